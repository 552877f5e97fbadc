"""Profiler on the real executors: fpga-emu (device time) and cpu (CPU time)."""
import json

import numpy as np
import pytest

from gnnweave.graph import CSRGraph
from gnnweave.host.costmodel import CostModel
from gnnweave.host.partition import ShareCost, partition_rows, predict_times, share_costs
from gnnweave.host.profiler import (QUICK, SweepSizes, calibrate_shares, calibrated_partition,
                                    measure_shares, plot_profile, plot_series, profile,
                                    profile_main)

executors = pytest.importorskip("gnnweave.host.executors")

SMALL = SweepSizes(
    graphs=[(n, d) for n in (300, 1200) for d in (2, 8)], feats=[8, 32],
    heldout_graphs=[(600, 4)], heldout_feats=[16],
    dense=[(m, k, n) for m in (64, 256) for k in (16, 64) for n in (16, 32)],
    heldout_dense=[(128, 32, 16)],
    transfer_bytes=[1 << 12, 1 << 16, 1 << 20], heldout_transfer_bytes=[1 << 14])


def test_fpga_emu_models_fit_its_cycle_model_on_heldout_sizes():
    prof = profile(["fpga-emu"], sizes=SMALL, progress=False)
    dm = prof.cost_model.devices["fpga-emu"]
    assert set(dm.ops) == {"aggregate", "dense_forward", "dense_input_grad",
                           "dense_weight_grad", "transfer_in", "transfer_out"}
    for op, m in dm.ops.items():
        assert m.time_source == "device"
        # the emulator's device time is the build's cycle model; the dense and transfer
        # times are linear in these features for tile-aligned matrices. An aggregation is
        # bound by the edge walk for one-beat rows (F <= 8) and by the read channel above:
        # one set of linear features spans both regimes only to about 10 %
        limit = 0.15 if op == "aggregate" else 0.01
        assert m.heldout_median_rel_err < limit, (op, m.heldout_median_rel_err)
    bw = dm.link["transfer_in"]["bandwidth_bytes_per_s"]
    assert bw == pytest.approx(executors.CycleModel().transfer_bytes_per_s, rel=1e-3)


def test_cpu_profile_structure():
    prof = profile(["cpu"], sizes=SMALL, repeats=2, progress=False, blas_threads=1)
    dm = prof.cost_model.devices["cpu"]
    assert "transfer_in" not in dm.ops and dm.link is None   # host memory
    for m in dm.ops.values():
        assert m.time_source == "cpu"
        assert all(v >= 0 for v in m.coef.values())
        assert m.n_heldout > 0 and m.heldout_median_rel_err is not None


def test_profile_main_writes_json_and_png(tmp_path, monkeypatch):
    import gnnweave.host.profiler as profiler
    monkeypatch.setattr(profiler, "QUICK", SMALL)
    report = profile_main(["fpga-emu"], str(tmp_path / "p"), True)
    out = tmp_path / "p" / "cost_model.json"
    assert report["meets_target"] and report["heldout_median_rel_err"] < 0.15
    assert report["out"] == str(out) and report["plot"] == str(out.with_suffix(".png"))
    assert out.is_file() and out.with_suffix(".png").is_file()
    data = json.loads(out.read_text())
    assert data["per_op"]["fpga-emu"]["aggregate"]["time_source"] == "device"
    cm = CostModel.load(out)
    assert "fpga-emu" in cm.devices


def test_profile_plot_tells_devices_ops_and_held_out_points_apart(tmp_path):
    prof = profile(["cpu", "fpga-emu"], sizes=SMALL, repeats=1, progress=False, blas_threads=1)
    series = plot_series(prof.samples)
    devices = {s.device for s in prof.samples}
    ops = {s.op for s in prof.samples}
    assert {x["device"] for x in series} == devices and len(ops) > 1
    # one colour per device, one marker per op, whatever the other is
    assert len({x["color"] for x in series}) == len(devices)
    assert {(x["device"], x["op"]) for x in series} == {(s.device, s.op) for s in prof.samples}
    for x in series:
        assert {y["color"] for y in series if y["device"] == x["device"]} == {x["color"]}
        assert {y["marker"] for y in series if y["op"] == x["op"]} == {x["marker"]}
        assert x["filled"] == x["heldout"]
        assert all(s.heldout == x["heldout"] for s in x["samples"])
    assert any(x["heldout"] for x in series) and any(not x["heldout"] for x in series)
    labels = plot_profile(prof.samples, prof.cost_model, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    assert devices | ops | {"fitted", "held out"} <= set(labels)


@pytest.mark.slow
def test_cpu_quick_profile_meets_heldout_target():
    prof = profile(["cpu"], quick=True, progress=False, blas_threads=1)
    errs = {op: m.heldout_median_rel_err for op, m in prof.cost_model.devices["cpu"].ops.items()}
    assert all(e <= 0.15 for e in errs.values()), errs
    assert QUICK.graphs


# -- calibration on the workload ------------------------------------------------------------

class HubExecutor:
    """A device with a known cost the size features cannot see: a row's first ``knee`` edges
    cost ``per_edge`` each, the rest of a hub row 4x less (its output row stays on chip);
    plus ``per_row`` per row and ``fixed`` per launch. Reports that as device time, and now
    and then (``burst`` of the calls) a 2.5x longer time, as a busy shared host would."""

    kind = "fpga"

    def __init__(self, name, per_edge, *, knee=16, per_row=1e-7, fixed=1e-4, burst=0.0, seed=0):
        self.name, self.per_edge, self.knee = name, per_edge, knee
        self.per_row, self.fixed, self.burst = per_row, fixed, burst
        self.rng = np.random.default_rng(seed)

    def true_seconds(self, graph, lo, hi):
        deg = np.diff(graph.indptr[lo:hi + 1])
        cheap = np.maximum(deg - self.knee, 0)
        return (self.fixed + self.per_row * (hi - lo)
                + self.per_edge * (np.sum(deg - cheap) + 0.25 * np.sum(cheap)))

    def aggregate(self, graph, x, reduce="sum", *, rows=None):
        lo, hi = rows
        t = self.true_seconds(graph, lo, hi)
        if self.rng.random() < self.burst:
            t *= 2.5
        value = np.zeros((hi - lo, x.shape[1]), np.float32)
        return executors.OpResult(value, 0.0, t, 0, 0, "aggregate", self.name)

    def transfer_in(self, a):
        return executors.OpResult(a, 0.0, 0.0, 0, 0, "transfer_in", self.name)

    transfer_out = transfer_in


def zipf_graph(n, avg_degree, seed):
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** 0.9
    rng.shuffle(w)
    dst = rng.choice(n, size=n * avg_degree, p=w / w.sum())
    src = rng.integers(0, n, size=n * avg_degree)
    return CSRGraph.from_edge_index(np.stack([src, dst]), n)


def true_optimum(graph, devs):
    """Brute force over the cut of a two-device split, with the devices' true costs."""
    a, b = devs
    n = graph.num_nodes
    return min(max(a.true_seconds(graph, 0, c) if c else 0.0,
                   b.true_seconds(graph, c, n) if c < n else 0.0) for c in range(n + 1))


def test_calibration_on_the_workload_predicts_a_split_the_sweep_model_misses():
    graph = zipf_graph(3000, 24, seed=3)
    x = np.zeros((graph.num_nodes, 8), np.float32)
    devs = [HubExecutor("fast", 2e-7, burst=0.2, seed=1),
            HubExecutor("slow", 3e-7, knee=10**9, burst=0.2, seed=2)]   # no hub discount
    # the prior: a size sweep on uniform graphs (every row below the knee)
    sweep = SweepSizes(graphs=[(500, 2), (2000, 4), (2000, 12)], feats=[8],
                       heldout_graphs=[(1000, 8)], heldout_feats=[8])
    cm = profile(devs, sizes=sweep, repeats=5, ops=("aggregate",), progress=False).cost_model
    prior = share_costs(cm, ["fast", "slow"], feat_dim=8, num_nodes=graph.num_nodes)
    fits = calibrate_shares(devs, graph, x, prior, rounds=5)
    calibrated = {d: f.cost for d, f in fits.items()}

    def judged(costs):
        """(worst per-device prediction error, true makespan) of the split sized from costs"""
        part = partition_rows(graph, 8, costs)
        predicted = predict_times(graph, part, costs)
        true = {dev.name: dev.true_seconds(graph, *part[dev.name]) for dev in devs
                if dev.name in part}
        return max(abs(predicted[d] - t) / t for d, t in true.items()), max(true.values())

    err_cal, true_cal = judged(calibrated)
    err_prior, true_prior = judged(prior)
    optimum = true_optimum(graph, devs)
    assert err_cal < 0.05 and true_cal <= 1.03 * optimum, (err_cal, true_cal, optimum)
    # the sweep model, blind to the hub rows, is far off and sizes a worse split
    assert err_prior > 0.25 and true_prior > 1.10 * optimum, (err_prior, true_prior, optimum)
    # the degree-blind device keeps its prior's shape: rescaling is enough for it
    assert fits["slow"].scale == pytest.approx(1.0, rel=0.02)


def test_measure_shares_median_ignores_bursts_and_calibration_errors():
    graph = zipf_graph(400, 6, seed=0)
    x = np.zeros((400, 4), np.float32)
    dev = HubExecutor("d", 1e-6, burst=0.25, seed=5)
    tasks = [(dev, (0, 400)), (dev, (100, 300))]
    med = measure_shares(tasks, graph, x, rounds=9, seed=1)
    for i, (_, (lo, hi)) in enumerate(tasks):
        assert med[i] == pytest.approx(dev.true_seconds(graph, lo, hi), rel=1e-9)
    with pytest.raises(ValueError, match="rounds=0"):
        measure_shares(tasks, graph, x, rounds=0)
    with pytest.raises(ValueError, match=r"fractions\[1\]"):
        calibrate_shares([dev], graph, x, fractions=((0.0, 1.0), (0.5, 0.5)))
    with pytest.raises(ValueError, match=r"x has shape \(3, 4\)"):
        calibrate_shares([dev], graph, x[:3])
    with pytest.raises(ValueError, match="priors: no entry for device 'd'"):
        calibrate_shares([dev], graph, x, {"other": ShareCost(per_edge_s=1.0)})


class MostlySlowedExecutor(HubExecutor):
    """Every call but each fourth is slowed 2.5x: a host busier than not."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls = 0

    def aggregate(self, graph, x, reduce="sum", *, rows=None):
        res = super().aggregate(graph, x, reduce, rows=rows)
        self.calls += 1
        if self.calls % 4:
            res.device_seconds *= 2.5
        return res


def test_measure_shares_min_ignores_bursts_that_most_calls_meet():
    """The median takes a slowed call; the fastest call is the device's own time
    (neighbours only ever slow a call down)."""
    graph = zipf_graph(400, 6, seed=0)
    x = np.zeros((400, 4), np.float32)
    ranges = [(0, 400), (100, 300)]
    for statistic, factor in (("min", 1.0), ("median", 2.5)):
        tasks = [(MostlySlowedExecutor("d", 1e-6), r) for r in ranges]
        got = measure_shares(tasks, graph, x, rounds=9, seed=1, statistic=statistic)
        for i, (dev, (lo, hi)) in enumerate(tasks):
            assert got[i] == pytest.approx(factor * dev.true_seconds(graph, lo, hi), rel=1e-9)
    with pytest.raises(ValueError, match="statistic='mean'"):
        measure_shares(tasks, graph, x, statistic="mean")
    dev = MostlySlowedExecutor("d", 1e-6)
    fits = calibrate_shares([dev], graph, x, rounds=9, statistic="min")
    # the fit (fixed + per-row + per-edge) is exact up to the hub rows' cheaper edges
    assert fits["d"].cost(graph.num_edges, 400) == pytest.approx(
        dev.true_seconds(graph, 0, 400), rel=0.1)


def test_calibrate_shares_on_real_executors():
    graph = zipf_graph(2000, 8, seed=4)
    x = np.random.default_rng(0).uniform(-1, 1, (2000, 16)).astype(np.float32)
    fits = calibrate_shares([executors.make_executor("fpga-emu"),
                             executors.make_executor("cpu")], graph, x, rounds=3)
    emu = fits["fpga-emu"]
    # fpga-emu's device time is its cycle model: at one width, close to linear in the
    # shard's edges and rows
    assert emu.fit_median_rel_err < 1e-3
    cm = executors.CycleModel()
    # two-beat rows (F=16) are bound by the read channel: two beats a gathered row plus
    # the edge's index (4 bytes) and weight (2 bytes) in 16-byte beats
    assert 2.0 <= emu.cost.per_edge_s * cm.clock_hz <= 2.0 + 6 / 16 + 0.01
    # cpu (CPU time): one sample per calibration range, the whole graph costs more than a tenth
    cpu = fits["cpu"]
    assert [(e, r) for e, r, _ in cpu.samples] == [(e, r) for e, r, _ in emu.samples]
    assert len(cpu.samples) == 8 and (graph.num_edges, 2000) == cpu.samples[0][:2]
    tenth = int(graph.indptr[200])
    assert float(cpu.cost(graph.num_edges, 2000)) > float(cpu.cost(tenth, 200))


def test_calibrated_partition_without_a_prior_balances_true_times():
    graph = zipf_graph(2000, 16, seed=7)
    devs = {"a": HubExecutor("a", 1e-7, seed=1), "b": HubExecutor("b", 4e-7, knee=4, seed=2)}
    part, costs, fits = calibrated_partition(devs, graph, 8, rounds=3)
    assert set(costs) == set(fits) == {"a", "b"} and all(f.scale is None for f in fits.values())
    true = [devs[d].true_seconds(graph, lo, hi) for d, (lo, hi) in part.items()]
    assert max(true) <= 1.03 * true_optimum(graph, list(devs.values()))
    with pytest.raises(ValueError, match="feat_dim=0"):
        calibrated_partition(devs, graph, 0)


class CountingExecutor:
    """Records every aggregation it runs; its device time is 1 ms per row."""

    def __init__(self, name, kind, log):
        self.name, self.kind, self.log = name, kind, log

    def aggregate(self, graph, x, reduce="sum", *, rows=None):
        from gnnweave.host.executors import OpResult
        lo, hi = rows
        self.log.append((self.name, lo, hi))
        out = np.zeros((hi - lo, x.shape[1]), np.float32)
        return OpResult(out, 0.0, 1e-3 * (hi - lo), 0, 0, "aggregate", self.name)

    def transfer_in(self, a):
        from gnnweave.host.executors import OpResult
        return OpResult(a, 0.0, 0.0, 0, 0, "transfer_in", self.name)

    transfer_out = transfer_in


@pytest.mark.parametrize("warmup, expected_calls", [(True, 2 * 3 * 4 + 1), (False, 3 * 4 + 1),
                                                     ("auto", None)])
def test_measure_share_samples_warmup_rules(warmup, expected_calls):
    from gnnweave.host.profiler import measure_share_samples
    graph = zipf_graph(50, 3, seed=0)
    x = np.zeros((50, 2), np.float32)
    log = []
    a, b = CountingExecutor("a", "fpga", log), CountingExecutor("b", "fpga-sim", log)
    emu = CountingExecutor("e", "fpga-emu", log)   # modelled: measured once, never warmed
    tasks = [(a, (0, 10)), (a, (10, 50)), (b, (0, 50)), (emu, (0, 50))]
    samples = measure_share_samples(tasks, graph, x, rounds=4, seed=3, warmup=warmup)
    assert [len(v) for v in samples.values()] == [4, 4, 4, 1]
    assert samples[1] == [pytest.approx(0.040)] * 4 and samples[3] == [pytest.approx(0.05)]
    assert sum(1 for c in log if c[0] == "e") == 1
    timed = 3 * 4 + 1
    if expected_calls is not None:
        assert len(log) == expected_calls
    else:
        # a warm-up exactly where the kind of device changes from the previous timed share
        kinds = {"a": "fpga", "b": "fpga-sim", "e": "fpga-emu"}
        warmups, prev = 0, None
        i = 0
        while i < len(log):
            name = log[i][0]
            repeated = i + 1 < len(log) and log[i + 1] == log[i] and name != "e"
            if repeated and kinds[name] != prev:
                warmups += 1
                i += 1
            prev = kinds[name]
            i += 1
        assert len(log) == timed + warmups and 2 <= warmups < 2 * 4
    with pytest.raises(ValueError, match="warmup='always'"):
        measure_share_samples(tasks, graph, x, warmup="always")


def test_measure_share_samples_runs_each_group_back_to_back():
    from gnnweave.host.profiler import measure_share_samples
    graph = zipf_graph(60, 3, seed=1)
    x = np.zeros((60, 2), np.float32)
    log = []
    a, b = CountingExecutor("a", "fpga", log), CountingExecutor("b", "fpga", log)
    tasks = [(a, (0, 20)), (b, (20, 60)), (a, (0, 60)), (b, (0, 60)), (a, (0, 30)), (b, (30, 60))]
    groups = [[0, 1], [2, 3], [4, 5]]
    samples = measure_share_samples(tasks, graph, x, rounds=6, seed=2, warmup=False,
                                    groups=groups)
    assert [len(v) for v in samples.values()] == [6] * 6
    assert samples[1] == [pytest.approx(0.040)] * 6
    timed = [(name, (lo, hi)) for name, lo, hi in log]
    index = {(ex.name, r): i for i, (ex, r) in enumerate(tasks)}
    seq = [index[t] for t in timed]
    group_of = {i: k for k, g in enumerate(groups) for i in g}
    firsts, orders = set(), set()
    for r in range(6):
        chunk = seq[6 * r:6 * r + 6]
        # the two tasks of a group run next to each other, every group once a round
        pairs = [chunk[j:j + 2] for j in (0, 2, 4)]
        assert sorted(group_of[p[0]] for p in pairs) == [0, 1, 2]
        assert all(group_of[p[0]] == group_of[p[1]] for p in pairs)
        firsts.add(tuple(group_of[p[0]] for p in pairs))
        orders.update(p[0] for p in pairs)
    assert len(firsts) > 1 and len(orders) > 3   # groups and tasks in them are shuffled
    with pytest.raises(ValueError, match="groups: must hold every task index"):
        measure_share_samples(tasks, graph, x, groups=[[0, 1], [2, 3], [4]])


def test_limit_blas_threads_reaches_numpys_openblas():
    import glob
    import os
    from gnnweave.host.profiler import limit_blas_threads
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs",
                                  "lib*openblas*.so*"))
    if not libs:
        pytest.skip("this numpy bundles no OpenBLAS")
    before = limit_blas_threads(1)
    try:
        assert isinstance(before, int) and before >= 1
        assert limit_blas_threads(1) == 1
    finally:
        limit_blas_threads(before)
    assert limit_blas_threads(None) is None
