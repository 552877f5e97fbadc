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
from gnnweave.golden.mac import SgdFormat, master_to_weight
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


def run_pipeline_rtl(masters, inputs, loss_grad, *, schedule, microbatches: int, relu,
                     lr_q: int, wd_q: int = 0, mu_q: int = 0, fmt: TrainFormat = BENCH_FORMAT,
                     lanes: int = 4, max_cycles: int = 2_000_000, progress: bool = False) -> RtlRun:
    from amaranth.sim import Simulator

    schedule = Schedule.parse(schedule)
    p = len(masters)
    dims = [masters[0].shape[0]] + [w.shape[1] for w in masters]
    rows = inputs[0].shape[0]
    n = len(inputs)
    m = microbatches
    steps = n // m
    dut = build_pipeline(p, dims, rows, m, schedule, lanes, fmt)
    L = lanes
    st = dut.stage_list
    last_b_order = [op.mb for op in stage_ops(schedule, p, m, p - 1, steps) if op.kind is OpKind.B]
    outputs = [dict() for _ in range(p)]
    input_grads = [dict() for _ in range(p)]
    result = {}

    def segments(mat):
        for r in range(mat.shape[0]):
            for c0 in range(0, mat.shape[1], L):
                yield r, c0, mat[r, c0:c0 + L]

    async def bench(ctx):
        for s, stage in enumerate(st):
            d_in, d_out = dims[s], dims[s + 1]
            ctx.set(stage.rows, rows)
            ctx.set(stage.d_in, d_in)
            ctx.set(stage.d_out, d_out)
            ctx.set(stage.relu, int(relu[s]))
            ctx.set(stage.fwd_shift, fmt.fwd_shift_at(s))
            ctx.set(stage.dx_shift, fmt.dx_shift)
            ctx.set(stage.dw_shift, fmt.dw_shift_at(s))
            ctx.set(stage.lr, lr_q)
            ctx.set(stage.wd, wd_q)
            ctx.set(stage.mu, mu_q)
            master = np.asarray(masters[s], dtype=np.int64)
            for r in range(d_in):
                for wd in range(0, d_out, L):
                    chunk = list(master[r, wd:wd + L]) + [0] * (L - len(master[r, wd:wd + L]))
                    ctx.set(stage.w_wr_en, 1)
                    ctx.set(stage.w_row, r)
                    ctx.set(stage.w_word, wd // L)
                    for l in range(L):
                        ctx.set(stage.w_wr_data[l], int(chunk[l]))
                    await ctx.tick()
            ctx.set(stage.w_wr_en, 0)
        ctx.set(dut.schedule, int(schedule))
        ctx.set(dut.microbatches, m)
        ctx.set(dut.steps, steps)
        ctx.set(dut.total_stages, p)
        ctx.set(dut.stage_offset, 0)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)

        in_segs = [(i, r, c0, seg, (r == rows - 1 and c0 + L >= dims[0]))
                   for i in range(n) for r, c0, seg in segments(np.asarray(inputs[i]))]
        in_pos = 0
        # per stage, the microbatch currently streaming out of act_out / grad_out
        f_orders = [[op.mb for op in stage_ops(schedule, p, m, s, steps) if op.kind is OpKind.F]
                    for s in range(p)]
        b_orders = [[op.mb for op in stage_ops(schedule, p, m, s, steps) if op.kind is OpKind.B]
                    for s in range(p)]
        f_pos, b_pos = [0] * p, [0] * p
        cur_out = [np.zeros((rows, dims[s + 1]), np.int64) for s in range(p)]
        cur_dx = [np.zeros((rows, dims[s]), np.int64) for s in range(p)]
        rows_seen = [np.zeros(rows, np.int64) for _ in range(p)]
        # host loss: dY segments queued per microbatch, sent in last-stage B order
        dy_ready: dict[int, list] = {}
        dy_sent_rows: dict[int, int] = {}
        b_send = 0
        g_pos = 0
        cycles = 0
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=n * p * 2, desc="pipeline RTL", unit="op")
        while True:
            # drive inputs
            if in_pos < len(in_segs):
                i, r, c0, seg, last = in_segs[in_pos]
                ctx.set(dut.act_in.valid, 1)
                ctx.set(dut.act_in.payload.row, r)
                ctx.set(dut.act_in.payload.col, c0)
                ctx.set(dut.act_in.payload.count, len(seg))
                ctx.set(dut.act_in.payload.last, int(last))
                for l, v in enumerate(seg):
                    ctx.set(dut.act_in.payload.data[l], int(v))
            else:
                ctx.set(dut.act_in.valid, 0)
            ctx.set(dut.act_out.ready, 1)
            ctx.set(dut.grad_out.ready, 1)
            # loss gradient stream
            sending = None
            if b_send < len(last_b_order):
                mb = last_b_order[b_send]
                queue = dy_ready.get(mb)
                if queue:
                    sending = queue[0]
                    r, c0, seg, last = sending
                    ctx.set(dut.grad_in.valid, 1)
                    ctx.set(dut.grad_in.payload.row, r)
                    ctx.set(dut.grad_in.payload.col, c0)
                    ctx.set(dut.grad_in.payload.count, len(seg))
                    ctx.set(dut.grad_in.payload.last, int(last))
                    for l, v in enumerate(seg):
                        ctx.set(dut.grad_in.payload.data[l], int(v))
            if sending is None:
                ctx.set(dut.grad_in.valid, 0)
            # sample handshakes
            if in_pos < len(in_segs) and ctx.get(dut.act_in.ready):
                in_pos += 1
            if sending is not None and ctx.get(dut.grad_in.ready):
                dy_ready[last_b_order[b_send]].pop(0)
                if sending[3]:
                    b_send += 1
            for s in range(p):
                so = st[s].act_out
                if ctx.get(so.valid) and ctx.get(so.ready):
                    pl = ctx.get(so.payload)
                    mb = f_orders[s][f_pos[s]]
                    for c in range(pl.count):
                        cur_out[s][pl.row, pl.col + c] = pl.data[c]
                    rows_seen[s][pl.row] += pl.count
                    if s == p - 1:
                        # rows whose logits are complete: send their loss gradient
                        done_rows = np.flatnonzero(rows_seen[s] == dims[p])
                        sent = dy_sent_rows.get(mb, 0)
                        if len(done_rows) and done_rows.max() + 1 > sent and \
                                np.all(rows_seen[s][:done_rows.max() + 1] == dims[p]):
                            upto = int(done_rows.max()) + 1
                            full = np.zeros_like(cur_out[s])
                            full[:upto] = cur_out[s][:upto]
                            dy = np.asarray(loss_grad(mb, full))
                            q = dy_ready.setdefault(mb, [])
                            for r in range(sent, upto):
                                for c0 in range(0, dims[p], L):
                                    q.append((r, c0, dy[r, c0:c0 + L],
                                              r == rows - 1 and c0 + L >= dims[p]))
                            dy_sent_rows[mb] = upto
                    if pl.last:
                        outputs[s][mb] = cur_out[s].copy()
                        rows_seen[s][:] = 0
                        f_pos[s] += 1
                        if bar is not None:
                            bar.update(1)
                go = st[s].grad_out
                if ctx.get(go.valid) and ctx.get(go.ready):
                    pl = ctx.get(go.payload)
                    mb = b_orders[s][b_pos[s]]
                    for c in range(pl.count):
                        cur_dx[s][pl.row, pl.col + c] = pl.data[c]
                    if pl.last:
                        input_grads[s][mb] = cur_dx[s].copy()
                        b_pos[s] += 1
                        if bar is not None:
                            bar.update(1)
            done = ctx.get(dut.done)
            await ctx.tick()
            cycles += 1
            if done:
                break
            if cycles > max_cycles:
                raise RuntimeError(f"pipeline RTL did not finish in {max_cycles} cycles "
                                   f"(F done {f_pos}, B done {b_pos})")
        if bar is not None:
            bar.close()
        result["cycles"] = cycles
        result["counters"] = []
        for stage in st:
            result["counters"].append({name: ctx.get(getattr(stage, name)) for name in
                                       ("busy_cycles", "fwd_cycles", "bwd_cycles", "upd_cycles",
                                        "wait_cycles", "mac_ops", "saturations", "ops_done")})
        result["masters"] = []
        for s, stage in enumerate(st):
            d_in, d_out = dims[s], dims[s + 1]
            got = np.zeros((d_in, d_out), np.int64)
            for r in range(d_in):
                for wd in range(0, d_out, L):
                    ctx.set(stage.w_row, r)
                    ctx.set(stage.w_word, wd // L)
                    await ctx.tick()
                    vals = ctx.get(stage.w_rd_data)
                    for l in range(min(L, d_out - wd)):
                        got[r, wd + l] = vals[l]
            result["masters"].append(got)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    t0 = time.time()
    sim.run()
    return RtlRun(outputs, input_grads, result["masters"], result["counters"], result["cycles"],
                  time.time() - t0)


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
                    wd: float = 1e-3, momentum: float = 0.5, progress: bool = False) -> dict:
    """RTL pipeline vs golden: every output, every input gradient, the final master
    weights. Returns the JSON fields of ``gnnweave verify pipeline``."""
    schedule = Schedule.parse(schedule)
    if not 1 <= stages <= 8:
        raise ValueError(f"--stages must be in 1..8, got {stages}")
    if not 1 <= microbatches <= 64:
        raise ValueError(f"--microbatches must be in 1..64, got {microbatches}")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(stages, microbatches, steps, dim=dim, rows=rows, seed=seed)
    relu = [s < stages - 1 for s in range(stages)]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, momentum)
    golden = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)
    trace = golden.run(schedule, xs, loss_grad, microbatches=microbatches)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule=schedule, microbatches=microbatches,
                           relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=lanes,
                           progress=progress)
    mismatches = []
    n = len(xs)
    for s in range(stages):
        for i in range(n):
            if not np.array_equal(run.outputs[s].get(i), trace.outputs[s][i]):
                mismatches.append(f"stage {s} output of microbatch {i}")
            if not np.array_equal(run.input_grads[s].get(i), trace.input_grads[s][i]):
                mismatches.append(f"stage {s} input gradient of microbatch {i}")
        if not np.array_equal(run.masters[s], trace.masters[s]):
            mismatches.append(f"stage {s} final master weights")
    cells = lanes * lanes
    busy = sum(c["busy_cycles"] for c in run.counters)
    bubble = measured_bubble(run)
    fb = [c["fwd_cycles"] + c["bwd_cycles"] for c in run.counters]
    return {
        "unit": "pipeline",
        "match": not mismatches,
        "mismatches": mismatches[:20],
        "stages": stages, "microbatches": microbatches, "schedule": schedule.cli_name,
        "steps": steps, "rows_per_microbatch": rows, "dim": dim, "lanes": lanes,
        "cycles": run.cycles,
        "mac_utilization": sum(c["mac_ops"] for c in run.counters) / (busy * cells) if busy else 0.0,
        "bubble_fraction": bubble,
        "bubble_formula": bubble_formula(schedule, stages, microbatches),
        "stage_utilization": [f / run.counters[0]["busy_cycles"] for f in fb],
        "counters": run.counters,
        "saturations": sum(c["saturations"] for c in run.counters),
        "golden_saturations": sum(trace.saturations),
        "sim_wall_s": round(run.wall_s, 2),
    }
