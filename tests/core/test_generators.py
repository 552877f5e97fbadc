"""R-MAT and SBM generators: sizes, determinism, the distributions they promise, and
that a GCN learns the planted SBM classes."""
import time

import numpy as np
import pytest
import scipy.sparse as sp

from gnnweave.generators import unrank_lower_triangle, rmat, rmat_edges, sbm, sbm_edges
from gnnweave.graph import gcn_norm


def test_rmat_sizes_and_determinism():
    g = rmat(10, 8, seed=4)
    assert (g.num_nodes, g.num_edges) == (1024, 8192)
    again = rmat(10, 8, seed=4)
    np.testing.assert_array_equal(g.indices, again.indices)
    np.testing.assert_array_equal(g.indptr, again.indptr)
    assert not np.array_equal(rmat(10, 8, seed=5).indptr, g.indptr)
    assert rmat(0, 3).num_nodes == 1 and rmat(0, 3).num_edges == 3   # all self loops


def test_rmat_quadrant_frequencies_match_a_b_c_d():
    # every level of every edge picks a quadrant with probabilities a, b, c, d
    scale, a, b, c = 10, 0.45, 0.22, 0.18
    edges = rmat_edges(scale, 16, a=a, b=b, c=c, seed=1, permute=False)
    src_bits = (edges[0][:, None] >> np.arange(scale)) & 1
    dst_bits = (edges[1][:, None] >> np.arange(scale)) & 1
    quadrant = 2 * src_bits + dst_bits
    freq = np.bincount(quadrant.ravel(), minlength=4) / quadrant.size
    want = np.array([a, b, c, 1 - a - b - c])
    sigma = np.sqrt(want * (1 - want) / quadrant.size)
    assert np.all(np.abs(freq - want) < 5 * sigma), (freq, want)
    # and independently per level
    for level in range(scale):
        per_level = np.bincount(quadrant[:, level], minlength=4) / quadrant.shape[0]
        assert np.all(np.abs(per_level - want) < 5 * np.sqrt(want * (1 - want) / quadrant.shape[0]))


def test_rmat_keeps_duplicates_and_self_loops_and_permutes_labels():
    plain = rmat_edges(8, 16, seed=2, permute=False)
    permuted = rmat_edges(8, 16, seed=2, permute=True)
    # same draws, relabelled: the degree multisets agree
    for row in (0, 1):
        assert sorted(np.bincount(plain[row], minlength=256)) == sorted(
            np.bincount(permuted[row], minlength=256))
    keys = plain[0] * 256 + plain[1]
    assert np.unique(keys).size < keys.size          # duplicates kept
    assert np.any(plain[0] == plain[1])              # self loops kept
    # unpermuted R-MAT concentrates on low ids (a is the largest quadrant)
    assert np.bincount(plain[1], minlength=256)[0] > 20 * np.median(np.bincount(plain[1], minlength=256))


def test_rmat_symmetric_and_argument_checks():
    g = rmat(7, 4, seed=0, symmetric=True)
    assert g.num_edges == 2 * 4 * 128
    a = g.to_scipy()
    assert (a != a.T).nnz == 0
    for bad in (dict(a=0.6, b=0.3, c=0.3), dict(a=-0.1)):
        with pytest.raises(ValueError, match="rmat"):
            rmat(4, 2, **bad)
    with pytest.raises(ValueError, match="scale"):
        rmat(-1, 2)


@pytest.mark.slow
def test_rmat_scale_18_generates_in_seconds():
    start = time.perf_counter()
    g = rmat(18, 16)
    assert g.num_edges == 16 * 2**18
    assert time.perf_counter() - start < 15   # ~3 s on an idle dev core; generous for CI


def test_unrank_lower_triangle_exhaustive_and_large():
    pairs = [(i, j) for i in range(1, 90) for j in range(i)]
    rows, cols = unrank_lower_triangle(np.arange(len(pairs)))
    assert list(zip(rows.tolist(), cols.tolist())) == pairs
    # near the float64 limit of the square root
    for i in (2**25 + 3, 3 * 10**7, 2**26 - 1):
        for j in (0, i // 2, i - 1):
            r, c = unrank_lower_triangle(np.array([i * (i - 1) // 2 + j]))
            assert (int(r[0]), int(c[0])) == (i, j)


def test_sbm_edges_structure_and_densities():
    sizes = [200, 150, 250]
    p_in, p_out = 0.06, 0.01
    edges = sbm_edges(sizes, p_in, p_out, seed=3)
    n = sum(sizes)
    assert not np.any(edges[0] == edges[1])
    keys = edges[0] * n + edges[1]
    assert np.unique(keys).size == keys.size
    a = sp.csr_matrix((np.ones(edges.shape[1]), (edges[0], edges[1])), shape=(n, n))
    assert (a != a.T).nnz == 0
    block = np.repeat(np.arange(3), sizes)
    upper = edges[:, edges[0] < edges[1]]
    same = block[upper[0]] == block[upper[1]]
    pairs_in = sum(s * (s - 1) // 2 for s in sizes)
    pairs_out = n * (n - 1) // 2 - pairs_in
    for count, pairs, p in ((same.sum(), pairs_in, p_in), ((~same).sum(), pairs_out, p_out)):
        assert abs(count - pairs * p) < 5 * np.sqrt(pairs * p * (1 - p)), (count, pairs * p)
    with pytest.raises(ValueError, match="p_in"):
        sbm_edges([3], 1.5, 0)


def test_sbm_dataset_shape_split_and_homophily():
    d = sbm(1200, 4, seed=7, avg_degree=10, homophily=0.9)
    assert (d.num_nodes, d.num_classes, d.num_features) == (1200, 4, 64)
    assert np.bincount(d.y).tolist() == [300] * 4
    assert d.train_mask.sum() == 80 and d.val_mask.sum() == 500 and d.test_mask.sum() == 620
    ei = d.edge_index
    assert abs(np.mean(d.y[ei[0]] == d.y[ei[1]]) - 0.9) < 0.03
    assert abs(d.num_edges / d.num_nodes - 10) < 0.8
    assert d.y[:300].std() > 0                    # ids shuffled, not one block per range
    again = sbm(1200, 4, seed=7, avg_degree=10, homophily=0.9)
    np.testing.assert_array_equal(again.x, d.x)
    np.testing.assert_array_equal(again.graph.indices, d.graph.indices)


def train_two_layer(a_hat, x, y, train, test, *, epochs=200, hidden=16, lr=0.01,
                    weight_decay=5e-4, seed=0):
    """Full-batch 2-layer GCN (Kipf & Welling) in numpy with Adam; a_hat = I gives an MLP."""
    rng = np.random.default_rng(seed)
    classes = int(y.max()) + 1

    def glorot(i, o):
        return rng.uniform(-1, 1, (i, o)) * np.sqrt(6 / (i + o))

    params = [glorot(x.shape[1], hidden), glorot(hidden, classes)]
    moments = [[np.zeros_like(p), np.zeros_like(p)] for p in params]
    onehot = np.eye(classes)[y]
    ax = a_hat @ x
    for step in range(1, epochs + 1):
        w1, w2 = params
        pre = ax @ w1
        h = np.maximum(pre, 0)
        ah = a_hat @ h
        z = ah @ w2
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        gz = np.where(train[:, None], p - onehot, 0) / train.sum()
        g2 = ah.T @ gz + weight_decay * w2
        gh = (a_hat.T @ (gz @ w2.T)) * (pre > 0)
        g1 = ax.T @ gh + weight_decay * w1
        for param, grad, (m, v) in zip(params, (g1, g2), moments):
            m *= 0.9
            m += 0.1 * grad
            v *= 0.999
            v += 0.001 * grad**2
            param -= lr * (m / (1 - 0.9**step)) / (np.sqrt(v / (1 - 0.999**step)) + 1e-8)
    pred = (a_hat @ np.maximum(ax @ params[0], 0) @ params[1]).argmax(1)
    return float(np.mean(pred[test] == y[test]))


def test_gcn_learns_the_planted_classes():
    d = sbm(seed=0)   # Cora-sized: 2708 nodes, 7 classes, 20 per class for training
    x = d.x.astype(np.float64)
    # 60 epochs at lr 0.03 converge here (the paper's 200 at 0.01 give the same accuracy)
    gcn = train_two_layer(gcn_norm(d.graph).to_scipy(), x, d.y, d.train_mask, d.test_mask,
                          epochs=60, lr=0.03)
    mlp = train_two_layer(sp.identity(d.num_nodes, format="csr"), x, d.y, d.train_mask,
                          d.test_mask, epochs=60, lr=0.03)
    chance = 1 / d.num_classes
    assert gcn >= 0.75, gcn
    assert gcn >= mlp + 0.25, (gcn, mlp)      # the graph carries the signal
    assert mlp > chance + 0.03, mlp           # the features carry a weak one
