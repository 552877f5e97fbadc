"""The accelerator top (every unit of a named build behind one control slave and one gmem
port, :mod:`gnnweave.hw.accelerator`) in cocotb on Verilator.

One simulation runs Aggregator and MacArray jobs (and, where the build has the training
Pipeline, a two-step training run served by the bench as the host) back to back on the
same top, selecting the unit through the ``unit`` register, and checks every result
against golden with the units' own checkers (:func:`gnnweave.sim.tb.check_job`,
:func:`gnnweave.sim.mac_array_bench.check_mac_job`,
:mod:`gnnweave.sim.pipeline_unit_bench`): bus ownership switches between units,
shared registers (``shift``, ``out_*``, ``status``, counters) read the running unit's
values, and a start of a unit the build does not hold is refused with CONFIG_ERROR and no
memory traffic.

``run_accelerator(config_name)`` builds (cached) and runs it; the results come back as the
dict the cocotb test stored.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

try:
    import cocotb
except ImportError:     # the module is also imported by the pytest side
    cocotb = None

BENCH_MODULE = "gnnweave.sim.accelerator_bench"


def accelerator_verilog(config_name: str, *, debug_names: bool = False) -> Path:
    """Generated Verilog of a named build's accelerator top, cached by the hw sources."""
    from gnnweave.hw.flow.verilog import write_accelerator_verilog
    from gnnweave.sim import runner
    return runner.cached_verilog(f"accel-{config_name}",
                                 lambda out, **kw: write_accelerator_verilog(config_name, out, **kw),
                                 debug_names=debug_names)


def build_accelerator_sim(config_name: str = "small", sim: str = "verilator", *, waves=None,
                          force: bool = False):
    from gnnweave.hw.accelerator import ACCELERATOR_TOP
    from gnnweave.sim import runner
    waves = runner.waves_requested(waves)
    source = accelerator_verilog(config_name, debug_names=waves)
    return runner.build([source], ACCELERATOR_TOP, sim, waves=waves, force=force)


def run_accelerator(config_name: str = "small", *, seed: int = 0, latency: int = 8,
                    backpressure: float | None = None) -> dict:
    from gnnweave.sim import runner
    built = build_accelerator_sim(config_name)
    res = runner.run(built, BENCH_MODULE, testcase="units_share_one_top",
                     params={"config": config_name, "seed": seed, "latency": latency,
                             "backpressure": backpressure})
    return res.results["units_share_one_top"]


if cocotb is not None:
    from gnnweave.hw.accelerator import Unit, build_regmap
    from gnnweave.hw.configs import get_config, get_mac_config, get_pipeline_config
    from gnnweave.sim import pipeline_unit_bench
    from gnnweave.sim import aggregate_bench
    from gnnweave.sim.mac_array_bench import MacArrayTB, check_mac_job, random_job
    from gnnweave.contract import AggregatorStatus
    from gnnweave.sim.tb import AP_START, AggregatorTB, check_job, load_params, store_result

    class AcceleratorTB(MacArrayTB, AggregatorTB):
        """Clock, reset, control, memory of the whole top; a job method per unit."""

        def __init__(self, dut, config_name: str, **kw):
            super().__init__(dut, get_mac_config(config_name), **kw)
            self.regmap = build_regmap(config_name)
            self.agg_config = get_config(config_name)

        async def select(self, unit: Unit):
            await self.write_reg("unit", unit.value)

        async def run_aggregate(self, job):
            await self.select(Unit.AGGREGATOR)
            AggregatorTB.load_job(self, job)
            return await AggregatorTB.run_job(self, job, load=False)

        async def run_mac(self, job):
            await self.select(Unit.MAC_ARRAY)
            return await MacArrayTB.run_job(self, job)

        # the Pipeline unit's host side (pipeline_unit_bench.PipelineUnitTB), on this top
        run_regs = pipeline_unit_bench.PipelineUnitTB.run_regs
        program_regs = pipeline_unit_bench.PipelineUnitTB.program_regs

        async def run_pipeline(self, layout):
            await self.select(Unit.PIPELINE)
            return await pipeline_unit_bench.PipelineUnitTB.train(self, layout)

    @cocotb.test()
    async def units_share_one_top(dut):
        params = load_params()
        name = params["config"]
        tb = AcceleratorTB(dut, name, latency=params.get("latency", 8))
        if params.get("backpressure"):
            tb.set_backpressure(params["backpressure"], seed=params.get("seed", 0))
        await tb.reset()
        rng = np.random.default_rng(params.get("seed", 0))
        present = await tb.read_reg("units_present")
        has_pipeline = get_pipeline_config(name) is not None
        want = (1 << Unit.AGGREGATOR.value) | (1 << Unit.MAC_ARRAY.value) | \
            (has_pipeline << Unit.PIPELINE.value)
        assert present == want, f"units_present = {present:#x}, want {want:#x}"
        agg_layout = aggregate_bench.layout_for(tb.agg_config)
        mac_layout = {"bus_bytes": tb.config.bus_width // 8,    # apart from the graph jobs
                      "base_addr": 0x1_5000_0000 if tb.config.addr_width > 32 else 0x5000_0000}
        log = []

        async def aggregate(label, reduce, weighted):
            j = aggregate_bench.random_graph_job(rng, 37, 5, 19, reduce, weighted, **agg_layout)
            res = await tb.run_aggregate(j)
            check_job(j, res, max_feat_dim=tb.agg_config.max_feat_dim)
            log.append({"unit": "aggregator", "job": label, "cycles": res.cycles,
                        "read_beats": res.counters["read_beats"]})
            # the shared counters read what this unit counted
            assert res.counters["read_beats"] == sum(b.beats for b in res.bursts if b.kind == "read")

        async def mac(label, mode, m, n, k, **kw):
            j = random_job(rng, mode, m, n, k, **mac_layout, **kw)
            res = await tb.run_mac(j)
            summary = check_mac_job(j, res, tb.config)
            log.append({"unit": "mac_array", "job": label, "cycles": res["cycles"],
                        "mac_ops": res["counters"]["mac_ops"], **{k: v for k, v in summary.items()
                                                                  if isinstance(v, (int, float, bool))}})
            assert res["counters"]["mac_ops"] == m * n * k

        await aggregate("sum", aggregate_bench.SUM, True)
        await mac("fwd+bias+relu", "fwd", 13, 9, 21, bias=True, relu=True, bias_shift=4)
        await aggregate("mean", aggregate_bench.MEAN, False)
        await mac("dx", "dx", 10, 7, 12)
        await mac("dw", "dw", 6, 11, 9)
        await aggregate("max", aggregate_bench.MAX, True)
        if has_pipeline:
            pb = pipeline_unit_bench.unit_problem("1f1b-flush", seed=params.get("seed", 0))
            lay = pipeline_unit_bench.TrainLayout(pb, mac_layout["base_addr"] + 0x100_0000, tb.bus_bytes)
            res = await tb.run_pipeline(lay)
            trace = pb.run_golden()
            bad = pipeline_unit_bench.compare_run(pb, trace, res["logits"], res["dx"], res["masters"])
            assert not bad and not res["violations"], (bad[:5], res["violations"][:3])
            log.append({"unit": "pipeline", "job": "train 1f1b-flush", "cycles": res["counters"]["cycles"],
                        "read_beats": res["counters"]["read_beats"]})
            await mac("after the pipeline", "dx", 7, 6, 5)

        # a unit this build does not hold: refused, no traffic, the next run is clean
        tb.clear_bursts()
        await tb.write_reg("unit", len(Unit) if has_pipeline else Unit.PIPELINE.value)
        await tb.write_reg("ap_ctrl", AP_START)
        await tb.wait_done(1000)
        status = await tb.read_reg("status")
        assert status & AggregatorStatus.CONFIG_ERROR, \
            f"status {status:#x} after starting an absent unit"
        assert not tb.bursts, f"{len(tb.bursts)} bursts from a refused start"
        await mac("after refusal", "fwd", 5, 5, 5)
        store_result("units_share_one_top", {"config": name, "jobs": log})
