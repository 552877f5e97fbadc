"""The TrainStage's SGD update as a pipeline: one word of ``lanes`` elements enters per
cycle, its result leaves :attr:`SgdPipeline.LATENCY` cycles later, bit for bit
:func:`gnnweave.golden.mac.sgd_update`.

Per element, with ``m = master.frac`` (see the golden function)::

    d   = (g << (m - grad.frac)) + rhe(wd * w, wd.frac)
    v'  = sat_velocity(rhe(mu * v, mu.frac) + d)          (momentum on: mu != 0)
    w'  = sat_master(w - rhe(lr * (v' if momentum else d), lr.frac))
    q   = sat_weight(rhe(w', m - weight.frac))           (the MAC weight)

Every multiply is split into DSP-sized partial products (a ``LIMB``-bit unsigned low part
and a signed high part, each within a 27 x 18 signed multiplier) with an input, an M and a
P register, so a DSP48E2 holds each with nothing around it. A rounding shift by fewer
than ``LIMB`` bits needs only the low product's dropped bits, so it is computed from the
registered partial products: the kept part and the round-up bit in one stage, their sum
in the next. Saturation and narrowing each take a stage of their own; every stage has at
most one carry chain of the word's width (two for an add with its round-up bit as the
carry in).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from gnnweave.fixed import FixedFormat

from .arith import RegisterStages, fabric_products, join_products, saturate

#: Bits of the unsigned low partial product's multiplicand (a 27 x 18 signed multiplier
#: takes it as a 27-bit non-negative value).
LIMB = 26
#: Widest multiplicand: the high limb must fit the multiplier's 27-bit signed input.
MAX_MULTIPLICAND = LIMB + 27


def round_up_bit(dropped, kept_lsb, shift: int):
    """Round-half-even's increment for ``shift`` dropped bits (``shift >= 1``)."""
    half = Const(1 << (shift - 1), shift)
    return (dropped > half) | ((dropped == half) & kept_lsb)


class _Product:
    """``a * b`` (``a`` signed, ``b`` unsigned, at most 16 bits) as two registered partial
    products: after :meth:`__init__`'s three register stages (input, M, P) ``hi`` and
    ``lo`` hold ``a * b == (hi << LIMB) + lo``."""

    LATENCY = 3

    def __init__(self, st: RegisterStages, a, b, name: str):
        if len(a) > MAX_MULTIPLICAND or len(b) > 17:
            raise ValueError(f"{name}: a {len(a)} x {len(b)}-bit product does not fit two DSPs")
        wide = Signal(signed(max(len(a), LIMB + 1)), name=f"{st.prefix}_{name}_a")
        st.m.d.comb += wide.eq(a.as_signed())
        a_lo = st.reg(wide.as_unsigned()[:LIMB], f"{name}_a_lo")
        a_hi = st.reg(wide[LIMB:].as_signed(), f"{name}_a_hi")
        b_q = st.reg(b, f"{name}_b")
        m_lo = self._m_stage(st, a_lo, b_q, f"{name}_m_lo")
        m_hi = self._m_stage(st, a_hi, b_q, f"{name}_m_hi")
        self.lo = self._p_stage(st, m_lo, (a_lo * b_q).shape(), f"{name}_p_lo")
        self.hi = self._p_stage(st, m_hi, (a_hi * b_q).shape(), f"{name}_p_hi")

    @staticmethod
    def _m_stage(st: RegisterStages, a, b, name: str) -> list:
        """``a * b``'s M registers: one per fabric multiplier (:func:`fabric_products`)."""
        pieces = fabric_products(a, b)
        return [(shift, st.reg(product, name if len(pieces) == 1 else f"{name}{k}"))
                for k, (shift, product) in enumerate(pieces)]

    @staticmethod
    def _p_stage(st: RegisterStages, m_regs: list, shape, name: str):
        """The P register: the M registers summed (the pieces add up to the product exactly,
        which fits its own ``shape``)."""
        if len(m_regs) == 1:
            return st.reg(m_regs[0][1], name)
        total = join_products(m_regs)[:shape.width]
        return st.reg(total.as_signed() if shape.signed else total, name, shape)

    def rounded_parts(self, shift: int):
        """``(kept, round_up)`` of ``rhe(a * b, shift)``: ``rhe == kept + round_up``."""
        if not 0 <= shift < LIMB:
            raise ValueError(f"rounding shift {shift} must be below {LIMB}")
        lo = self.lo
        kept = (self.hi.as_signed() << (LIMB - shift)) + (lo >> shift).as_unsigned()
        if shift == 0:
            return kept, Const(0, 1)
        return kept, round_up_bit(lo[:shift], lo[shift], shift)


class SgdPipeline(wiring.Component):
    """SGD over one word of ``lanes`` elements per cycle (see module doc).

    Inputs (sampled with ``valid``): ``w`` master weights, ``g`` weight-gradient sums,
    ``v`` velocities, ``lane_on`` (lanes that hold an element: only they count
    saturations) and a ``tag`` carried along (e.g. the word's address). ``lr``, ``wd``,
    ``mu`` are the raw hyper-parameters; keep them steady while words are in flight.
    Outputs, ``LATENCY`` cycles after the input: ``out_valid``, ``out_tag``, ``master``,
    ``velocity`` (the new velocity; with ``mu == 0`` it is not meaningful and must not be
    stored), ``weight`` (narrowed MAC weight); one cycle later ``sat_valid`` and
    ``sat_count`` (saturated elements of that word: velocity, master or weight).
    ``busy`` (a register: no wide OR in front of its user) is high while a word taken in
    an earlier cycle is in flight, including its saturation count."""

    def __init__(self, *, lanes: int, tag_width: int, master: FixedFormat, weight: FixedFormat,
                 grad_sum: FixedFormat, velocity: FixedFormat, lr: FixedFormat, wd: FixedFormat,
                 mu: FixedFormat):
        self.lanes = lanes
        self.fmt = dict(master=master, weight=weight, grad_sum=grad_sum, velocity=velocity,
                        lr=lr, wd=wd, mu=mu)
        for name in ("lr", "wd", "mu"):
            if self.fmt[name].width > 16:
                raise ValueError(f"SgdPipeline: {name} must be at most 16 bits, got {self.fmt[name].width}")
        super().__init__({
            "valid": In(1), "tag": In(tag_width), "lane_on": In(lanes),
            "w": In(data.ArrayLayout(signed(master.width), lanes)),
            "g": In(data.ArrayLayout(signed(grad_sum.width), lanes)),
            "v": In(data.ArrayLayout(signed(velocity.width), lanes)),
            "lr": In(lr.width), "wd": In(wd.width), "mu": In(mu.width),
            "out_valid": Out(1), "out_tag": Out(tag_width),
            "master": Out(data.ArrayLayout(signed(master.width), lanes)),
            "velocity": Out(data.ArrayLayout(signed(velocity.width), lanes)),
            "weight": Out(data.ArrayLayout(signed(weight.width), lanes)),
            "sat_valid": Out(1), "sat_count": Out(range(3 * lanes + 1)),
            "busy": Out(1),
        })

    #: cycles from ``valid`` to ``out_valid``
    LATENCY = 18

    def elaborate(self, platform):
        m = Module()
        st = RegisterStages(m, "sgd")
        f = self.fmt
        L = self.lanes
        mfrac = f["master"].frac
        grad_align = mfrac - f["grad_sum"].frac
        narrow_shift = mfrac - f["weight"].frac

        # control: valid (reset) and tag / lane mask (data) down the whole pipeline
        valids = [self.valid]
        for i in range(self.LATENCY + 1):
            v = Signal(name=f"sgd_valid{i + 1}")
            m.d.sync += v.eq(valids[-1])
            valids.append(v)
        tag = st.delay(self.tag, self.LATENCY, "tag")
        lane_on = st.delay(self.lane_on, self.LATENCY, "lane_on")
        m.d.comb += [self.out_valid.eq(valids[self.LATENCY]), self.out_tag.eq(tag),
                     self.sat_valid.eq(valids[self.LATENCY + 1]),
                     ]
        m.d.sync += self.busy.eq(Cat(*valids[:-1]).any())
        # the hyper-parameters are steady: each lane registers its own copies (the DSPs'
        # B registers and its momentum flag), so no control net fans out to every lane

        sat_flags = []
        for l in range(L):
            s = RegisterStages(m, f"sgd{l}")
            use_mom = s.reg(self.mu != 0, "use_mom")
            # 1: the memories' read data
            w1, g1, v1 = s.reg(self.w[l], "w"), s.reg(self.g[l], "g"), s.reg(self.v[l], "v")
            # 2-4: decay and momentum products (input, M, P registers)
            decay = _Product(s, w1, self.wd, "decay")
            mom = _Product(s, v1, self.mu, "mom")
            g4 = s.delay(g1.as_signed() << grad_align, 3, "g_al")
            w4 = s.delay(w1, 3, "w")
            # 5: rounding parts; 6: d and the rounded momentum term
            dk, du = decay.rounded_parts(f["wd"].frac)
            mk, mu_ = mom.rounded_parts(f["mu"].frac)
            dk5, du5, mk5, mu5 = s.reg(dk, "dk"), s.reg(du, "du"), s.reg(mk, "mk"), s.reg(mu_, "mu")
            g5 = s.reg(g4, "g5")
            d6 = s.reg(g5 + dk5 + du5, "d")
            mterm6 = s.reg(mk5 + mu5, "mterm")
            # 7: raw velocity; 8: saturated
            vraw7 = s.reg(mterm6 + d6, "vraw")
            d7 = s.reg(d6, "d7")
            vclamp, vsat = saturate(vraw7, f["velocity"].width)
            vel8, vsat8 = s.reg(vclamp, "vel"), s.reg(vsat, "vsat")
            d8 = s.reg(d7, "d8")
            # 9-11: step product of the velocity (momentum) or d
            src = Signal(signed(max(len(vel8), len(d8)) + 1), name=f"sgd{l}_src")
            m.d.comb += src.eq(Mux(use_mom, vel8, d8))
            step = _Product(s, src, self.lr, "step")
            # 12: rounding parts; 13: the step; 14: raw master; 15: saturated master
            sk, su = step.rounded_parts(f["lr"].frac)
            sk12, su12 = s.reg(sk, "sk"), s.reg(su, "su")
            step13 = s.reg(sk12 + su12, "step")
            w13 = s.delay(w4, 9, "w")
            mraw14 = s.reg(w13 - step13, "mraw")
            mclamp, msat = saturate(mraw14, f["master"].width)
            master15, msat15 = s.reg(mclamp, "master"), s.reg(msat, "msat")
            # 16: narrowing parts; 17: rounded; 18: saturated MAC weight
            if narrow_shift:
                nk16 = s.reg(master15 >> narrow_shift, "nk")
                nu16 = s.reg(round_up_bit(master15.as_unsigned()[:narrow_shift], master15[narrow_shift],
                                       narrow_shift), "nu")
            else:
                nk16, nu16 = s.reg(master15, "nk"), s.reg(Const(0, 1), "nu")
            nraw17 = s.reg(nk16 + nu16, "nraw")
            wclamp, wsat = saturate(nraw17, f["weight"].width)
            weight18 = s.reg(wclamp, "weight")
            wsat18 = s.reg(wsat, "wsat")
            master18 = s.delay(master15, 3, "master")
            vel18 = s.delay(vel8, 10, "vel")
            vsat18 = s.delay(vsat8, 10, "vsat")
            msat18 = s.delay(msat15, 3, "msat")
            m.d.comb += [self.master[l].eq(master18), self.velocity[l].eq(vel18),
                         self.weight[l].eq(weight18)]
            sat_flags.append(((vsat18 & use_mom) | msat18 | wsat18) & lane_on[l])
        # saturation count: per-lane flags registered, then their sum
        flags = st.reg(Cat(*sat_flags), "sat_flags")
        m.d.comb += self.sat_count.eq(sum(flags[l] for l in range(L)))
        return m
