"""Bit-exact model of the training Pipeline (chained TrainStages) and its schedules.

A pipeline of ``p`` stages; stage ``s`` owns one linear layer ``W_s [d_s, d_{s+1}]``
(master weights in :class:`~gnnweave.golden.mac.SgdFormat`, MAC weights narrowed from
them), optional fused ReLU. A training *run* streams ``n`` microbatches through it;
activations flow downstream (forward ``F``), activation gradients upstream (backward
``B``: ``dX`` and ``dW`` of the microbatch), and weights change in updates (``U``).
The loss gradient of the last stage's output is supplied by the host
(``loss_grad(mb, logits_q) -> dy_q``).

Each stage executes its own fixed op sequence (:func:`stage_ops`). Because every op
reads only its stage's state and the data its neighbours produced for the same
microbatch, the results depend only on these per-stage sequences, never on how the
stages interleave in time: the RTL runs the same sequences, so it matches bit for bit.

Schedules (register encoding :class:`Schedule`), ``m`` microbatches per step:

``GPIPE``        per step: ``F_0 .. F_{m-1}``, then ``B_{m-1} .. B_0`` (GPipe, Huang et al.
                 2019, fig. 2), then ``U`` (the flush).
``ONEF1B_FLUSH`` per step at stage ``s``: ``w = min(p-1-s, m)`` warm-up forwards, then
                 alternate ``F``/``B`` (one forward, one backward), cool-down backwards,
                 then ``U`` (PipeDream-Flush / Megatron-LM).
``ONEF1B_ASYNC`` no flush: the ``n`` microbatches of the whole run form one stream;
                 stage ``s`` keeps ``w = p - s`` microbatches in flight (PipeDream's
                 NOAM), alternates ``B_j``/``F_{j+w}`` and applies ``U`` right after each
                 ``B`` with that microbatch's gradient alone. *Weight stashing*: ``B_i``
                 uses the weight version ``F_i`` used, so with versions counted from 0 at
                 the start of the run, ``F_i`` at stage ``s`` sees version
                 ``max(0, i - (p - s) + 1)`` (PipeDream, Narayanan et al. 2019).

Synchronous schedules sum the 16-bit ``dW`` of the microbatches exactly (32-bit
accumulator, order independent), so GPipe and 1F1B-flush give identical weights.

Numerics per op (all via :mod:`gnnweave.golden.mac`): ``F``: ``Y = mac_forward(X, W,
shift=fwd_shift, relu)``; ``B``: ``dX = mac_input_grad(dY, W, shift=dx_shift,
relu_mask=Y>0)``, ``dW = mac_weight_grad(X, dY, shift=dw_shift, relu_mask)``; ``U``:
``sgd_update(master, sum dW)``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from gnnweave.enums import parse_enum
from gnnweave.fixed import FixedFormat
from gnnweave.golden.mac import (
    SgdFormat,
    mac_forward,
    mac_forward_float,
    mac_input_grad,
    mac_input_grad_float,
    mac_weight_grad,
    mac_weight_grad_float,
    master_to_weight,
    sgd_update,
    sgd_update_float,
)


class Schedule(enum.IntEnum):
    """Pipeline schedule; the values are the register encoding (``hw.pipeline.Schedule``)."""

    GPIPE = 0
    ONEF1B_FLUSH = 1
    ONEF1B_ASYNC = 2

    @property
    def cli_name(self) -> str:
        return {0: "gpipe", 1: "1f1b-flush", 2: "1f1b-async"}[int(self)]

    @property
    def synchronous(self) -> bool:
        return self is not Schedule.ONEF1B_ASYNC

    @classmethod
    def parse(cls, value) -> "Schedule":
        return parse_enum(cls, value, "schedule", lambda s: (s.cli_name,))


class OpKind(enum.IntEnum):
    F = 0
    B = 1
    U = 2


@dataclass(frozen=True)
class Op:
    kind: OpKind
    mb: int  # global microbatch index of the run; for U: the microbatch that triggered it (-1: flush)

    def __repr__(self):
        return f"{self.kind.name}{self.mb if self.mb >= 0 else ''}"


def stage_ops(schedule, stages: int, microbatches: int, stage: int, steps: int = 1) -> list[Op]:
    """The op sequence stage ``stage`` of ``stages`` executes for ``steps`` steps of
    ``microbatches`` microbatches each (global microbatch indices ``0 .. steps*m - 1``)."""
    schedule = Schedule.parse(schedule)
    p, m = int(stages), int(microbatches)
    if p < 1 or m < 1 or steps < 1:
        raise ValueError(f"stages, microbatches and steps must be >= 1 (got {p}, {m}, {steps})")
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} is not in 0..{p - 1}")
    ops: list[Op] = []
    if schedule is Schedule.ONEF1B_ASYNC:
        n = m * steps
        w = min(p - stage, n)
        ops += [Op(OpKind.F, i) for i in range(w)]
        for j in range(n):
            ops += [Op(OpKind.B, j), Op(OpKind.U, j)]
            if j + w < n:
                ops.append(Op(OpKind.F, j + w))
        return ops
    for step in range(steps):
        base = step * m
        if schedule is Schedule.GPIPE:
            ops += [Op(OpKind.F, base + i) for i in range(m)]
            ops += [Op(OpKind.B, base + i) for i in reversed(range(m))]
        else:
            w = min(p - 1 - stage, m)
            ops += [Op(OpKind.F, base + i) for i in range(w)]
            for j in range(m - w):
                ops += [Op(OpKind.F, base + w + j), Op(OpKind.B, base + j)]
            ops += [Op(OpKind.B, base + j) for j in range(m - w, m)]
        ops.append(Op(OpKind.U, -1))
    return ops


def bubble_formula(schedule, stages: int, microbatches: int) -> float:
    """Idle share of a stage with ``p`` balanced stages: ``(p-1)/(m+p-1)`` for the
    synchronous schedules, 0 in the steady state of asynchronous 1F1B."""
    schedule = Schedule.parse(schedule)
    if not schedule.synchronous:
        return 0.0
    p, m = stages, microbatches
    return (p - 1) / (m + p - 1)


def max_in_flight(schedule, stages: int, microbatches: int, stage: int) -> int:
    """Most microbatches stage ``stage`` holds (forward done, backward not): the number of
    activation stash slots (and, for async, stashed weight versions) it needs."""
    held, peak = 0, 0
    for op in stage_ops(schedule, stages, microbatches, stage, steps=2 if
                        Schedule.parse(schedule).synchronous else 1):
        held += {OpKind.F: 1, OpKind.B: -1, OpKind.U: 0}[op.kind]
        peak = max(peak, held)
    return peak


# ---------------------------------------------------------------- formats and state

@dataclass(frozen=True)
class TrainFormat:
    """Formats of a training pipeline (the same for every stage).

    ``act``: stage inputs and outputs (``input``, if set, is stage 0's input format instead,
    e.g. precomputed features); ``grad``: activation gradients (``dY``, ``dX``);
    ``sgd``: master weights, MAC weights, weight-gradient sums and hyper-parameters.
    Each ``DW`` output is narrowed into ``FixedFormat(dw_width, sgd.grad.frac)``.
    """

    act: FixedFormat = FixedFormat(16, 8)
    grad: FixedFormat = FixedFormat(16, 12)
    sgd: SgdFormat = SgdFormat()
    dw_width: int = 16
    input: FixedFormat | None = None

    def __post_init__(self):
        for s in (0, 1):
            if self.dw_shift_at(s) < 0 or self.fwd_shift_at(s) < 0:
                raise ValueError(f"TrainFormat: stage {s} would need a negative shift "
                                 f"(input/act/grad fractions too small for weight/sgd.grad)")

    def input_at(self, stage: int) -> FixedFormat:
        return self.input if (stage == 0 and self.input is not None) else self.act

    def fwd_shift_at(self, stage: int) -> int:
        return self.input_at(stage).frac + self.sgd.weight.frac - self.act.frac

    def dw_shift_at(self, stage: int) -> int:
        return self.input_at(stage).frac + self.grad.frac - self.sgd.grad.frac

    @property
    def fwd_shift(self) -> int:
        """Shift of ``F`` at stages >= 1 (act * weight -> act)."""
        return self.fwd_shift_at(1)

    @property
    def dx_shift(self) -> int:
        """Shift of the ``DX`` at every stage (grad * weight -> grad)."""
        return self.sgd.weight.frac

    @property
    def dw_shift(self) -> int:
        """Shift of ``DW`` at stages >= 1."""
        return self.dw_shift_at(1)


@dataclass
class StageState:
    """What a stage keeps on chip between runs."""

    master: np.ndarray                 # int64 [d_in, d_out], fmt.sgd.master
    velocity: np.ndarray | None = None  # momentum buffer
    version: int = 0                   # updates applied so far (in this run)


@dataclass
class RunTrace:
    """Everything a run produced, per stage ``s`` and global microbatch ``i``."""

    ops: list[list[Op]]
    outputs: list[dict[int, np.ndarray]]        # Y of stage s for mb i
    input_grads: list[dict[int, np.ndarray]]    # dX of stage s for mb i
    fwd_version: list[dict[int, int]]           # weight version F_i used at stage s
    bwd_version: list[dict[int, int]]           # weight version B_i used at stage s
    saturations: list[int]                      # per stage, all ops
    masters: list[np.ndarray] = field(default_factory=list)   # after the run
    weights: list[np.ndarray] = field(default_factory=list)   # MAC weights after the run


LossGrad = Callable[[int, np.ndarray], np.ndarray]


class GoldenPipeline:
    """Stateful bit-exact pipeline: ``run`` streams microbatches under a schedule."""

    def __init__(self, masters: Sequence[np.ndarray], *, relu: Sequence[bool] | None = None,
                 fmt: TrainFormat = TrainFormat(), lr_q: int, wd_q: int = 0, mu_q: int = 0):
        if not masters:
            raise ValueError("a pipeline needs at least one stage")
        self.fmt = fmt
        self.stages: list[StageState] = []
        for s, m in enumerate(masters):
            m = np.asarray(m, dtype=np.int64)
            if m.ndim != 2:
                raise ValueError(f"masters[{s}] must be 2-D [d_in, d_out], got shape {m.shape}")
            if s and m.shape[0] != self.stages[-1].master.shape[1]:
                raise ValueError(f"masters[{s}] has {m.shape[0]} rows but stage {s - 1} outputs "
                                 f"{self.stages[-1].master.shape[1]} features")
            fmt.sgd.master.saturate(m)  # range check below gives the index
            lo, hi = fmt.sgd.master.min_int, fmt.sgd.master.max_int
            bad = np.argwhere((m < lo) | (m > hi))
            if bad.size:
                raise ValueError(f"masters[{s}]{list(bad[0])} does not fit {fmt.sgd.master}")
            self.stages.append(StageState(m.copy()))
        p = len(self.stages)
        self.relu = [s < p - 1 for s in range(p)] if relu is None else list(relu)
        if len(self.relu) != p:
            raise ValueError(f"relu has {len(self.relu)} entries for {p} stages")
        self.lr_q, self.wd_q, self.mu_q = int(lr_q), int(wd_q), int(mu_q)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def weights(self) -> list[np.ndarray]:
        return [master_to_weight(st.master, self.fmt.sgd)[0] for st in self.stages]

    def run(self, schedule, inputs: Sequence[np.ndarray], loss_grad: LossGrad,
            microbatches: int | None = None) -> RunTrace:
        """Stream ``inputs`` (one int array ``[rows, d_0]`` per microbatch, ``act`` format)
        through the pipeline; ``microbatches`` per step (default: all of them)."""
        schedule = Schedule.parse(schedule)
        n = len(inputs)
        m = n if microbatches is None else int(microbatches)
        if m < 1 or n % m:
            raise ValueError(f"{n} microbatches do not split into steps of {m}")
        p, fmt = self.num_stages, self.fmt
        ops = [stage_ops(schedule, p, m, s, steps=n // m) for s in range(p)]
        trace = RunTrace(ops, [{} for _ in range(p)], [{} for _ in range(p)],
                         [{} for _ in range(p)], [{} for _ in range(p)], [0] * p)
        # per-stage state of the run
        versions = [{0: self.weights()[s]} for s in range(p)]   # version -> MAC weights
        for st in self.stages:
            st.version = 0
        stash_x = [{} for _ in range(p)]
        stash_mask = [{} for _ in range(p)]
        grad_sum = [np.zeros_like(st.master) for st in self.stages]
        pending_dw: list[dict[int, np.ndarray]] = [{} for _ in range(p)]
        down_grad: dict[int, np.ndarray] = {}   # dY entering the last stage
        pc = [0] * p

        def ready(s: int, op: Op) -> bool:
            if op.kind is OpKind.F:
                return s == 0 or op.mb in trace.outputs[s - 1]
            if op.kind is OpKind.B:
                return op.mb in (down_grad if s == p - 1 else trace.input_grads[s + 1])
            return True

        remaining = sum(len(o) for o in ops)
        while remaining:
            progressed = False
            for s in range(p):
                while pc[s] < len(ops[s]) and ready(s, ops[s][pc[s]]):
                    self._execute(s, ops[s][pc[s]], schedule, inputs, loss_grad, trace, versions,
                                  stash_x, stash_mask, grad_sum, pending_dw, down_grad)
                    pc[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:  # cannot happen for the schedules above
                raise RuntimeError(f"pipeline deadlock at ops {[o[i] for o, i in zip(ops, pc)]}")
        trace.masters = [st.master.copy() for st in self.stages]
        trace.weights = self.weights()
        return trace

    def _execute(self, s, op, schedule, inputs, loss_grad, trace, versions, stash_x, stash_mask,
                 grad_sum, pending_dw, down_grad):
        fmt, st, p = self.fmt, self.stages[s], self.num_stages
        if op.kind is OpKind.F:
            x = np.asarray(inputs[op.mb]) if s == 0 else trace.outputs[s - 1][op.mb]
            w = versions[s][st.version]
            res = mac_forward(x, w, shift=fmt.fwd_shift_at(s), out_width=fmt.act.width,
                              relu=self.relu[s])
            trace.saturations[s] += res.saturations
            trace.outputs[s][op.mb] = res.out
            trace.fwd_version[s][op.mb] = st.version
            stash_x[s][op.mb] = x
            stash_mask[s][op.mb] = res.relu_mask
            if s == p - 1:
                dy = np.asarray(loss_grad(op.mb, res.out))
                if dy.shape != res.out.shape:
                    raise ValueError(f"loss_grad({op.mb}) returned shape {dy.shape}, "
                                     f"expected {res.out.shape}")
                down_grad[op.mb] = dy
        elif op.kind is OpKind.B:
            dy = down_grad.pop(op.mb) if s == p - 1 else trace.input_grads[s + 1][op.mb]
            version = trace.fwd_version[s][op.mb] if not schedule.synchronous else st.version
            w = versions[s][version]
            x, mask = stash_x[s].pop(op.mb), stash_mask[s].pop(op.mb)
            dx = mac_input_grad(dy, w, shift=fmt.dx_shift, out_width=fmt.grad.width, relu_mask=mask)
            dw = mac_weight_grad(x, dy, shift=fmt.dw_shift_at(s), out_width=fmt.dw_width,
                                 relu_mask=mask)
            trace.saturations[s] += dx.saturations + dw.saturations
            trace.input_grads[s][op.mb] = dx.out
            trace.bwd_version[s][op.mb] = version
            grad_sum[s] += dw.out
        else:
            grad, sgd_fmt = grad_sum[s], fmt.sgd
            res = sgd_update(st.master, grad, lr_q=self.lr_q, wd_q=self.wd_q, mu_q=self.mu_q,
                             velocity_q=st.velocity, fmt=sgd_fmt)
            trace.saturations[s] += res.saturations
            st.master, st.velocity = res.master, res.velocity
            st.version += 1
            versions[s][st.version] = res.weight
            # versions no stashed microbatch can still need are dropped (bounded stash)
            live = set(trace.fwd_version[s][mb] for mb in stash_x[s]) | {st.version}
            for v in [v for v in versions[s] if v not in live]:
                del versions[s][v]
            grad_sum[s][...] = 0


# ---------------------------------------------------------------- float reference

class FloatPipeline:
    """Float64 reference with the same schedule semantics (weight versions, update points)."""

    def __init__(self, weights: Sequence[np.ndarray], *, relu: Sequence[bool] | None = None,
                 lr: float, wd: float = 0.0, mu: float = 0.0):
        self.w = [np.asarray(w, dtype=np.float64).copy() for w in weights]
        p = len(self.w)
        self.relu = [s < p - 1 for s in range(p)] if relu is None else list(relu)
        self.v: list[np.ndarray | None] = [None] * p
        self.lr, self.wd, self.mu = lr, wd, mu

    def run(self, schedule, inputs, loss_grad, microbatches: int | None = None) -> dict:
        schedule = Schedule.parse(schedule)
        n = len(inputs)
        m = n if microbatches is None else int(microbatches)
        p = len(self.w)
        ops = [stage_ops(schedule, p, m, s, steps=n // m) for s in range(p)]
        outs = [{} for _ in range(p)]
        dxs = [{} for _ in range(p)]
        fwd_w = [{} for _ in range(p)]
        masks = [{} for _ in range(p)]
        xs = [{} for _ in range(p)]
        gsum = [np.zeros_like(w) for w in self.w]
        dgrad = {}
        pc = [0] * p
        remaining = sum(len(o) for o in ops)
        while remaining:
            for s in range(p):
                while pc[s] < len(ops[s]):
                    op = ops[s][pc[s]]
                    if op.kind is OpKind.F:
                        if s and op.mb not in outs[s - 1]:
                            break
                        x = np.asarray(inputs[op.mb], dtype=np.float64) if s == 0 else outs[s - 1][op.mb]
                        y, mask = mac_forward_float(x, self.w[s], relu=self.relu[s])
                        outs[s][op.mb], masks[s][op.mb], xs[s][op.mb] = y, mask, x
                        fwd_w[s][op.mb] = self.w[s]
                        if s == p - 1:
                            dgrad[op.mb] = np.asarray(loss_grad(op.mb, y), dtype=np.float64)
                    elif op.kind is OpKind.B:
                        src = dgrad if s == p - 1 else dxs[s + 1]
                        if op.mb not in src:
                            break
                        dy = src[op.mb]
                        w = fwd_w[s].pop(op.mb)
                        mask = masks[s].pop(op.mb)
                        dxs[s][op.mb] = mac_input_grad_float(dy, w, relu_mask=mask)
                        gsum[s] = gsum[s] + mac_weight_grad_float(xs[s].pop(op.mb), dy, relu_mask=mask)
                    else:
                        self.w[s], self.v[s] = sgd_update_float(self.w[s], gsum[s], lr=self.lr,
                                                                wd=self.wd, mu=self.mu,
                                                                velocity=self.v[s])
                        gsum[s] = np.zeros_like(self.w[s])
                    pc[s] += 1
                    remaining -= 1
        return {"outputs": outs, "input_grads": dxs}


# ---------------------------------------------------------------- timing model

@dataclass
class Timeline:
    start: list[list[float]]   # per stage, start time of each op (stage_ops order)
    end: list[list[float]]
    busy: list[float]          # F + B time per stage (updates excluded)
    makespan: float            # first op start to last F/B end, all stages
    bubble_fraction: float     # 1 - sum(busy) / (p * makespan)


def schedule_timeline(schedule, stages: int, microbatches: int, *, t_f: float = 1.0,
                      t_b: float = 2.0, t_u: float = 0.0, link: float = 0.0,
                      host: float = 0.0, t_dx: float | None = None) -> Timeline:
    """As-soon-as-possible timing of one step (one run of ``m`` microbatches for async):
    each op starts when its stage is free and its input arrived (``link`` between stages,
    ``host`` for the loss gradient). The bubble is measured over the F/B part of the step.
    ``t_dx``: a backward's input gradient leaves ``t_dx`` after its start (the hardware
    computes ``dX`` before ``dW``); default: at its end (the textbook model)."""
    schedule = Schedule.parse(schedule)
    p = stages
    ops = [stage_ops(schedule, p, microbatches, s) for s in range(p)]
    start = [[0.0] * len(o) for o in ops]
    end = [[0.0] * len(o) for o in ops]
    f_end = [{} for _ in range(p)]
    b_end = [{} for _ in range(p)]
    free = [0.0] * p
    pc = [0] * p
    remaining = sum(len(o) for o in ops)
    while remaining:
        for s in range(p):
            while pc[s] < len(ops[s]):
                op = ops[s][pc[s]]
                if op.kind is OpKind.F:
                    if s and op.mb not in f_end[s - 1]:
                        break
                    t0 = max(free[s], f_end[s - 1][op.mb] + link if s else 0.0)
                    dur = t_f
                elif op.kind is OpKind.B:
                    if s == p - 1:
                        if op.mb not in f_end[s]:
                            break
                        t_in = f_end[s][op.mb] + host
                    else:
                        if op.mb not in b_end[s + 1]:
                            break
                        t_in = b_end[s + 1][op.mb] + link
                    t0 = max(free[s], t_in)
                    dur = t_b
                    out_at = t0 + (t_b if t_dx is None else t_dx)
                else:
                    t0, dur = free[s], t_u
                start[s][pc[s]], end[s][pc[s]] = t0, t0 + dur
                if op.kind is OpKind.F:
                    f_end[s][op.mb] = t0 + dur
                elif op.kind is OpKind.B:
                    b_end[s][op.mb] = out_at
                free[s] = t0 + dur
                pc[s] += 1
                remaining -= 1
    fb_end = max(e for s in range(p) for e, op in zip(end[s], ops[s]) if op.kind is not OpKind.U)
    busy = [sum(e - b for b, e, op in zip(start[s], end[s], ops[s]) if op.kind is not OpKind.U)
            for s in range(p)]
    return Timeline(start, end, busy, fb_end, 1.0 - sum(busy) / (p * fb_end))


def steady_state_utilization(stages: int, microbatches: int, *, t_f: float = 1.0,
                             t_b: float = 2.0) -> float:
    """Async 1F1B: busy share of each stage in the steady state (warm-up and drain
    excluded); the minimum over stages."""
    tl = schedule_timeline(Schedule.ONEF1B_ASYNC, stages, microbatches, t_f=t_f, t_b=t_b)
    ops = [stage_ops(Schedule.ONEF1B_ASYNC, stages, microbatches, s) for s in range(stages)]
    # steady window: from the first stage's first B (every stage has then filled) to the
    # first stage's last F (after it, the pipeline drains)
    t0 = min(tl.start[0][i] for i, op in enumerate(ops[0]) if op.kind is OpKind.B)
    t1 = max(tl.end[0][i] for i, op in enumerate(ops[0]) if op.kind is OpKind.F)
    if t1 <= t0:
        raise ValueError(f"no steady state with {microbatches} microbatches on {stages} stages")
    utils = []
    for s in range(stages):
        busy = sum(max(0.0, min(e, t1) - max(b, t0)) for b, e, op in zip(tl.start[s], tl.end[s], ops[s])
                   if op.kind is not OpKind.U)
        utils.append(busy / (t1 - t0))
    return min(utils)


# ---------------------------------------------------------------- host loss

def softmax_xent_grad(logits_q, labels, *, act: FixedFormat, grad: FixedFormat,
                      scale: float, mask=None) -> np.ndarray:
    """Host loss gradient ``scale * (softmax(z) - onehot(y))`` quantised into ``grad``
    (deterministic: the golden and the RTL runs call it on the same integers).
    Rows where ``mask`` is False get zero gradient (padding rows)."""
    z = act.to_float(logits_q)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    labels = np.asarray(labels, dtype=np.int64)
    prob[np.arange(len(labels)), labels] -= 1.0
    g = prob * scale
    if mask is not None:
        g = np.where(np.asarray(mask, dtype=bool)[:, None], g, 0.0)
    q, _ = grad.quantize(g)
    return q.astype(np.int64)
