"""The standalone MacArray: :class:`~.mac.MacCore` behind an AXI4 memory front end.

``MacArrayCore`` reads both operand matrices (and the bias) from memory through the
Aggregator's AXI4 building blocks (:class:`~.dma.ReadPort` with one guarded client per
buffer, :class:`~.dma.StreamReader` for the bias, :class:`~.dma.WritePort` for the
result), runs the array, and writes the narrowed result back. Numerics are
:mod:`gnnweave.golden.mac` bit for bit (``mac(mode, P, Q, ...)``).

Memory layout (the host never re-lays out anything)
---------------------------------------------------
Every matrix is int16, row-major, in its *forward* layout, rows ``stride`` bytes apart
(a multiple of the bus width, at least the row's bytes rounded up to whole beats), every
base bus-aligned. The bias is int32, ``n`` entries. Per mode (``P`` is the A side,
``Q`` the B side; the output is always ``[m, n]``):

=====  ==================  ==================  ================================
mode   P                   Q                   output
=====  ==================  ==================  ================================
fwd 0  ``X  [m, k]``       ``W  [k, n]``       ``Y  = X W (+ b) (ReLU)``
dx  1  ``dY [m, k]``       ``W  [n, k]``       ``dX = dY W^T``
dw  2  ``X  [k, m]``       ``dY [k, n]``       ``dW = X^T dY``
=====  ==================  ==================  ================================

Tiling (rows, columns and depth)
--------------------------------
The output is cut into blocks of ``max_dim x max_dim`` and the depth ``k`` into depth
blocks of ``max_depth`` (the last one shorter). The front end walks steps
``(bi, bj, bk)``, depth fastest. For each step it loads the ``P`` block ``(bi, bk)`` and the
``Q`` block ``(bj, bk)`` (both in parallel on the one read port, each row in INCR bursts
that never cross 4 KiB, every R beat written straight into a :class:`~.mac.SkewedBuffer`,
so R is never stalled) and runs :class:`~.mac.MacCore` over the block (which tiles it
over the ``rows x cols`` array). When ``k <= max_depth`` there is one depth block and
``P`` is loaded only when ``bi`` changes.

Depth blocks are summed exactly: the core is built with partial sums (the array's
accumulators hold one depth block; a partial-sum store holding one output block, one word
per tile row, holds sums of up to ``max_total_depth``). Every depth block but the last
ends with ``acc_keep`` (the drain stores the sums, nothing is written to memory); every
one but the first with ``acc_init`` (the drain adds the stored sums). Only the last depth
block narrows (bias once, round half to even, saturate, ReLU), so each output element is
narrowed once from the exact full-depth sum, as :mod:`gnnweave.golden.mac` does. The
block's biases are written into the array before its first depth block.

Every operand buffer is double-banked: step ``t``'s ``Q`` lands in bank ``t % 2``; ``P`` in
bank ``bi % 2`` without a depth split and ``t % 2`` with one, so the next step loads while
the array computes this one (a load starts once the bank's previous user, two steps
back, is computed); the next block's bias is fetched into the bias reader's FIFO during
the current block and written into the array between blocks. Result row segments become
single beats with WSTRB covering only the real bytes, and the write port joins the
consecutive beats of a row into INCR bursts. ``m``, ``n`` and ``k`` may be
any size up to 2**32 - 1 (``mac_ops`` is ``m * n * k``; with a depth split each step reads
its ``P`` block again, so reads grow by the ``P`` traffic of ``ceil(n / max_dim)`` passes).

Limits and refused configurations (CONFIG_ERROR, before any memory traffic)
----------------------------------------------------------------------------
``mode > 2``; ``m``, ``n`` or ``k`` zero; ``k > max_depth`` only in a build whose
``max_depth`` is not a multiple of the elements per beat (a depth block would start inside
a beat); ``shift > 63``;
``bias_shift > 31``; ``relu`` or ``use_bias`` outside ``fwd`` (the ReLU mask of ``dY`` is
the host's to apply); any base not bus-aligned; a stride not a multiple of the bus width
or shorter than its row; a buffer smaller than its matrix (last row in whole beats; the
bias in whole beats) or reaching past the address space. A read burst outside its
buffer is refused by the port guard and a write outside the output buffer is dropped
(ADDR_FAULT, run aborted), so no access leaves the configured buffers whatever the
register values.

Build limits: ``cols`` a power of two; ``pow2(max(rows, cols))`` and ``cols`` at most the
16-bit elements per bus beat (so one beat fills one buffer row segment and a result row
segment fits one beat); ``max_dim`` and ``max_depth`` powers of two, ``max_dim`` at least the elements per beat
(block offsets stay beat-aligned).

Status bits share the Aggregator's positions: bit0 config_error, bit3 addr_fault,
bit4 axi_error.

Timing structure
----------------
The front end is built of components (:mod:`.mac_blocks`), each of whose registers is at
most one short carry chain from the registers it is computed from. No multiply runs
per cycle: the operand blocks' bases and the output block's base are registers moved by
per-run strides (shifts of the row strides, since ``max_dim`` and ``max_depth`` are
powers of two) when a block loop steps; each loop's step (position, extents, last flags)
is a :class:`~.mac_blocks.BlockWalker` of registers, kept with the extents still to go.
A :class:`~.mac_blocks.BlockLoader` issues its bursts from registers, aligned so that
no burst length needs a subtract; the read port takes every request into a register
slice and checks it against its buffer on the way in. An output row's offset
``row * out_stride`` follows the core's row order by adds (next row, back to the band's
first row, or row 0); the result goes through three registered stages (offset and
lanes, address, buffer guard: two compares side by side) that never stall (a segment
enters against a credit of the writer's output FIFO) into the write port. A loader
latches its job and sets up from the latch a cycle later, and writes every R beat into
the buffer from a register, a cycle after it arrives. The
run control is the shared :class:`~.blocks.RunControl`: its ``stop`` is the registered
ADDR_FAULT bit and ``running`` the decode of its state register, which the block loops
see through a register of their own (a cycle late; the read port stops a cycle after
the fault from a register too), so no guard's verdict and no FIFO's ready gates the
datapath's control combinationally. The write port's queues are pushed while a room
flag of their own (a flip-flop) is high. The configuration
check runs in the CHECK state, 36 cycles: one :class:`~.blocks.ExtentCheck` per buffer
(the extent ``(rows - 1) * stride`` by shift and add, 32 cycles, then the row bytes, then
the comparisons), the register-level checks beside them. The write port's ``idle`` and
the W queue's room are flip-flops decided a cycle ahead from counts of their own.
:class:`~.mac.MacCore` documents the array's own pipeline.

On-chip memory (from the build parameters)
------------------------------------------
With ``B = max(max_dim, max_depth)``, ``L = max(pow2(max(rows, cols)), elems_per_beat)``:

* operand buffers: 4 (P and Q, two banks each) :class:`~.mac.SkewedBuffer` of ``L``
  memories of ``B * max(B, L) / L`` words x 16 bits;
* partial-sum store: one memory of ``ceil(max_dim / rows) * ceil(max_dim / cols) *
  2**ceil(log2(rows))`` words x ``cols * (33 + ceil(log2(max_total_depth)))`` bits
  (at least 33 bits a sum), marked ``ram_style = "ultra"`` when ``psum_uram``;
* bias: ``cols`` memories of ``max_dim / cols + 1`` words x 32 bits; the bias reader's FIFO
  ``max(16, max_dim * 4 / bus bytes)`` beats;
* the core's output FIFO: ``2 * rows + 16`` row segments of ``cols * 17 + 2 * ib +
  ceil(log2(cols + 1)) + 1`` bits (``ib = log2(B) + 2``), the write port's 16 beats and 16
  addresses.

``default`` (8 x 8, 128, 128, 128-bit bus): operand buffers 32 memories of 2048 x 16 bits;
partial-sum store 2048 x 520 bits (8 URAM288 of 4096 x 72, or 29 BRAM36 as 2048 x 18).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from pathlib import Path

from amaranth.hdl import Cat, Const, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import wiring

from .axi import SkidBuffer, UnitCore, unit_bus
from .blocks import EventCounters, ExtentCheck, RunControl, status_bit
from .dma import ReadPort, StreamReader, WritePort
from .mac import MAC_INPUT_WIDTH, MacBusParams, MacCore, MacMode, SkewedBuffer
from .mac_blocks import BlockLoader, BlockWalker, ResultWriter
from gnnweave.contract import MAC_ARRAY_CONFIG_REGISTERS as CONFIG_REGISTERS  # noqa: F401
from gnnweave.contract import MAC_ARRAY_STATUS_REGISTERS as STATUS_REGISTERS  # noqa: F401
from gnnweave.contract import MacArrayStatus as Status  # noqa: F401
from .top import UnitTop

ELEM_BYTES = MAC_INPUT_WIDTH // 8
BIAS_BYTES = 4


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass(frozen=True)
class MacArrayConfig(MacBusParams):
    """Build-time parameters of one MacArray instance."""

    rows: int = 4              # array rows (output rows per tile)
    cols: int = 4              # array columns (output columns per tile), a power of two
    max_dim: int = 64          # output block edge held in the on-chip buffers
    max_depth: int = 64        # largest k (depth) of a run
    bus_width: int = 128       # AXI data width: 64, 128, 256 or 512
    addr_width: int = 64
    max_burst: int = 16        # beats per read burst
    #: Largest total depth k of a run (k > max_depth is summed over depth blocks in the
    #: partial-sum store). It sets the store's word width: ``cols`` partial sums of
    #: ``2 * 16 + ceil(log2(max_total_depth)) + 1`` bits (65 at the default, which takes
    #: every 32-bit k); a smaller value narrows the store and refuses larger k (CONFIG_ERROR).
    max_total_depth: int = 2**32 - 1
    #: Mark the partial-sum store ``ram_style = "ultra"``: UltraScale+ URAM288 (4096 x 72)
    #: instead of block RAM. Only for Xilinx UltraScale+ flows (Yosys ``synth_ecp5`` finds no
    #: mapping for that style and stops); off, the tool picks block RAM.
    psum_uram: bool = False

    def __post_init__(self):
        self.check_bus()
        if not 1 <= self.rows <= 64 or not 1 <= self.cols <= 64:
            raise ValueError(f"MacArrayConfig.rows/cols must be in 1..64, got {self.rows}x{self.cols}")
        if self.cols & (self.cols - 1):
            raise ValueError(f"MacArrayConfig.cols must be a power of two, got {self.cols}")
        if _pow2(max(self.rows, self.cols)) > self.elems_per_beat:
            raise ValueError(f"MacArrayConfig: a {self.rows}x{self.cols} array needs a bus of at least "
                             f"{_pow2(max(self.rows, self.cols)) * 16} bits, not {self.bus_width}")
        for name in ("max_dim", "max_depth"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"MacArrayConfig.{name} must be a power of two, got {v}")
        if self.max_dim % self.elems_per_beat or self.max_dim < self.rows or self.max_dim < self.cols:
            # block column offsets must stay beat-aligned in every int16 matrix
            raise ValueError(f"MacArrayConfig.max_dim={self.max_dim}: must be >= rows, cols and "
                             f"a multiple of {self.elems_per_beat} (int16 elements per bus beat)")
        if self.max_depth > 4096:
            raise ValueError(f"MacArrayConfig.max_depth must be <= 4096, got {self.max_depth}")
        if not 1 <= self.max_burst <= 256:
            raise ValueError(f"MacArrayConfig.max_burst must be in 1..256, got {self.max_burst}")
        if not self.max_depth <= self.max_total_depth <= 2**32 - 1:
            raise ValueError(f"MacArrayConfig.max_total_depth must be in max_depth..2**32-1, "
                             f"got {self.max_total_depth}")

    @property
    def cells(self) -> int:
        return self.rows * self.cols

    @property
    def buffer_dim(self) -> int:
        return max(self.max_dim, self.max_depth)


def mac_array_regmap(config: MacArrayConfig | None = None):
    """The register map of the MacArray top (the one source of its offsets)."""
    from .regmap import RegisterBuilder
    return RegisterBuilder.unit("gnnweave_mac_array", CONFIG_REGISTERS, STATUS_REGISTERS)


class MacArrayCore(UnitCore):
    """The MacArray without its control slave: ``cfg`` signals in, AXI4 ``bus`` out.

    Same interface as :class:`~.aggregator.AggregatorCore`: ``bus``, ``cfg`` (one signal
    per :data:`CONFIG_REGISTERS` entry), ``stat`` (one per :data:`STATUS_REGISTERS`
    entry), ``start`` (one cycle, while ``idle``), ``idle``, ``done`` (pulse at the end).

    Parts (:mod:`.mac_blocks`): two :class:`~.mac_blocks.BlockLoader` (P, Q), two
    :class:`~.mac_blocks.BlockWalker` (the step being loaded, the step being computed),
    the :class:`~.mac.MacCore`, the bias :class:`~.dma.StreamReader` and the
    :class:`~.mac_blocks.ResultWriter` in a datapath reset at every start; the
    configuration check, the counters and the run control around it.
    """

    def __init__(self, config: MacArrayConfig = MacArrayConfig()):
        super().__init__(config, CONFIG_REGISTERS, STATUS_REGISTERS)

    def elaborate(self, platform):
        c = self.config
        m = Module()
        dp = Module()          # the datapath: reset while the run is checked
        run = self._run_signals(m)
        parts = self._parts(dp, run)
        self._operands(m, dp, run, parts)
        self._result(m, dp, run, parts)
        run["check_done"], run["check_error"] = self._configuration_check(m, run)
        self._counters_and_control(m, run, parts)
        self._block_loops(m, dp, run, parts)
        # the datapath's reset leaves a register (it reaches every datapath flip-flop)
        m.submodules.datapath = ResetInserter(run["dp_clear"])(dp)
        return m

    # ------------------------------------------------------------------ the parts
    def _run_signals(self, m):
        cfg = {name: Signal(len(sig), name=f"run_{name}") for name, sig in self.cfg.items()}
        mode = cfg["mode"]
        clear, dp_clear = Signal(name="clear"), Signal(name="dp_clear")
        m.d.sync += dp_clear.eq(clear)          # the CHECK state, a cycle late
        return {"cfg": cfg, "clear": clear, "dp_clear": dp_clear, "running": Signal(name="running"),
                "dp_running": Signal(name="dp_running"),
                "accept": Signal(name="accept"), "computing": Signal(name="computing"),
                "all_computed": Signal(name="all_computed"), "loading": Signal(name="loading"),
                "is_dx": mode == MacMode.DX.value, "is_dw": mode == MacMode.DW.value,
                "use_bias": cfg["use_bias"][0], "write_fault": Signal(name="write_fault")}

    def _parts(self, dp, run):
        c = self.config
        aw, D, MD, BD = c.addr_width, c.max_dim, c.max_depth, c.buffer_dim
        # (the core's configuration is the compute walker's, settled before its start, and
        # the compute loop starts it only after its last block's done)
        core = MacCore(rows=c.rows, cols=c.cols, max_dim=D, max_depth=MD, partial_sums=True,
                       max_total_depth=c.max_total_depth, settled_config=True, operand_chain=True,
                       psum_attrs={"ram_style": "ultra"} if c.psum_uram else None)
        lanes = max(core.lanes, c.elems_per_beat)
        # two banks per operand: the next block loads while the array computes this one
        # (each written by a loader that gives the banks' mask from a register)
        p_bufs = [SkewedBuffer(lanes=lanes, rows=BD, cols=max(BD, lanes), bank_mask=True)
                  for _ in range(2)]
        q_bufs = [SkewedBuffer(lanes=lanes, rows=BD, cols=max(BD, lanes), bank_mask=True)
                  for _ in range(2)]
        read_port = ReadPort(self.bus, num_clients=3, registered_requests=True,  # 0 bias, 1 P, 2 Q
                             zero_flag=True)
        # consecutive beats of an output row leave as one INCR burst
        write_port = WritePort(self.bus, beat_depth=16, address_depth=16, coalesce=True)
        # room for a whole block's bias: it is fetched during the previous block
        bias_reader = StreamReader(addr_width=aw, data_width=c.bus_width, elem_width=32,
                                   fifo_beats=max(16, D * BIAS_BYTES // c.bytes_per_beat),
                                   max_burst=min(16, c.max_burst))
        loader = dict(addr_width=aw, bus_width=c.bus_width, max_burst=c.max_burst, max_rows=BD,
                      write_layout=p_bufs[0].wr.shape())
        parts = {
            "core": core, "p_buf0": p_bufs[0], "p_buf1": p_bufs[1], "q_buf0": q_bufs[0],
            "q_buf1": q_bufs[1], "read_port": read_port, "write_port": write_port,
            "bias_reader": bias_reader, "p_load": BlockLoader(**loader), "q_load": BlockLoader(**loader),
            "load_walk": BlockWalker(block=D, depth_block=MD),
            "comp_walk": BlockWalker(block=D, depth_block=MD),
            "writer": ResultWriter(rows=c.rows, cols=c.cols, index_bits=core.index_bits,
                                   out_width=16, addr_width=aw, bus_width=c.bus_width),
        }
        for name, sub in parts.items():
            dp.submodules[name] = sub
        parts["p_bufs"], parts["q_bufs"] = p_bufs, q_bufs
        cfg = run["cfg"]
        for walk in (parts["load_walk"], parts["comp_walk"]):
            dp.d.comb += [walk.restart.eq(run["dp_clear"]), walk.m.eq(cfg["m"]), walk.n.eq(cfg["n"]),
                          walk.k.eq(cfg["k"])]
        return parts

    def _operands(self, m, dp, run, parts):
        """Loaders -> buffer banks -> the core's operand lanes; the bias reader -> the core."""
        cfg = run["cfg"]
        core, read_port, bias_reader = parts["core"], parts["read_port"], parts["bias_reader"]
        for client, load, bufs in ((1, parts["p_load"], parts["p_bufs"]),
                                   (2, parts["q_load"], parts["q_bufs"])):
            dp.d.comb += [
                read_port.requests[client].valid.eq(load.request.valid),
                read_port.requests[client].payload.eq(load.request.payload),
                load.request.ready.eq(read_port.requests[client].ready),
                load.response.eq(read_port.responses[client]),
            ]
            for index, buf in enumerate(bufs):
                dp.d.comb += [buf.wr_en.eq(load.wr_en[index]), buf.wr.eq(load.wr),
                              buf.wr_mask.eq(load.wr_mask)]
        p_rbank, q_rbank = Signal(name="p_rbank"), Signal(name="q_rbank")   # fixed during a block
        for req, bufs, bank, data_in in ((core.a_req, parts["p_bufs"], p_rbank, core.a_data),
                                         (core.b_req, parts["q_bufs"], q_rbank, core.b_data)):
            for buf in bufs:
                dp.d.comb += [buf.rd_en.eq(req.en), buf.rd_fixed.eq(req.fixed),
                              buf.rd_start.eq(req.start), buf.rd_rowwise.eq(req.rowwise),
                              buf.rd_extent.eq(req.extent)]
            dp.d.comb += [data_in[i].eq(Mux(bank, bufs[1].rd_data[i], bufs[0].rd_data[i]))
                          for i in range(core.lanes)]
        parts["p_rbank"], parts["q_rbank"] = p_rbank, q_rbank
        bias_fill = Signal(name="bias_fill")
        # the biases pass a register slice: the fill state's ready reaches only its
        # registers, not the reader's FIFO (two elements wait in it, so a block's bias still
        # goes in at one a cycle)
        dp.submodules.bias_slice = bias_slice = SkidBuffer(bias_reader.elements.payload.shape())
        dp.d.comb += [
            read_port.requests[0].valid.eq(bias_reader.request.valid),
            read_port.requests[0].payload.eq(bias_reader.request.payload),
            bias_reader.request.ready.eq(read_port.requests[0].ready),
            bias_reader.response.eq(read_port.responses[0]),
            bias_slice.i.valid.eq(bias_reader.elements.valid),
            bias_slice.i.payload.eq(bias_reader.elements.payload),
            bias_reader.elements.ready.eq(bias_slice.i.ready),
            bias_slice.o.ready.eq(bias_fill),
            core.bias_wr_en.eq(bias_slice.o.valid & bias_fill),
            core.bias_wr_data.eq(bias_slice.o.payload),
        ]
        bias_done = Signal(name="bias_done")
        dp.d.comb += bias_done.eq(bias_reader.done & ~bias_slice.o.valid)
        parts["bias_fill"], parts["bias_done"] = bias_fill, bias_done
        # the port's guards end a cycle after they are set (registered requests): the
        # configuration is in place from the start, long before the first request
        for i, buf in enumerate(("bias", "p", "q")):
            m.d.comb += [read_port.guard_base[i].eq(cfg[f"{buf}_addr"]),
                         read_port.guard_size[i].eq(cfg[f"{buf}_size"])]
        walk = parts["comp_walk"]
        m.d.comb += [
            core.mode.as_value().eq(cfg["mode"][:2]), core.m.eq(walk.bm), core.n.eq(walk.bn),
            core.k.eq(walk.bk), core.acc_init.eq(~walk.first_k), core.acc_keep.eq(~walk.last_k),
            core.shift.eq(cfg["shift"][:7]), core.relu.eq(cfg["relu"][0]),
            core.use_bias.eq(run["use_bias"]), core.bias_shift.eq(cfg["bias_shift"][:5]),
        ]

    # ------------------------------------------------------------------ the result
    def _result(self, m, dp, run, parts):
        """Core rows -> :class:`~.mac_blocks.ResultWriter` -> the write port's queues."""
        c, cfg = self.config, run["cfg"]
        AX, bpb = c.addr_width + 34, c.bytes_per_beat
        writer, write_port, core = parts["writer"], parts["write_port"], parts["core"]
        # the output block's base (i0, j0) and its row (i0, 0): moved by the compute loop
        block_base = Signal(AX, name="out_block_base", reset_less=True)
        block_row = Signal(AX, name="out_block_row", reset_less=True)
        # the buffer: its first byte, the last beat address whose beat ends inside it
        out_lo = Signal(AX, name="out_lo", reset_less=True)
        out_end = Signal(AX + 1, name="out_end", reset_less=True)
        out_hi = Signal(AX + 1, name="out_hi", reset_less=True)
        out_room = Signal(name="out_room", reset_less=True)
        m.d.sync += [out_lo.eq(cfg["out_addr"]), out_end.eq(cfg["out_addr"] + cfg["out_size"]),
                     out_hi.eq(out_end - bpb), out_room.eq(out_end >= bpb)]
        wiring.connect(dp, core.out, writer.rows)
        aw_payload = Signal(write_port._aw_layout)
        w_payload = Signal(write_port._w_layout)
        beat = writer.beats.payload
        can_push = write_port.room          # a flip-flop (the queues' w_rdy are compares)
        push = writer.beats.valid & can_push
        dp.d.comb += [
            writer.block_base.eq(block_base), writer.out_stride.eq(cfg["out_stride"]),
            writer.out_lo.eq(out_lo), writer.out_hi.eq(out_hi[:AX]),
            writer.out_room.eq(out_room & ~out_hi[AX]),
            writer.beats.ready.eq(can_push),
            aw_payload.addr.eq(beat.addr), aw_payload.len.eq(0),
            w_payload.data.eq(beat.data), w_payload.strb.eq(beat.strb), w_payload.last.eq(1),
            write_port.address.w_data.eq(aw_payload), write_port.address.w_en.eq(push),
            write_port.beats.w_data.eq(w_payload), write_port.beats.w_en.eq(push),
        ]
        # the writer's fault is held until the next run's accept: the datapath's reset
        # comes a cycle into CHECK, where the status already takes faults
        dp.d.comb += writer.restart.eq(run["accept"])
        m.d.comb += run["write_fault"].eq(writer.fault)
        parts["block_base"], parts["block_row"] = block_base, block_row

    # ------------------------------------------------------------------ configuration check
    def _configuration_check(self, m, run):
        """Sequential, in the CHECK state: one :class:`~.blocks.ExtentCheck` per buffer (P, Q,
        the output, the bias: alignment, overlapping rows, the extent ``(rows - 1) * stride
        + row bytes`` by shift and add against the size and the address space), started in
        the first cycle of CHECK from operands registered at ``accept``; the register-level
        checks (mode, sizes, shifts, flags) beside them in two registered steps. Returns
        ``(done, error)``: ``done`` high in the cycle the verdict is in (CHECK's 36th)."""
        c, cfg = self.config, run["cfg"]
        aw, bpb, MD = c.addr_width, c.bytes_per_beat, c.max_depth
        align = bpb - 1
        beat_bits = bpb.bit_length() - 1
        mode, is_dx, is_dw, use_bias = cfg["mode"], run["is_dx"], run["is_dw"], run["use_bias"]

        def whole_beats(nbytes):
            return ((nbytes + align) >> beat_bits) << beat_bits

        dim_m, dim_n, dim_k = cfg["m"], cfg["n"], cfg["k"]
        # a register of its own (the configuration holds through CHECK): the flags below
        # combine it with their own compares, not with a second compare of the mode
        fwd = Signal(name="chk_fwd", reset_less=True)
        m.d.sync += fwd.eq(mode == MacMode.FWD.value)

        def shapes(regs):
            """(rows, row elements, element bytes) of each buffer; the bias is checked only
            with use_bias (zero rows: nothing needed, nothing misaligned)."""
            m_, n_, k_ = regs["m"], regs["n"], regs["k"]
            dx, dw = regs["mode"] == MacMode.DX.value, regs["mode"] == MacMode.DW.value
            bias = regs["use_bias"][0]
            return {
                "p": (Mux(dw, k_, m_), Mux(dw, m_, k_), ELEM_BYTES),
                "q": (Mux(dx, n_, k_), Mux(dx, k_, n_), ELEM_BYTES),
                "out": (m_, n_, ELEM_BYTES),
                "bias": (Mux(bias, 1, 0), Mux(bias, n_, 0), BIAS_BYTES),
            }
        # latched with the configuration itself (from the registers it is latched from)
        buffers = shapes(self.cfg)
        start, armed = Signal(name="chk_start"), Signal(name="chk_armed")
        m.d.sync += [start.eq(run["accept"]), armed.eq(~run["accept"] & (armed | start))]
        checks = [
            mode > 2, dim_m == 0, dim_n == 0, dim_k == 0,
            cfg["shift"] > 63, cfg["bias_shift"] > 31,
            cfg["relu"] > 1, cfg["use_bias"] > 1,
            ~fwd & (cfg["relu"] != 0), ~fwd & (cfg["use_bias"] != 0),
        ]
        if MD % c.elems_per_beat:
            # depth blocks would start inside a bus beat: such a build cannot split the depth
            checks.append(dim_k > MD)
        if c.max_total_depth < 2**32 - 1:
            checks.append(dim_k > c.max_total_depth)
        done, errors = [], []
        for buf, (rows, row_elems, elem_bytes) in buffers.items():
            check = ExtentCheck(addr_width=aw, bytes_per_beat=bpb, rows_width=32, stride_width=64)
            m.submodules[f"check_{buf}"] = check
            gate = use_bias if buf == "bias" else 1
            base, size = cfg[f"{buf}_addr"], cfg[f"{buf}_size"]
            # the operands, registered at accept and held through the check; the row's
            # bytes rounded to whole beats a cycle later (the mode's decode and the
            # rounding's carry chain in registers of their own), in time for the check's
            # first step, two cycles after accept
            rows_q = Signal(32, name=f"chk_{buf}_rows", reset_less=True)
            elems_q = Signal(32, name=f"chk_{buf}_row_elems", reset_less=True)
            bytes_q = Signal(64, name=f"chk_{buf}_row_bytes", reset_less=True)
            with m.If(run["accept"]):
                m.d.sync += [rows_q.eq(rows), elems_q.eq(row_elems)]
            m.d.sync += bytes_q.eq(whole_beats(elems_q * elem_bytes))
            stride = bytes_q if buf == "bias" else cfg[f"{buf}_stride"]
            m.d.comb += [check.start.eq(start), check.rows.eq(rows_q), check.row_bytes.eq(bytes_q),
                         check.stride.eq(stride), check.base.eq(Mux(gate, base, 0)),
                         check.size.eq(Mux(gate, size, 0))]
            if aw < 64:
                # the check sees aw bits: a base or size past them is outside the space
                checks.append(gate & (((base >> aw) != 0) | ((size >> aw) != 0)))
            done.append(check.done)
            errors.append(check.error)
        flags = Signal(len(checks), name="chk_flags", reset_less=True)
        flagged = Signal(name="chk_flagged", reset_less=True)
        m.d.sync += [flags.eq(Cat(*checks)), flagged.eq(flags.any())]
        check_done, check_error = Signal(name="chk_done"), Signal(name="chk_error")
        m.d.comb += [check_done.eq(armed & Cat(*done).all()),
                     check_error.eq(flagged | Cat(*errors).any())]
        return check_done, check_error

    # ------------------------------------------------------------------ counters, run control
    def _counters_and_control(self, m, run, parts):
        """:class:`~.blocks.RunControl` (IDLE, CHECK, RUN, DRAIN, ABORT, FINISH) and
        :class:`~.blocks.EventCounters`. ``stop`` is the registered ADDR_FAULT bit and
        ``running`` the RUN state's register decode: no guard's or FIFO's ready reaches
        the datapath's control combinationally. A fault ends RUN two cycles after the
        offending burst or beat, which its guard has already refused."""
        cfg, running = run["cfg"], run["running"]
        core, read_port, write_port, writer = (parts[n] for n in ("core", "read_port", "write_port",
                                                                   "writer"))
        write_fault = run["write_fault"]
        status = self.stat["status"]
        core_done = Signal()
        m.d.comb += core_done.eq(core.done)
        increments = {
            "busy_cycles": Const(1, 1), "read_beats": read_port.beat, "write_beats": write_port.beat,
            "load_cycles": run["loading"],
            "mac_active_cycles": Mux(core_done, core.active_cycles, 0),
            "mac_ops": Mux(core_done, core.mac_ops, 0),
            "stall_cycles": Mux(core_done, core.stall_cycles, 0),
            "saturations": Mux(core_done, core.saturations, 0),
        }
        m.submodules.run = ctl = RunControl(drain=True)
        m.submodules.counters = counters = EventCounters(
            {name: (len(self.stat[name]), len(Value.cast(inc))) for name, inc in increments.items()})
        for name, inc in increments.items():
            m.d.comb += [getattr(counters.inc, name).eq(inc),
                         self.stat[name].eq(getattr(counters.count, name))]
        fault = Signal(name="addr_fault")
        m.d.comb += fault.eq((status & Status.ADDR_FAULT) != 0)
        # the read port stops a cycle after the fault, from a flip-flop of its own: a burst
        # granted in that cycle is one its guard let through, inside its buffer, and the
        # abort waits for it like for any other
        reads_on = Signal(init=1, name="reads_on")
        m.d.sync += reads_on.eq(~fault)
        # WritePort.idle counts what is queued and the bursts still being formed, so done
        # never precedes the last write
        writes_idle = Signal()
        m.d.comb += writes_idle.eq(write_port.idle & ~writer.pending)
        # nothing in flight: a register of the cycle before, and never of a RUN cycle (a
        # block the compute loop started in RUN's last cycle is busy by then)
        quiet = Signal(name="abort_quiet")
        m.d.sync += quiet.eq(~ctl.running & ~run["dp_running"] & read_port.no_outstanding & writes_idle &
                             ~run["computing"] & ~core.busy)
        # the block loops see RUN a cycle late, from a flip-flop of their own (the state's
        # decode reaches many of their registers); `quiet` waits for it too
        m.d.sync += run["dp_running"].eq(ctl.running)
        m.d.comb += [
            ctl.start.eq(self.start), ctl.check_done.eq(run["check_done"]),
            ctl.check_error.eq(run["check_error"]), ctl.stop.eq(fault),
            ctl.finished.eq(run["all_computed"]), ctl.drained.eq(writes_idle), ctl.quiet.eq(quiet),
            run["accept"].eq(ctl.accept), run["clear"].eq(ctl.checking), running.eq(ctl.running),
            counters.clear.eq(ctl.accept), counters.enable.eq(ctl.busy),
            self.idle.eq(ctl.idle), self.done.eq(ctl.done),
            read_port.enable.eq(reads_on),
        ]
        with m.If(ctl.busy):
            with m.If(read_port.resp_error | write_port.resp_error):
                m.d.sync += status.eq(status | Status.AXI_ERROR)
            with m.If(read_port.fault | write_fault):
                m.d.sync += status.eq(status | Status.ADDR_FAULT)
        with m.If(ctl.accept):
            m.d.sync += [cfg[name].eq(sig) for name, sig in self.cfg.items()]
            m.d.sync += status.eq(0)
        # the check's verdict (a deep decision) sets its own bit only: nothing else sets a
        # bit in CHECK (no traffic), and ADDR_FAULT, the run's stop, does not wait on it
        with m.If(ctl.config_error):
            m.d.sync += status_bit(status, Status.CONFIG_ERROR).eq(1)

    # ------------------------------------------------------------------ block loops
    def _block_loops(self, m, dp, run, parts):
        """The load loop and the compute loop (in the datapath: reset at every start).

        Block t's Q goes to bank t % 2, the P of block row bi to bank bi % 2 (with a depth
        split, every step loads P and Q, both into bank t % 2). A load may start when the
        block two back (the bank's last user) has been computed: loads started - blocks
        computed <= 1. The operand blocks' bases are registers moved by per-run strides
        (shifts of the row strides) when the load loop steps; the output block's base by
        the compute loop."""
        s = SimpleNamespace(dp=dp, run=run, parts=parts)     # what the two loops share
        s.cfg = s.run["cfg"]
        MD = self.config.max_depth
        s.running, s.use_bias = s.run["dp_running"], s.run["use_bias"]
        # the mode's flags from registers (the run's configuration is latched long before)
        s.is_dx = Signal(name="blocks_is_dx")
        s.is_dw = Signal(name="blocks_is_dw")
        m.d.sync += [s.is_dx.eq(s.run["is_dx"]), s.is_dw.eq(s.run["is_dw"])]
        s.core, s.p_load, s.q_load = s.parts["core"], s.parts["p_load"], s.parts["q_load"]
        s.lw, s.cw, s.bias_reader = s.parts["load_walk"], s.parts["comp_walk"], s.parts["bias_reader"]
        s.block_base, s.block_row = s.parts["block_base"], s.parts["block_row"]
        s.split_depth = Signal(name="split_depth")
        m.d.sync += s.split_depth.eq(s.cfg["k"] > MD)
        for name in ("load_start", "load_done", "comp_start", "comp_done"):
            setattr(s, name, Signal(name=name))
        s.in_flight = Signal(range(4))     # blocks loading or loaded, not yet computed
        s.ready_blocks = Signal(range(4))  # blocks loaded, not yet started
        s.dp.d.sync += [s.in_flight.eq(s.in_flight + s.load_start - s.comp_done),
                        s.ready_blocks.eq(s.ready_blocks + s.load_done - s.comp_start)]
        s.l_par = Signal()
        s.lq_par = Signal()
        s.c_par = Signal()
        s.cq_par = Signal()
        s.all_loaded = Signal()

        self._load_loop(m, s)
        self._compute_loop(m, s)
        self._run_bases(m, s)

    def _load_loop(self, m, s):
        """The load loop: each step's P and Q blocks into their banks; the bases move by strides."""
        c = self.config
        aw, D, MD = c.addr_width, c.max_dim, c.max_depth
        # P block (bi, bk): fwd/dx rows i0.., columns k0.. of [m,k]; dw rows k0.., columns i0..
        # of [k,m] (k0 is a multiple of max_depth, so column offsets stay beat-aligned)
        # Q block (bj, bk): dx rows j0.., columns k0.. of [n,k]; fwd/dw rows k0.., columns j0..
        # (li0, lk0) and (lj0, lk0); loaded with the buffers' bases while the datapath is cleared
        s.p_base = Signal(aw + 34, name="p_block_base", reset_less=True)
        s.q_base = Signal(aw + 34, name="q_block_base", reset_less=True)
        s.p_row_base = Signal(aw + 34, name="p_row_base", reset_less=True)     # (li0, 0)
        s.q_col_base = Signal(aw + 34, name="q_col_base", reset_less=True)     # (lj0, 0)
        steps = {name: Signal(aw + 34, name=f"{name}_step") for name in ("p_i", "p_k", "q_j", "q_k")}
        m.d.sync += [
            steps["p_i"].eq(Mux(s.is_dw, D * ELEM_BYTES, s.cfg["p_stride"] << (D.bit_length() - 1))),
            steps["p_k"].eq(Mux(s.is_dw, s.cfg["p_stride"] << (MD.bit_length() - 1), MD * ELEM_BYTES)),
            steps["q_j"].eq(Mux(s.is_dx, s.cfg["q_stride"] << (D.bit_length() - 1), D * ELEM_BYTES)),
            steps["q_k"].eq(Mux(s.is_dx, MD * ELEM_BYTES, s.cfg["q_stride"] << (MD.bit_length() - 1))),
        ]
        s.dp.d.comb += [
            s.p_load.base.eq(s.p_base), s.p_load.stride.eq(s.cfg["p_stride"]),
            s.p_load.nrows.eq(Mux(s.is_dw, s.lw.bk, s.lw.bm)),
            s.p_load.ncols.eq(Mux(s.is_dw, s.lw.bm, s.lw.bk)),
            s.q_load.base.eq(s.q_base), s.q_load.stride.eq(s.cfg["q_stride"]),
            s.q_load.nrows.eq(Mux(s.is_dx, s.lw.bn, s.lw.bk)),
            s.q_load.ncols.eq(Mux(s.is_dx, s.lw.bk, s.lw.bn)),
        ]
        # the bases of the step after the one loading, chosen while it loads (a later depth
        # block, the next block column, or the first column of the next block row; the
        # walker's flags settle three cycles after a step, a load's done comes two cycles
        # after its start at the earliest): the loads' done only enables the registers
        p_k_base, q_k_base, p_i_base, q_j_base = (Signal(aw + 34, name=f"{n}_next_base", reset_less=True)
                                                  for n in ("p_k", "q_k", "p_i", "q_j"))
        load_next = {name: Signal(aw + 34, name=f"load_next_{name}", reset_less=True)
                     for name in ("p_base", "q_base", "p_row_base", "q_col_base")}
        s.dp.d.sync += [
            p_k_base.eq(s.p_base + steps["p_k"]), q_k_base.eq(s.q_base + steps["q_k"]),
            p_i_base.eq(s.p_row_base + steps["p_i"]), q_j_base.eq(s.q_col_base + steps["q_j"]),
            load_next["p_base"].eq(Mux(~s.lw.last_k, p_k_base,
                                       Mux(s.lw.last_j, p_i_base, s.p_row_base))),
            load_next["q_base"].eq(Mux(~s.lw.last_k, q_k_base,
                                       Mux(s.lw.last_j, s.cfg["q_addr"], q_j_base))),
            load_next["p_row_base"].eq(Mux(s.lw.last_k & s.lw.last_j, p_i_base, s.p_row_base)),
            load_next["q_col_base"].eq(Mux(~s.lw.last_k, s.q_col_base,
                                           Mux(s.lw.last_j, s.cfg["q_addr"], q_j_base))),
        ]
        with s.dp.FSM(name="load"):
            with s.dp.State("START"):
                with s.dp.If(s.running & ~s.all_loaded & (s.in_flight <= 1) & s.lw.ready):
                    s.dp.d.comb += [s.load_start.eq(1), s.p_load.start.eq(s.lw.first_j | s.split_depth),
                                    s.p_load.bank.eq(s.l_par), s.q_load.start.eq(1),
                                    s.q_load.bank.eq(s.lq_par)]
                    s.dp.next = "WAIT"
            with s.dp.State("WAIT"):
                with s.dp.If(s.p_load.done & s.q_load.done):
                    s.dp.d.comb += [s.load_done.eq(1), s.lw.step.eq(1)]
                    s.dp.d.sync += s.lq_par.eq(~s.lq_par)
                    with s.dp.If(s.split_depth | (s.lw.last_k & s.lw.last_j)):
                        s.dp.d.sync += s.l_par.eq(~s.l_par)
                    with s.dp.If(s.lw.last):
                        s.dp.d.sync += s.all_loaded.eq(1)
                    s.dp.d.sync += [s.p_base.eq(load_next["p_base"]), s.q_base.eq(load_next["q_base"]),
                                    s.p_row_base.eq(load_next["p_row_base"]),
                                    s.q_col_base.eq(load_next["q_col_base"])]
                    s.dp.next = "START"
        m.d.comb += [s.parts["p_rbank"].eq(s.c_par), s.parts["q_rbank"].eq(s.cq_par)]

    def _compute_loop(self, m, s):
        """The compute loop: each block's bias, the core's start, the next output block's base."""
        c = self.config
        aw, D = c.addr_width, c.max_dim
        # the bias of the block computed next: the first block's, then the one after the
        # block being computed (registered: it only changes when the compute loop steps)
        bias_first = Signal()
        bias_base = Signal(aw, name="bias_next_base", reset_less=True)
        bias_count = Signal(range(D + 1), name="bias_next_count", reset_less=True)
        # (the state's decode only chooses, behind the adder, not in front of it)
        m.d.sync += [bias_base.eq(Mux(bias_first, s.cfg["bias_addr"],
                                      s.cfg["bias_addr"] + s.cw.next_j0 * BIAS_BYTES)),
                     bias_count.eq(Mux(bias_first, s.cw.bn, s.cw.next_bn))]
        s.dp.d.comb += [s.bias_reader.base.eq(bias_base), s.bias_reader.count.eq(bias_count)]
        bias_fill = s.parts["bias_fill"]
        # the core's start leaves a register (it reaches every register of the core's
        # sequencer); the core's inputs are the compute walker's, stable until it steps
        start_core = Signal(name="start_core")
        s.dp.d.sync += s.core.start.eq(start_core)
        # what the end of the block being computed does, and the next output block's bases,
        # registered while it computes (the walker's step is settled long before its end):
        # the core's done only chooses
        block_flags = {name: Signal(name=f"block_{name}") for name in
                       ("swap_p", "last", "next_row", "next_col")}
        next_row = Signal.like(s.block_row, name="out_next_row", reset_less=True)
        next_col = Signal.like(s.block_base, name="out_next_col", reset_less=True)
        # the next output block's base (and row) chosen a cycle later still, so the core's
        # done only enables the two registers (their bases settle within three cycles of
        # a step, long before the next block's end)
        next_base = Signal.like(s.block_base, name="out_next_base", reset_less=True)
        next_block_row = Signal.like(s.block_row, name="out_next_block_row", reset_less=True)
        s.dp.d.sync += [
            block_flags["swap_p"].eq(s.split_depth | (s.cw.last_k & s.cw.last_j)),
            block_flags["last"].eq(s.cw.last_k & s.cw.last),
            block_flags["next_row"].eq(s.cw.last_k & s.cw.last_j),
            block_flags["next_col"].eq(s.cw.last_k),
            next_row.eq(s.block_row + (s.cfg["out_stride"] << (D.bit_length() - 1))),
            next_col.eq(s.block_base + D * ELEM_BYTES),
            next_base.eq(Mux(block_flags["next_row"], next_row,
                             Mux(block_flags["next_col"], next_col, s.block_base))),
            next_block_row.eq(Mux(block_flags["next_row"], next_row, s.block_row)),
        ]
        # the RUN state as a flip-flop of its own: the block's end (it and the core's done)
        # reaches the walker and the output bases from two registers, not the state's decode
        s.in_run = Signal(name="compute_in_run")
        s.block_end = Signal(name="compute_block_end")
        s.dp.d.comb += s.block_end.eq(s.in_run & s.core.done)
        with s.dp.If(start_core):
            s.dp.d.sync += s.in_run.eq(1)
        with s.dp.Elif(s.block_end):
            s.dp.d.sync += s.in_run.eq(0)
        with s.dp.If(s.block_end):
            s.dp.d.comb += [s.comp_done.eq(1), s.cw.step.eq(1)]
            s.dp.d.sync += s.cq_par.eq(~s.cq_par)
            with s.dp.If(block_flags["swap_p"]):
                s.dp.d.sync += s.c_par.eq(~s.c_par)
            with s.dp.If(block_flags["last"]):
                s.dp.d.sync += s.run["all_computed"].eq(1)
        # a later depth block keeps the output block; otherwise the next block column, or
        # the first column of the next block row. The bases move a cycle after the block's
        # end, enabled by a flip-flop (the core's done reaches no wide enable); the next
        # block's first segment leaves the core many cycles later, and the next bases
        # still hold the values from before the walker's step
        base_step = Signal(name="out_base_step")
        s.dp.d.sync += base_step.eq(s.block_end & ~block_flags["last"])
        with s.dp.If(base_step):
            s.dp.d.sync += [s.block_row.eq(next_block_row), s.block_base.eq(next_base)]
        m.d.comb += s.run["computing"].eq(s.in_run)
        # the bias reader starts a cycle after the loop decides it, from a register (its
        # base and count are registers that hold until the compute walker steps; its done
        # falls the cycle after its start, before the BIAS state can look at it)
        bias_start = Signal(name="bias_start")
        s.dp.d.sync += s.bias_reader.start.eq(bias_start)
        # the BIAS state as a flip-flop of its own too: its decode fed the bias slice's
        # wide enables and, on the same net, the core's start
        s.in_bias = in_bias = Signal(name="compute_in_bias")
        bias_go = in_bias & s.running & s.parts["bias_done"]
        s.dp.d.comb += bias_fill.eq(in_bias)
        with s.dp.If(bias_go):
            s.dp.d.comb += [start_core.eq(1), s.comp_start.eq(1)]
            # fetch the next block's bias while this one computes
            s.dp.d.comb += bias_start.eq(s.use_bias & ~s.cw.last_block)
        with s.dp.FSM(name="compute") as s.compute:
            with s.dp.State("PREFETCH"):            # the first block's bias
                s.dp.d.comb += bias_first.eq(1)
                with s.dp.If(s.running & s.cw.ready):
                    s.dp.next = "PREFETCH_START"
            with s.dp.State("PREFETCH_START"):      # (its base and count registered)
                s.dp.d.comb += [bias_first.eq(1), bias_start.eq(s.use_bias)]
                s.dp.next = "WAIT"
            with s.dp.State("WAIT"):
                with s.dp.If(s.running & (s.ready_blocks != 0) & s.cw.ready):
                    with s.dp.If(s.cw.first_k):
                        s.dp.d.comb += s.core.bias_clear.eq(1)
                        s.dp.d.sync += in_bias.eq(1)
                        s.dp.next = "BIAS"
                    with s.dp.Else():                # later depth block: the bias is in place
                        s.dp.d.comb += [start_core.eq(1), s.comp_start.eq(1)]
                        s.dp.next = "RUN"
            with s.dp.State("BIAS"):                 # the block's bias into the array (above)
                with s.dp.If(bias_go):
                    s.dp.d.sync += in_bias.eq(0)
                    s.dp.next = "RUN"
            with s.dp.State("RUN"):                  # (the block's end: see in_run)
                with s.dp.If(s.core.done):
                    with s.dp.If(block_flags["last"]):
                        s.dp.next = "END"
                    with s.dp.Else():
                        s.dp.next = "WAIT"
            with s.dp.State("END"):
                pass
        m.d.comb += s.run["loading"].eq(s.running & ~s.core.busy)

    def _run_bases(self, m, s):
        """The blocks' first bases while the datapath is cleared; the probes for simulation."""
        with s.dp.If(s.run["dp_clear"]):
            s.dp.d.sync += [s.p_base.eq(s.cfg["p_addr"]), s.p_row_base.eq(s.cfg["p_addr"]),
                            s.q_base.eq(s.cfg["q_addr"]), s.q_col_base.eq(s.cfg["q_addr"]),
                            s.block_base.eq(s.cfg["out_addr"]), s.block_row.eq(s.cfg["out_addr"])]
        # the RUN flip-flop beside the state it shadows, for the simulation that checks
        # them against each other cycle by cycle
        self.probes = dict(in_run=s.in_run, run_state=s.compute.ongoing("RUN"), cfg=s.cfg,
                           block_end=s.block_end, in_bias=s.in_bias,
                           bias_state=s.compute.ongoing("BIAS"))

class MacArrayTop(UnitTop):
    """The MacArray alone (the MacArray benches' design): ``control``, ``gmem``, ``interrupt``."""

    def __init__(self, config: MacArrayConfig = MacArrayConfig()):
        self.config = config
        super().__init__(mac_array_regmap(config), unit_bus(config), lambda: MacArrayCore(config))


MAC_ARRAY_TOP = "gnnweave_mac_array"


def write_mac_array_verilog(config: MacArrayConfig, out_dir, *, debug_names: bool = False) -> Path:
    """Write ``<out_dir>/gnnweave_mac_array.v`` with the Vitis port names (``ap_clk``,
    ``ap_rst_n``, ``s_axi_control_*``, ``m_axi_gmem_*``, ``interrupt``), its register map JSON
    and C header."""
    from .flow.verilog import write_top
    return write_top(MacArrayTop(config), MAC_ARRAY_TOP, out_dir, debug_names=debug_names)
