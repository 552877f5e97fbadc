"""The Aggregator in cocotb behind a board-like memory and faults.

* ``board_memory``: read bursts answered out of order across IDs, each after a random
  latency and an open-row DRAM's costs (:class:`gnnweave.sim.tb.MemoryModel`), with
  random back-pressure; every job bit-exact against golden.
* ``injected_errors``: SLVERR/DECERR on a chosen read or write burst sets ``axi_error``,
  the run ends, and the next job on the same kernel is bit-exact.
* ``forced_addr_fault``: the read guard's limit for the feature rows is cut to nothing
  in the middle of a run (a deposit on the register, which no host can do): the guard refuses
  the next feature read, ``addr_fault`` is set, the run ends without a burst outside the
  buffers, and the next job is bit-exact.

``run_memory_bench(testcase)`` builds (cached) the Aggregator with its internal signals
public (the deposit needs them) and runs it.
"""
from __future__ import annotations

try:
    import cocotb
except ImportError:     # the module is also imported by the pytest side
    cocotb = None

import numpy as np

BENCH_MODULE = "gnnweave.sim.memory_bench"
CONFIG = "small"


def build_memory_bench(config: str = CONFIG):
    from gnnweave.sim import runner
    return runner.build([runner.aggregator_verilog(config)], runner.AGGREGATOR_TOP, "verilator",
                        public_internals=True)


def run_memory_bench(testcase: str, *, config: str = CONFIG, seed: int = 0):
    from gnnweave.sim import runner
    return runner.run(build_memory_bench(config), BENCH_MODULE, testcase=testcase,
                      params={"config": config, "seed": seed}, run_name=f"memory-{testcase}")


if cocotb is not None:
    from cocotb.triggers import Timer

    from gnnweave.sim.aggregate_bench import MAX, MEAN, SUM, _bench, _run_checked, random_graph_job
    from gnnweave.sim.tb import CLOCK_NS, MemoryModel, check_job, store_result

    @cocotb.test()
    async def board_memory(dut):
        tb, params = await _bench(dut, latency=16, backpressure=0.2)
        model = MemoryModel(reorder=True, jitter=40, dram=True, seed=params.get("seed", 0),
                            bus_bytes=tb.bus_bytes)
        tb.set_memory_model(model)
        rng = np.random.default_rng(params.get("seed", 0) + 31)
        cycles = []
        for reduce, weighted, (n, deg, f) in ((SUM, True, (60, 4.0, 16)), (MEAN, False, (50, 3.0, 40)),
                                              (MAX, False, (40, 5.0, 24)), (SUM, False, (30, 6.0, 64))):
            job = random_graph_job(rng, n, deg, f, reduce, weighted)
            result, _ = await _run_checked(tb, job, "board memory")
            cycles.append(result.counters["busy_cycles"])
        assert model.reordered > 0, "no burst was answered out of order"
        assert model.row_misses > 0
        store_result("board_memory", {"reordered": model.reordered, "row_misses": model.row_misses,
                                      "busy_cycles": cycles})

    @cocotb.test()
    async def injected_errors(dut):
        tb, params = await _bench(dut, latency=8)
        tb.set_memory_model(MemoryModel(reorder=True, jitter=16, seed=1, bus_bytes=tb.bus_bytes))
        rng = np.random.default_rng(params.get("seed", 0) + 5)
        seen = []
        for kind, resp, after in (("read", 2, 0), ("read", 3, 17), ("write", 2, 1), ("write", 3, 0)):
            bad = random_graph_job(rng, 50, 4.0, 24, MEAN, True)
            tb.inject_error(kind, after=after, resp=resp)
            result = await tb.run_job(bad, timeout_cycles=200_000)
            assert result.flags["axi_error"], f"{kind} resp {resp}: status 0x{result.status:x}"
            assert not result.violations, result.violations[0]
            assert result.ap_ctrl_after & 4, "not idle after the failed run"
            good = random_graph_job(rng, 40, 3.0, 16, SUM, False)
            await _run_checked(tb, good, f"after an injected {kind} error")
            seen.append(f"{kind}:{resp}")
        store_result("injected_errors", seen)

    @cocotb.test()
    async def forced_addr_fault(dut):
        tb, params = await _bench(dut, latency=8)
        rng = np.random.default_rng(params.get("seed", 0) + 9)
        job = random_graph_job(rng, 120, 5.0, 16, SUM, False)
        tb.load_job(job)
        tb.clear_bursts()
        await tb.program(job)
        await tb.start()
        feat = job.regions["feat"]
        # wait until the run has passed its checks and gathers feature rows
        for _ in range(20_000):
            await Timer(CLOCK_NS, "ns")
            if sum(b.kind == "read" and feat.addr <= b.addr < feat.end for b in tb.bursts) >= 3:
                break
        else:
            raise AssertionError("the run never read a feature row")
        # the feature rows' guard shrinks to nothing: the last beat of a burst may start
        # at address 0 at the latest (the guard holds its limits while the run runs)
        dut.top.core.datapath.read_port.guard_last_end3.value = 0
        reads_at_fault = len(tb.bursts)
        ctrl = await tb.wait_done(100_000)
        status = await tb.read_reg("status")
        assert status >> 3 & 1, f"addr_fault not set (status 0x{status:x}, ap_ctrl 0x{ctrl:x})"
        assert not tb.violations, tb.violations[0]
        after = await tb.read_reg("ap_ctrl")
        assert after & 4, "not idle after the aborted run"
        late = [b for b in tb.bursts[reads_at_fault:] if b.kind == "read" and feat.addr <= b.addr < feat.end]
        good = random_graph_job(rng, 40, 3.0, 16, MEAN, True)
        await _run_checked(tb, good, "after addr_fault")
        store_result("forced_addr_fault", {"status": status, "bursts_before": reads_at_fault,
                                           "feature_reads_after": len(late)})
