"""The RTL rounding shift equals gnnweave.fixed bit for bit, with its mask and half built
inline or held in registers (as the Aggregator's output stage holds them for a run)."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.sim import Simulator

from gnnweave.fixed import shift_round_half_even
from gnnweave.hw.arith import round_half_even_shift, rounding_constants

WIDTH = 48


class RoundingShift(Elaboratable):
    def __init__(self, constant_shift: int = 0):
        self.value, self.shift = Signal(signed(WIDTH)), Signal(6)
        self.inline, self.registered = Signal(signed(WIDTH + 1)), Signal(signed(WIDTH + 1))
        self.constant_shift, self.constant = constant_shift, Signal(signed(WIDTH + 1))

    def elaborate(self, platform):
        m = Module()
        mask, half = Signal(WIDTH), Signal(WIDTH)
        mask_now, half_now = rounding_constants(self.shift, WIDTH)
        m.d.sync += [mask.eq(mask_now), half.eq(half_now)]
        m.d.comb += [self.inline.eq(round_half_even_shift(self.value, self.shift)),
                     self.registered.eq(round_half_even_shift(self.value, self.shift,
                                                              (mask, half))),
                     self.constant.eq(round_half_even_shift(self.value, self.constant_shift))]
        return m


def _values(shift):
    rng = np.random.default_rng(shift)
    lo = (1 << shift) >> 1 if shift else 0
    # exact halves with an odd and an even kept part, and their neighbours
    ties = [lo, 3 * lo, -lo, -3 * lo, lo + 1, lo - 1] if 0 < shift < WIDTH - 2 else []
    return [*map(int, rng.integers(-(1 << (WIDTH - 1)), 1 << (WIDTH - 1), size=24)), *ties,
            0, -1, 1, (1 << (WIDTH - 1)) - 1, -(1 << (WIDTH - 1))]


def test_rounding_shift_matches_fixed_for_every_shift():
    # shifts past the value's width included: the quotient rounds to 0 there
    dut = RoundingShift()
    seen = []

    async def bench(ctx):
        for shift in range(64):
            ctx.set(dut.shift, shift)
            await ctx.tick()                      # the registered constants follow the shift
            for v in _values(shift):
                ctx.set(dut.value, v)
                want = int(shift_round_half_even(np.array([v]), shift)[0])
                got_inline, got_registered = ctx.get(dut.inline), ctx.get(dut.registered)
                assert got_inline == want, (v, shift, got_inline, want)
                assert got_registered == want, (v, shift, got_registered, want)
                seen.append(shift)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert set(seen) == set(range(64))


@pytest.mark.parametrize("shift", [0, 1, 14, WIDTH - 1, WIDTH, WIDTH + 2, 63])
def test_constant_rounding_shift_matches_fixed(shift):
    dut = RoundingShift(constant_shift=shift)
    checked = []

    async def bench(ctx):
        for v in _values(shift):
            ctx.set(dut.value, v)
            want = int(shift_round_half_even(np.array([v]), shift)[0])
            assert ctx.get(dut.constant) == want, (v, shift, ctx.get(dut.constant), want)
            checked.append(v)

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()
    assert len(checked) >= 29
