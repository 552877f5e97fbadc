"""The MacArray's compute loop keeps its RUN and BIAS states as flip-flops of their own
(``compute_in_run``: the block's end reaches the walker and the output bases from two
registers; ``compute_in_bias``: the bias slice's enables and the core's start do not decode
the state). They equal the compute FSM's states every cycle of a run over several output
and depth blocks, of a run aborted by a write outside its buffer while a block computes, and
of the run after that (Amaranth simulation of a small MacArray with an AXI memory of zeros)."""
from __future__ import annotations

from amaranth.sim import Simulator

from gnnweave.hw.mac_array import MacArrayConfig, MacArrayCore, Status
from gnnweave.sim.mac_array_bench import MacJob

from .unit_core_sim import run_job, zero_memory

CONFIG = MacArrayConfig(max_dim=16, max_depth=16)


def _registers(m, n, k):
    job = MacJob(mode=0, p=[[0] * k] * m, q=[[0] * n] * k, shift=0)
    return job.registers()


def test_run_flip_flop_matches_the_compute_state():
    dut = MacArrayCore(CONFIG)
    sim = Simulator(dut)               # elaborates the core: its probes exist from here
    bus, p = dut.bus, dut.probes
    seen = {"cycles": 0, "run_cycles": 0, "bias_cycles": 0, "blocks": 0}

    async def compare(ctx):
        async for _, _, in_run, run_state, in_bias, bias_state, block_end in ctx.tick().sample(
                p["in_run"], p["run_state"], p["in_bias"], p["bias_state"], p["block_end"]):
            assert in_run == run_state, seen["cycles"]
            assert in_bias == bias_state, seen["cycles"]
            seen["cycles"] += 1
            seen["run_cycles"] += run_state
            seen["bias_cycles"] += bias_state
            seen["blocks"] += block_end

    async def run(ctx, regs, *, shrink_out_at_block=None):
        blocks = seen["blocks"]

        def shrink(ctx):
            if shrink_out_at_block is not None and seen["blocks"] - blocks == shrink_out_at_block:
                # the write guard sees the output buffer shrink once the checks passed:
                # the next block's writes are refused while later blocks compute
                ctx.set(p["cfg"]["out_size"], 1)
        return await run_job(ctx, dut, regs, each_cycle=shrink, timeout=40_000)

    async def bench(ctx):
        await ctx.tick()
        # 2 x 2 output blocks of 16 x 16, each over 3 depth blocks: 12 blocks
        regs = _registers(32, 32, 40)
        assert await run(ctx, regs) == 0
        assert seen["blocks"] == 12
        status = await run(ctx, regs, shrink_out_at_block=3)
        assert status & Status.ADDR_FAULT, status
        aborted_at = seen["blocks"]
        assert 12 < aborted_at < 24
        assert await run(ctx, regs) == 0
        assert seen["blocks"] == aborted_at + 12

    sim.add_clock(1e-8)
    sim.add_process(zero_memory(bus))
    sim.add_process(compare)
    sim.add_testbench(bench)
    sim.run()
    assert seen["run_cycles"] > 3 * 12 * 16
    assert seen["bias_cycles"] >= 2 * 4    # each output block of the two whole runs has a bias
