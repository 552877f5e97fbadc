"""The fixed-point golden path stays within the derived worst-case error bound, and the
bound is tight: random data on low-degree nodes and adversarial data reach it."""
import numpy as np
import pytest

from gnnweave.datasets import DatasetNotFoundError, load_dataset, require_data
from gnnweave.fixed import FixedFormat, choose_frac
from gnnweave.generators import rmat
from gnnweave.graph import CSRGraph, gcn_norm, quantize_weights
from gnnweave.golden.aggregate import AggregateFormat, aggregate, aggregate_float
from gnnweave.golden.bounds import error_bound

REDUCES = ["sum", "mean", "max"]


def shared_graph(name):
    try:
        return load_dataset(name).graph
    except DatasetNotFoundError as exc:
        if require_data():
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def run_fixed(graph, x, reduce, weighted, feat_frac=10):
    """Quantise, aggregate, and return (measured |fixed - float|, bound, result)."""
    w = graph.weights if weighted else None
    ref = aggregate_float(graph, x, reduce, w)
    product_frac = feat_frac + (14 if weighted else 0)
    out_frac = min(choose_frac(ref, 16, headroom_bits=1), product_frac)
    fmt = AggregateFormat(FixedFormat(16, feat_frac), FixedFormat(16, 14) if weighted else None,
                          FixedFormat(16, out_frac))
    xq, x_sat = fmt.feat.quantize(x)
    wq = quantize_weights(graph, fmt.weight)[0] if weighted else None
    res = aggregate(graph, xq, reduce, fmt, weights=wq)
    assert x_sat == 0 and res.saturations == 0   # the bound assumes no saturation
    err = np.abs(fmt.out.to_float(res.out) - ref)
    bound = error_bound(reduce, fmt, graph.in_degree, w, x_abs_max=float(np.abs(x).max()))
    return err, bound[:, None], res


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "gcn_norm"])
@pytest.mark.parametrize("name", ["rmat", "cora"])
def test_random_features_within_bound_and_bound_reached(name, weighted, reduce):
    graph = rmat(11, 8, seed=3) if name == "rmat" else shared_graph("cora")
    if weighted:
        graph = gcn_norm(graph)
    x = np.random.default_rng(1).uniform(-2, 2, (graph.num_nodes, 8))
    err, bound, _ = run_fixed(graph, x, reduce, weighted)
    assert np.all(err <= bound * (1 + 1e-9) + 1e-15), float((err - bound).max())
    # Honest tightness on random data: the worst case is the sum of per-edge input errors
    # all of one sign, which random data only approaches on low-degree nodes (errors of
    # many edges cancel like a random walk). Both graphs have many such nodes.
    assert (err / np.where(bound > 0, bound, 1)).max() >= 0.6


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_adversarial_inputs_reach_the_bound(reduce, weighted):
    # star: node 0 receives from 1..64; every input sits just below a rounding midpoint,
    # so all quantisation errors have the same sign (the case the bound is built on)
    d = 64
    graph = CSRGraph(np.array([0] + [d] * (d + 1)), np.arange(1, d + 1), d + 1)
    feat_frac, weight_frac = 10, 14
    rng = np.random.default_rng(2)
    ints = rng.integers(200, 1000, (d + 1, 4))
    x = (ints + 0.5 - 1 / 64) * 2.0**-feat_frac           # rounds down by ~ half an lsb
    if weighted:
        w = (rng.integers(8000, 16000, d) + 0.5 - 1 / 64) * 2.0**-weight_frac
        graph = graph.with_weights(w)
    err, bound, _ = run_fixed(graph, x, reduce, weighted, feat_frac)
    assert np.all(err <= bound * (1 + 1e-9))
    ratio = err[0] / bound[0]
    assert ratio.max() >= 0.9, ratio


def test_bound_formula_on_hand_examples():
    fmt = AggregateFormat(FixedFormat(16, 8), None, FixedFormat(16, 6))   # shift 2
    ex, ro = 2.0**-9, 2.0**-7
    deg = np.array([0, 1, 3])
    np.testing.assert_allclose(error_bound("sum", fmt, deg, x_abs_max=1.0), [0, ex + ro, 3 * ex + ro])
    np.testing.assert_allclose(error_bound("max", fmt, deg, x_abs_max=1.0), [0, ex + ro, ex + ro])
    # mean, degree 3: input error 3ex/3, sum rounding ro/3, reciprocal error |S| delta, final
    delta = abs(round(2**24 / 3) / 2**24 - 1 / 3)
    s_peak = 3 * (1.0 + ex) + ro
    want = ex + ro / 3 + s_peak * delta + 2.0**-7
    np.testing.assert_allclose(error_bound("mean", fmt, deg, x_abs_max=1.0)[2], want)
    # per-feature bounds broadcast to [N, F]; weights must match the format
    assert error_bound("sum", fmt, deg, x_abs_max=np.ones(5)).shape == (3, 5)
    with pytest.raises(ValueError, match="weights"):
        error_bound("sum", fmt, deg, np.ones(4), x_abs_max=1.0)
