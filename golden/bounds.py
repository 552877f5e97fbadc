"""Worst-case error of the fixed-point Aggregator against the float reference.

The golden model computes ``out[v] = reduce_e w_e x_e`` on quantised inputs; the float
reference (:func:`gnnweave.golden.aggregate.aggregate_float`) on the unrounded ones.
:func:`error_bound` is the largest ``|fixed - float|`` that the format allows, derived
from the spec step by step (all values in real units; ``lsb = 2**-frac`` per format):

* inputs: ``|x^ - x| <= ex = lsb_x / 2`` and ``|w^ - w| <= ew = lsb_w / 2`` (``ew = 0``
  unweighted: the "weight" is an exact 1), so one product is off by at most
  ``|w^ x^ - w x| <= |w^| |x^ - x| + |x| |w^ - w| <= (|w| + ew) ex + X ew`` with
  ``X >= |x|``. Products and the accumulator are exact.
* ``ro``: rounding the exact product grid (``lsb_x * lsb_w``) to the output grid:
  ``lsb_out / 2`` when ``shift > 0``, 0 when ``shift = 0`` (nothing is dropped).
* ``sum``: ``sum_e [(|w_e| + ew) ex + X ew] + ro``.
* ``max``: ``|max a - max b| <= max_e |a_e - b_e|``, so ``max_e [(|w_e| + ew) ex + X ew] + ro``.
* ``mean`` with ``d`` edges: the sum ``S`` is rounded (``ro``), multiplied by
  ``R = round(2**24 / d)`` and rounded again (``lsb_out / 2``)::

      out - (1/d) sum w x = (S^ - sum w x)/d + rho1/d + S (R/2**24 - 1/d) + rho2

  bounded by ``E_sum/d + ro/d + |S| delta_d + lsb_out/2`` with ``E_sum`` the sum's input
  error above, ``delta_d = |R/2**24 - 1/d|`` (exact per degree; 0 for powers of two) and
  ``|S| <= sum_e (|w_e| + ew)(X + ex) + ro``.

Valid when nothing saturated (inputs, the mean's 32-bit sum, the output): check the
``saturations`` count of the result. Every step is attainable (rounding errors can all
have the same sign), so on adversarial inputs the measured error comes close to it.
"""
from __future__ import annotations

import numpy as np

from gnnweave.fixed import MEAN_RECIP_BITS, mean_reciprocal
from gnnweave.golden.aggregate import AggregateFormat, Reduce


def error_bound(reduce, fmt: AggregateFormat, degree, weights=None, *, x_abs_max) -> np.ndarray:
    """Worst-case ``|fixed - float|`` per node of a well-formed graph.

    ``degree``: edges per node [N] (the CSR row lengths); ``weights``: the float edge
    weights [E] in CSR order (None: unweighted); ``x_abs_max``: a bound on ``|x|`` of the
    float features, a scalar (result [N]) or one per feature [F] (result [N, F]).
    """
    reduce = Reduce.parse(reduce)
    degree = np.asarray(degree, dtype=np.int64)
    n = degree.shape[0]
    x_bound = np.asarray(x_abs_max, dtype=np.float64)
    if np.any(x_bound < 0) or not np.all(np.isfinite(x_bound)):
        raise ValueError("x_abs_max must be finite and >= 0")
    ex = fmt.feat.lsb / 2
    half_out = fmt.out.lsb / 2
    ro = half_out if fmt.shift > 0 else 0.0
    if (weights is None) != (fmt.weight is None):
        raise ValueError("weights must be given exactly when fmt.weight is set")
    if weights is None:
        ew = 0.0
        w_abs = np.ones(int(degree.sum()))
    else:
        ew = fmt.weight.lsb / 2
        w_abs = np.abs(np.asarray(weights, dtype=np.float64))
        if w_abs.shape != (int(degree.sum()),):
            raise ValueError(f"weights: shape {w_abs.shape}, expected ({int(degree.sum())},) "
                             f"= sum of degrees")
    rows = np.repeat(np.arange(n), degree)
    w_sum = np.bincount(rows, weights=w_abs, minlength=n)          # sum_e |w_e|
    w_max = np.zeros(n)
    np.maximum.at(w_max, rows, w_abs)                              # max_e |w_e|
    d = degree.astype(np.float64)
    if x_bound.ndim == 1:   # per feature: broadcast to [N, F]
        d, w_sum, w_max = d[:, None], w_sum[:, None], w_max[:, None]

    if reduce is Reduce.MAX:
        bound = (w_max + ew) * ex + x_bound * ew + ro
    else:
        input_error = (w_sum + d * ew) * ex + d * x_bound * ew
        if reduce is Reduce.SUM:
            bound = input_error + ro
        else:
            safe_d = np.maximum(d, 1)
            recip = mean_reciprocal(degree).astype(np.float64)
            delta = np.abs(recip * np.maximum(degree, 1) - 2.0**MEAN_RECIP_BITS) / (
                2.0**MEAN_RECIP_BITS * np.maximum(degree, 1))
            if x_bound.ndim == 1:
                delta = delta[:, None]
            s_peak = (w_sum + d * ew) * (x_bound + ex) + ro
            bound = input_error / safe_d + ro / safe_d + s_peak * delta + half_out
    empty = (degree == 0)[:, None] if np.ndim(bound) == 2 else degree == 0
    return np.where(empty, 0.0, bound)
