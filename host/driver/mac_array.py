"""The MacArray's protocol: one fixed-point matrix product (fwd, dx, dw)."""
from __future__ import annotations

import numpy as np

from gnnweave import contract
from gnnweave.contract import Limits, Unit
from gnnweave.golden.mac import MacMode
from gnnweave.host.driver.errors import DriverError
from gnnweave.host.driver.io import beat_elements, buffer_address, flush, free, invalidate
from gnnweave.host.driver.validate import check_int, check_shift, check_timeout, elements, wide

MAC_CONFIG = contract.names(contract.MAC_ARRAY_CONFIG_REGISTERS)
MAC_COUNTERS = tuple(n for n in contract.names(contract.MAC_ARRAY_STATUS_REGISTERS)
                     if n != contract.STATUS_REGISTER)
#: ``mode`` register values by name.
MAC_MODES = {m.name.lower(): int(m) for m in MacMode}
#: What P and Q hold in each mode, for error messages.
_SHAPES = {"fwd": "fwd: p [m, k] and q [k, n]", "dx": "dx: p = dY [m, k] and q = W [n, k]",
           "dw": "dw: p = X [k, m] and q = dY [k, n]"}


def _dims(mode: str, p_shape, q_shape) -> tuple[int, int, int, int]:
    """``(m, n, k, k of q)`` of the operands' forward layouts."""
    if mode == "fwd":
        (m, k), (k2, n) = p_shape, q_shape
    elif mode == "dx":
        (m, k), (n, k2) = p_shape, q_shape
    else:
        (k, m), (k2, n) = p_shape, q_shape
    return m, n, k, k2


class MacArrayProtocol:
    """:meth:`mac` on an :class:`~.core.AccelCore`."""

    def _setup_mac_array(self):
        #: The build has a MacArray (its registers are described and ``units_present`` says so).
        self.has_mac = self._has_unit(Unit.MAC_ARRAY) and \
            not self.registers.missing(MAC_CONFIG + MAC_COUNTERS)
        #: The MacArray's depth block (0: no MacArray): a deeper ``k`` is split on chip into
        #: blocks of this depth, summed exactly (one more P load per block).
        self.mac_max_depth = self.parameters.mac_max_depth if self.has_mac else 0

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
        timeout_s = check_timeout(timeout_s, self.default_timeout_s)
        key = str(mode).lower() if not isinstance(mode, (int, np.integer)) else \
            {v: k for k, v in MAC_MODES.items()}.get(int(mode), str(mode))
        if key not in MAC_MODES:
            raise ValueError(f"mode {mode!r}: choose one of {', '.join(MAC_MODES)}")
        a, b = elements(p, "p"), elements(q, "q")
        m, n, k, k2 = _dims(key, a.shape, b.shape)
        what = _SHAPES[key]
        if k != k2:
            raise ValueError(f"{what}: depths differ (p {a.shape}, q {b.shape})")
        if not (m and n and k):
            raise ValueError(f"{what}: empty operand (p {a.shape}, q {b.shape})")
        if max(m, n, k) > Limits.INDEX_MAX:
            raise ValueError(f"{what}: m={m}, n={n}, k={k}: each must be below 2**32")
        shift = check_shift(shift)
        bias_shift = check_int(bias_shift, "bias_shift", 0, Limits.BIAS_SHIFT_MAX)
        if key != "fwd" and (bias is not None or relu):
            raise ValueError(f"bias and relu apply to fwd only (mode {key}); mask dY on the host")
        bias_arr = None
        if bias is not None:
            bias_arr = wide(bias, "bias", ndim=1)
            if bias_arr.shape[0] != n:
                raise ValueError(f"bias: {bias_arr.shape[0]} values, the output has n={n} columns")
        self._check_idle()
        beat = self.bus_bytes
        bufs = {}
        try:
            for name, mat in (("p", a), ("q", b)):
                buf = self.io.allocate((mat.shape[0], beat_elements(mat.shape[1], 2, beat)), np.int16)
                buf[:, :mat.shape[1]] = mat
                buf[:, mat.shape[1]:] = 0
                bufs[name] = buf
            bufs["out"] = self.io.allocate((m, beat_elements(n, 2, beat)), np.int16)
            bufs["out"][:] = 0
            if bias_arr is not None:
                bufs["bias"] = self.io.allocate((beat_elements(n, 4, beat),), np.int32)
                bufs["bias"][:n] = bias_arr
                bufs["bias"][n:] = 0
            for buf in bufs.values():
                flush(buf)
            regs = {"mode": MAC_MODES[key], "m": m, "n": n, "k": k, "shift": shift,
                    "relu": int(bool(relu)), "use_bias": int(bias_arr is not None),
                    "bias_shift": bias_shift, "bias_addr": 0, "bias_size": 0}
            for name, buf in bufs.items():
                regs[f"{name}_addr"] = buffer_address(buf)
                regs[f"{name}_size"] = buf.nbytes
                if name != "bias":
                    regs[f"{name}_stride"] = buf.strides[0]
            counters = self._run(Unit.MAC_ARRAY, MAC_CONFIG, regs, MAC_COUNTERS, timeout_s,
                                 f"mode {key}, m={m}, n={n}, k={k}")
            invalidate(bufs["out"])
            return np.array(bufs["out"][:, :n], dtype=np.int64), counters
        finally:
            for buf in bufs.values():
                free(buf)
