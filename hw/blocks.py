"""Building blocks every unit shares: the run state machine, event counters, buffer
guards, buffer extent checks and a burst generator.

Each is a small :class:`~amaranth.lib.wiring.Component`; where data flows it is an
:mod:`amaranth.lib.stream` interface, so a unit wires them with ``connect()``:

* :class:`RunControl` — ``IDLE -> CHECK -> RUN [-> DRAIN] -> FINISH``, ``RUN -> ABORT ->
  FINISH`` and ``CHECK -> FINISH`` on a refused configuration; ``busy``/``idle``/``done``.
* :class:`EventCounters` — the performance counters: cleared at start, counting while busy.
* :class:`BufferGuard` — a burst ``[addr, addr + beats * bytes_per_beat)`` inside its buffer
  ``[base, base + size)`` and within one 4 KiB page (AXI A3.4.1).
* :class:`ExtentCheck` — a buffer of ``rows`` rows ``stride`` bytes apart, ``row_bytes``
  each: aligned, rows not overlapping, the whole extent ``(rows - 1) * stride + row_bytes``
  inside ``size`` and the address space; the product by shift-and-add (no DSP), over the
  cycles of the CHECK state.
* :class:`BurstGenerator` — a run of consecutive beats cut into INCR bursts of at most
  ``max_burst`` beats that never cross 4 KiB, one every two cycles.
* :class:`StreamRegister` — a register slice of one stream: no combinational path across.
* :class:`RegisteredFIFO` — a stream FIFO in block or LUT RAM whose ``level``, ``w.ready``
  and ``r.valid`` are flip-flops, each decided a cycle ahead.
* :class:`ElementReader` — ``count`` elements from memory: bursts from a
  :class:`BurstGenerator`, credits for every beat, the beats unpacked into an element stream.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .axi import BOUNDARY_BYTES, MAX_BURST_BEATS, SkidBuffer


class RunState(enum.Enum, shape=3):
    """States of :class:`RunControl`."""

    IDLE = 0
    CHECK = 1
    RUN = 2
    DRAIN = 3
    ABORT = 4
    FINISH = 5


class RunControl(wiring.Component):
    """The run state machine of a unit.

    ``IDLE`` waits for ``start``; ``CHECK`` lasts until ``check_done`` (the unit's
    configuration check runs while ``checking``) and goes to ``FINISH`` with a one-cycle
    ``config_error`` when ``check_error``, else to ``RUN``. ``RUN`` goes to ``ABORT`` on
    ``stop`` (a one-cycle ``aborting``), else, on ``finished``, to ``DRAIN`` (with
    ``drain``: until ``drained``, the last writes answered) or straight to ``FINISH``.
    ``ABORT`` waits for ``quiet`` (nothing in flight; ``abort_done`` pulses as it leaves).
    ``FINISH`` drops ``busy`` and pulses ``done``.

    Ports:
        start: In, one cycle, taken in ``IDLE`` (``accept`` pulses in that cycle: load the
            configuration, clear the status and the counters).
        check_done, check_error: In, the configuration check's verdict.
        stop: In, abort the run (in ``RUN``).
        finished: In, the run's work is issued and computed (in ``RUN``).
        drained: In, with ``drain``: the last write answered (in ``DRAIN``).
        quiet: In, nothing in flight (in ``ABORT``).
        busy, idle: Out, registered: from the cycle after ``start`` to ``FINISH``.
        done: Out, one cycle, in ``FINISH``.
        checking, running: Out, in ``CHECK``, in ``RUN`` (flip-flops).
        first: Out, the first cycle of ``RUN`` (launch the run's first requests).
        aborting, completing: Out, one cycle: ``RUN`` ends by ``stop``, by ``finished``.
        abort_done: Out, one cycle: ``ABORT`` ends.
        state: Out, the current :class:`RunState`.

    Args:
        drain: a ``DRAIN`` state between ``RUN`` and ``FINISH``.
        hold_first: ``finished`` is not taken in the first cycle of ``RUN`` (the unit's
            completion flags still hold the previous run's value then).
    """

    start: In(1)
    check_done: In(1)
    check_error: In(1)
    stop: In(1)
    finished: In(1)
    drained: In(1)
    quiet: In(1)
    busy: Out(1)
    idle: Out(1)
    done: Out(1)
    accept: Out(1)
    checking: Out(1)
    config_error: Out(1)
    running: Out(1)
    first: Out(1)
    aborting: Out(1)
    completing: Out(1)
    abort_done: Out(1)
    state: Out(RunState)

    def __init__(self, *, drain: bool = True, hold_first: bool = False):
        self.drain, self.hold_first = drain, hold_first
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        busy, first = Signal(), Signal(init=1)
        # CHECK, RUN, ABORT and FINISH as flip-flops of their own, set and cleared with the
        # state's transitions (IDLE is ~busy): every output is a flip-flop or one LUT of
        # flip-flops and inputs, never a decode of the state register (`checking` resets a
        # unit's whole datapath, `running` gates its traffic, `accept` loads its
        # configuration and clears its status)
        in_check, in_run, in_abort, in_finish = Signal(), Signal(), Signal(), Signal()
        finished = self.finished & ~first if self.hold_first else self.finished
        # RUN goes on (no stop, past the held first cycle): a kept net of flip-flops and
        # stop, so a late `finished` meets it in the last gate of `completing`
        run_on = Signal(name="run_on", attrs={"keep": 1})
        m.d.comb += run_on.eq(in_run & ~self.stop & (~first if self.hold_first else 1))
        m.d.comb += [
            self.busy.eq(busy), self.idle.eq(~busy),
            self.accept.eq(self.start & ~busy),
            self.checking.eq(in_check),
            self.config_error.eq(in_check & self.check_done & self.check_error),
            self.running.eq(in_run), self.first.eq(in_run & first),
            self.aborting.eq(in_run & self.stop),
            self.completing.eq(run_on & self.finished),
            self.abort_done.eq(in_abort & self.quiet),
            self.done.eq(in_finish),
        ]
        with m.FSM(name="run") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [busy.eq(1), in_check.eq(1)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(self.check_done):
                    m.d.sync += in_check.eq(0)
                with m.If(self.check_done & self.check_error):
                    m.d.sync += in_finish.eq(1)
                    m.next = "FINISH"
                with m.Elif(self.check_done):
                    m.d.sync += in_run.eq(1)
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.sync += first.eq(0)
                with m.If(self.stop | finished):
                    m.d.sync += in_run.eq(0)
                with m.If(self.stop):
                    m.d.sync += in_abort.eq(1)
                    m.next = "ABORT"
                with m.Elif(finished):
                    if self.drain:
                        m.next = "DRAIN"
                    else:
                        m.d.sync += in_finish.eq(1)
                        m.next = "FINISH"
            if self.drain:
                with m.State("DRAIN"):
                    with m.If(self.drained):
                        m.d.sync += in_finish.eq(1)
                        m.next = "FINISH"
            with m.State("ABORT"):
                with m.If(self.quiet):
                    m.d.sync += [in_abort.eq(0), in_finish.eq(1)]
                    m.next = "FINISH"
            with m.State("FINISH"):
                m.d.sync += [busy.eq(0), first.eq(1), in_finish.eq(0)]
                m.next = "IDLE"
        for state in RunState:
            if state.name in fsm.encoding:
                with m.If(fsm.ongoing(state.name)):
                    m.d.comb += self.state.eq(state)
        return m


class EventCounters(wiring.Component):
    """Performance counters: all zero on ``clear``, else each adds its increment while
    ``enable`` (a unit passes ``accept`` and ``busy`` of its :class:`RunControl`).

    Ports:
        clear: In, zero every counter (wins over ``enable``).
        enable: In, count this cycle.
        inc: In, a view with one field per counter: this cycle's increment.
        count: Out, a view with one field per counter: its value.

    Args:
        counters: ``{name: (counter bits, increment bits)}``, in register order.
    """

    def __init__(self, counters: dict[str, tuple[int, int]]):
        if not counters:
            raise ValueError("EventCounters needs at least one counter")
        for name, (width, inc) in counters.items():
            if not (isinstance(width, int) and isinstance(inc, int) and 1 <= inc <= width):
                raise ValueError(f"counter {name!r}: widths ({width!r}, {inc!r}) must be "
                                 f"integers with 1 <= increment bits <= counter bits")
        self.counters = dict(counters)
        super().__init__({
            "clear": In(1),
            "enable": In(1),
            "inc": In(data.StructLayout({n: inc for n, (_, inc) in counters.items()})),
            "count": Out(data.StructLayout({n: w for n, (w, _) in counters.items()})),
        })

    def elaborate(self, platform):
        m = Module()
        for name in self.counters:
            value = getattr(self.count, name)
            with m.If(self.clear):
                m.d.sync += value.eq(0)
            with m.Elif(self.enable):
                m.d.sync += value.eq(value + getattr(self.inc, name))
        return m


def burst_layout(addr_width: int) -> data.StructLayout:
    """One burst: byte address (beat aligned) and AxLEN (beats - 1); as ``dma.read_request_layout``."""
    return data.StructLayout({"addr": addr_width, "len": 8})


class BufferGuard(wiring.Component):
    """Whether a burst lies inside its buffer and within one 4 KiB page (combinational).

    Ports:
        addr, len: In, the burst (byte address, AxLEN = beats - 1).
        base, size: In, the buffer: bytes ``[base, base + size)``.
        inside: Out, ``base <= addr``, ``addr + (len + 1) * bytes_per_beat <= base + size``
            and no 4 KiB boundary inside the burst.

    Args:
        addr_width: address bits.
        bytes_per_beat: bytes of one beat, a power of two.
    """

    def __init__(self, addr_width: int, bytes_per_beat: int):
        if bytes_per_beat < 1 or bytes_per_beat & (bytes_per_beat - 1):
            raise ValueError(f"bytes_per_beat must be a power of two, not {bytes_per_beat!r}")
        self.addr_width, self.bytes_per_beat = addr_width, bytes_per_beat
        super().__init__({"addr": In(addr_width), "len": In(8), "base": In(addr_width),
                          "size": In(addr_width), "inside": Out(1)})

    def elaborate(self, platform):
        m = Module()
        shift = self.bytes_per_beat.bit_length() - 1
        burst_bytes = (self.len + 1) << shift
        end, limit = Signal(self.addr_width + 1), Signal(self.addr_width + 1)
        m.d.comb += [end.eq(self.addr + burst_bytes), limit.eq(self.base + self.size)]
        crosses = (self.addr[:12] + burst_bytes) > BOUNDARY_BYTES
        m.d.comb += self.inside.eq((self.addr >= self.base) & (end <= limit) & ~crosses)
        return m


class ExtentCheck(wiring.Component):
    """Sequential check of one strided buffer, over ``rows_width + 3`` cycles after ``start``.

    The buffer holds ``rows`` rows of ``row_bytes`` bytes, ``stride`` bytes apart, from
    ``base``; it is refused (``error``) when ``base`` or ``stride`` is not a multiple of
    ``bytes_per_beat``, rows overlap (``stride < row_bytes``, ``rows > 0``), or the extent
    ``(rows - 1) * stride + row_bytes`` exceeds ``size`` or ``base + size`` passes the
    address space. ``rows == 0`` needs nothing. The product comes from shift-and-add, one
    bit of ``rows - 1`` a cycle, MSB first; once it reaches ``2 ** addr_width`` (over every
    buffer, and it only grows) the next step clamps it to ``2 ** (addr_width + 1)``, so the
    verdict is exact and the clamp waits on a flip-flop's bits, not on the adder. No DSP.

    Ports:
        start: In, one cycle: load the operands (``base`` and ``size`` are registered
            there; the others must hold until ``done``).
        base, size, stride, rows, row_bytes: In, the buffer.
        done: Out, the verdict is ready (held until the next ``start``).
        error: Out, refused (valid with ``done``).
        extent: Out, the bytes the rows span (valid with ``done``; clamped).
    """

    def __init__(self, *, addr_width: int = 64, bytes_per_beat: int = 16, rows_width: int = 32,
                 stride_width: int = 64):
        if bytes_per_beat < 1 or bytes_per_beat & (bytes_per_beat - 1):
            raise ValueError(f"bytes_per_beat must be a power of two, not {bytes_per_beat!r}")
        if rows_width < 2:
            raise ValueError(f"rows_width must be at least 2, not {rows_width!r}")
        self.aw, self.bpb, self.rw = addr_width, bytes_per_beat, rows_width
        super().__init__({
            "start": In(1),
            "base": In(addr_width), "size": In(addr_width), "stride": In(stride_width),
            "rows": In(rows_width), "row_bytes": In(stride_width),
            "done": Out(1), "error": Out(1), "extent": Out(addr_width + 2),
        })

    def elaborate(self, platform):
        m = Module()
        aw, align = self.aw, self.bpb - 1
        clamp = 1 << (aw + 1)
        product = Signal(aw + 2, reset_less=True)
        multiplier = Signal(self.rw, reset_less=True)
        bits = Signal(range(self.rw + 1))
        need = Signal(aw + 3, reset_less=True)
        phase = Signal(range(4))      # 0 idle/done, 1 multiplying, 2 adding, 3 comparing
        # a stride of 2 ** addr_width or more spans every buffer with two rows (the rows
        # > 1 term below); the multiplier takes its low bits, so the product (below
        # 2 ** addr_width before each step) doubled and added stays in its width
        doubled = (Cat(Const(0, 1), product) + Mux(multiplier[-1], self.stride[:aw], 0))[:aw + 2]
        big = product[aw:].any()
        # the verdicts that need no product, registered while it is formed (the operands
        # hold from start): the last phase compares the extent with the size, nothing more
        # (each one in a register of its own: their OR is taken in the last phase)
        some, bad_early = Signal(reset_less=True), Signal(5, reset_less=True)
        # the buffer's base and size, registered at start: a caller's choice of them (a
        # gate, a mux) is not in series with the checks' adders and compares
        base = Signal(self.aw, name="base_q", reset_less=True)
        size = Signal(self.aw, name="size_q", reset_less=True)
        with m.If(self.start):
            m.d.sync += [product.eq(0), multiplier.eq(self.rows - 1), bits.eq(self.rw),
                         phase.eq(1), self.done.eq(0), base.eq(self.base), size.eq(self.size)]
        with m.Elif(phase == 1):
            m.d.sync += [product.eq(Mux(big, clamp, doubled)),
                         multiplier.eq(multiplier << 1), bits.eq(bits - 1)]
            with m.If(bits == 1):
                m.d.sync += phase.eq(2)
        with m.Elif(phase == 2):
            m.d.sync += [need.eq(product + self.row_bytes), phase.eq(3)]
        with m.Elif(phase == 3):
            m.d.sync += [self.error.eq(bad_early.any() | (some & (need > size))),
                         self.done.eq(1), phase.eq(0), self.extent.eq(Mux(some, need, 0))]
        # in two steps over the multiplying phase (``rows_width`` >= 2 cycles): the
        # compares, then the verdicts that AND two of them
        overlap, wide = Signal(reset_less=True), Signal(reset_less=True)
        many = Signal(reset_less=True)
        with m.If(phase == 1):
            m.d.sync += [some.eq(self.rows != 0), many.eq(self.rows > 1),
                         overlap.eq(self.stride < self.row_bytes), wide.eq(self.stride[aw:] != 0),
                         bad_early.eq(Cat((base & align) != 0, (self.stride & align) != 0,
                                          some & overlap, many & wide,
                                          (base + size) >> aw != 0))]
        return m


def burst_command_layout(addr_width: int, count_width: int = 32) -> data.StructLayout:
    """A run of consecutive beats: first byte address (beat aligned) and how many beats."""
    return data.StructLayout({"addr": addr_width, "beats": count_width})


def burst_out_layout(addr_width: int) -> data.StructLayout:
    """One burst of a run, and whether it is the run's last."""
    return data.StructLayout({"addr": addr_width, "len": 8, "last": 1})


class BurstGenerator(wiring.Component):
    """Cuts a run of beats into AXI INCR bursts, one every two cycles (each is planned from
    registers in one cycle and leaves in the next, its length a choice among registers).

    Each burst is the longest of: the beats left, ``max_burst``, the beats to the next
    4 KiB boundary. A run of zero beats gives no burst.

    Ports:
        cmd: In stream of :func:`burst_command_layout` (taken once the previous run's last
            burst has left: ``ready`` is a flip-flop).
        bursts: Out stream of :func:`burst_out_layout`.

    Args:
        addr_width, bytes_per_beat: the bus.
        max_burst: beats per burst, 1 .. 256.
        count_width: bits of ``cmd.beats``.
    """

    def __init__(self, *, addr_width: int = 64, bytes_per_beat: int = 16, max_burst: int = 16,
                 count_width: int = 32):
        if not 1 <= max_burst <= MAX_BURST_BEATS:
            raise ValueError(f"max_burst must be in 1..{MAX_BURST_BEATS}, not {max_burst!r}")
        if bytes_per_beat < 1 or bytes_per_beat & (bytes_per_beat - 1) or bytes_per_beat > 4096:
            raise ValueError(f"bytes_per_beat must be a power of two up to 4096, "
                             f"not {bytes_per_beat!r}")
        self.aw, self.bpb, self.max_burst, self.cw = addr_width, bytes_per_beat, max_burst, count_width
        super().__init__({
            "cmd": In(stream.Signature(burst_command_layout(addr_width, count_width))),
            "bursts": Out(stream.Signature(burst_out_layout(addr_width))),
        })

    def elaborate(self, platform):
        m = Module()
        shift, mb = self.bpb.bit_length() - 1, self.max_burst
        addr = Signal(self.aw, reset_less=True)
        left = Signal(self.cw, reset_less=True)
        left_m1 = Signal(self.cw, reset_less=True)        # left - 1, counted beside it
        has_left = Signal()                               # left != 0
        # a burst is planned in one cycle (registers in, registers out) and leaves in the
        # next, its length and beats chosen by the planned `last_r` among registers
        planned = Signal()
        cap_m1_r = Signal(range(mb), reset_less=True)     # min(page, max_burst) - 1
        cap_r = Signal(range(mb + 1), reset_less=True)    # min(page, max_burst)
        last_r = Signal(reset_less=True)                  # the beats left fit the cap
        # the beats to the page end minus one are the inverted beat address in the page
        page_m1 = ~addr[shift:12]
        if mb & (mb - 1) == 0 and 1 < mb and mb.bit_length() - 1 <= len(page_m1):
            k = mb.bit_length() - 1      # a power of two: page_m1 < mb - 1 from bits, no carry
            short = (page_m1[k:] == 0) & (page_m1[:k] != mb - 1)
        else:
            short = page_m1 < mb - 1
        cap_m1 = Signal(range(mb))
        m.d.comb += cap_m1.eq(Mux(short, page_m1, mb - 1))
        bits = len(cap_m1)
        # left <= the cap; a short page's cap fits `bits` bits, so the low compare does not
        # wait for the cap's mux
        low = left_m1[:bits]
        fits_full = Const(1) if mb == 1 << bits else low <= mb - 1
        last = (left_m1[bits:] == 0) & Mux(short, low <= page_m1[:bits], fits_full)
        beats_r = Mux(last_r, left[:len(cap_r)], cap_r)
        m.d.comb += [self.bursts.valid.eq(has_left & planned),
                     self.bursts.payload.addr.eq(addr),
                     self.bursts.payload.len.eq(Mux(last_r, left_m1[:bits], cap_m1_r)),
                     self.bursts.payload.last.eq(last_r),
                     self.cmd.ready.eq(~has_left)]
        leaving = self.bursts.valid & self.bursts.ready
        with m.If(self.cmd.valid & self.cmd.ready):
            beats = self.cmd.payload.beats
            m.d.sync += [addr.eq(self.cmd.payload.addr), left.eq(beats), left_m1.eq(beats - 1),
                         has_left.eq(beats != 0), planned.eq(0)]
        with m.Elif(leaving):
            m.d.sync += [addr.eq(addr + (beats_r << shift)), left.eq(left - beats_r),
                         left_m1.eq(left_m1 - beats_r), has_left.eq(~last_r), planned.eq(0)]
        with m.Elif(has_left & ~planned):
            m.d.sync += [planned.eq(1), last_r.eq(last), cap_m1_r.eq(cap_m1),
                         cap_r.eq(cap_m1 + 1)]
        return m


#: A register slice of one stream (no combinational path across, one element per cycle):
#: the AXI channels' :class:`~.axi.SkidBuffer`, under the name the stream blocks use.
StreamRegister = SkidBuffer


def up_down_counter(m: Module, limit: int, up, down, name: str):
    """A counter stepped by ``up`` and ``down`` pulses (both at once: it holds), kept beside
    its neighbours ``count + 1`` and ``count - 1`` as flip-flops: the pulses only choose
    among three registers, and each adder runs from flip-flops alone. (Written as
    ``count + 1`` and ``count - 1`` under two conditions, Yosys shares one adder whose
    operand the pulses select: a carry chain behind them.) Returns ``count``."""
    count = Signal(range(limit + 1), name=name)                      # from 0
    plus = Signal(len(count) + 1, init=1, name=f"{name}_plus")
    minus = Signal(len(count), init=(1 << len(count)) - 1, name=f"{name}_minus")   # wraps
    with m.If(up & ~down):
        m.d.sync += [count.eq(plus), plus.eq(plus + 1), minus.eq(count)]
    with m.Elif(down & ~up):
        m.d.sync += [count.eq(minus), plus.eq(count), minus.eq(minus - 1)]
    return count


#: the attribute of a register's copy (:func:`register_copies`) that the ECP5 timing flow
#: keeps apart from its equals (``gnnweave.hw.flow.estimate.KEEP_REGISTERS``)
COPY_ATTRIBUTE = "register_copy"


def register_copies(m: Module, value, copies: int, name: str) -> list[Signal]:
    """``copies`` registers that each take ``value`` every cycle (no reset), so that each
    drives a share of its loads: a net to hundreds of LUT RAM cells or multiplexers is
    the longest wire of a placed design. Synthesis merges equal registers back into one
    unless told not to (Yosys' ``opt_merge``, whatever the wire's attributes): each copy
    carries ``keep`` (Vivado keeps a register marked KEEP) and :data:`COPY_ATTRIBUTE`,
    which the ECP5 timing flow keeps."""
    regs = [Signal(Value.cast(value).shape(), name=f"{name}{k}", reset_less=True,
                   attrs={"keep": 1, COPY_ATTRIBUTE: 1}) for k in range(copies)]
    m.d.sync += [r.eq(value) for r in regs]
    return regs


def own_module(m: Module, name: str) -> Module:
    """A fresh :class:`Module`, submodule ``name`` of ``m``: logic written into it is a module
    of its own for Yosys, with the ports Amaranth infers from the signals it reads and
    drives.

    Yosys maps every module alone, and ABC relaxes a module's paths up to the deepest one
    in it: a decision of six flip-flops that one LUT can make is spread over several levels
    inside a large module, in front of the wide registers it enables. Alone, it is mapped as
    shallow as it is."""
    sub = Module()
    m.submodules[name] = sub
    return sub


def decision(m: Module, name: str, fn, **inputs):
    """``fn(**inputs)`` in a module of its own (:func:`own_module`) named ``name``, each
    input a port named like its keyword; returns the output."""
    ports = {k: Signal(len(Value.cast(v)), name=k) for k, v in inputs.items()}
    m.d.comb += [ports[k].eq(v) for k, v in inputs.items()]
    out = Signal(name="decision")
    own_module(m, name).d.comb += out.eq(fn(**ports))
    return out


def status_bit(status, flag: int):
    """The bit of a one-bit status ``flag`` in a unit's ``status`` register: an event sets
    it alone (``status_bit(status, Status.X).eq(1)``), so the bit's register sees no other
    bit's events, however deep their decisions."""
    return status[flag.bit_length() - 1]


def last_beat_flag(m: Module, step, beat, beat_plus_1, last, name: str):
    """``beat == last`` as a flip-flop, for a counter ``beat`` (kept beside ``beat_plus_1``)
    that ``step`` moves on and wraps to 0 after ``last``: each value the counter can take
    next is compared a cycle ahead, the compares are kept nets (``step``, a late
    handshake, only chooses among them; ABC builds no tree around them), and the flag has
    no reset (it follows the counter and ``last`` through a unit's CHECK). Returns it."""
    flag = Signal(name=name, reset_less=True)
    cand = {k: Signal(name=f"{name}_{k}", attrs={"keep": 1}) for k in ("one_beat", "next", "here")}
    m.d.comb += [cand["one_beat"].eq(last == 0), cand["next"].eq(beat_plus_1 == last),
                 cand["here"].eq(beat == last)]
    m.d.sync += flag.eq(Mux(step, Mux(flag, cand["one_beat"], cand["next"]), cand["here"]))
    return flag


class RegisteredFIFO(wiring.Component):
    """A first-in first-out queue of ``depth`` elements whose flags are all flip-flops.

    Unlike :class:`amaranth.lib.fifo.SyncFIFOBuffered`, whose ``w_rdy`` and inner read
    compare its level counter, whose counter steps through an adder the handshakes
    select, and whose ``level`` adds the output register's valid to it (carry chains and
    compares behind every producer and consumer), ``w.ready``, ``r.valid`` and ``level``
    here leave registers: each is set a cycle ahead from the ways its counter can go (the
    compares start from flip-flops, the producer's ``valid`` and the consumer's ``ready``
    only choose among them; the counters are :func:`up_down_counter`). The elements sit in
    a :class:`~amaranth.lib.memory.Memory` with a synchronous read port (block RAM or LUT
    RAM) behind one output register; an element written into an empty queue leaves two
    cycles later. One write and one read per cycle, ``depth`` elements at full throughput.

    Ports:
        w: In stream, the elements (``w.ready``: a flip-flop, room for one more).
        r: Out stream (``r.valid`` and ``r.payload`` from registers).
        level: Out, elements held (output register included), a register: the value after
            the last clock edge.

    Args:
        shape: the element's shape.
        depth: elements held, at least 1.
    """

    def __init__(self, shape, depth: int):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"RegisteredFIFO depth must be a positive integer, not {depth!r}")
        self.shape, self.depth = shape, depth
        super().__init__({
            "w": In(stream.Signature(shape)),
            "r": Out(stream.Signature(shape)),
            "level": Out(range(depth + 1)),
        })

    def _advance(self, pointer):
        """The next storage address after ``pointer`` (wrapping at ``depth``)."""
        if self.depth & (self.depth - 1) == 0:
            return (pointer + 1)[:len(pointer)]
        return Mux(pointer == self.depth - 1, 0, pointer + 1)

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        m.submodules.storage = storage = Memory(shape=self.shape, depth=depth, init=[])
        write, read = storage.write_port(), storage.read_port(domain="sync")
        produce, consume = Signal(range(depth)), Signal(range(depth))
        any_stored = Signal()                    # an element in the memory (not in r)
        w_ready = Signal(init=1)
        m.d.comb += self.w.ready.eq(w_ready)
        push = self.w.valid & w_ready
        pop = self.r.valid & self.r.ready
        fetch = any_stored & (~self.r.valid | self.r.ready)   # the memory -> r
        m.d.comb += [write.addr.eq(produce), write.data.eq(self.w.payload), write.en.eq(push),
                     read.addr.eq(consume), read.en.eq(fetch), self.r.payload.eq(read.data)]
        with m.If(push):
            m.d.sync += produce.eq(self._advance(produce))
        with m.If(fetch):
            m.d.sync += consume.eq(self._advance(consume))
        m.d.sync += self.r.valid.eq(fetch | (self.r.valid & ~pop))
        stored = up_down_counter(m, depth, push, fetch, "stored")
        level = up_down_counter(m, depth, push, pop, "level")
        m.d.comb += self.level.eq(level)
        with m.If(push & ~fetch):
            m.d.sync += any_stored.eq(1)
        with m.Elif(fetch & ~push):
            m.d.sync += any_stored.eq(stored != 1)
        with m.If(push & ~pop):
            m.d.sync += w_ready.eq(level != depth - 1)
        with m.Elif(pop & ~push):
            m.d.sync += w_ready.eq(1)
        return m


class BufferedFIFO(RegisteredFIFO):
    """A :class:`RegisteredFIFO` of ``width``-bit elements under the port names of
    :class:`amaranth.lib.fifo.SyncFIFOBuffered` (``w_en``, ``w_rdy``, ``w_data``, ``r_en``,
    ``r_rdy``, ``r_data``, ``level``), for logic written against amaranth's FIFOs: the
    same capacity and two-cycle latency, with every flag a flip-flop. (Its ``w_rdy`` may
    be high a cycle sooner than amaranth's, which counts the output register's element
    against its memory while it moves out.)"""

    def __init__(self, *, width: int, depth: int):
        super().__init__(width, depth)
        self.width = width
        self.w_en, self.w_rdy, self.w_data = self.w.valid, self.w.ready, self.w.payload
        self.r_en, self.r_rdy, self.r_data = self.r.ready, self.r.valid, self.r.payload


def read_response_layout(data_width: int) -> data.StructLayout:
    """One R beat routed to a read client (as :class:`~.dma.ReadPort` gives it)."""
    return data.StructLayout({"valid": 1, "data": data_width, "last": 1})


class ElementReader(wiring.Component):
    """Streams ``count`` elements of ``elem_width`` bits from a beat-aligned ``base``: a
    :class:`BurstGenerator` cuts the beats into bursts, a credit gate lets a burst out
    only when the beat FIFO (a :class:`RegisteredFIFO`) has room for all of it (so R is
    never stalled), and the beats are unpacked, least significant element first.

    Every decision starts from flip-flops: the bursts pass a register slice before the
    credit compare, the unpacker holds the current and the next beat in registers of its
    own, so the FIFO's pop is a flip-flop, and the element count's compares are flags set
    a cycle ahead. A burst every two cycles, an element
    every cycle.

    Ports:
        start: In, one cycle: latch ``base`` and ``count`` (while idle).
        base, count: In, the first byte (beat aligned) and the elements to read.
        request: Out stream of :func:`~.dma.read_request_layout` (for a read port client).
        response: In, :func:`read_response_layout`: this client's R beats.
        elements: Out stream, exactly ``count`` elements after each ``start``.
        done: Out, every element of the run delivered (from the second cycle after
            ``start``).

    Args:
        addr_width, data_width, elem_width: the bus and the element (``elem_width`` a
            multiple of 8 dividing ``data_width``).
        fifo_beats: beats the FIFO holds (and bursts in flight at most).
        max_burst: beats per burst, at most ``fifo_beats``.
    """

    def __init__(self, *, addr_width: int, data_width: int, elem_width: int,
                 fifo_beats: int = 32, max_burst: int = 16):
        if elem_width % 8 or data_width % elem_width:
            raise ValueError(f"elem_width {elem_width!r} must be a multiple of 8 dividing "
                             f"data_width {data_width!r}")
        if not 1 <= max_burst <= fifo_beats:
            raise ValueError(f"max_burst must be in 1..fifo_beats ({fifo_beats}), "
                             f"not {max_burst!r}")
        self.aw, self.dw, self.ew = addr_width, data_width, elem_width
        self.fifo_beats, self.max_burst = fifo_beats, max_burst
        request = data.StructLayout({"addr": addr_width, "len": 8})
        super().__init__({
            "start": In(1), "base": In(addr_width), "count": In(32),
            "request": Out(stream.Signature(request)),
            "response": In(read_response_layout(data_width)),
            "elements": Out(stream.Signature(elem_width)),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bpb, per_beat = self.dw // 8, self.dw // self.ew
        shift = bpb.bit_length() - 1
        m.submodules.bursts = bursts = BurstGenerator(
            addr_width=self.aw, bytes_per_beat=bpb, max_burst=self.max_burst, count_width=34)
        m.submodules.burst_slice = burst_slice = StreamRegister(burst_out_layout(self.aw))
        m.submodules.beats = beats = RegisteredFIFO(self.dw, self.fifo_beats)
        wiring.connect(m, bursts.bursts, burst_slice.i)

        # the run: its beats, from the count, into the generator's command register
        cmd_valid = Signal()
        with m.If(self.start):
            total = self.count * (self.ew // 8) + bpb - 1
            m.d.sync += [cmd_valid.eq(1), bursts.cmd.payload.addr.eq(self.base),
                         bursts.cmd.payload.beats.eq(total >> shift)]
        with m.Elif(bursts.cmd.ready):
            m.d.sync += cmd_valid.eq(0)
        m.d.comb += bursts.cmd.valid.eq(cmd_valid)

        # credit gate: a burst leaves when the FIFO has room for its beats
        credits = Signal(range(self.fifo_beats + 1), init=self.fifo_beats)
        head = burst_slice.o
        room = credits > head.payload.len
        m.d.comb += [self.request.valid.eq(head.valid & room),
                     self.request.payload.addr.eq(head.payload.addr),
                     self.request.payload.len.eq(head.payload.len),
                     head.ready.eq(self.request.ready & room)]
        issue = self.request.valid & self.request.ready
        fetched = beats.r.valid & beats.r.ready
        m.d.sync += credits.eq(credits - Mux(issue, head.payload.len + 1, 0) + fetched)
        m.d.comb += [beats.w.valid.eq(self.response.valid),
                     beats.w.payload.eq(self.response.data)]
        self._unpack(m, beats.r, per_beat)
        return m

    def _unpack(self, m, fifo_out, per_beat: int):
        """The current beat in a register, one element a cycle from it, and the next beat in
        a second register: the FIFO is popped whenever that one is free (a flip-flop), never
        from the consumer's ready. ``elements.valid`` is the current beat's flip-flop (the
        run's beats hold exactly its elements: its last element frees the last beat). Every
        compare is a flag kept a cycle ahead (``elems_left == 2``, ``sel == per_beat - 2``),
        the beat's end and the two beat valids are written as the few-input functions they
        are, and the beat registers' enable is a signal of its own, so no decision shares
        the nets that enable a whole beat of registers."""
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
        # count < 4, taken every cycle: at `loading` it is the loaded count's, so the
        # count's flags need its two low bits and this flip-flop, not a 32-bit compare
        count_small = Signal()
        m.d.sync += [loading.eq(self.start), count_small.eq(self.count[2:] == 0)]
        with m.If(self.start):
            m.d.sync += [elems_left.eq(self.count), sel.eq(0),
                         sel_before_last.eq(per_beat == 2),
                         at_end.eq(one_per_beat | last_elem)]
        with m.Elif(loading):
            # the count's flags from the loaded count (no element arrives this early)
            low = elems_left[:2]
            m.d.sync += [has_elems.eq(~count_small | (low != 0)),
                         last_elem.eq(count_small & (low == 1)),
                         left_is2.eq(count_small & (low == 2)),
                         left_is3.eq(count_small & (low == 3)),
                         at_end.eq(one_per_beat | (count_small & (low == 1)))]
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
