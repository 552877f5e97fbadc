"""The Aggregator's metadata reader against the shared ElementReader: the same stimulus,
cycle by cycle the same requests, elements and ``done``, over several runs."""
from __future__ import annotations

import random
from collections import deque

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from gnnweave.hw.aggregator_reader import MetaReader
from gnnweave.hw.blocks import ElementReader


@pytest.mark.parametrize("elem_width,counts,fifo_beats,max_burst,seed", [
    (32, [37, 0, 5], 8, 4, 0), (16, [200, 1, 9], 32, 16, 1), (8, [5, 33], 4, 4, 2),
    (16, [2, 3, 16, 17], 8, 2, 4), (128, [3, 1, 4], 8, 4, 5), (64, [7, 2], 8, 8, 6),
])
def test_meta_reader_is_the_element_reader_cycle_for_cycle(elem_width, counts, fifo_beats,
                                                           max_burst, seed):
    rng = random.Random(seed)
    dw, bpb = 128, 16
    base = 4096 - 3 * bpb                   # the run crosses a 4 KiB page early
    kw = dict(addr_width=32, data_width=dw, elem_width=elem_width, fifo_beats=fifo_beats,
              max_burst=max_burst)
    ref, dut = ElementReader(**kw), MetaReader(**kw)
    top = Module()
    top.submodules.ref, top.submodules.dut = ref, dut
    memory = {base + i * bpb: rng.getrandbits(dw) for i in range(4096)}
    per_beat = dw // elem_width
    traces = {"ref": [], "dut": []}
    elements = []

    async def bench(ctx):
        for count in counts:
            pending = deque()
            for r in (ref, dut):
                ctx.set(r.base, base)
                ctx.set(r.count, count)
                ctx.set(r.start, 1)
            await ctx.tick()
            for r in (ref, dut):
                ctx.set(r.start, 0)
            got = []
            for t in range(3000):
                request_ready = rng.random() < 0.6
                elements_ready = t % 97 > 30 and rng.random() < 0.7
                beat = pending and pending[0][0] <= t and rng.random() < 0.8
                if beat:
                    _, addr = pending.popleft()
                for r in (ref, dut):
                    ctx.set(r.request.ready, request_ready)
                    ctx.set(r.elements.ready, elements_ready)
                    ctx.set(r.response.valid, bool(beat))
                    if beat:
                        ctx.set(r.response.data, memory[addr])
                for name, r in (("ref", ref), ("dut", dut)):
                    traces[name].append((
                        ctx.get(r.request.valid), ctx.get(r.request.payload.addr),
                        ctx.get(r.request.payload.len), ctx.get(r.elements.valid),
                        ctx.get(r.elements.payload) if ctx.get(r.elements.valid) else None,
                        ctx.get(r.done)))
                assert traces["ref"][-1] == traces["dut"][-1], (count, t)
                if ctx.get(ref.request.valid) and request_ready:
                    addr0 = ctx.get(ref.request.payload.addr)
                    n = ctx.get(ref.request.payload.len) + 1
                    when = t + rng.randrange(2, 12)
                    pending.extend((when, addr0 + i * bpb) for i in range(n))
                if ctx.get(ref.elements.valid) and elements_ready:
                    got.append(ctx.get(ref.elements.payload))
                if ctx.get(ref.done) and not pending and t > 20:
                    break
                await ctx.tick()
            elements.append(got)
            for _ in range(3):
                await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    for count, got in zip(counts, elements):
        want = [(memory[base + (k // per_beat) * bpb] >> (elem_width * (k % per_beat)))
                & ((1 << elem_width) - 1) for k in range(count)]
        assert got == want
