"""``fpga-emu`` (also ``fpga-emu:1``, ...): the bit-exact golden models.

Each input is quantised to 16-bit dynamic fixed point (:mod:`.formats`), the golden
Aggregator / MAC array computes exactly what the RTL computes, and the result comes back
dequantised. ``device_seconds`` is an *estimate* from the cycle model of the build
(:class:`CycleModel`, :mod:`gnnweave.host.cyclemodel`: fitted to the simulated device's
cycles, at the clock the build reaches), not a measurement.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from gnnweave.errors import InputError
from gnnweave.fixed import FixedFormat, choose_frac, narrow
from gnnweave.golden.aggregate import Reduce, aggregate_raw
from gnnweave.graph import CSRGraph
from gnnweave.host import cyclemodel
from gnnweave.host.executors.base import (
    GRAPH_CACHE, DeviceUnavailable, Executor, OpResult, apply_relu_mask, as_operand,
    check_dense, check_features, check_rows, dense_array, operand_nbytes, oriented,
)
from gnnweave.host.executors.formats import (
    FPGA_WIDTH, bool_mask, frac_for_bound, prepare_aggregation, quantize16, quantized_weights,
)


class CycleModel:
    """fpga-emu's device time: the cycle model of a build (:mod:`gnnweave.host.cyclemodel`,
    its structure and constants fitted to the simulated device) at the clock that build
    reaches. ``config`` the named build (default the one the ``fpga-sim`` executor builds),
    ``clock_hz`` overrides the build's clock, ``latency`` the memory read latency in cycles.
    Transfers: host <-> board memory copies at ``transfer_bytes_per_s``.
    """

    def __init__(self, config: str | None = None, *, clock_hz: float | None = None,
                 latency: int = cyclemodel.DEFAULT_LATENCY,
                 transfer_bytes_per_s: float = 2e9):
        self.build = cyclemodel.load(config, latency=latency, clock_hz=clock_hz)
        self.config = self.build.config
        self.clock_hz = self.build.clock_hz
        self.transfer_bytes_per_s = float(transfer_bytes_per_s)

    def __repr__(self):
        return (f"CycleModel(config={self.config!r}, clock {self.clock_hz / 1e6:g} MHz: "
                f"{self.clock_source})")

    @property
    def clock_source(self) -> str:
        return self.build.clock_source

    def aggregate_cycles(self, degrees, features: int, *, weighted: bool = False,
                         reduce: str = "sum") -> float:
        """Cycles of aggregating nodes of in-degrees ``degrees`` (in the order the engine
        walks them), ``features`` wide (column chunks of the build's ``max_feat_dim``)."""
        return self.build.aggregator.cycles(degrees, int(features), weighted=weighted,
                                            reduce=reduce)

    def aggregate_seconds(self, degrees, features: int, *, weighted: bool = False,
                          reduce: str = "sum") -> float:
        return self.aggregate_cycles(degrees, features, weighted=weighted,
                                     reduce=reduce) / self.clock_hz

    def matmul_cycles(self, m: int, k: int, n: int, mode: str = "fwd") -> float:
        """Cycles of an ``[m, k] x [k, n]`` product on the build's MacArray (``mode`` fwd,
        dx or dw: which operands are read transposed); a build without one is timed as
        the default MacArray."""
        mac = self.build.mac_array or cyclemodel.MacArrayModel(cyclemodel.MacArrayBuild())
        return mac.cycles(m, k, n, mode)

    def matmul_seconds(self, m: int, k: int, n: int, mode: str = "fwd") -> float:
        return self.matmul_cycles(m, k, n, mode) / self.clock_hz

    def transfer_seconds(self, nbytes: int) -> float:
        return nbytes / self.transfer_bytes_per_s


def matmul_dims(mode: str, a, b) -> tuple[int, int, int]:
    """``(m, k, n)`` of the MacArray product of operands ``a`` and ``b`` in ``mode``:
    fwd ``a @ b``, dx ``a @ b.T``, dw ``a.T @ b``."""
    if mode == "fwd":
        return a.shape[0], a.shape[1], b.shape[1]
    if mode == "dx":
        return a.shape[0], a.shape[1], b.shape[0]
    return a.shape[1], a.shape[0], b.shape[1]


def shard_graph(graph: CSRGraph, lo: int, hi: int) -> CSRGraph:
    """Rows ``lo..hi`` of ``graph`` as the accelerator runs them: those rows first, the
    other ``N - (hi - lo)`` rows empty (the engine bounds source indices by its row count,
    so a shard keeps all ``N`` rows)."""
    s, e = int(graph.indptr[lo]), int(graph.indptr[hi])
    indptr = np.full(graph.num_nodes + 1, e - s, dtype=np.int64)
    indptr[: hi - lo + 1] = graph.indptr[lo:hi + 1] - s
    return CSRGraph(indptr=indptr, indices=np.asarray(graph.indices[s:e]),
                    num_nodes=graph.num_nodes)


def job_degrees(graph: CSRGraph, lo: int, hi: int) -> np.ndarray:
    """In-degrees of the run an accelerator gets for rows ``lo..hi`` of ``graph``: the
    shard's rows first, then the other ``N - (hi - lo)`` rows empty (the engine bounds
    source indices by its row count, so a shard keeps all ``N`` rows; the driver's
    executor submits it so)."""
    deg = np.zeros(graph.num_nodes, dtype=np.int64)
    deg[:hi - lo] = np.diff(np.asarray(graph.indptr[lo:hi + 1], dtype=np.int64))
    return deg

def _mac_module():
    try:
        from gnnweave.golden import mac
    except ImportError as exc:  # pragma: no cover - golden/mac.py is part of the package
        raise DeviceUnavailable(
            "fpga-emu dense ops need gnnweave.golden.mac (golden MAC array model), "
            f"which is not importable: {exc}") from None
    return mac


class FpgaEmuExecutor(Executor):
    """The golden bit-exact models, with 16-bit dynamic fixed point per tensor.

    Output formats are chosen by the host before the op runs:

    * aggregation: from a bound that holds for the whole graph
      (:func:`~gnnweave.host.executors.formats.quantize_aggregation`), so the result
      cannot saturate and a partitioned aggregation is bit-identical to the unpartitioned
      one;
    * dense ops (``dense_range='peak'``, default): from the exact integer result's
      range (the MAC array's exact accumulators), the largest ``frac`` without
      saturation -- on a board this is a calibration pass or the previous step's
      range; ``dense_range='bound'`` uses an a-priori bound instead (single pass,
      never saturates, fewer fractional bits).
    """

    kind = "fpga-emu"

    def __init__(self, name: str = "fpga-emu", *, cycle_model: CycleModel | None = None,
                 config: str | None = None, dense_range: str = "peak", mac_route: str = "fast"):
        """``config``: the named build whose cycle model gives the device times (default
        the ``fpga-sim`` executor's build); ``cycle_model`` gives the model itself."""
        if dense_range not in ("peak", "bound"):
            raise InputError(f"dense_range must be 'peak' or 'bound', got {dense_range!r}")
        if mac_route not in ("fast", "golden"):
            raise InputError(f"mac_route must be 'fast' or 'golden', got {mac_route!r}")
        self.mac_route = mac_route
        self.name = name
        if cycle_model is not None and config is not None:
            raise InputError("give cycle_model or config, not both")
        self.cycle_model = cycle_model or CycleModel(config)
        self.dense_range = dense_range

    # -- aggregation

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        job = prepare_aggregation(graph, x, reduce, rows=rows, transpose=transpose)
        g, lo, hi, q = job.graph, job.lo, job.hi, job.quantized
        s, e = job.edge_lo, job.edge_hi
        # the shard as the engine sees it: rows lo..hi first, the other N - (hi - lo) rows
        # empty, so the golden model computes (and is given pointers for) the shard's rows only
        indptr = np.asarray(g.indptr[lo:hi + 1], dtype=np.int64) - s
        res = aggregate_raw(indptr, g.indices[s:e], q.x_q, reduce=job.reduce, shift=q.fmt.shift,
                            out_width=FPGA_WIDTH,
                            weights=None if q.weights_q is None else q.weights_q[s:e],
                            num_rows=hi - lo)
        dev = self._aggregate_seconds(g, lo, hi, job.features, job.reduce,
                                      q.weights_q is not None)
        return job.result(res.out, time.perf_counter() - t0, dev, res.edges, res.saturations,
                          self.name)

    def _aggregate_seconds(self, g: CSRGraph, lo: int, hi: int, f: int, reduce: Reduce,
                           weighted: bool) -> float:
        """The modelled device time of the run the accelerator gets for rows ``lo..hi``
        (:func:`job_degrees`), computed once per graph, shard and shape."""
        cm = self.cycle_model
        key = ("cycles", cm.build.aggregator, lo, hi, f, reduce.name, weighted)
        cycles = GRAPH_CACHE.get(g, key, lambda: cm.aggregate_cycles(
            job_degrees(g, lo, hi), f, weighted=weighted, reduce=reduce.name.lower()))
        return cycles / cm.clock_hz

    # -- dense

    #: Longest contraction for which a float64 BLAS product of 16-bit integers is exact
    #: (every partial sum is an integer below K * 2**30 <= 2**52).
    EXACT_FLOAT_DEPTH = 1 << 22

    def _gemm(self, mode, a_q, b_q, *, shift, relu=False, relu_mask=None, bias=None):
        """One MacArray op on quantised operands -> (int64 out, saturations).

        ``mac_route='golden'`` calls :mod:`gnnweave.golden.mac`; ``'fast'`` (default) forms
        the same exact accumulator with a float64 BLAS product (exact below
        ``EXACT_FLOAT_DEPTH``) and narrows it with the same :func:`gnnweave.fixed.narrow`,
        so both routes give identical integers (tests compare them).
        """
        depth = a_q.shape[1] if mode != "dw" else a_q.shape[0]
        if self.mac_route == "golden" or depth >= self.EXACT_FLOAT_DEPTH:
            mac = _mac_module()
            a_q = dense_array(a_q)
            if mode == "fwd":
                res = mac.mac_forward(a_q, b_q, None if bias is None else bias[0], shift=shift,
                                      out_width=FPGA_WIDTH, relu=relu,
                                      bias_shift=0 if bias is None else bias[1])
            elif mode == "dx":
                res = mac.mac_input_grad(a_q, b_q, shift=shift, out_width=FPGA_WIDTH,
                                         relu_mask=relu_mask)
            else:
                res = mac.mac_weight_grad(a_q, b_q, shift=shift, out_width=FPGA_WIDTH,
                                          relu_mask=relu_mask)
            return np.asarray(res.out, dtype=np.int64), int(res.saturations)
        acc = self.accumulator(mode, a_q, b_q, relu_mask=relu_mask, bias=bias)
        z, saturated = narrow(acc.astype(np.int64), shift, FixedFormat(FPGA_WIDTH, 0))
        if relu:
            z = np.where(z > 0, z, 0)
        return z, int(np.count_nonzero(saturated))

    @staticmethod
    def accumulator(mode, a_q, b_q, *, relu_mask=None, bias=None) -> np.ndarray:
        """The exact sums of the MAC array as float64 integers: ``a_q @ b_q`` (fwd, plus
        ``bias = (int values, left shift)``), ``a_q @ b_q.T`` (dx) or ``a_q.T @ b_q`` (dw),
        with ``relu_mask`` zeroing the gradient operand's masked entries.

        A mostly-zero left operand (dropped-out bag-of-words features) is multiplied as a
        scipy CSR matrix: the same exact integer sums, far fewer products.
        """
        if mode in ("fwd", "dw") and (sp.issparse(a_q) or (
                a_q.size >= (1 << 16) and np.count_nonzero(a_q) < 0.1 * a_q.size)):
            a_sp = sp.csr_matrix(a_q).astype(np.float64)
            b = np.asarray(b_q, dtype=np.float64)
            if mode == "fwd":
                acc = np.asarray(a_sp @ b)
                if bias is not None:
                    acc += np.ldexp(np.asarray(bias[0], dtype=np.float64), bias[1])[None, :]
                return acc
            if relu_mask is not None:
                b = np.where(relu_mask, b, 0.0)
            return np.asarray((a_sp.T @ b))
        a = np.asarray(a_q, dtype=np.float64)
        b = np.asarray(b_q, dtype=np.float64)
        if mode == "fwd":
            acc = a @ b
            if bias is not None:
                acc += np.ldexp(np.asarray(bias[0], dtype=np.float64), bias[1])[None, :]
            return acc
        if relu_mask is not None:
            if mode == "dx":
                a = np.where(relu_mask, a, 0.0)
            else:
                b = np.where(relu_mask, b, 0.0)
        return a @ b.T if mode == "dx" else a.T @ b

    _accumulator = accumulator            # the name older callers use
    _weights_q = staticmethod(quantized_weights)

    def _out_frac(self, acc_peak_fn, bound, product_frac: int) -> int:
        peak = acc_peak_fn() if self.dense_range == "peak" else bound()
        return min(frac_for_bound(peak), product_frac)

    def _run_gemm(self, op, mode, a, b, *, bias=None, relu=False, relu_mask=None, bound):
        t0 = time.perf_counter()
        a_q, af = quantize16(a)
        b_q, bf = quantize16(b)
        product_frac = af.frac + bf.frac
        bias_q = None
        if bias is not None:
            bias = np.asarray(bias, dtype=np.float64).reshape(-1)
            # a 16-bit bias, aligned into the product's fraction on chip by a left shift
            bfmt = FixedFormat(FPGA_WIDTH, min(choose_frac(bias, FPGA_WIDTH), product_frac))
            bias_q = (bfmt.quantize(bias)[0].astype(np.int64), product_frac - bfmt.frac)
        acc = None

        def peak():
            nonlocal acc
            # the narrowing happens before any ReLU, so the pre-activation range counts
            acc = self.accumulator(mode, a_q, b_q, relu_mask=relu_mask, bias=bias_q)
            return float(np.max(np.abs(acc))) * 2.0 ** -product_frac if acc.size else 0.0

        out_frac = self._out_frac(peak, bound, product_frac)
        shift = product_frac - out_frac
        if acc is not None and self.mac_route == "fast" and acc.shape and \
                (a_q.shape[1] if mode != "dw" else a_q.shape[0]) < self.EXACT_FLOAT_DEPTH:
            z, saturated = narrow(acc.astype(np.int64), shift, FixedFormat(FPGA_WIDTH, 0))
            if relu:
                z = np.where(z > 0, z, 0)
            sat = int(np.count_nonzero(saturated))
        else:
            z, sat = self._gemm(mode, a_q, b_q, shift=shift, relu=relu, relu_mask=relu_mask,
                                bias=bias_q)
        value = np.ldexp(z.astype(np.float64), -out_frac).astype(np.float32)
        dev = self.cycle_model.matmul_seconds(*matmul_dims(mode, a, b), mode)
        return OpResult(value, time.perf_counter() - t0, dev,
                        (a.shape[0] * a.shape[1] + b.size) * 2, value.size * 2, op, self.name, sat)

    def dense_forward(self, x, w, b=None, *, relu=False):
        x, w = check_dense(x, w)

        def bound():
            v = (float(np.asarray(abs(x).sum(axis=1)).max()) if x.shape[0] * x.shape[1] else 0.0) * \
                (float(np.abs(w).max()) if w.size else 0.0)
            return v + (float(np.abs(b).max()) if b is not None and np.size(b) else 0.0)
        return self._run_gemm("dense_forward", "fwd", x, w, bias=b, relu=relu, bound=bound)

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        dy = np.asarray(dy)
        w = np.asarray(w)
        if dy.ndim != 2 or w.ndim != 2 or dy.shape[1] != w.shape[1]:
            raise ValueError(f"dense_input_grad: dy shape {dy.shape} does not match w shape {w.shape}")
        relu_mask = bool_mask(relu_mask, dy.shape)
        masked = apply_relu_mask(dy, relu_mask)
        def bound():
            return (float(np.abs(masked).sum(axis=1).max()) if dy.size else 0.0) * \
                (float(np.abs(w).max()) if w.size else 0.0)
        return self._run_gemm("dense_input_grad", "dx", masked, w, relu_mask=relu_mask,
                              bound=bound)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        x = as_operand(x)
        dy = np.asarray(dy)
        if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
            raise ValueError(f"dense_weight_grad: x shape {x.shape} does not match dy shape {dy.shape}")
        relu_mask = bool_mask(relu_mask, dy.shape)
        masked = apply_relu_mask(dy, relu_mask)
        def bound():
            return (float(np.asarray(abs(x).sum(axis=0)).max()) if x.shape[0] * x.shape[1] else 0.0) * \
                (float(np.abs(masked).max()) if dy.size else 0.0)
        return self._run_gemm("dense_weight_grad", "dw", x, masked, relu_mask=relu_mask,
                              bound=bound)

    def _copy(self, array, op):
        t0 = time.perf_counter()
        a = array.copy() if sp.issparse(array) else np.array(array, copy=True)
        size = operand_nbytes(a)
        dev = self.cycle_model.transfer_seconds(size)
        nin, nout = (size, 0) if op == "transfer_in" else (0, size)
        return OpResult(a, time.perf_counter() - t0, dev, nin, nout, op, self.name)

    def transfer_in(self, array):
        return self._copy(array, "transfer_in")

    def transfer_out(self, array):
        return self._copy(array, "transfer_out")
