"""Neighbour sampling for mini-batch training, and a background prefetcher.

A mini-batch of seed nodes becomes one :class:`Block` per layer (input layer first).
A block is a destination-grouped :class:`~gnnweave.graph.CSRGraph` over its *source*
nodes, numbered locally: the first ``n_dst`` sources are the block's destinations (the
next layer's nodes), rows ``>= n_dst`` have no edges. So every executor aggregates a
block with ``rows=(0, n_dst)``, and the backward pass uses ``transpose=True`` exactly as
on the full graph.

Each destination keeps at most ``fanout`` of its in-edges, drawn uniformly without
replacement. Kept edge weights are scaled by ``degree / kept`` so the sampled
aggregation is an unbiased estimate of the full one (a mean-normalised graph becomes the
mean over the sample; a GCN-normalised graph keeps its expected value).

``fanouts[i]`` is the fan-out of hop ``i + 1`` from the seeds (PyG's ``num_neighbors``
order); ``-1`` keeps every in-edge.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph


@dataclass
class Block:
    graph: CSRGraph           # over n_src local nodes; rows [0, n_dst) hold the sampled in-edges
    n_dst: int
    src_nodes: np.ndarray     # global ids of the local nodes; src_nodes[:n_dst] are the destinations

    @property
    def n_src(self) -> int:
        return self.graph.num_nodes


@dataclass
class MiniBatch:
    index: int                # position in the epoch
    seeds: np.ndarray         # global ids of the output nodes
    blocks: list[Block]       # input layer first
    x: np.ndarray | None = None   # features of blocks[0].src_nodes (on the device, after transfer)
    y: np.ndarray | None = None   # labels of the seeds

    @property
    def input_nodes(self) -> np.ndarray:
        return self.blocks[0].src_nodes if self.blocks else self.seeds


def _ranges(starts, counts) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(np.asarray(starts, dtype=np.int64), counts) + (np.arange(total) - offsets)


class NeighborSampler:
    """Uniform fan-out sampling of in-edges, hop by hop from the seeds."""

    def __init__(self, graph: CSRGraph, fanouts):
        fanouts = [int(f) for f in fanouts]
        if not fanouts:
            raise InputError("fanouts: need one fan-out per layer, got none")
        for i, f in enumerate(fanouts):
            if f == 0 or f < -1:
                raise InputError(f"fanouts[{i}] = {f}: must be >= 1, or -1 for every neighbour")
        self.graph = graph
        self.fanouts = fanouts
        self._local = np.full(graph.num_nodes, -1, dtype=np.int64)

    def sample_hop(self, nodes: np.ndarray, fanout: int, rng: np.random.Generator) -> Block:
        g = self.graph
        nodes = np.asarray(nodes, dtype=np.int64)
        n_dst = nodes.shape[0]
        starts = g.indptr[nodes]
        deg = g.indptr[nodes + 1] - starts
        pos = _ranges(starts, deg)
        seg = np.repeat(np.arange(n_dst, dtype=np.int64), deg)
        if fanout > 0 and pos.size and int(deg.max()) > fanout:
            keys = rng.random(pos.shape[0])
            order = np.lexsort((keys, seg))          # grouped by destination, random within
            seg_start = np.repeat(np.cumsum(deg) - deg, deg)
            rank = np.arange(pos.shape[0]) - seg_start
            keep = order[rank < fanout]
            keep.sort()                               # CSR order within each destination
            pos, seg = pos[keep], seg[keep]
        kept = np.minimum(deg, fanout) if fanout > 0 else deg
        src = g.indices[pos]
        weights = None
        if g.weights is not None:
            scale = np.where(kept > 0, deg / np.maximum(kept, 1), 0.0)
            weights = g.weights[pos] * scale[seg]
        # local numbering: destinations first, then new sources in ascending global id
        local = self._local
        local[nodes] = np.arange(n_dst)
        new = np.unique(src[local[src] < 0])
        local[new] = n_dst + np.arange(new.shape[0])
        src_local = local[src]
        src_nodes = np.concatenate([nodes, new])
        local[src_nodes] = -1
        n_src = src_nodes.shape[0]
        indptr = np.zeros(n_src + 1, dtype=np.int64)
        np.cumsum(np.bincount(seg, minlength=n_dst), out=indptr[1:n_dst + 1])
        indptr[n_dst + 1:] = indptr[n_dst]
        block_graph = CSRGraph(indptr, src_local, n_src, weights)
        return Block(block_graph, n_dst, src_nodes)

    def sample(self, seeds, rng: np.random.Generator) -> list[Block]:
        """Blocks for ``seeds``, input layer first."""
        nodes = np.asarray(seeds, dtype=np.int64)
        if nodes.size and (nodes.min() < 0 or nodes.max() >= self.graph.num_nodes):
            bad = nodes[(nodes < 0) | (nodes >= self.graph.num_nodes)][0]
            raise ValueError(f"seeds: {bad} is not a node id (0 <= id < {self.graph.num_nodes})")
        if np.unique(nodes).shape[0] != nodes.shape[0]:
            raise ValueError("seeds: node ids must be unique")
        blocks = []
        for fanout in self.fanouts:
            block = self.sample_hop(nodes, fanout, rng)
            blocks.insert(0, block)
            nodes = block.src_nodes
        return blocks


def seed_batches(nodes, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    """Shuffled (when ``rng`` is given) batches of ``nodes``."""
    nodes = np.asarray(nodes, dtype=np.int64)
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if rng is not None:
        nodes = nodes[rng.permutation(nodes.shape[0])]
    return [nodes[i:i + batch_size] for i in range(0, nodes.shape[0], batch_size)]


class _Failure:
    def __init__(self, exc):
        self.exc = exc


_DONE = object()


class Prefetcher:
    """Runs a producer iterator on a background thread, ``depth`` items ahead.

    The trainer's producer samples the next batch and copies its features to the device
    while the main thread computes the current one. Errors in the producer re-raise in
    the consumer; :meth:`close` (or leaving a ``with`` block) stops the thread.
    """

    def __init__(self, producer, depth: int = 2):
        if depth < 1:
            raise InputError(f"prefetch depth must be >= 1, got {depth}")
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._producer = producer
        self._thread = threading.Thread(target=self._run, name="gnnweave-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self):
        try:
            for item in self._producer:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer
            self._put(_Failure(exc))
            return
        self._put(_DONE)

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item

    def close(self):
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def running(self) -> bool:
        """True while the background thread is still preparing batches."""
        return self._thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
