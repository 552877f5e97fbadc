"""The training Pipeline's protocol: load and read master weights, train under a schedule
with the host's loss gradient served through the ``logits_done`` / ``grads_ready``
doorbell."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnweave import contract
from gnnweave.contract import Limits, PipeMode, Unit
from gnnweave.host.driver.errors import DriverError
from gnnweave.host.driver.io import beat_elements, buffer_address, flush, free, invalidate
from gnnweave.host.driver.validate import (
    check_int, check_timeout, elements, wide,
)

#: Unit-wide configuration registers (``s<i>_*`` excluded) and counters.
PIPE_CONFIG_NAMES = contract.names(contract.pipeline_config_registers(0))
PIPE_COUNTERS = tuple(n for n in contract.names(contract.pipeline_status_registers(0))
                      if n != contract.STATUS_REGISTER)
#: Per-stage configuration ``s<i>_<name>`` and counters.
PIPE_STAGE_NAMES = tuple(n for n, _ in contract.PIPELINE_STAGE_REGISTERS)
PIPE_STAGE_COUNTERS = tuple(n for n, _ in contract.PIPELINE_STAGE_COUNTERS)
#: ``pipe_mode`` register values by name.
PIPE_MODES = {m.name.lower(): int(m) for m in PipeMode}


@dataclass
class PipelineRun:
    """What :meth:`PipelineProtocol.train_pipeline` returns: per global microbatch ``i``
    (step ``i // microbatches``) the logits the unit wrote and the loss gradient was
    computed from, stage 0's input gradient (None without ``dx``), the final master weights
    per stage, the unit's counters (``busy_cycles``, ``grad_wait_cycles``, ...) and
    per-stage counters."""

    logits: list
    dx: list | None
    weights: list
    counters: dict
    stage_counters: list
    schedule: str
    microbatches: int
    steps: int
    lr_q: int
    wd_q: int
    mu_q: int

    def bubble_fraction(self) -> float:
        """1 - (forward + backward cycles) / (stages x span), the span being stage 0's busy
        cycles less its update cycles (as ``gnnweave verify pipeline`` measures it)."""
        c0 = self.stage_counters[0]
        span = c0["busy_cycles"] - c0["upd_cycles"]
        fb = sum(c["fwd_cycles"] + c["bwd_cycles"] for c in self.stage_counters)
        return 1.0 - fb / (len(self.stage_counters) * span) if span > 0 else 0.0


def _check_hardware_formats(fmt):
    from gnnweave.golden.mac import SgdFormat
    from gnnweave.golden.pipeline import TrainFormat
    if not isinstance(fmt, TrainFormat):
        raise ValueError(f"fmt: expected a gnnweave.golden.pipeline.TrainFormat, got {type(fmt).__name__}")
    hw_sgd = SgdFormat()
    for name in ("master", "weight", "grad", "lr", "wd", "mu"):
        if getattr(fmt.sgd, name) != getattr(hw_sgd, name):
            raise ValueError(f"fmt.sgd.{name} = {getattr(fmt.sgd, name)}: the hardware's is "
                             f"{getattr(hw_sgd, name)}")
    if fmt.sgd.momentum not in (None, hw_sgd.master):
        raise ValueError(f"fmt.sgd.momentum = {fmt.sgd.momentum}: the hardware's is the master format")


class PipelineProtocol:
    """:meth:`load_weights`, :meth:`read_weights` and :meth:`train_pipeline` on an
    :class:`~.core.AccelCore`."""

    def _setup_pipeline(self):
        stages = 0
        while f"s{stages}_{PIPE_STAGE_NAMES[0]}" in self.registers:
            stages += 1
        per_stage = [f"s{i}_{n}" for i in range(stages) for n in PIPE_STAGE_NAMES + PIPE_STAGE_COUNTERS]
        #: The build has the training Pipeline (``units_present`` and its registers say so).
        self.has_pipeline = self._has_unit(Unit.PIPELINE) and stages > 0 and \
            not self.registers.missing(PIPE_CONFIG_NAMES + PIPE_COUNTERS + tuple(per_stage))
        #: Stages of the Pipeline (0: none).
        self.pipeline_stages = stages if self.has_pipeline else 0
        #: Its build limits (``max_in``, ``max_out``, ``max_rows``, ``slots``); a limit that is
        #: 0 is unknown to the driver and left to the hardware's check (config_error).
        self.pipeline_limits = self.parameters.pipeline_limits
        #: ``{stage: (d_in, d_out)}`` of the weights last loaded or trained (what
        #: :meth:`read_weights` reads without a shape); clear it to forget them.
        self.loaded_shapes: dict[int, tuple[int, int]] = {}

    def _need_pipeline(self):
        if not self.has_pipeline:
            raise DriverError("this accelerator has no training Pipeline (units_present says so); "
                              "use a build whose configuration has one")

    def _check_stage(self, stage) -> int:
        return check_int(stage, "stage", 0, self.pipeline_stages - 1)

    def _check_dims(self, what: str, d_in: int, d_out: int):
        lim = self.pipeline_limits
        for name, value, cap in (("d_in", d_in, lim["max_in"]), ("d_out", d_out, lim["max_out"])):
            if value < 1 or (cap and value > cap):
                raise ValueError(f"{what}: {name} = {value}, this Pipeline takes 1..{cap or '?'}")

    def _weights_job(self, mode: PipeMode, stage: int, shape, w=None, timeout_s=None) -> np.ndarray:
        d_in, d_out = shape
        buf = self.io.allocate((d_in, beat_elements(d_out, 4, self.bus_bytes)), np.int32)
        try:
            buf[:] = 0
            if w is not None:
                buf[:, :d_out] = w
            flush(buf)
            regs = {"pipe_mode": int(mode), "stage": stage, "w_addr": buffer_address(buf),
                    "w_size": buf.nbytes, "w_stride": buf.strides[0],
                    f"s{stage}_d_in": d_in, f"s{stage}_d_out": d_out}
            self._run(Unit.PIPELINE, list(regs), regs, PIPE_COUNTERS, timeout_s,
                      f"{mode.name.lower()} stage {stage} [{d_in}, {d_out}]")
            invalidate(buf)
            return np.array(buf[:, :d_out], dtype=np.int64)
        finally:
            free(buf)

    def load_weights(self, stage: int, w_master, *, timeout_s: float | None = None):
        """Load stage ``stage``'s master weights ``w_master`` (int ``[d_in, d_out]``, the
        master format: int32, Q8.24 for the default formats) into the Pipeline; its MAC
        weights are narrowed from them on chip, and its SGD velocity is cleared."""
        self._need_pipeline()
        stage = self._check_stage(stage)
        w = wide(w_master, "w_master", ndim=2)
        self._check_dims("w_master", *w.shape)
        timeout_s = check_timeout(timeout_s, self.default_timeout_s)
        self._check_idle()
        self._weights_job(PipeMode.LOAD_WEIGHTS, stage, w.shape, w, timeout_s)
        self.loaded_shapes[stage] = tuple(w.shape)

    def read_weights(self, stage: int, shape=None, *, timeout_s: float | None = None) -> np.ndarray:
        """Stage ``stage``'s master weights -> int64 ``[d_in, d_out]`` (``shape``; default the
        shape of the last :meth:`load_weights` of that stage)."""
        self._need_pipeline()
        stage = self._check_stage(stage)
        if shape is None:
            if stage not in self.loaded_shapes:
                raise ValueError(f"read_weights(stage={stage}): give shape=(d_in, d_out); this "
                                 f"driver has not loaded that stage")
            shape = self.loaded_shapes[stage]
        if len(tuple(shape)) != 2 or not all(isinstance(v, (int, np.integer)) for v in shape):
            raise ValueError(f"shape {shape!r}: must be (d_in, d_out)")
        d_in, d_out = (int(v) for v in shape)
        self._check_dims("shape", d_in, d_out)
        timeout_s = check_timeout(timeout_s, self.default_timeout_s)
        self._check_idle()
        return self._weights_job(PipeMode.STORE_WEIGHTS, stage, (d_in, d_out), None, timeout_s)

    def train_pipeline(self, inputs, loss_grad_fn, *, microbatches: int, weights=None, dims=None,
                       schedule="gpipe", relu=None, lr: float, wd: float = 0.0, mu: float = 0.0,
                       fmt=None, dx: bool = True, dx_first: bool = True,
                       timeout_s: float | None = None) -> PipelineRun:
        """Train on the Pipeline: ``steps = len(inputs) / microbatches`` steps under ``schedule``
        (``gpipe``, ``1f1b-flush``, ``1f1b-async``), bit-exact with
        :class:`gnnweave.golden.pipeline.GoldenPipeline` (``run(schedule, inputs, loss_grad_fn,
        microbatches)``) started from the same masters (with ``weights``, a fresh start, as a
        new GoldenPipeline; without, the velocity the last run left, as the same object).

        ``inputs``: one int array ``[rows, d_0]`` per microbatch (``fmt.act`` / ``fmt.input``).
        ``loss_grad_fn(i, logits_q) -> dy_q``: the host's loss gradient of microbatch ``i``
        (int ``[rows, d_K]`` in, int16 ``[rows, d_K]`` out, ``fmt.grad``); it is called while
        the unit runs, as each microbatch's logits reach memory (the doorbell: poll
        ``logits_done``, read the logits, write the gradient, raise ``grads_ready``).
        ``weights``: initial master weights per stage (loaded first; None: train what is on
        chip, then ``dims = [d_0, ..., d_K]`` is needed). ``relu``: per stage (default all
        but the last). ``lr``/``wd``/``mu``: SGD hyper-parameters (quantised into
        ``fmt.sgd``). ``fmt``: a :class:`~gnnweave.golden.pipeline.TrainFormat` whose
        ``sgd`` formats are the hardware's (default ``TrainFormat()``); it fixes the shifts.
        ``dx``: also write stage 0's input gradients. Every argument is checked before the
        device is touched; a run past ``timeout_s`` raises :class:`AcceleratorTimeout`.
        Returns a :class:`PipelineRun` (logits and dX per microbatch, final masters, counters).
        """
        from gnnweave.golden.pipeline import Schedule, TrainFormat
        self._need_pipeline()
        K = self.pipeline_stages
        timeout_s = check_timeout(timeout_s, self.default_timeout_s)
        fmt = TrainFormat() if fmt is None else fmt
        _check_hardware_formats(fmt)
        try:
            sched = Schedule.parse(schedule)
        except ValueError:
            raise ValueError(f"schedule {schedule!r}: choose one of gpipe, 1f1b-flush, 1f1b-async") from None
        if not callable(loss_grad_fn):
            raise ValueError("loss_grad_fn: must be callable as loss_grad_fn(microbatch, logits_q)")
        masters, dims = self._check_masters(weights, dims)
        m = check_int(microbatches, "microbatches", 1, Limits.MICROBATCHES_MAX)
        xs, rows = self._check_inputs(inputs, m, dims, sched)
        relu = [s < K - 1 for s in range(K)] if relu is None else list(relu)
        if len(relu) != K or not all(isinstance(r, (bool, np.bool_, int)) and int(r) in (0, 1) for r in relu):
            raise ValueError(f"relu: {relu!r}: expected {K} booleans")
        lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, mu)
        shifts = [(fmt.fwd_shift_at(s), fmt.dx_shift, fmt.dw_shift_at(s)) for s in range(K)]
        for s, sh in enumerate(shifts):
            if not all(0 <= v <= Limits.SHIFT_MAX for v in sh):
                raise ValueError(f"fmt: stage {s} shifts {sh} outside 0..{Limits.SHIFT_MAX}")
        self._check_idle()

        if masters is not None:
            for s, w in enumerate(masters):
                self._weights_job(PipeMode.LOAD_WEIGHTS, s, w.shape, w, timeout_s)
                self.loaded_shapes[s] = tuple(w.shape)
        n = len(xs)
        stage_regs = {}
        for s in range(K):
            fwd, dxs, dws = shifts[s]
            stage_regs.update({f"s{s}_d_in": dims[s], f"s{s}_d_out": dims[s + 1],
                               f"s{s}_relu": int(relu[s]), f"s{s}_fwd_shift": fwd,
                               f"s{s}_dx_shift": dxs, f"s{s}_dw_shift": dws, f"s{s}_lr": lr_q,
                               f"s{s}_wd": wd_q, f"s{s}_mu": mu_q,
                               f"s{s}_dx_first": int(bool(dx_first))})
        logits, dxs, counters, stage_counters = self._train_run(
            xs, rows, dims, loss_grad_fn, sched, m, dx, stage_regs, timeout_s)
        final = [self._weights_job(PipeMode.STORE_WEIGHTS, s, (dims[s], dims[s + 1]), None, timeout_s)
                 for s in range(K)]
        for s in range(K):
            self.loaded_shapes[s] = (dims[s], dims[s + 1])
        return PipelineRun(logits=logits, dx=dxs, weights=final, counters=counters,
                           stage_counters=stage_counters, schedule=sched.cli_name, microbatches=m,
                           steps=n // m, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)

    def _check_masters(self, weights, dims):
        K = self.pipeline_stages
        masters = None
        if weights is not None:
            if len(weights) != K:
                raise ValueError(f"weights: {len(weights)} matrices, this Pipeline has {K} stages")
            masters = [wide(w, f"weights[{s}]", ndim=2) for s, w in enumerate(weights)]
            dims = [masters[0].shape[0]] + [w.shape[1] for w in masters]
            for s in range(1, K):
                if masters[s].shape[0] != masters[s - 1].shape[1]:
                    raise ValueError(f"weights[{s}]: {masters[s].shape[0]} rows, stage {s - 1} outputs "
                                     f"{masters[s - 1].shape[1]} features")
        elif dims is None:
            raise ValueError("give weights= (initial master weights) or dims= [d_0, ..., d_K]")
        dims = [int(d) for d in dims]
        if len(dims) != K + 1:
            raise ValueError(f"dims: {len(dims)} entries, a {K}-stage Pipeline needs {K + 1}")
        for s in range(K):
            self._check_dims(f"stage {s}", dims[s], dims[s + 1])
        return masters, dims

    def _check_inputs(self, inputs, m: int, dims, sched):
        from gnnweave.golden.pipeline import Schedule
        lim = self.pipeline_limits
        xs = [elements(x, f"inputs[{i}]") for i, x in enumerate(inputs)]
        n = len(xs)
        if n == 0 or n % m:
            raise ValueError(f"inputs: {n} microbatches do not split into steps of {m}")
        if n // m > Limits.STEPS_MAX:
            raise ValueError(f"inputs: {n // m} steps, at most {Limits.STEPS_MAX}")
        rows = xs[0].shape[0]
        for i, x in enumerate(xs):
            if x.shape != (rows, dims[0]):
                raise ValueError(f"inputs[{i}]: shape {x.shape}, expected ({rows}, {dims[0]}) "
                                 f"(rows of inputs[0], d_0)")
        if rows < 1 or (lim["max_rows"] and rows > lim["max_rows"]):
            raise ValueError(f"inputs: {rows} rows per microbatch, this Pipeline takes 1..{lim['max_rows']}")
        if sched is Schedule.GPIPE and lim["slots"] and m > lim["slots"]:
            raise ValueError(f"microbatches {m}: GPipe holds every microbatch of a step, this "
                             f"Pipeline has {lim['slots']} slots (use 1f1b-flush)")
        return xs, rows

    def _train_run(self, xs, rows, dims, loss_grad_fn, sched, m, dx, stage_regs, timeout_s):
        """One TRAIN run: buffers, the doorbell service, the counters."""
        beat = self.bus_bytes
        n, total, d_last = len(xs), len(xs) * rows, dims[-1]
        bufs = {}
        try:
            bufs["act"] = self.io.allocate((total, beat_elements(dims[0], 2, beat)), np.int16)
            bufs["logits"] = self.io.allocate((total, beat_elements(d_last, 2, beat)), np.int16)
            bufs["grad"] = self.io.allocate((total, beat_elements(d_last, 2, beat)), np.int16)
            if dx:
                bufs["dx"] = self.io.allocate((total, beat_elements(dims[0], 2, beat)), np.int16)
            for b in bufs.values():
                b[:] = 0
            bufs["act"][:, :dims[0]] = np.concatenate(xs)
            for b in bufs.values():
                flush(b)
            regs = {"pipe_mode": int(PipeMode.TRAIN), "stage": 0, "schedule": int(sched),
                    "microbatches": m, "steps": n // m, "rows": rows, "grads_ready": 0,
                    "dx_addr": 0, "dx_size": 0, "dx_stride": 0, "w_addr": 0, "w_size": 0, "w_stride": 0}
            for name, b in bufs.items():
                regs.update({f"{name}_addr": buffer_address(b), f"{name}_size": b.nbytes,
                             f"{name}_stride": b.strides[0]})
            regs.update(stage_regs)
            logits: list = [None] * n
            served = [0]
            lg, gr = bufs["logits"], bufs["grad"]

            def service():
                done = self._read("logits_done")
                start = served[0]
                while served[0] < min(done, n):
                    i = served[0]
                    invalidate(lg)
                    z = np.array(lg[i * rows:(i + 1) * rows, :d_last], dtype=np.int64)
                    try:
                        g = elements(loss_grad_fn(i, z.copy()), f"loss_grad_fn({i}, ...)")
                        if g.shape != (rows, d_last):
                            raise ValueError(f"loss_grad_fn({i}, ...): shape {g.shape}, expected "
                                             f"({rows}, {d_last})")
                    except Exception:
                        # the unit waits for this gradient forever: take it back first
                        if getattr(self.io, "reset", None) is not None:
                            self.recover()
                        raise
                    logits[i] = z
                    gr[i * rows:(i + 1) * rows, :d_last] = g
                    flush(gr)
                    served[0] = i + 1
                if served[0] > start:
                    self._write("grads_ready", served[0])

            counters = self._run(Unit.PIPELINE, list(regs), regs, PIPE_COUNTERS, timeout_s,
                                 f"train {sched.cli_name}, {n} microbatches of {rows} rows, dims {dims}",
                                 service=service)
            service()     # nothing is left: every gradient was read before the run could end
            stage_counters = [{c: self._read(f"s{s}_{c}") for c in PIPE_STAGE_COUNTERS}
                              for s in range(self.pipeline_stages)]
            invalidate(lg)
            dxs = None
            if dx:
                invalidate(bufs["dx"])
                dxs = [np.array(bufs["dx"][i * rows:(i + 1) * rows, :dims[0]], dtype=np.int64)
                       for i in range(n)]
        finally:
            for b in bufs.values():
                free(b)
        return logits, dxs, counters, stage_counters
