"""Profiler: time every op of each device over a size sweep and fit its cost model.

Sizes are split in two sets: the *fit* grid, on which :func:`~gnnweave.host.costmodel.fit_op`
fits the coefficients, and *held-out* sizes between the grid points (other node counts,
degrees and feature widths) that the fit never sees; the model's relative error on the
held-out set is what the report calls its accuracy (target: median <= 15 %).

Timing: the whole sweep is measured in ``repeats`` rounds, each round in a fresh random order
(fit and held-out sizes interleaved, so that drifting load on a shared machine hits both
alike), one warm-up and one timed call per size and round; a size's time is the minimum over
rounds (the least-disturbed run; fpga-emu's modelled time needs one round). Which clock (``clock="auto"``, recorded per sample as ``time_source``):

* FPGA kinds: ``OpResult.device_seconds`` when the executor reports it (a board's counters,
  the simulated device's cycles, or fpga-emu's cycle-model *estimate*);
* cpu: the CPU time the process spent in the call (``time.process_time``). On a machine
  shared with other users the wall clock also counts the time the OS gave to their processes
  (measured here: with a load of 6 on 2 cores, ops longer than a scheduler slice ran 3-5x
  their CPU time, at random), which no cost model of the device can predict;
* gpu and the rest: the host wall clock (``OpResult.wall_seconds``).

``clock="wall"`` forces the wall clock everywhere. Devices working in host memory (cpu) have no transfer model.

Calibration on the workload (:func:`calibrate_shares`): a size sweep on uniform synthetic
graphs misses what the real graph does to a device (measured on the partition benchmark's
Zipf-skewed graph: splits sized from the sweep model alone missed their predicted makespan
by 35-300 % in 10 of 11 cases where a CPU share was the slowest). So before a split is
sized, each device runs whole shares (features in, aggregate a row range, rows out:
:func:`share_seconds`) on a few row ranges of the graph to be split, with its own clock, in
rounds of random order; a range's time is the *median* over rounds (robust to a burst of load
from other processes in either direction, where a minimum keeps only the luckiest run), and
:func:`~gnnweave.host.partition.fit_share_cost` rescales or refits the device's share model.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph
from gnnweave.host.costmodel import CostModel, DeviceModel, fit_op

TARGET_MEDIAN_REL_ERR = 0.15
FPGA_KINDS = ("fpga", "fpga-sim", "fpga-emu")
DENSE_OPS = ("dense_forward", "dense_input_grad", "dense_weight_grad")


@dataclass
class SweepSizes:
    graphs: list[tuple[int, int]]            # (nodes, in-degree) of uniform random graphs
    feats: list[int]
    heldout_graphs: list[tuple[int, int]]
    heldout_feats: list[int]
    row_fractions: tuple[float, ...] = (1.0, 0.5)   # shares of the destination rows
    dense: list[tuple[int, int, int]] = field(default_factory=list)          # (m, k, n)
    heldout_dense: list[tuple[int, int, int]] = field(default_factory=list)
    transfer_bytes: list[int] = field(default_factory=list)
    heldout_transfer_bytes: list[int] = field(default_factory=list)


def _grid(ms, ks, ns):
    return [(m, k, n) for m in ms for k in ks for n in ns]


QUICK = SweepSizes(
    graphs=[(n, d) for n in (1000, 4000, 16000) for d in (4, 16)], feats=[8, 32, 128],
    heldout_graphs=[(2000, 8), (8000, 8), (12000, 12)], heldout_feats=[16, 64],
    dense=_grid((512, 4096), (16, 64, 256), (16, 64)),
    heldout_dense=_grid((1024, 2048), (32, 128), (32,)),
    transfer_bytes=[1 << 16, 1 << 20, 1 << 24], heldout_transfer_bytes=[1 << 18, 1 << 22])

FULL = SweepSizes(
    graphs=[(n, d) for n in (1000, 4000, 16000, 64000) for d in (2, 8, 32)],
    feats=[8, 32, 128, 256],
    heldout_graphs=[(2000, 4), (8000, 16), (32000, 8), (48000, 24)], heldout_feats=[16, 64, 192],
    dense=_grid((256, 2048, 16384), (16, 64, 256), (16, 64, 256)),
    heldout_dense=_grid((1024, 8192), (32, 128), (32, 128)),
    transfer_bytes=[1 << 14, 1 << 17, 1 << 20, 1 << 23, 1 << 26],
    heldout_transfer_bytes=[1 << 16, 1 << 19, 1 << 22, 1 << 25])


def limit_blas_threads(n: int | None) -> int | None:
    """Set the thread count of the OpenBLAS libraries bundled with numpy (and scipy); returns
    numpy's previous count (None where no such library is found). Process-wide: measured
    here, multi-threaded OpenBLAS on a loaded 2-core machine made a 512x16 @ 16x64 product
    700x slower (24 ms vs 34 us). numpy 2 bundles ``libscipy_openblas*`` (symbols
    ``scipy_openblas_set_num_threads64_``), numpy 1.26 ``libopenblas64_p*`` (symbols
    ``openblas_set_num_threads64_``): looking for the first name only found nothing under
    numpy 1.26 and silently left every thread on."""
    if n is None:
        return None
    import ctypes
    import glob
    import os

    site = os.path.join(os.path.dirname(np.__file__), os.pardir)
    prev = None
    for libdir in ("numpy.libs", "scipy.libs"):
        for path in sorted(glob.glob(os.path.join(site, libdir, "lib*openblas*.so*"))):
            lib = ctypes.CDLL(path)
            for prefix in ("scipy_openblas_", "openblas_"):
                for suffix in ("64_", "_64_", ""):
                    get = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
                    put = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
                    if get is not None and put is not None:
                        before = int(get())
                        put(int(n))
                        if prev is None and libdir == "numpy.libs":
                            prev = before
                        break
                else:
                    continue
                break
    return prev


def uniform_graph(num_nodes: int, degree: int, seed: int = 0) -> CSRGraph:
    """Every node has ``degree`` in-edges from uniformly random sources."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(0, num_nodes * degree + 1, degree, dtype=np.int64)
    indices = rng.integers(0, num_nodes, num_nodes * degree, dtype=np.int64)
    return CSRGraph(indptr, indices, num_nodes)


@dataclass
class Sample:
    device: str
    op: str
    sizes: dict
    seconds: float
    time_source: str
    heldout: bool

    def to_dict(self):
        return {"device": self.device, "op": self.op, "sizes": self.sizes,
                "seconds": self.seconds, "time_source": self.time_source,
                "heldout": self.heldout}


@dataclass
class Profile:
    cost_model: CostModel
    samples: list[Sample]
    seconds: float

    def to_dict(self) -> dict:
        return {"cost_model": self.cost_model.to_dict(),
                "samples": [s.to_dict() for s in self.samples], "seconds": self.seconds}


def _use_device_time(executor) -> bool:
    return getattr(executor, "kind", "") in FPGA_KINDS


def device_time(executor, call, clock: str = "auto") -> tuple[float, str, object]:
    """Run ``call`` once; return (seconds, time_source, OpResult) by the rules above."""
    kind = getattr(executor, "kind", "")
    if clock == "auto":
        clock = "cpu" if kind == "cpu" else "device" if kind in FPGA_KINDS else "wall"
    t0 = time.process_time()
    res = call()
    cpu = time.process_time() - t0
    if clock == "device" and res.device_seconds is not None:
        return float(res.device_seconds), "device", res
    if clock == "cpu":
        return cpu, "cpu", res
    return float(res.wall_seconds), "wall", res


def _measure_once(executor, call, clock: str) -> tuple[float, str]:
    """One warm-up call, then one timed call."""
    call()
    secs, source, _ = device_time(executor, call, clock)
    return secs, source


#: Row ranges (fractions of N) of a workload graph: fitted on the first, scored on the second.
WORKLOAD_FIT_RANGES = ((0.0, 1.0), (0.0, 0.5), (0.5, 1.0), (0.0, 0.25), (0.25, 0.4), (0.7, 0.8),
                       (0.1, 0.9))
WORKLOAD_HELDOUT_RANGES = ((0.0, 0.7), (0.4, 0.65), (0.6, 0.95), (0.2, 0.3), (0.8, 1.0))


def _jobs(executor, sizes: SweepSizes, seed: int, workload=()):
    """(op, sizes, heldout, thunk) for every measurement of one device."""
    rng = np.random.default_rng(seed)
    jobs = []
    for wi, (g, f) in enumerate(workload):
        x = np.random.default_rng(seed + wi).uniform(-1, 1, (g.num_nodes, f)).astype(np.float32)
        for heldout, ranges in ((False, WORKLOAD_FIT_RANGES), (True, WORKLOAD_HELDOUT_RANGES)):
            for a, b in ranges:
                lo, hi = int(a * g.num_nodes), max(int(b * g.num_nodes), int(a * g.num_nodes) + 1)
                jobs.append(("aggregate",
                             {"edges": int(g.indptr[hi] - g.indptr[lo]), "rows": hi - lo,
                              "feat": f, "nodes": g.num_nodes, "workload": wi},
                             heldout,
                             lambda g=g, x=x, lo=lo, hi=hi:
                             (lambda: executor.aggregate(g, x, "sum", rows=(lo, hi)))))
    for heldout, graphs, feats in ((False, sizes.graphs, sizes.feats),
                                   (True, sizes.heldout_graphs, sizes.heldout_feats)):
        for gi, (n, deg) in enumerate(graphs):
            for f in feats:
                for frac in sizes.row_fractions:
                    hi = max(1, int(round(n * frac)))

                    def thunk(n=n, deg=deg, f=f, hi=hi, gi=gi):
                        g = uniform_graph(n, deg, seed=seed + 7919 * gi + n)
                        x = rng.uniform(-1, 1, (n, f)).astype(np.float32)
                        return lambda: executor.aggregate(g, x, "sum", rows=(0, hi))
                    jobs.append(("aggregate", {"edges": hi * deg, "rows": hi, "feat": f, "nodes": n},
                                 heldout, thunk))
    for heldout, grid in ((False, sizes.dense), (True, sizes.heldout_dense)):
        for (m, k, n) in grid:
            def mk(m=m, k=k, n=n):
                x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
                w = rng.uniform(-1, 1, (k, n)).astype(np.float32) / np.sqrt(k)
                dy = rng.uniform(-1, 1, (m, n)).astype(np.float32)
                return x, w, dy
            jobs.append(("dense_forward", {"m": m, "k": k, "n": n}, heldout,
                         lambda mk=mk: (lambda a: lambda: executor.dense_forward(a[0], a[1]))(mk())))
            jobs.append(("dense_input_grad", {"m": m, "k": k, "n": n}, heldout,
                         lambda mk=mk: (lambda a: lambda: executor.dense_input_grad(a[2], a[1]))(mk())))
            jobs.append(("dense_weight_grad", {"m": m, "k": k, "n": n}, heldout,
                         lambda mk=mk: (lambda a: lambda: executor.dense_weight_grad(a[0], a[2]))(mk())))
    if getattr(executor, "kind", "") != "cpu":
        for heldout, sizes_b in ((False, sizes.transfer_bytes), (True, sizes.heldout_transfer_bytes)):
            for nbytes in sizes_b:
                for op in ("transfer_in", "transfer_out"):
                    def thunk(nbytes=nbytes, op=op):
                        a = rng.uniform(-1, 1, nbytes // 4).astype(np.float32)
                        return lambda: getattr(executor, op)(a)
                    jobs.append((op, {"nbytes": nbytes}, heldout, thunk))
    return jobs


def profile(devices, *, quick: bool = False, sizes: SweepSizes | None = None,
            repeats: int | None = None, seed: int = 0, progress: bool = True,
            ops: tuple[str, ...] | None = None, clock: str = "auto",
            blas_threads: int | None = None, workload=()) -> Profile:
    """Measure each device (names or executor objects) on the sweep and fit its models.

    ``blas_threads``: limit numpy's OpenBLAS threads while profiling (and restore after).
    ``workload``: ``[(graph, feat_dim), ...]`` to calibrate the aggregation model on the
    graphs that will actually be split: the model is then fitted on row ranges of those
    graphs only (:data:`WORKLOAD_FIT_RANGES`) and scored on other ranges
    (:data:`WORKLOAD_HELDOUT_RANGES`). A gather's cost depends on the graph's locality and
    degree skew, which the size features do not see (measured: the same executor gathered
    2x faster per edge on a Zipf-skewed graph than on a uniform one of the same size)."""
    prev_threads = limit_blas_threads(blas_threads)
    try:
        return _profile(devices, quick=quick, sizes=sizes, repeats=repeats, seed=seed,
                        progress=progress, ops=ops, clock=clock, workload=workload)
    finally:
        if prev_threads is not None:
            limit_blas_threads(prev_threads)


def _profile(devices, *, quick, sizes, repeats, seed, progress, ops, clock, workload) -> Profile:
    from tqdm import tqdm

    sizes = sizes or (QUICK if quick else FULL)
    repeats = repeats or (3 if quick else 5)
    executors = []
    for d in devices:
        if isinstance(d, str):
            from gnnweave.host.executors import make_executor
            executors.append(make_executor(d))
        else:
            executors.append(d)
    t0 = time.perf_counter()
    all_jobs = [(ex, job) for i, ex in enumerate(executors) for job in _jobs(ex, sizes, seed + i, workload)
                if ops is None or job[0] in ops]
    rng = np.random.default_rng(seed)
    best: dict[int, tuple[float, str]] = {}
    plan = []
    for r in range(repeats):
        for j in rng.permutation(len(all_jobs)):
            ex = all_jobs[j][0]
            if r > 0 and getattr(ex, "kind", "") == "fpga-emu":
                continue   # a modelled time does not vary between runs
            plan.append(int(j))
    for j in tqdm(plan, desc="profile", unit="op", disable=not progress, leave=False):
        ex, (op, sz, heldout, thunk) = all_jobs[j]
        secs, source = _measure_once(ex, thunk(), clock)
        if j not in best or secs < best[j][0]:
            best[j] = (secs, source)
    samples = [Sample(ex.name, op, sz, best[j][0], best[j][1], heldout)
               for j, (ex, (op, sz, heldout, _)) in enumerate(all_jobs)]
    model = CostModel(meta={"quick": quick, "repeats": repeats, "seed": seed})
    for ex in executors:
        dm = DeviceModel(ex.name, getattr(ex, "kind", ex.name))
        for op in sorted({s.op for s in samples if s.device == ex.name}):
            mine = [s for s in samples if s.device == ex.name and s.op == op]
            if op == "aggregate" and any("workload" in s.sizes for s in mine):
                mine = [s for s in mine if "workload" in s.sizes]
            fit = [(s.sizes, s.seconds) for s in mine if not s.heldout and s.seconds > 0]
            held = [(s.sizes, s.seconds) for s in mine if s.heldout and s.seconds > 0]
            if not fit:
                continue
            dm.ops[op] = fit_op(op, fit, held, time_source=mine[0].time_source)
        model.devices[ex.name] = dm
    return Profile(model, samples, time.perf_counter() - t0)


#: Marker of each op in the profile plot (colour: the device; filled: held out).
OP_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def plot_series(samples) -> list[dict]:
    """How :func:`plot_profile` draws ``samples``: one series per (device, op, held out),
    each with its ``color`` (one per device), ``marker`` (one per op) and ``filled``
    (held-out points filled, fitted points hollow)."""
    devices = list(dict.fromkeys(s.device for s in samples))
    ops = list(dict.fromkeys(s.op for s in samples))
    series = {}
    for s in samples:
        key = (s.device, s.op, bool(s.heldout))
        if key not in series:
            series[key] = dict(device=s.device, op=s.op, heldout=bool(s.heldout),
                               color=f"C{devices.index(s.device) % 10}",
                               marker=OP_MARKERS[ops.index(s.op) % len(OP_MARKERS)],
                               filled=bool(s.heldout), samples=[])
        series[key]["samples"].append(s)
    return list(series.values())


def plot_profile(samples, model: CostModel, png: Path):
    """Predicted vs measured time of every profiled op, log-log: colour by device, marker by
    op, held-out points filled and fitted ones hollow; returns the figure's legend labels."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(7, 5.5))
    for ser in plot_series(samples):
        measured = [s.seconds for s in ser["samples"]]
        predicted = [model.predict(s.device, s.op, **s.sizes) for s in ser["samples"]]
        ax.scatter(measured, predicted, s=18, marker=ser["marker"], alpha=0.75,
                   facecolors=ser["color"] if ser["filled"] else "none",
                   edgecolors=ser["color"], linewidths=0.9)
    lo = min(s.seconds for s in samples)
    hi = max(s.seconds for s in samples)
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured time [s]")
    ax.set_ylabel("predicted time [s]")
    ax.set_title("cost model: predicted vs measured time per op")
    series = plot_series(samples)
    devices = list(dict.fromkeys((x["device"], x["color"]) for x in series))
    ops = list(dict.fromkeys((x["op"], x["marker"]) for x in series))
    handles = ([Line2D([], [], ls="", marker="o", color=c, label=d) for d, c in devices]
               + [Line2D([], [], ls="", marker=m, color="0.3", mfc="none", label=o) for o, m in ops]
               + [Line2D([], [], ls="", marker="o", color="0.3", mfc="none", label="fitted"),
                  Line2D([], [], ls="", marker="o", color="0.3", label="held out")])
    legend = ax.legend(handles=handles, fontsize=7, loc="upper left", frameon=False,
                       title="device (colour), op (marker)", title_fontsize=7)
    labels = [t.get_text() for t in legend.get_texts()]
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return labels


#: The cost model's file name in ``gnnweave profile --out FOLDER``.
COST_MODEL_FILE = "cost_model.json"


def profile_main(devices: list[str], out: str | None, quick: bool) -> dict:
    """``gnnweave profile --devices ... [--out FOLDER] [--quick] --json``.

    Profiles the devices, returns the report (cost model, per-op held-out errors, samples);
    with ``out`` also writes it to the folder ``out`` as ``cost_model.json`` (loadable by
    ``CostModel.load``) and its predicted-vs-measured plot ``cost_model.png``.
    """
    prof = profile(devices, quick=quick)
    cm = prof.cost_model
    per_op = {dev: {op: {"heldout_median_rel_err": m.heldout_median_rel_err,
                         "heldout_p90_rel_err": m.heldout_p90_rel_err,
                         "fit_median_rel_err": m.fit_median_rel_err,
                         "time_source": m.time_source, "coef": m.coef,
                         "n_fit": m.n_fit, "n_heldout": m.n_heldout}
                    for op, m in dm.ops.items()}
              for dev, dm in cm.devices.items()}
    held = [s for s in prof.samples if s.heldout]
    errs = [abs(cm.predict(s.device, s.op, **s.sizes) - s.seconds) / s.seconds for s in held]
    overall = float(np.median(errs)) if errs else None
    # judged per device: a device whose times are a formula (fpga-emu's cycle model) is
    # predicted exactly and would hide a poorly modelled device in a pooled median
    per_device = {}
    for dev in cm.devices:
        dev_errs = [e for s, e in zip(held, errs) if s.device == dev]
        per_device[dev] = float(np.median(dev_errs)) if dev_errs else None
    worst = max((v for v in per_device.values() if v is not None), default=None)
    report = {
        "devices": list(cm.devices), "quick": quick, "seconds": prof.seconds,
        "heldout_median_rel_err": overall,
        "heldout_median_rel_err_per_device": per_device,
        "heldout_p90_rel_err": float(np.percentile(errs, 90)) if errs else None,
        "target_median_rel_err": TARGET_MEDIAN_REL_ERR,
        "meets_target": worst is not None and worst <= TARGET_MEDIAN_REL_ERR,
        "per_op": per_op,
        "links": {dev: dm.link for dev, dm in cm.devices.items()},
        "cost_model": cm.to_dict(),
        "samples": [s.to_dict() for s in prof.samples],
    }
    if out:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / COST_MODEL_FILE
        report["out"] = str(path)
        png = path.with_suffix(".png")
        try:
            plot_profile(prof.samples, cm, png)
            report["plot"] = str(png)
        except Exception as e:   # the JSON is the result; a missing plot is only reported
            report["plot_error"] = f"{type(e).__name__}: {e}"
        path.write_text(json.dumps(report, indent=1))
    return report


#: Row ranges (fractions of N) measured by :func:`calibrate_shares`: sizes over a 10x range
#: (so a fixed cost separates from the work) and both halves and all quarters of the rows.
CALIBRATION_FRACTIONS = ((0.0, 1.0), (0.0, 0.5), (0.5, 1.0), (0.0, 0.25), (0.25, 0.5),
                         (0.5, 0.75), (0.75, 1.0), (0.0, 0.1))


def _deterministic(executor) -> bool:
    """fpga-emu's device time is a formula of the sizes: one measurement is enough."""
    return getattr(executor, "kind", "") == "fpga-emu"


def share_seconds(executor, graph, x, rows, *, reduce: str = "sum", clock: str = "auto",
                  transfers: bool = True, copy_in: bool = True) -> float:
    """Device time of one share as a partitioned aggregation runs it: ``x`` in, aggregate
    destination rows ``rows = (lo, hi)``, the result rows out (each timed by
    :func:`device_time`'s rules and summed; ``transfers=False``: the aggregation only;
    ``copy_in=False``: ``x`` is on the device already, as for a work-stealing chunk after the
    device's first). An empty range costs 0."""
    lo, hi = rows
    if hi <= lo:
        return 0.0
    if not transfers:
        return device_time(executor, lambda: executor.aggregate(graph, x, reduce, rows=(lo, hi)),
                           clock)[0]
    if not copy_in:
        t_agg, _, res = device_time(executor, lambda: executor.aggregate(
            graph, x, reduce, rows=(lo, hi)), clock)
        return t_agg + device_time(executor, lambda: executor.transfer_out(res.value), clock)[0]
    t_in, _, res_in = device_time(executor, lambda: executor.transfer_in(x), clock)
    t_agg, _, res = device_time(executor, lambda: executor.aggregate(
        graph, res_in.value, reduce, rows=(lo, hi)), clock)
    t_out, _, _ = device_time(executor, lambda: executor.transfer_out(res.value), clock)
    return t_in + t_agg + t_out


def measure_share_samples(tasks, graph, x, *, rounds: int = 5, seed: int = 0,
                          reduce: str = "sum", clock: str = "auto", warmup="auto",
                          transfers: bool = True, groups=None) -> dict:
    """Device times of each ``(executor, (lo, hi))`` in ``tasks`` over ``rounds`` rounds, each
    round in a fresh random order (so drifting load hits all tasks alike). Deterministic
    (modelled) devices are measured once. Returns ``{task index: [seconds, ...]}``.

    ``warmup``: run the aggregation once, untimed, before a timed share so that caches are
    warm, as in every epoch after the first: ``True`` before every timed share, ``False``
    never, ``"auto"`` (default) only where the previous timed share ran on another kind of
    executor (or none ran yet). Shares of one graph and one ``x`` run back to back on the
    same kind of device already leave each other the caches warm (measured on the partition
    benchmark's graph, cpu executor, 60 pairs: a share timed straight after another share
    took a median 1.01x the time of the same share timed after its own warm-up), and a
    warm-up before every share doubles the time a round takes, time better spent on more
    rounds: on a shared 2-core host one share's CPU time varies by 20-30 % (coefficient of
    variation) from call to call under a load of 4-8, and the median's error only falls with
    more samples.

    ``groups``: None (each round runs the tasks in one random order), or a list of lists of
    task indices holding every task once: each round then runs the groups in a random order
    and the tasks of a group back to back, in a random order. For the shares of one split,
    which run at the same time on the real devices: run one after another on one host, the
    closer together they run, the more alike the host's speed (its load comes in bursts)."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: must be >= 1")
    if warmup not in (True, False, "auto"):
        raise ValueError(f"warmup={warmup!r}: choose True, False or 'auto'")
    grouped = groups is not None
    if grouped:
        groups = [[int(i) for i in g] for g in groups]
        flat = sorted(i for g in groups for i in g)
        if flat != list(range(len(tasks))):
            raise ValueError(f"groups: must hold every task index 0..{len(tasks) - 1} exactly "
                             f"once (got {flat})")
    else:
        groups = [[i] for i in range(len(tasks))]
    rng = np.random.default_rng(seed)
    times: dict[int, list[float]] = {i: [] for i in range(len(tasks))}
    last_kind = None
    for r in range(rounds):
        order = []
        for k in rng.permutation(len(groups)):
            g = groups[k]
            order += [g[j] for j in rng.permutation(len(g))] if grouped else g
        for i in order:
            ex, (lo, hi) = tasks[i]
            if r > 0 and _deterministic(ex):
                continue
            kind = getattr(ex, "kind", None)
            if hi > lo and not _deterministic(ex) and (
                    warmup is True or (warmup == "auto" and kind != last_kind)):
                ex.aggregate(graph, x, reduce, rows=(lo, hi))
            times[int(i)].append(share_seconds(ex, graph, x, (lo, hi), reduce=reduce,
                                               clock=clock, transfers=transfers))
            if hi > lo:
                last_kind = kind
    return times


#: How :func:`measure_shares` reduces a task's calls to one time.
SHARE_STATISTICS = {"median": np.median, "min": np.min}


def measure_shares(tasks, graph, x, *, rounds: int = 5, seed: int = 0, reduce: str = "sum",
                   clock: str = "auto", warmup="auto", transfers: bool = True,
                   statistic: str = "median") -> dict:
    """Device time of each ``(executor, (lo, hi))`` in ``tasks`` over ``rounds`` interleaved
    rounds (see :func:`measure_share_samples`): the ``statistic`` of its calls, ``"median"``
    or ``"min"`` (the call the host disturbed least: other processes only ever slow a call
    down, so on a shared host the fastest of a few calls is the device's own speed, as
    ``timeit`` reports it). Returns ``{task index: seconds}``."""
    if statistic not in SHARE_STATISTICS:
        raise ValueError(f"statistic={statistic!r}: choose one of {sorted(SHARE_STATISTICS)}")
    times = measure_share_samples(tasks, graph, x, rounds=rounds, seed=seed, reduce=reduce,
                                  clock=clock, warmup=warmup, transfers=transfers)
    return {i: float(SHARE_STATISTICS[statistic](v)) for i, v in times.items()}


def calibrate_shares(executors, graph, x, priors=None, *, fractions=CALIBRATION_FRACTIONS,
                     rounds: int = 5, seed: int = 0, method: str = "auto", reduce: str = "sum",
                     clock: str = "auto", transfers: bool = True,
                     statistic: str = "median") -> dict:
    """Calibrate each executor's share model on the graph that will be split.

    ``statistic``: how each row range's ``rounds`` calls become one sample
    (:func:`measure_shares`); use the statistic the split's measured times will be judged by.

    ``priors``: ``{device name: ShareCost}`` before calibration (e.g. ``share_costs`` of a
    profiled CostModel), or None to fit from the samples alone. Returns
    ``{device name: ShareFit}``; pass ``{d: f.cost for d, f in fits.items()}`` to
    :func:`~gnnweave.host.partition.partition_rows` or a ``Rebalancer``."""
    from gnnweave.host.partition import fit_share_cost

    n = graph.num_nodes
    if n == 0:
        raise InputError("calibrate_shares: the graph has no nodes")
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != n:
        raise ValueError(f"calibrate_shares: x has shape {x.shape}, expected ({n}, F)")
    ranges = []
    for i, (a, b) in enumerate(fractions):
        if not (0.0 <= a < b <= 1.0):
            raise ValueError(f"fractions[{i}] = {(a, b)}: need 0 <= lo < hi <= 1")
        lo = min(int(a * n), n - 1)
        ranges.append((lo, max(int(round(b * n)), lo + 1)))
    ranges = list(dict.fromkeys(ranges))   # small graphs can round two fractions together
    names = [getattr(ex, "name", str(ex)) for ex in executors]
    if len(set(names)) != len(names):
        raise ValueError(f"calibrate_shares: executor names repeat: {names}")
    tasks = [(ex, r) for ex in executors for r in ranges]
    med = measure_shares(tasks, graph, x, rounds=rounds, seed=seed, reduce=reduce, clock=clock,
                         transfers=transfers, statistic=statistic)
    fits = {}
    for name, ex in zip(names, executors):
        samples = [(int(graph.indptr[hi] - graph.indptr[lo]), hi - lo, med[i])
                   for i, (e, (lo, hi)) in enumerate(tasks) if e is ex]
        prior = None if priors is None else priors.get(name)
        if priors is not None and prior is None:
            raise ValueError(f"priors: no entry for device {name!r} (have {sorted(priors)})")
        bad = [s for s in samples if not s[2] > 0]
        if bad:
            raise ValueError(f"calibrate_shares: device {name!r} measured {bad[0][2]} s on "
                             f"{bad[0][1]} rows (its clock reports no time)")
        fits[name] = fit_share_cost(samples, prior, method=method)
    return fits


def calibrated_partition(executors, graph, feat_dim: int, *, rounds: int = 3, seed: int = 0,
                         transfers: bool = False):
    """Split ``graph``'s rows over ``executors`` (``{name: executor}``) with no prior model:
    calibrate each on row ranges of the graph (random features of width ``feat_dim``; the
    cost does not depend on the values) and size the split from the calibrated models.
    ``transfers=False`` times the aggregation alone, as the training runtime's rebalancer
    measures shards. Returns ``(partition, {name: ShareCost}, {name: ShareFit})``."""
    from gnnweave.host.partition import partition_rows

    if feat_dim < 1:
        raise ValueError(f"feat_dim={feat_dim}: must be >= 1")
    names = list(executors)
    x = np.random.default_rng(seed).uniform(-1, 1, (graph.num_nodes, feat_dim)).astype(np.float32)
    fits = calibrate_shares([executors[d] for d in names], graph, x, rounds=rounds, seed=seed,
                            transfers=transfers)
    fits = dict(zip(names, fits.values()))   # keyed as the caller named them
    costs = {d: f.cost for d, f in fits.items()}
    return partition_rows(graph, feat_dim, costs, devices=names), costs, fits
