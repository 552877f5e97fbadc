"""Where the Aggregator reads a gathered feature row: ``feat_addr + index * feat_stride``,
cut at the 4 KiB boundary it may cross (a row is at most 4 KiB, so into at most two
bursts).

The product goes through DSP-shaped tiles (:class:`~.arith.PipelinedMultiplier`), then
one adder or comparator per stage::

    index -> [a/b regs -> M -> P -> adder tree] -> + base -> beats to boundary
          -> first burst -> second burst's address and length
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .arith import PipelinedMultiplier
from .dma import beats_to_boundary


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
        self._multiplier = PipelinedMultiplier(unsigned(32), unsigned(32))
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
        m.d.comb += [mul.a.eq(self.i.payload), mul.b.eq(self.stride)]
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
