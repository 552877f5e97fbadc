"""Fixed-point arithmetic building blocks, mirroring :mod:`gnnweave.fixed` bit for bit."""
from __future__ import annotations

from amaranth.hdl import Const, Mux, Value, signed, unsigned


def rounding_constants(shift: Value, width: int) -> tuple[Value, Value]:
    """``(mask, half)`` that :func:`round_half_even_shift` compares the dropped bits of a
    ``width``-bit value with: they depend on ``shift`` only, so a caller whose shift is
    fixed for a whole run registers them once instead of rebuilding a wide ``1 << shift``
    in every lane on every cycle (on the Aggregator's critical path)."""
    one = Const(1, unsigned(width + 1))
    return ((one << shift) - 1)[:width], ((one << shift) >> 1)[:width]


def round_half_even_shift(value: Value, shift: Value | int, constants=None) -> Value:
    """``value / 2**shift`` rounded half to even (``gnnweave.fixed.shift_round_half_even``).

    ``value`` is signed; ``shift`` may be a constant or an unsigned signal. The result is
    one bit wider than ``value`` (the round-up of the largest value). ``constants``: the
    ``(mask, half)`` of :func:`rounding_constants` for this ``shift`` and ``len(value)``,
    when the caller holds them in registers.
    """
    width = len(value)
    value = value.as_signed()
    kept = value >> shift                       # arithmetic: floor division by 2**shift
    if isinstance(shift, int):
        if shift == 0:
            return kept.as_signed()
        if shift >= width:                      # |value / 2**shift| <= 1/2: rounds to 0
            return Const(0, signed(width + 1))
        dropped = value.as_unsigned()[:shift]
        half = Const(1 << (shift - 1), shift)
        round_up = (dropped > half) | ((dropped == half) & kept[0])
    else:
        mask, half = constants if constants is not None else rounding_constants(shift, width)
        dropped = value.as_unsigned() & mask
        round_up = (shift != 0) & ((dropped > half) | ((dropped == half) & kept[0]))
        # |value| <= 2**(width-1) <= 2**(shift-1): the quotient rounds to 0 (the mask and
        # half above are cut to `width` bits and would round a positive value up to 1)
        return Mux(shift >= width, 0, kept + round_up).as_signed()
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
