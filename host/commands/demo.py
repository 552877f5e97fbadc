"""``gnnweave demo``: verify the Aggregator RTL against golden, then train a GCN with its
aggregation split across fpga-emu and cpu."""
from __future__ import annotations

import json
import sys

from gnnweave.clitools import json_default, output_folder


def add_arguments(parser) -> None:
    parser.add_argument("--dataset", default="cora", help="the dataset to train on")
    parser.add_argument("--out", default="build/demo",
                        help="folder for verify.json and train/ (result.json, timeline.png)")


def run(args) -> int:
    out = output_folder("--out", args.out)
    print("== 1/2  Aggregator RTL (Verilator) against the golden model, R-MAT scale 9, F=16")
    from gnnweave.sim.verify import verify_aggregate
    rep = verify_aggregate("rmat:9:8", 16, "mean", "verilator", 32, 0, "small")
    print(f"   match={rep.get('match')} mismatches={rep.get('mismatches')} "
          f"edges={rep.get('edges')} cycles={rep.get('cycles')} "
          f"port_utilization={rep.get('port_utilization')} "
          f"sim={rep.get('sim_cycles_per_second')} cycles/s")
    (out / "verify.json").write_text(json.dumps(rep, indent=1, default=json_default))
    if not rep.get("match"):
        print(f"   RTL does not match golden: {rep.get('error')}", file=sys.stderr)
        return 1
    print("== 2/2  GCN on Cora, aggregation split across fpga-emu and cpu")
    from gnnweave.host.train import TrainConfig, run_training
    cfg = TrainConfig(dataset=args.dataset, model="gcn", device="cpu",
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
