"""``make lint`` with this room's Verilator (:mod:`.toolchain`): the lint itself and its
waivers are the build flow's (:mod:`gnnweave.hw.flow.lint`)."""
from __future__ import annotations

from pathlib import Path

from gnnweave.hw.flow.lint import WAIVERS
from gnnweave.hw.flow.lint import lint_verilog as _lint

from . import toolchain


def lint_verilog(path, top: str, *, waivers: Path | None = WAIVERS) -> dict:
    """Run ``verilator --lint-only -Wall``; returns {clean, warnings, waived, log}."""
    return _lint(path, top, verilator=toolchain.setup_verilator().executable, waivers=waivers)
