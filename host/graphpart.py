"""Graph partitioning over ranks: which rank owns which nodes, and each rank's local block.

A distributed step gives every rank a contiguous range of *new* node ids (the graph is
relabelled so that each part is one range) and the local block of the model's normalised
graph: the rank's own nodes as destinations, its own and its *halo* nodes (sources owned
by other ranks) as sources. The block keeps the global normalisation's edge weights, so
aggregating it over halo rows fetched from their owners gives exactly the global
aggregation's rows.

Methods (``partition_graph(method=...)``):

* ``metis``  METIS k-way (pymetis) on the symmetrised graph without self loops, vertex
  weights from per-node costs (:func:`node_costs`), target part weights ``tpwgts``
  proportional to the ranks' speeds (a fast rank gets more work);
* ``rcm``    reverse Cuthill-McKee order (scipy) cut into ranges of the cost in
  proportion to the speeds (a bandwidth-reducing order: neighbours get near ids);
* ``rows``   the node order as it is, cut the same way (no relabelling: as bad as random
  on graphs whose node order has no locality, such as Cora);
* ``random`` a seeded random assignment with part sizes in proportion to the speeds.

Without pymetis, ``metis`` falls back to ``rcm`` (and ``rcm`` to ``random`` without
scipy's csgraph); :attr:`GraphPartition.method` names what ran and
:attr:`GraphPartition.fallback` says why.

Halo rows move once per aggregation in each direction (forward: the owner sends its rows;
backward: the halo side sends its partial sums back to be added into the owner's rows), so
a layer of output width ``F`` moves ``2 * halo_nodes * F * itemsize`` bytes per step
(:meth:`GraphPartition.predicted_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph

METHODS = ("metis", "rcm", "rows", "random")


# --------------------------------------------------------------------------- costs, speeds


def node_costs(graph: CSRGraph, *, per_edge: float = 1.0, per_row: float = 1.0) -> np.ndarray:
    """Predicted work of each node as a destination: ``per_row + per_edge * in_degree``
    (a :class:`~gnnweave.host.partition.ShareCost`'s ``per_row_s`` and ``per_edge_s`` give
    the device's figures)."""
    if not (per_edge >= 0 and per_row >= 0 and per_edge + per_row > 0):
        raise InputError(f"node_costs: per_edge = {per_edge}, per_row = {per_row}: expected "
                         f">= 0, not both 0")
    return per_row + per_edge * graph.in_degree.astype(np.float64)


def _fractions(speeds, num_parts: int) -> np.ndarray:
    if speeds is None:
        return np.full(num_parts, 1.0 / num_parts)
    s = np.asarray(speeds, dtype=np.float64).reshape(-1)
    if s.shape[0] != num_parts:
        raise InputError(f"speeds: {s.shape[0]} entries for {num_parts} parts")
    bad = np.flatnonzero(~(np.isfinite(s) & (s > 0)))
    if bad.size:
        raise InputError(f"speeds[{bad[0]}] = {s[bad[0]]}: rank speeds must be finite and > 0")
    return s / s.sum()


def _check_costs(costs, n: int) -> np.ndarray:
    c = np.asarray(costs, dtype=np.float64).reshape(-1)
    if c.shape[0] != n:
        raise InputError(f"node_cost: {c.shape[0]} entries, the graph has {n} nodes")
    bad = np.flatnonzero(~(np.isfinite(c) & (c >= 0)))
    if bad.size:
        raise InputError(f"node_cost[{bad[0]}] = {c[bad[0]]}: costs must be finite and >= 0")
    return c


# --------------------------------------------------------------------------- the partition


@dataclass
class GraphPartition:
    """Nodes over ranks. Node ids here are the graph's own (*old*) ids unless named new.

    ``parts[v]``: the rank owning node ``v``; ``order[i]``: the old id of new id ``i`` (each
    rank's nodes are one range ``bounds[r]:bounds[r+1]`` of new ids, in old-id order within
    the rank); ``new_id``: the inverse of ``order``.
    """

    parts: np.ndarray
    num_parts: int
    method: str
    requested: str
    fallback: str | None = None
    fractions: np.ndarray | None = None
    order: np.ndarray = field(init=False, repr=False)
    new_id: np.ndarray = field(init=False, repr=False)
    bounds: np.ndarray = field(init=False)

    def __post_init__(self):
        self.parts = np.asarray(self.parts, dtype=np.int64)
        if self.parts.size and (self.parts.min() < 0 or self.parts.max() >= self.num_parts):
            i = int(np.flatnonzero((self.parts < 0) | (self.parts >= self.num_parts))[0])
            raise InputError(f"parts[{i}] = {self.parts[i]}: not a rank in 0..{self.num_parts - 1}")
        self.order = np.argsort(self.parts, kind="stable")
        self.new_id = np.empty_like(self.order)
        self.new_id[self.order] = np.arange(self.order.shape[0])
        counts = np.bincount(self.parts, minlength=self.num_parts)
        self.bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def num_nodes(self) -> int:
        return int(self.parts.shape[0])

    def owned(self, rank: int) -> np.ndarray:
        """Old ids of ``rank``'s nodes, in its local order (new-id order)."""
        return self.order[self.bounds[rank]:self.bounds[rank + 1]]

    def halo(self, graph: CSRGraph, rank: int) -> np.ndarray:
        """Old ids of the sources of ``rank``'s destinations that other ranks own, sorted
        by (owner, new id): the order in which they arrive from an all-to-all."""
        own = self.owned(rank)
        src = _row_sources(graph, own)
        src = np.unique(src[self.parts[src] != rank])
        return src[np.lexsort((self.new_id[src], self.parts[src]))]

    def halo_counts(self, graph: CSRGraph) -> np.ndarray:
        return np.array([self.halo(graph, r).shape[0] for r in range(self.num_parts)])

    def edge_cut(self, graph: CSRGraph) -> int:
        """Directed edges ``u -> v`` (self loops aside) whose ends lie on different ranks."""
        dst = np.repeat(np.arange(graph.num_nodes), graph.in_degree)
        return int(np.count_nonzero(self.parts[graph.indices] != self.parts[dst]))

    def predicted_bytes(self, graph: CSRGraph, widths, *, forward_itemsize: int = 4,
                        backward_itemsize: int | None = None) -> int:
        """Bytes the halo exchanges of one training step move between ranks: per layer of
        output width ``F`` (the width exchanged: GCN and GraphSAGE transform first), the
        forward all-to-all sends ``halo_nodes * F * forward_itemsize`` and the backward's
        reverse exchange ``halo_nodes * F * backward_itemsize``."""
        halo = int(self.halo_counts(graph).sum())
        b = forward_itemsize if backward_itemsize is None else backward_itemsize
        return int(sum(halo * int(w) * (forward_itemsize + b) for w in widths))

    def report(self, graph: CSRGraph, widths=(), *, node_cost=None, forward_itemsize: int = 4,
               backward_itemsize: int | None = None) -> dict:
        """JSON-ready summary: method (and fallback), edge cut, halo nodes per rank, nodes,
        edges and cost per rank against their targets, predicted bytes per step."""
        costs = (node_costs(graph) if node_cost is None
                 else _check_costs(node_cost, graph.num_nodes))
        k = self.num_parts
        per_cost = np.bincount(self.parts, weights=costs, minlength=k)
        target = (self.fractions if self.fractions is not None else np.full(k, 1.0 / k))
        target_cost = target * costs.sum()
        halo = self.halo_counts(graph)
        edges = np.bincount(self.parts, weights=graph.in_degree, minlength=k).astype(np.int64)
        return dict(
            method=self.method, requested=self.requested, fallback=self.fallback,
            num_parts=k, edge_cut=self.edge_cut(graph),
            halo_nodes=[int(h) for h in halo], halo_nodes_total=int(halo.sum()),
            nodes=[int(c) for c in np.diff(self.bounds)], edges=[int(e) for e in edges],
            target_fractions=[float(t) for t in target],
            balance=float(np.max(per_cost / np.where(target_cost > 0, target_cost, 1))),
            predicted_bytes_per_step=self.predicted_bytes(
                graph, widths, forward_itemsize=forward_itemsize,
                backward_itemsize=backward_itemsize) if len(widths) else None)


def _row_sources(graph: CSRGraph, rows: np.ndarray) -> np.ndarray:
    return graph.indices[_row_positions(graph, rows)]


def _symmetric_adjacency(graph: CSRGraph) -> sp.csr_matrix:
    """Pattern of ``A + A^T`` without self loops (what METIS and RCM take)."""
    a = graph.to_scipy()
    a = sp.csr_matrix((np.ones(a.nnz, dtype=np.int32), a.indices, a.indptr), shape=a.shape)
    s = (a + a.T).tocsr()
    s.setdiag(0)
    s.eliminate_zeros()
    s.sort_indices()
    return s


def _cut_order(order: np.ndarray, costs: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """Parts from cutting ``order`` into consecutive runs holding ``fractions`` of the cost."""
    cum = np.cumsum(costs[order])
    total = cum[-1] if cum.size else 0.0
    targets = np.cumsum(fractions)[:-1] * total
    cuts = np.searchsorted(cum, targets, side="left")
    parts = np.empty(order.shape[0], dtype=np.int64)
    parts[order] = np.searchsorted(cuts, np.arange(order.shape[0]), side="right")
    return parts


def _metis(graph, k, costs, fractions, seed):
    import pymetis
    adj = _symmetric_adjacency(graph)
    # METIS takes integer vertex weights: costs scaled to about 1000 per average node
    scale = 1000.0 / max(float(costs.mean()), 1e-300) if costs.size else 1.0
    vw = np.maximum(np.rint(costs * scale), 1).astype(np.int64)
    opts = pymetis.Options(seed=int(seed))
    csr = pymetis.CSRAdjacency(adj.indptr.astype(np.int64), adj.indices.astype(np.int64))
    _, parts = pymetis.part_graph(k, csr, vweights=vw, tpwgts=[float(f) for f in fractions],
                                  options=opts)
    return np.asarray(parts, dtype=np.int64)


def _rcm(graph, k, costs, fractions):
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    order = np.asarray(reverse_cuthill_mckee(_symmetric_adjacency(graph), symmetric_mode=True),
                       dtype=np.int64)
    return _cut_order(order, costs, fractions)


def _random(n, fractions, seed):
    rng = np.random.default_rng([int(seed), 0x9A27])
    counts = np.floor(fractions * n).astype(np.int64)
    counts[: n - counts.sum()] += 1
    parts = np.repeat(np.arange(fractions.shape[0]), counts)
    return parts[rng.permutation(n)]


def partition_graph(graph: CSRGraph, num_parts: int, *, method: str = "metis", node_cost=None,
                    speeds=None, seed: int = 0) -> GraphPartition:
    """Assign the nodes of ``graph`` to ``num_parts`` ranks.

    Args:
        graph: the graph (its edges decide the cut; weights are ignored).
        num_parts: ranks, >= 1.
        method: ``metis`` | ``rcm`` | ``rows`` | ``random`` (see the module docstring).
        node_cost: ``[N]`` work per node (default :func:`node_costs`: ``1 + in_degree``);
            METIS's vertex weights, and the quantity ``rcm``/``rows`` cut by.
        speeds: ``[num_parts]`` relative rank speeds (default equal); each rank's target
            share of the cost is its speed over their sum.
        seed: METIS's and ``random``'s seed. METIS is not deterministic across processes:
            partition on one rank and broadcast.
    """
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)) or num_parts < 1:
        raise InputError(f"num_parts = {num_parts!r}: expected an integer >= 1")
    key = str(method).lower()
    if key not in METHODS:
        raise InputError(f"partition method {method!r}: choose one of {', '.join(METHODS)}")
    n = graph.num_nodes
    if num_parts > max(n, 1):
        raise InputError(f"num_parts = {num_parts}: more ranks than the graph's {n} nodes")
    costs = node_costs(graph) if node_cost is None else _check_costs(node_cost, n)
    fractions = _fractions(speeds, int(num_parts))
    k = int(num_parts)
    fallback, ran = None, key
    if k == 1:
        parts = np.zeros(n, dtype=np.int64)
    elif key == "metis":
        try:
            parts = _metis(graph, k, costs, fractions, seed)
        except ImportError:
            fallback, ran = "pymetis is not installed (pip install 'gnnweave[dist]')", "rcm"
    if k > 1 and ran == "rcm":
        try:
            parts = _rcm(graph, k, costs, fractions)
        except ImportError:   # pragma: no cover - scipy always has csgraph
            fallback, ran = "scipy.sparse.csgraph is unavailable", "random"
    if k > 1 and ran == "rows":
        parts = _cut_order(np.arange(n), costs, fractions)
    if k > 1 and ran == "random":
        parts = _random(n, fractions, seed)
    part = GraphPartition(parts, k, ran, key, fallback, fractions)
    empty = np.flatnonzero(np.diff(part.bounds) == 0)
    if empty.size:
        raise InputError(f"partition ({ran}): rank {empty[0]} got no nodes; use fewer ranks "
                         f"or less uneven speeds")
    return part


# --------------------------------------------------------------------------- local blocks


@dataclass
class LocalBlock:
    """One rank's share of a normalised graph, in local ids.

    Local ids ``0..n_own`` are the rank's own nodes (in new-id order), ``n_own..n_src`` its
    halo nodes (grouped by owner rank, in new-id order within an owner: the order an
    all-to-all delivers them). ``graph`` has ``n_src`` nodes; its rows ``0..n_own`` hold
    the own nodes' in-edges with the global graph's weights, rows from ``n_own`` on none.

    ``send[q]``: local ids of own nodes that rank ``q`` holds as halo, in ``q``'s halo
    order; ``recv_counts[q]``: the halo rows that come from ``q``.
    """

    rank: int
    own: np.ndarray
    halo: np.ndarray
    graph: CSRGraph
    send: list
    recv_counts: list

    @property
    def n_own(self) -> int:
        return int(self.own.shape[0])

    @property
    def n_src(self) -> int:
        return self.graph.num_nodes

    @property
    def send_counts(self) -> list[int]:
        return [int(s.shape[0]) for s in self.send]

    @property
    def send_index(self) -> np.ndarray:
        """All rows to send, concatenated in peer order (the all-to-all's input order)."""
        return (np.concatenate(self.send) if self.send else np.zeros(0, np.int64)).astype(np.int64)


def local_block(graph: CSRGraph, partition: GraphPartition, rank: int) -> LocalBlock:
    """Rank ``rank``'s :class:`LocalBlock` of ``graph`` (the model's normalised graph)."""
    if not 0 <= rank < partition.num_parts:
        raise InputError(f"rank {rank}: not in 0..{partition.num_parts - 1}")
    if partition.num_nodes != graph.num_nodes:
        raise InputError(f"partition has {partition.num_nodes} nodes, the graph {graph.num_nodes}")
    own = partition.owned(rank)
    halo = partition.halo(graph, rank)
    local = np.full(graph.num_nodes, -1, dtype=np.int64)
    local[own] = np.arange(own.shape[0])
    local[halo] = own.shape[0] + np.arange(halo.shape[0])
    n_src = own.shape[0] + halo.shape[0]
    lengths = graph.in_degree[own]
    indptr = np.zeros(n_src + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:own.shape[0] + 1])
    indptr[own.shape[0] + 1:] = indptr[own.shape[0]]
    positions = _row_positions(graph, own)
    block = CSRGraph(indptr, local[graph.indices[positions]], n_src,
                     None if graph.weights is None else graph.weights[positions])
    owners = partition.parts[halo]
    recv_counts = [int(c) for c in np.bincount(owners, minlength=partition.num_parts)]
    send = []
    for q in range(partition.num_parts):
        if q == rank:
            send.append(np.zeros(0, dtype=np.int64))
            continue
        theirs = partition.halo(graph, q)
        mine = theirs[partition.parts[theirs] == rank]
        send.append(local[mine])
    return LocalBlock(rank, own, halo, block, send, recv_counts)


def _row_positions(graph: CSRGraph, rows: np.ndarray) -> np.ndarray:
    starts, lengths = graph.indptr[rows], graph.in_degree[rows]
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total) + offsets


__all__ = ["METHODS", "GraphPartition", "LocalBlock", "local_block", "node_costs",
           "partition_graph"]
