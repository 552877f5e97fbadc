"""Argument checks, run before anything touches the device; each error names the
argument, the index and the allowed range."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnweave.contract import Limits
from gnnweave.golden.aggregate import Reduce


def as_int_array(value, what: str, *, ndim: int, lo: int, hi: int) -> np.ndarray:
    """``value`` as an int64 array of ``ndim`` dimensions with every entry in ``[lo, hi]``."""
    arr = np.asarray(value)
    if arr.ndim != ndim:
        raise ValueError(f"{what}: expected a {ndim}-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{what}: values must be integers (dtype {arr.dtype})")
    arr = arr.astype(np.int64)
    if arr.size:
        flat = arr.reshape(-1)
        bad = np.flatnonzero((flat < lo) | (flat > hi))
        if bad.size:
            i = int(bad[0])
            idx = np.unravel_index(i, arr.shape)
            raise ValueError(f"{what}[{', '.join(map(str, idx))}] = {int(flat[i])} "
                             f"is outside [{lo}, {hi}]")
    return arr


def elements(value, what: str, ndim: int = 2) -> np.ndarray:
    """An int16 operand (features, weights, MAC operands)."""
    return as_int_array(value, what, ndim=ndim, lo=Limits.ELEMENT_MIN, hi=Limits.ELEMENT_MAX)


def wide(value, what: str, ndim: int) -> np.ndarray:
    """An int32 operand (bias, master weights)."""
    return as_int_array(value, what, ndim=ndim, lo=Limits.WIDE_MIN, hi=Limits.WIDE_MAX)


def check_int(value, what: str, lo: int, hi: int) -> int:
    """An integer (not a bool) in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= int(value) <= hi:
        raise ValueError(f"{what} {value!r}: must be an integer in {lo}..{hi}")
    return int(value)


def check_shift(value, what: str = "shift") -> int:
    return check_int(value, what, 0, Limits.SHIFT_MAX)


def check_timeout(timeout_s, default: float | None = None) -> float:
    timeout_s = default if timeout_s is None else timeout_s
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s {timeout_s!r}: must be a positive number of seconds")
    return timeout_s


@dataclass(frozen=True, eq=False)
class CheckedGraph:
    """A CSR graph the driver has validated (:func:`check_graph`): read-only int64 copies
    of its row pointers, indices and (optional) int16 edge weights, so later changes to the
    caller's arrays cannot invalidate it. Pass it to :meth:`aggregate` for every column
    chunk of one aggregation: the graph is scanned once, not once per chunk."""

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def num_edges(self) -> int:
        return self.indices.shape[0]


def check_graph(graph, weights=None) -> CheckedGraph:
    """Validate ``graph`` (``.indptr``, ``.indices``): row pointers from 0 to ``E``, never
    decreasing, every index a node; ``weights`` (None: unweighted) int16, one per edge.
    An already checked graph is returned as it is."""
    if isinstance(graph, CheckedGraph):
        if weights is not None:
            raise ValueError("weights: a checked graph carries its weights; give them to "
                             "check_graph()")
        return graph
    for attr in ("indptr", "indices"):
        if not hasattr(graph, attr):
            raise ValueError(f"graph: needs .indptr and .indices (a CSRGraph), got {type(graph).__name__}")
    indptr = as_int_array(graph.indptr, "graph.indptr", ndim=1, lo=0, hi=Limits.INDEX_MAX)
    indices = as_int_array(graph.indices, "graph.indices", ndim=1, lo=0, hi=Limits.INDEX_MAX)
    if indptr.shape[0] < 1:
        raise ValueError("graph.indptr: needs num_nodes + 1 >= 1 entries")
    n, e = indptr.shape[0] - 1, indices.shape[0]
    if indptr[0] != 0 or indptr[-1] != e:
        raise ValueError(f"graph.indptr: must start at 0 and end at num_edges={e} "
                         f"(got {int(indptr[0])} .. {int(indptr[-1])})")
    dec = np.flatnonzero(np.diff(indptr) < 0)
    if dec.size:
        raise ValueError(f"graph.indptr[{int(dec[0]) + 1}] = {int(indptr[dec[0] + 1])} is smaller "
                         f"than graph.indptr[{int(dec[0])}] = {int(indptr[dec[0]])}")
    if e and indices.max() >= n:
        i = int(np.argmax(indices >= n))
        raise ValueError(f"graph.indices[{i}] = {int(indices[i])} is not a node (num_nodes={n})")
    w = None
    if weights is not None:
        w = elements(weights, "weights", ndim=1)
        if w.shape[0] != e:
            raise ValueError(f"weights: {w.shape[0]} values, the graph has {e} edges")
        w.flags.writeable = False
    indptr.flags.writeable = indices.flags.writeable = False
    return CheckedGraph(indptr, indices, w)


def validate_job(graph, x_q, reduce, shift, weights, *, max_feat_dim: int, timeout_s):
    """Checks every argument of an aggregation; returns ``(indptr, indices, x, reduce,
    shift, weights)`` normalised. ``graph`` may be a :class:`CheckedGraph` (not scanned
    again; its weights are the job's)."""
    g = check_graph(graph, weights)
    n, e = g.num_nodes, g.num_edges
    x = elements(x_q, "x_q")
    if x.shape[0] != n:
        raise ValueError(f"x_q: {x.shape[0]} rows, the graph has {n} nodes")
    f = x.shape[1]
    if not 1 <= f <= max_feat_dim:
        raise ValueError(f"x_q: {f} features per row, this accelerator takes 1..{max_feat_dim}")
    try:
        red = Reduce.parse(reduce) if not isinstance(reduce, (int, np.integer)) else Reduce(int(reduce))
    except ValueError:
        raise ValueError(f"reduce {reduce!r}: choose one of sum, mean, max") from None
    shift = check_shift(shift)
    check_timeout(timeout_s)
    return g.indptr, g.indices, x, red, shift, g.weights
