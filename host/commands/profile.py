"""``gnnweave profile``: measure devices and fit the cost model (:mod:`gnnweave.host.profiler`)."""
from __future__ import annotations

from gnnweave.clitools import device_list, emit, output_folder
from gnnweave.errors import InputError


def add_arguments(parser) -> None:
    parser.add_argument("--devices", nargs="+", required=True, metavar="NAME[*COUNT]",
                        help="the devices to measure, separated by commas or spaces (e.g. "
                             "cpu,fpga-emu; NAME*COUNT as in gnnweave plan)")
    parser.add_argument("--out", default=None,
                        help="folder for cost_model.json (train --cost-model reads it) and "
                             "cost_model.png, predicted vs measured (default: nothing written)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer, smaller sizes (a minute instead of several)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    from gnnweave.host.profiler import profile_main
    devices = device_list("--devices", args.devices)
    if not devices:
        raise InputError("--devices: give at least one device, e.g. cpu,fpga-emu")
    if args.out is not None:
        output_folder("--out", args.out)
    report = profile_main(devices, args.out, args.quick)
    emit(report, args.json, ("devices", "heldout_median_rel_err", "heldout_p90_rel_err",
                             "meets_target", "seconds", "out", "plot"))
    return 0
