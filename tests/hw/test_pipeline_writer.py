"""BandWriter, WriteCompletion and CheckedWriteQueue (Amaranth simulator): tile-ordered row
segments in, row-major beats out, every element and strobe checked against the matrix that
went in; completions after their responses; checked beats with the oracle's verdicts."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from gnnweave.hw.pipeline_writer import BandWriter

L, BUS = 4, 128
EPB = BUS // 16


def tile_order(rows, cols, lanes=L):
    """The MacCore's output order: bands of ``lanes`` rows, tiles of ``lanes`` columns."""
    for i0 in range(0, rows, lanes):
        for j0 in range(0, cols, lanes):
            for r in range(i0, min(i0 + lanes, rows)):
                yield r, j0, min(lanes, cols - j0), r == rows - 1 and j0 + lanes >= cols


def run(mats, *, rows, cols, ready_gaps=0.0, seed=0, max_cols=16):
    dut = BandWriter(lanes=L, index_bits=8, max_cols=max_cols, bus_width=BUS)
    rng = np.random.default_rng(seed)
    segs = [(mb, r, c0, n, last) for mb in range(len(mats)) for r, c0, n, last in tile_order(rows, cols)]
    beats, stalls = [], 0

    async def bench(ctx):
        nonlocal stalls
        ctx.set(dut.rows, rows)
        ctx.set(dut.cols, cols)
        await ctx.tick()
        await ctx.tick()
        i = 0
        for _ in range(20 * len(segs) + 100):
            if i < len(segs):
                mb, r, c0, n, last = segs[i]
                vals = [int(v) & 0xFFFF for v in mats[mb][r, c0:c0 + n]] + [0] * (L - n)
                ctx.set(dut.segments.valid, 1)
                ctx.set(dut.segments.payload.row, r)
                ctx.set(dut.segments.payload.col, c0)
                ctx.set(dut.segments.payload.count, n)
                ctx.set(dut.segments.payload.last, last)
                ctx.set(dut.segments.payload.data.as_value(), sum(v << (16 * k) for k, v in enumerate(vals)))
            else:
                ctx.set(dut.segments.valid, 0)
            ready = int(rng.random() >= ready_gaps)
            ctx.set(dut.beats.ready, ready)
            if i < len(segs):
                if ctx.get(dut.segments.ready):
                    i += 1
                else:
                    stalls += 1
            if ctx.get(dut.beats.valid) and ready:
                pl = dut.beats.payload
                beats.append((ctx.get(pl.row), ctx.get(pl.beat), ctx.get(pl.data), ctx.get(pl.strb),
                              ctx.get(pl.last)))
            await ctx.tick()
            if i == len(segs) and not ctx.get(dut.pending):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return beats, stalls


def check(mats, beats, rows, cols):
    row_beats = -(-cols // EPB)
    assert len(beats) == len(mats) * rows * row_beats
    it = iter(beats)
    for mb, mat in enumerate(mats):
        for r in range(rows):
            for k in range(row_beats):
                row, beat, word, strb, last = next(it)
                assert (row, beat) == (r, k), (mb, r, k)
                n = min(EPB, cols - k * EPB)
                assert strb == (1 << (2 * n)) - 1, (mb, r, k)
                got = [(word >> (16 * e)) & 0xFFFF for e in range(n)]
                assert got == [int(v) & 0xFFFF for v in mat[r, k * EPB:k * EPB + n]], (mb, r, k)
                assert last == (r == rows - 1 and k == row_beats - 1)


@pytest.mark.parametrize("rows,cols", [(8, 16), (6, 12), (1, 4), (5, 16), (6, 10), (3, 3)])
def test_row_major_beats_bit_exact(rows, cols):
    rng = np.random.default_rng(rows * 100 + cols)
    mats = [rng.integers(-2**15, 2**15, (rows, cols)) for _ in range(3)]
    beats, stalls = run(mats, rows=rows, cols=cols)
    check(mats, beats, rows, cols)
    # full bands leave faster than they fill: a steady stream never waits
    if rows % L == 0:
        assert stalls == 0


def test_row_major_beats_under_backpressure():
    rng = np.random.default_rng(7)
    mats = [rng.integers(-2**15, 2**15, (7, 16)) for _ in range(3)]
    beats, stalls = run(mats, rows=7, cols=16, ready_gaps=0.6, seed=3)
    check(mats, beats, 7, 16)
    assert stalls > 0          # the banks filled up: the input waited, nothing was lost


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_bad_lanes():
    with pytest.raises(ValueError, match=r"lanes \(3\) must be a power of two"):
        BandWriter(lanes=3, index_bits=8, max_cols=16, bus_width=128)


def test_write_completion_follows_the_responses():
    """Beats joined into bursts of random length, AW and B after random delays: each
    marked beat completes only once the response of its burst is in, and promptly."""
    from gnnweave.hw.pipeline_writer import WriteCompletion
    dut = WriteCompletion(track=16, marks=4)
    rng = np.random.default_rng(4)
    n = 120
    marked = set(int(i) for i in rng.choice(n, 20, replace=False))
    result = {"completions": [], "b_cycle": {}}

    async def bench(ctx):
        pushed, bursts, formed, cycle = 0, [], 0, 0      # bursts: [first, last, aw_at, b_at]
        while len(result["completions"]) < len(marked) and cycle < 5000:
            push = pushed < n and ctx.get(dut.room) and rng.random() < 0.7
            ctx.set(dut.push, int(push))
            ctx.set(dut.mark, int(push and pushed in marked))
            if push:
                pushed += 1
            # close a burst of the beats pushed so far (1..5 beats)
            if pushed - formed >= rng.integers(1, 6) or (pushed == n and pushed > formed):
                bursts.append([formed, pushed - 1, cycle + int(rng.integers(1, 4)), None])
                formed = pushed
            aw = next((b for b in bursts if b[3] is None), None)      # AWs in order
            aw = aw if aw is not None and aw[2] <= cycle else None
            ctx.set(dut.aw_fire, int(aw is not None))
            if aw is not None:
                ctx.set(dut.aw_len, aw[1] - aw[0])
                aw[3] = cycle + int(rng.integers(1, 8))
            # responses in AW order, one per cycle at most
            due = [b for b in bursts if b[3] is not None and b[3] <= cycle]
            b = due[0] if due and bursts.index(due[0]) == 0 else None
            ctx.set(dut.b_fire, int(b is not None))
            if b is not None:
                for i in range(b[0], b[1] + 1):
                    result["b_cycle"][i] = cycle
                bursts.remove(b)
            if ctx.get(dut.completed):
                result["completions"].append(cycle)
            await ctx.tick()
            cycle += 1

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    done = result["completions"]
    assert len(done) == len(marked)
    for k, beat in enumerate(sorted(marked)):
        b_at = result["b_cycle"][beat]
        assert done[k] > b_at, (k, beat)          # never before its response
        assert done[k] <= b_at + 3 + k, (k, beat)   # and soon after (one completion a cycle)


@pytest.mark.parametrize("track,marks", [(8, 4), (16, 4), (6, 8)])
def test_write_completion_room_holds_at_the_edge(track, marks):
    """A client that pushes a marked beat on every cycle ``room`` allows, against a bus
    that withholds its responses for long stretches: the beats waiting for a response never
    exceed ``track`` nor the marks waiting ``marks`` (``room`` lags a push by two cycles,
    so this is where an overflow would drop a burst length or a mark), and every mark
    still completes, in order, after its response."""
    from gnnweave.hw.pipeline_writer import WriteCompletion
    dut = WriteCompletion(track=track, marks=marks)
    rng = np.random.default_rng(track * marks)
    n = 200
    seen = {"unacked": 0, "waiting": 0}

    async def bench(ctx):
        pushed, acked, done, cycle = 0, 0, 0, 0
        aws, bs = [], []          # beats pushed, AW not yet sent; cycles of AWs, B not yet in
        while done < n and cycle < 100 * n:
            push = pushed < n and bool(ctx.get(dut.room))
            ctx.set(dut.push, int(push))
            ctx.set(dut.mark, int(push))
            if push:
                aws.append(pushed)
                pushed += 1
            # every beat is a burst of its own; its AW soon after the push, its B (after the
            # W beat) at least two cycles after the AW, and only in the bus's open windows
            aw = bool(aws) and rng.random() < 0.8
            ctx.set(dut.aw_fire, int(aw))
            ctx.set(dut.aw_len, 0)
            if aw:
                aws.pop(0)
                bs.append(cycle)
            open_bus = (cycle // 37) % 3 == 2
            b = bool(bs) and bs[0] <= cycle - 2 and open_bus and rng.random() < 0.6
            ctx.set(dut.b_fire, int(b))
            if b:
                bs.pop(0)
                acked += 1
            if ctx.get(dut.completed):
                assert done < acked, (done, acked)          # never before its response
                done += 1
            seen["unacked"] = max(seen["unacked"], pushed - acked)
            seen["waiting"] = max(seen["waiting"], pushed - done)
            await ctx.tick()
            cycle += 1
        seen["done"] = done

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen["done"] == n, seen
    assert seen["waiting"] <= marks, seen["waiting"]
    assert seen["unacked"] <= track, seen["unacked"]


def guard_oracle(addr, buf_base, buf_size, bpb=BUS // 8):
    """The beat lies in ``[buf_base, buf_base + buf_size)`` and within one 4 KiB page."""
    return buf_base <= addr and addr + bpb <= buf_base + buf_size and addr % 4096 + bpb <= 4096


def run_checked_queue(beats, *, aw, ow, depth=4, offer_p=0.8, take_p=0.5, seed=6):
    """Offers ``beats`` (dicts of the payload's fields) to a CheckedWriteQueue under random
    back-pressure; returns the beats that came out and the cycles they left in."""
    from gnnweave.hw.pipeline_writer import CheckedWriteQueue
    dut = CheckedWriteQueue(addr_width=aw, offset_width=ow, bus_width=BUS, depth=depth)
    rng = np.random.default_rng(seed)
    n = len(beats)
    out, cycles = [], []

    async def bench(ctx):
        i, cycle, entered = 0, 0, False
        while len(out) < n and cycle < 20 * n + 50:
            # the flip-flops ready is made of: the beat taken last cycle, and a credit
            # left, which is the ready after a cycle without a beat
            assert ctx.get(dut.entering) == entered
            if not entered:
                assert ctx.get(dut.beats.ready) == ctx.get(dut.credit)
            offer = i < n and rng.random() < offer_p
            ctx.set(dut.beats.valid, int(offer))
            if offer:
                b = beats[i]
                for k, v in (("base", b["base"]), ("row_offset", b["row"]), ("beat_offset", b["beat"]),
                             ("data", b["data"]), ("strb", b["strb"]), ("mark", int(b["mark"])),
                             ("buf_base", b["buf_base"]), ("buf_size", b["buf_size"])):
                    ctx.set(getattr(dut.beats.payload, k), v)
            take = rng.random() < take_p
            ctx.set(dut.queued.ready, int(take))
            entered = bool(offer and ctx.get(dut.beats.ready))
            if entered:
                i += 1
            if take and ctx.get(dut.queued.valid):
                p = dut.queued.payload
                out.append({k: ctx.get(getattr(p, k)) for k in ("addr", "data", "strb", "mark", "inside")})
                cycles.append(cycle)
            await ctx.tick()
            cycle += 1
        for _ in range(8):
            await ctx.tick()
        assert ctx.get(dut.empty) and not ctx.get(dut.queued.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert len(out) == n
    for b, o in zip(beats, out):
        assert (o["addr"], o["data"], o["strb"], o["mark"], o["inside"]) == \
            (b["addr"], b["data"], b["strb"], int(b["mark"]), int(b["inside"])), b
    return out, cycles


def checked_beat(rng, base, row, beat, buf_base, buf_size, i=0):
    addr = base + row + beat
    return dict(base=base, row=row, beat=beat, data=int(rng.integers(0, 1 << 62)),
                strb=int(rng.integers(0, 1 << 16)), mark=i % 3 == 0, buf_base=buf_base,
                buf_size=buf_size, addr=addr, inside=guard_oracle(addr, buf_base, buf_size))


def test_checked_write_queue_addresses_and_verdicts():
    """Random beats (address parts, buffer bounds) in under random back-pressure on the
    queue's head: every beat comes out once, in order, with its address summed and its
    buffer verdict the oracle's; the queue never takes more beats than it has room for."""
    aw, ow = 40, 24
    rng = np.random.default_rng(6)
    n = 150
    beats = []
    for i in range(n):
        base = int(rng.integers(0, 1 << 30)) & ~15
        row, beat = int(rng.integers(0, 1 << 16)) & ~15, int(rng.integers(0, 64)) * 16
        addr = base + row + beat
        buf_base = max(addr - int(rng.integers(-2, 3)) * 16, 0)
        buf_size = int(rng.integers(0, 4)) * 16
        beats.append(checked_beat(rng, base, row, beat, buf_base, buf_size, i))
    run_checked_queue(beats, aw=aw, ow=ow)
    assert sum(b["inside"] for b in beats) not in (0, n)     # both verdicts were exercised


def test_checked_write_queue_refuses_every_beat_outside():
    """Beats at and around every edge of their buffer (one byte before or after its start
    and end, buffers shorter than a beat or empty, buffers ending at the top of the
    address space, unaligned beats crossing a 4 KiB page) and in the upper address bits
    (buffers that differ from the beat only there): the verdict is the oracle's for each,
    so no beat outside its buffer is ever let through."""
    aw, ow = 40, 24
    top = 1 << aw
    rng = np.random.default_rng(11)
    beats = []

    def add(addr, buf_base, buf_size):
        base = addr & ~((1 << 20) - 1)
        rest = addr - base
        row, beat = rest & ~0xFFF, rest & 0xFFF
        beats.append(checked_beat(rng, base, row, beat, buf_base, buf_size, len(beats)))

    for addr in (0, 16, 4096 - 16, 4096, 0x1234_5670, top - 4096, top - 32, top - 16):
        for d_base in (-16, -1, 0, 1, 16):
            for d_end in (-17, -16, -1, 0, 1, 16):
                buf_base = addr + d_base
                buf_size = addr + 16 + d_end - buf_base
                if 0 <= buf_base < top and 0 <= buf_size < top:
                    add(addr, buf_base, buf_size)
    for addr in (0, 8, 16, 4096 * 5):
        for size in (0, 1, 8, 15, 16, 17):
            add(addr, addr, size)
    for addr in (4096 - 8, 4096 * 3 - 1, 4096 * 7 - 15, 4096 * 9 + 1):    # unaligned
        add(addr, addr - 64, 256)
    for k in range(40):            # buffers that differ from the beat in high bits only
        addr = int(rng.integers(0, top - 4096)) & ~15
        flip = 1 << int(rng.integers(20, aw))
        buf_base = addr ^ flip if k % 2 else addr
        add(addr, buf_base, 16 if k % 2 else int(rng.integers(0, 32)) * 16)
    assert any(b["inside"] for b in beats) and not all(b["inside"] for b in beats)
    run_checked_queue(beats, aw=aw, ow=ow, depth=8)


def test_checked_write_queue_full_rate():
    """Offered every cycle and drained every cycle, the queue takes and gives one beat
    per cycle (initiation interval 1) after the four stages and the FIFO's latency."""
    from gnnweave.hw.pipeline_writer import CheckedWriteQueue
    rng = np.random.default_rng(3)
    beats = [checked_beat(rng, 1 << 20, 0, 16 * i, 1 << 20, 1 << 16, i) for i in range(64)]
    out, cycles = run_checked_queue(beats, aw=40, ow=24, depth=8, offer_p=1.0, take_p=1.0)
    first = cycles[0]
    assert cycles == list(range(first, first + len(beats)))
    assert first == CheckedWriteQueue.STAGES + 2


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_checked_write_queue_depth_is_checked():
    from gnnweave.hw.pipeline_writer import CheckedWriteQueue
    with pytest.raises(ValueError, match=r"CheckedWriteQueue depth must be >= 2, not 1"):
        CheckedWriteQueue(addr_width=40, offset_width=24, bus_width=BUS, depth=1)
