"""Runs of the cocotb pipeline bench from Python: one case, or many cases on one build in
one simulator process."""
from __future__ import annotations

from gnnweave.golden.pipeline import Schedule
from .build import build_pipeline_sim


def run_cocotb_pipeline(stages: int, microbatches: int, schedule, steps: int, *, build=None,
                        **problem) -> dict:
    """Build (cached) and run the cocotb pipeline bench; returns its summary dict."""
    from gnnweave.sim import runner
    build = build or {}
    built = build_pipeline_sim(stages, **build)
    params = dict(stages=stages, microbatches=microbatches, schedule=Schedule.parse(schedule).cli_name,
                  steps=steps, build=build, **problem)
    res = runner.run(built, "gnnweave.sim.pipeline.cocotb_bench", testcase="pipeline_run", params=params,
                     run_name=f"p{stages}-m{microbatches}-{Schedule.parse(schedule).cli_name}",
                     check=False)
    summary = res.results.get("pipeline")
    if summary is None:
        raise RuntimeError(f"pipeline bench produced no result ({res.failed} failed); log {res.log}: "
                           f"{res.failures[:1]}")
    return summary


def run_cocotb_pipeline_batch(stages: int, cases: list[dict], *, build=None) -> list[dict]:
    """Run several random-problem cases (dicts of :func:`run_cocotb_pipeline`'s keywords:
    microbatches, schedule, steps, dim, rows, seed, dx_first, ...) on one build and one
    simulator process; returns their summaries in order."""
    from gnnweave.sim import runner
    build = build or {}
    for i, c in enumerate(cases[1:], 1):
        if c.get("momentum", 0.5) != 0:
            raise ValueError(f"cases[{i}]: momentum must be 0 after the first case (the velocity "
                             f"memory keeps its contents between runs and the host cannot clear it)")
    built = build_pipeline_sim(stages, **build)
    cases = [{**c, "stages": stages, "schedule": Schedule.parse(c["schedule"]).cli_name} for c in cases]
    res = runner.run(built, "gnnweave.sim.pipeline.cocotb_bench", testcase="pipeline_batch_run",
                     params={"cases": cases, "build": build}, run_name=f"p{stages}-batch{len(cases)}",
                     check=False)
    summaries = res.results.get("pipeline_batch") or []
    if len(summaries) != len(cases):
        raise RuntimeError(f"pipeline batch ran {len(summaries)} of {len(cases)} cases ({res.failed} "
                           f"failed); log {res.log}: {res.failures[:1]}")
    return summaries
