"""Open-flow ECP5 post-route Fmax of the Aggregator, the MacArray and the Pipeline.

Each unit of the smallest named build that has it (the builds in
``gnnweave.buildconfig.BUILDS`` order, the smallest first) is synthesised with
``synth_ecp5`` inside a port wrapper and placed and routed on an LFE5U-85F by nextpnr-ecp5
(``gnnweave.hw.flow.estimate.ecp5_timing``; docs/estimate.md says what the figure can
tell). Target: >= 100 MHz post-route for each. A run cut by its wall-clock limit records
nextpnr's post-placement estimate and says so (``stage``, ``stopped``).

    python -m benchmarks.bench_timing [OUT_DIR] [--units aggregator,mac_array]
        [--pnr-limit SECONDS] [--pnr-cpu-limit SECONDS] [--config NAME] [--seed N]
                                                       # OUT_DIR/bench_timing.json

``--seed`` picks nextpnr's placement seed (1 unless given; each unit's entry records it):
another seed is another placement, for a unit whose routing does not converge with one.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TARGET_MHZ = 100.0
UNITS = ("aggregator", "mac_array", "pipeline")
DEVICE = "85k"


def smallest_build(unit: str) -> str:
    """The first build in ``BUILDS`` (smallest first) with ``unit``."""
    from gnnweave.buildconfig import BUILDS
    for name, build in BUILDS.items():
        if getattr(build, unit) is not None:
            return name
    raise ValueError(f"no build has a {unit}")


def time_unit(unit: str, config: str, *, pnr_limit_s: float, log_dir: Path | None,
              pnr_cpu_limit_s: float | None = None, seed: int = 1) -> dict:
    from gnnweave.hw.flow.estimate import (component_rtlil, config_top, ecp5_timing,
                                           timing_units, tools_cpu_seconds)
    t0, cpu0 = time.monotonic(), tools_cpu_seconds()
    component, name = config_top(config)
    design = component_rtlil(component, name)
    module = timing_units(design, name)[unit]
    res = ecp5_timing(design, module, device=DEVICE, target_mhz=TARGET_MHZ, seed=seed,
                      route=True, pnr_limit_s=pnr_limit_s, pnr_cpu_limit_s=pnr_cpu_limit_s,
                      progress=False,
                      log_path=None if log_dir is None else log_dir / f"{unit}.nextpnr.log")
    fmax = min(res["fmax_mhz"].values()) if res.get("fmax_mhz") else None
    return {"unit": unit, "config": config, "module": module, "seed": seed, "fmax_mhz": fmax,
            "stage": res.get("stage"), "stopped": res.get("stopped"),
            "meets_target": None if fmax is None or res.get("stage") != "post-route"
            else fmax >= TARGET_MHZ,
            "printed": res["printed"], "promoted_nets": res.get("promoted_nets"),
            "packed_multipliers": res.get("packed_multipliers"),
            "slow_endpoints": res.get("slow_endpoints"),
            "seconds": res["seconds"],
            "wall_s": round(time.monotonic() - t0, 1),
            "tools_cpu_s": round(tools_cpu_seconds() - cpu0, 1)}


def run(out_dir: Path | None = None, units=UNITS, *, pnr_limit_s: float = 7200.0,
        config: str | None = None, pnr_cpu_limit_s: float | None = None, seed: int = 1) -> dict:
    out_dir = Path(out_dir) if out_dir is not None else None
    from gnnweave.hw.flow.report import source_commit
    commit = source_commit()
    result = {"label": "open-flow ECP5 post-route Fmax (not a Xilinx timing figure)",
              "device": "LFE5U-85F", "target_mhz": TARGET_MHZ, "commit": commit,
              "load_average_start": round(os.getloadavg()[0], 2), "units": {}}
    for unit in units:
        print(f"ECP5 place and route of {unit} ...", file=sys.stderr)
        result["units"][unit] = time_unit(unit, config or smallest_build(unit),
                                          pnr_limit_s=pnr_limit_s, log_dir=out_dir,
                                          pnr_cpu_limit_s=pnr_cpu_limit_s, seed=seed)
        if out_dir is not None:        # keep what is done if a later unit is cut short
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "bench_timing.json").write_text(json.dumps(result, indent=1) + "\n")
    result["load_average_end"] = round(os.getloadavg()[0], 2)
    if out_dir is not None:
        (out_dir / "bench_timing.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_timing",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="benchmarks/results/timing")
    ap.add_argument("--units", default=",".join(UNITS))
    ap.add_argument("--pnr-limit", type=float, default=7200.0,
                    help="wall-clock seconds each nextpnr run may take")
    ap.add_argument("--pnr-cpu-limit", type=float, default=None,
                    help="also stop each nextpnr run after this many seconds of its own CPU "
                         "time (the same limit on a loaded machine)")
    ap.add_argument("--config", default=None, help="one build for every unit")
    ap.add_argument("--seed", type=int, default=1, help="nextpnr's placement seed (default 1)")
    a = ap.parse_args(argv)
    units = tuple(u for u in a.units.split(",") if u)
    bad = [u for u in units if u not in UNITS]
    if bad:
        print(f"error: --units {','.join(bad)}: choose from {', '.join(UNITS)}", file=sys.stderr)
        return 2
    if a.seed < 1:
        print(f"error: --seed {a.seed}: must be 1 or more", file=sys.stderr)
        return 2
    res = run(Path(a.out_dir), units, pnr_limit_s=a.pnr_limit, config=a.config,
              pnr_cpu_limit_s=a.pnr_cpu_limit, seed=a.seed)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
