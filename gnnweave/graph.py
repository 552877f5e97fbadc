"""Graph container: CSR grouped by destination node.

Row ``v`` of the CSR lists the source nodes ``u`` of the edges ``u -> v``, so that
aggregation ``out[v] = reduce_u w_uv x[u]`` walks one row per output node. Edge
weights are optional floats in the same order as ``indices``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnweave.errors import InputError


@dataclass
class CSRGraph:
    indptr: np.ndarray            # int64 [N + 1]
    indices: np.ndarray           # int64 [E], source node of each edge
    num_nodes: int
    weights: np.ndarray | None = None  # float64 [E] or None

    def __post_init__(self):
        self.indptr = np.ascontiguousarray(self.indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(self.indices, dtype=np.int64)
        if self.weights is not None:
            self.weights = np.ascontiguousarray(self.weights, dtype=np.float64)
        self.validate()

    def validate(self):
        n = self.num_nodes
        if n < 0:
            raise InputError(f"num_nodes must be >= 0, got {n}")
        if self.indptr.shape != (n + 1,):
            raise InputError(f"indptr: shape {self.indptr.shape}, expected ({n + 1},)")
        if self.indptr[0] != 0 or np.any(np.diff(self.indptr) < 0):
            raise InputError("indptr: must start at 0 and never decrease")
        if self.indptr[-1] != self.indices.shape[0]:
            raise InputError(f"indptr: ends at {self.indptr[-1]} but there are "
                             f"{self.indices.shape[0]} indices")
        if self.indices.size:
            bad = np.flatnonzero((self.indices < 0) | (self.indices >= n))
            if bad.size:
                raise InputError(f"indices[{bad[0]}] = {self.indices[bad[0]]} is not a node id "
                                 f"(0 <= id < {n})")
        if self.weights is not None:
            if self.weights.shape != self.indices.shape:
                raise InputError(f"weights: shape {self.weights.shape}, expected {self.indices.shape}")
            if not np.isfinite(self.weights).all():
                i = int(np.flatnonzero(~np.isfinite(self.weights))[0])
                raise InputError(f"weights[{i}] is not finite")

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def in_degree(self) -> np.ndarray:
        return np.diff(self.indptr)

    @classmethod
    def from_edge_index(cls, edge_index, num_nodes: int | None = None, weights=None) -> "CSRGraph":
        """From a [2, E] array of (source, target) pairs; edge order is kept within a row."""
        ei = np.asarray(edge_index)
        if ei.ndim != 2 or ei.shape[0] != 2:
            raise InputError(f"edge_index: shape {ei.shape}, expected (2, E)")
        ei = ei.astype(np.int64)
        src, dst = ei[0], ei[1]
        if num_nodes is None:
            num_nodes = int(ei.max()) + 1 if ei.size else 0
        for name, ids in (("source", src), ("target", dst)):
            bad = np.flatnonzero((ids < 0) | (ids >= num_nodes))
            if bad.size:
                raise InputError(f"edge_index: {name} of edge {bad[0]} is {ids[bad[0]]}, "
                                 f"not a node id (0 <= id < {num_nodes})")
        order = np.argsort(dst, kind="stable")
        indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
        w = None if weights is None else np.asarray(weights, dtype=np.float64)[order]
        return cls(indptr, src[order], num_nodes, w)

    @classmethod
    def from_scipy(cls, matrix) -> "CSRGraph":
        """From a sparse matrix with ``A[v, u] = w_uv`` (rows are destinations)."""
        a = sp.csr_matrix(matrix)
        if a.shape[0] != a.shape[1]:
            raise InputError(f"adjacency must be square, got shape {a.shape}")
        return cls(a.indptr, a.indices, a.shape[0], a.data.astype(np.float64))

    def to_scipy(self) -> sp.csr_matrix:
        """``A[v, u] = w_uv`` (1 where unweighted); duplicate edges stay separate entries."""
        data = self.weights if self.weights is not None else np.ones(self.num_edges)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.num_nodes,) * 2)

    def transpose(self) -> "CSRGraph":
        """The reversed graph (for the backward pass): edge u -> v becomes v -> u."""
        dst = np.repeat(np.arange(self.num_nodes), self.in_degree)
        return CSRGraph.from_edge_index(np.stack([dst, self.indices]), self.num_nodes, self.weights)

    def with_weights(self, weights) -> "CSRGraph":
        return CSRGraph(self.indptr, self.indices, self.num_nodes, weights)


def gcn_norm(graph: CSRGraph, *, add_self_loops: bool = True) -> CSRGraph:
    """GCN's symmetric normalisation ``D^-1/2 (A + I) D^-1/2`` as edge weights.

    Follows PyG's ``gcn_norm`` (flow source -> target): with ``add_self_loops`` every
    node ends with exactly one self loop, as ``add_remaining_self_loops`` leaves it
    (existing loops are dropped; the new loop keeps the weight of the node's last
    existing loop, else 1), appended after the node's other in-edges. ``D`` is the
    weighted in-degree, self loop included; nodes of degree 0 get weight 0 edges.
    Unweighted graphs count every edge as 1.
    """
    n = graph.num_nodes
    dst = np.repeat(np.arange(n, dtype=np.int64), graph.in_degree)
    src = graph.indices
    w = np.ones(graph.num_edges) if graph.weights is None else graph.weights
    if add_self_loops:
        is_loop = src == dst
        loop_weight = np.ones(n)
        loop_weight[dst[is_loop]] = w[is_loop]   # fancy assignment: the last one wins
        others = ~is_loop
        nodes = np.arange(n, dtype=np.int64)
        src = np.concatenate([src[others], nodes])
        dst = np.concatenate([dst[others], nodes])
        w = np.concatenate([w[others], loop_weight])
    degree = np.bincount(dst, weights=w, minlength=n)
    if np.any(degree < 0):
        v = int(np.flatnonzero(degree < 0)[0])
        raise InputError(f"gcn_norm: node {v} has negative weighted in-degree {degree[v]}")
    inv_sqrt = np.zeros(n)
    positive = degree > 0
    inv_sqrt[positive] = degree[positive] ** -0.5
    return CSRGraph.from_edge_index(np.stack([src, dst]), n, inv_sqrt[src] * w * inv_sqrt[dst])


def quantize_weights(graph: CSRGraph, fmt) -> tuple[np.ndarray, int]:
    """Edge weights in the fixed-point format ``fmt`` (1 for an unweighted graph), CSR
    order: (integers, number of saturated weights)."""
    w = np.ones(graph.num_edges) if graph.weights is None else graph.weights
    return fmt.quantize(w)
