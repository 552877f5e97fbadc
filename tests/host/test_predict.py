"""train -> save -> load -> predict: inference reproduces what training measured."""
import json
import subprocess
import sys

import numpy as np
import pytest

import gnnweave
from gnnweave.host.modelfile import ModelFileError, load_model, save_model
from gnnweave.host.predict import PredictError, predict
from gnnweave.host.train import params_digest
from tests.conftest import require

SBM = "sbm:400:3"


@pytest.fixture(scope="module")
def fpga_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "gcn-fpga.npz"
    model = gnnweave.train(SBM, model="gcn", device="fpga-emu", epochs=15, progress=False)
    model.save(path)
    return model, path


def test_fixed_point_predict_reproduces_training_exactly(fpga_model):
    model, path = fpga_model
    loaded = gnnweave.load_model(path)
    assert loaded.saved.params_sha256 == params_digest(loaded.params) == \
        model.result["seeds"][0]["params_sha256"]
    res = loaded.predict()
    assert res.dataset_matches_training
    assert res.test_acc == model.test_acc == model.result["test_acc_mean"]
    again = loaded.predict(SBM)
    assert np.array_equal(again.logits, res.logits)   # the fixed-point path is deterministic


def test_cpu_predict_reproduces_training_and_other_devices_agree(tmp_path):
    model = gnnweave.train(SBM, model="sage", epochs=10, progress=False)
    path = model.save(tmp_path / "sage.npz")
    res = gnnweave.load_model(path).predict()
    assert res.test_acc == model.test_acc
    split = gnnweave.load_model(path).predict(devices=["cpu", "cpu:b"])
    # a row split of the aggregation computes each row as a whole: the same numbers
    np.testing.assert_allclose(split.logits, res.logits, rtol=0, atol=1e-5)
    assert np.array_equal(split.predictions, res.predictions)


def test_sgc_round_trip(tmp_path):
    model = gnnweave.train(SBM, model="sgc", epochs=20, progress=False)
    res = gnnweave.load_model(model.save(tmp_path / "sgc.npz")).predict()
    assert res.test_acc == model.test_acc


def test_model_file_keeps_every_field(fpga_model, tmp_path):
    model, path = fpga_model
    saved = load_model(path)
    assert (saved.model, saved.layers, saved.device, saved.hidden) == ("gcn", 2, "fpga-emu", 16)
    for k, v in model.params.items():
        assert saved.params[k].dtype == v.dtype and np.array_equal(saved.params[k], v)
    copy = save_model(saved, tmp_path / "copy.npz")
    assert load_model(copy).meta() == saved.meta()


def test_predict_on_data_that_does_not_fit_is_refused(fpga_model):
    _, path = fpga_model
    with pytest.raises(PredictError, match="features per node, the model was trained on"):
        predict(load_model(path), "sbm:400:3:8")


@pytest.mark.parametrize("content, message", [
    (None, "no such model file"), (b"not a zip", "not a readable model file")])
def test_bad_model_files_are_named(tmp_path, content, message):
    path = tmp_path / "m.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        load_model(path)
    np.savez(tmp_path / "other.npz", a=np.zeros(2))
    with pytest.raises(ModelFileError, match="not a gnnweave model"):
        load_model(tmp_path / "other.npz")


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", *args], capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def test_command_line_train_save_predict(tmp_path):
    model = tmp_path / "gcn.npz"
    rc, out, err = run_cli("train", "--dataset", SBM, "--epochs", "5", "--save-model", str(model),
                           "--no-progress", "--json")
    assert rc == 0, err
    trained = json.loads(out)
    assert trained["saved_model"] == str(model)
    rc, out, err = run_cli("predict", "--model", str(model), "--out", str(tmp_path / "p"),
                           "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["test_acc"] == trained["test_acc_mean"] == report["trained_test_acc"]
    rows = np.loadtxt(tmp_path / "p" / "predictions.csv", delimiter=",", skiprows=1, dtype=int)
    assert rows.shape == (400, 2) and set(rows[:, 1]) <= {0, 1, 2}


def test_save_model_path_is_checked_before_training(tmp_path):
    rc, _, err = run_cli("train", "--dataset", SBM, "--epochs", "500", "--save-model",
                         str(tmp_path))
    assert rc == 2 and "is a folder; give a file name" in err
    (tmp_path / "plain").write_text("")
    rc, _, err = run_cli("train", "--dataset", SBM, "--save-model",
                         str(tmp_path / "plain" / "m.npz"))
    assert rc == 2 and "is a file, not a folder" in err
    rc, _, err = run_cli("train", "--dataset", SBM, "--epochs", "1", "--save-model",
                         str(tmp_path / "new" / "m.npz"))
    assert rc == 0 and (tmp_path / "new" / "m.npz").is_file()


@pytest.mark.parametrize("name", ["gcn", "sage", "sgc"])
def test_pyg_export_computes_what_the_model_computes(name):
    torch = require("torch")
    pyg = require("torch_geometric")
    from gnnweave.datasets import load_dataset
    from gnnweave.host.models import row_normalize
    model = gnnweave.train(SBM, model=name, epochs=3, progress=False)
    ds = load_dataset(SBM)
    x = torch.from_numpy(np.asarray(ds.x, np.float32))
    if model.saved.normalize_features and ds.x.min() >= 0:
        x = torch.from_numpy(row_normalize(ds.x).astype(np.float32))
    edge_index = torch.from_numpy(ds.edge_index)
    dims = [model.saved.in_dim] + [model.saved.hidden] * (model.saved.layers - 1) + [model.saved.out_dim]
    nn = pyg.nn
    if name == "sgc":
        net = torch.nn.Module()
        net.conv = nn.SGConv(model.saved.in_dim, model.saved.out_dim, K=model.saved.layers)
        forward = lambda: net.conv(x, edge_index)  # noqa: E731
    else:
        layer = (lambda a, b: nn.GCNConv(a, b)) if name == "gcn" else \
            (lambda a, b: nn.SAGEConv(a, b, aggr="mean"))
        net = torch.nn.Module()
        net.convs = torch.nn.ModuleList([layer(a, b) for a, b in zip(dims[:-1], dims[1:])])

        def forward():
            h = x
            for i, conv in enumerate(net.convs):
                h = conv(h, edge_index)
                if i < len(net.convs) - 1:
                    h = torch.relu(h)
            return h
    net.load_state_dict(model.to_pyg_state_dict())
    with torch.no_grad():
        theirs = forward().numpy()
    ours = model.predict().logits
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_python_api_takes_the_command_lines_placement_words(tmp_path):
    model = gnnweave.train(SBM, devices=["fpga-emu", "cpu"], partition="auto", epochs=3,
                           progress=False)
    assert model.result["rebalances"] is not None          # auto: rebalanced each epoch
    assert set(model.result["shares"]) == {"fpga-emu", "cpu"}
    res = gnnweave.load_model(model.save(tmp_path / "m.npz")).predict()
    assert res.devices == ["fpga-emu", "cpu"] and res.test_acc == model.test_acc


def test_best_val_saves_the_epoch_it_reports(tmp_path):
    kw = dict(model="gcn", epochs=30, lr=0.5, progress=False)
    best = gnnweave.train(SBM, select="best_val", **kw)
    last = gnnweave.train(SBM, select="last", **kw)
    chosen = best.result["seeds"][0]["best_val"]
    assert chosen["epoch"] < 30 and best.test_acc == chosen["test_acc"] != last.test_acc
    saved = gnnweave.load_model(best.save(tmp_path / "best.npz"))
    assert saved.saved.epochs_done == chosen["epoch"]
    assert saved.predict().test_acc == best.predict().test_acc == best.test_acc
    assert gnnweave.load_model(last.save(tmp_path / "last.npz")).predict().test_acc == \
        last.test_acc
