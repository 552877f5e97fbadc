"""The Aggregator's configuration check, computed over a few cycles of its CHECK state.

A run is refused (``config_error``, no memory traffic) when any of these holds::

    feat_dim == 0 or feat_dim > max_feat_dim;  reduce_op not built;  shift > 63
    a base address or a stride not a multiple of the bus width (weights only if used)
    size < need or base + size beyond the address space, for every buffer, with
      need(indptr) = whole_beats(4 (N + 1)),  need(indices) = whole_beats(4 E),
      need(weights) = whole_beats(elem_bytes E)          (only if used)
      need(feat)    = (N - 1) feat_stride + row_bytes    (only if N > 0; likewise out)
    feat_stride or out_stride < row_bytes (N > 0);  N == 2**32 - 1

where ``row_bytes`` is ``ceil(feat_dim / lanes)`` whole beats. The two products
``(N - 1) * stride`` come from a shift-and-add multiplier (one bit of ``N - 1`` per cycle,
ending at its highest set bit), so the check holds no DSP; every other term is a register
one adder or comparator away from the run's configuration registers.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out


class _Step(enum.Enum, shape=6):
    """One-hot (IDLE: none): each step's enable is one flip-flop, not a decode, in front of
    the wide registers it loads."""
    IDLE = 0
    TERMS = 1 << 0      # alignment flags, byte counts, base + size
    ROUND = 1 << 1      # whole beats, row bytes; the multiplier is loaded
    MULTIPLY = 1 << 2   # (N - 1) * stride, one bit per cycle
    NEED = 1 << 3       # product + row bytes
    COMPARE = 1 << 4    # every size and stride against its need
    RESULT = 1 << 5     # the OR of every flag


class ConfigCheck(wiring.Component):
    """Checks the run configuration ``cfg`` (constant while it runs) after ``start``.

    Ports:
        cfg: the run's configuration registers (a view with one field per register).
        start: one cycle; the check begins (``cfg`` holds its values from this cycle on).
        done: the verdict is ready (held until the next ``start``).
        error: the configuration is refused (valid with ``done``).
        row_beats, row_last_beat, row_bytes, last_mask: derived run constants (beats per
            row, that minus one, its bytes, valid lanes of the last beat), valid with
            ``done`` and held until the next ``start``.

    Args:
        registers: ``(name, width, doc)`` of the configuration registers.
        lanes, bytes_per_beat, elem_width, max_feat_dim, addr_width, reduce_codes: the
            build's parameters (``reduce_codes``: the reductions it has).
    """

    def __init__(self, registers, *, lanes: int, bytes_per_beat: int, elem_width: int,
                 max_feat_dim: int, addr_width: int, reduce_codes):
        self.lanes, self.bpb, self.ew = lanes, bytes_per_beat, elem_width
        self.max_feat_dim, self.aw, self.reduce_codes = max_feat_dim, addr_width, tuple(reduce_codes)
        max_beats = -(-max_feat_dim // lanes)
        super().__init__({
            "cfg": In(data.StructLayout({name: width for name, width, _ in registers})),
            "start": In(1),
            "done": Out(1),
            "error": Out(1),
            "row_beats": Out(range(max_beats + 1)),
            "row_last_beat": Out(range(max_beats + 1)),
            "row_bytes": Out(32),
            "last_mask": Out(lanes),
        })

    def _wraps(self, addr, size):
        """``addr + size >= 2 ** addr_width`` as a compare against ``~addr``: an adder of the
        same two registers is the read port's guard limit, and Yosys would share it (its
        result then travels from the read port to this flag)."""
        aw = self.aw
        high = [v[aw:].any() for v in (addr, size) if len(v) > aw]
        return Cat(*high, size[:aw] > ~addr[:aw]).any()

    def elaborate(self, platform):
        m = Module()
        cfg, lanes, bpb, aw = self.cfg, self.lanes, self.bpb, self.aw
        align, beat_bits = bpb - 1, bpb.bit_length() - 1
        step = Signal(_Step)

        def at(which: _Step):
            return step.as_value()[which.value.bit_length() - 1]

        use_weights = cfg.use_weights[0]
        n = cfg.num_nodes

        def reg(width, name):
            return Signal(width, name=name, reset_less=True)

        # TERMS: one adder or comparator from the configuration each
        flags = {}

        def flag(name, value):
            flags[name] = reg(1, f"bad_{name}")
            with m.If(at(_Step.TERMS)):
                m.d.sync += flags[name].eq(value)

        buffers = ("indptr", "indices", "weights", "feat", "out")
        flag("feat_dim", (cfg.feat_dim == 0) | (cfg.feat_dim > self.max_feat_dim))
        flag("reduce_op", ~Cat(*[cfg.reduce_op == code for code in self.reduce_codes]).any())
        flag("shift", cfg.shift > 63)
        for name in buffers:
            addr_bad = (cfg[f"{name}_addr"] & align) != 0
            wrap = self._wraps(cfg[f"{name}_addr"], cfg[f"{name}_size"])
            flag(f"{name}_align", (use_weights if name == "weights" else 1) & addr_bad)
            flag(f"{name}_wrap", wrap)          # counted only where used (at RESULT)
        for name in ("feat_stride", "out_stride"):
            flag(f"{name}_align", (cfg[name] & align) != 0)
        flag("nodes_max", n == 0xFFFF_FFFF)

        n_minus_1, nonempty = reg(32, "n_minus_1"), reg(1, "nonempty")
        ptr_bytes, idx_bytes, w_bytes = reg(35, "ptr_bytes"), reg(35, "idx_bytes"), reg(35, "w_bytes")
        row_beats = reg(len(self.row_beats), "row_beats_r")
        with m.If(at(_Step.TERMS)):
            m.d.sync += [
                n_minus_1.eq(n - 1),
                ptr_bytes.eq((n + 1) << 2), idx_bytes.eq(cfg.num_edges << 2),
                w_bytes.eq(cfg.num_edges * (self.ew // 8)),
                row_beats.eq((cfg.feat_dim + lanes - 1) >> (lanes.bit_length() - 1)),
            ]

        # ROUND: whole beats of the streams, the row's bytes, its last lanes
        def whole_beats(nbytes):
            return ((nbytes + align) >> beat_bits) << beat_bits

        need = {name: reg(65, f"need_{name}") for name in buffers}
        last_lanes = (cfg.feat_dim - (row_beats - 1) * lanes)[:lanes.bit_length()]
        with m.If(at(_Step.ROUND)):
            m.d.sync += [
                need["indptr"].eq(whole_beats(ptr_bytes)), need["indices"].eq(whole_beats(idx_bytes)),
                need["weights"].eq(whole_beats(w_bytes)),
                self.row_bytes.eq(row_beats << beat_bits),
                self.row_beats.eq(row_beats), self.row_last_beat.eq(row_beats - 1),
                self.last_mask.eq(((Const(1, lanes + 1) << last_lanes) - 1)[:lanes]),
            ]

        # MULTIPLY: (N - 1) * stride, shift and add
        multiplier = reg(32, "multiplier")
        multiplied = reg(1, "multiplied")     # multiplier == 0, a flip-flop beside it
        products = {name: reg(64, f"{name}_product") for name in ("feat", "out")}
        addends = {name: reg(64, f"{name}_addend") for name in ("feat", "out")}
        # N != 0 and N == 1 from N - 1 (a register of few loads), not from N itself, which
        # fans out across the whole unit
        with m.If(at(_Step.ROUND)):
            m.d.sync += [multiplier.eq(n_minus_1), multiplied.eq(n_minus_1 == 0),
                         nonempty.eq(n_minus_1 != 0xFFFF_FFFF)]
            for name in products:
                m.d.sync += [products[name].eq(0), addends[name].eq(cfg[f"{name}_stride"])]
        with m.If(at(_Step.MULTIPLY)):
            m.d.sync += [multiplier.eq(multiplier >> 1), multiplied.eq(multiplier[1:] == 0)]
            for name in products:
                m.d.sync += [addends[name].eq(addends[name] << 1),
                             products[name].eq(products[name] + Mux(multiplier[0], addends[name], 0))]
        with m.If(at(_Step.NEED)):
            for name in products:
                m.d.sync += need[name].eq(products[name] + self.row_bytes)

        # COMPARE: each size against its need, each stride against the row
        bad = {name: reg(1, f"small_{name}") for name in buffers}
        short = {name: reg(1, f"short_{name}") for name in ("feat_stride", "out_stride")}
        with m.If(at(_Step.COMPARE)):
            for name in buffers:                # counted only where used (at RESULT)
                m.d.sync += bad[name].eq(need[name] > cfg[f"{name}_size"])
            for name in short:
                m.d.sync += short[name].eq(nonempty & (cfg[name] < self.row_bytes))

        # the next step, bit by bit (one LUT each): TERMS on start, then one step a cycle,
        # MULTIPLY until the multiplier is spent
        go = ~self.start
        S = _Step
        m.d.sync += step.as_value().eq(Cat(
            self.start, go & at(S.TERMS), go & (at(S.ROUND) | (at(S.MULTIPLY) & ~multiplied)),
            go & at(S.MULTIPLY) & multiplied, go & at(S.NEED), go & at(S.COMPARE)))
        # a buffer's size terms count where it is used: weights with use_weights, feat and
        # out with N > 0
        used = {"weights": use_weights, "feat": nonempty, "out": nonempty}
        sizes = [used.get(name, 1) & (flags.pop(f"{name}_wrap") | bad[name]) for name in buffers]
        with m.If(at(S.RESULT)):
            m.d.sync += [self.error.eq(Cat(*flags.values(), *short.values(), *sizes).any()),
                         self.done.eq(1)]
        with m.If(self.start):
            m.d.sync += self.done.eq(0)
        return m
