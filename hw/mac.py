"""MacArray: fixed-point matrix unit for ``Y = X W (+b, ReLU)``, ``dX = dY W^T``, ``dW = X^T dY``.

Architecture (output-stationary, broadcast operands)
----------------------------------------------------
``rows x cols`` cells; cell ``(r, c)`` owns one accumulator of the output tile and does
one ``16 x 16`` multiply-accumulate per cycle (one DSP slice: registered operands,
registered product, accumulate). Each cycle the depth index ``k`` advances: the row
operand ``a[r] = A[i0 + r, k]`` is broadcast along row ``r``, the column operand
``b[c] = B[k, j0 + c]`` along column ``c`` (an outer product per cycle). Output-stationary
was chosen over a systolic (skewed) array because a tile's results are complete
``K + 6`` cycles after its first operand, the next tile starts in the very next cycle
(no fill/drain skew between tiles), and broadcast fan-out of ``rows`` / ``cols`` <= 16 is
cheap at these array sizes. When a tile's last depth step is accumulated, the
accumulators are copied into a shift register that hands the drain one tile row per
cycle (partial sum, bias, round half to even, saturate, ReLU: each in stages of its own)
while the array computes the next tile. Nothing downstream stalls the array: the
sequencer takes output FIFO credits for a tile before its last step (see
:class:`MacCore`).

On-chip transposes (skewed operand buffers)
-------------------------------------------
Every operand matrix lives in a :class:`SkewedBuffer` of ``L`` banks (``L`` a power of
two >= ``max(rows, cols)``): element ``(i, j)`` is stored in bank ``(i + j) mod L`` at
address ``(i, j // L)``. Any ``L`` consecutive elements of a row *or* of a column then sit
in distinct banks, so the buffer delivers a row segment or a column segment per cycle:

======  =============================  =============================
mode    A operand (row lanes)          B operand (column lanes)
======  =============================  =============================
FWD     ``X[i0+r, k]``   (column read) ``W[k, j0+c]``   (row read)
DX      ``dY[i0+r, k]``  (column read) ``W[j0+c, k]``   (column read: ``W^T``)
DW      ``X[k, i0+r]``   (row read: X^T) ``dY[k, j0+c]`` (row read)
======  =============================  =============================

so the host stores every matrix row-major, in the forward layout, and never re-lays out
anything. Lanes past the end of a matrix read as 0 (odd sizes).

Numerics are :mod:`gnnweave.golden.mac` bit for bit: exact products, exact sums in an
accumulator of :func:`~gnnweave.golden.mac.mac_accumulator_width` bits for the configured
maximum depth, one ``narrow`` per output element; the ReLU mask of ``dY`` is applied when
``dY`` is written into its buffer (the writer zeroes masked elements).
"""
from __future__ import annotations

from amaranth.lib import enum

from amaranth.hdl import Array, Cat, Const, Elaboratable, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .arith import RegisterStages, saturate
from .axi import BusParams
from .blocks import RegisteredFIFO


#: Widest MAC operand (one DSP multiply); mirrors gnnweave.golden.mac.MAC_INPUT_WIDTH.
MAC_INPUT_WIDTH = 16


class MacBusParams(BusParams):
    """:class:`~.axi.BusParams` of a unit whose bus carries int16 MAC operands."""

    @property
    def elems_per_beat(self) -> int:
        return self.bus_width // MAC_INPUT_WIDTH


class MacMode(enum.Enum, shape=2):
    """Operation; values equal ``gnnweave.golden.mac.MacMode`` (the register encoding)."""

    FWD = 0
    DX = 1
    DW = 2


def accumulator_width(max_depth: int, in_width: int = MAC_INPUT_WIDTH) -> int:
    """Same bound as ``gnnweave.golden.mac.mac_accumulator_width`` (hw may not import golden)."""
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    return max(2 * in_width + (max_depth - 1).bit_length() + 1, 33)


def _log2_exact(name: str, value: int) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two, got {value}")
    return value.bit_length() - 1


def buffer_write_layout(lanes: int, row_bits: int, col_bits: int, width: int = MAC_INPUT_WIDTH):
    """One buffer write: ``count`` elements ``(row, col + l)`` of one matrix row."""
    return data.StructLayout({
        "row": row_bits, "col": col_bits,
        "data": data.ArrayLayout(signed(width), lanes),
        "count": range(lanes + 1),
    })


class SkewedBuffer(Elaboratable):
    """A matrix of up to ``rows x cols`` elements in ``lanes`` skewed banks (see module doc).

    Write port (one row segment per cycle): ``wr_en`` and ``wr`` (:func:`buffer_write_layout`).
    ``col`` must be a multiple of ``lanes`` and the segment must not wrap. With
    ``bank_mask=True`` the writer also gives ``wr_mask``, bit ``b`` set when bank ``b`` is
    written (``(b - row) mod lanes < count``), so a writer that has it in a register spares
    the banks' write enables that compare.
    Read port (result :attr:`read_latency` cycles after the request: the banks' read, their
    output register, then the lane rotation in a register of its own; held while ``rd_en``
    is low; ``registered_request=True`` registers the request first, one cycle more, so a
    request routed through a mux reaches the banks' address logic from a register):
    ``rd_fixed`` (the fixed index), ``rd_start`` (first lane's index along the other axis),
    ``rd_rowwise`` (1: lanes are ``(fixed, start + l)``; 0: ``(start + l, fixed)``),
    ``rd_extent`` (lanes with ``start + l >= extent`` read 0) -> ``rd_data[l]``.
    """

    #: cycles from a read request to its lanes on ``rd_data`` (request not registered)
    READ_LATENCY = 3

    def __init__(self, *, lanes: int, rows: int, cols: int, width: int = MAC_INPUT_WIDTH,
                 registered_request: bool = False, bank_mask: bool = False):
        self.lanes, self.rows, self.cols, self.width = lanes, rows, cols, width
        self.registered_request = registered_request
        self.bank_mask = bank_mask
        #: cycles from a read request to its lanes on ``rd_data``
        self.read_latency = self.READ_LATENCY + int(registered_request)
        self.lane_bits = _log2_exact("lanes", lanes)
        self.row_bits = _log2_exact("buffer rows", rows)
        col_words = max(cols // lanes, 1)
        self.word_bits = _log2_exact("buffer cols / lanes", col_words)
        if cols % lanes:
            raise ValueError(f"buffer cols ({cols}) must be a multiple of lanes ({lanes})")
        index_bits = max(self.row_bits, _log2_exact("buffer cols", cols)) + 1
        self.index_bits = index_bits
        self.wr_en = Signal()
        self.wr = Signal(buffer_write_layout(lanes, self.row_bits, index_bits, width))
        if bank_mask:
            self.wr_mask = Signal(lanes)
        self.rd_en = Signal()
        self.rd_fixed = Signal(index_bits)
        self.rd_start = Signal(index_bits)
        self.rd_rowwise = Signal()
        self.rd_extent = Signal(index_bits + 1)
        self.rd_data = Signal(data.ArrayLayout(signed(width), lanes), reset_less=True)

    def _request(self, m):
        """The read request the banks see: the inputs, or their registered copy (the
        fields held while ``rd_en`` is low, like the banks). A registered request also
        registers ``start_hi_inc``, the high bits of ``rd_start`` plus one (see the banks'
        read address)."""
        names = ("rd_en", "rd_fixed", "rd_start", "rd_rowwise", "rd_extent")
        if not self.registered_request:
            return {n: getattr(self, n) for n in names}
        req = {n: Signal.like(getattr(self, n), name=f"{n}_r", reset_less=n != "rd_en") for n in names}
        req["start_hi_inc"] = Signal(len(self.rd_start) - self.lane_bits + 1, name="rd_start_hi_inc_r",
                                     reset_less=True)
        m.d.sync += req["rd_en"].eq(self.rd_en)
        with m.If(self.rd_en):
            m.d.sync += [req[n].eq(getattr(self, n)) for n in names[1:]]
            m.d.sync += req["start_hi_inc"].eq(self.rd_start[self.lane_bits:] + 1)
        return req

    def elaborate(self, platform):
        m = Module()
        L, lb = self.lanes, self.lane_bits
        depth = 1 << (self.row_bits + self.word_bits)
        req = self._request(m)
        rd_en, rd_fixed, rd_start = req["rd_en"], req["rd_fixed"], req["rd_start"]
        rot_w = (self.wr.row[:lb] if lb else Const(0, 1))
        rot_r = Signal(max(lb, 1))
        m.d.comb += rot_r.eq((rd_start + rd_fixed)[:lb] if lb else 0)
        # extent - start, a cycle before the lanes compare it with their constant offsets
        # (an add and a compare per lane would sit in series before the lane mux)
        room_q = Signal(signed(len(self.rd_extent) + 1), reset_less=True)
        rd_en_q = Signal()
        m.d.sync += rd_en_q.eq(rd_en)
        # the request's lane fields, two cycles on: with the banks' output register
        rot_r_p = Signal.like(rot_r, reset_less=True)
        start_p = Signal.like(self.rd_start, reset_less=True)
        extent_p = Signal.like(self.rd_extent, reset_less=True)
        with m.If(rd_en):
            m.d.sync += [rot_r_p.eq(rot_r), start_p.eq(rd_start), extent_p.eq(req["rd_extent"])]
        # each lane's source bank, (rotation + lane) mod L, in a register of its own: the
        # add is not in series with the lane mux (nor one rotation net behind every lane)
        src_q = [Signal(max(lb, 1), name=f"src{l}", reset_less=True) for l in range(L)]
        with m.If(rd_en_q):
            m.d.sync += room_q.eq(extent_p - start_p)
            m.d.sync += [src_q[l].eq((rot_r_p + l) if lb else 0) for l in range(L)]
        bank_data = []
        for b in range(L):
            mem = Memory(shape=signed(self.width), depth=depth, init=[])
            m.submodules[f"bank{b}"] = mem
            wp = mem.write_port()
            rp = mem.read_port()
            # write: lane l lands in bank (row + col + l) mod L = (row + l) mod L (col aligned),
            # so bank b takes lane (b - row) mod L: a mux on the row's low bits, each input
            # the lane that row selects (no subtract before the mux)
            lanes_w = [(b - r) % L for r in range(L)]
            data_w = Array([self.wr.data[lane] for lane in lanes_w])[rot_w] if lb else self.wr.data[0]
            in_count = (Array([self.wr.count > lane for lane in lanes_w])[rot_w] if lb
                        else self.wr.count > 0)
            m.d.comb += [
                wp.addr.eq(Cat(((self.wr.col >> lb) + 0)[:self.word_bits], self.wr.row[:self.row_bits])),
                wp.data.eq(data_w),
                wp.en.eq(self.wr_en & (self.wr_mask[b] if self.bank_mask else in_count)),
            ]
            # read: bank b serves lane l = (b - start - fixed) mod L, the element at
            # along = start + l, the one index in [start, start + L) that is (b - fixed) mod
            # L: its low bits are t = (b - fixed) mod L, its high ones start's plus one when
            # t < start mod L. t and that compare are tables of the low bits (LUTs, no
            # subtract or compare chain before the banks' address), the increment beside them
            along = Signal(self.index_bits + 1, name=f"along{b}")
            if lb:
                t = Signal(lb, name=f"rlow{b}")
                fixed_low, start_low = rd_fixed[:lb], rd_start[:lb]
                m.d.comb += t.eq(Array([Const((b - f) % L, lb) for f in range(L)])[fixed_low])
                wraps = Array([Const(int((b - f) % L < s_), 1) for f in range(L) for s_ in range(L)])[
                    Cat(start_low, fixed_low)]
                inc = req["start_hi_inc"] if "start_hi_inc" in req else rd_start[lb:] + 1
                m.d.comb += along.eq(Cat(t, Mux(wraps, inc, rd_start[lb:])))
            else:
                m.d.comb += along.eq(rd_start)
            row = Mux(req["rd_rowwise"], rd_fixed, along)
            col = Mux(req["rd_rowwise"], along, rd_fixed)
            m.d.comb += [
                rp.addr.eq(Cat((col >> lb)[:self.word_bits], row[:self.row_bits])),
                rp.en.eq(rd_en),
            ]
            bank_q = Signal.like(rp.data, name=f"bank{b}_q", reset_less=True)
            with m.If(rd_en_q):
                m.d.sync += bank_q.eq(rp.data)
            bank_data.append(bank_q)
        banks = Array(bank_data)
        for l in range(L):
            inside = room_q > l                     # start + l < extent
            m.d.sync += self.rd_data[l].eq(Mux(inside, banks[src_q[l]], 0))
        return m


def _wire(m: Module, expr, name: str | None = None):
    """Materialise ``expr`` in a signal: an expression used several times is emitted once
    (Amaranth would otherwise copy the whole tree into every use)."""
    sig = Signal(expr.shape(), name=name)
    m.d.comb += sig.eq(expr)
    return sig


def _saturate(m: Module, value, width):
    """:func:`~.arith.saturate` with its clamped value and flag materialised in signals."""
    clamped, saturated = saturate(_wire(m, value.as_signed()), width)
    return _wire(m, clamped), _wire(m, saturated)


def operand_request_signature(index_bits: int) -> wiring.Signature:
    """Operand read request from the core to a buffer (answer next cycle, held when en=0)."""
    return wiring.Signature({
        "en": Out(1), "fixed": Out(index_bits), "start": Out(index_bits),
        "rowwise": Out(1), "extent": Out(index_bits + 1),
    })


def output_layout(cols: int, index_bits: int, width: int) -> data.StructLayout:
    """One narrowed output row segment: ``count`` values ``(row, col + c)``."""
    return data.StructLayout({
        "row": index_bits, "col": index_bits,
        "data": data.ArrayLayout(signed(width), cols),
        "relu_mask": cols,
        "count": range(cols + 1),
        "last": 1,
    })


class MacCore(wiring.Component):
    """The ``rows x cols`` array with its depth sequencer and drain (no memory of its own
    except the bias vector and the partial-sum store): operands come from two
    :class:`SkewedBuffer` read ports, ``read_latency`` cycles after the request (default
    :data:`SkewedBuffer.READ_LATENCY`; a buffer with ``registered_request`` takes one more).

    Biases (FWD with ``use_bias``): ``bias_clear``, then ``bias_wr_en``/``bias_wr_data`` once
    per output column in order.

    Start (``start`` pulse while idle) takes the configuration signals: ``mode``, ``m``,
    ``n``, ``k`` (output ``m x n``, depth ``k``), ``shift``, ``relu``, ``use_bias``,
    ``bias_shift``. The result streams out of ``out`` row segment by row segment (tile
    order, rows of a tile in order); ``done`` pulses the cycle after the last one was
    accepted (``busy`` falls with that acceptance).
    Counters (cleared on start): ``busy_cycles``, ``active_cycles`` (cycles the array
    accumulated), ``mac_ops`` (useful MACs), ``stall_cycles`` (cycles the sequencer held a
    step back: drain credits, drain spacing or ``hold``), ``saturations`` (output elements
    that saturated).

    Timing structure. Nothing downstream gates the array: the sequencer issues one depth
    step per cycle and every later stage moves every cycle, carrying a valid bit (a step
    held back is a bubble). Before it issues a tile's last depth step the sequencer takes
    the tile's rows out of a credit counter of the output FIFO (``2 * rows + 16`` row
    segments), so the drain never waits for ``out.ready``; and last steps are at least
    ``rows`` cycles apart, so the drain, a shift register of ``rows`` rows, has emitted a
    tile before the next one is loaded. The sequencer's flags (last step, last tile
    column and row, the drain room) and the tile extents are registers computed a step
    ahead; a reservation and the FIFO's pops reach the credit counter a cycle late, so
    ``hold`` and ``out.ready`` only gate the step. Each cell is a DSP-shaped
    multiply-accumulate (operand, product and accumulator registers, the accumulator
    enabled by the step's valid bit: the A/B, M and P registers of a DSP48E2; Yosys'
    ``xilinx_dsp`` packs DSP registers only for 7 Series, so an UltraScale+ Yosys netlist
    keeps them in the fabric, and it merges per-cell copies of an operand register back
    into one); the drain narrows one row per cycle in stages of
    their own: the bias shift (two stages), the partial sum (a register behind the store,
    then a split add), the bias add (split), rounding (a coarse and a fine shift, with the
    dropped bits reduced per byte and then per lane, then the increment, split),
    saturation (per-byte flags, the value's flags, then clamp and ReLU). Per-lane copies
    of the run's shift and ReLU settings are registered; datapath registers are
    ``reset_less``.

    ``partial_sums=True`` (opt-in; off, the core is unchanged) lets a caller split a depth
    over several runs of the same ``m x n``: a partial-sum store (one memory,
    ``max_tiles * 2**ceil(log2(rows))`` words of ``cols * psum_width`` bits, word
    ``(tile, row)``) and two more start-time inputs. ``acc_init``: the drain adds every
    tile row's stored partial sum to the array's sum. ``acc_keep``: the drain writes every
    tile row's sum back to the store (nothing goes out of ``out``, no bias, no narrowing;
    ``done`` pulses after the last tile row is stored). The array's accumulators only hold
    one run's depth (``max_depth``); the store's words are :func:`accumulator_width` of
    ``max_total_depth`` bits, so the final narrowing sees the exact full-depth sum.

    ``psum_attrs``: attributes of the partial-sum store's memory (e.g. ``ram_style``).

    ``operand_hold=True`` (opt-in; off, the core is unchanged) adds an input ``hold``: while
    it is high the sequencer issues no step (a bubble), so a caller whose operands are
    still arriving can start a run early and hold it until the data at the requested
    address (``a_req`` / ``b_req``) is in.

    ``settled_config=True`` (opt-in) is a promise that the configuration inputs hold their
    values for at least one cycle before ``start`` and that ``start`` comes only while the
    core is idle: the core then decodes the inputs (non-empty, the first tile's extents,
    ``k == 1``) into registers every cycle, so ``start`` only chooses those registers, and
    ``start`` itself (not gated with ``busy``) enables the run's registers.
    ``idle_start=True`` (opt-in) makes the second promise alone: ``start`` comes only while
    the core is idle (the configuration is decoded at ``start``, as without either).

    ``operand_chain=True`` (opt-in; off, the core is unchanged) passes each row's A operand
    along the row from cell to cell instead of broadcasting it (a systolic chain: each
    operand register loads one DSP and the next register, not the row's DSPs): column
    ``c`` runs ``skew[c] = c`` cycles behind column 0, its B operand delayed as
    much, its accumulate enable, first-step flag and drain load a cycle behind the cell to
    its left; its rows leave the drain's shift register ``cols - 1 - c`` cycles later, so
    the columns of a row meet again before the partial sum. A run takes ``cols - 1``
    cycles longer.

    ``depth_flags=True`` (opt-in; off, the core is unchanged) adds two outputs about the
    requested depth index (``a_req.fixed``), both registers: ``depth_last`` (it is the
    run's last, ``k - 1``, once the run started) and ``depth_word_end`` (it ends a word of
    ``lanes`` indices), so a caller deciding ``hold`` from the request needs no compare
    of the index.
    """

    #: Default total depth (sum over split runs) a partial-sum core's store holds exactly.
    MAX_TOTAL_DEPTH = 2**32 - 1

    def __init__(self, *, rows: int = 4, cols: int = 4, max_dim: int = 256, max_depth: int = 256,
                 out_width: int = 16, bias_width: int = 32, partial_sums: bool = False,
                 operand_hold: bool = False, max_total_depth: int = MAX_TOTAL_DEPTH,
                 psum_attrs: dict | None = None, read_latency: int = SkewedBuffer.READ_LATENCY,
                 depth_flags: bool = False, settled_config: bool = False,
                 idle_start: bool = False, operand_chain: bool = False):
        if not 1 <= rows <= 64 or not 1 <= cols <= 64:
            raise ValueError(f"rows/cols must be in 1..64, got {rows}x{cols}")
        if not max_depth <= max_total_depth <= self.MAX_TOTAL_DEPTH:
            raise ValueError(f"max_total_depth must be in max_depth..2**32-1, got {max_total_depth}")
        self.rows, self.cols = rows, cols
        self.lanes = 1 << (max(rows, cols) - 1).bit_length()
        self.max_dim, self.max_depth = max_dim, max_depth
        self.index_bits = max(max_dim, max_depth).bit_length() + 1
        self.partial_sums = partial_sums
        self.operand_hold = operand_hold
        self.depth_flags = depth_flags
        self.settled_config = settled_config
        self.idle_start = idle_start or settled_config
        self.operand_chain = operand_chain
        #: cycles column c of the array runs behind column 0
        self.skew = [c if operand_chain else 0 for c in range(cols)]
        if read_latency < 1:
            raise ValueError(f"MacCore read_latency must be >= 1 cycle, got {read_latency}")
        #: cycles from a step's operand requests to their data on ``a_data`` / ``b_data``
        self.read_latency = read_latency
        #: bits of one cell's accumulator: one run's depth
        self.acc_width = accumulator_width(max_depth)
        #: bits of one partial sum in the store (0 without partial sums)
        self.psum_width = accumulator_width(max_total_depth) if partial_sums else 0
        self.psum_attrs = dict(psum_attrs or {})
        #: tiles of one max_dim x max_dim output
        self.max_tiles = -(-max_dim // rows) * -(-max_dim // cols)
        self.row_bits = (rows - 1).bit_length()
        #: partial-sum store: words (tile, row) of cols * psum_width bits
        self.psum_depth = self.max_tiles << self.row_bits if partial_sums else 0
        #: row segments the output FIFO holds (the drain's credits)
        self.out_depth = 2 * rows + 16
        self.out_width = out_width
        self.bias_width = bias_width
        ib = self.index_bits
        lanes_layout = data.ArrayLayout(signed(MAC_INPUT_WIDTH), self.lanes)
        partial = {"acc_init": In(1), "acc_keep": In(1)} if partial_sums else {}
        if operand_hold:
            partial["hold"] = In(1)
        if depth_flags:
            partial |= {"depth_last": Out(1), "depth_word_end": Out(1)}
        super().__init__(partial | {
            "start": In(1), "busy": Out(1), "done": Out(1),
            "mode": In(MacMode), "m": In(ib), "n": In(ib), "k": In(ib),
            "shift": In(7), "relu": In(1), "use_bias": In(1), "bias_shift": In(5),
            "bias_clear": In(1), "bias_wr_en": In(1), "bias_wr_data": In(signed(bias_width)),
            "a_req": Out(operand_request_signature(ib)), "a_data": In(lanes_layout),
            "b_req": Out(operand_request_signature(ib)), "b_data": In(lanes_layout),
            "out": Out(stream.Signature(output_layout(cols, ib, out_width))),
            "busy_cycles": Out(32), "active_cycles": Out(32), "mac_ops": Out(48),
            "stall_cycles": Out(32), "saturations": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        R, C, ib = self.rows, self.cols, self.index_bits
        # its level and ready are flip-flops (the drain's credits guarantee room: the write
        # side never looks at ready)
        m.submodules.out_fifo = fifo = RegisteredFIFO(self.out.payload.shape(), self.out_depth)
        run = self._configuration(m)
        bias_ports = self._bias_memory(m)
        seq = self._sequencer(m, run, fifo)
        cells = self._array(m, seq)
        self._drain(m, run, cells, bias_ports, fifo)
        wiring.connect(m, fifo.r, wiring.flipped(self.out))
        return m

    # ---------------------------------------------------------------- configuration
    def _configuration(self, m):
        """Start-time inputs latched at ``start``; derived per-run constants registered."""
        ib = self.index_bits
        run = {name: Signal(len(getattr(self, name)), name=f"run_{name}")
               for name in ("m", "n", "k", "shift", "relu", "use_bias", "bias_shift")}
        run["mode"] = Signal(MacMode, name="run_mode")
        run["acc_init"], run["acc_keep"] = Const(0, 1), Const(0, 1)
        if self.partial_sums:
            run["acc_init"], run["acc_keep"] = Signal(name="run_acc_init"), Signal(name="run_acc_keep")
        run["running"] = Signal(name="running")
        run["issuing"] = Signal(name="issuing")
        run["starting"] = starting = Signal(name="starting")
        m.d.comb += starting.eq(self.start if self.idle_start else self.start & ~run["running"])
        run["decoded"] = decoded = self._decoded_config(m)
        with m.If(starting):
            m.d.sync += [run[k].eq(getattr(self, k)) for k in
                         ("m", "n", "k", "shift", "relu", "use_bias", "bias_shift", "mode")]
            if self.partial_sums:
                m.d.sync += [run["acc_init"].eq(self.acc_init), run["acc_keep"].eq(self.acc_keep)]
            m.d.sync += [run["running"].eq(1), run["issuing"].eq(~decoded["empty"])]
        # the bias is added only in FWD and never to a kept partial sum
        run["bias_on"] = Signal(name="bias_on")
        run["empty"] = Signal(name="run_empty")
        keep_in = self.acc_keep if self.partial_sums else 0
        with m.If(starting):
            m.d.sync += [run["bias_on"].eq(self.use_bias & (self.mode == MacMode.FWD) & ~keep_in),
                         run["empty"].eq(decoded["empty"])]
        m.d.comb += self.busy.eq(run["running"])
        return run

    def _decoded_config(self, m):
        """What a start derives from the configuration inputs: ``empty`` (a zero extent),
        ``k_one``, the first tile row's and column's flags (``m_last``, ``n_last``: the
        only one) and extents (``rows``, ``cols``). Registered every cycle with
        ``settled_config`` (see the class doc), else the inputs' decode itself."""
        R, C = self.rows, self.cols
        decode = {"empty": (self.m == 0) | (self.n == 0) | (self.k == 0), "k_one": self.k == 1,
                  "m_last": self.m <= R, "n_last": self.n <= C,
                  "rows": Mux(self.m <= R, self.m, R), "cols": Mux(self.n <= C, self.n, C)}
        if not self.settled_config:
            return decode
        regs = {}
        for name, value in decode.items():
            width = {"rows": range(R + 1), "cols": range(C + 1)}.get(name, 1)
            regs[name] = Signal(width, name=f"start_{name}", reset_less=True)
            m.d.sync += regs[name].eq(value)
        return regs

    def _bias_memory(self, m):
        """C banks, bank c holds bias[j] for j = c mod C at address j // C, so a tile's C
        biases come out of one read (written in order j = 0, 1, ...)."""
        C = self.cols
        bias_lane = Signal(range(C))
        bias_word = Signal(range(self.max_dim // C + 2))
        with m.If(self.bias_clear):
            m.d.sync += [bias_lane.eq(0), bias_word.eq(0)]
        with m.Elif(self.bias_wr_en):
            m.d.sync += bias_lane.eq(bias_lane + 1)
            with m.If(bias_lane == C - 1):
                m.d.sync += [bias_lane.eq(0), bias_word.eq(bias_word + 1)]
        ports = []
        for c in range(C):
            mem = Memory(shape=signed(self.bias_width), depth=self.max_dim // C + 1, init=[])
            m.submodules[f"bias{c}"] = mem
            wp = mem.write_port()
            m.d.comb += [wp.addr.eq(bias_word), wp.data.eq(self.bias_wr_data),
                         wp.en.eq(self.bias_wr_en & (bias_lane == c))]
            ports.append(mem.read_port())
        return ports

    # ---------------------------------------------------------------- stage 0: sequencer
    def _sequencer(self, m, run, fifo):
        """Walks (tile row i0, tile column j0, depth kk) one step per cycle; returns the
        issued step's fields (valid = ``fire``).

        Every flag ``fire`` depends on, and every next value it selects, is a register or
        a compare of one register with a constant: the last-step/last-column/last-row flags
        and the tile extents are computed a step ahead, and the drain credits take a tile's
        reservation and the FIFO's pops a cycle late (``hold`` and ``out.ready`` reach
        only a gate and the registers' enables)."""
        R, C, ib = self.rows, self.cols, self.index_bits
        starting = run["starting"]
        # the operand position (the buffers' read request) is loaded at every start: no
        # reset, so the datapath's clear (a net of several hundred loads) is not behind it
        i0, j0, kk = (Signal(ib, name=n, reset_less=True) for n in ("i0", "j0", "kk"))
        tj = Signal(ib, name="tj")
        tile = Signal(range(self.max_tiles + 1), name="tile")
        # remaining extents, kept incrementally (no subtract-and-compare per cycle)
        # (loaded at every start as well: no reset, no reset net across the core)
        k_rem = Signal(ib, name="k_rem", reset_less=True)     # dim_k - 1 - kk
        m_left = Signal(ib, name="m_left", reset_less=True)   # dim_m - i0
        n_left = Signal(ib, name="n_left", reset_less=True)   # dim_n - j0
        # flags of the next step, a step ahead: last_k = (k_rem == 0), last_j = (n_left <= C),
        # last_i = (m_left <= R), first = (kk == 0); and the tile's extents
        last_k, last_j, last_i = Signal(name="last_k"), Signal(name="last_j"), Signal(name="last_i")
        first = Signal(name="first_k")
        rows_t = Signal(range(R + 1), name="tile_rows")
        cols_t = Signal(range(C + 1), name="tile_cols")
        # start-time constants: the flags and extents of a new row of tiles / a new depth walk
        k_one = Signal(name="run_k_one")
        n_last0, n_cols0 = Signal(name="run_n_last0"), Signal(range(C + 1), name="run_n_cols0")
        # drain credits (output FIFO row segments not yet promised) and drain spacing
        credits = Signal(range(self.out_depth + 1), name="drain_credits")
        gap = Signal(range(R), name="drain_gap")
        gap_zero = Signal(name="drain_gap_zero")
        reserve = Signal(range(R + 1), name="drain_reserve")      # taken a cycle late
        reserving = Signal(name="drain_reserving")
        popped = Signal(name="drain_popped")                      # returned a cycle late
        m.d.sync += popped.eq(self.out.valid & self.out.ready)
        keep = run["acc_keep"]
        # a tile's last step may issue: the drain is spaced (gap) and has room for a whole
        # tile (rows of the last band may be fewer: reserved exactly). Computed a cycle
        # ahead from the credits of the cycle before, so it never counts on room a
        # reservation still on its way into the counter takes. Right after a tile's last
        # step only a one-row tile that keeps its sums may follow (keep holds for the run);
        # otherwise the spacing and credits decide, a register: the last step chooses
        # between the two a cycle later, so no compare lies behind the step that fires.
        ok_otherwise = Signal(name="drain_ok_otherwise")
        fired_last = Signal(name="drain_fired_last")
        tile_ok = Signal(name="drain_tile_ok")
        m.d.comb += tile_ok.eq(Mux(fired_last, (R == 1) & keep, ok_otherwise))
        hold = self.hold if self.operand_hold else Const(0, 1)
        fire = Signal(name="fire", attrs={"keep": 1})    # one LUT: kept as a net of its own
        m.d.comb += fire.eq(run["issuing"] & ~hold & (~last_k | tile_ok))
        # a tile's last step, one LUT from the same flip-flops (not fire's net and another
        # LUT): it moves the tile position and the extents
        fire_last = Signal(name="fire_last", attrs={"keep": 1})
        m.d.comb += fire_last.eq(run["issuing"] & ~hold & last_k & tile_ok)
        m.d.sync += [fired_last.eq(fire_last),
                     ok_otherwise.eq((gap_zero | (gap == 1))
                                     & (keep | ((credits >= R) & ~reserving)))]
        m.d.sync += [reserving.eq(fire_last & ~keep), reserve.eq(rows_t),
                     credits.eq(credits - Mux(reserving, reserve, 0) + popped)]
        with m.If(fire_last):
            m.d.sync += [gap.eq(R - 1), gap_zero.eq(R == 1)]
        with m.Elif(~gap_zero):
            m.d.sync += [gap.eq(gap - 1), gap_zero.eq(gap == 1)]
        stall = Signal(name="seq_stall")
        m.d.comb += stall.eq(run["issuing"] & ~fire)

        def extent(left, size):
            """(last, count) of the block after this one: ``left - size`` still to go."""
            return left <= 2 * size, Mux(left <= 2 * size, left - size, size)

        with m.If(starting):
            dec = run["decoded"]
            m.d.sync += [i0.eq(0), j0.eq(0), kk.eq(0), tj.eq(0), tile.eq(0), gap.eq(0),
                         gap_zero.eq(1), credits.eq(self.out_depth), reserving.eq(0),
                         fired_last.eq(0), ok_otherwise.eq(1),
                         k_rem.eq(self.k - 1), m_left.eq(self.m), n_left.eq(self.n),
                         last_k.eq(dec["k_one"]), k_one.eq(dec["k_one"]), first.eq(1),
                         last_j.eq(dec["n_last"]), cols_t.eq(dec["cols"]),
                         n_last0.eq(dec["n_last"]), n_cols0.eq(dec["cols"]),
                         last_i.eq(dec["m_last"]), rows_t.eq(dec["rows"])]
        with m.Elif(fire_last):
            j_last, j_cols = extent(n_left, C)
            m.d.sync += [j0.eq(j0 + C), n_left.eq(n_left - C), last_j.eq(j_last),
                         cols_t.eq(j_cols), tj.eq(tj + 1), tile.eq(tile + 1)]
            with m.If(last_j):
                i_last, i_rows = extent(m_left, R)
                m.d.sync += [j0.eq(0), n_left.eq(run["n"]), last_j.eq(n_last0), cols_t.eq(n_cols0),
                             tj.eq(0), i0.eq(i0 + R), m_left.eq(m_left - R), last_i.eq(i_last),
                             rows_t.eq(i_rows)]
                with m.If(last_i):
                    m.d.sync += run["issuing"].eq(0)
        # the depth walk selects on last_k (a step that fires with last_k is the tile's
        # last): its registers are no loads of fire_last, whose net stays short
        with m.If(~starting & fire):
            with m.If(last_k):
                m.d.sync += [kk.eq(0), k_rem.eq(run["k"] - 1), last_k.eq(k_one), first.eq(1)]
            with m.Else():
                m.d.sync += [kk.eq(kk + 1), k_rem.eq(k_rem - 1), last_k.eq(k_rem == 1),
                             first.eq(0)]
        if self.depth_flags:
            # kk's low bits reach lanes - 1 one step ahead (kk only moves at start and fire)
            lb = self.lanes.bit_length() - 1
            word_end = Signal(name="kk_word_end", init=self.lanes == 1)
            with m.If(starting):
                m.d.sync += word_end.eq(self.lanes == 1)
            with m.Elif(fire):
                m.d.sync += word_end.eq(Mux(last_k, self.lanes == 1,
                                            (kk[:lb] == self.lanes - 2) if lb else 1))
            m.d.comb += [self.depth_last.eq(last_k), self.depth_word_end.eq(word_end)]
        is_dw = run["mode"] == MacMode.DW
        is_dx = run["mode"] == MacMode.DX
        # reads are harmless: a step not issued is a bubble, its operands are never used
        m.d.comb += [
            self.a_req.en.eq(1), self.a_req.fixed.eq(kk), self.a_req.start.eq(i0),
            self.a_req.rowwise.eq(is_dw), self.a_req.extent.eq(run["m"]),
            self.b_req.en.eq(1), self.b_req.fixed.eq(kk), self.b_req.start.eq(j0),
            self.b_req.rowwise.eq(~is_dx), self.b_req.extent.eq(run["n"]),
        ]
        return {"valid": fire, "stall": stall,
                "fields": {"first": first, "last": last_k, "i0": i0, "j0": j0, "tj": tj,
                           "tile": tile, "rows": rows_t, "cols": cols_t,
                           "end": last_k & last_j & last_i}}

    # ---------------------------------------------------------------- the array
    def _array(self, m, seq):
        """Operands -> per-row/column broadcast registers -> product (DSP M) -> accumulator
        (DSP P). Returns the accumulators and the step fields once the accumulators hold
        the step's sum."""
        R, C, AW = self.rows, self.cols, self.acc_width
        L = self.read_latency     # the step's operands are on a_data / b_data at L
        skew = self.skew
        # stage fields travel along the valid bit (valid with reset, fields reset_less);
        # the drain's row walk starts when the last column holds the tile (skew[-1] later)
        valids, stages = [seq["valid"]], [seq["fields"]]
        for s in range(1, L + 3 + skew[-1]):
            v = Signal(name=f"s{s}_valid")
            m.d.sync += v.eq(valids[-1])
            regs = {k: Signal(Value.cast(x).shape(), name=f"s{s}_{k}", reset_less=True)
                    for k, x in stages[-1].items()}
            m.d.sync += [regs[k].eq(stages[-1][k]) for k in regs]
            valids.append(v)
            stages.append(regs)
        W = MAC_INPUT_WIDTH
        if self.operand_chain:
            a_cell, b_cell = self._chained_operands(m, valids)
        else:
            a_cell, b_cell = self._cell_operands(m, valids, stages)
        prod = [[Signal(signed(2 * W), name=f"p{r}_{c}", reset_less=True) for c in range(C)]
                for r in range(R)]                                                      # L + 2
        m.d.sync += [prod[r][c].eq(a_cell[r][c] * b_cell[r][c])
                     for r in range(R) for c in range(C)]
        acc = [[Signal(signed(AW), name=f"acc{r}_{c}", reset_less=True) for c in range(C)]
               for r in range(R)]                                                       # L + 3
        v_acc, s_acc = valids[L + 2], stages[L + 2]
        # the drain's load (a tile's last step is in the accumulators)
        load = Signal(name="drain_load_next")
        m.d.comb += load.eq(v_acc & s_acc["last"])
        load_cells = [[None] * C for _ in range(R)]

        def next_cell(flag, name):
            """``flag`` a cycle later (its reset kept), a net of its own."""
            reg = Signal.like(flag, name=name, attrs={"keep": 1})
            m.d.sync += reg.eq(flag)
            return reg
        for r in range(R):
            # per-row copies of the accumulate enable, the first-step flag and the drain's
            # load (fan-out C); with an operand chain, per cell, each a cycle behind the
            # cell to its left
            en = Signal(name=f"acc_en{r}", attrs={"keep": 1})
            first = Signal(name=f"acc_first{r}", reset_less=True, attrs={"keep": 1})
            ld = Signal(name=f"drain_load{r}", attrs={"keep": 1})
            m.d.sync += [en.eq(valids[L + 1]), first.eq(stages[L + 1]["first"]), ld.eq(load)]
            for c in range(C):
                if c and self.operand_chain:
                    en = next_cell(en, f"acc_en{r}_{c}")
                    first = next_cell(first, f"acc_first{r}_{c}")
                    ld = next_cell(ld, f"drain_load{r}_{c}")
                with m.If(en):
                    m.d.sync += acc[r][c].eq(Mux(first, 0, acc[r][c]) + prod[r][c])
                load_cells[r][c] = ld
        v_done = Signal(name="acc_valid")
        done_f = {k: Signal(Value.cast(x).shape(), name=f"acc_{k}", reset_less=True)
                  for k, x in stages[-1].items()}
        m.d.sync += v_done.eq(valids[-1])
        m.d.sync += [done_f[k].eq(stages[-1][k]) for k in done_f]
        return {"acc": acc, "valid": v_done, "fields": done_f, "load_cells": load_cells,
                "count_valid": v_acc, "count_fields": s_acc, "stall": seq["stall"]}

    def _chained_operands(self, m, valids):
        """The cells' operand registers with an operand chain (``a[r][c]``, ``b[r][c]``):
        row r's A operand passes from cell to cell along the row (a load of one DSP and
        one register each, not the whole row's), column c's B operand through ``c`` more
        registers."""
        R, C, W, L = self.rows, self.cols, MAC_INPUT_WIDTH, self.read_latency
        a_reg = [Signal(signed(W), name=f"a{r}", reset_less=True) for r in range(R)]      # L + 1
        m.d.sync += [a_reg[r].eq(self.a_data[r]) for r in range(R)]
        st = RegisterStages(m, "array")
        a_cell = [[a_reg[r]] * C for r in range(R)]
        for r in range(R):
            for c in range(1, C):
                a_cell[r][c] = st.reg(a_cell[r][c - 1], f"a{r}_{c}")
        b_reg = [Signal(signed(W), name=f"b{c}", reset_less=True) for c in range(C)]
        for c in range(C):
            early = st.delay(self.b_data[c], self.skew[c], f"b{c}_early")
            if self.skew[c]:
                # loaded by a step only: a clock enable unlike the delay's, so the delay's
                # shift-register LUT (slow to its output) ends here and not at the DSPs
                with m.If(valids[L + self.skew[c]]):
                    m.d.sync += b_reg[c].eq(early)
            else:
                m.d.sync += b_reg[c].eq(early)
        return a_cell, [list(b_reg) for _ in range(R)]

    def _cell_operands(self, m, valids, stages):
        """The cells' operand registers without an operand chain: a pair per cell, loaded
        with a step's operands (at stage ``read_latency``; the loads are flip-flops set a
        stage ahead where there is one).

        One register per row (column) would load the row's (column's) DSPs, so it could
        not be a DSP's own input register, and the multiply would start from a fabric net
        of several loads. Copies loaded alike are merged by synthesis; these are not alike:
        cell ``(r, c)`` loads A only when column ``c`` is in the step's tile and B only
        when row ``r`` is. Every product a drained row holds is as before: a cell whose
        column is out of the tile keeps an old A but loads B, which reads 0 there (outside
        the request's extent); a row out of the tile is not drained."""
        R, C, W, L = self.rows, self.cols, MAC_INPUT_WIDTH, self.read_latency
        ahead = L >= 2
        valid, fields = (valids[L - 1], stages[L - 1]) if ahead else (valids[L], stages[L])

        def load(name, cond):
            flag = Signal(name=name)
            m.d["sync" if ahead else "comb"] += flag.eq(cond)
            return flag
        col_on = [valids[L]] + [load(f"a_load_col{c}", valid & (fields["cols"] > c))
                                for c in range(1, C)]
        row_on = [valids[L]] + [load(f"b_load_row{r}", valid & (fields["rows"] > r))
                                for r in range(1, R)]
        a_cell = [[Signal(signed(W), name=f"a{r}" if c == 0 else f"a{r}_{c}", reset_less=True)
                   for c in range(C)] for r in range(R)]                                # L + 1
        b_cell = [[Signal(signed(W), name=f"b{c}" if r == 0 else f"b{c}_{r}", reset_less=True)
                   for c in range(C)] for r in range(R)]
        for r in range(R):
            for c in range(C):
                with m.If(col_on[c]):
                    m.d.sync += a_cell[r][c].eq(self.a_data[r])
                with m.If(row_on[r]):
                    m.d.sync += b_cell[r][c].eq(self.b_data[c])
        return a_cell, b_cell

    # ---------------------------------------------------------------- the drain
    def _drain(self, m, run, cells, bias_ports, fifo):
        """Shift register of one tile's rows, then one row per cycle through partial sum,
        bias, rounding, saturation and ReLU into the output FIFO (or the partial-sum store)."""
        R, C, ib, AW = self.rows, self.cols, self.index_bits, self.acc_width
        acc, fields = cells["acc"], cells["fields"]
        load = Signal(name="drain_load")
        m.d.comb += load.eq(cells["valid"] & fields["last"])
        # the tile's biases: read at the load, held (the next load is >= rows cycles later)
        for rp in bias_ports:
            m.d.comb += [rp.addr.eq(fields["tj"]), rp.en.eq(load)]
        # tile fields, latched at the load
        tile_f = {k: Signal(Value.cast(fields[k]).shape(), name=f"drain_{k}", reset_less=True)
                  for k in ("i0", "j0", "tile", "rows", "cols", "end")}
        with m.If(load):
            m.d.sync += [tile_f[k].eq(fields[k]) for k in tile_f]
        # ---- D0: the shift registers (row r of the tile leaves r cycles after the load;
        # one per column, column c loaded skew[c] cycles after column 0 and its rows
        # delayed skew[-1] - skew[c] cycles more, so all columns of a row leave together)
        res = [[Signal(signed(AW), name=f"res{r}_{c}", reset_less=True) for c in range(C)]
               for r in range(R)]
        for r in range(R):
            for c in range(C):
                with m.If(cells["load_cells"][r][c]):
                    m.d.sync += res[r][c].eq(acc[r][c])
                with m.Else():
                    m.d.sync += res[r][c].eq(res[r + 1][c] if r + 1 < R else 0)
        res_valid = [Signal(name=f"res_valid{r}") for r in range(R)]
        res_row = [Signal(range(R), name=f"res_row{r}", reset_less=True) for r in range(R)]
        rows_in_tile = fields["rows"]
        for r in range(R):
            nxt = (res_valid[r + 1], res_row[r + 1]) if r + 1 < R else (0, 0)
            with m.If(load):
                m.d.sync += [res_valid[r].eq(r < rows_in_tile), res_row[r].eq(r)]
            with m.Else():
                m.d.sync += [res_valid[r].eq(nxt[0]), res_row[r].eq(nxt[1])]
        skew = self.skew
        res_out = [RegisterStages(m, "drain").delay(res[0][c], skew[-1] - skew[c], f"res_out{c}")
                   for c in range(C)]
        row_in_tile = res_row[0]
        sw = self.psum_width if self.partial_sums else AW        # bits of the sum narrowed
        wide = max(sw, self.bias_width + 31) + 2
        psum_addr = Cat(row_in_tile, tile_f["tile"]) if self.row_bits else tile_f["tile"]
        meta = {"row": tile_f["i0"] + row_in_tile, "col": tile_f["j0"], "count": tile_f["cols"],
                "last": tile_f["end"] & (row_in_tile + 1 == tile_f["rows"]),
                "addr": psum_addr}
        valid = res_valid[0]
        stage_no = [0]

        def stage(valid, meta, values, keep=()):
            """One drain register stage: valid (with reset), meta and values (reset_less);
            the registers of the values named in ``keep`` are kept nets."""
            stage_no[0] += 1
            n = stage_no[0]
            v = Signal(name=f"d{n}_valid")
            m.d.sync += v.eq(valid)
            regs = {}
            for k, x in (meta | values).items():
                attrs = {"keep": 1} if k in keep else None
                if isinstance(x, list):
                    regs[k] = [Signal(Value.cast(e).shape(), name=f"d{n}_{k}{i}", reset_less=True,
                                      attrs=attrs) for i, e in enumerate(x)]
                    m.d.sync += [r.eq(e) for r, e in zip(regs[k], x)]
                else:
                    regs[k] = Signal(Value.cast(x).shape(), name=f"d{n}_{k}", reset_less=True,
                                     attrs=attrs)
                    m.d.sync += regs[k].eq(x)
            return v, {k: regs[k] for k in meta}, {k: regs[k] for k in values}

        # ---- D1: the row and its biases (partial-sum read in flight)
        lanes = res_out
        bias_hi = self._fanout(m, run["bias_shift"][3:], C, "bias_shift_hi")
        biases = [Array([Mux(run["bias_on"], bias_ports[c].data, 0).as_signed() << (8 * h)
                         for h in range(4)])[bias_hi[c]] for c in range(C)]
        psum_rd = psum_wr = None
        if self.partial_sums:
            m.submodules.psum = mem = Memory(shape=unsigned(C * sw), depth=self.psum_depth, init=[],
                                             attrs=self.psum_attrs)
            psum_rd, psum_wr = mem.read_port(), mem.write_port()
            m.d.comb += [psum_rd.addr.eq(psum_addr), psum_rd.en.eq(1)]
        v1, meta1, x1 = stage(valid, meta, {"lane": lanes, "bias": biases})
        # ---- D2: the biases aligned (shifted by multiples of 8 in D1, the rest here); the
        # stored partial sums in a plain register behind the store (an output register
        # the memory can absorb)
        bias_lo = self._fanout(m, run["bias_shift"][:3], C, "bias_shift_lo")
        aligned = [Array([x1["bias"][c] << f for f in range(8)])[bias_lo[c]].as_signed()
                   for c in range(C)]
        extra = {"psum": [psum_rd.data[c * sw:(c + 1) * sw] for c in range(C)]} if self.partial_sums else {}
        v2, meta2, x2 = stage(v1, meta1, {"lane": x1["lane"], "bias": aligned} | extra, keep=("lane",))

        def split_add(v, meta, xs, ys, width, extra):
            """``xs[i] + ys[i]`` (signed, ``width`` bits) over two register stages: the low
            half and its carry first, then the high half (two short carry chains)."""
            h = width // 2
            lo, xh, yh = [], [], []
            for x, y in zip(xs, ys):
                xe, ye = Signal(signed(width)), Signal(signed(width))
                m.d.comb += [xe.eq(x), ye.eq(y)]
                lo.append(xe[:h] + ye[:h])
                xh.append(xe[h:])
                yh.append(ye[h:])
            va, meta_a, xa = stage(v, meta, {"lo": lo, "xh": xh, "yh": yh} | extra)
            sums = [Cat(xa["lo"][i][:h], (xa["xh"][i] + xa["yh"][i] + xa["lo"][i][h])[:width - h]).as_signed()
                    for i in range(len(xs))]
            return va, meta_a, xa, sums

        # ---- D3, D4: + the stored partial sum (only a core with a partial-sum store)
        if self.partial_sums:
            stored = [Mux(run["acc_init"], x2["psum"][c].as_signed(), 0) for c in range(C)]
            va, meta_a, xa, sums = split_add(v2, meta2, x2["lane"], stored, sw, {"bias": x2["bias"]})
            v3, meta3, x3 = stage(va, meta_a, {"sum": sums, "bias": xa["bias"]})
        else:
            v3, meta3, x3 = v2, meta2, {"sum": x2["lane"], "bias": x2["bias"]}
        keep = run["acc_keep"]
        kept_last = v3 & keep & meta3["last"]
        if self.partial_sums:
            m.d.comb += [psum_wr.addr.eq(meta3["addr"]), psum_wr.data.eq(Cat(*x3["sum"])),
                         psum_wr.en.eq(v3 & keep)]
        # ---- D5, D6: + bias (kept rows end here: they went to the store)
        v4, meta4, x4, with_bias = split_add(v3 & ~keep, meta3, x3["sum"], x3["bias"], wide, {})
        v5, meta5, x5 = stage(v4, meta4, {"value": with_bias})
        v8, meta8, rounded = self._round(m, run, stage, split_add, v5, meta5, x5["value"], wide)
        # ---- saturation, ReLU: per-byte flags, the value's flags, then the output segment
        ow = self.out_width
        parts = {"low": [], "neg": [], "high_any": [], "high_all": [], "any": []}
        for val in rounded:
            high = val[ow - 1:]                      # all equal: the value fits out_width
            chunks = [high[i:i + 8] for i in range(0, len(high), 8)]
            parts["low"].append(val[:ow])
            parts["neg"].append(val[-1])
            parts["high_any"].append(Cat(*[ch.any() for ch in chunks]))
            parts["high_all"].append(Cat(*[ch.all() for ch in chunks]))
            parts["any"].append(Cat(val[:ow - 1].any(), *[ch.any() for ch in chunks]))
        vs, metas, xs = stage(v8, meta8, parts)
        flags = {"low": xs["low"],
                 "big": [~n & h.any() for n, h in zip(xs["neg"], xs["high_any"])],
                 "small": [n & ~h.all() for n, h in zip(xs["neg"], xs["high_all"])],
                 "positive": [~n & a.any() for n, a in zip(xs["neg"], xs["any"])]}
        v9, meta9, x9 = stage(vs, metas, flags)
        payload = Signal(self.out.payload.shape(), name="out_payload", reset_less=True)
        sat_q = Signal(C, name="out_saturated", reset_less=True)
        v10 = Signal(name="out_valid")
        m.d.sync += v10.eq(v9)
        relu = self._fanout(m, run["relu"], 1, "relu")[0]
        for c in range(C):
            big, small = x9["big"][c], x9["small"][c]
            clamped = Mux(big, (1 << (ow - 1)) - 1, Mux(small, -(1 << (ow - 1)), x9["low"][c]))
            m.d.sync += [payload.data[c].eq(Mux(relu & ~x9["positive"][c], 0, clamped)),
                         payload.relu_mask[c].eq(x9["positive"][c]),
                         sat_q[c].eq((big | small) & (c < meta9["count"]))]
        m.d.sync += [payload.row.eq(meta9["row"]), payload.col.eq(meta9["col"]),
                     payload.count.eq(meta9["count"]), payload.last.eq(meta9["last"])]
        m.d.comb += [fifo.w.valid.eq(v10), fifo.w.payload.eq(payload)]
        self._counters(m, run, cells, v10, sat_q, kept_last)

    @staticmethod
    def _fanout(m, sig, copies: int, name: str):
        """``copies`` registered copies of a run constant (each drives one lane's logic);
        they follow ``sig`` a cycle late, long before the first row reaches them."""
        regs = [Signal.like(sig, name=f"{name}_q{i}", reset_less=True) for i in range(copies)]
        m.d.sync += [r.eq(sig) for r in regs]
        return regs

    def _round(self, m, run, stage, split_add, valid, meta, values, wide):
        """Round half to even by ``shift`` in five stages: shifts by the multiple of 32,
        of 8, then the rest (the dropped bits' half bit and rest reduced per byte in the
        first, over the bytes in the second), then the increment over two stages (low
        half, high half)."""
        C = self.cols
        nbytes = -(-wide // 8)
        # The masks of the dropped bits, (1 << shift - 1) - 1 and 1 << shift - 1, registered
        # in three steps from the run's shift (it is latched at start, long before the
        # first row): s = shift - 1; per byte b, s's byte index above / equal to b; then
        # per bit 8 b + j, above: all of the byte, equal: s's bit index above / equal to j.
        shift = Signal.like(run["shift"], name="round_shift", reset_less=True)
        s = Signal(len(shift) + 1, name="round_s", reset_less=True)
        s_on = Signal(name="round_s_on", reset_less=True)             # shift != 0
        m.d.sync += [shift.eq(run["shift"]), s.eq(shift - 1), s_on.eq(shift != 0)]
        above = Signal(nbytes, name="round_byte_above", reset_less=True)
        equal = Signal(nbytes, name="round_byte_equal", reset_less=True)
        s_lo = Signal(3, name="round_s_lo", reset_less=True)
        m.d.sync += [above.eq(Cat(*[s_on & (s[3:] > b) for b in range(nbytes)])),
                     equal.eq(Cat(*[s_on & (s[3:] == b) for b in range(nbytes)])), s_lo.eq(s[:3])]
        round_low = Signal(wide, name="round_low", reset_less=True)
        round_half = Signal(wide, name="round_half", reset_less=True)
        m.d.sync += [round_low.eq(Cat(*[above[i // 8] | (equal[i // 8] & (s_lo > i % 8))
                                        if i % 8 < 7 else above[i // 8] for i in range(wide)])),
                     round_half.eq(Cat(*[equal[i // 8] & (s_lo == i % 8) for i in range(wide)]))]
        round_on = Signal(name="round_on", reset_less=True)            # 0 < shift < wide
        m.d.sync += round_on.eq((shift != 0) & (shift < wide))
        top_sel = self._fanout(m, shift[5:], C, "shift_top")
        mid_sel = self._fanout(m, shift[3:5], C, "shift_mid")
        fine_sel = self._fanout(m, shift[:3], C, "shift_lo")
        # shift >= wide: every lane rounds to 0 (one copy per lane)
        round_zero = self._fanout(m, shift >= wide, C, "round_zero")
        # ---- R1: shift by the multiple of 32; dropped-bit flags per byte
        coarse, top_b, rest_b = [], [], []
        for c, value in enumerate(values):
            coarse.append(Array([value >> (32 * h) for h in range(4)])[top_sel[c]])
            u = value.as_unsigned()
            top_b.append(Cat(*[(u[8 * b:8 * b + 8] & round_half[8 * b:8 * b + 8]).any()
                               for b in range(nbytes)]))
            rest_b.append(Cat(*[(u[8 * b:8 * b + 8] & round_low[8 * b:8 * b + 8]).any()
                                for b in range(nbytes)]))
        v0, meta0, x0 = stage(valid, meta, {"coarse": coarse, "top": top_b, "rest": rest_b})
        # ---- R2: shift by the multiple of 8 within; the flags of all bytes
        mid = [Array([x0["coarse"][c].as_signed() >> (8 * h) for h in range(4)])[mid_sel[c]]
               for c in range(C)]
        v1, meta1, x1 = stage(v0, meta0, {"coarse": mid, "top": [t.any() for t in x0["top"]],
                                          "rest": [r.any() for r in x0["rest"]]})
        # ---- R3: the remaining shift (0..7)
        kept = [Mux(round_zero[c], 0, Array([x1["coarse"][c].as_signed() >> f for f in range(8)])[fine_sel[c]])
                for c in range(C)]
        v2, meta2, x2 = stage(v1, meta1, {"kept": kept, "top": x1["top"], "rest": x1["rest"]})
        # ---- R4, R5: round half to even (the increment)
        ups = [round_on & x2["top"][c] & (x2["rest"][c] | x2["kept"][c][0]) for c in range(C)]
        v3, meta3, _, rounded = split_add(v2, meta2, x2["kept"], ups, wide + 1, {})
        v4, meta4, x4 = stage(v3, meta3, {"rounded": rounded})
        return v4, meta4, x4["rounded"]

    def _counters(self, m, run, cells, sat_valid, sat_q, kept_last):
        """Run end (``done``) and the counters."""
        running, starting = run["running"], run["starting"]
        popped_last = self.out.valid & self.out.ready & self.out.payload.last
        # done leaves a register (a cycle after the run ends): out.ready reaches no further
        done = Signal(name="done_q")
        m.d.sync += done.eq(0)
        with m.If(running & (popped_last | kept_last | run["empty"])):
            m.d.sync += [running.eq(0), done.eq(1)]
        m.d.comb += self.done.eq(done)
        busy_cycles, active_cycles = Signal(32), Signal(32)
        stall_cycles, saturations = Signal(32), Signal(32)
        mac_ops = Signal(48)
        # the cells of a step (a small multiply) and the saturated lanes are summed a
        # stage after they are known; both settle before the run's last output is out
        # (the step's extents are registered first: the multiply starts from registers)
        # (and the product split in two: rows * cols = rows * low bits + rows * high bits)
        rows_q = Signal.like(cells["count_fields"]["rows"], reset_less=True)
        cols_q = Signal.like(cells["count_fields"]["cols"], reset_less=True)
        half = (len(cols_q) + 1) // 2
        part_lo = Signal(range(self.rows * (1 << half) + 1), reset_less=True)
        part_hi = Signal(range(self.rows * self.cols + 1), reset_less=True)
        cells_q = Signal(range(self.rows * self.cols + 1), reset_less=True)
        valid_q, valid_p, count_q = Signal(), Signal(), Signal()
        sats_q = Signal(range(self.cols + 1), reset_less=True)
        m.d.sync += [rows_q.eq(cells["count_fields"]["rows"]), cols_q.eq(cells["count_fields"]["cols"]),
                     valid_q.eq(cells["count_valid"]),
                     part_lo.eq(rows_q * cols_q[:half]), part_hi.eq((rows_q * cols_q[half:]) << half),
                     valid_p.eq(valid_q),
                     cells_q.eq(part_lo + part_hi), count_q.eq(valid_p),
                     sats_q.eq(Mux(sat_valid, sum(sat_q[c] for c in range(self.cols)), 0))]
        with m.If(starting):
            m.d.sync += [busy_cycles.eq(0), active_cycles.eq(0), stall_cycles.eq(0), mac_ops.eq(0),
                         saturations.eq(0)]
        with m.Elif(running):
            m.d.sync += [busy_cycles.eq(busy_cycles + 1), saturations.eq(saturations + sats_q)]
            with m.If(count_q):
                m.d.sync += [active_cycles.eq(active_cycles + 1), mac_ops.eq(mac_ops + cells_q)]
            with m.If(cells["stall"]):
                m.d.sync += stall_cycles.eq(stall_cycles + 1)
        m.d.comb += [self.busy_cycles.eq(busy_cycles), self.active_cycles.eq(active_cycles),
                     self.stall_cycles.eq(stall_cycles), self.mac_ops.eq(mac_ops),
                     self.saturations.eq(saturations)]


def connect_operand(m: Module, req, buf: SkewedBuffer, data_in):
    """Wire a core's operand request to a buffer's read port and its lanes back."""
    m.d.comb += [buf.rd_en.eq(req.en), buf.rd_fixed.eq(req.fixed), buf.rd_start.eq(req.start),
                 buf.rd_rowwise.eq(req.rowwise), buf.rd_extent.eq(req.extent),
                 data_in.eq(buf.rd_data)]


class MacUnit(Elaboratable):
    """:class:`MacCore` with its two operand buffers ``p`` (A side: X or dY) and ``q``
    (B side: W or dY), each ``max_dim x max_dim``. The buffers' write ports and the core's
    configuration/result ports are the interface (the AXI front end drives them);
    ``core_options`` go to the core."""

    def __init__(self, *, rows: int = 4, cols: int = 4, max_dim: int = 64, out_width: int = 16,
                 **core_options):
        self.core = MacCore(rows=rows, cols=cols, max_dim=max_dim, max_depth=max_dim,
                            out_width=out_width, **core_options)
        lanes = self.core.lanes
        self.p = SkewedBuffer(lanes=lanes, rows=max_dim, cols=max(max_dim, lanes))
        self.q = SkewedBuffer(lanes=lanes, rows=max_dim, cols=max(max_dim, lanes))

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = self.core
        m.submodules.p = self.p
        m.submodules.q = self.q
        connect_operand(m, self.core.a_req, self.p, self.core.a_data)
        connect_operand(m, self.core.b_req, self.q, self.core.b_data)
        return m
