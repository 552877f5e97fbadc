"""``gnnweave build lint``: ``verilator --lint-only -Wall`` on the generated Verilog."""
from __future__ import annotations

import sys

from gnnweave.clitools import emit, output_folder


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="default", help="the build (gnnweave/buildconfig.py)")
    parser.add_argument("--out", default=None,
                        help="folder to write the Verilog to first (default: the simulators' "
                             "cached Verilog, regenerated only when the RTL changed)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(a) -> int:
    from gnnweave.buildconfig import BuildConfigError, get_build
    from gnnweave.errors import InputError
    from gnnweave.hw.accelerator import ACCELERATOR_TOP
    from gnnweave.progress import stage
    from gnnweave.sim.lint import lint_verilog
    try:
        get_build(a.config)
    except BuildConfigError as exc:
        raise InputError(f"--config: {exc}") from None
    if a.out:
        from gnnweave.hw.flow.verilog import write_accelerator_verilog
        path = write_accelerator_verilog(a.config, output_folder("--out", a.out))
    else:
        from gnnweave.sim.accelerator_bench import accelerator_verilog
        path = accelerator_verilog(a.config)
    with stage(f"verilator --lint-only of {a.config}"):
        report = lint_verilog(path, ACCELERATOR_TOP)
    emit(report, a.json, ("clean", "warnings", "waived", "waiver_file"))
    if not report["clean"]:
        print(report["log"], file=sys.stderr)
    return 0 if report["clean"] else 1
