"""``gnnweave plan``: pipeline stages, op placement and row split (:mod:`gnnweave.host.planner`,
which owns the options)."""
from __future__ import annotations

from gnnweave.clitools import positive, print_json


def add_arguments(parser) -> None:
    from gnnweave.host.planner import add_plan_arguments
    add_plan_arguments(parser)


def run(args) -> int:
    from gnnweave.host.planner import plan_from_args
    positive("--hidden", args.hidden)
    positive("--layers", args.layers)
    report = plan_from_args(args)
    if args.json:
        print_json({k: v for k, v in report.items() if k != "text"})
    else:
        print(report.get("text", ""))
        if "out" in report:
            print(f"wrote {report['out']}" + (f" and {report['plot']}" if "plot" in report else ""))
    return 0
