"""Cost model fitting (NNLS), held-out error, persistence."""
import json

import numpy as np
import pytest

from gnnweave.host.costmodel import CostModel, CostModelError, DeviceModel, fit_op
from gnnweave.host.partition import ShareCost


def agg_sizes(rng, n):
    out = []
    for _ in range(n):
        nodes = int(rng.integers(500, 60000))
        rows = int(rng.integers(1, nodes + 1))
        out.append({"edges": rows * int(rng.integers(1, 30)), "rows": rows,
                    "feat": int(rng.choice([8, 16, 32, 64, 128])), "nodes": nodes})
    return out


def test_fit_recovers_linear_coefficients_exactly():
    rng = np.random.default_rng(0)
    true = {"fixed": 3e-5, "mkn": 2e-11, "mk": 0.0, "mn": 1e-9, "kn": 0.0}

    def t(s):
        return true["fixed"] + true["mkn"] * s["m"] * s["k"] * s["n"] + true["mn"] * s["m"] * s["n"]
    sizes = [{"m": int(m), "k": int(k), "n": int(n)} for m, k, n in rng.integers(8, 3000, (30, 3))]
    held = [{"m": int(m), "k": int(k), "n": int(n)} for m, k, n in rng.integers(8, 3000, (10, 3))]
    model = fit_op("dense_forward", [(s, t(s)) for s in sizes], [(s, t(s)) for s in held])
    for name, v in true.items():
        assert model.coef[name] == pytest.approx(v, rel=1e-6, abs=1e-15)
    assert model.heldout_median_rel_err < 1e-6
    assert all(v >= 0 for v in model.coef.values())


def test_fit_finds_the_cache_knee_and_reports_heldout_error_under_noise():
    rng = np.random.default_rng(1)
    cache = 1 << 20

    def t(s):
        miss = max(0.0, 1 - cache / (s["nodes"] * s["feat"] * 4))
        return 2e-5 + s["edges"] * (1e-9 + 2e-10 * s["feat"]) + s["edges"] * miss * 5e-8
    fit = [(s, t(s) * (1 + 0.03 * rng.standard_normal())) for s in agg_sizes(rng, 60)]
    held = [(s, t(s)) for s in agg_sizes(rng, 20)]
    model = fit_op("aggregate", fit, held)
    assert model.params["cache_bytes"] == cache
    assert model.heldout_median_rel_err < 0.03
    # without the cache term the same data cannot be fitted: the term earns its place
    nocache = fit_op("aggregate", [(dict(s, nodes=1), v) for s, v in fit],
                     [(dict(s, nodes=1), v) for s, v in held])
    assert nocache.heldout_median_rel_err > 3 * model.heldout_median_rel_err


def test_save_load_roundtrip_and_share_cost(tmp_path):
    rng = np.random.default_rng(2)
    sizes = agg_sizes(rng, 20)
    agg = fit_op("aggregate", [(s, 1e-5 + 1e-9 * s["edges"] * s["feat"]) for s in sizes])
    tin = fit_op("transfer_in", [({"nbytes": b}, 1e-4 + b / 2e9) for b in (1e3, 1e6, 1e8)])
    tout = fit_op("transfer_out", [({"nbytes": b}, 2e-4 + b / 1e9) for b in (1e3, 1e6, 1e8)])
    cm = CostModel({"fpga": DeviceModel("fpga", "fpga", {"aggregate": agg, "transfer_in": tin,
                                                          "transfer_out": tout})})
    path = cm.save(tmp_path / "cm.json")
    back = CostModel.load(path)
    s = sizes[0]
    assert back.predict("fpga", "aggregate", **s) == cm.predict("fpga", "aggregate", **s)
    link = back.devices["fpga"].link
    assert link["transfer_in"]["bandwidth_bytes_per_s"] == pytest.approx(2e9, rel=1e-6)
    sc = back.share_cost("fpga", feat_dim=32, num_nodes=1000)
    assert isinstance(sc, ShareCost)
    # share = aggregate of the rows + all of x in + the result rows out
    expect = (cm.predict("fpga", "aggregate", edges=5000, rows=400, feat=32, nodes=1000)
              + cm.predict("fpga", "transfer_in", nbytes=1000 * 32 * 4)
              + cm.predict("fpga", "transfer_out", nbytes=400 * 32 * 4))
    assert float(sc(5000, 400)) == pytest.approx(expect, rel=1e-9)
    assert float(sc(0, 0)) == 0.0


def test_load_errors_name_the_file_and_field(tmp_path):
    with pytest.raises(CostModelError, match="no such cost model file"):
        CostModel.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelError, match="bad.json: not JSON"):
        CostModel.load(bad)
    agg = fit_op("aggregate", [({"edges": e, "rows": 10, "feat": 8, "nodes": 10}, 1e-6 * e)
                               for e in (10, 100, 1000)])
    data = CostModel({"cpu": DeviceModel("cpu", "cpu", {"aggregate": agg})}).to_dict()
    data["devices"]["cpu"]["ops"]["aggregate"]["coef"]["edges"] = -1.0
    bad.write_text(json.dumps(data))
    with pytest.raises(CostModelError, match=r"devices\.cpu\.ops\.aggregate\.coef\.edges"):
        CostModel.load(bad)
    with pytest.raises(CostModelError, match="missing size"):
        agg.predict(edges=1, rows=1, feat=1)
    with pytest.raises(CostModelError, match="no cost model for device 'gpu:0'"):
        CostModel().predict("gpu:0", "aggregate", edges=1, rows=1, feat=1, nodes=1)
