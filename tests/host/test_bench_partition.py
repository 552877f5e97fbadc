"""The partition benchmark's epoch loop on a small graph: its judged figures recomputed from
the devices' own times (fpga-emu: a formula, so exact), and the epoch structure."""
import numpy as np
import pytest

from benchmarks import bench_partition as bp
from gnnweave.host.profiler import SweepSizes, profile, share_seconds

SWEEP = SweepSizes(graphs=[(n, d) for n in (300, 1200) for d in (4, 16)], feats=[8, 16],
                   heldout_graphs=[(600, 8)], heldout_feats=[8],
                   transfer_bytes=[1 << 12, 1 << 16], heldout_transfer_bytes=[1 << 14])


@pytest.fixture(scope="module")
def setup():
    g = bp.skewed_graph(1500, 12, seed=3)
    x = np.random.default_rng(0).uniform(-1, 1, (g.num_nodes, 8)).astype(np.float32)
    names = ["cpu", "fpga-emu", "fpga-emu:100MHz"]
    prof = profile(bp.make_devices(names), sizes=SWEEP, repeats=1,
                   ops=("aggregate", "transfer_in", "transfer_out"), progress=False)
    return g, x, prof.cost_model


def test_modelled_pair_figures_equal_the_devices_own_times(setup):
    g, x, cm = setup
    names = ["fpga-emu", "fpga-emu:100MHz"]
    r = bp.run_config(names, g, x, cm, epochs=4, warmup=1, repeats=2, calibrate_rounds=1)
    devs = {d.name: d for d in bp.make_devices(names)}
    alone = {d: share_seconds(devs[d], g, x, (0, g.num_nodes)) for d in names}
    ideal = 1.0 / sum(1.0 / t for t in alone.values())
    part = r["rebalanced"]["last_partition"]
    makespan = max(share_seconds(devs[d], g, x, tuple(rg)) for d, rg in part.items())
    assert r["ideal_s_judged_median"] == pytest.approx(ideal, rel=1e-12)
    assert r["rebalanced"]["vs_ideal"] == pytest.approx(makespan / ideal - 1, rel=1e-9)
    # fpga-emu's time is its cycle model, deterministic but not linear in a share's edges and
    # rows (the read channel's credits, empty rows): the calibrated share model fits it
    # to a fraction of a percent
    assert r["rebalanced"]["vs_predicted"] < 5e-3
    # stealing runs a share in chunks, and every fpga-emu call walks all N rows of the graph
    # (as the driver submits a shard), a per-call cost the share model does not hold: its
    # prediction is off by that
    assert r["stealing"]["vs_predicted"] < 0.25
    # the best row-range cut with the fitted models can be no worse than the split made, up
    # to the fitted models' own error (judged by them, measured for the split made; the
    # bound asserted above)
    assert r["model_best_penalty"] <= r["rebalanced"]["vs_ideal"] + 5e-3
    assert 0 <= r["row_granular_penalty"] <= r["model_best_penalty"] + 1e-9


def test_epoch_structure_and_contrasts_only_in_judged_epochs(setup):
    g, x, cm = setup
    r = bp.run_config(["cpu", "fpga-emu"], g, x, cm, epochs=4, warmup=2, repeats=3,
                      calibrate_rounds=1)
    recs = r["epoch_records"]
    assert [e["judged"] for e in recs] == [False, False, True, True]
    for e in recs:
        assert set(e["plans"]) == ({"rebalanced", "stealing", *bp.CONTRASTS} if e["judged"]
                                   else {"rebalanced", "stealing"})
        st = e["plans"]["stealing"]
        # one stealing run per round; the epoch's figure is the fastest, as for a share
        assert len(st["samples_s"]["makespan"]) == 3 == len(st["steals"])
        assert st["makespan_s"] == min(st["samples_s"]["makespan"])
        assert sum(st["edges"].values()) == g.num_edges
        assert st["makespan_s"] == pytest.approx(max(st["measured_s"].values()))
        reb = e["plans"]["rebalanced"]
        assert reb["makespan_s"] == max(reb["measured_s"].values())
        # the judged time of a share is its fastest call; the median is reported beside it
        assert bp.STATISTIC == "min"
        assert reb["measured_s"] == {d: min(v) for d, v in reb["samples_s"].items()}
        assert reb["median_makespan_s"] == max(float(np.median(v))
                                               for v in reb["samples_s"].values())
        assert all(len(v) == 3 for v in reb["samples_s"].values())
        assert len(reb["per_round_makespan_over_ideal"]) == 3
        assert sum(reb["edges"].values()) == g.num_edges
    judged = [e["plans"]["rebalanced"]["makespan_s"] / e["ideal_s"] for e in recs[2:]]
    assert r["rebalanced"]["vs_ideal"] == pytest.approx(float(np.median(judged)) - 1)
    lo, hi = r["rebalanced"]["vs_ideal_ci90"]
    assert min(judged) - 1 <= lo <= hi <= max(judged) - 1
    with pytest.raises(ValueError, match="warmup=4"):
        bp.run_config(["cpu", "fpga-emu"], g, x, cm, epochs=4, warmup=4)


def test_host_speed_probe_times_both_series(setup):
    g, x, _ = setup
    hs = bp.host_speed(g, x, pairs=3, loop=10)
    for k in ("aggregate", "compute_loop"):
        assert len(hs[k]["series_s"]) == 3
        assert 0 < hs[k]["min_s"] <= hs[k]["median_s"] <= hs[k]["max_s"]
    assert -1.0 <= hs["correlation"] <= 1.0
