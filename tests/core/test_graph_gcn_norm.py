"""gcn_norm against an independent dense computation of D^-1/2 (A + I) D^-1/2 (PyG's
own gcn_norm is compared in tests/golden/test_golden_oracles.py when installed)."""
import numpy as np
import pytest

from gnnweave.fixed import FixedFormat
from gnnweave.graph import CSRGraph, gcn_norm, quantize_weights


def dense_gcn_norm(edges, n, weights, add_self_loops):
    """Dense A[v, u] (duplicates summed), loops replaced as PyG's add_remaining_self_loops."""
    a = np.zeros((n, n))
    loop = np.full(n, np.nan)
    for (u, v), w in zip(edges.T, weights):
        if u == v and add_self_loops:
            loop[v] = w                   # the last existing loop of a node wins
        else:
            a[v, u] += w
    if add_self_loops:
        a[np.arange(n), np.arange(n)] += np.where(np.isnan(loop), 1.0, loop)
    deg = a.sum(1)
    inv = np.where(deg > 0, 1 / np.sqrt(np.where(deg > 0, deg, 1)), 0)
    return inv[:, None] * a * inv[None, :]


@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_matches_dense_formula(add_self_loops, weighted):
    rng = np.random.default_rng(int(add_self_loops) * 2 + int(weighted))
    n = 30
    edges = rng.integers(0, n, (2, 150))          # duplicates and self loops included
    weights = rng.uniform(0.2, 3, 150) if weighted else np.ones(150)
    graph = CSRGraph.from_edge_index(edges, n, weights if weighted else None)
    got = gcn_norm(graph, add_self_loops=add_self_loops)
    np.testing.assert_allclose(got.to_scipy().toarray(),
                               dense_gcn_norm(edges, n, weights, add_self_loops), rtol=1e-12)
    if add_self_loops:
        dst = np.repeat(np.arange(n), got.in_degree)
        loops = got.indices == dst
        assert loops.sum() == n                    # exactly one loop per node ...
        last = got.indptr[1:] - 1
        assert np.all(got.indices[last] == np.arange(n))   # ... after its other in-edges


def test_gcn_norm_isolated_nodes_and_negative_degree():
    # 2 -> 0, 0 -> 1; node 2 has no in-edges, so without self loops D^-1/2 of node 2 is 0
    # (not inf) and its out-edge gets weight 0; 0 -> 1 joins two degree-1 nodes: weight 1
    graph = CSRGraph.from_edge_index(np.array([[2, 0], [0, 1]]), 3)
    got = gcn_norm(graph, add_self_loops=False)
    assert got.weights.tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="node 0 has negative weighted in-degree"):
        gcn_norm(CSRGraph.from_edge_index(np.array([[1], [0]]), 2, [-5.0]))


def test_quantize_weights():
    graph = CSRGraph.from_edge_index(np.array([[0, 1, 1], [1, 0, 0]]), 2, [0.5, -1.25, 3.0])
    q, saturations = quantize_weights(graph, FixedFormat(8, 6))
    # CSR order: row 0 holds 1 -> 0 twice (-1.25, 3.0 saturates), row 1 holds 0 -> 1
    assert q.tolist() == [-80, 127, 32] and saturations == 1
    unweighted = CSRGraph.from_edge_index(np.array([[0], [1]]), 2)
    assert quantize_weights(unweighted, FixedFormat(16, 14))[0].tolist() == [1 << 14]
