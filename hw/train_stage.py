"""TrainStage: one layer with its weights on chip, forward/backward for microbatches, SGD.

A stage holds (all in on-chip memories):

* master weights ``[d_in, d_out]`` (``master`` format, e.g. 32 bits), the SGD velocity and
  the weight-gradient sum (32 bits), ``lanes`` elements per word;
* MAC weights (16 bits) in a :class:`~gnnweave.hw.mac.SkewedBuffer` with ``versions``
  version slots: an update writes the next slot, so the weights a microbatch's forward
  used stay readable for its backward (weight stashing) — ``versions`` must exceed the
  microbatches a stage holds in flight (``p - s + 1`` for asynchronous 1F1B);
* the input activations of in-flight microbatches (``slots`` stash slots) and the ReLU
  mask of their outputs; two ``dY`` slots, so the next gradient arrives during a backward.

Streams (payload :func:`~gnnweave.hw.mac.output_layout` with ``lanes`` columns, one row
segment per transfer, ``last`` on a microbatch's final segment): ``act_in`` (inputs,
microbatches in forward order), ``act_out`` (outputs), ``grad_in`` (``dY``, microbatches in
this stage's backward order), ``grad_out`` (``dX``). In a :class:`~gnnweave.hw.pipeline.Pipeline`
they connect to the neighbours; at the ends they are external ports (host, other device).

The op sequencer implements the per-stage op order of
``gnnweave.golden.pipeline.stage_ops`` for the schedule register (0 GPipe, 1 1F1B-flush,
2 async 1F1B); receivers fill stash slots independently of the compute so transfers
overlap computation. ``F``: ``Y = X W`` (ReLU, mask stashed); ``B``: ``dX = (dY*mask) W^T``
then ``dW = X^T (dY*mask)`` added into the gradient sum (the mask is applied as ``dY``
is written into its buffer); with ``dx_first`` (default) ``dX`` leaves before ``dW`` is
computed, so the upstream stage's backward overlaps this stage's ``dW`` (a shorter
backward critical path than the textbook model, where a backward's output is ready
only when the whole backward ends; ``dx_first = 0`` gives the textbook order); ``U``: SGD over the weight words, one word (``lanes``
elements) per cycle through the :class:`~.sgd_pipeline.SgdPipeline` (its results are
written ``LATENCY`` cycles after the read; the new version becomes current once the last
is in), into the next version slot. The numerics are those of
``gnnweave.golden.mac.sgd_update`` / ``mac_*`` bit for bit.

The ends of the pipeline stream: the first stage (``stage == 0``) starts a forward while
its input microbatch is still arriving and the last stage (``stage == stages - 1``) starts
a backward while its ``dY`` (the host's loss gradient) is; the core is held until the
operand it is about to read has been written (``_FillTracker``: fast when the segments
come in the streaming order, row block by row block and within a block word by word; any
other order is still correct, the stage then waits for the whole microbatch). Held
cycles count as ``wait_cycles``, not as forward/backward cycles. Between stages a
microbatch is handed over whole, as in the schedule the bubble formula describes.

The host reaches the master weights (``w_*``) and the SGD velocity (``v_*``) while the
stage is idle, one word of ``lanes`` elements per cycle, so a run can resume from any
epoch with its momentum.
"""
from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from gnnweave.fixed import FixedFormat

from .arith import saturate
from .blocks import own_module
from .mac import MAC_INPUT_WIDTH, MacCore, MacMode, SkewedBuffer, _log2_exact, output_layout
from .sgd_pipeline import RegisterStages, SgdPipeline, round_up_bit

SCHEDULE_GPIPE, SCHEDULE_1F1B_FLUSH, SCHEDULE_1F1B_ASYNC = 0, 1, 2

#: the TrainStage's configuration inputs (steady from ``start`` to ``done``)
_CONFIG_INPUTS = ("schedule", "stages", "stage", "microbatches", "steps", "rows", "d_in", "d_out",
                  "relu", "fwd_shift", "dx_shift", "dw_shift", "dx_first", "lr", "wd", "mu")


class Phase:
    IDLE, DECIDE, F_START, F_RUN, DX_START, DX_RUN, DW_START, DW_RUN, U_RUN, U_DRAIN, DONE, SETUP = range(12)


class _FillTracker:
    """How far a microbatch being received has arrived, for operand reads that start before
    it is complete. Segments are expected in the *streaming order*: row block (``lanes``
    rows) by row block, within a block word (``lanes`` columns) by word, within a word
    row by row. ``(block, word, row)`` is the next expected segment; a segment out of
    that order sets ``disorder`` and nothing is known until the microbatch is complete
    (so any order stays correct, only the streaming order is fast). Call :meth:`update`
    with the segments as they are *written* into the buffer; reset after ``last``.

    Besides the position it keeps two earlier ones, so the stage can tell one cycle ahead
    whether the core's *next* read is in (a registered ``hold``): ``prev_*`` the position
    one segment back, ``unit_*`` the ``(block, word)`` one word back (each valid once the
    position moved past it); ``block_m1`` is ``block - 1`` (valid for ``block >= 1``)."""

    def __init__(self, m, name, *, lanes: int, blocks: int, words: int, rows_last, words_last,
                 fire, row, col, last):
        m = own_module(m, name)      # mapped apart from the stage's logic
        lb = lanes.bit_length() - 1
        self.lb, self.L = lb, lanes
        # block and word counts as narrow as the capacity allows (``blocks`` row blocks,
        # ``words`` words per row; the block one bit wider, as a core's tile row index passes
        # the last block once its walk ends): the compares with the core's request indices
        # (cut to these widths) are short. ``word`` never passes ``words - 1``.
        pb = max((blocks - 1).bit_length(), 0) + 1
        pw = max((words - 1).bit_length(), 1)
        self.block = Signal(pb, name=f"{name}_block")
        self.word = Signal(pw, name=f"{name}_word")
        self.row = Signal(lb + 1, name=f"{name}_row")
        self.disorder = Signal(name=f"{name}_disorder")
        self.prev_block, self.prev_word = Signal(pb, name=f"{name}_prev_block"), Signal(pw, name=f"{name}_prev_word")
        self.prev_row, self.prev_ok = Signal(lb + 1, name=f"{name}_prev_row"), Signal(name=f"{name}_prev_ok")
        self.unit_block, self.unit_word = Signal(pb, name=f"{name}_unit_block"), Signal(pw, name=f"{name}_unit_word")
        self.unit_ok = Signal(name=f"{name}_unit_ok")
        self.block_m1, self.block_ok = Signal(pb, name=f"{name}_block_m1"), Signal(name=f"{name}_block_ok")
        # ``rows_last`` / ``words_last``: the microbatch's rows - 1 and words per row - 1
        # (registers); the row index is a concatenation (row < lanes), so the checks are
        # equalities, no adds. The position moves on every segment and a segment out of
        # order only sets ``disorder`` (which hides the position), so the order check is
        # not in front of the position's registers.
        row_at = Cat(self.row[:lb], self.block) if lb else self.block
        expected = (row == row_at) & (col == Cat(Const(0, lb), self.word))
        # whether the expected segment ends its row block / its block's last word: registers,
        # set a segment ahead from the position and copies of the limits minus one (the
        # limits are steady while segments arrive; without a segment the flags are
        # recomputed from the position, so they follow a new configuration)
        self.block_end, self.words_end = Signal(name=f"{name}_block_end"), Signal(name=f"{name}_words_end")
        # the limits cut to the position's widths (a configuration within the capacity
        # fits), the copies minus one a bit wider (-1 matches no position): short compares
        rows_last, words_last = rows_last[:lb + pb], words_last[:pw]
        blocks_last = rows_last[lb:]
        blocks_last_m1 = Signal(pb + 1, name=f"{name}_blocks_last_m1", reset_less=True)
        blocks_last_m2 = Signal(pb + 1, name=f"{name}_blocks_last_m2", reset_less=True)
        blocks_two = Signal(name=f"{name}_blocks_two", reset_less=True)     # blocks_last == 1
        words_last_m1 = Signal(pw + 1, name=f"{name}_words_last_m1", reset_less=True)
        first_end = Signal(name=f"{name}_first_end", reset_less=True)      # a block of one row
        words_one = Signal(name=f"{name}_words_one", reset_less=True)      # one word per row
        # the last block's rows - 1 in it is 0 (a block of one row): a register like the
        # other copies, so the compare is not in front of ``block_end``'s candidates
        low_zero = Signal(name=f"{name}_rows_low_zero", reset_less=True)
        m.d.sync += low_zero.eq((rows_last[:lb] == 0) if lb else 1)
        row_next_end = (self.row == lanes - 2) if lanes > 1 else Const(1, 1)
        # ``in_last``: the position's block is the microbatch's last (a register, moved with
        # the block), so the checks against the last row look at the row's low bits only:
        # the row the block ends at is ``rows_last``'s low bits in the last block, and the
        # one before it (``low_m1``) there too unless the block has one row (then
        # ``block_end`` is already set)
        in_last = Signal(name=f"{name}_in_last_block")
        blocks_one = Signal(name=f"{name}_blocks_one", reset_less=True)
        low_m1 = Signal(max(lb, 1), name=f"{name}_rows_low_m1", reset_less=True)
        m.d.sync += [blocks_last_m1.eq(blocks_last - 1), blocks_one.eq(blocks_last == 0),
                     blocks_last_m2.eq(blocks_last - 2), blocks_two.eq(blocks_last == 1),
                     words_last_m1.eq(words_last - 1), first_end.eq((lanes == 1) | (rows_last == 0)),
                     words_one.eq(words_last == 0), low_m1.eq(rows_last[:lb] - 1 if lb else 0)]
        row_low = self.row[:lb] if lb else Const(0, 1)
        at_last_row = in_last & ((row_low == rows_last[:lb]) if lb else Const(1, 1))
        before_last_row = ~low_zero & in_last & (row_low == low_m1)
        # the block after this one is the last: a register, kept equal to
        # ``block == blocks_last_m1`` (moved with the block, recomputed without a segment),
        # so no compare of the block sits in front of ``block_end``
        next_last = Signal(name=f"{name}_next_last")
        # its candidates as nets of their own (kept, as block_end's): the handshake only
        # chooses among the two compares, not a tree ABC builds around them
        last_after_step = Signal(name=f"{name}_next_last_step", attrs={"keep": 1})
        last_here = Signal(name=f"{name}_next_last_here", attrs={"keep": 1})
        at_block_row0 = (lanes == 1) | (low_zero & in_last)
        next_block_row0 = (lanes == 1) | (low_zero & next_last)
        # block_end's next value: its candidates are nets of their own (kept), so the
        # segment's handshake and the position's flags only choose among them (a mux of
        # two levels behind ``fire``, not a tree ABC rebuilds around the compares)
        cand = {k: Signal(name=f"{name}_block_end_{k}", attrs={"keep": 1})
                for k in ("row", "block", "idle")}
        m.d.comb += [cand["row"].eq(row_next_end | before_last_row),
                     cand["block"].eq(Mux(self.words_end, next_block_row0, at_block_row0)),
                     cand["idle"].eq((self.row == lanes - 1) | at_last_row)]
        m.d.comb += [last_after_step.eq(self.block == blocks_last_m2),
                     last_here.eq(self.block == blocks_last_m1)]
        on_segment = Mux(last, first_end, Mux(self.block_end, cand["block"], cand["row"]))
        m.d.sync += self.block_end.eq(Mux(fire, on_segment, cand["idle"]))
        with m.If(fire):
            with m.If(last):
                m.d.sync += [self.block.eq(0), self.word.eq(0), self.row.eq(0), self.disorder.eq(0),
                             self.prev_ok.eq(0), self.unit_ok.eq(0), self.block_ok.eq(0),
                             self.words_end.eq(words_one), in_last.eq(blocks_one),
                             next_last.eq(blocks_two)]
            with m.Else():
                with m.If(~expected):
                    m.d.sync += self.disorder.eq(1)
                m.d.sync += [self.row.eq(self.row + 1), self.prev_ok.eq(1), self.prev_block.eq(self.block),
                             self.prev_word.eq(self.word), self.prev_row.eq(self.row)]
                with m.If(self.block_end):
                    m.d.sync += [self.row.eq(0), self.word.eq(self.word + 1), self.unit_ok.eq(1),
                                 self.unit_block.eq(self.block), self.unit_word.eq(self.word),
                                 self.words_end.eq(self.word == words_last_m1)]
                    with m.If(self.words_end):
                        m.d.sync += [self.word.eq(0), self.block.eq(self.block + 1),
                                     self.block_m1.eq(self.block), self.block_ok.eq(1),
                                     self.words_end.eq(words_one), in_last.eq(next_last),
                                     next_last.eq(last_after_step)]
        with m.Else():
            # (in_last follows a new configuration a cycle before block_end does)
            m.d.sync += [self.words_end.eq(self.word == words_last),
                         in_last.eq(self.block == blocks_last),
                         next_last.eq(last_here)]

    def _high(self, index, field):
        """``index // lanes`` cut to ``field``'s width (it fits while the core walks)."""
        return (index[self.lb:] if self.lb else index)[:len(field)]

    def _split(self, row):
        return self._high(row, self.block), (row[:self.lb] if self.lb else Const(0, 1))

    @staticmethod
    def _past(position, at):
        """``position`` is past ``at`` in the streaming order: both lists of fields, least
        significant first (e.g. row, word, block), compared as one number: the borrow of
        ``at - position``, so it maps to a carry chain (a ``>`` of a few fields becomes a
        tree of LUTs, as deep as the rest of ``hold``'s logic)."""
        def widened(a, p):
            assert len(a) <= len(p)
            return Cat(a, Const(0, len(p) - len(a))) if len(a) < len(p) else a
        pos = Cat(*position)
        return (Cat(*(widened(a, p) for a, p in zip(at, position))) - pos)[len(pos)]

    def has_block_word(self, row_start, col):
        """All rows of the block of ``row_start`` have the word of column ``col``."""
        b, w = self._high(row_start, self.block), self._high(col, self.word)
        return ~self.disorder & self._past([self.word, self.block], [w, b])

    def has_next_block_word(self, row_start, col):
        """Also the word after that one (in the streaming order) is in."""
        b, w = self._high(row_start, self.block), self._high(col, self.word)
        return ~self.disorder & self.unit_ok & self._past([self.unit_word, self.unit_block], [w, b])

    def has_row_word(self, row, col):
        """Row ``row`` has the word of column ``col``."""
        (b, r), w = self._split(row), self._high(col, self.word)
        return ~self.disorder & self._past([self.row, self.word, self.block], [r, w, b])

    def has_next_row_word(self, row, col):
        """Also the segment after that one (in the streaming order) is in."""
        (b, r), w = self._split(row), self._high(col, self.word)
        return ~self.disorder & self.prev_ok & self._past(
            [self.prev_row, self.prev_word, self.prev_block], [r, w, b])

    def has_row_word_next_block(self, row, col):
        """The row ``lanes`` rows below ``row`` (same position in the next block) has the
        word of column ``col``."""
        (b, _), w = self._split(row), self._high(col, self.word)
        return ~self.disorder & self.block_ok & self._past(
            [self.row, self.word, self.block_m1], [Const(0, 1), w, b])


class _PhaseRegister:
    """The sequencer's phase, one-hot (``now[p]``), and, set with it, a flag per group of
    phases (the op kinds, START, RUN, ...): registers, so no decode of the phase sits in
    front of the many signals they select (operand routing, core configuration, hold, the
    sequencer's counters).

    A phase's logic is written in :meth:`block`; :meth:`go` there moves to another phase.
    Each flag's next value is the OR of the moves into it, or its own value while its phase
    does not move (one move per cycle: the blocks are exclusive), so a flag sits two
    levels of logic behind the conditions of its moves, not behind a chain of them.
    Call :meth:`finish` once every move is written."""

    GROUPS = {
        "f": (Phase.F_START, Phase.F_RUN), "dx": (Phase.DX_START, Phase.DX_RUN),
        "dw": (Phase.DW_START, Phase.DW_RUN), "start": (Phase.F_START, Phase.DX_START, Phase.DW_START),
        "run": (Phase.F_RUN, Phase.DX_RUN, Phase.DW_RUN), "upd": (Phase.U_RUN, Phase.U_DRAIN),
        "setup": (Phase.SETUP,), "decide": (Phase.DECIDE,),
    }

    def __init__(self, m):
        self.m = m
        names = sorted((v, k.lower()) for k, v in vars(Phase).items() if k.isupper())
        self.now = [Signal(name=f"phase_is_{n}", init=p == Phase.IDLE) for p, n in names]
        self.flag = {g: Signal(name=f"phase_{g}") for g in self.GROUPS}
        self._into = [Signal(name=f"phase_into_{n}") for _, n in names]    # a move into p
        self._leave = [Signal(name=f"phase_leave_{n}") for _, n in names]  # p moves
        self._current = Phase.IDLE

    @contextmanager
    def block(self, phase: int):
        """The logic of ``phase`` (taken while it is the phase)."""
        outer, self._current = self._current, phase
        with self.m.If(self.now[phase]):
            yield
        self._current = outer

    def go(self, phase: int):
        self.m.d.comb += [self._into[phase].eq(1), self._leave[self._current].eq(1)]

    def into(self, phase: int):
        """A move into ``phase`` this cycle."""
        return self._into[phase]

    def leaves(self, phase: int):
        """``phase`` moves this cycle."""
        return self._leave[phase]

    def finish(self):
        m = self.m
        for p, now in enumerate(self.now):
            m.d.sync += now.eq(self._into[p] | (now & ~self._leave[p]))
        for g, members in self.GROUPS.items():
            into = Cat(*(self._into[p] for p in members)).any()
            leave = Cat(*(self._leave[p] for p in members)).any()
            m.d.sync += self.flag[g].eq(into | (self.flag[g] & ~leave))


class TrainStage(wiring.Component):
    """One pipeline stage (see module doc). Configuration inputs are read while running;
    keep them steady from ``start`` to ``done``."""

    def __init__(self, *, lanes: int = 4, max_dim: int = 16, max_rows: int = 16, slots: int = 4,
                 max_in: int | None = None, max_out: int | None = None,
                 versions: int = 4, master: FixedFormat = FixedFormat(32, 24),
                 weight: FixedFormat = FixedFormat(16, 12), grad_sum: FixedFormat = FixedFormat(32, 12),
                 lr: FixedFormat = FixedFormat(16, 16), wd: FixedFormat = FixedFormat(16, 20),
                 mu: FixedFormat = FixedFormat(16, 15), velocity: FixedFormat | None = None,
                 state_ram_style: str | None = None):
        _log2_exact("lanes", lanes)
        if state_ram_style not in (None, "block", "ultra"):
            raise ValueError(f"TrainStage state_ram_style must be None, 'block' or 'ultra', "
                             f"got {state_ram_style!r}")
        # synthesis attribute of the master / velocity / gradient-sum memories
        self.state_ram_style = state_ram_style
        self.lanes = lanes
        self.max_dim = max(max_dim, lanes)
        # input / output feature capacity (default: max_dim both; a wide, short layer such
        # as a classifier over bag-of-words features needs only max_in large)
        self.max_in = max(max_in or self.max_dim, lanes)
        self.max_out = max(max_out or self.max_dim, lanes)
        _log2_exact("max_in", self.max_in)
        _log2_exact("max_out", self.max_out)
        self.max_rows = max_rows
        self.slots = slots
        self.versions = versions
        _log2_exact("max_dim", self.max_dim)
        _log2_exact("max_rows", max_rows)
        _log2_exact("slots", slots)
        self.fmt = dict(master=master, weight=weight, grad_sum=grad_sum, lr=lr, wd=wd, mu=mu,
                        velocity=velocity or master)
        if weight.width > MAC_INPUT_WIDTH or master.frac < weight.frac or master.frac < grad_sum.frac:
            raise ValueError("TrainStage formats: weight <= 16 bits, master.frac >= weight.frac, grad_sum.frac")
        big = max(self.max_in, self.max_out, max_rows)
        # the operand buffers register the routed requests (the core's step index reaches
        # three buffers through the op's routing muxes): one cycle more read latency
        # (the core starts only from a START phase, a cycle after the op before it ended:
        # idle, so its start need not be gated with its busy)
        self.core = MacCore(rows=lanes, cols=lanes, max_dim=big, max_depth=big, operand_hold=True,
                            depth_flags=True, idle_start=True,
                            read_latency=SkewedBuffer.READ_LATENCY + 1)
        ib = self.core.index_bits
        self.index_bits = ib
        seg = output_layout(lanes, ib, 16)
        words = self.max_out // lanes
        self.word_bits = (words - 1).bit_length() if words > 1 else 0
        super().__init__({
            "start": In(1), "busy": Out(1), "done": Out(1),
            # configuration
            "schedule": In(2), "stages": In(4), "stage": In(4), "microbatches": In(8),
            "steps": In(16), "rows": In(ib), "d_in": In(ib), "d_out": In(ib), "relu": In(1),
            "fwd_shift": In(7), "dx_shift": In(7), "dw_shift": In(7), "dx_first": In(1, init=1),
            "lr": In(lr.width), "wd": In(wd.width), "mu": In(mu.width),
            # streams
            "act_in": In(stream.Signature(seg)), "act_out": Out(stream.Signature(seg)),
            "grad_in": In(stream.Signature(seg)), "grad_out": Out(stream.Signature(seg)),
            # host access to the master weights (while idle): write one word, read one word;
            # a write also zeroes that word's weight-gradient sum (a completed step leaves it
            # zero; a run aborted mid-step would leave a partial sum for the next update)
            "w_wr_en": In(1), "w_row": In(ib), "w_word": In(max(self.word_bits, 1)),
            "w_wr_data": In(data.ArrayLayout(signed(master.width), lanes)),
            "w_rd_data": Out(data.ArrayLayout(signed(master.width), lanes)),
            # host access to the SGD velocity (while idle), the same way: a run resumed at a
            # later epoch loads its momentum buffer instead of restarting it
            "v_wr_en": In(1), "v_row": In(ib), "v_word": In(max(self.word_bits, 1)),
            "v_wr_data": In(data.ArrayLayout(signed(self.fmt["velocity"].width), lanes)),
            "v_rd_data": Out(data.ArrayLayout(signed(self.fmt["velocity"].width), lanes)),
            # counters (cleared at start)
            "busy_cycles": Out(32), "fwd_cycles": Out(32), "bwd_cycles": Out(32),
            "upd_cycles": Out(32), "wait_cycles": Out(32), "mac_ops": Out(48),
            "saturations": Out(32), "ops_done": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        s = SimpleNamespace()     # the signals the sections share
        L, S, V = self.lanes, self.slots, self.versions
        DI, DO, RM = self.max_in, self.max_out, self.max_rows
        m.submodules.core = s.core = self.core
        m.submodules.wbuf = s.wbuf = SkewedBuffer(lanes=L, rows=1 << (V * DI - 1).bit_length(), cols=DO,
                                                  registered_request=True)
        m.submodules.xbuf = s.xbuf = SkewedBuffer(lanes=L, rows=S * RM, cols=DI, registered_request=True)
        m.submodules.ybuf = s.ybuf = SkewedBuffer(lanes=L, rows=2 * RM, cols=DO, registered_request=True)

        # the configuration inputs, registered once on entry: the logic behind them starts
        # from this stage's own registers, not from whoever drives the inputs (they are
        # steady from start; the copies are current from the first SETUP cycle on)
        s.cfg = SimpleNamespace(**{name: Signal.like(getattr(self, name), name=f"cfg_{name}")
                                   for name in _CONFIG_INPUTS})
        m.d.sync += [getattr(s.cfg, name).eq(getattr(self, name)) for name in _CONFIG_INPUTS]

        s.running = Signal()
        s.ph = _PhaseRegister(m)
        s.in_f, s.in_dx, s.in_dw = s.ph.flag["f"], s.ph.flag["dx"], s.ph.flag["dw"]
        m.d.comb += self.busy.eq(s.running)

        self._op_counters(m, s)
        self._act_receiver(m, s)
        self._mask_stash(m, s)
        self._grad_receiver(m, s)
        self._state_memories(m, s)
        self._current_op(m, s)
        self._sgd_datapath(m, s)
        self._streaming_hold(m, s)
        self._op_ends(m, s)
        self._run_start(m, s)
        self._decide(m, s)
        self._phases(m, s)
        self._cycle_counters(m, s)
        return m

    def _op_counters(self, m, s):
        """The schedule's decodes, the step's counters and the per-run constants."""
        L, ib, S, V = self.lanes, self.index_bits, self.slots, self.versions
        lb = self.lanes.bit_length() - 1
        sched = s.cfg.schedule
        # the schedule's and the stage's position's decodes, registered
        s.is_async = Signal(name="is_async")
        s.gpipe = Signal(name="is_gpipe")
        s.is_first = Signal(name="is_first")
        s.is_last = Signal(name="is_last")
        m.d.sync += [s.is_async.eq(sched == SCHEDULE_1F1B_ASYNC), s.gpipe.eq(sched == SCHEDULE_GPIPE),
                     s.is_first.eq(s.cfg.stage == 0), s.is_last.eq(s.cfg.stage + 1 == s.cfg.stages)]
        s.mbs = s.cfg.microbatches
        # N = microbatches * steps, once per run in SETUP: operand, product and result
        # registers (a DSP with its input, M and P registers, not a multiply every cycle)
        s.n_total = Signal(24)
        n_ops = [Signal(8, name="n_mbs_q", reset_less=True), Signal(16, name="n_steps_q", reset_less=True)]
        s.n_prod = Signal(24, name="n_prod", reset_less=True)
        m.d.sync += [n_ops[0].eq(s.mbs), n_ops[1].eq(s.cfg.steps), s.n_prod.eq(n_ops[0] * n_ops[1])]
        # SETUP's cycles left as a one-hot countdown: its last cycle is a flip-flop of its
        # own (a compare of a count sat in front of the phase flags)
        s.setup_left = Signal(6)
        # per-run constants, registered (steady from SETUP on)
        s.m_eff = Signal(24, name="m_eff", reset_less=True)        # microbatches per flush
        m.d.sync += s.m_eff.eq(Mux(s.is_async, s.n_total, s.mbs))
        s.f_loc = Signal(24)                          # F issued in this step
        s.b_loc = Signal(24)                          # B issued in this step
        s.ahead = Signal(24)                          # f_loc - b_loc
        s.base = Signal(24)                           # global index of the step's first microbatch
        s.f_mb = Signal(24)                           # base + f_loc: the next forward's microbatch
        s.b_mb = Signal(24)                           # the next backward's microbatch
        s.step_idx = Signal(16)
        s.b_done = Signal(24)                         # B completed in the run (global)
        p_minus_s = Signal(5, name="p_minus_s", reset_less=True)
        m.d.sync += p_minus_s.eq(s.cfg.stages - s.cfg.stage)
        s.window = Signal(24, name="window", reset_less=True)
        win_raw = Signal(5, name="window_raw", reset_less=True)
        m.d.sync += [win_raw.eq(Mux(s.is_async, p_minus_s, p_minus_s - 1)),
                     s.window.eq(Mux(win_raw < s.m_eff, win_raw, s.m_eff))]
        s.cur_ver = Signal(range(V))
        s.ver_of_slot = Array([Signal(range(V), name=f"ver_slot{i}") for i in range(S)])

        # each dimension - 1 and the words per row - 1 of the input and the output,
        # registered (the configuration is steady from start)
        s.dim_last = {}
        for name in ("d_in", "d_out", "rows"):
            s.dim_last[name] = Signal(ib, name=f"{name}_last", reset_less=True)
            m.d.sync += s.dim_last[name].eq(getattr(s.cfg, name) - 1)
        s.d_in_last = s.dim_last["d_in"]
        s.in_words_last = Signal(ib, name="in_words_last", reset_less=True)
        s.words_last = Signal(ib, name="words_last", reset_less=True)
        m.d.sync += [s.in_words_last.eq(((s.cfg.d_in + L - 1) >> lb) - 1),
                     s.words_last.eq(((s.cfg.d_out + L - 1) >> lb) - 1)]

    def _act_receiver(self, m, s):
        """Activations in: the input slots and how far each has arrived."""
        L, S, DI, RM = self.lanes, self.slots, self.max_in, self.max_rows
        s.rx_f = Signal(24)                 # microbatches fully received (global)
        s.rx_row_ok = Signal()
        rx_slot = Signal(range(S))
        m.d.comb += rx_slot.eq(s.rx_f[:max(S.bit_length() - 1, 1)] if S > 1 else 0)
        # a slot is free when its previous occupant's backward is done; synchronous
        # schedules also wait for the flush before taking the next step's inputs
        # ``ready`` is a register (it reaches the upstream core's drain credits): computed one
        # cycle ahead from the limits' registered copies (stale limits only ever lag: b_done
        # and base grow during a run) for the count the receiver will have then
        act = self.act_in.payload
        s.rx_f_next = Signal(24)            # rx_f + 1
        rx_lim_slot = Signal(24, name="rx_lim_slot", reset_less=True)     # b_done + S
        rx_lim_step = Signal(24, name="rx_lim_step", reset_less=True)     # base + mbs
        m.d.sync += [rx_lim_slot.eq(s.b_done + S), rx_lim_step.eq(s.base + s.mbs)]

        def rx_room(count):
            return (count < rx_lim_slot) & (s.is_async | (count < rx_lim_step)) & (count < s.n_total)
        rx_last = self.act_in.valid & s.rx_row_ok & act.last
        m.d.sync += s.rx_row_ok.eq(s.running & ~s.ph.flag["setup"] &
                                   Mux(rx_last, rx_room(s.rx_f_next), rx_room(s.rx_f)))
        m.d.comb += self.act_in.ready.eq(s.rx_row_ok)
        m.d.comb += [
            s.xbuf.wr_en.eq(self.act_in.valid & s.rx_row_ok),
            s.xbuf.wr.row.eq(Cat(act.row[:RM.bit_length() - 1], rx_slot)),
            s.xbuf.wr.col.eq(act.col), s.xbuf.wr.count.eq(act.count), s.xbuf.wr.data.eq(act.data),
        ]
        with m.If(rx_last):
            m.d.sync += [s.rx_f.eq(s.rx_f + 1), s.rx_f_next.eq(s.rx_f_next + 1)]
        # how far microbatch rx_f has arrived (the first stage's forward streams on it)
        s.x_fill = _FillTracker(m, "x_fill", lanes=L, blocks=-(-RM // L), words=DI // L,
                                rows_last=s.dim_last["rows"],
                                words_last=s.in_words_last, fire=self.act_in.valid & s.rx_row_ok,
                                row=act.row, col=act.col, last=act.last)

    def _mask_stash(self, m, s):
        """The ReLU masks of forward outputs, kept for the backward."""
        L, S, DO, RM = self.lanes, self.slots, self.max_out, self.max_rows
        lb = self.lanes.bit_length() - 1
        mask_words = S * RM * (DO // L)
        mask_mem = Memory(shape=L, depth=mask_words, init=[])
        m.submodules.mask = mask_mem
        s.mask_wp = mask_mem.write_port()
        s.mask_rp = mask_mem.read_port()

        def mask_addr(slot, row, col):
            return Cat((col >> lb)[:max(self.word_bits, 0) or 1] if self.word_bits else Const(0, 0),
                       row[:RM.bit_length() - 1] if RM > 1 else Const(0, 0),
                       slot[:S.bit_length() - 1] if S > 1 else Const(0, 0))
        s.mask_addr = mask_addr

    def _grad_receiver(self, m, s):
        """Gradients in: masked by the stashed ReLU and written to the dY slots."""
        L, S, DO, RM = self.lanes, self.slots, self.max_out, self.max_rows
        s.rx_b = Signal(24)                 # dY microbatches fully received (global count)
        # ``ready`` registered as the act receiver's (b_done + 2 lags, so it only errs safe)
        g_ok = Signal()
        s.rx_b_next = Signal(24)            # rx_b + 1
        g_lim = Signal(24, name="g_lim", reset_less=True)
        m.d.sync += g_lim.eq(s.b_done + 2)
        # stage 1 of the receiver: read the mask word; stage 2: mask dY
        g_valid_q = Signal()
        g_pl_q = Signal.like(self.grad_in.payload)
        g_slot_q = Signal()
        m.d.comb += self.grad_in.ready.eq(g_ok)
        g_fire = self.grad_in.valid & g_ok
        gp = self.grad_in.payload
        # the slot of the microbatch the next dY belongs to: a step's microbatches come in
        # reverse order with GPipe (base + mbs - 1 - i), else in order (base + i); only
        # the slot's bits are kept, moved at each microbatch's last segment (below), so no
        # add of the counts is in front of the mask memory's address
        sb = max(S.bit_length() - 1, 1)
        mb_slot = Signal(sb, name="rx_b_slot")
        m.d.comb += [s.mask_rp.addr.eq(s.mask_addr(mb_slot, gp.row, gp.col)), s.mask_rp.en.eq(1)]
        m.d.sync += [g_valid_q.eq(g_fire), g_pl_q.eq(gp), g_slot_q.eq(s.rx_b[0])]
        # (not in SETUP, while the registered configuration's decodes settle)
        m.d.sync += g_ok.eq(s.running & ~s.ph.flag["setup"] &
                            Mux(g_fire & gp.last, s.rx_b_next < g_lim, s.rx_b < g_lim))
        # ``rx_b_wrap``: the next dY completes a synchronous step's microbatches (it is the
        # step's last), a register kept current for the count the receiver has after each
        # one. It is set from ``rx_b_left`` (the step's dY to come after the next, counted
        # down; loaded in SETUP, before any dY, and at each wrap): compared with 0 and 1,
        # which differ in the low bit only, so the handshake chooses at the end, not in
        # front of a compare of the count with two limits (a tree ABC built behind the
        # handshake's enables)
        rx_b_wrap = Signal(name="rx_b_wrap")
        mbs_m1 = Signal(8, name="mbs_m1", reset_less=True)
        mbs_one = Signal(name="mbs_one", reset_less=True)      # one microbatch per step
        rx_b_left = Signal(8, name="rx_b_left", reset_less=True)
        m.d.sync += [mbs_m1.eq(s.mbs - 1), mbs_one.eq(s.mbs == 1)]
        left_high_zero = rx_b_left[1:] == 0
        m.d.sync += rx_b_wrap.eq(~s.is_async & Mux(g_fire & gp.last,
                                                   Mux(rx_b_wrap, mbs_one, left_high_zero & rx_b_left[0]),
                                                   left_high_zero & ~rx_b_left[0]))
        # (GPipe: a step's last microbatch is its base, the next step's first is 2 mbs - 1
        # past it)
        slot_wrap_step = Signal(sb, name="rx_b_slot_wrap_step", reset_less=True)
        m.d.sync += slot_wrap_step.eq(Mux(s.gpipe, s.mbs + mbs_m1, 1))
        with m.If(s.ph.flag["setup"]):
            m.d.sync += [rx_b_left.eq(mbs_m1), mb_slot.eq(Mux(s.gpipe, mbs_m1, 0))]
        with m.Elif(g_fire & gp.last):
            m.d.sync += [rx_b_left.eq(Mux(rx_b_wrap, mbs_m1, rx_b_left - 1)),
                         mb_slot.eq(mb_slot + Mux(rx_b_wrap, slot_wrap_step, Mux(s.gpipe, -1, 1)))]
        with m.If(g_fire & gp.last):
            m.d.sync += [s.rx_b.eq(s.rx_b + 1), s.rx_b_next.eq(s.rx_b_next + 1)]
        # stage 3: write the masked segment, from registers (the mask memory's read data
        # reaches no further than them)
        masked = [Mux(~s.cfg.relu | s.mask_rp.data[l], g_pl_q.data[l], 0) for l in range(L)]
        y_wr_en = Signal(name="y_wr_en")
        y_wr = Signal.like(s.ybuf.wr, name="y_wr", reset_less=True)
        y_row = Signal.like(g_pl_q.row, name="y_wr_row", reset_less=True)
        y_last = Signal(name="y_wr_last", reset_less=True)
        m.d.sync += [y_wr_en.eq(g_valid_q), y_row.eq(g_pl_q.row), y_last.eq(g_pl_q.last),
                     y_wr.row.eq(Cat(g_pl_q.row[:RM.bit_length() - 1], g_slot_q)),
                     y_wr.col.eq(g_pl_q.col), y_wr.count.eq(g_pl_q.count)]
        m.d.sync += [y_wr.data[l].eq(masked[l]) for l in range(L)]
        m.d.comb += [s.ybuf.wr_en.eq(y_wr_en), s.ybuf.wr.eq(y_wr)]
        # the last dY segment is written two cycles after it was accepted
        rx_b_accepted, rx_b_written = Signal(24), Signal(24)
        s.rx_b_written = rx_b_written
        m.d.sync += [rx_b_accepted.eq(s.rx_b), s.rx_b_written.eq(rx_b_accepted)]
        # how far dY microbatch rx_b_written has been written (the last stage's backward
        # streams on it)
        s.y_fill = _FillTracker(m, "y_fill", lanes=L, blocks=-(-RM // L), words=DO // L,
                                rows_last=s.dim_last["rows"],
                                words_last=s.words_last, fire=y_wr_en,
                                row=y_row, col=y_wr.col, last=y_last)

    def _state_memories(self, m, s):
        """Master weights, SGD velocity and weight-gradient sums."""
        L, DI, DO, f = self.lanes, self.max_in, self.max_out, self.fmt
        n_words = DI * DO // L
        mw = f["master"].width
        attrs = {"ram_style": self.state_ram_style} if self.state_ram_style else None
        masters = Memory(shape=data.ArrayLayout(signed(mw), L), depth=n_words, init=[], attrs=attrs)
        velocity = Memory(shape=data.ArrayLayout(signed(f["velocity"].width), L), depth=n_words, init=[],
                          attrs=attrs)
        gsum = Memory(shape=data.ArrayLayout(signed(f["grad_sum"].width), L), depth=n_words, init=[],
                      attrs=attrs)
        m.submodules.masters, m.submodules.velocity, m.submodules.gsum = masters, velocity, gsum
        s.ms_rp = masters.read_port()
        s.ms_wp = masters.write_port()
        s.vl_rp = velocity.read_port()
        s.vl_wp = velocity.write_port()
        s.gs_rp = gsum.read_port()
        s.gs_wp = gsum.write_port()

        def word_addr(row, col_word):
            return Cat(col_word[:self.word_bits] if self.word_bits else Const(0, 0),
                       row[:DI.bit_length() - 1])
        s.word_addr = word_addr

    def _current_op(self, m, s):
        """The op's operand routing, core configuration and output routing."""
        S, V, DI, RM = self.slots, self.versions, self.max_in, self.max_rows
        lb = self.lanes.bit_length() - 1
        s.op_mb = Signal(24)
        s.op_slot = Signal(range(S))
        m.d.comb += s.op_slot.eq(s.op_mb[:max(S.bit_length() - 1, 1)] if S > 1 else 0)
        s.op_ver = Signal(range(V))
        s.op_yslot = Signal()
        rows_shift = RM.bit_length() - 1
        s.d_shift = DI.bit_length() - 1

        # core operand routing: the slot / version offset goes to the row coordinate (the
        # fixed index of a rowwise read, else the start), which is below 2**shift, so
        # it is a concatenation, not an add (the extent, off the address path, is added)
        def route(req, buf, slot, shift):
            def at(index):
                return Cat(index[:shift], slot) if shift else slot
            m.d.comb += [buf.rd_en.eq(req.en), buf.rd_rowwise.eq(req.rowwise)]
            m.d.comb += [buf.rd_fixed.eq(Mux(req.rowwise, at(req.fixed), req.fixed)),
                         buf.rd_start.eq(Mux(req.rowwise, req.start, at(req.start))),
                         buf.rd_extent.eq(Mux(req.rowwise, req.extent, req.extent + (slot << shift)))]

        route(s.core.a_req, s.xbuf, s.op_slot, rows_shift)       # F, DW read X on the A side
        route(s.core.b_req, s.wbuf, s.op_ver, s.d_shift)           # F, DX read W on the B side
        # dY: A side in DX, B side in DW
        with m.If(s.in_dx):
            route(s.core.a_req, s.ybuf, s.op_yslot, rows_shift)
        with m.Else():
            route(s.core.b_req, s.ybuf, s.op_yslot, rows_shift)
        x_data, y_data, w_data = (b.rd_data.as_value() for b in (s.xbuf, s.ybuf, s.wbuf))
        m.d.comb += [s.core.a_data.eq(Mux(s.in_dx, y_data, x_data)),
                     s.core.b_data.eq(Mux(s.in_dw, y_data, w_data))]

        # core configuration: registers loaded a cycle ahead with the next op's (see ``next_f``)
        m.d.comb += [s.core.use_bias.eq(0), s.core.bias_shift.eq(0), s.core.bias_clear.eq(0),
                     s.core.bias_wr_en.eq(0)]
        s.core_cfg = {name: Signal.like(getattr(s.core, name), name=f"core_cfg_{name}", reset_less=True)
                      for name in ("mode", "m", "n", "k", "shift", "relu")}
        m.d.comb += [getattr(s.core, name).eq(sig) for name, sig in s.core_cfg.items()]
        cfg = s.cfg
        s.op_config = {
            Phase.F_START: (MacMode.FWD, cfg.rows, cfg.d_out, cfg.d_in, cfg.fwd_shift, cfg.relu),
            Phase.DX_START: (MacMode.DX, cfg.rows, cfg.d_in, cfg.d_out, cfg.dx_shift, 0),
            Phase.DW_START: (MacMode.DW, cfg.d_in, cfg.d_out, cfg.rows, cfg.dw_shift, 0),
        }

        s.go = s.ph.go

        # core output routing
        out = s.core.out.payload
        m.d.comb += [self.act_out.payload.eq(out), self.grad_out.payload.eq(out)]
        m.d.comb += [self.act_out.valid.eq(s.core.out.valid & s.in_f),
                     self.grad_out.valid.eq(s.core.out.valid & s.in_dx)]
        # (the core's output is valid in RUN phases only: its ready reads their one-hot
        # registers, which fan out far less than the op flags. Outside F_RUN and DX_RUN it
        # is high, which no valid output meets but DW's: a function of four inputs, which
        # the core's output FIFO folds into its fetch LUT)
        s.now = s.ph.now
        m.d.comb += s.core.out.ready.eq((self.act_out.ready | ~s.now[Phase.F_RUN]) &
                                        (self.grad_out.ready | ~s.now[Phase.DX_RUN]))
        # F: stash the ReLU mask of every accepted output segment
        m.d.comb += [s.mask_wp.addr.eq(s.mask_addr(s.op_slot, out.row, out.col)),
                     s.mask_wp.data.eq(out.relu_mask),
                     s.mask_wp.en.eq(s.in_f & s.core.out.valid & self.act_out.ready)]
        # DW: add each segment into the gradient sum: read, register the read data, add and
        # write. The segments of one DW have distinct addresses, so no word is read while
        # an earlier write to it is in flight; the SGD walk starts only once the last write
        # is in (``dw_busy``), and the next DW is a DX op later.
        s.dw_fire = s.in_dw & s.core.out.valid
        s.dw_addr = s.word_addr(out.row, out.col >> lb)
        s.dw_q1 = Signal()
        s.dw_q2 = Signal()
        dw_addr1, s.dw_addr2 = (Signal.like(s.gs_wp.addr, name=f"dw_addr{i}", reset_less=True)
                                for i in (1, 2))
        dw_data1, s.dw_data2 = (Signal.like(out.data, name=f"dw_data{i}", reset_less=True)
                                for i in (1, 2))
        s.gs_q = Signal.like(s.gs_rp.data, name="gs_q", reset_less=True)     # the read data register
        m.d.sync += [s.dw_q1.eq(s.dw_fire), dw_addr1.eq(s.dw_addr), dw_data1.eq(out.data),
                     s.dw_q2.eq(s.dw_q1), s.dw_addr2.eq(dw_addr1), s.dw_data2.eq(dw_data1),
                     s.gs_q.eq(s.gs_rp.data)]
        s.dw_busy = Signal(name="dw_busy")      # dw_q1 | dw_q2, as a register
        m.d.sync += s.dw_busy.eq(s.dw_fire | s.dw_q1)

    def _sgd_datapath(self, m, s):
        """The SGD walk, the host's weight and velocity access, the port muxing."""
        L, ib, V, f = self.lanes, self.index_bits, self.versions, self.fmt
        lb, wbits = self.lanes.bit_length() - 1, max(self.word_bits, 1)
        # the walk issues one word address per cycle (read), the words' results come out of
        # the SgdPipeline LATENCY cycles after the read data and are written there; each
        # word is read and written once per update, so no read meets a write in flight
        s.u_row = Signal(ib)
        s.u_word = Signal(wbits)
        s.u_word_end = Signal()  # the walk is at the row's end
        s.u_row_end = Signal()   # ... and the matrix's
        s.u_issue = Signal()     # reading word (u_row, u_word) this cycle
        s.u_q = Signal()         # its read data is out this cycle
        u_row_q, u_word_q = Signal(ib, reset_less=True), Signal(wbits, reset_less=True)
        u_lanes_q = Signal(L, reset_less=True)      # lanes of the word inside d_out
        # the walk's limits minus one (one bit wider: -1 matches no index)
        s.u_words_last_m1 = Signal(ib + 1, name="u_words_last_m1", reset_less=True)
        s.u_rows_last_m1 = Signal(ib + 1, name="u_rows_last_m1", reset_less=True)
        m.d.sync += [s.u_words_last_m1.eq(s.words_last - 1), s.u_rows_last_m1.eq(s.d_in_last - 1)]
        u_addr = s.word_addr(s.u_row, s.u_word)
        u_addr_q = s.word_addr(u_row_q, u_word_q)
        m.d.sync += [s.u_q.eq(s.u_issue), u_row_q.eq(s.u_row), u_word_q.eq(s.u_word),
                     u_lanes_q.eq(Cat(((s.u_word << lb) + l) < s.cfg.d_out for l in range(L)))]
        s.new_ver = Signal(range(V))
        m.d.comb += s.new_ver.eq(Mux(s.cur_ver == V - 1, 0, s.cur_ver + 1))
        use_mom = Signal(name="use_momentum")
        m.d.sync += use_mom.eq(s.cfg.mu != 0)
        m.submodules.sgd = s.sgd = SgdPipeline(
            lanes=L, tag_width=wbits + ib, master=f["master"], weight=f["weight"],
            grad_sum=f["grad_sum"], velocity=f["velocity"], lr=f["lr"], wd=f["wd"], mu=f["mu"])
        m.d.comb += [s.sgd.valid.eq(s.u_q), s.sgd.tag.eq(Cat(u_word_q, u_row_q)),
                     s.sgd.lane_on.eq(u_lanes_q),
                     s.sgd.w.eq(s.ms_rp.data), s.sgd.g.eq(s.gs_rp.data), s.sgd.v.eq(s.vl_rp.data),
                     s.sgd.lr.eq(s.cfg.lr), s.sgd.wd.eq(s.cfg.wd), s.sgd.mu.eq(s.cfg.mu)]
        sgd_word, sgd_row = s.sgd.out_tag[:wbits], s.sgd.out_tag[wbits:]
        sgd_addr = s.word_addr(sgd_row, sgd_word)

        # host weight load: the master word is written at once; the narrowed MAC weights go
        # to the current version slot through three stages (round parts, round, saturate)
        host = RegisterStages(m, "host_w")
        host_valid = [self.w_wr_en]
        for i in range(3):
            host_valid.append(Signal(name=f"host_w_valid{i + 1}"))
            m.d.sync += host_valid[-1].eq(host_valid[-2])
        host_row = host.delay(self.w_row, 3, "row")
        host_word = host.delay(self.w_word, 3, "word")
        host_w = Signal(data.ArrayLayout(signed(16), L))
        nshift = f["master"].frac - f["weight"].frac
        for l in range(L):
            x = self.w_wr_data[l]
            if nshift:
                kept = host.reg(x >> nshift, f"kept{l}")
                up = host.reg(round_up_bit(x.as_unsigned()[:nshift], x[nshift], nshift), f"up{l}")
            else:
                kept, up = host.reg(x, f"kept{l}"), host.reg(Const(0, 1), f"up{l}")
            raw = host.reg(kept + up, f"raw{l}")
            clamped, _ = saturate(raw, f["weight"].width)
            m.d.comb += host_w[l].eq(host.reg(clamped, f"weight{l}"))

        # memory port muxing: host access (idle) / DW accumulate / SGD
        with m.If(~s.running):
            m.d.comb += [s.vl_rp.addr.eq(s.word_addr(self.v_row, self.v_word)),
                         s.vl_wp.addr.eq(s.word_addr(self.v_row, self.v_word)),
                         s.vl_wp.data.eq(self.v_wr_data), s.vl_wp.en.eq(self.v_wr_en)]
            m.d.comb += [s.ms_rp.addr.eq(s.word_addr(self.w_row, self.w_word)),
                         s.ms_wp.addr.eq(s.word_addr(self.w_row, self.w_word)),
                         s.ms_wp.data.eq(self.w_wr_data), s.ms_wp.en.eq(self.w_wr_en)]
        with m.Else():
            m.d.comb += [s.ms_rp.addr.eq(u_addr), s.vl_rp.addr.eq(u_addr),
                         s.ms_wp.addr.eq(sgd_addr), s.ms_wp.data.eq(s.sgd.master),
                         s.ms_wp.en.eq(s.sgd.out_valid),
                         s.vl_wp.addr.eq(sgd_addr), s.vl_wp.data.eq(s.sgd.velocity),
                         s.vl_wp.en.eq(s.sgd.out_valid & use_mom)]
        # MAC weights: a host write still in its narrowing stages goes first (the SGD writes
        # only while running, long after the host's last write); the write is registered
        # before the buffer's lane rotation (the next op reads the new version cycles later)
        wb_en = Signal(name="wbuf_wr_en")
        wb = Signal.like(s.wbuf.wr, name="wbuf_wr", reset_less=True)
        m.d.comb += [s.wbuf.wr_en.eq(wb_en), s.wbuf.wr.eq(wb)]
        with m.If(host_valid[3]):
            m.d.sync += [wb_en.eq(1), wb.row.eq(Cat(host_row[:s.d_shift], s.cur_ver)),
                         wb.col.eq(host_word << lb), wb.count.eq(L), wb.data.eq(host_w)]
        with m.Else():
            m.d.sync += [wb_en.eq(s.sgd.out_valid), wb.row.eq(Cat(sgd_row[:s.d_shift], s.new_ver)),
                         wb.col.eq(sgd_word << lb), wb.count.eq(L), wb.data.eq(s.sgd.weight)]
        m.d.comb += [self.w_rd_data.eq(s.ms_rp.data), self.v_rd_data.eq(s.vl_rp.data), s.ms_rp.en.eq(1),
                     s.vl_rp.en.eq(1), s.gs_rp.en.eq(1)]
        with m.If(s.in_dw | s.dw_busy):
            m.d.comb += [s.gs_rp.addr.eq(s.dw_addr), s.gs_wp.addr.eq(s.dw_addr2), s.gs_wp.en.eq(s.dw_q2)]
            m.d.comb += [s.gs_wp.data[l].eq(s.gs_q[l] + s.dw_data2[l]) for l in range(L)]
        with m.Elif(~s.running):      # a host weight write clears the word's gradient sum
            m.d.comb += [s.gs_rp.addr.eq(s.word_addr(self.w_row, self.w_word)),
                         s.gs_wp.addr.eq(s.word_addr(self.w_row, self.w_word)),
                         s.gs_wp.en.eq(self.w_wr_en)]
            m.d.comb += [s.gs_wp.data[l].eq(0) for l in range(L)]
        with m.Else():              # the SGD walk zeroes each sum once it has been read
            m.d.comb += [s.gs_rp.addr.eq(u_addr), s.gs_wp.addr.eq(u_addr_q), s.gs_wp.en.eq(s.u_q)]
            m.d.comb += [s.gs_wp.data[l].eq(0) for l in range(L)]

    def _streaming_hold(self, m, s):
        """Holds the core until the data it reads next has arrived."""
        ib = self.index_bits
        # The first stage's forward may start while its input (from the host) is still
        # arriving, and the last stage's backward while its dY (the host's loss gradient)
        # is: the core is held until the data it is about to read is in (x_fill / y_fill).
        # Between stages a microbatch is handed over whole, as in the schedule model.
        # ``hold`` gates the core's whole sequencer, so it comes from registers (one per op
        # kind, below), computed one cycle ahead: while held the core's read stays where it
        # is and that read must be in; else the core may step, so its next read must be in
        # too. The next read is the same word until the depth step crosses a word (or the
        # run's depth ends), then the next the next row block. A START phase (the core does
        # not step) needs its first read (address 0) only; the choice comes last, so the
        # compares start from registers.
        # Whether the op's microbatch is in whole (or is the one arriving) are registers, a
        # cycle behind the counts: when a count moves on they lag on the safe side (the
        # tracker has just been reset, so the partial checks say "not in" for that cycle),
        # and the counters they compare with are steady from a cycle before the op starts
        # (f_mb is op_mb during a forward; b_done moves at a backward's end only).
        x_whole, y_whole, x_at = Signal(name="x_whole"), Signal(name="y_whole"), Signal(name="x_at")
        m.d.sync += [x_whole.eq(s.rx_f > s.f_mb), y_whole.eq(s.rx_b_written > s.b_done),
                     x_at.eq(s.rx_f == s.f_mb)]
        # ``hold`` is the OR of a register per op kind, each set only while its kind is the
        # op's: three cones, each from its own compares, mapped apart from the sequencer's
        # logic (which ABC would otherwise relax to their depth). While an op's RUN phase
        # reads ``hold``, only its own kind's register can be set (another kind's is clear
        # from the cycle after its phase flag falls, the START cycle at the latest), so each
        # cone reads its own register: one LUT level fewer behind the compares
        part = {k: Signal(name=f"hold_{k}") for k in ("f", "dx", "dw")}
        hold = Signal(name="hold")
        m.d.comb += hold.eq(part["f"] | part["dx"] | part["dw"])
        kk = s.core.a_req.fixed           # the depth step (== b_req.fixed)
        i0, j0 = s.core.a_req.start, s.core.b_req.start
        # whether the depth step is the run's last / ends a word: the core's registers (current
        # from the op's first RUN cycle; START does not look at them), no compare of kk here
        at_depth_end, word_end = s.core.depth_last, s.core.depth_word_end
        zero = Const(0, ib)

        # ``cur & (hold | nxt)``: the read is in, and so is the next one unless held. The
        # next read's segment lies past the current one's in the streaming order, so ``nxt``
        # implies ``cur``: that is ``(cur & hold) | nxt``, with ``nxt`` off the AND
        def ok(cur, nxt, held):
            return (cur & held) | nxt
        f_cur, dx_cur = s.x_fill.has_block_word(i0, kk), s.y_fill.has_block_word(i0, kk)
        run_f = x_at & Mux(word_end | at_depth_end,
                           ok(f_cur, s.x_fill.has_next_block_word(i0, kk), part["f"]), f_cur)
        run_dx = Mux(word_end | at_depth_end,
                     ok(dx_cur, s.y_fill.has_next_block_word(i0, kk), part["dx"]), dx_cur)
        run_dw = ok(s.y_fill.has_row_word(kk, j0), Mux(
            word_end & ~at_depth_end, s.y_fill.has_row_word_next_block(kk, j0),
            s.y_fill.has_next_row_word(kk, j0)), part["dw"])
        starting = s.ph.flag["start"]
        ok_f = x_whole | Mux(starting, x_at & s.x_fill.has_block_word(zero, zero), run_f)
        ok_dx = y_whole | Mux(starting, s.y_fill.has_block_word(zero, zero), run_dx)
        ok_dw = y_whole | Mux(starting, s.y_fill.has_row_word(zero, zero), run_dw)
        for kind, in_kind, ok_kind in (("f", s.in_f, ok_f), ("dx", s.in_dx, ok_dx),
                                       ("dw", s.in_dw, ok_dw)):
            held_next = Signal(name=f"hold_{kind}_next")
            own_module(m, f"hold_{kind}_decision").d.comb += held_next.eq(in_kind & ~ok_kind)
            m.d.sync += part[kind].eq(held_next)
        m.d.comb += s.core.hold.eq(hold)
        s.held = hold & s.ph.flag["run"]        # counted as waiting

    def _op_ends(self, m, s):
        """The core's done, decoded with the op it ends."""
        m.d.comb += s.core.start.eq(s.ph.flag["start"])
        # the core's done (from its output handshake) registered, and decoded with the op it
        # ends (the phase and the order of a backward's halves are steady while the core
        # runs): each move of the sequencer starts from one register of its own
        s.core_done = Signal()
        s.now, dx_first = s.ph.now, s.cfg.dx_first
        s.ends = {k: Signal(name=f"end_{k}") for k in ("f", "dx_then_dw", "dw_then_dx", "b_at_dx",
                                                          "b_at_dw", "b")}
        m.d.sync += [s.core_done.eq(s.core.done & s.ph.flag["run"]),
                     s.ends["f"].eq(s.core.done & s.now[Phase.F_RUN]),
                     s.ends["dx_then_dw"].eq(s.core.done & s.now[Phase.DX_RUN] & dx_first),
                     s.ends["dw_then_dx"].eq(s.core.done & s.now[Phase.DW_RUN] & ~dx_first),
                     s.ends["b_at_dx"].eq(s.core.done & s.now[Phase.DX_RUN] & ~dx_first),
                     s.ends["b_at_dw"].eq(s.core.done & s.now[Phase.DW_RUN] & dx_first),
                     s.ends["b"].eq(s.core.done & Mux(dx_first, s.now[Phase.DW_RUN],
                                                      s.now[Phase.DX_RUN]))]

    def _run_start(self, m, s):
        """The run's counters and its start."""
        s.busy_c, s.fwd_c, s.bwd_c, s.upd_c, s.wait_c = (
            Signal(32, name=n) for n in ("busy_c", "fwd_c", "bwd_c", "upd_c", "wait_c"))
        s.mac_ops = Signal(48)
        s.sats = Signal(32)
        s.ops_done = Signal(32)
        # the end-of-op counters add registered increments (their values are read after the
        # run, and the last one lands cycles before DONE): no adder behind the op's end, and
        # the start's clear below takes precedence
        s.op_ended = Signal()             # an op (F, B or U) ends this cycle
        ops_inc = Signal()
        mac_inc = Signal.like(s.mac_ops, name="mac_ops_inc")
        sat_inc = Signal.like(s.sats, name="saturations_inc")
        # (the SGD's count, a sum of its lanes' flags, is registered before the add)
        sgd_sats = Signal.like(s.sgd.sat_count, name="sgd_saturations", reset_less=True)
        m.d.sync += [ops_inc.eq(s.op_ended), mac_inc.eq(Mux(s.core_done, s.core.mac_ops, 0)),
                     sgd_sats.eq(Mux(s.sgd.sat_valid, s.sgd.sat_count, 0)),
                     sat_inc.eq(Mux(s.core_done, s.core.saturations, 0) + sgd_sats),
                     s.ops_done.eq(s.ops_done + ops_inc), s.mac_ops.eq(s.mac_ops + mac_inc),
                     s.sats.eq(s.sats + sat_inc)]
        with m.If(self.start & ~s.running):
            s.go(Phase.SETUP)
            m.d.sync += [s.running.eq(1), s.setup_left.eq(1 << 5), s.f_loc.eq(0), s.b_loc.eq(0), s.ahead.eq(0),
                         s.base.eq(0), s.f_mb.eq(0),
                         s.step_idx.eq(0), s.b_done.eq(0), s.rx_f.eq(0), s.rx_b.eq(0), s.rx_f_next.eq(1),
                         s.rx_b_next.eq(1),
                         s.busy_c.eq(0), s.fwd_c.eq(0), s.bwd_c.eq(0), s.upd_c.eq(0), s.wait_c.eq(0),
                         s.mac_ops.eq(0), s.sats.eq(0), s.ops_done.eq(0)]

    def _decide(self, m, s):
        """DECIDE: the next op, from registers, and the core configuration for it."""
        S, V = self.slots, self.versions
        def mb_slot_of(mb):
            return mb[:max(S.bit_length() - 1, 1)] if S > 1 else Const(0, 1)

        # the counters' next values, registered (each changes at most once per op, so the
        # copy is current whenever an op ends): no incrementer behind the phase logic
        for name in ("b_mb_next", "b_done_next", "ahead_up", "ahead_down", "f_mb_next", "step_base",
                     "step_b_mb"):
            setattr(s, name, Signal(24, name=name, reset_less=True))
        # the first backward's microbatch from the step's base, a run constant registered
        # (one adder behind the base, not three)
        step_b_off = Signal(24, name="step_b_off", reset_less=True)
        m.d.sync += step_b_off.eq(Mux(s.gpipe, s.mbs + s.mbs - 1, s.mbs))
        m.d.sync += [s.b_mb_next.eq(Mux(s.gpipe, s.b_mb - 1, s.b_mb + 1)), s.b_done_next.eq(s.b_done + 1),
                     s.ahead_up.eq(s.ahead + 1), s.ahead_down.eq(s.ahead - 1),
                     s.f_mb_next.eq(s.f_mb + 1), s.step_base.eq(s.base + s.mbs),
                     s.step_b_mb.eq(s.base + step_b_off)]

        def after_backward():
            # an asynchronous schedule updates after every backward (see ``ends["b"]``)
            with m.If(s.is_async):
                s.go(Phase.U_RUN)
            with m.Else():
                s.go(Phase.DECIDE)
        s.after_backward = after_backward

        # DECIDE's outcome is a set of exclusive registers computed every cycle from the
        # counters (so no priority chain of its conditions sits in front of the phase flags
        # and the core's configuration); the first DECIDE cycle only lets them see the
        # counters the ended op just updated: an outcome is set only from a DECIDE cycle,
        # so it is set in the second and later ones (the flag and the outcome in one
        # register, one LUT input of the moves). Their cones (the counts' compares) are
        # mapped apart from the sequencer's logic.
        want_f = Mux(s.is_async, (s.f_loc < s.n_total) & (s.ahead < s.window),
                     (s.f_loc < s.mbs) & (s.gpipe | (s.ahead <= s.window)))
        f_ready = (s.rx_f > s.f_mb) | (s.is_first & (s.rx_f == s.f_mb) & s.rx_row_ok)
        b_left = s.b_loc < s.m_eff
        b_ready = (s.rx_b_written > s.b_done) | (s.is_last & (s.rx_b_written == s.b_done))
        finished = Mux(s.is_async, s.b_done >= s.n_total, s.step_idx >= s.cfg.steps)
        s.decide = {n: Signal(name=f"decide_{n}") for n in ("done", "f", "dx", "dw", "u", "wait")}
        b_go = ~finished & ~want_f & b_left & b_ready
        s.b_ver = Signal(range(V), name="decide_b_ver")
        outcome = {
            "done": finished, "f": ~finished & want_f & f_ready, "dx": b_go & s.cfg.dx_first,
            "dw": b_go & ~s.cfg.dx_first, "u": ~finished & ~want_f & ~b_left,
            "wait": ~finished & Mux(want_f, ~f_ready, b_left & ~b_ready)}
        outcome_m = own_module(m, "decide_outcome")
        for name, cond in outcome.items():
            nxt = Signal(name=f"decide_{name}_next")
            outcome_m.d.comb += nxt.eq(s.ph.flag["decide"] & cond)
            m.d.sync += s.decide[name].eq(nxt)
        m.d.sync += s.b_ver.eq(Mux(s.is_async, s.ver_of_slot[mb_slot_of(s.b_mb)], s.cur_ver))

        # the core latches its configuration in an op's START cycle, so the registers only
        # have to hold that op's by then: they load, every cycle, the op that starts next
        # (DECIDE's outcome; after a backward's first half, its other half), from registers
        next_f = s.ph.flag["decide"] & s.decide["f"]
        next_dx = Mux(s.ph.flag["decide"], s.decide["dx"], s.in_dw & ~s.cfg.dx_first)
        for sig, f_v, dx_v, dw_v in zip(s.core_cfg.values(), *s.op_config.values()):
            m.d.sync += sig.eq(Mux(next_f, Value.cast(f_v), Mux(next_dx, Value.cast(dx_v), Value.cast(dw_v))))

    def _phases(self, m, s):
        """Each phase's logic and its moves."""
        u_restart = Signal(name="u_restart")      # the U walk starts from word 0
        # one phase flag is set at a time: each phase's block reads its own register
        with s.ph.block(Phase.SETUP):
            # the configuration is steady from start: its operands, product, N and the
            # constants registered from N (m_eff, window) settle
            m.d.sync += [s.setup_left.eq(s.setup_left >> 1), s.b_mb.eq(Mux(s.gpipe, s.mbs - 1, 0))]
            with m.If(s.setup_left[0]):
                s.go(Phase.DECIDE)
            with m.Else():
                m.d.sync += s.n_total.eq(s.n_prod)
        with s.ph.block(Phase.DECIDE):
            # the outcomes are exclusive: one If each, no priority between them
            with m.If(s.decide["done"]):
                s.go(Phase.DONE)
            with m.If(s.decide["f"]):
                # forward of microbatch base + f_loc, once its input arrived
                s.go(Phase.F_START)
                m.d.sync += s.op_mb.eq(s.f_mb)
            for kind, phase in (("dx", Phase.DX_START), ("dw", Phase.DW_START)):
                with m.If(s.decide[kind]):
                    s.go(phase)
                    m.d.sync += [s.op_mb.eq(s.b_mb), s.op_yslot.eq(s.b_done[0]), s.op_ver.eq(s.b_ver)]
            with m.If(s.decide["u"]):
                s.go(Phase.U_RUN)
                m.d.comb += u_restart.eq(1)
            with m.If(s.decide["wait"]):
                m.d.sync += s.wait_c.eq(s.wait_c + 1)
        with s.ph.block(Phase.F_START):
            s.go(Phase.F_RUN)
            m.d.sync += s.op_ver.eq(s.cur_ver)
            m.d.sync += s.ver_of_slot[s.op_slot].eq(s.cur_ver)
        with s.ph.block(Phase.F_RUN):
            m.d.sync += s.op_ver.eq(s.cur_ver)
            with m.If(s.ends["f"]):
                s.go(Phase.DECIDE)
                m.d.sync += [s.f_loc.eq(s.f_loc + 1), s.ahead.eq(s.ahead_up), s.f_mb.eq(s.f_mb_next)]
                m.d.comb += s.op_ended.eq(1)
        with s.ph.block(Phase.DX_START):
            s.go(Phase.DX_RUN)
        with s.ph.block(Phase.DX_RUN):
            with m.If(s.ends["dx_then_dw"]):
                s.go(Phase.DW_START)
            with m.If(s.ends["b_at_dx"]):
                s.after_backward()
        with s.ph.block(Phase.DW_START):
            s.go(Phase.DW_RUN)
        with s.ph.block(Phase.DW_RUN):
            with m.If(s.ends["dw_then_dx"]):
                s.go(Phase.DX_START)
            with m.If(s.ends["b_at_dw"]):
                s.after_backward()
        # a backward's end (either half last): the counters, and the U walk's start
        with m.If(s.ends["b"]):
            m.d.sync += [s.b_loc.eq(s.b_loc + 1), s.ahead.eq(s.ahead_down), s.b_mb.eq(s.b_mb_next)]
            m.d.comb += s.op_ended.eq(1)
            with m.If(s.is_async):
                m.d.comb += u_restart.eq(1)
            with m.Else():
                m.d.sync += s.b_done.eq(s.b_done_next)
        # the walk steps while U_RUN is the phase and no gradient-sum write is in flight:
        # ``u_issue`` is that AND as a register, set from both terms' next values (the
        # walk's counters then start from one flip-flop, not from the phase and dw_busy)
        in_u_run = s.ph.into(Phase.U_RUN) | (s.now[Phase.U_RUN] & ~s.ph.leaves(Phase.U_RUN))
        m.d.sync += s.u_issue.eq(in_u_run & ~(s.dw_fire | s.dw_q1))
        # the walk's position in a module of its own (mapped apart from the sequencer's
        # logic; the restart and the step never meet: the walk issues in U_RUN only)
        walk = own_module(m, "u_walk")
        with walk.If(u_restart):
            walk.d.sync += [s.u_row.eq(0), s.u_word.eq(0), s.u_word_end.eq(s.words_last == 0),
                            s.u_row_end.eq(s.d_in_last == 0)]
        with walk.If(s.u_issue):
            walk.d.sync += [s.u_word.eq(s.u_word + 1), s.u_word_end.eq(s.u_word == s.u_words_last_m1)]
            with walk.If(s.u_word_end):
                walk.d.sync += [s.u_word.eq(0), s.u_row.eq(s.u_row + 1), s.u_word_end.eq(s.words_last == 0),
                                s.u_row_end.eq(s.u_row == s.u_rows_last_m1)]
        with s.ph.block(Phase.U_RUN):
            with m.If(s.u_issue & s.u_word_end & s.u_row_end):
                s.go(Phase.U_DRAIN)
        with s.ph.block(Phase.U_DRAIN):
            # once the last word is written (and counted) the new version becomes current
            with m.If(~s.sgd.busy & ~s.u_q):      # u_q: a word entering the SGD pipeline now
                s.go(Phase.DECIDE)
                m.d.sync += s.cur_ver.eq(s.new_ver)
                m.d.comb += s.op_ended.eq(1)
                with m.If(s.is_async):
                    m.d.sync += s.b_done.eq(s.b_done_next)
                with m.Else():
                    m.d.sync += [s.f_loc.eq(0), s.b_loc.eq(0), s.ahead.eq(0), s.base.eq(s.step_base),
                                 s.f_mb.eq(s.step_base), s.b_mb.eq(s.step_b_mb),
                                 s.step_idx.eq(s.step_idx + 1)]
        with s.ph.block(Phase.DONE):
            s.go(Phase.IDLE)
            m.d.sync += s.running.eq(0)
            m.d.comb += self.done.eq(1)

    def _cycle_counters(self, m, s):
        """The phase register's next state and the cycle counters."""
        s.ph.finish()
        # the last U of a synchronous run is followed by a DECIDE that finds step_idx == steps
        with m.If(s.running):
            m.d.sync += s.busy_c.eq(s.busy_c + 1)
            with m.If(s.ph.flag["upd"]):
                m.d.sync += s.upd_c.eq(s.upd_c + 1)
        # a held core waits for data: that is idle time, not forward/backward time. These
        # counts step a cycle after the cycle they count (each step a register): the hold
        # is not in front of their adders; an op's last step lands a cycle after its last
        # RUN cycle, long before DONE, and none at a start, which finds them clear
        steps = {name: Signal(name=f"{name}_step") for name in ("fwd", "bwd", "wait")}
        m.d.sync += [steps["fwd"].eq(s.running & s.in_f & ~s.held),
                     steps["bwd"].eq(s.running & (s.in_dx | s.in_dw) & ~s.held),
                     steps["wait"].eq(s.running & s.held)]
        for name, count in (("fwd", s.fwd_c), ("bwd", s.bwd_c), ("wait", s.wait_c)):
            with m.If(steps[name]):
                m.d.sync += count.eq(count + 1)
        m.d.comb += [self.busy_cycles.eq(s.busy_c), self.fwd_cycles.eq(s.fwd_c),
                     self.bwd_cycles.eq(s.bwd_c), self.upd_cycles.eq(s.upd_c),
                     self.wait_cycles.eq(s.wait_c), self.mac_ops.eq(s.mac_ops),
                     self.saturations.eq(s.sats), self.ops_done.eq(s.ops_done)]
