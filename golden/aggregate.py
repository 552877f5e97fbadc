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
import scipy.sparse as sp

from gnnweave.enums import parse_enum
from gnnweave.fixed import (
    MEAN_RECIP_BITS,
    MEAN_SUM_WIDTH,
    FixedFormat,
    mean_reciprocal,
    narrow,
)

# Elements gathered per vectorised chunk of the max reduction: bounds the temporaries.
_CHUNK_ELEMENTS = 1 << 22

# float64 adds integers exactly while every partial sum stays below this.
_FLOAT_EXACT_LIMIT = 1 << 53


class Reduce(enum.IntEnum):
    """Reduction of the Aggregator; the values are the register encoding."""

    SUM = 0
    MEAN = 1
    MAX = 2

    @classmethod
    def parse(cls, value) -> "Reduce":
        return parse_enum(cls, value, "reduce")


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
        if self.shift > 63:
            raise ValueError(f"shift {self.shift} exceeds the hardware's 63")
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
                  weights=None, num_edges: int | None = None,
                  num_rows: int | None = None) -> AggregateResult:
    """The engine on raw memory contents: unsigned 32-bit ``indptr``/``indices`` as stored,
    integer features ``x [N, F]``, optional integer ``weights [E]``.

    ``num_rows``: compute only the first ``num_rows`` destination rows (default all N), for
    a caller whose rows from ``num_rows`` on are empty (``indptr[num_rows] == num_edges``;
    e.g. a row range of a graph laid out as the engine sees a shard). A row's output depends
    on its own edges only, so the result is then the whole one's (``out`` and ``degree``
    cut to those rows, every count and flag equal) at the cost of those rows, not N."""
    reduce = Reduce.parse(reduce)
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D [nodes, features], got shape {x.shape}")
    if x.dtype.kind not in "biu":
        x = x.astype(np.int64)   # integers are expected; floats truncate as they always did
    n, f = x.shape
    rows = n if num_rows is None else int(num_rows)
    if not 0 <= rows <= n:
        raise ValueError(f"num_rows={num_rows}: must be in [0, {n}] (the rows of x)")
    indices = np.asarray(indices).astype(np.int64) & 0xFFFF_FFFF  # as the 32-bit words in memory
    e = indices.shape[0] if num_edges is None else int(num_edges)
    if e > indices.shape[0]:
        raise ValueError(f"num_edges={e} but only {indices.shape[0]} indices given")
    indices = indices[:e]
    indptr = np.asarray(indptr).astype(np.int64) & 0xFFFF_FFFF
    eff, bad = effective_indptr(indptr, rows, e)
    out_fmt = FixedFormat(out_width, 0)

    # Node v owns stream positions [eff[v], eff[v+1]); eff never decreases, so together
    # the nodes own the contiguous run [eff[0], eff[N]), in node order.
    first, last = int(eff[0]), int(eff[-1])
    stream = indices[first:last]
    degree = np.diff(eff)
    w = None
    if weights is not None:
        weights = np.asarray(weights)
        if weights.shape[0] < e:
            raise ValueError(f"{weights.shape[0]} weights given for num_edges={e}")
        w = weights[first:last].astype(np.int64)
    valid = stream < n
    rejected = int(stream.shape[0] - np.count_nonzero(valid))
    if rejected:
        invalid_positions = first + np.flatnonzero(~valid)
        owner = np.searchsorted(eff, invalid_positions, side="right") - 1
        degree = degree - np.bincount(owner, minlength=rows)
        stream = stream[valid]
        if w is not None:
            w = w[valid]
    row_ptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(degree, out=row_ptr[1:])

    acc = _segment_reduce(x, row_ptr, stream, w, reduce)
    has = degree > 0
    if reduce is Reduce.MEAN:
        s, sat1 = _narrow(acc, shift, FixedFormat(MEAN_SUM_WIDTH, 0))
        s *= mean_reciprocal(degree)[:, None]
        out, sat2 = _narrow(s, MEAN_RECIP_BITS, out_fmt)
        saturated = sat1 | sat2
    else:
        out, saturated = _narrow(acc, shift, out_fmt)
    out[~has] = 0
    saturated[~has] = False
    return AggregateResult(out=out, saturations=int(np.count_nonzero(saturated)),
                           rejected=rejected, edges=int(stream.shape[0]), bad_indptr=bad,
                           degree=degree)


def _narrow(a, shift: int, fmt: FixedFormat) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gnnweave.fixed.narrow` in fewer passes over memory (it dominates on large
    graphs): round half to even is ``floor((a + 2**(shift-1) - 1 + kept_lsb) / 2**shift)``
    where ``kept_lsb`` is bit ``shift`` of ``a``. The tests hold it equal to ``narrow``."""
    a = np.asarray(a, dtype=np.int64)
    if not 0 <= shift <= 62:
        return narrow(a, shift, fmt)
    if shift == 0:
        rounded = a.copy()
    else:   # |a| <= 2**62 (2**32 products of 31 bits): a + 2**61 cannot overflow
        rounded = a >> shift
        rounded &= 1
        rounded += a
        rounded += (1 << (shift - 1)) - 1
        rounded >>= shift
    saturated = (rounded < fmt.min_int) | (rounded > fmt.max_int)
    np.clip(rounded, fmt.min_int, fmt.max_int, out=rounded)
    return rounded, saturated


def _segment_reduce(x, row_ptr, src, w, reduce: Reduce) -> np.ndarray:
    """Exact int64 ``acc[v] = reduce_{k in row v} w[k] * x[src[k]]`` (0 for empty rows).

    Two fast exact routes (the tests hold both against an independent naive model):
    sums go through a scipy sparse product, maxima through degree-bucketed gathers.
    """
    n, f = len(row_ptr) - 1, x.shape[1]
    if src.shape[0] == 0 or f == 0:
        return np.zeros((n, f), dtype=np.int64)
    if reduce is Reduce.MAX:
        return _segment_max(x, row_ptr, src, w)
    return _segment_sum(x, row_ptr, src, w)


def _segment_sum(x, row_ptr, src, w) -> np.ndarray:
    rows, n = len(row_ptr) - 1, x.shape[0]
    x_peak = _peak(x)
    if w is None:
        row_weight = np.diff(row_ptr)
    else:
        running = np.concatenate([[0], np.cumsum(np.abs(w))])
        row_weight = running[row_ptr[1:]] - running[row_ptr[:-1]]
    # a bound on every partial sum decides whether the (faster) float route is exact
    float_exact = x_peak * int(row_weight.max(initial=0)) < _FLOAT_EXACT_LIMIT
    dtype = np.float64 if float_exact else np.int64
    data = np.ones(src.shape[0], dtype=dtype) if w is None else w.astype(dtype)
    matrix = sp.csr_matrix((data, src, row_ptr), shape=(rows, n))
    acc = matrix @ x.astype(dtype)
    return acc.astype(np.int64) if float_exact else acc


def _segment_max(x, row_ptr, src, w) -> np.ndarray:
    # Nodes are bucketed by degree and each bucket gathered as a dense [nodes, cap, F]
    # block; rows shorter than cap repeat their own first edge (max is idempotent), so
    # no padding value can win. Products are formed in the narrowest exact integer type.
    n, f = len(row_ptr) - 1, x.shape[1]
    x_peak = _peak(x)
    w_peak = 1 if w is None else _peak(w)
    xs = x.astype(_narrowest_int(x_peak), copy=False)
    prod_type = _narrowest_int(x_peak * w_peak)
    degree = np.diff(row_ptr)
    acc = np.zeros((n, f), dtype=np.int64)
    order = np.argsort(degree, kind="stable")
    sorted_degree = degree[order]
    lo = int(np.searchsorted(sorted_degree, 1))
    for cap in _bucket_caps(int(sorted_degree[-1])):
        hi = int(np.searchsorted(sorted_degree, cap, side="right"))
        step = max(1, _CHUNK_ELEMENTS // (cap * f))
        lane = np.arange(cap, dtype=np.int64)
        for start in range(lo, hi, step):
            nodes = order[start:min(start + step, hi)]
            first = row_ptr[nodes]
            positions = first[:, None] + np.where(lane < degree[nodes, None], lane, 0)
            vals = xs[src[positions]]
            if w is not None:
                vals = vals.astype(prod_type) * w[positions].astype(prod_type)[:, :, None]
            acc[nodes] = vals.max(axis=1)
        lo = hi
    return acc


def _peak(a) -> int:
    """max |a| as a Python int (no int64 copy of ``a``, no overflow at the type minimum)."""
    return max(-int(a.min()), int(a.max())) if a.size else 0


def _narrowest_int(peak: int):
    for dtype in (np.int16, np.int32):
        if peak <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def _bucket_caps(max_degree: int) -> list[int]:
    """Degree bucket limits: exact up to 16, then steps of ~19 % (padding stays small)."""
    caps = list(range(1, 17))
    while caps[-1] < max_degree:
        caps.append(int(np.ceil(caps[-1] * 1.19)))
    return caps


def _check_quantised(name: str, a: np.ndarray, fmt: FixedFormat) -> None:
    """``a`` must hold integers of ``fmt`` (the words the hardware reads), not raw floats."""
    if a.size == 0:
        return
    if a.dtype.kind == "f":
        frac = np.flatnonzero(np.trunc(a).ravel() != a.ravel())
        if frac.size:
            idx = np.unravel_index(frac[0], a.shape)
            raise ValueError(f"{name}{list(idx)} = {a[idx]!r} is not an integer: quantise with "
                             f"{fmt!r}.quantize() first")
    elif a.dtype.kind not in "biu":
        raise ValueError(f"{name}: dtype {a.dtype} is not numeric")
    lo, hi = -(1 << (fmt.width - 1)), (1 << (fmt.width - 1)) - 1
    out = np.flatnonzero((a.ravel() < lo) | (a.ravel() > hi))
    if out.size:
        idx = np.unravel_index(out[0], a.shape)
        raise ValueError(f"{name}{list(idx)} = {a[idx]} is outside the {fmt.width}-bit range "
                         f"[{lo}, {hi}] of {fmt!r}")


def aggregate(graph, x, reduce="sum", fmt: AggregateFormat = AggregateFormat(),
              weights=None) -> AggregateResult:
    """Golden Aggregator on a :class:`~gnnweave.graph.CSRGraph` with quantised inputs.

    ``x`` holds integers in ``fmt.feat``; ``weights`` integers in ``fmt.weight`` (required
    when ``fmt.weight`` is set, one per edge in CSR order).
    """
    if (weights is None) != (fmt.weight is None):
        raise ValueError("weights must be given exactly when fmt.weight is set")
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != graph.num_nodes:
        raise ValueError(f"x: shape {x.shape}, expected [{graph.num_nodes}, F] "
                         f"(one row per node of the graph)")
    _check_quantised("x", x, fmt.feat)
    if weights is not None:
        weights = np.asarray(weights)
        if weights.shape != graph.indices.shape:
            raise ValueError(f"weights: shape {weights.shape}, expected "
                             f"{graph.indices.shape} (one per edge in CSR order)")
        _check_quantised("weights", weights, fmt.weight)
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
