"""Golden float reference and fixed path against outside oracles: scipy's sparse product,
numpy's unbuffered ``ufunc.at`` on the raw edge list (no CSR involved), and PyG where
installed. Real graphs (Cora, CiteSeer) and a skewed R-MAT graph."""
import numpy as np
import pytest

from tests.conftest import require

from gnnweave.datasets import DatasetNotFoundError, data_root, load_dataset, require_data
from gnnweave.fixed import FixedFormat
from gnnweave.generators import rmat
from gnnweave.graph import CSRGraph, gcn_norm
from gnnweave.golden.aggregate import AggregateFormat, aggregate, aggregate_float

REDUCES = ["sum", "mean", "max"]
GRAPHS = ["cora", "citeseer", "rmat"]


def shared_dataset(name):
    try:
        return load_dataset(name)
    except DatasetNotFoundError as exc:
        if require_data():
            pytest.fail(str(exc))
        pytest.skip(str(exc))


def graph_and_edges(name):
    """(CSRGraph, raw edge list [2, E] it was built from)."""
    if name == "rmat":
        from gnnweave.generators import rmat_edges
        edges = rmat_edges(12, 8, seed=5)
        return rmat(12, 8, seed=5), edges
    dataset = shared_dataset(name)
    raw = np.load(data_root() / f"{name}.npz")["edge_index"]   # the file, not the loader
    return dataset.graph, raw


def coo_reference(edges, n, x, reduce, weights_coo=None):
    """The reduction over an unordered edge list with numpy's ufunc.at (no CSR)."""
    src, dst = edges
    prod = x[src] if weights_coo is None else x[src] * weights_coo[:, None]
    if reduce == "max":
        out = np.full((n, x.shape[1]), -np.inf)
        np.maximum.at(out, dst, prod)
        return np.where(np.isinf(out), 0.0, out)
    out = np.zeros((n, x.shape[1]))
    np.add.at(out, dst, prod)
    if reduce == "mean":
        deg = np.bincount(dst, minlength=n)
        out /= np.maximum(deg, 1)[:, None]
    return out


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("name", GRAPHS)
def test_float_reference_matches_coo_route(name, reduce):
    graph, edges = graph_and_edges(name)
    x = np.random.default_rng(0).standard_normal((graph.num_nodes, 16))
    got = aggregate_float(graph, x, reduce)
    np.testing.assert_allclose(got, coo_reference(edges, graph.num_nodes, x, reduce),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", GRAPHS)
def test_float_reference_matches_scipy(name):
    graph, _ = graph_and_edges(name)
    x = np.random.default_rng(1).standard_normal((graph.num_nodes, 16))
    np.testing.assert_allclose(aggregate_float(graph, x, "sum"), graph.to_scipy() @ x,
                               rtol=1e-5, atol=1e-5)
    normalized = gcn_norm(graph)
    np.testing.assert_allclose(aggregate_float(normalized, x, "sum", normalized.weights),
                               normalized.to_scipy() @ x, rtol=1e-5, atol=1e-5)
    deg = np.maximum(graph.in_degree, 1)[:, None]
    np.testing.assert_allclose(aggregate_float(graph, x, "mean"), (graph.to_scipy() @ x) / deg,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_fixed_sum_and_max_are_exact_on_binary_features(name):
    # bag-of-words features are 0/1: with integer formats sum and max lose nothing
    dataset = shared_dataset(name)
    x = dataset.x[:, :256]
    assert set(np.unique(x)) <= {0.0, 1.0}
    fmt = AggregateFormat(FixedFormat(16, 0), None, FixedFormat(16, 0))
    xq, _ = fmt.feat.quantize(x)
    summed = aggregate(dataset.graph, xq, "sum", fmt)
    np.testing.assert_array_equal(summed.out, dataset.graph.to_scipy() @ x.astype(np.float64))
    assert summed.saturations == 0 and summed.edges == dataset.num_edges
    maxed = aggregate(dataset.graph, xq, "max", fmt)
    np.testing.assert_array_equal(maxed.out, coo_reference(dataset.edge_index,
                                                           dataset.num_nodes, x, "max"))


@pytest.mark.parametrize("reduce", REDUCES)
def test_fixed_path_on_rmat_matches_scipy_exactly_when_nothing_rounds(reduce):
    # integer features, integer output, unweighted: only the mean's division rounds
    graph, edges = graph_and_edges("rmat")
    rng = np.random.default_rng(2)
    xq = rng.integers(-100, 100, (graph.num_nodes, 8)).astype(np.int16)
    fmt = AggregateFormat(FixedFormat(16, 0), None, FixedFormat(16, 0))
    res = aggregate(graph, xq, reduce, fmt)
    ref = coo_reference(edges, graph.num_nodes, xq.astype(np.float64), reduce)
    if reduce == "mean":
        from gnnweave.golden.bounds import error_bound
        bound = error_bound("mean", fmt, graph.in_degree, x_abs_max=100.0)[:, None]
        assert res.saturations == 0 and np.all(np.abs(res.out - ref) <= bound)
    else:
        fits = np.abs(ref) <= 32767
        np.testing.assert_array_equal(res.out[fits], ref[fits])
        assert res.saturations == np.count_nonzero(~fits)


# ------------------------------------------------------------------------- PyG

def pyg_edge_index(graph: CSRGraph):
    torch = require("torch")
    dst = np.repeat(np.arange(graph.num_nodes), graph.in_degree)
    return torch.as_tensor(np.stack([graph.indices, dst]))


def sorted_triples(src, dst, w):
    order = np.lexsort((np.round(w, 12), src, dst))
    return np.stack([dst[order], src[order]]), w[order]


@pytest.mark.parametrize("name", ["cora", "rmat", "loops"])
def test_gcn_norm_matches_pyg(name):
    require("torch_geometric")
    import torch
    from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_gcn_norm
    if name == "loops":   # weighted, with self loops (one per node at most) and duplicates
        rng = np.random.default_rng(4)
        n = 50
        ei = rng.integers(0, n, (2, 400))
        loops = np.unique(ei[0][ei[0] == ei[1]], return_index=True)[1]
        keep = (ei[0] != ei[1])
        keep[np.flatnonzero(ei[0] == ei[1])[loops]] = True
        graph = CSRGraph.from_edge_index(ei[:, keep], n, rng.uniform(0.1, 2, keep.sum()))
    else:
        graph = graph_and_edges(name)[0]
    ours = gcn_norm(graph)
    weight = None if graph.weights is None else torch.as_tensor(graph.weights)
    ei, w = pyg_gcn_norm(pyg_edge_index(graph), weight, graph.num_nodes, add_self_loops=True)
    theirs = CSRGraph.from_edge_index(ei.numpy(), graph.num_nodes, w.double().numpy())
    a = sorted_triples(ours.indices, np.repeat(np.arange(ours.num_nodes), ours.in_degree),
                       ours.weights)
    b = sorted_triples(theirs.indices, np.repeat(np.arange(theirs.num_nodes), theirs.in_degree),
                       theirs.weights)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(a[1], b[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["cora", "rmat"])
def test_gcnconv_propagation_matches_golden(name):
    require("torch_geometric")
    import torch
    from torch_geometric.nn import GCNConv
    from gnnweave.golden.bounds import error_bound
    graph = graph_and_edges(name)[0]
    f = 8
    x = np.random.default_rng(3).uniform(-1, 1, (graph.num_nodes, f))
    conv = GCNConv(f, f, bias=False).double()
    with torch.no_grad():
        conv.lin.weight.copy_(torch.eye(f, dtype=torch.float64))   # propagation only
        theirs = conv(torch.as_tensor(x), pyg_edge_index(graph)).numpy()
    normalized = gcn_norm(graph)
    np.testing.assert_allclose(aggregate_float(normalized, x, "sum", normalized.weights), theirs,
                               rtol=1e-5, atol=1e-5)
    fmt = AggregateFormat(FixedFormat(16, 12), FixedFormat(16, 14), FixedFormat(16, 12))
    xq, _ = fmt.feat.quantize(x)
    wq, _ = fmt.weight.quantize(normalized.weights)
    res = aggregate(normalized, xq, "sum", fmt, weights=wq)
    assert res.saturations == 0
    bound = error_bound("sum", fmt, normalized.in_degree, normalized.weights, x_abs_max=1.0)
    assert np.all(np.abs(fmt.out.to_float(res.out) - theirs) <= bound[:, None] + 1e-9)


@pytest.mark.parametrize("reduce", REDUCES)
def test_simpleconv_aggregations_match_golden(reduce):
    require("torch_geometric")
    import torch
    from torch_geometric.nn import SimpleConv
    graph = graph_and_edges("rmat")[0]
    x = np.random.default_rng(4).standard_normal((graph.num_nodes, 8))
    theirs = SimpleConv(aggr=reduce)(torch.as_tensor(x), pyg_edge_index(graph)).numpy()
    np.testing.assert_allclose(aggregate_float(graph, x, reduce), theirs, rtol=1e-5, atol=1e-5)
