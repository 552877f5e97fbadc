"""Row-major beats from a MAC core's tile-ordered output, so the writes form INCR bursts.

A :class:`~.mac.MacCore` emits its result row segment by row segment in tile order: a
band of ``lanes`` rows, within it tile by tile, within a tile row by row. Neighbouring
segments are different rows, so written as they come every beat is a burst of its own
(and a ``lanes``-element segment fills only part of a beat). :class:`BandWriter` collects
a band in one of two banks and, while the next band arrives in the other, reads it out
row by row, beat by beat: consecutive addresses, which
:class:`~.dma.WritePort` ``(coalesce=True)`` joins into bursts.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .blocks import BufferedFIFO
from .mac import MAC_INPUT_WIDTH, output_layout


def band_beat_layout(index_bits: int, beat_index_bits: int, bus_width: int) -> data.StructLayout:
    """One beat of :class:`BandWriter`: its row and beat within the row, data, byte strobes,
    and ``last`` on the final beat of the microbatch."""
    return data.StructLayout({"row": index_bits, "beat": beat_index_bits, "data": bus_width,
                              "strb": bus_width // 8, "last": 1})


class BandWriter(wiring.Component):
    """Tile-ordered row segments (``segments``, :func:`~.mac.output_layout` of ``lanes``
    columns) of a ``rows x cols`` microbatch -> its beats in row-major order (``beats``,
    :func:`band_beat_layout`).

    ``rows`` and ``cols`` (``1..max_cols``) are steady while a microbatch passes. A band
    (``lanes`` rows, fewer in the last) is complete with its last row's segment at the
    last column; its beats leave one per cycle (``ready`` permitting), row by row, the
    last beat of a row with WSTRB covering only the row's elements. ``segments.ready`` is
    low only while both banks hold a band that has not left: a band takes one segment of
    ``lanes`` elements per cycle and leaves one beat of ``bus_width / 16`` a cycle, so with
    ``rows`` a multiple of ``lanes`` a steady stream never waits; a shorter last band may
    wait for the band before it to leave. ``pending``: a band is held or leaving.
    """

    def __init__(self, *, lanes: int, index_bits: int, max_cols: int, bus_width: int):
        epb = bus_width // MAC_INPUT_WIDTH
        if lanes < 1 or lanes & (lanes - 1) or epb % lanes or max_cols % lanes:
            raise ValueError(f"BandWriter: lanes ({lanes}) must be a power of two dividing the "
                             f"beat's {epb} elements and max_cols ({max_cols})")
        self.lanes, self.index_bits, self.bus_width = lanes, index_bits, bus_width
        self.epb = epb
        #: beats of the widest row
        self.row_beats = max(-(-max_cols // epb), 1)
        self.beat_bits = max((self.row_beats - 1).bit_length(), 1)
        super().__init__({
            "rows": In(index_bits), "cols": In(index_bits),
            "segments": In(stream.Signature(output_layout(lanes, index_bits, MAC_INPUT_WIDTH))),
            "beats": Out(stream.Signature(band_beat_layout(index_bits, self.beat_bits, bus_width))),
            "pending": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        L, epb, RB = self.lanes, self.epb, self.row_beats
        lb = L.bit_length() - 1
        bpb = self.bus_width // 8
        seg = self.segments.payload
        seg_bits = L * MAC_INPUT_WIDTH
        row_slots = L * RB                       # beats of one band
        mem = Memory(shape=self.bus_width, depth=2 * row_slots, init=[])
        m.submodules.bands = mem
        wp = mem.write_port(granularity=seg_bits)
        rp = mem.read_port()

        # per-run constants (the configuration is steady): beats per row - 1, the last
        # beat's strobes, rows - 1
        beats_last = Signal(self.beat_bits, name="band_beats_last", reset_less=True)
        strb_last = Signal(bpb, name="band_strb_last", reset_less=True)
        rows_last = Signal(self.index_bits, name="band_rows_last", reset_less=True)
        # the first column of a row's last segment (segments start at multiples of lanes):
        # a segment ends its row when its column reaches it, a compare with no adder before
        last_seg_col = Signal(self.index_bits, name="band_last_seg_col", reset_less=True)
        row_bytes = self.cols * (MAC_INPUT_WIDTH // 8)
        tail_bytes = Signal(range(bpb + 1), name="band_tail_bytes")   # bytes of a row's last beat
        m.d.comb += tail_bytes.eq(((row_bytes - 1) & (bpb - 1)) + 1)
        m.d.sync += [beats_last.eq((row_bytes - 1) // bpb), rows_last.eq(self.rows - 1),
                     last_seg_col.eq((self.cols - 1) & ~Const(L - 1, self.index_bits)),
                     strb_last.eq((Const(1, bpb + 1) << tail_bytes) - 1)]

        # ---- fill: bank `fill` takes segments; full[b]: bank b holds a complete band
        fill = Signal()
        full = [Signal(name=f"band{b}_full") for b in (0, 1)]
        band_row0 = [Signal(self.index_bits, name=f"band{b}_row0", reset_less=True) for b in (0, 1)]
        band_last = [Signal(name=f"band{b}_last", reset_less=True) for b in (0, 1)]
        # each bank's last row index within its band (its rows - 1), so the drain's "last
        # row" is an equality of registers per bank, no adder behind the bank flags
        band_rlast = [Signal(range(L), name=f"band{b}_rlast", reset_less=True) for b in (0, 1)]
        fill_full = Mux(fill, full[1], full[0])
        take = self.segments.valid & ~fill_full
        m.d.comb += self.segments.ready.eq(~fill_full)
        in_row = seg.row[:lb] if lb else Const(0, 1)
        word = seg.col >> (epb.bit_length() - 1)              # beat within the row
        lane = (seg.col >> lb)[:max((epb // L - 1).bit_length(), 1)] if epb > L else Const(0, 1)
        m.d.comb += [wp.addr.eq(((fill * L + in_row) * RB) + word), wp.data.eq(seg.data.as_value() << (lane * seg_bits)),
                     wp.en.eq(Mux(take, 1 << lane, 0))]
        band_end = ((in_row == L - 1) | (seg.row == rows_last)) & (seg.col >= last_seg_col)
        band_in = take & band_end
        with m.If(band_in):
            m.d.sync += fill.eq(~fill)
            for b in (0, 1):
                with m.If(fill == b):
                    m.d.sync += [band_row0[b].eq(seg.row - in_row), band_rlast[b].eq(in_row),
                                 band_last[b].eq(seg.last)]

        # ---- drain: bank `out` row r, beat k -> the output register (the read latency)
        out = Signal()
        r, k = Signal(range(L), name="band_out_row"), Signal(self.beat_bits, name="band_out_beat")
        valid = Signal()
        advance = ~valid | self.beats.ready
        have = Mux(out, full[1], full[0])
        pl = self.beats.payload
        meta_row = Signal(self.index_bits, name="band_beat_row", reset_less=True)
        meta_beat = Signal(self.beat_bits, name="band_beat_index", reset_less=True)
        meta_strb = Signal(bpb, name="band_beat_strb", reset_less=True)
        meta_last = Signal(name="band_beat_last", reset_less=True)
        row_end = k == beats_last
        band_done = row_end & Mux(out, r == band_rlast[1], r == band_rlast[0])
        m.d.comb += [rp.addr.eq((out * L + r) * RB + k), rp.en.eq(advance)]
        # a beat steps the position; every next value is chosen from registers alone, so
        # the sink's ready (late, through `advance`) only enables it. The beat's fields load
        # at every advance (with no beat to step, valid drops and they are not looked at),
        # so the enable of their hundred flip-flops is `advance` itself
        step = Signal(name="band_step")
        m.d.comb += step.eq(advance & have)
        with m.If(advance):
            m.d.sync += [valid.eq(have),
                         meta_row.eq(Mux(out, band_row0[1], band_row0[0]) + r), meta_beat.eq(k),
                         meta_strb.eq(Mux(row_end, strb_last, (1 << bpb) - 1)),
                         meta_last.eq(band_done & Mux(out, band_last[1], band_last[0]))]
        with m.If(step):
            m.d.sync += [k.eq(Mux(row_end, 0, k + 1)),
                         r.eq(Mux(band_done, 0, Mux(row_end, r + 1, r))),
                         out.eq(out ^ band_done)]
        for b in (0, 1):
            # a bank is set when its band is in and cleared when it left (never both at once:
            # the one filled is not full, the one leaving is); whether bank b's last beat is
            # up comes from registers alone, `advance` (the sink's ready) joins last
            last_beat = Signal(name=f"band{b}_last_beat")
            m.d.comb += last_beat.eq(full[b] & (out == b) & band_done)
            m.d.sync += full[b].eq((full[b] | (band_in & (fill == b))) & ~(advance & last_beat))
        m.d.comb += [self.beats.valid.eq(valid), pl.row.eq(meta_row), pl.beat.eq(meta_beat),
                     pl.data.eq(rp.data), pl.strb.eq(meta_strb), pl.last.eq(meta_last),
                     self.pending.eq(valid | full[0] | full[1])]
        return m


class WriteCompletion(wiring.Component):
    """Which microbatches' writes are in memory, when a write port joins single beats into
    bursts: a write response covers the burst whose AW it answers (one ID, in order).

    ``push`` counts every beat the client queues; ``mark`` (with ``push``) flags a beat
    that completes a microbatch. ``aw_fire``/``aw_len`` and ``b_fire`` are the bus's
    handshakes. ``completed`` pulses once per marked beat, in order, once the responses
    cover every beat up to it. ``room`` is low while ``track`` beats wait for their
    response (or ``marks`` marked ones for their turn): then the client must not push, so
    neither queue overflows."""

    def __init__(self, *, track: int = 64, marks: int = 32):
        self.track, self.marks = track, marks
        super().__init__({
            "push": In(1), "mark": In(1), "aw_fire": In(1), "aw_len": In(8), "b_fire": In(1),
            "completed": Out(1), "room": Out(1),
        })

    def elaborate(self, platform):
        from amaranth.lib import fifo
        m = Module()
        pushed = Signal(32, name="beats_pushed")
        acked = Signal(32, name="beats_acked")
        bursts = fifo.SyncFIFO(width=9, depth=self.track)        # beats of each burst on AW
        marks = BufferedFIFO(width=32, depth=self.marks)  # beats pushed at each mark
        m.submodules.bursts, m.submodules.marks = bursts, marks
        # the pushes are counted a cycle late, from registers: the client's push (decided
        # deep in its logic) reaches no counter or FIFO level. A beat's response comes
        # cycles after its push, so the count is ahead of the acknowledgements as before
        push, mark = Signal(name="push_q"), Signal(name="mark_q")
        m.d.sync += [push.eq(self.push), mark.eq(self.mark)]
        m.d.comb += [bursts.w_en.eq(self.aw_fire), bursts.w_data.eq(self.aw_len + 1),
                     bursts.r_en.eq(self.b_fire),
                     marks.w_en.eq(push & mark), marks.w_data.eq(pushed + 1)]
        m.d.sync += pushed.eq(pushed + push)
        with m.If(self.b_fire):
            m.d.sync += acked.eq(acked + bursts.r_data)
        # acked >= mark, in modular arithmetic (the counters are never 2**31 apart), as a
        # register: it holds for the head only once that head was there a cycle before
        covered = Signal()
        head_seen = Signal()
        m.d.sync += [covered.eq((acked - marks.r_data)[31] == 0),
                     head_seen.eq(marks.r_rdy & ~self.completed)]
        m.d.comb += [self.completed.eq(marks.r_rdy & covered & head_seen),
                     marks.r_en.eq(self.completed)]
        # room as a register, two beats short of full: it lags a push by two cycles (the
        # push's register, then its own)
        m.d.sync += self.room.eq((marks.level < self.marks - 2) &
                                 ((pushed - acked)[:32] < self.track - 2))
        return m


def checked_beat_layout(addr_width: int, offset_width: int, bus_width: int) -> data.StructLayout:
    """One beat into :class:`CheckedWriteQueue`: its address as ``base + row_offset +
    beat_offset``, data, byte strobes, a ``mark`` the queue carries along, and the buffer
    ``[buf_base, buf_base + buf_size)`` it must lie in."""
    return data.StructLayout({"base": addr_width, "row_offset": offset_width,
                              "beat_offset": offset_width, "data": bus_width,
                              "strb": bus_width // 8, "mark": 1,
                              "buf_base": addr_width, "buf_size": addr_width})


def checked_out_layout(addr_width: int, bus_width: int) -> data.StructLayout:
    """One beat out of :class:`CheckedWriteQueue`, with the guard's verdict ``inside``."""
    return data.StructLayout({"addr": addr_width, "data": bus_width, "strb": bus_width // 8,
                              "mark": 1, "inside": 1})


class CheckedWriteQueue(wiring.Component):
    """Write beats -> their addresses and buffer checks, computed in stages of their own,
    into a queue whose head a client pushes to a :class:`~.dma.WritePort` only when its
    registered verdict ``inside`` holds.

    A beat passes four register stages (its operands; ``base + row_offset`` and the
    buffer's end; ``+ beat_offset`` and the last beat start the buffer allows; the verdict
    of :class:`~.blocks.BufferGuard` for one beat) and then waits in a
    ``depth``-entry FIFO. ``beats.ready`` is a credit count (one per FIFO entry) that a
    beat takes as it enters and gets back the cycle after it leaves the FIFO, so the
    stages never stall and no ready path runs through them; ``beats.ready`` is one LUT
    from flip-flops and nothing in the queue depends on ``beats.valid`` but the first
    stage. ``empty``: no beat is in a stage or the FIFO, and every credit is back.
    ``credit`` and ``entering`` are flip-flops ``beats.ready`` is made of: a credit is
    left, and a beat is in the first stage (it takes one more). ``credit & ~entering``
    never exceeds ``beats.ready`` and equals it after a cycle without a beat: a client
    that never gives beats in consecutive cycles may decide its take from them in one LUT.

    Args:
        addr_width: bits of the computed address (wide enough that no sum wraps).
        offset_width: bits of either offset.
        bus_width: data bits of a beat.
        depth: FIFO entries (and credits).
    """

    STAGES = 4

    def __init__(self, *, addr_width: int, offset_width: int, bus_width: int, depth: int = 8):
        if depth < 2:
            raise ValueError(f"CheckedWriteQueue depth must be >= 2, not {depth!r}")
        self.aw, self.ow, self.bw, self.depth = addr_width, offset_width, bus_width, depth
        super().__init__({
            "beats": In(stream.Signature(checked_beat_layout(addr_width, offset_width, bus_width))),
            "queued": Out(stream.Signature(checked_out_layout(addr_width, bus_width))),
            "empty": Out(1),
            "credit": Out(1),
            "entering": Out(1),
        })

    def elaborate(self, platform):
        from .axi import BOUNDARY_BYTES
        m = Module()
        aw, bpb = self.aw, self.bw // 8
        out_layout = checked_out_layout(aw, self.bw)
        m.submodules.queue = queue = BufferedFIFO(width=out_layout.size, depth=self.depth)
        # the credits as a thermometer code (bit i: more than i credits), shifted by one
        # per beat leaving and, a cycle late, per beat entering (the first stage's valid):
        # the count is one high while that beat is in the first stage, which ready and empty
        # take into account. No adder sits behind the entering beat's valid, and the
        # credits do not depend on it (it is decided deep in the client's logic)
        credits = Signal(self.depth, init=(1 << self.depth) - 1)
        enter = self.beats.valid & self.beats.ready
        # a beat's credit comes back the cycle after it leaves, from a register: the
        # client's pop (its push decision) reaches the queue's pointers, not the credits
        leave = Signal(name="wq_left")
        m.d.sync += leave.eq(self.queued.valid & self.queued.ready)
        s1_valid = Signal(name="wq_operands_valid")
        m.d.comb += [self.beats.ready.eq(Mux(s1_valid, credits[1], credits[0])),
                     self.credit.eq(credits[0]), self.entering.eq(s1_valid)]
        with m.If(s1_valid & ~leave):
            m.d.sync += credits.eq(credits[1:])
        with m.Elif(leave & ~s1_valid):
            m.d.sync += credits.eq(Cat(1, credits[:-1]))
        m.d.comb += self.empty.eq(credits[-1] & ~s1_valid)

        def stage(name, layout, valid=None):
            return (Signal(layout, name=f"{name}", reset_less=True),
                    Signal(name=f"{name}_valid") if valid is None else valid)

        carry = {"data": self.bw, "strb": bpb, "mark": 1, "buf_base": aw}
        s1, v1 = stage("wq_operands", checked_beat_layout(aw, self.ow, self.bw), s1_valid)
        s2, v2 = stage("wq_partial", data.StructLayout({"addr": aw, "beat_offset": self.ow,
                                                        "limit": aw + 1, **carry}))
        # `last`: the highest start of a beat inside the buffer, `limit - bpb`, with its
        # borrow on top (set: no beat fits); precomputed beside the address sum, so the
        # verdict is two compares side by side, not a sum and a compare in series
        s3, v3 = stage("wq_address", data.StructLayout({"addr": aw, "last": aw + 2, **carry}))
        s4, v4 = stage("wq_checked", out_layout)
        m.d.sync += [v1.eq(enter), v2.eq(v1), v3.eq(v2), v4.eq(v3), s1.eq(self.beats.payload)]
        m.d.sync += [getattr(s2, k).eq(getattr(s1, k)) for k in carry]
        m.d.sync += [s2.addr.eq(s1.base + s1.row_offset), s2.beat_offset.eq(s1.beat_offset),
                     s2.limit.eq(s1.buf_base + s1.buf_size)]
        m.d.sync += [getattr(s3, k).eq(getattr(s2, k)) for k in carry]
        m.d.sync += [s3.addr.eq(s2.addr + s2.beat_offset), s3.last.eq(s2.limit - bpb)]
        # inside [buf_base, buf_base + buf_size) and within one 4 KiB page (as
        # blocks.BufferGuard with len 0): addr + bpb <= limit is addr <= last, no borrow
        fits = ~s3.last[aw + 1] & (s3.addr <= s3.last[:aw + 1])
        crosses = s3.addr[:12] > BOUNDARY_BYTES - bpb
        m.d.sync += [s4.addr.eq(s3.addr), s4.data.eq(s3.data), s4.strb.eq(s3.strb),
                     s4.mark.eq(s3.mark),
                     s4.inside.eq((s3.addr >= s3.buf_base) & fits & ~crosses)]
        m.d.comb += [queue.w_en.eq(v4), queue.w_data.eq(s4),
                     self.queued.valid.eq(queue.r_rdy), self.queued.payload.eq(queue.r_data),
                     queue.r_en.eq(self.queued.ready)]
        return m
