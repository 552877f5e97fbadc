"""Slow runs over ranks: 4 ranks on CiteSeer reach the single-process accuracy, and a
torchrun job whose rank is killed restarts, resumes from its checkpoint and ends with the
digest of a run that was never interrupted."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnnweave.host.train import TrainConfig, run_training
from tests.conftest import require, require_dataset

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_four_ranks_on_citeseer_reach_the_published_gcn_accuracy():
    require("torch")
    require("pymetis")
    require_dataset("citeseer")
    from gnnweave.host.distributed import launch
    r = launch([TrainConfig(dataset="citeseer", model="gcn", seeds=5, progress=False)], 4)[0]
    assert r["world_size"] == 4
    assert r["test_acc_mean"] >= 0.695, r["test_acc_mean"]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_torchrun_kill_and_resume_gives_the_uninterrupted_digest(tmp_path):
    require("torch")
    require("pymetis")
    require_dataset("cora")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun not installed beside this python")
    epochs = 40
    out = tmp_path / "out"
    cmd = [torchrun, "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "-m", "gnnweave", "train", "--dist", "--resume",
           "--dataset", "cora", "--device", "fpga-emu", "--epochs", str(epochs),
           "--checkpoint-every", "5", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        ckpt = out / "checkpoints" / "gcn-seed0.npz"
        deadline = time.monotonic() + 300
        while not ckpt.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        workers = [c for p in _children(proc.pid) for c in [p] + _children(p)]
        victims = [w for w in workers if "gnnweave" in Path(f"/proc/{w}/cmdline").read_text()
                   .replace("\0", " ")] or workers
        os.kill(victims[-1], signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["seeds"][0]["resumed_from"] is not None
    straight = run_training(TrainConfig(dataset="cora", model="gcn", device="fpga-emu",
                                        epochs=epochs, seeds=[0], progress=False,
                                        rank_invariant=True))
    assert result["seeds"][0]["params_sha256"] == straight["seeds"][0]["params_sha256"]


def test_resume_with_a_different_world_size_is_bit_identical(tmp_path):
    require("torch")
    require("pymetis")
    require_dataset("cora")
    from gnnweave.host.distributed import launch
    kw = dict(dataset="cora", model="gcn", device="fpga-emu", dropout=0.5, seeds=[0],
              progress=False, checkpoint_dir=str(tmp_path), checkpoint_every=4)
    # 4 epochs on 4 ranks, then on to 8 on 2 ranks
    first = launch([TrainConfig(**kw, epochs=4)], 4)[0]
    assert first["seeds"][0]["epochs_done"] == 4
    second = launch([TrainConfig(**kw, epochs=8, resume=True)], 2)[0]
    assert second["seeds"][0]["resumed_from"] == 4
    straight = run_training(TrainConfig(**{**kw, "checkpoint_dir": None}, epochs=8,
                                        rank_invariant=True))
    assert second["seeds"][0]["params_sha256"] == straight["seeds"][0]["params_sha256"]
