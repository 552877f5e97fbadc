"""Host runtime: driver, executors, profiler, partitioner, planner, trainer."""
