"""Bit-exact model of the MacArray (three GEMM modes) and of the on-chip SGD update.

The MacArray multiplies signed integers of at most :data:`MAC_INPUT_WIDTH` bits. This
module is the specification of what the RTL computes:

* Every product is exact; every sum over the depth (the contracted index) is exact
  (int64 here; in the RTL an accumulator wide enough for the configured maximum depth,
  see :func:`mac_accumulator_width`, so it can never overflow).
* The exact sum is narrowed once: ``narrow(acc, shift, FixedFormat(out_width, 0))``
  (round half to even, then saturate; every saturated element is counted once).

Modes (the register encoding is :class:`MacMode`):

``FWD``  ``Y = X W (+ b)``: ``X [M, K]``, ``W [K, N]``, optional bias ``b [N]``. The bias
         is aligned into the product's fraction by a left shift of ``bias_shift`` bits
         (``bias_shift = x.frac + w.frac - b.frac``) and added to the exact sum before
         narrowing. With ``relu`` the narrowed pre-activation ``z`` gives
         ``relu_mask = z > 0`` and the output ``where(relu_mask, z, 0)``. The mask is
         taken after narrowing so that it equals ``Y > 0``: the backward pass can rebuild
         it from the stored activation and the hardware needs no separate mask buffer.
``DX``   ``dX = (dY * mask) W^T``: ``dY [M, N]``, ``W [K, N]`` (the same weight layout as
         ``FWD``; the transpose happens on chip), ``mask [M, N]`` zeroes the gradient of
         the elements a fused ReLU clamped.
``DW``   ``dW = X^T (dY * mask)``: ``X [M, K]``, ``dY [M, N]``, summed over the ``M`` rows of
         a microbatch.

``shift`` is ``frac(a) + frac(b) - frac(out)`` of the two operands of the mode; it must
be ``>= 0`` (a left-shifting narrowing would be pointless in hardware).

SGD (:func:`sgd_update`) keeps master weights wider than the MAC inputs (``SgdFormat``),
mirrors ``torch.optim.SGD`` (``d = g + wd * w; buf = mu * buf + d; w -= lr * buf``) with
every multiply exact and every narrowing round-half-even + saturate.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from gnnweave.enums import parse_enum
from gnnweave.fixed import FixedFormat, narrow, shift_round_half_even

#: Widest operand the MAC cells take (one DSP multiply per cell per cycle).
MAC_INPUT_WIDTH = 16


class MacMode(enum.IntEnum):
    """MacArray operation; the values are the register encoding (``hw.mac.MacMode``)."""

    FWD = 0
    DX = 1
    DW = 2

    @classmethod
    def parse(cls, value) -> "MacMode":
        return parse_enum(cls, value, "MAC mode")


@dataclass
class MacResult:
    out: np.ndarray                       # int64, values in FixedFormat(out_width, shift-adjusted)
    saturations: int                      # output elements whose narrowing saturated
    relu_mask: np.ndarray | None = None   # FWD with relu: narrowed pre-activation > 0


def mac_accumulator_width(max_depth: int, in_width: int = MAC_INPUT_WIDTH,
                          bias_width: int = 32) -> int:
    """Accumulator bits so that ``max_depth`` products plus an aligned bias never overflow.

    A product of two ``in_width``-bit signed numbers needs ``2 * in_width - 1`` bits
    (``(-2**(w-1))**2`` is the only case needing the top bit); ``max_depth`` of them add
    ``ceil(log2(max_depth))`` bits, the aligned bias one more.
    """
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return max(2 * in_width + (max_depth - 1).bit_length() + 1, bias_width + 1)


def _as_int_matrix(name: str, a, width: int = MAC_INPUT_WIDTH, ndim: int = 2) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError(f"{name} must hold integers (quantise it first)")
    arr = arr.astype(np.int64)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    bad = np.argwhere((arr < lo) | (arr > hi))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise ValueError(f"{name}{list(idx)} = {arr[idx]} does not fit {width} signed bits")
    return arr


def _check_shift(shift: int, out_width: int):
    if int(shift) != shift or shift < 0:
        raise ValueError(f"shift must be an integer >= 0, got {shift}")
    if not 2 <= out_width <= 32:
        raise ValueError(f"out_width must be in 2..32, got {out_width}")


def _mask(name: str, relu_mask, shape) -> np.ndarray | None:
    if relu_mask is None:
        return None
    m = np.asarray(relu_mask)
    if m.shape != tuple(shape):
        raise ValueError(f"relu_mask: shape {m.shape}, expected {tuple(shape)} (the shape of {name})")
    return m.astype(bool)


def mac_forward(x_q, w_q, b_q=None, *, shift: int, out_width: int = 16, relu: bool = False,
                bias_shift: int = 0, bias_width: int = 32) -> MacResult:
    """``Y = narrow(X W + (b << bias_shift), shift)``, optionally ReLU (see module doc)."""
    _check_shift(shift, out_width)
    x = _as_int_matrix("x_q", x_q)
    w = _as_int_matrix("w_q", w_q)
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x_q has {x.shape[1]} columns but w_q has {w.shape[0]} rows")
    acc = x @ w
    if b_q is not None:
        b = _as_int_matrix("b_q", b_q, width=bias_width, ndim=1)
        if b.shape[0] != w.shape[1]:
            raise ValueError(f"b_q has {b.shape[0]} entries, w_q has {w.shape[1]} columns")
        if bias_shift < 0:
            raise ValueError(f"bias_shift must be >= 0, got {bias_shift}")
        acc = acc + (b << bias_shift)[None, :]
    z, saturated = narrow(acc, shift, FixedFormat(out_width, 0))
    if not relu:
        return MacResult(z, int(np.count_nonzero(saturated)))
    mask = z > 0
    return MacResult(np.where(mask, z, 0), int(np.count_nonzero(saturated)), mask)


def mac_input_grad(dy_q, w_q, *, shift: int, out_width: int = 16, relu_mask=None) -> MacResult:
    """``dX = narrow((dY * mask) W^T, shift)`` with ``W [K, N]`` in the forward layout."""
    _check_shift(shift, out_width)
    dy = _as_int_matrix("dy_q", dy_q)
    w = _as_int_matrix("w_q", w_q)
    if dy.shape[1] != w.shape[1]:
        raise ValueError(f"dy_q has {dy.shape[1]} columns but w_q has {w.shape[1]} columns")
    mask = _mask("dy_q", relu_mask, dy.shape)
    if mask is not None:
        dy = np.where(mask, dy, 0)
    out, saturated = narrow(dy @ w.T, shift, FixedFormat(out_width, 0))
    return MacResult(out, int(np.count_nonzero(saturated)))


def mac_weight_grad(x_q, dy_q, *, shift: int, out_width: int = 16, relu_mask=None) -> MacResult:
    """``dW = narrow(X^T (dY * mask), shift)``, summed over the microbatch rows."""
    _check_shift(shift, out_width)
    x = _as_int_matrix("x_q", x_q)
    dy = _as_int_matrix("dy_q", dy_q)
    if x.shape[0] != dy.shape[0]:
        raise ValueError(f"x_q has {x.shape[0]} rows but dy_q has {dy.shape[0]} rows")
    mask = _mask("dy_q", relu_mask, dy.shape)
    if mask is not None:
        dy = np.where(mask, dy, 0)
    out, saturated = narrow(x.T @ dy, shift, FixedFormat(out_width, 0))
    return MacResult(out, int(np.count_nonzero(saturated)))


def mac(mode, a_q, b_q, *, shift: int, out_width: int = 16, relu: bool = False,
        relu_mask=None, bias_q=None, bias_shift: int = 0) -> MacResult:
    """Dispatch on :class:`MacMode` with the operand order the hardware reads them in:
    FWD ``(X, W)``, DX ``(dY, W)``, DW ``(X, dY)``."""
    mode = MacMode.parse(mode)
    if mode is MacMode.FWD:
        return mac_forward(a_q, b_q, bias_q, shift=shift, out_width=out_width, relu=relu,
                           bias_shift=bias_shift)
    if mode is MacMode.DX:
        return mac_input_grad(a_q, b_q, shift=shift, out_width=out_width, relu_mask=relu_mask)
    return mac_weight_grad(a_q, b_q, shift=shift, out_width=out_width, relu_mask=relu_mask)


# ---------------------------------------------------------------- float references

def mac_forward_float(x, w, b=None, *, relu: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Float64 ``X W + b`` (ReLU optional); returns (output, mask or None)."""
    z = np.asarray(x, dtype=np.float64) @ np.asarray(w, dtype=np.float64)
    if b is not None:
        z = z + np.asarray(b, dtype=np.float64)[None, :]
    if not relu:
        return z, None
    mask = z > 0
    return np.where(mask, z, 0.0), mask


def mac_input_grad_float(dy, w, *, relu_mask=None) -> np.ndarray:
    dy = np.asarray(dy, dtype=np.float64)
    if relu_mask is not None:
        dy = np.where(relu_mask, dy, 0.0)
    return dy @ np.asarray(w, dtype=np.float64).T


def mac_weight_grad_float(x, dy, *, relu_mask=None) -> np.ndarray:
    dy = np.asarray(dy, dtype=np.float64)
    if relu_mask is not None:
        dy = np.where(relu_mask, dy, 0.0)
    return np.asarray(x, dtype=np.float64).T @ dy


# ---------------------------------------------------------------- SGD with master weights

@dataclass(frozen=True)
class SgdFormat:
    """Fixed-point formats of the on-chip SGD update.

    ``master``: the weights the optimiser owns (wider than the MAC input ``weight``);
    ``momentum``: the velocity buffer, in the master's fraction; ``grad``: the incoming
    weight gradient: the sum of the ``DW`` outputs of the microbatches of a step (each
    ``DW`` output is 16 bits with ``grad.frac`` fractional bits; 32 bits hold the exact sum
    of up to 65536 of them, so accumulation order never matters); ``lr`` / ``wd`` / ``mu``: unsigned-valued
    hyper-parameters (learning rate, weight decay, momentum) as fixed-point registers.
    The MAC input weight is ``narrow(master, master.frac - weight.frac, weight)``.
    """

    master: FixedFormat = FixedFormat(32, 24)
    weight: FixedFormat = FixedFormat(16, 12)
    grad: FixedFormat = FixedFormat(32, 12)
    lr: FixedFormat = FixedFormat(16, 16)
    wd: FixedFormat = FixedFormat(16, 20)
    mu: FixedFormat = FixedFormat(16, 15)
    momentum: FixedFormat | None = None   # default: same as master

    def __post_init__(self):
        if self.weight.width > MAC_INPUT_WIDTH:
            raise ValueError(f"SgdFormat.weight is a MAC input: at most {MAC_INPUT_WIDTH} bits")
        if self.master.frac < self.weight.frac:
            raise ValueError("SgdFormat.master must have at least as many fractional bits as weight")
        if self.master.frac < self.grad.frac:
            raise ValueError("SgdFormat.master must have at least as many fractional bits as grad")
        for name in ("lr", "wd", "mu"):
            f = getattr(self, name)
            if f.frac < 0:
                raise ValueError(f"SgdFormat.{name}.frac must be >= 0")
        if self.momentum is not None and self.momentum.frac != self.master.frac:
            raise ValueError("SgdFormat.momentum must have the master's fractional bits")

    @property
    def velocity(self) -> FixedFormat:
        return self.momentum if self.momentum is not None else self.master

    @property
    def grad_align(self) -> int:
        """Left shift that puts a gradient into the master's fraction."""
        return self.master.frac - self.grad.frac

    @property
    def weight_shift(self) -> int:
        """Right shift (round half even, saturate) from master to MAC weight."""
        return self.master.frac - self.weight.frac

    def quantize_hyper(self, lr: float, wd: float = 0.0, mu: float = 0.0) -> tuple[int, int, int]:
        """Float hyper-parameters -> register integers (refuses values that saturate)."""
        out = []
        for name, fmt, value in (("lr", self.lr, lr), ("wd", self.wd, wd), ("mu", self.mu, mu)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
            q, sat = fmt.quantize(value)
            if sat:
                raise ValueError(f"{name}={value} does not fit {fmt} (max {fmt.max_value})")
            out.append(int(q))
        return tuple(out)


@dataclass
class SgdResult:
    master: np.ndarray       # int64, new master weights (SgdFormat.master)
    weight: np.ndarray       # int64, the narrowed MAC weights (SgdFormat.weight)
    velocity: np.ndarray | None  # int64, new momentum buffer (None without momentum)
    saturations: int         # elements whose master, velocity or weight narrowing saturated


def master_to_weight(master_q, fmt: SgdFormat = SgdFormat()) -> tuple[np.ndarray, int]:
    """Narrow master weights into the MAC weight format; returns (weights, saturations)."""
    w, sat = narrow(np.asarray(master_q, dtype=np.int64), fmt.weight_shift, fmt.weight)
    return w, int(np.count_nonzero(sat))


def sgd_update(w_master_q, grad_q, *, lr_q: int, wd_q: int = 0, mu_q: int = 0,
               velocity_q=None, fmt: SgdFormat = SgdFormat()) -> SgdResult:
    """One SGD step on master weights, bit-exact with the on-chip update unit.

    Per element, with ``m = fmt.master.frac``::

        g   = grad << (m - grad.frac)                       (exact)
        d   = g + rhe(wd * w, wd.frac)                      (decay, exact add)
        buf = sat_velocity(rhe(mu * buf_old, mu.frac) + d)  if momentum (mu_q or velocity given)
            = d                                             otherwise
        w'  = sat_master(w - rhe(lr * buf, lr.frac))

    ``rhe`` = round half to even; ``sat`` = saturate (counted). Without momentum the
    buffer is not stored (``velocity`` is None in the result).
    """
    w = np.asarray(w_master_q, dtype=np.int64)
    g = np.asarray(grad_q, dtype=np.int64)
    if w.shape != g.shape:
        raise ValueError(f"grad_q: shape {g.shape}, expected the weights' shape {w.shape}")
    for name, value, f in (("lr_q", lr_q, fmt.lr), ("wd_q", wd_q, fmt.wd), ("mu_q", mu_q, fmt.mu)):
        if not 0 <= int(value) <= f.max_int:
            raise ValueError(f"{name}={value} outside 0..{f.max_int} ({f})")
    _as_int_matrix("w_master_q", w.reshape(-1), width=fmt.master.width, ndim=1)
    _as_int_matrix("grad_q", g.reshape(-1), width=fmt.grad.width, ndim=1)
    d = (g << fmt.grad_align) + shift_round_half_even(int(wd_q) * w, fmt.wd.frac)
    saturated = np.zeros(w.shape, dtype=bool)
    use_momentum = velocity_q is not None or int(mu_q) != 0
    velocity = None
    if use_momentum:
        v_old = np.zeros_like(w) if velocity_q is None else np.asarray(velocity_q, dtype=np.int64)
        if v_old.shape != w.shape:
            raise ValueError(f"velocity_q: shape {v_old.shape}, expected {w.shape}")
        velocity, vsat = fmt.velocity.saturate(
            shift_round_half_even(int(mu_q) * v_old, fmt.mu.frac) + d)
        saturated |= vsat
        step_src = velocity
    else:
        step_src = d
    master, msat = fmt.master.saturate(w - shift_round_half_even(int(lr_q) * step_src, fmt.lr.frac))
    saturated |= msat
    weight, wsat = narrow(master, fmt.weight_shift, fmt.weight)
    saturated |= wsat
    return SgdResult(master, weight, velocity, int(np.count_nonzero(saturated)))


def sgd_update_float(w, grad, *, lr: float, wd: float = 0.0, mu: float = 0.0,
                     velocity=None) -> tuple[np.ndarray, np.ndarray | None]:
    """Float64 ``torch.optim.SGD`` step (no dampening, no Nesterov)."""
    w = np.asarray(w, dtype=np.float64)
    d = np.asarray(grad, dtype=np.float64) + wd * w
    if velocity is None and mu == 0.0:
        return w - lr * d, None
    v = d if velocity is None else mu * np.asarray(velocity, dtype=np.float64) + d
    return w - lr * v, v
