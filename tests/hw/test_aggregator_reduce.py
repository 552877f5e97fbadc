"""The Aggregator's reduce and drain alone (Amaranth simulation): accumulators bit-exact
against integer sums and maxima of the products, output bursts against their addresses."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from gnnweave.hw.aggregator_drain import Drain
from gnnweave.hw.aggregator_reduce import Reduce

LANES, EW, ACC_W = 4, 16, 64


def _run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def _wrap(value, bits=ACC_W):
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _graph(rng, nodes, row_beats):
    """Per node: its edges' (weight, row of row_beats x LANES elements) and a reciprocal."""
    out = []
    for _ in range(nodes):
        degree = int(rng.choice([0, 1, 1, 2, 3, 7]))
        edges = [(int(rng.integers(-32768, 32768)),
                  rng.integers(-32768, 32768, size=(row_beats, LANES)).tolist())
                 for _ in range(degree)]
        out.append((edges, int(rng.integers(0, 1 << 25))))
    # the extremes: the largest products, and a sum that wraps nothing at 64 bits
    out.append(([(-32768, [[-32768] * LANES] * row_beats)] * 3, 1))
    return out


def _reduce_oracle(graph, op):
    """Per node: (zero, recip, accumulators [beat][lane]) as the banks must hold them."""
    want = []
    for edges, recip in graph:
        if not edges:
            want.append((1, recip, None))
            continue
        products = np.array([[[w * x for x in beat] for beat in row] for w, row in edges],
                            dtype=object)
        acc = products.max(axis=0) if op == "max" else products.sum(axis=0)
        want.append((0, recip, [[_wrap(int(v)) for v in beat] for beat in acc]))
    return want


@pytest.mark.parametrize("op, row_beats, p_row, p_drain", [
    ("sum", 1, 1.0, 1.0), ("sum", 3, 0.7, 0.5), ("max", 1, 0.8, 1.0), ("max", 2, 1.0, 0.3),
    ("sum", 4, 1.0, 1.0)])
def test_reduce_accumulates_like_integer_arithmetic(op, row_beats, p_row, p_drain):
    """Back-to-back products into one entry (one-beat rows) go through the forwarding path;
    the drain reads each closed bank while the next node accumulates."""
    rng = np.random.default_rng(row_beats * 10 + int(p_row * 7 + p_drain * 3))
    graph = _graph(rng, 40, row_beats)
    dut = Reduce(lanes=LANES, elem_width=EW, acc_width=ACC_W, max_beats=4, reduce_max=True)
    rows = [sum((x & 0xFFFF) << (EW * k) for k, x in enumerate(beat))
            for edges, _ in graph for _, row in edges for beat in row]
    descs = []
    for edges, recip in graph:
        if not edges:
            descs.append({"desc": {"weight": 0, "last": 1, "empty": 1, "count": 0}, "recip": recip})
        for j, (w, _) in enumerate(edges):
            last = j == len(edges) - 1
            descs.append({"desc": {"weight": w, "last": int(last), "empty": 0,
                                   "count": len(edges) if last else 0}, "recip": recip})
    got = []

    async def bench(ctx):
        ctx.set(dut.row_last_beat, row_beats - 1)
        ctx.set(dut.max, op == "max")
        r = d = 0
        beat, beats = 0, []
        read = None         # (single, node done) the drain read the flags of last cycle
        for _ in range(20 * len(rows) + 500):
            ctx.set(dut.rows.valid, r < len(rows) and rng.random() < p_row)
            ctx.set(dut.rows.payload, rows[r] if r < len(rows) else 0)
            ctx.set(dut.descriptors.valid, d < len(descs))
            ctx.set(dut.descriptors.payload, descs[d] if d < len(descs) else descs[0])
            if read is not None:
                # a cycle after the flags, the accumulators: the node's even and odd edges',
                # as the output stage combines them (the even ones alone for one edge)
                single, done = read
                data = ctx.get(dut.bank.data)
                even = [_wrap(data >> (ACC_W * k)) for k in range(LANES)]
                odd = [_wrap(data >> (ACC_W * (LANES + k))) for k in range(LANES)]
                beats.append(even if single else [max(e, o) if op == "max" else _wrap(e + o)
                                                  for e, o in zip(even, odd)])
                if done:
                    got.append((*done, beats))
                    beats = []
            reading = ctx.get(dut.bank.ready) and rng.random() < p_drain
            release = reading and beat == row_beats - 1
            ctx.set(dut.bank.release, release)
            read = None
            if reading:
                done = (ctx.get(dut.bank.zero), ctx.get(dut.bank.recip)) if release else None
                # the beat's number goes with the flags, its accumulators come a cycle later
                ctx.set(dut.bank.beat, beat)
                read = (ctx.get(dut.bank.single), done)
                beat = 0 if release else beat + 1
            r += ctx.get(dut.rows.valid) and ctx.get(dut.rows.ready)
            d += ctx.get(dut.descriptors.valid) and ctx.get(dut.descriptors.ready)
            await ctx.tick()
            if len(got) == len(graph):
                break
        assert not ctx.get(dut.busy)

    _run(dut, bench)
    want = _reduce_oracle(graph, op)
    assert len(got) == len(want)
    for node, ((zero, recip, acc), (w_zero, w_recip, w_acc)) in enumerate(zip(got, want)):
        assert (zero, recip) == (w_zero, w_recip), node
        if not zero:
            assert acc == w_acc, node


def test_reduce_takes_a_beat_every_cycle():
    """With rows and descriptors always there and the drain always reading, no bubble."""
    row_beats, nodes, degree = 2, 30, 4
    dut = Reduce(lanes=LANES, elem_width=EW, acc_width=ACC_W, max_beats=4, reduce_max=False)
    taken = []

    async def bench(ctx):
        ctx.set(dut.row_last_beat, row_beats - 1)
        ctx.set(dut.rows.valid, 1)
        ctx.set(dut.rows.payload, 0x0001_0002_0003_0004)
        n = 0
        beat = 0
        for t in range(nodes * degree * row_beats + 40):
            ctx.set(dut.descriptors.valid, 1)
            ctx.set(dut.descriptors.payload, {"desc": {"weight": 1, "last": n % degree == degree - 1,
                                                       "empty": 0, "count": degree}, "recip": 0})
            ctx.set(dut.bank.beat, beat)
            release = ctx.get(dut.bank.ready) and beat == row_beats - 1
            ctx.set(dut.bank.release, release)
            beat = 0 if release else beat + ctx.get(dut.bank.ready)
            if ctx.get(dut.rows.ready):
                taken.append(t)
            n += ctx.get(dut.descriptors.ready) and ctx.get(dut.descriptors.valid)
            await ctx.tick()

    _run(dut, bench)
    # after the descriptor slice fills, one row beat per cycle
    gaps = np.diff(taken[:nodes * degree * row_beats])
    assert len(taken) >= nodes * degree * row_beats and gaps.max() == 1


# ---------------------------------------------------------------- drain
def _row_bursts(addr, row_beats, bpb=16):
    first = min((4096 - addr % 4096) // bpb, row_beats)
    bursts = [(addr, first - 1)]
    if first < row_beats:
        bursts.append((addr + first * bpb, row_beats - first - 1))
    return bursts


@pytest.mark.parametrize("row_beats, stride, p_ready, p_aw, p_w, first_beats", [
    (1, 16, 1.0, 1.0, 1.0, None), (3, 48, 0.6, 0.5, 0.4, None), (8, 4096 + 64, 1.0, 0.7, 1.0, None),
    (5, 336, 0.8, 1.0, 0.2, None),
    # the first row's first burst is one beat, later rows' first bursts one beat more or
    # less each (strides a beat off a page), at full rate and stalling
    (2, 4096 - 16, 1.0, 1.0, 1.0, 1), (3, 4096 + 16, 0.8, 0.6, 0.5, 1),
    (8, 4096 - 80, 1.0, 1.0, 1.0, 1), (8, 144, 0.7, 0.4, 0.6, 1), (5, 4096 - 48, 0.5, 1.0, 0.3, 1)])
def test_drain_sends_every_row_and_its_bursts(row_beats, stride, p_ready, p_aw, p_w, first_beats):
    rng = np.random.default_rng(row_beats * 100 + stride)
    nodes, credits, lanes = 60, 6, LANES
    # rows near and across 4 KiB pages; with first_beats, the first row that far before one
    back = int(rng.integers(0, 12)) if first_beats is None else first_beats
    base = 4096 * 7 - 16 * back
    dut = Drain(lanes=lanes, acc_width=ACC_W, max_beats=8, addr_width=48, bytes_per_beat=16,
                credits=credits)
    last_mask = 0b0011
    zeros = [int(rng.random() < 0.2) for _ in range(nodes)]
    recips = [int(rng.integers(0, 1 << 25)) for _ in range(nodes)]
    beats, bursts = [], []

    def acc(node, beat):
        return (node << 16 | beat) * 0x1_0000_0001

    async def bench(ctx):
        ctx.set(dut.base, base)
        ctx.set(dut.stride, stride)
        ctx.set(dut.row_beats, row_beats)
        ctx.set(dut.row_last_beat, row_beats - 1)
        ctx.set(dut.last_mask, last_mask)
        ctx.set(dut.launch, 1)
        await ctx.tick()
        ctx.set(dut.launch, 0)
        node, owed = 0, 0
        read_node = 0           # the bank the drain read flags of a cycle ago
        read_beat = 0           # the beat it asked for then (the reduce registers it)
        for _ in range(nodes * row_beats * 12 + 100):
            ready = node < nodes and rng.random() < p_ready
            ctx.set(dut.bank.ready, ready)
            ctx.set(dut.bank.zero, zeros[node] if node < nodes else 0)
            ctx.set(dut.bank.recip, recips[node] if node < nodes else 0)
            ctx.set(dut.bank.data, acc(read_node, read_beat))
            read_node, read_beat = node, ctx.get(dut.bank.beat)
            ctx.set(dut.aw.ready, rng.random() < p_aw)
            back = owed > 0 and rng.random() < p_w        # the write port takes a beat
            ctx.set(dut.beat_done, back)
            owed -= back
            if ctx.get(dut.aw.valid) and ctx.get(dut.aw.ready):
                bursts.append((ctx.get(dut.aw.payload.addr), ctx.get(dut.aw.payload.len)))
            if ctx.get(dut.o.valid):
                o = ctx.get(dut.o.payload)
                beats.append((o.acc, o.mask, o.last, o.zero, o.recip))
                owed += 1
            node += ctx.get(dut.bank.release)
            assert owed <= credits, "a beat was sent without the write port's room"
            await ctx.tick()
        assert ctx.get(dut.nodes) == nodes and not ctx.get(dut.busy)

    _run(dut, bench)
    want_bursts = [b for v in range(nodes) for b in _row_bursts(base + v * stride, row_beats)]
    assert bursts == want_bursts
    ends = {v * row_beats + first - 1 for v in range(nodes)
            for first in [min((4096 - (base + v * stride) % 4096) // 16, row_beats)]}
    want_beats = [(acc(v, b), last_mask if b == row_beats - 1 else 0b1111,
                   int(b == row_beats - 1 or v * row_beats + b in ends), zeros[v], recips[v])
                  for v in range(nodes) for b in range(row_beats)]
    assert beats == want_beats
