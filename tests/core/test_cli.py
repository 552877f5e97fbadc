"""The command line: help, argument errors as one line, JSON output of quick commands."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gnnweave import cli


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", *args], capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def test_help_lists_the_commands():
    rc, out, _ = run_cli("--help")
    assert rc == 0
    for command in ("verify", "train", "profile", "plan", "build", "demo"):
        assert command in out


@pytest.mark.parametrize("args, needle", [
    (["verify", "aggregate", "--graph", "cora", "--feat-dim", "0", "--json"], "--feat-dim must be >= 1"),
    (["verify", "aggregate", "--graph", "nosuchfile.npz", "--feat-dim", "4", "--json"], "nosuchfile.npz"),
    (["verify", "aggregate", "--graph", "rmat:x:2", "--feat-dim", "4", "--json"], "rmat"),
    (["verify", "aggregate", "--graph", "cora", "--feat-dim", "100000"],
     "feat_dim=100000: configuration 'default' takes 1..256"),
    (["verify", "aggregate", "--graph", "rmat:6:2", "--feat-dim", "4", "--backpressure", "2"],
     "backpressure=2.0: a pause probability in [0, 1)"),
    (["verify", "aggregate", "--graph", "rmat:6:2", "--feat-dim", "4", "--backpressure", "-0.5"],
     "backpressure=-0.5"),
    (["verify", "aggregate", "--graph", "rmat:6:2", "--feat-dim", "4", "--reduce", "max",
      "--config", "small-sum"], "reduce='max': configuration 'small-sum' is built with sum only"),
    (["verify", "mac", "--rows", "4", "--cols", "4", "--depth", "4", "--backpressure", "2"],
     "backpressure must be in [0, 1)"),
    (["train", "--dataset", "rmat:40:16", "--epochs", "1"], "rmat:40:16: needs about"),
    (["plan", "--model", "vgg16", "--devices", "a", "a", "--json"], "repeat"),
    (["profile", "--devices", "", "--quick"], "--devices: give at least one device"),
    (["profile", "--devices", "cpu,cpu", "--quick"], "--devices: 'cpu' appears twice"),
    (["train", "--devices", "fpga-emu,cpu", "--partition", "none"], "--partition none trains on one"),
    (["build", "verilog", "--config", "nonesuch"], "unknown configuration 'nonesuch'"),
    (["build", "estimate", "--config", "nonesuch"], "unknown configuration 'nonesuch'"),
    (["build", "bitstream", "--board", "nosuch"], "unknown board 'nosuch'"),
])
def test_bad_arguments_give_one_line_errors(args, needle):
    rc, out, err = run_cli(*args)
    assert rc == 2, (rc, out, err)
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_plan_prints_json(tmp_path):
    rc, out, err = run_cli("plan", "--model", "vgg16", "--devices", "g0=1:16", "g1=1:16",
                           "fpga=0.3:4", "--json")
    if rc == 2 and "profiles" in err:
        pytest.skip("shared profiles not present")
    assert rc == 0, err
    report = json.loads(out)
    assert report["bottleneck"] is not None or report.get("stages")


def test_parser_builds_without_running():
    parser = cli.build_parser()
    ns = parser.parse_args(["verify", "aggregate", "--graph", "cora", "--feat-dim", "16"])
    assert ns.func is cli.cmd_verify_aggregate and ns.latency == 32


def test_a_missing_simulator_is_named_before_any_build():
    env = {"PATH": "/nonexistent", "HOME": "/nonexistent"}
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", "verify", "aggregate", "--graph",
                           "rmat:6:2", "--feat-dim", "4", "--sim", "icarus"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Icarus Verilog not found: `apt-get install iverilog`" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_train_prints_a_summary_people_can_read():
    rc, out, err = run_cli("train", "--dataset", "sbm:300:3", "--epochs", "2", "--devices",
                           "fpga-emu,cpu", "--no-progress")
    assert rc == 0, err
    assert out.startswith("GCN on sbm:300:3 (full-batch, 1 seed, 2 epochs")
    assert "test accuracy" in out and "aggregation split" in out and "fpga-emu" in out
    assert "{'" not in out   # no Python reprs


def test_fanouts_may_start_with_minus_one():
    rc, out, err = run_cli("train", "--dataset", "sbm:300:3", "--fanouts", "-1,5", "--epochs", "1",
                           "--no-progress", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["mode"] == "mini-batch" and report["hyperparameters"]["fanouts"] == [-1, 5]
    rc, _, err = run_cli("train", "--dataset", "sbm:300:3", "--fanouts", "-2,5", "--epochs", "1")
    assert rc == 2 and "fanouts[0] = -2" in err
