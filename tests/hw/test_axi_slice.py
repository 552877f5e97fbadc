"""AXI register slices (hw/axi.py) in Amaranth simulation: the two-entry skid buffer keeps
full throughput, loses, duplicates and reorders nothing under random back-pressure on both
sides, holds its output until the handshake, and has no combinational path from either
side to the other; the AXI4 and AXI4-Lite slices do the same on every channel at once."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from gnnweave.hw.axi import (AXI4LiteSignature, AXI4Signature, AXIRegisterSlice, SkidBuffer,
                             axi_channels)


def _simulate(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


class _Source:
    """Offers ``items`` on (valid, payload signals) with random gaps; AXI rule: once valid,
    the payload holds until the handshake."""

    def __init__(self, valid, ready, fields, items, rng, p_valid):
        self.valid, self.ready, self.fields = valid, ready, fields
        self.items, self.rng, self.p_valid = list(items), rng, p_valid
        self.sent = 0
        self.offering = False

    def drive(self, ctx):
        if not self.offering and self.sent < len(self.items) and self.rng.random() < self.p_valid:
            self.offering = True
            for sig, value in zip(self.fields, self.items[self.sent]):
                ctx.set(sig, value)
        ctx.set(self.valid, int(self.offering))

    def sample(self, ctx):
        if self.offering and ctx.get(self.ready):
            self.sent += 1
            self.offering = False


class _Sink:
    """Random ready; records every handshaken payload and checks that a valid output
    holds its payload until it is taken."""

    def __init__(self, valid, ready, fields, rng, p_ready):
        self.valid, self.ready, self.fields = valid, ready, fields
        self.rng, self.p_ready = rng, p_ready
        self.got = []
        self.held = None

    def drive(self, ctx):
        ctx.set(self.ready, int(self.rng.random() < self.p_ready))

    def sample(self, ctx):
        if not ctx.get(self.valid):
            assert self.held is None, "valid dropped before the handshake"
            return
        payload = tuple(ctx.get(f) for f in self.fields)
        if self.held is not None:
            assert payload == self.held, "payload changed while valid and not ready"
        if ctx.get(self.ready):
            self.got.append(payload)
            self.held = None
        else:
            self.held = payload


def test_skid_buffer_full_throughput_and_two_cycle_fill():
    """Always valid and always ready: one beat per cycle after one cycle of latency."""
    dut = SkidBuffer(16)
    got = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.valid, 1)
        for cycle in range(100):
            ctx.set(dut.i.payload, cycle)
            assert ctx.get(dut.i.ready)
            if ctx.get(dut.o.valid):
                got.append((cycle, ctx.get(dut.o.payload)))
            await ctx.tick()

    _simulate(dut, bench)
    assert [v for _, v in got] == list(range(99))
    assert got[0][0] == 1, "one cycle of latency"


@pytest.mark.parametrize("seed,p_valid,p_ready", [(0, 0.5, 0.5), (1, 0.9, 0.3), (2, 0.3, 0.9),
                                                  (3, 1.0, 0.7)])
def test_skid_buffer_random_backpressure_keeps_every_beat_in_order(seed, p_valid, p_ready):
    rng = np.random.default_rng(seed)
    dut = SkidBuffer(12)
    items = [(int(v),) for v in rng.integers(0, 1 << 12, size=400)]
    src = _Source(dut.i.valid, dut.i.ready, [dut.i.payload], items, rng, p_valid)
    sink = _Sink(dut.o.valid, dut.o.ready, [dut.o.payload], rng, p_ready)

    async def bench(ctx):
        for _ in range(5000):
            src.drive(ctx)
            sink.drive(ctx)
            src.sample(ctx)
            sink.sample(ctx)
            await ctx.tick()
            if len(sink.got) == len(items):
                break

    _simulate(dut, bench)
    assert sink.got == items


def test_skid_buffer_sustains_throughput_when_ready_toggles():
    """Ready high every other cycle and input always offered: the output side is never
    idle while the buffer holds data (no bubble from the skid register)."""
    dut = SkidBuffer(8)
    stats = {"fired": 0, "cycles": 0}

    async def bench(ctx):
        ctx.set(dut.i.valid, 1)
        n = 0
        for cycle in range(400):
            ctx.set(dut.i.payload, n & 0xFF)
            ready = cycle % 2
            ctx.set(dut.o.ready, ready)
            if cycle > 4:
                stats["cycles"] += ready
                assert ctx.get(dut.o.valid), f"output idle at cycle {cycle}"
                stats["fired"] += ready
            if ctx.get(dut.i.ready):
                n += 1
            await ctx.tick()

    _simulate(dut, bench)
    assert stats["fired"] == stats["cycles"]


def test_skid_buffer_has_no_combinational_path():
    """Within one cycle, o.ready does not reach i.ready and i.valid/payload do not reach o."""
    dut = SkidBuffer(8)

    async def bench(ctx):
        ctx.set(dut.i.valid, 1)
        ctx.set(dut.i.payload, 0x5A)
        ctx.set(dut.o.ready, 0)
        for _ in range(3):     # fill main and skid
            await ctx.tick()
        before = (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload))
        assert before[0] == 0 and before[1] == 1
        for o_ready, i_valid, payload in ((1, 0, 0x11), (0, 1, 0x22), (1, 1, 0x33)):
            ctx.set(dut.o.ready, o_ready)
            ctx.set(dut.i.valid, i_valid)
            ctx.set(dut.i.payload, payload)
            assert (ctx.get(dut.i.ready), ctx.get(dut.o.valid), ctx.get(dut.o.payload)) == before

    _simulate(dut, bench)


def _random_payload(rng, fields):
    return tuple(int(rng.integers(0, 1 << min(len(f), 62))) for f in fields)


@pytest.mark.parametrize("signature", [AXI4Signature(addr_width=40, data_width=64, id_width=2),
                                       AXI4LiteSignature(addr_width=8)],
                         ids=["axi4", "axi4-lite"])
@pytest.mark.parametrize("seed", [0, 1])
def test_axi_slice_every_channel_under_random_backpressure(signature, seed):
    """Traffic on all five channels at once, random valid on the driving side and random
    ready on the taking side of each: every channel delivers its beats in order, none lost
    or repeated, each held until taken."""
    rng = np.random.default_rng(seed)
    dut = AXIRegisterSlice(signature)
    channels = axi_channels(signature)
    assert set(channels) == {"aw", "w", "b", "ar", "r"}
    ends = {}
    for prefix, (forward, fields) in channels.items():
        src_if, dst_if = (dut.s, dut.m) if forward else (dut.m, dut.s)
        src_fields = [getattr(src_if, f) for f in fields]
        items = [_random_payload(rng, src_fields) for _ in range(150)]
        ends[prefix] = (
            items,
            _Source(getattr(src_if, f"{prefix}valid"), getattr(src_if, f"{prefix}ready"),
                    src_fields, items, rng, float(rng.uniform(0.3, 1.0))),
            _Sink(getattr(dst_if, f"{prefix}valid"), getattr(dst_if, f"{prefix}ready"),
                  [getattr(dst_if, f) for f in fields], rng, float(rng.uniform(0.3, 1.0))))

    async def bench(ctx):
        for _ in range(3000):
            for _, src, sink in ends.values():
                src.drive(ctx)
                sink.drive(ctx)
            for _, src, sink in ends.values():
                src.sample(ctx)
                sink.sample(ctx)
            await ctx.tick()
            if all(len(sink.got) == len(items) for items, _, sink in ends.values()):
                break

    _simulate(dut, bench)
    for prefix, (items, _, sink) in ends.items():
        assert sink.got == items, f"channel {prefix}"
