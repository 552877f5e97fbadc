"""``gnnweave device run aggregate | mac | pipeline``: one operation through the host driver
(genuine pynq classes where pynq imports) on the simulated device, checked against the
golden model."""
from __future__ import annotations

import time

from gnnweave.clitools import (
    SCHEDULES, add_aggregation_options, add_config_option, emit, named_build, positive,
)
from gnnweave.errors import InputError


def _common(parser, *, what: str) -> None:
    parser.add_argument("--latency", type=int, default=32, help="memory read latency in cycles")
    add_config_option(parser, what=what)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random operands")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _plain_counters(counters: dict) -> dict:
    """Driver counters for JSON: numbers as ints, nested dicts/lists (flags) as they are."""
    return {k: int(v) if not isinstance(v, (dict, list)) else v for k, v in counters.items()}


def _timing(cycles: int, wall: float, counters: dict) -> dict:
    """The timing and counter fields every ``device run`` report carries."""
    return {"wall_seconds": round(wall, 4),
            "sim_cycles_per_second": round(cycles / max(wall, 1e-9), 1),
            "counters": _plain_counters(counters)}


class Aggregate:
    """The Aggregator on a graph with random int16 features."""

    @staticmethod
    def add_arguments(parser) -> None:
        add_aggregation_options(parser)
        _common(parser, what="an Aggregator")

    @staticmethod
    def run(a) -> int:
        import numpy as np

        from gnnweave.fixed import FixedFormat
        from gnnweave.golden.aggregate import AggregateFormat, aggregate
        from gnnweave.host.cyclemodel import report_fields as cycle_model_fields
        from gnnweave.host.driver import SimAccel
        from gnnweave.sim.simdevice import SimDevice
        from gnnweave.sim.verify import check_run_options, load_graph
        positive("--feat-dim", a.feat_dim)
        positive("--latency", a.latency, minimum=0)
        # what the build cannot run is refused now, not after its minutes-long native build
        check_run_options(named_build(a.config).aggregator, a.config, feat_dim=a.feat_dim,
                          reduce=a.reduce, latency=a.latency, backpressure=None)
        graph = load_graph(a.dataset, seed=a.seed)
        if not graph.num_nodes:
            raise InputError(f"--dataset {a.dataset}: the graph has no nodes")
        rng = np.random.default_rng(a.seed)
        x_q = rng.integers(-2**12, 2**12, (graph.num_nodes, a.feat_dim)).astype(np.int16)
        need = (64 * 4096 + 8 * (graph.num_edges + graph.num_nodes)
                + 4 * graph.num_nodes * (2 * a.feat_dim + 64))
        device = SimDevice(-(-need // 4096) * 4096 * 2, latency=a.latency, config=a.config)
        accel = SimAccel(device)
        start = time.perf_counter()
        out, counters = accel.aggregate(graph, x_q, a.reduce, shift=0)
        wall = time.perf_counter() - start
        unweighted = AggregateFormat(feat=FixedFormat(16, 0), weight=None, out=FixedFormat(16, 0))
        golden = aggregate(graph, x_q, a.reduce, unweighted)
        mismatches = int(np.count_nonzero(out != golden.out))
        cycles = int(counters["busy_cycles"])
        report = {"dataset": a.dataset, "config": a.config, "reduce": a.reduce,
                  "feat_dim": a.feat_dim, "latency": a.latency, "nodes": graph.num_nodes,
                  "edges": int(counters["edges"]), "match": mismatches == 0,
                  "mismatches": mismatches, "cycles": cycles,
                  "read_beats": int(counters["read_beats"]),
                  "port_utilization": round(int(counters["read_beats"]) / max(cycles, 1), 4),
                  **cycle_model_fields(a.config, np.diff(graph.indptr), a.feat_dim,
                                       measured=cycles, reduce=a.reduce, latency=a.latency),
                  **_timing(cycles, wall, counters)}
        emit(report, a.json, ("match", "mismatches", "cycles", "predicted_cycles",
                              "predicted_error_pct", "port_utilization", "wall_seconds",
                              "sim_cycles_per_second"))
        return 0 if report["match"] else 1


class MacArray:
    """One MacArray operation on random int12 operands."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--rows", type=int, required=True, help="output rows m")
        parser.add_argument("--cols", type=int, required=True, help="output columns n")
        parser.add_argument("--depth", type=int, required=True,
                            help="depth k (split on chip when deep)")
        parser.add_argument("--mode", default="fwd", choices=["fwd", "dx", "dw"],
                            help="Y = X W, dX = dY W^T or dW = X^T dY")
        parser.add_argument("--shift", type=int, default=12,
                            help="right shift of the accumulator into the 16-bit output")
        _common(parser, what="a MacArray")

    @staticmethod
    def run(a) -> int:
        import numpy as np

        from gnnweave.golden.mac import mac
        from gnnweave.host.driver import open_sim_accel
        from gnnweave.sim.mac_bench import operand_shapes
        for name in ("rows", "cols", "depth"):
            positive(f"--{name}", getattr(a, name))
        positive("--latency", a.latency, minimum=0)
        from gnnweave.contract import Limits
        if not 0 <= a.shift <= Limits.SHIFT_MAX:
            raise InputError(f"--shift {a.shift}: must be in 0..{Limits.SHIFT_MAX}")
        build = named_build(a.config)
        if build.mac_array is None:
            raise InputError(f"--config {a.config!r}: the build has no MacArray")
        rng = np.random.default_rng(a.seed)
        (pr, pc), (qr, qc) = operand_shapes(a.mode, a.rows, a.cols, a.depth)
        p = rng.integers(-2**11, 2**11, (pr, pc))
        q = rng.integers(-2**11, 2**11, (qr, qc))
        accel, _device, owner = open_sim_accel(config=a.config, latency=a.latency)
        try:
            start = time.perf_counter()
            out, counters = accel.mac(a.mode, p, q, shift=a.shift)
            wall = time.perf_counter() - start
        finally:
            owner.close()
        golden = mac(a.mode, p, q, shift=a.shift, out_width=16)
        mismatches = int(np.count_nonzero(out != golden.out))
        cycles = int(counters["busy_cycles"])
        cells = build.mac_array.rows * build.mac_array.cols
        report = {"mode": a.mode, "config": a.config, "rows": a.rows, "cols": a.cols,
                  "depth": a.depth, "driver": type(accel).__name__, "match": mismatches == 0,
                  "mismatches": mismatches, "cycles": cycles,
                  "mac_utilization": round(int(counters["mac_ops"]) / max(cycles * cells, 1), 4),
                  "saturations": int(counters["saturations"]),
                  "golden_saturations": int(golden.saturations),
                  **_timing(cycles, wall, counters)}
        emit(report, a.json, ("match", "mismatches", "cycles", "mac_utilization",
                              "wall_seconds", "sim_cycles_per_second"))
        return 0 if report["match"] and report["saturations"] == report["golden_saturations"] else 1


class Pipeline:
    """A pipeline training run, checked against GoldenPipeline bit for bit."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--schedule", default="gpipe", choices=SCHEDULES,
                            help="the pipeline schedule")
        parser.add_argument("--microbatches", type=int, default=4, help="microbatches per step")
        parser.add_argument("--steps", type=int, default=2, help="training steps")
        parser.add_argument("--rows", type=int, default=8, help="rows per microbatch")
        parser.add_argument("--dim", type=int, default=16, help="input and hidden features")
        parser.add_argument("--classes", type=int, default=10, help="outputs of the last stage")
        parser.add_argument("--poll-cycles", type=int, default=64,
                            help="cycles the simulated device runs per host poll (the host's "
                                 "reaction time to the loss-gradient doorbell)")
        _common(parser, what="a training Pipeline")

    @staticmethod
    def run(a) -> int:
        from gnnweave.golden.pipeline import bubble_formula
        from gnnweave.host.driver import open_sim_accel
        from gnnweave.sim.pipeline_unit_bench import compare_run, unit_problem
        for name in ("microbatches", "steps", "rows", "poll_cycles", "dim", "classes"):
            positive(f"--{name.replace('_', '-')}", getattr(a, name))
        positive("--latency", a.latency, minimum=0)
        pipe = named_build(a.config).pipeline
        if pipe is None:
            raise InputError(f"--config {a.config!r}: the build has no training Pipeline")
        # the build's limits, checked before its native build
        for option, value, cap in (("--dim", a.dim, min(pipe.max_in, pipe.max_out)),
                                   ("--classes", a.classes, pipe.max_out),
                                   ("--rows", a.rows, pipe.max_rows)):
            if value > cap:
                raise InputError(f"{option} {value}: build {a.config!r} takes 1..{cap}")
        accel, device, owner = open_sim_accel(config=a.config, latency=a.latency)
        # simulated time passes only while the host polls: each poll lets this many cycles
        # run, so it is the simulated host's reaction time to the doorbell
        device.poll_cycles = a.poll_cycles
        try:
            k = accel.pipeline_stages
            dims = [a.dim] * k + [a.classes]
            pb = unit_problem(a.schedule, dims=tuple(dims), rows=a.rows,
                              microbatches=a.microbatches, steps=a.steps, seed=a.seed)
            golden = pb.golden_pipeline()
            start = time.perf_counter()
            run = accel.train_pipeline(pb.inputs, pb.loss_grad, microbatches=a.microbatches,
                                       weights=pb.masters, schedule=a.schedule, relu=pb.relu,
                                       lr=0.25, wd=1e-3, mu=0.5, fmt=pb.fmt)
            wall = time.perf_counter() - start
        finally:
            owner.close()
        trace = golden.run(pb.schedule, pb.inputs, pb.loss_grad, microbatches=pb.microbatches)
        mismatches = compare_run(pb, trace, dict(enumerate(run.logits)), dict(enumerate(run.dx)),
                                 run.weights)
        cycles = int(run.counters["busy_cycles"])
        report = {"unit": "pipeline", "config": a.config, "schedule": pb.schedule, "stages": k,
                  "dims": dims, "rows": a.rows, "microbatches": a.microbatches, "steps": a.steps,
                  "driver": type(accel).__name__, "poll_cycles": a.poll_cycles,
                  "match": not mismatches, "mismatches": mismatches[:20],
                  "cycles": cycles, "grad_wait_cycles": int(run.counters["grad_wait_cycles"]),
                  "bubble": round(run.bubble_fraction(), 4),
                  "bubble_formula": round(bubble_formula(pb.schedule, k, a.microbatches), 4),
                  "saturations": sum(int(c["saturations"]) for c in run.stage_counters),
                  "golden_saturations": int(sum(trace.saturations)),
                  "wall_seconds": round(wall, 4),
                  "counters": _plain_counters(run.counters),
                  "stage_counters": run.stage_counters}
        emit(report, a.json, ("match", "cycles", "bubble", "bubble_formula", "grad_wait_cycles",
                              "wall_seconds"))
        return 0 if report["match"] and report["saturations"] == report["golden_saturations"] else 1
