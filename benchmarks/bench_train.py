"""Training accuracy and speed: GCN on Cora and CiteSeer, float and fixed point, 5 seeds.

Targets (Kipf & Welling, ICLR 2017, Table 2: GCN 81.5 % Cora, 70.3 % CiteSeer; 2 layers, 16
hidden, dropout 0.5, lr 0.01, weight decay 5e-4, 200 epochs, row-normalised features, test
accuracy after the last epoch, mean of 5 seeds):

* float GCN (``cpu`` executor) >= 80.5 % on Cora and >= 69.5 % on CiteSeer;
* the fixed-point path (``fpga-emu``: 16-bit dynamic fixed point through the golden
  Aggregator and MacArray models) within 1.5 points of float on each.

Also measured on Cora: the fixed-point path with a-priori output ranges
(``dense_range='bound'``, 5 seeds); one seed each of GraphSAGE and SGC; a partitioned GCN (aggregation
split over ``cpu`` and ``fpga-emu`` by edge count, with the timeline PNG and partition
table); mini-batch GCN (fan-outs 10, 10) with and without the background prefetcher.

Run: ``python -m benchmarks.bench_train [out_dir]``; writes ``train.json`` (and the
partitioned run's ``timeline.png`` / ``partition.txt`` under ``out_dir/partitioned``).
A cost model JSON in ``$GNNWEAVE_COST_MODEL`` fills ``predicted_vs_measured``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from gnnweave.host.train import TrainConfig, run_training

SEEDS = 5
FLOAT_TARGET = {"cora": 0.805, "citeseer": 0.695}
FIXED_POINT_MAX_GAP = 0.015


def _have(name: str) -> bool:
    from gnnweave.datasets import DatasetNotFoundError, load_dataset
    try:
        load_dataset(name)
        return True
    except DatasetNotFoundError:
        if os.environ.get("GNNWEAVE_REQUIRE_DATA") == "1":
            raise
        return False


def _summary(r: dict, wall: float) -> dict:
    return dict(test_acc_mean=r["test_acc_mean"], test_acc_std=r["test_acc_std"],
                per_seed=[s["test_acc"] for s in r["seeds"]], epoch_seconds=r["epoch_seconds"],
                saturations=r["saturations"], wall_seconds=wall)


def _run(**kw) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = run_training(TrainConfig(progress=False, **kw))
    return r, time.perf_counter() - t0


def run(out_dir) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cost_model = os.environ.get("GNNWEAVE_COST_MODEL")
    report: dict = dict(seeds=SEEDS, targets=dict(float=FLOAT_TARGET,
                                                  fixed_point_max_gap=FIXED_POINT_MAX_GAP),
                        accuracy={}, passed=True, skipped=[])
    for ds in ("cora", "citeseer"):
        if not _have(ds):
            report["skipped"].append(ds)
            continue
        entry = {}
        for label, device in (("float", "cpu"), ("fixed_point", "fpga-emu")):
            r, wall = _run(dataset=ds, model="gcn", device=device, seeds=SEEDS)
            entry[label] = dict(_summary(r, wall), device=device,
                                config=dict(dataset=ds, model="gcn", device=device,
                                            seeds=SEEDS))
        gap = entry["float"]["test_acc_mean"] - entry["fixed_point"]["test_acc_mean"]
        entry["float_meets_target"] = entry["float"]["test_acc_mean"] >= FLOAT_TARGET[ds]
        entry["fixed_point_gap"] = gap
        entry["fixed_point_within_gap"] = gap <= FIXED_POINT_MAX_GAP
        report["passed"] &= entry["float_meets_target"] and entry["fixed_point_within_gap"]
        report["accuracy"][ds] = entry

    if "cora" not in report["skipped"]:
        # the single-pass range rule (output formats from a-priori bounds: no calibration
        # pass, never saturates) instead of the exact-peak rule
        r, wall = _run(dataset="cora", model="gcn", device="fpga-emu", seeds=SEEDS,
                       executor_options={"fpga-emu": {"dense_range": "bound"}})
        report["accuracy"]["cora"]["fixed_point_bound_ranges"] = _summary(r, wall)
        others = {}
        for model in ("sage", "sgc"):
            r, wall = _run(dataset="cora", model=model, seeds=[0])
            others[model] = _summary(r, wall)
        report["other_models_cora_seed0"] = others

        part_dir = out_dir / "partitioned"
        r, wall = _run(dataset="cora", model="gcn", seeds=[0], partition="even",
                       devices=["cpu", "fpga-emu"], out_dir=str(part_dir), cost_model=cost_model)
        report["partitioned_cora"] = dict(_summary(r, wall), shares=r["shares"],
                                          partition_table=r["partition_table"], busy=r["busy"],
                                          predicted_vs_measured=r["predicted_vs_measured"],
                                          timeline_png=r.get("timeline_png"))

        mb = {}
        for prefetch in (2, 0):
            r, wall = _run(dataset="cora", model="gcn", seeds=[0], epochs=30, batch_size=32,
                           fanouts=(10, 10), prefetch=prefetch, device="fpga-emu")
            mb[f"prefetch_{prefetch}"] = dict(_summary(r, wall),
                                              overlap_s_last_epoch=r.get("prefetch_overlap_s"))
        report["minibatch_cora_fpga_emu_30_epochs"] = mb
    (out_dir / "train.json").write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    result = run(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    print(json.dumps({k: result[k] for k in ("accuracy", "passed", "skipped")}, indent=1,
                     default=str))
