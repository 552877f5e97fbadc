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
    (["verify", "aggregate", "--dataset", "cora", "--feat-dim", "0", "--json"], "--feat-dim must be >= 1"),
    (["verify", "aggregate", "--dataset", "nosuchfile.npz", "--feat-dim", "4", "--json"], "nosuchfile.npz"),
    (["verify", "aggregate", "--dataset", "rmat:x:2", "--feat-dim", "4", "--json"], "rmat"),
    (["verify", "aggregate", "--dataset", "cora", "--feat-dim", "100000"],
     "feat_dim=100000: configuration 'small' takes 1..64"),
    (["verify", "aggregate", "--dataset", "rmat:6:2", "--feat-dim", "4", "--backpressure", "2"],
     "backpressure=2.0: a pause probability in [0, 1)"),
    (["verify", "aggregate", "--dataset", "rmat:6:2", "--feat-dim", "4", "--backpressure", "-0.5"],
     "backpressure=-0.5"),
    (["verify", "aggregate", "--dataset", "rmat:6:2", "--feat-dim", "4", "--reduce", "max",
      "--config", "small-sum"], "reduce='max': configuration 'small-sum' is built with sum only"),
    (["verify", "mac", "--rows", "4", "--cols", "4", "--depth", "4", "--backpressure", "2"],
     "backpressure must be in [0, 1)"),
    (["train", "--dataset", "rmat:40:16", "--epochs", "1"], "rmat:40:16: needs about"),
    (["plan", "--model", "vgg16", "--devices", "a", "a", "--json"], "--devices: 'a' appears twice"),
    (["profile", "--devices", "", "--quick"], "--devices: give at least one device"),
    (["profile", "--devices", "cpu,cpu", "--quick"], "--devices: 'cpu' appears twice"),
    (["train", "--devices", "fpga-emu,cpu", "--partition", "none"], "--partition none trains on one"),
    (["build", "verilog", "--config", "nonesuch"], "unknown configuration 'nonesuch'"),
    (["build", "estimate", "--config", "nonesuch"], "unknown configuration 'nonesuch'"),
    (["build", "bitstream", "--board", "nosuch"], "unknown board 'nosuch'"),
    (["train", "--dataset", "sbm:60:2", "--hidden", "100000000"],
     "TrainConfig.hidden = 100000000: needs about"),
    (["train", "--dataset", "sbm:60:2", "--nproc", "0"], "TrainConfig.nproc = 0: must be >= 1"),
    (["train", "--dataset", "sbm:60:2", "--nproc", "2", "--comm-timeout", "0"],
     "TrainConfig.comm_timeout_s = 0.0: must be a positive number of seconds"),
    (["train", "--dataset", "sbm:60:2", "--batch-size", "8", "--prefetch", "-1"],
     "TrainConfig.prefetch = -1: must be >= 0"),
    (["train", "--dataset", "sbm:60:2", "--cost-model", "."], "is a folder, not a cost model"),
    (["plan", "--dataset", "sbm:60:2", "--devices", "cpu", "--cost-model", "."],
     ".: is a folder, not a cost model JSON file"),
    (["plan", "--dataset", "sbm:60:2", "--devices", "cpu", "--bandwidth-gbps", "0"],
     "--bandwidth-gbps 0: must be > 0"),
    (["plan", "--dataset", "sbm:60:2", "--devices", "cpu", "--latency-us", "-1"],
     "--latency-us -1: must be a number >= 0"),
    (["plan", "--dataset", "sbm:60:2", "--devices", "cpu", "--inter-group-gbps", "-2"],
     "--inter-group-gbps -2: must be > 0"),
    (["plan", "--dataset", "sbm:60:2", "--devices", "gpu=0"], "'gpu=0': SPEED and MEM_GB must be > 0"),
    # refused before the simulated device's minutes-long native build
    (["device", "run", "aggregate", "--dataset", "rmat:6:2", "--feat-dim", "100000"],
     "feat_dim=100000: configuration 'small' takes 1..64"),
    (["device", "run", "aggregate", "--dataset", "rmat:6:2", "--feat-dim", "4", "--reduce", "max",
      "--config", "small-sum"], "reduce='max': configuration 'small-sum' is built with sum only"),
    (["device", "run", "mac", "--rows", "4", "--cols", "4", "--depth", "4", "--config", "small-agg"],
     "--config 'small-agg': the build has no MacArray"),
    (["device", "run", "mac", "--rows", "4", "--cols", "4", "--depth", "4", "--shift", "99"],
     "--shift 99: must be in 0..63"),
    (["device", "run", "pipeline", "--dim", "100000"], "--dim 100000: build 'small' takes 1..16"),
    (["device", "run", "pipeline", "--rows", "17"], "--rows 17: build 'small' takes 1..16"),
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
    argv = ["verify", "aggregate", "--dataset", "cora", "--feat-dim", "16"]
    ns = cli.build_parser(argv).parse_args(argv)
    assert ns.command_target == "gnnweave.sim.commands.verify:Aggregate" and ns.latency == 32


def test_every_command_mounts_one_way_and_every_option_has_help_and_a_default():
    found = list(cli.options(cli.build_parser(every_command=True)))
    commands = {words for words, target in ((w, t) for w, (t, _) in cli.COMMANDS.items()) if target}
    assert {o.words for o in found} == commands
    for words, (target, _) in cli.COMMANDS.items():
        if target:
            command = cli.load_command(target)
            assert callable(command.add_arguments) and callable(command.run), words
    assert [(o.words, o.names) for o in found if not o.help] == []
    # a value option shows its default: the formatter appends a set one, the help says what
    # an unset one means; a flag is off unless given
    hidden = [(o.words, o.names) for o in found if not (o.required or o.flag) and
              (o.default is None or o.default is False) and "default:" not in o.help]
    assert hidden == []


def test_every_command_that_simulates_a_build_takes_one_default():
    from gnnweave.buildconfig import BUILDS, DEFAULT_BUILD

    configs = {o.words: o for o in cli.options(cli.build_parser(every_command=True))
               if o.names == ("--config",)}
    assert {("verify", "aggregate"), ("device", "run", "aggregate"), ("device", "run", "mac"),
            ("device", "run", "pipeline"), ("build", "lint")} <= set(configs)
    simulated = [o for w, o in configs.items() if w[0] in ("verify", "device")]
    assert {o.default for o in simulated} == {DEFAULT_BUILD}
    # every unit, so one build serves every command
    assert set(BUILDS[DEFAULT_BUILD].units()) == {"aggregator", "mac_array", "pipeline"}
    rc, out, _ = run_cli("device", "run", "mac", "--help")
    assert rc == 0 and f"(default: {DEFAULT_BUILD})" in " ".join(out.split())
    assert all(name in out for name in BUILDS)


def test_help_shows_the_defaults():
    rc, out, _ = run_cli("verify", "aggregate", "--help")
    assert rc == 0 and "(default: verilator)" in out and "(default: 32)" in out
    assert "(default: 0)" in out        # a zero default is shown too


def test_graph_is_a_deprecated_name_of_dataset():
    argv = ["device", "run", "aggregate", "--graph", "rmat:6:2", "--feat-dim", "4"]
    assert cli.build_parser(argv).parse_args(argv).dataset == "rmat:6:2"
    rc, _, err = run_cli("verify", "aggregate", "--graph", "cora", "--feat-dim", "0")
    assert rc == 2 and "--graph is deprecated: use --dataset" in err
    assert "--feat-dim must be >= 1" in err


def test_a_bug_keeps_its_traceback_and_says_so(monkeypatch, capsys):
    from gnnweave.host.commands import profile

    def broken(args):
        raise ValueError("not the user's fault")
    monkeypatch.setattr(profile, "run", broken)
    assert cli.main(["profile", "--devices", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: not the user's fault" in err
    assert err.strip().splitlines()[-1] == cli.BUG_HINT


def test_a_reader_that_stops_early_is_not_a_bug():
    # `gnnweave ... --json | head`: the pipe closes under the report
    code = ("import sys; from gnnweave import cli; from gnnweave.host.commands import profile\n"
            "def closed(args):\n    raise BrokenPipeError(32, 'Broken pipe')\n"
            "profile.run = closed\nsys.exit(cli.main(['profile', '--devices', 'cpu']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 141 and proc.stderr == ""


def test_a_lost_rank_leaves_without_interpreter_teardown():
    # gloo's worker thread may still free the failed collective's tensors; a normal exit
    # races it through interpreter finalisation (std::terminate); the error must leave at once
    code = ("import atexit, sys; from gnnweave import cli; from gnnweave.host.commands import profile\n"
            "from gnnweave.host.distributed import RankLost\n"
            "atexit.register(lambda: print('finalised', file=sys.stderr))\n"
            "def lost(args):\n    raise RankLost('rank 0 of 2: an all-reduce failed')\n"
            "profile.run = lost\nsys.exit(cli.main(['profile', '--devices', 'cpu']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "gnnweave profile: error: rank 0 of 2: an all-reduce failed\n"


@pytest.mark.parametrize("args, needle", [
    (["profile", "--devices", "cpu", "--out", "{file}"], "--out {file}: is a file; give a folder"),
    (["train", "--dataset", "sbm:60:2", "--out", "{file}"], "--out {file}: is a file; give a folder"),
    (["train", "--dataset", "sbm:60:2", "--checkpoint-dir", "{file}/x"], "{file} is a file, not a folder"),
    (["predict", "--model", "nosuch.npz", "--out", "{file}"], "--out {file}: is a file"),
    (["build", "verilog", "--out", "{file}"], "--out {file}: is a file; give a folder"),
    (["train", "--devices", "gpu=1:16", "cpu"], "=SPEED:MEM and @GROUP are for gnnweave plan"),
    (["train", "--devices", "cpu*0"], "COUNT after '*' must be an integer >= 1"),
    (["plan", "--dataset", "cora", "--devices", "cpu", "--hidden", "0"], "--hidden must be >= 1"),
])
def test_output_paths_and_device_words_are_checked_before_any_work(tmp_path, args, needle):
    file = tmp_path / "a-file"
    file.write_text("")
    args = [a.replace("{file}", str(file)) for a in args]
    rc, out, err = run_cli(*args)
    assert rc == 2, (rc, out, err)
    assert needle.replace("{file}", str(file)) in err and "Traceback" not in err


def test_train_and_plan_read_the_same_device_words():
    from gnnweave.host.commands.train import add_arguments, config_from_args
    import argparse
    parser = add_arguments(argparse.ArgumentParser())
    cfg = config_from_args(parser.parse_args(["--devices", "fpga-emu*2", "cpu"]))
    assert cfg.devices == ["fpga-emu:0", "fpga-emu:1", "cpu"] and cfg.partition == "even"
    from gnnweave.host.planner import DeviceSpec
    assert [d.name for d in DeviceSpec.parse_many("fpga-emu*2")] == cfg.devices[:2]
    assert config_from_args(parser.parse_args(["--devices", "fpga-emu,cpu"])).devices == \
        ["fpga-emu", "cpu"]


def test_reports_print_as_an_aligned_table():
    from gnnweave.clitools import format_table
    text = format_table({"match": True, "cycles": 1234, "port_utilization": 0.123456789,
                         "devices": ["cpu", "fpga-emu"], "error": None})
    assert text.splitlines() == ["match             yes", "cycles            1234",
                                 "port utilization  0.1235", "devices           cpu, fpga-emu",
                                 "error             -"]


def test_a_missing_simulator_is_named_before_any_build():
    env = {"PATH": "/nonexistent", "HOME": "/nonexistent"}
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", "verify", "aggregate", "--dataset",
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


def test_an_empty_graph_is_named_before_any_build(tmp_path, capsys):
    import numpy as np
    path = tmp_path / "empty.npz"
    np.savez(path, x=np.zeros((0, 4), np.float32), y=np.zeros(0, np.int64),
             edge_index=np.zeros((2, 0), np.int64), train_mask=np.zeros(0, bool),
             val_mask=np.zeros(0, bool), test_mask=np.zeros(0, bool))
    assert cli.main(["device", "run", "aggregate", "--dataset", str(path), "--feat-dim", "4"]) == 2
    assert capsys.readouterr().err.strip() == \
        f"gnnweave device run aggregate: error: --dataset {path}: the graph has no nodes"
