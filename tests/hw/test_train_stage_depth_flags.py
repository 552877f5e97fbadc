"""The MacCore's opt-in depth flags the TrainStage's ``hold`` reads instead of comparing the
requested depth index: checked cycle by cycle against that index, with the core held on
random cycles (the index then stays, and so must the flags)."""
import random

import pytest
from amaranth.sim import Simulator

from gnnweave.hw.mac import MacCore, MacMode


def test_flags_are_opt_in():
    assert "depth_last" not in MacCore(operand_hold=True).signature.members
    assert "depth_word_end" in MacCore(depth_flags=True).signature.members


@pytest.mark.parametrize("lanes,mode,m,n,k", [(4, MacMode.FWD, 9, 5, 11), (4, MacMode.DW, 4, 8, 1),
                                             (2, MacMode.DX, 3, 3, 6), (1, MacMode.FWD, 2, 2, 3)])
def test_depth_flags_follow_the_request(lanes, mode, m, n, k):
    core = MacCore(rows=lanes, cols=lanes, max_dim=16, max_depth=16, operand_hold=True, depth_flags=True)
    rng = random.Random(m * 31 + k)
    seen = {"last": 0, "word_end": 0, "steps": 0}

    async def bench(ctx):
        for run in range(2):          # a second run starts from where the first left the index
            ctx.set(core.out.ready, 1)
            ctx.set(core.mode, mode)
            ctx.set(core.m, m)
            ctx.set(core.n, n)
            ctx.set(core.k, k)
            ctx.set(core.start, 1)
            await ctx.tick()
            ctx.set(core.start, 0)
            for _ in range(5000):
                ctx.set(core.hold, rng.random() < 0.4)
                kk = ctx.get(core.a_req.fixed)
                last, word_end = ctx.get(core.depth_last), ctx.get(core.depth_word_end)
                assert last == (kk == k - 1), (run, kk)
                assert word_end == (kk % lanes == lanes - 1), (run, kk)
                seen["last"] += last
                seen["word_end"] += word_end
                seen["steps"] += 1
                done = ctx.get(core.done)
                await ctx.tick()
                if done:
                    break
            else:
                raise AssertionError("the run did not end")
            ctx.set(core.hold, 0)

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen["last"] > 0
    assert seen["word_end"] > 0 or k < lanes
