"""Faults over ranks (two ``gnnweave train --dist`` processes, as torchrun would start them
on two hosts): a rank killed mid-run makes the other stop with a one-line error well within
60 s, a rank that hangs makes it stop once ``--comm-timeout`` has passed, and the killed
run's checkpoint resumes in one process to the bits of a run that was never
interrupted."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gnnweave.host.checkpoint import load_checkpoint
from gnnweave.host.train import TrainConfig, run_training
from tests.conftest import require, require_dataset

ROOT = Path(__file__).resolve().parents[2]


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, port, ckpt, log, comm_timeout_s):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               LOCAL_RANK=str(rank), WORLD_SIZE="2", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "gnnweave", "train", "--dist", "--dataset", "cora",
           "--device", "fpga-emu", "--epochs", "400", "--checkpoint-dir", str(ckpt),
           "--checkpoint-every", "1", "--comm-timeout", str(comm_timeout_s), "--no-progress",
           "--json"]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _interrupted_run(tmp, sig, comm_timeout_s):
    """Start two ranks, send ``sig`` to rank 1 once training is under way, and return how
    rank 0 ended: exit code, seconds from the signal to its exit, its output."""
    require("torch")
    require("pymetis")
    require_dataset("cora")
    ckpt = tmp / "ckpt"
    port = _free_port()
    logs = [open(tmp / f"rank{r}.log", "w+") for r in range(2)]
    procs = [_rank(r, port, ckpt, logs[r], comm_timeout_s) for r in range(2)]
    try:
        path = ckpt / "gcn-seed0.npz"
        deadline = time.monotonic() + 240
        while not path.exists():   # training is under way once rank 0 wrote a checkpoint
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            assert procs[0].poll() is None and procs[1].poll() is None, \
                (tmp / "rank0.log").read_text()[-2000:]
            time.sleep(0.2)
        time.sleep(0.5)
        os.kill(procs[1].pid, sig)
        signalled = time.monotonic()
        try:
            rc = procs[0].wait(timeout=90)
        except subprocess.TimeoutExpired:
            rc = None
        waited = time.monotonic() - signalled
        logs[0].seek(0)
        return dict(rc=rc, waited=waited, output=logs[0].read(), checkpoint=path)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)   # also a stopped rank and any children
            except ProcessLookupError:
                pass
            p.wait()
        for f in logs:
            f.close()


def _assert_one_line_rank_error(run):
    assert run["rc"] == 2, run["output"][-2000:]
    last = run["output"].strip().splitlines()[-1]
    assert last.startswith("gnnweave train: error: rank 0 of 2:"), last
    assert "another rank has stopped or is unreachable" in last
    assert "Traceback" not in run["output"]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    # a short collective timeout: even a death that only the timeout catches stops in time
    return _interrupted_run(tmp_path_factory.mktemp("killed"), signal.SIGKILL, 20)


def test_a_killed_rank_stops_the_other_with_a_clear_error(killed_run):
    _assert_one_line_rank_error(killed_run)
    assert killed_run["waited"] < 60


def test_a_hung_rank_stops_the_other_after_the_comm_timeout(tmp_path):
    hung = _interrupted_run(tmp_path, signal.SIGSTOP, 8)
    _assert_one_line_rank_error(hung)
    assert 8 <= hung["waited"] < 60, hung["waited"]


def test_the_killed_runs_checkpoint_resumes_in_one_process_bit_for_bit(killed_run, tmp_path):
    arrays, meta = load_checkpoint(killed_run["checkpoint"])
    done = int(meta["epoch"])
    assert done >= 1
    epochs = done + 3
    kw = dict(dataset="cora", model="gcn", device="fpga-emu", epochs=epochs, seeds=[0],
              progress=False)
    import shutil
    resume_dir = tmp_path / "resume"
    shutil.copytree(killed_run["checkpoint"].parent, resume_dir)
    from gnnweave.host.distributed import Comm, run_rank
    resumed = run_rank(TrainConfig(**kw, checkpoint_dir=str(resume_dir), resume=True), Comm())
    assert resumed["seeds"][0]["resumed_from"] == done
    straight = run_training(TrainConfig(**kw, rank_invariant=True))
    assert resumed["seeds"][0]["params_sha256"] == straight["seeds"][0]["params_sha256"]
