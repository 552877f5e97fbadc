"""The fixed-point number formats: one specification for the golden models and the RTL.

Every tensor that crosses into hardware is a signed two's-complement integer of
``width`` bits that stands for ``value / 2**frac`` (dynamic fixed point: the host
picks ``frac`` per tensor from its range with :func:`choose_frac`). Narrowing (a
right shift that drops fractional bits) rounds half to even, and results that do
not fit the narrower width saturate instead of wrapping; every saturation is
counted. The Amaranth generators read their widths from these objects and the
golden models compute with them, so a format change reaches both sides at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Bits added to a product's width so that a sum of up to 2**32 products cannot
#: overflow (edge counters are 32-bit): the accumulator never needs saturation.
ACC_GUARD_BITS = 32

#: Fractional bits of the reciprocal ``round(2**MEAN_RECIP_BITS / degree)`` used by
#: the ``mean`` reduction (a multiply instead of a divide per lane).
MEAN_RECIP_BITS = 24

#: Width of the intermediate sum the ``mean`` reduction multiplies by the reciprocal.
MEAN_SUM_WIDTH = 32


@dataclass(frozen=True)
class FixedFormat:
    """Signed fixed point: ``width`` bits in total, ``frac`` of them fractional."""

    width: int = 16
    frac: int = 8

    def __post_init__(self):
        if not 2 <= self.width <= 32:
            raise ValueError(f"FixedFormat.width must be in 2..32, got {self.width}")
        if not -64 <= self.frac <= 64:
            raise ValueError(f"FixedFormat.frac must be in -64..64, got {self.frac}")

    @property
    def min_int(self) -> int:
        return -(1 << (self.width - 1))

    @property
    def max_int(self) -> int:
        return (1 << (self.width - 1)) - 1

    @property
    def lsb(self) -> float:
        """Value of one unit in the last place."""
        return 2.0 ** -self.frac

    @property
    def max_value(self) -> float:
        return self.max_int * self.lsb

    @property
    def min_value(self) -> float:
        return self.min_int * self.lsb

    @property
    def dtype(self):
        """Smallest numpy integer type that holds the format."""
        return np.int16 if self.width <= 16 else np.int32

    def with_frac(self, frac: int) -> "FixedFormat":
        return FixedFormat(self.width, frac)

    def quantize(self, x) -> tuple[np.ndarray, int]:
        """Float array -> (integers in this format, number of saturated elements).

        Rounds half to even (numpy's ``rint``); NaN is refused, infinities saturate.
        """
        x = np.asarray(x, dtype=np.float64)
        if np.isnan(x).any():
            index = tuple(int(i) for i in np.argwhere(np.isnan(x))[0])
            raise ValueError(f"cannot quantize NaN (first at index {index})")
        scaled = np.rint(np.ldexp(x, self.frac))
        clipped = np.clip(scaled, self.min_int, self.max_int)
        saturated = int(np.count_nonzero(clipped != scaled))
        return clipped.astype(self.dtype), saturated

    def to_float(self, q) -> np.ndarray:
        return np.ldexp(np.asarray(q, dtype=np.float64), -self.frac)

    def saturate(self, a) -> tuple[np.ndarray, np.ndarray]:
        """Clamp int64 values into this width; returns (values, saturated mask)."""
        a = np.asarray(a, dtype=np.int64)
        clipped = np.clip(a, self.min_int, self.max_int)
        return clipped, clipped != a


def shift_round_half_even(a, shift: int) -> np.ndarray:
    """``a / 2**shift`` rounded half to even, for int64 arrays and ``shift >= 0``.

    This is exactly what the RTL narrowing stage computes: floor-shift, then add one
    when the dropped bits are above one half, or exactly one half and the kept value
    is odd.
    """
    a = np.asarray(a, dtype=np.int64)
    if shift < 0:
        raise ValueError(f"shift must be >= 0, got {shift}")
    if shift == 0:
        return a.copy()
    kept = a >> shift  # arithmetic shift: floor division
    dropped = a & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    round_up = (dropped > half) | ((dropped == half) & ((kept & 1) == 1))
    return kept + round_up


def narrow(a, shift: int, fmt: FixedFormat) -> tuple[np.ndarray, np.ndarray]:
    """Round half to even by ``shift`` bits, then saturate into ``fmt``.

    Returns (values as int64, saturated mask).
    """
    return fmt.saturate(shift_round_half_even(a, shift))


def accumulator_width(input_width: int, weight_width: int) -> int:
    """Accumulator width that a sum of up to 2**ACC_GUARD_BITS products never overflows."""
    return input_width + weight_width + ACC_GUARD_BITS


def mean_reciprocal(degree) -> np.ndarray:
    """``round(2**MEAN_RECIP_BITS / degree)`` (half rounds up) for ``degree >= 1``; 0 for 0."""
    d = np.asarray(degree, dtype=np.int64)
    safe = np.maximum(d, 1)
    recip = ((1 << MEAN_RECIP_BITS) + (safe >> 1)) // safe
    return np.where(d > 0, recip, 0)


def choose_frac(x, width: int, *, headroom_bits: int = 0) -> int:
    """Largest ``frac`` such that ``max |x|`` fits ``width`` bits (dynamic fixed point).

    ``headroom_bits`` keeps that many spare integer bits for values that will grow
    (for example sums of many terms).
    """
    x = np.asarray(x, dtype=np.float64)
    if x.size and not np.isfinite(x).all():
        raise ValueError("cannot choose a fixed-point format for non-finite values")
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak == 0.0:
        return width - 1 - headroom_bits
    # integer bits needed for the peak (plus sign), the rest are fractional
    int_bits = int(np.floor(np.log2(peak))) + 1
    frac = width - 1 - int_bits - headroom_bits
    fmt = FixedFormat(width, max(-64, min(frac, 64)))
    # rounding can push the peak one unit past max_int: give one bit back then
    if np.rint(peak * 2.0 ** (frac + headroom_bits)) > fmt.max_int:
        frac -= 1
    if frac > 64:
        raise ValueError(f"values too small for a fixed-point format (max |x| = {peak:g})")
    return frac
