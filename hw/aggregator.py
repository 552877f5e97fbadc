"""The Aggregator: GNN neighbour aggregation over a CSR graph in memory.

``out[v] = reduce_{u in N(v)} w_uv * x[u]`` (sum / mean / max), bit-exact to
:mod:`gnnweave.golden.aggregate` (read its docstring: it is the specification).

Microarchitecture (one AXI4 manager port, reads and writes in flight at once); each box
is a component of its own (``hw/aggregator_*.py``), wired with ``connect()``::

    indptr ─┐ ElementReader x3  register   EdgeWalk ──> RowAddress ──> row ids ──> RowGather
    indices ├─ (INCR bursts,  ──> slices ──>    │        (DSP tiles)                (bursts)
    weights ┘   credits)                        └─> descriptors ─> ReciprocalPipe      │
                                                                      │             row FIFO
    ConfigCheck (CHECK state, sequential)                        descriptor FIFO      │
                                                                      └──> Reduce: a/b, M, P
                                                                           registers, accumulate
                                                                           into 2 banks
                                         WritePort (AW/W/B) <── OutputStage <── Drain

* The edge walk follows the (clamped) row pointers, range-checks every index against
  the node count (an index ``>= N`` is skipped and counted: no read is issued for it),
  and issues one feature-row read per valid edge, so up to ``reads_in_flight`` beats of
  gathered rows are in flight: memory latency is hidden and the read port, not the
  control, limits throughput.
* Each client reads with its own AXI ID, so its beats come back in order; room for every
  beat is reserved before the request is issued (credits), so R is never stalled. Every
  pipeline below (row addresses, reciprocals, products, output stage) runs without a
  stall: room at its end is reserved before an element enters it.
* Accumulators are double-banked: node ``k+1`` accumulates while node ``k`` is narrowed
  and written. ``mean`` multiplies by ``round(2**24 / degree)`` from a pipelined
  restoring divider on the descriptor path (1 per cycle, no divider per lane).
* Timing: every multiply is cut into DSP48E2-sized tiles with their operand, M and P
  registers (:class:`~.arith.PipelinedMultiplier`); rounding, saturation and narrowing
  have a stage each (:class:`~.aggregator_output.OutputStage`); addresses advance by
  adds; the configuration check runs over a few cycles (:mod:`.aggregator_check`);
  control decisions start from flip-flops (register slices on every stream between
  components, counter compares kept as flags set a cycle ahead, one flip-flop per state
  of the edge walk, the row pointers clamped and compared a stage ahead of it, completion
  terms registered); datapath registers have no reset, only control state does.
* Every burst is checked against its configured buffer by the :class:`~.dma.ReadPort`
  guard and the configuration is checked before any traffic: no access leaves the
  buffers the host configured, whatever the memory contents.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, DomainRenamer, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from gnnweave.buildconfig import AggregatorParams
from gnnweave.fixed import ACC_GUARD_BITS, MEAN_RECIP_BITS

from .aggregator_check import ConfigCheck
from .aggregator_drain import Drain
from .aggregator_gather import RowAddress, RowGather, row_bursts_layout
from .aggregator_output import OutputStage
from .aggregator_reduce import Reduce
from .aggregator_walk import EdgeWalk, descriptor_layout
from .axi import BusParams, UnitCore
from .blocks import (BufferedFIFO, ElementReader, EventCounters, RegisteredFIFO, RunControl,
                     StreamRegister, status_bit)
from .dma import ReadPort, WritePort, read_request_layout, write_address_layout
from gnnweave.contract import AGGREGATOR_CONFIG_REGISTERS as CONFIG_REGISTERS  # noqa: F401
from gnnweave.contract import AGGREGATOR_STATUS_REGISTERS as STATUS_REGISTERS  # noqa: F401
from gnnweave.contract import AggregatorStatus as Status  # noqa: F401


@dataclass(frozen=True)
class AggregatorConfig(AggregatorParams, BusParams):
    """Build-time parameters of one Aggregator instance: the fields (and defaults) of the
    build's :class:`~gnnweave.buildconfig.AggregatorParams`, with what one Aggregator can
    build checked and its beat geometry derived."""

    def __post_init__(self):
        self.check_bus()
        if self.elem_width not in (8, 16):
            raise ValueError(f"elem_width must be 8 or 16, not {self.elem_width}")
        if not 1 <= self.max_feat_dim or self.max_feat_dim * self.elem_width > 4096 * 8:
            raise ValueError(f"max_feat_dim={self.max_feat_dim}: a row must fit one 4 KiB page")
        unknown = set(self.reduce_ops) - {"sum", "mean", "max"}
        if unknown or not self.reduce_ops:
            raise ValueError(f"reduce_ops must be a non-empty subset of sum, mean, max; got {self.reduce_ops}")
        if self.reads_in_flight < self.max_beats:
            raise ValueError("reads_in_flight must hold at least one whole row")

    @property
    def lanes(self) -> int:
        return self.bus_width // self.elem_width

    @property
    def max_beats(self) -> int:
        return -(-self.max_feat_dim // self.lanes)

    @property
    def acc_width(self) -> int:
        return 2 * self.elem_width + ACC_GUARD_BITS


#: Output beats the write port buffers: covers the output stage's latency, so the drain
#: never waits for its own beats in flight.
W_BEATS = 32


class ReduceOp(enum.Enum, shape=2):
    SUM = 0
    MEAN = 1
    MAX = 2


def aggregator_regmap(config: AggregatorConfig | None = None):
    """The register map of the Aggregator top (the one source of its offsets)."""
    from .regmap import RegisterBuilder
    return RegisterBuilder.unit("gnnweave_aggregator", CONFIG_REGISTERS, STATUS_REGISTERS)


def reciprocal_layout(payload_layout) -> data.StructLayout:
    """A descriptor with its mean's reciprocal."""
    return data.StructLayout({"desc": payload_layout, "recip": MEAN_RECIP_BITS + 1})


class ReciprocalPipe(wiring.Component):
    """``round(2**MEAN_RECIP_BITS / count)`` (half up), one per cycle, fixed latency.

    A restoring divider unrolled into ``MEAN_RECIP_BITS + 1`` registered stages behind an
    input register; the payload (which holds ``count``, the divisor) travels alongside.
    Nothing stalls it: the producer must have room for every element in flight (see
    :attr:`latency`); ``recip`` is 0 for a count of 0. ``busy``: an element is in a stage.
    """

    def __init__(self, payload_layout: data.StructLayout):
        self.layout = payload_layout
        self.latency = MEAN_RECIP_BITS + 2     # an input register, then a stage per bit
        super().__init__({
            "i": In(stream.Signature(payload_layout, always_ready=True)),
            "o": Out(stream.Signature(reciprocal_layout(payload_layout), always_ready=True)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        qbits = MEAN_RECIP_BITS + 1      # the quotient < 2**(MEAN_RECIP_BITS + 1)
        # numerator 2**24 + count//2 < 2**33; quotient bits above qbits are zero, so the
        # division starts from numerator >> qbits as partial remainder.
        # the input from registers: the producer's logic and the first stage's compare do
        # not share a cycle
        in_valid = Signal()
        in_payload = Signal(self.layout, reset_less=True)
        m.d.sync += [in_valid.eq(self.i.valid), in_payload.eq(self.i.payload)]
        # the numerator's adder before the input register: the first stage's compare and
        # subtract start from its flip-flops
        numerator = Signal(34, reset_less=True)
        m.d.sync += numerator.eq((1 << MEAN_RECIP_BITS) + (self.i.payload.count >> 1))
        # a stage carries only what later stages use: the numerator bits still to come
        # down and the quotient bits found so far
        valid, payload, rem, num, quo = (in_valid, in_payload, numerator >> qbits, numerator,
                                         Const(0, 0))
        # a count of 0 (whose division is all ones) as a flag carried down the stages: the
        # output's zeroing is one LUT from flip-flops, not a compare of the count
        zero = payload.count == 0
        valids = [in_valid]
        for stage in range(qbits):
            bit = qbits - 1 - stage
            trial = Cat(num[bit], rem)                   # (rem << 1) | numerator bit
            fits = trial >= payload.count
            n_valid = Signal(name=f"rp{stage}_valid")
            n_payload = Signal(self.layout, name=f"rp{stage}_payload", reset_less=True)
            n_rem = Signal(34, name=f"rp{stage}_rem", reset_less=True)
            n_num = Signal(max(bit, 1), name=f"rp{stage}_num", reset_less=True)
            n_quo = Signal(stage + 1, name=f"rp{stage}_quo", reset_less=True)
            n_zero = Signal(name=f"rp{stage}_zero", reset_less=True)
            m.d.sync += [
                n_valid.eq(valid), n_payload.eq(payload), n_num.eq(num[:bit]),
                n_rem.eq(Mux(fits, trial - payload.count, trial)),
                n_quo.eq(Cat(fits, quo)), n_zero.eq(zero),
            ]
            valid, payload, rem, num, quo, zero = n_valid, n_payload, n_rem, n_num, n_quo, n_zero
            valids.append(n_valid)
        m.d.comb += [
            self.busy.eq(Cat(*valids).any()),
            self.o.valid.eq(valid), self.o.payload.desc.eq(payload),
            self.o.payload.recip.eq(Mux(zero, 0, quo)),
        ]
        return m


class AggregatorCore(UnitCore):
    """The engine without its control slave: ``cfg`` signals in, AXI4 ``bus`` out.

    ``start`` (one cycle, while ``idle``) runs one aggregation with the values of
    ``cfg``; ``done`` pulses when it has finished (results written, all responses in).
    """

    def __init__(self, config: AggregatorConfig = AggregatorConfig()):
        super().__init__(config, CONFIG_REGISTERS, STATUS_REGISTERS)
        #: ``{part: clock domain}`` for the parts of :meth:`parts` that run on a domain of
        #: their own (the simulated device, :mod:`gnnweave.sim.device.top`, gives each a
        #: clock that stops while the part is idle); a part not named runs on ``sync``
        self.part_domains = {}
        #: per part: it holds or takes work (or the datapath is cleared), so an edge of
        #: its clock may change what it holds; low, an edge changes nothing that is read
        self.part_busy = {part: Signal(name=f"{part}_busy") for part in self.parts()}

    def parts(self) -> tuple[str, ...]:
        """The parts that may have a clock domain of their own: the output stage, the
        weights' reader and its register slices (idle in runs without weights), and the
        mean's reciprocal pipeline (a build with ``mean``; it is idle in other runs)."""
        return ("output", "weights") + (("recip",) if "mean" in self.config.reduce_ops else ())

    def _add_part(self, s, part: str | None, name: str, module):
        """``module`` as the datapath's submodule ``name``, on the domain of ``part`` (``sync``
        for None, or a part without a domain of its own)."""
        domain = self.part_domains.get(part, "sync")
        s.dp.submodules[name] = module if domain == "sync" else DomainRenamer(domain)(module)

    def elaborate(self, platform):
        m = Module()
        s = SimpleNamespace()     # the signals the sections share
        self._run_state(m, s)
        self._datapath(m, s)
        self._read_clients(m, s)
        self._row_gather(m, s)
        self._edge_walk(m, s)
        self._reduce_and_drain(m, s)
        self._completion(m, s)
        self._check_and_run(m, s)
        return m

    def _run_state(self, m, s):
        """The run's registered configuration and what a start clears."""
        s.clear = Signal()        # resets the whole datapath at the start of every run
        s.running = Signal()
        s.cfg = {name: Signal(len(sig), name=f"run_{name}") for name, sig in self.cfg.items()}

        def on_start():
            return [s.cfg[name].eq(sig) for name, sig in self.cfg.items()]
        s.on_start = on_start

    def _datapath(self, m, s):
        """The datapath's ports and streams (everything under ``dp`` is cleared at start)."""
        c = self.config
        lanes, bpb, ew, maxb = c.lanes, c.bytes_per_beat, c.elem_width, c.max_beats
        aw = c.addr_width
        s.dp = Module()
        # 0 indptr, 1 indices, 2 weights, 3 rows; registered requests keep the readers' request
        # logic and the guard's adders out of the arbitration (the ECP5 critical path)
        s.read_port = ReadPort(self.bus, num_clients=4, registered_requests=True, zero_flag=True,
                               held_limits=True)
        s.write_port = WritePort(self.bus, beat_depth=W_BEATS, address_depth=4)
        s.ptr_reader, s.idx_reader, s.w_reader = (
            ElementReader(addr_width=aw, data_width=c.bus_width, elem_width=width,
                          fifo_beats=c.meta_fifo_beats, max_burst=c.meta_burst_beats)
            for width in (32, 32, ew))
        s.row_fifo = BufferedFIFO(width=c.bus_width, depth=c.reads_in_flight)
        s.row_address = RowAddress(addr_width=aw, bytes_per_beat=bpb, max_beats=maxb)
        s.id_slots = s.row_address.latency + 4
        # registered flags: the pop reaches no level compare
        s.row_ids = RegisteredFIFO(row_bursts_layout(aw, maxb), s.id_slots)
        desc_layout = descriptor_layout(ew)
        # without `mean` the descriptors skip the divider (and its latency)
        s.recip_pipe = ReciprocalPipe(desc_layout) if "mean" in c.reduce_ops else None
        s.desc_full_layout = reciprocal_layout(desc_layout)
        s.desc_fifo = RegisteredFIFO(s.desc_full_layout, c.desc_depth)
        for name, sub in [("read_port", s.read_port), ("write_port", s.write_port),
                          ("ptr_reader", s.ptr_reader), ("idx_reader", s.idx_reader),
                          ("row_fifo", s.row_fifo), ("row_ids", s.row_ids),
                          ("row_address", s.row_address), ("desc_fifo", s.desc_fifo)]:
            s.dp.submodules[name] = sub
        self._add_part(s, "weights", "w_reader", s.w_reader)
        if s.recip_pipe is not None:
            self._add_part(s, "recip", "recip", s.recip_pipe)

        # derived run constants
        s.check = ConfigCheck(CONFIG_REGISTERS, lanes=lanes, bytes_per_beat=bpb, elem_width=ew,
                              max_feat_dim=c.max_feat_dim, addr_width=aw,
                              reduce_codes=[ReduceOp[op.upper()].value for op in c.reduce_ops])
        m.submodules.check = s.check
        m.d.comb += [s.check.cfg[name].eq(sig) for name, sig in s.cfg.items()]
        # derived run constants, registered by the check
        s.row_beats, s.row_last_beat = s.check.row_beats, s.check.row_last_beat
        s.num_nodes, s.num_edges = s.cfg["num_nodes"], s.cfg["num_edges"]
        s.use_weights = s.cfg["use_weights"][0]
        s.reduce_op = Signal(ReduceOp)
        m.d.comb += s.reduce_op.eq(s.cfg["reduce_op"][:2])

    def _read_clients(self, m, s):
        """The pointer, index and weight readers."""
        c = self.config
        aw = c.addr_width
        # each request reaches the read port through a register slice: the arbiter's ready
        # goes no further than a flip-flop, and no client's logic reaches the arbiter
        request_layout = read_request_layout(aw)
        for i, (reader, buf, part) in enumerate([(s.ptr_reader, "indptr", None),
                                                 (s.idx_reader, "indices", None),
                                                 (s.w_reader, "weights", "weights")]):
            self._add_part(s, part, f"{buf}_request", request := StreamRegister(request_layout))
            s.dp.d.comb += [
                request.i.valid.eq(reader.request.valid),
                request.i.payload.eq(reader.request.payload),
                reader.request.ready.eq(request.i.ready),
                reader.response.eq(s.read_port.responses[i]),
            ]
            wiring.connect(s.dp, request.o, s.read_port.requests[i])
            m.d.comb += [s.read_port.guard_base[i].eq(s.cfg[f"{buf}_addr"]),
                         s.read_port.guard_size[i].eq(s.cfg[f"{buf}_size"])]
        m.d.comb += [s.read_port.guard_base[3].eq(s.cfg["feat_addr"]),
                     s.read_port.guard_size[3].eq(s.cfg["feat_size"])]
        s.launch = Signal()       # first cycle of a run that passed the checks
        # the pointers' count from a register (set during CHECK, outside the datapath's
        # reset): no adder before the reader's compares of its count
        ptr_count = Signal(32, name="ptr_count")
        m.d.sync += ptr_count.eq(s.num_nodes + 1)
        # the weights' reader starts only in a run with weights: in the others it stays
        # as the clear left it (and its own clock stops in the simulated device)
        m.d.comb += [
            s.ptr_reader.start.eq(s.launch), s.ptr_reader.base.eq(s.cfg["indptr_addr"]),
            s.ptr_reader.count.eq(ptr_count),
            s.idx_reader.start.eq(s.launch), s.idx_reader.base.eq(s.cfg["indices_addr"]),
            s.idx_reader.count.eq(s.num_edges),
            s.w_reader.start.eq(s.launch & s.use_weights), s.w_reader.base.eq(s.cfg["weights_addr"]),
            s.w_reader.count.eq(s.num_edges),
        ]

    def _row_gather(self, m, s):
        """Row gather: one read burst (two across a 4 KiB boundary) per valid edge."""
        c = self.config
        maxb, aw = c.max_beats, c.addr_width
        # the bursts of a row come from the row-address pipeline through `row_ids`, whose
        # room the edge walk reserves before it sends an index in
        s.dp.submodules.gather = gather = RowGather(addr_width=aw, max_beats=maxb,
                                                    slots=c.reads_in_flight)
        s.row_pop = Signal()
        s.dp.d.comb += [
            s.row_address.base.eq(s.cfg["feat_addr"]), s.row_address.stride.eq(s.cfg["feat_stride"]),
            s.row_address.row_beats.eq(s.row_beats),
            s.row_ids.w.valid.eq(s.row_address.o.valid), s.row_ids.w.payload.eq(s.row_address.o.payload),
            gather.freed.eq(s.row_pop),
            s.row_fifo.w_en.eq(s.read_port.responses[3].valid),
            s.row_fifo.w_data.eq(s.read_port.responses[3].data),
        ]
        # a register slice between them: the gather's load (its issue decision) enables its
        # own burst registers and the slice's, not also the FIFO's read and counters
        s.dp.submodules.bursts_slice = bursts_slice = StreamRegister(row_bursts_layout(aw, maxb))
        wiring.connect(s.dp, s.row_ids.r, bursts_slice.i)
        wiring.connect(s.dp, bursts_slice.o, gather.bursts)
        wiring.connect(s.dp, gather.request, s.read_port.requests[3])

    def _edge_walk(self, m, s):
        """Edge walk: a row index and a descriptor per valid edge."""
        c = self.config
        ew = c.elem_width
        # register slices: the walk's decisions do not reach back into the readers (the
        # indices' slice is the walk's own)
        # (and the index reader's ready is the slice's flip-flop, not the walk's join of
        # indices and weights, which would fan out to the reader's every beat register)
        slices = {name: (StreamRegister(width), part) for name, width, part in
                  (("ptr_slice", 32, None), ("idx_slice", 32, None), ("w_slice", ew, "weights"))}
        s.walk = EdgeWalk(elem_width=ew, row_slots=s.id_slots, desc_slots=c.desc_depth)
        s.dp.submodules.walk = s.walk
        for (name, (sl, part)), reader, port in zip(slices.items(),
                                                    (s.ptr_reader, s.idx_reader, s.w_reader),
                                                    (s.walk.pointers, s.walk.indices, s.walk.weights)):
            self._add_part(s, part, name, sl)
            wiring.connect(s.dp, reader.elements, sl.i)
            wiring.connect(s.dp, sl.o, port)
        wiring.connect(s.dp, s.walk.rows, s.row_address.i)
        s.desc_pop = Signal()
        s.dp.d.comb += [s.walk.run.eq(s.running), s.walk.num_nodes.eq(s.num_nodes),
                        s.walk.num_edges.eq(s.num_edges), s.walk.use_weights.eq(s.use_weights),
                        s.walk.count_edges.eq(s.reduce_op == ReduceOp.MEAN),
                        s.walk.row_done.eq(s.row_ids.r.valid & s.row_ids.r.ready),
                        s.walk.desc_done.eq(s.desc_pop)]
        s.edge_pulse, s.rejected_pulse, s.bad_indptr = s.walk.edge, s.walk.rejected, s.walk.bad_indptr
        # recip 0 where there is no mean: the output stage's mean is not chosen
        direct = Signal(s.desc_full_layout)
        s.dp.d.comb += direct.desc.eq(s.walk.descriptors.payload)
        valid, payload = s.walk.descriptors.valid, direct
        if s.recip_pipe is not None:
            # only a mean run's descriptors take the divider (and its latency): in other
            # runs it is idle (and its own clock stops in the simulated device). The others
            # pass a register; a run's descriptors take one path, so the FIFO's write
            # valid is the OR of the two paths' valid flip-flops
            mean_run = Signal(name="mean_run")             # set with the run's start
            m.d.sync += mean_run.eq(s.reduce_op == ReduceOp.MEAN)
            bypass_valid = Signal(name="desc_bypass_valid")
            bypass = Signal(s.desc_full_layout, name="desc_bypass", reset_less=True)
            s.dp.d.sync += [bypass_valid.eq(valid & ~mean_run), bypass.eq(direct)]
            recip = s.recip_pipe
            s.dp.d.comb += [recip.i.valid.eq(valid & mean_run),
                            recip.i.payload.eq(s.walk.descriptors.payload),
                            self.part_busy["recip"].eq(recip.i.valid | recip.busy | s.clear)]
            valid = recip.o.valid | bypass_valid
            payload = Mux(mean_run, recip.o.payload, bypass)
        s.dp.d.comb += [s.desc_fifo.w.valid.eq(valid), s.desc_fifo.w.payload.eq(payload)]

    def _reduce_and_drain(self, m, s):
        """Reduce: products accumulated per node into two banks; drain: a closed bank,
        beat by beat, one AW per burst, into the output stage."""
        c = self.config
        lanes, bpb, ew, maxb = c.lanes, c.bytes_per_beat, c.elem_width, c.max_beats
        aw = c.addr_width
        acc_w = c.acc_width
        s.reduce = Reduce(lanes=lanes, elem_width=ew, acc_width=acc_w, max_beats=maxb,
                          reduce_max="max" in c.reduce_ops)
        s.drain = Drain(lanes=lanes, acc_width=acc_w, max_beats=maxb, addr_width=aw,
                        bytes_per_beat=bpb, credits=W_BEATS)
        # the output stage: round, saturate, mean, narrow, a stage each (no stall: the
        # drain's credits reserve the write port's room for every beat in flight)
        output = OutputStage(lanes=lanes, acc_width=acc_w, elem_width=ew,
                             mean=s.recip_pipe is not None, reduce_max="max" in c.reduce_ops)
        s.dp.submodules.reduce, s.dp.submodules.drain = s.reduce, s.drain
        self._add_part(s, "output", "output", output)
        s.dp.d.comb += self.part_busy["output"].eq(output.busy | s.clear)
        s.dp.d.comb += [
            s.reduce.rows.valid.eq(s.row_fifo.r_rdy), s.reduce.rows.payload.eq(s.row_fifo.r_data),
            s.row_fifo.r_en.eq(s.reduce.rows.ready), s.row_pop.eq(s.row_fifo.r_en),
            s.reduce.descriptors.valid.eq(s.desc_fifo.r.valid),
            s.reduce.descriptors.payload.eq(s.desc_fifo.r.payload),
            s.desc_fifo.r.ready.eq(s.reduce.descriptors.ready),
            s.desc_pop.eq(s.desc_fifo.r.valid & s.desc_fifo.r.ready),
            s.reduce.row_last_beat.eq(s.row_last_beat),
        ]
        m.d.comb += s.reduce.max.eq(s.reduce_op == ReduceOp.MAX)
        wiring.connect(s.dp, s.reduce.bank, s.drain.bank)
        # a register slice on the write addresses: the drain's go (which releases the bank)
        # starts from its ready flip-flop, not from the address FIFO's level compare
        s.dp.submodules.aw_slice = aw_slice = StreamRegister(write_address_layout(aw))
        wiring.connect(s.dp, s.drain.aw, aw_slice.i)
        s.dp.d.comb += [
            s.write_port.address.w_en.eq(aw_slice.o.valid),
            s.write_port.address.w_data.eq(aw_slice.o.payload),
            aw_slice.o.ready.eq(s.write_port.address.w_rdy),
            s.drain.beat_done.eq(s.write_port.beat), s.drain.launch.eq(s.launch),
            s.drain.row_beats.eq(s.row_beats), s.drain.row_last_beat.eq(s.row_last_beat),
            s.drain.last_mask.eq(s.check.last_mask),
        ]
        m.d.comb += [s.drain.base.eq(s.cfg["out_addr"]), s.drain.stride.eq(s.cfg["out_stride"])]
        wiring.connect(s.dp, s.drain.o, output.i)
        s.dp.d.comb += [s.write_port.beats.w_data.eq(output.o.payload),
                        s.write_port.beats.w_en.eq(output.o.valid)]
        m.d.comb += [output.shift.eq(s.cfg["shift"][:6]), output.mean.eq(s.reduce_op == ReduceOp.MEAN),
                     output.max.eq(s.reduce_op == ReduceOp.MAX)]
        s.saturated_now = output.saturated
        s.pipe_busy = s.drain.busy | output.busy | aw_slice.o.valid

    def _completion(self, m, s):
        """When the run's traffic is all in."""
        # each term is registered (the run ends a cycle later): once the run's work is done
        # nothing new starts, so terms of the cycle before are as good as this cycle's
        s.quiet = {name: Signal(name=f"{name}_quiet") for name in
                   ("walk", "nodes", "pipe", "writes", "reads", "bank")}
        s.dp.d.sync += [
            s.quiet["walk"].eq(s.walk.done), s.quiet["nodes"].eq(s.drain.nodes == s.num_nodes),
            s.quiet["pipe"].eq(~s.pipe_busy), s.quiet["writes"].eq(s.write_port.idle),
            s.quiet["reads"].eq(s.read_port.no_outstanding), s.quiet["bank"].eq(~s.reduce.bank.ready),
        ]
        s.in_flight_done = s.quiet["reads"] & s.quiet["writes"] & s.quiet["pipe"]
        # one LUT of flip-flops, kept as a net: the run's end decisions start from it
        s.drained = Signal(name="drained", attrs={"keep": 1})
        s.dp.d.comb += s.drained.eq(s.quiet["walk"] & s.quiet["nodes"] & s.in_flight_done)

        domains = {"sync", *self.part_domains.values()}
        m.submodules.datapath = ResetInserter({d: s.clear for d in domains})(s.dp)

    def _check_and_run(self, m, s):
        """The configuration check and the run FSM."""
        status = self.stat["status"]

        # IDLE -> CHECK -> RUN -> FINISH (no DRAIN: `drained` already waits for the last
        # write response), RUN -> ABORT on a guard fault; `drained` is a register a cycle
        # behind the run, so it is not taken in the run's first cycle
        m.submodules.run = run = RunControl(drain=False, hold_first=True)
        busy = run.busy
        # the run's first cycle and its running state from flip-flops (a cycle late): they
        # fan out to the readers, the drain and the walk, never the state decode itself
        m.d.sync += [s.launch.eq(run.first), s.running.eq(run.running)]
        # a refused burst stops the run a cycle later: the guards' verdicts reach the run
        # control from a flip-flop (the burst itself never leaves the read port)
        fault = Signal()
        m.d.sync += fault.eq(s.read_port.fault)
        m.d.comb += [
            run.start.eq(self.start), run.check_done.eq(s.check.done),
            run.check_error.eq(s.check.error), run.stop.eq(fault),
            run.finished.eq(s.drained), run.quiet.eq(s.in_flight_done & s.quiet["bank"]),
            s.check.start.eq(run.accept), s.clear.eq(run.checking),
            # the guards' limits follow the configuration until the run's readers start
            s.read_port.load_limits.eq(~s.running),
            self.idle.eq(run.idle), self.done.eq(run.done),
            # a run with weights keeps their reader busy until the unit is idle; in a run
            # without, only the clear changes it
            self.part_busy["weights"].eq((s.use_weights & ~run.idle) | s.clear),
        ]
        bus = self.bus
        stall = ((bus.arvalid & ~bus.arready) | (bus.awvalid & ~bus.awready) |
                 (bus.wvalid & ~bus.wready))
        increments = {
            "busy_cycles": Const(1, 1), "read_beats": s.read_port.beat,
            "write_beats": s.write_port.beat, "stall_cycles": stall,
            "mem_wait_cycles": ~s.read_port.no_outstanding & ~s.read_port.beat,
            "edges": s.edge_pulse, "rejected_indices": s.rejected_pulse,
            "saturations": s.saturated_now,
        }
        # the walk's pulses come from its deepest decisions, the bus's stalls and the read
        # port's wait from across the unit: they reach the counters' adders from a register,
        # a cycle late. Totals are the same: none of them can be set in the cycle before a
        # run (no traffic) or in its last (the walk is done, every response is in)
        for name in ("edges", "rejected_indices", "stall_cycles", "mem_wait_cycles"):
            late = Signal(name=f"{name}_pulse")
            m.d.sync += late.eq(increments[name])
            increments[name] = late
        m.submodules.counters = counters = EventCounters(
            {name: (len(self.stat[name]), len(Value.cast(inc))) for name, inc in increments.items()})
        m.d.comb += [counters.clear.eq(run.accept), counters.enable.eq(busy)]
        for name, inc in increments.items():
            m.d.comb += [getattr(counters.inc, name).eq(inc),
                         self.stat[name].eq(getattr(counters.count, name))]
        # each event sets its own bit only, so a bit's register sees no other bit's events
        # (the run's end is a deep decision; it reaches BAD_INDPTR's enable, nothing else)
        def raise_bit(flag):
            m.d.sync += status_bit(status, flag).eq(1)

        with m.If(busy):
            with m.If(s.rejected_pulse):
                raise_bit(Status.INDEX_REJECTED)
            with m.If(s.read_port.resp_error | s.write_port.resp_error):
                raise_bit(Status.AXI_ERROR)

        m.d.comb += s.read_port.enable.eq(~(status & Status.ADDR_FAULT).any())
        # the run's own status bits, after (over) the ones above, as the state machine's were
        with m.If(run.accept):
            m.d.sync += s.on_start()
            m.d.sync += status.eq(0)
        with m.If(run.config_error):
            m.d.sync += status.eq(Status.CONFIG_ERROR)
        with m.If(run.aborting):
            raise_bit(Status.ADDR_FAULT)
        with m.If(run.completing & s.bad_indptr):
            raise_bit(Status.BAD_INDPTR)
