"""``gnnweave build lint``: ``verilator --lint-only -Wall`` on the generated Verilog."""
from __future__ import annotations

import sys

from gnnweave.clitools import add_config_option, emit, named_build, output_folder


def add_arguments(parser) -> None:
    add_config_option(parser)
    parser.add_argument("--out", default=None,
                        help="folder to write the Verilog to first (default: the simulators' "
                             "cached Verilog, regenerated only when the RTL changed)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(a) -> int:
    from gnnweave.hw.accelerator import ACCELERATOR_TOP
    from gnnweave.progress import stage
    from gnnweave.sim.lint import lint_verilog
    named_build(a.config)
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
