"""The cocotb tests of the pipeline bench (collected when cocotb runs this module)."""
from __future__ import annotations

from gnnweave.golden.pipeline import GoldenPipeline, Schedule
from .build import COCOTB_BUILD, segment_layout
from .devices import DevicesIO
from .host import BENCH_FORMAT, PipelineHost, compare_with_golden, drive_pipeline, summarize
from .problems import _host_for, make_problem


class CocotbIO:
    """Port access by name for cocotb; a write of the value a port already holds is
    skipped (the bench drives every input each cycle; most do not change)."""

    def __init__(self, dut):
        self.dut = dut
        self._cache = {}
        self._written = {}

    def _h(self, name):
        h = self._cache.get(name)
        if h is None:
            h = getattr(self.dut, name.replace(".", "__"))
            self._cache[name] = h
        return h

    def set(self, name, value):
        value = int(value)
        if self._written.get(name) != value:
            self._h(name).value = value
            self._written[name] = value

    def forget_writes(self):
        """After a reset or a direct write: drive every port again on its next set."""
        self._written.clear()

    def get(self, name) -> int:
        v = self._h(name).value
        try:
            return v.to_unsigned()
        except AttributeError:
            return int(v)


try:  # the cocotb test (collected only when cocotb runs this module)
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ReadOnly, RisingEdge
except ImportError:  # pragma: no cover - cocotb is in the [sim] extra
    cocotb = None

if cocotb is not None:
    async def _reset(dut, io, stages: int):
        """Three cycles of reset with every input stream and weight port idle."""
        dut.rst.value = 1
        io.set("start", 0)
        for name in ("act_in.valid", "grad_in.valid"):
            io.set(name, 0)
        for s in range(stages):
            io.set(f"s{s}_w_wr_en", 0)
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0

    async def _run_case(dut, prm: dict, clock_started: bool) -> dict:
        """One case of the random-problem bench (see pipeline_run); returns its summary."""
        stages, m, steps = prm["stages"], prm["microbatches"], prm["steps"]
        schedule = Schedule.parse(prm["schedule"])
        fmt = BENCH_FORMAT
        bcfg = {**COCOTB_BUILD, **prm.get("build", {})}
        masters, xs, loss_grad = make_problem(stages, m, steps, dim=prm.get("dim", 8),
                                              rows=prm.get("rows", 8), seed=prm.get("seed", 0))
        relu = [s < stages - 1 for s in range(stages)]
        lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(prm.get("lr", 0.25), prm.get("wd", 1e-3),
                                                  prm.get("momentum", 0.5))
        golden = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)
        trace = golden.run(schedule, xs, loss_grad, microbatches=m)
        lanes = bcfg["lanes"]
        host = PipelineHost(masters, xs, loss_grad, schedule=schedule, microbatches=m, relu=relu,
                            lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes,
                            seg_layout=segment_layout(fmt, stages, **prm.get("build", {})),
                            master_width=fmt.sgd.master.width,
                            dx_first=prm.get("dx_first", True))
        io = CocotbIO(dut)
        if not clock_started:
            cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        await _reset(dut, io, stages)
        run = await drive_pipeline(io, host, stages, tick=lambda: RisingEdge(dut.clk), settle=ReadOnly,
                                   max_cycles=prm.get("max_cycles", 2_000_000))
        counters, cycles, wall, got = run.counters, run.cycles, run.wall_s, run.masters
        mismatches = compare_with_golden(host, trace, got)
        return summarize(schedule, stages, m, steps, counters, cycles, mismatches, lanes,
                         trace.saturations, sim_wall_s=round(wall, 2),
                         steady_state_utilization=host.steady_state_utilization(),
                         cycles_per_s=round(cycles / max(wall, 1e-9)),
                         dx_first=int(prm.get("dx_first", True)))

    @cocotb.test()
    async def pipeline_run(dut):
        """Params: stages, microbatches, schedule, steps, dim, rows, seed, lr, wd, momentum,
        dx_first, result_key. Trains on the RTL and on golden, stores the comparison summary."""
        from gnnweave.sim.tb import load_params, store_result
        prm = load_params()
        summary = await _run_case(dut, prm, clock_started=False)
        store_result(prm.get("result_key", "pipeline"), summary)
        assert summary["match"], summary["mismatches"][:5]

    @cocotb.test()
    async def pipeline_batch_run(dut):
        """Params: ``cases`` (a list of pipeline_run parameter sets, all for this build),
        run one after the other on one simulator process (reset between them); stores
        the list of summaries under ``pipeline_batch``."""
        from gnnweave.sim.tb import load_params, store_result
        prm = load_params()
        summaries = []
        for i, case in enumerate(prm["cases"]):
            summaries.append(await _run_case(dut, {**case, "build": prm.get("build", {})},
                                             clock_started=i > 0))
            store_result("pipeline_batch", summaries)
        assert all(s["match"] for s in summaries), [s["mismatches"][:3] for s in summaries]

    @cocotb.test()
    async def pipeline_problem_run(dut):
        """Params: problem_path (a pickled PipelineProblem), run_path (where the RtlRun is
        pickled), build, devices, link_delay, dx_first, max_cycles. Runs the RTL only; the
        caller compares with golden."""
        import pickle
        from gnnweave.sim.tb import load_params, store_result
        prm = load_params()
        with open(prm["problem_path"], "rb") as fh:
            problem = pickle.load(fh)
        build, devices = prm["build"], prm.get("devices")
        seg = segment_layout(problem.fmt, problem.stages, **build)
        host = _host_for(problem, seg, build["lanes"], prm.get("dx_first", True))
        io = CocotbIO(dut)
        if devices:
            io = DevicesIO(io, devices, prm.get("link_delay", 1))
        stages = problem.stages
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        if devices:
            io.idle_links()
        await _reset(dut, io, stages)
        run = await drive_pipeline(io, host, stages, tick=lambda: RisingEdge(dut.clk), settle=ReadOnly,
                                   max_cycles=prm.get("max_cycles", 20_000_000))
        run.stage_ops_seen = [host.steady_state_utilization()]
        cycles, wall = run.cycles, run.wall_s
        with open(prm["run_path"], "wb") as fh:
            pickle.dump(run, fh)
        store_result("pipeline_problem", {"cycles": cycles, "sim_wall_s": round(wall, 2)})
