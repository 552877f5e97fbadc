"""``gnnweave train``: train a GNN across devices (:mod:`gnnweave.host.train`)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from gnnweave.clitools import device_list, output_folder, print_json
from gnnweave.errors import InputError
from gnnweave.host.train.config import DEFAULT_FANOUT_BATCH_SIZE, SGD_DEFAULT_LR, TrainConfig, resolve_placement


def _ranges_arg(text: str) -> dict:
    """'cpu=0:1200,fpga-emu=1200:2708' -> {'cpu': (0, 1200), 'fpga-emu': (1200, 2708)}."""
    out = {}
    for part in text.split(","):
        dev, sep, rng = part.partition("=")
        lo, sep2, hi = rng.partition(":")
        if not (sep and sep2):
            raise InputError(f"--partition: {part!r} is not DEVICE=LO:HI")
        try:
            out[dev.strip()] = (int(lo), int(hi))
        except ValueError:
            raise InputError(f"--partition: {part!r}: LO and HI must be integers") from None
    return out


def _ints_arg(option: str, text: str) -> tuple[int, ...]:
    """'10,5' -> (10, 5); anything else is a one-line error naming the option."""
    try:
        return tuple(int(f) for f in str(text).split(","))
    except ValueError:
        raise InputError(f"--{option}: {text!r} is not a comma list of integers, e.g. 10,5") from None


def _ints_or_floats(option: str, text: str) -> list[float]:
    try:
        return [float(f) for f in str(text).split(",")]
    except ValueError:
        raise InputError(f"--{option}: {text!r} is not a comma list of numbers, e.g. 2,1") from None


def add_arguments(parser):
    """The ``gnnweave train`` options."""
    p = parser
    p.add_argument("--dataset", default="cora",
                   help="cora | citeseer | sbm[:N:C] | rmat:SCALE:EF | PATH.npz")
    p.add_argument("--model", default="gcn", choices=["gcn", "sage", "sgc"], help="the GNN")
    p.add_argument("--device", default=None,
                   help="executor for dense ops (and aggregation); default: the one --devices "
                        "entry, else cpu")
    p.add_argument("--devices", nargs="+", default=None, metavar="NAME[*COUNT]",
                   help="the devices that share the aggregation, separated by commas or spaces; "
                        "NAME*COUNT is COUNT of them, NAME:0..NAME:COUNT-1, as in gnnweave plan "
                        "(one device: trains on it; default: --device alone)")
    p.add_argument("--partition", default=None,
                   help="auto (a split calibrated on the graph, rebalanced after each epoch) | none | "
                        "even | balanced (needs "
                        "--cost-model) | DEVICE=LO:HI,DEVICE=LO:HI; default: even over several "
                        "--devices, else none")
    p.add_argument("--epochs", type=int, default=None,
                   help="training epochs (default: the model's published number, 200 for GCN)")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden features (default: the model's published width, 16 for GCN)")
    p.add_argument("--layers", type=int, default=2,
                   help="GCN/SAGE layers; SGC: propagation steps K")
    p.add_argument("--dropout", type=float, default=None,
                   help="dropout probability (default: the model's, 0.5 for GCN)")
    p.add_argument("--lr", type=float, default=None,
                   help=f"learning rate (default: the model's, 0.01 for GCN with Adam; {SGD_DEFAULT_LR} "
                        "with --optimizer sgd)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="L2 weight decay (default: the model's, 5e-4 for GCN)")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"],
                   help="adam, or sgd with momentum")
    p.add_argument("--momentum", type=float, default=0.9, help="for --optimizer sgd")
    p.add_argument("--seeds", type=int, default=1, help="train seeds 0..N-1")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"seed nodes per mini-batch (default: full batch; {DEFAULT_FANOUT_BATCH_SIZE} "
                        "with --fanouts)")
    p.add_argument("--fanouts", default=None,
                   help="neighbours sampled per hop, e.g. 25,10; turns on mini-batch training "
                        "(default: none; 10 per hop with --batch-size)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="mini-batches sampled ahead on a background thread (0: inline)")
    p.add_argument("--overlap-chunks", type=int, default=1,
                   help="split each layer's aggregation into K row chunks; the dense device "
                        "transforms chunk k while the --devices aggregate chunk k+1 (1: no overlap)")
    p.add_argument("--select", default="last", choices=["last", "best_val"],
                   help="report the last epoch's test accuracy, or the best validation epoch's")
    p.add_argument("--checkpoint-dir", default=None,
                   help="folder for checkpoints (default: OUT/checkpoints with --out, else none)")
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="epochs between checkpoints (0: only at the end and on Ctrl-C)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint (bit-identical to an uninterrupted run)")
    p.add_argument("--out", default=None, help="folder for result.json, timeline.png, partition.txt "
                        "(default: nothing written)")
    p.add_argument("--save-model", default=None, metavar="PATH",
                   help="write the trained model (first seed) to PATH (.npz) for gnnweave predict "
                        "(default: not saved)")
    p.add_argument("--cost-model", default=None, help="cost model JSON from gnnweave profile (fills predicted_vs_measured; "
                        "default: none)")
    p.add_argument("--rebalance", action="store_true",
                   help="re-partition after each epoch from the measured shard times")
    p.add_argument("--steal", action="store_true",
                   help="work stealing: a device whose rows of an aggregation are done takes "
                        "rows from a slower one (within each aggregation; --rebalance still "
                        "moves the split between epochs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    d = p.add_argument_group("over ranks (docs/distributed.md)")
    d.add_argument("--nproc", type=int, default=1,
                   help="spawn N local ranks (torch.distributed, gloo) and train over them")
    d.add_argument("--dist", action="store_true",
                   help="be one rank of a torchrun job (torchrun --nproc-per-node N -m gnnweave "
                        "train --dist ...)")
    d.add_argument("--rank-devices", default=None,
                   help="each rank's devices, e.g. '0=fpga-emu,cpu 1=cpu' (default: --devices, "
                        "else --device)")
    d.add_argument("--rank-speeds", default=None,
                   help="relative rank speeds, e.g. 2,1, or auto (each rank times its dense "
                        "device on the graph): each rank's share of the nodes' work "
                        "(default: equal)")
    d.add_argument("--partition-method", default="metis",
                   choices=["metis", "rcm", "rows", "random"],
                   help="how nodes are split over ranks (metis falls back to rcm without pymetis)")
    d.add_argument("--digest-every", type=int, default=10,
                   help="epochs between cross-rank parameter digest checks (0: never)")
    d.add_argument("--dist-backend", default="auto", choices=["auto", "gloo", "nccl"],
                   help="torch.distributed backend: auto takes NCCL when every rank runs on "
                        "gpu devices and CUDA is there, else gloo")
    d.add_argument("--comm-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a collective that waits longer than this (a rank hung or unreachable) "
                        "stops the run with an error")
    d.add_argument("--rank-invariant", action="store_true",
                   help="one process: counter-based dropout and exact bias sums, the bits that "
                        "any number of ranks gives")
    return parser


def config_from_args(args) -> TrainConfig:
    """TrainConfig from parsed ``gnnweave train`` options; options a caller's parser does
    not define take the defaults of :func:`add_arguments`."""
    import argparse
    defaults = vars(add_arguments(argparse.ArgumentParser()).parse_args([]))
    a = {k: getattr(args, k, v) for k, v in defaults.items()}
    from gnnweave.host.distributed import parse_rank_devices
    devices = device_list("--devices", a["devices"])
    device, part, auto = resolve_placement(a["device"], devices, a["partition"])
    if part not in ("none", "even", "balanced"):
        part = _ranges_arg(part)
    if a["fanouts"] is not None and a["batch_size"] is None:
        # fan-outs only mean something for mini-batches: asking for them asks for mini-batch
        a["batch_size"] = DEFAULT_FANOUT_BATCH_SIZE
    fanouts = (_ints_arg("fanouts", a["fanouts"]) if a["fanouts"] is not None
               else (10,) * max(a["layers"], 1))
    return TrainConfig(
        dataset=a["dataset"], model=a["model"], device=device, devices=devices,
        partition=part, hidden=a["hidden"], layers=a["layers"], dropout=a["dropout"], lr=a["lr"],
        weight_decay=a["weight_decay"], epochs=a["epochs"], optimizer=a["optimizer"],
        momentum=a["momentum"], seeds=a["seeds"], batch_size=a["batch_size"], fanouts=fanouts, prefetch=a["prefetch"],
        overlap_chunks=a["overlap_chunks"],
        select=a["select"], checkpoint_dir=a["checkpoint_dir"],
        checkpoint_every=a["checkpoint_every"], resume=a["resume"], out_dir=a["out"],
        save_model=a.get("save_model"),
        cost_model=a["cost_model"], rebalance=a["rebalance"] or auto, steal=a["steal"],
        progress=not a["no_progress"], nproc=a["nproc"], dist=a["dist"],
        rank_devices=(None if a["rank_devices"] is None else
                      parse_rank_devices(a["rank_devices"])),    # checked before any work
        rank_speeds=(a["rank_speeds"] if a["rank_speeds"] in (None, "auto") else
                     [float(v) for v in _ints_or_floats("rank-speeds", a["rank_speeds"])]),
        partition_method=a["partition_method"], digest_every=a["digest_every"],
        rank_invariant=a["rank_invariant"], dist_backend=a["dist_backend"],
        comm_timeout_s=a["comm_timeout"])


def run(args) -> int:
    from gnnweave.host.train import run_training
    from gnnweave.host.train.report import format_summary
    config = config_from_args(args)
    for option, folder in (("--out", config.out_dir), ("--checkpoint-dir", config.checkpoint_dir)):
        if folder is not None:
            output_folder(option, folder, create=False)
    report = run_training(config)
    if getattr(args, "dist", False) and int(os.environ.get("RANK", "0")) != 0:
        return 0   # under torchrun every rank trains and holds the summary; rank 0 prints it
    if getattr(args, "json", False):
        print_json(report)
    else:
        print(format_summary(report))
    if config.resume and not any(r.get("resumed_from") is not None for r in report.get("seeds", [])):
        where = config.checkpoint_dir or Path(config.out_dir) / "checkpoints"
        print(f"gnnweave train: --resume found no checkpoint in {where}: trained from epoch 0",
              file=sys.stderr)
    if report.get("interrupted"):
        last = report["seeds"][-1] if report.get("seeds") else {}
        saved = (f"checkpoint {last['checkpoint']} (continue with --resume)"
                 if last.get("checkpoint") else "no checkpoint (give --checkpoint-dir or --out)")
        print(f"gnnweave train: interrupted after epoch {last.get('epochs_done')} of seed "
              f"{last.get('seed')}; {saved}", file=sys.stderr)
        return 130
    return 0


def train_main(argv=None) -> dict:
    """Parse ``argv`` (a list, or an argparse Namespace), train, return the summary dict."""
    import argparse
    from gnnweave.host.train import run_training
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        args = add_arguments(argparse.ArgumentParser(prog="gnnweave train")).parse_args(argv)
    return run_training(config_from_args(args))
