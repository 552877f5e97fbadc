"""Training problems for the pipeline bench (picklable, so a cocotb process can load one),
their golden runs, and running one on the RTL (Verilator or Amaranth)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnweave.golden.pipeline import (GoldenPipeline, Schedule, TrainFormat, max_in_flight,
                                      softmax_xent_grad)
from .amaranth_run import _simulate_amaranth, run_pipeline_rtl
from .batch import run_cocotb_pipeline
from .build import (COCOTB_BUILD, build_pipeline_sim, cocotb_pipeline, segment_layout,
                    split_pipelines)
from .host import BENCH_FORMAT, PipelineHost, RtlRun, _pow2, compare_with_golden, summarize


@dataclass
class PipelineProblem:
    """One training run, as the host sees it (picklable, so the cocotb process gets it
    from a file): initial master weights per stage, the input microbatches, the labels
    the host's softmax-cross-entropy gradient uses (microbatch ``i`` uses
    ``labels[i % len(labels)]``, so repeated epochs can reuse them), the schedule."""

    masters: list
    inputs: list
    labels: list
    loss_scale: float
    schedule: str
    microbatches: int
    relu: list
    lr_q: int
    wd_q: int = 0
    mu_q: int = 0
    fmt: TrainFormat = BENCH_FORMAT
    #: SGD velocity per stage to start from (None: zero, momentum starts afresh)
    velocities: list | None = None

    @property
    def stages(self) -> int:
        return len(self.masters)

    @property
    def steps(self) -> int:
        return len(self.inputs) // self.microbatches

    def loss_grad(self, mb, logits_q):
        return softmax_xent_grad(logits_q, self.labels[mb % len(self.labels)], act=self.fmt.act,
                                 grad=self.fmt.grad, scale=self.loss_scale)

    def golden_pipeline(self) -> GoldenPipeline:
        pipe = GoldenPipeline(self.masters, relu=self.relu, fmt=self.fmt, lr_q=self.lr_q,
                              wd_q=self.wd_q, mu_q=self.mu_q)
        for st, v in zip(pipe.stages, self.velocities or []):
            st.velocity = None if v is None else np.asarray(v, dtype=np.int64).copy()
        return pipe

    def run_golden(self):
        return self.golden_pipeline().run(self.schedule, self.inputs, self.loss_grad,
                                          microbatches=self.microbatches)


def random_problem(stages: int, microbatches: int, steps: int, schedule, *, dim: int = 8,
                   rows: int = 8, seed: int = 0, lr: float = 0.25, wd: float = 1e-3,
                   momentum: float = 0.5, fmt: TrainFormat = BENCH_FORMAT) -> PipelineProblem:
    """:func:`make_problem` as a :class:`PipelineProblem` (ReLU on all stages but the last)."""
    rng = np.random.default_rng(seed)
    dims = [dim] * (stages + 1)
    masters = [fmt.sgd.master.quantize(rng.normal(0, 0.6, (a, b)))[0].astype(np.int64)
               for a, b in zip(dims[:-1], dims[1:])]
    n = microbatches * steps
    xs = [fmt.act.quantize(rng.normal(0, 1, (rows, dim)))[0].astype(np.int64) for _ in range(n)]
    labels = [rng.integers(0, dim, rows) for _ in range(n)]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, momentum)
    return PipelineProblem(masters, xs, labels, 1.0 / (rows * microbatches),
                           Schedule.parse(schedule).cli_name, microbatches,
                           [s < stages - 1 for s in range(stages)], lr_q, wd_q, mu_q, fmt)


def _host_for(problem: PipelineProblem, seg_layout, lanes: int, dx_first: bool) -> "PipelineHost":
    return PipelineHost(problem.masters, problem.inputs, problem.loss_grad,
                        schedule=problem.schedule, microbatches=problem.microbatches,
                        relu=problem.relu, lr_q=problem.lr_q, wd_q=problem.wd_q, mu_q=problem.mu_q,
                        fmt=problem.fmt, lanes=lanes, seg_layout=seg_layout,
                        master_width=problem.fmt.sgd.master.width, dx_first=dx_first,
                        velocities=problem.velocities)


def compare_problem(problem: PipelineProblem, trace, run: RtlRun) -> list[str]:
    """Every stage output and input gradient of every microbatch and the final masters."""
    host = PipelineHost.__new__(PipelineHost)
    host.p, host.n, host.outputs, host.input_grads = problem.stages, len(problem.inputs), \
        run.outputs, run.input_grads
    return compare_with_golden(host, trace, run.masters)


def problem_build(problem: PipelineProblem, lanes: int = 4, **build) -> dict:
    """Smallest build parameters (powers of two) that hold ``problem``."""
    dims = [problem.masters[0].shape[0]] + [w.shape[1] for w in problem.masters]
    rows = max(x.shape[0] for x in problem.inputs)
    sched = Schedule.parse(problem.schedule)
    p = problem.stages
    inner = dims[1:-1] or [lanes]
    cfg = dict(lanes=lanes, max_dim=_pow2(max(max(inner), lanes)), max_rows=_pow2(max(rows, 2)),
               max_in=_pow2(max(dims[:-1] + [lanes])), max_out=_pow2(max(dims[1:] + [lanes])),
               slots=_pow2(max(max_in_flight(sched, p, problem.microbatches, s) for s in range(p)) + 1))
    cfg.update(build)
    return cfg


def run_problem_rtl(problem: PipelineProblem, *, build: dict | None = None, devices=None,
                    link_delay: int = 1, dx_first: bool = True, simulator: str = "verilator",
                    max_cycles: int = 20_000_000) -> RtlRun:
    """Train ``problem`` on the Pipeline RTL (``devices=(k0, k1, ...)``: on that many
    Pipelines linked by the bench, see :class:`DevicesIO`) and return what it produced.
    ``simulator``: ``verilator`` (cocotb; the build is cached) or ``amaranth``."""
    build = dict(build or problem_build(problem))
    if devices is not None and sum(devices) != problem.stages:
        raise ValueError(f"devices {list(devices)} hold {sum(devices)} stages, the problem has "
                         f"{problem.stages}")
    if simulator == "amaranth":
        return _run_problem_amaranth(problem, build, devices, link_delay, dx_first, max_cycles)
    if simulator != "verilator":
        raise ValueError(f"unknown simulator {simulator!r}; choose verilator or amaranth")
    import pickle
    import tempfile
    from pathlib import Path
    from gnnweave.sim import runner
    built = build_pipeline_sim(problem.stages, fmt=problem.fmt, devices=devices, **build)
    with tempfile.TemporaryDirectory(prefix="gnnweave-pipe-") as tmp:
        src, dst = Path(tmp) / "problem.pkl", Path(tmp) / "run.pkl"
        src.write_bytes(pickle.dumps(problem))
        params = dict(problem_path=str(src), run_path=str(dst), build=build,
                      devices=list(devices) if devices else None, link_delay=link_delay,
                      dx_first=bool(dx_first), max_cycles=max_cycles, fmt_stages=problem.stages)
        name = f"problem-p{problem.stages}-m{problem.microbatches}" + \
            (f"-split{'_'.join(map(str, devices))}" if devices else "")
        res = runner.run(built, "gnnweave.sim.pipeline.cocotb_bench", testcase="pipeline_problem_run",
                         params=params, run_name=name, check=False)
        if not dst.is_file():
            raise RuntimeError(f"pipeline bench produced no result ({res.failed} failed); log "
                               f"{res.log}: {res.failures[:1]}")
        return pickle.loads(dst.read_bytes())


def _rtl_top(problem, build, devices):
    if devices:
        return split_pipelines(devices, problem.fmt, **build)
    return cocotb_pipeline(problem.stages, problem.fmt, **build)


def _run_problem_amaranth(problem, build, devices, link_delay, dx_first, max_cycles) -> RtlRun:
    from .devices import DevicesIO      # (devices imports this module)
    dut = _rtl_top(problem, build, devices)
    seg = segment_layout(problem.fmt, problem.stages, **build)
    host = _host_for(problem, seg, build["lanes"], dx_first)
    wrap = (lambda io: DevicesIO(io, devices, link_delay)) if devices else None
    return _simulate_amaranth(dut, host, problem.stages, max_cycles, wrap)


def make_problem(stages: int, microbatches: int, steps: int, *, dim: int = 8, rows: int = 8,
                 classes: int | None = None, seed: int = 0, fmt: TrainFormat = BENCH_FORMAT):
    """Random balanced problem: ``stages`` layers ``dim -> dim`` (the last ``dim -> classes``)."""
    rng = np.random.default_rng(seed)
    classes = classes or dim
    dims = [dim] * stages + [classes]
    masters = [fmt.sgd.master.quantize(rng.normal(0, 0.6, (a, b)))[0].astype(np.int64)
               for a, b in zip(dims[:-1], dims[1:])]
    n = microbatches * steps
    xs = [fmt.act.quantize(rng.normal(0, 1, (rows, dim)))[0].astype(np.int64) for _ in range(n)]
    labels = [rng.integers(0, classes, rows) for _ in range(n)]

    def loss_grad(mb, z):
        return softmax_xent_grad(z, labels[mb], act=fmt.act, grad=fmt.grad,
                                 scale=1.0 / (rows * microbatches))
    return masters, xs, loss_grad


def verify_pipeline(stages: int, microbatches: int, schedule, steps: int = 2, *, dim: int = 8,
                    rows: int = 8, lanes: int = 4, seed: int = 0, lr: float = 0.25,
                    wd: float = 1e-3, momentum: float = 0.5, simulator: str = "verilator") -> dict:
    """RTL pipeline vs golden: every stage's output and input gradient of every microbatch,
    and the final master weights, compared bit for bit after ``steps`` steps. Returns the
    JSON fields of ``gnnweave verify pipeline`` (``match``, ``cycles``, ``mac_utilization``,
    ``bubble_fraction``, ``bubble_formula``, ...). ``simulator``: ``verilator`` (cocotb,
    the default) or ``amaranth`` (pure Python, slow; no toolchain needed)."""
    schedule = Schedule.parse(schedule)
    if not 1 <= stages <= 8:
        raise ValueError(f"--stages must be in 1..8, got {stages}")
    if not 1 <= microbatches <= 64:
        raise ValueError(f"--microbatches must be in 1..64, got {microbatches}")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if simulator == "verilator":
        build = {"lanes": lanes}
        if dim > COCOTB_BUILD["max_dim"]:
            build["max_dim"] = _pow2(dim)
        if rows > COCOTB_BUILD["max_rows"]:
            build["max_rows"] = _pow2(rows)
        if schedule is Schedule.GPIPE and microbatches >= COCOTB_BUILD["slots"]:
            build["slots"] = _pow2(microbatches + 1)
        if build == {"lanes": COCOTB_BUILD["lanes"]}:
            build = {}
        return run_cocotb_pipeline(stages, microbatches, schedule, steps, build=build, dim=dim,
                                   rows=rows, seed=seed, lr=lr, wd=wd, momentum=momentum)
    if simulator != "amaranth":
        raise ValueError(f"unknown simulator {simulator!r}; choose verilator or amaranth")
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(stages, microbatches, steps, dim=dim, rows=rows, seed=seed)
    relu = [s < stages - 1 for s in range(stages)]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, momentum)
    golden = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)
    trace = golden.run(schedule, xs, loss_grad, microbatches=microbatches)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule=schedule, microbatches=microbatches,
                           relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes)
    host = PipelineHost.__new__(PipelineHost)
    host.p, host.n, host.outputs, host.input_grads = stages, len(xs), run.outputs, run.input_grads
    mismatches = compare_with_golden(host, trace, run.masters)
    return summarize(schedule, stages, microbatches, steps, run.counters, run.cycles, mismatches,
                     lanes, trace.saturations, sim_wall_s=round(run.wall_s, 2))
