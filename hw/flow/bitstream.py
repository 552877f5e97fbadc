"""Vivado project for a board: Verilog + a batch TCL script (templates in bitstreams/tcl/).

``write_project(board, out_dir)`` writes ``<out_dir>/src/gnnweave.v`` (the accelerator top of the
board's configuration, :mod:`.accelerator`) and ``<out_dir>/build_<board>.tcl``; the script packages the Verilog as IP
(``ipx::infer_core``), builds the block design with the PS and one HP port, runs
synthesis/implementation/write_bitstream and copies ``gnnweave.bit`` + ``gnnweave.hwh`` to
``bitstreams/<board>/``. ``run(board)`` runs it when ``vivado`` is on PATH.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .boards import Board, get_board
from ..configs import get_config, get_mac_config, get_pipeline_config
from ..accelerator import ACCELERATOR_TOP, INSTANCE_NAME, build_regmap, unit_registers
from ..pipeline_unit import HWH_LIMITS
from .verilog import write_accelerator_verilog

REPO_ROOT = Path(__file__).resolve().parents[2]
TCL_DIR = REPO_ROOT / "bitstreams" / "tcl"
BITSTREAMS_DIR = REPO_ROOT / "bitstreams"

# Vivado board-file names differ from the catalogue keys; used as a glob, only when installed.
BOARD_PART_GLOB = {"zcu104": "zcu104", "kv260": "kv260_som", "ultra96v2": "ultra96v2",
                   "pynqz2": "pynq-z2", "alveo-u250": "u250"}

_ZYNQMP_HP = re.compile(r"S_AXI_HP([0-3])_FPD$")
_ZYNQ7_HP = re.compile(r"S_AXI_HP([0-3])$")


class VivadoNotFoundError(RuntimeError):
    """``vivado`` is not on PATH: the generated script must be run elsewhere."""


def _ps_slave_config(board: Board, port: str) -> tuple[str, str]:
    """(enable, data-width) CONFIG names of the PS for HP port ``port``."""
    if board.ps_type == "zynq_ultra_ps_e":
        m = _ZYNQMP_HP.match(port)
        if not m:
            raise ValueError(f"board {board.key!r}: HP port {port!r} is not S_AXI_HP<n>_FPD")
        gp = int(m.group(1)) + 2     # UG1085: HP0..HP3_FPD are S_AXI_GP2..GP5 in the PS config
        return f"PSU__USE__S_AXI_GP{gp}", f"PSU__SAXIGP{gp}__DATA_WIDTH"
    m = _ZYNQ7_HP.match(port)
    if not m:
        raise ValueError(f"board {board.key!r}: HP port {port!r} is not S_AXI_HP<n>")
    return f"PCW_USE_S_AXI_HP{m.group(1)}", f"PCW_S_AXI_HP{m.group(1)}_DATA_WIDTH"


def _fill(template: str, values: dict) -> str:
    text = (TCL_DIR / template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", str(value))
    left = re.findall(r"@[A-Z_]+@", text)
    if left:
        raise ValueError(f"bitstreams/tcl/{template}: no value for {', '.join(sorted(set(left)))}")
    return text


def _tcl_path(p: Path) -> str:
    return p.resolve().as_posix()


def script_path(board, out_dir) -> Path:
    return Path(out_dir) / f"build_{get_board(board).key}.tcl"


def write_project(board, out_dir, *, dest_dir=None, jobs: int = 4) -> Path:
    """Write the Verilog and the Vivado batch script for ``board``; returns the script path."""
    board = get_board(board)
    config = get_config(board.config)
    out_dir = Path(out_dir)
    src = out_dir / "src"
    write_accelerator_verilog(board.config, src)
    regmap = build_regmap(board.config)
    mac = get_mac_config(board.config)
    pipe = get_pipeline_config(board.config)
    units = "+".join(r.unit.name.lower() for r in unit_registers(board.config))
    ctrl_range = 1 << regmap.addr_width
    registers = "\n".join(f"    {r.name} {r.offset:#x} {r.width}" for r in regmap)
    dest = Path(dest_dir) if dest_dir is not None else BITSTREAMS_DIR / board.key
    script = script_path(board, out_dir)
    port = board.hp_ports[0]
    common = {"BOARD": board.key, "BOARD_NAME": board.name, "CONFIG": board.config,
              "BUS_WIDTH": config.bus_width, "CLOCK_MHZ": board.pl_clock_mhz,
              "HP_PORT": port.name, "IP_NAME": ACCELERATOR_TOP, "INSTANCE": INSTANCE_NAME}
    parts = [
        _fill("project.tcl", {**common, "PART": board.part, "SCRIPT": _tcl_path(script),
                              "PROJ_DIR": _tcl_path(out_dir / "vivado"), "DEST_DIR": _tcl_path(dest),
                              "JOBS": int(jobs), "BOARD_PART_GLOB": BOARD_PART_GLOB.get(board.key, board.key)}),
        _fill("package_ip.tcl", {**common, "IP_SRC": _tcl_path(src), "IP_REPO": _tcl_path(out_dir / "ip_repo"),
                                 "MAX_FEAT_DIM": config.max_feat_dim, "UNITS": units,
                                 "MAC_MAX_DEPTH": mac.max_depth if mac is not None else 0, "CTRL_RANGE": ctrl_range,
                                 # the driver's pre-device checks of the Pipeline (0: none)
                                 **{f"PIPE_{k.upper()}": getattr(pipe, k) if pipe is not None else 0
                                    for k in HWH_LIMITS},
                                 "REGISTERS": registers}),
    ]
    if board.has_ps:
        enable, width = _ps_slave_config(board, port.name)
        bd = "bd_zynqmp.tcl" if board.ps_type == "zynq_ultra_ps_e" else "bd_zynq7.tcl"
        parts.append(_fill(bd, {**common, "PS_SLAVE_ENABLE": enable, "PS_SLAVE_WIDTH": width}))
        parts.append(_fill("build.tcl", {"INSTANCE": INSTANCE_NAME, "CONTROL_BASE": f"{board.control_base:#010X}".replace("0X", "0x"),
                                         "CTRL_RANGE_BD": max(ctrl_range, 4096)}))
    else:
        parts.append(_fill("vitis_note.tcl", common))
    script.write_text("\n".join(parts))
    return script


def run(board, out_dir=None, *, vivado: str = "vivado") -> Path:
    """Write the project and run Vivado in batch mode; returns ``bitstreams/<board>/gnnweave.bit``."""
    board = get_board(board)
    out_dir = Path(out_dir) if out_dir is not None else REPO_ROOT / "build" / "bitstream" / board.key
    script = write_project(board, out_dir)
    exe = shutil.which(vivado)
    if exe is None:
        raise VivadoNotFoundError(
            f"vivado is not on PATH; run `vivado -mode batch -source {script}` on a machine with "
            f"Vivado (the script and its Verilog are in {out_dir})")
    subprocess.run([exe, "-mode", "batch", "-nojournal", "-source", str(script)],
                   cwd=out_dir, check=True, env=os.environ.copy())
    return BITSTREAMS_DIR / board.key / "gnnweave.bit"


def main(argv=None) -> int:
    """``python -m gnnweave.hw.flow.bitstream BOARD [--out DIR] [--script-only]``"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gnnweave.hw.flow.bitstream",
                                 description="Vivado project and bitstream for a board")
    ap.add_argument("board")
    ap.add_argument("--out", help="project folder (default build/bitstream/<board>)")
    ap.add_argument("--script-only", action="store_true", help="write the script, do not run Vivado")
    args = ap.parse_args(argv)
    try:
        board = get_board(args.board)
        out = Path(args.out) if args.out else REPO_ROOT / "build" / "bitstream" / board.key
        if args.script_only:
            print(write_project(board, out))
        else:
            print(run(board, out))
    except (ValueError, VivadoNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: vivado failed with exit status {e.returncode} (log in {out})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
