"""Run the Aggregator RTL on a whole graph and compare it with the golden model.

:func:`verify_aggregate` is what ``gnnweave verify aggregate`` calls: it builds the RTL
(cached), runs one job through the cocotb bench (``job_from_file`` in
:mod:`gnnweave.sim.aggregate_bench`) with random int16 features and, if asked, random
edge weights, and reports correctness and speed.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from gnnweave.errors import InputError
from gnnweave.layout import AggregateJob

def load_graph(spec: str, seed: int = 0):
    """``cora`` | ``citeseer`` | ``rmat:SCALE:EF`` | a dataset path -> CSRGraph."""
    parts = str(spec).split(":")
    if parts[0].lower() == "rmat" and len(parts) == 3:
        from gnnweave.generators import rmat
        try:
            scale, edge_factor = int(parts[1]), int(parts[2])
        except ValueError:
            raise InputError(f"graph {spec!r}: expected rmat:SCALE:EF with integers") from None
        return rmat(scale, edge_factor, seed=seed)
    from gnnweave.datasets import load_dataset
    return load_dataset(spec, seed=seed).graph


def make_job(graph, feat_dim: int, reduce: str = "sum", *, weighted: bool = False, seed: int = 0,
             feat_range: int = 600, layout: dict | None = None) -> AggregateJob:
    """A job on ``graph`` with random features (``|x| <= feat_range``) and weights."""
    from gnnweave.sim.aggregate_bench import REDUCES, default_shift
    if reduce not in REDUCES:
        raise InputError(f"reduce {reduce!r}: choose one of {', '.join(REDUCES)}")
    if feat_dim < 1:
        raise InputError(f"feat_dim must be >= 1, got {feat_dim}")
    rng = np.random.default_rng(seed)
    x = rng.integers(-feat_range, feat_range + 1, size=(graph.num_nodes, feat_dim), dtype=np.int64)
    w = rng.integers(-32768, 32768, size=graph.num_edges, dtype=np.int64) if weighted else None
    return AggregateJob(indptr=graph.indptr, indices=graph.indices, x=x, reduce=REDUCES[reduce],
                        shift=default_shift(weighted), weights=w, **(layout or {}))


def ideal_read_beats(job: AggregateJob, edges: int) -> int:
    """Read beats the job needs at least: the metadata streams plus one row per valid edge."""
    beats = lambda nbytes: -(-nbytes // job.bus_bytes)  # noqa: E731
    total = beats((job.num_nodes + 1) * 4) + beats(int(job.num_edges) * 4)
    if job.use_weights:
        total += beats(int(job.num_edges) * 2)
    return total + edges * beats(job.row_bytes)


def check_run_options(cfg, config: str, *, feat_dim: int, reduce: str, latency: int,
                      backpressure: float | None) -> None:
    """Refuse, before any build, a run the configuration cannot do or the bench cannot drive
    (the RTL would answer a too-wide row with a config error, read as mismatches)."""
    if not 1 <= feat_dim <= cfg.max_feat_dim:
        raise InputError(f"feat_dim={feat_dim}: configuration {config!r} takes 1..{cfg.max_feat_dim}")
    if reduce not in cfg.reduce_ops:
        raise InputError(f"reduce={reduce!r}: configuration {config!r} is built with "
                         f"{', '.join(cfg.reduce_ops)} only")
    if latency < 0:
        raise InputError(f"latency={latency}: must be >= 0 cycles")
    if backpressure is not None and not 0.0 <= backpressure < 1.0:
        raise InputError(f"backpressure={backpressure}: a pause probability in [0, 1) "
                         f"(1 would pause every cycle and never finish)")


def verify_aggregate(graph: str, feat_dim: int, reduce: str = "sum", sim: str = "verilator",
                     latency: int = 32, seed: int = 0, config: str = "default",
                     weighted: bool = False, backpressure: float | None = None,
                     waves: bool | None = None) -> dict:
    """Run the RTL on ``graph`` and compare with golden; returns a JSON-able report.

    Keys: match, mismatches, nodes, edges (gathered), graph_edges, cycles (busy_cycles),
    read_beats, write_beats, port_utilization (read beats / busy cycles), ideal_cycles
    (read beats needed: the port's limit), efficiency (ideal / busy), sim_seconds,
    sim_cycles_per_second, build_seconds, build_cached, the counters, violations, error.
    """
    from gnnweave.sim import runner
    from gnnweave.hw.configs import get_config
    from gnnweave.sim.aggregate_bench import job_to_npz, layout_for

    from gnnweave.sim import toolchain
    toolchain.setup(sim)   # a missing simulator is named before minutes of generation
    cfg = get_config(config)
    check_run_options(cfg, config, feat_dim=feat_dim, reduce=reduce, latency=latency,
                      backpressure=backpressure)
    layout = layout_for(cfg)
    g = load_graph(graph, seed=seed)
    job = make_job(g, feat_dim, reduce, weighted=weighted, seed=seed, layout=layout)
    t0 = time.perf_counter()
    built = runner.build_aggregator(config, sim, waves=waves)
    build_wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="gnnweave-verify-") as tmp:
        job_file = Path(tmp) / "job.npz"
        job_to_npz(job, job_file)
        params = {"config": config, "latency": latency, "seed": seed, "job_file": str(job_file),
                  "backpressure": backpressure}
        run = runner.run(built, runner.BENCH_MODULE, testcase="job_from_file", params=params,
                         run_name=f"verify-{Path(str(graph)).name}", check=False)
    rep = run.results.get("job")
    report = {"graph": str(graph), "sim": sim, "config": config, "reduce": reduce,
              "weighted": bool(weighted), "feat_dim": int(feat_dim), "latency": int(latency),
              "seed": int(seed), "nodes": int(g.num_nodes), "graph_edges": int(g.num_edges),
              "build_seconds": round(built.build_seconds, 2), "build_cached": built.cached,
              "build_wall_seconds": round(build_wall, 2), "run_wall_seconds": round(run.wall_seconds, 2),
              "log": str(run.log)}
    if rep is None:
        report.update(match=False, error=(run.failures[0] if run.failures else
                                          f"simulation produced no result; see {run.log}"))
        return report
    c = rep["counters"]
    busy = max(int(c["busy_cycles"]), 1)
    ideal = ideal_read_beats(job, int(rep["golden"]["edges"]))
    report.update(
        match=run.failed == 0 and rep["mismatches"] == 0,
        mismatches=int(rep["mismatches"]),
        error=run.failures[0] if run.failures else None,
        edges=int(c["edges"]),
        cycles=int(c["busy_cycles"]),
        read_beats=int(c["read_beats"]),
        write_beats=int(c["write_beats"]),
        port_utilization=round(int(c["read_beats"]) / busy, 4),
        ideal_cycles=int(ideal),
        efficiency=round(ideal / busy, 4),
        sim_seconds=round(rep["wall_seconds"], 3),
        sim_cycles_per_second=round(rep["sim_cycles"] / max(rep["wall_seconds"], 1e-9), 1),
        counters={k: int(v) for k, v in c.items()},
        status=int(rep["status"]),
        violations=rep["violations"],
        stray_writes=rep["stray_writes"],
    )
    return report


def main(argv=None) -> int:
    """``python -m gnnweave.sim.verify GRAPH FEAT_DIM [--reduce R] [--sim S] ...`` -> JSON."""
    import argparse
    import json
    p = argparse.ArgumentParser(prog="python -m gnnweave.sim.verify", description=__doc__.splitlines()[0])
    p.add_argument("graph")
    p.add_argument("feat_dim", type=int)
    p.add_argument("--reduce", default="sum", choices=["sum", "mean", "max"])
    p.add_argument("--sim", default="verilator", choices=["verilator", "icarus"])
    p.add_argument("--latency", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default="default")
    p.add_argument("--weighted", action="store_true")
    p.add_argument("--backpressure", type=float, default=None)
    a = p.parse_args(argv)
    rep = verify_aggregate(a.graph, a.feat_dim, a.reduce, a.sim, a.latency, a.seed, a.config,
                           a.weighted, a.backpressure)
    print(json.dumps(rep, indent=1))
    return 0 if rep.get("match") else 1


if __name__ == "__main__":
    raise SystemExit(main())
