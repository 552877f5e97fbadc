"""The TrainStage's fill tracker alone (Amaranth simulation): its registered flags, set a
segment ahead, against the position of each segment as the stream delivers it."""
import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.sim import Simulator

from gnnweave.hw.train_stage import _FillTracker

LANES, BLOCKS, WORDS = 4, 4, 2


class _Tracked(Elaboratable):
    def __init__(self):
        self.rows_last, self.words_last = Signal(8), Signal(8)
        self.fire, self.last = Signal(), Signal()
        self.row, self.col = Signal(8), Signal(8)

    def elaborate(self, platform):
        m = Module()
        self.fill = _FillTracker(m, "fill", lanes=LANES, blocks=BLOCKS, words=WORDS,
                                 rows_last=self.rows_last, words_last=self.words_last,
                                 fire=self.fire, row=self.row, col=self.col, last=self.last)
        return m


def _streaming_order(rows, words):
    """(row, col, ends its row block, in its row's last word) of every segment."""
    for block in range(-(-rows // LANES)):
        block_rows = range(block * LANES, min(rows, (block + 1) * LANES))
        for word in range(words):
            for r in block_rows:
                yield r, word * LANES, r == block_rows[-1], word == words - 1


@pytest.mark.parametrize("p_idle", [0.0, 0.4])
def test_fill_tracker_block_and_word_ends(p_idle):
    """At every segment ``block_end`` and ``words_end`` say whether it ends its row block
    and is in its row's last word, for every row count up to the capacity (last blocks
    of one to four rows), one and two words, three microbatches each, back to back or
    between idle cycles, and with the configuration changed between microbatches."""
    dut = _Tracked()
    rng = random.Random(7)
    cases = [(rows, words) for rows in range(1, LANES * BLOCKS + 1) for words in (1, 2)]
    rng.shuffle(cases)
    checked = []

    async def bench(ctx):
        for rows, words in cases:
            ctx.set(dut.rows_last, rows - 1)
            ctx.set(dut.words_last, words - 1)
            for _ in range(3):          # the new configuration settles while idle
                await ctx.tick()
            for _ in range(3):
                segs = list(_streaming_order(rows, words))
                for k, (row, col, ends_block, last_word) in enumerate(segs):
                    while rng.random() < p_idle:
                        ctx.set(dut.fire, 0)
                        await ctx.tick()
                    ctx.set(dut.row, row)
                    ctx.set(dut.col, col)
                    ctx.set(dut.last, k == len(segs) - 1)
                    ctx.set(dut.fire, 1)
                    got = (ctx.get(dut.fill.block_end), ctx.get(dut.fill.words_end),
                           ctx.get(dut.fill.disorder))
                    assert got == (ends_block, last_word, 0), (rows, words, k, row, col, got)
                    checked.append(k)
                    await ctx.tick()
                ctx.set(dut.fire, 0)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(checked) == 3 * sum(rows * words for rows, words in cases)
