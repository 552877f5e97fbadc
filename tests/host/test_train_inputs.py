"""Training refuses, before any work, inputs that would give a wrong answer or lose work."""
import numpy as np
import pytest

from gnnweave.datasets import load_dataset
from gnnweave.host.train import TrainConfig, run_training

SBM = "sbm:300:3"


def train(**kw):
    return run_training(TrainConfig(dataset=kw.pop("dataset", SBM), progress=False, **kw))


def test_zero_epochs_is_refused():
    with pytest.raises(ValueError, match="epochs = 0: must be >= 1"):
        train(epochs=0)


@pytest.mark.parametrize("field", ["out_dir", "checkpoint_dir"])
def test_an_output_folder_that_is_a_file_is_refused_before_training(tmp_path, field):
    path = tmp_path / "plain-file"
    path.write_text("")
    epochs_seen = []
    with pytest.raises(ValueError, match=f"{field} = .*is a file, not a folder"):
        train(epochs=50, **{field: str(path)},
              on_epoch_end=lambda seed, epoch, stats: epochs_seen.append(epoch))
    assert epochs_seen == []


def test_a_cost_model_path_that_is_a_folder_is_named(tmp_path):
    with pytest.raises(ValueError, match="cost_model = .*is a folder, not a cost model JSON"):
        train(epochs=1, cost_model=str(tmp_path))


def test_resume_past_the_asked_epochs_is_refused(tmp_path):
    train(epochs=4, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with pytest.raises(ValueError, match="checkpoint is at epoch 4, past the 2 epochs asked for"):
        train(epochs=2, checkpoint_dir=str(tmp_path), resume=True)
    res = train(epochs=6, checkpoint_dir=str(tmp_path), resume=True)
    assert res["seeds"][0]["resumed_from"] == 4 and res["seeds"][0]["epochs_done"] == 6


def test_no_training_nodes_is_refused():
    ds = load_dataset(SBM)
    ds.train_mask = np.zeros_like(ds.train_mask)
    with pytest.raises(ValueError, match="training mask selects no node"):
        train(dataset=ds, epochs=1)


def test_no_test_nodes_reports_no_accuracy_not_nan():
    ds = load_dataset(SBM)
    ds.test_mask = np.zeros_like(ds.test_mask)
    res = train(dataset=ds, epochs=2)
    assert res["test_acc_mean"] is None and res["seeds"][0]["test_acc"] is None
