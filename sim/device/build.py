"""The native build of the simulated device: the Verilated top (:mod:`.top`) and the C++
harness of ``sim/native/`` compiled into one shared library, once per content.

:func:`build_native` caches the library under ``build/native/<config>-<key>/``, ``key``
hashing everything it is made from (:func:`build_plan`): Verilator and its options, the C++
flags, profile-guided optimisation, the CPU, the Verilog, the wrapper and the harness.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .top import SIM_TOP, UNITS_HEADER, sim_top_verilog, simulated_top, unit_values, units_header

REPO_ROOT = Path(__file__).resolve().parents[2]
NATIVE_DIR = REPO_ROOT / "sim" / "native"
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


class NativeBuildError(RuntimeError):
    """The native harness could not be built (the message has the log tail)."""


@dataclass(frozen=True)
class NativeBuild:
    """A built library: its path, the hardware configuration, the bus width, the cache key,
    whether it came from the cache and how long it took to build."""

    library: Path
    config: str
    bus_bytes: int
    key: str
    cached: bool
    build_seconds: float


def bus_bytes(config: str) -> int:
    """Bytes per AXI data beat of the named build."""
    from gnnweave.hw.configs import get_config
    return get_config(config).bytes_per_beat


def pgo_enabled() -> bool:
    """``$GNNWEAVE_NATIVE_PGO=0`` builds without profile-guided optimisation (one compile
    instead of two, about 15-20 % slower simulation)."""
    return os.environ.get("GNNWEAVE_NATIVE_PGO", "1") != "0"


#: Default C++ flags of the model and harness (``$GNNWEAVE_NATIVE_OPT`` replaces them): the
#: build is local and cached per CPU (:func:`cpu_identity` is part of the cache key), so it
#: may use every instruction this CPU has.
DEFAULT_NATIVE_OPT = "-O3 -march=native"


def cpu_identity() -> str:
    """What ``-march=native`` compiles for: the first CPU's model and feature flags. In the
    build's cache key, so a build directory copied to (or shared with) another kind of CPU
    is rebuilt rather than loaded and stopped by an illegal instruction."""
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
    units_header: str
    sources: tuple
    bus_bytes: int
    cflags: str
    ldflags: str
    make_opts: str
    pgo: bool


def build_plan(config: str) -> _BuildPlan:
    """The inputs of :func:`build_native` for ``config`` and their cache key: Verilator and
    its options, C++ flags, PGO, the CPU (see :func:`cpu_identity`), the Verilog and the
    harness sources (with the header naming the build's unit clocks, :func:`.top.units_header`)."""
    from gnnweave.sim import toolchain

    tool = toolchain.setup_verilator()
    verilog, top = simulated_top(config)
    beat = bus_bytes(config)
    sources = sorted(NATIVE_DIR.glob("*.cpp")) + sorted(NATIVE_DIR.glob("*.h"))
    # $GNNWEAVE_NATIVE_OPT: C++ optimisation of the model and harness (DEFAULT_NATIVE_OPT):
    # the level goes to the per-cycle code only, further flags (-march=native) everywhere
    opt = os.environ.get("GNNWEAVE_NATIVE_OPT", DEFAULT_NATIVE_OPT).split() or ["-O3"]
    level = opt[0] if opt[0].startswith("-O") else "-O3"
    extra = " ".join(opt[1:] if opt[0].startswith("-O") else opt)
    pgo = pgo_enabled()
    # hidden symbols: calls inside the library skip the PLT (the gw_* entry points are
    # exported); link-time optimisation inlines across the model's files (5-10 % faster)
    cflags = f"-fPIC -fvisibility=hidden -flto=auto -DBUS_BYTES={beat} {extra}".strip()
    # the link does the link-time optimisation's code generation: the same target flags
    ldflags = f"-shared -flto=auto {extra}".strip()
    # OPT_SLOW: Verilator's run-once code (initial settle, constant pools): -O1 cuts the
    # compile time and costs nothing per cycle
    make_opts = f"OPT_FAST={level} OPT_SLOW=-O1 OPT_GLOBAL=-O2"
    h = hashlib.sha256()
    for part in (top, json.dumps(VERILATOR_ARGS), cflags, ldflags, make_opts, f"pgo={pgo}",
                 tool.version, cpu_identity()):
        h.update(part.encode() + b"\0")
    verilog_text = Path(verilog).read_text()
    wrapper = sim_top_verilog(verilog_text, top)
    header = units_header(unit_values(verilog_text, top))
    for text in (verilog_text, wrapper, header):
        h.update(text.encode() + b"\0")
    for s in sources:
        h.update(s.name.encode() + b"\0" + s.read_bytes() + b"\0")
    return _BuildPlan(h.hexdigest()[:16], tool, Path(verilog), top, wrapper, header,
                      tuple(sources), beat, cflags, ldflags, make_opts, pgo)


def build_native(config: str = "small", *, force: bool = False,
                 build_root: Path | None = None) -> NativeBuild:
    """Build (or find cached) ``libgnnweave_sim.so`` for a named hardware config.

    With PGO (the default, see :func:`pgo_enabled`) the model is compiled twice: once
    instrumented, run on a short training workload in a child process (all reductions,
    weighted and not; :func:`~.jobs.pgo_train`), then again with the recorded profile. The
    profile only steers code layout and inlining; the simulated behaviour is the same."""
    from gnnweave.sim import runner

    plan = build_plan(config)
    key, tool, verilog, top, wrapper, sources = (plan.key, plan.tool, plan.verilog, plan.top,
                                                 plan.wrapper, plan.sources)
    beat, cflags, ldflags, make_opts, pgo = (plan.bus_bytes, plan.cflags, plan.ldflags,
                                             plan.make_opts, plan.pgo)
    root = Path(build_root) if build_root is not None else BUILD_ROOT
    out = root / f"{config}-{key}"
    lib = out / "libgnnweave_sim.so"
    stamp = out / "build.json"
    with runner.file_lock(root / f".{config}-{key}.lock"):
        if stamp.is_file() and lib.is_file() and not force:
            info = json.loads(stamp.read_text())
            return NativeBuild(lib, config, beat, key, True, info["build_seconds"])
        if out.exists():
            shutil.rmtree(out)
        (out / "src").mkdir(parents=True)
        shutil.copy2(verilog, out / "src" / f"{top}.v")
        (out / "src" / f"{SIM_TOP}.v").write_text(wrapper)
        (out / "src" / UNITS_HEADER).write_text(plan.units_header)
        copies = []
        for s in sources:
            shutil.copy2(s, out / "src" / s.name)
            if s.suffix == ".cpp":
                copies.append(str(out / "src" / s.name))
        obj = out / "obj"
        log = out / "build.log"

        steps = 3 if pgo else 1

        def verilate(extra_cflags: str, extra_ldflags: str, target: Path, step: int, what: str):
            cmd = [str(tool.executable), "--cc", "--exe", "--build", "-j", "2",
                   *VERILATOR_ARGS, "--top-module", SIM_TOP, "--Mdir", str(obj),
                   "-CFLAGS", f"{cflags} {extra_cflags}".strip(),
                   "-LDFLAGS", f"{ldflags} {extra_ldflags}".strip(),
                   "-MAKEFLAGS", make_opts, "-o", str(target),
                   str(out / "src" / f"{SIM_TOP}.v"), str(out / "src" / f"{top}.v"), *copies]
            _logged(cmd, log, target, f"native build of {config} ({step}/{steps}): Verilator and "
                    f"C++ compile{what}")
            return cmd

        start = time.perf_counter()
        log.write_text("")
        cmds = []
        if pgo:
            trained = out / "libgnnweave_sim-pgo-gen.so"
            cmds.append(verilate("-fprofile-generate -fprofile-update=single",
                                 "-fprofile-generate", trained, 1, ", instrumented for PGO"))
            train = [sys.executable, "-c", "import sys; from gnnweave.sim.device.jobs import "
                     "pgo_train; pgo_train(sys.argv[1], sys.argv[2])", str(trained), config]
            _logged(train, log, None, f"native build of {config} (2/3): profile run")
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
                                 if profiled else "", "", lib, 3, " from the profile"))
            pgo = profiled
        else:
            cmds.append(verilate("", "", lib, 1, ""))
        seconds = time.perf_counter() - start
        stamp.write_text(json.dumps({"config": config, "build_seconds": seconds, "pgo": pgo,
                                     "verilog": str(verilog), "cmds": cmds}, indent=1))
        return NativeBuild(lib, config, beat, key, False, seconds)


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

