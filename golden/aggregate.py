"""Bit-exact model of the Aggregator, and its float reference.

The RTL computes, for every destination node ``v`` of a CSR graph held in memory::

    out[v] = reduce_{e in edges(v), indices[e] < N}  weight[e] * x[indices[e]]

Semantics, exactly as the hardware implements them (this module is the spec):

* Products are exact (``feat.width + weight.width`` bits); without edge weights the
  product is ``x`` itself. Sums accumulate in :func:`~gnnweave.fixed.accumulator_width`
  bits, which cannot overflow.
* ``sum``: ``narrow(acc, shift)``; ``max``: ``narrow(max of products, shift)``;
  ``mean``: ``S = narrow(acc, shift)`` into :data:`MEAN_SUM_WIDTH` bits, then
  ``narrow(S * mean_reciprocal(deg), MEAN_RECIP_BITS)``. ``narrow`` rounds half to
  even and saturates into the output width; an element counts once as saturated if
  any step saturated. ``shift = feat.frac + weight.frac - out.frac``.
* A node with no valid edge gets 0 for every reduction (the mean of nothing is 0).
* An index ``>= N`` is skipped (no memory access), counted in ``rejected``, and does
  not count towards the degree used by ``mean``.
* The edge stream is ``indices[0:num_edges]``. Node ``v`` owns the stream positions
  ``[p[v], p[v+1])`` with ``p[0] = min(indptr[0], E)`` and
  ``p[i] = min(max(indptr[i], p[i-1]), E)`` — a malformed ``indptr`` (not starting at
  0, decreasing, past ``E`` or not ending at ``E``) is clamped like this, flagged as
  ``bad_indptr``, and can never make the engine read outside the indices buffer.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from gnnweave.fixed import (
    MEAN_RECIP_BITS,
    MEAN_SUM_WIDTH,
    FixedFormat,
    mean_reciprocal,
    narrow,
)

# Edges processed per vectorised chunk: bounds the E x F int64 temporaries.
_CHUNK_ELEMENTS = 1 << 23


class Reduce(enum.IntEnum):
    """Reduction of the Aggregator; the values are the register encoding."""

    SUM = 0
    MEAN = 1
    MAX = 2

    @classmethod
    def parse(cls, value) -> "Reduce":
        if isinstance(value, Reduce):
            return value
        try:
            return cls[str(value).upper()]
        except KeyError:
            names = ", ".join(r.name.lower() for r in cls)
            raise ValueError(f"unknown reduce {value!r}; choose one of {names}") from None


@dataclass(frozen=True)
class AggregateFormat:
    """Formats of the feature input, the edge weights (None: unweighted) and the output."""

    feat: FixedFormat = FixedFormat(16, 8)
    weight: FixedFormat | None = FixedFormat(16, 14)
    out: FixedFormat = FixedFormat(16, 8)

    def __post_init__(self):
        if self.feat.width > 16 or (self.weight is not None and self.weight.width > 16):
            raise ValueError("Aggregator inputs are at most 16 bits wide")
        if self.out.width != self.feat.width:
            raise ValueError("Aggregator output width must equal the feature width")
        if self.shift < 0:
            raise ValueError(
                f"output format has more fractional bits ({self.out.frac}) than the products "
                f"({self.product_frac}): shift would be negative")

    @property
    def product_frac(self) -> int:
        return self.feat.frac + (self.weight.frac if self.weight is not None else 0)

    @property
    def shift(self) -> int:
        return self.product_frac - self.out.frac


@dataclass
class AggregateResult:
    out: np.ndarray                 # int64 [N, F], values in the output format
    saturations: int                # output elements that saturated
    rejected: int                   # indices >= N that were skipped
    edges: int                      # edges that were gathered (valid indices)
    bad_indptr: bool                # indptr had to be clamped
    degree: np.ndarray = field(repr=False)  # valid edges per node


def effective_indptr(indptr, num_nodes: int, num_edges: int) -> tuple[np.ndarray, bool]:
    """The clamped row pointers the hardware walks, and whether clamping changed anything."""
    p = np.asarray(indptr, dtype=np.int64)[: num_nodes + 1]
    if p.shape[0] != num_nodes + 1:
        raise ValueError(f"indptr has {p.shape[0]} entries, needs num_nodes + 1 = {num_nodes + 1}")
    eff = np.minimum(np.maximum.accumulate(p), num_edges)
    bad = bool(p[0] != 0 or p[-1] != num_edges or np.any(eff != p))
    return eff, bad


def aggregate_raw(indptr, indices, x, *, reduce: Reduce, shift: int, out_width: int,
                  weights=None, num_edges: int | None = None) -> AggregateResult:
    """The engine on raw memory contents: unsigned 32-bit ``indptr``/``indices`` as stored,
    integer features ``x [N, F]``, optional integer ``weights [E]``."""
    reduce = Reduce.parse(reduce)
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D [nodes, features], got shape {x.shape}")
    n, f = x.shape
    indices = np.asarray(indices).astype(np.int64) & 0xFFFF_FFFF  # as the 32-bit words in memory
    e = indices.shape[0] if num_edges is None else int(num_edges)
    if e > indices.shape[0]:
        raise ValueError(f"num_edges={e} but only {indices.shape[0]} indices given")
    indices = indices[:e]
    indptr = np.asarray(indptr).astype(np.int64) & 0xFFFF_FFFF
    eff, bad = effective_indptr(indptr, n, e)
    out_fmt = FixedFormat(out_width, 0)

    # stream positions that belong to some node, and which node
    counts = np.diff(eff)
    owned = np.zeros(e, dtype=bool)
    dest = np.repeat(np.arange(n, dtype=np.int64), counts)
    pos = _ranges(eff[:-1], counts)
    owned[pos] = True
    valid = owned.copy()
    valid[pos] &= indices[pos] < n
    rejected = int(np.count_nonzero(owned & ~valid))
    keep = pos[valid[pos]]
    keep_dest = dest[valid[pos]]
    degree = np.bincount(keep_dest, minlength=n).astype(np.int64)
    src = indices[keep]
    w = None
    if weights is not None:
        w = np.asarray(weights).astype(np.int64)[:e][keep]

    acc = _segment_reduce(x, src, w, degree, reduce)
    has = degree > 0
    if reduce is Reduce.MEAN:
        s, sat1 = narrow(acc, shift, FixedFormat(MEAN_SUM_WIDTH, 0))
        recip = mean_reciprocal(degree)[:, None]
        out, sat2 = narrow(s * recip, MEAN_RECIP_BITS, out_fmt)
        saturated = sat1 | sat2
    else:
        out, saturated = narrow(acc, shift, out_fmt)
    out = np.where(has[:, None], out, 0)
    saturated &= has[:, None]
    return AggregateResult(out=out, saturations=int(np.count_nonzero(saturated)),
                           rejected=rejected, edges=int(keep.shape[0]), bad_indptr=bad,
                           degree=degree)


def _ranges(starts, counts) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each pair, vectorised."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(np.asarray(starts, dtype=np.int64), counts) + (np.arange(total) - offsets)


def _segment_reduce(x, src, w, degree, reduce: Reduce) -> np.ndarray:
    """Exact int64 per-node reduction of ``w[k] * x[src[k]]`` over consecutive segments."""
    n, f = x.shape
    acc = np.zeros((n, f), dtype=np.int64)
    if src.shape[0] == 0 or f == 0:
        return acc
    bounds = np.concatenate([[0], np.cumsum(degree)])
    nodes = np.flatnonzero(degree)
    chunk_edges = max(1, _CHUNK_ELEMENTS // max(f, 1))
    xi = x.astype(np.int64, copy=False)
    start_node = 0
    while start_node < nodes.shape[0]:
        # take whole nodes until the chunk is full (at least one node)
        first_edge = bounds[nodes[start_node]]
        stop = np.searchsorted(bounds[nodes + 1], first_edge + chunk_edges, side="right")
        stop = max(stop, start_node + 1)
        chunk_nodes = nodes[start_node:stop]
        e0, e1 = first_edge, bounds[chunk_nodes[-1] + 1]
        prod = xi[src[e0:e1]]
        if w is not None:
            prod = prod * w[e0:e1, None]
        seg_starts = bounds[chunk_nodes] - e0
        if reduce is Reduce.MAX:
            acc[chunk_nodes] = np.maximum.reduceat(prod, seg_starts, axis=0)
        else:
            acc[chunk_nodes] = np.add.reduceat(prod, seg_starts, axis=0)
        start_node = stop
    return acc


def aggregate(graph, x, reduce="sum", fmt: AggregateFormat = AggregateFormat(),
              weights=None) -> AggregateResult:
    """Golden Aggregator on a :class:`~gnnweave.graph.CSRGraph` with quantised inputs.

    ``x`` holds integers in ``fmt.feat``; ``weights`` integers in ``fmt.weight`` (required
    when ``fmt.weight`` is set, one per edge in CSR order).
    """
    if (weights is None) != (fmt.weight is None):
        raise ValueError("weights must be given exactly when fmt.weight is set")
    return aggregate_raw(graph.indptr, graph.indices, x, reduce=reduce, shift=fmt.shift,
                         out_width=fmt.out.width, weights=weights)


def aggregate_float(graph, x, reduce="sum", weights=None) -> np.ndarray:
    """Float64 reference: the same reduction without any rounding (mean of nothing is 0)."""
    reduce = Reduce.parse(reduce)
    x = np.asarray(x, dtype=np.float64)
    n, f = x.shape
    deg = np.diff(graph.indptr)
    src = np.asarray(graph.indices, dtype=np.int64)
    prod = x[src]
    if weights is not None:
        prod = prod * np.asarray(weights, dtype=np.float64)[:, None]
    out = np.zeros((n, f))
    nodes = np.flatnonzero(deg)
    if nodes.size:
        starts = np.asarray(graph.indptr)[nodes]
        red = np.maximum if reduce is Reduce.MAX else np.add
        out[nodes] = red.reduceat(prod, starts, axis=0)
        if reduce is Reduce.MEAN:
            out[nodes] /= deg[nodes, None]
    return out
