"""One executor interface for every device the trainer and planner can use.

Every op takes and returns host ``numpy`` arrays and reports what it cost in an
:class:`OpResult` (wall time on the host, device time where the device can say,
bytes moved), so the profiler, the cost model and the timeline read the same records
whatever device ran the op.

Devices (``make_executor(name)``):

* ``cpu`` (also ``cpu:1``, ...): numpy/scipy float32 (scipy CSR @ dense).
* ``gpu`` / ``gpu:<i>``: torch on CUDA device ``i``; needs the optional extra ``gpu``.
* ``fpga-emu`` (also ``fpga-emu:1``, ...): the bit-exact golden models. Each input is
  quantised to 16-bit dynamic fixed point (``choose_frac`` per tensor), the golden
  Aggregator / MAC array computes exactly what the RTL computes, and the result comes
  back dequantised. ``device_seconds`` is an *estimate* from the cycle model of the build
  (:class:`CycleModel`, :mod:`gnnweave.host.cyclemodel`: fitted to the simulated device's
  cycles, at the clock the build reaches), not a measurement.
* ``fpga-sim`` / ``fpga``: the simulated device and a PYNQ board, through
  ``gnnweave.host.driver``; constructing them without that driver raises
  :class:`DeviceUnavailable` naming what is missing.

``aggregate(graph, x, reduce, rows=(lo, hi), transpose=False)`` computes
``out[v] = reduce_{u -> v} w_uv * x[u]`` for the destination nodes ``lo <= v < hi`` of
``graph`` (or of ``graph.transpose()`` for the backward pass), so a partitioned
aggregation is the concatenation of the shards' results in row order.
"""
from __future__ import annotations

import abc
import os
import threading
import time
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnweave.fixed import FixedFormat, choose_frac, narrow
from gnnweave.golden.aggregate import AggregateFormat, Reduce, aggregate_raw
from gnnweave.graph import CSRGraph
from gnnweave.host import cyclemodel

#: Width of every tensor that crosses into the FPGA (features, weights, gradients).
FPGA_WIDTH = 16


class DeviceUnavailable(ValueError):
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


class _PerGraphCache:
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


_GRAPH_CACHE = _PerGraphCache()


def transposed(graph: CSRGraph) -> CSRGraph:
    """``graph.transpose()``, computed once per graph object."""
    return _GRAPH_CACHE.get(graph, "transpose", graph.transpose)


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


def _check_features(graph: CSRGraph, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != graph.num_nodes:
        raise ValueError(f"x: shape {x.shape}, expected ({graph.num_nodes}, features)")
    return x


def shard_edges(graph: CSRGraph, lo: int, hi: int) -> int:
    return int(graph.indptr[hi] - graph.indptr[lo])


def _abs_row_weight_max(graph: CSRGraph) -> float:
    """max_v sum_{u->v} |w_uv| over the whole graph (1 per edge when unweighted)."""
    def build():
        if graph.num_edges == 0:
            return 0.0
        w = np.abs(graph.weights) if graph.weights is not None else np.ones(graph.num_edges)
        sums = np.add.reduceat(w, graph.indptr[:-1][graph.in_degree > 0])
        return float(sums.max()) if sums.size else 0.0
    return _GRAPH_CACHE.get(graph, "abs_row_weight_max", build)


def _abs_weight_max(graph: CSRGraph) -> float:
    def build():
        if graph.weights is None or graph.num_edges == 0:
            return 1.0
        return float(np.abs(graph.weights).max())
    return _GRAPH_CACHE.get(graph, "abs_weight_max", build)


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
        a = _as_operand(array)
        return OpResult(a, time.perf_counter() - t0, 0.0, 0, 0, op, self.name)


def _mask(dy, relu_mask):
    if relu_mask is None:
        return dy
    relu_mask = np.asarray(relu_mask)
    if relu_mask.shape != np.shape(dy):
        raise ValueError(f"relu_mask: shape {relu_mask.shape}, expected {np.shape(dy)}")
    return np.where(relu_mask, dy, 0).astype(np.asarray(dy).dtype, copy=False)


def _as_operand(x):
    """ndarray, or a scipy sparse matrix kept sparse (as CSR)."""
    if sp.issparse(x):
        return sp.csr_matrix(x)
    return np.asarray(x)


def _dense_array(x) -> np.ndarray:
    return x.toarray() if sp.issparse(x) else np.asarray(x)


def _nbytes(x) -> int:
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    return int(np.asarray(x).nbytes)


def _check_dense(x, w, what="x"):
    x = _as_operand(x)
    w = np.asarray(w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"dense: {what} shape {x.shape} does not match w shape {w.shape}")
    return x, w


# --------------------------------------------------------------------------- cpu


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
        return _GRAPH_CACHE.get(graph, "cpu_csr_arrays", build)

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        reduce = Reduce.parse(reduce)
        g = oriented(graph, transpose)
        x = _check_features(g, x).astype(np.float32, copy=False)
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
        x, w = _check_dense(x, w)
        if sp.issparse(x):
            y = np.asarray(x.astype(np.float32) @ w.astype(np.float32), dtype=np.float32)
        else:
            y = np.asarray(x, dtype=np.float32) @ np.asarray(w, dtype=np.float32)
        if b is not None:
            y += np.asarray(b, dtype=np.float32)
        if relu:
            np.maximum(y, 0, out=y)
        return OpResult(y, time.perf_counter() - t0, None, _nbytes(x) + w.size * 4,
                        y.nbytes, "dense_forward", self.name)

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        t0 = time.perf_counter()
        dy = _mask(np.asarray(dy, dtype=np.float32), relu_mask)
        w = np.asarray(w, dtype=np.float32)
        if dy.ndim != 2 or w.ndim != 2 or dy.shape[1] != w.shape[1]:
            raise ValueError(f"dense_input_grad: dy shape {dy.shape} does not match w shape {w.shape}")
        dx = dy @ w.T
        return OpResult(dx, time.perf_counter() - t0, None, dy.nbytes + w.nbytes, dx.nbytes,
                        "dense_input_grad", self.name)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        t0 = time.perf_counter()
        dy = _mask(np.asarray(dy, dtype=np.float32), relu_mask)
        x = _as_operand(x).astype(np.float32)
        if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
            raise ValueError(f"dense_weight_grad: x shape {x.shape} does not match dy shape {dy.shape}")
        dw = np.asarray(x.T @ dy, dtype=np.float32)
        return OpResult(dw, time.perf_counter() - t0, None, _nbytes(x) + dy.nbytes, dw.nbytes,
                        "dense_weight_grad", self.name)


# --------------------------------------------------------------------------- fpga-emu


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


def job_degrees(graph: CSRGraph, lo: int, hi: int) -> np.ndarray:
    """In-degrees of the run an accelerator gets for rows ``lo..hi`` of ``graph``: the
    shard's rows first, then the other ``N - (hi - lo)`` rows empty (the engine bounds
    source indices by its row count, so a shard keeps all ``N`` rows; the driver's
    executor submits it so)."""
    deg = np.zeros(graph.num_nodes, dtype=np.int64)
    deg[:hi - lo] = np.diff(np.asarray(graph.indptr[lo:hi + 1], dtype=np.int64))
    return deg


def quantize_dynamic(x, width: int = FPGA_WIDTH, *, headroom_bits: int = 0):
    """Float array -> (integers, FixedFormat) with ``frac`` chosen from the array's range."""
    fmt = FixedFormat(width, choose_frac(x, width, headroom_bits=headroom_bits))
    q, _ = fmt.quantize(x)
    return q, fmt


def _frac_for_bound(bound: float, width: int = FPGA_WIDTH) -> int:
    """Fractional bits so that any value with ``|v| <= bound`` fits ``width`` bits."""
    return choose_frac(np.array([bound]), width)


def _peak_frac(x: np.ndarray) -> int:
    """``choose_frac(x, 16)`` from the peak alone (the only thing it depends on), without
    converting a large array to float64."""
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    return choose_frac(np.array([peak]), FPGA_WIDTH)


_QUANT_CACHE: list = []   # [(array, (q, fmt))]: read-only arrays quantised recently


def _quantize16(x) -> tuple[np.ndarray, FixedFormat]:
    """:func:`quantize_dynamic` at 16 bits, without the float64 round trip.

    ``x * 2**frac`` is exact in x's own float type (a power-of-two scale), ``rint`` rounds
    half to even as :meth:`FixedFormat.quantize` does, and ``choose_frac`` guarantees the
    peak fits, so no element saturates; equal to ``fmt.quantize(x)`` (tested). Read-only
    arrays (the trainer's constant inputs and dropout outputs, used by a forward and a
    backward op) are remembered by identity, so each is quantised once.
    """
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        fmt = FixedFormat(FPGA_WIDTH, _peak_frac(x.data))
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
    fmt = FixedFormat(FPGA_WIDTH, _peak_frac(x))
    q = np.rint(np.ldexp(x, fmt.frac)).astype(np.int16)
    if frozen:
        _QUANT_CACHE[:] = [(x, (q, fmt))] + _QUANT_CACHE[:1]
    return q, fmt


def _bool_mask(relu_mask, shape):
    if relu_mask is None:
        return None
    relu_mask = np.asarray(relu_mask, dtype=bool)
    if relu_mask.shape != tuple(shape):
        raise ValueError(f"relu_mask: shape {relu_mask.shape}, expected {tuple(shape)}")
    return relu_mask


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
      (``max_v sum_u |w_uv| * max|x|`` for sum; ``max|x| * max|w|`` for mean/max), so
      the result cannot saturate, and every row shard of one aggregation uses the same
      formats -- a partitioned aggregation is bit-identical to the unpartitioned one;
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
            raise ValueError(f"dense_range must be 'peak' or 'bound', got {dense_range!r}")
        if mac_route not in ("fast", "golden"):
            raise ValueError(f"mac_route must be 'fast' or 'golden', got {mac_route!r}")
        self.mac_route = mac_route
        self.name = name
        if cycle_model is not None and config is not None:
            raise ValueError("give cycle_model or config, not both")
        self.cycle_model = cycle_model or CycleModel(config)
        self.dense_range = dense_range

    # -- aggregation

    def _weights_q(self, graph: CSRGraph):
        def build():
            if graph.weights is None:
                return None, None
            q, fmt = quantize_dynamic(graph.weights)
            return q.astype(np.int64), fmt
        return _GRAPH_CACHE.get(graph, "fpga_weights_q16", build)

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        reduce = Reduce.parse(reduce)
        g = oriented(graph, transpose)
        x = _check_features(g, x)
        lo, hi = check_rows(g, rows)
        x_q, feat_fmt = _quantize16(x)
        w_q, w_fmt = self._weights_q(g)
        peak = float(np.max(np.abs(x))) if x.size else 0.0
        if reduce is Reduce.SUM:
            bound = _abs_row_weight_max(g) * peak
        else:
            bound = _abs_weight_max(g) * peak
        product_frac = feat_fmt.frac + (w_fmt.frac if w_fmt is not None else 0)
        out_frac = min(_frac_for_bound(bound), product_frac)
        fmt = AggregateFormat(feat=feat_fmt, weight=w_fmt, out=FixedFormat(FPGA_WIDTH, out_frac))
        # the shard as the engine sees it: rows lo..hi first, the other N - (hi - lo) rows
        # empty, so the golden model computes (and is given pointers for) the shard's rows only
        s, e = int(g.indptr[lo]), int(g.indptr[hi])
        indptr = np.asarray(g.indptr[lo:hi + 1], dtype=np.int64) - s
        res = aggregate_raw(indptr, g.indices[s:e], x_q, reduce=reduce, shift=fmt.shift,
                            out_width=FPGA_WIDTH, weights=None if w_q is None else w_q[s:e],
                            num_rows=hi - lo)
        out = fmt.out.to_float(res.out).astype(np.float32)
        f = x.shape[1]
        dev = self._aggregate_seconds(g, lo, hi, f, reduce, w_q is not None)
        return OpResult(out, time.perf_counter() - t0, dev,
                        res.edges * f * 2 + (e - s) * 8, (hi - lo) * f * 2,
                        "aggregate", self.name, res.saturations)

    def _aggregate_seconds(self, g: CSRGraph, lo: int, hi: int, f: int, reduce: Reduce,
                           weighted: bool) -> float:
        """The modelled device time of the run the accelerator gets for rows ``lo..hi``
        (:func:`job_degrees`), computed once per graph, shard and shape."""
        cm = self.cycle_model
        key = ("cycles", cm.build.aggregator, lo, hi, f, reduce.name, weighted)
        cycles = _GRAPH_CACHE.get(g, key, lambda: cm.aggregate_cycles(
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
            a_q = _dense_array(a_q)
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
        acc = self._accumulator(mode, a_q, b_q, relu_mask=relu_mask, bias=bias)
        z, saturated = narrow(acc.astype(np.int64), shift, FixedFormat(FPGA_WIDTH, 0))
        if relu:
            z = np.where(z > 0, z, 0)
        return z, int(np.count_nonzero(saturated))

    @staticmethod
    def _accumulator(mode, a_q, b_q, *, relu_mask=None, bias=None) -> np.ndarray:
        """The exact sums of the MAC array as float64 integers.

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

    def _out_frac(self, acc_peak_fn, bound, product_frac: int) -> int:
        peak = acc_peak_fn() if self.dense_range == "peak" else bound()
        return min(_frac_for_bound(peak), product_frac)

    def _run_gemm(self, op, mode, a, b, *, bias=None, relu=False, relu_mask=None, bound):
        t0 = time.perf_counter()
        a_q, af = _quantize16(a)
        b_q, bf = _quantize16(b)
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
            acc = self._accumulator(mode, a_q, b_q, relu_mask=relu_mask, bias=bias_q)
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
        if mode == "fwd":
            m, k, n = a.shape[0], a.shape[1], b.shape[1]
        elif mode == "dx":
            m, k, n = a.shape[0], a.shape[1], b.shape[0]
        else:
            m, k, n = a.shape[1], a.shape[0], b.shape[1]
        dev = self.cycle_model.matmul_seconds(m, k, n, mode)
        return OpResult(value, time.perf_counter() - t0, dev,
                        (a.shape[0] * a.shape[1] + b.size) * 2, value.size * 2, op, self.name, sat)

    def dense_forward(self, x, w, b=None, *, relu=False):
        x, w = _check_dense(x, w)

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
        relu_mask = _bool_mask(relu_mask, dy.shape)
        masked = _mask(dy, relu_mask)
        def bound():
            return (float(np.abs(masked).sum(axis=1).max()) if dy.size else 0.0) * \
                (float(np.abs(w).max()) if w.size else 0.0)
        return self._run_gemm("dense_input_grad", "dx", masked, w, relu_mask=relu_mask,
                              bound=bound)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        x = _as_operand(x)
        dy = np.asarray(dy)
        if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
            raise ValueError(f"dense_weight_grad: x shape {x.shape} does not match dy shape {dy.shape}")
        relu_mask = _bool_mask(relu_mask, dy.shape)
        masked = _mask(dy, relu_mask)
        def bound():
            return (float(np.asarray(abs(x).sum(axis=0)).max()) if x.shape[0] * x.shape[1] else 0.0) * \
                (float(np.abs(masked).max()) if dy.size else 0.0)
        return self._run_gemm("dense_weight_grad", "dw", x, masked, relu_mask=relu_mask,
                              bound=bound)

    def _copy(self, array, op):
        t0 = time.perf_counter()
        a = array.copy() if sp.issparse(array) else np.array(array, copy=True)
        nbytes = _nbytes(a)
        dev = self.cycle_model.transfer_seconds(nbytes)
        nin, nout = (nbytes, 0) if op == "transfer_in" else (0, nbytes)
        return OpResult(a, time.perf_counter() - t0, dev, nin, nout, op, self.name)

    def transfer_in(self, array):
        return self._copy(array, "transfer_in")

    def transfer_out(self, array):
        return self._copy(array, "transfer_out")


# --------------------------------------------------------------------------- gpu


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _cuda_count() -> int:
    torch = _torch()
    if torch is None:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver counts as no device
        return 0


class GpuExecutor(Executor):
    """torch float32 on one CUDA device; host arrays in and out (each op copies)."""

    kind = "gpu"

    def __init__(self, index: int = 0, name: str | None = None, *,
                 torch_device: str | None = None):
        """``torch_device`` runs the same code on another torch device (the tests use
        ``'cpu'`` where there is no CUDA); times then come from the host clock."""
        torch = _torch()
        if torch is None:
            raise DeviceUnavailable(
                "no CUDA device: torch is not installed (pip install 'gnnweave[gpu]'); "
                f"available: {', '.join(available_devices())}")
        self.torch = torch
        if torch_device is not None:
            self.device = torch.device(torch_device)
        else:
            count = _cuda_count()
            if index >= count:
                raise DeviceUnavailable(
                    f"no CUDA device gpu:{index} ({count} visible): "
                    f"available: {', '.join(available_devices())}")
            self.device = torch.device("cuda", index)
        self.name = name or f"gpu:{index}"

    def _timed(self, fn):
        torch = self.torch
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            out = fn()
            return out, time.perf_counter() - t0
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        stop.record()
        stop.synchronize()
        return out, start.elapsed_time(stop) / 1e3

    def _to(self, a, dtype=None):
        # torch shares memory with a read-only array and warns; copy only those (e.g. views
        # of a cached graph), writable contiguous arrays still go over without a host copy
        host = np.require(a, dtype=dtype or np.float32, requirements=("C", "W"))
        return self.torch.from_numpy(host).to(self.device, non_blocking=False)

    def _graph(self, g: CSRGraph):
        def build():
            torch = self.torch
            w = g.weights if g.weights is not None else np.ones(g.num_edges)
            return (torch.from_numpy(g.indptr).to(self.device),
                    torch.from_numpy(g.indices).to(self.device),
                    torch.from_numpy(w.astype(np.float32)).to(self.device))
        return _GRAPH_CACHE.get(g, f"torch:{self.device}", build)

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        torch = self.torch
        reduce = Reduce.parse(reduce)
        g = oriented(graph, transpose)
        x = _check_features(g, x)
        lo, hi = check_rows(g, rows)
        indptr, indices, w = self._graph(g)
        xt = self._to(x)
        s, e = int(g.indptr[lo]), int(g.indptr[hi])
        f = x.shape[1]

        def run():
            crow = indptr[lo:hi + 1] - s
            if reduce is Reduce.MAX:
                deg = crow[1:] - crow[:-1]
                dst = torch.repeat_interleave(torch.arange(hi - lo, device=self.device), deg)
                prod = xt[indices[s:e]] * w[s:e, None]
                out = torch.zeros((hi - lo, f), device=self.device)
                with warnings.catch_warnings():   # "index_reduce() is in beta"
                    warnings.simplefilter("ignore", UserWarning)
                    out.index_reduce_(0, dst, prod, "amax", include_self=False)
                return out
            with warnings.catch_warnings():   # "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                a = torch.sparse_csr_tensor(crow, indices[s:e], w[s:e],
                                            size=(hi - lo, g.num_nodes), check_invariants=False)
            out = a @ xt
            if reduce is Reduce.MEAN:
                deg = (crow[1:] - crow[:-1]).clamp(min=1).to(out.dtype)
                out = out / deg[:, None]
            return out

        out, dev = self._timed(run)
        value = out.cpu().numpy()
        return OpResult(value, time.perf_counter() - t0, dev, x.nbytes, value.nbytes,
                        "aggregate", self.name)

    def _dense(self, op, fn, nbytes_in):
        t0 = time.perf_counter()
        out, dev = self._timed(fn)
        value = out.cpu().numpy()
        return OpResult(value, time.perf_counter() - t0, dev, nbytes_in, value.nbytes,
                        op, self.name)

    def dense_forward(self, x, w, b=None, *, relu=False):
        x, w = _check_dense(x, w)
        x = _dense_array(x)
        xt, wt = self._to(x), self._to(w)
        bt = None if b is None else self._to(b)

        def run():
            y = xt @ wt
            if bt is not None:
                y = y + bt
            return self.torch.relu(y) if relu else y
        return self._dense("dense_forward", run, x.size * 4 + w.size * 4)

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        dy = _mask(np.asarray(dy, dtype=np.float32), relu_mask)
        w = np.asarray(w)
        if dy.ndim != 2 or w.ndim != 2 or dy.shape[1] != w.shape[1]:
            raise ValueError(f"dense_input_grad: dy shape {dy.shape} does not match w shape {w.shape}")
        dyt, wt = self._to(dy), self._to(w)
        return self._dense("dense_input_grad", lambda: dyt @ wt.T, dy.nbytes + w.size * 4)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        dy = _mask(np.asarray(dy, dtype=np.float32), relu_mask)
        x = _dense_array(x)
        if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
            raise ValueError(f"dense_weight_grad: x shape {x.shape} does not match dy shape {dy.shape}")
        xt, dyt = self._to(x), self._to(dy)
        return self._dense("dense_weight_grad", lambda: xt.T @ dyt, x.size * 4 + dy.nbytes)

    def transfer_in(self, array):
        t0 = time.perf_counter()
        a = np.ascontiguousarray(_dense_array(array))
        src = self.torch.from_numpy(a)
        out, dev = self._timed(lambda: src.to(self.device))
        return OpResult(a, time.perf_counter() - t0, dev, a.nbytes, 0, "transfer_in", self.name)

    def transfer_out(self, array):
        t0 = time.perf_counter()
        a = np.ascontiguousarray(array)
        on_dev = self.torch.from_numpy(a).to(self.device)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        out, dev = self._timed(lambda: on_dev.cpu())
        return OpResult(out.numpy(), time.perf_counter() - t0, dev, 0, a.nbytes,
                        "transfer_out", self.name)


# --------------------------------------------------------------------------- fpga-sim / board


def _driver():
    try:
        from gnnweave.host import driver
    except ImportError:
        return None
    return driver


def _open_driver_executor(kind: str, name: str, **kw) -> Executor:
    driver = _driver()
    what = "the simulated device" if kind == "fpga-sim" else "a PYNQ board"
    if driver is None:
        raise DeviceUnavailable(
            f"no {kind} device: {what} needs gnnweave.host.driver, which is not in this build; "
            f"available: {', '.join(available_devices())}")
    opener = getattr(driver, "open_executor", None)
    if opener is None:
        raise DeviceUnavailable(
            f"no {kind} device: gnnweave.host.driver has no open_executor(kind, name) entry point; "
            f"available: {', '.join(available_devices())}")
    try:
        return opener(kind, name=name, **kw)
    except DeviceUnavailable:
        raise
    except (ImportError, OSError, RuntimeError) as exc:
        raise DeviceUnavailable(f"no {kind} device: {exc}") from None


# --------------------------------------------------------------------------- registry


def available_devices() -> list[str]:
    """Device names that :func:`make_executor` can construct on this machine."""
    names = ["cpu"]
    names += [f"gpu:{i}" for i in range(_cuda_count())]
    names.append("fpga-emu")
    driver = _driver()
    probe = getattr(driver, "available_kinds", None) if driver is not None else None
    if probe is not None:
        try:
            kinds = list(probe())
        except Exception:  # a probe that fails means no such device
            kinds = []
        names += [k for k in ("fpga-sim", "fpga") if k in kinds]
    return names


def _split_name(name: str) -> tuple[str, str | None]:
    base, sep, suffix = name.partition(":")
    return base, (suffix if sep else None)


def make_executor(name: str, **kw) -> Executor:
    """Executor for a device name: 'cpu', 'gpu', 'gpu:<i>', 'fpga-emu', 'fpga-sim', 'fpga'.

    ``cpu:<tag>`` and ``fpga-emu:<tag>`` make further independent instances (so one
    machine can stand in for several devices of a partition).
    """
    if not isinstance(name, str) or not name:
        raise DeviceUnavailable(f"device name must be a non-empty string, got {name!r}")
    base, suffix = _split_name(name.strip().lower())
    if base == "cpu":
        return CpuExecutor(name, **kw)
    if base == "fpga-emu":
        return FpgaEmuExecutor(name, **kw)
    if base in ("gpu", "cuda"):
        try:
            index = int(suffix) if suffix is not None else 0
        except ValueError:
            raise DeviceUnavailable(f"gpu index must be an integer, got {name!r}") from None
        return GpuExecutor(index, **kw)
    if base in ("fpga-sim", "fpga"):
        return _open_driver_executor(base, name, **kw)
    raise DeviceUnavailable(f"unknown device {name!r}: available: {', '.join(available_devices())}")


def default_device() -> str:
    """``$GNNWEAVE_DEVICE`` or 'cpu'."""
    return os.environ.get("GNNWEAVE_DEVICE", "cpu")
