"""What every executor shares: the op record, the interface, operand checks and the
per-graph cache of derived values (transposes, index arrays, quantised weights)."""
from __future__ import annotations

import abc
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnweave.errors import GnnweaveError
from gnnweave.graph import CSRGraph


class DeviceUnavailable(GnnweaveError, ValueError):
    """The requested device is not present (or its software is not installed)."""


@dataclass
class OpResult:
    value: np.ndarray
    wall_seconds: float              # host wall clock for the whole call
    device_seconds: float | None     # time on the device (measured, or an estimate for fpga-emu)
    bytes_in: int                    # bytes the device reads (transfers: bytes copied in)
    bytes_out: int                   # bytes the device writes (transfers: bytes copied out)
    op: str                          # 'aggregate', 'dense_forward', ..., 'transfer_in'
    executor: str                    # the executor's name
    saturations: int = 0             # fixed-point outputs that saturated (fpga kinds)


# --------------------------------------------------------------------------- graph caches


class PerGraphCache:
    """Values derived from a graph (its transpose, scipy matrix, ...), dropped with the graph.

    CSRGraph is a mutable dataclass (unhashable), so entries are keyed by ``id``. A
    weakref finaliser only *notes* a collected graph (it can run inside any allocation,
    even while the lock is held); the next lookup purges its entries before its id can
    be looked up again.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[tuple[int, str], object] = {}
        self._watched: set[int] = set()
        self._dead: list[int] = []

    def _purge(self):
        while self._dead:
            gid = self._dead.pop()
            self._watched.discard(gid)
            for k in [k for k in self._entries if k[0] == gid]:
                del self._entries[k]

    def get(self, graph: CSRGraph, key: str, build):
        k = (id(graph), key)
        with self._lock:
            self._purge()
            if k in self._entries:
                return self._entries[k]
        value = build()
        with self._lock:
            self._purge()
            self._entries.setdefault(k, value)
            if id(graph) not in self._watched:
                self._watched.add(id(graph))
                weakref.finalize(graph, self._dead.append, id(graph))
            return self._entries[k]


GRAPH_CACHE = PerGraphCache()


def transposed(graph: CSRGraph) -> CSRGraph:
    """``graph.transpose()``, computed once per graph object."""
    return GRAPH_CACHE.get(graph, "transpose", graph.transpose)


def oriented(graph: CSRGraph, transpose: bool) -> CSRGraph:
    """The graph an op walks: ``graph``, or its (cached) transpose for the backward pass."""
    return transposed(graph) if transpose else graph


def check_rows(graph: CSRGraph, rows) -> tuple[int, int]:
    """Validate a destination-node range ``[lo, hi)`` of ``graph``."""
    if rows is None:
        return 0, graph.num_nodes
    try:
        lo, hi = (int(r) for r in rows)
    except (TypeError, ValueError):
        raise ValueError(f"rows must be a (lo, hi) pair, got {rows!r}") from None
    if not 0 <= lo <= hi <= graph.num_nodes:
        raise ValueError(f"rows=({lo}, {hi}) is not a node range within 0..{graph.num_nodes}")
    return lo, hi


def check_features(graph: CSRGraph, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != graph.num_nodes:
        raise ValueError(f"x: shape {x.shape}, expected ({graph.num_nodes}, features)")
    return x


def shard_edges(graph: CSRGraph, lo: int, hi: int) -> int:
    return int(graph.indptr[hi] - graph.indptr[lo])


def abs_row_weight_max(graph: CSRGraph) -> float:
    """max_v sum_{u->v} |w_uv| over the whole graph (1 per edge when unweighted)."""
    def build():
        if graph.num_edges == 0:
            return 0.0
        w = np.abs(graph.weights) if graph.weights is not None else np.ones(graph.num_edges)
        sums = np.add.reduceat(w, graph.indptr[:-1][graph.in_degree > 0])
        return float(sums.max()) if sums.size else 0.0
    return GRAPH_CACHE.get(graph, "abs_row_weight_max", build)


def abs_weight_max(graph: CSRGraph) -> float:
    """max |w_uv| over the graph's edges (1 when unweighted or empty)."""
    def build():
        if graph.weights is None or graph.num_edges == 0:
            return 1.0
        return float(np.abs(graph.weights).max())
    return GRAPH_CACHE.get(graph, "abs_weight_max", build)


# --------------------------------------------------------------------------- base class


class Executor(abc.ABC):
    """A device that can run the training ops. Subclasses set ``name`` and ``kind``."""

    name: str
    kind: str

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"

    @abc.abstractmethod
    def aggregate(self, graph: CSRGraph, x: np.ndarray, reduce="sum", *,
                  rows: tuple[int, int] | None = None, transpose: bool = False) -> OpResult:
        """``out[v - lo] = reduce_{u -> v} w_uv x[u]`` for ``lo <= v < hi``; x [N, F] -> [hi-lo, F]."""

    @abc.abstractmethod
    def dense_forward(self, x, w, b=None, *, relu: bool = False) -> OpResult:
        """``x @ w (+ b)``, then ReLU when asked."""

    @abc.abstractmethod
    def dense_input_grad(self, dy, w, *, relu_mask=None) -> OpResult:
        """``(dy * relu_mask) @ w.T``."""

    @abc.abstractmethod
    def dense_weight_grad(self, x, dy, *, relu_mask=None) -> OpResult:
        """``x.T @ (dy * relu_mask)``."""

    def transfer_in(self, array) -> OpResult:
        """Copy a host array to the device; the value is what the device now holds."""
        return self._no_copy(array, "transfer_in")

    def transfer_out(self, array) -> OpResult:
        """Copy a device array back to the host."""
        return self._no_copy(array, "transfer_out")

    def close(self):
        """Release device resources (no-op where there are none)."""

    def _no_copy(self, array, op):
        t0 = time.perf_counter()
        a = as_operand(array)
        return OpResult(a, time.perf_counter() - t0, 0.0, 0, 0, op, self.name)


def apply_relu_mask(dy, relu_mask):
    if relu_mask is None:
        return dy
    relu_mask = np.asarray(relu_mask)
    if relu_mask.shape != np.shape(dy):
        raise ValueError(f"relu_mask: shape {relu_mask.shape}, expected {np.shape(dy)}")
    return np.where(relu_mask, dy, 0).astype(np.asarray(dy).dtype, copy=False)


def as_operand(x):
    """ndarray, or a scipy sparse matrix kept sparse (as CSR)."""
    if sp.issparse(x):
        return sp.csr_matrix(x)
    return np.asarray(x)


def dense_array(x) -> np.ndarray:
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def operand_nbytes(x) -> int:
    """Bytes of an operand: a dense array's, or a CSR matrix's three arrays."""
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    return int(np.asarray(x).nbytes)


def check_dense(x, w, what="x"):
    x = as_operand(x)
    w = np.asarray(w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"dense: {what} shape {x.shape} does not match w shape {w.shape}")
    return x, w


