"""SGC training steps on the TrainStage pipeline RTL, bit for bit against golden SGC.

``S^2 X`` comes from the golden Aggregator (bit-identical to the Aggregator RTL); the
linear classifier then trains on the RTL for whole epochs (the 140 Cora training nodes in
4 microbatches of 35 rows, the host computing the softmax-cross-entropy gradient from the
logits the RTL streams out) starting from the golden weights at some epoch. Every logit,
every input gradient and the master weights after the steps must equal golden's.

The full-width runs (1433 bag-of-words features + bias, a 2048-input stage) are slow: the
Verilog generation and Verilator build take minutes on a loaded 2-core machine and an
epoch is ~90k cycles. The default variants train on the first 7 propagated features (+
bias) in the Amaranth simulator; their golden side trains on exactly that slice.
"""
from __future__ import annotations


import numpy as np
import pytest

from gnnweave.datasets import data_root
from gnnweave.golden.sgc import SgcConfig
from gnnweave.sim.pipeline_bench import sgc_problem, verify_sgc_rtl
from tests.conftest import require_file


def _need(name):
    require_file(data_root() / f"{name}.npz", "dataset")


def _check(res, epochs):
    assert res["match"], res["mismatches"]
    assert res["rtl_microbatches"] == 4 * epochs
    assert res["rows_per_microbatch"] == [35, 35, 35, 35]
    return res


def test_sgc_problem_replays_golden_training():
    """The problem handed to the RTL is the golden SGC training itself (no RTL involved):
    from epoch 0 its golden run ends on the weights train_sgc reaches after 2 epochs."""
    _need("cora")
    from gnnweave.golden.sgc import train_sgc
    problem, info = sgc_problem("cora", start_epoch=0, rtl_epochs=2, features=7)
    trace = problem.run_golden()
    assert info["velocity_zero"] and info["d_in"] == 8
    cfg = SgcConfig(epochs=2)
    setup = info["setup"]
    res = train_sgc("cora", cfg, setup=setup)
    assert np.array_equal(res.master, trace.masters[0])
    assert np.any(trace.masters[0] != 0)


def test_sgc_slice_two_epochs_amaranth_from_epoch0():
    _need("cora")
    res = _check(verify_sgc_rtl("cora", start_epoch=0, rtl_epochs=2, features=7, lanes=4,
                                simulator="amaranth"), 2)
    assert res["trajectory_match"] is True


def test_sgc_slice_trained_weights_amaranth():
    """From the weights and SGD velocity after 30 golden epochs (the velocity loaded through
    the stage's velocity port): the RTL continues the golden SGC training itself."""
    _need("cora")
    res = _check(verify_sgc_rtl("cora", start_epoch=30, rtl_epochs=1, features=7, lanes=4,
                                simulator="amaranth"), 1)
    assert res["velocity_zero_at_start"] is False and res["velocity_loaded"] is True
    assert res["trajectory_match"] is True


@pytest.mark.slow
def test_sgc_full_width_verilator_from_epoch0():
    """All 1433 features: two epochs (8 microbatches) on the RTL continue the golden SGC
    training bit for bit."""
    _need("cora")
    res = _check(verify_sgc_rtl("cora", start_epoch=0, rtl_epochs=2, lanes=8), 2)
    assert res["d_in"] == 1434 and res["trajectory_match"] is True


@pytest.mark.slow
def test_sgc_full_width_verilator_trained_weights():
    _need("cora")
    res = _check(verify_sgc_rtl("cora", start_epoch=40, rtl_epochs=1, lanes=8), 1)
    assert res["velocity_loaded"] is True and res["trajectory_match"] is True
