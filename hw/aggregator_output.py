"""The Aggregator's output stage: accumulator beats in, narrowed output beats out.

Per lane, bit-exact to :func:`gnnweave.golden.aggregate.aggregate_raw`::

    S = saturate(round_half_even(acc / 2**shift), MEAN_SUM_WIDTH)
    y = saturate(round_half_even(S * recip / 2**MEAN_RECIP_BITS), elem_width)  # mean
    y = saturate(S, elem_width)                                                  # sum, max

(saturating to ``MEAN_SUM_WIDTH`` first changes neither the value nor the flag of a
sum or max: the second saturation is the narrower one). Every step has a stage of its
own so that no register-to-register path holds more than one carry chain or a few LUTs::

    shift -> align -> round -> flags -> clamp -> [a/b regs -> M -> P -> add (mean)
    -> round terms -> round] -> flags -> clamp -> beat          -> popcount

The pipeline never stalls (its producer reserves room for every beat in flight) and its
data registers have no reset; ``valid`` is the only state that a reset clears.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from gnnweave.fixed import MEAN_RECIP_BITS, MEAN_SUM_WIDTH

from .arith import (PipelinedMultiplier, clamp, rounding_constants, rounding_terms,
                    saturation_flags)


def accumulator_beat_layout(lanes: int, acc_width: int) -> data.StructLayout:
    """One beat of accumulators on its way out: ``acc`` holds the ``lanes`` accumulators of
    the node's even edges, then those of its odd edges (see :mod:`.aggregator_reduce`);
    ``single`` marks a node with one edge (its odd accumulators are not its own), ``zero``
    one without edges."""
    return data.StructLayout({"acc": 2 * lanes * acc_width, "mask": lanes, "last": 1,
                              "zero": 1, "single": 1, "recip": MEAN_RECIP_BITS + 1})


def output_beat_layout(lanes: int, elem_width: int) -> data.StructLayout:
    """One beat for the write port (the layout of :func:`~.dma.write_beat_layout`)."""
    return data.StructLayout({"data": lanes * elem_width, "strb": lanes * elem_width // 8,
                              "last": 1})


class _Chain:
    """Registers a beat's values stage by stage, its ``valid`` beside them.

    A stage's values load only behind a valid beat (clock enables from the previous
    stage's ``valid`` flip-flop, no logic): the hardware is the same, and a simulator
    skips the stage's arithmetic while no beat passes. A list of values (one per lane)
    becomes a list of registers: the same flip-flops as one wide vector, and a simulator
    computes each lane in machine words instead of slicing a vector of several hundred
    bits."""

    def __init__(self, m: Module, valid):
        self.m, self.valid, self.valids = m, valid, []

    def stage(self, name: str, **values) -> dict:
        enable = self.valid
        self.valid = Signal(name=f"{name}_valid", attrs={"max_fanout": 64})
        self.m.d.sync += self.valid.eq(enable)
        self.valids.append(self.valid)
        regs = {}
        for key, value in values.items():
            if isinstance(value, list):
                regs[key] = [self._register(f"{name}_{key}{k}", v, enable)
                             for k, v in enumerate(value)]
            else:
                regs[key] = self._register(f"{name}_{key}", value, enable)
        return regs

    def _register(self, name, value, enable):
        value = Value.cast(value)
        reg = Signal(value.shape(), name=name, reset_less=True)
        with self.m.If(enable):
            self.m.d.sync += reg.eq(value)
        return reg


class OutputStage(wiring.Component):
    """Narrows one beat of ``lanes`` accumulators per cycle into ``elem_width`` outputs.

    Ports:
        i: accumulator beats (:func:`accumulator_beat_layout`); always accepted. Each
            lane's two partial accumulators are combined first (sum, or max with ``max``;
            the even one alone with ``single``). In a max run each accumulator is a
            product of two ``elem_width`` elements (or the least value of that width),
            sign-extended, as the reduce keeps them: the compare is of that width.
        o: output beats (:func:`output_beat_layout`), :attr:`latency` cycles later; the
            consumer takes every beat (it has reserved room for the beats in flight).
        shift: narrowing shift (0 .. 63), fixed for a run (registered, with its rounding
            constants: a beat may enter from the second cycle after it is set).
        mean: 1 for the ``mean`` reduction (only with ``mean=True``), fixed for a run
            (registered likewise).
        max: 1 for the ``max`` reduction (only with ``reduce_max=True``), likewise.
        saturated: output elements of one beat that saturated (registered, two cycles
            after the beat leaves on ``o``; 0 when none).
        busy: a beat or its count is still in the pipeline.
    """

    #: bits of an accumulator each first-stage OR of its dropped-bit flags covers (24 inputs:
    #: two LUT levels; the second stage ORs the chunks)
    ROUND_CHUNK = 12

    def __init__(self, *, lanes: int, acc_width: int, elem_width: int, mean: bool = True,
                 reduce_max: bool = True):
        self.lanes, self.acc_width, self.elem_width, self.has_mean = (
            lanes, acc_width, elem_width, mean)
        self.has_max = reduce_max
        self._multipliers = [PipelinedMultiplier(signed(MEAN_SUM_WIDTH), MEAN_RECIP_BITS + 1,
                                                 enable=True)
                             for _ in range(lanes)] if mean else []
        # pair, combine, shift, align, round, flags, clamp | multiply, round terms, round |
        # flags, clamp
        self.latency = 7 + (self._multipliers[0].latency + 2 if mean else 0) + 2
        super().__init__({
            "i": In(stream.Signature(accumulator_beat_layout(lanes, acc_width),
                                     always_ready=True)),
            "o": Out(stream.Signature(output_beat_layout(lanes, elem_width), always_ready=True)),
            "shift": In(6),
            "mean": In(1),
            "max": In(1),
            "saturated": Out(range(lanes + 1)),
            "busy": Out(1),
        })

    def _lanes(self, value, width):
        """A beat's ``lanes`` signed values of ``width`` bits each: the slices of a vector,
        or the elements of a list narrowed to ``width``."""
        if isinstance(value, list):
            return [Value.cast(v)[:width].as_signed() for v in value]
        return [value.word_select(k, width).as_signed() for k in range(self.lanes)]

    def elaborate(self, platform):
        m = Module()
        acc_w, ew, lanes = self.acc_width, self.elem_width, self.lanes
        beat = self.i.payload
        chain = _Chain(m, self.i.valid)
        # run constants, registered where they fan out to every lane
        shift = Signal(6, reset_less=True, attrs={"max_fanout": 64})
        mask, half = Signal(acc_w, reset_less=True), Signal(acc_w, reset_less=True)
        self._mean_sel = Signal(reset_less=True, attrs={"max_fanout": 64})
        rounds = Signal(reset_less=True, attrs={"max_fanout": 64})    # 0 < shift < acc_w
        m.d.sync += [shift.eq(self.shift), self._mean_sel.eq(self.mean),
                     rounds.eq((self.shift != 0) & (self.shift < acc_w)),
                     Cat(mask, half).eq(Cat(*rounding_constants(self.shift, acc_w)))]

        # combine each lane's even and odd accumulators (wrapping like the accumulate)
        max_sel = Signal(reset_less=True, attrs={"max_fanout": 64})
        m.d.sync += max_sel.eq(self.max if self.has_max else 0)
        # in two stages: the sum and the compare (two carry chains side by side), then the
        # choice among sum, larger and even (muxes only)
        halves = lanes * acc_w
        evens = self._lanes(beat.acc[:halves], acc_w)
        odds = self._lanes(beat.acc[halves:], acc_w)
        side = dict(mask=beat.mask, last=beat.last, zero=beat.zero, recip=beat.recip,
                    single=beat.single)
        operands = dict(even=evens)
        if self.has_max:
            # in a max run each accumulator holds a product's width sign-extended (the
            # reduce's identity included; a single edge's odd one is not used), so a
            # compare of that width decides
            prod_w = 2 * ew
            odd_larger = [o[:prod_w].as_signed() > e[:prod_w].as_signed()
                          for e, o in zip(evens, odds)]
            operands.update(odd=odds, odd_larger=Cat(*odd_larger))
        r = chain.stage("pair", summed=self._lanes([e + o for e, o in zip(evens, odds)], acc_w),
                        **operands, **side)
        combined = []
        odd_q = self._lanes(r["odd"], acc_w) if self.has_max else None
        for k, (even, summed) in enumerate(zip(self._lanes(r["even"], acc_w),
                                              self._lanes(r["summed"], acc_w))):
            value = summed
            if self.has_max:
                value = Mux(max_sel, Mux(r["odd_larger"][k], odd_q[k], even), summed)
            combined.append(Mux(r["single"], even, value))
        r = chain.stage("combine", acc=self._lanes(combined, acc_w),
                        **{k: r[k] for k in ("mask", "last", "zero", "recip")})

        # shift, in two stages of three mux levels: by the shift's multiple of 8, then by
        # the rest. Beside it, how the dropped bits compare with one half: the half bit
        # (`top`) and whether any bit below it is set (`rest`) give above = top & rest and
        # tie = top & ~rest; both are OR-reductions, in chunks at the first stage and of the
        # chunks at the second (no compare chain)
        accs = self._lanes(r["acc"], acc_w)
        below_half = mask[1:]           # the dropped bits under the half bit
        chunks = range(0, acc_w, self.ROUND_CHUNK)
        top = Cat(*[(a.as_unsigned()[i:i + self.ROUND_CHUNK] & half[i:i + self.ROUND_CHUNK]).any()
                    for a in accs for i in chunks])
        rest = Cat(*[(a.as_unsigned()[i:i + self.ROUND_CHUNK]
                      & below_half[i:i + self.ROUND_CHUNK]).any() for a in accs for i in chunks])
        r = chain.stage("shift", coarse=self._lanes([a >> Cat(Const(0, 3), shift[3:])
                                                     for a in accs], acc_w),
                        top=top, rest=rest, **{k: r[k] for k in ("mask", "last", "zero", "recip")})
        side = {k: r[k] for k in ("mask", "last", "zero", "recip")}
        inside = shift < acc_w          # beyond the width the quotient rounds to 0
        kept = [Mux(inside, c >> shift[:3], 0) for c in self._lanes(r["coarse"], acc_w)]
        n = len(chunks)
        tops = [rounds & r["top"][k * n:(k + 1) * n].any() for k in range(lanes)]
        rests = [r["rest"][k * n:(k + 1) * n].any() for k in range(lanes)]
        r = chain.stage("align", kept=self._lanes(kept, acc_w),
                        above=Cat(*[t & s for t, s in zip(tops, rests)]),
                        tie=Cat(*[t & ~s for t, s in zip(tops, rests)]), **side)
        side = {k: r[k] for k in side}
        # round: kept + round-up, one carry chain
        rounded = [k + (r["above"][i] | (r["tie"][i] & k[0]))
                   for i, k in enumerate(self._lanes(r["kept"], acc_w))]
        r = chain.stage("round", value=self._lanes(rounded, acc_w + 1), **side)
        value, sat, side = self._saturate(chain, "sum", r.pop("value"), acc_w + 1,
                                          MEAN_SUM_WIDTH, r)
        width = MEAN_SUM_WIDTH
        if self.has_mean:
            value, width, side = self._mean(m, chain, value, {**side, "sat": sat})
            sat = side.pop("sat")
        value, sat_out, side = self._saturate(chain, "out", value, width, ew, {**side, "sat": sat})
        saturated = (sat_out | side["sat"]) & side["mask"] & Cat(*[~side["zero"]] * lanes)
        m.d.comb += [
            self.o.valid.eq(chain.valid),
            self.o.payload.data.eq(Mux(side["zero"], 0, Cat(*value))),
            self.o.payload.strb.eq(Cat(*[Mux(side["mask"][k], (1 << (ew // 8)) - 1, 0)
                                         for k in range(lanes)])),
            self.o.payload.last.eq(side["last"]),
        ]
        # a beat's saturation count: the lanes' flags registered, then their popcount (the
        # flags' gating and the adder tree do not share a cycle), which the counter adds
        # next cycle
        flagged = Signal(lanes, reset_less=True)
        flagged_valid = Signal()
        count = Signal(range(lanes + 1), reset_less=True)
        counted = Signal()
        m.d.sync += [flagged.eq(saturated), flagged_valid.eq(chain.valid),
                     count.eq(sum(flagged)), counted.eq(flagged_valid)]
        m.d.comb += [self.saturated.eq(Mux(counted, count, 0)),
                     self.busy.eq(Cat(self.i.valid, *chain.valids, flagged_valid, counted).any())]
        return m

    def _saturate(self, chain, name, value, width, out_width, side):
        """Two stages: each lane's saturation flags, then its clamped value.
        Returns (values, per-lane flags, side values)."""
        flags = [saturation_flags(v, out_width) for v in self._lanes(value, width)]
        r = chain.stage(f"{name}_flags", value=self._lanes(value, width),
                        big=Cat(*[b for b, _ in flags]), small=Cat(*[s for _, s in flags]), **side)
        clamped = [clamp(v, out_width, r["big"][k], r["small"][k])
                   for k, v in enumerate(self._lanes(r["value"], width))]
        c = chain.stage(f"{name}_clamp", value=clamped, flag=r["big"] | r["small"],
                        **{k: r[k] for k in side})
        return c.pop("value"), c.pop("flag"), c

    def _mean(self, m, chain, value, side):
        """``S * recip`` in DSP tiles, its rounding by MEAN_RECIP_BITS in two stages; the
        plain ``S`` (sum, max) travels alongside and is chosen at the last one."""
        products = []
        for k, (s, mul) in enumerate(zip(self._lanes(value, MEAN_SUM_WIDTH), self._multipliers)):
            m.submodules[f"recip_mul{k}"] = mul
            m.d.comb += [mul.a.eq(s), mul.b.eq(side["recip"]),
                         mul.en.eq(chain.valid & self._mean_sel)]
            products.append(mul.p)
        carried = {**side, "plain": self._lanes(value, MEAN_SUM_WIDTH)}
        for step in range(mul.latency):
            carried = chain.stage(f"mul{step}", **carried)
        terms = [rounding_terms(p.as_signed(), MEAN_RECIP_BITS) for p in products]
        kw = len(terms[0][0])
        r = chain.stage("recip_terms", kept=self._lanes([t[0] for t in terms], kw),
                        above=Cat(*[t[1] for t in terms]), tie=Cat(*[t[2] for t in terms]),
                        **carried)
        plain = self._lanes(r["plain"], MEAN_SUM_WIDTH)
        chosen = [Mux(self._mean_sel, (k + (r["above"][i] | (r["tie"][i] & k[0]))), plain[i])
                  for i, k in enumerate(self._lanes(r["kept"], kw))]
        q = chain.stage("recip_round", value=self._lanes(chosen, kw + 1),
                        **{k: r[k] for k in side})
        return q.pop("value"), kw + 1, q
