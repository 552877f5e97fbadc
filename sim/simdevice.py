"""The simulated device: the Aggregator RTL, Verilated into a C++ harness, as a PYNQ device.

Two layers:

* :class:`NativeAggregator` -- the Verilated top with a C++ memory model (a numpy byte
  buffer used in place, no copies) and an AXI4-Lite master, loaded with ctypes from
  ``sim/native/harness.cpp`` (built once per content under
  ``build/native/<hash>/``; :func:`build_native`). The clock runs in C++; Python only
  touches registers. Its memory timing is the cocotb bench's (see the comment at the top
  of ``harness.cpp``), so ``busy_cycles`` are the same for the same job and latency.
* :class:`SimDevice` -- a ``pynq.Device`` (when pynq is importable, else a plain object
  with the same methods) whose ``read_registers``/``write_registers`` reach the native
  AXI4-Lite slave and whose allocator hands out numpy arrays that *are* the simulated
  memory. :func:`write_overlay` writes a ``.hwh`` (from the register map) and a dummy
  ``.bit`` so ``pynq.Overlay(path, device=SimDevice(...))`` binds the driver.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
NATIVE_DIR = Path(__file__).resolve().parent / "native"
#: Where native builds are cached; ``$GNNWEAVE_BUILD`` overrides ``<repo>/build``.
BUILD_ROOT = Path(os.environ.get("GNNWEAVE_BUILD", REPO_ROOT / "build")) / "native"

#: Verilator options. Lint waivers: the same named classes as gnnweave.sim.runner (style
#: warnings Amaranth's Verilog trips by construction), no blanket -Wno-fatal.
#: ``--output-split-cfuncs``: Verilator otherwise emits each scheduling region as one
#: function of thousands of statements, which the compiler handles badly (values spilled
#: across the whole body); cut into functions of at most OUTPUT_SPLIT_CFUNCS statements
#: small-agg ran 17 % more cycles per CPU second (PGO builds interleaved in one process,
#: R-MAT 13/16; 1000: +10 %, 6000: +5 %; without PGO 200 and 500 gained least or lost),
#: with the same cycle counts and counters.
OUTPUT_SPLIT_CFUNCS = 3000
VERILATOR_ARGS = (
    "--x-assign", "fast", "--x-initial", "fast", "-O3",
    "--output-split-cfuncs", str(OUTPUT_SPLIT_CFUNCS),
    "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNUSEDSIGNAL", "-Wno-UNUSEDPARAM",
    "-Wno-CASEINCOMPLETE", "-Wno-UNOPTFLAT", "-Wno-PINCONNECTEMPTY", "-Wno-DECLFILENAME",
    "-Wno-SYMRSVDWORD",
)
#: The harness answers a burst due at edge t at edge t (the cocotb bench's Timer fires
#: before the clock edge of the same time step); checked against the bench by the tests.
R_LEAD = 1
#: Module the simulated device's wrapper instantiates by default (see :func:`simulated_top`).
TOP = "gnnweave"
#: The harness's top: the Aggregator with its reset taken through a register (see
#: :func:`sim_top_verilog`).
SIM_TOP = "gnnweave_sim_top"
#: Physical address where a SimDevice's memory starts (above 4 GiB: upper address bits used).
DEFAULT_MEM_BASE = 0x1_0000_0000

# stats order of gw_stats
_STATS = ("cycles", "ar_bursts", "aw_bursts", "r_beats", "w_beats", "faults",
          "protocol_errors", "reads_in_flight", "writes_in_flight", "region_violations",
          "injected_errors", "reordered_bursts", "row_misses")
#: AXI responses :meth:`NativeAggregator.inject_error` can answer with.
ERROR_RESPONSES = {"SLVERR": 2, "DECERR": 3}
#: Default row-miss penalty of the memory model's open-row DRAM (cycles).
ROW_MISS_CYCLES = 12


class NativeBuildError(RuntimeError):
    """The native harness could not be built (the message has the log tail)."""


class DeviceTimeout(TimeoutError):
    """The simulated AXI4-Lite slave did not answer."""


@dataclass(frozen=True)
class NativeBuild:
    library: Path
    config: str
    bus_bytes: int
    key: str
    cached: bool
    build_seconds: float


def sim_top_verilog(verilog_text: str, top: str = TOP) -> str:
    """A wrapper with the Aggregator's ports whose ``ap_rst_n`` reaches the core through
    a flip-flop (one cycle later).

    Why: Amaranth folds the synchronous reset into every register's next-state logic, so
    with ``ap_rst_n`` a top-level input Verilator re-evaluates all of that logic in its
    input-combinational phase on every ``eval()``; from a register it is evaluated once
    per clock edge (several times faster). The harness holds reset long enough for the
    extra cycle; nothing else changes timing.

    Likewise ``s_axi_control_araddr`` (the register read multiplexer hangs on it) reaches
    the core one cycle late: the harness's AXI4-Lite master presents the address a
    cycle before ARVALID (control-port timing only; the memory side is unchanged).
    """
    import re
    head = verilog_text[verilog_text.index(f"module {top}("):]
    head = head[:head.index("endmodule")]
    ports = re.findall(r"^\s*(input|output)\s*(\[[^\]]+\])?\s*(\w+);", head, re.M)
    decls, conns = [], []
    for direction, width, name in ports:
        decls.append(f"  {direction} {width or ''} {name};")
        inner = {"ap_rst_n": "rst_n_q", "s_axi_control_araddr": "araddr_q"}.get(name, name)
        conns.append(f"    .{name}({inner})")
    names = ", ".join(n for _, _, n in ports)
    araddr_width = next(w for _, w, n in ports if n == "s_axi_control_araddr")
    return (f"module {SIM_TOP}({names});\n" + "\n".join(decls) + "\n"
            "  reg rst_n_q = 1'b0;\n"
            "  always @(posedge ap_clk) rst_n_q <= ap_rst_n;\n"
            f"  reg {araddr_width} araddr_q = 0;\n"
            "  always @(posedge ap_clk) araddr_q <= s_axi_control_araddr;\n"
            f"  {top} dut (\n" + ",\n".join(conns) + "\n  );\nendmodule\n")


def _bus_bytes(config: str) -> int:
    from gnnweave.hw.configs import get_config
    return get_config(config).bytes_per_beat


def simulated_top(config: str) -> tuple[Path, str]:
    """Which Verilog the simulated device runs: ``(generated Verilog file, its top module)``.

    The one place to change when the device simulates another top; the harness only needs
    the port names ``ap_clk``, ``ap_rst_n``, ``s_axi_control_*``, ``m_axi_gmem_*`` and
    ``interrupt``."""
    from gnnweave.hw.accelerator import ACCELERATOR_TOP
    from gnnweave.sim.accelerator_bench import accelerator_verilog
    return Path(accelerator_verilog(config)), ACCELERATOR_TOP


def _pgo_enabled() -> bool:
    """``$GNNWEAVE_NATIVE_PGO=0`` builds without profile-guided optimisation (one compile
    instead of two, about 15-20 % slower simulation)."""
    return os.environ.get("GNNWEAVE_NATIVE_PGO", "1") != "0"


#: Default C++ flags of the model and harness (``$GNNWEAVE_NATIVE_OPT`` replaces them): the
#: build is local and cached per CPU (:func:`_cpu_identity` is part of the cache key), so it
#: may use every instruction this CPU has.
DEFAULT_NATIVE_OPT = "-O3 -march=native"


def _cpu_identity() -> str:
    """What ``-march=native`` compiles for: the first CPU's model and feature flags. In the
    build's cache key, so a build directory copied to (or shared with) another kind of CPU
    is rebuilt rather than loaded and stopped by an illegal instruction."""
    import platform
    fields = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if not line.strip():
                if fields:
                    break           # the first processor's block is enough
                continue
            name, _, value = line.partition(":")
            fields[name.strip()] = value.strip()
    except OSError:
        pass
    keep = ("vendor_id", "cpu family", "model", "model name", "flags",     # x86
            "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features")
    return json.dumps([platform.machine(), platform.processor(),
                       *(fields.get(k, "") for k in keep)])


@dataclass(frozen=True)
class _BuildPlan:
    """Everything a native build is made from; ``key`` hashes all of it (the cache key)."""
    key: str
    tool: object
    verilog: Path
    top: str
    wrapper: str
    sources: tuple
    bus_bytes: int
    cflags: str
    ldflags: str
    make_opts: str
    pgo: bool


def _build_plan(config: str) -> _BuildPlan:
    """The inputs of :func:`build_native` for ``config`` and their cache key: Verilator and
    its options, C++ flags, PGO, the CPU (see :func:`_cpu_identity`), the Verilog and the
    harness sources."""
    from gnnweave.sim import toolchain

    tool = toolchain.setup_verilator()
    verilog, top = simulated_top(config)
    bus_bytes = _bus_bytes(config)
    sources = sorted(NATIVE_DIR.glob("*.cpp")) + sorted(NATIVE_DIR.glob("*.h"))
    # $GNNWEAVE_NATIVE_OPT: C++ optimisation of the model and harness (DEFAULT_NATIVE_OPT):
    # the level goes to the per-cycle code only, further flags (-march=native) everywhere
    opt = os.environ.get("GNNWEAVE_NATIVE_OPT", DEFAULT_NATIVE_OPT).split() or ["-O3"]
    level = opt[0] if opt[0].startswith("-O") else "-O3"
    extra = " ".join(opt[1:] if opt[0].startswith("-O") else opt)
    pgo = _pgo_enabled()
    # hidden symbols: calls inside the library skip the PLT (the gw_* entry points are
    # exported); link-time optimisation inlines across the model's files (5-10 % faster)
    cflags = f"-fPIC -fvisibility=hidden -flto=auto -DBUS_BYTES={bus_bytes} {extra}".strip()
    # the link does the link-time optimisation's code generation: the same target flags
    ldflags = f"-shared -flto=auto {extra}".strip()
    # OPT_SLOW: Verilator's run-once code (initial settle, constant pools): -O1 cuts the
    # compile time and costs nothing per cycle
    make_opts = f"OPT_FAST={level} OPT_SLOW=-O1 OPT_GLOBAL=-O2"
    h = hashlib.sha256()
    for part in (top, json.dumps(VERILATOR_ARGS), cflags, ldflags, make_opts, f"pgo={pgo}",
                 tool.version, _cpu_identity()):
        h.update(part.encode() + b"\0")
    verilog_text = Path(verilog).read_text()
    wrapper = sim_top_verilog(verilog_text, top)
    h.update(verilog_text.encode())
    h.update(wrapper.encode())
    for s in sources:
        h.update(s.name.encode() + b"\0" + s.read_bytes() + b"\0")
    return _BuildPlan(h.hexdigest()[:16], tool, Path(verilog), top, wrapper, tuple(sources),
                      bus_bytes, cflags, ldflags, make_opts, pgo)


def build_native(config: str = "small", *, force: bool = False,
                 build_root: Path | None = None) -> NativeBuild:
    """Build (or find cached) ``libgnnweave_sim.so`` for a named hardware config.

    With PGO (the default, see :func:`_pgo_enabled`) the model is compiled twice: once
    instrumented, run on a short training workload in a child process (all reductions,
    weighted and not; :func:`_pgo_train`), then again with the recorded profile. The
    profile only steers code layout and inlining; the simulated behaviour is the same."""
    from gnnweave.sim import runner

    plan = _build_plan(config)
    key, tool, verilog, top, wrapper, sources = (plan.key, plan.tool, plan.verilog, plan.top,
                                                 plan.wrapper, plan.sources)
    bus_bytes, cflags, ldflags, make_opts, pgo = (plan.bus_bytes, plan.cflags, plan.ldflags,
                                                  plan.make_opts, plan.pgo)
    root = Path(build_root) if build_root is not None else BUILD_ROOT
    out = root / f"{config}-{key}"
    lib = out / "libgnnweave_sim.so"
    stamp = out / "build.json"
    with runner.file_lock(root / f".{config}-{key}.lock"):
        if stamp.is_file() and lib.is_file() and not force:
            info = json.loads(stamp.read_text())
            return NativeBuild(lib, config, bus_bytes, key, True, info["build_seconds"])
        if out.exists():
            shutil.rmtree(out)
        (out / "src").mkdir(parents=True)
        shutil.copy2(verilog, out / "src" / f"{top}.v")
        (out / "src" / f"{SIM_TOP}.v").write_text(wrapper)
        copies = []
        for s in sources:
            shutil.copy2(s, out / "src" / s.name)
            if s.suffix == ".cpp":
                copies.append(str(out / "src" / s.name))
        obj = out / "obj"
        log = out / "build.log"

        def verilate(extra_cflags: str, extra_ldflags: str, target: Path):
            cmd = [str(tool.executable), "--cc", "--exe", "--build", "-j", "2",
                   *VERILATOR_ARGS, "--top-module", SIM_TOP, "--Mdir", str(obj),
                   "-CFLAGS", f"{cflags} {extra_cflags}".strip(),
                   "-LDFLAGS", f"{ldflags} {extra_ldflags}".strip(),
                   "-MAKEFLAGS", make_opts, "-o", str(target),
                   str(out / "src" / f"{SIM_TOP}.v"), str(out / "src" / f"{top}.v"), *copies]
            _logged(cmd, log, target, "native harness build")
            return cmd

        start = time.perf_counter()
        log.write_text("")
        cmds = []
        if pgo:
            trained = out / "libgnnweave_sim-pgo-gen.so"
            cmds.append(verilate("-fprofile-generate -fprofile-update=single",
                                 "-fprofile-generate", trained))
            train = [sys.executable, "-c", "import sys; from gnnweave.sim.simdevice import "
                     "_pgo_train; _pgo_train(sys.argv[1], sys.argv[2])", str(trained), config]
            _logged(train, log, None, "native harness profile run")
            cmds.append(train)
            profiled = any(obj.glob("*.gcda"))
            if not profiled:     # a compiler that writes its profile elsewhere (clang)
                with open(log, "a") as fh:
                    fh.write("profile run wrote no .gcda files: building without PGO\n")
            # recompile everything (make does not track CFLAGS), from the profile if any
            for f in obj.iterdir():
                if f.is_file() and f.suffix != ".gcda":
                    f.unlink()
            trained.unlink()
            cmds.append(verilate("-fprofile-use -fprofile-partial-training -Wno-missing-profile"
                                 if profiled else "", "", lib))
            pgo = profiled
        else:
            cmds.append(verilate("", "", lib))
        seconds = time.perf_counter() - start
        stamp.write_text(json.dumps({"config": config, "build_seconds": seconds, "pgo": pgo,
                                     "verilog": str(verilog), "cmds": cmds}, indent=1))
        return NativeBuild(lib, config, bus_bytes, key, False, seconds)


def _logged(cmd: list[str], log: Path, product: Path | None, what: str):
    """Run ``cmd`` appending to ``log`` (its stage named on stderr while it runs); a failure
    raises with the log's tail."""
    from gnnweave.progress import stage
    with stage(what, note="once per build, cached afterwards"):
        _logged_run(cmd, log, product, what)


def _logged_run(cmd: list[str], log: Path, product: Path | None, what: str):
    with open(log, "a") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=log.parent)
    if proc.returncode != 0 or (product is not None and not product.is_file()):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise NativeBuildError(f"{what} failed (exit {proc.returncode}); log {log}:\n{tail}")


def _pgo_train(library: str, config: str):
    """The profile run (in a child process, which writes the profile when it exits): a few
    short jobs covering every reduction, weights and the control path."""
    from gnnweave.generators import rmat
    from gnnweave.golden.aggregate import Reduce, aggregate_raw
    from gnnweave.sim.verify import make_job
    build = NativeBuild(Path(library), config, _bus_bytes(config), "pgo", True, 0.0)
    sim = None
    for scale, reduce, weighted, feat in ((10, "sum", False, 16), (9, "mean", False, 24),
                                          (9, "max", False, 16), (9, "sum", True, 8)):
        job = make_job(rmat(scale, 8, seed=scale), feat, reduce, weighted=weighted, seed=1)
        if sim is None:
            sim = NativeAggregator(job.memory_image(), job.base_addr, config=config, build=build)
        res = run_job(job, latency=32, config=config, sim=sim)
        gold = aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce.parse(reduce),
                             shift=job.shift, out_width=16, weights=job.weights)
        if res.timed_out or res.faults or not np.array_equal(res.out, gold.out):
            raise SystemExit(f"profile run: wrong result on rmat:{scale}:8 {reduce}")
    sim.close()


_LIBS: dict[str, ctypes.CDLL] = {}
_LIBS_LOCK = threading.Lock()


def _load(path: Path) -> ctypes.CDLL:
    with _LIBS_LOCK:
        lib = _LIBS.get(str(path))
        if lib is not None:
            return lib
        lib = ctypes.CDLL(str(path))
        vp, u8p, u32, u64, i32 = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                  ctypes.c_uint64, ctypes.c_int)
        sigs = {
            "gw_create": (vp, [u8p, u64, u64, u32, u32, i32]),
            "gw_destroy": (None, [vp]),
            "gw_set_memory": (None, [vp, u8p, u64, u64]),
            "gw_set_latency": (None, [vp, u32, u32]),
            "gw_set_read_stall": (None, [vp, i32]),
            "gw_reset": (None, [vp, u32]),
            "gw_reg_read": (i32, [vp, u32, ctypes.POINTER(u32), u64]),
            "gw_reg_write": (i32, [vp, u32, u32, u32, u64]),
            "gw_step": (u64, [vp, u64]),
            "gw_run_until_interrupt": (u64, [vp, u64]),
            "gw_interrupt": (i32, [vp]),
            "gw_cycles": (u64, [vp]),
            "gw_stats": (i32, [vp, ctypes.POINTER(u64), i32]),
            "gw_first_fault": (i32, [vp, ctypes.c_char_p, i32]),
            "gw_clear_faults": (None, [vp]),
            "gw_bus_bytes": (u32, []),
            "gw_set_memory_model": (None, [vp, i32, i32, u32, i32, u32, u64]),
            "gw_inject_error": (None, [vp, i32, u64, u32]),
            "gw_clear_injections": (None, [vp]),
            "gw_set_regions": (None, [vp, i32, ctypes.POINTER(u64), i32]),
            "gw_set_one_eval": (i32, [vp, i32]),
            "gw_set_check_one_eval": (None, [vp, i32]),
            "gw_one_eval_mismatches": (u64, [vp]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _LIBS[str(path)] = lib
        return lib


#: AXI4-Lite answers within a few cycles; more than this means the slave is broken.
REG_TIMEOUT_CYCLES = 1000


class NativeAggregator:
    """One simulated Aggregator with its memory: ``memory`` (uint8 numpy, used in place)
    at physical ``base``. ``latency``: read latency in cycles, defined as in the cocotb
    bench (``DelayedReadAddress``); ``max_outstanding``: bursts the memory accepts before
    ARREADY drops (the bench's default 64)."""

    def __init__(self, memory: np.ndarray, base: int = DEFAULT_MEM_BASE, *, latency: int = 32,
                 max_outstanding: int = 64, config: str = "small",
                 build: NativeBuild | None = None):
        self.build = build if build is not None else build_native(config)
        self.config = config
        self._lib = _load(self.build.library)
        self._handle = None
        self._check_memory(memory)
        self.memory = memory
        self.base = int(base)
        self.latency = int(latency)
        self.max_outstanding = int(max_outstanding)
        self._lock = threading.RLock()
        self._handle = self._lib.gw_create(memory.ctypes.data, memory.nbytes, self.base,
                                           self.latency, self.max_outstanding, R_LEAD)
        if not self._handle:
            raise RuntimeError("gw_create failed")

    @staticmethod
    def _check_memory(memory):
        if not isinstance(memory, np.ndarray) or memory.dtype != np.uint8 or memory.ndim != 1 \
                or not memory.flags.c_contiguous or not memory.flags.writeable:
            raise ValueError("memory must be a writeable, contiguous 1-D uint8 numpy array")

    # -- lifetime
    def close(self):
        if self._handle:
            self._lib.gw_destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _h(self):
        if not self._handle:
            raise RuntimeError("the simulated device is closed")
        return self._handle

    # -- configuration
    def set_memory(self, memory: np.ndarray, base: int):
        self._check_memory(memory)
        with self._lock:
            self.memory, self.base = memory, int(base)
            self._lib.gw_set_memory(self._h(), memory.ctypes.data, memory.nbytes, self.base)

    def set_latency(self, latency: int, max_outstanding: int | None = None):
        with self._lock:
            self.latency = int(latency)
            if max_outstanding is not None:
                self.max_outstanding = int(max_outstanding)
            self._lib.gw_set_latency(self._h(), self.latency, self.max_outstanding)

    def set_read_stall(self, stall: bool):
        """``True``: the memory accepts reads but never answers (a hung device)."""
        with self._lock:
            self._lib.gw_set_read_stall(self._h(), int(bool(stall)))

    def set_memory_model(self, *, reorder: bool = False, jitter: int = 0, dram: bool = False,
                         row_miss: int = ROW_MISS_CYCLES, seed: int = 0, on: bool = True):
        """A memory that answers like a board's interconnect and DRAM (``on=False``: the
        exact bench timing again). Every read burst waits ``latency`` plus a random 0..
        ``jitter`` cycles (write responses the same jitter); ``dram``: an 8-bank open-row
        DRAM with 64-byte access granularity shared by all bursts, ``row_miss`` cycles per
        row miss; ``reorder``: bursts of different IDs are answered in the order they
        become ready (each ID's in its own order)."""
        for name, value in (("jitter", jitter), ("row_miss", row_miss)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                    not 0 <= int(value) < 1 << 20:
                raise ValueError(f"set_memory_model: {name} must be an integer in 0..2**20-1, "
                                 f"not {value!r}")
        with self._lock:
            self._lib.gw_set_memory_model(self._h(), int(bool(on)), int(bool(reorder)),
                                          int(jitter), int(bool(dram)), int(row_miss),
                                          int(seed) & (1 << 64) - 1)

    def inject_error(self, kind: str = "read", after: int = 0, resp: str = "SLVERR"):
        """Answer the ``after``-th ``kind`` (``"read"`` or ``"write"``) burst from now (0:
        the next) with ``resp`` (``"SLVERR"`` or ``"DECERR"``): a read returns its beats
        with that RRESP, a write is dropped and answered with that BRESP."""
        if kind not in ("read", "write"):
            raise ValueError(f"inject_error: kind must be 'read' or 'write', not {kind!r}")
        if resp not in ERROR_RESPONSES:
            raise ValueError(f"inject_error: resp must be one of {sorted(ERROR_RESPONSES)}, "
                             f"not {resp!r}")
        if int(after) < 0:
            raise ValueError(f"inject_error: after must be >= 0, not {after}")
        with self._lock:
            self._lib.gw_inject_error(self._h(), int(kind == "write"), int(after),
                                      ERROR_RESPONSES[resp])

    def clear_injections(self):
        with self._lock:
            self._lib.gw_clear_injections(self._h())

    def set_regions(self, *, read=None, write=None):
        """The buffers bursts may touch, ``[(addr, size), ...]`` per kind (``None``: leave
        that kind as it is, ``[]``: stop checking it). A burst reaching outside every buffer
        of its kind counts in ``stats()["region_violations"]`` (and is still performed)."""
        with self._lock:
            for write_kind, regions in ((0, read), (1, write)):
                if regions is None:
                    continue
                flat = [v for a, n in regions for v in (int(a), int(a) + int(n))]
                arr = (ctypes.c_uint64 * max(len(flat), 1))(*flat)
                self._lib.gw_set_regions(self._h(), write_kind, arr, len(flat) // 2)

    def set_one_eval(self, on: bool) -> bool:
        """One ``eval()`` per cycle (default where the Verilated model allows it) or two
        (clock high, clock low); returns the mode now in force. Cycle timing is the same."""
        with self._lock:
            return bool(self._lib.gw_set_one_eval(self._h(), int(bool(on))))

    def check_one_eval(self, on: bool):
        """Also run the falling-edge ``eval()`` and count cycles where it changed an output
        the bench samples (:attr:`one_eval_mismatches`; any is a bug of the one-eval mode)."""
        with self._lock:
            self._lib.gw_set_check_one_eval(self._h(), int(bool(on)))

    @property
    def one_eval_mismatches(self) -> int:
        return int(self._lib.gw_one_eval_mismatches(self._h()))

    # -- registers (32-bit words)
    def reg_read(self, offset: int) -> int:
        value = ctypes.c_uint32()
        with self._lock:
            if self._lib.gw_reg_read(self._h(), int(offset), ctypes.byref(value),
                                     REG_TIMEOUT_CYCLES) != 0:
                raise DeviceTimeout(f"AXI4-Lite read of offset 0x{offset:x} got no answer in "
                                    f"{REG_TIMEOUT_CYCLES} cycles")
        return value.value

    def reg_write(self, offset: int, value: int, strb: int = 0xF):
        with self._lock:
            if self._lib.gw_reg_write(self._h(), int(offset), int(value) & 0xFFFF_FFFF,
                                      int(strb), REG_TIMEOUT_CYCLES) != 0:
                raise DeviceTimeout(f"AXI4-Lite write of offset 0x{offset:x} got no answer in "
                                    f"{REG_TIMEOUT_CYCLES} cycles")

    # -- the clock
    def step(self, cycles: int) -> int:
        with self._lock:
            return int(self._lib.gw_step(self._h(), int(cycles)))

    def run_until_interrupt(self, max_cycles: int) -> int:
        """Clock until the ``interrupt`` output is high (GIE/IER must enable it) or
        ``max_cycles`` have passed; returns the cycles run."""
        with self._lock:
            return int(self._lib.gw_run_until_interrupt(self._h(), int(max_cycles)))

    @property
    def interrupt(self) -> bool:
        return bool(self._lib.gw_interrupt(self._h()))

    def reset(self, cycles: int = 8):
        with self._lock:
            self._lib.gw_reset(self._h(), int(cycles))

    @property
    def cycles(self) -> int:
        return int(self._lib.gw_cycles(self._h()))

    def stats(self) -> dict:
        buf = (ctypes.c_uint64 * len(_STATS))()
        self._lib.gw_stats(self._h(), buf, len(_STATS))
        return dict(zip(_STATS, (int(v) for v in buf)))

    def first_fault(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._lib.gw_first_fault(self._h(), buf, 256)
        return buf.value.decode()

    def clear_faults(self):
        self._lib.gw_clear_faults(self._h())


# ----------------------------------------------------------------------------- one job
@dataclass
class NativeJobResult:
    out: np.ndarray           # [N, F] int64 from the output rows
    counters: dict            # every status register of the map, by name
    status: int
    cycles: int               # harness cycles from the ap_start write to the interrupt
    wall_seconds: float       # host time of the run (start to done)
    memory: np.ndarray        # the image after the run
    faults: int               # beats outside the memory, malformed bursts and bursts
                              # outside the job's configured buffers in this run
    first_fault: str          # the first of the device's lifetime (clear_faults resets)
    timed_out: bool = False
    region_violations: int = 0  # bursts outside the job's configured buffers


def _regmap(config: str):
    from gnnweave.hw.accelerator import build_regmap
    return build_regmap(config)


def write_register(sim: NativeAggregator, reg, value: int):
    """A register of the map (32 or 64 bits, low word first)."""
    for word in range(reg.words):
        sim.reg_write(reg.offset + 4 * word, (int(value) >> (32 * word)) & 0xFFFF_FFFF)


def read_register(sim: NativeAggregator, reg) -> int:
    value = 0
    for word in range(reg.words):
        value |= sim.reg_read(reg.offset + 4 * word) << (32 * word)
    return value


def job_buffers(job) -> tuple[list, list]:
    """The buffers an :class:`~gnnweave.layout.AggregateJob` configures: ``(read, write)``
    lists of ``(addr, size)`` (weights only when the job uses them)."""
    regs = job.registers()
    reads = [(regs[f"{n}_addr"], regs[f"{n}_size"]) for n in ("indptr", "indices", "feat")]
    if regs.get("use_weights"):
        reads.append((regs["weights_addr"], regs["weights_size"]))
    return reads, [(regs["out_addr"], regs["out_size"])]


def run_job(job, *, latency: int = 32, config: str = "small", max_cycles: int | None = None,
            sim: NativeAggregator | None = None, max_outstanding: int = 64) -> NativeJobResult:
    """Run one :class:`~gnnweave.layout.AggregateJob` on the native device (a fresh one
    unless ``sim`` is given; its memory is replaced by the job's image). Every burst is
    checked against the buffers the job configures (:func:`job_buffers`)."""
    from gnnweave.hw.regmap import CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, CtrlBit
    regmap = _regmap(config)
    image = job.memory_image()
    if sim is None:
        sim = NativeAggregator(image, job.base_addr, latency=latency, config=config,
                               max_outstanding=max_outstanding)
    else:
        sim.set_memory(image, job.base_addr)
        sim.set_latency(latency, max_outstanding)
    reads, writes = job_buffers(job)
    sim.set_regions(read=reads, write=writes)
    before = sim.stats()
    for name, value in job.registers().items():
        write_register(sim, regmap[name], value)
    sim.reg_write(GIE_OFFSET, 1)
    sim.reg_write(IER_OFFSET, 1)
    if max_cycles is None:
        beats = job.num_edges * -(-job.row_bytes // sim.build.bus_bytes) + job.num_nodes * 4
        max_cycles = 20_000 + 20 * beats * max(1, latency // 8)
    t0 = time.perf_counter()
    c0 = sim.cycles
    sim.reg_write(CTRL_OFFSET, 1 << CtrlBit.AP_START)
    sim.run_until_interrupt(max_cycles)
    wall = time.perf_counter() - t0
    cycles = sim.cycles - c0
    timed_out = not sim.interrupt
    sim.reg_write(ISR_OFFSET, 1)       # toggle ap_done back off
    sim.reg_read(CTRL_OFFSET)          # clear-on-read ap_done
    counters = {r.name: read_register(sim, r) for r in regmap if r.access.name == "RO"}
    after = sim.stats()
    sim.set_regions(read=[], write=[])
    outside = after["region_violations"] - before["region_violations"]
    faults = (after["faults"] - before["faults"]) + \
        (after["protocol_errors"] - before["protocol_errors"]) + outside
    return NativeJobResult(out=job.read_output(image), counters=counters,
                           status=int(counters["status"]), cycles=cycles, wall_seconds=wall,
                           memory=image, faults=faults,
                           first_fault=sim.first_fault(), timed_out=timed_out,
                           region_violations=outside)


# ----------------------------------------------------------------------------- overlay files
#: The VLNV the .hwh gives the accelerator (the bitstream flow's); gnnweave.host.driver binds to it.
VLNV = "gnnweave:hls:gnnweave:1.0"
#: Where the control slave sits in the PS address map (an M_AXI_HPM0_LPD-like window).
CONTROL_BASE = 0xA000_0000
IP_NAME = "gnnweave_0"


def hwh_text(regmap, *, control_base: int = CONTROL_BASE, instance: str = IP_NAME,
             vlnv: str = VLNV, mem_base: int = DEFAULT_MEM_BASE, mem_size: int = 1 << 28,
             max_feat_dim: int = 64, bus_width: int = 128, mac_max_depth: int = 0,
             pipeline: dict | None = None) -> str:
    """A Vivado-style ``.hwh``: a Zynq UltraScale+ PS whose master maps ``instance``'s
    ``s_axi_control`` at ``control_base`` (registers from ``regmap``), and the
    accelerator's ``m_axi_gmem`` master reaching the PS's HP slave port."""
    import xml.etree.ElementTree as ET

    from gnnweave.hw.pipeline_unit import HWH_LIMITS
    high = control_base + regmap.size - 1
    root = ET.Element("EDKSYSTEM", EDWVERSION="1.2", TIMESTAMP="0", VIVADOVERSION="2022.1")
    ET.SubElement(root, "SYSTEMINFO", ARCH="zynquplus", DEVICE="xczu7ev", NAME="gnnweave_sim",
                  PACKAGE="ffvc1156", SPEEDGRADE="-2")
    ET.SubElement(root, "EXTERNALPORTS")
    modules = ET.SubElement(root, "MODULES")
    ps = ET.SubElement(modules, "MODULE", COREREVISION="0", FULLNAME="/zynq_ultra_ps_e_0",
                       HWVERSION="3.4", INSTANCE="zynq_ultra_ps_e_0", IPTYPE="PERIPHERAL",
                       IS_ENABLE="1", IS_PL="FALSE", MODCLASS="PROCESSOR",
                       MODTYPE="zynq_ultra_ps_e", VLNV="xilinx.com:ip:zynq_ultra_ps_e:3.4")
    ps_params = ET.SubElement(ps, "PARAMETERS")
    for clk in range(4):   # PL clocks as pynq's parser reads them (PL0: 100 MHz)
        ET.SubElement(ps_params, "PARAMETER", NAME=f"PSU__FPGA_PL{clk}_ENABLE",
                      VALUE="1" if clk == 0 else "0")
        for div, value in ((0, 15), (1, 1)):
            ET.SubElement(ps_params, "PARAMETER",
                          NAME=f"PSU__CRL_APB__PL{clk}_REF_CTRL__DIVISOR{div}", VALUE=str(value))
    mm = ET.SubElement(ps, "MEMORYMAP")
    ET.SubElement(mm, "MEMRANGE", ADDRESSBLOCK="Reg", BASENAME="C_S_AXI_CONTROL_BASEADDR",
                  BASEVALUE=f"0x{control_base:08X}", HIGHNAME="C_S_AXI_CONTROL_HIGHADDR",
                  HIGHVALUE=f"0x{high:08X}", INSTANCE=instance, IS_DATA="TRUE",
                  IS_INSTRUCTION="TRUE", MASTERBUSINTERFACE="M_AXI_HPM0_FPD", MEMTYPE="REGISTER",
                  SLAVEBUSINTERFACE="s_axi_control")
    ET.SubElement(ps, "PORTS")
    bifs = ET.SubElement(ps, "BUSINTERFACES")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="ps_M_AXI_HPM0_FPD", DATAWIDTH="128",
                  NAME="M_AXI_HPM0_FPD", TYPE="MASTER", VLNV="xilinx.com:interface:aximm:1.0")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="gmem_S_AXI_HP0_FPD", DATAWIDTH="128",
                  NAME="S_AXI_HP0_FPD", TYPE="SLAVE", VLNV="xilinx.com:interface:aximm:1.0")

    ip = ET.SubElement(modules, "MODULE", COREREVISION="1", FULLNAME=f"/{instance}",
                       HWVERSION="1.0", INSTANCE=instance, IPTYPE="PERIPHERAL", IS_ENABLE="1",
                       MODCLASS="PERIPHERAL", MODTYPE=vlnv.split(":")[2], VLNV=vlnv)
    docs = ET.SubElement(ip, "DOCUMENTS")
    del docs
    params = ET.SubElement(ip, "PARAMETERS")
    for name, value in (("C_S_AXI_CONTROL_BASEADDR", f"0x{control_base:08X}"),
                        ("C_S_AXI_CONTROL_HIGHADDR", f"0x{high:08X}"),
                        ("C_S_AXI_CONTROL_ADDR_WIDTH", str(regmap.addr_width)),
                        ("C_S_AXI_CONTROL_DATA_WIDTH", "32"),
                        ("C_M_AXI_GMEM_DATA_WIDTH", str(bus_width)),
                        ("C_MAX_FEAT_DIM", str(max_feat_dim)),
                        ("C_MAC_MAX_DEPTH", str(mac_max_depth)),
                        # the training Pipeline's limits (0: no Pipeline)
                        *((f"C_PIPE_{k.upper()}", str((pipeline or {}).get(k, 0)))
                          for k in HWH_LIMITS)):
        ET.SubElement(params, "PARAMETER", NAME=name, VALUE=value)
    abs_ = ET.SubElement(ip, "ADDRESSBLOCKS")
    block = ET.SubElement(abs_, "ADDRESSBLOCK", ACCESS="read-write", INTERFACE="s_axi_control",
                          NAME="Reg", RANGE=str(regmap.size), USAGE="register")
    block.append(regmap.to_hwh_element())
    mm = ET.SubElement(ip, "MEMORYMAP")
    ET.SubElement(mm, "MEMRANGE", ADDRESSBLOCK="HP0_DDR_LOW", BASENAME="C_BASEADDR",
                  BASEVALUE=f"0x{mem_base:08X}", HIGHNAME="C_HIGHADDR",
                  HIGHVALUE=f"0x{mem_base + mem_size - 1:08X}", INSTANCE="zynq_ultra_ps_e_0",
                  IS_DATA="TRUE", IS_INSTRUCTION="TRUE", MASTERBUSINTERFACE="m_axi_gmem",
                  MEMTYPE="MEMORY", SLAVEBUSINTERFACE="S_AXI_HP0_FPD")
    ports = ET.SubElement(ip, "PORTS")
    ET.SubElement(ports, "PORT", DIR="I", NAME="ap_clk", SIGIS="clk")
    ET.SubElement(ports, "PORT", DIR="I", NAME="ap_rst_n", SIGIS="rst")
    ET.SubElement(ports, "PORT", DIR="O", NAME="interrupt", SIGIS="INTERRUPT")
    bifs = ET.SubElement(ip, "BUSINTERFACES")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="ps_M_AXI_HPM0_FPD", DATAWIDTH="32",
                  NAME="s_axi_control", TYPE="SLAVE", VLNV="xilinx.com:interface:aximm:1.0")
    ET.SubElement(bifs, "BUSINTERFACE", BUSNAME="gmem_S_AXI_HP0_FPD", DATAWIDTH="128",
                  NAME="m_axi_gmem", TYPE="MASTER", VLNV="xilinx.com:interface:aximm:1.0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8" standalone="no" ?>\n' + \
        ET.tostring(root, encoding="unicode") + "\n"


def write_overlay(out_dir, config: str = "small", name: str = "gnnweave_sim", **kw) -> Path:
    """Write ``<out_dir>/<name>.hwh`` and a dummy ``<name>.bit``; returns the .bit path
    (what ``pynq.Overlay`` takes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from gnnweave.hw.configs import get_config, get_mac_config, get_pipeline_config
    from gnnweave.hw.pipeline_unit import HWH_LIMITS
    cfg = get_config(config)
    mac = get_mac_config(config)
    pipe = get_pipeline_config(config)
    if pipe is not None:
        kw.setdefault("pipeline", {k: getattr(pipe, k) for k in HWH_LIMITS})
    kw.setdefault("max_feat_dim", cfg.max_feat_dim)
    kw.setdefault("mac_max_depth", mac.max_depth if mac is not None else 0)
    kw.setdefault("bus_width", cfg.bus_width)
    (out_dir / f"{name}.hwh").write_text(hwh_text(_regmap(config), **kw))
    bit = out_dir / f"{name}.bit"
    # never programmed: the simulated device ignores it (and a real board would refuse it)
    bit.write_bytes(b"gnnweave simulated device: not a bitstream\n")
    return bit


# ----------------------------------------------------------------------------- memory
class SimMemoryError(MemoryError):
    """The simulated memory cannot hold the requested buffer."""


class _Allocator:
    """First-fit allocation of page-aligned blocks in ``[0, size)`` of the memory array."""

    ALIGN = 4096

    def __init__(self, size: int):
        self.size = size
        self._blocks: dict[int, int] = {}   # offset -> bytes
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> int:
        want = -(-max(int(nbytes), 1) // self.ALIGN) * self.ALIGN
        with self._lock:
            cursor = 0
            for off in sorted(self._blocks):
                if off - cursor >= want:
                    break
                cursor = off + -(-self._blocks[off] // self.ALIGN) * self.ALIGN
            if cursor + want > self.size:
                raise SimMemoryError(
                    f"simulated memory full: {nbytes} bytes requested, "
                    f"{self.size - sum(self._blocks.values())} of {self.size} free "
                    f"(make the SimDevice with a larger mem_size)")
            self._blocks[cursor] = want
            return cursor

    def free(self, offset: int):
        with self._lock:
            self._blocks.pop(offset, None)

    @property
    def used(self) -> int:
        return sum(self._blocks.values())


def _buffer_class():
    try:
        from pynq.buffer import PynqBuffer
        return PynqBuffer
    except ImportError:
        return None


class SimBuffer(np.ndarray):
    """Stand-in for ``pynq.buffer.PynqBuffer`` without pynq: a numpy view into the
    simulated memory with ``physical_address`` / ``device_address``."""

    def __new__(cls, shape, dtype, buffer, offset, device_address, device):
        obj = super().__new__(cls, shape, dtype, buffer=buffer, offset=offset)
        obj.device_address = device_address
        obj.physical_address = device_address
        obj.sim_device = device   # not `.device`: numpy 2 arrays have a read-only one
        obj.coherent = True
        obj.bo = device_address
        return obj

    def __array_finalize__(self, obj):
        if obj is None:
            return
        offset = self.__array_interface__["data"][0] - obj.__array_interface__["data"][0] \
            if isinstance(obj, SimBuffer) else 0
        addr = getattr(obj, "device_address", None)
        self.device_address = self.physical_address = None if addr is None else addr + offset
        self.coherent, self.bo = getattr(obj, "coherent", None), getattr(obj, "bo", None)
        self.sim_device = None            # only the allocation itself frees the block

    def flush(self):
        pass

    def invalidate(self):
        pass

    sync_to_device = flush
    sync_from_device = invalidate

    def __del__(self):
        self.freebuffer()

    def freebuffer(self):
        if getattr(self, "sim_device", None) is not None:
            self.sim_device._free(self.device_address)
            self.sim_device = None

    close = freebuffer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.freebuffer()
        return False


class _SimMemory:
    """``device.default_memory``: what ``pynq.allocate`` calls ``allocate`` on."""

    def __init__(self, device):
        self.device = device

    def allocate(self, shape, dtype, **kwargs):
        return self.device.allocate(shape, dtype, **kwargs)


# ----------------------------------------------------------------------------- the device
def _device_base():
    try:
        from pynq.pl_server.device import Device
        return Device
    except ImportError:
        return object


class SimDevice(_device_base()):
    """The simulated PYNQ device (see the module docstring).

    ``mem_size`` bytes of simulated DDR at physical ``mem_base``; ``latency`` read latency
    in cycles (the cocotb bench's definition); ``config`` the hardware configuration.
    Register space: the accelerator's control slave at :data:`CONTROL_BASE`.

    Time: the device clock advances when the host waits -- a read of the CTRL register
    (the polling read) that finds the engine busy (neither done nor idle) runs the
    simulation until the ``interrupt`` output rises or ``poll_cycles`` cycles pass, then
    reads CTRL again; :meth:`advance` does the same on request.

    With ``check_buffers`` the device remembers the register writes and, at every
    ``ap_start``, tells the memory the buffers the host configured for the selected unit
    (Aggregator: indptr, indices, feat, weights when used; out written. MacArray: p, q,
    bias when used; out written); any burst outside them is counted
    (:meth:`memory_faults`, ``stats()["region_violations"]``). Other units run unchecked.
    """

    #: Buffers each unit reads and writes: (read buffer names, written, {buffer: the
    #: register that says it is used}).
    UNIT_BUFFERS = {0: (("indptr", "indices", "feat", "weights"), ("out",), {"weights": "use_weights"}),
                    1: (("p", "q", "bias"), ("out",), {"bias": "use_bias"})}

    _probe_priority_ = None   # never enumerated: a SimDevice is made explicitly

    def __init__(self, mem_size: int = 1 << 26, *, mem_base: int = DEFAULT_MEM_BASE,
                 latency: int = 32, config: str = "small", poll_cycles: int = 1 << 14,
                 max_outstanding: int = 64, tag: str = "gnnweave-sim",
                 check_buffers: bool = False):
        if int(mem_size) <= 0 or int(mem_size) % 4096:
            raise ValueError(f"mem_size must be a positive multiple of 4096, not {mem_size}")
        if int(mem_base) % 4096:
            raise ValueError(f"mem_base must be 4 KiB aligned, not 0x{int(mem_base):x}")
        if _device_base() is not object:
            super().__init__(tag)
        self.name = tag
        self.tag = tag
        self.config = config
        self.regmap = _regmap(config)
        self.mem_base = int(mem_base)
        self.memory = np.zeros(int(mem_size), dtype=np.uint8)
        self.control_base = CONTROL_BASE
        self.poll_cycles = int(poll_cycles)
        self._alloc = _Allocator(self.memory.nbytes)
        self.sim = NativeAggregator(self.memory, self.mem_base, latency=latency, config=config,
                                    max_outstanding=max_outstanding)
        self.default_memory = _SimMemory(self)
        self._buffer_cls = _buffer_class()
        self._bitfile = None
        self.check_buffers = bool(check_buffers)
        self._written: dict[int, int] = {}     # register word offset -> last value written

    # -- pynq.Device interface --------------------------------------------------------
    @property
    def capabilities(self):
        return {"REGISTER_RW": True, "MEMORY_MAPPED": False, "CALLABLE": False}

    def _control_offset(self, address: int, length: int) -> int:
        off = int(address) - self.control_base
        if off < 0 or off + int(length) > self.regmap.size or off % 4 or int(length) % 4:
            raise ValueError(
                f"register access at 0x{int(address):x} ({length} bytes) is outside the "
                f"control slave [0x{self.control_base:x}, "
                f"0x{self.control_base + self.regmap.size:x}) or not word aligned")
        return off

    def read_registers(self, address, length):
        off = self._control_offset(address, length)
        words = []
        for i in range(0, int(length), 4):
            value = self.sim.reg_read(off + i)
            if off + i == 0 and not value & 0x6:
                # the CTRL poll of a busy engine (neither done nor idle): time passes
                self.advance()
                value |= self.sim.reg_read(off + i)   # ap_ready is clear-on-read too
            words.append(value.to_bytes(4, "little"))
        return b"".join(words)

    def write_registers(self, address, data):
        data = bytes(data)
        off = self._control_offset(address, len(data))
        for i in range(0, len(data), 4):
            value = int.from_bytes(data[i:i + 4], "little")
            self._written[off + i] = value
            if off + i == 0 and value & 1 and self.check_buffers:
                self._configure_regions()
            self.sim.reg_write(off + i, value)

    def _register_value(self, name: str) -> int:
        reg = self.regmap[name]
        return sum(self._written.get(reg.offset + 4 * w, reg.reset >> (32 * w) & 0xFFFF_FFFF)
                   << (32 * w) for w in range(reg.words))

    def configured_buffers(self) -> tuple[list, list] | None:
        """``(read, write)`` ``[(addr, size), ...]`` the registers written so far configure for
        the selected unit, or None for a unit whose buffers are not known here."""
        unit = self._register_value("unit") if "unit" in self.regmap else 0
        if unit not in self.UNIT_BUFFERS:
            return None
        reads, writes, used_by = self.UNIT_BUFFERS[unit]

        def buffers(names):
            return [(self._register_value(f"{n}_addr"), self._register_value(f"{n}_size"))
                    for n in names if n not in used_by or self._register_value(used_by[n])]
        return buffers(reads), buffers(writes)

    def _configure_regions(self):
        found = self.configured_buffers()
        reads, writes = found if found is not None else ([], [])
        self.sim.set_regions(read=reads, write=writes)

    def allocate(self, shape, dtype, **kwargs):
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = self._alloc.alloc(nbytes)
        addr = self.mem_base + offset
        if self._buffer_cls is not None:
            buf = self._buffer_cls(shape, dtype, buffer=self.memory, offset=offset,
                                   device_address=addr, bo=addr, device=self, coherent=True)
            # PynqBuffer frees through memory/pointer/return_to (also when collected)
            buf.memory, buf.pointer, buf.return_to = self.memory, offset + 1, self
            buf.freed = True      # never munmap: the block is numpy memory, not a mapping
        else:
            buf = SimBuffer(shape, dtype, self.memory, offset, addr, self)
        return buf

    def return_pointer(self, pointer: int):
        self._alloc.free(int(pointer) - 1)

    def _free(self, device_address: int):
        self._alloc.free(int(device_address) - self.mem_base)

    # PynqBuffer calls these with its bo; the simulated memory is coherent
    def flush(self, bo, offset, ptr, size):
        pass

    def invalidate(self, bo, offset, ptr, size):
        pass

    def free(self, bo):
        self._free(bo)

    def close(self):
        self.sim.close()

    def download(self, bitstream, parser=None):
        """Nothing to program: remember the bitstream and refresh the dictionaries."""
        self._bitfile = getattr(bitstream, "bitfile_name", bitstream)
        post = getattr(super(), "post_download", None)
        if post is not None and hasattr(bitstream, "partial"):
            post(bitstream, parser)

    def get_bitfile_metadata(self, bitfile_name, partial=False):
        """pynq's HWH parser on the ``.hwh`` next to ``bitfile_name``."""
        # The Zynq UltraScale+ parser whatever the host CPU (pynq picks its HWH class by
        # the CPU it runs on; on x86 that is the abstract one).
        from pynq.pl_server.hwh_parser import _HWHUltrascale
        hwh = Path(bitfile_name).with_suffix(".hwh")
        if not hwh.is_file():
            raise FileNotFoundError(f"{hwh}: no .hwh next to the bitstream")
        parser = _HWHUltrascale(hwh_data=hwh.read_text())
        if not hasattr(parser, "systemgraph"):
            parser.systemgraph = None       # pynq 4.0 reads it; the .hwh parser has none
        parser.clock_dict = {}              # no PS clock registers to program here
        return parser

    # -- simulation controls ------------------------------------------------------------
    def advance(self, cycles: int | None = None) -> int:
        """Let ``cycles`` (default ``poll_cycles``) pass, stopping early when the
        interrupt rises; returns the cycles run."""
        cycles = self.poll_cycles if cycles is None else int(cycles)
        if self.sim.interrupt:
            return self.sim.step(cycles)
        return self.sim.run_until_interrupt(cycles)

    def reset_accelerator(self):
        """Pulse ``ap_rst_n`` (what a PL reset from the PS does on a board)."""
        self.sim.reset()
        self._written.clear()       # the registers are back at their reset values

    def set_latency(self, latency: int):
        self.sim.set_latency(latency)

    def set_read_stall(self, stall: bool):
        self.sim.set_read_stall(stall)

    def set_memory_model(self, **kw):
        """See :meth:`NativeAggregator.set_memory_model`."""
        self.sim.set_memory_model(**kw)

    def inject_error(self, kind: str = "read", after: int = 0, resp: str = "SLVERR"):
        """See :meth:`NativeAggregator.inject_error`."""
        self.sim.inject_error(kind, after, resp)

    def stats(self) -> dict:
        """The memory's counters (bursts, beats, faults, region violations, injected
        errors, reordered bursts, row misses) since the device was made."""
        return self.sim.stats()

    @property
    def cycles(self) -> int:
        return self.sim.cycles

    def memory_faults(self) -> tuple[int, str]:
        """(number of beats outside the memory, malformed bursts and, with
        ``check_buffers``, bursts outside the configured buffers; first description)."""
        st = self.sim.stats()
        return st["faults"] + st["protocol_errors"] + st["region_violations"], self.sim.first_fault()

    def __repr__(self):
        return (f"<SimDevice {self.tag}: {self.memory.nbytes >> 20} MiB at 0x{self.mem_base:x}, "
                f"config {self.config}, latency {self.sim.latency}>")
