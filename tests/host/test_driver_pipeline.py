"""The driver's training Pipeline on the simulated device (the `small` build's two-stage
Pipeline unit): a pipeline training run bit-identical with GoldenPipeline (logits, stage 0
dX, final master weights) through genuine pynq and through SimAccel, the weights load/store
round trip, the loss-gradient doorbell's failure path, and argument validation before any
device access.

pynq is part of ``make setup``; without it the pynq cases skip, unless
``GNNWEAVE_REQUIRE_PYNQ=1``, where a missing pynq fails them."""
from __future__ import annotations

import numpy as np
import pytest

from gnnweave.golden.pipeline import TrainFormat
from gnnweave.host import driver
from gnnweave.sim.pipeline_unit_bench import unit_problem

from .test_driver import open_accel

FMT = TrainFormat()


@pytest.fixture(scope="module")
def direct():
    accel, device, owner = driver.open_sim_accel(config="small", latency=16, mem_size=1 << 22,
                                                 use_pynq=False)
    yield accel, device
    owner.close()


def _train(accel, pb, *, dx=True):
    return accel.train_pipeline(pb.inputs, pb.loss_grad, microbatches=pb.microbatches,
                                weights=pb.masters, schedule=pb.schedule, relu=pb.relu,
                                lr=0.25, wd=1e-3, mu=0.5, fmt=pb.fmt, dx=dx, timeout_s=120)


def _check(pb, run, trace):
    n = len(pb.inputs)
    for i in range(n):
        np.testing.assert_array_equal(run.logits[i], trace.outputs[-1][i], err_msg=f"logits {i}")
        if run.dx is not None:
            np.testing.assert_array_equal(run.dx[i], trace.input_grads[0][i], err_msg=f"dx {i}")
    for s in range(pb.stages):
        np.testing.assert_array_equal(run.weights[s], trace.masters[s], err_msg=f"stage {s} masters")
    assert run.counters["logits_done"] == n
    assert run.counters["flags"]["config_error"] is False
    assert run.counters["grad_wait_cycles"] > 0          # the unit waited for the host
    assert sum(c["ops_done"] for c in run.stage_counters) > 0
    assert 0.0 <= run.bubble_fraction() < 1.0


@pytest.mark.parametrize("backend,schedule", [("pynq", "gpipe"), ("direct", "1f1b-async")])
def test_train_pipeline_bit_exact_with_golden(backend, schedule):
    accel, _device, owner = open_accel(backend, config="small", latency=16, mem_size=1 << 22)
    try:
        assert accel.has_pipeline and accel.pipeline_stages == 2
        assert accel.pipeline_limits == {"max_in": 16, "max_out": 16, "max_rows": 16, "slots": 8}
        pb = unit_problem(schedule, seed=11, microbatches=2, steps=2)
        assert (pb.lr_q, pb.wd_q, pb.mu_q) == FMT.sgd.quantize_hyper(0.25, 1e-3, 0.5)
        golden = pb.golden_pipeline()
        run = _train(accel, pb, dx=schedule == "gpipe")
        trace = golden.run(pb.schedule, pb.inputs, pb.loss_grad, microbatches=pb.microbatches)
        _check(pb, run, trace)
        assert (run.dx is None) == (schedule != "gpipe")
        # a second run continues from the trained weights and the velocity on chip, as the
        # same golden object does
        pb2 = unit_problem(schedule, seed=12, microbatches=2, steps=1)
        run2 = accel.train_pipeline(pb2.inputs, pb2.loss_grad, microbatches=2, dims=[7, 12, 5],
                                    schedule=schedule, lr=0.25, wd=1e-3, mu=0.5, timeout_s=120)
        trace2 = golden.run(schedule, pb2.inputs, pb2.loss_grad, microbatches=2)
        _check(pb2, run2, trace2)
        # loading weights again is a fresh start (velocity cleared), as a new golden model
        run3 = _train(accel, pb2)
        _check(pb2, run3, pb2.run_golden())
    finally:
        owner.close()


def test_weights_round_trip_through_pynq():
    accel, _device, owner = open_accel("pynq", config="small", latency=8, mem_size=1 << 22)
    try:
        rng = np.random.default_rng(3)
        w0 = rng.integers(-(1 << 31), 1 << 31, size=(16, 9))
        w1 = rng.integers(-(1 << 31), 1 << 31, size=(9, 13))
        w1[0, :2] = [-(1 << 31), (1 << 31) - 1]
        accel.load_weights(0, w0)
        accel.load_weights(1, w1)
        np.testing.assert_array_equal(accel.read_weights(1), w1)
        np.testing.assert_array_equal(accel.read_weights(0), w0)
        # another shape reads the same words: the first 3 x 4 block of stage 1
        np.testing.assert_array_equal(accel.read_weights(1, (3, 4)), w1[:3, :4])
    finally:
        owner.close()


@pytest.mark.parametrize("fail_at", [0, 1])
def test_loss_grad_failure_recovers_the_device(direct, fail_at):
    """The host's loss gradient fails: at microbatch 0 with a wrong shape (no backward has
    run yet), or at microbatch 1 with an exception, after microbatch 0's backward added its
    dW into the stages' gradient sums, which the reset leaves on chip. The device is idle
    again, and the retrain (its weight load is a fresh start: velocity and gradient sums
    cleared) equals golden."""
    accel, _device = direct
    pb = unit_problem("1f1b-flush", seed=4 + fail_at, microbatches=2, steps=1)

    def failing_grad(i, z):
        if i < fail_at:
            return pb.loss_grad(i, z)
        if fail_at == 0:
            return np.zeros((3, 3))               # wrong shape
        raise RuntimeError("host loss failed")
    match = (r"loss_grad_fn\(0, \.\.\.\): shape \(3, 3\), expected \(5, 5\)" if fail_at == 0
             else "host loss failed")
    with pytest.raises(ValueError if fail_at == 0 else RuntimeError, match=match):
        accel.train_pipeline(pb.inputs, failing_grad, microbatches=2, weights=pb.masters,
                             schedule="1f1b-flush", lr=0.25, timeout_s=60)
    assert accel.is_idle()
    golden = pb.golden_pipeline()
    golden.lr_q, golden.wd_q, golden.mu_q = FMT.sgd.quantize_hyper(0.25)
    run = accel.train_pipeline(pb.inputs, pb.loss_grad, microbatches=2, weights=pb.masters,
                               schedule="1f1b-flush", lr=0.25, timeout_s=60)
    trace = golden.run("1f1b-flush", pb.inputs, pb.loss_grad, microbatches=2)
    for i in range(2):
        np.testing.assert_array_equal(run.logits[i], trace.outputs[-1][i], err_msg=f"logits {i}")
    for s in range(2):
        np.testing.assert_array_equal(run.weights[s], trace.masters[s], err_msg=f"stage {s}")


def test_timeout_when_the_host_never_answers(direct):
    """A loss gradient that never comes (a hung host callback cannot be simulated, so the
    timeout is shorter than one doorbell round trip): AcceleratorTimeout with the status."""
    accel, _device = direct
    pb = unit_problem("gpipe", seed=6, microbatches=2, steps=1)
    for s, w in enumerate(pb.masters):
        accel.load_weights(s, w)
    with pytest.raises(driver.AcceleratorTimeout, match="no ap_done within") as exc:
        accel.train_pipeline(pb.inputs, pb.loss_grad, microbatches=2, dims=[7, 12, 5],
                             lr=0.25, timeout_s=1e-9)
    assert "busy_cycles" in exc.value.status
    accel.recover()
    assert accel.is_idle()


def test_arguments_are_checked_before_the_device_is_touched(direct, monkeypatch):
    accel, _device = direct
    pb = unit_problem("gpipe", seed=1, microbatches=2, steps=1)

    def touched(*a, **k):
        raise AssertionError("the device was touched")
    monkeypatch.setattr(accel.io, "write32", touched)
    monkeypatch.setattr(accel.io, "read32", touched)
    monkeypatch.setattr(accel.io, "allocate", touched)
    ok = dict(microbatches=2, weights=pb.masters, lr=0.25)
    cases = [
        (dict(ok, microbatches=0), "microbatches 0: must be an integer in 1..255"),
        (dict(ok, microbatches=3), "inputs: 2 microbatches do not split into steps of 3"),
        (dict(ok, weights=pb.masters[:1]), "weights: 1 matrices, this Pipeline has 2 stages"),
        (dict(ok, weights=[pb.masters[0], pb.masters[1][:5]]), r"weights\[1\]: 5 rows, stage 0 outputs 12"),
        (dict(ok, weights=[np.zeros((7, 17)), np.zeros((17, 5))]), "stage 0: d_out = 17, this Pipeline takes 1..16"),
        (dict(ok, weights=None), "give weights="),
        (dict(ok, schedule="zigzag"), "schedule 'zigzag': choose one of"),
        (dict(ok, relu=[True]), "relu"),
        (dict(ok, lr=-1.0), "lr must be >= 0"),
        (dict(ok, timeout_s=0), "timeout_s 0: must be a positive number"),
        (dict(ok, fmt=TrainFormat(sgd=FMT.sgd.__class__(lr=FMT.sgd.wd))), r"fmt.sgd.lr"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            accel.train_pipeline(pb.inputs, pb.loss_grad, **kw)
    with pytest.raises(ValueError, match=r"inputs\[1\]: shape \(5, 6\), expected \(5, 7\)"):
        accel.train_pipeline([pb.inputs[0], pb.inputs[1][:, :6]], pb.loss_grad, **ok)
    with pytest.raises(ValueError, match=r"inputs\[0\]\[0, 0\] = 40000 is outside"):
        accel.train_pipeline([np.full((5, 7), 40000), pb.inputs[1]], pb.loss_grad, **ok)
    with pytest.raises(ValueError, match="inputs: 17 rows per microbatch, this Pipeline takes 1..16"):
        accel.train_pipeline([np.zeros((17, 7))] * 2, pb.loss_grad, **ok)
    with pytest.raises(ValueError, match="GPipe holds every microbatch of a step, this Pipeline has 8 slots"):
        accel.train_pipeline([pb.inputs[0]] * 9, pb.loss_grad, **dict(ok, microbatches=9))
    with pytest.raises(ValueError, match="loss_grad_fn: must be callable"):
        accel.train_pipeline(pb.inputs, None, **ok)
    with pytest.raises(ValueError, match=r"stage 2: must be an integer in 0..1"):
        accel.load_weights(2, pb.masters[0])
    with pytest.raises(ValueError, match=r"w_master\[0, 1\] = 4294967296 is outside"):
        accel.load_weights(0, np.array([[0, 1 << 32]]))
    with pytest.raises(ValueError, match="w_master: d_in = 17, this Pipeline takes 1..16"):
        accel.load_weights(0, np.zeros((17, 3)))
    with pytest.raises(ValueError, match=r"read_weights\(stage=1\): give shape"):
        accel.loaded_shapes.clear()
        accel.read_weights(1)


def test_device_run_pipeline_cli_matches_golden():
    import json
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", "device", "run", "pipeline",
                           "--schedule", "1f1b-flush", "--microbatches", "3", "--steps", "2",
                           "--rows", "6", "--dim", "12", "--classes", "7", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["match"] and report["mismatches"] == []
    assert report["counters"]["logits_done"] == 6
    assert 0.0 <= report["bubble"] < 1.0 and report["bubble_formula"] == round(1 / 4, 4)
    assert report["cycles"] > report["grad_wait_cycles"] > 0 and report["wall_seconds"] > 0
