"""The Aggregator's reduce: every gathered row beat times its edge's weight, accumulated
per node (sum, or max) into one of two banks, and a closed bank read out by the drain.

Per lane, with ``w`` the edge weight and ``x`` a feature element, each node keeps two
partial accumulators, one for its even edges (first, third, ...) and one for its odd::

    acc = w * x                    the half's first edge
    acc = acc + w * x              sum (and mean: the output stage divides)
    acc = max(acc, w * x)          max

and the output stage combines the two (``even + odd`` or ``max(even, odd)``: both are
associative, and the sum wraps at the accumulator's width either way, so the result is
bit for bit the one accumulator's), or takes the even one alone for a node with a single
edge (its odd half holds an older node's values). Why two: consecutive beats of one half
are at least two cycles apart (one-beat rows alternate halves), so the accumulate stage's
sum and compare are registered before their result is written or forwarded, and no add
or compare sits in a one-cycle loop.

Node ``k + 1`` accumulates in one bank while node ``k`` drains from the other. Each
product is in DSP shape (operand registers, M, P). The old accumulator is read while the
beat's operands are registered (p1) and registered itself; beside M it becomes ``old``
(or the accumulate stage's value, for a beat two behind one into the same entry and half;
three behind, that value replaces the RAM's read). The accumulate stage registers the sum
and, for max, the compare with the operands it chose between; the new value is that sum or
that choice, one LUT from registers, into the RAM's write and the forwards::

    row beat   -> [x, w]  --> M ------> P ---> sum, compare -> new -> bank RAM
    descriptor -> RAM read -> stored --> old --^                 |
                               ^ new (3 behind)  ^ new (2 behind)

The banks are a RAM per lane, half (even, odd) and 16-bit slice of the accumulator, each
with copies of its own of the address and write-enable registers, and each lane with its
own copies of the stage's selects: no register drives more than one RAM's cells or one
lane's multiplexers.
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from gnnweave.fixed import MEAN_RECIP_BITS

from .aggregator_walk import descriptor_layout
from .blocks import StreamRegister, last_beat_flag, register_copies


#: bits of an accumulator per LUT RAM: each RAM's addresses and write enable are
#: registers of its own, so no register drives more than RAM_SLICE_BITS bits' cells
RAM_SLICE_BITS = 16


def bank_entries(max_beats: int) -> int:
    """Accumulator entries per bank: a row's beats, rounded up to a power of two."""
    return 1 << max(1, (max_beats - 1).bit_length())


def bank_read_signature(lanes: int, acc_width: int, max_beats: int) -> wiring.Signature:
    """The drain's side of the banks (as the :class:`Reduce` drives it).

    Members:
        ready: the drain's bank is closed and its last product is in.
        zero: that bank's node had no valid edge (its outputs are 0).
        recip: that node's mean reciprocal.
        beat: the beat the drain reads a cycle later, given in the cycle it reads the
            flags above: the reduce registers it beside each of its RAMs, and ``data`` is
            then a combinational read at those registers, in the bank the flags were of.
        single: that bank's node had one edge (only the even accumulators hold it).
        data: that beat's ``lanes`` accumulators of the node's even edges, then the
            ``lanes`` of its odd edges (meaningless with ``single``).
        release: the drain has read the bank's last beat; the other bank is next.
    """
    return wiring.Signature({
        "ready": Out(1), "zero": Out(1), "single": Out(1), "recip": Out(MEAN_RECIP_BITS + 1),
        "beat": In(range(max_beats)), "data": Out(2 * lanes * acc_width),
        "release": In(1),
    })


def reduce_descriptor_layout(elem_width: int) -> data.StructLayout:
    """What the reduce needs of an edge descriptor (with its mean reciprocal)."""
    return data.StructLayout({"desc": descriptor_layout(elem_width), "recip": MEAN_RECIP_BITS + 1})


class Reduce(wiring.Component):
    """Multiplies and accumulates one row beat per cycle; never stalls after the operands.

    Ports:
        rows: gathered feature beats, ``lanes`` elements each, a row's beats in order.
        descriptors: one per gathered row (:func:`reduce_descriptor_layout`), in the same
            order; a node without valid edges sends one ``empty`` descriptor and no row.
        row_last_beat: beats per row minus one, fixed for a run.
        max: reduce by max (else sum), fixed for a run (only with ``reduce_max``).
        bank: :func:`bank_read_signature`, the closed banks for the drain.
        busy: a product is still on its way into a bank.

    Args:
        lanes, elem_width, acc_width, max_beats: the build's geometry.
        reduce_max: build the max reduction.
    """

    def __init__(self, *, lanes: int, elem_width: int, acc_width: int, max_beats: int,
                 reduce_max: bool = True):
        self.lanes, self.ew, self.acc_w, self.max_beats = lanes, elem_width, acc_width, max_beats
        self.reduce_max = reduce_max
        super().__init__({
            "rows": In(stream.Signature(lanes * elem_width)),
            "descriptors": In(stream.Signature(reduce_descriptor_layout(elem_width))),
            "row_last_beat": In(range(max_beats + 1)),
            "max": In(1),
            "bank": Out(bank_read_signature(lanes, acc_width, max_beats)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        entries = bank_entries(self.max_beats)
        entry_bits = (entries - 1).bit_length()
        # RAMs, not registers: distributed RAM on the FPGA, and an indexed array (instead of
        # a wide multiplexer evaluated every cycle) in Verilator's model. One per lane, half
        # (even, odd) and slice of RAM_SLICE_BITS, each addressed and written from
        # registers of its own: a shared address would be a net to every LUT RAM cell of
        # the bank (1,024 in a 64 x 512-bit one), the longest wire of the placed unit
        slices = self.acc_w // RAM_SLICE_BITS if self.acc_w % RAM_SLICE_BITS == 0 else 1
        acc = [[[Memory(shape=unsigned(self.acc_w // slices), depth=2 * entries, init=[])
                 for _ in range(slices)] for _ in range(2)] for _ in range(self.lanes)]
        for lane, halves in enumerate(acc):
            for half, rams in zip(("even", "odd"), halves):
                for k, ram in enumerate(rams):
                    m.submodules[f"acc{lane}_{half}_{k}"] = ram
        # the descriptor's control bits leave flip-flops, not the FIFO's block RAM
        m.submodules.head = head_slice = StreamRegister(reduce_descriptor_layout(self.ew))
        wiring.connect(m, wiring.flipped(self.descriptors), head_slice.i)
        head = head_slice.o

        def index(beat, which_bank):
            return Cat(beat, Const(0, entry_bits - len(beat)), which_bank)

        bank = Signal()                       # the bank being accumulated
        dbank = Signal()                      # the bank the drain reads
        filled = Signal(2)                    # closed, waiting for / in the drain
        beat_no = Signal(range(self.max_beats))
        beat_no1 = Signal(range(self.max_beats + 1), init=1)    # beat_no + 1, counted beside it
        first = Signal(init=1)                # the next beat is its node's first edge's
        second = Signal()                     # ... its second edge's
        odd = Signal()                        # ... an odd edge's (the second, fourth, ...)
        bank_zero = Array(Signal(name=f"bank_zero{i}", reset_less=True) for i in range(2))
        bank_single = Array(Signal(name=f"bank_single{i}", reset_less=True) for i in range(2))
        bank_recip = Array(Signal(MEAN_RECIP_BITS + 1, name=f"bank_recip{i}", reset_less=True)
                           for i in range(2))
        row_pop, desc_pop = Signal(), Signal()
        other_free = Signal(init=1)           # ~filled[~bank], a flip-flop set a cycle ahead
        # whether beat_no is a row's last, a flip-flop decided a cycle ahead
        last_beat = last_beat_flag(m, row_pop, beat_no, beat_no1, self.row_last_beat, "last_beat")

        # the next cycle's `filled` and `dbank`, and `other_free` set a cycle ahead
        closing = Signal()                    # the accumulated bank closes
        filled_next, dbank_next = Signal(2), Signal()
        m.d.comb += [filled_next.eq(filled | Mux(closing, Mux(bank, 0b10, 0b01), 0)),
                     dbank_next.eq(dbank)]
        # the accumulated bank is never filled (a bank closes only while the other is free),
        # so after a close the other is not free, and otherwise it frees on its release
        m.d.sync += [filled.eq(filled_next), dbank.eq(dbank_next), bank.eq(bank ^ closing),
                     other_free.eq(~closing & (~filled.bit_select(~bank, 1) |
                                               (self.bank.release & (dbank != bank))))]

        # the three decisions, each a function of flip-flops only (none built from another:
        # they fan out to the FIFO, the descriptor slice and the bank flags side by side)
        desc = head.payload.desc
        beat_in = head.valid & ~desc.empty & self.rows.valid
        m.d.comb += [
            row_pop.eq(beat_in & (~(last_beat & desc.last) | other_free)),
            desc_pop.eq(head.valid & Mux(desc.empty, other_free, self.rows.valid & last_beat &
                                         (~desc.last | other_free))),
            closing.eq(head.valid & other_free &
                       (desc.empty | (self.rows.valid & last_beat & desc.last))),
        ]
        with m.If(row_pop):
            m.d.sync += [beat_no.eq(beat_no1), beat_no1.eq(beat_no1 + 1)]
            with m.If(last_beat):
                m.d.sync += [beat_no.eq(0), beat_no1.eq(1), first.eq(0), second.eq(first),
                             odd.eq(~odd)]
        with m.If(closing):
            # (closing with a row beat: `first` says the closing edge is the node's only one)
            m.d.sync += [first.eq(1), second.eq(0), odd.eq(0), bank_zero[bank].eq(desc.empty),
                         bank_single[bank].eq(first),
                         bank_recip[bank].eq(head.payload.recip)]
        m.d.comb += [self.rows.ready.eq(row_pop), head.ready.eq(desc_pop)]

        entry = index(beat_no, bank)
        self._multiply_accumulate(m, acc, row_pop, entry, first, second, odd,
                                  head.payload.desc.weight)

        # the drain side: a closed bank is ready once none of its products is in flight; a
        # flip-flop, from the values its terms take next (the drain's go starts from it);
        # the release (the drain's deepest decision) only chooses between the two banks
        release = self.bank.release
        with m.If(release):
            m.d.comb += [filled_next.bit_select(dbank, 1).eq(0), dbank_next.eq(~dbank)]
        # (a bank closing with a row beat has that beat's product in flight: only a close by
        # an empty descriptor can make its bank ready at once)
        ready = Signal()
        closing_empty = head.valid & desc.empty & other_free
        # (kept nets: the release, which the write-address ready decides, only chooses
        # between them, in the last LUT, and ABC builds no deeper tree around it)
        ready_of = [Signal(name=f"ready_{k}", attrs={"keep": 1}) for k in ("held", "released")]
        m.d.comb += [ready_of[k].eq(~self._in_pipe.bit_select(b, 1) &
                                    (filled.bit_select(b, 1) | (closing_empty & (bank == b))))
                     for k, b in enumerate((dbank, ~dbank))]
        m.d.sync += ready.eq(Mux(release, ready_of[1], ready_of[0]))
        # the drain reads a beat's accumulators a cycle after its flags (and its go): the
        # bank the flags were of, with any product that was still in s3 then written
        drain_addr = iter(register_copies(m, index(self.bank.beat, dbank),
                                          2 * self.lanes * slices, "drain_addr"))
        drained = [[], []]
        for halves in acc:
            for half, rams in enumerate(halves):
                words = []
                for ram in rams:
                    port = ram.read_port(domain="comb")
                    m.d.comb += port.addr.eq(next(drain_addr))
                    words.append(port.data)
                drained[half].append(Cat(*words))
        m.d.comb += [
            self.bank.ready.eq(ready),
            self.bank.zero.eq(bank_zero[dbank]), self.bank.single.eq(bank_single[dbank]),
            self.bank.recip.eq(bank_recip[dbank]),
            self.bank.data.eq(Cat(*drained[0], *drained[1])),
        ]
        return m

    def _multiply_accumulate(self, m, acc, valid, entry, first, second, odd, weight):
        """The product pipeline and the accumulate stage; sets :attr:`_in_pipe` (per bank: a
        product of it will be in p2 or s2), and drives ``busy``."""
        lanes, ew, acc_w = self.lanes, self.ew, self.acc_w
        depth = len(entry)

        def regs(prefix, **shapes):
            return [Signal(shape, name=f"{prefix}_{n}", reset_less=True) for n, shape in shapes.items()]

        p1_valid, p2_valid, s2_valid, s3_valid = (Signal(name=f"{n}_valid")
                                                  for n in ("p1", "p2", "s2", "s3"))
        # `fresh`: the beat is its half's first (the node's first or second edge), so it
        # meets the identity
        p1_index, p1_fresh, p1_odd, p1_x, p1_w = regs(
            "p1", index=depth, fresh=1, odd=1, x=lanes * ew, w=signed(ew))
        p2_index, p2_odd = regs("p2", index=depth, odd=1)
        s2_index, s2_odd = regs("s2", index=depth, odd=1)

        def lane_regs(prefix, shape):
            # one register per lane, not one wide vector: the same flip-flops, and a
            # simulator computes each lane once instead of per 32-bit word of the vector
            return [Signal(shape, name=f"{prefix}{k}", reset_less=True) for k in range(lanes)]

        p2_prod = lane_regs("p2_prod", signed(2 * ew))
        p2_stored = lane_regs("p2_stored", unsigned(acc_w))
        s2_prod = lane_regs("s2_prod", signed(2 * ew))
        s2_old = lane_regs("s2_old", signed(acc_w))
        s3_sum = lane_regs("s3_sum", signed(acc_w))
        # a max run's compare and the two values it chose between (with ``reduce_max``)
        s3_prod = lane_regs("s3_prod", signed(2 * ew))
        s3_old = lane_regs("s3_old", signed(2 * ew))
        s3_larger = lane_regs("s3_larger", 1)
        # the accumulate stage's result: the sum, or the larger of a max run, chosen from
        # registers (one LUT), into the RAM's write and the two forwards
        s3_new = [Signal(signed(acc_w), name=f"s3_new{k}") for k in range(lanes)]
        m.d.sync += [
            p1_valid.eq(valid), p1_index.eq(entry), p1_fresh.eq(first | second), p1_odd.eq(odd),
            p1_x.eq(self.rows.payload), p1_w.eq(weight),
            p2_valid.eq(p1_valid), p2_index.eq(p1_index), p2_odd.eq(p1_odd),
            [p.eq(p1_x.word_select(k, ew).as_signed() * p1_w) for k, p in enumerate(p2_prod)],
            s2_valid.eq(p2_valid), s2_index.eq(p2_index), s2_odd.eq(p2_odd),
            [s.eq(p) for s, p in zip(s2_prod, p2_prod)],
            s3_valid.eq(s2_valid),
        ]
        # each lane's controls, and each RAM's addresses and write enable, from copies of
        # their own (a lane's select reaches its acc_w multiplexers, not every lane's)
        slices = len(acc[0][0])
        per_ram = 2 * lanes * slices
        # the old accumulator is read while the beat is in p1 (at copies of its entry),
        # and registered: the RAM's read is a stage of its own
        update_addr = register_copies(m, entry, per_ram, "update_addr")
        read_odd = register_copies(m, odd, lanes, "p1_odd")
        write_addr = register_copies(m, s2_index, per_ram, "write_addr")
        write_en = [register_copies(m, s2_valid & (s2_odd == half), lanes * slices,
                                    f"write_en{half}_") for half in range(2)]
        fresh = register_copies(m, p1_fresh, lanes, "p2_fresh")
        # a beat two behind one into the same entry and half (a one-beat row two edges on)
        # takes its value from s3 in p2; three behind, from s3 in p1 (s3 writes the RAM
        # at the end of that cycle); the beat right behind never shares both
        forward = register_copies(m, s2_valid & (p1_index == s2_index) & (p1_odd == s2_odd),
                                  lanes, "forward")
        forward_read = register_copies(m, s2_valid & (entry == s2_index) & (odd == s2_odd),
                                       lanes, "forward_read")
        is_max = register_copies(m, self.max if self.reduce_max else Const(0, 1), lanes, "is_max")

        for lane in range(lanes):
            stored = []
            for half, rams in enumerate(acc[lane]):
                words = []
                for k, ram in enumerate(rams):
                    ram_no = (2 * lane + half) * slices + k
                    read, write = ram.read_port(domain="comb"), ram.write_port()
                    m.d.comb += [read.addr.eq(update_addr[ram_no]),
                                 write.addr.eq(write_addr[ram_no]),
                                 write.data.eq(s3_new[lane].word_select(k, len(write.data))),
                                 write.en.eq(write_en[half][lane * slices + k])]
                    words.append(read.data)
                stored.append(Cat(*words))
            m.d.sync += p2_stored[lane].eq(Mux(forward_read[lane], s3_new[lane],
                                               Mux(read_odd[lane], stored[1], stored[0])))
            # a half's first product meets the identity of its reduction instead of the old
            # accumulator, so the accumulate stage has no `first` to decide: 0 for sum, and
            # for max the least value of a product's width (every product of two ew-bit
            # elements is above it), sign-extended
            identity = Cat(Const(0, 2 * ew - 1), is_max[lane].replicate(acc_w - 2 * ew + 1))
            m.d.sync += s2_old[lane].eq(Mux(fresh[lane], identity,
                                            Mux(forward[lane], s3_new[lane], p2_stored[lane])))
            # in a max run the accumulator holds the identity or a product, each a
            # product's width sign-extended, so a compare of that width decides (a carry
            # chain of half the accumulator's), registered beside the sum
            prod, prev = s2_prod[lane], s2_old[lane]
            m.d.sync += s3_sum[lane].eq((prev + prod)[:acc_w])
            value = s3_sum[lane]
            if self.reduce_max:
                m.d.sync += [s3_prod[lane].eq(prod), s3_old[lane].eq(prev[:2 * ew]),
                             s3_larger[lane].eq(prod > prev[:2 * ew].as_signed())]
                larger = Mux(s3_larger[lane], s3_prod[lane], s3_old[lane])
                value = Mux(is_max[lane], larger, value)
            m.d.comb += s3_new[lane].eq(value)

        # per bank, whether a product of it will be in p2 or s2 next cycle (the one entering
        # p1 is the caller's to know; one in s3 is written before the drain reads)
        self._in_pipe = Signal(2)
        bank_bit = depth - 1
        for b in range(2):
            m.d.comb += self._in_pipe[b].eq((p1_valid & (p1_index[bank_bit] == b)) |
                                            (p2_valid & (p2_index[bank_bit] == b)))
        m.d.comb += self.busy.eq(p1_valid | p2_valid | s2_valid | s3_valid)
