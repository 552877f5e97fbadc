"""Pipeline bubble and utilization on the RTL (Verilator + cocotb) against the formulas,
and SGC training steps on the RTL against golden SGC.

Balanced stages (``DIM -> DIM`` features, ``ROWS``-row microbatches, 4 x 4 MAC array per
stage), every schedule, K = 1..4 stages, m in {1, 4, 16} microbatches. For GPipe and
1F1B-flush the idle share measured from the stage counters (a core held waiting for
streaming data counts as idle) is reported beside ``(p-1)/(m+p-1)``, with ``dx_first = 0``
(the textbook order, which the formula describes: the headline, within 1 point) and with
the default ``dx_first = 1`` (``dX`` leaves before ``dW`` is computed, which shortens the
backward critical path, so the bubble is *smaller* than the textbook formula;
``schedule_timeline(..., t_dx=1)`` models it). For async 1F1B the steady-state stage
utilization (F + B + SGD cycles over the window) is reported against 0.95. Every run is
also compared bit for bit with golden.

Speed: one Verilator build per K (cached by content), all cases of a K in one simulator
process (``run_cocotb_pipeline_batch``), the K batches two at a time.

Then SGC: one epoch of Cora's classifier (all 1433 features + bias; 4 microbatches with
the host's loss gradient) on the RTL from golden epoch 0, compared bit for bit, and the
test accuracy of the golden path (bit-identical to the RTL) on Cora and CiteSeer after
the full training. And the stage split across two linked devices (Amaranth simulator).

Then timing: the Xilinx-mapped logic depth and the estimated UltraScale+ Fmax of the
``default`` build's TrainStage, its SGD pipeline and the whole Pipeline unit
(:mod:`benchmarks.pipeline_depth`: Yosys ``synth_xilinx``, the longest register-to-register
path per part), against the 250 MHz floor and the 300 MHz target.

    python -m benchmarks.bench_pipeline [OUT_DIR]   # OUT_DIR/bench_pipeline.json + .png
"""
from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gnnweave.golden.pipeline import schedule_timeline

BUILD = {"max_dim": 32, "max_rows": 16, "slots": 16}
DIM, ROWS = 32, 16
STAGES = (1, 2, 3, 4)
MICROBATCHES = (1, 4, 16)
SYNC = ("gpipe", "1f1b-flush")
BUBBLE_TOLERANCE = 0.01
ASYNC_TARGET = 0.95
SGC_TARGETS = {"cora": 0.795, "citeseer": 0.704}
DEPTH_CONFIG = "default"
DEPTH_PARTS = ("stage", "sgd", "unit")
FMAX_FLOOR_MHZ, FMAX_TARGET_MHZ = 250.0, 300.0


def _cases(p: int) -> list[dict]:
    cases = []
    for m in MICROBATCHES:
        for sched in SYNC:
            for dxf in (1, 0):
                cases.append(dict(microbatches=m, schedule=sched, steps=1, dx_first=dxf))
        cases.append(dict(microbatches=m, schedule="1f1b-async", steps=1, dx_first=1))
    # momentum 0: the cases share one simulator and the velocity memory is not host-clearable
    return [{**c, "dim": DIM, "rows": ROWS, "seed": p * 100 + c["microbatches"], "momentum": 0.0}
            for c in cases]


def _bubble_rows(p: int) -> list[dict]:
    from gnnweave.sim.pipeline_bench import run_cocotb_pipeline_batch
    t0 = time.perf_counter()
    out = []
    for s in run_cocotb_pipeline_batch(p, _cases(p), build=BUILD):
        row = {"stages": p, "microbatches": s["microbatches"], "schedule": s["schedule"],
               "dx_first": s["dx_first"], "steps": s["steps"], "match": s["match"],
               "cycles": s["cycles"], "mac_utilization": round(s["mac_utilization"], 4),
               "bubble_fraction": round(s["bubble_fraction"], 4),
               "bubble_formula": round(s["bubble_formula"], 4),
               "steady_state_utilization": s["steady_state_utilization"],
               "cycles_per_s": s["cycles_per_s"]}
        if s["schedule"] != "1f1b-async":
            row["bubble_model"] = round(schedule_timeline(
                s["schedule"], p, s["microbatches"], t_f=1, t_b=2,
                t_dx=1 if s["dx_first"] else None).bubble_fraction, 4)
            row["within_1pp_of_formula"] = abs(s["bubble_fraction"] - s["bubble_formula"]) <= BUBBLE_TOLERANCE
        out.append(row)
    out.append({"batch_seconds": round(time.perf_counter() - t0, 1), "stages": p})
    return out


def _sgc_rtl() -> dict:
    from gnnweave.sim.pipeline_bench import verify_sgc_rtl
    try:
        return verify_sgc_rtl("cora", start_epoch=0, rtl_epochs=1, lanes=8)
    except FileNotFoundError as exc:
        return {"skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001 - keep the bubble table when this part fails
        return {"error": f"{type(exc).__name__}: {exc}"}


def _depth(part: str) -> dict:
    """Estimated Fmax of one part of the ``DEPTH_CONFIG`` build: its slowest path (the
    part's figure), and the slowest path ending in each of its submodules."""
    from benchmarks.pipeline_depth import measure
    r = measure(part, DEPTH_CONFIG)
    paths = {u: v for u, v in r["depth"].items() if "est_fmax_mhz" in v}
    worst = min(paths, key=lambda u: paths[u]["est_fmax_mhz"])
    w = paths[worst]
    return {"config": DEPTH_CONFIG, "est_fmax_mhz": w["est_fmax_mhz"], "worst_unit": worst,
            "lut_levels": w["lut_levels"], "carry_cells": w["carry_cells"], "muxf": w["muxf"],
            "dsp_in_path": w["dsp_in_path"], "delay_ns": w["delay_ns"],
            "path": [w.get("from_net"), w.get("to_net")],
            "meets_floor": w["est_fmax_mhz"] >= FMAX_FLOOR_MHZ,
            "meets_target": w["est_fmax_mhz"] >= FMAX_TARGET_MHZ,
            "units_mhz": {u: v["est_fmax_mhz"] for u, v in sorted(paths.items())},
            "resources": r["resources"], "seconds": r["seconds"]}


def _depth_or_error(part: str) -> dict:
    try:
        return _depth(part)
    except Exception as exc:  # noqa: BLE001 - keep the bubble table when synthesis fails
        return {"error": f"{type(exc).__name__}: {exc}"}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    for ax, sched in zip(axes, SYNC):
        for dxf, marker in ((0, "o"), (1, "^")):
            pts = [r for r in rows if r["schedule"] == sched and r["dx_first"] == dxf]
            pts.sort(key=lambda r: (r["stages"], r["microbatches"]))
            ax.scatter([r["bubble_formula"] for r in pts], [r["bubble_fraction"] for r in pts],
                       marker=marker, label=f"measured, dx_first={dxf}" +
                       (" (textbook order)" if not dxf else ""))
            for r in pts if dxf == 0 else []:
                ax.annotate(f"K{r['stages']} m{r['microbatches']}",
                            (r["bubble_formula"], r["bubble_fraction"]), fontsize=7,
                            xytext=(3, -8), textcoords="offset points")
        ax.plot([0, 0.8], [0, 0.8], "k-", lw=0.8, label="(p-1)/(m+p-1)")
        ax.fill_between([0, 0.8], [-0.01, 0.79], [0.01, 0.81], color="grey", alpha=0.25,
                        label="formula +/- 1 point")
        ax.set_title(f"{sched}: {DIM}-wide stages, {ROWS}-row microbatches")
        ax.set_xlabel("formula bubble (p-1)/(m+p-1)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("measured bubble (stage cycle counters)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(out_dir=None, *, with_sgc: bool = True, with_depth: bool = True) -> dict:
    out_dir = Path(out_dir) if out_dir else None
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        # synthesis first: the unit's is the longest job
        depth = {part: pool.submit(_depth_or_error, part) for part in DEPTH_PARTS} if with_depth else {}
        futures = [pool.submit(_bubble_rows, p) for p in reversed(STAGES)]   # longest first
        sgc_rtl = pool.submit(_sgc_rtl) if with_sgc else None
        batches = [f.result() for f in futures]
        sgc_rtl_result = sgc_rtl.result() if sgc_rtl else None
        depth = {part: f.result() for part, f in depth.items()}
    rows = [r for b in batches for r in b if "batch_seconds" not in r]
    rows.sort(key=lambda r: (r["schedule"], r["dx_first"], r["stages"], r["microbatches"]))
    sync = [r for r in rows if r["schedule"] != "1f1b-async"]
    steady = [r for r in rows if r["schedule"] == "1f1b-async" and r["microbatches"] == 16
              and r["stages"] > 1]
    result = {
        "bench": "pipeline", "dim": DIM, "rows": ROWS, "build": BUILD, "cases": rows,
        "batch_seconds": {f"K={b[-1]['stages']}": b[-1]["batch_seconds"] for b in batches},
        "rtl_seconds": round(time.perf_counter() - t0, 1),
        "all_match": all(r["match"] for r in rows),
        "textbook_within_1pp": all(r["within_1pp_of_formula"] for r in sync if not r["dx_first"]),
        "dx_first_within_1pp": all(r["within_1pp_of_formula"] for r in sync if r["dx_first"]),
        "max_bubble_error_textbook": max(abs(r["bubble_fraction"] - r["bubble_formula"])
                                         for r in sync if not r["dx_first"]),
        "max_bubble_error_dx_first": max(abs(r["bubble_fraction"] - r["bubble_formula"])
                                         for r in sync if r["dx_first"]),
        "async_steady_utilization_m16": {f"K={r['stages']}": r["steady_state_utilization"]
                                         for r in steady},
        "async_steady_utilization": min(r["steady_state_utilization"] or 0 for r in steady),
    }
    if depth:
        result["depth"] = depth
        result["fmax_floor_mhz"], result["fmax_target_mhz"] = FMAX_FLOOR_MHZ, FMAX_TARGET_MHZ
    if sgc_rtl_result is not None:
        result["sgc_rtl"] = sgc_rtl_result
    if with_sgc:
        from gnnweave.golden.sgc import train_sgc
        result["sgc"] = {}
        for name, target in SGC_TARGETS.items():
            try:
                r = train_sgc(name)
            except FileNotFoundError as exc:
                result["sgc"][name] = {"skipped": str(exc)}
                continue
            result["sgc"][name] = {"test_accuracy": r.test_accuracy, "target": target,
                                   "meets_target": r.test_accuracy >= target,
                                   "path": "golden (bit-identical to the RTL)"}
        from gnnweave.sim.pipeline_bench import verify_split_pipeline
        split = verify_split_pipeline((2, 2), 3, "1f1b-async", steps=2, link_delays=(1, 9), dim=4,
                                      rows=4, seed=21, simulator="amaranth")
        result["split_devices"] = {"devices": split["devices"], "match": split["match"],
                                   "simulator": "amaranth", "single_cycles": split["single"]["cycles"],
                                   "split": split["split"]}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        plot(rows, out_dir / "bench_pipeline_bubble.png")
        result["plot"] = str(out_dir / "bench_pipeline_bubble.png")
    return result


def table(result: dict) -> str:
    lines = ["schedule    dx K  m  measured formula model  match",
             "-" * 52]
    for r in result["cases"]:
        if r["schedule"] == "1f1b-async":
            u = r["steady_state_utilization"]
            lines.append(f"{r['schedule']:<11} -  {r['stages']} {r['microbatches']:>2}  steady-state "
                         f"utilization {u if u is None else round(u, 4)}  {r['match']}")
        else:
            lines.append(f"{r['schedule']:<11} {r['dx_first']}  {r['stages']} {r['microbatches']:>2}  "
                         f"{r['bubble_fraction']:.4f}   {r['bubble_formula']:.4f}  "
                         f"{r['bubble_model']:.4f} {r['match']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else Path("benchmarks/results/pipeline")
    result = run(out_dir)
    (out_dir / "bench_pipeline.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(table(result))
    for part, d in result.get("depth", {}).items():
        print(f"{part:<6} est. UltraScale+ Fmax {d.get('est_fmax_mhz', d.get('error'))} MHz "
              f"(worst path in {d.get('worst_unit')})")
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, default=str))
    ok = result["all_match"] and result["textbook_within_1pp"] and \
        result["async_steady_utilization"] >= ASYNC_TARGET
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
