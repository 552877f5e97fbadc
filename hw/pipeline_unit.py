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
from .blocks import BufferedFIFO, ExtentCheck, RunControl
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
    is issued, so R is never back-pressured. ``start`` (one cycle) latches a job; ``issued``
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

        # the decision: min(remain, to_page, max_burst), its compares side by side
        page_short = to_page < mb
        capped = Mux(page_short, to_page, mb)
        remain_shorter = Mux(page_short, remain <= to_page, remain <= mb)
        fire = Signal()
        with m.If(active & ~decided):
            m.d.sync += [decided.eq(1), burst.eq(Mux(remain_shorter, remain, capped)),
                         burst_len.eq(Mux(remain_shorter, remain - 1, capped - 1)),
                         row_end.eq(remain_shorter), last_row.eq(rows_left == 1),
                         enough.eq(Mux(remain_shorter, credits >= remain,
                                       Mux(page_short, credits >= to_page, credits >= mb)))]
        with m.Elif(decided):
            m.d.sync += enough.eq(~fire & (credits >= burst))

        m.d.comb += [
            self.request.valid.eq(active & decided & enough),
            self.request.payload.addr.eq(addr),
            self.request.payload.len.eq(burst_len),
            self.issued.eq(~active),
        ]
        m.d.comb += fire.eq(self.request.valid & self.request.ready)
        next_page = (BOUNDARY_BYTES - next_row[:12]) >> beat_bits
        with m.If(fire):
            m.d.sync += decided.eq(0)
            with m.If(row_end):
                m.d.sync += [addr.eq(next_row), next_row.eq(next_row + stride),
                             to_page.eq(next_page), remain.eq(row_beats),
                             rows_left.eq(rows_left - 1), active.eq(~last_row)]
            with m.Else():
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
                         rows_left.eq(self.nrows),
                         active.eq((self.row_beats != 0) & (self.nrows != 0))]
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
        gpipe = cfg["schedule"] == 0
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
        with m.If(self.start):
            m.d.sync += [phase.eq(1), self.started.eq(1)]
            m.d.comb += [x.start.eq(1) for x in first]
        with m.Elif(phase == 1):
            with m.If(done[1]):
                m.d.sync += phase.eq(2)
                m.d.comb += [x.start.eq(1) for x in second]
        with m.Elif(phase == 2):
            with m.If(done[2]):
                m.d.sync += phase.eq(3)
                m.d.comb += [x.start.eq(1) for x in self.extent.values()]
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
        fill_left = Signal(range(c.max_rows + 1), name="sizes_fill_left", reset_less=True)
        fill_one = Signal(name="sizes_fill_one", reset_less=True)
        filled = self.filled
        with m.If(self.start):
            m.d.sync += [fill_left.eq(rows), fill_one.eq(rows == 1), filled.eq(rows == 0)]
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
        c = self.config
        m = Module()
        K, L = c.stages, c.lanes
        aw, bpb, epb = c.addr_width, c.bytes_per_beat, c.elems_per_beat
        align = bpb - 1
        beat_bits = bpb.bit_length() - 1
        spb = epb // L                         # stream segments per beat (>= 2)
        wpb = c.bus_width // (32 * L)          # master words per beat (>= 1)

        m.submodules.run = run = RunControl(drain=True, hold_first=True)
        clear = Signal()          # datapath reset (the CHECK state of every run)
        pipe_reset = Signal()     # Pipeline reset (after an aborted TRAIN only)
        cfg = {name: Signal(len(sig), name=f"run_{name}") for name, sig in self.cfg.items()}
        mode = cfg["pipe_mode"]
        # the mode's flags as registers (the configuration is steady from start)
        is_load, is_store, is_train = Signal(), Signal(), Signal()
        m.d.sync += [is_load.eq(mode == PipelineMode.LOAD_WEIGHTS.value),
                     is_store.eq(mode == PipelineMode.STORE_WEIGHTS.value),
                     is_train.eq(mode == PipelineMode.TRAIN.value)]
        sched = cfg["schedule"]
        # a register too (the 32-bit compare selected the backward order's steps)
        gpipe = Signal()
        m.d.sync += gpipe.eq(sched == 0)
        mbs, steps, rows = cfg["microbatches"], cfg["steps"], cfg["rows"]
        # the run's sizes, computed in CHECK by bit-serial multipliers (see _RunSizes)
        sizes = _RunSizes(m, cfg, c, K)
        n_total = sizes.n_total
        # flags of the run's configuration, as registers (the configuration is steady)
        dx_on = Signal()
        mbs_m1, two_mbs_m1 = Signal(8), Signal(9)
        m.d.sync += [dx_on.eq(cfg["dx_addr"] != 0), mbs_m1.eq(mbs[:8] - 1),
                     two_mbs_m1.eq((mbs[:8] << 1) - 1)]

        # ---- the Pipeline (not reset with the datapath: its weights live across runs) ----
        pipe = c.pipeline()
        m.submodules.pipeline = ResetInserter(pipe_reset)(pipe)
        m.d.comb += [pipe.schedule.eq(sched), pipe.microbatches.eq(mbs), pipe.steps.eq(steps),
                     pipe.total_stages.eq(K), pipe.stage_offset.eq(0)]
        for i in range(K):
            m.d.comb += getattr(pipe, f"s{i}_rows").eq(rows)
            for name, _ in STAGE_REGISTERS:
                m.d.comb += getattr(pipe, f"s{i}_{name}").eq(cfg[f"s{i}_{name}"])
            for name in STAGE_COUNTERS:
                m.d.comb += self.stat[f"s{i}_{name}"].eq(getattr(pipe, f"s{i}_{name}"))
        d_first = cfg["s0_d_in"]
        d_last = cfg[f"s{K - 1}_d_out"]
        sel = cfg["stage"]
        # the selected stage's dimensions and select flags, registered
        sel_d_in, sel_d_out = Signal(32), Signal(32)
        sel_is = [Signal(name=f"sel_is_{i}") for i in range(K)]
        m.d.sync += [sel_d_in.eq(Array(cfg[f"s{i}_d_in"] for i in range(K))[sel[:3] if K > 1 else 0]),
                     sel_d_out.eq(Array(cfg[f"s{i}_d_out"] for i in range(K))[sel[:3] if K > 1 else 0])]
        m.d.sync += [flag.eq(sel == i) for i, flag in enumerate(sel_is)]

        # ---- datapath (reset at the start of every run) ----------------------------------
        dp = Module()
        # 0 weights, 1 grad, 2 act; each client's guard in stages of its own
        read_port = ReadPort(self.bus, num_clients=3, registered_requests=True, zero_flag=True)
        # single beats in, INCR bursts out (consecutive beats joined, up to max_burst)
        write_port = WritePort(self.bus, beat_depth=16, address_depth=16,
                               coalesce=c.max_burst >= 2, max_burst=max(c.max_burst, 2))
        # which logits microbatches are in memory (write responses cover their last beat)
        markers = WriteCompletion()
        offset_width = aw + 13
        write_queue = CheckedWriteQueue(addr_width=aw + 41, offset_width=offset_width,
                                        bus_width=c.bus_width)
        rd = dict(addr_width=aw, bus_width=c.bus_width, max_burst=c.max_burst,
                  fifo_beats=c.fifo_beats)
        w_reader = RowReader(read_port.requests[0], read_port.responses[0], **rd)
        g_reader = RowReader(read_port.requests[1], read_port.responses[1], **rd)
        a_reader = RowReader(read_port.requests[2], read_port.responses[2], **rd)
        for name, sub in (("read_port", read_port), ("write_port", write_port), ("markers", markers),
                          ("write_queue", write_queue), ("w_reader", w_reader),
                          ("g_reader", g_reader), ("a_reader", a_reader)):
            dp.submodules[name] = sub
        for i, buf in enumerate(("w", "grad", "act")):
            m.d.comb += [read_port.guard_base[i].eq(cfg[f"{buf}_addr"]),
                         read_port.guard_size[i].eq(cfg[f"{buf}_size"])]

        def row_beats(cols, elem_bytes):
            # a register (the configuration is steady from start; a job starts in RUN): no
            # adder in front of a reader's start
            beats = Signal(16, reset_less=True)
            m.d.sync += beats.eq((cols * elem_bytes + align) >> beat_bits)
            return beats

        stopped = Signal()        # a fault was found: from the next cycle nothing proceeds
        # the run's phase as registers of the unit, each set a cycle ahead from what moves
        # the run control (its outputs decode its state; they feed hundreds of loads here)
        checking = Signal()       # CHECK (== run.checking)
        running = Signal()        # RUN, no fault: traffic may proceed (run.running & ~stopped)
        train_run = Signal()      # running & is_train
        first = Signal()          # first RUN cycle (== run.first)

        # ---- stream unpacking: beats -> row segments of `lanes` elements ------------------
        # the microbatch's rows as registers of its width (rows <= max_rows once checked)
        rows_bits = max(c.max_rows.bit_length(), 1)
        rows_m1 = Signal(rows_bits, reset_less=True)
        rows_one = Signal(reset_less=True)
        m.d.sync += [rows_m1.eq(rows[:rows_bits] - 1), rows_one.eq(rows == 1)]

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
            with dp.If(first):
                dp.d.sync += [left.eq(cols_w), last_row.eq(rows_one), after.eq(rows_m1),
                              row_end.eq(one_seg)]
            seg = reader.data.word_select(b_j, L * MAC_INPUT_WIDTH)
            pl = port.payload
            dp.d.comb += [
                port.valid.eq(reader.valid & train_run),
                pl.row.eq(r), pl.col.eq(col), pl.count.eq(Mux(row_end, left, L)),
                pl.data.as_value().eq(seg), pl.relu_mask.eq(0),
                pl.last.eq(row_end & last_row),
            ]
            with dp.If(port.valid & port.ready):
                dp.d.sync += [b_j.eq(b_j + 1), col.eq(col + L), left.eq(left - L),
                              row_end.eq(left <= 2 * L)]
                with dp.If(row_end):
                    dp.d.comb += reader.pop.eq(1)
                    dp.d.sync += [b_j.eq(0), col.eq(0), left.eq(cols_w), row_end.eq(one_seg)]
                    with dp.If(last_row):
                        dp.d.sync += [r.eq(0), after.eq(rows_m1), last_row.eq(rows_one)]
                    with dp.Else():
                        dp.d.sync += [r.eq(r + 1), after.eq(after - 1), last_row.eq(after == 1)]
                with dp.Elif(b_j == spb - 1):
                    dp.d.comb += reader.pop.eq(1)

        unpack(a_reader, pipe.act_in, d_first, c.max_in, "act")
        unpack(g_reader, pipe.grad_in, d_last, c.max_out, "grad")

        # inputs: one job over all N * rows rows
        m.d.comb += [a_reader.base.eq(cfg["act_addr"]), a_reader.stride.eq(cfg["act_stride"]),
                     a_reader.nrows.eq(sizes.n_rows), a_reader.row_beats.eq(row_beats(d_first, ELEM_BYTES))]
        dp.d.comb += a_reader.start.eq(first & is_train)

        # ---- microbatch order of a backward stream (last stage's grad_in, stage 0's dX) ----
        def backward_order(fire_last, name, buf=None):
            """Index (and, for ``buf``, base address) of the microbatch a backward-ordered
            stream is at, as registers; the address moves by precomputed steps, no
            multiply. GPipe walks a step's microbatches down, then jumps to the next step's
            last; the 1F1B schedules walk up."""
            left = Signal(8, name=f"{name}_left")        # microbatches after this one in its step
            step_end = Signal(name=f"{name}_step_end")   # left == 0
            mb = Signal(24, name=f"{name}_mb")
            addr = Signal(aw + 40, name=f"{name}_addr")
            with dp.If(fire_last):
                dp.d.sync += [left.eq(left - 1), step_end.eq(left == 1),
                              mb.eq(Mux(gpipe, Mux(step_end, mb + two_mbs_m1, mb - 1), mb + 1))]
                with dp.If(step_end):
                    dp.d.sync += [left.eq(mbs_m1), step_end.eq(mbs_m1 == 0)]
                if buf is not None:
                    dp.d.sync += addr.eq(addr + Mux(step_end, sizes.step_delta[buf], sizes.inner_delta[buf]))
            with dp.If(first):
                dp.d.sync += [left.eq(mbs_m1), step_end.eq(mbs_m1 == 0),
                              mb.eq(Mux(gpipe, mbs_m1, 0))]
                if buf is not None:
                    dp.d.sync += addr.eq(cfg[f"{buf}_addr"] + Mux(gpipe, sizes.last_off[buf], 0))
            return mb, addr

        # gradients: one job per microbatch, only below the doorbell; the job's conditions
        # are registers, so a job waits two cycles after the one before (its index settles).
        # The start itself is a flip-flop set a cycle after its conditions (their AND is
        # not in front of the reader's wide load); while it is pending no other decides
        g_jobs_left = Signal(24)
        g_mb, g_job_base = backward_order(g_reader.start, "grad_order", "grad")
        g_recent = Signal(2)
        g_may = Signal()
        g_go = Signal(attrs={"max_fanout": 64})
        dp.d.sync += [g_recent.eq(Cat(g_reader.start, g_recent[0])),
                      g_may.eq(g_mb < self.cfg["grads_ready"])]   # live: the host raises it
        g_jobs_any = Signal()     # g_jobs_left != 0, a register
        # the reader's issued flag a cycle late: it falls only at a start, which g_recent
        # covers for two cycles, so the copy is never high while the reader is active
        g_issued = Signal()
        dp.d.sync += g_issued.eq(g_reader.issued)
        g_free = train_run & ~first & ~g_go & ~g_recent.any() & g_issued & g_jobs_any
        dp.d.sync += g_go.eq(g_free & g_may)
        # a fault in the cycle between stops the pending start too
        dp.d.comb += [g_reader.start.eq(g_go & train_run)]
        m.d.comb += [g_reader.base.eq(g_job_base), g_reader.stride.eq(cfg["grad_stride"]),
                     g_reader.nrows.eq(rows), g_reader.row_beats.eq(row_beats(d_last, ELEM_BYTES))]
        with dp.If(first):
            dp.d.sync += [g_jobs_left.eq(n_total), g_jobs_any.eq(n_total != 0)]
        with dp.Elif(g_reader.start):
            dp.d.sync += [g_jobs_left.eq(g_jobs_left - 1), g_jobs_any.eq(g_jobs_left != 1)]
        grad_wait = Signal()
        m.d.comb += grad_wait.eq(g_free & ~g_may)

        # ---- weight load: beats -> master words of the selected stage ----------------------
        m.d.comb += [w_reader.base.eq(cfg["w_addr"]), w_reader.stride.eq(cfg["w_stride"]),
                     w_reader.nrows.eq(sel_d_in), w_reader.row_beats.eq(row_beats(sel_d_out, MASTER_BYTES))]
        dp.d.comb += w_reader.start.eq(first & is_load)
        lw_row, lw_word = Signal(16), Signal(16)
        lw_left = Signal(16)       # elements of the row from this word on
        lw_j = Signal(range(max(wpb, 2)))
        # the walks' row-end and done flags are registers, set a word ahead from the
        # counters and copies of the limits (steady from start): no compare of a counter
        # with a limit sits in front of the walk's enables
        out_one_word = Signal()             # sel_d_out <= L: every word ends its row
        sel_d_in_m1 = Signal(16, reset_less=True)
        m.d.sync += [out_one_word.eq(sel_d_out <= L), sel_d_in_m1.eq(sel_d_in[:16] - 1)]
        lw_row_end, lw_done = Signal(), Signal()
        # the last row's compare, a net of its own (kept): the word's handshake only chooses
        # whether lw_done takes it, instead of a tree ABC rebuilds around the compare
        lw_last_row = Signal(name="lw_last_row", attrs={"keep": 1})
        dp.d.comb += lw_last_row.eq(lw_row == sel_d_in_m1)
        with dp.If(first):
            dp.d.sync += [lw_left.eq(sel_d_out), lw_row_end.eq(out_one_word), lw_done.eq(sel_d_in == 0)]
        load_valid = Signal()
        dp.d.comb += load_valid.eq(running & is_load & w_reader.valid)
        load_word = Signal(L * 32)
        raw = w_reader.data.word_select(lw_j, L * 32) if wpb > 1 else w_reader.data[:L * 32]
        # the word's lanes inside the row (lw_left > lane), registers set a word ahead
        lw_keep = Signal(L)
        out_keep = Signal(L, reset_less=True)       # a row's first word: sel_d_out > lane
        m.d.sync += out_keep.eq(Cat(*(sel_d_out > lane for lane in range(L))))
        for lane in range(L):
            dp.d.comb += load_word.word_select(lane, 32).eq(Mux(lw_keep[lane], raw.word_select(lane, 32), 0))
        with dp.If(first):
            dp.d.sync += lw_keep.eq(out_keep)
        with dp.If(load_valid):
            dp.d.sync += [lw_word.eq(lw_word + 1), lw_left.eq(lw_left - L), lw_row_end.eq(lw_left <= 2 * L),
                          lw_keep.eq(Cat(*(lw_left > lane + L for lane in range(L))))]
            with dp.If(lw_row_end):
                dp.d.comb += w_reader.pop.eq(1)
                dp.d.sync += [lw_j.eq(0), lw_word.eq(0), lw_left.eq(sel_d_out), lw_row.eq(lw_row + 1),
                              lw_row_end.eq(out_one_word), lw_done.eq(lw_last_row),
                              lw_keep.eq(out_keep)]
            with dp.Elif(lw_j == wpb - 1):
                dp.d.comb += w_reader.pop.eq(1)
                dp.d.sync += lw_j.eq(0)
            with dp.Else():
                dp.d.sync += lw_j.eq(lw_j + 1)
        load_done = lw_done

        # ---- weight store: master words -> single-beat writes ------------------------------
        sw_row, sw_word = Signal(16), Signal(16)
        sw_left = Signal(16)       # elements of the row from this word on
        sw_keep = Signal(L)        # sw_left > lane, registers set a word ahead
        sw_settled = Signal()      # w_rd_data holds the word at (sw_row, sw_word)
        sw_row_addr = Signal(aw + 16)
        sw_row_end = Signal()      # sw_left <= L: the word is its row's last
        store_done = Signal()      # sw_row == sel_d_in
        # sw_row == sel_d_in_m1 from a register: a row's last word is taken at least two
        # cycles after its row stepped (a take clears sw_settled), so a cycle late is in time
        sw_last_row = Signal()
        dp.d.sync += sw_last_row.eq(sw_row == sel_d_in_m1)
        store_valid = Signal()
        dp.d.comb += store_valid.eq(running & is_store & sw_settled & ~store_done)
        with dp.If(first):
            dp.d.sync += [sw_left.eq(sel_d_out), sw_row_end.eq(out_one_word), store_done.eq(sel_d_in == 0),
                          sw_keep.eq(out_keep)]

        w_row = Mux(is_load, lw_row, sw_row)
        w_word = Mux(is_load, lw_word, sw_word)
        rd_words = []
        for i in range(K):
            m.d.comb += [getattr(pipe, f"s{i}_w_row").eq(w_row), getattr(pipe, f"s{i}_w_word").eq(w_word),
                         getattr(pipe, f"s{i}_w_wr_data").eq(load_word),
                         getattr(pipe, f"s{i}_w_wr_en").eq(load_valid & sel_is[i]),
                         # the same word of the velocity is cleared (v_wr_data stays 0)
                         getattr(pipe, f"s{i}_v_row").eq(w_row), getattr(pipe, f"s{i}_v_word").eq(w_word),
                         getattr(pipe, f"s{i}_v_wr_en").eq(load_valid & sel_is[i])]
            rd_words.append(getattr(pipe, f"s{i}_w_rd_data"))
        rd_word = Signal(L * 32)
        m.d.comb += rd_word.eq(Array(rd_words)[sel[:3] if K > 1 else 0])

        # ---- writes: logits (act_out), dX (grad_out), stored weights -----------------------
        status = self.stat["status"]

        # the Pipeline's output streams end in band writers: each collects a band of rows
        # (the cores emit tile by tile) and sends it row by row, so a row's beats are
        # consecutive and join into bursts; their ready and beats are registers
        def band_writer(port, cols, name):
            w = BandWriter(lanes=L, index_bits=len(port.payload.row), bus_width=c.bus_width,
                           max_cols=c.max_out if name == "logits" else c.max_in)
            dp.submodules[f"{name}_band"] = w
            dp.d.comb += [w.rows.eq(rows), w.cols.eq(cols),
                          w.segments.payload.eq(port.payload), w.segments.valid.eq(port.valid & train_run),
                          port.ready.eq(w.segments.ready & train_run)]
            # its beats pass a register slice: the writer's bank logic sees a flip-flop as
            # ready, not the choice among the writers and the queue's credits
            out = SkidBuffer(w.beats.payload.shape())
            dp.submodules[f"{name}_beats"] = out
            wiring.connect(dp, w.beats, out.i)
            # a beat in the slice is pending too (its skid entry only when the main one is)
            return SimpleNamespace(beats=out.o, pending=w.pending | out.o.valid)

        lg_w = band_writer(pipe.act_out, d_last, "logits")
        dx_w = band_writer(pipe.grad_out, d_first, "dx")
        lg_pl, dx_pl = lg_w.beats.payload, dx_w.beats.payload

        # every beat enters the checked queue with its address as base + row offset + beat
        # offset and its buffer; logits first, then dX, then stored weights
        entry = write_queue.beats
        ep = entry.payload
        room = entry.ready
        take_lg = train_run & lg_w.beats.valid & room
        take_dx = train_run & ~lg_w.beats.valid & dx_w.beats.valid & dx_on & room
        take_st = store_valid & room
        lg_base = Signal(aw + 40)
        with dp.If(take_lg & lg_pl.last):
            dp.d.sync += lg_base.eq(lg_base + sizes.mb_bytes["logits"])
        _, dx_base = backward_order(take_dx & dx_pl.last, "dx_order", "dx")

        def buffer(buf):
            return [ep.buf_base.eq(cfg[f"{buf}_addr"]), ep.buf_size.eq(cfg[f"{buf}_size"])]

        word_bytes = Signal(32)
        dp.d.comb += word_bytes.eq(sw_word * (L * MASTER_BYTES))
        st_off = word_bytes[:beat_bits]
        # the word's elements in the row: lanes below sw_left
        st_strb = Cat(*[Mux(sw_keep[lane], Const((1 << MASTER_BYTES) - 1, MASTER_BYTES), 0)
                        for lane in range(L)]) << st_off
        st_data = rd_word << (st_off * 8)
        # the beat's fields are chosen by the writers' valid flags alone (flip-flops; the
        # queue takes the fields only with entry.valid), so its ready, a credit count, is
        # not in front of the hundreds of loads the choice reaches
        with dp.If(lg_w.beats.valid):
            dp.d.comb += [ep.base.eq(lg_base), ep.row_offset.eq(sizes.row_offset(dp, "logits", lg_pl.row)),
                          ep.beat_offset.eq(lg_pl.beat << beat_bits), ep.data.eq(lg_pl.data),
                          ep.strb.eq(lg_pl.strb), ep.mark.eq(lg_pl.last), *buffer("logits")]
        with dp.Elif(dx_w.beats.valid):
            dp.d.comb += [ep.base.eq(dx_base), ep.row_offset.eq(sizes.row_offset(dp, "dx", dx_pl.row)),
                          ep.beat_offset.eq(dx_pl.beat << beat_bits), ep.data.eq(dx_pl.data),
                          ep.strb.eq(dx_pl.strb), *buffer("dx")]
        with dp.Else():
            dp.d.comb += [ep.base.eq(sw_row_addr), ep.row_offset.eq(0),
                          ep.beat_offset.eq(word_bytes & ~Const(align, 32)), ep.data.eq(st_data),
                          ep.strb.eq(st_strb), *buffer("w")]
        dp.d.comb += [entry.valid.eq(take_lg | take_dx | take_st),
                      lg_w.beats.ready.eq(train_run & room),
                      # dX of a run without a dx buffer: taken and dropped
                      dx_w.beats.ready.eq(train_run & ((~lg_w.beats.valid & room) | ~dx_on))]

        # the queue's head: pushed when its registered verdict holds and no fault was found;
        # a head outside its buffer is dropped and raises the fault, which holds every later
        # push back (the run stops a cycle later)
        head = write_queue.queued
        write_fault = Signal()
        # flip-flops only (the port's queues' own w_rdy compare their levels)
        can_push = write_port.room & markers.room
        live = head.valid & ~write_fault & ~stopped
        push = Signal()
        fault_found = Signal()
        dp.d.comb += [push.eq(live & head.payload.inside & can_push),
                      fault_found.eq(live & ~head.payload.inside),
                      # after a fault every beat left is dropped, so the queue drains
                      head.ready.eq(push | (head.valid & (write_fault | stopped | ~head.payload.inside)))]
        with dp.If(fault_found):
            dp.d.sync += write_fault.eq(1)
        # single-beat bursts (len 0, last 1); Cat in the layouts' field order
        dp.d.comb += [write_port.address.w_data.eq(Cat(head.payload.addr[:aw], Const(0, 8))),
                      write_port.address.w_en.eq(push),
                      write_port.beats.w_data.eq(Cat(head.payload.data, head.payload.strb, Const(1, 1))),
                      write_port.beats.w_en.eq(push), markers.push.eq(push),
                      markers.mark.eq(head.payload.mark)]

        with dp.If(first):
            dp.d.sync += [lg_base.eq(cfg["logits_addr"]), sw_row_addr.eq(cfg["w_addr"])]
        # store walk: present (row, word), wait a cycle for the read, queue, next word
        with dp.If(running & is_store & ~store_done):
            with dp.If(~sw_settled):
                dp.d.sync += sw_settled.eq(1)
            with dp.Elif(take_st):
                dp.d.sync += [sw_settled.eq(0), sw_word.eq(sw_word + 1), sw_left.eq(sw_left - L),
                              sw_row_end.eq(sw_left <= 2 * L),
                              sw_keep.eq(Cat(*(sw_left > lane + L for lane in range(L))))]
                with dp.If(sw_row_end):
                    dp.d.sync += [sw_word.eq(0), sw_left.eq(sel_d_out), sw_row.eq(sw_row + 1),
                                  sw_row_addr.eq(sw_row_addr + cfg["w_stride"]),
                                  sw_row_end.eq(out_one_word), store_done.eq(sw_last_row),
                                  sw_keep.eq(out_keep)]

        # write responses: in order (one ID), each for the burst of the AW before it; a
        # microbatch's logits are in once the responses cover the beats up to its last
        bus = self.bus
        dp.d.comb += [markers.aw_fire.eq(bus.awvalid & bus.awready), markers.aw_len.eq(bus.awlen),
                      markers.b_fire.eq(bus.bvalid & bus.bready)]
        logits_done = self.stat["logits_done"]
        logits_b = Signal()
        dp.d.comb += logits_b.eq(markers.completed)

        # ---- configuration check -------------------------------------------------------
        weights_checks = [sel >= K, sel_d_in == 0, sel_d_in > c.max_in, sel_d_out == 0, sel_d_out > c.max_out,
                          sizes.buffer_bad("w", sel_d_out, MASTER_BYTES)]
        train_checks = [
            sched > 2, mbs == 0, mbs > 255, steps == 0, steps > 65535, rows == 0, rows > c.max_rows,
            gpipe & (mbs > c.slots),
            sizes.buffer_bad("act", d_first, ELEM_BYTES),
            sizes.buffer_bad("logits", d_last, ELEM_BYTES),
            sizes.buffer_bad("grad", d_last, ELEM_BYTES),
            (cfg["dx_addr"] != 0) & sizes.buffer_bad("dx", d_first, ELEM_BYTES),
        ]
        for i in range(K):
            s = lambda name: cfg[f"s{i}_{name}"]  # noqa: E731
            train_checks += [s("d_in") == 0, s("d_in") > c.max_in, s("d_out") == 0, s("d_out") > c.max_out,
                             s("relu") > 1, s("dx_first") > 1, s("fwd_shift") > 63, s("dx_shift") > 63,
                             s("dw_shift") > 63, s("lr") >> 16 != 0, s("wd") >> 16 != 0, s("mu") >> 16 != 0]
            if i + 1 < K:
                train_checks.append(s("d_out") != cfg[f"s{i + 1}_d_in"])
        # every check from registers into a register of its own, their OR into err_config a
        # cycle later (no compare in front of the OR tree): valid once the sizes are in
        def registered(checks, name):
            flags = Signal(len(checks), name=name)
            m.d.sync += flags.eq(Cat(*checks))
            return flags.any()
        err_config = Signal()
        m.d.sync += err_config.eq((mode > 2) | (is_train & registered(train_checks, "train_checks")) |
                                  (~is_train & registered(weights_checks, "weights_checks")))

        # ---- counters --------------------------------------------------------------------
        busy = run.busy
        stall = (bus.arvalid & ~bus.arready) | (bus.awvalid & ~bus.awready) | (bus.wvalid & ~bus.wready)
        increments = {"busy_cycles": 1, "read_beats": read_port.beat, "write_beats": write_port.beat,
                      "stall_cycles": stall, "grad_wait_cycles": grad_wait}
        fault = Signal()
        m.d.comb += fault.eq((status & Status.ADDR_FAULT) != 0)
        with m.If(busy):
            for name, inc in increments.items():
                m.d.sync += self.stat[name].eq(self.stat[name] + inc)
            with m.If(logits_b):
                m.d.sync += logits_done.eq(logits_done + 1)
            with m.If(read_port.resp_error | write_port.resp_error):
                m.d.sync += status.eq(status | Status.AXI_ERROR)
            with m.If(read_port.fault | fault_found):
                m.d.sync += [status.eq(status | Status.ADDR_FAULT), stopped.eq(1)]
        m.d.comb += read_port.enable.eq(~fault)

        # ---- run control -----------------------------------------------------------------
        pipe_finished = Signal()
        with m.If(pipe.done):
            m.d.sync += pipe_finished.eq(1)
        check_done = Signal()
        # the sizes start in CHECK's first cycle, from a flip-flop (run.accept a cycle
        # late, which is checking & ~sizes.started): the start fans out to every size's
        # and extent's operand registers
        sizes_start = Signal(name="sizes_start")
        m.d.sync += sizes_start.eq(run.accept)
        m.d.comb += [
            run.start.eq(self.start), self.idle.eq(run.idle), self.done.eq(run.done),
            # the sizes take tens of cycles (bit-serial), the checks one more
            sizes.start.eq(sizes_start), check_done.eq(sizes.ready),
            run.check_done.eq(check_done), run.check_error.eq(err_config),
            clear.eq(checking),
            run.stop.eq(stopped),
            run.finished.eq(Mux(is_train, pipe_finished, Mux(is_load, load_done, store_done))),
            run.drained.eq(write_queue.empty & write_port.idle & ~lg_w.pending & ~dx_w.pending),
            # nothing new is issued; once the traffic in flight is in, the Pipeline (which
            # may wait for data that will never come) is reset
            run.quiet.eq(read_port.no_outstanding & write_port.idle),
        ]
        # the Pipeline's reset is a register (it reaches every flip-flop of the stages):
        # high in the FINISH cycle after the abort, so the next run finds it reset
        m.d.sync += pipe_reset.eq(run.abort_done & is_train)
        # CHECK -> RUN next cycle; RUN ends by finishing or by a fault found now (stopped
        # is set and run.running & ~stopped drops: the same cycle as with the decoded state)
        enter_run = checking & check_done & ~err_config
        stays = running & ~run.completing & ~(read_port.fault | fault_found)
        m.d.sync += [checking.eq(run.accept | (checking & ~check_done)),
                     running.eq(enter_run | stays), train_run.eq((enter_run | stays) & is_train),
                     first.eq(enter_run)]
        # the Pipeline starts from a register, in the first RUN cycle: no path runs from the
        # sizes and the check into the stages' start decisions
        pipe_start = Signal()
        m.d.sync += pipe_start.eq(enter_run & is_train)
        m.d.comb += pipe.start.eq(pipe_start)
        with m.If(run.accept):
            m.d.sync += [cfg[name].eq(sig) for name, sig in self.cfg.items()]
            m.d.sync += [status.eq(0), pipe_finished.eq(0), stopped.eq(0)]
            m.d.sync += [self.stat[name].eq(0) for name in (*increments, "logits_done")]
        with m.If(run.config_error):
            m.d.sync += status.eq(Status.CONFIG_ERROR)

        m.submodules.datapath = ResetInserter(clear)(dp)
        # the registered phase beside the run control's, for the simulation that checks
        # them against each other cycle by cycle
        self.probes = dict(run=run, checking=checking, running=running, train_run=train_run,
                           first=first, stopped=stopped, is_train=is_train, pipe_reset=pipe_reset,
                           cfg=cfg)
        return m


PIPELINE_UNIT_TOP = "gnnweave_pipeline_unit"


class PipelineUnitTop(UnitTop):
    """The Pipeline unit alone (its bench's design): ``control``, ``gmem``, ``interrupt``."""

    def __init__(self, config: PipelineUnitConfig = PipelineUnitConfig()):
        self.config = config
        super().__init__(pipeline_unit_regmap(config), unit_bus(config), lambda: PipelineUnitCore(config))
