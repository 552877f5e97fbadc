"""Host driver of the gnnweave accelerator (the Aggregator and, where the build has them,
the MacArray and the training Pipeline behind one control slave), the same code on a PYNQ
board and on the simulated device.

* :class:`GnnweaveAccel` -- with pynq installed, a ``pynq.DefaultIP`` bound to the
  accelerator's VLNV (:data:`VLNV`), so ``pynq.Overlay(...)`` hands it out as
  ``overlay.gnnweave_0``; register offsets come from the overlay's ``.hwh``
  (written from :class:`gnnweave.hw.regmap.RegisterMap`), buffers from ``pynq.allocate``.
* :class:`SimAccel` -- without pynq: the same methods on a
  :class:`gnnweave.sim.simdevice.SimDevice`, through the same thin register/buffer
  interface (:class:`_Io`), so the logic in :class:`_AccelCore` is shared.
* :func:`open_executor` / :func:`available_kinds` -- what
  :func:`gnnweave.host.executors.make_executor` calls for ``fpga-sim`` and ``fpga``.

Every argument is validated before anything touches the device; a run that does not
finish raises :class:`AcceleratorTimeout` with the status bits, a refused job
:class:`AcceleratorError` naming the reason.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnweave.golden.aggregate import Reduce

#: The accelerator's VLNV in the .hwh (``gnnweave.hw.accelerator.VLNV``; a test checks).
VLNV = "gnnweave:hls:gnnweave:1.0"
#: Its instance name in the block design (``overlay.gnnweave_0``).
INSTANCE_NAME = "gnnweave_0"
#: ``unit`` register values (``gnnweave.hw.accelerator.Unit``).
UNIT_AGGREGATOR, UNIT_MAC_ARRAY, UNIT_PIPELINE = 0, 1, 2

CTRL, GIE, IER, ISR = 0x00, 0x04, 0x08, 0x0C
AP_START, AP_DONE, AP_IDLE, AP_READY = 1, 2, 4, 8
#: Bits of the status register (hw/aggregator.py ``Status``).
STATUS_BITS = {"config_error": 0, "index_rejected": 1, "bad_indptr": 2, "addr_fault": 3,
               "axi_error": 4}
COUNTERS = ("busy_cycles", "read_beats", "write_beats", "stall_cycles", "mem_wait_cycles",
            "edges", "rejected_indices", "saturations")
#: MacArray registers (present when the build has a MacArray) and its counters.
MAC_CONFIG_NAMES = ("mode", "m", "n", "k", "shift", "relu", "use_bias", "bias_shift",
                    "p_addr", "p_size", "p_stride", "q_addr", "q_size", "q_stride",
                    "bias_addr", "bias_size", "out_addr", "out_size", "out_stride")
MAC_COUNTERS = ("busy_cycles", "mac_active_cycles", "mac_ops", "stall_cycles", "load_cycles",
                "read_beats", "write_beats", "saturations")
MAC_MODES = {"fwd": 0, "dx": 1, "dw": 2}
#: Training Pipeline registers (``gnnweave.hw.pipeline_unit``): unit-wide configuration,
#: per-stage configuration ``s<i>_<name>``, unit counters and per-stage counters.
PIPE_MODES = {"load_weights": 0, "store_weights": 1, "train": 2}
PIPE_CONFIG_NAMES = ("pipe_mode", "stage", "schedule", "microbatches", "steps", "rows",
                     *(f"{b}_{f}" for b in ("act", "logits", "grad", "dx", "w")
                       for f in ("addr", "size", "stride")), "grads_ready")
PIPE_STAGE_NAMES = ("d_in", "d_out", "relu", "fwd_shift", "dx_shift", "dw_shift", "lr", "wd", "mu",
                    "dx_first")
PIPE_COUNTERS = ("busy_cycles", "read_beats", "write_beats", "stall_cycles", "logits_done",
                 "grad_wait_cycles")
PIPE_STAGE_COUNTERS = ("busy_cycles", "fwd_cycles", "bwd_cycles", "upd_cycles", "wait_cycles",
                       "mac_ops", "saturations", "ops_done")
#: Registers the driver programs (all must be in the register description).
CONFIG_NAMES = ("num_nodes", "num_edges", "feat_dim", "reduce_op", "use_weights", "shift",
                "feat_stride", "out_stride", "indptr_addr", "indptr_size", "indices_addr",
                "indices_size", "weights_addr", "weights_size", "feat_addr", "feat_size",
                "out_addr", "out_size")


class DriverError(RuntimeError):
    """Base class of the driver's errors."""


class DeviceBusy(DriverError):
    """A run was requested while the accelerator was still busy."""


class AcceleratorTimeout(DriverError, TimeoutError):
    """No ``ap_done`` within the timeout; ``status`` holds the registers read then."""

    def __init__(self, message, status: dict):
        super().__init__(message)
        self.status = status


class AcceleratorError(DriverError):
    """The accelerator finished with an error status (config_error, addr_fault, axi_error)."""

    def __init__(self, message, status: dict):
        super().__init__(message)
        self.status = status


def status_flags(status: int) -> dict:
    return {name: bool(int(status) >> bit & 1) for name, bit in STATUS_BITS.items()}


def _pynq():
    try:
        import pynq
    except ImportError:
        return None
    return pynq


# ----------------------------------------------------------------------------- validation
def _as_int_array(value, what: str, *, ndim: int, lo: int, hi: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != ndim:
        raise ValueError(f"{what}: expected a {ndim}-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{what}: values must be integers (dtype {arr.dtype})")
    arr = arr.astype(np.int64)
    if arr.size:
        bad = np.flatnonzero((arr.reshape(-1) < lo) | (arr.reshape(-1) > hi))
        if bad.size:
            i = int(bad[0])
            idx = np.unravel_index(i, arr.shape)
            raise ValueError(f"{what}[{', '.join(map(str, idx))}] = {int(arr.reshape(-1)[i])} "
                             f"is outside [{lo}, {hi}]")
    return arr


def validate_job(graph, x_q, reduce, shift, weights, *, max_feat_dim: int, timeout_s):
    """Checks every argument of :meth:`_AccelCore.aggregate`; returns normalised values."""
    for attr in ("indptr", "indices"):
        if not hasattr(graph, attr):
            raise ValueError(f"graph: needs .indptr and .indices (a CSRGraph), got {type(graph).__name__}")
    indptr = _as_int_array(graph.indptr, "graph.indptr", ndim=1, lo=0, hi=0xFFFF_FFFF)
    indices = _as_int_array(graph.indices, "graph.indices", ndim=1, lo=0, hi=0xFFFF_FFFF)
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
    x = _as_int_array(x_q, "x_q", ndim=2, lo=-32768, hi=32767)
    if x.shape[0] != n:
        raise ValueError(f"x_q: {x.shape[0]} rows, the graph has {n} nodes")
    f = x.shape[1]
    if not 1 <= f <= max_feat_dim:
        raise ValueError(f"x_q: {f} features per row, this accelerator takes 1..{max_feat_dim}")
    try:
        red = Reduce.parse(reduce) if not isinstance(reduce, (int, np.integer)) else Reduce(int(reduce))
    except ValueError:
        raise ValueError(f"reduce {reduce!r}: choose one of sum, mean, max") from None
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)) or not 0 <= int(shift) <= 63:
        raise ValueError(f"shift {shift!r}: must be an integer in 0..63")
    w = None
    if weights is not None:
        w = _as_int_array(weights, "weights", ndim=1, lo=-32768, hi=32767)
        if w.shape[0] != e:
            raise ValueError(f"weights: {w.shape[0]} values, the graph has {e} edges")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s {timeout_s!r}: must be a positive number of seconds")
    return indptr, indices, x, red, int(shift), w


@dataclass
class PipelineRun:
    """What :meth:`_AccelCore.train_pipeline` returns: per global microbatch ``i`` (step
    ``i // microbatches``) the logits the unit wrote and the loss gradient was computed from,
    stage 0's input gradient (None without ``dx``), the final master weights per stage, the
    unit's counters (``busy_cycles``, ``grad_wait_cycles``, ...) and per-stage counters."""

    logits: list
    dx: list | None
    weights: list
    counters: dict
    stage_counters: list
    schedule: str
    microbatches: int
    steps: int
    lr_q: int
    wd_q: int
    mu_q: int

    def bubble_fraction(self) -> float:
        """1 - (forward + backward cycles) / (stages x span), the span being stage 0's busy
        cycles less its update cycles (as ``gnnweave verify pipeline`` measures it)."""
        c0 = self.stage_counters[0]
        span = c0["busy_cycles"] - c0["upd_cycles"]
        fb = sum(c["fwd_cycles"] + c["bwd_cycles"] for c in self.stage_counters)
        return 1.0 - fb / (len(self.stage_counters) * span) if span > 0 else 0.0


# ----------------------------------------------------------------------------- register/buffer I/O
class _Io:
    """What the driver needs from below: 32-bit register access at offsets of the control
    slave, buffers with a ``device_address``, and the accelerator's parameters."""

    def read32(self, offset: int) -> int:
        raise NotImplementedError

    def write32(self, offset: int, value: int):
        raise NotImplementedError

    def allocate(self, shape, dtype):
        raise NotImplementedError

    def pause(self):
        """Between two polls of CTRL (a board sleeps; the simulator's CTRL read already
        lets simulated time pass)."""


def _address(buf) -> int:
    for name in ("device_address", "physical_address"):
        v = getattr(buf, name, None)
        if v is not None:
            return int(v)
    raise DriverError(f"buffer {type(buf).__name__} has no device_address")


def _free(buf):
    fn = getattr(buf, "freebuffer", None)
    if fn is not None:
        fn()


def _offsets_from_hwh(registers: dict) -> dict:
    """``{name: (offset, words)}`` from pynq's ``ip_dict[...]['registers']``."""
    out = {}
    for name, reg in registers.items():
        out[name] = (int(reg["address_offset"]), max(1, int(reg["size"]) // 32))
    return out


def _offsets_from_regmap(regmap) -> dict:
    return {r.name: (r.offset, r.words) for r in regmap}


class _AccelCore:
    """The driver logic, on top of ``self._io`` (an :class:`_Io`), ``self._regs``
    (``{name: (offset, words)}``), ``self.max_feat_dim`` and ``self.bus_bytes``."""

    poll_s = 1e-4
    default_timeout_s = 60.0

    def _setup_core(self, io: _Io, regs: dict, max_feat_dim: int, bus_bytes: int,
                    mac_max_depth: int = 0, pipeline_limits: dict | None = None):
        missing = [n for n in CONFIG_NAMES + COUNTERS + ("status",) if n not in regs]
        if missing:
            raise DriverError(f"the accelerator's register description lacks {missing} "
                              f"(wrong .hwh or bitstream?)")
        self._io, self._regs = io, regs
        self.max_feat_dim, self.bus_bytes = int(max_feat_dim), int(bus_bytes)
        present = self._read("units_present") if "units_present" in regs else 1 << UNIT_AGGREGATOR
        #: The build has a MacArray (its registers are described and ``units_present`` says so).
        self.has_mac = bool(present >> UNIT_MAC_ARRAY & 1) and \
            all(n in regs for n in MAC_CONFIG_NAMES + MAC_COUNTERS)
        #: The MacArray's depth block (0: no MacArray): a deeper ``k`` is split on chip into
        #: blocks of this depth, summed exactly (one more P load per block).
        self.mac_max_depth = int(mac_max_depth) if self.has_mac else 0
        stages = 0
        while f"s{stages}_d_in" in regs:
            stages += 1
        #: The build has the training Pipeline (``units_present`` and its registers say so).
        self.has_pipeline = bool(present >> UNIT_PIPELINE & 1) and stages > 0 and \
            all(n in regs for n in PIPE_CONFIG_NAMES + PIPE_COUNTERS) and \
            all(f"s{i}_{n}" in regs for i in range(stages) for n in PIPE_STAGE_NAMES + PIPE_STAGE_COUNTERS)
        #: Stages of the Pipeline (0: none).
        self.pipeline_stages = stages if self.has_pipeline else 0
        #: Its build limits (``max_in``, ``max_out``, ``max_rows``, ``slots``); a limit that is
        #: 0 is unknown to the driver and left to the hardware's check (config_error).
        self.pipeline_limits = {k: int((pipeline_limits or {}).get(k, 0))
                                for k in ("max_in", "max_out", "max_rows", "slots")}
        self._pipe_shapes: dict[int, tuple[int, int]] = {}

    # -- registers by name
    def _write(self, name: str, value: int):
        off, words = self._regs[name]
        value = int(value)
        if value < 0 or value >> (32 * words):
            raise ValueError(f"register {name}: {value} does not fit {32 * words} bits")
        for w in range(words):
            self._io.write32(off + 4 * w, (value >> (32 * w)) & 0xFFFF_FFFF)

    def _read(self, name: str) -> int:
        off, words = self._regs[name]
        value = 0
        for w in range(words):
            value |= self._io.read32(off + 4 * w) << (32 * w)
        return value

    def counters(self, names=COUNTERS) -> dict:
        """Performance counters and status of the last run (the Aggregator's by default)."""
        out = {name: self._read(name) for name in names}
        out["status"] = self._read("status")
        out["flags"] = status_flags(out["status"])
        return out

    def ctrl(self) -> int:
        return self._io.read32(CTRL)

    def is_idle(self) -> bool:
        return bool(self.ctrl() & AP_IDLE)

    def aggregate(self, graph, x_q, reduce="sum", shift: int = 0, weights=None, *,
                  timeout_s: float | None = None):
        """``out[v] = reduce_{u -> v} w_uv x_q[u]`` on the accelerator -> ``(out, counters)``.

        ``x_q`` int16 values ``[N, F]``, ``weights`` int16 per edge (or None), ``shift``
        the narrowing shift (0..63). ``out`` is int64 ``[N, F]``; ``counters`` the
        performance counters and status flags of the run.
        """
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        indptr, indices, x, red, shift, w = validate_job(
            graph, x_q, reduce, shift, weights, max_feat_dim=self.max_feat_dim,
            timeout_s=timeout_s)
        n, f = x.shape
        e = indices.shape[0]
        ctrl = self.ctrl()
        if not ctrl & AP_IDLE:
            raise DeviceBusy(f"the accelerator is busy (ap_ctrl=0x{ctrl:x}): a previous run "
                             f"has not finished; wait for it or call recover()")
        stride_elems = -(-2 * f // self.bus_bytes) * self.bus_bytes // 2
        bufs = {}
        try:
            # whole beats: the engine reads its streams in full bus words
            words = lambda count, size: -(-max(count, 1) * size // self.bus_bytes) * self.bus_bytes // size  # noqa: E731
            bufs["indptr"] = self._io.allocate((words(n + 1, 4),), np.uint32)
            bufs["indices"] = self._io.allocate((words(e, 4),), np.uint32)
            bufs["weights"] = self._io.allocate((words(e, 2),), np.int16) if w is not None else None
            bufs["feat"] = self._io.allocate((max(n, 1), stride_elems), np.int16)
            bufs["out"] = self._io.allocate((max(n, 1), stride_elems), np.int16)
            bufs["indptr"][:n + 1] = indptr
            bufs["indptr"][n + 1:] = 0
            bufs["indices"][:e] = indices
            bufs["indices"][e:] = 0
            if w is not None:
                bufs["weights"][:e] = w
                bufs["weights"][e:] = 0
            bufs["feat"][:n, :f] = x
            bufs["feat"][:n, f:] = 0
            bufs["out"][:] = 0
            for b in bufs.values():
                if b is not None and hasattr(b, "flush"):
                    b.flush()
            regs = {"num_nodes": n, "num_edges": e, "feat_dim": f, "reduce_op": int(red),
                    "use_weights": int(w is not None), "shift": shift,
                    "feat_stride": 2 * stride_elems, "out_stride": 2 * stride_elems}
            for name, b in bufs.items():
                regs[f"{name}_addr"] = _address(b) if b is not None else 0
                regs[f"{name}_size"] = b.nbytes if b is not None else 0
            counters = self._run(UNIT_AGGREGATOR, CONFIG_NAMES, regs, COUNTERS, timeout_s,
                                 f"N={n}, E={e}, F={f}")
            if hasattr(bufs["out"], "invalidate"):
                bufs["out"].invalidate()
            out = np.array(bufs["out"][:n, :f], dtype=np.int64)
            return out, counters
        finally:
            for b in bufs.values():
                if b is not None:
                    _free(b)

    def _run(self, unit: int, config_names, regs: dict, counter_names, timeout_s, what: str,
             service=None) -> dict:
        """Select ``unit`` (where the build has a unit register), write ``regs[config_names]``,
        start, wait for ap_done (calling ``service()`` after every poll that did not see it),
        raise on an error status; returns the counters."""
        if "unit" in self._regs:
            self._write("unit", unit)
        for name in config_names:
            self._write(name, regs[name])
        self._io.write32(GIE, 1)
        self._io.write32(IER, 1)
        if self._io.read32(ISR) & 1:
            self._io.write32(ISR, 1)          # toggle a stale ap_done off
        self._io.write32(CTRL, AP_START)
        deadline = time.monotonic() + float(timeout_s)
        while True:
            ctrl = self._io.read32(CTRL)
            if ctrl & AP_DONE:
                break
            if time.monotonic() > deadline:
                status = self.counters(counter_names)
                raise AcceleratorTimeout(
                    f"accelerator timeout: no ap_done within {timeout_s} s "
                    f"(ap_ctrl=0x{ctrl:x}, idle={bool(ctrl & AP_IDLE)}, "
                    f"status=0x{status['status']:x} {[k for k, v in status['flags'].items() if v]}, "
                    f"busy_cycles={status['busy_cycles']}, read_beats={status['read_beats']}); "
                    f"the run is still in progress: call recover() before the next one",
                    status)
            if service is not None:
                service()
            self._io.pause()
        if self._io.read32(ISR) & 1:
            self._io.write32(ISR, 1)
        counters = self.counters(counter_names)
        bad = [k for k in ("config_error", "addr_fault", "axi_error") if counters["flags"][k]]
        if bad:
            raise AcceleratorError(
                f"accelerator refused or aborted the run: {', '.join(bad)} "
                f"(status=0x{counters['status']:x}; {what}, buffers "
                f"{', '.join(f'{k}=0x{v:x}' for k, v in regs.items() if k.endswith('_addr'))})",
                counters)
        return counters

    def mac(self, mode, p, q, *, shift: int, bias=None, bias_shift: int = 0, relu: bool = False,
            timeout_s: float | None = None):
        """One MacArray operation -> ``(out, counters)`` (``gnnweave.golden.mac`` bit for bit).

        ``mode`` ``fwd`` (``out = P Q (+ bias << bias_shift)``, optional ReLU; P ``[m, k]``,
        Q ``[k, n]``), ``dx`` (``out = P Q^T``; P = dY ``[m, k]``, Q = W ``[n, k]``) or ``dw``
        (``out = P^T Q``; P = X ``[k, m]``, Q = dY ``[k, n]``): every matrix int16 in its
        forward layout (the transposes happen on chip), ``bias`` int32 ``[n]`` (fwd only),
        ``shift`` the narrowing shift 0..63. ``out`` is int64 ``[m, n]``.
        """
        if not self.has_mac:
            raise DriverError("this accelerator has no MacArray (units_present says so); "
                              "use a build whose configuration has one")
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        key = str(mode).lower() if not isinstance(mode, (int, np.integer)) else \
            {v: k for k, v in MAC_MODES.items()}.get(int(mode), str(mode))
        if key not in MAC_MODES:
            raise ValueError(f"mode {mode!r}: choose one of {', '.join(MAC_MODES)}")
        a = _as_int_array(p, "p", ndim=2, lo=-32768, hi=32767)
        b = _as_int_array(q, "q", ndim=2, lo=-32768, hi=32767)
        if key == "fwd":
            (m, k), (k2, n) = a.shape, b.shape
            what = "fwd: p [m, k] and q [k, n]"
        elif key == "dx":
            (m, k), (n, k2) = a.shape, b.shape
            what = "dx: p = dY [m, k] and q = W [n, k]"
        else:
            (k, m), (k2, n) = a.shape, b.shape
            what = "dw: p = X [k, m] and q = dY [k, n]"
        if k != k2:
            raise ValueError(f"{what}: depths differ (p {a.shape}, q {b.shape})")
        if not (m and n and k):
            raise ValueError(f"{what}: empty operand (p {a.shape}, q {b.shape})")
        if k >= 1 << 32 or m >= 1 << 32 or n >= 1 << 32:
            raise ValueError(f"{what}: m={m}, n={n}, k={k}: each must be below 2**32")
        if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)) or not 0 <= int(shift) <= 63:
            raise ValueError(f"shift {shift!r}: must be an integer in 0..63")
        if isinstance(bias_shift, bool) or not isinstance(bias_shift, (int, np.integer)) \
                or not 0 <= int(bias_shift) <= 31:
            raise ValueError(f"bias_shift {bias_shift!r}: must be an integer in 0..31")
        if key != "fwd" and (bias is not None or relu):
            raise ValueError(f"bias and relu apply to fwd only (mode {key}); mask dY on the host")
        bias_arr = None
        if bias is not None:
            bias_arr = _as_int_array(bias, "bias", ndim=1, lo=-(1 << 31), hi=(1 << 31) - 1)
            if bias_arr.shape[0] != n:
                raise ValueError(f"bias: {bias_arr.shape[0]} values, the output has n={n} columns")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s {timeout_s!r}: must be a positive number of seconds")
        ctrl = self.ctrl()
        if not ctrl & AP_IDLE:
            raise DeviceBusy(f"the accelerator is busy (ap_ctrl=0x{ctrl:x}): a previous run "
                             f"has not finished; wait for it or call recover()")
        beat = self.bus_bytes

        def row_elems(cols):       # a row stride in int16 elements, whole bus beats
            return -(-2 * max(cols, 1) // beat) * beat // 2

        bufs = {}
        try:
            for name, mat in (("p", a), ("q", b)):
                buf = self._io.allocate((mat.shape[0], row_elems(mat.shape[1])), np.int16)
                buf[:, :mat.shape[1]] = mat
                buf[:, mat.shape[1]:] = 0
                bufs[name] = buf
            bufs["out"] = self._io.allocate((m, row_elems(n)), np.int16)
            bufs["out"][:] = 0
            if bias_arr is not None:
                words = -(-4 * n // beat) * beat // 4
                bufs["bias"] = self._io.allocate((words,), np.int32)
                bufs["bias"][:n] = bias_arr
                bufs["bias"][n:] = 0
            for buf in bufs.values():
                if hasattr(buf, "flush"):
                    buf.flush()
            regs = {"mode": MAC_MODES[key], "m": m, "n": n, "k": k, "shift": int(shift),
                    "relu": int(bool(relu)), "use_bias": int(bias_arr is not None),
                    "bias_shift": int(bias_shift), "bias_addr": 0, "bias_size": 0}
            for name, buf in bufs.items():
                regs[f"{name}_addr"] = _address(buf)
                regs[f"{name}_size"] = buf.nbytes
                if name != "bias":
                    regs[f"{name}_stride"] = buf.strides[0]
            counters = self._run(UNIT_MAC_ARRAY, MAC_CONFIG_NAMES, regs, MAC_COUNTERS, timeout_s,
                                 f"mode {key}, m={m}, n={n}, k={k}")
            if hasattr(bufs["out"], "invalidate"):
                bufs["out"].invalidate()
            return np.array(bufs["out"][:, :n], dtype=np.int64), counters
        finally:
            for buf in bufs.values():
                _free(buf)

    # ------------------------------------------------------------------ training Pipeline
    def _need_pipeline(self):
        if not self.has_pipeline:
            raise DriverError("this accelerator has no training Pipeline (units_present says so); "
                              "use a build whose configuration has one")

    def _check_stage(self, stage) -> int:
        if isinstance(stage, bool) or not isinstance(stage, (int, np.integer)) or \
                not 0 <= int(stage) < self.pipeline_stages:
            raise ValueError(f"stage {stage!r}: must be an integer in 0..{self.pipeline_stages - 1}")
        return int(stage)

    def _check_dims(self, what: str, d_in: int, d_out: int):
        lim = self.pipeline_limits
        for name, value, cap in (("d_in", d_in, lim["max_in"]), ("d_out", d_out, lim["max_out"])):
            if value < 1 or (cap and value > cap):
                raise ValueError(f"{what}: {name} = {value}, this Pipeline takes 1..{cap or '?'}")

    def _master_array(self, w, what: str) -> np.ndarray:
        return _as_int_array(w, what, ndim=2, lo=-(1 << 31), hi=(1 << 31) - 1)

    def _check_timeout(self, timeout_s):
        timeout_s = self.default_timeout_s if timeout_s is None else timeout_s
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s {timeout_s!r}: must be a positive number of seconds")
        return timeout_s

    def _check_idle(self):
        ctrl = self.ctrl()
        if not ctrl & AP_IDLE:
            raise DeviceBusy(f"the accelerator is busy (ap_ctrl=0x{ctrl:x}): a previous run "
                             f"has not finished; wait for it or call recover()")

    def _weights_job(self, mode: str, stage: int, shape, w=None, timeout_s=None) -> np.ndarray:
        d_in, d_out = shape
        words = -(-4 * d_out // self.bus_bytes) * self.bus_bytes // 4
        buf = self._io.allocate((d_in, words), np.int32)
        try:
            if w is not None:
                buf[:, :d_out] = w
                buf[:, d_out:] = 0
            else:
                buf[:] = 0
            if hasattr(buf, "flush"):
                buf.flush()
            regs = {"pipe_mode": PIPE_MODES[mode], "stage": stage, "w_addr": _address(buf),
                    "w_size": buf.nbytes, "w_stride": buf.strides[0],
                    f"s{stage}_d_in": d_in, f"s{stage}_d_out": d_out}
            self._run(UNIT_PIPELINE, list(regs), regs, PIPE_COUNTERS, timeout_s,
                      f"{mode} stage {stage} [{d_in}, {d_out}]")
            if hasattr(buf, "invalidate"):
                buf.invalidate()
            return np.array(buf[:, :d_out], dtype=np.int64)
        finally:
            _free(buf)

    def load_weights(self, stage: int, w_master, *, timeout_s: float | None = None):
        """Load stage ``stage``'s master weights ``w_master`` (int ``[d_in, d_out]``, the
        master format: int32, Q8.24 for the default formats) into the Pipeline; its MAC
        weights are narrowed from them on chip, and its SGD velocity is cleared."""
        self._need_pipeline()
        stage = self._check_stage(stage)
        w = self._master_array(w_master, "w_master")
        self._check_dims("w_master", *w.shape)
        timeout_s = self._check_timeout(timeout_s)
        self._check_idle()
        self._weights_job("load_weights", stage, w.shape, w, timeout_s)
        self._pipe_shapes[stage] = tuple(w.shape)

    def read_weights(self, stage: int, shape=None, *, timeout_s: float | None = None) -> np.ndarray:
        """Stage ``stage``'s master weights -> int64 ``[d_in, d_out]`` (``shape``; default the
        shape of the last :meth:`load_weights` of that stage)."""
        self._need_pipeline()
        stage = self._check_stage(stage)
        if shape is None:
            if stage not in self._pipe_shapes:
                raise ValueError(f"read_weights(stage={stage}): give shape=(d_in, d_out); this "
                                 f"driver has not loaded that stage")
            shape = self._pipe_shapes[stage]
        if len(tuple(shape)) != 2 or not all(isinstance(v, (int, np.integer)) for v in shape):
            raise ValueError(f"shape {shape!r}: must be (d_in, d_out)")
        d_in, d_out = (int(v) for v in shape)
        self._check_dims("shape", d_in, d_out)
        timeout_s = self._check_timeout(timeout_s)
        self._check_idle()
        return self._weights_job("store_weights", stage, (d_in, d_out), None, timeout_s)

    def train_pipeline(self, inputs, loss_grad_fn, *, microbatches: int, weights=None, dims=None,
                       schedule="gpipe", relu=None, lr: float, wd: float = 0.0, mu: float = 0.0,
                       fmt=None, dx: bool = True, dx_first: bool = True,
                       timeout_s: float | None = None) -> "PipelineRun":
        """Train on the Pipeline: ``steps = len(inputs) / microbatches`` steps under ``schedule``
        (``gpipe``, ``1f1b-flush``, ``1f1b-async``), bit-exact with
        :class:`gnnweave.golden.pipeline.GoldenPipeline` (``run(schedule, inputs, loss_grad_fn,
        microbatches)``) started from the same masters (with ``weights``, a fresh start, as a
        new GoldenPipeline; without, the velocity the last run left, as the same object).

        ``inputs``: one int array ``[rows, d_0]`` per microbatch (``fmt.act`` / ``fmt.input``).
        ``loss_grad_fn(i, logits_q) -> dy_q``: the host's loss gradient of microbatch ``i``
        (int ``[rows, d_K]`` in, int16 ``[rows, d_K]`` out, ``fmt.grad``); it is called while
        the unit runs, as each microbatch's logits reach memory (the doorbell: poll
        ``logits_done``, read the logits, write the gradient, raise ``grads_ready``).
        ``weights``: initial master weights per stage (loaded first; None: train what is on
        chip, then ``dims = [d_0, ..., d_K]`` is needed). ``relu``: per stage (default all
        but the last). ``lr``/``wd``/``mu``: SGD hyper-parameters (quantised into
        ``fmt.sgd``). ``fmt``: a :class:`~gnnweave.golden.pipeline.TrainFormat` whose
        ``sgd`` formats are the hardware's (default ``TrainFormat()``); it fixes the shifts.
        ``dx``: also write stage 0's input gradients. Every argument is checked before the
        device is touched; a run past ``timeout_s`` raises :class:`AcceleratorTimeout`.
        Returns a :class:`PipelineRun` (logits and dX per microbatch, final masters, counters).
        """
        from gnnweave.golden.pipeline import Schedule, TrainFormat
        self._need_pipeline()
        K = self.pipeline_stages
        lim = self.pipeline_limits
        timeout_s = self._check_timeout(timeout_s)
        fmt = TrainFormat() if fmt is None else fmt
        if not isinstance(fmt, TrainFormat):
            raise ValueError(f"fmt: expected a gnnweave.golden.pipeline.TrainFormat, got {type(fmt).__name__}")
        from gnnweave.golden.mac import SgdFormat
        hw_sgd = SgdFormat()
        for name in ("master", "weight", "grad", "lr", "wd", "mu"):
            if getattr(fmt.sgd, name) != getattr(hw_sgd, name):
                raise ValueError(f"fmt.sgd.{name} = {getattr(fmt.sgd, name)}: the hardware's is "
                                 f"{getattr(hw_sgd, name)}")
        if fmt.sgd.momentum not in (None, hw_sgd.master):
            raise ValueError(f"fmt.sgd.momentum = {fmt.sgd.momentum}: the hardware's is the master format")
        try:
            sched = Schedule.parse(schedule)
        except ValueError:
            raise ValueError(f"schedule {schedule!r}: choose one of gpipe, 1f1b-flush, 1f1b-async") from None
        if not callable(loss_grad_fn):
            raise ValueError("loss_grad_fn: must be callable as loss_grad_fn(microbatch, logits_q)")
        masters = None
        if weights is not None:
            if len(weights) != K:
                raise ValueError(f"weights: {len(weights)} matrices, this Pipeline has {K} stages")
            masters = [self._master_array(w, f"weights[{s}]") for s, w in enumerate(weights)]
            dims = [masters[0].shape[0]] + [w.shape[1] for w in masters]
            for s in range(1, K):
                if masters[s].shape[0] != masters[s - 1].shape[1]:
                    raise ValueError(f"weights[{s}]: {masters[s].shape[0]} rows, stage {s - 1} outputs "
                                     f"{masters[s - 1].shape[1]} features")
        elif dims is None:
            raise ValueError("give weights= (initial master weights) or dims= [d_0, ..., d_K]")
        dims = [int(d) for d in dims]
        if len(dims) != K + 1:
            raise ValueError(f"dims: {len(dims)} entries, a {K}-stage Pipeline needs {K + 1}")
        for s in range(K):
            self._check_dims(f"stage {s}", dims[s], dims[s + 1])
        if isinstance(microbatches, bool) or not isinstance(microbatches, (int, np.integer)) or \
                not 1 <= int(microbatches) <= 255:
            raise ValueError(f"microbatches {microbatches!r}: must be an integer in 1..255")
        m = int(microbatches)
        xs = [_as_int_array(x, f"inputs[{i}]", ndim=2, lo=-32768, hi=32767) for i, x in enumerate(inputs)]
        n = len(xs)
        if n == 0 or n % m:
            raise ValueError(f"inputs: {n} microbatches do not split into steps of {m}")
        if n // m > 65535:
            raise ValueError(f"inputs: {n // m} steps, at most 65535")
        rows = xs[0].shape[0]
        for i, x in enumerate(xs):
            if x.shape != (rows, dims[0]):
                raise ValueError(f"inputs[{i}]: shape {x.shape}, expected ({rows}, {dims[0]}) "
                                 f"(rows of inputs[0], d_0)")
        if rows < 1 or (lim["max_rows"] and rows > lim["max_rows"]):
            raise ValueError(f"inputs: {rows} rows per microbatch, this Pipeline takes 1..{lim['max_rows']}")
        if sched is Schedule.GPIPE and lim["slots"] and m > lim["slots"]:
            raise ValueError(f"microbatches {m}: GPipe holds every microbatch of a step, this "
                             f"Pipeline has {lim['slots']} slots (use 1f1b-flush)")
        relu = [s < K - 1 for s in range(K)] if relu is None else list(relu)
        if len(relu) != K or not all(isinstance(r, (bool, np.bool_, int)) and int(r) in (0, 1) for r in relu):
            raise ValueError(f"relu: {relu!r}: expected {K} booleans")
        lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, mu)
        shifts = [(fmt.fwd_shift_at(s), fmt.dx_shift, fmt.dw_shift_at(s)) for s in range(K)]
        for s, sh in enumerate(shifts):
            if not all(0 <= v <= 63 for v in sh):
                raise ValueError(f"fmt: stage {s} shifts {sh} outside 0..63")
        self._check_idle()

        if masters is not None:
            for s, w in enumerate(masters):
                self._weights_job("load_weights", s, w.shape, w, timeout_s)
                self._pipe_shapes[s] = tuple(w.shape)
        beat = self.bus_bytes

        def elems(cols, size):
            return -(-size * max(cols, 1) // beat) * beat // size

        total = n * rows
        d_last = dims[-1]
        bufs = {}
        try:
            bufs["act"] = self._io.allocate((total, elems(dims[0], 2)), np.int16)
            bufs["logits"] = self._io.allocate((total, elems(d_last, 2)), np.int16)
            bufs["grad"] = self._io.allocate((total, elems(d_last, 2)), np.int16)
            if dx:
                bufs["dx"] = self._io.allocate((total, elems(dims[0], 2)), np.int16)
            for name, b in bufs.items():
                b[:] = 0
            bufs["act"][:, :dims[0]] = np.concatenate(xs)
            for b in bufs.values():
                if hasattr(b, "flush"):
                    b.flush()
            regs = {"pipe_mode": PIPE_MODES["train"], "stage": 0, "schedule": int(sched),
                    "microbatches": m, "steps": n // m, "rows": rows, "grads_ready": 0,
                    "dx_addr": 0, "dx_size": 0, "dx_stride": 0, "w_addr": 0, "w_size": 0, "w_stride": 0}
            for name, b in bufs.items():
                regs.update({f"{name}_addr": _address(b), f"{name}_size": b.nbytes,
                             f"{name}_stride": b.strides[0]})
            for s in range(K):
                fwd, dxs, dws = shifts[s]
                regs.update({f"s{s}_d_in": dims[s], f"s{s}_d_out": dims[s + 1], f"s{s}_relu": int(relu[s]),
                             f"s{s}_fwd_shift": fwd, f"s{s}_dx_shift": dxs, f"s{s}_dw_shift": dws,
                             f"s{s}_lr": lr_q, f"s{s}_wd": wd_q, f"s{s}_mu": mu_q,
                             f"s{s}_dx_first": int(bool(dx_first))})
            logits: list = [None] * n
            served = [0]
            lg, gr = bufs["logits"], bufs["grad"]

            def service():
                done = self._read("logits_done")
                start = served[0]
                while served[0] < min(done, n):
                    i = served[0]
                    if hasattr(lg, "invalidate"):
                        lg.invalidate()
                    z = np.array(lg[i * rows:(i + 1) * rows, :d_last], dtype=np.int64)
                    try:
                        g = _as_int_array(loss_grad_fn(i, z.copy()), f"loss_grad_fn({i}, ...)", ndim=2,
                                          lo=-32768, hi=32767)
                        if g.shape != (rows, d_last):
                            raise ValueError(f"loss_grad_fn({i}, ...): shape {g.shape}, expected "
                                             f"({rows}, {d_last})")
                    except Exception:
                        # the unit waits for this gradient forever: take it back first
                        if getattr(self._io, "reset", None) is not None:
                            self.recover()
                        raise
                    logits[i] = z
                    gr[i * rows:(i + 1) * rows, :d_last] = g
                    if hasattr(gr, "flush"):
                        gr.flush()
                    served[0] = i + 1
                if served[0] > start:
                    self._write("grads_ready", served[0])

            counters = self._run(UNIT_PIPELINE, list(regs), regs, PIPE_COUNTERS, timeout_s,
                                 f"train {sched.cli_name}, {n} microbatches of {rows} rows, dims {dims}",
                                 service=service)
            service()     # nothing is left: every gradient was read before the run could end
            stage_counters = [{c: self._read(f"s{s}_{c}") for c in PIPE_STAGE_COUNTERS} for s in range(K)]
            if hasattr(lg, "invalidate"):
                lg.invalidate()
            dxs = None
            if dx:
                if hasattr(bufs["dx"], "invalidate"):
                    bufs["dx"].invalidate()
                dxs = [np.array(bufs["dx"][i * rows:(i + 1) * rows, :dims[0]], dtype=np.int64)
                       for i in range(n)]
        finally:
            for b in bufs.values():
                _free(b)
        final = [self._weights_job("store_weights", s, (dims[s], dims[s + 1]), None, timeout_s)
                 for s in range(K)]
        for s in range(K):
            self._pipe_shapes[s] = (dims[s], dims[s + 1])
        return PipelineRun(logits=logits, dx=dxs, weights=final, counters=counters,
                           stage_counters=stage_counters, schedule=sched.cli_name, microbatches=m,
                           steps=n // m, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)

    def recover(self):
        """Bring a hung accelerator back: a reset where the platform offers one."""
        reset = getattr(self._io, "reset", None)
        if reset is None:
            raise DriverError("this platform cannot reset the accelerator from software: "
                              "download the overlay again")
        reset()


# ----------------------------------------------------------------------------- simulated device
class _SimDeviceIo(_Io):
    """Registers and buffers straight on a SimDevice (no pynq)."""

    def __init__(self, device):
        self.device = device
        self.base = device.control_base

    def read32(self, offset):
        return int.from_bytes(self.device.read_registers(self.base + offset, 4), "little")

    def write32(self, offset, value):
        self.device.write_registers(self.base + offset, int(value).to_bytes(4, "little"))

    def allocate(self, shape, dtype):
        return self.device.allocate(shape, dtype)

    def reset(self):
        self.device.reset_accelerator()


class SimAccel(_AccelCore):
    """The driver on a :class:`~gnnweave.sim.simdevice.SimDevice` without pynq."""

    def __init__(self, device):
        from gnnweave.hw.configs import get_config, get_mac_config, get_pipeline_config
        cfg = get_config(device.config)
        mac = get_mac_config(device.config)
        pipe = get_pipeline_config(device.config)
        self.device = device
        self._setup_core(_SimDeviceIo(device), _offsets_from_regmap(device.regmap),
                         cfg.max_feat_dim, cfg.bytes_per_beat,
                         mac.max_depth if mac is not None else 0,
                         None if pipe is None else {k: getattr(pipe, k) for k in
                                                    ("max_in", "max_out", "max_rows", "slots")})


# ----------------------------------------------------------------------------- PYNQ
class _PynqIo(_Io):
    def __init__(self, ip, pynq, device):
        self.ip, self.pynq, self.device = ip, pynq, device

    def read32(self, offset):
        return int(self.ip.mmio.read(offset))

    def write32(self, offset, value):
        self.ip.mmio.write(offset, int(value))

    def allocate(self, shape, dtype):
        target = getattr(self.device, "default_memory", None)
        if target is not None:
            return self.pynq.allocate(shape, dtype, target=target)
        return self.pynq.allocate(shape, dtype)

    def pause(self):
        if not hasattr(self.device, "advance"):   # a board: let the hardware work
            time.sleep(_AccelCore.poll_s)

    @property
    def reset(self):
        fn = getattr(self.device, "reset_accelerator", None)
        return fn


def _hwh_parameter(description: dict, name: str, default: int) -> int:
    params = description.get("parameters", {}) or {}
    try:
        return int(str(params.get(name, default)), 0)
    except ValueError:
        return default


_pynq_mod = _pynq()
if _pynq_mod is not None:
    class GnnweaveAccel(_pynq_mod.DefaultIP, _AccelCore):
        """The accelerator as a PYNQ IP (``overlay.gnnweave_0``)."""

        bindto = [VLNV]

        def __init__(self, description):
            super().__init__(description)
            device = description.get("device") or getattr(self.mmio, "device", None)
            self.device = device
            self._setup_core(_PynqIo(self, _pynq_mod, device),
                             _offsets_from_hwh(description.get("registers", {})),
                             _hwh_parameter(description, "C_MAX_FEAT_DIM", 64),
                             _hwh_parameter(description, "C_M_AXI_GMEM_DATA_WIDTH", 128) // 8,
                             _hwh_parameter(description, "C_MAC_MAX_DEPTH", 0),
                             {k: _hwh_parameter(description, f"C_PIPE_{k.upper()}", 0)
                              for k in ("max_in", "max_out", "max_rows", "slots")})
else:
    GnnweaveAccel = None


# ----------------------------------------------------------------------------- executors
def _executors():
    from gnnweave.host import executors
    return executors


def _make_executor_class():
    ex = _executors()

    class FpgaExecutor(ex.FpgaEmuExecutor):
        """Aggregations on the accelerator (board or simulated device), dense ops on its
        MacArray where the build has one (``dense="device"``, the default; an op the unit
        cannot take, a bias shift over 31, runs on the golden MAC model as in ``fpga-emu``,
        counted in ``emulated_dense_ops``). Formats are chosen exactly as ``fpga-emu`` chooses them, so
        results are bit-identical to it; device times come from the cycle counters."""

        def __init__(self, accel, kind: str, name: str | None = None, *, timeout_s: float = 600.0,
                     owner=None, dense: str = "device", config: str | None = None):
            # the build's own cycle model and clock turn its counters into seconds
            super().__init__(name or kind, config=config)
            if dense not in ("device", "emulated"):
                raise ValueError(f"dense must be 'device' or 'emulated', got {dense!r}")
            self.kind = kind
            self.accel = accel
            self.timeout_s = timeout_s
            self._owner = owner
            if dense == "device" and getattr(accel, "has_mac", False):
                self.mac_route = "device"
            self.emulated_dense_ops = 0
            self._mac_cycles = None

        def _gemm(self, mode, a_q, b_q, *, shift, relu=False, relu_mask=None, bias=None):
            # relu_mask is already applied: the callers quantise the masked dY
            fits = self.mac_route == "device" and (bias is None or 0 <= int(bias[1]) <= 31)
            if not fits:
                if self.mac_route == "device":
                    self.emulated_dense_ops += 1
                return super()._gemm(mode, a_q, b_q, shift=shift, relu=relu, relu_mask=relu_mask,
                                     bias=bias)
            out, cnt = self.accel.mac(mode, ex._dense_array(a_q), ex._dense_array(b_q), shift=shift,
                                      relu=relu, bias=None if bias is None else bias[0],
                                      bias_shift=0 if bias is None else int(bias[1]),
                                      timeout_s=self.timeout_s)
            self._mac_cycles = (self._mac_cycles or 0) + cnt["busy_cycles"]
            return out, int(cnt["saturations"])

        def _run_gemm(self, *args, **kw):
            self._mac_cycles = None
            res = super()._run_gemm(*args, **kw)
            if self._mac_cycles is not None:        # measured, not modelled
                res.device_seconds = self._mac_cycles / self.cycle_model.clock_hz
            return res

        def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
            from gnnweave.fixed import FixedFormat
            from gnnweave.golden.aggregate import AggregateFormat
            from gnnweave.graph import CSRGraph
            t0 = time.perf_counter()
            red = Reduce.parse(reduce)
            g = ex.oriented(graph, transpose)
            x = ex._check_features(g, x)
            lo, hi = ex.check_rows(g, rows)
            x_q, feat_fmt = ex._quantize16(x)
            w_q, w_fmt = self._weights_q(g)
            peak = float(np.max(np.abs(x))) if x.size else 0.0
            bound = (ex._abs_row_weight_max(g) if red is Reduce.SUM else ex._abs_weight_max(g)) * peak
            product_frac = feat_fmt.frac + (w_fmt.frac if w_fmt is not None else 0)
            out_frac = min(ex._frac_for_bound(bound), product_frac)
            fmt = AggregateFormat(feat=feat_fmt, weight=w_fmt, out=FixedFormat(ex.FPGA_WIDTH, out_frac))
            s, e = int(g.indptr[lo]), int(g.indptr[hi])
            n = g.num_nodes
            indptr = np.full(n + 1, e - s, dtype=np.int64)
            indptr[: hi - lo + 1] = g.indptr[lo:hi + 1] - s
            shard = CSRGraph(indptr=indptr, indices=np.asarray(g.indices[s:e]), num_nodes=n) \
                if _csr_takes(CSRGraph) else _Shard(indptr, np.asarray(g.indices[s:e]))
            f = x.shape[1]
            out = np.zeros((n, f), dtype=np.int64)
            sat = edges = cycles = 0
            step = self.accel.max_feat_dim       # column chunks: aggregation is per column
            for c0 in range(0, f, step):
                part, cnt = self.accel.aggregate(
                    shard, x_q[:, c0:c0 + step], red, fmt.shift,
                    None if w_q is None else w_q[s:e], timeout_s=self.timeout_s)
                out[:, c0:c0 + step] = part
                sat += cnt["saturations"]
                edges = cnt["edges"]
                cycles += cnt["busy_cycles"]
            value = fmt.out.to_float(out[: hi - lo]).astype(np.float32)
            dev = cycles / self.cycle_model.clock_hz
            return ex.OpResult(value, time.perf_counter() - t0, dev,
                               edges * f * 2 + (e - s) * 8, (hi - lo) * f * 2,
                               "aggregate", self.name, sat)

        def close(self):
            if self._owner is not None:
                self._owner.close()
                self._owner = None

    return FpgaExecutor


class _Shard:
    def __init__(self, indptr, indices):
        self.indptr, self.indices = indptr, indices
        self.num_nodes = len(indptr) - 1


def _csr_takes(cls) -> bool:
    import inspect
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return "indptr" in params and "indices" in params and "num_nodes" in params


def _native_toolchain_problem() -> str | None:
    import shutil
    try:
        from gnnweave.sim import toolchain
        toolchain.verilator_root()
    except Exception as exc:  # noqa: BLE001 - any failure means no simulated device
        return str(exc)
    for tool in ("g++", "make", "perl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH"
    return None


def available_kinds() -> list[str]:
    """``fpga-sim`` where the native simulator can be built; ``fpga`` where pynq finds a board."""
    kinds = []
    if _native_toolchain_problem() is None:
        kinds.append("fpga-sim")
    pynq = _pynq()
    if pynq is not None and os.environ.get("GNNWEAVE_BITSTREAM"):
        try:
            if pynq.Device.devices:
                kinds.append("fpga")
        except Exception:  # noqa: BLE001 - no board
            pass
    return kinds


class _SimOwner:
    """Keeps the SimDevice (and the overlay files) alive as long as the executor."""

    def __init__(self, device, tmpdir=None):
        self.device, self.tmpdir = device, tmpdir

    def close(self):
        self.device.close()
        if self.tmpdir is not None:
            self.tmpdir.cleanup()


def open_sim_accel(*, config: str = "small", latency: int = 32, mem_size: int = 1 << 30,
                   use_pynq: bool | None = None):
    """A driver on a fresh SimDevice -> ``(accel, device, owner)``: through genuine pynq
    (``Overlay`` + ``GnnweaveAccel``) when pynq is importable (or ``use_pynq``), else
    :class:`SimAccel`. The simulated memory costs nothing until touched (zero pages), so
    the default is large."""
    from gnnweave.sim.simdevice import SimDevice, write_overlay
    device = SimDevice(mem_size, latency=latency, config=config)
    pynq = _pynq()
    if use_pynq is None:
        use_pynq = pynq is not None
    if use_pynq:
        if pynq is None:
            raise DriverError("use_pynq=True but pynq is not installed")
        tmp = tempfile.TemporaryDirectory(prefix="gnnweave-overlay-")
        bit = write_overlay(tmp.name, config=config)
        overlay = pynq.Overlay(str(bit), device=device)
        accel = getattr(overlay, INSTANCE_NAME)
        return accel, device, _SimOwner(device, tmp)
    return SimAccel(device), device, _SimOwner(device)


def open_executor(kind: str, name: str | None = None, **kw):
    """An executor on the accelerator: ``fpga-sim`` (simulated device; options ``config``,
    ``latency``, ``mem_size``, ``use_pynq``, ``timeout_s``, ``dense``) or ``fpga`` (a PYNQ
    board; ``bitstream`` or ``$GNNWEAVE_BITSTREAM``, ``timeout_s``, ``dense``)."""
    ex = _executors()
    cls = _make_executor_class()
    timeout_s = kw.pop("timeout_s", 600.0)
    dense = kw.pop("dense", "device")

    def unavailable(reason: str):
        # the user asked for a device that is not there: say what is
        return ex.DeviceUnavailable(f"{reason}; available: {', '.join(ex.available_devices())}")

    if kind == "fpga-sim":
        problem = _native_toolchain_problem()
        if problem:
            raise unavailable(f"no fpga-sim device: {problem}")
        accel, _device, owner = open_sim_accel(**kw)
        return cls(accel, kind, name, timeout_s=timeout_s, owner=owner, dense=dense,
                   config=kw.get("config", "small"))
    if kind == "fpga":
        pynq = _pynq()
        if pynq is None:
            raise unavailable("no fpga device: pynq is not installed (pip install pynq)")
        bit = kw.pop("bitstream", None) or os.environ.get("GNNWEAVE_BITSTREAM")
        if not bit or not Path(bit).is_file():
            raise unavailable(
                f"no fpga device: give bitstream=<path to .bit> or set GNNWEAVE_BITSTREAM "
                f"(got {bit!r})")
        overlay = pynq.Overlay(str(bit))
        accels = [getattr(overlay, n) for n, d in overlay.ip_dict.items()
                  if d.get("type") == VLNV]
        if not accels:
            raise unavailable(f"no fpga device: {bit} has no IP with VLNV {VLNV}")
        return cls(accels[0], kind, name, timeout_s=timeout_s, dense=dense)
    raise ex.DeviceUnavailable(f"unknown accelerator kind {kind!r}: choose fpga-sim or fpga")
