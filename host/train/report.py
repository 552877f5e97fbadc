"""What a training run reports: the summary dict, its files, and a text table for people."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gnnweave.graph import CSRGraph
from gnnweave.host.timeline import (
    busy_fractions, format_partition_table, interval_overlap, measured_clocks,
    partition_rows_table, plot_timeline,
)
from gnnweave.host.train.config import TrainConfig


def predicted_vs_measured(records, cost_model) -> dict | None:
    """Per device: the cost model's predicted seconds for the recorded ops vs measured.

    ``predicted_s`` sums the ops the device's model covers and ``ratio`` is measured /
    predicted over those same ops; ops it has no model for (a cpu's no-op transfers, say)
    are listed with their measured seconds under ``unmodelled``.
    """
    if cost_model is None or not hasattr(cost_model, "predict"):
        return None   # no model, or bare relative rates
    out = {}
    records = [r for r in records if r.kind != "host"]   # sampling: no device, no model
    for dev in dict.fromkeys(r.device for r in records):
        mine = [r for r in records if r.device == dev]
        entry = dict(measured_s=sum(r.measured_seconds for r in mine), predicted_s=None,
                     ratio=None)
        name = None
        for candidate in (dev, dev.partition(":")[0]):
            try:
                cost_model.device(candidate) if hasattr(cost_model, "device") else None
                name = candidate
                break
            except (ValueError, KeyError) as exc:
                entry["error"] = str(exc).splitlines()[0]
        if name is None:
            out[dev] = entry
            continue
        entry.pop("error", None)
        predicted, modelled, unmodelled, covered, last_error = 0.0, 0.0, {}, 0, None
        for r in mine:
            try:
                predicted += cost_model.predict(name, r.op, **r.sizes)
                modelled += r.measured_seconds
                covered += 1
            except (ValueError, KeyError) as exc:
                unmodelled[r.op] = unmodelled.get(r.op, 0.0) + r.measured_seconds
                last_error = str(exc).splitlines()[0]
        if covered:
            entry.update(predicted_s=predicted, measured_modelled_s=modelled,
                         ratio=modelled / predicted if predicted > 0 else None)
        elif last_error:
            entry["error"] = last_error
        if unmodelled:
            entry["unmodelled"] = unmodelled
        out[dev] = entry
    return out


def aggregation_work(records, devices) -> tuple[dict, dict]:
    """Per device of ``devices``, over the aggregate ops in ``records``: ``({device: seconds
    on its clock}, {device: (edges, rows)})``."""
    times = {d: 0.0 for d in devices}
    work = {d: (0, 0) for d in devices}
    for r in records:
        if r.op == "aggregate" and r.device in times:
            times[r.device] += r.measured_seconds
            e, n = work[r.device]
            work[r.device] = (e + int(r.sizes.get("edges", 0)), n + int(r.sizes.get("rows", 0)))
    return times, work


def summarize(config: TrainConfig, *, model: str, dataset: str, graph: CSRGraph, hp: dict,
              engine, timeline, per_seed: list[dict], interrupted: bool, rebalances: list,
              cost_model, saved_path) -> dict:
    """The JSON-ready summary of a run (test accuracy over seeds, epoch time, the split and
    what each device measured on its own clock in the last epoch), and its files under
    ``config.out_dir`` (``result.json``, ``partition.txt``, ``timeline.png``)."""
    key, name = model, dataset
    accs = [r["test_acc"] for r in per_seed if r["test_acc"] is not None]
    eps = [r["epoch_seconds"] for r in per_seed if r["epoch_seconds"] is not None]
    last_epoch = max((r.epoch for r in timeline.records), default=None) if timeline else None
    last_records = timeline.of_epoch(last_epoch) if last_epoch is not None else []
    share_map = ({d: r for d, (_, r) in engine.shards.items()} if engine.shards
                 else {config.device: (0, graph.num_nodes)})
    if engine.shards:
        # a listed device the split left without rows (a rebalance can) is shown with none
        n = graph.num_nodes
        share_map.update({d: (n, n) for d in (config.devices or []) if d not in share_map})
    measured = {dev: s.get("compute_s", 0.0) + s.get("transfer_s", 0.0)
                for dev, s in (timeline.summary(last_epoch).items() if timeline else [])}
    pvm = predicted_vs_measured(last_records, cost_model)
    # measured seconds are device time on FPGA kinds, CPU time on cpu, else wall: say which
    clocks = measured_clocks(last_records)
    ran = None
    if config.steal:   # the split is where each device starts; stealing moves rows
        ran_edges = {d: e for d, (e, _) in aggregation_work(last_records, share_map)[1].items()}
        total_ran = sum(ran_edges.values())
        ran = {d: (e / total_ran if total_ran else 0.0) for d, e in ran_edges.items()}
    table_rows = partition_rows_table(graph, share_map, measured,
                                      {d: v["predicted_s"] for d, v in pvm.items()} if pvm else None,
                                      clocks, ran)
    result = dict(
        dataset=name, model=key, device=config.device,
        mode="mini-batch" if config.batch_size is not None else "full-batch",
        hyperparameters=dict(hp, layers=config.layers, optimizer=config.optimizer,
                             batch_size=config.batch_size,
                             fanouts=list(config.fanouts) if config.batch_size else None),
        test_acc_mean=float(np.mean(accs)) if accs else None,
        test_acc_std=float(np.std(accs)) if accs else None,
        epoch_seconds=float(np.mean(eps)) if eps else None,
        shares={d: dict(lo=r["lo"], hi=r["hi"], rows=r["rows"], edges=r["edges"],
                        edge_share=r["edge_share"]) for d, r in zip(share_map, table_rows)},
        partition_table=format_partition_table(table_rows),
        predicted_vs_measured=pvm,
        measured_clock=clocks,
        busy=busy_fractions(last_records),
        saturations=sum(r.saturations for r in (timeline.records if timeline else [])),
        interrupted=interrupted,
        rebalances=rebalances if config.rebalance else None,
        steals=engine.steals if config.steal else None,
        seeds=[{k: v for k, v in r.items() if k != "history"} for r in per_seed],
        saved_model=str(saved_path) if saved_path is not None else None,
    )
    if config.batch_size is not None and timeline is not None:
        prep = [r for r in last_records if r.category in ("transfer", "host")]
        comp = [r for r in last_records if r.category == "compute"]
        # seconds of the last epoch in which preparing a batch (sampling, copying it in)
        # ran while an op computed: what the prefetcher hides
        result["prefetch_overlap_s"] = interval_overlap(prep, comp)
    if config.out_dir is not None:
        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if timeline is not None and timeline.records:
            epochs_to_plot = sorted({r.epoch for r in timeline.records if r.epoch >= 0})[-1:]
            result["timeline_png"] = str(plot_timeline(
                timeline, out / "timeline.png", epochs=epochs_to_plot,
                title=f"{key} on {name}: training step of epoch {epochs_to_plot[0] + 1}"
                      + (" (mini-batches)" if config.batch_size else "")))
        (out / "partition.txt").write_text(result["partition_table"] + "\n")
        result["histories"] = {r["seed"]: r["history"] for r in per_seed}
        (out / "result.json").write_text(json.dumps(result, indent=2, default=json_default))
        result.pop("histories")
    return result


def json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def percent(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def format_summary(report: dict) -> str:
    """A training report for people: accuracy, time per epoch, the split, what was saved."""
    hp = report.get("hyperparameters") or {}
    seeds = report.get("seeds") or []
    lines = [f"{report.get('model', '?').upper()} on {report.get('dataset')} "
             f"({report.get('mode')}, {len(seeds)} seed{'s' if len(seeds) != 1 else ''}, "
             f"{hp.get('epochs')} epochs, dense ops on {report.get('device')})"]
    acc = report.get("test_acc_mean")
    std = report.get("test_acc_std")
    lines.append(f"  test accuracy   {percent(acc)}"
                 + (f" ± {100 * std:.1f}" if std and len(seeds) > 1 else ""))
    if report.get("epoch_seconds") is not None:
        lines.append(f"  time per epoch  {1e3 * report['epoch_seconds']:.1f} ms (host wall clock)")
    if report.get("saturations"):
        lines.append(f"  saturations     {report['saturations']:,} fixed-point values clipped")
    table = report.get("partition_table")
    shares = report.get("shares") or {}
    if table and len(shares) > 1:
        lines.append("  aggregation split (last epoch):")
        lines += ["    " + row for row in str(table).splitlines()]
        idle = [d for d, share in shares.items() if not share.get("rows")]
        if idle:
            lines.append(f"  note: {', '.join(idle)} got no rows of the split (too slow for "
                         f"a share of this graph)")
    for key, label in (("saved_model", "model saved to"), ("timeline_png", "timeline")):
        if report.get(key):
            lines.append(f"  {label:<15} {report[key]}")
    return "\n".join(lines)
