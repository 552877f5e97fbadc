"""A bit-serial multiplier for configuration arithmetic: one adder, one multiplier bit per
cycle, no DSP. A unit computes its run's sizes and limits with it in its CHECK state
(tens of cycles once per run) instead of with wide multipliers evaluated every cycle."""
from __future__ import annotations

from amaranth.hdl import Elaboratable, Module, Signal


class SerialMultiplier(Elaboratable):
    """``product = a * b`` (unsigned), ``b_width`` cycles after ``start``.

    ``start`` (one cycle) samples ``a`` and ``b``; ``done`` is high from the cycle the
    product is complete until the next ``start``. ``product`` is ``a_width + b_width``
    bits and holds its value until then.
    """

    def __init__(self, a_width: int, b_width: int):
        if a_width < 1 or b_width < 1:
            raise ValueError(f"SerialMultiplier widths must be >= 1, got {a_width} x {b_width}")
        self.a_width, self.b_width = a_width, b_width
        self.start = Signal()
        self.a = Signal(a_width)
        self.b = Signal(b_width)
        self.product = Signal(a_width + b_width)
        self.done = Signal()

    def elaborate(self, platform):
        m = Module()
        shifted = Signal(self.a_width + self.b_width, reset_less=True)   # a << bit
        rest = Signal(self.b_width, reset_less=True)                      # b >> bit
        left = Signal(range(self.b_width + 1))
        # steps remain: a flip-flop decided a step ahead (it enables every register here,
        # so no compare of the count sits in front of them)
        running = Signal()
        m.d.comb += self.done.eq(~running)
        with m.If(self.start):
            m.d.sync += [shifted.eq(self.a), rest.eq(self.b), left.eq(self.b_width),
                         running.eq(1), self.product.eq(0)]
        with m.Elif(running):
            m.d.sync += [shifted.eq(shifted << 1), rest.eq(rest >> 1), left.eq(left - 1),
                         running.eq(left != 1)]
            with m.If(rest[0]):
                m.d.sync += self.product.eq(self.product + shifted)
        return m
