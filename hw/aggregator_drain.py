"""The Aggregator's drain: a closed accumulator bank, beat by beat, towards the output
stage, with one write address per burst of its output row (a row crosses at most one
4 KiB boundary, so it is one or two bursts).

Output-row addresses move by the row stride (no multiply) and each row's burst split is
worked out a row ahead, into one of two slots; whether a beat is its row's last or
starts a burst is a flip-flop set a cycle ahead, so the drain's go signal is one LUT from
flip-flops, and it enables no wide register.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .aggregator_output import accumulator_beat_layout
from .aggregator_reduce import bank_read_signature
from .blocks import last_beat_flag
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
        nodes: output rows drained so far in this run (a cycle after each row's last beat).
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
        # two rows' bursts in two slots: `which` holds the row being drained, the other the
        # row after it. A slot is refilled a cycle after its row is left (from registers:
        # the drain's deepest decision only flips `which`, it enables no wide register);
        # the row after the next one is `next_row_addr`
        next_row_addr = Signal(aw, name="next_row_addr")
        slot_addr = [Signal(aw, name=f"slot{k}_addr", reset_less=True) for k in range(2)]
        slot_len = [Signal(range(maxb + 1), name=f"slot{k}_len", reset_less=True) for k in range(2)]
        slot_len_m1 = [Signal(range(maxb), name=f"slot{k}_len_m1", reset_less=True)
                       for k in range(2)]
        # "the first burst is one beat", "... two beats": flags of the slot, set with it
        slot_one = [Signal(name=f"slot{k}_one", reset_less=True) for k in range(2)]
        slot_two = [Signal(name=f"slot{k}_two", reset_less=True) for k in range(2)]
        which = Signal()
        out_row_addr, first_len, first_len_m1 = (Signal(aw, name="out_row_addr"),
                                                 Signal(range(maxb + 1), name="first_len"),
                                                 Signal(range(maxb), name="first_len_m1"))
        m.d.comb += [out_row_addr.eq(Mux(which, slot_addr[1], slot_addr[0])),
                     first_len.eq(Mux(which, slot_len[1], slot_len[0])),
                     first_len_m1.eq(Mux(which, slot_len_m1[1], slot_len_m1[0]))]
        second_addr, second_len_m1 = Signal(aw, name="second_addr"), Signal(range(maxb))
        advance = Signal()      # the drained row's last beat goes: the other slot is next
        advanced = Signal()     # the cycle after: refill the slot just left
        launched, launched2 = Signal(), Signal()   # the run's second and third cycles
        m.d.sync += [launched.eq(self.launch), launched2.eq(launched), advanced.eq(advance)]
        # beats to the boundary minus one, for a beat-aligned address: no carry chain
        to_b_m1 = ~next_row_addr[beat_bits:12]
        crosses = to_b_m1 < row_last_beat
        # whether the first burst is 1 or 2 beats, without the compare: min(to_b_m1 + 1,
        # row_beats) is 1 where either is 1, and 2 where one is 2 and the other at least 2
        one_beat = (to_b_m1 == 0) | (row_last_beat == 0)
        two_beats = (((to_b_m1 == 1) & (row_last_beat[1:] != 0)) |
                     ((row_last_beat == 1) & (to_b_m1 != 0)))
        # the first row fills `which` in the run's second cycle, the second row the other
        # slot in its third; later rows fill the slot their predecessor-but-one left
        fill = launched | launched2 | advanced
        fill_slot = Mux(launched, which, ~which)
        with m.If(self.launch):
            m.d.sync += next_row_addr.eq(self.base)
        with m.Elif(fill):
            m.d.sync += next_row_addr.eq(next_row_addr + self.stride)
        for k in range(2):
            with m.If(fill & (fill_slot == k)):
                m.d.sync += [
                    slot_addr[k].eq(next_row_addr),
                    slot_len_m1[k].eq(Mux(crosses, to_b_m1, row_last_beat)),
                    slot_len[k].eq(Mux(crosses, to_b_m1 + 1, row_beats)),
                    slot_one[k].eq(one_beat), slot_two[k].eq(two_beats),
                ]
        m.d.sync += [second_addr.eq(out_row_addr + (first_len << beat_bits)),
                     second_len_m1.eq(row_last_beat - first_len)]

        # d_beat is its row's last / starts a burst: flip-flops, each way d_beat can go
        # compared a cycle ahead (no reset: they follow d_beat and the row through CHECK)
        go = Signal()
        # credits != 0 and not the run's second cycle (where the first row's slot fills), a
        # flip-flop decided a cycle ahead (go only chooses among outcomes)
        may_go = Signal(init=self.credits != 0)
        needs_aw = Signal(reset_less=True)
        d_last = last_beat_flag(m, go, d_beat, d_beat1, row_last_beat, "d_last")
        # whether d_beat + 1 (burst_next) and d_beat (burst_here) end the row's first
        # burst, from a count of the beats before its second burst, `to_second` =
        # first_len - d_beat, and flags of it: flip-flops, no compare behind go. They serve
        # from the row's second beat on: its first beat asks its slot's flags, and its go
        # loads the count from the slot (the row's AW reads the same slot then)
        first_one = Mux(which, slot_one[1], slot_one[0])
        first_two = Mux(which, slot_two[1], slot_two[0])
        to_second = Signal(signed(len(first_len) + 1), name="to_second", reset_less=True)
        burst_next = Signal(name="burst_next", reset_less=True)     # to_second == 1
        burst_here = Signal(name="burst_here", reset_less=True)     # to_second == 0
        with m.If(go):
            with m.If(d_first):
                m.d.sync += [to_second.eq(first_len_m1), burst_next.eq(first_two),
                             burst_here.eq(first_one)]
            with m.Else():
                m.d.sync += [to_second.eq(to_second - 1), burst_next.eq(to_second == 2),
                             burst_here.eq(burst_next)]
        ends_first = Mux(d_first, first_one, burst_next)
        m.d.sync += needs_aw.eq(Mux(go, d_last | ends_first, d_first | burst_here))
        m.d.comb += [
            # the first row's bursts are in their slot from the run's third cycle
            go.eq(self.bank.ready & may_go & (~needs_aw | self.aw.ready)),
            advance.eq(go & d_last),
            self.aw.valid.eq(self.bank.ready & may_go & needs_aw),
            self.aw.payload.addr.eq(Mux(d_first, out_row_addr, second_addr)),
            self.aw.payload.len.eq(Mux(d_first, first_len_m1, second_len_m1)),
            self.bank.release.eq(advance),
        ]
        m.d.sync += [credits.eq(Mux(go & ~self.beat_done, credits - 1,
                                    Mux(~go & self.beat_done, credits + 1, credits))),
                     may_go.eq(~self.launch & Mux(go & ~self.beat_done, credits != 1,
                                                  Mux(~go & self.beat_done, 1, credits != 0)))]
        with m.If(go):
            m.d.sync += [d_beat.eq(d_beat1), d_beat1.eq(d_beat1 + 1), d_first.eq(0)]
            with m.If(d_last):
                m.d.sync += [d_beat.eq(0), d_beat1.eq(1), d_first.eq(1), which.eq(~which)]
        # rows drained, a cycle late (the count's adder is not behind the go)
        with m.If(advanced):
            m.d.sync += self.nodes.eq(self.nodes + 1)

        # the beat leaves from registers in two steps; they load every cycle (no enable to
        # fan out), and the valids qualify them. At the go: the bank's flags (and the beat's
        # number to the reduce, which registers it beside its RAMs); a cycle later its
        # accumulators, read at that number (the bank's last product, still in the reduce's
        # last stage at the go, is written by then)
        layout = accumulator_beat_layout(self.lanes, self.acc_w)
        beat = Signal(layout, reset_less=True)
        side = Signal(data.StructLayout({k: v.shape for k, v in layout if k != "acc"}),
                      reset_less=True)
        side_valid = Signal()
        m.d.sync += [
            side_valid.eq(go),
            side.mask.eq(Mux(d_last, self.last_mask, (1 << self.lanes) - 1)),
            side.last.eq(d_last | ends_first),
            side.zero.eq(self.bank.zero), side.single.eq(self.bank.single),
            side.recip.eq(self.bank.recip),
            self.o.valid.eq(side_valid), beat.acc.eq(self.bank.data),
            *[beat[k].eq(side[k]) for k, _ in side.shape()],
        ]
        m.d.comb += [self.bank.beat.eq(d_beat),
                     self.o.payload.eq(beat), self.busy.eq(side_valid | self.o.valid)]
        return m
