"""The golden Aggregator against its docstring: an independent naive model on random
inputs (malformed ones included), and hand-worked edge cases."""
import numpy as np
import pytest

try:   # tests/ as a package (tests/__init__.py) or as plain folders on sys.path
    from tests.golden.golden_reference_model import reference_aggregate
except ImportError:
    from golden_reference_model import reference_aggregate
from gnnweave.fixed import FixedFormat
from gnnweave.graph import CSRGraph
from gnnweave.golden.aggregate import (
    AggregateFormat,
    Reduce,
    aggregate,
    aggregate_raw,
    effective_indptr,
)

REDUCES = ["sum", "mean", "max"]


def assert_matches_reference(indptr, indices, x, reduce, shift, out_width, weights=None,
                             num_edges=None):
    got = aggregate_raw(indptr, indices, x, reduce=reduce, shift=shift, out_width=out_width,
                        weights=weights, num_edges=num_edges)
    want = reference_aggregate(indptr, indices, x, reduce, shift, out_width, weights, num_edges)
    n = len(x)
    f = np.asarray(x).shape[1]
    np.testing.assert_array_equal(got.out, np.asarray(want["out"], dtype=np.int64).reshape(n, f))
    np.testing.assert_array_equal(got.degree, np.asarray(want["degree"], dtype=np.int64))
    assert (got.saturations, got.rejected, got.edges, got.bad_indptr) == (
        want["saturations"], want["rejected"], want["edges"], want["bad_indptr"])
    return got


def random_case(rng):
    n = int(rng.integers(0, 7))
    f = int(rng.integers(1, 4))
    e = int(rng.integers(0, 14))
    pool = np.array([-1, 2**32 - 1, 2**31, n, n + 5], dtype=np.int64)
    indices = rng.integers(0, max(n, 1), e)
    if n == 0 or rng.random() < 0.3:   # some out-of-range words, negative ones included
        bad = rng.random(e) < 0.3 if n else np.ones(e, bool)
        indices = np.where(bad, rng.choice(pool, e), indices)
    if rng.random() < 0.5:
        indptr = np.concatenate([[0], np.sort(rng.integers(0, e + 1, n)), [e]])[: n + 1]
        indptr[-1] = e
    else:  # malformed: anything, negative and past-the-end words included
        indptr = rng.integers(-3, e + 4, n + 1)
    width = int(rng.integers(2, 17))
    x = rng.integers(-(1 << (width - 1)), 1 << (width - 1), (n, f))
    weights = None
    if rng.random() < 0.5:
        weights = rng.integers(-(1 << 15), 1 << 15, e)
    shift = int(rng.integers(0, 20))
    out_width = int(rng.integers(2, 17))
    num_edges = None if rng.random() < 0.7 else int(rng.integers(0, e + 1))
    return indptr, indices, x, shift, out_width, weights, num_edges


@pytest.mark.parametrize("reduce", REDUCES)
def test_random_inputs_match_naive_model(reduce):
    rng = np.random.default_rng(1234 + REDUCES.index(reduce))
    seen = dict(saturated=0, rejected=0, bad=0)
    for _ in range(400):
        indptr, indices, x, shift, out_width, weights, num_edges = random_case(rng)
        got = assert_matches_reference(indptr, indices, x, reduce, shift, out_width, weights,
                                       num_edges)
        seen["saturated"] += got.saturations > 0
        seen["rejected"] += got.rejected > 0
        seen["bad"] += got.bad_indptr
    # the random cases really exercised the corner paths
    assert min(seen.values()) >= 20, seen


@pytest.mark.parametrize("reduce", REDUCES)
def test_num_rows_is_the_prefix_of_the_whole_result(reduce):
    """Rows from num_rows on empty (as a shard is laid out): computing only the first rows
    gives the whole run's first rows, degrees and every count and flag (malformed inputs
    included)."""
    rng = np.random.default_rng(99 + REDUCES.index(reduce))
    cut = 0
    for _ in range(300):
        indptr, indices, x, shift, out_width, weights, num_edges = random_case(rng)
        n = len(x)
        r = int(rng.integers(0, n + 1))
        indptr = np.asarray(indptr).copy()
        indptr[r + 1:] = indptr[r]
        kw = dict(reduce=reduce, shift=shift, out_width=out_width, weights=weights,
                  num_edges=num_edges)
        whole = assert_matches_reference(indptr, indices, x, reduce, shift, out_width,
                                         weights, num_edges)
        part = aggregate_raw(indptr, indices, x, num_rows=r, **kw)
        np.testing.assert_array_equal(part.out, whole.out[:r])
        np.testing.assert_array_equal(part.degree, whole.degree[:r])
        assert (part.saturations, part.rejected, part.edges, part.bad_indptr) == (
            whole.saturations, whole.rejected, whole.edges, whole.bad_indptr)
        cut += r < n and whole.edges > 0
    assert cut >= 30   # cases that really cut rows with edges before the cut
    with pytest.raises(ValueError, match="num_rows=3: must be in"):
        aggregate_raw([0, 0, 0], [], np.zeros((2, 1), np.int64), reduce=reduce, shift=0,
                      out_width=16, num_rows=3)


@pytest.mark.parametrize("reduce", REDUCES)
def test_larger_random_graph_matches_naive_model(reduce):
    rng = np.random.default_rng(7)
    n, f, e = 60, 5, 500
    graph = CSRGraph.from_edge_index(rng.integers(0, n, (2, e)), n)
    x = rng.integers(-2000, 2000, (n, f))
    w = rng.integers(-(1 << 15), 1 << 15, e)
    assert_matches_reference(graph.indptr, graph.indices, x, reduce, 14, 16, weights=w)
    assert_matches_reference(graph.indptr, graph.indices, x, reduce, 2, 16)


@pytest.mark.parametrize("reduce", REDUCES)
def test_wide_degree_spread_matches_naive_model(reduce):
    # degrees 0..117 in steps of 3 cross many of the max route's degree buckets, most of
    # them padded (a row shorter than its bucket); values chosen so padding would show
    rng = np.random.default_rng(8)
    n = 40
    degree = 3 * np.arange(n)
    dst = np.repeat(np.arange(n), degree)
    src = rng.integers(0, n, dst.shape[0])
    graph = CSRGraph.from_edge_index(np.stack([src, dst]), n)
    x = rng.integers(-30000, 30000, (n, 3))
    w = rng.integers(-(1 << 15), 1 << 15, graph.num_edges)
    assert_matches_reference(graph.indptr, graph.indices, x, reduce, 14, 16, weights=w)
    assert_matches_reference(graph.indptr, graph.indices, x, reduce, 3, 16)


# ---------------------------------------------------------------- hand-worked cases

def unweighted(frac_in=0, frac_out=0, width=16):
    return AggregateFormat(FixedFormat(width, frac_in), None, FixedFormat(width, frac_out))


@pytest.mark.parametrize("reduce", REDUCES)
def test_empty_graph(reduce):
    graph = CSRGraph(np.zeros(1, np.int64), np.zeros(0, np.int64), 0)
    res = aggregate(graph, np.zeros((0, 3), np.int16), reduce, unweighted())
    assert res.out.shape == (0, 3)
    assert (res.saturations, res.rejected, res.edges, res.bad_indptr) == (0, 0, 0, False)


@pytest.mark.parametrize("reduce", REDUCES)
def test_single_node_without_and_with_self_loop(reduce):
    x = np.array([[5, -7]], np.int16)
    alone = aggregate(CSRGraph(np.array([0, 0]), np.zeros(0), 1), x, reduce, unweighted())
    np.testing.assert_array_equal(alone.out, [[0, 0]])
    loop = aggregate(CSRGraph(np.array([0, 1]), np.array([0]), 1), x, reduce, unweighted())
    np.testing.assert_array_equal(loop.out, [[5, -7]])
    assert loop.degree.tolist() == [1]


@pytest.mark.parametrize("reduce", REDUCES)
def test_isolated_nodes_get_zero(reduce):
    # 0 -> 1, 2 isolated; x of the isolated node must not leak anywhere
    graph = CSRGraph.from_edge_index(np.array([[0], [1]]), 3)
    x = np.array([[-4], [9], [100]], np.int16)
    res = aggregate(graph, x, reduce, unweighted())
    np.testing.assert_array_equal(res.out, [[0], [-4], [0]])
    assert res.degree.tolist() == [0, 1, 0]


def test_duplicate_edges_count_twice():
    # 0 -> 2 twice, 1 -> 2 once
    graph = CSRGraph.from_edge_index(np.array([[0, 0, 1], [2, 2, 2]]), 3)
    x = np.array([[3], [9], [0]], np.int16)
    fmt = unweighted()
    assert aggregate(graph, x, "sum", fmt).out[2, 0] == 15
    assert aggregate(graph, x, "max", fmt).out[2, 0] == 9
    # mean 15/3 = 5 exactly; reciprocal of 3 is round(2**24 / 3)
    assert aggregate(graph, x, "mean", fmt).out[2, 0] == 5
    assert aggregate(graph, x, "mean", fmt).degree[2] == 3


def test_rounding_half_to_even_in_output():
    # one fractional input bit dropped: 5/2 -> 2, 7/2 -> 4, -5/2 -> -2, -7/2 -> -4
    graph = CSRGraph(np.arange(5), np.arange(4), 4)
    x = np.array([[5], [7], [-5], [-7]], np.int16)
    res = aggregate(graph, x, "sum", unweighted(frac_in=1, frac_out=0))
    assert res.out[:, 0].tolist() == [2, 4, -2, -4]


def test_sum_saturation_is_counted():
    # 8-bit output: 100 + 100 = 200 saturates to 127; -100 - 100 -> -128; 50 + 50 fits
    graph = CSRGraph(np.array([0, 2]), np.array([0, 0]), 1)
    x = np.array([[100, -100, 50]], np.int8)
    res = aggregate(graph, x, "sum", unweighted(width=8))
    assert res.out.tolist() == [[127, -128, 100]]
    assert res.saturations == 2
    # the mean of the same does not saturate
    assert aggregate(graph, x, "mean", unweighted(width=8)).saturations == 0


def test_mean_counts_intermediate_saturation():
    # S does not fit MEAN_SUM_WIDTH=32 bits: 2**16 edges of 2**15 - 1 with shift 0
    e = 1 << 17
    graph = CSRGraph(np.array([0, e]), np.zeros(e, np.int64), 1)
    x = np.array([[32767]], np.int16)
    res = aggregate(graph, x, "mean", unweighted())
    # S clamps to 2**31 - 1, then times round(2**24 / 2**17) = 128, >> 24 -> 16384
    assert res.out.tolist() == [[16384]]
    assert res.saturations == 1


def test_out_of_range_indices_are_skipped_and_not_in_degree():
    # node 0 receives from 1, 7 (bad), 2**32 - 1 (bad, a negative word) and 2
    indptr = np.array([0, 4, 4, 4])
    indices = np.array([1, 7, -1, 2])
    x = np.array([[0], [6], [3]])
    for reduce, want in (("sum", 9), ("mean", 4), ("max", 6)):   # mean 4.5 -> 4 (even)
        res = aggregate_raw(indptr, indices, x, reduce=reduce, shift=0, out_width=16)
        assert res.out[0, 0] == want, reduce
        assert (res.rejected, res.edges, res.degree[0], res.bad_indptr) == (2, 2, 2, False)


@pytest.mark.parametrize("indptr, owned, bad", [
    ([0, 2, 4], [[0, 1], [2, 3]], False),       # well formed
    ([1, 2, 4], [[1], [2, 3]], True),          # does not start at 0: position 0 unowned
    ([0, 3, 1], [[0, 1, 2], []], True),        # decreasing, and ends short of E
    ([0, 2, 9], [[0, 1], [2, 3]], True),        # past E
    ([0, 1, 2], [[0], [1]], True),             # ends before E: positions 2, 3 unowned
    ([7, 8, 9], [[], []], True),               # everything past E
])
def test_malformed_indptr_is_clamped(indptr, owned, bad):
    indices = np.array([0, 1, 0, 1])
    weights = np.array([1, 2, 4, 8])   # x = 1 everywhere: each sum names its positions
    res = aggregate_raw(indptr, indices, np.ones((2, 1)), reduce="sum", shift=0, out_width=16,
                        weights=weights)
    assert res.out[:, 0].tolist() == [sum(weights[p] for p in positions) for positions in owned]
    assert res.bad_indptr is bad
    assert res.edges == sum(len(p) for p in owned)
    eff, flagged = effective_indptr(indptr, 2, 4)
    assert flagged is bad and eff.min() >= 0 and eff.max() <= 4


def test_num_edges_limits_the_stream():
    res = aggregate_raw([0, 3], [0, 0, 0], np.array([[2]]), reduce="sum", shift=0, out_width=16,
                        num_edges=2)
    assert res.out[0, 0] == 4 and res.bad_indptr and res.edges == 2


def test_weighted_products_are_exact_before_rounding():
    # 3 * 0.5 + 1 * 0.25, weights in Q.2: products in Q.2, one output rounding only
    graph = CSRGraph(np.array([0, 2]), np.array([0, 0]), 1)
    fmt = AggregateFormat(FixedFormat(16, 0), FixedFormat(16, 2), FixedFormat(16, 0))
    res = aggregate(graph, np.array([[3]]), "sum", fmt, weights=np.array([2, 1]))
    assert res.out[0, 0] == 2     # (6 + 3) / 4 = 2.25 -> 2
    with pytest.raises(ValueError, match="weights"):
        aggregate(graph, np.array([[3]]), "sum", fmt)


def test_reduce_parse():
    assert Reduce.parse("MAX") is Reduce.MAX and Reduce.parse(Reduce.SUM) is Reduce.SUM
    with pytest.raises(ValueError, match="unknown reduce"):
        Reduce.parse("min")


# ------------------------------------------------- the fast internal routes vs the spec

def test_fast_narrow_equals_fixed_narrow():
    from gnnweave.fixed import narrow
    from gnnweave.golden.aggregate import _narrow
    values = np.concatenate([np.arange(-5000, 5000), [2**40 + 2**19, -(2**40) - 2**19,
                                                       2**61, -(2**61), 2**62 + 1, -(2**62)]])
    for shift in list(range(0, 14)) + [24, 40, 61, 62]:
        for width in (2, 8, 16, 32):
            fmt = FixedFormat(width, 0)
            got, got_sat = _narrow(values, shift, fmt)
            want, want_sat = narrow(values, shift, fmt)
            np.testing.assert_array_equal(got, want, err_msg=f"shift={shift} width={width}")
            np.testing.assert_array_equal(got_sat, want_sat)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_integer_route_of_the_sum_matches_naive_model(reduce, monkeypatch):
    # the float64 route is taken only when provably exact; force the int64 route
    import gnnweave.golden.aggregate as agg
    monkeypatch.setattr(agg, "_FLOAT_EXACT_LIMIT", 0)
    rng = np.random.default_rng(11)
    for _ in range(100):
        indptr, indices, x, shift, out_width, weights, num_edges = random_case(rng)
        assert_matches_reference(indptr, indices, x, reduce, shift, out_width, weights, num_edges)


@pytest.mark.parametrize("reduce", REDUCES)
def test_wide_integers_take_exact_routes(reduce):
    # features beyond 16 bits: max needs int64 products, sums cross the 2**53 float limit
    rng = np.random.default_rng(5)
    n, e = 8, 40
    graph = CSRGraph.from_edge_index(rng.integers(0, n, (2, e)), n)
    x = rng.integers(-(2**40), 2**40, (n, 3))
    w = rng.integers(-(2**15), 2**15, e)
    assert_matches_reference(graph.indptr, graph.indices, x, reduce, 40, 16, weights=w)
    assert_matches_reference(graph.indptr, graph.indices, x, reduce, 30, 16)


@pytest.mark.parametrize("reduce", REDUCES)
def test_accumulators_stay_exact_beyond_float64(reduce):
    # products of ~2**55 do not fit a float64 mantissa: the sum route must notice and
    # accumulate in int64 (white box: the accumulator before rounding, vs Python ints)
    from gnnweave.golden.aggregate import Reduce, _segment_reduce
    rng = np.random.default_rng(6)
    n, e = 6, 30
    graph = CSRGraph.from_edge_index(rng.integers(0, n, (2, e)), n)
    x = rng.integers(2**39, 2**40, (n, 2)) | 1
    w = rng.integers(2**14, 2**15, e) | 1
    acc = _segment_reduce(x, graph.indptr, graph.indices, w, Reduce.parse(reduce))
    for v in range(n):
        terms = [[int(w[k]) * int(xv) for xv in x[graph.indices[k]]]
                 for k in range(graph.indptr[v], graph.indptr[v + 1])]
        want = [0, 0] if not terms else [
            (max if reduce == "max" else sum)(t[j] for t in terms) for j in range(2)]
        assert acc[v].tolist() == want, v


@pytest.mark.parametrize("x, message", [
    (np.zeros((2, 3), dtype=np.int64), r"x: shape \(2, 3\), expected \[3, F\]"),
    (np.full((3, 3), 0.25), r"x\[0, 0\] = 0.25 is not an integer: quantise"),
    (np.full((3, 3), 1 << 15), r"x\[0, 0\] = 32768 is outside the 16-bit range"),
    (np.zeros(3, dtype=np.int64), r"x: shape \(3,\), expected \[3, F\]"),
])
def test_aggregate_refuses_features_the_hardware_cannot_hold(x, message):
    graph = CSRGraph(np.array([0, 1, 2, 3]), np.array([2, 0, 1]), 3)
    with pytest.raises(ValueError, match=message):
        aggregate(graph, x, "sum", AggregateFormat(weight=None))


def test_aggregate_refuses_weights_of_the_wrong_count_or_range():
    graph = CSRGraph(np.array([0, 1, 2, 3]), np.array([2, 0, 1]), 3)
    x = np.ones((3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=r"weights: shape \(2,\), expected \(3,\)"):
        aggregate(graph, x, "sum", AggregateFormat(), weights=np.ones(2, dtype=np.int64))
    with pytest.raises(ValueError, match=r"weights\[1\] = -40000 is outside"):
        aggregate(graph, x, "sum", AggregateFormat(), weights=np.array([1, -40000, 1]))


def test_integral_floats_are_the_same_words():
    graph = CSRGraph(np.array([0, 2, 3]), np.array([0, 1, 0]), 2)
    x = np.array([[3, -5], [7, 1]])
    fmt = AggregateFormat(weight=None)
    assert np.array_equal(aggregate(graph, x.astype(np.float64), "mean", fmt).out,
                          aggregate(graph, x, "mean", fmt).out)
