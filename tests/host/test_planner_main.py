"""Op placement, plan_main (the `gnnweave plan` entry) and the profile reader."""
import json
import os
import re

import numpy as np
import pytest

from gnnweave.host.planner import (
    OpDevice,
    plan_main,
    plan_placement,
    simulate_placement,
)
from gnnweave.host.profiles import (
    ProfileError,
    available_profiles,
    linearize,
    parse_graph,
)

DIAMOND = """node1 -- Input -- forward_compute_time=9.0, backward_compute_time=0.0, activation_size=100.0, parameter_size=0.0
node2 -- Conv2d(a) -- forward_compute_time=1.0, backward_compute_time=2.0, activation_size=10.0, parameter_size=5.0
node3 -- ReLU -- forward_compute_time=0.5, backward_compute_time=0.5, activation_size=20.0, parameter_size=0.0
node4 -- Conv2d(b) -- forward_compute_time=2.0, backward_compute_time=3.0, activation_size=[30.0; 1.0], parameter_size=7.0
node5 -- Add -- forward_compute_time=0.1, backward_compute_time=0.1, activation_size=40.0, parameter_size=0.0
node6 -- __getitem__(1) -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=1.0, parameter_size=0.0
	node1 -- node2
	node2 -- node3
	node2 -- node4
	node3 -- node5
	node4 -- node5
	node4 -- node6
"""


def test_linearize_diamond_counts_crossing_bytes_exactly():
    chain = linearize(parse_graph(DIAMOND, "diamond"))
    # Input source and the unused __getitem__ sink are dropped, as in PipeDream's optimizer
    assert [n.split(":")[0] for n in chain.names] == ["node2", "node3", "node4", "node5"]
    assert list(chain.compute_ms) == [3.0, 1.0, 5.0, 0.2]
    # cut after node2: its output (10) feeds node3 and node4; after node3: node2's (10, still
    # needed by node4) + node3's (20); after node4: node3's 20 + node4's 31 (two outputs)
    assert list(chain.boundary_bytes) == [10.0, 30.0, 51.0]
    coarse = chain.coarsen(2)
    assert len(coarse) == 2 and coarse.compute_ms.sum() == pytest.approx(chain.compute_ms.sum())
    assert coarse.boundary_bytes[0] in chain.boundary_bytes


def test_profile_errors_name_the_line():
    with pytest.raises(ProfileError, match=r"x:2: not a node or edge line"):
        parse_graph(DIAMOND.splitlines()[0] + "\nrubbish\n", "x")
    bad = DIAMOND.replace("backward_compute_time=2.0", "backward_compute_time=abc")
    with pytest.raises(ProfileError, match=r"x:2: field 'backward_compute_time'"):
        parse_graph(bad, "x")
    cyc = DIAMOND + "\tnode5 -- node2\n"
    with pytest.raises(ProfileError, match="cycle"):
        linearize(parse_graph(cyc, "x"))


def test_placement_splits_aggregation_and_dense_like_hygcn():
    # an FPGA that gathers 10x faster than the GPU but multiplies 20x slower, and vice versa
    devs = [OpDevice("gpu", gather_rate=1e9, mac_rate=2e11, link_bytes_per_s=16e9),
            OpDevice("fpga", gather_rate=1e10, mac_rate=1e10, link_bytes_per_s=16e9)]
    shape = dict(num_edges=2_000_000, num_nodes=100_000, dims=[256, 256, 256])
    plan = plan_placement(devs, **shape, batches=8)
    for p in plan["placement"]:
        assert (p["aggregate"], p["dense"]) == ("fpga", "gpu")
    assert plan["predicted_step_s"] < 0.8 * min(plan["single_device_step_s"].values())
    # the schedule overlaps: the step is shorter than the serial sum of busy times
    assert plan["predicted_step_s"] < sum(plan["busy_s"].values())


def test_simulated_single_device_step_is_the_serial_sum():
    dev = OpDevice("cpu", gather_rate=1e8, mac_rate=1e9)
    dims, e, n = [8, 4, 2], 1000, 100
    sim = simulate_placement([("cpu", "cpu")] * 2, [dev], e, n, dims, batches=2)
    work = 0.0
    for fi, fo in zip(dims[:-1], dims[1:]):
        work += 2 * (e * fi) / 1e8 + 3 * (n * fi * fo) / 1e9
    assert sim["makespan_s"] == pytest.approx(work, rel=1e-12)


# without the shared profiles these skip, except under GNNWEAVE_REQUIRE_DATA=1 (CI): fail
needs_profiles = pytest.mark.skipif(
    not available_profiles() and os.environ.get("GNNWEAVE_REQUIRE_DATA") != "1",
    reason="no PipeDream profiles")


@needs_profiles
def test_plan_main_on_a_pipedream_model(tmp_path):
    rep = plan_main("gnmt", ["gpu:0=1:16", "gpu:1=1:16", "fpga=0.3:8"], out=str(tmp_path))
    assert rep["bottleneck_s"] == max(rep["stage_times_s"])
    assert (tmp_path / "plan.json").is_file() and (tmp_path / "plan.png").is_file()
    data = json.loads((tmp_path / "plan.json").read_text())
    stages = data["pipeline"]["stages"]
    assert stages[0]["first_cut"] == 0
    # every layer in exactly one stage; devices, replicas and the model recorded
    layers = [l for s in stages for l in s["layers"]]
    assert len(layers) == len(set(layers)) == rep["num_layers"]
    assert sum(s["replicas"] for s in stages) == sum(len(s["devices"]) for s in stages) <= 3
    assert data["pipeline"]["model"]["comm"] == "sender"
    assert data["stage_times_s"] == [s["time_s"] for s in stages]
    assert "bottleneck" in rep["text"]


def test_plan_cli_options_and_comm_models(tmp_path):
    from gnnweave.cli import main as cli_main

    out = tmp_path / "plan"
    rc = cli_main(["plan", "--model", "vgg16", "--devices", "gpu*4=1", "--comm", "none",
                   "--straight", "--bandwidth-gb-per-s", "10", "--out", str(out), "--json"])
    assert rc == 0
    data = json.loads((out / "plan.json").read_text())
    assert (out / "plan.png").is_file()
    assert all(s["replicas"] == 1 for s in data["pipeline"]["stages"])
    assert data["pipeline"]["model"] == {**data["pipeline"]["model"], "comm": "none",
                                         "replicate": False, "bandwidth_bytes_per_s": 10e9}
    reps = {c: plan_main("vgg16", ["gpu*4=1"], comm=c, straight=True)["bottleneck_s"]
            for c in ("none", "overlap", "sender")}
    # links only add terms: none <= overlap <= sender on one model
    assert reps["none"] <= reps["overlap"] <= reps["sender"]
    with pytest.raises(ValueError, match="comm='fast'"):
        plan_main("vgg16", ["gpu"], comm="fast")
    with pytest.raises(ValueError, match="COUNT"):
        plan_main("vgg16", ["gpu*x"])


def test_plan_main_on_a_dataset_and_bad_input(tmp_path):
    rng = np.random.default_rng(0)
    n = 200
    path = tmp_path / "tiny.npz"
    np.savez(path, x=rng.random((n, 12)).astype(np.float32), y=rng.integers(0, 3, n),
             edge_index=rng.integers(0, n, (2, 1500)))
    rep = plan_main(dataset=str(path), devices=["gpu=4", "fpga=1", "cpu=0.2"], hidden=8)
    assert rep["graph"]["dims"] == [12, 8, 3]
    rows = sorted(tuple(r) for r in rep["partition"].values())
    assert rows[0][0] == 0 and rows[-1][1] == n
    assert len(rep["placement"]["placement"]) == 2
    with pytest.raises(ValueError, match="exactly one"):
        plan_main("vgg16", ["gpu"], dataset=str(path))
    with pytest.raises(ValueError, match="'gpu' appears twice"):
        plan_main(dataset=str(path), devices=["gpu", "gpu=2"])
    with pytest.raises(FileNotFoundError, match="not found"):
        plan_main("no-such-model", ["gpu"])
    empty = tmp_path / "empty.npz"
    np.savez(empty, x=np.zeros((0, 4), np.float32), y=np.zeros(0, np.int64),
             edge_index=np.zeros((2, 0), np.int64))
    with pytest.raises(ValueError, match="empty.npz: the graph has no nodes"):
        plan_main(dataset=str(empty), devices=["gpu"])


def test_plan_main_takes_every_dataset_spec_train_takes(tmp_path):
    """`gnnweave plan --dataset sbm` / an edge list / an OGB folder, as `gnnweave train`."""
    rep = plan_main(dataset="sbm:300:3", devices=["gpu=4", "fpga=1"])
    assert rep["graph"]["nodes"] == 300 and rep["graph"]["classes"] == 3
    edges = tmp_path / "g.txt"
    edges.write_text("0 1\n1 2\n2 3\n3 0\n4 0\n")
    rep = plan_main(dataset=str(edges), devices=["gpu=4", "fpga=1"])
    assert rep["graph"]["nodes"] == 5 and rep["graph"]["edges"] == 5
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((3, 2), np.float32), y=np.zeros(3, np.int64),
             edge_index=np.array([[0, -1], [1, 2]]))
    with pytest.raises(ValueError, match="bad.npz: edge_index"):
        plan_main(dataset=str(bad), devices=["gpu"])


def test_plan_says_which_devices_the_cost_model_lacks(tmp_path):
    from gnnweave.host.costmodel import CostModel
    from gnnweave.host.profiler import profile
    path = tmp_path / "cm.json"
    profile(["fpga-emu"], quick=True, progress=False).cost_model.save(path)
    rep = plan_main(dataset="sbm:300:3", devices=["fpga-emu", "gpu=4"], cost_model=str(path))
    assert rep["rates_from"] == {"fpga-emu": "cost model", "gpu": "nominal x speed"}
    assert "nominal x SPEED: gpu" in rep["text"]
    assert CostModel.load(path).devices



def test_plan_without_shared_profiles_uses_the_shipped_examples(tmp_path, monkeypatch):
    # an empty $GNNWEAVE_PROFILES and no ../shared: the README's `plan --model vgg16` still
    # runs, on the shipped copy, which is byte-for-byte the profile it was taken from
    from gnnweave.host.planner import EXAMPLE_PROFILES, example_profiles, locate_profile
    from gnnweave.host.profiles import ProfileNotFoundError

    monkeypatch.setenv("GNNWEAVE_PROFILES", str(tmp_path))
    assert {"vgg16", "resnet18", "gnmt"} <= set(example_profiles())
    assert (EXAMPLE_PROFILES / "LICENSE").read_text().count("MIT License") == 1
    rep = plan_main("vgg16", ["gpu0=1.0:16", "gpu1=1.0:16", "fpga=0.3:4"])
    assert rep["profile"] == str(locate_profile("vgg16"))
    assert rep["profile"].startswith(str(EXAMPLE_PROFILES))
    with pytest.raises(ProfileNotFoundError,
                       match="'nosuchnet': profile not found .known: gnmt, resnet18, vgg16"):
        plan_main("nosuchnet", ["gpu"])
    monkeypatch.delenv("GNNWEAVE_PROFILES")
    shared = {m for m in available_profiles()} & set(example_profiles())
    for model in shared:
        assert ((EXAMPLE_PROFILES / "pipedream" / model / "graph.txt").read_bytes()
                == locate_profile(model).read_bytes())


def test_every_plan_option_has_help_and_a_default():
    from gnnweave import cli

    found = [o for o in cli.options(cli.build_parser(["plan"])) if o.words == ("plan",)]
    assert {"--model", "--dataset", "--devices", "--out"} <= {o.names[0] for o in found}
    for o in found:
        assert o.help, o.names
        # a value option shows its default (the formatter appends it, or the help says it)
        assert o.required or o.flag or o.default is not None or "default:" in o.help, \
            o.names


def test_plan_devices_are_the_train_syntax_with_speeds_and_groups():
    from gnnweave.host.planner import DeviceSpec

    words = DeviceSpec.parse_many("gpu*2=2:16@dc1, fpga=0.5")
    assert [(d.name, d.speed, d.memory_bytes, d.group) for d in words] == [
        ("gpu:0", 2.0, 16e9, "dc1"), ("gpu:1", 2.0, 16e9, "dc1"), ("fpga", 0.5, np.inf, "")]
    # one argument with commas, several words, or both: the same devices
    assert DeviceSpec.parse_many(["gpu*2=2:16@dc1", "fpga=0.5"]) == words
    assert DeviceSpec.parse_many("cpu,fpga-emu") == DeviceSpec.parse_many(["cpu", "fpga-emu"])
    for bad, needle in [("gpu=0", "SPEED and MEM_GB must be > 0"), ("gpu=x", "expected NAME"),
                        ("=1", "empty device name"), ("gpu*0", "COUNT after '*'"),
                        ("gpu:1,gpu*2", "'gpu:1' appears twice")]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            DeviceSpec.parse_many(bad)


def test_plan_out_is_a_folder_checked_before_the_plan(tmp_path, capsys):
    from gnnweave.cli import main as cli_main

    file = tmp_path / "taken"
    file.write_text("")
    assert cli_main(["plan", "--model", "nosuchnet", "--devices", "gpu", "--out", str(file)]) == 2
    # the path is refused before the (unknown) model is looked at
    assert capsys.readouterr().err.strip() == \
        f"gnnweave plan: error: --out {file}: is a file; give a folder"
    rep = plan_main(dataset="sbm:300:3", devices=["gpu=4,fpga=1"], out=str(tmp_path / "a" / "b"))
    assert rep["out"] == str(tmp_path / "a" / "b" / "plan.json")
    assert json.loads((tmp_path / "a" / "b" / "plan.json").read_text())["graph"]["nodes"] == 300
