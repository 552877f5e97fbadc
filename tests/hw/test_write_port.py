"""WritePort's burst forming (hw/dma.py, ``coalesce=True``) in Amaranth simulation: a
client pushes single beats (runs of consecutive addresses, gaps, 4 KiB crossings, random
WSTRB) against a memory with random AW/W back-pressure and B latency. Memory ends up as
the beats say, in order; every burst is INCR, at most ``max_burst`` beats, inside one
4 KiB page and made of consecutive pushed beats only, with WLAST on its last beat; runs
do become bursts; ``idle`` rises only after the last B."""
from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.sim import Simulator

from gnnweave.hw.axi import AXI4Signature
from gnnweave.hw.dma import WritePort

from .test_blocks import simulate

DW = 64
BPB = DW // 8
MEM = 3 * 4096


class Port(Elaboratable):
    def __init__(self, max_burst):
        self.bus = AXI4Signature(addr_width=32, data_width=DW, id_width=2).create()
        self.port = WritePort(self.bus, beat_depth=8, address_depth=8, coalesce=True,
                              max_burst=max_burst)

    def elaborate(self, platform):
        m = Module()
        m.submodules.port = self.port
        return m


def _beats(rng, count):
    """Single beats: runs of consecutive addresses from random starts (some just below a
    4 KiB boundary), each with random data and strobes."""
    out = []
    while len(out) < count:
        start = int(rng.choice([4096 - 3 * BPB, 2 * 4096 - BPB, int(rng.integers(0, MEM // BPB - 40)) * BPB]))
        for i in range(int(rng.integers(1, 40))):
            addr = start + i * BPB
            if addr + BPB > MEM:
                break
            strb = int(rng.integers(1, 256)) if rng.random() < 0.3 else 0xFF
            out.append((addr, int(rng.integers(0, 1 << 63)), strb))
    return out[:count]


@pytest.mark.parametrize("seed,max_burst", [(0, 16), (1, 4), (2, 256)])
def test_coalesced_bursts_write_memory_exactly(seed, max_burst):
    rng = np.random.default_rng(seed)
    beats = _beats(rng, 300)
    dut = Port(max_burst)
    port, bus = dut.port, dut.bus
    memory = bytearray(MEM)
    expect = bytearray(MEM)
    for addr, value, strb in beats:
        for b in range(BPB):
            if strb >> b & 1:
                expect[addr + b] = value >> (8 * b) & 0xFF
    log = {"bursts": [], "idle_early": False}

    async def bench(ctx):
        pushed = 0
        last_push = 0
        bursts = deque()            # AW taken, beats still to come: [addr, beats, seen]
        b_due = deque()
        for cycle in range(20_000):
            # client: push single beats with random gaps
            offer = pushed < len(beats) and rng.random() < 0.8
            ctx.set(port.address.w_en, 0)
            ctx.set(port.beats.w_en, 0)
            if offer and ctx.get(port.address.w_rdy) and ctx.get(port.beats.w_rdy):
                addr, value, strb = beats[pushed]
                ctx.set(port.address.w_data, addr)                 # len 0
                ctx.set(port.beats.w_data, value | strb << DW | 1 << (DW + BPB))
                ctx.set(port.address.w_en, 1)
                ctx.set(port.beats.w_en, 1)
                pushed += 1
                last_push = cycle
            # memory: random AW/W readiness, B after a random delay
            ctx.set(bus.awready, int(rng.random() < 0.5))
            w_ready = bool(bursts) and rng.random() < 0.7
            ctx.set(bus.wready, int(w_ready))
            b_now = bool(b_due) and b_due[0] <= cycle
            ctx.set(bus.bvalid, int(b_now))
            ctx.set(bus.bresp, 0)
            if ctx.get(bus.awvalid) and ctx.get(bus.awready):
                addr, length = ctx.get(bus.awaddr), ctx.get(bus.awlen) + 1
                assert ctx.get(bus.awburst) == 1
                assert addr % 4096 + length * BPB <= 4096, "burst crosses 4 KiB"
                assert length <= max_burst
                bursts.append([addr, length, 0])
                log["bursts"].append((addr, length))
            if w_ready and ctx.get(bus.wvalid):
                burst = bursts[0]
                addr = burst[0] + burst[2] * BPB
                data, strb = ctx.get(bus.wdata), ctx.get(bus.wstrb)
                for b in range(BPB):
                    if strb >> b & 1:
                        memory[addr + b] = data >> (8 * b) & 0xFF
                burst[2] += 1
                assert ctx.get(bus.wlast) == (burst[2] == burst[1]), "WLAST misplaced"
                if burst[2] == burst[1]:
                    bursts.popleft()
                    b_due.append(cycle + int(rng.integers(1, 30)))
            if b_now and ctx.get(bus.bready):
                b_due.popleft()
            done = pushed == len(beats) and not bursts and not b_due
            if ctx.get(port.idle) and not done and pushed == len(beats) and cycle > last_push:
                log["idle_early"] = True
            await ctx.tick()
            if done and cycle > 10 and ctx.get(port.idle):
                break
        log["pushed"] = pushed

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert log["pushed"] == len(beats)
    assert not log["idle_early"], "idle before every write was answered"
    assert memory == expect
    # bursts are runs of consecutive pushed beats, in push order
    flat = [a + i * BPB for a, n in log["bursts"] for i in range(n)]
    assert flat == [a for a, _, _ in beats]
    assert len(log["bursts"]) < len(beats) // 3, "consecutive beats were not joined"


@pytest.mark.parametrize("b_delay", [1, 6])
def test_idle_falls_with_a_lone_push_and_rises_after_its_b(b_delay):
    """One beat into an idle port: ``idle`` is low from the cycle after the push until the
    B response is taken, then high again."""
    dut = Port(16)
    port, bus = dut.port, dut.bus
    trace = []

    async def bench(ctx):
        ctx.set(bus.awready, 1)
        ctx.set(bus.wready, 1)
        for _ in range(3):
            await ctx.tick()
        assert ctx.get(port.idle)
        ctx.set(port.address.w_data, 0x100)
        ctx.set(port.beats.w_data, 0x1234 | 0xFF << DW | 1 << (DW + BPB))
        ctx.set(port.address.w_en, 1)
        ctx.set(port.beats.w_en, 1)
        await ctx.tick()
        ctx.set(port.address.w_en, 0)
        ctx.set(port.beats.w_en, 0)
        b_at = None
        for cycle in range(60):
            if b_at is None and ctx.get(bus.wvalid) and ctx.get(bus.wlast):
                b_at = cycle + b_delay
            b_now = b_at is not None and cycle >= b_at and not trace.count("B")
            ctx.set(bus.bvalid, int(b_now))
            trace.append("B" if b_now else int(ctx.get(port.idle)))
            await ctx.tick()
        ctx.set(bus.bvalid, 0)

    simulate(dut, bench)
    answered = trace.index("B")
    assert trace[:answered] == [0] * answered, trace
    # (the B's pulse is counted a cycle late, so idle rises two cycles after it)
    assert trace[answered + 1:] == [0] + [1] * (len(trace) - answered - 2), trace
