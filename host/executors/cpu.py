"""``cpu`` (also ``cpu:1``, ...): numpy/scipy float32 on the host (scipy CSR @ dense)."""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from gnnweave.golden.aggregate import Reduce
from gnnweave.graph import CSRGraph
from gnnweave.host.executors.base import (
    GRAPH_CACHE, Executor, OpResult, apply_relu_mask, as_operand, check_dense, check_features,
    check_rows, operand_nbytes, oriented,
)


class CpuExecutor(Executor):
    """numpy/scipy float32 on the host."""

    kind = "cpu"

    def __init__(self, name: str = "cpu"):
        self.name = name

    @staticmethod
    def _arrays(graph: CSRGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data float32, indices, indptr)`` of ``graph`` in the index type scipy's kernels
        use (int32 while it fits), made once per graph. Built per call, scipy's CSR
        constructor scans and narrows the int64 index arrays of the share every time: measured
        2.3-2.7 ms of a 30 ms whole-graph aggregation (1.44 M edges), paid again by each share."""
        def build():
            data = (graph.weights if graph.weights is not None
                    else np.ones(graph.num_edges)).astype(np.float32)
            small = max(graph.num_nodes, graph.num_edges) < np.iinfo(np.int32).max
            idx = np.int32 if small else np.int64
            return (data, np.ascontiguousarray(graph.indices, dtype=idx),
                    np.ascontiguousarray(graph.indptr, dtype=idx))
        return GRAPH_CACHE.get(graph, "cpu_csr_arrays", build)

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        reduce = Reduce.parse(reduce)
        g = oriented(graph, transpose)
        x = check_features(g, x).astype(np.float32, copy=False)
        lo, hi = check_rows(g, rows)
        s, e = int(g.indptr[lo]), int(g.indptr[hi])
        all_data, all_indices, all_indptr = self._arrays(g)
        data = all_data[s:e]
        indptr = all_indptr[lo:hi + 1] - all_indptr.dtype.type(s)
        indices = all_indices[s:e]
        f = x.shape[1]
        if reduce is Reduce.MAX:
            out = np.zeros((hi - lo, f), dtype=np.float32)
            deg = np.diff(indptr)
            nz = np.flatnonzero(deg)
            if nz.size:
                prod = x[indices] * data[:, None]
                out[nz] = np.maximum.reduceat(prod, indptr[:-1][nz], axis=0)
        else:
            a = sp.csr_matrix((data, indices, indptr), shape=(hi - lo, g.num_nodes))
            out = np.asarray(a @ x, dtype=np.float32)
            if reduce is Reduce.MEAN:
                deg = np.diff(indptr).astype(np.float32)
                out /= np.maximum(deg, 1)[:, None]
        edges = e - s
        return OpResult(out, time.perf_counter() - t0, None,
                        edges * (f * 4 + 8 + 4), out.nbytes, "aggregate", self.name)

    def dense_forward(self, x, w, b=None, *, relu=False):
        t0 = time.perf_counter()
        x, w = check_dense(x, w)
        if sp.issparse(x):
            y = np.asarray(x.astype(np.float32) @ w.astype(np.float32), dtype=np.float32)
        else:
            y = _row_stable_matmul(np.asarray(x, dtype=np.float32), np.asarray(w, dtype=np.float32))
        if b is not None:
            y += np.asarray(b, dtype=np.float32)
        if relu:
            np.maximum(y, 0, out=y)
        return OpResult(y, time.perf_counter() - t0, None, operand_nbytes(x) + w.size * 4,
                        y.nbytes, "dense_forward", self.name)

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        t0 = time.perf_counter()
        dy = apply_relu_mask(np.asarray(dy, dtype=np.float32), relu_mask)
        w = np.asarray(w, dtype=np.float32)
        if dy.ndim != 2 or w.ndim != 2 or dy.shape[1] != w.shape[1]:
            raise ValueError(f"dense_input_grad: dy shape {dy.shape} does not match w shape {w.shape}")
        dx = _row_stable_matmul(dy, w.T)
        return OpResult(dx, time.perf_counter() - t0, None, dy.nbytes + w.nbytes, dx.nbytes,
                        "dense_input_grad", self.name)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        t0 = time.perf_counter()
        dy = apply_relu_mask(np.asarray(dy, dtype=np.float32), relu_mask)
        x = as_operand(x).astype(np.float32)
        if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
            raise ValueError(f"dense_weight_grad: x shape {x.shape} does not match dy shape {dy.shape}")
        dw = np.asarray(x.T @ dy, dtype=np.float32)
        return OpResult(dw, time.perf_counter() - t0, None, operand_nbytes(x) + dy.nbytes, dw.nbytes,
                        "dense_weight_grad", self.name)


def _row_stable_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float32 where each row of the result depends on its own row of ``a``
    only. OpenBLAS' float32 GEMM kernels on some CPUs round a row differently by how many
    rows share the call and by their alignment, so a transform done in row chunks (overlap,
    mini-batches) would not match the whole one bit for bit; einsum's own loop sums every
    row in one order."""
    return np.einsum("ik,kj->ij", a, b, optimize=False)
