"""The training Pipeline as a unit of the accelerator: :class:`~.pipeline.Pipeline` (``K``
chained :class:`~.train_stage.TrainStage` s) behind an AXI4 memory front end.

``PipelineUnitCore`` has the contract of every unit (:mod:`.accelerator`): an AXI4 manager
``bus``, ``cfg``/``stat`` dicts, ``start``/``idle``/``done``. The memory plumbing is the
Aggregator's and the MacArray's (:class:`~.dma.ReadPort` with one guarded client per buffer,
:class:`~.dma.WritePort`); numerics are the Pipeline's, so a run is
:class:`gnnweave.golden.pipeline.GoldenPipeline` bit for bit.

Modes (``pipe_mode``, :class:`PipelineMode`)
--------------------------------------------
``LOAD_WEIGHTS``  stage ``stage``'s master weights ``[d_in, d_out]`` (int32, the master
                  format, rows ``w_stride`` bytes apart from ``w_addr``) into the stage
                  (through its ``s<i>_w_*`` port; the MAC weights are narrowed from them),
                  and the stage's SGD velocity cleared (``s<i>_v_*`` port): a fresh start.
                  Elements past ``d_out`` in a row's last word are loaded as 0.
``STORE_WEIGHTS`` the same matrix from the stage to memory (WSTRB covers only its bytes).
``TRAIN``         ``steps`` steps of ``microbatches`` microbatches under ``schedule``
                  (0 GPipe, 1 1F1B-flush, 2 async 1F1B), ``N = steps * microbatches``.

TRAIN memory layout (int16, row-major, every base and stride bus-aligned): microbatch ``i``'s
row ``r`` is row ``i * rows + r`` of a ``[N * rows, d]`` matrix: ``act`` the inputs
(``d = s0_d_in``), ``logits`` the last stage's outputs (``d = s<K-1>_d_out``; written),
``grad`` the loss gradient of the logits (``d = s<K-1>_d_out``; written by the host),
``dx`` stage 0's input gradient (``d = s0_d_in``; written only when ``dx_addr`` is not 0).

The loss gradient doorbell
--------------------------
The host computes the loss gradient from the logits while the unit runs, so:
``logits_done`` (status) counts microbatches whose logits are in memory (every write
response in, in microbatch order); the host reads them, writes that microbatch's gradient
rows and raises ``grads_ready`` (a configuration register, read live while the unit runs:
the control slave takes register writes whatever the engine does) to the number of
microbatches whose gradient is in memory. The unit reads a microbatch's gradient only
while its index is below ``grads_ready``, in the last stage's backward order (GPipe:
a step's microbatches in reverse). ``grad_wait_cycles`` counts the cycles it waited for
the host. A host that never raises ``grads_ready`` gets a run that never finishes (the
driver's timeout reports it; its ``recover()`` resets the accelerator).

Per stage ``s<i>_<name>``: ``d_in``, ``d_out`` (``s<i>_d_out`` must equal ``s<i+1>_d_in``),
``relu``, the three narrowing shifts, ``lr``/``wd``/``mu`` (raw SGD hyper-parameters) and
``dx_first``; the microbatch ``rows`` are one register for all stages (a stage cannot have
other rows than its neighbour). Counters per stage are the TrainStage's; unit counters
are ``busy_cycles``, ``read_beats``, ``write_beats``, ``stall_cycles`` (as the
Aggregator's) and ``grad_wait_cycles``.

Refused configurations (CONFIG_ERROR, before any memory traffic): a mode over 2; for the
weight modes a ``stage`` outside the build, a zero or too large ``d_in``/``d_out``, a
misaligned base or stride, a stride shorter than a row, a buffer smaller than the
matrix or reaching past the address space; for TRAIN a schedule over 2, ``microbatches``
outside 1..255, ``steps`` outside 1..65535, ``rows`` outside 1..max_rows, GPipe with more
microbatches than the stages' activation slots, any stage dimension zero, over the build
or not chaining, a flag over 1, a shift over 63, a hyper-parameter over 16 bits, and any
of the four buffers (``dx`` only when used) misaligned or too small. A read outside its
buffer is refused by the port guard and a write outside its buffer is dropped, with every
write after it (ADDR_FAULT: the run stops a cycle later and is aborted once its traffic is
in, and the Pipeline is reset, so the host must load the weights again), so no access
leaves the configured buffers whatever the register values. Status bits share the other units' positions: bit0 config_error,
bit3 addr_fault, bit4 axi_error.

State kept between runs: master weights and MAC weights (loaded/stored by the weight
modes), and the SGD velocity (a TRAIN continues the momentum of the previous one, as a
reused ``GoldenPipeline`` object does; LOAD_WEIGHTS clears it, as a new one starts). The
weight-gradient sums are zero after every completed step; a run aborted mid-step (or a
reset) leaves a partial sum behind, which LOAD_WEIGHTS clears with the words it writes (the
TrainStage zeroes a word's sum on every host weight write), so reload the weights after
a failed run (the driver's ``train_pipeline(weights=...)`` does).

Build limits: ``lanes`` a power of two whose master word (``lanes`` x 32 bits) fits one bus
beat; ``max_in``/``max_out``/``max_rows``/``slots`` powers of two; ``slots >= stages`` and
``versions >= stages + 2`` (1F1B and async 1F1B at every microbatch count).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Elaboratable, Module, Mux, ResetInserter, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.memory import Memory

from .axi import BOUNDARY_BYTES, SkidBuffer, UnitCore, unit_bus
from .blocks import BufferedFIFO, ExtentCheck, RunControl, decision, own_module, status_bit
from .dma import ReadPort, WritePort
from .pipeline_writer import BandWriter, CheckedWriteQueue, WriteCompletion
from .mac import MAC_INPUT_WIDTH, MacBusParams
from .serial_multiply import SerialMultiplier
from .pipeline import STAGE_COUNTERS, Pipeline
from gnnweave.contract import PIPELINE_STAGE_REGISTERS as STAGE_REGISTERS
from gnnweave.contract import IpParameters, PipelineStatus as Status  # noqa: F401
from gnnweave.contract import pipeline_config_registers as config_registers
from gnnweave.contract import pipeline_status_registers as status_registers
from .top import UnitTop

ELEM_BYTES = MAC_INPUT_WIDTH // 8
#: Master weights in memory: int32 (the TrainStage's default master format, Q8.24).
MASTER_BYTES = 4
#: Build limits the driver checks before touching the device; the ``.hwh`` carries each as
#: the IP parameter ``C_PIPE_<NAME>`` (0 in a build without a Pipeline).
HWH_LIMITS = IpParameters.PIPELINE_LIMITS


def _is_pow2(x: int) -> bool:
    return x >= 1 and not x & (x - 1)


class PipelineMode(enum.Enum, shape=2):
    """Value of the ``pipe_mode`` register."""

    LOAD_WEIGHTS = 0
    STORE_WEIGHTS = 1
    TRAIN = 2


@dataclass(frozen=True)
class PipelineUnitConfig(MacBusParams):
    """Build-time parameters of one Pipeline unit."""

    stages: int = 2
    lanes: int = 4           # MAC array edge of each stage (and elements per stream segment)
    max_in: int = 16         # largest d_in of a stage
    max_out: int = 16        # largest d_out of a stage
    max_rows: int = 16       # largest microbatch
    slots: int = 8           # activation stash slots per stage (GPipe: microbatches <= slots)
    versions: int = 4        # MAC weight versions per stage (async 1F1B weight stashing)
    bus_width: int = 128
    addr_width: int = 64
    max_burst: int = 16
    fifo_beats: int = 32     # per read buffer: beats in flight or waiting for the Pipeline
    #: Master weights, SGD velocity and weight-gradient sums of every stage in UltraRAM
    #: (``ram_style = "ultra"``; UltraScale+ parts with URAM: ZCU104, KV260, Alveo), else in
    #: block RAM. Each is ``max_in * max_out / lanes`` words of ``lanes * 32`` bits.
    uram: bool = False

    def __post_init__(self):
        def bad(msg):
            raise ValueError(f"PipelineUnitConfig.{msg}")
        if not 1 <= self.stages <= 8:
            bad(f"stages must be in 1..8, got {self.stages}")
        self.check_bus()
        if not _is_pow2(self.lanes) or self.lanes * 8 * MASTER_BYTES > self.bus_width:
            bad(f"lanes must be a power of two with lanes * 32 <= bus_width ({self.bus_width}), "
                f"got {self.lanes}")
        for name in ("max_in", "max_out", "max_rows", "slots"):
            v = getattr(self, name)
            if not _is_pow2(v):
                bad(f"{name} must be a power of two, got {v}")
        for name in ("max_in", "max_out"):
            if not self.lanes <= getattr(self, name) <= 4096:
                bad(f"{name} must be in lanes ({self.lanes}) .. 4096, got {getattr(self, name)}")
        if self.max_rows > 4096:
            bad(f"max_rows must be <= 4096, got {self.max_rows}")
        if self.slots < self.stages:
            bad(f"slots must be >= stages ({self.stages}) for 1F1B, got {self.slots}")
        if self.versions < self.stages + 2:
            bad(f"versions must be >= stages + 2 ({self.stages + 2}) for async 1F1B, "
                f"got {self.versions}")
        if not 1 <= self.max_burst <= 256 or self.max_burst > self.fifo_beats:
            bad(f"max_burst must be in 1..min(256, fifo_beats={self.fifo_beats}), got {self.max_burst}")

    def stage_memories(self) -> dict[str, tuple[int, int, int]]:
        """The on-chip memories of one stage outside its MAC core, ``{name: (count, depth,
        width in bits)}``; the unit holds ``stages`` of each. ``master``, ``velocity`` and
        ``grad_sum`` (in URAM with :attr:`uram`) are ``max_in * max_out / lanes`` words of
        ``lanes`` 32-bit elements; the MAC weights (``versions`` slots of ``max_in`` rows,
        rounded up to a power of two), stashed activations (``slots`` microbatches) and
        gradients (two microbatches) are ``lanes`` skewed banks of 16-bit elements; the
        ReLU mask holds one bit per stashed output element."""
        L, di, do, rm = self.lanes, self.max_in, self.max_out, self.max_rows
        version_rows = 1 << (self.versions * di - 1).bit_length()
        state = (1, di * do // L, 8 * MASTER_BYTES * L)
        return {
            "master": state, "velocity": state, "grad_sum": state,
            "weights": (L, version_rows * do // L, MAC_INPUT_WIDTH),
            "activations": (L, self.slots * rm * di // L, MAC_INPUT_WIDTH),
            "gradients": (L, 2 * rm * do // L, MAC_INPUT_WIDTH),
            "relu_mask": (1, self.slots * rm * do // L, L),
        }

    def stage_kwargs(self) -> dict:
        """The arguments of each :class:`~.train_stage.TrainStage` (its default formats:
        the bench's)."""
        return dict(lanes=self.lanes, max_dim=max(self.max_in, self.max_out), max_in=self.max_in,
                    max_out=self.max_out, max_rows=self.max_rows, slots=self.slots,
                    versions=self.versions, state_ram_style="ultra" if self.uram else None)

    def pipeline(self) -> Pipeline:
        """The Pipeline this unit wraps."""
        return Pipeline(self.stages, **self.stage_kwargs())


#: The registers of the default build (two stages).
CONFIG_REGISTERS = config_registers(PipelineUnitConfig().stages)
STATUS_REGISTERS = status_registers(PipelineUnitConfig().stages)


def pipeline_unit_regmap(config: PipelineUnitConfig = PipelineUnitConfig()):
    """The register map of the Pipeline unit alone (:class:`PipelineUnitTop`)."""
    from .regmap import RegisterBuilder
    return RegisterBuilder.unit(PIPELINE_UNIT_TOP, config_registers(config.stages),
                                status_registers(config.stages))


class RowReader(Elaboratable):
    """Reads ``nrows`` rows of ``row_beats`` beats (``stride`` bytes apart from ``base``)
    through one :class:`~.dma.ReadPort` client into a beat FIFO, with INCR bursts of at most
    ``max_burst`` beats that never cross 4 KiB. Room in the FIFO is reserved when a burst
    is issued, so R is never back-pressured. ``start`` (one cycle) latches a job (``nrows``
    and ``row_beats`` steady from the cycle before it, ``base`` and ``stride`` at it); ``issued``
    is high once every burst of it went out (a new job may start while its beats are still
    in the FIFO). The consumer reads ``data`` while ``valid`` and pulses ``pop``.

    ``data`` is the head of a two-beat buffer behind the FIFO, which moves a beat over
    whenever its second entry is free (a register): the consumer's ``pop`` reaches only
    that buffer, not the FIFO's level or the credits, and a beat can still be taken every
    cycle.

    A burst is decided in one cycle (its length and whether it ends the row, into
    registers) and requested in the next, so a burst leaves at most every other cycle: no
    path runs from the request's handshake through the length arithmetic. The beats to
    the 4 KiB boundary and the next row's address are kept as registers, stepped by the
    burst issued, so no wide adder lies in the decision."""

    def __init__(self, request, response, *, addr_width: int, bus_width: int, max_burst: int,
                 fifo_beats: int):
        self.request, self.response = request, response
        self.addr_width, self.bus_width = addr_width, bus_width
        self.max_burst, self.fifo_beats = max_burst, fifo_beats
        self.beats = BufferedFIFO(width=bus_width, depth=fifo_beats)
        self.start = Signal()
        self.base = Signal(addr_width)
        self.stride = Signal(addr_width)
        self.nrows = Signal(40)
        self.row_beats = Signal(16)
        self.pop = Signal()
        self.valid = Signal()
        self.data = Signal(bus_width)
        self.issued = Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.beats = beats = self.beats
        # the output buffer: head (what the consumer sees) and spare; a beat leaves the FIFO
        # while the spare is free, so the FIFO's read depends on registers only
        head, spare = Signal(self.bus_width, reset_less=True), Signal(self.bus_width, reset_less=True)
        has_head, has_spare = Signal(), Signal()
        fetch = Signal()
        m.d.comb += [fetch.eq(beats.r_rdy & ~has_spare), beats.r_en.eq(fetch),
                     self.valid.eq(has_head), self.data.eq(head)]
        with m.If(self.pop | ~has_head):
            m.d.sync += head.eq(Mux(has_spare, spare, beats.r_data))
        with m.If(~has_spare):
            m.d.sync += spare.eq(beats.r_data)
        with m.If(has_head):
            m.d.sync += [has_head.eq(~self.pop | has_spare | fetch),
                         has_spare.eq(Mux(has_spare, ~self.pop, fetch & ~self.pop))]
        with m.Else():
            m.d.sync += has_head.eq(fetch)
        aw, bpb, mb = self.addr_width, self.bus_width // 8, self.max_burst
        beat_bits = bpb.bit_length() - 1
        page_beats = BOUNDARY_BYTES // bpb
        stride = Signal(aw, reset_less=True)
        row_beats = Signal(16, reset_less=True)
        addr = Signal(aw, reset_less=True)           # the next burst's address
        next_row = Signal(aw, reset_less=True)       # the next row's first byte
        remain = Signal(16, reset_less=True)         # beats of the row not yet requested
        to_page = Signal(range(page_beats + 1), reset_less=True)   # beats to the boundary
        rows_left = Signal(40)
        active = Signal()                            # rows are left to request
        last_row = Signal()                          # the row being requested is the last
        decided = Signal()                           # burst, row_end hold the next burst
        burst = Signal(range(mb + 1), reset_less=True)
        burst_len = Signal(8, reset_less=True)       # burst - 1 (AxLEN)
        row_end = Signal(reset_less=True)
        credits = Signal(range(self.fifo_beats + 1), init=self.fifo_beats)
        # credits >= burst, a register: from the decision's credits, then the count of the
        # cycle before (credits only grow while a decided burst waits, so it is never
        # early); the request's valid is one LUT from flip-flops
        enough = Signal()
        # the job has rows and beats, a register (no compare of the counts at start); no
        # reset, so a start in the cycle after a reset finds it current (its OR of 56 bits
        # mapped apart from the reader's arithmetic)
        nonempty = Signal(name="nonempty", reset_less=True)
        nonempty_next = Signal(name="nonempty_next")
        own_module(m, "nonempty_decision").d.comb += nonempty_next.eq(
            (self.row_beats != 0) & (self.nrows != 0))
        m.d.sync += nonempty.eq(nonempty_next)

        # the decision: min(remain, to_page, max_burst), its compares side by side
        page_short = to_page < mb
        capped = Mux(page_short, to_page, mb)
        remain_shorter = Mux(page_short, remain <= to_page, remain <= mb)
        fire = Signal()
        # (enough's cone, compares of the credits, is mapped apart from the reader's wider
        # arithmetic, which ABC would otherwise relax it to)
        enough_next = Signal(name="enough_next")
        own_module(m, "enough_decision").d.comb += enough_next.eq(Mux(
            ~decided, Mux(remain_shorter, credits >= remain,
                          Mux(page_short, credits >= to_page, credits >= mb)),
            ~fire & (credits >= burst)))
        with m.If(active & ~decided):
            m.d.sync += [decided.eq(1), burst.eq(Mux(remain_shorter, remain, capped)),
                         burst_len.eq(Mux(remain_shorter, remain - 1, capped - 1)),
                         row_end.eq(remain_shorter), last_row.eq(rows_left == 1)]
        with m.If(active | decided):
            m.d.sync += enough.eq(enough_next)

        m.d.comb += [
            self.request.valid.eq(active & decided & enough),
            self.request.payload.addr.eq(addr),
            self.request.payload.len.eq(burst_len),
            self.issued.eq(~active),
        ]
        # the issue, and whether it ends its row or not: decisions of their own, one LUT of
        # flip-flops and the request's ready each, the enables of the wide position registers
        issue = {"active": active, "decided": decided, "enough": enough, "ready": self.request.ready}

        def issued(active, decided, enough, ready):
            return active & decided & enough & ready
        m.d.comb += fire.eq(decision(m, "fire", issued, **issue))
        fire_row_end = decision(m, "fire_row_end", lambda row_end, **k: issued(**k) & row_end,
                                **issue, row_end=row_end)
        fire_in_row = decision(m, "fire_in_row", lambda row_end, **k: issued(**k) & ~row_end,
                               **issue, row_end=row_end)
        next_page = (BOUNDARY_BYTES - next_row[:12]) >> beat_bits
        with m.If(fire):
            m.d.sync += decided.eq(0)
        with m.If(fire_row_end):
            m.d.sync += [addr.eq(next_row), next_row.eq(next_row + stride),
                         to_page.eq(next_page), remain.eq(row_beats),
                         rows_left.eq(rows_left - 1), active.eq(~last_row)]
        with m.If(fire_in_row):
            # a burst that reaches the boundary starts the next page
            m.d.sync += [addr.eq(addr + (burst << beat_bits)), remain.eq(remain - burst),
                         to_page.eq(Mux(to_page == burst, page_beats, to_page - burst))]
        m.d.sync += credits.eq(credits - Mux(fire, burst, 0) + fetch)
        m.d.comb += [beats.w_en.eq(self.response.valid), beats.w_data.eq(self.response.data)]
        with m.If(self.start):
            m.d.sync += [addr.eq(self.base), next_row.eq(self.base + self.stride),
                         stride.eq(self.stride), row_beats.eq(self.row_beats),
                         remain.eq(self.row_beats), decided.eq(0),
                         to_page.eq((BOUNDARY_BYTES - self.base[:12]) >> beat_bits),
                         rows_left.eq(self.nrows), active.eq(nonempty)]
        return m


class _RunSizes:
    """A TRAIN or weights run's sizes, computed once in CHECK with bit-serial multipliers
    (no DSP, no wide multiply on any path): ``n_total`` (microbatches * steps),
    ``n_rows`` (``n_total * rows``), per backward-ordered buffer the bytes of a microbatch
    (``mb_bytes``), the offset of a step's last microbatch (``last_off``) and the address
    steps of the backward order (``inner_delta`` within a step, ``step_delta`` into the
    next), and per buffer an :class:`~.blocks.ExtentCheck` (:meth:`buffer_bad`). ``start``
    (one cycle, CHECK's first) begins; ``ready`` rises once every size and the registered
    configuration check that reads them are valid (about 75 cycles)."""

    def __init__(self, m: Module, cfg: dict, c, stages: int):
        aw = c.addr_width
        self.start, self.started, self.ready = Signal(), Signal(), Signal()
        self.filled = Signal()    # the row offset tables are written
        self.filled_q = Signal(name="sizes_filled_q")   # the same, a cycle later
        mbs, steps, rows = cfg["microbatches"][:8], cfg["steps"][:16], cfg["rows"][:13]
        sel = cfg["stage"]
        # the selected stage's input dimension, registered (the configuration is steady
        # from start; the weights' extent check reads it tens of cycles later)
        sel_d_in = Signal(32, name="sizes_sel_d_in", reset_less=True)
        m.d.sync += sel_d_in.eq(Array(cfg[f"s{i}_d_in"] for i in range(stages))[sel[:3] if stages > 1 else 0])
        # (a register: it selects hundreds of bits of the address steps below)
        gpipe = Signal(name="sizes_gpipe")
        m.d.sync += gpipe.eq(cfg["schedule"] == 0)
        self.m, self.cfg, self.aw, self.align = m, cfg, aw, c.bytes_per_beat - 1
        self.beat_bits = c.bytes_per_beat.bit_length() - 1

        def mul(name, a_width, b_width):
            sm = SerialMultiplier(a_width, b_width)
            m.submodules[f"size_{name}"] = sm
            return sm
        # phase 1: N, microbatch bytes; 2: N * rows, last offsets; 3: each buffer's extent
        # check (aligned, rows apart, the rows' span inside the buffer and the address space)
        n = mul("n_total", 16, 8)
        mb = {b: mul(f"{b}_mb_bytes", aw, 13) for b in ("logits", "grad", "dx")}
        n_rows = mul("n_rows", 24, 13)
        last = {b: mul(f"{b}_last_off", aw + 13, 8) for b in ("grad", "dx")}
        self.extent = {}
        for b in ("act", "logits", "grad", "dx", "w"):
            check = ExtentCheck(addr_width=aw, bytes_per_beat=c.bytes_per_beat,
                                rows_width=16 if b == "w" else 37, stride_width=len(cfg[f"{b}_stride"]))
            m.submodules[f"{b}_extent"] = self.extent[b] = check
            m.d.comb += [check.base.eq(cfg[f"{b}_addr"]), check.size.eq(cfg[f"{b}_size"]),
                         check.stride.eq(cfg[f"{b}_stride"]),
                         check.rows.eq(sel_d_in if b == "w" else n_rows.product)]
        phase = Signal(range(7))
        first = [n, *mb.values()]
        second = [n_rows, *last.values()]
        m.d.comb += [n.a.eq(steps), n.b.eq(mbs)]
        m.d.comb += [x.a.eq(cfg[f"{b}_stride"]) for b, x in mb.items()]
        m.d.comb += [x.b.eq(rows) for x in mb.values()]
        m.d.comb += [n_rows.a.eq(n.product), n_rows.b.eq(rows)]
        m.d.comb += [x.a.eq(mb[b].product) for b, x in last.items()]
        m.d.comb += [x.b.eq(mbs - 1) for x in last.values()]
        # each phase ends a cycle after its parts are done, from a register (a part's done
        # is a compare; the next phase's start reaches hundreds of enables): the register
        # of a phase is set only in that phase, so a done left from before never counts
        groups = {1: first, 2: second, 3: list(self.extent.values())}
        done = {p: Signal(name=f"sizes_phase{p}_done") for p in groups}
        m.d.sync += [done[p].eq((phase == p) & Cat(*(x.done for x in ms)).all()) for p, ms in groups.items()]
        # the starts of the second and third groups (each reaches a few hundred enables): a
        # decision of its own each, one LUT of the start, the phase and its done
        starts = {p: decision(m, f"sizes_start{p + 1}",
                              lambda start, phase, done, p=p: ~start & (phase == p) & done,
                              start=self.start, phase=phase, done=done[p]) for p in (1, 2)}
        m.d.comb += [x.start.eq(starts[1]) for x in second]
        m.d.comb += [x.start.eq(starts[2]) for x in self.extent.values()]
        with m.If(self.start):
            m.d.sync += [phase.eq(1), self.started.eq(1)]
            m.d.comb += [x.start.eq(1) for x in first]
        with m.Elif(phase == 1):
            with m.If(done[1]):
                m.d.sync += phase.eq(2)
        with m.Elif(phase == 2):
            with m.If(done[2]):
                m.d.sync += phase.eq(3)
        with m.Elif(phase == 3):
            with m.If(done[3]):
                m.d.sync += phase.eq(4)
        with m.Elif(phase == 4):       # the derived sizes below and the check are registers
            m.d.sync += phase.eq(5)
        with m.Elif(phase == 5):       # (the check in two register stages)
            m.d.sync += phase.eq(6)
        with m.Elif(self.ready):
            m.d.sync += [phase.eq(0), self.started.eq(0)]
        # ready from registers only, not behind start (which is low from phase 1 on: start
        # is held while ~started, and started is set with the phase)
        m.d.comb += self.ready.eq((phase == 6) & self.filled_q)
        self.n_total = n.product
        self.n_rows = n_rows.product
        self.mb_bytes = {b: x.product for b, x in mb.items()}
        self.last_off = {b: x.product for b, x in last.items()}
        self.inner_delta, self.step_delta = {}, {}
        for b in ("grad", "dx"):
            # GPipe walks a step's microbatches down, then jumps to the next step's last
            self.inner_delta[b] = Signal(aw + 40, name=f"{b}_inner_delta")
            self.step_delta[b] = Signal(aw + 40, name=f"{b}_step_delta")
            m.d.sync += [self.inner_delta[b].eq(Mux(gpipe, -self.mb_bytes[b], self.mb_bytes[b])),
                         self.step_delta[b].eq(Mux(gpipe, self.mb_bytes[b] + (self.last_off[b] << 1),
                                                   self.mb_bytes[b]))]
        # row offsets (row * stride) of the written buffers, a table filled in CHECK by
        # repeated addition (rows entries, one a cycle, beside the multipliers)
        self.tables = {}
        fill_row = Signal(range(c.max_rows + 1))
        # the rows left to write, counted down from the run's row count (the configuration
        # is loaded by start), and whether one is left: filled is set a row ahead from
        # that flag, so no compare is in front of the tables' write enables, and the flag
        # is a compare of the count's own flip-flops
        rows = Mux(cfg["rows"] > c.max_rows, c.max_rows, cfg["rows"])
        # (the clamped count is 0, or 1, exactly when the configured one is: the flags
        # compare the configuration's flip-flops, not the clamp)
        rows_zero = cfg["rows"] == 0
        rows_one = (cfg["rows"] == 1) if c.max_rows > 1 else ~rows_zero
        fill_left = Signal(range(c.max_rows + 1), name="sizes_fill_left", reset_less=True)
        fill_one = Signal(name="sizes_fill_one", reset_less=True)
        filled = self.filled
        with m.If(self.start):
            m.d.sync += [fill_left.eq(rows), fill_one.eq(rows_one), filled.eq(rows_zero)]
        with m.Elif(self.started & ~filled):
            m.d.sync += [fill_left.eq(fill_left - 1), fill_one.eq(fill_left == 2),
                         filled.eq(fill_one)]
        # the same, a cycle later, for ready (which ends CHECK): no compare in front of the
        # run control (the tables fill in `rows` cycles, the phases take longer)
        m.d.sync += self.filled_q.eq(filled)
        for b in ("logits", "dx"):
            table = Memory(shape=aw + 13, depth=c.max_rows, init=[])
            m.submodules[f"{b}_row_offsets"] = table
            wp = table.write_port()
            self.tables[b] = table.read_port(domain="comb")
            acc = Signal(aw + 13, name=f"{b}_row_offset_acc", reset_less=True)
            m.d.comb += [wp.addr.eq(fill_row), wp.data.eq(acc), wp.en.eq(self.started & ~filled)]
            with m.If(self.start):
                m.d.sync += acc.eq(0)
            with m.Elif(self.started & ~filled):
                m.d.sync += acc.eq(acc + cfg[f"{b}_stride"])
        with m.If(self.start):
            m.d.sync += fill_row.eq(0)
        with m.Elif(self.started & ~filled):
            m.d.sync += fill_row.eq(fill_row + 1)

    def row_offset(self, module, buf, row):
        """``row * stride`` of ``buf`` (rows below ``rows``), read from its table."""
        rp = self.tables[buf]
        module.d.comb += rp.addr.eq(row)
        return rp.data

    def buffer_bad(self, buf, cols, elem_bytes):
        """The buffer cannot hold the run's rows of ``cols`` elements (or is misaligned):
        its :class:`~.blocks.ExtentCheck`'s verdict, for rows of whole beats."""
        row_bytes = Signal(32, name=f"{buf}_row_bytes")
        self.m.d.sync += row_bytes.eq(((cols * elem_bytes + self.align) >> self.beat_bits) << self.beat_bits)
        self.m.d.comb += self.extent[buf].row_bytes.eq(row_bytes)
        return self.extent[buf].error


class PipelineUnitCore(UnitCore):
    """The Pipeline without its control slave: ``cfg`` signals in, AXI4 ``bus`` out (see
    the module doc). Same interface as :class:`~.aggregator.AggregatorCore`.

    No guard verdict gates the datapath in the cycle it is found: a read outside its buffer
    is held back in the :class:`~.dma.ReadPort` (registered mode), a write's address and
    buffer check are computed stages ahead of its push (:class:`~.pipeline_writer.
    CheckedWriteQueue`), and the run stops from a register a cycle after a fault."""

    def __init__(self, config: PipelineUnitConfig = PipelineUnitConfig()):
        self.config_registers = config_registers(config.stages)
        self.status_registers = status_registers(config.stages)
        super().__init__(config, self.config_registers, self.status_registers)

    def elaborate(self, platform):
        m = Module()
        s = SimpleNamespace()     # the signals the sections share
        self._run_configuration(m, s)
        self._pipeline(m, s)
        self._datapath(m, s)
        self._stream_unpacking(m, s)
        self._backward_order(m, s)
        self._weight_load(m, s)
        self._weight_store(m, s)
        self._writes(m, s)
        self._config_check(m, s)
        self._counters(m, s)
        self._run_control(m, s)
        return m

    def _run_configuration(self, m, s):
        """The run control and the run's configuration, its flags and sizes as registers."""
        c = self.config
        K = c.stages

        m.submodules.run = s.run = RunControl(drain=True, hold_first=True)
        s.clear = Signal()          # datapath reset (the CHECK state of every run)
        s.pipe_reset = Signal()     # Pipeline reset (after an aborted TRAIN only)
        s.cfg = {name: Signal(len(sig), name=f"run_{name}") for name, sig in self.cfg.items()}
        s.mode = s.cfg["pipe_mode"]
        # the mode's flags as registers (the configuration is steady from start)
        s.is_load = Signal()
        s.is_store = Signal()
        s.is_train = Signal()
        m.d.sync += [s.is_load.eq(s.mode == PipelineMode.LOAD_WEIGHTS.value),
                     s.is_store.eq(s.mode == PipelineMode.STORE_WEIGHTS.value),
                     s.is_train.eq(s.mode == PipelineMode.TRAIN.value)]
        s.sched = s.cfg["schedule"]
        # a register too (the 32-bit compare selected the backward order's steps)
        s.gpipe = Signal()
        m.d.sync += s.gpipe.eq(s.sched == 0)
        s.mbs, s.steps, s.rows = s.cfg["microbatches"], s.cfg["steps"], s.cfg["rows"]
        # the run's sizes, computed in CHECK by bit-serial multipliers (see _RunSizes)
        s.sizes = _RunSizes(m, s.cfg, c, K)
        s.n_total = s.sizes.n_total
        # flags of the run's configuration, as registers (the configuration is steady)
        s.dx_on = Signal()
        s.mbs_m1 = Signal(8)
        s.two_mbs_m1 = Signal(9)
        m.d.sync += [s.dx_on.eq(s.cfg["dx_addr"] != 0), s.mbs_m1.eq(s.mbs[:8] - 1),
                     s.two_mbs_m1.eq((s.mbs[:8] << 1) - 1)]

    def _pipeline(self, m, s):
        """The Pipeline of training stages (not reset with the datapath: its weights live across runs)."""
        c = self.config
        K = c.stages
        s.pipe = c.pipeline()
        m.submodules.pipeline = ResetInserter(s.pipe_reset)(s.pipe)
        m.d.comb += [s.pipe.schedule.eq(s.sched), s.pipe.microbatches.eq(s.mbs), s.pipe.steps.eq(s.steps),
                     s.pipe.total_stages.eq(K), s.pipe.stage_offset.eq(0)]
        for i in range(K):
            m.d.comb += getattr(s.pipe, f"s{i}_rows").eq(s.rows)
            for name, _ in STAGE_REGISTERS:
                m.d.comb += getattr(s.pipe, f"s{i}_{name}").eq(s.cfg[f"s{i}_{name}"])
            for name in STAGE_COUNTERS:
                m.d.comb += self.stat[f"s{i}_{name}"].eq(getattr(s.pipe, f"s{i}_{name}"))
        s.d_first = s.cfg["s0_d_in"]
        s.d_last = s.cfg[f"s{K - 1}_d_out"]
        s.sel = s.cfg["stage"]
        # the selected stage's dimensions and select flags, registered
        s.sel_d_in = Signal(32)
        s.sel_d_out = Signal(32)
        s.sel_is = [Signal(name=f"sel_is_{i}") for i in range(K)]
        m.d.sync += [s.sel_d_in.eq(Array(s.cfg[f"s{i}_d_in"] for i in range(K))[s.sel[:3] if K > 1 else 0]),
                     s.sel_d_out.eq(Array(s.cfg[f"s{i}_d_out"] for i in range(K))[s.sel[:3] if K > 1 else 0])]
        # (each compare a decision of its own: an equality of 32 bits is two LUT levels)
        m.d.sync += [flag.eq(decision(m, f"sel_is_{i}_term", lambda x, i=i: x == i, x=s.sel))
                     for i, flag in enumerate(s.sel_is)]

    def _datapath(self, m, s):
        """The datapath's ports, write queue and row readers (reset at the start of every run)."""
        c = self.config
        aw, align, beat_bits = c.addr_width, c.bytes_per_beat - 1, c.bytes_per_beat.bit_length() - 1
        s.dp = Module()
        # 0 weights, 1 grad, 2 act; each client's guard in stages of its own
        s.read_port = ReadPort(self.bus, num_clients=3, registered_requests=True, zero_flag=True)
        # single beats in, INCR bursts out (consecutive beats joined, up to max_burst)
        s.write_port = WritePort(self.bus, beat_depth=16, address_depth=16,
                                 coalesce=c.max_burst >= 2, max_burst=max(c.max_burst, 2))
        # which logits microbatches are in memory (write responses cover their last beat)
        s.markers = WriteCompletion()
        offset_width = aw + 13
        s.write_queue = CheckedWriteQueue(addr_width=aw + 41, offset_width=offset_width,
                                          bus_width=c.bus_width)
        rd = dict(addr_width=aw, bus_width=c.bus_width, max_burst=c.max_burst,
                  fifo_beats=c.fifo_beats)
        s.w_reader = RowReader(s.read_port.requests[0], s.read_port.responses[0], **rd)
        s.g_reader = RowReader(s.read_port.requests[1], s.read_port.responses[1], **rd)
        s.a_reader = RowReader(s.read_port.requests[2], s.read_port.responses[2], **rd)
        for name, sub in (("read_port", s.read_port), ("write_port", s.write_port), ("markers", s.markers),
                          ("write_queue", s.write_queue), ("w_reader", s.w_reader),
                          ("g_reader", s.g_reader), ("a_reader", s.a_reader)):
            s.dp.submodules[name] = sub
        for i, buf in enumerate(("w", "grad", "act")):
            m.d.comb += [s.read_port.guard_base[i].eq(s.cfg[f"{buf}_addr"]),
                         s.read_port.guard_size[i].eq(s.cfg[f"{buf}_size"])]

        def row_beats(cols, elem_bytes):
            # a register (the configuration is steady from start; a job starts in RUN): no
            # adder in front of a reader's start
            beats = Signal(16, reset_less=True)
            m.d.sync += beats.eq((cols * elem_bytes + align) >> beat_bits)
            return beats
        s.row_beats = row_beats

        s.stopped = Signal()        # a fault was found: from the next cycle nothing proceeds
        # the run's phase as registers of the unit, each set a cycle ahead from what moves
        # the run control (its outputs decode its state; they feed hundreds of loads here)
        s.checking = Signal()       # CHECK (== run.checking)
        s.running = Signal()        # RUN, no fault: traffic may proceed (run.running & ~stopped)
        s.train_run = Signal()      # running & is_train
        s.store_run = Signal()      # running & is_store
        s.first = Signal()          # first RUN cycle (== run.first)
        # ... of a TRAIN / LOAD_WEIGHTS run: registers of their own, so the starts of the
        # Pipeline and of the readers (a few hundred loads) are not a LUT behind ``first``
        s.first_train, s.first_load = Signal(), Signal()

    def _stream_unpacking(self, m, s):
        """Read beats into row segments of ``lanes`` elements for the Pipeline's streams."""
        c = self.config
        L = c.lanes
        spb = c.elems_per_beat // L          # stream segments per beat (>= 2)
        # the microbatch's rows as registers of its width (rows <= max_rows once checked)
        rows_bits = max(c.max_rows.bit_length(), 1)
        rows_m1 = Signal(rows_bits, reset_less=True)
        rows_one = Signal(reset_less=True)
        m.d.sync += [rows_m1.eq(s.rows[:rows_bits] - 1), rows_one.eq(s.rows == 1)]

        def unpack(reader, port, cols, max_cols, name):
            # the row position as registers stepped per segment: the segment's column, the
            # elements left in its row, the rows after it (counted down: no compare with the
            # configured rows), whether its row is the microbatch's last
            r = Signal(16, name=f"{name}_row")
            after = Signal(rows_bits, name=f"{name}_rows_after")
            b_j = Signal(range(spb), name=f"{name}_seg")
            col = Signal(range(max_cols + 1), name=f"{name}_col")
            left = Signal(range(max_cols + 1), name=f"{name}_left")
            last_row = Signal(name=f"{name}_last_row")
            row_end = Signal(name=f"{name}_row_end")       # left <= lanes
            cols_w = Signal(range(max_cols + 1), name=f"{name}_cols", reset_less=True)
            one_seg = Signal(name=f"{name}_one_seg", reset_less=True)   # cols <= lanes
            m.d.sync += [cols_w.eq(cols[:len(cols_w)]), one_seg.eq(cols <= L)]
            with s.dp.If(s.first):
                s.dp.d.sync += [left.eq(cols_w), last_row.eq(rows_one), after.eq(rows_m1),
                                row_end.eq(one_seg)]
            seg = reader.data.word_select(b_j, L * MAC_INPUT_WIDTH)
            pl = port.payload
            s.dp.d.comb += [
                port.valid.eq(reader.valid & s.train_run),
                pl.row.eq(r), pl.col.eq(col), pl.count.eq(Mux(row_end, left, L)),
                pl.data.as_value().eq(seg), pl.relu_mask.eq(0),
                pl.last.eq(row_end & last_row),
            ]
            # a segment taken, and one that ends its row: decisions of their own from
            # flip-flops, the enables of the position registers
            offer = {"valid": reader.valid, "run": s.train_run, "ready": port.ready}

            def taken(valid, run, ready):
                return valid & run & ready
            take = decision(s.dp, f"{name}_take", taken, **offer)
            take_row_end = decision(s.dp, f"{name}_take_row_end",
                                    lambda row_end, **k: taken(**k) & row_end,
                                    **offer, row_end=row_end)
            with s.dp.If(take):
                s.dp.d.sync += [b_j.eq(b_j + 1), col.eq(col + L), left.eq(left - L),
                                row_end.eq(left <= 2 * L)]
            with s.dp.If(take_row_end):
                s.dp.d.sync += [b_j.eq(0), col.eq(0), left.eq(cols_w), row_end.eq(one_seg)]
                with s.dp.If(last_row):
                    s.dp.d.sync += [r.eq(0), after.eq(rows_m1), last_row.eq(rows_one)]
                with s.dp.Else():
                    s.dp.d.sync += [r.eq(r + 1), after.eq(after - 1), last_row.eq(after == 1)]
            # the beat's pop (a segment taken that ends its row or its beat): one LUT of
            # flip-flops in front of the reader's wide head
            s.dp.d.comb += reader.pop.eq(decision(
                s.dp, f"{name}_pop",
                lambda row_end, seg, **k: taken(**k) & (row_end | (seg == spb - 1)),
                **offer, row_end=row_end, seg=b_j))

        unpack(s.a_reader, s.pipe.act_in, s.d_first, c.max_in, "act")
        unpack(s.g_reader, s.pipe.grad_in, s.d_last, c.max_out, "grad")

        # inputs: one job over all N * rows rows
        m.d.comb += [s.a_reader.base.eq(s.cfg["act_addr"]), s.a_reader.stride.eq(s.cfg["act_stride"]),
                     s.a_reader.nrows.eq(s.sizes.n_rows),
                     s.a_reader.row_beats.eq(s.row_beats(s.d_first, ELEM_BYTES))]
        s.dp.d.comb += s.a_reader.start.eq(s.first_train)

    def _backward_order(self, m, s):
        """The microbatch order of a backward stream (the last stage's dY, stage 0's dX)."""
        c = self.config
        aw = c.addr_width
        def backward_order(fire_last, name, buf=None):
            """Index (and, for ``buf``, base address) of the microbatch a backward-ordered
            stream is at, as registers; the address moves by precomputed steps, no
            multiply. GPipe walks a step's microbatches down, then jumps to the next step's
            last; the 1F1B schedules walk up."""
            left = Signal(8, name=f"{name}_left")        # microbatches after this one in its step
            step_end = Signal(name=f"{name}_step_end")   # left == 0
            mb = Signal(24, name=f"{name}_mb")
            addr = Signal(aw + 40, name=f"{name}_addr")
            # the address's next move, a register chosen with ``step_end``'s next value (the
            # stream may end microbatches in consecutive cycles): the add starts from it, no
            # select of the two steps in front of the wide carry chain
            delta = Signal(aw + 40, name=f"{name}_delta", reset_less=True)

            def move(ends_step):
                return Mux(ends_step, s.sizes.step_delta[buf], s.sizes.inner_delta[buf])
            with s.dp.If(fire_last):
                s.dp.d.sync += [left.eq(left - 1), step_end.eq(left == 1),
                                mb.eq(Mux(s.gpipe, Mux(step_end, mb + s.two_mbs_m1, mb - 1), mb + 1))]
                with s.dp.If(step_end):
                    s.dp.d.sync += [left.eq(s.mbs_m1), step_end.eq(s.mbs_m1 == 0)]
                if buf is not None:
                    s.dp.d.sync += [addr.eq(addr + delta),
                                    delta.eq(move(Mux(step_end, s.mbs_m1 == 0, left == 1)))]
            with s.dp.If(s.first):
                s.dp.d.sync += [left.eq(s.mbs_m1), step_end.eq(s.mbs_m1 == 0),
                                mb.eq(Mux(s.gpipe, s.mbs_m1, 0))]
                if buf is not None:
                    s.dp.d.sync += [addr.eq(s.cfg[f"{buf}_addr"] + Mux(s.gpipe, s.sizes.last_off[buf], 0)),
                                    delta.eq(move(s.mbs_m1 == 0))]
            return mb, addr
        s.backward_order = backward_order

        # gradients: one job per microbatch, only below the doorbell; the job's conditions
        # are registers, so a job waits two cycles after the one before (its index settles).
        # The start itself is a flip-flop set a cycle after its conditions (their AND is
        # not in front of the reader's wide load); while it is pending no other decides
        g_jobs_left = Signal(24)
        g_mb, g_job_base = s.backward_order(s.g_reader.start, "grad_order", "grad")
        g_recent = Signal(2)
        g_may = Signal()
        g_go = Signal(attrs={"max_fanout": 64})
        s.dp.d.sync += [g_recent.eq(Cat(s.g_reader.start, g_recent[0])),
                        g_may.eq(g_mb < self.cfg["grads_ready"])]   # live: the host raises it
        g_jobs_any = Signal()     # g_jobs_left != 0, a register
        # the reader's issued flag a cycle late: it falls only at a start, which g_recent
        # covers for two cycles, so the copy is never high while the reader is active
        g_issued = Signal()
        s.dp.d.sync += g_issued.eq(s.g_reader.issued)
        g_free = s.train_run & ~s.first & ~g_go & ~g_recent.any() & g_issued & g_jobs_any
        s.dp.d.sync += g_go.eq(g_free & g_may)
        # a fault in the cycle between stops the pending start too
        s.dp.d.comb += [s.g_reader.start.eq(g_go & s.train_run)]
        m.d.comb += [s.g_reader.base.eq(g_job_base), s.g_reader.stride.eq(s.cfg["grad_stride"]),
                     s.g_reader.nrows.eq(s.rows), s.g_reader.row_beats.eq(s.row_beats(s.d_last, ELEM_BYTES))]
        with s.dp.If(s.first):
            s.dp.d.sync += [g_jobs_left.eq(s.n_total), g_jobs_any.eq(s.n_total != 0)]
        with s.dp.Elif(s.g_reader.start):
            s.dp.d.sync += [g_jobs_left.eq(g_jobs_left - 1), g_jobs_any.eq(g_jobs_left != 1)]
        s.grad_wait = Signal()
        m.d.comb += s.grad_wait.eq(g_free & ~g_may)

    def _weight_load(self, m, s):
        """Weight load: read beats into master words of the selected stage."""
        c = self.config
        L = c.lanes
        wpb = c.bus_width // (32 * L)          # master words per beat (>= 1)
        m.d.comb += [s.w_reader.base.eq(s.cfg["w_addr"]), s.w_reader.stride.eq(s.cfg["w_stride"]),
                     s.w_reader.nrows.eq(s.sel_d_in),
                     s.w_reader.row_beats.eq(s.row_beats(s.sel_d_out, MASTER_BYTES))]
        s.dp.d.comb += s.w_reader.start.eq(s.first_load)
        s.lw_row = Signal(16)
        s.lw_word = Signal(16)
        lw_left = Signal(16)       # elements of the row from this word on
        lw_j = Signal(range(max(wpb, 2)))
        # the walks' row-end and done flags are registers, set a word ahead from the
        # counters and copies of the limits (steady from start): no compare of a counter
        # with a limit sits in front of the walk's enables
        s.out_one_word = Signal()             # sel_d_out <= L: every word ends its row
        s.sel_d_in_m1 = Signal(16, reset_less=True)
        m.d.sync += [s.out_one_word.eq(s.sel_d_out <= L), s.sel_d_in_m1.eq(s.sel_d_in[:16] - 1)]
        lw_row_end, lw_done = Signal(), Signal()
        # the last row's compare, a net of its own (kept): the word's handshake only chooses
        # whether lw_done takes it, instead of a tree ABC rebuilds around the compare
        lw_last_row = Signal(name="lw_last_row", attrs={"keep": 1})
        s.dp.d.comb += lw_last_row.eq(s.lw_row == s.sel_d_in_m1)
        with s.dp.If(s.first):
            s.dp.d.sync += [lw_left.eq(s.sel_d_out), lw_row_end.eq(s.out_one_word),
                            lw_done.eq(s.sel_d_in == 0)]
        s.load_valid = Signal()
        s.dp.d.comb += s.load_valid.eq(s.running & s.is_load & s.w_reader.valid)
        s.load_word = Signal(L * 32)
        raw = s.w_reader.data.word_select(lw_j, L * 32) if wpb > 1 else s.w_reader.data[:L * 32]
        # the word's lanes inside the row (lw_left > lane), registers set a word ahead
        lw_keep = Signal(L)
        s.out_keep = Signal(L, reset_less=True)       # a row's first word: sel_d_out > lane
        m.d.sync += s.out_keep.eq(Cat(*(s.sel_d_out > lane for lane in range(L))))
        for lane in range(L):
            s.dp.d.comb += s.load_word.word_select(lane, 32).eq(
                Mux(lw_keep[lane], raw.word_select(lane, 32), 0))
        with s.dp.If(s.first):
            s.dp.d.sync += lw_keep.eq(s.out_keep)
        with s.dp.If(s.load_valid):
            s.dp.d.sync += [s.lw_word.eq(s.lw_word + 1), lw_left.eq(lw_left - L),
                            lw_row_end.eq(lw_left <= 2 * L),
                            lw_keep.eq(Cat(*(lw_left > lane + L for lane in range(L))))]
            with s.dp.If(lw_row_end):
                s.dp.d.comb += s.w_reader.pop.eq(1)
                s.dp.d.sync += [lw_j.eq(0), s.lw_word.eq(0), lw_left.eq(s.sel_d_out),
                                s.lw_row.eq(s.lw_row + 1),
                                lw_row_end.eq(s.out_one_word), lw_done.eq(lw_last_row),
                                lw_keep.eq(s.out_keep)]
            with s.dp.Elif(lw_j == wpb - 1):
                s.dp.d.comb += s.w_reader.pop.eq(1)
                s.dp.d.sync += lw_j.eq(0)
            with s.dp.Else():
                s.dp.d.sync += lw_j.eq(lw_j + 1)
        s.load_done = lw_done

    def _weight_store(self, m, s):
        """Weight store: the selected stage's master words into single-beat writes."""
        c = self.config
        K, L, aw = c.stages, c.lanes, c.addr_width
        s.sw_row = Signal(16)
        s.sw_word = Signal(16)
        s.sw_left = Signal(16)       # elements of the row from this word on
        s.sw_keep = Signal(L)        # sw_left > lane, registers set a word ahead
        s.sw_settled = Signal()      # w_rd_data holds the word at (sw_row, sw_word)
        s.sw_row_addr = Signal(aw + 16)
        s.sw_row_end = Signal()      # sw_left <= L: the word is its row's last
        s.store_done = Signal()      # sw_row == sel_d_in
        # sw_row == sel_d_in_m1 from a register: a row's last word is taken at least two
        # cycles after its row stepped (a take clears sw_settled), so a cycle late is in time
        s.sw_last_row = Signal()
        s.dp.d.sync += s.sw_last_row.eq(s.sw_row == s.sel_d_in_m1)
        with s.dp.If(s.first):
            s.dp.d.sync += [s.sw_left.eq(s.sel_d_out), s.sw_row_end.eq(s.out_one_word),
                            s.store_done.eq(s.sel_d_in == 0), s.sw_keep.eq(s.out_keep)]

        # the stages' host-port position: the load walk's or the store walk's. The datapath
        # is cleared in every run's CHECK and a run moves its own walk only, so the other
        # one is 0 and an OR selects (no select by the mode, a net of a hundred loads, in
        # front of the stages' memory addresses)
        w_row = s.lw_row | s.sw_row
        w_word = s.lw_word | s.sw_word
        rd_words = []
        for i in range(K):
            m.d.comb += [getattr(s.pipe, f"s{i}_w_row").eq(w_row), getattr(s.pipe, f"s{i}_w_word").eq(w_word),
                         getattr(s.pipe, f"s{i}_w_wr_data").eq(s.load_word),
                         getattr(s.pipe, f"s{i}_w_wr_en").eq(s.load_valid & s.sel_is[i]),
                         # the same word of the velocity is cleared (v_wr_data stays 0)
                         getattr(s.pipe, f"s{i}_v_row").eq(w_row), getattr(s.pipe, f"s{i}_v_word").eq(w_word),
                         getattr(s.pipe, f"s{i}_v_wr_en").eq(s.load_valid & s.sel_is[i])]
            rd_words.append(getattr(s.pipe, f"s{i}_w_rd_data"))
        s.rd_word = Signal(L * 32)
        m.d.comb += s.rd_word.eq(Array(rd_words)[s.sel[:3] if K > 1 else 0])

    def _writes(self, m, s):
        """The writes: logits, dX and stored weights through the checked queue."""
        c = self.config
        L, aw = c.lanes, c.addr_width
        align, beat_bits = c.bytes_per_beat - 1, c.bytes_per_beat.bit_length() - 1
        s.status = self.stat["status"]

        # the Pipeline's output streams end in band writers: each collects a band of rows
        # (the cores emit tile by tile) and sends it row by row, so a row's beats are
        # consecutive and join into bursts; their ready and beats are registers
        def band_writer(port, cols, name):
            w = BandWriter(lanes=L, index_bits=len(port.payload.row), bus_width=c.bus_width,
                           max_cols=c.max_out if name == "logits" else c.max_in)
            s.dp.submodules[f"{name}_band"] = w
            s.dp.d.comb += [w.rows.eq(s.rows), w.cols.eq(cols),
                            w.segments.payload.eq(port.payload), w.segments.valid.eq(port.valid & s.train_run),
                            port.ready.eq(w.segments.ready & s.train_run)]
            # its beats pass a register slice: the writer's bank logic sees a flip-flop as
            # ready, not the choice among the writers and the queue's credits
            out = SkidBuffer(w.beats.payload.shape())
            s.dp.submodules[f"{name}_beats"] = out
            wiring.connect(s.dp, w.beats, out.i)
            # a beat in the slice is pending too (its skid entry only when the main one is)
            return SimpleNamespace(beats=out.o, pending=w.pending | out.o.valid)

        s.lg_w = band_writer(s.pipe.act_out, s.d_last, "logits")
        s.dx_w = band_writer(s.pipe.grad_out, s.d_first, "dx")
        lg_pl, dx_pl = s.lg_w.beats.payload, s.dx_w.beats.payload

        # every beat enters the checked queue with its address as base + row offset + beat
        # offset and its buffer; logits first, then dX, then stored weights
        entry = s.write_queue.beats
        ep = entry.payload
        room = entry.ready
        take_lg = s.train_run & s.lg_w.beats.valid & room
        take_dx = s.train_run & ~s.lg_w.beats.valid & s.dx_w.beats.valid & s.dx_on & room
        # the store walk gives a beat every other cycle at most (a take clears sw_settled),
        # so the queue's ready for a beat after a cycle without one is its ready: the take
        # and the row step (enable of the walk's wide registers) are decisions of their
        # own from flip-flops
        store_go = {"run": s.store_run, "settled": s.sw_settled, "done": s.store_done,
                    "credit": s.write_queue.credit, "entering": s.write_queue.entering}

        def store_takes(run, settled, done, credit, entering):
            return run & settled & ~done & credit & ~entering
        take_st = decision(s.dp, "store_take", store_takes, **store_go)
        st_row_step = decision(s.dp, "store_row_step",
                               lambda row_end, **k: store_takes(**k) & row_end,
                               **store_go, row_end=s.sw_row_end)
        lg_base = Signal(aw + 40)
        # a microbatch's last beat taken: decisions of their own (the queue's room, a LUT
        # of its credits, and five flip-flops), in front of the bases' wide enables
        lg_last = decision(s.dp, "logits_last_taken",
                           lambda run, valid, last, room: run & valid & last & room,
                           run=s.train_run, valid=s.lg_w.beats.valid, last=lg_pl.last, room=room)
        dx_last = decision(s.dp, "dx_last_taken",
                           lambda run, lg, valid, on, last, room: run & ~lg & valid & on & last & room,
                           run=s.train_run, lg=s.lg_w.beats.valid, valid=s.dx_w.beats.valid,
                           on=s.dx_on, last=dx_pl.last, room=room)
        with s.dp.If(lg_last):
            s.dp.d.sync += lg_base.eq(lg_base + s.sizes.mb_bytes["logits"])
        _, dx_base = s.backward_order(dx_last, "dx_order", "dx")

        def buffer(buf):
            return [ep.buf_base.eq(s.cfg[f"{buf}_addr"]), ep.buf_size.eq(s.cfg[f"{buf}_size"])]

        word_bytes = Signal(32)
        s.dp.d.comb += word_bytes.eq(s.sw_word * (L * MASTER_BYTES))
        st_off = word_bytes[:beat_bits]
        # the word's elements in the row: lanes below sw_left
        st_strb = Cat(*[Mux(s.sw_keep[lane], Const((1 << MASTER_BYTES) - 1, MASTER_BYTES), 0)
                        for lane in range(L)]) << st_off
        st_data = s.rd_word << (st_off * 8)
        # the beat's fields are chosen by the writers' valid flags alone (flip-flops; the
        # queue takes the fields only with entry.valid), so its ready, a credit count, is
        # not in front of the hundreds of loads the choice reaches
        # the row offset tables' reads, addressed by their writers' rows always (a read
        # addressed inside the If below would wait on the writers' valid flags)
        lg_row_offset = s.sizes.row_offset(s.dp, "logits", lg_pl.row)
        dx_row_offset = s.sizes.row_offset(s.dp, "dx", dx_pl.row)
        with s.dp.If(s.lg_w.beats.valid):
            s.dp.d.comb += [ep.base.eq(lg_base), ep.row_offset.eq(lg_row_offset),
                            ep.beat_offset.eq(lg_pl.beat << beat_bits), ep.data.eq(lg_pl.data),
                            ep.strb.eq(lg_pl.strb), ep.mark.eq(lg_pl.last), *buffer("logits")]
        with s.dp.Elif(s.dx_w.beats.valid):
            s.dp.d.comb += [ep.base.eq(dx_base), ep.row_offset.eq(dx_row_offset),
                            ep.beat_offset.eq(dx_pl.beat << beat_bits), ep.data.eq(dx_pl.data),
                            ep.strb.eq(dx_pl.strb), *buffer("dx")]
        with s.dp.Else():
            s.dp.d.comb += [ep.base.eq(s.sw_row_addr), ep.row_offset.eq(0),
                            ep.beat_offset.eq(word_bytes & ~Const(align, 32)), ep.data.eq(st_data),
                            ep.strb.eq(st_strb), *buffer("w")]
        s.dp.d.comb += [entry.valid.eq(take_lg | take_dx | take_st),
                        s.lg_w.beats.ready.eq(s.train_run & room),
                      # dX of a run without a dx buffer: taken and dropped
                        s.dx_w.beats.ready.eq(s.train_run & ((~s.lg_w.beats.valid & room) | ~s.dx_on))]

        # the queue's head: pushed when its registered verdict holds and no fault was found;
        # a head outside its buffer is dropped and raises the fault, which holds every later
        # push back (the run stops a cycle later)
        head = s.write_queue.queued
        write_fault = Signal()
        # flip-flops only (the port's queues' own w_rdy compare their levels)
        can_push = s.write_port.room & s.markers.room
        live = head.valid & ~write_fault & ~s.stopped
        push = Signal()
        s.fault_found = Signal()
        s.dp.d.comb += [push.eq(live & head.payload.inside & can_push),
                        s.fault_found.eq(live & ~head.payload.inside),
                      # after a fault every beat left is dropped, so the queue drains; a
                      # decision of its own (six flip-flops) in front of the queue's pop
                        head.ready.eq(decision(
                            s.dp, "write_head_pop",
                            lambda valid, room, mroom, fault, stopped, inside:
                            valid & ((room & mroom) | fault | stopped | ~inside),
                            valid=head.valid, room=s.write_port.room, mroom=s.markers.room,
                            fault=write_fault, stopped=s.stopped, inside=head.payload.inside))]
        with s.dp.If(s.fault_found):
            s.dp.d.sync += write_fault.eq(1)
        # single-beat bursts (len 0, last 1); Cat in the layouts' field order
        s.dp.d.comb += [s.write_port.address.w_data.eq(Cat(head.payload.addr[:aw], Const(0, 8))),
                        s.write_port.address.w_en.eq(push),
                        s.write_port.beats.w_data.eq(Cat(head.payload.data, head.payload.strb, Const(1, 1))),
                        s.write_port.beats.w_en.eq(push), s.markers.push.eq(push),
                        s.markers.mark.eq(head.payload.mark)]

        with s.dp.If(s.first):
            s.dp.d.sync += [lg_base.eq(s.cfg["logits_addr"]), s.sw_row_addr.eq(s.cfg["w_addr"])]
        # store walk: present (row, word), wait a cycle for the read, queue, next word
        with s.dp.If(s.store_run & ~s.store_done & ~s.sw_settled):
            s.dp.d.sync += s.sw_settled.eq(1)
        with s.dp.If(take_st):
            s.dp.d.sync += [s.sw_settled.eq(0), s.sw_word.eq(s.sw_word + 1), s.sw_left.eq(s.sw_left - L),
                            s.sw_row_end.eq(s.sw_left <= 2 * L),
                            s.sw_keep.eq(Cat(*(s.sw_left > lane + L for lane in range(L))))]
        with s.dp.If(st_row_step):
            s.dp.d.sync += [s.sw_word.eq(0), s.sw_left.eq(s.sel_d_out), s.sw_row.eq(s.sw_row + 1),
                            s.sw_row_addr.eq(s.sw_row_addr + s.cfg["w_stride"]),
                            s.sw_row_end.eq(s.out_one_word), s.store_done.eq(s.sw_last_row),
                            s.sw_keep.eq(s.out_keep)]

        # write responses: in order (one ID), each for the burst of the AW before it; a
        # microbatch's logits are in once the responses cover the beats up to its last
        s.bus = self.bus
        s.dp.d.comb += [s.markers.aw_fire.eq(s.bus.awvalid & s.bus.awready), s.markers.aw_len.eq(s.bus.awlen),
                        s.markers.b_fire.eq(s.bus.bvalid & s.bus.bready)]
        s.logits_done = self.stat["logits_done"]
        s.logits_b = Signal()
        s.dp.d.comb += s.logits_b.eq(s.markers.completed)

    def _config_check(self, m, s):
        """The configuration check, from registers, once the run's sizes are in."""
        c = self.config
        K = c.stages
        count = iter(range(1 << 16))

        def check(fn, **inputs):
            # each compare of configuration registers alone in a module (blocks.own_module):
            # mapped together, Yosys shares their subtractions and ABC chains them
            return decision(m, f"config_check{next(count)}", fn, **inputs)

        def above(value, limit):
            return check(lambda x: x > limit, x=value)

        def zero(value):
            return check(lambda x: x == 0, x=value)

        weights_checks = [check(lambda x: x >= K, x=s.sel), zero(s.sel_d_in), above(s.sel_d_in, c.max_in),
                          zero(s.sel_d_out), above(s.sel_d_out, c.max_out),
                          s.sizes.buffer_bad("w", s.sel_d_out, MASTER_BYTES)]
        train_checks = [
            above(s.sched, 2), zero(s.mbs), above(s.mbs, 255), zero(s.steps), above(s.steps, 65535),
            zero(s.rows), above(s.rows, c.max_rows),
            check(lambda gpipe, x: gpipe & (x > c.slots), gpipe=s.gpipe, x=s.mbs),
            s.sizes.buffer_bad("act", s.d_first, ELEM_BYTES),
            s.sizes.buffer_bad("logits", s.d_last, ELEM_BYTES),
            s.sizes.buffer_bad("grad", s.d_last, ELEM_BYTES),
            ~zero(s.cfg["dx_addr"]) & s.sizes.buffer_bad("dx", s.d_first, ELEM_BYTES),
        ]
        for i in range(K):
            reg = lambda name: s.cfg[f"s{i}_{name}"]  # noqa: E731
            train_checks += [zero(reg("d_in")), above(reg("d_in"), c.max_in), zero(reg("d_out")),
                             above(reg("d_out"), c.max_out), above(reg("relu"), 1),
                             above(reg("dx_first"), 1), above(reg("fwd_shift"), 63),
                             above(reg("dx_shift"), 63), above(reg("dw_shift"), 63),
                             above(reg("lr"), 65535), above(reg("wd"), 65535), above(reg("mu"), 65535)]
            if i + 1 < K:
                train_checks.append(check(lambda x, y: x != y, x=reg("d_out"), y=s.cfg[f"s{i + 1}_d_in"]))
        # every check from registers into a register of its own, their OR into err_config a
        # cycle later (no compare in front of the OR tree): valid once the sizes are in
        def registered(checks, name):
            flags = Signal(len(checks), name=name)
            m.d.sync += flags.eq(Cat(*checks))
            return flags.any()
        s.err_config = Signal()
        m.d.sync += s.err_config.eq((s.mode > 2) | (s.is_train & registered(train_checks, "train_checks")) |
                                    (~s.is_train & registered(weights_checks, "weights_checks")))

    def _counters(self, m, s):
        """The status counters and the fault flags."""
        busy = s.run.busy
        bus = s.bus
        stall = (bus.arvalid & ~bus.arready) | (bus.awvalid & ~bus.awready) | (bus.wvalid & ~bus.wready)
        s.increments = {"busy_cycles": 1, "read_beats": s.read_port.beat, "write_beats": s.write_port.beat,
                        "stall_cycles": stall, "grad_wait_cycles": s.grad_wait}
        fault = Signal()
        m.d.comb += fault.eq((s.status & Status.ADDR_FAULT) != 0)
        with m.If(busy):
            for name, inc in s.increments.items():
                m.d.sync += self.stat[name].eq(self.stat[name] + inc)
            with m.If(s.logits_b):
                m.d.sync += s.logits_done.eq(s.logits_done + 1)
            # each event sets its own bit (its register sees no other bit's events)
            with m.If(s.read_port.resp_error | s.write_port.resp_error):
                m.d.sync += status_bit(s.status, Status.AXI_ERROR).eq(1)
            with m.If(s.read_port.fault | s.fault_found):
                m.d.sync += [status_bit(s.status, Status.ADDR_FAULT).eq(1), s.stopped.eq(1)]
        m.d.comb += s.read_port.enable.eq(~fault)

    def _run_control(self, m, s):
        """The run's phases, the Pipeline's start and reset, and the probes for simulation."""
        pipe_finished = Signal()
        with m.If(s.pipe.done):
            m.d.sync += pipe_finished.eq(1)
        check_done = Signal()
        # the sizes start in CHECK's first cycle, from a flip-flop (run.accept a cycle
        # late, which is checking & ~sizes.started): the start fans out to every size's
        # and extent's operand registers
        sizes_start = Signal(name="sizes_start")
        m.d.sync += sizes_start.eq(s.run.accept)
        m.d.comb += [
            s.run.start.eq(self.start), self.idle.eq(s.run.idle), self.done.eq(s.run.done),
            # the sizes take tens of cycles (bit-serial), the checks one more
            s.sizes.start.eq(sizes_start), check_done.eq(s.sizes.ready),
            s.run.check_done.eq(check_done), s.run.check_error.eq(s.err_config),
            s.clear.eq(s.checking),
            s.run.stop.eq(s.stopped),
            s.run.finished.eq(Mux(s.is_train, pipe_finished, Mux(s.is_load, s.load_done, s.store_done))),
            s.run.drained.eq(s.write_queue.empty & s.write_port.idle & ~s.lg_w.pending & ~s.dx_w.pending),
            # nothing new is issued; once the traffic in flight is in, the Pipeline (which
            # may wait for data that will never come) is reset
            s.run.quiet.eq(s.read_port.no_outstanding & s.write_port.idle),
        ]
        # the Pipeline's reset is a register (it reaches every flip-flop of the stages):
        # high in the FINISH cycle after the abort, so the next run finds it reset
        m.d.sync += s.pipe_reset.eq(s.run.abort_done & s.is_train)
        # CHECK -> RUN next cycle; RUN ends by finishing or by a fault found now (stopped
        # is set and run.running & ~stopped drops: the same cycle as with the decoded state)
        enter_run = s.checking & check_done & ~s.err_config
        stays = s.running & ~s.run.completing & ~(s.read_port.fault | s.fault_found)
        m.d.sync += [s.checking.eq(s.run.accept | (s.checking & ~check_done)),
                     s.running.eq(enter_run | stays), s.train_run.eq((enter_run | stays) & s.is_train),
                     s.store_run.eq((enter_run | stays) & s.is_store),
                     s.first.eq(enter_run), s.first_train.eq(enter_run & s.is_train),
                     s.first_load.eq(enter_run & s.is_load)]
        # the Pipeline starts from a register, in the first RUN cycle: no path runs from the
        # sizes and the check into the stages' start decisions
        m.d.comb += s.pipe.start.eq(s.first_train)
        with m.If(s.run.accept):
            m.d.sync += [s.cfg[name].eq(sig) for name, sig in self.cfg.items()]
            m.d.sync += [s.status.eq(0), pipe_finished.eq(0), s.stopped.eq(0)]
            m.d.sync += [self.stat[name].eq(0) for name in (*s.increments, "logits_done")]
        # the check's verdict sets its own bit only: the status was cleared at accept and
        # nothing sets a bit in CHECK (no traffic)
        with m.If(s.run.config_error):
            m.d.sync += status_bit(s.status, Status.CONFIG_ERROR).eq(1)

        m.submodules.datapath = ResetInserter(s.clear)(s.dp)
        # the registered phase beside the run control's, for the simulation that checks
        # them against each other cycle by cycle
        self.probes = dict(run=s.run, checking=s.checking, running=s.running, train_run=s.train_run,
                           first=s.first, stopped=s.stopped, is_train=s.is_train, pipe_reset=s.pipe_reset,
                           cfg=s.cfg)


PIPELINE_UNIT_TOP = "gnnweave_pipeline_unit"


class PipelineUnitTop(UnitTop):
    """The Pipeline unit alone (its bench's design): ``control``, ``gmem``, ``interrupt``."""

    def __init__(self, config: PipelineUnitConfig = PipelineUnitConfig()):
        self.config = config
        super().__init__(pipeline_unit_regmap(config), unit_bus(config), lambda: PipelineUnitCore(config))
