"""Checkpoints: atomic files, readable errors, bit-identical resume, Ctrl-C."""
import os
import stat

import numpy as np
import pytest

from gnnweave.datasets import load_dataset
from gnnweave.host.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from gnnweave.host.train import TrainConfig, run_training


@pytest.fixture(scope="module")
def sbm():
    return load_dataset("sbm:300:3")


def test_round_trip_and_atomic_replace(tmp_path):
    p = tmp_path / "c.npz"
    save_checkpoint(p, {"a": np.arange(5.0)}, {"epoch": 3, "rng": {"state": 2 ** 100}})
    save_checkpoint(p, {"a": np.arange(6.0)}, {"epoch": 4})
    arrays, meta = load_checkpoint(p)
    np.testing.assert_array_equal(arrays["a"], np.arange(6.0))
    assert meta["epoch"] == 4
    assert [f.name for f in tmp_path.iterdir()] == ["c.npz"]   # no temp files left


def test_failed_save_keeps_the_old_file(tmp_path):
    p = tmp_path / "c.npz"
    save_checkpoint(p, {"a": np.ones(2)}, {"epoch": 1})
    with pytest.raises(TypeError):
        save_checkpoint(p, {"a": np.ones(2)}, {"epoch": object()})   # not JSON
    assert load_checkpoint(p)[1]["epoch"] == 1
    assert [f.name for f in tmp_path.iterdir()] == ["c.npz"]


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="bad.npz: unreadable"):
        load_checkpoint(bad)
    np.savez(tmp_path / "plain.npz", a=np.ones(1))
    with pytest.raises(CheckpointError, match="not a gnnweave checkpoint"):
        load_checkpoint(tmp_path / "plain.npz")


def _interrupt_at(epoch):
    def hook(seed, e, stats):
        if e == epoch:
            raise KeyboardInterrupt
    return hook


@pytest.mark.parametrize("extra", [
    dict(device="cpu"),
    dict(device="cpu", batch_size=32, fanouts=(4, 4)),
    dict(device="fpga-emu", optimizer="sgd", lr=0.1),
])
def test_interrupt_then_resume_is_bit_identical(sbm, tmp_path, extra):
    kw = dict(dataset=sbm, model="gcn", seeds=[4], epochs=7, progress=False, **extra)
    straight = run_training(TrainConfig(**kw))
    ck = tmp_path / "ck"
    first = run_training(TrainConfig(checkpoint_dir=str(ck), checkpoint_every=2,
                                     on_epoch_end=_interrupt_at(5), **kw))
    assert first["interrupted"] and first["seeds"][0]["epochs_done"] == 5
    assert (ck / "gcn-seed4.npz").is_file()
    resumed = run_training(TrainConfig(checkpoint_dir=str(ck), resume=True, **kw))
    s = resumed["seeds"][0]
    assert s["resumed_from"] == 5 and s["epochs_done"] == 7 and not resumed["interrupted"]
    assert s["params_sha256"] == straight["seeds"][0]["params_sha256"]
    assert s["test_acc"] == straight["seeds"][0]["test_acc"]


def test_resume_with_other_settings_is_refused(sbm, tmp_path):
    kw = dict(dataset=sbm, seeds=[0], epochs=2, progress=False, checkpoint_dir=str(tmp_path))
    run_training(TrainConfig(**kw))
    with pytest.raises(CheckpointError, match="config.lr"):
        run_training(TrainConfig(resume=True, lr=0.5, **kw))


def test_resume_needs_to_know_where_the_checkpoint_is(sbm):
    with pytest.raises(ValueError, match="TrainConfig.resume: give checkpoint_dir"):
        run_training(TrainConfig(dataset=sbm, epochs=1, resume=True, progress=False))


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_checkpoint_file_mode_follows_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path / "c.npz", {"a": np.ones(2)}, {})
        # reading the umask for that leaves it as it was
        assert os.umask(umask) == umask
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


def test_resume_of_a_finished_run_trains_no_more(sbm, tmp_path):
    kw = dict(dataset=sbm, seeds=[0], epochs=3, progress=False, checkpoint_dir=str(tmp_path))
    a = run_training(TrainConfig(**kw))
    b = run_training(TrainConfig(resume=True, **kw))
    assert b["seeds"][0]["params_sha256"] == a["seeds"][0]["params_sha256"]
    assert b["seeds"][0]["resumed_from"] == 3


def test_interrupt_in_the_middle_of_an_epoch_resumes_bit_identically(sbm, tmp_path, monkeypatch):
    """Ctrl-C during a mini-batch step: the checkpoint holds the last completed epoch (the
    live state is mid-epoch) and the resumed run replays that epoch exactly."""
    from gnnweave.host import train as train_mod
    kw = dict(dataset=sbm, model="sage", seeds=[1], epochs=4, batch_size=16, fanouts=(3, 3),
              progress=False)
    straight = run_training(TrainConfig(**kw))
    real_step = train_mod.Trainer.step
    calls = {"n": 0}

    def flaky_step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 10:          # epoch 3 (4 batches of 16 out of 60 train nodes)
            raise KeyboardInterrupt
        return real_step(self, *a, **k)

    monkeypatch.setattr(train_mod.Trainer, "step", flaky_step)
    first = run_training(TrainConfig(checkpoint_dir=str(tmp_path), **kw))
    assert first["interrupted"] and first["seeds"][0]["epochs_done"] == 2
    monkeypatch.setattr(train_mod.Trainer, "step", real_step)
    resumed = run_training(TrainConfig(checkpoint_dir=str(tmp_path), resume=True, **kw))
    assert resumed["seeds"][0]["params_sha256"] == straight["seeds"][0]["params_sha256"]
