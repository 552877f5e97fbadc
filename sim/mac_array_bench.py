"""cocotb bench of the MacArray AXI top (:class:`~gnnweave.hw.mac_array.MacArrayTop`) on
Verilator, every output word compared bit for bit with :func:`gnnweave.golden.mac.mac`.

Three parts:

* :class:`MacJob` (numpy only): one operation laid out in memory the way the host stores
  it (row-major forward layout, int16 rows ``stride`` bytes apart, int32 bias), its
  register values, the memory image (every byte not part of an operand holds a fill
  pattern) and the read-back of the output (plus the bytes written where they must not be).
* :func:`build_mac_array`: the generated Verilog cached by hw content, built once per
  content with :func:`gnnweave.sim.runner.build`.
* the cocotb tests (run them through :func:`gnnweave.sim.runner.run`;
  ``tests/sim/test_mac_array_cocotb.py`` does): :class:`MacArrayTB` owns clock, reset, an
  ``AxiLiteMaster`` on the control port, an ``AxiRam`` on gmem with read latency, pause
  generators on every channel and a monitor that fails any burst outside the declared
  buffers (from :class:`gnnweave.sim.tb.AxiTB`).

Parameters (JSON from the runner): ``config`` (MacArrayConfig fields), ``latency``,
``backpressure``, ``seed``, ``job_file`` (``.npz`` from :func:`job_to_npz`).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

try:
    import cocotb
except ImportError:  # pragma: no cover - the job and build helpers work without cocotb
    cocotb = None

from gnnweave import contract
from gnnweave.golden.mac import MacMode, mac
from gnnweave.sim.mac_bench import operand_shapes

FILL = 0xA5
PAGE = 4096
STATUS_BITS = {f.name.lower(): f.bit_length() - 1 for f in contract.MacArrayStatus}
COUNTERS = tuple(n for n in contract.names(contract.MAC_ARRAY_STATUS_REGISTERS)
                 if n != contract.STATUS_REGISTER)
BUFFERS = ("p", "q", "bias", "out")


def _whole(nbytes: int, bus: int) -> int:
    return -(-nbytes // bus) * bus


@dataclass
class MacJob:
    """One MacArray operation in memory. ``p``/``q`` int16 matrices in the host layout of
    ``mode``; ``bias`` int32 (fwd only). Layout knobs: ``bus_bytes``, ``base_addr``,
    ``pad_beats`` (extra beats per row stride), ``offsets`` (bytes added to a buffer base),
    ``sizes`` (override a buffer's declared size), ``registers_override``."""

    mode: int
    p: np.ndarray
    q: np.ndarray
    shift: int
    bias: np.ndarray | None = None
    bias_shift: int = 0
    relu: bool = False
    bus_bytes: int = 16
    base_addr: int = 0x1_2340_0000
    pad_beats: dict = field(default_factory=dict)
    offsets: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)
    registers_override: dict = field(default_factory=dict)

    def __post_init__(self):
        self.mode = int(MacMode.parse(self.mode))
        self.p = np.asarray(self.p, dtype=np.int64)
        self.q = np.asarray(self.q, dtype=np.int64)
        mode = MacMode(self.mode)
        if mode is MacMode.FWD:
            self.m, self.k, self.n = self.p.shape[0], self.p.shape[1], self.q.shape[1]
        elif mode is MacMode.DX:
            self.m, self.k, self.n = self.p.shape[0], self.p.shape[1], self.q.shape[0]
        else:
            self.m, self.k, self.n = self.p.shape[1], self.p.shape[0], self.q.shape[1]
        (pr, pc), (qr, qc) = operand_shapes(mode, self.m, self.n, self.k)
        if self.p.shape != (pr, pc) or self.q.shape != (qr, qc):
            raise ValueError(f"MacJob: P {self.p.shape} / Q {self.q.shape} do not fit mode "
                             f"{mode.name.lower()} (expected {(pr, pc)} / {(qr, qc)})")
        bus = self.bus_bytes
        self.shapes = {"p": (pr, pc), "q": (qr, qc), "out": (self.m, self.n)}
        self.strides = {b: _whole(max(c, 1) * 2, bus) + bus * self.pad_beats.get(b, 0)
                        for b, (_, c) in self.shapes.items()}
        need = {b: (r - 1) * self.strides[b] + _whole(c * 2, bus) if r and c else 0
                for b, (r, c) in self.shapes.items()}
        need["bias"] = _whole(self.n * 4, bus)
        self.regions = {}
        addr = self.base_addr + 3 * bus          # not page aligned: bursts meet 4 KiB edges
        for b in BUFFERS:
            addr += self.offsets.get(b, 0)
            size = self.sizes.get(b, need[b])
            self.regions[b] = (addr, size)
            addr = _whole(addr + max(size, need[b]) + 5 * bus, bus)  # a gap between buffers
        self.image_size = addr + 2 * bus - self.base_addr

    @property
    def use_bias(self) -> bool:
        return self.bias is not None

    def registers(self) -> dict:
        regs = {"mode": self.mode, "m": self.m, "n": self.n, "k": self.k, "shift": self.shift,
                "relu": int(self.relu), "use_bias": int(self.use_bias),
                "bias_shift": self.bias_shift}
        for b in BUFFERS:
            regs[f"{b}_addr"], regs[f"{b}_size"] = self.regions[b]
            if b != "bias":
                regs[f"{b}_stride"] = self.strides[b]
        regs.update(self.registers_override)
        return regs

    def memory_image(self) -> np.ndarray:
        img = np.full(self.image_size, FILL, dtype=np.uint8)
        for b, mat in (("p", self.p), ("q", self.q)):
            addr = self.regions[b][0] - self.base_addr
            for r, row in enumerate(mat):
                raw = row.astype("<i2").view(np.uint8)
                img[addr + r * self.strides[b]: addr + r * self.strides[b] + raw.size] = raw
        if self.use_bias:
            raw = np.asarray(self.bias, dtype="<i4").view(np.uint8)
            addr = self.regions["bias"][0] - self.base_addr
            img[addr: addr + raw.size] = raw
        return img

    def _out_bytes(self) -> np.ndarray:
        """Offsets (from base_addr) of the real output bytes."""
        addr = self.regions["out"][0] - self.base_addr
        rows = addr + np.arange(self.m)[:, None] * self.strides["out"]
        return (rows + np.arange(self.n * 2)[None, :]).reshape(-1)

    def read_output(self, image: np.ndarray) -> np.ndarray:
        raw = image[self._out_bytes()].reshape(self.m, self.n * 2)
        return raw.copy().view("<i2").astype(np.int64)

    def stray_writes(self, image: np.ndarray) -> np.ndarray:
        """Offsets of bytes that changed although no output lives there."""
        expect = self.memory_image()
        changed = image != expect
        changed[self._out_bytes()] = False
        return np.flatnonzero(changed)

    def golden(self):
        return mac(MacMode(self.mode), self.p, self.q, shift=self.shift, relu=self.relu,
                   bias_q=self.bias, bias_shift=self.bias_shift)

    def config_error_expected(self, cfg) -> bool:
        """The contract of the hardware's configuration check (hw/mac_array.py docstring)."""
        r = self.registers()
        bus = self.bus_bytes
        mode = r["mode"]
        if mode > 2 or min(r["m"], r["n"], r["k"]) == 0:
            return True
        if r["k"] > cfg.max_depth and cfg.max_depth % (cfg.bus_width // 16):
            return True          # depth blocks would not start on a bus beat
        if r["shift"] > 63 or r["bias_shift"] > 31 or r["relu"] > 1 or r["use_bias"] > 1:
            return True
        if mode != 0 and (r["relu"] or r["use_bias"]):
            return True
        (pr, pc), (qr, qc) = operand_shapes(mode, r["m"], r["n"], r["k"])
        for b, rows, cols in (("p", pr, pc), ("q", qr, qc), ("out", r["m"], r["n"])):
            addr, size, stride = r[f"{b}_addr"], r[f"{b}_size"], r[f"{b}_stride"]
            row_bytes = _whole(cols * 2, bus)
            if addr % bus or stride % bus or stride < row_bytes:
                return True
            if (rows - 1) * stride + row_bytes > size or addr + size >= 1 << cfg.addr_width:
                return True
        if r["use_bias"]:
            addr, size = r["bias_addr"], r["bias_size"]
            if addr % bus or _whole(r["n"] * 4, bus) > size or addr + size >= 1 << cfg.addr_width:
                return True
        return False

    def expected_beats(self, cfg) -> tuple[int, int]:
        """(read beats, write beats) the front end must move for this job (tiling contract):
        output blocks of ``max_dim``, each over depth blocks of ``max_depth``; P is loaded
        once per block row when the depth fits one block, else once per (block, depth block)."""
        D, E, MD = cfg.max_dim, cfg.bus_width // 16, cfg.max_depth
        bus = self.bus_bytes
        bi = -(-self.m // D)
        bj = -(-self.n // D)
        depths = [min(MD, self.k - k0) for k0 in range(0, self.k, MD)]
        mode = MacMode(self.mode)

        def p_beats(bm, bk):
            return bm * -(-bk // E) if mode is not MacMode.DW else bk * -(-bm // E)

        def q_beats(bn, bk):
            return bn * -(-bk // E) if mode is MacMode.DX else bk * -(-bn // E)

        reads = 0
        for i in range(bi):
            bm = min(D, self.m - i * D)
            if len(depths) == 1:
                reads += p_beats(bm, self.k)
            for j in range(bj):
                bn = min(D, self.n - j * D)
                for bk in depths:
                    reads += q_beats(bn, bk) + (p_beats(bm, bk) if len(depths) > 1 else 0)
                if self.use_bias:
                    reads += -(-bn * 4 // bus)
        writes = self.m * sum(-(-min(D, self.n - j * D) // cfg.cols) for j in range(bj))
        return reads, writes


def job_to_npz(j: MacJob, path) -> None:
    arrays = dict(mode=j.mode, p=j.p, q=j.q, shift=j.shift, relu=int(j.relu),
                  bias_shift=j.bias_shift, bus_bytes=j.bus_bytes, base_addr=j.base_addr)
    if j.bias is not None:
        arrays["bias"] = j.bias
    np.savez(path, **arrays)


def job_from_npz(path) -> MacJob:
    with np.load(path, allow_pickle=False) as z:
        return MacJob(mode=int(z["mode"]), p=z["p"], q=z["q"], shift=int(z["shift"]),
                      relu=bool(z["relu"]), bias_shift=int(z["bias_shift"]),
                      bias=z["bias"] if "bias" in z.files else None,
                      bus_bytes=int(z["bus_bytes"]), base_addr=int(z["base_addr"]))


def random_job(rng, mode, m, n, k, *, bus_bytes=16, bits=16, shift=None, bias=False,
               relu=False, bias_shift=0, **layout) -> MacJob:
    (pr, pc), (qr, qc) = operand_shapes(mode, m, n, k)
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
    p = rng.integers(lo, hi, size=(pr, pc))
    q = rng.integers(lo, hi, size=(qr, qc))
    if shift is None:   # most results in range: half the product bits plus the sum growth
        shift = min(2 * bits - 16 + (max(k, 1) - 1).bit_length() // 2 + 1, 63)
    b = rng.integers(-(1 << 20), 1 << 20, size=n) if bias else None
    return MacJob(mode=mode, p=p, q=q, shift=shift, bias=b, relu=relu, bias_shift=bias_shift,
                  bus_bytes=bus_bytes, **layout)


# ------------------------------------------------------------------ build (cached)
def config_from_params(params: dict):
    from gnnweave.hw.mac_array import MacArrayConfig
    return MacArrayConfig(**params.get("config", {}))


def mac_array_verilog(config, *, debug_names: bool = False) -> Path:
    """Generated Verilog of one MacArrayConfig, cached by the hw sources' fingerprint."""
    from gnnweave.hw.mac_array import write_mac_array_verilog
    from gnnweave.sim import runner
    key = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode()).hexdigest()[:10]
    return runner.cached_verilog(f"mac-{key}",
                                 lambda out, **kw: write_mac_array_verilog(config, out, **kw),
                                 debug_names=debug_names)


def build_mac_array(config=None, sim: str = "verilator", *, waves=None, force: bool = False,
                    build_root=None):
    from gnnweave.hw.mac_array import MAC_ARRAY_TOP, MacArrayConfig
    from gnnweave.sim import runner
    config = config or MacArrayConfig()
    waves = runner.waves_requested(waves)
    source = mac_array_verilog(config, debug_names=waves)
    return runner.build([source], MAC_ARRAY_TOP, sim, waves=waves, force=force,
                        build_root=build_root)


BENCH_MODULE = "gnnweave.sim.mac_array_bench"


def run_bench(config, testcase: str, **params):
    """Build (cached) and run cocotb tests of this bench; returns the runner's RunResult."""
    from gnnweave.sim import runner
    built = build_mac_array(config)
    return runner.run(built, BENCH_MODULE, testcase=testcase,
                      params={"config": asdict(config), **params},
                      run_name=testcase.replace(",", "+"))


# ------------------------------------------------------------------ cocotb
if cocotb is not None:
    from gnnweave.sim.tb import AP_DONE, AP_IDLE, AP_START, AxiTB, load_params, store_result

    class MacArrayTB(AxiTB):
        """The MacArray kernel: lay out a job, program it, start, wait for ap_done, read back."""

        def __init__(self, dut, config, **kw):
            from gnnweave.hw.mac_array import mac_array_regmap
            super().__init__(dut, mac_array_regmap(config), **kw)
            self.config = config

        def load_job(self, j: MacJob):
            self.load(j.base_addr, j.memory_image())
            reads = [(b, *j.regions[b]) for b in ("p", "q")]
            if j.use_bias:
                reads.append(("bias", *j.regions["bias"]))
            self.allow(read=reads, write=[("out", *j.regions["out"])])

        poll_gaps = (16, 1024)

        async def run_job(self, j: MacJob, timeout_cycles: int | None = None) -> dict:
            self.load_job(j)
            self.clear_bursts()
            for name, value in j.registers().items():
                await self.write_reg(name, value)
            if timeout_cycles is None:
                work = j.m * j.n * max(j.k, 1) // self.config.cells
                timeout_cycles = 20_000 + 4 * work + 8 * (j.p.size + j.q.size) * max(1, self.ar_delay.latency)
            wall = time.perf_counter()
            t0 = self.now_cycles()
            await self.write_reg("ap_ctrl", AP_START)
            await self.wait_done(timeout_cycles)
            cycles = self.now_cycles() - t0
            wall = time.perf_counter() - wall
            counters = {name: await self.read_reg(name) for name in COUNTERS}
            status = await self.read_reg("status")
            after = await self.read_reg("ap_ctrl")
            image = self.dump(j.base_addr, j.image_size)
            return {"out": j.read_output(image), "stray": j.stray_writes(image), "counters": counters,
                    "status": status, "flags": {k: bool(status >> b & 1) for k, b in STATUS_BITS.items()},
                    "cycles": cycles, "bursts": list(self.bursts), "violations": list(self.violations),
                    "ap_ctrl_after": after, "sim_seconds": wall}

    def check_mac_job(j: MacJob, res: dict, config) -> dict:
        """Assert the run matches golden and the contract; returns a summary."""
        problems = []
        if res["violations"]:
            problems.append(f"{len(res['violations'])} memory-safety violations, first: {res['violations'][0]}")
        if len(res["stray"]):
            problems.append(f"{len(res['stray'])} bytes written outside the output elements "
                            f"(first at 0x{j.base_addr + int(res['stray'][0]):x})")
        if res["ap_ctrl_after"] & AP_DONE or not res["ap_ctrl_after"] & AP_IDLE:
            problems.append(f"ap_ctrl after done = 0x{res['ap_ctrl_after']:x} (want idle, done cleared)")
        if res["flags"]["axi_error"] or res["flags"]["addr_fault"]:
            problems.append(f"unexpected status 0x{res['status']:x}")
        summary = {"config_error": j.config_error_expected(config), "mismatches": 0}
        cnt = res["counters"]
        if summary["config_error"]:
            if not res["flags"]["config_error"]:
                problems.append("config error expected, status.config_error not set")
            if res["bursts"]:
                problems.append(f"config error but {len(res['bursts'])} bursts issued")
            if cnt["read_beats"] or cnt["write_beats"] or cnt["mac_ops"]:
                problems.append(f"config error but counters moved: {cnt}")
        else:
            gold = j.golden()
            if res["flags"]["config_error"]:
                problems.append(f"unexpected config_error (registers {j.registers()})")
            else:
                bad = np.argwhere(res["out"] != gold.out)
                summary["mismatches"] = int(bad.shape[0])
                if bad.size:
                    r, c = (int(i) for i in bad[0])
                    problems.append(f"{bad.shape[0]} output words differ from golden; first out[{r}][{c}] = "
                                    f"{int(res['out'][r, c])}, golden {int(gold.out[r, c])}")
                if cnt["saturations"] != gold.saturations:
                    problems.append(f"saturations = {cnt['saturations']}, golden {gold.saturations}")
                if cnt["mac_ops"] != j.m * j.n * j.k:
                    problems.append(f"mac_ops = {cnt['mac_ops']}, want m*n*k = {j.m * j.n * j.k}")
                seen_r = sum(b.beats for b in res["bursts"] if b.kind == "read")
                seen_w = sum(b.beats for b in res["bursts"] if b.kind == "write")
                want_r, want_w = j.expected_beats(config)
                if (cnt["read_beats"], seen_r) != (want_r, want_r):
                    problems.append(f"read beats: counter {cnt['read_beats']}, bench saw {seen_r}, "
                                    f"tiling contract {want_r}")
                if (cnt["write_beats"], seen_w) != (want_w, want_w):
                    problems.append(f"write beats: counter {cnt['write_beats']}, bench saw {seen_w}, "
                                    f"tiling contract {want_w}")
                summary["saturations"] = gold.saturations
        if problems:
            raise AssertionError(f"mode {j.mode} m={j.m} n={j.n} k={j.k}: " + "; ".join(problems))
        return summary

    async def _bench(dut, *, latency=None, backpressure=None):
        params = load_params()
        config = config_from_params(params)
        tb = MacArrayTB(dut, config, latency=params.get("latency", 8) if latency is None else latency)
        bp = params.get("backpressure") if backpressure is None else backpressure
        if bp:
            tb.set_backpressure(bp, seed=params.get("seed", 0))
        await tb.reset()
        return tb, params, config

    async def _run_checked(tb, j, config):
        res = await tb.run_job(j)
        return res, check_mac_job(j, res, config)

    def _layout(config) -> dict:
        return {"bus_bytes": config.bus_width // 8,
                "base_addr": 0x1_2340_0000 if config.addr_width > 32 else 0x1234_0000}

    @cocotb.test()
    @cocotb.parametrize(mode=["fwd", "dx", "dw"])
    async def modes(dut, mode):
        """Odd sizes (not multiples of the array, the bus or the block) and tiling."""
        tb, params, config = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0) + int(MacMode.parse(mode)))
        D = config.max_dim
        sizes = [(1, 1, 1), (5, 3, 7), (config.rows, config.cols, config.max_depth),
                 (D + 3, 2 * D + 1, config.max_depth - 3), (2 * D, D, 9)]
        stats = []
        for i, (m, n, k) in enumerate(sizes):
            j = random_job(rng, mode, m, n, k, pad_beats={"p": i % 2, "out": (i + 1) % 3}, **_layout(config))
            res, _ = await _run_checked(tb, j, config)
            stats.append(res["counters"]["busy_cycles"])
        store_result(f"modes/{mode}", stats)

    @cocotb.test()
    async def bias_relu(dut):
        tb, params, config = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0) + 10)
        D = config.max_dim
        relus = 0
        for m, n, k, bs in ((7, 9, 5, 0), (D + 5, D + 2, 11, 3), (3, 2 * D + 3, config.max_depth, 7)):
            j = random_job(rng, "fwd", m, n, k, bias=True, relu=True, bias_shift=bs, **_layout(config))
            res, _ = await _run_checked(tb, j, config)
            relus += int(np.count_nonzero(res["out"] == 0))
        store_result("bias_relu", {"zeros": relus})

    @cocotb.test()
    async def saturation(dut):
        tb, params, config = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0) + 20)
        total = 0
        for mode in ("fwd", "dx", "dw"):
            j = random_job(rng, mode, 9, config.max_dim + 3, 13, shift=4, **_layout(config))
            j.p[0, :] = 32767
            res, summary = await _run_checked(tb, j, config)
            total += res["counters"]["saturations"]
        store_result("saturation", total)

    @cocotb.test()
    async def backpressure(dut):
        """Random pauses on AR, R, AW, W and B with read latency; every mode."""
        params = load_params()
        tb, params, config = await _bench(dut, latency=params.get("latency", 24),
                                          backpressure=params.get("backpressure", 0.4))
        rng = np.random.default_rng(params.get("seed", 0) + 30)
        D = config.max_dim
        stalls = 0
        for mode in ("fwd", "dx", "dw"):
            j = random_job(rng, mode, D + 7, D + 1, 19, bias=mode == "fwd", **_layout(config))
            res, _ = await _run_checked(tb, j, config)
            stalls += res["counters"]["stall_cycles"]
        # depth 1: the array makes results faster than a paused W channel takes them. Every
        # channel keeps a generator: clearing one mid-run can leave its pause flag stuck high.
        base = params.get("backpressure", 0.4) or 0.4
        tb.set_backpressure({name: base for name in tb.channels()} | {"w": 0.85, "aw": 0.5, "b": 0.5},
                            seed=params.get("seed", 0) + 1)
        j = random_job(rng, "fwd", 2 * D, D, 1, **_layout(config))
        res, _ = await _run_checked(tb, j, config)
        store_result("backpressure", {"stall_cycles": stalls,
                                      "stall_cycles_depth1": res["counters"]["stall_cycles"]})

    @cocotb.test()
    async def depth_split(dut):
        """k = 3 * max_depth + 5: four depth blocks per output block, partial sums carried
        exactly; every mode at odd sizes, fwd with bias and ReLU, and saturation."""
        tb, params, config = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0) + 70)
        D, MD = config.max_dim, config.max_depth
        k = 3 * MD + 5
        summary = {"zeros": 0, "saturations": 0, "read_beats": 0}
        for i, mode in enumerate(("fwd", "dx", "dw")):
            j = random_job(rng, mode, D + 3, 2 * D + 1, k, bias=mode == "fwd", relu=mode == "fwd",
                           bias_shift=5 if mode == "fwd" else 0,
                           pad_beats={"q": i % 2, "out": 1}, **_layout(config))
            res, _ = await _run_checked(tb, j, config)
            summary["zeros"] += int(np.count_nonzero(res["out"] == 0))
            summary["read_beats"] += res["counters"]["read_beats"]
            j = random_job(rng, mode, 5, D + 3, k, shift=6, **_layout(config))
            j.p[:] = 32767
            j.q[:] = -32768 if mode == "dx" else 32767
            res, _ = await _run_checked(tb, j, config)
            summary["saturations"] += res["counters"]["saturations"]
        store_result("depth_split", summary)

    def config_error_jobs(rng, config) -> list[tuple[str, MacJob]]:
        lay = _layout(config)
        bus = lay["bus_bytes"]
        mk = lambda mode="fwd", m=5, n=6, k=7, **kw: random_job(rng, mode, m, n, k, **lay, **kw)  # noqa: E731
        cases = [
            ("mode_3", mk(registers_override={"mode": 3})),
            ("m_zero", mk(registers_override={"m": 0})),
            ("n_zero", mk(registers_override={"n": 0})),
            ("k_zero", mk(registers_override={"k": 0})),
            ("k_past_p_buffer", mk(registers_override={"k": 3 * config.max_depth + 1})),
            ("shift_64", mk(shift=64)),
            ("bias_shift_32", mk(bias=True, bias_shift=32)),
            ("relu_in_dx", mk("dx", relu=True)),
            ("bias_in_dw", mk("dw", bias=True)),
            ("p_misaligned", mk(offsets={"p": 2})),
            ("out_misaligned", mk(offsets={"out": bus // 2})),
            ("bias_misaligned", mk(bias=True, offsets={"bias": 4})),
            ("p_stride_unaligned", mk(registers_override={"p_stride": bus + 2})),
            ("q_stride_too_small", mk(m=3, n=2 * bus, k=4, registers_override={"q_stride": bus})),
            ("out_stride_zero", mk(registers_override={"out_stride": 0})),
            ("p_size_zero", mk(sizes={"p": 0})),
            ("q_small", mk("dx", sizes={"q": 5 * bus})),
            ("out_small", mk(sizes={"out": 4 * bus + bus - 1})),
            ("bias_small", mk(bias=True, sizes={"bias": bus})),
            ("out_wraps", mk(registers_override={"out_size": (1 << config.addr_width) - 64})),
            ("huge_m", mk(registers_override={"m": 0xFFFF_FFFF})),
        ]
        for name, j in cases:
            if not j.config_error_expected(config):
                raise AssertionError(f"config-error case {name} is not an error by the contract")
        return cases

    @cocotb.test()
    async def config_errors(dut):
        tb, params, config = await _bench(dut)
        rng = np.random.default_rng(params.get("seed", 0) + 40)
        refused = []
        for name, j in config_error_jobs(rng, config):
            try:
                await _run_checked(tb, j, config)
            except AssertionError as exc:
                raise AssertionError(f"config error case {name}: {exc}") from None
            refused.append(name)
        good = random_job(rng, "dw", 6, 5, 4, **_layout(config))
        await _run_checked(tb, good, config)
        store_result("config_errors", refused)

    @cocotb.test()
    async def tight_buffers(dut):
        """Buffers declared exactly as large as their matrices (last row in whole beats),
        rows at the minimum stride, P ending on a 4 KiB page: no burst leaves them and no
        byte outside the output elements changes."""
        tb, params, config = await _bench(dut, latency=4)
        rng = np.random.default_rng(params.get("seed", 0) + 50)
        lay = _layout(config)
        bus = lay["bus_bytes"]
        D = config.max_dim
        for mode in ("fwd", "dx", "dw"):
            j0 = random_job(rng, mode, D + 1, 3, 5, **lay)
            # place P so that its end meets a page boundary
            end = j0.regions["p"][0] + j0.regions["p"][1]
            shift = (-end) % PAGE
            j = random_job(rng, mode, D + 1, 3, 5, **lay, offsets={"p": shift})
            assert (j.regions["p"][0] + j.regions["p"][1]) % PAGE == 0
            await _run_checked(tb, j, config)
        store_result("tight_buffers", True)

    @cocotb.test()
    async def reset_mid_run(dut):
        """Reset while bursts are in flight; the next run is correct and the old one left no trace."""
        tb, params, config = await _bench(dut, latency=40)
        rng = np.random.default_rng(params.get("seed", 0) + 60)
        lay = _layout(config)
        D = config.max_dim
        first = random_job(rng, "fwd", 3 * D, 3 * D, config.max_depth, bias=True, **lay)
        bursts_before = await tb.reset_during(first, max_cycles=5000)
        ctrl = await tb.read_reg("ap_ctrl")
        assert ctrl & AP_IDLE, f"not idle after reset (ap_ctrl=0x{ctrl:x})"
        second = random_job(rng, "dw", D + 3, 2 * D - 1, 9, **{**lay, "base_addr": lay["base_addr"] + 0x1000_0000})
        res, _ = await _run_checked(tb, second, config)
        assert all(b.addr >= second.base_addr for b in res["bursts"]), "stale burst after reset"
        store_result("reset_mid_run", {"bursts_before_reset": bursts_before,
                                       "cycles_after": res["counters"]["busy_cycles"]})

    @cocotb.test()
    async def job_from_file(dut):
        """One job from ``params['job_file']`` (verify_mac, benchmarks); reports everything."""
        params = load_params()
        tb, params, config = await _bench(dut, latency=params.get("latency", 8),
                                          backpressure=params.get("backpressure"))
        j = job_from_npz(params["job_file"])
        res = await tb.run_job(j, timeout_cycles=params.get("timeout_cycles"))
        gold = j.golden()
        mism = int(np.count_nonzero(res["out"] != gold.out))
        store_result("job", {"counters": res["counters"], "status": res["status"], "flags": res["flags"],
                             "cycles": res["cycles"], "mismatches": mism, "golden_saturations": gold.saturations,
                             "violations": res["violations"][:10], "stray_writes": int(len(res["stray"])),
                             "sim_seconds": res["sim_seconds"]})
        check_mac_job(j, res, config)
