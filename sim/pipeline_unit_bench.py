"""The Pipeline unit (:mod:`gnnweave.hw.pipeline_unit`) in cocotb on Verilator, bit-exact
against :class:`gnnweave.golden.pipeline.GoldenPipeline`.

The bench plays the host: it loads every stage's master weights (LOAD_WEIGHTS), starts a
TRAIN run and services the loss-gradient doorbell (polls ``logits_done``, reads those
logits from memory, writes the gradient :meth:`PipelineProblem.loss_grad` computes from
them, raises ``grads_ready``), then reads the weights back (STORE_WEIGHTS). Logits, stage
0's input gradients and the final master weights are compared with the golden trace;
every burst is checked against the buffers of its run (memory safety), under random AXI
backpressure and read latency.

``run_bench(testcase, **params)`` builds (cached) and runs; tests store their results.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

try:
    import cocotb
except ImportError:     # the module is also imported by the pytest side
    cocotb = None

from gnnweave.golden.pipeline import Schedule
from gnnweave.sim.pipeline_bench import BENCH_FORMAT, PipelineProblem

BENCH_MODULE = "gnnweave.sim.pipeline_unit_bench"
#: The bench's build: the ``small`` accelerator's Pipeline unit.
BENCH_CONFIG = dict(stages=2, lanes=4, max_in=16, max_out=16, max_rows=16, slots=8, versions=4)


def unit_problem(schedule, *, dims=(7, 12, 5), rows: int = 5, microbatches: int = 3,
                 steps: int = 2, seed: int = 0, lr: float = 0.25, wd: float = 1e-3,
                 momentum: float = 0.5) -> PipelineProblem:
    """A random training problem with odd sizes (partial segments and beats)."""
    fmt = BENCH_FORMAT
    rng = np.random.default_rng(seed)
    masters = [fmt.sgd.master.quantize(rng.normal(0, 0.6, (a, b)))[0].astype(np.int64)
               for a, b in zip(dims[:-1], dims[1:])]
    n = microbatches * steps
    xs = [fmt.act.quantize(rng.normal(0, 1, (rows, dims[0])))[0].astype(np.int64) for _ in range(n)]
    labels = [rng.integers(0, dims[-1], rows) for _ in range(n)]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(lr, wd, momentum)
    p = len(masters)
    return PipelineProblem(masters, xs, labels, 1.0 / (rows * microbatches),
                           Schedule.parse(schedule).cli_name, microbatches,
                           [s < p - 1 for s in range(p)], lr_q, wd_q, mu_q, fmt)


def row_stride(cols: int, elem_bytes: int, bus_bytes: int) -> int:
    return -(-max(cols, 1) * elem_bytes // bus_bytes) * bus_bytes


class TrainLayout:
    """Where a training run's buffers sit (bus-aligned, 4 KiB apart) and its registers."""

    def __init__(self, problem: PipelineProblem, base: int, bus_bytes: int, *, dx: bool = True):
        self.problem = problem
        self.bus_bytes = bus_bytes
        dims = [problem.masters[0].shape[0]] + [w.shape[1] for w in problem.masters]
        self.dims = dims
        self.rows = problem.inputs[0].shape[0]
        self.n = len(problem.inputs)
        total = self.n * self.rows
        self.buffers = {}
        addr = base

        def place(name, nrows, cols, elem):
            nonlocal addr
            stride = row_stride(cols, elem, bus_bytes)
            size = nrows * stride
            self.buffers[name] = (addr, size, stride)
            addr += -(-size // 4096) * 4096 + 4096
        place("act", total, dims[0], 2)
        place("logits", total, dims[-1], 2)
        place("grad", total, dims[-1], 2)
        if dx:
            place("dx", total, dims[0], 2)
        for s, w in enumerate(problem.masters):
            place(f"w{s}", w.shape[0], w.shape[1], 4)
        self.end = addr

    def registers(self) -> dict:
        pb, fmt = self.problem, self.problem.fmt
        regs = {"pipe_mode": 2, "stage": 0, "schedule": int(Schedule.parse(pb.schedule)),
                "microbatches": pb.microbatches, "steps": self.n // pb.microbatches,
                "rows": self.rows, "grads_ready": 0}
        for name in ("act", "logits", "grad", "dx"):
            a, s, st = self.buffers.get(name, (0, 0, 0))
            regs.update({f"{name}_addr": a, f"{name}_size": s, f"{name}_stride": st})
        for s in range(len(pb.masters)):
            regs.update({f"s{s}_d_in": self.dims[s], f"s{s}_d_out": self.dims[s + 1],
                         f"s{s}_relu": int(pb.relu[s]), f"s{s}_fwd_shift": fmt.fwd_shift_at(s),
                         f"s{s}_dx_shift": fmt.dx_shift, f"s{s}_dw_shift": fmt.dw_shift_at(s),
                         f"s{s}_lr": pb.lr_q, f"s{s}_wd": pb.wd_q, f"s{s}_mu": pb.mu_q,
                         f"s{s}_dx_first": 1})
        return regs

    def weight_registers(self, stage: int, mode: int) -> dict:
        """The whole register set of a LOAD (0) / STORE (1) of ``stage``'s weights."""
        a, s, st = self.buffers[f"w{stage}"]
        return {**self.registers(), "pipe_mode": mode, "stage": stage, "w_addr": a, "w_size": s,
                "w_stride": st}

    # memory images
    def matrix_bytes(self, name, mat, dtype) -> bytes:
        addr, size, stride = self.buffers[name]
        elem = np.dtype(dtype).itemsize
        img = np.zeros((size // stride, stride // elem), dtype=dtype)
        img[:mat.shape[0], :mat.shape[1]] = mat
        return img.tobytes()

    def read_matrix(self, raw: bytes, name, nrows, cols, dtype) -> np.ndarray:
        addr, size, stride = self.buffers[name]
        elem = np.dtype(dtype).itemsize
        img = np.frombuffer(raw, dtype=dtype).reshape(-1, stride // elem)
        return img[:nrows, :cols].astype(np.int64)


def compare_run(problem: PipelineProblem, trace, logits: dict, dx: dict | None, masters) -> list[str]:
    bad = []
    last = problem.stages - 1
    for i in range(len(problem.inputs)):
        if not np.array_equal(logits.get(i), trace.outputs[last][i]):
            bad.append(f"logits of microbatch {i}")
        if dx is not None and not np.array_equal(dx.get(i), trace.input_grads[0][i]):
            bad.append(f"stage 0 input gradient of microbatch {i}")
    for s in range(problem.stages):
        if not np.array_equal(masters[s], trace.masters[s]):
            bad.append(f"stage {s} final master weights")
    return bad


def pipeline_unit_verilog(config: dict, *, debug_names: bool = False) -> Path:
    import hashlib
    import json
    from gnnweave.hw.pipeline_unit import PIPELINE_UNIT_TOP, PipelineUnitConfig, PipelineUnitTop
    from gnnweave.hw.flow.verilog import write_top
    from gnnweave.sim import runner
    cfg = PipelineUnitConfig(**config)
    key = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest()[:10]

    def write(out, debug_names=False):
        return write_top(PipelineUnitTop(cfg), PIPELINE_UNIT_TOP, out, debug_names=debug_names)
    return runner.cached_verilog(f"pipeunit-{key}", write, debug_names=debug_names)


def build_pipeline_unit(config: dict | None = None, sim: str = "verilator", *, waves=None,
                        public_internals: bool = False):
    from gnnweave.hw.pipeline_unit import PIPELINE_UNIT_TOP
    from gnnweave.sim import runner
    waves = runner.waves_requested(waves)
    source = pipeline_unit_verilog(config or BENCH_CONFIG, debug_names=waves)
    return runner.build([source], PIPELINE_UNIT_TOP, sim, waves=waves,
                        public_internals=public_internals)


#: testcases that write internal registers (a build with its internals public)
INTERNAL_TESTCASES = {"write_fault"}


def run_bench(testcase: str, *, config: dict | None = None, **params):
    """Build (cached) and run cocotb tests of this bench; returns the runner's RunResult."""
    from gnnweave.sim import runner
    config = config or BENCH_CONFIG
    built = build_pipeline_unit(config, public_internals=bool(INTERNAL_TESTCASES & set(testcase.split(","))))
    return runner.run(built, BENCH_MODULE, testcase=testcase, params={"config": config, **params},
                      run_name=testcase.replace(",", "+"))


if cocotb is not None:
    from gnnweave.hw.pipeline_unit import PipelineUnitConfig, pipeline_unit_regmap
    from cocotb.triggers import Timer
    from gnnweave.sim.tb import AP_DONE, AP_IDLE, AP_START, CLOCK_NS, AxiTB, load_params, store_result

    BASE = 0x1_2000_0000

    class PipelineUnitTB(AxiTB):
        poll_gaps = (8, 256)

        def __init__(self, dut, config: PipelineUnitConfig, **kw):
            super().__init__(dut, pipeline_unit_regmap(config), **kw)
            self.config = config

        async def program_regs(self, regs: dict):
            for name, value in regs.items():
                await self.write_reg(name, value)

        async def run_regs(self, regs: dict, timeout_cycles: int = 200_000, service=None) -> dict:
            """Program, start, (serve the doorbell), wait for done -> counters and status."""
            await self.program_regs(regs)
            t0 = self.now_cycles()
            await self.write_reg("ap_ctrl", AP_START)
            deadline = t0 + timeout_cycles
            while True:
                ctrl = await self.read_reg("ap_ctrl")
                if ctrl & AP_DONE:
                    break
                if self.now_cycles() > deadline:
                    raise AssertionError(f"no ap_done within {timeout_cycles} cycles (ap_ctrl=0x{ctrl:x})")
                if service is not None:
                    await service()
                await self.cycles(8)
            cycles = self.now_cycles() - t0
            names = [r.name for r in self.regmap if r.access.name == "RO"]
            counters = {n: await self.read_reg(n) for n in names}
            counters["ap_ctrl_after"] = await self.read_reg("ap_ctrl")
            counters["cycles"] = cycles
            return counters

        async def train(self, lay: TrainLayout) -> dict:
            """Load weights, TRAIN with the doorbell served, store weights; -> results."""
            pb = lay.problem
            read_bufs = [("act", *lay.buffers["act"][:2]), ("grad", *lay.buffers["grad"][:2])]
            write_bufs = [("logits", *lay.buffers["logits"][:2])]
            if "dx" in lay.buffers:
                write_bufs.append(("dx", *lay.buffers["dx"][:2]))
            # weights in
            for s, w in enumerate(pb.masters):
                self.load(lay.buffers[f"w{s}"][0], lay.matrix_bytes(f"w{s}", w, np.int32))
                self.allow(read=[(f"w{s}", *lay.buffers[f"w{s}"][:2])])
                cnt = await self.run_regs(lay.weight_registers(s, 0))
                assert cnt["status"] == 0, f"load_weights stage {s}: status {cnt['status']:#x}"
            # inputs in, outputs cleared
            x = np.concatenate(pb.inputs)
            self.load(lay.buffers["act"][0], lay.matrix_bytes("act", x, np.int16))
            for name in ("logits", "grad", "dx"):
                if name in lay.buffers:
                    self.load(lay.buffers[name][0], bytes(lay.buffers[name][1]))
            self.allow(read=read_bufs, write=write_bufs)
            self.clear_bursts()
            rows, d_last, d0 = lay.rows, lay.dims[-1], lay.dims[0]
            served = {"n": 0}
            logits = {}

            async def service():
                done = await self.read_reg("logits_done")
                while served["n"] < done:
                    i = served["n"]
                    a, size, stride = lay.buffers["logits"]
                    raw = self.ram.read(a + i * rows * stride, rows * stride)
                    z = np.frombuffer(raw, dtype=np.int16).reshape(rows, -1)[:, :d_last].astype(np.int64)
                    logits[i] = z
                    g = pb.loss_grad(i, z)
                    img = np.zeros((rows, stride // 2), dtype=np.int16)
                    img[:, :d_last] = g
                    self.ram.write(lay.buffers["grad"][0] + i * rows * stride, img.tobytes())
                    served["n"] = i + 1
                    await self.write_reg("grads_ready", served["n"])

            regs = lay.registers()
            cnt = await self.run_regs(regs, timeout_cycles=2_000_000, service=service)
            train_bursts = list(self.bursts)
            violations = list(self.violations)
            dx = None
            if "dx" in lay.buffers:
                a, size, stride = lay.buffers["dx"]
                img = np.frombuffer(self.ram.read(a, size), dtype=np.int16).reshape(-1, stride // 2)
                dx = {i: img[i * rows:(i + 1) * rows, :d0].astype(np.int64) for i in range(lay.n)}
            # logits in memory at the end are the ones served
            a, size, stride = lay.buffers["logits"]
            img = np.frombuffer(self.ram.read(a, size), dtype=np.int16).reshape(-1, stride // 2)
            final_logits = {i: img[i * rows:(i + 1) * rows, :d_last].astype(np.int64) for i in range(lay.n)}
            # weights out (the buffers first scribbled, so a missing write shows)
            masters = []
            for s, w in enumerate(pb.masters):
                a, size, stride = lay.buffers[f"w{s}"]
                self.load(a, bytes([0xA5]) * size)
                self.allow(write=[(f"w{s}", a, size)])
                c2 = await self.run_regs(lay.weight_registers(s, 1))
                assert c2["status"] == 0, f"store_weights stage {s}: status {c2['status']:#x}"
                raw = np.frombuffer(self.ram.read(a, size), dtype=np.int32).reshape(-1, stride // 4)
                masters.append(raw[:w.shape[0], :w.shape[1]].astype(np.int64))
                pad = raw[:w.shape[0], w.shape[1]:]
                assert np.all(pad.view(np.uint32) == 0xA5A5A5A5), f"stage {s}: bytes past d_out written"
            return {"counters": cnt, "logits": logits, "final_logits": final_logits, "dx": dx,
                    "masters": masters, "served": served["n"], "bursts": train_bursts,
                    "violations": violations}

    async def _setup(dut):
        params = load_params()
        config = PipelineUnitConfig(**params.get("config", BENCH_CONFIG))
        tb = PipelineUnitTB(dut, config, latency=params.get("latency", 8))
        if params.get("backpressure"):
            tb.set_backpressure(params["backpressure"], seed=params.get("seed", 0))
        await tb.reset()
        return tb, params

    def _check_train(problem, res, carry: dict | None = None) -> dict:
        """Compare with a fresh golden model (every run here loads its weights, which clears
        the velocity); ``carry`` would hand it the velocity a previous run left behind."""
        golden = problem.golden_pipeline()
        if carry:
            for st, v in zip(golden.stages, carry.get("velocity", [])):
                st.velocity = None if v is None else v.copy()
        trace = golden.run(problem.schedule, problem.inputs, problem.loss_grad,
                           microbatches=problem.microbatches)
        if carry is not None:
            carry["velocity"] = [st.velocity for st in golden.stages]
        bad = compare_run(problem, trace, res["logits"], res["dx"], res["masters"])
        bad += [f"logits of microbatch {i} changed after it was served" for i in res["logits"]
                if not np.array_equal(res["logits"][i], res["final_logits"][i])]
        cnt = res["counters"]
        n = len(problem.inputs)
        assert not res["violations"], res["violations"][:3]
        assert cnt["status"] == 0, f"status {cnt['status']:#x}"
        assert cnt["ap_ctrl_after"] & AP_IDLE and not cnt["ap_ctrl_after"] & AP_DONE
        assert cnt["logits_done"] == n and res["served"] == n
        if bad:
            detail = []
            for i in range(n):
                d = res["logits"][i] - trace.outputs[-1][i]
                detail.append(f"mb{i}: logits max|diff| {int(abs(d).max())} at {np.argwhere(d)[:3].tolist()}")
            for s in range(problem.stages):
                d = res["masters"][s] - trace.masters[s]
                detail.append(f"stage {s} masters: {int((d != 0).sum())} differ, max {int(abs(d).max())}")
            store_result("debug", {"logits": {str(k): v for k, v in res["logits"].items()},
                                   "dx": {str(k): v for k, v in (res["dx"] or {}).items()},
                                   "masters": res["masters"]})
            raise AssertionError(f"{bad[:10]}; {detail}")
        read_beats = sum(b.beats for b in res["bursts"] if b.kind == "read")
        write_beats = sum(b.beats for b in res["bursts"] if b.kind == "write")
        assert cnt["read_beats"] == read_beats and cnt["write_beats"] == write_beats
        sat = sum(cnt[f"s{s}_saturations"] for s in range(problem.stages))
        write_bursts = sum(1 for b in res["bursts"] if b.kind == "write")
        return {"match": True, "cycles": cnt["cycles"], "busy_cycles": cnt["busy_cycles"],
                "grad_wait_cycles": cnt["grad_wait_cycles"], "stall_cycles": cnt["stall_cycles"],
                "read_beats": read_beats, "write_beats": write_beats, "write_bursts": write_bursts,
                "saturations": sat, "golden_saturations": int(sum(trace.saturations))}

    @cocotb.test()
    async def train_schedules(dut):
        """K = 2, every schedule, two steps of three microbatches, bit-exact vs golden."""
        tb, params = await _setup(dut)
        out = {}
        for k, sched in enumerate(params.get("schedules", ["gpipe", "1f1b-flush", "1f1b-async"])):
            pb = unit_problem(sched, seed=params.get("seed", 0) + k,
                              microbatches=params.get("microbatches", 3), steps=params.get("steps", 2))
            lay = TrainLayout(pb, BASE + 0x100_0000 * k, tb.bus_bytes,
                              dx=sched not in params.get("no_dx", ["1f1b-flush"]))
            res = await tb.train(lay)
            # a fresh golden each time: the weight load cleared the previous run's momentum
            out[sched] = _check_train(pb, res)
            out[sched]["dx_written"] = "dx" in lay.buffers
        store_result("train_schedules", out)

    @cocotb.test()
    async def config_errors(dut):
        """Bad configurations: CONFIG_ERROR, no burst, counters still; then a clean run."""
        tb, params = await _setup(dut)
        cfg = tb.config
        pb = unit_problem("gpipe", seed=5, microbatches=2, steps=1)
        lay = TrainLayout(pb, BASE, tb.bus_bytes)
        good = lay.registers()
        act = lay.buffers["act"]
        wl = lay.weight_registers(0, 0)
        cases = {
            "rows 0": {"rows": 0}, "rows over max_rows": {"rows": cfg.max_rows + 1},
            "microbatches 0": {"microbatches": 0}, "steps 0": {"steps": 0},
            "gpipe over slots": {"microbatches": cfg.slots + 1},
            "schedule 3": {"schedule": 3}, "mode 3": {"pipe_mode": 3},
            "d_in 0": {"s0_d_in": 0}, "d_out over max_out": {"s1_d_out": cfg.max_out + 1},
            "dims do not chain": {"s0_d_out": 11},
            "relu 2": {"s0_relu": 2}, "fwd_shift 64": {"s1_fwd_shift": 64},
            "lr over 16 bits": {"s0_lr": 1 << 16},
            "act misaligned": {"act_addr": act[0] + 2},
            "act stride misaligned": {"act_stride": act[2] + 8},
            "act stride short": {"act_stride": 0},
            "logits too small": {"logits_size": lay.buffers["logits"][1] - 1},
            "grad too small": {"grad_size": 16},
            "dx too small": {"dx_size": lay.buffers["dx"][1] - 16},
            "act past the address space": {"act_addr": (1 << cfg.addr_width) - 4096, "act_size": 8192},
        }
        wcases = {
            "load stage outside": {**wl, "stage": cfg.stages},
            "load w too small": {**wl, "w_size": lay.buffers["w0"][1] - 16},
            "load w misaligned": {**wl, "w_addr": lay.buffers["w0"][0] + 4},
            "store stride short": {**wl, "pipe_mode": 1, "w_stride": 16},
            "load d_out 0": {**wl, "s0_d_out": 0},
        }
        seen = []
        for name, change in list(cases.items()) + list(wcases.items()):
            regs = {**good, **change} if name in cases else {**good, **change}
            tb.allow()
            tb.clear_bursts()
            cnt = await tb.run_regs(regs, timeout_cycles=2000)
            assert cnt["status"] == 1, f"{name}: status {cnt['status']:#x}"
            assert not tb.bursts, f"{name}: {len(tb.bursts)} bursts"
            assert cnt["read_beats"] == 0 and cnt["write_beats"] == 0 and cnt["logits_done"] == 0, name
            seen.append(name)
        # the unit still trains correctly afterwards
        res = await tb.train(lay)
        summary = _check_train(pb, res)
        store_result("config_errors", {"cases": seen, "after": summary})

    @cocotb.test()
    async def write_fault(dut):
        """The logits base moved to the buffer's last row once the run is past its checks
        (a register of the unit's datapath): that row's write goes out, the next row's is
        refused by the registered check (ADDR_FAULT), nothing is written past the buffer,
        the run ends, and the next run is bit-exact."""
        tb, params = await _setup(dut)
        pb = unit_problem("1f1b-flush", seed=params.get("seed", 0) + 7, microbatches=2, steps=1)
        lay = TrainLayout(pb, BASE, tb.bus_bytes, dx=False)
        for s, w in enumerate(pb.masters):
            tb.load(lay.buffers[f"w{s}"][0], lay.matrix_bytes(f"w{s}", w, np.int32))
            tb.allow(read=[(f"w{s}", *lay.buffers[f"w{s}"][:2])])
            cnt = await tb.run_regs(lay.weight_registers(s, 0))
            assert cnt["status"] == 0, f"load_weights stage {s}: status {cnt['status']:#x}"
        tb.load(lay.buffers["act"][0], lay.matrix_bytes("act", np.concatenate(pb.inputs), np.int16))
        logits_addr, logits_size, logits_stride = lay.buffers["logits"]
        tb.allow(read=[("act", *lay.buffers["act"][:2]), ("grad", *lay.buffers["grad"][:2])],
                 write=[("logits", logits_addr, logits_size)])
        tb.clear_bursts()
        await tb.program_regs(lay.registers())
        await tb.write_reg("ap_ctrl", AP_START)
        act = lay.buffers["act"]
        for _ in range(20_000):
            await Timer(CLOCK_NS, "ns")
            if any(b.kind == "read" and act[0] <= b.addr < act[0] + act[1] for b in tb.bursts):
                break
        else:
            raise AssertionError("the run never read its input")
        last_row = logits_addr + logits_size - logits_stride
        dut.top.core.datapath.lg_base.value = last_row
        for _ in range(2000):
            ctrl = await tb.read_reg("ap_ctrl")
            if ctrl & AP_DONE:
                break
            await tb.cycles(8)
        else:
            raise AssertionError("the run did not end after the write fault")
        status = await tb.read_reg("status")
        assert status >> 3 & 1, f"addr_fault not set (status 0x{status:x})"
        writes = [b for b in tb.bursts if b.kind == "write"]
        assert not tb.violations, tb.violations[:3]
        assert all(last_row <= b.addr and b.addr + b.beats * tb.bus_bytes <= logits_addr + logits_size
                   for b in writes), writes
        written = sum(b.beats for b in writes)
        res = await tb.train(lay)
        summary = _check_train(pb, res)
        store_result("write_fault", {"status": status, "beats_before_fault": written,
                                     "after": summary})
