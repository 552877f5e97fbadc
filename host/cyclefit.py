"""Fit and check :mod:`gnnweave.host.cyclemodel` against the simulated device.

``python -m gnnweave.host.cyclefit fit [--config small-agg]`` runs the fit set on the
simulated device (the Verilated RTL through the PYNQ driver, :class:`~gnnweave.host.driver.SimAccel`),
fits the Aggregator's constants by least squares on relative errors
(:func:`scipy.optimize.least_squares`) and writes them, with the build parameters of every
named configuration (exported from ``gnnweave/buildconfig.py``), into ``host/cyclemodel.json``.
``python -m gnnweave.host.cyclefit check`` runs graphs the fit never saw and prints
measured against predicted cycles. The first run of a configuration builds its simulated
device (minutes; cached afterwards).

Jobs are what the ``fpga-sim`` executor submits: a whole graph, or a row shard ``lo..hi``
as ``N`` rows of which the first ``hi - lo`` carry the shard's edges (the engine bounds
indices by its row count, so a shard keeps all ``N`` rows).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass

import numpy as np

from gnnweave.host import cyclemodel as cm


@dataclass(frozen=True)
class Case:
    """One aggregation: ``graph`` spec (``gnnweave.sim.verify.load_graph``), an optional
    row shard ``rows=(lo, hi)``, feature width, reduction, weights or not."""

    graph: str
    feat: int
    reduce: str = "sum"
    weighted: bool = False
    rows: tuple | None = None

    @property
    def label(self) -> str:
        g = self.graph + (f"[{self.rows[0]}:{self.rows[1]}]" if self.rows else "")
        return f"{g} F={self.feat} {self.reduce}{' weighted' if self.weighted else ''}"


def _grid(graphs, feats, reduces=("sum",), weighted=(False, True), rows=None):
    return [Case(g, f, r, w, rows) for g in graphs for f in feats for r in reduces
            for w in weighted]


#: Feature widths below, at and above the 128-bit bus (8 elements a beat) up to small's 64.
FIT_FEATS = (4, 8, 12, 16, 24, 40, 64)
#: The fit set: graphs of several degree shapes (R-MAT hubs and empty rows, SBM, Cora).
FIT_CASES = (
    _grid(("rmat:10:8", "rmat:12:2", "sbm:2000:4"), FIT_FEATS)
    + _grid(("cora",), (8, 16, 40), ("mean", "max"), (False,))
    + [Case("cora", f, "sum", False, (0, 900)) for f in (8, 24, 64)]
)
#: Graphs the fit never saw: other R-MAT/SBM sizes and shapes, CiteSeer, Cora shards.
CHECK_CASES = (
    [Case("rmat:11:4", f, r, w) for f, r, w in ((6, "sum", False), (16, "mean", True),
                                                 (40, "max", False), (64, "sum", True))]
    + [Case("sbm:1200:3", f, r, w) for f, r, w in ((8, "max", True), (20, "sum", False),
                                                    (48, "mean", False))]
    + [Case("citeseer", f, r) for f, r in ((5, "mean"), (16, "max"), (33, "sum"))]
    + [Case("cora", f, r, False, (900, 2708)) for f, r in ((8, "sum"), (24, "mean"))]
    + [Case("rmat:9:16", 64, "max", True)]
)
#: A handful of the check cases for the default test suite.
QUICK_CHECK = tuple(CHECK_CASES[i] for i in (0, 3, 4, 6, 7, 9, 11))


def job_degrees(graph, rows=None) -> np.ndarray:
    """In-degrees of the job the ``fpga-sim`` executor submits for ``graph`` (a shard
    ``rows=(lo, hi)``: :func:`~gnnweave.host.executors.job_degrees`)."""
    if rows is None:
        return np.diff(np.asarray(graph.indptr, dtype=np.int64))
    from gnnweave.host.executors.fpga_emu import job_degrees as shard_degrees
    return shard_degrees(graph, *rows)


class Runner:
    """Runs cases on one simulated device (built for ``config`` on first use)."""

    def __init__(self, config: str = "small-agg", latency: int = cm.DEFAULT_LATENCY):
        from gnnweave.host.driver import SimAccel
        from gnnweave.sim.simdevice import SimDevice
        self.config, self.latency = config, latency
        self.device = SimDevice(1 << 28, latency=latency, config=config)
        self.accel = SimAccel(self.device)
        self._graphs = {}

    def graph(self, spec):
        if spec not in self._graphs:
            from gnnweave.sim.verify import load_graph
            self._graphs[spec] = load_graph(spec, seed=0)
        return self._graphs[spec]

    def measure(self, case: Case) -> dict:
        from gnnweave.host.executors.fpga_emu import shard_graph
        g = self.graph(case.graph)
        job = g if case.rows is None else shard_graph(g, *case.rows)
        rng = np.random.default_rng(case.feat)
        x = rng.integers(-600, 601, (job.num_nodes, case.feat)).astype(np.int16)
        w = (rng.integers(-3000, 3001, job.indices.shape[0]).astype(np.int16)
             if case.weighted else None)
        _, counters = self.accel.aggregate(job, x, case.reduce, shift=12 if case.weighted else 0,
                                           weights=w)
        return {"case": case, "cycles": int(counters["busy_cycles"]),
                "degrees": job_degrees(g, case.rows)}

    def close(self):
        self.device.close()


def measure_all(runner: Runner, cases, progress=True) -> list[dict]:
    out = []
    for i, case in enumerate(cases):
        if progress:
            print(f"  [{i + 1}/{len(cases)}] {case.label}", file=sys.stderr, flush=True)
        out.append(runner.measure(case))
    return out


def predict(model: cm.AggregatorModel, sample: dict) -> float:
    c = sample["case"]
    return model.cycles(sample["degrees"], c.feat, weighted=c.weighted, reduce=c.reduce)


def fit_timing(build: cm.AggregatorBuild, samples, *, latency=cm.DEFAULT_LATENCY,
               start: cm.AggregatorTiming | None = None) -> cm.AggregatorTiming:
    """Least squares on relative errors over the constants of :class:`AggregatorTiming`."""
    from scipy.optimize import least_squares
    names = [f.name for f in dataclasses.fields(cm.AggregatorTiming)]
    x0 = [getattr(start or cm.AggregatorTiming(), n) for n in names]
    measured = np.array([s["cycles"] for s in samples], dtype=np.float64)

    def residuals(x):
        model = cm.AggregatorModel(build, cm.AggregatorTiming(*x), latency)
        return np.array([predict(model, s) for s in samples]) / measured - 1.0

    # bounds keep each constant what it stands for (a negative issue lead beyond the
    # latency would cut the edge walk off the read channel)
    lo = {"fixed": 0, "node_walk": 1, "empty_walk": -1, "drain_gap": 0, "multiply_stages": 0,
          "issue_lead": -latency, "reduce_lag": -8, "credit_round_trip": 0,
          "edge_credit_lag": -64}
    bounds = ([lo[n] for n in names], [2000 if n == "fixed" else 256 for n in names])
    x0 = np.clip(x0, bounds[0], bounds[1])
    # the model is piecewise linear in the constants: finite differences over whole cycles
    sol = least_squares(residuals, x0, bounds=bounds, diff_step=0.05, x_scale=10.0)
    return cm.AggregatorTiming(*[float(round(v, 3)) for v in sol.x])


def table(model: cm.AggregatorModel, samples) -> list[dict]:
    rows = []
    for s in samples:
        c, p = s["case"], predict(model, s)
        rows.append({"case": c.label, "graph": c.graph, "rows": list(c.rows) if c.rows else None,
                     "nodes": int(len(s["degrees"])), "edges": int(np.sum(s["degrees"])),
                     "reduce": c.reduce, "weighted": c.weighted, "feat": c.feat,
                     "measured": s["cycles"], "predicted": round(p, 1),
                     "error_pct": round(100 * (p / s["cycles"] - 1), 2)})
    return rows


def old_model_cycles(sample: dict, bus_bytes: int = 16) -> int:
    """The estimate fpga-emu used before this model: one beat per gathered row beat."""
    c = sample["case"]
    return int(np.sum(sample["degrees"])) * -(-c.feat * 2 // bus_bytes)


def export_configs() -> dict:
    """The build parameters of every named configuration (``gnnweave.buildconfig``)."""
    from gnnweave.buildconfig import BUILDS
    agg_names = {f.name for f in dataclasses.fields(cm.AggregatorBuild)}
    mac_names = {f.name for f in dataclasses.fields(cm.MacArrayBuild)}
    out = {}
    for name, build in BUILDS.items():
        agg = {k: v for k, v in dataclasses.asdict(build.aggregator).items() if k in agg_names}
        agg["reduce_ops"] = list(agg["reduce_ops"])
        mac = build.mac_array
        out[name] = {"aggregator": agg,
                     "mac_array": None if mac is None else
                     {k: v for k, v in dataclasses.asdict(mac).items() if k in mac_names}}
    return out


def cmd_fit(a) -> int:
    t0 = time.perf_counter()
    configs = export_configs()
    if a.config not in configs:
        raise SystemExit(f"--config {a.config!r}: unknown; choose one of {', '.join(configs)}")
    build = cm.AggregatorBuild.from_dict(configs[a.config]["aggregator"], a.config)
    try:
        old = cm.read_data(a.data)
    except cm.CycleModelError:
        old = {"configs": {}, "aggregator_fit": {}}
    # start from the recorded constants (the defaults for any the record lacks)
    names = {f.name for f in dataclasses.fields(cm.AggregatorTiming)}
    recorded = old["aggregator_fit"].get("constants") or {}
    start = cm.AggregatorTiming(**{k: float(v) for k, v in recorded.items() if k in names})
    print(f"fit: {len(FIT_CASES)} runs on the simulated device ({a.config})", file=sys.stderr)
    runner = Runner(a.config, a.latency)
    samples = measure_all(runner, FIT_CASES)
    timing = fit_timing(build, samples, latency=a.latency, start=start)
    model = cm.AggregatorModel(build, timing, a.latency)
    errs = np.array([abs(r["error_pct"]) for r in table(model, samples)])
    for name, entry in configs.items():        # keep recorded clocks of the builds
        for key in ("est_fmax_mhz", "clock_source"):
            if key in old["configs"].get(name, {}):
                entry[key] = old["configs"][name][key]
    data = {"format": cm.FORMAT, "version": cm.FORMAT_VERSION,
            "aggregator_fit": {
                "constants": dataclasses.asdict(timing), "fitted_on": a.config,
                "rtl_key": runner.device.sim.build.key, "latency": a.latency,
                "runs": len(samples), "fit_max_abs_error_pct": round(float(errs.max()), 3),
                "fit_median_abs_error_pct": round(float(np.median(errs)), 3),
                "command": f"python -m gnnweave.host.cyclefit fit --config {a.config}"},
            "configs": configs}
    if old.get("mac_array_fit"):
        data["mac_array_fit"] = old["mac_array_fit"]
    path = cm.DATA_FILE if a.data is None else a.data
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    print(json.dumps({"constants": dataclasses.asdict(timing),
                      "fit_max_abs_error_pct": data["aggregator_fit"]["fit_max_abs_error_pct"],
                      "seconds": round(time.perf_counter() - t0, 1), "written": str(path)},
                     indent=1))
    return 0


#: MacArray runs ``(mode, m, k, n)``: one block and several, split depths, ragged edges.
MAC_FIT_CASES = [(mode, m, k, n) for mode in ("fwd", "dx", "dw")
                 for m, k, n in ((16, 16, 16), (64, 64, 64), (100, 40, 70), (23, 150, 19),
                                 (128, 32, 8), (8, 200, 128))]
#: MacArray shapes the fit never saw.
MAC_CHECK_CASES = [("fwd", 48, 96, 80), ("dx", 70, 33, 130), ("dw", 90, 120, 50),
                   ("fwd", 200, 16, 24)]


def measure_mac(config: str, cases, latency=cm.DEFAULT_LATENCY, progress=True) -> list[dict]:
    """Busy cycles of MacArray runs through the driver on the simulated device."""
    from gnnweave.host.driver import open_sim_accel
    accel, _device, owner = open_sim_accel(config=config, latency=latency, mem_size=1 << 26,
                                           use_pynq=False)
    out = []
    try:
        for i, (mode, m, k, n) in enumerate(cases):
            if progress:
                print(f"  [{i + 1}/{len(cases)}] mac {mode} m={m} k={k} n={n}", file=sys.stderr,
                      flush=True)
            rng = np.random.default_rng(i)
            shapes = {"fwd": ((m, k), (k, n)), "dx": ((m, k), (n, k)), "dw": ((k, m), (k, n))}
            p, q = (rng.integers(-300, 301, s).astype(np.int16) for s in shapes[mode])
            _, counters = accel.mac(mode, p, q, shift=8)
            out.append({"case": (mode, m, k, n), "cycles": int(counters["busy_cycles"]),
                        "rtl_key": _device.sim.build.key})
    finally:
        owner.close()
    return out


def fit_mac_timing(build: cm.MacArrayBuild, samples, latency=cm.DEFAULT_LATENCY):
    from scipy.optimize import least_squares
    names = [f.name for f in dataclasses.fields(cm.MacArrayTiming)]
    measured = np.array([s["cycles"] for s in samples], dtype=np.float64)

    def residuals(x):
        model = cm.MacArrayModel(build, cm.MacArrayTiming(*x), latency)
        return np.array([model.cycles(*s["case"][1:], s["case"][0]) for s in samples]) \
            / measured - 1.0

    x0 = [getattr(cm.MacArrayTiming(), n) for n in names]
    sol = least_squares(residuals, x0, bounds=([0] * len(names), [4096] * len(names)),
                        diff_step=0.05, x_scale=10.0)
    errs = 100 * np.abs(residuals(sol.x))
    return cm.MacArrayTiming(*[float(round(v, 3)) for v in sol.x]), errs


def cmd_fit_mac(a) -> int:
    data = cm.read_data(a.data)
    entry = data["configs"].get(a.config) or {}
    if not entry.get("mac_array"):
        raise SystemExit(f"--config {a.config!r}: the build has no MacArray")
    build = cm.MacArrayBuild.from_dict(entry["mac_array"], a.config)
    samples = measure_mac(a.config, MAC_FIT_CASES, a.latency)
    timing, errs = fit_mac_timing(build, samples, a.latency)
    model = cm.MacArrayModel(build, timing, a.latency)
    check_rows = []
    for s in measure_mac(a.config, MAC_CHECK_CASES, a.latency):
        mode, m, k, n = s["case"]
        p = model.cycles(m, k, n, mode)
        check_rows.append({"case": s["case"], "measured": s["cycles"], "predicted": round(p),
                           "error_pct": round(100 * (p / s["cycles"] - 1), 2)})
    data["mac_array_fit"] = {
        "constants": dataclasses.asdict(timing), "fitted_on": a.config,
        "rtl_key": samples[0]["rtl_key"], "latency": a.latency,
        "runs": len(samples), "fit_max_abs_error_pct": round(float(errs.max()), 3),
        "check": check_rows,
        "command": f"python -m gnnweave.host.cyclefit fit-mac --config {a.config}"}
    path = cm.DATA_FILE if a.data is None else a.data
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    print(json.dumps(data["mac_array_fit"], indent=1))
    return 0


def clock_from_depth_report(report: dict, where: str) -> tuple[float, str]:
    """``(MHz, source)`` from a ``python -m gnnweave.hw.estimate CONFIG --depth --json``
    report: the slowest unit's ``est_fmax_mhz`` (the build runs on one clock)."""
    depth = report.get("depth") if isinstance(report, dict) else None
    units = {u: d["est_fmax_mhz"] for u, d in (depth or {}).items()
             if isinstance(d, dict) and isinstance(d.get("est_fmax_mhz"), (int, float))}
    if not units:
        raise cm.CycleModelError(f"{where}: no 'depth' field with est_fmax_mhz per unit "
                                 f"(run the estimate with --depth --json)")
    slowest = min(units, key=units.get)
    return float(units[slowest]), (f"estimate --depth: slowest unit {slowest} at "
                                   f"{units[slowest]:g} MHz (UltraScale+ logic-depth model)")


def cmd_export(a) -> int:
    """Refresh the build parameters only (after a change to ``gnnweave/buildconfig.py``); with
    ``--clock-from REPORT --config NAME``, record that build's estimated clock too."""
    data = cm.read_data(a.data)
    configs = export_configs()
    for name, entry in configs.items():
        for key in ("est_fmax_mhz", "clock_source"):
            if key in data["configs"].get(name, {}):
                entry[key] = data["configs"][name][key]
    if a.clock_from:
        if a.config not in configs:
            raise SystemExit(f"--clock-from needs --config, one of {', '.join(configs)}")
        with open(a.clock_from) as fh:
            mhz, source = clock_from_depth_report(json.load(fh), a.clock_from)
        configs[a.config].update(est_fmax_mhz=mhz, clock_source=source)
    data["configs"] = configs
    path = cm.DATA_FILE if a.data is None else a.data
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    print(f"{path}: build parameters of {len(configs)} configurations")
    return 0


def check(config: str = "small-agg", cases=CHECK_CASES, *, latency=cm.DEFAULT_LATENCY,
          progress=True) -> dict:
    """Measured vs predicted cycles on ``cases`` (graphs the fit never saw)."""
    model = cm.load(config, latency=latency).aggregator
    runner = Runner(config, latency)
    try:
        samples = measure_all(runner, cases, progress)
    finally:
        runner.close()
    rows = table(model, samples)
    for r, s in zip(rows, samples):
        old = old_model_cycles(s, model.build.bus_bytes)
        r["old_model"] = old
        r["old_error_pct"] = round(100 * (old / s["cycles"] - 1), 2)
    errs = [abs(r["error_pct"]) for r in rows]
    return {"config": config, "latency": latency, "runs": rows,
            "max_abs_error_pct": max(errs), "median_abs_error_pct": float(np.median(errs)),
            "old_model_max_abs_error_pct": max(abs(r["old_error_pct"]) for r in rows)}


def cmd_check(a) -> int:
    rep = check(a.config, QUICK_CHECK if a.quick else CHECK_CASES, latency=a.latency)
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        print(f"{'case':44s} {'measured':>9s} {'predicted':>10s} {'err %':>7s} {'old %':>7s}")
        for r in rep["runs"]:
            print(f"{r['case']:44s} {r['measured']:9d} {r['predicted']:10.0f} "
                  f"{r['error_pct']:7.2f} {r['old_error_pct']:7.2f}")
        print(f"max |error| {rep['max_abs_error_pct']:.2f} % "
              f"(old model {rep['old_model_max_abs_error_pct']:.1f} %)")
    return 0 if rep["max_abs_error_pct"] <= 5.0 else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gnnweave.host.cyclefit", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit the Aggregator's constants on the simulated device")
    f.add_argument("--config", default="small-agg")
    f.add_argument("--latency", type=int, default=cm.DEFAULT_LATENCY)
    f.add_argument("--data", default=None, help="data file to write (default host/cyclemodel.json)")
    f.set_defaults(func=cmd_fit)
    m = sub.add_parser("fit-mac", help="fit the MacArray's constants on the simulated device")
    m.add_argument("--config", default="small")
    m.add_argument("--latency", type=int, default=cm.DEFAULT_LATENCY)
    m.add_argument("--data", default=None)
    m.set_defaults(func=cmd_fit_mac)
    e = sub.add_parser("export", help="refresh the build parameters from gnnweave/buildconfig.py")
    e.add_argument("--data", default=None)
    e.add_argument("--clock-from", default=None, metavar="REPORT.json",
                   help="record the clock of `python -m gnnweave.hw.estimate CONFIG --depth --json`")
    e.add_argument("--config", default=None, help="the build the clock report is of")
    e.set_defaults(func=cmd_export)
    c = sub.add_parser("check", help="measured vs predicted on graphs the fit never saw")
    c.add_argument("--config", default="small-agg")
    c.add_argument("--latency", type=int, default=cm.DEFAULT_LATENCY)
    c.add_argument("--quick", action="store_true", help="the default test's handful of graphs")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check)
    a = p.parse_args(argv)
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
