"""The bit-serial multiplier the Pipeline unit's CHECK state sizes its run with, in the
Amaranth simulator against Python's product: random and extreme operands, back-to-back
starts (a new start abandons nothing it should keep), done exactly b_width cycles later."""
from __future__ import annotations

import random

import pytest
from amaranth.sim import Simulator

from gnnweave.hw.serial_multiply import SerialMultiplier


@pytest.mark.parametrize("a_width,b_width", [(64, 37), (16, 8), (1, 1)])
def test_products_match_python(a_width, b_width):
    rng = random.Random(a_width * 100 + b_width)
    cases = [((1 << a_width) - 1, (1 << b_width) - 1), (0, (1 << b_width) - 1), ((1 << a_width) - 1, 0)]
    cases += [(rng.getrandbits(a_width), rng.getrandbits(b_width)) for _ in range(20)]
    dut = SerialMultiplier(a_width, b_width)

    async def bench(ctx):
        for a, b in cases:
            ctx.set(dut.a, a)
            ctx.set(dut.b, b)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            ctx.set(dut.a, 0)           # sampled at start only
            ctx.set(dut.b, 0)
            cycles = 0
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
            assert cycles == b_width
            assert ctx.get(dut.product) == a * b, (a, b)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_bad_width():
    with pytest.raises(ValueError, match="SerialMultiplier widths must be >= 1, got 0 x 4"):
        SerialMultiplier(0, 4)
