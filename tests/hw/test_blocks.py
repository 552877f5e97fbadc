"""hw/blocks.py: each shared building block against a Python model of what it must do."""
from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from amaranth.back import rtlil
from amaranth.hdl import Module, Signal

from gnnweave.hw.blocks import (BufferGuard, BurstGenerator, ElementReader, EventCounters,
                                ExtentCheck, BufferedFIFO, RegisteredFIFO, RunControl, RunState,
                                decision)


def simulate(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


# ------------------------------------------------------------------------------ RunControl

def run_fsm(dut, script, cycles):
    """Drive ``script(cycle, state) -> {port: value}`` for ``cycles`` cycles; returns one
    ``(state, busy, done, accept, config_error, first, aborting, abort_done, completing)``
    per cycle."""
    trace = []

    async def bench(ctx):
        for cycle in range(cycles):
            state = RunState(ctx.get(dut.state))
            for port in ("start", "check_done", "check_error", "stop", "finished", "drained",
                         "quiet"):
                ctx.set(getattr(dut, port), 0)
            for port, value in script(cycle, state).items():
                ctx.set(getattr(dut, port), value)
            trace.append((state.name, *(ctx.get(getattr(dut, p)) for p in (
                "busy", "done", "accept", "config_error", "first", "aborting", "abort_done",
                "completing"))))
            await ctx.tick()

    simulate(dut, bench)
    return trace


def states(trace):
    return [t[0] for t in trace]


def test_a_run_goes_idle_check_run_drain_finish():
    def script(cycle, state):
        return {"start": cycle == 1, "check_done": cycle == 4, "finished": cycle == 7,
                "drained": cycle == 9}

    trace = run_fsm(RunControl(drain=True), script, 12)
    assert states(trace) == ["IDLE", "IDLE", "CHECK", "CHECK", "CHECK", "RUN", "RUN", "RUN",
                             "DRAIN", "DRAIN", "FINISH", "IDLE"]
    busy = [t[1] for t in trace]
    assert busy == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    assert [t[2] for t in trace].count(1) == 1 and trace[10][2] == 1      # done in FINISH
    assert [i for i, t in enumerate(trace) if t[3]] == [1]                 # accept at start
    assert [i for i, t in enumerate(trace) if t[5]] == [5]                 # first RUN cycle
    assert [i for i, t in enumerate(trace) if t[8]] == [7]                 # completing


def test_without_drain_run_finishes_directly_and_hold_first_waits_a_cycle():
    def script(cycle, state):
        return {"start": cycle == 0, "check_done": state == RunState.CHECK,
                "finished": state == RunState.RUN}

    plain = states(run_fsm(RunControl(drain=False), script, 6))
    assert plain == ["IDLE", "CHECK", "RUN", "FINISH", "IDLE", "IDLE"]
    held = states(run_fsm(RunControl(drain=False, hold_first=True), script, 6))
    assert held == ["IDLE", "CHECK", "RUN", "RUN", "FINISH", "IDLE"]


def test_refused_configuration_finishes_without_running():
    def script(cycle, state):
        return {"start": cycle == 0, "check_done": cycle == 2, "check_error": 1,
                "finished": 1}

    trace = run_fsm(RunControl(), script, 6)
    assert states(trace) == ["IDLE", "CHECK", "CHECK", "FINISH", "IDLE", "IDLE"]
    assert [i for i, t in enumerate(trace) if t[4]] == [2]                 # config_error


def test_stop_aborts_and_waits_for_quiet():
    def script(cycle, state):
        return {"start": cycle == 0, "check_done": 1, "stop": cycle == 3,
                "finished": cycle == 3, "quiet": cycle >= 6}

    trace = run_fsm(RunControl(), script, 9)
    # stop wins over finished in the same cycle; ABORT holds until quiet
    assert states(trace) == ["IDLE", "CHECK", "RUN", "RUN", "ABORT", "ABORT", "ABORT",
                             "FINISH", "IDLE"]
    assert [i for i, t in enumerate(trace) if t[6]] == [3]                 # aborting
    assert [i for i, t in enumerate(trace) if t[7]] == [6]                 # abort_done
    assert not any(t[8] for t in trace)                                    # never completing


def test_start_is_ignored_while_busy_and_first_rearms():
    def script(cycle, state):
        return {"start": 1, "check_done": 1, "finished": state == RunState.RUN, "drained": 1}

    trace = run_fsm(RunControl(hold_first=True), script, 14)
    s = states(trace)
    assert s[:7] == ["IDLE", "CHECK", "RUN", "RUN", "DRAIN", "FINISH", "IDLE"]
    assert s[7:13] == s[1:7]                        # the next run is the same
    assert [i for i, t in enumerate(trace) if t[5]] == [2, 8]     # first, once per run
    assert [i for i, t in enumerate(trace) if t[3]] == [0, 6, 12]


@pytest.mark.parametrize("drain", [False, True])
def test_every_output_is_its_state_and_inputs_under_random_inputs(drain):
    rng = random.Random(7 + drain)
    dut = RunControl(drain=drain)
    inputs = ("start", "check_done", "check_error", "stop", "finished", "drained", "quiet")
    seen = set()

    async def bench(ctx):
        for _ in range(400):
            v = {p: int(rng.random() < 0.3) for p in inputs}
            for port, value in v.items():
                ctx.set(getattr(dut, port), value)
            state = RunState(ctx.get(dut.state))
            seen.add(state)
            expect = {
                "idle": state == RunState.IDLE, "accept": state == RunState.IDLE and v["start"],
                "checking": state == RunState.CHECK,
                "config_error": state == RunState.CHECK and v["check_done"] and v["check_error"],
                "running": state == RunState.RUN,
                "aborting": state == RunState.RUN and v["stop"],
                "completing": state == RunState.RUN and not v["stop"] and v["finished"],
                "abort_done": state == RunState.ABORT and v["quiet"],
                "done": state == RunState.FINISH,
            }
            assert {k: ctx.get(getattr(dut, k)) for k in expect} == \
                {k: int(bool(e)) for k, e in expect.items()}, state
            await ctx.tick()

    simulate(dut, bench)
    assert len(seen) == len(RunState) - (not drain)


# --------------------------------------------------------------------------- EventCounters

def test_counters_count_while_enabled_and_clear_first():
    rng = random.Random(1)
    spec = {"busy": (16, 1), "beats": (8, 3), "sat": (12, 4)}
    dut = EventCounters(spec)
    model = dict.fromkeys(spec, 0)

    async def bench(ctx):
        for _ in range(300):
            clear, enable = rng.random() < 0.05, rng.random() < 0.7
            inc = {n: rng.randrange(1 << w) for n, (_, w) in spec.items()}
            ctx.set(dut.clear, clear)
            ctx.set(dut.enable, enable)
            for n, v in inc.items():
                ctx.set(getattr(dut.inc, n), v)
            await ctx.tick()
            for n, (width, _) in spec.items():
                model[n] = 0 if clear else (model[n] + inc[n] * enable) % (1 << width)
                assert ctx.get(getattr(dut.count, n)) == model[n], n

    simulate(dut, bench)


def test_counter_widths_are_checked():
    with pytest.raises(ValueError, match=r"counter 'x': widths \(4, 5\)"):
        EventCounters({"x": (4, 5)})
    with pytest.raises(ValueError, match="at least one counter"):
        EventCounters({})


# ----------------------------------------------------------------------------- BufferGuard

def guard_model(addr, length, base, size, bpb):
    nbytes = (length + 1) * bpb
    return base <= addr and addr + nbytes <= base + size and (addr % 4096) + nbytes <= 4096


@pytest.mark.parametrize("bpb", [8, 16, 64])
def test_guard_matches_the_rule(bpb):
    rng = random.Random(bpb)
    aw = 32
    dut = BufferGuard(aw, bpb)

    async def bench(ctx):
        for i in range(400):
            base = rng.randrange(0, 1 << 20) * bpb
            size = rng.choice([0, bpb, 4096, rng.randrange(0, 1 << 16) * bpb])
            addr = base + rng.randrange(-8, 64) * bpb if i % 2 else \
                (base + size - rng.randrange(0, 8) * bpb)
            addr = max(0, addr) % (1 << aw)
            length = rng.randrange(0, 256)
            for port, v in (("addr", addr), ("len", length), ("base", base), ("size", size)):
                ctx.set(getattr(dut, port), v)
            await ctx.delay(1e-9)
            assert ctx.get(dut.inside) == guard_model(addr, length, base, size, bpb), \
                (addr, length, base, size)

    sim = Simulator(dut)
    sim.add_testbench(bench)
    sim.run()


# ----------------------------------------------------------------------------- ExtentCheck

def extent_model(base, size, stride, rows, row_bytes, bpb, aw):
    bad = base % bpb != 0 or stride % bpb != 0 or (base + size) >> aw != 0
    if rows:
        bad |= stride < row_bytes or (rows - 1) * stride + row_bytes > size
    return bad


@pytest.mark.parametrize("stride_width, rw", [(40, 12), (48, 12), (40, 2)])
def test_extent_check_matches_the_rule_and_takes_its_cycles(stride_width, rw):
    """Against the rule, with products past the address space (the clamp) and, where the
    stride is wider than an address, strides of 2 ** addr_width and more; with the
    narrowest rows (the shortest multiplying phase) too."""
    rng = random.Random(7 + stride_width + rw)
    aw, bpb = 40, 16
    dut = ExtentCheck(addr_width=aw, bytes_per_beat=bpb, rows_width=rw, stride_width=stride_width)

    async def bench(ctx):
        for _ in range(60):
            rows = rng.choice([0, 1, 2, rng.randrange(1 << rw), (1 << rw) - 1])
            row_bytes = rng.randrange(1, 64) * bpb
            stride = rng.choice([row_bytes, row_bytes + bpb, row_bytes - bpb, row_bytes + 3,
                                 rng.randrange(1 << 30), (1 << aw) - bpb,
                                 rng.randrange(1 << stride_width) & -bpb]) % (1 << stride_width)
            need = max(rows - 1, 0) * stride + row_bytes
            size = max(0, need + rng.choice([0, -1, -bpb, bpb, 1 << 20])) % (1 << aw)
            if rng.random() < 0.2:      # large buffers: the stride's low bits fit them
                size = rng.randrange(1 << (aw - 1), 1 << aw)
            base = rng.choice([0, bpb * 5, 3, (1 << aw) - size])
            for port, v in (("base", base), ("size", size), ("stride", stride), ("rows", rows),
                            ("row_bytes", row_bytes)):
                ctx.set(getattr(dut, port), v)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 0
            while not ctx.get(dut.done):
                await ctx.tick()
                cycles += 1
            assert cycles + 1 == rw + 3        # the start cycle, then rw + 2 more
            assert ctx.get(dut.error) == extent_model(base, size, stride, rows, row_bytes,
                                                      bpb, aw), (base, size, stride, rows)

    simulate(dut, bench)


# -------------------------------------------------------------------------- BurstGenerator

@pytest.mark.parametrize("bpb,max_burst,ready_share", [(16, 16, 1.0), (64, 8, 0.6), (8, 256, 0.8)])
def test_bursts_cover_the_run_greedily_and_never_cross_a_page(bpb, max_burst, ready_share):
    rng = random.Random(max_burst)
    aw = 32
    dut = BurstGenerator(addr_width=aw, bytes_per_beat=bpb, max_burst=max_burst, count_width=16)
    runs = [(rng.randrange(0, 1 << 16) * bpb, rng.choice([0, 1, 5, 300, rng.randrange(2000)]))
            for _ in range(12)]
    got = []

    async def producer(ctx):
        for addr, beats in runs:
            ctx.set(dut.cmd.valid, 1)
            ctx.set(dut.cmd.payload.addr, addr)
            ctx.set(dut.cmd.payload.beats, beats)
            await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)

    async def consumer(ctx):
        idle = 0
        while idle < 50:
            ready = rng.random() < ready_share
            ctx.set(dut.bursts.ready, ready)
            await ctx.delay(1e-9)
            if ctx.get(dut.bursts.valid) and ready:
                p = dut.bursts.payload
                got.append((ctx.get(p.addr), ctx.get(p.len) + 1, ctx.get(p.last)))
                idle = 0
            else:
                idle += 1
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()

    expected = []
    for addr, beats in runs:
        while beats:
            n = min(beats, max_burst, (4096 - addr % 4096) // bpb)
            beats -= n
            expected.append((addr, n, int(beats == 0)))
            addr += n * bpb
    assert got == expected


def test_a_burst_every_two_cycles():
    dut = BurstGenerator(addr_width=32, bytes_per_beat=16, max_burst=4)
    valid = []

    async def bench(ctx):
        ctx.set(dut.bursts.ready, 1)
        ctx.set(dut.cmd.valid, 1)
        ctx.set(dut.cmd.payload.addr, 4096 - 32)
        ctx.set(dut.cmd.payload.beats, 12)
        await ctx.tick().until(dut.cmd.ready)
        ctx.set(dut.cmd.valid, 0)
        for _ in range(12):
            valid.append(ctx.get(dut.bursts.valid))
            await ctx.tick()

    simulate(dut, bench)
    # 2 beats to the page end, then 4 + 4 + 2: four bursts, sized and sent in turn
    assert valid == [0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("kw,message", [
    ({"max_burst": 0}, r"max_burst must be in 1\.\.256, not 0"),
    ({"bytes_per_beat": 12}, r"bytes_per_beat must be a power of two up to 4096, not 12"),
])
def test_burst_generator_parameters_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        BurstGenerator(**kw)


# -------------------------------------------------------------------------- RegisteredFIFO

class FIFOModel:
    """The queue cycle by cycle: a memory behind one output register, one write and one
    read a cycle; an element written into an empty queue is readable two cycles later."""

    def __init__(self, depth):
        self.depth, self.stored, self.out, self.level = depth, deque(), None, 0
        self.written, self.read = [], []       # every element pushed, every one popped

    def flags(self):
        return {"w_ready": int(self.level < self.depth), "r_valid": int(self.out is not None),
                "level": self.level}

    def clock(self, w_valid, w_data, r_ready):
        push = w_valid and self.level < self.depth
        pop = r_ready and self.out is not None
        popped = self.out if pop else None
        if pop:
            self.out = None
        if self.stored and self.out is None:
            self.out = self.stored.popleft()
        if push:
            self.stored.append(w_data)
            self.written.append(w_data)
        if pop:
            self.read.append(popped)
        self.level += push - pop


@pytest.mark.parametrize("depth,w_share,r_share", [
    (1, 0.7, 0.7), (2, 0.9, 0.5), (5, 0.5, 0.9), (16, 0.8, 0.8), (16, 1.0, 0.3),
])
def test_registered_fifo_follows_the_model_under_random_push_and_pop(depth, w_share, r_share):
    rng = random.Random(depth * 100 + int(w_share * 10))
    dut = RegisteredFIFO(8, depth)
    model = FIFOModel(depth)

    async def bench(ctx):
        for _ in range(600):
            before = {"w_ready": ctx.get(dut.w.ready), "r_valid": ctx.get(dut.r.valid),
                      "level": ctx.get(dut.level)}
            assert before == model.flags()
            if before["r_valid"]:
                assert ctx.get(dut.r.payload) == model.out
            w_valid, r_ready = rng.random() < w_share, rng.random() < r_share
            w_data = rng.randrange(256)
            ctx.set(dut.w.valid, w_valid)
            ctx.set(dut.w.payload, w_data)
            ctx.set(dut.r.ready, r_ready)
            # registered: this cycle's valid and ready change none of the flags
            assert {"w_ready": ctx.get(dut.w.ready), "r_valid": ctx.get(dut.r.valid),
                    "level": ctx.get(dut.level)} == before
            model.clock(w_valid, w_data, r_ready)
            await ctx.tick()

    simulate(dut, bench)
    assert len(model.read) > 100 and model.read == model.written[:len(model.read)]


@pytest.mark.parametrize("depth", [2, 6, 17])
def test_buffered_fifo_is_the_model_under_amaranth_port_names(depth):
    rng = random.Random(depth)
    dut = BufferedFIFO(width=16, depth=depth)
    model = FIFOModel(depth)

    async def bench(ctx):
        for _ in range(500):
            assert {"w_ready": ctx.get(dut.w_rdy), "r_valid": ctx.get(dut.r_rdy),
                    "level": ctx.get(dut.level)} == model.flags()
            if ctx.get(dut.r_rdy):
                assert ctx.get(dut.r_data) == model.out
            w_en, r_en, w_data = rng.random() < 0.8, rng.random() < 0.6, rng.randrange(1 << 16)
            ctx.set(dut.w_en, w_en)
            ctx.set(dut.w_data, w_data)
            ctx.set(dut.r_en, r_en)
            model.clock(w_en, w_data, r_en)
            await ctx.tick()

    simulate(dut, bench)
    assert dut.width == 16 and dut.depth == depth
    assert len(model.read) > 100 and model.read == model.written[:len(model.read)]


def test_registered_fifo_moves_one_element_per_cycle_and_holds_its_depth():
    layout = data.StructLayout({"a": 5, "b": 11})
    dut = RegisteredFIFO(layout, 8)
    out = []

    async def bench(ctx):
        ctx.set(dut.r.ready, 0)
        for i in range(10):                       # fill: exactly 8 are taken
            ctx.set(dut.w.valid, 1)
            ctx.set(dut.w.payload, {"a": i, "b": 1000 + i})
            if ctx.get(dut.w.ready):
                out.append(("in", i))
            await ctx.tick()
        assert ctx.get(dut.level) == 8 and not ctx.get(dut.w.ready)
        ctx.set(dut.r.ready, 1)
        streaming = []
        for i in range(8, 40):                    # both ends every cycle once flowing
            ctx.set(dut.w.payload, {"a": i % 32, "b": 1000 + i})
            streaming.append((ctx.get(dut.w.ready), ctx.get(dut.r.valid)))
            if ctx.get(dut.r.valid):
                out.append(("out", ctx.get(dut.r.payload.a), ctx.get(dut.r.payload.b)))
            await ctx.tick()
        assert streaming[-20:] == [(1, 1)] * 20

    simulate(dut, bench)
    assert [e for e in out if e[0] == "in"] == [("in", i) for i in range(8)]
    got = [e[2] for e in out if e[0] == "out"]
    assert got[:8] == [1000 + i for i in range(8)]
    assert got == sorted(got) and len(got) >= 30      # in order, one a cycle after the first


def test_registered_fifo_depth_is_checked():
    with pytest.raises(ValueError, match="RegisteredFIFO depth must be a positive integer, not 0"):
        RegisteredFIFO(8, 0)


# --------------------------------------------------------------------------- ElementReader

@pytest.mark.parametrize("elem_width,counts,fifo_beats,max_burst,seed", [
    (32, [37], 8, 4, 0), (16, [200], 32, 16, 1), (8, [5], 4, 4, 2), (32, [0], 8, 8, 3),
    (16, [1], 8, 2, 4),
    # several runs back to back: each start reloads the count's flags
    (32, [37, 0, 5], 8, 4, 5), (16, [200, 1, 9], 32, 16, 6), (8, [5, 33], 4, 4, 7),
    (16, [2, 3, 16, 17], 8, 2, 8), (128, [3, 1, 4], 8, 4, 9), (64, [7, 2], 8, 8, 10),
    # counts over 4 whose low bits look like a short run's (1, 2, 3)
    (16, [6, 11, 13, 5], 8, 4, 11), (32, [10, 7], 8, 2, 12),
])
def test_element_reader_streams_the_buffer_and_never_overfills(elem_width, counts, fifo_beats,
                                                               max_burst, seed):
    rng = random.Random(seed)
    dw, bpb = 128, 16
    base = 4096 - 3 * bpb                   # every run crosses a 4 KiB page early
    memory = {base + i * bpb: rng.getrandbits(dw)
              for i in range(max(counts) * elem_width // dw + 2)}
    per_beat = dw // elem_width
    dut = ElementReader(addr_width=32, data_width=dw, elem_width=elem_width,
                        fifo_beats=fifo_beats, max_burst=max_burst)
    runs = []                               # (elements, bursts) of each run

    async def bench(ctx):
        for count in counts:
            got, bursts, pending = [], [], deque()
            ctx.set(dut.base, base)
            ctx.set(dut.count, count)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            for t in range(3000):
                ctx.set(dut.request.ready, rng.random() < 0.6)
                # long stalls fill the FIFO: a beat without room would be lost (and the
                # elements wrong)
                ctx.set(dut.elements.ready, t % 200 > 60 and rng.random() < 0.7)
                beat = pending and pending[0][0] <= t and rng.random() < 0.8
                ctx.set(dut.response.valid, bool(beat))
                if beat:
                    _, addr = pending.popleft()
                    ctx.set(dut.response.data, memory[addr])
                if ctx.get(dut.request.valid) and ctx.get(dut.request.ready):
                    addr = ctx.get(dut.request.payload.addr)
                    n = ctx.get(dut.request.payload.len) + 1
                    bursts.append((addr, n))
                    when = t + rng.randrange(2, 12)
                    pending.extend((when, addr + i * bpb) for i in range(n))
                if ctx.get(dut.elements.valid) and ctx.get(dut.elements.ready):
                    got.append(ctx.get(dut.elements.payload))
                if ctx.get(dut.done) and not pending and t > 20:
                    break
                await ctx.tick()
            runs.append((got, bursts))
            for _ in range(3):
                await ctx.tick()

    simulate(dut, bench)
    assert len(runs) == len(counts)
    for count, (got, bursts) in zip(counts, runs):
        want = [(memory[base + (k // per_beat) * bpb] >> (elem_width * (k % per_beat)))
                & ((1 << elem_width) - 1) for k in range(count)]
        assert got == want, count
        beats = -(-count * elem_width // dw)
        issued = [a + i * bpb for a, n in bursts for i in range(n)]
        assert issued == [base + i * bpb for i in range(beats)], count
        assert all(n <= max_burst and (a % 4096) + n * bpb <= 4096 for a, n in bursts)


# ------------------------------------------------------------------------------ decision

def test_a_decision_is_its_function_of_its_inputs_in_a_module_of_its_own():
    m = Module()
    a, b, seg = Signal(), Signal(), Signal(2)
    out = decision(m, "pick", lambda a, b, seg: a & (b | (seg == 3)), a=a, b=b, seg=seg)
    assert "module \\top.pick" in rtlil.convert(m, ports=[a, b, seg, out])
    got = {}

    async def bench(ctx):
        for x in range(16):
            ctx.set(a, x & 1)
            ctx.set(b, x >> 1 & 1)
            ctx.set(seg, x >> 2)
            got[x] = ctx.get(out)

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert got == {x: (x & 1) & ((x >> 1 & 1) | (x >> 2 == 3)) for x in range(16)}
