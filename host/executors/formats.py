"""The fixed-point format choice of the FPGA kinds (``fpga-emu``, ``fpga-sim``, ``fpga``).

Every tensor that crosses into the accelerator is 16-bit dynamic fixed point: its
fractional bits come from its own range (:func:`gnnweave.fixed.choose_frac`), and an
op's output format from a bound or the exact result's range, chosen by the host before
the op runs. The emulator and the device executors call the same functions here, so
their results are bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnweave.fixed import FixedFormat, choose_frac
from gnnweave.golden.aggregate import AggregateFormat, Reduce
from gnnweave.graph import CSRGraph
from gnnweave.host.executors.base import (
    GRAPH_CACHE, OpResult, abs_row_weight_max, abs_weight_max, check_features, check_rows, oriented,
)

#: Width of every tensor that crosses into the FPGA (features, weights, gradients).
FPGA_WIDTH = 16


def quantize_dynamic(x, width: int = FPGA_WIDTH, *, headroom_bits: int = 0):
    """Float array -> (integers, FixedFormat) with ``frac`` chosen from the array's range."""
    fmt = FixedFormat(width, choose_frac(x, width, headroom_bits=headroom_bits))
    q, _ = fmt.quantize(x)
    return q, fmt


def frac_for_bound(bound: float, width: int = FPGA_WIDTH) -> int:
    """Fractional bits so that any value with ``|v| <= bound`` fits ``width`` bits."""
    return choose_frac(np.array([bound]), width)


def peak_frac(x: np.ndarray) -> int:
    """``choose_frac(x, 16)`` from the peak alone (the only thing it depends on), without
    converting a large array to float64."""
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    return choose_frac(np.array([peak]), FPGA_WIDTH)


_QUANT_CACHE: list = []   # [(array, (q, fmt))]: read-only arrays quantised recently


def quantize16(x) -> tuple[np.ndarray, FixedFormat]:
    """:func:`quantize_dynamic` at 16 bits, without the float64 round trip.

    ``x * 2**frac`` is exact in x's own float type (a power-of-two scale), ``rint`` rounds
    half to even as :meth:`FixedFormat.quantize` does, and ``choose_frac`` guarantees the
    peak fits, so no element saturates; equal to ``fmt.quantize(x)`` (tested). Read-only
    arrays (the trainer's constant inputs and dropout outputs, used by a forward and a
    backward op) are remembered by identity, so each is quantised once.
    """
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        fmt = FixedFormat(FPGA_WIDTH, peak_frac(x.data))
        data = np.rint(np.ldexp(np.asarray(x.data, dtype=np.float64), fmt.frac)).astype(np.int16)
        return sp.csr_matrix((data, x.indices, x.indptr), shape=x.shape), fmt
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        return quantize_dynamic(x)
    frozen = not x.flags.writeable and x.base is None
    if frozen:
        for arr, hit in list(_QUANT_CACHE):
            if arr is x:
                return hit
    fmt = FixedFormat(FPGA_WIDTH, peak_frac(x))
    q = np.rint(np.ldexp(x, fmt.frac)).astype(np.int16)
    if frozen:
        _QUANT_CACHE[:] = [(x, (q, fmt))] + _QUANT_CACHE[:1]
    return q, fmt


def bool_mask(relu_mask, shape):
    if relu_mask is None:
        return None
    relu_mask = np.asarray(relu_mask, dtype=bool)
    if relu_mask.shape != tuple(shape):
        raise ValueError(f"relu_mask: shape {relu_mask.shape}, expected {tuple(shape)}")
    return relu_mask


def quantized_weights(graph: CSRGraph) -> tuple[np.ndarray | None, FixedFormat | None]:
    """The graph's edge weights as int64 16-bit fixed point and their format (``None, None``
    when unweighted), computed once per graph."""
    def build():
        if graph.weights is None:
            return None, None
        q, fmt = quantize_dynamic(graph.weights)
        return q.astype(np.int64), fmt
    return GRAPH_CACHE.get(graph, "fpga_weights_q16", build)


@dataclass
class QuantizedAggregation:
    """An aggregation's operands as the accelerator takes them, and its formats."""
    x_q: np.ndarray                  # int16 [N, F] features
    weights_q: np.ndarray | None     # int64 [E] edge weights, or None when unweighted
    fmt: AggregateFormat             # features, weights and output formats (and the shift)


def quantize_aggregation(graph: CSRGraph, x, reduce: Reduce) -> QuantizedAggregation:
    """Quantise ``x`` and ``graph``'s weights and choose the output format of
    ``reduce_{u -> v} w_uv x[u]``.

    The output format comes from a bound that holds for the whole graph
    (``max_v sum_u |w_uv| * max|x|`` for sum, ``max|x| * max|w|`` for mean and max), so
    the result cannot saturate and every row shard of one aggregation gets the same
    formats: a partitioned aggregation is bit-identical to the unpartitioned one.
    """
    x_q, feat_fmt = quantize16(x)
    w_q, w_fmt = quantized_weights(graph)
    peak = float(np.max(np.abs(x))) if np.size(x) else 0.0
    weight_bound = abs_row_weight_max(graph) if reduce is Reduce.SUM else abs_weight_max(graph)
    product_frac = feat_fmt.frac + (w_fmt.frac if w_fmt is not None else 0)
    out_frac = min(frac_for_bound(weight_bound * peak), product_frac)
    fmt = AggregateFormat(feat=feat_fmt, weight=w_fmt, out=FixedFormat(FPGA_WIDTH, out_frac))
    return QuantizedAggregation(x_q, w_q, fmt)


@dataclass
class AggregationJob:
    """One aggregation as every FPGA kind runs it: the graph it walks, the destination rows
    ``lo..hi`` and their edges ``edge_lo..edge_hi``, and the quantised operands."""
    graph: CSRGraph                  # the graph walked (transposed for the backward pass)
    reduce: Reduce
    lo: int
    hi: int
    quantized: QuantizedAggregation

    @property
    def features(self) -> int:
        return self.quantized.x_q.shape[1]

    @property
    def edge_lo(self) -> int:
        return int(self.graph.indptr[self.lo])

    @property
    def edge_hi(self) -> int:
        return int(self.graph.indptr[self.hi])

    def result(self, out_q: np.ndarray, wall_seconds: float, device_seconds: float,
               edges: int, saturations: int, executor: str) -> OpResult:
        """The op's result from the output words of rows ``lo..hi``: dequantised, with the
        bytes the accelerator reads (a feature row per edge, 8 bytes of index and pointer
        per edge) and writes."""
        f = self.features
        value = self.quantized.fmt.out.to_float(out_q).astype(np.float32)
        return OpResult(value, wall_seconds, device_seconds,
                        edges * f * 2 + (self.edge_hi - self.edge_lo) * 8,
                        (self.hi - self.lo) * f * 2, "aggregate", executor, int(saturations))


def prepare_aggregation(graph: CSRGraph, x, reduce, *, rows=None,
                        transpose: bool = False) -> AggregationJob:
    """Check an ``Executor.aggregate`` call's operands and quantise them
    (:func:`quantize_aggregation`): the part every FPGA kind shares."""
    reduce = Reduce.parse(reduce)
    g = oriented(graph, transpose)
    x = check_features(g, x)
    lo, hi = check_rows(g, rows)
    return AggregationJob(g, reduce, lo, hi, quantize_aggregation(g, x, reduce))
