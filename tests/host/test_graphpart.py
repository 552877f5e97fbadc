"""Partitioning over ranks: METIS's halo against random's on Cora, speed-weighted targets,
the fallbacks, and local blocks against the global aggregation (scipy oracle)."""
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from gnnweave.datasets import load_dataset
from gnnweave.graph import gcn_norm
from gnnweave.host.graphpart import local_block, node_costs, partition_graph
from gnnweave.host.models import mean_norm
from tests.conftest import require, require_dataset


@pytest.fixture(scope="module")
def cora():
    return require_dataset("cora")


def test_metis_cuts_the_cora_halo_five_times_below_random(cora):
    require("pymetis")
    metis = partition_graph(cora.graph, 2, method="metis")
    rand = partition_graph(cora.graph, 2, method="random")
    h_metis = int(metis.halo_counts(cora.graph).sum())
    h_rand = int(rand.halo_counts(cora.graph).sum())
    assert metis.method == "metis" and metis.fallback is None
    assert h_rand >= 5 * h_metis, (h_metis, h_rand)
    # and the cut it reports is the directed edges between the two sides
    src = cora.graph.indices
    dst = np.repeat(np.arange(cora.graph.num_nodes), cora.graph.in_degree)
    assert metis.edge_cut(cora.graph) == int(np.sum(metis.parts[src] != metis.parts[dst]))


def test_rcm_beats_the_unrelabelled_rows_on_cora(cora):
    # Cora's node order has no locality: its row ranges are as bad as random
    rcm = partition_graph(cora.graph, 2, method="rcm").halo_counts(cora.graph).sum()
    rows = partition_graph(cora.graph, 2, method="rows").halo_counts(cora.graph).sum()
    assert 2 * rcm < rows


@pytest.mark.parametrize("method", ["metis", "rcm", "rows", "random"])
def test_target_weights_follow_rank_speeds(cora, method):
    if method == "metis":
        require("pymetis")
    costs = node_costs(cora.graph)
    p = partition_graph(cora.graph, 2, method=method, speeds=[2.0, 1.0])
    share = np.bincount(p.parts, weights=costs if method != "random" else None,
                        minlength=2) / (costs.sum() if method != "random" else p.num_nodes)
    assert share[0] == pytest.approx(2 / 3, abs=0.03), share
    report = p.report(cora.graph, widths=[16, 7])
    assert report["balance"] < 1.05
    assert report["target_fractions"] == pytest.approx([2 / 3, 1 / 3])


def test_relabelling_gives_each_rank_one_contiguous_range(cora):
    p = partition_graph(cora.graph, 3, method="random", seed=4)
    assert np.array_equal(p.order[p.new_id], np.arange(p.num_nodes))
    for r in range(3):
        own = p.owned(r)
        assert np.all(p.parts[own] == r)
        assert np.array_equal(p.new_id[own], np.arange(p.bounds[r], p.bounds[r + 1]))


def test_without_pymetis_metis_falls_back_to_rcm_and_says_so(cora, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)   # import pymetis -> ImportError
    p = partition_graph(cora.graph, 2, method="metis")
    assert p.method == "rcm" and p.requested == "metis"
    assert "pymetis" in p.fallback
    assert p.report(cora.graph)["fallback"] == p.fallback


@pytest.mark.parametrize("norm", [gcn_norm, mean_norm], ids=["gcn", "mean"])
@pytest.mark.parametrize("k", [2, 3])
def test_local_blocks_reproduce_the_global_aggregation(norm, k):
    ds = load_dataset("sbm:400:4", seed=1)
    g = norm(ds.graph)
    p = partition_graph(g, k, method="random", seed=2)
    x = np.random.default_rng(0).standard_normal((g.num_nodes, 5))
    a = sp.csr_matrix((g.weights, g.indices, g.indptr), shape=(g.num_nodes,) * 2)
    oracle = a @ x                                  # out[v] = sum_u w_uv x[u]
    oracle_t = a.T @ x                              # the backward pass's transpose
    blocks = [local_block(g, p, r) for r in range(k)]
    back = np.zeros_like(x)
    for b in blocks:
        # halo rows as an all-to-all delivers them: from each owner, its send list for us
        arrived = np.concatenate([blocks[q].own[blocks[q].send[b.rank]] for q in range(k)])
        assert np.array_equal(arrived, b.halo)
        assert b.recv_counts == [blocks[q].send_counts[b.rank] for q in range(k)]
        x_local = x[np.concatenate([b.own, b.halo])]
        bg = sp.csr_matrix((b.graph.weights, b.graph.indices, b.graph.indptr),
                           shape=(b.n_src,) * 2)
        # same entries in the same order per row: the same float sums, bit for bit
        assert np.array_equal((bg @ x_local)[: b.n_own], oracle[b.own])
        # backward: the transposed block's rows for own and halo nodes add up to A^T x
        dz = bg.T @ np.vstack([x[b.own], np.zeros((b.n_src - b.n_own, 5))])
        np.add.at(back, np.concatenate([b.own, b.halo]), dz)
    np.testing.assert_allclose(back, oracle_t, rtol=1e-12, atol=1e-12)


def test_predicted_bytes_count_halo_rows_both_ways(cora):
    p = partition_graph(cora.graph, 2, method="random")
    halo = int(p.halo_counts(cora.graph).sum())
    assert p.predicted_bytes(cora.graph, [16, 7]) == halo * (16 + 7) * 4 * 2
    assert p.predicted_bytes(cora.graph, [16], forward_itemsize=2, backward_itemsize=8) == \
        halo * 16 * 10


def test_bad_requests_name_the_problem(cora):
    with pytest.raises(ValueError, match="partition method 'kway'"):
        partition_graph(cora.graph, 2, method="kway")
    with pytest.raises(ValueError, match="speeds: 3 entries for 2 parts"):
        partition_graph(cora.graph, 2, speeds=[1, 2, 3])
    with pytest.raises(ValueError, match=r"speeds\[1\] = 0"):
        partition_graph(cora.graph, 2, speeds=[1, 0])
    with pytest.raises(ValueError, match="num_parts = 0"):
        partition_graph(cora.graph, 0)
    with pytest.raises(ValueError, match="node_cost: 3 entries"):
        partition_graph(cora.graph, 2, node_cost=[1, 2, 3])


def test_a_cost_models_per_row_and_per_edge_seconds_weigh_the_nodes(cora):
    from gnnweave.host.distributed import model_node_costs
    from gnnweave.host.partition import ShareCost
    from gnnweave.host.train import TrainConfig

    class Fitted:   # the part of a fitted CostModel the partitioner reads
        def share_cost(self, device, *, feat_dim, num_nodes):
            assert (device, feat_dim, num_nodes) == ("fpga-emu", 16, cora.graph.num_nodes)
            return ShareCost(0.0, 2e-9, 5e-9)

    cfg = TrainConfig(device="fpga-emu", cost_model=Fitted())
    costs = model_node_costs(cfg, cora.graph, dict(hidden=16))
    np.testing.assert_allclose(costs, 5e-9 + 2e-9 * cora.graph.in_degree)
    assert model_node_costs(TrainConfig(), cora.graph, dict(hidden=16)) is None
    # the cut balances those costs: heavy (high-degree) nodes count for more
    p = partition_graph(cora.graph, 2, method="rcm", node_cost=costs)
    assert p.report(cora.graph, node_cost=costs)["balance"] < 1.01
