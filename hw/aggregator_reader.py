"""The Aggregator's metadata reader: :class:`~.blocks.ElementReader` with an unpacker whose
decisions are each one or two LUTs from flip-flops.

The shared unpacker decides whether the current beat ends (its last element, or the
run's) from the element counter's compares and the select counter's, behind the
consumer's ready; mapped, those decisions share the nets that enable the beat
registers (a fan-out of a whole beat). Here every compare is a flag kept a cycle ahead
(``elems_left == 2``, ``sel == per_beat - 2``), the beat's end and the two beat valids
are written as the few-input functions they are, and the beat registers' enable is a
signal of its own.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal

from .blocks import ElementReader


class MetaReader(ElementReader):
    """:class:`~.blocks.ElementReader` (same ports, same behaviour, element for element and
    cycle for cycle), its unpacker's control flattened for timing."""

    def _unpack(self, m: Module, fifo_out, per_beat: int):
        cur_valid, nxt_valid = Signal(), Signal()
        cur, nxt = Signal(self.dw, reset_less=True), Signal(self.dw, reset_less=True)
        sel = Signal(range(per_beat))
        elems_left = Signal(32)
        has_elems, last_elem = Signal(), Signal()        # elems_left != 0, == 1
        left_is2 = Signal()                              # elems_left == 2
        left_is3 = Signal()                              # elems_left == 3
        sel_before_last = Signal(init=per_beat == 2)     # sel == per_beat - 2
        at_end = Signal()                                # sel == per_beat - 1 | last_elem
        one_per_beat = int(per_beat == 1)
        ready = self.elements.ready
        take = cur_valid & ready
        # cur takes the next beat: free, or its end taken (not built from `take`)
        frees = Signal()
        m.d.comb += [
            frees.eq(~cur_valid | (ready & at_end)),
            self.elements.valid.eq(cur_valid),
            self.elements.payload.eq(cur.word_select(sel, self.ew)),
            fifo_out.ready.eq(~nxt_valid),
            self.done.eq(~has_elems),
        ]
        with m.If(~nxt_valid):
            m.d.sync += nxt.eq(fifo_out.payload)
        with m.If(frees):
            m.d.sync += cur.eq(Mux(nxt_valid, nxt, fifo_out.payload))
        # the valids from their inputs (cur_valid, ready, at_end, nxt_valid, the FIFO's valid)
        ends = ready & at_end
        m.d.sync += [
            cur_valid.eq(Mux(cur_valid, ~ends | nxt_valid | fifo_out.valid,
                             nxt_valid | fifo_out.valid)),
            nxt_valid.eq(cur_valid & ~ends & (nxt_valid | fifo_out.valid)),
        ]
        loading = Signal()
        m.d.sync += loading.eq(self.start)
        with m.If(self.start):
            m.d.sync += [elems_left.eq(self.count), sel.eq(0),
                         sel_before_last.eq(per_beat == 2),
                         at_end.eq(one_per_beat | last_elem)]
        with m.Elif(loading):
            # the count's flags from the loaded count (no element arrives this early)
            m.d.sync += [has_elems.eq(elems_left != 0), last_elem.eq(elems_left == 1),
                         left_is2.eq(elems_left == 2), left_is3.eq(elems_left == 3),
                         at_end.eq(one_per_beat | (elems_left == 1))]
        with m.Elif(take):
            m.d.sync += [elems_left.eq(elems_left - 1),
                         has_elems.eq(~last_elem), last_elem.eq(left_is2),
                         left_is2.eq(left_is3), left_is3.eq(elems_left == 4)]
            with m.If(at_end):
                m.d.sync += [sel.eq(0), sel_before_last.eq(per_beat == 2),
                             at_end.eq(one_per_beat | left_is2)]
            with m.Else():
                m.d.sync += [sel.eq(sel + 1), sel_before_last.eq(sel == per_beat - 3),
                             at_end.eq(sel_before_last | left_is2)]
