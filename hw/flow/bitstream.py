"""Vivado project and bitstream for a board.

The project is the Verilog and a batch TCL script (templates in bitstreams/tcl/).
``write_project(board, out_dir)`` writes ``<out_dir>/src/gnnweave.v`` (the accelerator top of
the board's configuration, :mod:`..accelerator`) and ``<out_dir>/build_<board>.tcl``; the
script packages the Verilog as IP (``ipx::infer_core``; the VLNV and the ``C_*`` parameters
the ``.hwh`` carries come from :mod:`gnnweave.contract`), builds the block design with the PS
and one HP port, runs synthesis/implementation/write_bitstream and copies ``gnnweave.bit`` +
``gnnweave.hwh`` to ``bitstreams/<board>/``. ``build_bitstream(board)`` runs it when
``vivado`` is on PATH.

``python -m gnnweave.hw.flow.bitstream BOARD [--out DIR] [--script-only]`` (also ``gnnweave
build bitstream --board BOARD``): :func:`add_arguments` and :func:`run`.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gnnweave.contract import VLNV, IpParameters
from gnnweave.errors import GnnweaveError, InputError

from .boards import Board, get_board
from .options import BOARD_HELP, add_bitstream_options
from ..configs import get_config, get_mac_config, get_pipeline_config
from ..accelerator import ACCELERATOR_TOP, INSTANCE_NAME, build_regmap, unit_registers
from .verilog import write_accelerator_verilog

REPO_ROOT = Path(__file__).resolve().parents[2]
TCL_DIR = REPO_ROOT / "bitstreams" / "tcl"
BITSTREAMS_DIR = REPO_ROOT / "bitstreams"

# Vivado board-file names differ from the catalogue keys; used as a glob, only when installed.
BOARD_PART_GLOB = {"zcu104": "zcu104", "kv260": "kv260_som", "ultra96v2": "ultra96v2",
                   "pynqz2": "pynq-z2", "alveo-u250": "u250"}

_ZYNQMP_HP = re.compile(r"S_AXI_HP([0-3])_FPD$")
_ZYNQ7_HP = re.compile(r"S_AXI_HP([0-3])$")


class VivadoNotFoundError(GnnweaveError):
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


def ip_parameters(config_name: str) -> IpParameters:
    """The limits of build ``config_name`` that the IP's ``C_*`` parameters carry into the
    ``.hwh`` (what the driver checks before a run)."""
    config = get_config(config_name)
    mac, pipe = get_mac_config(config_name), get_pipeline_config(config_name)
    return IpParameters(
        gmem_data_width=config.bus_width, max_feat_dim=config.max_feat_dim,
        mac_max_depth=mac.max_depth if mac is not None else 0,
        **{f"pipe_{k}": getattr(pipe, k) if pipe is not None else 0
           for k in IpParameters.PIPELINE_LIMITS})


def vlnv_fields() -> dict:
    """``IP_VENDOR``, ``IP_LIBRARY``, ``IP_NAME``, ``IP_VERSION`` of the contract's VLNV."""
    vendor, library, name, version = VLNV.split(":")
    if name != ACCELERATOR_TOP:
        raise ValueError(f"contract VLNV {VLNV!r} does not name the top {ACCELERATOR_TOP!r}")
    return {"IP_VENDOR": vendor, "IP_LIBRARY": library, "IP_NAME": name, "IP_VERSION": version}


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
    units = "+".join(r.unit.name.lower() for r in unit_registers(board.config))
    ctrl_range = 1 << regmap.addr_width
    registers = "\n".join(f"    {r.name} {r.offset:#x} {r.width}" for r in regmap)
    dest = Path(dest_dir) if dest_dir is not None else BITSTREAMS_DIR / board.key
    script = script_path(board, out_dir)
    port = board.hp_ports[0]
    common = {"BOARD": board.key, "BOARD_NAME": board.name, "CONFIG": board.config,
              "BUS_WIDTH": config.bus_width, "CLOCK_MHZ": board.pl_clock_mhz,
              "HP_PORT": port.name, **vlnv_fields(), "VLNV": VLNV, "INSTANCE": INSTANCE_NAME}
    parts = [
        _fill("project.tcl", {**common, "PART": board.part, "SCRIPT": _tcl_path(script),
                              "PROJ_DIR": _tcl_path(out_dir / "vivado"), "DEST_DIR": _tcl_path(dest),
                              "JOBS": int(jobs), "BOARD_PART_GLOB": BOARD_PART_GLOB.get(board.key, board.key)}),
        _fill("package_ip.tcl", {**common, "IP_SRC": _tcl_path(src), "IP_REPO": _tcl_path(out_dir / "ip_repo"),
                                 "UNITS": units, "CTRL_RANGE": ctrl_range,
                                 # the driver's checks before it touches the device (0: no such unit)
                                 "IP_PARAMETERS": " ".join(f"{name} {value}" for name, value
                                                           in ip_parameters(board.config).hwh_items()),
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


def default_out_dir(board) -> Path:
    """``build/bitstream/<board>`` of the repository."""
    return REPO_ROOT / "build" / "bitstream" / get_board(board).key


def build_bitstream(board, out_dir=None, *, vivado: str = "vivado") -> Path:
    """Write the project and run Vivado in batch mode; returns ``bitstreams/<board>/gnnweave.bit``."""
    board = get_board(board)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(board)
    script = write_project(board, out_dir)
    exe = shutil.which(vivado)
    if exe is None:
        raise VivadoNotFoundError(
            f"vivado is not on PATH; run `vivado -mode batch -source {script}` on a machine with "
            f"Vivado (the script and its Verilog are in {out_dir})")
    subprocess.run([exe, "-mode", "batch", "-nojournal", "-source", str(script)],
                   cwd=out_dir, check=True, env=os.environ.copy())
    return BITSTREAMS_DIR / board.key / "gnnweave.bit"


def add_arguments(parser) -> None:
    """``BOARD [--out DIR] [--script-only]``."""
    parser.add_argument("board", help=f"a board of bitstreams/boards.json: {BOARD_HELP}")
    add_bitstream_options(parser)


def run(args) -> int:
    """Write the project of ``args.board`` (and run Vivado unless ``args.script_only``);
    prints the script's or the bitstream's path."""
    try:
        board = get_board(args.board)
    except ValueError as exc:
        raise InputError(f"board: {exc}") from None
    out = Path(args.out) if args.out else default_out_dir(board)
    if args.script_only:
        print(write_project(board, out))
        return 0
    try:
        print(build_bitstream(board, out))
    except subprocess.CalledProcessError as e:
        print(f"error: vivado failed with exit status {e.returncode} (log in {out})", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    """``python -m gnnweave.hw.flow.bitstream BOARD [--out DIR] [--script-only]``"""
    from ..commands.standalone import main as standalone
    return standalone(sys.modules[__name__], "python -m gnnweave.hw.flow.bitstream", argv)


if __name__ == "__main__":
    sys.exit(main())
