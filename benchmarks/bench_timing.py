"""Open-flow ECP5 post-route Fmax of the Aggregator, the MacArray and the Pipeline.

Each unit of the smallest named build that has it (:func:`smallest_build`: the fewest
multipliers, then block RAMs, by the analytic budget) is synthesised with
``synth_ecp5`` inside a port wrapper and placed and routed on an LFE5U-85F by nextpnr-ecp5
(``gnnweave.hw.flow.estimate.ecp5_timing``; docs/estimate.md says what the figure can
tell). Target: >= 100 MHz post-route for each. A run cut by its wall-clock limit records
nextpnr's post-placement estimate and says so (``stage``, ``stopped``).

    python -m benchmarks.bench_timing [OUT_DIR] [--units aggregator,mac_array]
        [--pnr-limit SECONDS] [--pnr-cpu-limit SECONDS] [--config NAME] [--seed N[,N...]]
        [--speed-grade 6|7|8] [--placer-timing-weight W[,W...]]
                                                       # OUT_DIR/bench_timing.json

``--seed`` picks nextpnr's placement seed (1 unless given; each unit's entry records it):
another seed is another placement, for a unit whose routing does not converge with one.
Several seeds route each unit once per seed: the unit's entry is the best route's (a
post-route figure before any post-placement estimate), with every seed's figure in
``seeds``. One netlist's figure moves by a quarter between placements, so a change to the
RTL is judged on several. ``--placer-timing-weight`` sweeps the placer's weight of timing
against wirelength the same way (every weight with every seed; default the flow's,
``PLACER_TIMING_WEIGHT``), each route recording its weight.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

# the estimate's options, without Amaranth
from gnnweave.hw.flow.estimate_options import (DEFAULT_SPEED_GRADE, ECP5_SPEED_GRADES,
                                               PLACER_TIMING_WEIGHT)

TARGET_MHZ = 100.0
UNITS = ("aggregator", "mac_array", "pipeline")
DEVICE = "85k"


@functools.lru_cache(maxsize=1)
def unit_sizes() -> dict[str, dict[str, tuple[int, float]]]:
    """``{unit: {build: (DSPs, block RAMs)}}`` of every unit of every build that has it, by
    the analytic budget (BRAM36 and URAM together; each build elaborated once, seconds per
    build, no synthesis)."""
    from gnnweave.buildconfig import BUILDS
    from gnnweave.hw.flow.budget import budget
    sizes = {unit: {} for unit in UNITS}
    for name, build in BUILDS.items():
        units = budget(name)["units"]
        for unit in UNITS:
            if getattr(build, unit) is not None:
                res = units.get(unit, {})
                sizes[unit][name] = (res.get("dsp", 0), res.get("bram36", 0) + res.get("uram", 0))
    return sizes


def smallest_build(unit: str) -> str:
    """The build whose ``unit`` takes the fewest multipliers, then the fewest block RAMs
    (:func:`unit_sizes`; the first in ``BUILDS`` order of equals): the resources an ECP5 has
    at fixed sites only, which spread a unit over the part."""
    sizes = unit_sizes().get(unit)
    if not sizes:
        raise ValueError(f"no build has a {unit}")
    return min(sizes, key=lambda name: sizes[name])


@functools.lru_cache(maxsize=1)
def _design(config: str) -> tuple:
    """The build's RTLIL as the ECP5 flow maps it and its top's name, elaborated once for
    all of a unit's seeds."""
    from gnnweave.hw.flow.estimate import config_top, ecp5_rtlil
    component, name = config_top(config)
    return ecp5_rtlil(component, name), name


def time_unit(unit: str, config: str, *, pnr_limit_s: float, log_dir: Path | None,
              pnr_cpu_limit_s: float | None = None, seed: int = 1,
              log_name: str | None = None, speed_grade: int = DEFAULT_SPEED_GRADE,
              placer_timing_weight: int = PLACER_TIMING_WEIGHT) -> dict:
    from gnnweave.hw.flow.estimate import ecp5_timing, timing_units, tools_cpu_seconds
    t0, cpu0 = time.monotonic(), tools_cpu_seconds()
    design, name = _design(config)
    module = timing_units(design, name)[unit]
    res = ecp5_timing(design, module, device=DEVICE, speed_grade=speed_grade,
                      target_mhz=TARGET_MHZ, seed=seed, placer_timing_weight=placer_timing_weight,
                      route=True, pnr_limit_s=pnr_limit_s, pnr_cpu_limit_s=pnr_cpu_limit_s,
                      progress=False,
                      log_path=None if log_dir is None
                      else log_dir / f"{log_name or unit}.nextpnr.log")
    fmax = min(res["fmax_mhz"].values()) if res.get("fmax_mhz") else None
    return {"unit": unit, "config": config, "module": module, "seed": seed,
            "speed_grade": speed_grade, "placer_timing_weight": placer_timing_weight,
            "fmax_mhz": fmax,
            "stage": res.get("stage"), "stopped": res.get("stopped"),
            "meets_target": None if fmax is None or res.get("stage") != "post-route"
            else fmax >= TARGET_MHZ,
            "printed": res["printed"], "promoted_nets": res.get("promoted_nets"),
            "packed_multipliers": res.get("packed_multipliers"),
            "slow_endpoints": res.get("slow_endpoints"),
            "seconds": res["seconds"],
            "wall_s": round(time.monotonic() - t0, 1),
            "tools_cpu_s": round(tools_cpu_seconds() - cpu0, 1)}


def best_of_seeds(routes: list[dict]) -> dict:
    """The best of one unit's routes (one per seed): a post-route figure before a
    post-placement estimate, then the highest Fmax; with ``seeds``, each route's seed,
    stage, Fmax and late endpoints, when there was more than one."""
    def rank(route):
        return (route.get("stage") == "post-route", route.get("fmax_mhz") or 0.0)
    best = dict(max(routes, key=rank))
    if len(routes) > 1:
        best["seeds"] = [{"seed": r["seed"],
                          **({"placer_timing_weight": r["placer_timing_weight"]}
                             if "placer_timing_weight" in r else {}),
                          "stage": r.get("stage"), "fmax_mhz": r.get("fmax_mhz"),
                          "late_endpoints": (r.get("slow_endpoints") or {}).get("late")}
                         for r in routes]
    return best


def run(out_dir: Path | None = None, units=UNITS, *, pnr_limit_s: float = 7200.0,
        config: str | None = None, pnr_cpu_limit_s: float | None = None,
        seeds=(1,), speed_grade: int = DEFAULT_SPEED_GRADE,
        weights=(PLACER_TIMING_WEIGHT,)) -> dict:
    out_dir = Path(out_dir) if out_dir is not None else None
    from gnnweave.hw.flow.report import source_commit
    commit = source_commit()
    result = {"label": "open-flow ECP5 post-route Fmax (not a Xilinx timing figure)",
              "device": "LFE5U-85F", "speed_grade": speed_grade, "target_mhz": TARGET_MHZ,
              "commit": commit,
              "load_average_start": round(os.getloadavg()[0], 2), "units": {}}
    for unit in units:
        routes = []
        build = config or smallest_build(unit)
        for weight in weights:
            for seed in seeds:
                print(f"ECP5 place and route of the {unit} of {build}, seed {seed}, placer "
                      f"timing weight {weight} ...", file=sys.stderr)
                # in a sweep each route keeps its nextpnr log (unit, weight, seed)
                name = unit + (f".w{weight}" if len(weights) > 1 else "") + \
                    (f".seed{seed}" if len(seeds) > 1 else "")
                routes.append(time_unit(unit, build,
                                        pnr_limit_s=pnr_limit_s, log_dir=out_dir,
                                        pnr_cpu_limit_s=pnr_cpu_limit_s, seed=seed,
                                        speed_grade=speed_grade, placer_timing_weight=weight,
                                        log_name=name))
        result["units"][unit] = best_of_seeds(routes)
        if out_dir is not None:        # keep what is done if a later unit is cut short
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "bench_timing.json").write_text(json.dumps(result, indent=1) + "\n")
    result["load_average_end"] = round(os.getloadavg()[0], 2)
    if out_dir is not None:
        (out_dir / "bench_timing.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _whole_numbers(text: str) -> tuple[int, ...]:
    """``1,2,3`` as a tuple; empty if any is not a whole number of 1 or more or repeats."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        return ()
    return values if min(values) >= 1 and len(set(values)) == len(values) else ()


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
    ap.add_argument("--seed", default="1",
                    help="nextpnr's placement seed, or several (1,2,3): each unit routed once "
                         "per seed, its best route kept (default 1)")
    ap.add_argument("--speed-grade", type=int, default=DEFAULT_SPEED_GRADE,
                    choices=ECP5_SPEED_GRADES,
                    help="the part's speed grade (default 6, the slowest, on most boards)")
    ap.add_argument("--placer-timing-weight", default=str(PLACER_TIMING_WEIGHT),
                    help="the HeAP placer's weight of timing against wirelength, or several "
                         "(10,30): each with every seed, the best route kept (default "
                         f"{PLACER_TIMING_WEIGHT})")
    a = ap.parse_args(argv)
    units = tuple(u for u in a.units.split(",") if u)
    bad = [u for u in units if u not in UNITS]
    if bad:
        print(f"error: --units {','.join(bad)}: choose from {', '.join(UNITS)}", file=sys.stderr)
        return 2
    seeds = _whole_numbers(a.seed)
    if not seeds:
        print(f"error: --seed {a.seed}: give whole numbers of 1 or more, each once "
              "(e.g. 2 or 1,2,3)", file=sys.stderr)
        return 2
    weights = _whole_numbers(a.placer_timing_weight)
    if not weights:
        print(f"error: --placer-timing-weight {a.placer_timing_weight}: give whole numbers of "
              "1 or more, each once (e.g. 30 or 10,30)", file=sys.stderr)
        return 2
    res = run(Path(a.out_dir), units, pnr_limit_s=a.pnr_limit, config=a.config,
              pnr_cpu_limit_s=a.pnr_cpu_limit, seeds=seeds, speed_grade=a.speed_grade,
              weights=weights)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
