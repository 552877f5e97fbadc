"""The Aggregator's drain: a closed accumulator bank, beat by beat, towards the output
stage, with one write address per burst of its output row (a row crosses at most one
4 KiB boundary, so it is one or two bursts).

Output-row addresses move by the row stride (no multiply) and each row's burst split is
worked out a row ahead; whether a beat is its row's last or starts a burst is a
flip-flop set a cycle ahead, so the drain's go signal is two LUTs from flip-flops.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .aggregator_output import accumulator_beat_layout
from .aggregator_reduce import bank_read_signature
from .dma import write_address_layout


class Drain(wiring.Component):
    """Reads each closed bank (one node's output row) and sends its beats on.

    Ports:
        bank: the banks (:func:`~.aggregator_reduce.bank_read_signature`, flipped).
        o: accumulator beats for the output stage; always taken (``credits`` reserve room).
        aw: one write burst (address, ``len``) per burst of each output row.
        beat_done: the write port took one output beat (a credit comes back).
        launch: the run's first cycle; the first output row is ``base``.
        base, stride: ``out_addr`` and ``out_stride`` (bytes), fixed for a run.
        row_beats, row_last_beat, last_mask: beats per row, that minus one, valid lanes of
            a row's last beat; fixed for a run.
        nodes: output rows drained so far in this run.
        busy: a beat is between the bank and the output stage.

    Args:
        lanes, acc_width, max_beats, addr_width, bytes_per_beat: the build's geometry.
        credits: output beats the write port can hold beyond what it has taken.
    """

    def __init__(self, *, lanes: int, acc_width: int, max_beats: int, addr_width: int,
                 bytes_per_beat: int, credits: int):
        self.lanes, self.acc_w, self.max_beats = lanes, acc_width, max_beats
        self.aw_bits, self.bpb, self.credits = addr_width, bytes_per_beat, credits
        super().__init__({
            "bank": In(bank_read_signature(lanes, acc_width, max_beats)),
            "o": Out(stream.Signature(accumulator_beat_layout(lanes, acc_width), always_ready=True)),
            "aw": Out(stream.Signature(write_address_layout(addr_width))),
            "beat_done": In(1),
            "launch": In(1),
            "base": In(addr_width), "stride": In(32),
            "row_beats": In(range(max_beats + 1)), "row_last_beat": In(range(max_beats + 1)),
            "last_mask": In(lanes),
            "nodes": Out(32),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        maxb, aw, beat_bits = self.max_beats, self.aw_bits, self.bpb.bit_length() - 1
        row_beats, row_last_beat = self.row_beats, self.row_last_beat
        d_beat = Signal(range(maxb))
        d_beat1 = Signal(range(maxb + 1), init=1)   # d_beat + 1, counted beside it
        d_first = Signal(init=1)                      # d_beat == 0
        credits = Signal(range(self.credits + 1), init=self.credits)
        # a row's bursts, computed a row ahead: next_row_addr is the row after the one
        # being drained
        next_row_addr, out_row_addr, second_addr = Signal(aw), Signal(aw), Signal(aw)
        first_len, first_len_m1, second_len_m1 = (Signal(range(maxb + 1)), Signal(range(maxb)),
                                                  Signal(range(maxb)))
        advance = Signal()      # the next row becomes the one being drained
        launched = Signal()     # the run's second cycle: the first row is set up
        m.d.sync += launched.eq(self.launch)
        with m.If(self.launch):
            m.d.sync += next_row_addr.eq(self.base)
        # beats to the boundary minus one, for a beat-aligned address: no carry chain
        to_b_m1 = ~next_row_addr[beat_bits:12]
        crosses = to_b_m1 < row_last_beat
        with m.If(advance):
            m.d.sync += [
                out_row_addr.eq(next_row_addr), next_row_addr.eq(next_row_addr + self.stride),
                first_len_m1.eq(Mux(crosses, to_b_m1, row_last_beat)),
                first_len.eq(Mux(crosses, to_b_m1 + 1, row_beats)),
            ]
        m.d.sync += [second_addr.eq(out_row_addr + (first_len << beat_bits)),
                     second_len_m1.eq(row_last_beat - first_len)]

        # d_beat is its row's last / starts a burst: flip-flops, each way d_beat can go
        # compared a cycle ahead (no reset: they follow d_beat and the row through CHECK)
        go = Signal()
        # credits != 0, a flip-flop decided a cycle ahead (go only chooses among outcomes)
        has_credit = Signal(init=self.credits != 0)
        d_last, needs_aw = Signal(reset_less=True), Signal(reset_less=True)
        ends_first = d_beat1 == first_len
        m.d.sync += [
            d_last.eq(Mux(go, Mux(d_last, row_last_beat == 0, d_beat1 == row_last_beat),
                          d_beat == row_last_beat)),
            needs_aw.eq(Mux(go, d_last | ends_first, d_first | (d_beat == first_len))),
        ]
        m.d.comb += [
            # the first row's address is set up in the cycle after launch
            go.eq(self.bank.ready & ~launched & has_credit & (~needs_aw | self.aw.ready)),
            advance.eq(launched | (go & d_last)),
            self.aw.valid.eq(self.bank.ready & ~launched & has_credit & needs_aw),
            self.aw.payload.addr.eq(Mux(d_first, out_row_addr, second_addr)),
            self.aw.payload.len.eq(Mux(d_first, first_len_m1, second_len_m1)),
            self.bank.beat.eq(d_beat),
            self.bank.release.eq(go & d_last),
        ]
        m.d.sync += [credits.eq(Mux(go & ~self.beat_done, credits - 1,
                                    Mux(~go & self.beat_done, credits + 1, credits))),
                     has_credit.eq(Mux(go & ~self.beat_done, credits != 1,
                                       Mux(~go & self.beat_done, 1, credits != 0)))]
        with m.If(go):
            m.d.sync += [d_beat.eq(d_beat1), d_beat1.eq(d_beat1 + 1), d_first.eq(0)]
            with m.If(d_last):
                m.d.sync += [d_beat.eq(0), d_beat1.eq(1), d_first.eq(1),
                             self.nodes.eq(self.nodes + 1)]

        # the beat leaves from registers; they load every cycle (no enable to fan out), and
        # o.valid qualifies them
        beat = Signal(accumulator_beat_layout(self.lanes, self.acc_w), reset_less=True)
        m.d.sync += [
            self.o.valid.eq(go), beat.acc.eq(self.bank.data),
            beat.mask.eq(Mux(d_last, self.last_mask, (1 << self.lanes) - 1)),
            beat.last.eq(d_last | ends_first),
            beat.zero.eq(self.bank.zero), beat.recip.eq(self.bank.recip),
        ]
        m.d.comb += [self.o.payload.eq(beat), self.busy.eq(self.o.valid)]
        return m
