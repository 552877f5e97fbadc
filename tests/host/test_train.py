"""Trainer: gradients against finite differences, accuracy on Cora against the published
GCN number, the fixed-point path against float, partitioned training against one device,
mini-batch training, timeline/partition outputs, config errors."""
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest

from gnnweave.datasets import load_dataset
from gnnweave.graph import CSRGraph
from gnnweave.host.executors import CpuExecutor
from gnnweave.host.engine import Engine, check_shares
from gnnweave.host.models import LayerGraph, make_model, mean_norm, softmax_cross_entropy
from gnnweave.host.sampling import NeighborSampler
from gnnweave.host.train import TrainConfig, predicted_vs_measured, run_training, train_main
from tests.conftest import require_dataset


@pytest.fixture(scope="module")
def sbm():
    return load_dataset("sbm:300:3")


# --------------------------------------------------------------------------- gradients


def _tiny_problem(seed=0, n=40, f=6, c=3):
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, 160))
    ei = np.concatenate([ei, ei[::-1]], axis=1)
    graph = CSRGraph.from_edge_index(ei, n)
    x = rng.normal(size=(n, f)).astype(np.float32)
    y = rng.integers(0, c, size=n)
    return graph, x, y


def _loss(model, eng, x, layers, y, rows):
    logits, _ = model.forward(eng, x, layers, train=False, rng=None)
    return softmax_cross_entropy(logits.astype(np.float64), y, rows)[0]


@pytest.mark.parametrize("name", ["gcn", "sage", "sgc"])
@pytest.mark.parametrize("sampled", [False, True])
def test_manual_backprop_matches_finite_differences(name, sampled):
    graph, x, y = _tiny_problem()
    eng = Engine(CpuExecutor())

    def margin(cache):
        return min([np.abs(c[2]).min() for c in cache[:-1]], default=np.inf) \
            if name != "sgc" else np.inf

    for init_seed in range(60):   # pick weights whose ReLU inputs all keep clear of 0
        model = make_model(name, x.shape[1], 3, hidden=5, dropout=0.0, seed=init_seed)
        g = model.norm_graph(graph)
        xs = model.prepare_features(eng, g, x) if name == "sgc" else x
        if sampled and model.hops:
            seeds = np.arange(0, 40, 3)
            blocks = NeighborSampler(g, [3] * model.hops).sample(seeds, np.random.default_rng(0))
            layers = [LayerGraph(b.graph, b.n_dst) for b in blocks]
            xin, yy, rows = xs[blocks[0].src_nodes], y[seeds], None
        else:
            layers = [LayerGraph(g, g.num_nodes)] * model.hops
            xin, yy, rows = xs, y, np.arange(0, 40, 2)
        if margin(model.forward(eng, xin, layers, train=False, rng=None)[1]) > 0.01:
            break
    logits, cache = model.forward(eng, xin, layers, train=True, rng=np.random.default_rng(0))
    assert margin(cache) > 0.01   # no ReLU input near its kink: differences are derivatives
    _, d = softmax_cross_entropy(logits, yy, rows)
    grads = model.backward(eng, d, cache, layers)
    rng = np.random.default_rng(2)
    base = {k: v.copy() for k, v in model.params.items()}

    def numeric(k, i, eps):
        bumped = []
        for sign in (1, -1):
            p = base[k].copy()
            p[i] += sign * eps
            model.params = dict(base, **{k: p})
            bumped.append(_loss(model, eng, xin, layers, yy, rows))
        return (bumped[0] - bumped[1]) / (2 * eps)

    for k in base:
        for _ in range(3):
            i = tuple(int(rng.integers(0, s)) for s in base[k].shape)
            assert float(grads[k][i]) == pytest.approx(numeric(k, i, 1e-3), rel=3e-2, abs=2e-4), \
                (k, i)
    model.params = base


# --------------------------------------------------------------------------- accuracy


def test_gcn_cora_float_accuracy_single_seed():
    """Kipf & Welling report 81.5 % (mean); one seed of our GCN must land near it."""
    require_dataset("cora")
    r = run_training(TrainConfig(dataset="cora", model="gcn", seeds=[0], progress=False))
    assert r["test_acc_mean"] >= 0.80
    assert r["epoch_seconds"] > 0 and r["predicted_vs_measured"] is None


def test_gcn_cora_fixed_point_close_to_float():
    """The fpga-emu path (16-bit dynamic fixed point, golden models) tracks float."""
    require_dataset("cora")
    kw = dict(dataset="cora", model="gcn", seeds=[0], progress=False)
    flt = run_training(TrainConfig(device="cpu", **kw))
    fxp = run_training(TrainConfig(device="fpga-emu", **kw))
    assert fxp["test_acc_mean"] >= flt["test_acc_mean"] - 0.02
    assert fxp["saturations"] == 0


def test_gcn_citeseer_float_and_fixed_point_single_seed():
    """Published 70.3 % (mean of runs); seed 0 of ours: float and fixed point near it."""
    require_dataset("citeseer")
    kw = dict(dataset="citeseer", model="gcn", seeds=[0], progress=False)
    flt = run_training(TrainConfig(device="cpu", **kw))
    fxp = run_training(TrainConfig(device="fpga-emu", **kw))
    assert flt["test_acc_mean"] >= 0.68
    assert fxp["test_acc_mean"] >= flt["test_acc_mean"] - 0.02


@pytest.mark.slow
def test_five_seed_accuracy_benchmark(tmp_path):
    """The 5-seed targets: float >= 80.5 % Cora / 69.5 % CiteSeer, fixed point within 1.5."""
    require_dataset("cora")
    require_dataset("citeseer")
    from benchmarks.bench_train import run
    report = run(tmp_path)
    assert report["passed"], report["accuracy"]


@pytest.mark.parametrize("model", ["sage", "sgc"])
def test_other_models_learn_cora(model):
    require_dataset("cora")
    r = run_training(TrainConfig(dataset="cora", model=model, seeds=[0], progress=False))
    assert r["test_acc_mean"] >= 0.75


# --------------------------------------------------------------------------- partitioned


def test_partitioned_fixed_point_training_is_bit_identical(sbm):
    kw = dict(dataset=sbm, model="gcn", seeds=[3], epochs=8, progress=False)
    single = run_training(TrainConfig(device="fpga-emu", **kw))
    n = sbm.graph.num_nodes
    shares = {"fpga-emu": (0, 100), "fpga-emu:1": (100, 230), "fpga-emu:2": (230, n)}
    parted = run_training(TrainConfig(device="fpga-emu", partition=shares, **kw))
    assert parted["seeds"][0]["params_sha256"] == single["seeds"][0]["params_sha256"]
    assert set(parted["shares"]) == set(shares)
    assert sum(s["edges"] for s in parted["shares"].values()) > 0


def test_partitioned_float_training_matches_single_device(sbm):
    kw = dict(dataset=sbm, model="sage", seeds=[1], epochs=10, progress=False)
    single = run_training(TrainConfig(device="cpu", **kw))
    parted = run_training(TrainConfig(device="cpu", partition="even", devices=["cpu", "cpu:1"],
                                      **kw))
    # scipy computes each CSR row on its own: float row shards give the same bits
    assert parted["seeds"][0]["params_sha256"] == single["seeds"][0]["params_sha256"]
    edges = [s["edges"] for s in parted["shares"].values()]
    assert abs(edges[0] - edges[1]) <= 0.05 * max(edges)   # 'even' cuts on edge counts
    callable_part = run_training(TrainConfig(
        device="cpu", partition=lambda g, devs: {"cpu": (0, 150), "cpu:1": (150, g.num_nodes)},
        **kw))
    assert callable_part["seeds"][0]["params_sha256"] == single["seeds"][0]["params_sha256"]
    assert callable_part["shares"]["cpu"]["hi"] == 150


def test_mixed_float_and_fixed_point_shards_train_as_well(sbm):
    kw = dict(dataset=sbm, model="gcn", seeds=[0], epochs=60, progress=False)
    single = run_training(TrainConfig(device="cpu", **kw))
    mixed = run_training(TrainConfig(device="cpu", partition="even",
                                     devices=["cpu", "fpga-emu"], **kw))
    assert abs(mixed["test_acc_mean"] - single["test_acc_mean"]) <= 0.05
    assert mixed["busy"]["fpga-emu"]["compute"] > 0


def test_bad_partition_is_one_line_error(sbm):
    with pytest.raises(ValueError, match=r"partition\['cpu:1'\].*contiguous"):
        run_training(TrainConfig(dataset=sbm, partition={"cpu": (0, 100), "cpu:1": (120, 300)},
                                 epochs=1, progress=False))
    with pytest.raises(ValueError, match="ranges end at node 250"):
        check_shares({"cpu": (0, 250)}, 300)


# --------------------------------------------------------------------------- mini-batch


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_minibatch_training_learns(sbm, model):
    full = run_training(TrainConfig(dataset=sbm, model=model, seeds=[0], epochs=60,
                                    progress=False))
    mb = run_training(TrainConfig(dataset=sbm, model=model, seeds=[0], epochs=60, batch_size=16,
                                  fanouts=(5, 5), progress=False))
    assert mb["mode"] == "mini-batch"
    assert mb["test_acc_mean"] >= full["test_acc_mean"] - 0.1
    assert mb["test_acc_mean"] > 0.6        # 3 planted classes: chance is 1/3


def test_minibatch_with_and_without_prefetch_is_identical(sbm):
    kw = dict(dataset=sbm, model="gcn", seeds=[0], epochs=3, batch_size=20, fanouts=(4, 4),
              progress=False)
    a = run_training(TrainConfig(prefetch=2, **kw))
    b = run_training(TrainConfig(prefetch=0, **kw))
    assert a["seeds"][0]["params_sha256"] == b["seeds"][0]["params_sha256"]


def test_fanouts_must_match_layers(sbm):
    with pytest.raises(ValueError, match="fanouts has 3 entries"):
        run_training(TrainConfig(dataset=sbm, batch_size=8, fanouts=(2, 2, 2), epochs=1,
                                 progress=False))


# --------------------------------------------------------------------------- outputs


def test_outputs_timeline_and_partition_table(sbm, tmp_path):
    n = sbm.graph.num_nodes
    r = run_training(TrainConfig(dataset=sbm, seeds=2, epochs=3, partition={"cpu": (0, 120),
                                 "fpga-emu": (120, n)}, out_dir=str(tmp_path), progress=False))
    png = tmp_path / "timeline.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["test_acc_mean"] == r["test_acc_mean"] and len(saved["seeds"]) == 2
    assert set(saved["histories"]) == {"0", "1"}
    table = (tmp_path / "partition.txt").read_text()
    assert "fpga-emu" in table and "120" in table
    assert set(r["busy"]) == {"cpu", "fpga-emu"}
    assert r["test_acc_std"] >= 0
    assert json.loads(json.dumps(r))["shares"]["fpga-emu"]["lo"] == 120   # plain JSON types


def test_partition_table_says_which_clock_each_device_was_measured_with(sbm):
    """FPGA kinds report device time (fpga-emu: its cycle model), cpu its thread's CPU time:
    the outputs say which, per device (issue: 'timelines say which is which')."""
    from gnnweave.host.timeline import OpRecord
    n = sbm.graph.num_nodes
    r = run_training(TrainConfig(dataset=sbm, seeds=[0], epochs=2, progress=False,
                                 partition={"cpu": (0, 120), "fpga-emu": (120, n)}))
    assert r["measured_clock"] == {"cpu": "cpu", "fpga-emu": "device"}
    lines = [line.split() for line in r["partition_table"].splitlines()]
    column = lines[0].index("clock")
    assert {row[0]: row[column] for row in lines[2:]} == {"cpu": "cpu", "fpga-emu": "device"}
    rec = OpRecord("g", "gpu", "aggregate", 0.0, 1.0, 1.0, 0.5, 0, 0, 0)
    assert rec.clock == "wall" and rec.measured_seconds == 1.0


def test_a_listed_device_without_rows_is_shown_with_none(sbm):
    n = sbm.graph.num_nodes
    r = run_training(TrainConfig(dataset=sbm, seeds=[0], epochs=1, progress=False,
                                 devices=["cpu", "fpga-emu"], partition={"cpu": (0, n)}))
    assert r["shares"]["fpga-emu"] == dict(lo=n, hi=n, rows=0, edges=0, edge_share=0.0)
    assert "fpga-emu" in r["partition_table"]


class _FakeCostModel:
    """Predicts 1 ms per aggregate and 2 ms per dense op, for cpu only."""

    def predict(self, device, op, **sizes):
        if device != "cpu":
            raise ValueError(f"no cost model for device {device!r}")
        assert sizes, "sizes must be passed"
        return 1e-3 if op == "aggregate" else 2e-3


def test_predicted_vs_measured_uses_the_cost_model(sbm):
    r = run_training(TrainConfig(dataset=sbm, seeds=[0], epochs=2, cost_model=_FakeCostModel(),
                                 partition={"cpu": (0, 100), "fpga-emu": (100, 300)},
                                 progress=False))
    pvm = r["predicted_vs_measured"]
    # one training step of a 2-layer GCN: 4 aggregations (2 forward, 2 backward) on each
    # shard, 2 dense forward + 2 weight grads + 1 input grad on the dense device (cpu)
    assert pvm["cpu"]["predicted_s"] == pytest.approx(4 * 1e-3 + 5 * 2e-3)
    assert pvm["cpu"]["measured_s"] > 0
    assert pvm["fpga-emu"]["predicted_s"] is None and "fpga-emu" in pvm["fpga-emu"]["error"]
    assert predicted_vs_measured([], None) is None


def test_config_errors(sbm):
    with pytest.raises(ValueError, match="TrainConfig.model"):
        run_training(TrainConfig(dataset=sbm, model="gat"))
    with pytest.raises(ValueError, match="unknown field 'lr_decay'"):
        TrainConfig.from_dict({"lr_decay": 1})
    with pytest.raises(ValueError, match="available: cpu"):
        run_training(TrainConfig(dataset=sbm, device="tpu", epochs=1, progress=False))


def test_sbm_demo_learns_its_planted_classes():
    """The no-download demo dataset has Gaussian (signed) features: they must not be row
    normalised like bag-of-words (a signed row sum near 0 blows the row up; it gave 49 %)."""
    r = run_training(TrainConfig(dataset="sbm", seeds=[0], progress=False))
    assert r["test_acc_mean"] >= 0.85     # 7 planted classes, chance 14 %


@pytest.mark.parametrize("field, value", [("hidden", 0), ("layers", 0), ("lr", -0.01),
                                          ("lr", 0.0), ("weight_decay", -1e-4),
                                          ("checkpoint_every", -1), ("momentum", 1.5)])
def test_bad_hyperparameters_are_one_line_errors(sbm, field, value):
    with pytest.raises(ValueError, match=f"TrainConfig.{field} = {value}"):
        run_training(TrainConfig(dataset=sbm, epochs=1, progress=False, **{field: value}))


def test_sgc_allows_zero_hops(sbm):
    r = run_training(TrainConfig(dataset=sbm, model="sgc", layers=0, epochs=2, progress=False))
    assert r["test_acc_mean"] is not None


def test_train_main_parses_the_command_line(tmp_path):
    r = train_main(["--dataset", "sbm:200:2", "--epochs", "3", "--seeds", "2", "--no-progress",
                    "--partition", "cpu=0:90,fpga-emu=90:200", "--out", str(tmp_path)])
    assert len(r["seeds"]) == 2 and r["shares"]["fpga-emu"]["lo"] == 90
    assert (tmp_path / "result.json").is_file()
    with pytest.raises(ValueError, match="--partition: 'cpu' is not DEVICE=LO:HI"):
        train_main(["--dataset", "sbm:200:2", "--partition", "cpu", "--no-progress"])


class _SlowAggregate:
    """A cpu executor that is really 4x slower at aggregation (it does the work 4 times)."""

    kind = "cpu"

    def __init__(self, name):
        self.inner, self.name = CpuExecutor(name), name

    def aggregate(self, *a, **k):
        t0 = time.perf_counter()
        for _ in range(3):
            self.inner.aggregate(*a, **k)
        res = self.inner.aggregate(*a, **k)
        res.wall_seconds = time.perf_counter() - t0
        res.executor = self.name
        return res

    def __getattr__(self, item):
        return getattr(self.inner, item)


def test_rebalance_moves_rows_off_the_slow_device(monkeypatch):
    import gnnweave.host.train.loop as loop
    real = loop.make_executor
    monkeypatch.setattr(loop, "make_executor",
                        lambda name, **kw: _SlowAggregate(name) if name == "cpu:slow" else real(name, **kw))
    ds = load_dataset("sbm:2000:4")
    r = run_training(TrainConfig(dataset=ds, seeds=[0], epochs=10, partition="even",
                                 devices=["cpu", "cpu:slow"], rebalance=True, progress=False))
    assert r["rebalances"], "the 4x slower device should lose rows"
    assert r["shares"]["cpu"]["edge_share"] > 0.6      # ideal: 0.8
    # float row shards: the partition changes nothing in the numbers
    plain = run_training(TrainConfig(dataset=ds, seeds=[0], epochs=10, progress=False))
    assert r["seeds"][0]["params_sha256"] == plain["seeds"][0]["params_sha256"]


def test_minibatch_partitioned_fixed_point_is_bit_identical(sbm):
    """Sampled blocks are cut into the partition's edge fractions; fixed point stays exact."""
    kw = dict(dataset=sbm, model="sage", seeds=[2], epochs=3, batch_size=25, fanouts=(5, 3),
              device="fpga-emu", progress=False)
    single = run_training(TrainConfig(**kw))
    parted = run_training(TrainConfig(partition="even", devices=["fpga-emu", "fpga-emu:1"], **kw))
    assert parted["seeds"][0]["params_sha256"] == single["seeds"][0]["params_sha256"]
    assert parted["busy"]["fpga-emu:1"]["compute"] > 0


def test_sgc_minibatch_uses_row_batches(sbm):
    r = run_training(TrainConfig(dataset=sbm, model="sgc", seeds=[0], epochs=30, batch_size=16,
                                 progress=False))
    assert r["test_acc_mean"] > 0.6


def test_predicted_vs_measured_with_a_fitted_cost_model(sbm):
    """The op sizes the trainer records are the ones the profiler's cost model takes."""
    from gnnweave.host.profiler import profile
    prof = profile(["cpu"], quick=True, progress=False)
    r = run_training(TrainConfig(dataset=sbm, seeds=[0], epochs=2, batch_size=50,
                                 cost_model=prof.cost_model, progress=False))
    pvm = r["predicted_vs_measured"]
    assert set(pvm) == {"cpu"} and pvm["cpu"]["predicted_s"] > 0 and pvm["cpu"]["ratio"] > 0


def test_balanced_partition_from_rates(sbm):
    r = run_training(TrainConfig(dataset=sbm, seeds=[0], epochs=1, partition="balanced",
                                 devices=["cpu", "cpu:1"], cost_model={"cpu": 3.0, "cpu:1": 1.0},
                                 progress=False))
    assert r["shares"]["cpu"]["edge_share"] == pytest.approx(0.75, abs=0.03)
    with pytest.raises(ValueError, match="needs a cost model"):
        run_training(TrainConfig(dataset=sbm, partition="balanced", devices=["cpu"], epochs=1,
                                 progress=False))


def _config(*argv):
    import argparse
    from gnnweave.host.train import add_train_arguments, config_from_args
    return config_from_args(add_train_arguments(argparse.ArgumentParser()).parse_args(list(argv)))


def test_command_line_devices_and_partition():
    """What --device/--devices/--partition mean together (gnnweave train)."""
    c = _config("--devices", "fpga-emu")                   # one device: it trains
    assert (c.device, c.partition, c.rebalance) == ("fpga-emu", "none", False)
    c = _config("--device", "cpu", "--devices", "fpga-emu")  # it aggregates, cpu does dense
    assert (c.device, c.partition, c.devices) == ("cpu", "even", ["fpga-emu"])
    c = _config("--devices", "fpga-emu,cpu")
    assert (c.device, c.partition, c.devices) == ("cpu", "even", ["fpga-emu", "cpu"])
    c = _config("--devices", "fpga-emu,cpu", "--partition", "auto")
    assert (c.partition, c.rebalance) == ("even", True)
    c = _config()
    assert (c.device, c.partition, c.batch_size, c.fanouts) == ("cpu", "none", None, (10, 10))
    assert _config("--layers", "3", "--batch-size", "8").fanouts == (10, 10, 10)
    assert _config("--batch-size", "8", "--fanouts", "10,5").fanouts == (10, 5)
    # fan-outs ask for mini-batches (the issue's `--fanouts 10,5`): GraphSAGE's batch of 512
    c = _config("--fanouts", "10,5")
    assert (c.batch_size, c.fanouts) == (512, (10, 5))
    assert _config("--optimizer", "sgd", "--momentum", "0.5").momentum == 0.5


@pytest.mark.parametrize("argv, needle", [
    (["--devices", "fpga-emu,cpu", "--partition", "none"], "--partition none trains on one device"),
    (["--partition", "auto"], "--partition auto needs --devices"),
    (["--devices", "cpu,cpu"], "--devices: 'cpu' appears twice"),
    (["--rank-devices", "0=cpu,cpu 1=cpu"], "--rank-devices: rank 0: 'cpu' appears twice"),
    (["--rank-devices", "0=cpu 1=gpu=2"], "--rank-devices: rank 1: 'gpu=2': =SPEED:MEM"),
    (["--batch-size", "8", "--fanouts", "10,x"], "--fanouts: '10,x' is not a comma list"),
    (["--partition", "cpu=a:b"], "--partition: 'cpu=a:b': LO and HI must be integers"),
])
def test_command_line_contradictions_are_one_line_errors(argv, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        _config(*argv)


def test_ctrl_c_on_the_command_line_saves_and_exits_130(tmp_path):
    """SIGINT to a running `gnnweave train`: the last completed epoch is saved, the exit
    status is 130 and stderr says where the checkpoint is; --resume continues from it."""
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    # the checkpoint fsyncs every epoch: tmpfs keeps a disk busy with other tests' builds out
    # of the timing. The child starts with SIGINT at its default, unblocked: a child inherits
    # its parent's blocked and ignored signals, and in the fresh-clone CI run (pytest -n 2)
    # the child twice ignored SIGINT for 120 s, as it does (checked) when the parent has it
    # blocked or ignored; some earlier test in the same worker left it so (not yet found).
    def default_sigint():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    def sigint_state():
        status = Path("/proc/self/status")
        return [ln for ln in status.read_text().splitlines()
                if ln.startswith(("SigBlk", "SigIgn"))] if status.exists() else []
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) \
        else tmp_path
    proc = None
    try:
        ckpt = base / "ck"
        cmd = [sys.executable, "-m", "gnnweave.cli", "train", "--dataset", "sbm:300:3",
               "--epochs", "1000000", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
               "--no-progress", "--json"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_sigint)
        deadline = time.monotonic() + 120
        while not (ckpt / "gcn-seed0.npz").is_file():   # training has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 120 s after SIGINT; this test process: {sigint_state()}")
        assert proc.returncode == 130, err
        report = json.loads(out)
        done = report["seeds"][0]["epochs_done"]
        assert report["interrupted"] and 1 <= done < 1000000
        assert f"interrupted after epoch {done} of seed 0" in err and "--resume" in err
        resumed = train_main(["--dataset", "sbm:300:3", "--epochs", str(done + 2), "--resume",
                              "--checkpoint-dir", str(ckpt), "--no-progress"])
        assert resumed["seeds"][0]["resumed_from"] == done
        assert resumed["seeds"][0]["epochs_done"] == done + 2
    finally:
        if proc is not None and proc.poll() is None:   # never leave it training on
            proc.kill()
            proc.communicate()
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)


def test_resume_without_a_checkpoint_says_so(tmp_path, capsys):
    from gnnweave import cli
    rc = cli.main(["train", "--dataset", "sbm:100:2", "--epochs", "1", "--resume",
                   "--checkpoint-dir", str(tmp_path / "none"), "--no-progress"])
    assert rc == 0
    assert "--resume found no checkpoint in" in capsys.readouterr().err


def test_config_from_a_foreign_namespace_uses_defaults():
    import argparse
    from gnnweave.host.train import config_from_args
    cfg = config_from_args(argparse.Namespace(dataset="citeseer", seeds=5))
    assert cfg.dataset == "citeseer" and cfg.seed_list() == [0, 1, 2, 3, 4]
    assert cfg.partition == "none" and cfg.fanouts == (10, 10) and cfg.progress


def test_sgd_without_lr_takes_a_learning_rate_that_trains_cora():
    """The models' default lr (0.01) is Adam's; SGD with momentum learns next to nothing at
    it in 200 epochs (19 % on Cora), so --optimizer sgd alone takes SGD_DEFAULT_LR."""
    from gnnweave.host.train import SGD_DEFAULT_LR
    ds = require_dataset("cora")
    r = run_training(TrainConfig(dataset=ds, optimizer="sgd", epochs=500, seeds=3,
                                 progress=False))
    assert r["hyperparameters"]["lr"] == SGD_DEFAULT_LR
    assert r["test_acc_mean"] >= 0.75
    adam = run_training(TrainConfig(dataset=ds, epochs=1, seeds=1, progress=False))
    assert adam["hyperparameters"]["lr"] == 0.01   # Adam keeps Kipf & Welling's


def test_the_summary_says_when_a_listed_device_got_no_rows():
    from gnnweave.host.train import format_summary
    report = {"model": "gcn", "dataset": "d", "mode": "full-batch", "seeds": [{}],
              "hyperparameters": {"epochs": 1}, "device": "cpu", "test_acc_mean": 0.5,
              "partition_table": "table", "shares": {"cpu": {"rows": 10}, "fpga-emu": {"rows": 0}}}
    assert "note: fpga-emu got no rows of the split" in format_summary(report)
    report["shares"]["fpga-emu"]["rows"] = 3
    assert "no rows" not in format_summary(report)
