"""The pipeline bench on the Amaranth simulator (no Verilog toolchain; small problems)."""
from __future__ import annotations

import time

from gnnweave.golden.pipeline import Schedule, TrainFormat, max_in_flight
from .host import BENCH_FORMAT, PipelineHost, RtlRun, _pow2, drive_pipeline


def build_pipeline(stages: int, dims: list[int], rows: int, microbatches: int, schedule,
                   lanes: int = 4, fmt: TrainFormat = BENCH_FORMAT):
    from gnnweave.hw.pipeline import Pipeline
    schedule = Schedule.parse(schedule)
    slots = _pow2(max(max_in_flight(schedule, stages, microbatches, s) for s in range(stages)) + 1)
    sgd = fmt.sgd
    return Pipeline(stages, lanes=lanes, max_dim=_pow2(max(max(dims), lanes)), max_rows=_pow2(rows),
                    slots=slots, versions=stages + 2, master=sgd.master, weight=sgd.weight,
                    grad_sum=sgd.grad, lr=sgd.lr, wd=sgd.wd, mu=sgd.mu)


class AmaranthIO:
    def __init__(self, dut, ctx):
        self.dut, self.ctx = dut, ctx
        self._cache = {}

    def _sig(self, name):
        sig = self._cache.get(name)
        if sig is None:
            obj = self.dut
            for part in name.split("."):
                obj = getattr(obj, part)
            sig = obj.as_value() if hasattr(obj, "as_value") else obj
            self._cache[name] = sig
        return sig

    def set(self, name, value):
        self.ctx.set(self._sig(name), int(value))

    def get(self, name) -> int:
        return int(self.ctx.get(self._sig(name)))


def run_pipeline_rtl(masters, inputs, loss_grad, *, schedule, microbatches: int, relu,
                     lr_q: int, wd_q: int = 0, mu_q: int = 0, fmt: TrainFormat = BENCH_FORMAT,
                     lanes: int = 4, max_cycles: int = 2_000_000, dx_first: bool = True,
                     segment_order: str = "streaming", gaps: float = 0.0, gap_seed: int = 0) -> RtlRun:
    """The bench on the Amaranth simulator (no Verilog toolchain; slow: small problems).
    ``gaps``/``gap_seed``: see :class:`PipelineHost`."""
    p = len(masters)
    dims = [masters[0].shape[0]] + [w.shape[1] for w in masters]
    dut = build_pipeline(p, dims, inputs[0].shape[0], microbatches, schedule, lanes, fmt)
    host = PipelineHost(masters, inputs, loss_grad, schedule=schedule, microbatches=microbatches,
                        relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes,
                        seg_layout=dut.stage_list[0].act_out.payload.shape(),
                        master_width=fmt.sgd.master.width, dx_first=dx_first,
                        segment_order=segment_order, gaps=gaps, gap_seed=gap_seed)
    return _simulate_amaranth(dut, host, p, max_cycles)


def _simulate_amaranth(dut, host: "PipelineHost", stages: int, max_cycles: int,
                       wrap_io=None) -> RtlRun:
    """Run ``host`` against ``dut`` on the Amaranth simulator: configure, load the weights,
    start, drive and sample every cycle until the host has every result, then read the
    counters and the master weights back. ``wrap_io`` wraps the simulator's port access
    (:class:`DevicesIO` for a pipeline split over devices)."""
    from amaranth.sim import Simulator
    result = {}

    async def bench(ctx):
        io = AmaranthIO(dut, ctx)
        if wrap_io is not None:
            io = wrap_io(io)
            io.idle_links()
        result["run"] = await drive_pipeline(io, host, stages, tick=ctx.tick, max_cycles=max_cycles)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    t0 = time.time()
    sim.run()
    run = result["run"]
    run.wall_s = time.time() - t0
    return run
