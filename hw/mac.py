"""MacArray: fixed-point matrix unit for ``Y = X W (+b, ReLU)``, ``dX = dY W^T``, ``dW = X^T dY``.

Architecture (output-stationary, broadcast operands)
----------------------------------------------------
``rows x cols`` cells; cell ``(r, c)`` owns one accumulator of the output tile and does
one ``16 x 16`` multiply-accumulate per cycle (one DSP slice: registered operands,
registered product, accumulate). Each cycle the depth index ``k`` advances: the row
operand ``a[r] = A[i0 + r, k]`` is broadcast along row ``r``, the column operand
``b[c] = B[k, j0 + c]`` along column ``c`` (an outer product per cycle). Output-stationary
was chosen over a systolic (skewed) array because a tile's results are complete
``K + 4`` cycles after its first operand, the next tile starts in the very next cycle
(no fill/drain skew between tiles), and broadcast fan-out of ``rows`` / ``cols`` <= 16 is
cheap at these array sizes. When a tile's last depth step is accumulated, the
accumulators are copied into a result bank and a drain unit narrows one tile row per
cycle (bias, round half to even, saturate, ReLU) while the array computes the next tile.

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

from amaranth.hdl import Array, Cat, Const, Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .arith import round_half_even_shift, rounding_constants, saturate
from .axi import BusParams


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
    ``col`` must be a multiple of ``lanes`` and the segment must not wrap.
    Read port (result one cycle after the request, held while ``rd_en`` is low):
    ``rd_fixed`` (the fixed index), ``rd_start`` (first lane's index along the other axis),
    ``rd_rowwise`` (1: lanes are ``(fixed, start + l)``; 0: ``(start + l, fixed)``),
    ``rd_extent`` (lanes with ``start + l >= extent`` read 0) -> ``rd_data[l]``.
    """

    def __init__(self, *, lanes: int, rows: int, cols: int, width: int = MAC_INPUT_WIDTH):
        self.lanes, self.rows, self.cols, self.width = lanes, rows, cols, width
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
        self.rd_en = Signal()
        self.rd_fixed = Signal(index_bits)
        self.rd_start = Signal(index_bits)
        self.rd_rowwise = Signal()
        self.rd_extent = Signal(index_bits + 1)
        self.rd_data = Signal(data.ArrayLayout(signed(width), lanes))

    def elaborate(self, platform):
        m = Module()
        L, lb = self.lanes, self.lane_bits
        depth = 1 << (self.row_bits + self.word_bits)
        rot_w = (self.wr.row[:lb] if lb else Const(0, 1))
        rot_r = Signal(max(lb, 1))
        m.d.comb += rot_r.eq((self.rd_start + self.rd_fixed)[:lb] if lb else 0)
        rot_r_q = Signal.like(rot_r)
        start_q = Signal.like(self.rd_start)
        extent_q = Signal.like(self.rd_extent)
        with m.If(self.rd_en):
            m.d.sync += [rot_r_q.eq(rot_r), start_q.eq(self.rd_start), extent_q.eq(self.rd_extent)]
        bank_data = []
        for b in range(L):
            mem = Memory(shape=signed(self.width), depth=depth, init=[])
            m.submodules[f"bank{b}"] = mem
            wp = mem.write_port()
            rp = mem.read_port()
            # write: lane l lands in bank (row + col + l) mod L = (row + l) mod L (col aligned)
            lane_w = Signal(max(lb, 1), name=f"wlane{b}")
            m.d.comb += lane_w.eq((b - rot_w) if lb else 0)
            m.d.comb += [
                wp.addr.eq(Cat(((self.wr.col >> lb) + 0)[:self.word_bits], self.wr.row[:self.row_bits])),
                wp.data.eq(self.wr.data[lane_w]),
                wp.en.eq(self.wr_en & (lane_w < self.wr.count)),
            ]
            # read: bank b serves lane l = (b - start - fixed) mod L
            lane_r = Signal(max(lb, 1), name=f"rlane{b}")
            m.d.comb += lane_r.eq((b - rot_r) if lb else 0)
            along = Signal(self.index_bits + 1, name=f"along{b}")
            m.d.comb += along.eq(self.rd_start + lane_r)
            row = Mux(self.rd_rowwise, self.rd_fixed, along)
            col = Mux(self.rd_rowwise, along, self.rd_fixed)
            m.d.comb += [
                rp.addr.eq(Cat((col >> lb)[:self.word_bits], row[:self.row_bits])),
                rp.en.eq(self.rd_en),
            ]
            bank_data.append(rp.data)
        banks = Array(bank_data)
        for l in range(L):
            inside = (start_q + l) < extent_q
            src = Signal(max(lb, 1), name=f"src{l}")
            m.d.comb += src.eq((rot_r_q + l) if lb else 0)
            m.d.comb += self.rd_data[l].eq(Mux(inside, banks[src], 0))
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
    except the bias vector): operands come from two :class:`SkewedBuffer` read ports.

    Biases (FWD with ``use_bias``): ``bias_clear``, then ``bias_wr_en``/``bias_wr_data`` once
    per output column in order.

    Start (``start`` pulse while idle) takes the configuration signals: ``mode``, ``m``,
    ``n``, ``k`` (output ``m x n``, depth ``k``), ``shift``, ``relu``, ``use_bias``,
    ``bias_shift``. The result streams out of ``out`` row segment by row segment (tile
    order, rows of a tile in order); ``done`` pulses after the last one was accepted.
    Counters (cleared on start): ``busy_cycles``, ``active_cycles`` (cycles the array
    accumulated), ``mac_ops`` (useful MACs), ``stall_cycles`` (array frozen by the drain
    or by ``out`` back-pressure), ``saturations`` (output elements that saturated).

    ``partial_sums=True`` (opt-in; off, the core is unchanged) lets a caller split a depth
    over several runs of the same ``m x n``: a partial-sum store (one word per tile row,
    ``rows`` memories addressed by tile index) and two more start-time inputs.
    ``acc_init``: every tile's accumulators start from the stored partial sums instead
    of 0. ``acc_keep``: every tile's raw accumulators are written back to the store by
    the drain (nothing goes out of ``out``, no bias, no narrowing; ``done`` pulses after
    the last tile row is stored). The accumulators are then wide enough for a total
    depth of ``2**32 - 1``, so the final narrowing sees the exact full-depth sum.

    ``operand_hold=True`` (opt-in; off, the core is unchanged) adds an input ``hold``: while
    it is high the array freezes exactly as for a drain stall (no operand read is issued,
    nothing advances), so a caller whose operands are still arriving can start a run early
    and hold it until the data at the requested address (``a_req`` / ``b_req``) is in.
    """

    #: Total depth (sum over split runs) a partial-sum core's accumulators hold exactly.
    MAX_TOTAL_DEPTH = 2**32 - 1

    def __init__(self, *, rows: int = 4, cols: int = 4, max_dim: int = 256, max_depth: int = 256,
                 out_width: int = 16, bias_width: int = 32, partial_sums: bool = False,
                 operand_hold: bool = False):
        if not 1 <= rows <= 64 or not 1 <= cols <= 64:
            raise ValueError(f"rows/cols must be in 1..64, got {rows}x{cols}")
        self.rows, self.cols = rows, cols
        self.lanes = 1 << (max(rows, cols) - 1).bit_length()
        self.max_dim, self.max_depth = max_dim, max_depth
        self.index_bits = max(max_dim, max_depth).bit_length() + 1
        self.partial_sums = partial_sums
        self.operand_hold = operand_hold
        self.acc_width = accumulator_width(self.MAX_TOTAL_DEPTH if partial_sums else max_depth)
        #: tiles of one max_dim x max_dim output: partial-sum store depth
        self.max_tiles = -(-max_dim // rows) * -(-max_dim // cols)
        self.out_width = out_width
        self.bias_width = bias_width
        ib = self.index_bits
        lanes_layout = data.ArrayLayout(signed(MAC_INPUT_WIDTH), self.lanes)
        partial = {"acc_init": In(1), "acc_keep": In(1)} if partial_sums else {}
        if operand_hold:
            partial["hold"] = In(1)
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
        R, C, ib, AW = self.rows, self.cols, self.index_bits, self.acc_width

        # ---- configuration, latched at start
        mode = Signal(MacMode)
        dim_m, dim_n, dim_k = Signal(ib), Signal(ib), Signal(ib)
        shift, relu, use_bias, bias_shift = Signal(7), Signal(), Signal(), Signal(5)
        running = Signal()
        issuing = Signal()
        acc_init, acc_keep = Const(0, 1), Const(0, 1)
        if self.partial_sums:
            acc_init, acc_keep = Signal(), Signal()
            with m.If(self.start & ~running):
                m.d.sync += [acc_init.eq(self.acc_init), acc_keep.eq(self.acc_keep)]
        with m.If(self.start & ~running):
            m.d.sync += [mode.eq(self.mode), dim_m.eq(self.m), dim_n.eq(self.n), dim_k.eq(self.k),
                         shift.eq(self.shift), relu.eq(self.relu), use_bias.eq(self.use_bias),
                         bias_shift.eq(self.bias_shift), running.eq(1),
                         issuing.eq((self.m != 0) & (self.n != 0) & (self.k != 0))]
        m.d.comb += self.busy.eq(running)

        # ---- bias vector: C banks, bank c holds bias[j] for j = c mod C at address j // C,
        # so a tile's C biases come out of one read (written in order j = 0, 1, ...)
        bias_lane = Signal(range(C))
        bias_word = Signal(range(self.max_dim // C + 2))
        with m.If(self.bias_clear):
            m.d.sync += [bias_lane.eq(0), bias_word.eq(0)]
        with m.Elif(self.bias_wr_en):
            m.d.sync += bias_lane.eq(bias_lane + 1)
            with m.If(bias_lane == C - 1):
                m.d.sync += [bias_lane.eq(0), bias_word.eq(bias_word + 1)]
        bias_ports = []
        for c in range(C):
            mem = Memory(shape=signed(self.bias_width), depth=self.max_dim // C + 1, init=[])
            m.submodules[f"bias{c}"] = mem
            wp = mem.write_port()
            m.d.comb += [wp.addr.eq(bias_word), wp.data.eq(self.bias_wr_data),
                         wp.en.eq(self.bias_wr_en & (bias_lane == c))]
            bias_ports.append(mem.read_port())

        stall = Signal()
        advance = ~stall

        # ---- stage 0: depth sequencer (tile row i0, tile col j0, depth kk)
        i0, j0, kk, tj = Signal(ib), Signal(ib), Signal(ib), Signal(ib)
        tile = Signal(range(self.max_tiles + 1))      # tile index in the run (partial-sum address)
        last_k = kk + 1 == dim_k
        last_j = j0 + C >= dim_n
        last_i = i0 + R >= dim_m
        with m.If(self.start & ~running):
            m.d.sync += [i0.eq(0), j0.eq(0), kk.eq(0), tj.eq(0), tile.eq(0)]
        with m.Elif(issuing & advance):
            m.d.sync += kk.eq(kk + 1)
            with m.If(last_k):
                m.d.sync += [kk.eq(0), j0.eq(j0 + C), tj.eq(tj + 1), tile.eq(tile + 1)]
                with m.If(last_j):
                    m.d.sync += [j0.eq(0), tj.eq(0), i0.eq(i0 + R)]
                    with m.If(last_i):
                        m.d.sync += issuing.eq(0)
        is_dw = mode == MacMode.DW
        is_dx = mode == MacMode.DX
        m.d.comb += [
            self.a_req.en.eq(advance), self.a_req.fixed.eq(kk), self.a_req.start.eq(i0),
            self.a_req.rowwise.eq(is_dw), self.a_req.extent.eq(dim_m),
            self.b_req.en.eq(advance), self.b_req.fixed.eq(kk), self.b_req.start.eq(j0),
            self.b_req.rowwise.eq(~is_dx), self.b_req.extent.eq(dim_n),
        ]

        def stage(name, src_valid, fields):
            """A pipeline register stage that moves only when the array advances."""
            valid = Signal(name=f"{name}_valid")
            regs = {k: Signal.like(v, name=f"{name}_{k}") for k, v in fields.items()}
            with m.If(advance):
                m.d.sync += valid.eq(src_valid)
                m.d.sync += [regs[k].eq(v) for k, v in fields.items()]
            with m.If(self.start & ~running):
                m.d.sync += valid.eq(0)
            return valid, regs

        tile_info = {"first": kk == 0, "last": last_k, "i0": i0, "j0": j0, "tj": tj, "tile": tile,
                     "rows": Mux(dim_m - i0 >= R, R, dim_m - i0)[:7],
                     "cols": Mux(dim_n - j0 >= C, C, dim_n - j0)[:7],
                     "end": last_k & last_j & last_i}
        # stage 1: buffer read in flight (data appears on a_data / b_data)
        v1, s1 = stage("s1", issuing, tile_info)
        # stage 2: registered operands (DSP A/B registers)
        a_reg = [Signal(signed(MAC_INPUT_WIDTH), name=f"a{r}") for r in range(R)]
        b_reg = [Signal(signed(MAC_INPUT_WIDTH), name=f"b{c}") for c in range(C)]
        with m.If(advance):
            m.d.sync += [a_reg[r].eq(self.a_data[r]) for r in range(R)]
            m.d.sync += [b_reg[c].eq(self.b_data[c]) for c in range(C)]
        v2, s2 = stage("s2", v1, s1)
        # stage 3: registered products (DSP M register)
        prod = [[Signal(signed(2 * MAC_INPUT_WIDTH), name=f"p{r}_{c}") for c in range(C)]
                for r in range(R)]
        with m.If(advance):
            m.d.sync += [prod[r][c].eq(a_reg[r] * b_reg[c]) for r in range(R) for c in range(C)]
        v3, s3 = stage("s3", v2, s2)
        # partial sums: read at stage 2 (data with stage 3, held while frozen), written by the
        # drain; each tile is read and written once per run, so reads never meet writes
        psum_rd, psum_wr = [], []
        if self.partial_sums:
            for r in range(R):
                mem = Memory(shape=unsigned(C * AW), depth=self.max_tiles, init=[])
                m.submodules[f"psum{r}"] = mem
                rp = mem.read_port()
                m.d.comb += [rp.addr.eq(s2["tile"]), rp.en.eq(advance)]
                psum_rd.append(rp.data)
                psum_wr.append(mem.write_port())
        # stage 4: accumulate (DSP P register); at a tile's last step into the result bank
        acc = [[Signal(signed(AW), name=f"acc{r}_{c}") for c in range(C)] for r in range(R)]
        res = [[Signal(signed(AW), name=f"res{r}_{c}") for c in range(C)] for r in range(R)]
        res_full = Signal()
        res_i0, res_j0 = Signal(ib), Signal(ib)
        res_tile = Signal.like(tile)
        res_rows, res_cols, res_end = Signal(7), Signal(7), Signal()
        load_res = Signal()
        with m.If(v3 & advance):
            for r in range(R):
                for c in range(C):
                    if self.partial_sums:
                        start_from = Mux(acc_init, psum_rd[r][c * AW:(c + 1) * AW].as_signed(), 0)
                    else:
                        start_from = 0
                    total = Mux(s3["first"], start_from, acc[r][c]) + prod[r][c]
                    m.d.sync += acc[r][c].eq(total)
                    with m.If(s3["last"]):
                        m.d.sync += res[r][c].eq(total)
            with m.If(s3["last"]):
                m.d.comb += load_res.eq(1)
                m.d.sync += [res_i0.eq(s3["i0"]), res_j0.eq(s3["j0"]), res_tile.eq(s3["tile"]),
                             res_rows.eq(s3["rows"]),
                             res_cols.eq(s3["cols"]), res_end.eq(s3["end"])]

        # ---- drain: one tile row per cycle through bias, rounding, saturation, ReLU
        drain_row = Signal(range(R + 1))
        for c, rp in enumerate(bias_ports):
            m.d.comb += [rp.addr.eq(s3["tj"]), rp.en.eq(load_res)]   # held during the drain
        out_valid = Signal()
        out_payload = Signal(output_layout(C, ib, self.out_width))
        m.d.comb += [self.out.valid.eq(out_valid), self.out.payload.eq(out_payload)]
        # keep: the drain stores raw rows (never blocked), nothing goes out
        can_emit = res_full & (acc_keep | ~out_valid | self.out.ready)
        row_sel = _wire(m, Array([Cat(*[res[r][c] for c in range(C)]) for r in range(R)])[drain_row],
                        name="row_sel")
        sat_flags = []
        new_payload = Signal.like(out_payload)
        wide = max(AW, self.bias_width + 31) + 2
        # the rounding mask and half depend on the shift only: latched with it at start, once
        # for all lanes, instead of a wide 1 << shift per lane. Both are written exactly when
        # `shift` is, and their reset value 0 is that of shift = 0, so in every cycle they
        # equal rounding_constants(shift, wide) (the first output of a run included).
        round_mask, round_half = Signal(wide, name="round_mask"), Signal(wide, name="round_half")
        mask_at_start, half_at_start = rounding_constants(self.shift, wide)
        with m.If(self.start & ~running):
            m.d.sync += [round_mask.eq(mask_at_start), round_half.eq(half_at_start)]
        for c in range(C):
            acc_v = row_sel[c * AW:(c + 1) * AW].as_signed()
            with_bias = Signal(signed(wide), name=f"biased{c}")
            m.d.comb += with_bias.eq(Mux(use_bias & (mode == MacMode.FWD) & ~acc_keep,
                                         acc_v + (bias_ports[c].data << bias_shift), acc_v))
            rounded = _wire(m, round_half_even_shift(with_bias, shift, (round_mask, round_half)))
            value, sat = _saturate(m, rounded, self.out_width)
            positive = value > 0
            in_tile = c < res_cols
            m.d.comb += [
                new_payload.data[c].eq(Mux(relu & ~positive, 0, value)),
                new_payload.relu_mask[c].eq(positive),
            ]
            sat_flags.append(sat & in_tile & ~acc_keep)
        row_last = drain_row + 1 >= res_rows
        m.d.comb += [new_payload.row.eq(res_i0 + drain_row), new_payload.col.eq(res_j0),
                     new_payload.count.eq(res_cols), new_payload.last.eq(res_end & row_last)]
        # the array may hand over a finished tile in the cycle the drain emits its last row
        drain_stall = v3 & s3["last"] & res_full & ~(can_emit & row_last)
        m.d.comb += stall.eq((drain_stall | self.hold) if self.operand_hold else drain_stall)
        saturations = Signal(32)
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += out_valid.eq(0)
        for r, wp in enumerate(psum_wr):
            m.d.comb += [wp.addr.eq(res_tile), wp.data.eq(row_sel),
                         wp.en.eq(can_emit & acc_keep & (drain_row == r))]
        with m.If(can_emit):
            m.d.sync += [out_valid.eq(~acc_keep), out_payload.eq(new_payload),
                         drain_row.eq(drain_row + 1),
                         saturations.eq(saturations + sum(sat_flags))]
            with m.If(row_last):
                m.d.sync += res_full.eq(0)
        with m.If(load_res):
            m.d.sync += [res_full.eq(1), drain_row.eq(0)]

        # ---- finish and counters
        with m.If(running & self.out.valid & self.out.ready & self.out.payload.last):
            m.d.sync += running.eq(0)
            m.d.comb += self.done.eq(1)
        with m.If(running & acc_keep & can_emit & res_end & row_last):   # last row stored
            m.d.sync += running.eq(0)
            m.d.comb += self.done.eq(1)
        # a run of an empty matrix finishes at once
        with m.If(running & ~issuing & ~v1 & ~v2 & ~v3 & ~res_full & ~out_valid &
                  ((dim_m == 0) | (dim_n == 0) | (dim_k == 0))):
            m.d.sync += running.eq(0)
            m.d.comb += self.done.eq(1)
        busy_cycles, active_cycles, stall_cycles = Signal(32), Signal(32), Signal(32)
        mac_ops = Signal(48)
        with m.If(self.start & ~running):
            m.d.sync += [busy_cycles.eq(0), active_cycles.eq(0), stall_cycles.eq(0), mac_ops.eq(0),
                         saturations.eq(0)]
        with m.Elif(running):
            m.d.sync += busy_cycles.eq(busy_cycles + 1)
            with m.If(v3 & advance):
                m.d.sync += [active_cycles.eq(active_cycles + 1),
                             mac_ops.eq(mac_ops + s3["rows"] * s3["cols"])]
            with m.If(stall):
                m.d.sync += stall_cycles.eq(stall_cycles + 1)
        m.d.comb += [self.busy_cycles.eq(busy_cycles), self.active_cycles.eq(active_cycles),
                     self.stall_cycles.eq(stall_cycles), self.mac_ops.eq(mac_ops),
                     self.saturations.eq(saturations)]
        return m


def connect_operand(m: Module, req, buf: SkewedBuffer, data_in):
    """Wire a core's operand request to a buffer's read port and its lanes back."""
    m.d.comb += [buf.rd_en.eq(req.en), buf.rd_fixed.eq(req.fixed), buf.rd_start.eq(req.start),
                 buf.rd_rowwise.eq(req.rowwise), buf.rd_extent.eq(req.extent),
                 data_in.eq(buf.rd_data)]


class MacUnit(Elaboratable):
    """:class:`MacCore` with its two operand buffers ``p`` (A side: X or dY) and ``q``
    (B side: W or dY), each ``max_dim x max_dim``. The buffers' write ports and the core's
    configuration/result ports are the interface (the AXI front end drives them)."""

    def __init__(self, *, rows: int = 4, cols: int = 4, max_dim: int = 64, out_width: int = 16):
        self.core = MacCore(rows=rows, cols=cols, max_dim=max_dim, max_depth=max_dim,
                            out_width=out_width)
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
