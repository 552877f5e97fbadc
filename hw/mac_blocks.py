"""The MacArray front end's parts (:mod:`.mac_array`), each a component of its own.

* :class:`BlockLoader` — reads a block of int16 rows through one :class:`~.dma.ReadPort`
  client into one of the banks of a :class:`~.mac.SkewedBuffer`.
* :class:`BlockWalker` — walks the block steps ``(bi, bj, bk)`` of a run (depth fastest)
  and holds each step's position, extents and last-flags in registers.
* :class:`ResultWriter` — turns the core's output row segments into single-beat writes
  (address, lanes, strobes) and drops any beat outside the output buffer.

Timing structure: every output leaves from a register, and every register's next value
is at most one short carry chain (an add of two registers, or a compare of one register
with a constant) away from registers.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .axi import BOUNDARY_BYTES, SkidBuffer
from .blocks import BufferedFIFO, decision
from .dma import read_request_layout
from .mac import MAC_INPUT_WIDTH, output_layout

__all__ = ["BlockLoader", "BlockWalker", "ResultWriter", "read_response_layout",
           "write_beat_layout", "aligned_burst_beats"]


def read_response_layout(data_width: int) -> data.StructLayout:
    """One R beat as :class:`~.dma.ReadPort` hands it to a client."""
    return data.StructLayout({"valid": 1, "data": data_width, "last": 1})


def aligned_burst_beats(max_burst: int, bytes_per_beat: int) -> int:
    """Beats of a :class:`BlockLoader` burst: the largest power of two that is at most
    ``max_burst`` and whose bytes divide 4 KiB (bursts aligned to it never cross 4 KiB)."""
    beats = 1
    while beats * 2 <= max_burst and beats * 2 * bytes_per_beat <= BOUNDARY_BYTES:
        beats *= 2
    return beats


def _log2(x: int) -> int:
    return x.bit_length() - 1


class BlockLoader(wiring.Component):
    """Reads ``nrows`` rows of ``ncols`` int16 (``stride`` bytes apart, from ``base``) into
    the buffer bank ``bank``, element ``(r, c)`` of the block at ``(r, c)``.

    ``start`` (one cycle, only while ``done``) latches the job into registers and clears
    ``done``, nothing else: what follows from it (the row's beats, the flags, the first
    count) is set up from those registers in the next cycle, so neither ``start`` nor the
    job's inputs reach any logic of the loader's own. ``done`` (a flip-flop) is
    high while no beat is outstanding (a register: low in the cycle after ``start`` even
    for an empty job).
    Rows are read in whole beats, in INCR bursts aligned to :func:`aligned_burst_beats`
    (the first burst of a row runs up to the next such boundary), so no burst crosses
    4 KiB and no burst length needs a subtract: the request leaves from registers, one
    burst a cycle inside a row, the first burst of the next row a cycle after the row
    before it. Beats come back in order (one ID per client) and each is written into the
    buffer in the cycle after it arrives, from registers (``wr_en`` one bit per bank,
    ``wr`` the buffer's write layout, ``wr_mask`` the buffer lanes it writes, for a
    :class:`~.mac.SkewedBuffer` with ``bank_mask``), so R is never stalled.
    """

    def __init__(self, *, addr_width: int, bus_width: int, max_burst: int, max_rows: int,
                 write_layout, banks: int = 2):
        self.addr_width, self.bus_width, self.max_rows = addr_width, bus_width, max_rows
        self.bytes_per_beat = bus_width // 8
        self.elems_per_beat = bus_width // MAC_INPUT_WIDTH
        self.burst = aligned_burst_beats(max_burst, self.bytes_per_beat)
        self.banks = banks
        self.lanes = data.Layout.cast(write_layout)["data"].shape.length
        super().__init__({
            "start": In(1), "base": In(addr_width), "stride": In(addr_width),
            "nrows": In(range(max_rows + 1)), "ncols": In(range(max_rows + 1)),
            "bank": In(range(max(2, banks))), "done": Out(1),
            "request": Out(stream.Signature(read_request_layout(addr_width))),
            "response": In(read_response_layout(bus_width)),
            "wr_en": Out(banks), "wr": Out(write_layout), "wr_mask": Out(self.lanes),
        })

    def elaborate(self, platform):
        m = Module()
        # the job, latched at start; `started` is the cycle after it (the job's registers
        # hold it): the derived state is set up then
        job = {"nrows": Signal.like(self.nrows, name="job_nrows", reset_less=True),
               "ncols": Signal.like(self.ncols, name="job_ncols", reset_less=True)}
        started = Signal(name="job_started")
        m.d.sync += started.eq(self.start)
        with m.If(self.start):
            m.d.sync += [job["nrows"].eq(self.nrows), job["ncols"].eq(self.ncols)]
        job["empty"] = (job["nrows"] == 0) | (job["ncols"] == 0)
        self._issue(m, job, started)
        self._receive(m, job, started)
        return m

    def _issue(self, m, job, started):
        A, beat_bits, epb = self.burst, _log2(self.bytes_per_beat), self.elems_per_beat
        maxr = self.max_rows
        row_beats = Signal(range(maxr + 1), name="row_beats")
        stride = Signal(self.addr_width, reset_less=True)
        # the request slot (the burst on `request`) and what follows it
        valid = Signal(name="req_valid")
        addr = Signal(self.addr_width, name="req_addr", reset_less=True)
        beats = Signal(range(A + 1), name="req_beats", reset_less=True)
        # beats - 1 beside it: the port's guard adds the length to the address at once
        length = Signal(8, name="req_len", reset_less=True)
        rest = Signal(range(maxr + 1), name="row_rest")        # beats of the row after it
        # rest != 0 and rest > A, registers beside it (the request's choice starts from them)
        rest_any = Signal(name="row_rest_any")
        rest_long = Signal(name="row_rest_long")
        rows_left = Signal(range(maxr + 1), name="rows_left")  # rows not yet begun
        rows_any = Signal(name="rows_any")                     # rows_left != 0, a register
        # the next row's start and its first burst (up to the next aligned boundary),
        # registered a cycle after the start moves (head_ok)
        next_row = Signal(self.addr_width, name="next_row", reset_less=True)
        head = Signal(range(A + 1), name="next_head", reset_less=True)
        head_ok = Signal(name="next_head_ok")

        def room_of(row_addr):
            """Beats from ``row_addr`` to the next aligned boundary of ``A`` beats."""
            return A - (row_addr[beat_bits:beat_bits + _log2(A)] if A > 1 else 0)
        # the next row's room, a register kept with the row (no subtract before the head's
        # compare): the start's from the base, an issue's from the row after it, which is
        # registered every cycle (the row has held since the cycle before an issue: head_ok)
        room = Signal(range(A + 1), name="next_room", reset_less=True)
        room_after = Signal(range(A + 1), name="after_room", reset_less=True)
        m.d.sync += [room_after.eq(room_of(next_row + stride)),
                     head.eq(Mux(row_beats <= room, row_beats, room)), head_ok.eq(1)]
        m.d.comb += [self.request.valid.eq(valid), self.request.payload.addr.eq(addr),
                     self.request.payload.len.eq(length)]
        with m.If(~valid | self.request.ready):
            with m.If(rest_any):
                m.d.sync += [valid.eq(1), addr.eq(addr + (beats << beat_bits)),
                             beats.eq(Mux(rest_long, A, rest)), length.eq(Mux(rest_long, A, rest) - 1),
                             rest.eq(Mux(rest_long, rest - A, 0)),
                             rest_any.eq(rest_long), rest_long.eq(rest > 2 * A)]
            with m.Elif(rows_any & head_ok):
                m.d.sync += [valid.eq(1), addr.eq(next_row), beats.eq(head), length.eq(head - 1),
                             rest.eq(row_beats - head), rest_any.eq(row_beats != head),
                             rest_long.eq(row_beats > head + A), rows_left.eq(rows_left - 1),
                             rows_any.eq(rows_left != 1),
                             next_row.eq(next_row + stride), room.eq(room_after), head_ok.eq(0)]
            with m.Else():
                m.d.sync += valid.eq(0)
        # (a job starts once the last one is done: its requests all issued, so the slot
        # and the row's rest are already clear; they are cleared again a cycle later)
        with m.If(started):          # (rows_left counts only while rows_any is high)
            m.d.sync += [valid.eq(0), rest.eq(0), rest_any.eq(0), rest_long.eq(0),
                         rows_left.eq(job["nrows"]), rows_any.eq(~job["empty"]), head_ok.eq(0),
                         row_beats.eq((job["ncols"] + epb - 1) >> _log2(epb))]
        with m.If(self.start):
            m.d.sync += [next_row.eq(self.base), room.eq(room_of(self.base)), stride.eq(self.stride)]

    def _receive(self, m, job, started):
        epb, maxr = self.elems_per_beat, self.max_rows
        ncols = job["ncols"]
        left = Signal(range(maxr + 1), name="recv_left")      # elements of the row from this beat
        count = Signal(range(epb + 1), name="recv_count")     # ... in this beat: min(left, epb)
        row = Signal(range(maxr + 1), name="recv_row")
        col = Signal(range(maxr + epb + 1), name="recv_col")
        rows_to_recv = Signal(range(maxr + 1), name="rows_to_recv")
        # rows_to_recv == 0 as a register, updated from registers only: a start clears
        # it, the latched job sets it a cycle later
        done = Signal(init=1, name="recv_done")
        bank = Signal.like(self.bank)
        # every beat is written from a register a cycle after it arrives, with its place
        # (row, column, count) and the banks it writes (the buffer's wr_mask), so the
        # buffer's write logic starts from flip-flops and not from the port's R decode
        wr, lanes = self.wr, self.lanes
        lb = _log2(lanes)
        wr_en = Signal(self.banks, name="recv_wr_en")
        wr_q = Signal.like(wr, name="recv_wr", reset_less=True)
        mask = Signal(lanes, name="recv_wr_mask", reset_less=True)
        last_beat = Signal(name="recv_last_beat")     # the job's last beat is in wr_q
        m.d.sync += [wr_en[index].eq(self.response.valid & (bank == index))
                     for index in range(self.banks)]
        m.d.sync += [wr_q.row.eq(row), wr_q.col.eq(col), wr_q.count.eq(count),
                     wr_q.data.as_value().eq(self.response.data[:len(wr_q.data.as_value())]),
                     last_beat.eq(self.response.valid & (left <= epb) & (rows_to_recv == 1))]
        # bank b takes lane (b - row) mod lanes (the column is a multiple of lanes)
        m.d.sync += [mask[b].eq(((b - row[:lb])[:lb] if lb else Const(0, 1)) < count)
                     for b in range(lanes)]
        m.d.comb += [wr.eq(wr_q), self.wr_en.eq(wr_en), self.wr_mask.eq(mask)]
        with m.If(last_beat):
            m.d.sync += done.eq(1)
        with m.If(self.response.valid):
            with m.If(left <= epb):          # the row's last beat
                m.d.sync += [left.eq(ncols), count.eq(Mux(ncols < epb, ncols, epb)), col.eq(0),
                             row.eq(row + 1), rows_to_recv.eq(rows_to_recv - 1)]
            with m.Else():
                m.d.sync += [left.eq(left - epb), count.eq(Mux(left < 2 * epb, left - epb, epb)),
                             col.eq(col + epb)]
        m.d.comb += self.done.eq(done)
        with m.If(started):          # (no beat of the job can arrive before its first burst)
            m.d.sync += [done.eq(job["empty"]), left.eq(ncols), row.eq(0), col.eq(0),
                         count.eq(Mux(ncols < epb, ncols, epb)), rows_to_recv.eq(job["nrows"])]
        with m.If(self.start):
            m.d.sync += [done.eq(0), bank.eq(self.bank)]


class BlockWalker(wiring.Component):
    """The block steps of one run: output blocks of ``block x block`` (``i0``, ``j0``), depth
    blocks of ``depth_block`` (``k0``), depth fastest, then block column, then block row.

    ``restart`` (held while the run's configuration ``m``, ``n``, ``k`` is loaded) puts the
    walker on the first step; ``step`` (one cycle) moves it to the next. Everything about
    the current step is a register: its position, its extents ``bm``, ``bn``, ``bk`` (the
    last blocks are shorter), ``first_k`` (``k0 == 0``), ``first_j`` (``j0 == 0``), ``last_k``,
    ``last_j``, ``last_block``
    (the last output block), ``last`` (the run's last step), and ``next_j0`` (the block column of the next output block).
    The extents and flags follow a step ``settle + 1`` cycles later (``next_bn`` is two
    registers from the position); ``ready`` is high while they describe the current step
    (a register: it falls in the cycle after ``step`` or ``restart``, so a
    consumer must not look at it in the cycle it steps). Positions are kept with the extents still to go
    (``m - i0`` ...), so no register is more than one add or one compare with a constant
    from the registers it is computed from.
    """

    def __init__(self, *, block: int, depth_block: int, settle: int = 2):
        if settle < 1:
            raise ValueError(f"BlockWalker settle must be at least 1 (a step reads the "
                             f"registered flags), not {settle}")
        self.block, self.depth_block, self.settle = block, depth_block, settle
        D, MD = block, depth_block
        super().__init__({
            "restart": In(1), "step": In(1), "m": In(32), "n": In(32), "k": In(32),
            "ready": Out(1), "i0": Out(32), "j0": Out(32), "k0": Out(32),
            "bm": Out(range(D + 1)), "bn": Out(range(D + 1)), "bk": Out(range(MD + 1)),
            "first_k": Out(1), "first_j": Out(1), "last_k": Out(1), "last_j": Out(1),
            "last_block": Out(1),
            "last": Out(1),
            "next_j0": Out(32), "next_bn": Out(range(D + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        D, MD = self.block, self.depth_block
        i0, j0, k0 = Signal(32, name="pos_i0"), Signal(32, name="pos_j0"), Signal(32, name="pos_k0")
        m_left, n_left, k_left = (Signal(32, name=f"{x}_left", reset_less=True) for x in "mnk")
        # the step's flags, one compare with a constant each (before the extents settle)
        last_k = Signal(name="walk_last_k")
        last_j = Signal(name="walk_last_j")
        last_i = Signal(name="walk_last_i")
        m.d.comb += [last_k.eq(k_left <= MD), last_j.eq(n_left <= D), last_i.eq(m_left <= D)]
        # A step moves the depth; at the last depth block the column, at the last column
        # too the row. It chooses by the registered flags (a step comes only while
        # `ready`, after they settled): the step reaches each level's enable through one
        # LUT of its own, and the next values are chosen from flip-flops alone
        restart, step = self.restart, self.step
        enable = {
            level: decision(m, f"walk_{level}_enable", fn, restart=restart, step=step,
                            last_k=self.last_k, last_j=self.last_j)
            for level, fn in (
                ("k", lambda restart, step, last_k, last_j: restart | step),
                ("j", lambda restart, step, last_k, last_j: restart | (step & last_k)),
                ("i", lambda restart, step, last_k, last_j: restart | (step & last_k & last_j)))}
        with m.If(enable["k"]):
            first = restart | self.last_k
            m.d.sync += [k0.eq(Mux(first, 0, k0 + MD)), k_left.eq(Mux(first, self.k, k_left - MD))]
        with m.If(enable["j"]):
            first = restart | self.last_j
            m.d.sync += [j0.eq(Mux(first, 0, j0 + D)), n_left.eq(Mux(first, self.n, n_left - D))]
        with m.If(enable["i"]):
            m.d.sync += [i0.eq(Mux(restart, 0, i0 + D)), m_left.eq(Mux(restart, self.m, m_left - D))]
        # registered view of the step (settles `settle` cycles after a step)
        nj_left = Signal(32, name="next_n_left", reset_less=True)   # n - next_j0
        m.d.sync += [
            self.i0.eq(i0), self.j0.eq(j0), self.k0.eq(k0), self.first_k.eq(k0 == 0),
            self.first_j.eq(j0 == 0),
            self.bm.eq(Mux(m_left >= D, D, m_left)), self.bn.eq(Mux(n_left >= D, D, n_left)),
            self.bk.eq(Mux(k_left >= MD, MD, k_left)),
            self.last_k.eq(last_k), self.last_j.eq(last_j), self.last_block.eq(last_j & last_i),
            self.last.eq(last_k & last_j & last_i),
            self.next_j0.eq(Mux(last_j, 0, j0 + D)), nj_left.eq(Mux(last_j, self.n, n_left - D)),
            self.next_bn.eq(Mux(nj_left >= D, D, nj_left)),
        ]
        # (reset_less: under a reset held with `restart`, it still counts the settling);
        # `ready` is wait == 0 as a flip-flop of its own, set with the count
        wait = Signal(range(self.settle + 2), name="walk_settle", reset_less=True)
        ready = Signal(init=1, name="walk_ready", reset_less=True)
        with m.If(self.restart | self.step):
            m.d.sync += [wait.eq(self.settle), ready.eq(self.settle == 0)]
        with m.Elif(wait != 0):
            m.d.sync += [wait.eq(wait - 1), ready.eq(wait == 1)]
        # a consumer never looks at `ready` in the cycle it steps
        m.d.comb += self.ready.eq(ready)
        return m


def write_beat_layout(addr_width: int, bus_width: int) -> data.StructLayout:
    """One single-beat write of :class:`ResultWriter`: address, data and byte strobes."""
    return data.StructLayout({"addr": addr_width, "data": bus_width, "strb": bus_width // 8})


class ResultWriter(wiring.Component):
    """The core's output row segments (``rows``, :func:`~.mac.output_layout`) to single-beat
    writes (``beats``): a segment ``(row, col)`` of the block at ``block_base`` goes to
    ``block_base + row * out_stride + col * 2``, its lanes shifted into place in the beat
    and WSTRB covering only its ``count`` elements.

    Three registered stages that never stall: A the row offset (kept by adds: rows come
    tile by tile, rows of a tile in order, so the next row is the previous + 1, the band's
    first row again, or row 0), the block base plus the column, the lanes and strobes; B
    the beat's address; C the buffer guard, ``out_lo <= addr <= out_hi`` (``out_hi`` the
    last beat-aligned address whose beat ends inside the buffer; ``out_room`` low: no beat
    fits). A beat outside is dropped and raises ``fault`` (held until ``restart``). The
    segments enter through a :class:`~.axi.SkidBuffer` (``rows.ready`` leaves a register)
    and the beats leave through a FIFO of :data:`QUEUE` beats; a segment enters the stages
    only against a credit (a slot of that FIFO, given back the cycle after its beat leaves
    it or is dropped), so ``beats.ready`` reaches only the FIFO and a register, never the
    stages' registers. ``pending`` is high while a segment is in the slice, the stages or
    the FIFO, or its credit is on its way back.
    """

    #: beats of the output FIFO, the credits: covers the three stages and the credit's
    #: way back, so a sink that is always ready takes a beat every cycle
    QUEUE = 8

    def __init__(self, *, rows: int, cols: int, index_bits: int, out_width: int,
                 addr_width: int, bus_width: int):
        self.tile_rows, self.cols = rows, cols
        self.addr_width, self.bus_width = addr_width, bus_width
        #: address arithmetic width: i0 < 2**32 rows of a 2**aw stride cannot wrap
        self.ax = addr_width + 34
        super().__init__({
            "rows": In(stream.Signature(output_layout(cols, index_bits, out_width))),
            "block_base": In(self.ax), "out_stride": In(addr_width),
            "out_lo": In(self.ax), "out_hi": In(self.ax), "out_room": In(1),
            "restart": In(1),
            "beats": Out(stream.Signature(write_beat_layout(addr_width, bus_width))),
            "fault": Out(1), "pending": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        AX, bpb = self.ax, self.bus_width // 8
        epb = self.bus_width // MAC_INPUT_WIDTH
        beat_bits = _log2(bpb)
        elem_bytes = MAC_INPUT_WIDTH // 8
        # the segments enter through a register slice: the credit reaches only its
        # registers, not the core's output queue. Each takes the block base along as it
        # leaves the core (the base moves on once the block's last segment has left it)
        m.submodules.rows_slice = rows_in = SkidBuffer(data.StructLayout({
            "seg": self.rows.payload.shape(), "base": AX,
            "first": 1, "again": 1, "new_band": 1}))
        m.d.comb += [rows_in.i.valid.eq(self.rows.valid), self.rows.ready.eq(rows_in.i.ready),
                     rows_in.i.payload.seg.eq(self.rows.payload),
                     rows_in.i.payload.base.eq(self.block_base)]
        # how a segment's row offset follows from the last one's, decided as it enters the
        # slice: the block's first segment (offset 0), the band's first row again (the
        # band's offset), or the next row (the last offset plus the stride), which may
        # begin a band
        flags = self._band_flags(m, self.rows.payload, self.rows.valid & rows_in.i.ready)
        m.d.comb += [rows_in.i.payload.first.eq(flags["first"]),
                     rows_in.i.payload.again.eq(flags["again"]),
                     rows_in.i.payload.new_band.eq(flags["new_band"])]
        seg = rows_in.o.payload.seg
        va, vb, vc = Signal(name="wr_a_valid"), Signal(name="wr_b_valid"), Signal(name="wr_c_valid")
        inside_c = Signal(name="wr_c_inside", reset_less=True)
        fault = self.fault
        m.submodules.queue = queue = BufferedFIFO(width=len(self.beats.payload.as_value()),
                                                  depth=self.QUEUE)
        m.d.comb += [self.beats.valid.eq(queue.r_rdy), self.beats.payload.eq(queue.r_data),
                     queue.r_en.eq(self.beats.ready)]
        # credits: FIFO slots not yet promised to a segment; `credit` (a register) is
        # credits after this cycle's take, pop and drop, non-zero
        credits = Signal(range(self.QUEUE + 1), init=self.QUEUE, name="wr_credits")
        credit = Signal(init=1, name="wr_credit")
        idle = Signal(init=1, name="wr_idle")          # every credit back
        keep_c = vc & inside_c & ~fault
        take = rows_in.o.valid & credit
        # a popped or dropped beat's credit comes back a cycle later, from a register (the
        # sink's ready reaches no adder); the count after it and its flags with and without
        # a take are formed side by side, and the take (whose net reaches the stages) only
        # chooses among them
        popped, dropped = Signal(name="wr_popped"), Signal(name="wr_dropped")
        m.d.sync += [popped.eq(queue.r_rdy & self.beats.ready), dropped.eq(vc & ~keep_c)]
        returned = Signal(len(credits) + 1, name="wr_returned")
        m.d.comb += returned.eq(credits + popped + dropped)
        m.d.sync += [credits.eq(Mux(take, returned - 1, returned)),
                     credit.eq(Mux(take, returned > 1, returned != 0)),
                     idle.eq(Mux(take, returned == self.QUEUE + 1, returned == self.QUEUE))]
        # ---- A: row offset by adds, the block base plus the column, lanes and strobes
        row_off = Signal(AX, name="out_row_off", reset_less=True)
        band_off = Signal(AX, name="out_band_off", reset_less=True)
        flags = rows_in.o.payload
        row_off_next = Signal(AX, name="out_row_off_next")
        m.d.comb += row_off_next.eq(Mux(flags.first, 0,
                                        Mux(flags.again, band_off, row_off + self.out_stride)))
        with m.If(take):
            m.d.sync += row_off.eq(row_off_next)
            with m.If(flags.first | flags.new_band):
                m.d.sync += band_off.eq(row_off_next)
        col_bytes = Cat(Const(0, beat_bits), (seg.col * elem_bytes)[beat_bits:])
        lane_off = seg.col[:max(1, (epb - 1).bit_length())] if epb > 1 else Const(0, 1)
        lanes = Cat(*[seg.data[i] for i in range(self.cols)])
        a_base = Signal(AX, name="wr_a_base", reset_less=True)
        a_row = Signal(AX, name="wr_a_row", reset_less=True)
        a_data = Signal(self.bus_width, name="wr_a_data", reset_less=True)
        a_strb = Signal(bpb, name="wr_a_strb", reset_less=True)
        # the stages' data registers load every cycle (no enable): only the valid bits
        # tell a beat from a bubble
        m.d.sync += [va.eq(take), a_base.eq(rows_in.o.payload.base + col_bytes),
                     a_row.eq(row_off_next),
                     a_data.eq(lanes << (lane_off * MAC_INPUT_WIDTH)),
                     a_strb.eq(self._strobes(seg.count, lane_off, elem_bytes, bpb))]
        # ---- B: the beat's address
        b_addr = Signal(AX, name="wr_b_addr", reset_less=True)
        b_data = Signal.like(a_data, name="wr_b_data")
        b_strb = Signal.like(a_strb, name="wr_b_strb")
        m.d.sync += [vb.eq(va), b_addr.eq(a_base + a_row), b_data.eq(a_data), b_strb.eq(a_strb)]
        # ---- C: inside the output buffer? (two compares of registers, side by side)
        c_beat = Signal(self.beats.payload.shape(), name="wr_c_beat")
        m.d.sync += [vc.eq(vb), c_beat.addr.eq(b_addr[:self.addr_width]), c_beat.data.eq(b_data),
                     c_beat.strb.eq(b_strb),
                     inside_c.eq(self.out_room & (b_addr >= self.out_lo) & (b_addr <= self.out_hi))]
        m.d.comb += [
            rows_in.o.ready.eq(credit),
            self.pending.eq(rows_in.o.valid | ~idle),
            queue.w_en.eq(keep_c), queue.w_data.eq(c_beat.as_value()),
        ]
        with m.If(self.restart):
            m.d.sync += fault.eq(0)
        with m.Elif(vc & ~inside_c):
            m.d.sync += fault.eq(1)
        return m

    @staticmethod
    def _strobes(count, lane_off, elem_bytes: int, bpb: int):
        """WSTRB of ``count`` elements from lane ``lane_off``: a table of the two fields (a
        few LUTs per strobe bit, no shifter or carry chain)."""
        table = [((1 << c * elem_bytes) - 1) << (lo * elem_bytes) & ((1 << bpb) - 1)
                 for lo in range(1 << len(lane_off)) for c in range(1 << len(count))]
        return Array(Const(t, bpb) for t in table)[Cat(count, lane_off)]

    def _band_flags(self, m, seg, entered):
        """A segment's place in its block: ``first`` (row 0, column 0), ``again`` (the first
        row of a band's later tile) and ``new_band`` (the first row of a band; with or
        without the block's first, whose offset the band takes either way). Tiles start at rows that are multiples of ``tile_rows`` and each band's
        tiles at column 0, so with ``tile_rows`` a power of two these are compares of the
        segment's own fields, no state; otherwise the band's first row and the next one
        are tracked as the segments enter (``entered``), in order."""
        row, col = seg.row, seg.col
        col_zero = col == 0
        if self.tile_rows & (self.tile_rows - 1) == 0:
            # each flag a decision of its own (see blocks.own_module): two LUT levels of the
            # segment's fields, not spread out to the writer's depth
            rb = self.tile_rows.bit_length() - 1
            top = row[:rb] if rb else Const(0, 1)
            return {"first": decision(m, "seg_first", lambda row, col: (row == 0) & (col == 0),
                                      row=row, col=col),
                    "again": decision(m, "seg_again", lambda top, col: (top == 0) & (col != 0),
                                      top=top, col=col),
                    "new_band": decision(m, "seg_new_band", lambda top, col: (top == 0) & (col == 0),
                                         top=top, col=col)}
        band_row = Signal(len(row), name="out_band_row", reset_less=True)
        next_band = Signal(len(row) + 1, name="out_next_band", reset_less=True)
        first = (row == 0) & col_zero
        # (next_band is tile_rows or more, so the block's first segment never matches it)
        new_band = row == next_band
        with m.If(entered):
            with m.If(first):
                m.d.sync += [band_row.eq(0), next_band.eq(self.tile_rows)]
            with m.Elif(new_band):
                m.d.sync += [band_row.eq(row), next_band.eq(next_band + self.tile_rows)]
        return {"first": first, "again": row == band_row, "new_band": new_band}
