"""Fixed-point arithmetic building blocks, mirroring :mod:`gnnweave.fixed` bit for bit."""
from __future__ import annotations

from amaranth.hdl import Const, Mux, Value, signed, unsigned


def round_half_even_shift(value: Value, shift: Value | int) -> Value:
    """``value / 2**shift`` rounded half to even (``gnnweave.fixed.shift_round_half_even``).

    ``value`` is signed; ``shift`` may be a constant or an unsigned signal. The result is
    one bit wider than ``value`` (the round-up of the largest value).
    """
    width = len(value)
    value = value.as_signed()
    kept = value >> shift                       # arithmetic: floor division by 2**shift
    if isinstance(shift, int):
        if shift == 0:
            return kept.as_signed()
        dropped = value.as_unsigned()[:shift]
        half = Const(1 << (shift - 1), shift)
        round_up = (dropped > half) | ((dropped == half) & kept[0])
    else:
        one = Const(1, unsigned(width + 1))
        mask = ((one << shift) - 1)[:width]
        dropped = value.as_unsigned() & mask
        half = ((one << shift) >> 1)[:width]
        round_up = (shift != 0) & ((dropped > half) | ((dropped == half) & kept[0]))
    return (kept + round_up).as_signed()


def saturate(value: Value, width: int) -> tuple[Value, Value]:
    """Clamp a signed value into ``width`` bits: returns (clamped, saturated flag)."""
    lo = -(1 << (width - 1))
    hi = (1 << (width - 1)) - 1
    value = value.as_signed()
    too_big = value > hi
    too_small = value < lo
    clamped = Mux(too_big, Const(hi, signed(width)),
                  Mux(too_small, Const(lo, signed(width)), value[:width].as_signed()))
    return clamped, too_big | too_small
