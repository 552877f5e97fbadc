"""The native simulated device against the cocotb bench: simulated cycles per second.

The same job (same graph, features, latency, no backpressure) runs on the cocotb bench
(:func:`gnnweave.sim.verify.verify_aggregate`: Verilator driven per cycle from Python by
cocotbext-axi) and on the native device (:mod:`gnnweave.sim.device`: the clock in
C++). Reported per graph: the busy cycles of both (they must be identical), simulated
cycles per wall second of both and their ratio, and the native device's cycles per CPU
second of its own thread (the wall figure depends on the machine's load). The totals over
the graphs (cycles / seconds, both simulators) give the headline figures. A larger
native-only run (R-MAT 13/16) measures the clock loop alone and the whole ``run_job``
(registers, memory image, output read-back) per CPU second. Targets: native >= 1,000,000
cycles/s and >= 20x the cocotb bench. Every native run is checked bit-exact against the
golden model.

The whole top (:func:`whole_top`): the same Aggregator job (CiteSeer, F = 32) on the build
the fpga-sim executor runs (``small``: Aggregator, MacArray, Pipeline) and on the
Aggregator-alone build (``small-agg``), interleaved in one process, and on ``small`` with
every unit clock free-running (what the idle units cost without the unit clocks). Target:
``small`` >= 1,000,000 cycles/s, as fast as ``small-agg``. The headline ratio is of the
best round of each; the JSON also has each round's ratio (min, median, max) and how far
``small-agg``'s own speed moved over the rounds (the host's noise in this run).

    python -m benchmarks.bench_device [OUT_DIR]    # writes OUT_DIR/bench_device.json
    python -m benchmarks.bench_device --whole-top [OUT_DIR]   # OUT_DIR/whole_top.json only
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

TARGET_CYCLES_PER_SECOND = 1_000_000
LATENCY = 32
FEAT_DIM = 16
GRAPHS = ("cora", "rmat:12:8")
#: native only (the cocotb bench would take minutes on it)
LARGE_GRAPH = "rmat:13:16"
TARGET_SPEEDUP = 20.0
#: The whole-top comparison: the fpga-sim executor's build against the Aggregator alone.
WHOLE_TOP_GRAPH = "citeseer"
WHOLE_TOP_FEAT_DIM = 32
WHOLE_TOP_CONFIGS = ("small", "small-agg")


def native_run(graph: str, feat_dim: int, reduce: str, latency: int, config: str,
               weighted: bool = False, repeats: int = 7) -> dict:
    """Best of ``repeats`` runs of one job on the native device (as ``timeit`` does: on
    this shared VM a run is only ever slowed by other work: the same build's best of 3 on
    R-MAT 12/8 was 1.16 M cycles/s at 12:41 and 0.66 M at 12:52 on 2026-11-30, so the
    fastest of a few more is nearer the device's own speed; a run of the small jobs takes
    under 0.1 s)."""
    from gnnweave.golden.aggregate import Reduce, aggregate_raw
    from gnnweave.sim import device as simdevice
    from gnnweave.sim.verify import load_graph, make_job
    job = make_job(load_graph(graph), feat_dim, reduce, weighted=weighted)
    gold = aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce.parse(reduce),
                         shift=job.shift, out_width=16, weights=job.weights)
    timing = {}
    orig = simdevice.NativeAccelerator.run_until_interrupt
    sim = simdevice.NativeAccelerator(job.memory_image(), job.base_addr, latency=latency,
                                     config=config)

    def timed(self, max_cycles):
        cpu, wall = time.thread_time(), time.perf_counter()
        ran = orig(self, max_cycles)
        timing.update(cpu=time.thread_time() - cpu, wall=time.perf_counter() - wall, cycles=ran)
        return ran

    best = None
    simdevice.NativeAccelerator.run_until_interrupt = timed
    try:
        for _ in range(repeats):
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            res = simdevice.run_job(job, latency=latency, config=config, sim=sim)
            job_cpu, job_wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            if not np.array_equal(res.out, gold.out) or res.faults or res.timed_out:
                raise AssertionError(f"native device on {graph}: wrong result "
                                     f"(faults {res.faults}, timed out {res.timed_out})")
            busy = int(res.counters["busy_cycles"])
            run = {"busy_cycles": busy, "cycles": int(timing["cycles"]),
                   "wall_seconds": timing["wall"], "cpu_seconds": timing["cpu"],
                   "job_wall_seconds": job_wall, "job_cpu_seconds": job_cpu}
            if best is None or run["wall_seconds"] < best["wall_seconds"]:
                best = run
    finally:
        simdevice.NativeAccelerator.run_until_interrupt = orig
        sim.close()
    best["cycles_per_second"] = round(best["cycles"] / max(best["wall_seconds"], 1e-9), 1)
    best["cycles_per_cpu_second"] = round(best["cycles"] / max(best["cpu_seconds"], 1e-9), 1)
    # the whole run_job (Python register traffic, memory image, read-back) per busy cycle
    best["job_cycles_per_second"] = round(best["busy_cycles"] / max(best["job_wall_seconds"], 1e-9), 1)
    best["job_cycles_per_cpu_second"] = round(best["busy_cycles"] / max(best["job_cpu_seconds"], 1e-9), 1)
    return best


def whole_top(out_dir=None, graph: str = WHOLE_TOP_GRAPH, feat_dim: int = WHOLE_TOP_FEAT_DIM,
              latency: int = LATENCY, configs=WHOLE_TOP_CONFIGS, repeats: int = 15) -> dict:
    """Simulated cycles per second of one Aggregator job on each build of ``configs`` and on
    the first with its unit clocks free-running, the runs interleaved (round robin, best
    of ``repeats`` each: the host's speed moves, the ratio between builds much less)."""
    from gnnweave.golden.aggregate import Reduce, aggregate_raw
    from gnnweave.sim import device
    from gnnweave.sim.verify import load_graph, make_job
    job = make_job(load_graph(graph), feat_dim, "sum")
    gold = aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce.SUM, shift=job.shift,
                         out_width=16, weights=job.weights)
    variants = [(c, True) for c in configs] + [(configs[0], False)]
    sims, best, builds, rounds = {}, {}, {}, []
    for config in configs:
        build = device.build_native(config)
        builds[config] = {"key": build.key, "cached": build.cached,
                          "build_seconds": round(build.build_seconds, 1)}
        sims[config] = device.NativeAccelerator(job.memory_image(), job.base_addr,
                                                latency=latency, config=config, build=build)
    try:
        for _ in tqdm(range(repeats), desc="whole top", unit="round", leave=False):
            rounds.append({})
            for config, gated in variants:
                sim = sims[config]
                sim.set_unit_gating(gated)
                run = _timed_job(sim, job, latency, config)
                if not np.array_equal(run.pop("out"), gold.out):
                    raise AssertionError(f"{config}: wrong result on {graph}")
                name = config if gated else f"{config} (unit clocks free-running)"
                rounds[-1][name] = run["cycles"] / max(run["cpu_seconds"], 1e-9)
                if name not in best or run["cpu_seconds"] < best[name]["cpu_seconds"]:
                    best[name] = run
    finally:
        for sim in sims.values():
            sim.close()
    for run in best.values():
        run["cycles_per_second"] = round(run["cycles"] / max(run["wall_seconds"], 1e-9), 1)
        run["cycles_per_cpu_second"] = round(run["cycles"] / max(run["cpu_seconds"], 1e-9), 1)
    full, alone = configs[0], configs[1]
    free = f"{full} (unit clocks free-running)"
    cps = {k: v["cycles_per_cpu_second"] for k, v in best.items()}
    # how much the host's speed moved within this run: each round's ratio of the two builds
    # (measured seconds apart) and the spread of one build's speed over the rounds
    ratios = sorted(r[alone] / r[full] for r in rounds)
    alone_speeds = [r[alone] for r in rounds]
    result = {
        "benchmark": "bench_device.whole_top", "graph": graph, "feat_dim": feat_dim,
        "latency": latency, "reduce": "sum", "builds": builds, "runs": best,
        "identical_cycle_counts": len({v["cycles"] for v in best.values()}) == 1 and
        len({v["busy_cycles"] for v in best.values()}) == 1,
        # per CPU second of the simulating thread (comparable on a shared machine)
        f"{full}_cycles_per_second": cps[full],
        f"{alone}_cycles_per_second": cps[alone],
        f"{alone}_over_{full}": round(cps[alone] / cps[full], 3),
        f"{alone}_over_{full}_per_round": {"min": round(ratios[0], 3),
                                            "median": round(ratios[len(ratios) // 2], 3),
                                            "max": round(ratios[-1], 3)},
        f"{alone}_speed_spread_over_rounds": round(max(alone_speeds) / min(alone_speeds), 3),
        "rounds": repeats,
        f"free_running_{full}_cycles_per_second": cps[free],
        f"{full}_over_free_running": round(cps[full] / cps[free], 3),
        "target_cycles_per_second": TARGET_CYCLES_PER_SECOND,
        "meets_target": cps[full] >= TARGET_CYCLES_PER_SECOND,
        "machine": _machine(),
    }
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "whole_top.json").write_text(json.dumps(result, indent=1))
    return result


def _timed_job(sim, job, latency: int, config: str) -> dict:
    """One run_job with the clock loop timed (wall and CPU seconds of this thread)."""
    from gnnweave.sim import device
    timing = {}
    clock_loop = sim.run_until_interrupt

    def timed(max_cycles):
        cpu, wall = time.thread_time(), time.perf_counter()
        ran = clock_loop(max_cycles)
        timing.update(cpu=time.thread_time() - cpu, wall=time.perf_counter() - wall, cycles=ran)
        return ran

    sim.run_until_interrupt = timed
    try:
        res = device.run_job(job, latency=latency, config=config, sim=sim)
    finally:
        del sim.run_until_interrupt
    if res.faults or res.timed_out:
        raise AssertionError(f"{config}: faults {res.faults}, timed out {res.timed_out}")
    return {"out": res.out, "busy_cycles": int(res.counters["busy_cycles"]),
            "cycles": int(timing["cycles"]), "wall_seconds": timing["wall"],
            "cpu_seconds": timing["cpu"]}


def _machine() -> dict:
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "load_average_1min": load}


def run(out_dir, graphs=GRAPHS, feat_dim: int = FEAT_DIM, latency: int = LATENCY,
        config: str = "small-agg", reduce: str = "sum", full_config: str | None = "small") -> dict:
    """Native vs cocotb on ``config`` (default: the Aggregator-only build, the aggregation
    top of the target); ``full_config`` (the whole accelerator top, Aggregator + MacArray)
    is measured natively on the large graph beside it: every unit in the model costs
    simulation time each cycle, busy or not."""
    from gnnweave.sim import device as simdevice
    from gnnweave.sim.verify import verify_aggregate
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=2 + 2 * len(graphs), desc="bench_device", unit="step", leave=False)
    t0 = time.perf_counter()
    build = simdevice.build_native(config)
    build_info = {"cached": build.cached, "build_seconds": round(build.build_seconds, 1),
                  "pgo": simdevice.pgo_enabled(),
                  "cxx_flags": os.environ.get("GNNWEAVE_NATIVE_OPT",
                                              simdevice.DEFAULT_NATIVE_OPT),
                  "wall_seconds": round(time.perf_counter() - t0, 1)}
    steps.update()
    runs = {}
    for graph in graphs:
        native = native_run(graph, feat_dim, reduce, latency, config)
        steps.update()
        rep = verify_aggregate(graph, feat_dim, reduce, "verilator", latency=latency,
                               config=config)
        steps.update()
        cocotb_cps = float(rep.get("sim_cycles_per_second") or 0.0)
        runs[graph] = {
            "native": native,
            "cocotb": {"busy_cycles": rep.get("cycles"), "match": rep.get("match"),
                       "cycles_per_second": cocotb_cps, "sim_seconds": rep.get("sim_seconds")},
            "identical_cycle_counts": native["busy_cycles"] == rep.get("cycles"),
            "speedup_vs_cocotb": round(native["cycles_per_second"] / cocotb_cps, 1)
            if cocotb_cps else None,
            "meets_target": native["cycles_per_second"] >= TARGET_CYCLES_PER_SECOND,
        }
    large = native_run(LARGE_GRAPH, feat_dim, reduce, latency, config) if LARGE_GRAPH else None
    steps.update()
    full = None
    if full_config and LARGE_GRAPH:
        simdevice.build_native(full_config)
        full = {"config": full_config,
                **native_run(LARGE_GRAPH, feat_dim, reduce, latency, full_config)}
    top = whole_top(out_dir)
    steps.close()
    native_cycles = sum(r["native"]["cycles"] for r in runs.values())
    native_wall = sum(r["native"]["wall_seconds"] for r in runs.values())
    native_cpu = sum(r["native"]["cpu_seconds"] for r in runs.values())
    cocotb_cycles = sum(r["cocotb"]["busy_cycles"] or 0 for r in runs.values())
    cocotb_wall = sum(r["cocotb"]["sim_seconds"] or 0 for r in runs.values())
    native_cps = native_cycles / max(native_wall, 1e-9)
    cocotb_cps = cocotb_cycles / cocotb_wall if cocotb_wall else 0.0
    speedup = native_cps / cocotb_cps if cocotb_cps else None
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    result = {
        "benchmark": "bench_device",
        "config": config, "feat_dim": feat_dim, "latency": latency, "reduce": reduce,
        "target_cycles_per_second": TARGET_CYCLES_PER_SECOND,
        "native_build": build_info,
        "graphs": list(graphs),
        # totals over `graphs`, both simulators in this run on the same jobs
        "native_cycles_per_second": round(native_cps, 1),
        "native_cycles_per_cpu_second": round(native_cycles / max(native_cpu, 1e-9), 1),
        "cocotb_cycles_per_second": round(cocotb_cps, 1),
        "speedup_vs_cocotb": round(speedup, 1) if speedup else None,
        "large_graph": LARGE_GRAPH, "large_native": large,
        "full_top_large_native": full,
        "whole_top": top,
        "meets_target": bool(native_cps >= TARGET_CYCLES_PER_SECOND and speedup
                             and speedup >= TARGET_SPEEDUP),
        # the same with CPU seconds of the simulating thread: what a busy shared machine
        # leaves comparable (the cocotb ratio stays a wall-clock one)
        "meets_target_per_cpu_second": bool(
            native_cycles / max(native_cpu, 1e-9) >= TARGET_CYCLES_PER_SECOND and speedup
            and speedup >= TARGET_SPEEDUP),
        "target_speedup": TARGET_SPEEDUP,
        "runs": runs,
        "identical_cycle_counts": all(r["identical_cycle_counts"] for r in runs.values()),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1min": load},
    }
    (out_dir / "bench_device.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    only_top = "--whole-top" in argv
    argv = [a for a in argv if a != "--whole-top"]
    out = Path(argv[0]) if argv else Path("benchmarks/results")
    if only_top:
        res = whole_top(out)
        print(json.dumps(res, indent=1))
        return 0 if res["identical_cycle_counts"] else 1
    res = run(out)
    print(json.dumps(res, indent=1))
    return 0 if res["identical_cycle_counts"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
