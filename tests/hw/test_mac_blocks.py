"""The MacArray front end's parts alone (hw/mac_blocks.py), in the Amaranth simulator,
each against a plain-Python model of what it must do."""
from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from gnnweave.hw.mac import buffer_write_layout
from gnnweave.hw.mac_blocks import BlockLoader, BlockWalker, ResultWriter, aligned_burst_beats


def _run(dut, bench, deadline=1e-3):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run_until(deadline)


def test_aligned_burst_beats():
    assert aligned_burst_beats(16, 16) == 16
    assert aligned_burst_beats(12, 16) == 8
    assert aligned_burst_beats(256, 64) == 64        # 4 KiB of 64-byte beats
    assert aligned_burst_beats(1, 16) == 1


@pytest.mark.parametrize("nrows,ncols,base_beats,stride_beats,seed", [
    (5, 37, 3, 7, 0),        # rows cross aligned boundaries and a 4 KiB page
    (4, 8, 250, 1, 1),       # one-beat rows, back to back, across a page
    (3, 128, 0, 16, 2),      # 16-beat rows, aligned
    (0, 8, 0, 1, 3),         # nothing to read
])
def test_block_loader_reads_every_row_in_aligned_bursts(nrows, ncols, base_beats, stride_beats, seed):
    bus, bpb, epb = 128, 16, 8
    # the write port of a 128 x 128 buffer of 8 lanes
    dut = BlockLoader(addr_width=32, bus_width=bus, max_burst=16, max_rows=128,
                      write_layout=buffer_write_layout(8, 7, 8))
    rng = random.Random(seed)
    mem = np.random.default_rng(seed).integers(-2**15, 2**15, size=64 * 1024, dtype=np.int64)
    base, stride = base_beats * bpb, max(stride_beats, -(-ncols // epb)) * bpb
    seen = {"bursts": [], "writes": {}, "done_at": None}

    async def bench(ctx):
        ctx.set(dut.base, base)
        ctx.set(dut.stride, stride)
        ctx.set(dut.nrows, nrows)
        ctx.set(dut.ncols, ncols)
        ctx.set(dut.bank, 1)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        pending = []          # (ready cycle, beat address) in request order
        beats = writes = 0
        for cycle in range(3000):
            # each beat is written a cycle after it arrives, from registers
            if ctx.get(dut.wr_en):
                assert ctx.get(dut.wr_en) == 0b10
                writes += 1
                wr = ctx.get(dut.wr)
                for lane in range(wr.count):
                    seen["writes"][(wr.row, wr.col + lane)] = wr.data[lane]
                # the banks written: bank b holds lane (b - row) mod 8
                assert ctx.get(dut.wr_mask) == sum(1 << b for b in range(8)
                                                   if (b - wr.row) % 8 < wr.count)
            ready = rng.random() < 0.7
            ctx.set(dut.request.ready, ready)
            if ctx.get(dut.request.valid) and ready:
                addr, length = ctx.get(dut.request.payload.addr), ctx.get(dut.request.payload.len)
                seen["bursts"].append((addr, length + 1))
                pending += [(cycle + 4, addr + i * bpb) for i in range(length + 1)]
            beat = pending and pending[0][0] <= cycle and rng.random() < 0.8
            if beat:
                _, addr = pending.pop(0)
                word = sum((int(mem[addr // 2 + i]) & 0xFFFF) << (16 * i) for i in range(epb))
                ctx.set(dut.response, {"valid": 1, "data": word, "last": 0})
            else:
                ctx.set(dut.response, {"valid": 0, "data": 0, "last": 0})
            beats += bool(beat)
            await ctx.tick()
            if ctx.get(dut.done) and not pending and seen["done_at"] is None:
                assert writes == beats and not ctx.get(dut.wr_en)
                seen["done_at"] = cycle
                break

    _run(dut, bench)
    assert seen["done_at"] is not None
    for addr, beats in seen["bursts"]:
        assert 1 <= beats <= 16
        assert addr % bpb == 0 and addr // 4096 == (addr + beats * bpb - 1) // 4096
        # only the first burst of a row may start off the aligned boundary
        assert (addr // (16 * bpb)) == ((addr + beats * bpb - 1) // (16 * bpb))
    want = {(r, c): int(mem[(base + r * stride) // 2 + c]) for r in range(nrows) for c in range(ncols)}
    assert seen["writes"] == want
    row_beats = -(-ncols // epb)
    assert sum(b for _, b in seen["bursts"]) == nrows * row_beats


def _walk_model(m, n, k, D, MD):
    steps = []
    for i0 in range(0, m, D):
        for j0 in range(0, n, D):
            for k0 in range(0, k, MD):
                steps.append((i0, j0, k0, min(D, m - i0), min(D, n - j0), min(MD, k - k0)))
    return steps


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (40, 17, 70), (16, 48, 16), (33, 16, 5)])
def test_block_walker_visits_every_step_with_its_extents(m, n, k):
    D, MD = 16, 32
    dut = BlockWalker(block=D, depth_block=MD)
    want = _walk_model(m, n, k, D, MD)
    got = []

    async def bench(ctx):
        ctx.set(dut.m, m)
        ctx.set(dut.n, n)
        ctx.set(dut.k, k)
        ctx.set(dut.restart, 1)
        for _ in range(3):
            await ctx.tick()
        ctx.set(dut.restart, 0)
        for _ in range(len(want)):
            while not ctx.get(dut.ready):
                await ctx.tick()
            step = tuple(ctx.get(s) for s in (dut.i0, dut.j0, dut.k0, dut.bm, dut.bn, dut.bk))
            flags = tuple(ctx.get(s) for s in (dut.first_k, dut.last_k, dut.last_j, dut.last,
                                               dut.next_j0, dut.next_bn, dut.last_block))
            got.append((step, flags))
            ctx.set(dut.step, 1)
            await ctx.tick()
            ctx.set(dut.step, 0)

    _run(dut, bench)
    assert [s for s, _ in got] == want
    for idx, ((i0, j0, k0, bm, bn, bk), (first_k, last_k, last_j, last, next_j0, next_bn,
                                         last_block)) in enumerate(got):
        assert first_k == (k0 == 0) and last_k == (k0 + MD >= k) and last_j == (j0 + D >= n)
        assert last_block == (last_j and i0 + D >= m)
        assert last == (idx == len(want) - 1)
        assert next_j0 == (0 if last_j else j0 + D) and next_bn == min(D, n - next_j0)


@pytest.mark.parametrize("rows", [4, 3])      # band flags from the row's bits / tracked
def test_result_writer_addresses_lanes_strobes_and_guard(rows):
    cols, bus = 4, 128
    dut = ResultWriter(rows=rows, cols=cols, index_bits=8, out_width=16, addr_width=32, bus_width=bus)
    stride, block_base, out_lo = 256, 0x1000 + 32, 0x1000
    out_size = 9 * stride        # rows 0..8 fit; row 9 of the block is outside the buffer
    # a 10 x 7 block, tile by tile (rows x 4 tiles: the last column's are 3 wide), rows of
    # a tile in order
    segs = [(r, j0, min(4, 7 - j0)) for i0 in range(0, 10, rows) for j0 in range(0, 7, 4)
            for r in range(i0, min(i0 + rows, 10))]
    rng = random.Random(5)
    got = []

    async def bench(ctx):
        end = out_lo + out_size
        ctx.set(dut.block_base, block_base)
        ctx.set(dut.out_stride, stride)
        ctx.set(dut.out_lo, out_lo)
        ctx.set(dut.out_hi, end - bus // 8)
        ctx.set(dut.out_room, 1)
        queue = list(segs)
        for _ in range(400):
            ctx.set(dut.beats.ready, rng.random() < 0.6)
            if queue:
                r, c, count = queue[0]
                ctx.set(dut.rows.valid, 1)
                ctx.set(dut.rows.payload, {"row": r, "col": c, "count": count, "last": 0,
                                           "relu_mask": 0, "data": [r * 16 + c + i for i in range(cols)]})
            else:
                ctx.set(dut.rows.valid, 0)
            if ctx.get(dut.beats.valid) and ctx.get(dut.beats.ready):
                b = ctx.get(dut.beats.payload)
                got.append((b.addr, b.data, b.strb))
            if queue and ctx.get(dut.rows.ready):
                queue.pop(0)
            await ctx.tick()
        assert ctx.get(dut.fault) == 1 and ctx.get(dut.pending) == 0

    _run(dut, bench)
    want = []
    for r, c, count in segs:
        if r >= 9:
            break                # the first beat outside: dropped, and nothing after it
        addr = block_base + r * stride + c * 2
        lane = (addr % 16) // 2
        data = sum((r * 16 + c + i) << (16 * (lane + i)) for i in range(cols))
        strb = ((1 << (2 * count)) - 1) << (2 * lane)
        want.append((addr - addr % 16, data, strb))
    assert got == want


def test_result_writer_takes_a_segment_every_cycle_into_an_always_ready_sink():
    """The credits cover the stages and the credit's way back: with the sink always ready,
    a long run of segments enters at one per cycle once the first is in."""
    cols, bus, rows = 4, 128, 4
    dut = ResultWriter(rows=rows, cols=cols, index_bits=8, out_width=16, addr_width=32, bus_width=bus)
    segs = [(r, j0, 4) for i0 in range(0, 64, rows) for j0 in range(0, 8, 4)
            for r in range(i0, i0 + rows)]
    taken = []

    async def bench(ctx):
        ctx.set(dut.out_stride, 256)
        ctx.set(dut.out_lo, 0)
        ctx.set(dut.out_hi, 1 << 20)
        ctx.set(dut.out_room, 1)
        ctx.set(dut.beats.ready, 1)
        queue = list(segs)
        for cycle in range(len(segs) + 40):
            ctx.set(dut.rows.valid, bool(queue))
            if queue:
                r, c, count = queue[0]
                ctx.set(dut.rows.payload, {"row": r, "col": c, "count": count, "last": 0,
                                           "relu_mask": 0, "data": [0] * cols})
            if queue and ctx.get(dut.rows.ready):
                queue.pop(0)
                taken.append(cycle)
            await ctx.tick()

    _run(dut, bench)
    assert len(taken) == len(segs)
    # after the first few, one per cycle
    assert taken[-1] - taken[4] == len(segs) - 1 - 4
