"""The Pipeline unit's registered run phase (``checking``, ``running``, ``train_run``,
``first``: set a cycle ahead by the unit, for their fan-out) equals what its RunControl
decodes, every cycle of a refused run, a weight load, a TRAIN and a TRAIN aborted by a read
outside its buffer; the Pipeline's reset after that abort lands in FINISH, before the next
run can start (Amaranth simulation of a one-stage unit with a small AXI memory)."""
from __future__ import annotations

from amaranth.sim import Simulator

from gnnweave.hw.blocks import RunState
from gnnweave.hw.pipeline_unit import PipelineUnitConfig, PipelineUnitCore

from .unit_core_sim import run_job, zero_memory

CONFIG = PipelineUnitConfig(stages=1, lanes=2, bus_width=64, addr_width=32, max_in=4, max_out=4,
                            max_rows=2, slots=1, versions=3, max_burst=2, fifo_beats=4)
BEAT = CONFIG.bus_width // 8


def _regs(**kw):
    base = dict(stage=0, schedule=1, microbatches=1, steps=1, rows=2, s0_d_in=4, s0_d_out=4,
                w_addr=0x1000, w_size=0x1000, w_stride=2 * BEAT,
                act_addr=0x2000, act_size=0x1000, act_stride=BEAT,
                logits_addr=0x3000, logits_size=0x1000, logits_stride=BEAT,
                grad_addr=0x4000, grad_size=0x1000, grad_stride=BEAT, grads_ready=255)
    base.update(kw)
    return base


def test_registered_run_phase_matches_the_run_control():
    dut = PipelineUnitCore(CONFIG)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    bus = dut.bus
    p = dut.probes if hasattr(dut, "probes") else None
    seen = {"states": set(), "resets": [], "cycles": 0}

    async def compare(ctx):
        run = p["run"]
        async for _, _, state, checking, r_checking, running, r_running, stopped, train_run, \
                is_train, first, r_first, abort_done, pipe_reset in ctx.tick().sample(
                    run.state, p["checking"], run.checking, p["running"], run.running, p["stopped"],
                    p["train_run"], p["is_train"], p["first"], run.first, run.abort_done,
                    p["pipe_reset"]):
            cycle = seen["cycles"]
            seen["cycles"] += 1
            seen["states"].add(RunState(state))
            assert checking == r_checking, cycle
            assert running == (r_running and not stopped), cycle
            assert train_run == (running and is_train), cycle
            assert first == r_first, cycle
            if pipe_reset:
                seen["resets"].append(RunState(state))

    async def run(ctx, regs, *, poke_act_size=None):
        def shrink(ctx):
            if poke_act_size is not None and ctx.get(p["first"]):
                # the read guard sees the buffer shrink once the checks passed
                ctx.set(p["cfg"]["act_size"], poke_act_size)
        return await run_job(ctx, dut, regs, each_cycle=shrink)

    async def bench(ctx):
        await ctx.tick()
        assert await run(ctx, _regs(pipe_mode=3)) == 1                    # CONFIG_ERROR
        assert await run(ctx, _regs(pipe_mode=0)) == 0                    # LOAD_WEIGHTS
        assert await run(ctx, _regs(pipe_mode=1)) == 0                    # STORE_WEIGHTS
        assert await run(ctx, _regs(pipe_mode=2)) == 0                    # TRAIN
        assert not seen["resets"]
        # TRAIN aborted: the first input read is refused (ADDR_FAULT)
        status = await run(ctx, _regs(pipe_mode=2), poke_act_size=BEAT)
        assert status >> 3 & 1, status
        assert seen["resets"] == [RunState.FINISH]
        assert await run(ctx, _regs(pipe_mode=2)) == 0                    # and the next runs
        assert seen["resets"] == [RunState.FINISH]

    assert p is not None
    sim.add_process(zero_memory(bus))
    sim.add_process(compare)
    sim.add_testbench(bench)
    sim.run()
    assert {RunState.CHECK, RunState.RUN, RunState.DRAIN, RunState.ABORT, RunState.FINISH} <= seen["states"]
