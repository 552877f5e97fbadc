"""The cycle model: its algebra, its build parameters, and its error on the simulated device."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gnnweave.host import cyclemodel as cm


def model(config="small", **kw):
    return cm.load(config, **kw).aggregator


@pytest.mark.parametrize("feat", [4, 8, 16, 24, 64])
def test_empty_rows_cost_the_edge_walk_or_the_drain(feat):
    # an empty row: two cycles of edge control (read indptr[v+1], close), or the drain of
    # its zero row (row beats + 1) before the next bank can close, whichever is longer
    agg = model()
    rb, t = agg.build.row_beats(feat), agg.timing
    per_row = agg.job_cycles(np.zeros(2000), feat) - agg.job_cycles(np.zeros(1000), feat)
    assert per_row / 1000 == pytest.approx(max(t.node_walk + t.empty_walk, rb + t.drain_gap),
                                           abs=0.01)


@pytest.mark.parametrize("feat, weighted", [(16, False), (40, True), (64, False)])
def test_dense_rows_are_bound_by_the_read_channel(feat, weighted):
    # degree 8, two or more beats a row: one R beat a cycle for the rows, the indices
    # (4 bytes), the weights (2 bytes) and the row pointers (4 bytes a node)
    agg = model()
    rb, bpb = agg.build.row_beats(feat), agg.build.bus_bytes
    per_node = (agg.job_cycles(np.full(2000, 8), feat, weighted=weighted)
                - agg.job_cycles(np.full(1000, 8), feat, weighted=weighted)) / 1000
    beats = 8 * rb + 8 * 4 / bpb + (8 * 2 / bpb if weighted else 0) + 4 / bpb
    assert per_node == pytest.approx(beats, abs=0.02)


def test_one_beat_rows_are_bound_by_the_edge_walk():
    # degree 3: three edges and the row pointer's walk, unless the bank turnaround (one
    # beat, the drain gap, the multiply stages) is longer
    agg = model()
    t = agg.timing
    per_node = (agg.job_cycles(np.full(2000, 3), 8) - agg.job_cycles(np.full(1000, 3), 8)) / 1000
    assert per_node == pytest.approx(max(3 + t.node_walk, 1 + t.drain_gap + t.multiply_stages),
                                     abs=0.02)


def test_wide_rows_run_as_column_chunks():
    agg = model()
    deg = np.random.default_rng(0).integers(0, 9, 500)
    step = agg.build.max_feat_dim
    assert agg.cycles(deg, 2 * step + 5) == pytest.approx(
        2 * agg.job_cycles(deg, step) + agg.job_cycles(deg, 5))


def test_latency_beyond_the_credits_slows_the_read_channel():
    deg = np.full(1000, 8)
    near, far = model(latency=32), model(latency=256)
    # 64 beats of credit per round trip of about 256 cycles: a quarter of the port
    assert far.job_cycles(deg, 64) > 3 * near.job_cycles(deg, 64)


def test_bad_queries_name_the_problem():
    with pytest.raises(cm.CycleModelError, match="config = 'nope'"):
        cm.load("nope")
    with pytest.raises(cm.CycleModelError, match="feat_dim = 0"):
        model().cycles(np.ones(3), 0)
    with pytest.raises(cm.CycleModelError, match="feat_dim = 65"):
        model().job_cycles(np.ones(3), 65)
    with pytest.raises(cm.CycleModelError, match="reduce = 'mean': this build has sum"):
        model("small-sum").cycles(np.ones(3), 8, reduce="mean")
    with pytest.raises(cm.CycleModelError, match="degrees"):
        model().job_cycles(np.array([1, -1]), 8)


def test_bad_data_file_names_the_field(tmp_path):
    data = json.loads(cm.DATA_FILE.read_text())
    data["aggregator_fit"]["constants"]["fixed"] = "x"
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(data))
    with pytest.raises(cm.CycleModelError, match="constants.fixed = 'x'"):
        cm.load("small", path=path)
    path.write_text("{")
    with pytest.raises(cm.CycleModelError, match="not JSON"):
        cm.load("small", path=path)
    with pytest.raises(cm.CycleModelError, match="no cycle model data"):
        cm.load("small", path=tmp_path / "missing.json")


def test_clock_is_the_recorded_estimate_or_the_documented_default(tmp_path):
    data = json.loads(cm.DATA_FILE.read_text())
    path = tmp_path / "cm.json"
    for key in ("est_fmax_mhz", "clock_source"):
        data["configs"]["small"].pop(key, None)
    path.write_text(json.dumps(data))
    build = cm.load("small", path=path)
    assert build.clock_hz == cm.DEFAULT_CLOCK_MHZ * 1e6 and "default" in build.clock_source
    data["configs"]["small"]["est_fmax_mhz"] = 250.0
    path.write_text(json.dumps(data))
    est = cm.load("small", path=path)
    assert est.clock_hz == 250e6 and "estimate" in est.clock_source
    assert est.seconds(500) == pytest.approx(2e-6)
    assert cm.load("small", clock_hz=50e6).clock_source == "given"


def test_build_parameters_are_those_of_hw_configs():
    pytest.importorskip("amaranth")
    from gnnweave.host.cyclefit import export_configs
    recorded = json.loads(cm.DATA_FILE.read_text())["configs"]
    exported = export_configs()
    assert set(recorded) == set(exported)
    for name, entry in exported.items():
        assert recorded[name]["aggregator"] == entry["aggregator"], name
        assert recorded[name]["mac_array"] == entry["mac_array"], name


def _native_toolchain():
    try:
        from gnnweave.sim import toolchain
        toolchain.verilator_root()
    except Exception:  # noqa: BLE001 - no simulator here
        return False
    return all(shutil.which(t) for t in ("g++", "make", "perl"))


@pytest.mark.skipif(not _native_toolchain(), reason="no Verilator toolchain")
def test_within_five_percent_of_the_simulated_device_on_unseen_graphs():
    # the fpga-sim executor's build (the suite builds it for the driver tests too): graphs,
    # shards and shapes the fit never saw, every reduction, rows below and above the bus
    from gnnweave.host.cyclefit import QUICK_CHECK, check
    rep = check("small", QUICK_CHECK, progress=False)
    reduces = {r["reduce"] for r in rep["runs"]}
    assert reduces == {"sum", "mean", "max"}
    feats = {r["feat"] for r in rep["runs"]}
    assert min(feats) <= 8 < max(feats)
    bad = [(r["case"], r["measured"], r["predicted"]) for r in rep["runs"]
           if abs(r["error_pct"]) > 5.0]
    assert not bad, bad


def test_mac_array_steps_over_its_blocks():
    build = cm.load("small")
    mac, b = build.mac_array, build.mac_array.build
    one = mac.cycles(b.max_dim, b.max_depth, b.max_dim)
    # a second row of output blocks: one more block of every step (loads overlap compute)
    two = mac.cycles(2 * b.max_dim, b.max_depth, b.max_dim)
    fixed = mac.timing.fixed + mac.latency
    assert two - fixed == pytest.approx(2 * (one - fixed), rel=0.1)
    # the array bounds a deep block: tiles of depth + fill cycles
    tiles = (b.max_dim // b.rows) * (b.max_dim // b.cols)
    assert one >= tiles * (b.max_depth + mac.timing.tile_fill)
    with pytest.raises(cm.CycleModelError, match="mode = 'up'"):
        mac.cycles(4, 4, 4, "up")
    assert cm.load("small-agg").mac_array is None


def test_clock_comes_from_the_depth_estimate_report():
    from gnnweave.host.cyclefit import clock_from_depth_report
    report = {"depth": {"aggregator": {"lut_levels": 9, "est_fmax_mhz": 212.5},
                        "mac_array": {"lut_levels": 12, "est_fmax_mhz": 180.0}}}
    mhz, source = clock_from_depth_report(report, "r.json")
    assert mhz == 180.0 and "mac_array" in source
    with pytest.raises(cm.CycleModelError, match="r.json: no 'depth' field"):
        clock_from_depth_report({"units": {}}, "r.json")
