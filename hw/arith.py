"""Fixed-point arithmetic building blocks, mirroring :mod:`gnnweave.fixed` bit for bit."""
from __future__ import annotations

import contextlib
import contextvars

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


def rounding_constants(shift: Value, width: int) -> tuple[Value, Value]:
    """``(mask, half)`` that :func:`round_half_even_shift` compares the dropped bits of a
    ``width``-bit value with: they depend on ``shift`` only, so a caller whose shift is
    fixed for a whole run registers them once instead of rebuilding a wide ``1 << shift``
    in every lane on every cycle (on the Aggregator's critical path)."""
    one = Const(1, unsigned(width + 1))
    return ((one << shift) - 1)[:width], ((one << shift) >> 1)[:width]


def rounding_terms(value: Value, shift: Value | int, constants=None) -> tuple[Value, Value, Value]:
    """``(kept, above, tie)`` of a round-half-even shift, for a pipeline that registers
    them before the add: the result is ``kept + (above | tie & kept[0])``.

    ``kept`` is ``floor(value / 2**shift)``; ``above`` / ``tie``: the dropped bits are
    more than / exactly one half. All three are 0 where ``shift >= len(value)`` (the
    quotient rounds to 0 there), and ``above``/``tie`` are 0 for ``shift == 0``.
    ``constants`` as in :func:`round_half_even_shift`.
    """
    width = len(value)
    value = value.as_signed()
    kept = value >> shift                       # arithmetic: floor division by 2**shift
    if isinstance(shift, int):
        if shift == 0:
            return kept, Const(0), Const(0)
        if shift >= width:
            return Const(0, signed(width)), Const(0), Const(0)
        dropped = value.as_unsigned()[:shift]
        half = Const(1 << (shift - 1), shift)
        return kept, dropped > half, dropped == half
    mask, half = constants if constants is not None else rounding_constants(shift, width)
    dropped = value.as_unsigned() & mask
    # |value| <= 2**(width-1) <= 2**(shift-1) past the width: the quotient rounds to 0 (the
    # mask and half are cut to `width` bits and would round a positive value up to 1)
    inside = shift < width
    nonzero = inside & (shift != 0)
    return (Mux(inside, kept, 0).as_signed(), nonzero & (dropped > half),
            nonzero & (dropped == half))


def round_half_even_shift(value: Value, shift: Value | int, constants=None) -> Value:
    """``value / 2**shift`` rounded half to even (``gnnweave.fixed.shift_round_half_even``).

    ``value`` is signed; ``shift`` may be a constant or an unsigned signal. The result is
    one bit wider than ``value`` (the round-up of the largest value). ``constants``: the
    ``(mask, half)`` of :func:`rounding_constants` for this ``shift`` and ``len(value)``,
    when the caller holds them in registers.
    """
    kept, above, tie = rounding_terms(value, shift, constants)
    if isinstance(shift, int) and (shift == 0 or shift >= len(value)):
        return kept.as_signed() if shift == 0 else Const(0, signed(len(value) + 1))
    return (kept + (above | (tie & kept[0]))).as_signed()


def saturate(value: Value, width: int) -> tuple[Value, Value]:
    """Clamp a signed value into ``width`` bits: returns (clamped, saturated flag)."""
    too_big, too_small = saturation_flags(value, width)
    return clamp(value, width, too_big, too_small), too_big | too_small


def saturation_flags(value: Value, width: int) -> tuple[Value, Value]:
    """``(too_big, too_small)``: the signed ``value`` lies above / below ``width`` bits."""
    value = value.as_signed()
    return value > (1 << (width - 1)) - 1, value < -(1 << (width - 1))


def clamp(value: Value, width: int, too_big: Value, too_small: Value) -> Value:
    """``value`` narrowed to ``width`` bits, the limits where :func:`saturation_flags` said so."""
    hi, lo = (1 << (width - 1)) - 1, -(1 << (width - 1))
    return Mux(too_big, Const(hi, signed(width)),
               Mux(too_small, Const(lo, signed(width)), value[:width].as_signed()))


#: The widest operands one DSP48E2 multiplier takes (signed): A x B.
DSP_TILE = (27, 18)
#: The widest operands one ECP5 MULT18X18D takes (signed).
ECP5_TILE = (18, 18)

#: The multiplier tile of the part a build maps to, where it is smaller than
#: :data:`DSP_TILE` (see :func:`fabric_multiplier_tile`); None: the DSP48E2's.
_fabric_tile: contextvars.ContextVar = contextvars.ContextVar("fabric_tile", default=None)


@contextlib.contextmanager
def fabric_multiplier_tile(tile: tuple[int, int] | None):
    """Components built (and elaborated) inside map their products to multipliers of
    ``tile`` (e.g. :data:`ECP5_TILE`): each M register holds one such multiplier's product
    (so a part's output register can take it) and the P stage adds them up. Cycles, latency
    and results stay those of the :data:`DSP_TILE` build; only where the adder sits moves."""
    if tile is not None and (len(tile) != 2 or min(tile) < 2):
        raise ValueError(f"a multiplier tile is two port widths of at least 2 bits, got {tile!r}")
    token = _fabric_tile.set(tuple(tile) if tile is not None else None)
    try:
        yield
    finally:
        _fabric_tile.reset(token)


def fabric_products(a: Value, b: Value) -> list[tuple[int, Value]]:
    """``a * b`` as ``(shift, product)`` pieces, each one multiplier of the current fabric
    tile (:func:`fabric_multiplier_tile`): ``a * b == sum(product << shift)``; the one piece
    ``a * b`` without a fabric tile, or where it fits one."""
    tile = _fabric_tile.get()
    if tile is None:
        return [(0, a * b)]
    a_sh, b_sh = a.shape(), b.shape()
    a_chunks = _chunks(a_sh.width, a_sh.signed, tile[0])
    b_chunks = _chunks(b_sh.width, b_sh.signed, tile[1])
    if len(a_chunks) * len(b_chunks) == 1:
        return [(0, a * b)]
    return [(ao + bo, _piece(a, ao, aw, asg) * _piece(b, bo, bw, bsg))
            for ao, aw, asg in a_chunks for bo, bw, bsg in b_chunks]


def join_products(pieces: list[tuple[int, Value]]) -> Value:
    """``sum(product << shift)`` of :func:`fabric_products`' pieces (their registers); the
    one piece itself, with no adder."""
    if len(pieces) == 1:
        return pieces[0][1]
    return sum(product << shift for shift, product in pieces)


def _piece(value, offset, width, is_signed):
    """Bits ``[offset, offset + width)`` of ``value``, signed for a top signed piece, else
    zero-extended to a non-negative signed value."""
    bits = value.as_unsigned()[offset:offset + width]
    return bits.as_signed() if is_signed else Cat(bits, Const(0, 1)).as_signed()


def _chunks(width: int, is_signed: bool, port: int) -> list[tuple[int, int, bool]]:
    """``(offset, width, signed)`` pieces of an operand that each fit a ``port``-bit signed
    multiplier input: unsigned pieces of ``port - 1`` bits, the top one signed if the
    operand is."""
    pieces, offset = [], 0
    while width - offset > (port if is_signed else port - 1):
        pieces.append((offset, port - 1, False))
        offset += port - 1
    pieces.append((offset, width - offset, is_signed))
    return pieces


class PipelinedMultiplier(wiring.Component):
    """``p = a * b`` through DSP-shaped tiles, one product per cycle, :attr:`latency` cycles.

    The operands are cut into pieces no wider than a DSP48E2 multiplier
    (:data:`DSP_TILE`); the pipeline registers the pieces (the DSP's A/B registers), each
    tile's product twice (M and P), then adds the shifted tile products pairwise, one
    level of the adder tree per stage. Nothing stalls it; its registers have no reset.

    Args:
        a_shape, b_shape: operand shapes (signed or unsigned); ``p`` is wide enough for
            every product.
        enable: add an ``en`` input, the operands' valid: from the M registers on, each
            stage's registers load only behind it (the DSP's clock enables CEM and CEP, then
            the adders'), so an idle multiplier holds still. ``en`` drives one flip-flop (the
            operand registers load every cycle), so it adds no fan-out to its producer's
            valid. ``p`` is the product :attr:`latency` cycles after ``en``, and stale while
            no product is due.
    """

    def __init__(self, a_shape, b_shape, *, enable: bool = False):
        self._enable = enable
        self._a, self._b = unsigned(0).cast(a_shape), unsigned(0).cast(b_shape)
        self._p = (signed if self._a.signed or self._b.signed else unsigned)(
            self._a.width + self._b.width)
        # the operand that fits the wide port whole goes there: fewer tiles
        self._a_chunks = _chunks(self._a.width, self._a.signed, DSP_TILE[0])
        self._b_chunks = _chunks(self._b.width, self._b.signed, DSP_TILE[1])
        swapped_a = _chunks(self._a.width, self._a.signed, DSP_TILE[1])
        swapped_b = _chunks(self._b.width, self._b.signed, DSP_TILE[0])
        if len(swapped_a) * len(swapped_b) < len(self._a_chunks) * len(self._b_chunks):
            self._a_chunks, self._b_chunks = swapped_a, swapped_b
        tiles = len(self._a_chunks) * len(self._b_chunks)
        self.latency = 3 + (tiles - 1).bit_length()
        super().__init__({"a": In(self._a), "b": In(self._b), "p": Out(self._p),
                          **({"en": In(1)} if enable else {})})

    @property
    def tiles(self) -> int:
        return len(self._a_chunks) * len(self._b_chunks)

    def elaborate(self, platform):
        m = Module()
        pw = self._p.width
        # stage k's registers load under `enables[k]`, `en` delayed k cycles
        enables = [self.en] if self._enable else []
        for k in range(self.latency - 1 if self._enable else 0):
            enables.append(Signal(name=f"en{k + 1}"))
            m.d.sync += enables[-1].eq(enables[-2])

        def load(stage, *assigns):
            if not self._enable or stage == 0:
                m.d.sync += assigns
                return
            with m.If(enables[stage]):
                m.d.sync += assigns

        partials = []
        for ai, (ao, aw, asg) in enumerate(self._a_chunks):
            for bi, (bo, bw, bsg) in enumerate(self._b_chunks):
                a_reg = Signal(signed(aw + (not asg)), name=f"a{ai}b{bi}_areg", reset_less=True)
                b_reg = Signal(signed(bw + (not bsg)), name=f"a{ai}b{bi}_breg", reset_less=True)
                p_reg = Signal(signed(len(a_reg) + len(b_reg)), name=f"a{ai}b{bi}_preg",
                               reset_less=True)
                load(0, a_reg.eq(_piece(self.a, ao, aw, asg)),
                     b_reg.eq(_piece(self.b, bo, bw, bsg)))
                # one M register per fabric multiplier; P adds them (one piece: P = M)
                pieces = fabric_products(a_reg, b_reg)
                m_regs = []
                for k, (shift, product) in enumerate(pieces):
                    suffix = "" if len(pieces) == 1 else str(k)
                    m_regs.append((shift, Signal(product.shape(), name=f"a{ai}b{bi}_mreg{suffix}",
                                                 reset_less=True)))
                    load(1, m_regs[-1][1].eq(product))
                load(2, p_reg.eq(join_products(m_regs)))
                partials.append((ao + bo, p_reg))
        level = 0
        while len(partials) > 1:
            merged = []
            for i in range(0, len(partials), 2):
                pair = partials[i:i + 2]
                low = min(o for o, _ in pair)
                s = Signal(signed(pw + 1), name=f"sum{level}_{i // 2}", reset_less=True)
                load(3 + level, s.eq(sum(v << (o - low) for o, v in pair)))
                merged.append((low, s))
            partials, level = merged, level + 1
        offset, value = partials[0]
        m.d.comb += self.p.eq(value << offset)
        return m


class RegisterStages:
    """Registers for one pipeline: :meth:`reg` is a ``reset_less`` register of an
    expression (data), :meth:`delay` a chain of them."""

    def __init__(self, m: Module, prefix: str):
        self.m, self.prefix = m, prefix

    def reg(self, value, name: str, shape=None):
        sig = Signal(shape if shape is not None else value.shape(), name=f"{self.prefix}_{name}",
                     reset_less=True)
        self.m.d.sync += sig.eq(value)
        return sig

    def delay(self, value, cycles: int, name: str):
        for i in range(cycles):
            value = self.reg(value, f"{name}_d{i}")
        return value
