"""Where the Aggregator reads a gathered feature row, and when.

:class:`RowAddress` works out ``feat_addr + index * feat_stride``, cut at the 4 KiB
boundary it may cross (a row is at most 4 KiB, so into at most two bursts);
:class:`RowGather` issues those bursts as the row buffer frees room for their beats.

The product goes through DSP-shaped tiles (:class:`~.arith.PipelinedMultiplier`), then
one adder or comparator per stage::

    index -> [a/b regs -> M -> P -> adder tree] -> + base -> beats to boundary
          -> first burst -> second burst's address and length
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .blocks import StreamRegister
from .arith import PipelinedMultiplier
from .dma import beats_to_boundary, read_request_layout


def row_bursts_layout(addr_width: int, max_beats: int) -> data.StructLayout:
    """A row's one or two read bursts (``second_len == 0``: one burst)."""
    return data.StructLayout({"first_addr": addr_width, "first_len": range(max_beats + 1),
                              "second_addr": addr_width, "second_len": range(max_beats + 1)})


class RowAddress(wiring.Component):
    """Turns one row index per cycle into that row's read bursts, :attr:`latency` later.

    Ports:
        i: row indices (32-bit); always accepted.
        o: :func:`row_bursts_layout`; the consumer takes every one (it reserved room).
        base, stride: ``feat_addr`` and ``feat_stride`` (bytes), fixed for a run.
        row_beats: beats per row (1 .. ``max_beats``), fixed for a run.
        busy: an index is still in the pipeline.
    """

    def __init__(self, *, addr_width: int, bytes_per_beat: int, max_beats: int):
        self.aw, self.bpb, self.max_beats = addr_width, bytes_per_beat, max_beats
        self._multiplier = PipelinedMultiplier(unsigned(32), unsigned(32), enable=True)
        self.latency = self._multiplier.latency + 4
        super().__init__({
            "i": In(stream.Signature(32, always_ready=True)),
            "o": Out(stream.Signature(row_bursts_layout(addr_width, max_beats), always_ready=True)),
            "base": In(addr_width),
            "stride": In(32),
            "row_beats": In(range(max_beats + 1)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.multiplier = mul = self._multiplier
        aw, beat_bits = self.aw, self.bpb.bit_length() - 1
        m.d.comb += [mul.a.eq(self.i.payload), mul.b.eq(self.stride), mul.en.eq(self.i.valid)]
        valids = [self.i.valid]
        for k in range(self.latency):
            v = Signal(name=f"v{k}")
            m.d.sync += v.eq(valids[-1])
            valids.append(v)

        def reg(shape, name):
            return Signal(shape, name=name, reset_less=True)

        beats = range(self.max_beats + 1)
        addr, addr_b, addr_c = reg(aw, "addr"), reg(aw, "addr_b"), reg(aw, "addr_c")
        to_boundary, first = reg(range(4096 // self.bpb + 1), "to_boundary"), reg(beats, "first")
        out = Signal(row_bursts_layout(aw, self.max_beats), reset_less=True)
        m.d.sync += [
            addr.eq(self.base + mul.p),
            addr_b.eq(addr), to_boundary.eq(beats_to_boundary(addr, self.bpb)),
            addr_c.eq(addr_b), first.eq(Mux(to_boundary < self.row_beats, to_boundary, self.row_beats)),
            out.first_addr.eq(addr_c), out.first_len.eq(first),
            out.second_addr.eq(addr_c + (first << beat_bits)),
            out.second_len.eq(self.row_beats - first),
        ]
        m.d.comb += [self.o.valid.eq(valids[-1]), self.o.payload.eq(out),
                     self.busy.eq(Cat(*valids).any())]
        return m


class RowGather(wiring.Component):
    """Issues each gathered row's one or two read bursts once the row buffer has room
    for their beats: it holds ``slots`` beats of credit, one back a cycle after each
    ``freed`` pulse, and spends a burst's beats when the burst is issued (so R is never
    stalled).

    Ports:
        bursts: each row's bursts (:func:`row_bursts_layout`), in edge order.
        request: read bursts (address, ``len`` = beats - 1) for the read port; they leave
            from a register slice, whose ready is a flip-flop too.
        freed: one gathered beat left the row buffer.

    Args:
        addr_width, max_beats: the build's address width and beats per row.
        slots: beats the row buffer holds.
    """

    def __init__(self, *, addr_width: int, max_beats: int, slots: int):
        self.aw, self.max_beats, self.slots = addr_width, max_beats, slots
        super().__init__({
            "bursts": In(stream.Signature(row_bursts_layout(addr_width, max_beats))),
            "request": Out(stream.Signature(read_request_layout(addr_width))),
            "freed": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.slice = out = StreamRegister(read_request_layout(self.aw))
        wiring.connect(m, out.o, wiring.flipped(self.request))
        beats = range(self.max_beats + 1)
        credits = Signal(range(self.slots + 1), init=self.slots)
        busy = Signal()                                   # a row's bursts are being issued
        burst_len = Signal(beats)                         # the burst to issue next
        # the row's two bursts (address, AxLEN), loaded with the row and chosen by
        # `on_second`: the issue flips a flip-flop, it enables no wide register
        first_addr, next_addr = Signal(self.aw, reset_less=True), Signal(self.aw, reset_less=True)
        first_len_m1, next_len_m1 = Signal(8, reset_less=True), Signal(8, reset_less=True)
        next_len = Signal(beats)
        on_second = Signal()
        # credits >= burst_len, a flip-flop: compared a cycle ahead on the values both
        # take next, so the issue and the row buffer's pop start from registers
        enough = Signal(init=1)
        last_burst = Signal(init=1, reset_less=True)       # next_len == 0, likewise
        both_len = Signal(range(2 * self.max_beats + 1))  # burst_len + next_len, likewise
        m.d.comb += [out.i.valid.eq(busy & enough),
                     out.i.payload.addr.eq(Mux(on_second, next_addr, first_addr)),
                     out.i.payload.len.eq(Mux(on_second, next_len_m1, first_len_m1))]
        issue = out.i.valid & out.i.ready
        # busy & enough & last_burst, likewise: the row slice's load enable (wide) waits
        # on one gate of flip-flops
        may_finish = Signal()
        finishing = may_finish & out.i.ready
        load = self.bursts.valid & (~busy | finishing)
        m.d.comb += self.bursts.ready.eq(load)
        row = self.bursts.payload

        # the pop arrives late from the reduce; its credit waits a cycle in a flip-flop
        # (only ever fewer beats counted free than there are)
        freed = Signal()
        m.d.sync += freed.eq(self.freed)
        held = credits + freed
        # credits + 1, kept beside the count: a compare of the held credits is one of two
        # compares of registers, which `freed` picks (no adder between it and the compare);
        # both counts after an issue are worked out from registers, and the issue only
        # picks them
        credits_p1 = Signal(range(self.slots + 2), init=self.slots + 1)
        held_p1 = credits_p1 + freed
        m.d.sync += [credits.eq(Mux(issue, held - burst_len, held)),
                     credits_p1.eq(Mux(issue, held_p1 - burst_len, held_p1))]

        def held_at_least(x):
            return Mux(freed, credits_p1 >= x, credits >= x)

        # the next enough for each outcome of this cycle's issue and load, compared on
        # registers alone; issue and load only pick one (credits_next >= the next burst's
        # length, with the issued burst's length moved to the right-hand side)
        enough_if = {
            (0, 0): held_at_least(burst_len),
            (1, 0): held_at_least(both_len),
            (0, 1): held_at_least(row.first_len),
            (1, 1): held_at_least(burst_len + row.first_len),
        }
        enough_if_load = Mux(issue, enough_if[1, 1], enough_if[0, 1])
        m.d.sync += enough.eq(Mux(load, enough_if_load,
                                  Mux(issue, enough_if[1, 0], enough_if[0, 0])))
        # busy and last_burst next: kept (0, 0); after an issue, busy only if it was not
        # the last burst, then its last; after a load, the row's second is the last if empty
        one_burst = row.second_len == 0
        m.d.sync += may_finish.eq(Mux(
            load, one_burst & enough_if_load,
            Mux(issue, ~last_burst & enough_if[1, 0], busy & last_burst & enough_if[0, 0])))
        with m.If(issue):
            m.d.sync += [on_second.eq(1), burst_len.eq(next_len), both_len.eq(next_len),
                         next_len.eq(0), last_burst.eq(1)]
            with m.If(finishing):
                m.d.sync += busy.eq(0)
        with m.If(load):
            m.d.sync += [busy.eq(1), on_second.eq(0), first_addr.eq(row.first_addr),
                         burst_len.eq(row.first_len), first_len_m1.eq(row.first_len - 1),
                         both_len.eq(row.first_len + row.second_len),
                         next_addr.eq(row.second_addr), next_len.eq(row.second_len),
                         next_len_m1.eq(row.second_len - 1), last_burst.eq(one_burst)]
        return m
