"""Neighbour sampler and prefetcher."""
import threading
import time

import numpy as np
import pytest

from gnnweave.golden.aggregate import aggregate_float
from gnnweave.graph import CSRGraph, gcn_norm
from gnnweave.host.executors import CpuExecutor
from gnnweave.host.sampling import NeighborSampler, Prefetcher, seed_batches


def random_graph(n=200, e=3000, seed=0):
    rng = np.random.default_rng(seed)
    return gcn_norm(CSRGraph.from_edge_index(rng.integers(0, n, size=(2, e)), n))


def test_block_structure_and_fanout():
    g = random_graph()
    seeds = np.array([5, 17, 3, 150])
    blocks = NeighborSampler(g, [4, 6]).sample(seeds, np.random.default_rng(0))
    assert len(blocks) == 2
    top, bottom = blocks[1], blocks[0]
    np.testing.assert_array_equal(top.src_nodes[:4], seeds)          # destinations first
    assert top.n_dst == 4 and bottom.n_dst == top.n_src
    np.testing.assert_array_equal(bottom.src_nodes[:bottom.n_dst], top.src_nodes)
    for b, fanout in ((top, 4), (bottom, 6)):
        deg = b.graph.in_degree
        assert (deg[: b.n_dst] <= fanout).all() and (deg[b.n_dst:] == 0).all()
        full_deg = g.in_degree[b.src_nodes[: b.n_dst]]
        np.testing.assert_array_equal(deg[: b.n_dst], np.minimum(full_deg, fanout))
        # every sampled edge is an edge of the graph
        dst = np.repeat(b.src_nodes[: b.n_dst], deg[: b.n_dst])
        src = b.src_nodes[b.graph.indices]
        full = set(zip(np.repeat(np.arange(g.num_nodes), g.in_degree), g.indices))
        assert all((d, s) in full for d, s in zip(dst, src))


def test_full_fanout_block_aggregation_equals_full_graph():
    g = random_graph()
    x = np.random.default_rng(1).normal(size=(g.num_nodes, 5)).astype(np.float32)
    seeds = np.arange(0, 200, 7)
    (block,) = NeighborSampler(g, [-1]).sample(seeds, np.random.default_rng(0))
    out = CpuExecutor().aggregate(block.graph, x[block.src_nodes], rows=(0, block.n_dst)).value
    ref = aggregate_float(g, x, weights=g.weights)[seeds]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_sampled_aggregation_is_unbiased():
    g = random_graph(n=60, e=1500)
    x = np.random.default_rng(2).normal(size=(60, 3))
    seeds = np.arange(60)
    sampler = NeighborSampler(g, [5])
    rng = np.random.default_rng(3)
    acc = np.zeros((60, 3))
    trials = 400
    for _ in range(trials):
        (b,) = sampler.sample(seeds, rng)
        acc += aggregate_float(b.graph, x[b.src_nodes], weights=b.graph.weights)[:60]
    ref = aggregate_float(g, x, weights=g.weights)
    assert np.abs(acc / trials - ref).max() < 0.1 * np.abs(ref).max()


def test_sampling_is_deterministic_per_rng():
    g = random_graph()
    s = NeighborSampler(g, [3, 3])
    a = s.sample(np.arange(10), np.random.default_rng(7))
    b = s.sample(np.arange(10), np.random.default_rng(7))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.graph.indices, y.graph.indices)
        np.testing.assert_array_equal(x.src_nodes, y.src_nodes)


def test_sampler_errors():
    g = random_graph()
    with pytest.raises(ValueError, match=r"fanouts\[1\] = 0"):
        NeighborSampler(g, [3, 0])
    with pytest.raises(ValueError, match="seeds: 500 is not a node id"):
        NeighborSampler(g, [3]).sample([1, 500], np.random.default_rng(0))
    with pytest.raises(ValueError, match="unique"):
        NeighborSampler(g, [3]).sample([1, 1], np.random.default_rng(0))
    with pytest.raises(ValueError, match="batch_size"):
        seed_batches(np.arange(5), 0, None)


def test_seed_batches_cover_every_node_once():
    batches = seed_batches(np.arange(23), 5, np.random.default_rng(0))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
    np.testing.assert_array_equal(np.sort(np.concatenate(batches)), np.arange(23))


def test_prefetcher_overlaps_production_with_consumption():
    events = []
    lock = threading.Lock()

    def producer():
        for i in range(4):
            with lock:
                events.append(("start", i, time.perf_counter()))
            time.sleep(0.05)
            yield i

    consumed = []
    with Prefetcher(producer(), depth=2) as pf:
        for item in pf:
            t0 = time.perf_counter()
            time.sleep(0.05)            # "compute" on the item
            consumed.append((item, t0, time.perf_counter()))
    assert [c[0] for c in consumed] == [0, 1, 2, 3]
    starts = {i: t for kind, i, t in events}
    # item i+1 was being produced while item i was consumed
    assert all(starts[i + 1] < consumed[i][2] for i in range(3))


def test_prefetcher_reraises_producer_errors_and_stops():
    def producer():
        yield 1
        raise RuntimeError("sampler broke")

    with pytest.raises(RuntimeError, match="sampler broke"):
        list(Prefetcher(producer()))

    def endless():
        i = 0
        while True:
            i += 1
            yield i

    pf = Prefetcher(endless(), depth=1)
    assert next(iter(pf)) == 1
    pf.close()
    assert not pf.running
