"""``gnnweave verify aggregate | mac | pipeline``: a unit's RTL in simulation, every output
word compared with the golden model."""
from __future__ import annotations

from gnnweave.clitools import (
    SCHEDULES, add_aggregation_options, add_config_option, emit, positive,
)


class Aggregate:
    """The Aggregator on a whole graph (cocotb bench, Verilator or Icarus)."""

    @staticmethod
    def add_arguments(parser) -> None:
        add_aggregation_options(parser)
        parser.add_argument("--sim", default="verilator", choices=["verilator", "icarus"],
                            help="the simulator")
        parser.add_argument("--latency", type=int, default=32, help="memory read latency in cycles")
        parser.add_argument("--seed", type=int, default=0, help="seed of the random features")
        add_config_option(parser, what="an Aggregator")
        parser.add_argument("--weighted", action="store_true",
                            help="random 16-bit edge weights")
        parser.add_argument("--backpressure", type=float, default=None,
                            help="probability of a pause on each AXI channel per cycle, in [0, 1) "
                                 "(default: none)")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    @staticmethod
    def run(a) -> int:
        from gnnweave.sim.verify import verify_aggregate
        positive("--feat-dim", a.feat_dim)
        positive("--latency", a.latency, minimum=0)
        report = verify_aggregate(a.dataset, a.feat_dim, a.reduce, a.sim, a.latency, a.seed,
                                  a.config, a.weighted, a.backpressure)
        emit(report, a.json, ("match", "mismatches", "nodes", "edges", "cycles", "read_beats",
                              "port_utilization", "ideal_cycles", "sim_seconds",
                              "sim_cycles_per_second", "error"))
        return 0 if report.get("match") else 1


class MacArray:
    """The MacArray behind the whole AXI top (control, operand loads, tiling, write-back)."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--rows", type=int, required=True, help="output rows m")
        parser.add_argument("--cols", type=int, required=True, help="output columns n")
        parser.add_argument("--depth", type=int, required=True, help="depth k")
        parser.add_argument("--mode", choices=["fwd", "dx", "dw"], default="fwd",
                            help="Y = X W, dX = dY W^T or dW = X^T dY")
        parser.add_argument("--seed", type=int, default=0, help="seed of the random operands")
        parser.add_argument("--backpressure", type=float, default=0.0,
                            help="pause probability on every AXI channel, in [0, 1)")
        parser.add_argument("--bias", action="store_true", help="fwd: add a random int32 bias")
        parser.add_argument("--relu", action="store_true", help="fwd: fused ReLU")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    @staticmethod
    def run(a) -> int:
        from gnnweave.sim.mac_bench import verify_mac
        report = verify_mac(rows=a.rows, cols=a.cols, depth=a.depth, mode=a.mode, seed=a.seed,
                            front_end="axi", backpressure=a.backpressure, bias=a.bias,
                            relu=a.relu)
        emit(report, a.json, ("match", "mismatches", "cycles", "mac_utilization",
                              "sim_seconds", "error"))
        return 0 if report.get("match") else 1


class Pipeline:
    """The training pipeline against GoldenPipeline."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--stages", type=int, required=True, help="pipeline stages")
        parser.add_argument("--microbatches", type=int, required=True,
                            help="microbatches per step")
        parser.add_argument("--schedule", choices=SCHEDULES, default="gpipe",
                            help="the pipeline schedule")
        parser.add_argument("--steps", type=int, default=2, help="training steps")
        parser.add_argument("--seed", type=int, default=0, help="seed of the random problem")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    @staticmethod
    def run(a) -> int:
        from gnnweave.sim.pipeline_bench import verify_pipeline
        for name in ("stages", "microbatches", "steps"):
            positive(f"--{name}", getattr(a, name))
        report = verify_pipeline(stages=a.stages, microbatches=a.microbatches,
                                 schedule=a.schedule, steps=a.steps, seed=a.seed)
        emit(report, a.json, ("match", "mismatches", "cycles", "bubble", "sim_seconds", "error"))
        return 0 if report.get("match") else 1
