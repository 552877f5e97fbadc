"""Training over ranks: halo bytes per partition method, gradient all-reduce against a
parameter server, epoch time at 1, 2 and 4 ranks.

1. ``partitions``: for Cora, CiteSeer and a 100,000-node SBM, 2 and 4 ranks, every method
   of :func:`gnnweave.host.graphpart.partition_graph`: halo nodes, edge cut, balance, the
   seconds partitioning took and the halo bytes per epoch a 2-layer GCN (hidden 16) moves
   on the float path (the fixed-point path moves 10/8 of that).
2. ``gradient_reduce``: the flat gradient of GCN on Cora (23,063 values, float64) added
   over 2 and 4 gloo ranks by one ``all_reduce``, and parameter-server style (``reduce``
   to rank 0, then ``broadcast``): bytes each scheme moves (ring all-reduce:
   ``2 (k-1)/k S`` per rank; server: rank 0 receives and sends ``(k-1) S``) and the
   measured median seconds.
3. ``epoch_seconds``: GCN on Cora at 1, 2 and 4 local ranks, float and fixed point, with
   the measured halo bytes against the prediction. This host has 2 shared cores: ranks
   compete for them, so this is NOT a speed-up figure, only what the exchange costs here.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SBM = "sbm:100000:8"
GCN_GRAD_VALUES = 1433 * 16 + 16 + 16 * 7 + 7


def partitions() -> list[dict]:
    from gnnweave.datasets import load_dataset
    from gnnweave.host.graphpart import METHODS, partition_graph
    rows = []
    for name in ("cora", "citeseer", SBM):
        ds = load_dataset(name)
        widths = [16, int(ds.num_classes)]
        for k in (2, 4):
            for method in METHODS:
                t0 = time.perf_counter()
                p = partition_graph(ds.graph, k, method=method)
                seconds = time.perf_counter() - t0
                rep = p.report(ds.graph, widths)
                rows.append(dict(dataset=name, nodes=ds.graph.num_nodes, ranks=k, method=p.method,
                                 halo_nodes=rep["halo_nodes"],
                                 halo_nodes_total=rep["halo_nodes_total"],
                                 edge_cut=rep["edge_cut"], balance=rep["balance"],
                                 bytes_per_epoch_float=rep["predicted_bytes_per_step"],
                                 partition_seconds=seconds))
    return rows


def _time_reduce(values: int, repeats: int):
    """A spawned rank: median seconds of all_reduce vs reduce + broadcast."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    g = torch.ones(values, dtype=torch.float64)
    out = {}
    for scheme in ("allreduce", "server"):
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            if scheme == "allreduce":
                dist.all_reduce(g)
            else:
                dist.reduce(g, dst=0)
                dist.broadcast(g, src=0)
            times.append(time.perf_counter() - t0)
        out[scheme] = float(np.median(times))
    dist.destroy_process_group()
    return out


def gradient_reduce(repeats: int = 30) -> list[dict]:
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from gnnweave.host.distributed import _free_port
    rows = []
    size = GCN_GRAD_VALUES * 8
    for k in (2, 4):
        cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=k, run_id=uuid.uuid4().hex[:8],
                           rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{_free_port()}",
                           max_restarts=0, start_method="spawn")
        res = elastic_launch(cfg, _time_reduce)(GCN_GRAD_VALUES, repeats)
        rows.append(dict(ranks=k, gradient_bytes=size,
                         allreduce_bytes_per_rank=int(2 * (k - 1) / k * size),
                         server_bytes_at_rank0=int(2 * (k - 1) * size),
                         allreduce_seconds=res[0]["allreduce"], server_seconds=res[0]["server"]))
    return rows


def epoch_seconds(epochs: int = 20) -> list[dict]:
    from gnnweave.host.distributed import Comm, launch, run_rank
    from gnnweave.host.train import TrainConfig
    rows = []
    for device in ("cpu", "fpga-emu"):
        job = TrainConfig(dataset="cora", model="gcn", device=device, epochs=epochs, seeds=[0],
                          dropout=0.5, progress=False, digest_every=0)
        for k in (1, 2, 4):
            r = run_rank(job, Comm()) if k == 1 else launch([job], k)[0]
            rows.append(dict(device=device, ranks=k, numeric=r["numeric"],
                             epoch_seconds=r["epoch_seconds"],
                             rank_epoch_seconds=r["rank_epoch_seconds"],
                             comm_bytes_per_epoch=r["comm_bytes_per_epoch"],
                             predicted_comm_bytes_per_epoch=r["predicted_comm_bytes_per_epoch"],
                             allreduce_bytes_per_step=r["allreduce_bytes_per_step"],
                             test_acc=r["test_acc_mean"],
                             params_sha256=r["seeds"][0]["params_sha256"]))
    return rows


def run(out_dir) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report = dict(
        benchmark="dist",
        partitions=partitions(),
        gradient_reduce=gradient_reduce(),
        epoch_seconds=epoch_seconds(),
        note="epoch_seconds: all ranks share this host's 2 cores with each other (and with "
             "other work); it shows what the exchange and all-reduce cost here, not a "
             "speed-up",
        load_average=os.getloadavg(),
        seconds=time.perf_counter() - t0)
    fixed = [r for r in report["epoch_seconds"] if r["numeric"] == "fixed"]
    report["fixed_point_same_bits_at_1_2_4_ranks"] = len({r["params_sha256"] for r in fixed}) == 1
    report["measured_equals_predicted"] = all(
        r["comm_bytes_per_epoch"] == r["predicted_comm_bytes_per_epoch"]
        for r in report["epoch_seconds"])
    (out_dir / "dist.json").write_text(json.dumps(report, indent=1))
    report["files"] = [str(out_dir / "dist.json")]
    return report


if __name__ == "__main__":
    rep = run(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/dist")
    print(json.dumps({k: v for k, v in rep.items() if k != "partitions"}, indent=1))
