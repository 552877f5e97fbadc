"""Golden Aggregator speed against scipy's sparse product, on one R-MAT graph.

The golden model is the spec, but also the engine of the ``fpga-emu`` executor and of
every RTL comparison, so it must stay usable on large graphs: the target is at least half
the speed of ``scipy.sparse`` CSR @ dense float64 (the obvious software baseline) on
Graph500 R-MAT scale 18, edge factor 16, 64 features. Both are timed in the same run,
best of 3, after one warm-up call each.

    python -m benchmarks.bench_golden [OUT_DIR]     # writes OUT_DIR/bench_golden.json
"""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gnnweave.fixed import FixedFormat
from gnnweave.generators import rmat
from gnnweave.graph import gcn_norm, quantize_weights
from gnnweave.golden.aggregate import AggregateFormat, aggregate

SCALE = 18
EDGE_FACTOR = 16
FEAT_DIM = 64
REPEATS = 3
TARGET_RATIO = 0.5


def best_time(fn, repeats: int = REPEATS) -> tuple[float, object]:
    result = fn()   # warm-up: page faults, caches, lazy imports
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def run(out_dir, *, scale: int = SCALE, edge_factor: int = EDGE_FACTOR,
        feat_dim: int = FEAT_DIM, repeats: int = REPEATS) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=8, desc="bench_golden", unit="step", leave=False)

    start = time.perf_counter()
    graph = rmat(scale, edge_factor, seed=0)
    generate_seconds = time.perf_counter() - start
    steps.update()

    rng = np.random.default_rng(0)
    x_float = rng.standard_normal((graph.num_nodes, feat_dim))
    fmt = AggregateFormat(FixedFormat(16, 8), None, FixedFormat(16, 8))
    x_q, _ = fmt.feat.quantize(x_float)
    x_dequant = fmt.feat.to_float(x_q)
    adjacency = graph.to_scipy()

    scipy_seconds, scipy_out = best_time(lambda: adjacency @ x_dequant, repeats)
    steps.update()
    golden = {}
    for reduce in ("sum", "mean", "max"):
        golden[reduce] = best_time(lambda r=reduce: aggregate(graph, x_q, r, fmt), repeats)
        steps.update()

    # the sum is exact here (shift 0): it must equal scipy wherever it did not saturate
    summed = golden["sum"][1]
    fits = np.abs(scipy_out) <= fmt.out.max_value
    sum_matches = bool(np.array_equal(fmt.out.to_float(summed.out)[fits], scipy_out[fits]))

    # weighted: GCN normalisation D^-1/2 (A+I) D^-1/2, weights in Q1.14
    normalized = gcn_norm(graph)
    weighted_fmt = AggregateFormat(FixedFormat(16, 8), FixedFormat(16, 14), FixedFormat(16, 8))
    w_q, _ = quantize_weights(normalized, weighted_fmt.weight)
    weighted_adjacency = normalized.to_scipy()
    steps.update()
    scipy_weighted_seconds, _ = best_time(lambda: weighted_adjacency @ x_dequant, repeats)
    steps.update()
    golden_weighted_seconds, _ = best_time(
        lambda: aggregate(normalized, x_q, "sum", weighted_fmt, weights=w_q), repeats)
    steps.update()
    steps.close()

    result = {
        "benchmark": "golden_aggregate_vs_scipy",
        "graph": f"rmat(scale={scale}, edge_factor={edge_factor}, seed=0)",
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "max_in_degree": int(graph.in_degree.max()),
        "feat_dim": feat_dim,
        "repeats": repeats,
        "generate_seconds": generate_seconds,
        "golden_seconds": golden["sum"][0],
        "golden_mean_seconds": golden["mean"][0],
        "golden_max_seconds": golden["max"][0],
        "scipy_seconds": scipy_seconds,
        "ratio_golden_speed_vs_scipy": scipy_seconds / golden["sum"][0],
        "ratio_mean_speed_vs_scipy": scipy_seconds / golden["mean"][0],
        "ratio_max_speed_vs_scipy": scipy_seconds / golden["max"][0],
        "golden_weighted_sum_seconds": golden_weighted_seconds,
        "scipy_weighted_seconds": scipy_weighted_seconds,
        "ratio_weighted_speed_vs_scipy": scipy_weighted_seconds / golden_weighted_seconds,
        "target_ratio": TARGET_RATIO,
        "meets_target": scipy_seconds / golden["sum"][0] >= TARGET_RATIO,
        "golden_sum_equals_scipy_where_unsaturated": sum_matches,
        "sum_saturations": summed.saturations,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    (out_dir / "bench_golden.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else Path("benchmarks/results")
    result = run(out_dir)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
