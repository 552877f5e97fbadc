"""An independent, deliberately naive model of the Aggregator spec, for the tests.

It re-reads the docstring of ``gnnweave.golden.aggregate`` and implements it one edge
at a time with Python integers and ``fractions.Fraction`` (whose ``round`` is
round-half-to-even), sharing no code with the vectorised golden model or with
``gnnweave.fixed``. Only for small inputs.
"""
from __future__ import annotations

from fractions import Fraction
from math import floor

RECIP_BITS = 24          # restated from the spec, not imported: the model must not share code
MEAN_SUM_BITS = 32


def _clamp(value: int, width: int) -> tuple[int, bool]:
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    clamped = min(max(value, lo), hi)
    return clamped, clamped != value


def _round_shift(value: int, shift: int) -> int:
    return round(Fraction(value, 1 << shift))


def reference_aggregate(indptr, indices, x, reduce: str, shift: int, out_width: int,
                        weights=None, num_edges=None) -> dict:
    x = [[int(v) for v in row] for row in x]
    n = len(x)
    f = len(x[0]) if n else 0
    words = [int(v) & 0xFFFF_FFFF for v in indices]
    e = len(words) if num_edges is None else int(num_edges)
    words = words[:e]
    ptr = [int(v) & 0xFFFF_FFFF for v in indptr][: n + 1]
    walk = []
    for i, p in enumerate(ptr):
        walk.append(min(p if i == 0 else max(p, walk[-1]), e))
    bad = ptr[0] != 0 or ptr[-1] != e or walk != ptr
    out = [[0] * f for _ in range(n)]
    degree = [0] * n
    saturations = rejected = edges = 0
    for v in range(n):
        products = []          # list of per-feature lists
        for position in range(walk[v], walk[v + 1]):
            u = words[position]
            if u >= n:
                rejected += 1
                continue
            w = 1 if weights is None else int(weights[position])
            products.append([w * xv for xv in x[u]])
        degree[v] = len(products)
        edges += len(products)
        if not products:
            continue
        for j in range(f):
            column = [p[j] for p in products]
            if reduce == "sum":
                value, sat = _clamp(_round_shift(sum(column), shift), out_width)
            elif reduce == "max":
                value, sat = _clamp(_round_shift(max(column), shift), out_width)
            elif reduce == "mean":
                s, sat1 = _clamp(_round_shift(sum(column), shift), MEAN_SUM_BITS)
                recip = floor(Fraction(1 << RECIP_BITS, len(column)) + Fraction(1, 2))
                value, sat2 = _clamp(_round_shift(s * recip, RECIP_BITS), out_width)
                sat = sat1 or sat2
            else:
                raise ValueError(reduce)
            out[v][j] = value
            saturations += sat
    return dict(out=out, saturations=saturations, rejected=rejected, edges=edges,
                bad_indptr=bad, degree=degree)
