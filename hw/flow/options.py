"""Command-line options of the build flow's commands, without Amaranth: ``gnnweave build
...`` declares them from here without importing the toolchain, and the flow modules'
own ``python -m`` entry points (:mod:`gnnweave.hw.commands.standalone`) from the same
functions. The estimate's options are :mod:`.estimate_options`."""
from __future__ import annotations

from .estimate_options import add_arguments as add_estimate_options  # noqa: F401

#: the boards of bitstreams/boards.json, for the help text
BOARD_HELP = "zcu104 | kv260 | ultra96v2 | pynqz2 | alveo-u250"


def add_bitstream_options(parser) -> None:
    """The options of a bitstream build besides the board (``gnnweave build bitstream``
    names it ``--board``, ``python -m gnnweave.hw.flow.bitstream`` takes it first)."""
    parser.add_argument("--out", default=None,
                        help="project folder (default: build/bitstream/BOARD)")
    parser.add_argument("--script-only", action="store_true",
                        help="write the project script, do not run Vivado")
