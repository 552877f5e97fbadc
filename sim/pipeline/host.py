"""The pipeline bench's host, independent of the simulator: the stream segment codec, the
streaming order, :class:`PipelineHost` (drives the pipeline's end streams and weight ports
cycle by cycle, plays the loss gradient, records every result) and the summaries."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gnnweave.fixed import FixedFormat
from gnnweave.golden.mac import SgdFormat
from gnnweave.golden.pipeline import OpKind, Schedule, TrainFormat, bubble_formula, stage_ops


BENCH_FORMAT = TrainFormat(act=FixedFormat(16, 8), grad=FixedFormat(16, 12),
                           sgd=SgdFormat(master=FixedFormat(32, 24), weight=FixedFormat(16, 12),
                                         grad=FixedFormat(32, 12)))


@dataclass
class RtlRun:
    outputs: list[dict[int, np.ndarray]]
    input_grads: list[dict[int, np.ndarray]]
    masters: list[np.ndarray]
    counters: list[dict[str, int]]
    cycles: int
    wall_s: float = 0.0
    stage_ops_seen: list = field(default_factory=list)


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


# ---------------------------------------------------------------- packing of struct ports

def _fields(layout):
    from amaranth.hdl import Shape
    out = {}
    for name, fld in layout:
        out[name] = (fld.offset, Shape.cast(fld.shape).width)
    return out


class SegmentCodec:
    """Packs/unpacks the stream payload (``hw.mac.output_layout``) as one integer."""

    def __init__(self, layout, lanes: int):
        self.f = _fields(layout)
        self.lanes = lanes
        off, width = self.f["data"]
        self.elem = width // lanes

    def pack(self, row, col, values, last) -> int:
        v = (row << self.f["row"][0]) | (col << self.f["col"][0])
        v |= len(values) << self.f["count"][0]
        v |= int(bool(last)) << self.f["last"][0]
        base = self.f["data"][0]
        mask = (1 << self.elem) - 1
        for l, x in enumerate(values):
            v |= (int(x) & mask) << (base + l * self.elem)
        return v

    def unpack(self, v: int):
        get = lambda name: (v >> self.f[name][0]) & ((1 << self.f[name][1]) - 1)
        base = self.f["data"][0]
        vals = []
        for l in range(self.lanes):
            x = (v >> (base + l * self.elem)) & ((1 << self.elem) - 1)
            vals.append(x - (1 << self.elem) if x >> (self.elem - 1) else x)
        return get("row"), get("col"), vals, get("count"), get("last")


def pack_words(values, width: int) -> int:
    v = 0
    for l, x in enumerate(values):
        v |= (int(x) & ((1 << width) - 1)) << (l * width)
    return v


def unpack_words(v: int, width: int, n: int) -> list[int]:
    out = []
    for l in range(n):
        x = (v >> (l * width)) & ((1 << width) - 1)
        out.append(x - (1 << width) if x >> (width - 1) else x)
    return out


# ---------------------------------------------------------------- the host side of the bench

def streaming_order(rows: int, cols: int, lanes: int, first_row: int = 0, end_row: int | None = None):
    """``(row, col, last)`` of a microbatch's segments in the order a TrainStage can start
    on before the microbatch is complete (see ``hw.train_stage._FillTracker``): row block
    (``lanes`` rows) by row block, within a block column word by word, within a word row
    by row. ``first_row`` / ``end_row`` (multiples of ``lanes``, or ``rows``) select whole
    row blocks; ``last`` marks the microbatch's final segment."""
    end_row = rows if end_row is None else end_row
    final = (rows - 1, (cols - 1) // lanes * lanes)
    for b0 in range(first_row, end_row, lanes):
        for c0 in range(0, cols, lanes):
            for r in range(b0, min(b0 + lanes, end_row)):
                yield r, c0, (r, c0) == final


class PipelineHost:
    """Everything the bench does around the RTL, cycle by cycle, independent of the
    simulator: ``io.set(name, int)`` / ``io.get(name) -> int`` on the top ports (``a.b``
    names a member of a stream port)."""

    def __init__(self, masters, inputs, loss_grad, *, schedule, microbatches, relu, lr_q, wd_q,
                 mu_q, fmt, lanes, seg_layout, master_width, dx_first: bool = True,
                 segment_order: str = "streaming", velocities=None, gaps: float = 0.0,
                 gap_seed: int = 0):
        if not 0.0 <= gaps < 1.0:
            raise ValueError(f"gaps must be in [0, 1), got {gaps}")
        #: share of cycles the host leaves its input streams idle and holds back the
        #: output streams' ready (seeded): data arrives at uneven times
        self.gaps = gaps
        self._gap_rng = np.random.default_rng(gap_seed)
        if velocities is not None and len(velocities) != len(masters):
            raise ValueError(f"velocities has {len(velocities)} entries for {len(masters)} stages")
        #: SGD velocity per stage (None: not loaded; the stage keeps what its memory holds)
        self.velocities = None if velocities is None else [
            None if v is None else np.asarray(v, dtype=np.int64) for v in velocities]
        if segment_order not in ("streaming", "rows"):
            raise ValueError(f"segment_order must be 'streaming' or 'rows', got {segment_order!r}")
        self.dx_first = dx_first
        #: "streaming": inputs and loss gradients in streaming_order (the ends of the
        #: pipeline start on partial data); "rows": row by row, which the stages accept
        #: too but only use once a microbatch is complete
        self.segment_order = segment_order
        self.schedule = Schedule.parse(schedule)
        self.p = p = len(masters)
        self.masters = [np.asarray(w, dtype=np.int64) for w in masters]
        self.dims = [masters[0].shape[0]] + [w.shape[1] for w in masters]
        self.rows = inputs[0].shape[0]
        self.inputs = inputs
        self.n = len(inputs)
        self.m = microbatches
        self.steps = self.n // self.m
        self.loss_grad = loss_grad
        self.relu, self.lr_q, self.wd_q, self.mu_q, self.fmt = relu, lr_q, wd_q, mu_q, fmt
        self.L = lanes
        self.codec = SegmentCodec(seg_layout, lanes)
        self.master_width = master_width
        orders = [stage_ops(self.schedule, p, self.m, s, self.steps) for s in range(p)]
        self.f_orders = [[o.mb for o in ops if o.kind is OpKind.F] for ops in orders]
        self.b_orders = [[o.mb for o in ops if o.kind is OpKind.B] for ops in orders]
        self.outputs = [dict() for _ in range(p)]
        self.input_grads = [dict() for _ in range(p)]
        L, rows = lanes, self.rows
        self.in_segs = [self.codec.pack(r, c0, x[r, c0:c0 + L], last)
                        for x in (np.asarray(i) for i in inputs)
                        for r, c0, last in self._order(rows, self.dims[0])]
        self.in_pos = 0
        self.f_pos, self.b_pos = [0] * p, [0] * p
        self.cur_out = [np.zeros((rows, self.dims[s + 1]), np.int64) for s in range(p)]
        self.cur_dx = [np.zeros((rows, self.dims[s]), np.int64) for s in range(p)]
        self.rows_seen = np.zeros(rows, np.int64)
        self.dy_queue: dict[int, list] = {}
        self.dy_sent_rows: dict[int, int] = {}
        self.b_send = 0
        self.sending = None
        self.cycle = 0
        self.steady: list[tuple[int, list[int]]] = []   # (cycle, per-stage F+B+U cycles)

    # static configuration and weight loading
    def config(self) -> list[tuple[str, int]]:
        cfg = [("schedule", int(self.schedule)), ("microbatches", self.m), ("steps", self.steps),
               ("total_stages", self.p), ("stage_offset", 0)]
        for s in range(self.p):
            cfg += [(f"s{s}_rows", self.rows), (f"s{s}_d_in", self.dims[s]),
                    (f"s{s}_d_out", self.dims[s + 1]), (f"s{s}_relu", int(self.relu[s])),
                    (f"s{s}_fwd_shift", self.fmt.fwd_shift_at(s)), (f"s{s}_dx_shift", self.fmt.dx_shift),
                    (f"s{s}_dw_shift", self.fmt.dw_shift_at(s)), (f"s{s}_lr", self.lr_q),
                    (f"s{s}_wd", self.wd_q), (f"s{s}_mu", self.mu_q),
                    (f"s{s}_dx_first", int(self.dx_first))]
        return cfg

    def weight_writes(self):
        """Per cycle: the list of (port, value) that writes one master word."""
        L = self.L
        for s, w in enumerate(self.masters):
            for r in range(w.shape[0]):
                for c0 in range(0, w.shape[1], L):
                    chunk = list(w[r, c0:c0 + L]) + [0] * (L - len(w[r, c0:c0 + L]))
                    yield [(f"s{s}_w_wr_en", 1), (f"s{s}_w_row", r), (f"s{s}_w_word", c0 // L),
                           (f"s{s}_w_wr_data", pack_words(chunk, self.master_width))]
            yield [(f"s{s}_w_wr_en", 0)]
            v = self.velocities[s] if self.velocities is not None else None
            if v is None:
                continue
            if v.shape != w.shape:
                raise ValueError(f"velocities[{s}] has shape {v.shape}, masters[{s}] {w.shape}")
            for r in range(v.shape[0]):
                for c0 in range(0, v.shape[1], L):
                    chunk = list(v[r, c0:c0 + L]) + [0] * (L - len(v[r, c0:c0 + L]))
                    yield [(f"s{s}_v_wr_en", 1), (f"s{s}_v_row", r), (f"s{s}_v_word", c0 // L),
                           (f"s{s}_v_wr_data", pack_words(chunk, self.velocity_width))]
            yield [(f"s{s}_v_wr_en", 0)]

    @property
    def velocity_width(self) -> int:
        return self.fmt.sgd.velocity.width

    def readback_addresses(self):
        L = self.L
        for s, w in enumerate(self.masters):
            for r in range(w.shape[0]):
                for c0 in range(0, w.shape[1], L):
                    yield s, r, c0, [(f"s{s}_w_row", r), (f"s{s}_w_word", c0 // L)]

    def collect_master(self, got, s, r, c0, word):
        vals = unpack_words(word, self.master_width, self.L)
        d_out = self.dims[s + 1]
        for l in range(min(self.L, d_out - c0)):
            got[s][r, c0 + l] = vals[l]

    # one cycle: drive, then sample the settled handshakes
    def drive(self, io):
        links = getattr(io, "drive_links", None)   # DevicesIO: the links between devices
        if links is not None:
            links()
        idle = self._gap_rng.random(4) < self.gaps if self.gaps else [False] * 4
        self.in_sending = self.in_pos < len(self.in_segs) and not idle[0]
        if self.in_sending:
            io.set("act_in.valid", 1)
            io.set("act_in.payload", self.in_segs[self.in_pos])
        else:
            io.set("act_in.valid", 0)
        io.set("act_out.ready", int(not idle[1]))
        io.set("grad_out.ready", int(not idle[2]))
        self.sending = None
        if self.b_send < len(self.b_orders[-1]) and not idle[3]:
            q = self.dy_queue.get(self.b_orders[-1][self.b_send])
            if q:
                self.sending = q[0]
        if self.sending is not None:
            io.set("grad_in.valid", 1)
            io.set("grad_in.payload", self.sending[0])
        else:
            io.set("grad_in.valid", 0)

    def _snapshot(self, io):
        self.steady.append((self.cycle, [io.get(f"s{s}_fwd_cycles") + io.get(f"s{s}_bwd_cycles") +
                                         io.get(f"s{s}_upd_cycles") for s in range(self.p)]))

    def steady_state_utilization(self) -> float | None:
        """Min over stages of the busy (F, B, U) share between the first stage's first
        backward output (all stages filled) and its last forward output (drain starts)."""
        if len(self.steady) < 2 or self.steady[1][0] <= self.steady[0][0]:
            return None
        (c0, b0), (c1, b1) = self.steady[0], self.steady[1]
        return min((y - x) / (c1 - c0) for x, y in zip(b0, b1))

    def sample(self, io) -> bool:
        links = getattr(io, "sample_links", None)
        if links is not None:
            links()
        self.cycle += 1
        if getattr(self, "in_sending", False) and io.get("act_in.ready"):
            self.in_pos += 1
        if self.sending is not None and io.get("grad_in.ready"):
            self.dy_queue[self.b_orders[-1][self.b_send]].pop(0)
            if self.sending[1]:
                self.b_send += 1
        p = self.p
        for s in range(p):
            if io.get(f"s{s}_act_fire"):
                row, col, vals, count, last = self.codec.unpack(io.get(f"s{s}_act_data"))
                mb = self.f_orders[s][self.f_pos[s]]
                if s == 0 and last and self.f_pos[0] == self.n - 1 and len(self.steady) == 1:
                    self._snapshot(io)
                self.cur_out[s][row, col:col + count] = vals[:count]
                if s == p - 1:
                    self._host_loss(mb, row, count)
                if last:
                    self.outputs[s][mb] = self.cur_out[s].copy()
                    self.f_pos[s] += 1
            if io.get(f"s{s}_grad_fire"):
                row, col, vals, count, last = self.codec.unpack(io.get(f"s{s}_grad_data"))
                if s == 0 and not self.steady:
                    self._snapshot(io)
                mb = self.b_orders[s][self.b_pos[s]]
                self.cur_dx[s][row, col:col + count] = vals[:count]
                if last:
                    self.input_grads[s][mb] = self.cur_dx[s].copy()
                    self.b_pos[s] += 1
        return bool(io.get("done"))

    def _host_loss(self, mb, row, count):
        """Send the loss gradient of every row block (``lanes`` rows, one row block of the
        MAC array) whose logits are complete, in the streaming order (row blocks finish in
        order; the gradient of a row needs the whole row of logits). The bench answers in
        the cycle the block's last logits segment came out: a host, or a loss unit on chip,
        that takes longer adds its turnaround to the last stage's backward."""
        d_out, L, rows = self.dims[-1], self.L, self.rows
        self.rows_seen[row] += count
        sent = self.dy_sent_rows.get(mb, 0)
        upto = sent
        while upto < rows and self.rows_seen[upto] == d_out:
            upto += 1
        if upto < rows and self.segment_order == "streaming":
            upto -= upto % L          # whole row blocks only
        if upto > sent:
            full = np.zeros_like(self.cur_out[-1])
            full[:upto] = self.cur_out[-1][:upto]
            dy = np.asarray(self.loss_grad(mb, full))
            q = self.dy_queue.setdefault(mb, [])
            for r, c0, last in self._order(rows, d_out, sent, upto):
                q.append((self.codec.pack(r, c0, dy[r, c0:c0 + L], last), last))
            self.dy_sent_rows[mb] = upto
        if upto == rows:
            self.rows_seen[:] = 0

    def _order(self, rows, cols, first_row=0, end_row=None):
        if self.segment_order == "streaming":
            return streaming_order(rows, cols, self.L, first_row, end_row)
        end_row = rows if end_row is None else end_row
        return [(r, c0, r == rows - 1 and c0 + self.L >= cols)
                for r in range(first_row, end_row) for c0 in range(0, cols, self.L)]

    def progress(self) -> str:
        return f"F done {self.f_pos}, B done {self.b_pos}"


async def drive_pipeline(io, host: "PipelineHost", stages: int, *, tick, settle=None,
                         max_cycles: int) -> RtlRun:
    """One run of ``host`` against a Pipeline, whatever the simulator: configure, load the
    weights, start, drive and sample every cycle until the host has every result, then
    read the counters and the master weights back.

    Args:
        io: port access by name (``set``/``get``).
        tick: awaitable factory, one clock edge.
        settle: awaitable factory that lets the outputs settle before they are sampled
            (cocotb's ``ReadOnly``; a port written after it waits for the next ``tick``),
            or None where sampling after ``set`` already sees them (Amaranth).
        max_cycles: the run fails with a RuntimeError naming the host's progress past it.
    """
    import time
    from gnnweave.hw.pipeline import STAGE_COUNTERS
    for name, value in host.config():
        io.set(name, value)
    for writes in host.weight_writes():
        for name, value in writes:
            io.set(name, value)
        await tick()
    io.set("start", 1)
    await tick()
    io.set("start", 0)
    cycles = 0
    t0 = time.time()
    while True:
        host.drive(io)
        if settle is not None:
            await settle()
        done = host.sample(io)
        await tick()
        cycles += 1
        if done:
            break
        if cycles >= max_cycles:
            raise RuntimeError(f"pipeline RTL did not finish in {max_cycles} cycles ({host.progress()})")
    wall = time.time() - t0
    counters = [{name: io.get(f"s{s}_{name}") for name in STAGE_COUNTERS} for s in range(stages)]
    got = [np.zeros_like(w) for w in host.masters]
    for s, r, c0, writes in host.readback_addresses():
        for name, value in writes:
            io.set(name, value)
        await tick()
        if settle is not None:
            await settle()
        host.collect_master(got, s, r, c0, io.get(f"s{s}_w_rd_data"))
        if settle is not None:
            await tick()
    return RtlRun(host.outputs, host.input_grads, got, counters, cycles, wall)


def measured_bubble(run: RtlRun) -> float:
    """Idle share of the stages over the forward/backward part of the run:
    ``1 - sum_s (fwd_s + bwd_s) / (p * (T - U_0))`` with ``T`` the run's cycles and ``U_0`` the
    first stage's update cycles (its flushes are on the critical path and outside the
    schedule formula)."""
    p = len(run.counters)
    t = run.counters[0]["busy_cycles"]
    span = t - run.counters[0]["upd_cycles"]
    fb = sum(c["fwd_cycles"] + c["bwd_cycles"] for c in run.counters)
    return 1.0 - fb / (p * span)


def compare_with_golden(host: "PipelineHost", trace, masters_rtl) -> list[str]:
    bad = []
    for s in range(host.p):
        for i in range(host.n):
            if not np.array_equal(host.outputs[s].get(i), trace.outputs[s][i]):
                bad.append(f"stage {s} output of microbatch {i}")
            if not np.array_equal(host.input_grads[s].get(i), trace.input_grads[s][i]):
                bad.append(f"stage {s} input gradient of microbatch {i}")
        if not np.array_equal(masters_rtl[s], trace.masters[s]):
            bad.append(f"stage {s} final master weights")
    return bad


def summarize(schedule, stages, microbatches, steps, counters, cycles, mismatches, lanes,
              trace_saturations, **extra) -> dict:
    run = RtlRun([], [], [], counters, cycles)
    busy = sum(c["busy_cycles"] for c in counters)
    fb = [c["fwd_cycles"] + c["bwd_cycles"] for c in counters]
    schedule = Schedule.parse(schedule)
    return {
        "unit": "pipeline", "match": not mismatches, "mismatches": mismatches[:20],
        "stages": stages, "microbatches": microbatches, "schedule": schedule.cli_name,
        "steps": steps, "lanes": lanes, "cycles": cycles,
        "mac_utilization": sum(c["mac_ops"] for c in counters) / (busy * lanes * lanes) if busy else 0.0,
        "bubble_fraction": measured_bubble(run),
        "bubble_formula": bubble_formula(schedule, stages, microbatches),
        "stage_utilization": [f / counters[0]["busy_cycles"] for f in fb],
        "saturations": sum(c["saturations"] for c in counters),
        "golden_saturations": int(sum(trace_saturations)),
        "counters": counters, **extra,
    }
