"""Aggregation overlapped with the dense device (``overlap_chunks``): the same numbers as the
unchunked step, and timeline records of the two devices that overlap in time."""
import argparse
import time

import numpy as np
import pytest

from gnnweave.datasets import load_dataset
from gnnweave.host.executors import CpuExecutor, FpgaEmuExecutor
from gnnweave.host.engine import Engine
from gnnweave.host.models import LayerGraph, make_model, softmax_cross_entropy
from gnnweave.host.timeline import interval_overlap
from gnnweave.host.train import TrainConfig, add_train_arguments, config_from_args, run_training


@pytest.fixture(scope="module")
def sbm():
    return load_dataset("sbm:300:3")


class SlowCpu(CpuExecutor):
    """cpu ops that also sleep (releasing the GIL as a device would while it computes), so
    that two ops that run at once show overlapping intervals whatever the machine's load."""

    def __init__(self, name, seconds=0.01):
        super().__init__(name)
        self.seconds = seconds

    def aggregate(self, *a, **kw):
        time.sleep(self.seconds)
        return super().aggregate(*a, **kw)

    def dense_forward(self, *a, **kw):
        time.sleep(self.seconds)
        return super().dense_forward(*a, **kw)


def _engine(dense, agg, n, graph, k):
    return Engine(dense, shards={agg.name: (agg, (0, n))}, num_nodes=n, base_graph=graph,
                  overlap_chunks=k)


def _step(model_name, data, eng, *, hidden=16, seed=0):
    """One training step's forward and backward: (logits, grads, timeline records)."""
    graph = make_model(model_name, 1, 1).norm_graph(data.graph)
    eng.base_graph = graph
    model = make_model(model_name, data.x.shape[1], data.num_classes, hidden=hidden, seed=seed)
    layers = [LayerGraph(graph, graph.num_nodes)] * model.num_layers
    x = np.asarray(data.x, dtype=np.float32)
    logits, cache = model.forward(eng, x, layers, train=True, rng=np.random.default_rng(seed))
    _, d = softmax_cross_entropy(logits, data.y, np.flatnonzero(data.train_mask))
    grads = model.backward(eng, d, cache, layers)
    return logits, grads, list(eng.timeline.records)


def _agg_dense_overlap(records, agg_device, dense_device):
    agg = [r for r in records if r.device == agg_device and r.op == "aggregate"]
    dense = [r for r in records if r.device == dense_device and r.op == "dense_forward"]
    assert agg and dense
    return interval_overlap(agg, dense)


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_timeline_shows_aggregation_and_dense_overlapping_only_when_chunked(sbm, model):
    n = sbm.graph.num_nodes
    seen = {}
    for k in (1, 6):
        eng = _engine(SlowCpu("cpu"), SlowCpu("agg"), n, sbm.graph, k)
        try:
            logits, grads, recs = _step(model, sbm, eng)
        finally:
            eng.close()
        seen[k] = (_agg_dense_overlap(recs, "agg", "cpu"), logits, grads)
        if k > 1:
            # the first layer's output came in k chunks, each transformed on its own
            assert sum(r.op == "aggregate" for r in recs) >= k
    assert seen[1][0] == 0.0          # one op after the other
    assert seen[6][0] > 0.0           # chunk k's transform ran while chunk k+1 aggregated
    np.testing.assert_allclose(seen[6][1], seen[1][1], rtol=0, atol=1e-6 * np.abs(seen[1][1]).max())


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_float_path_within_1e6_relative(sbm, model):
    """numpy's BLAS (OpenBLAS here) does not promise that a row slice of a product has the
    bits of the whole product (on this machine it did for outputs <= 8 wide, not for 16):
    the float path is checked to 1e-6 of the largest magnitude, with a 16-wide output."""
    n = sbm.graph.num_nodes
    out = {}
    for k in (1, 4):
        eng = _engine(CpuExecutor("cpu"), CpuExecutor("cpu:1"), n, sbm.graph, k)
        assert eng.overlaps() == (k > 1)
        try:
            out[k] = _step(model, sbm, eng, hidden=32)[:2]
        finally:
            eng.close()
    ref_logits, ref_grads = out[1]
    got_logits, got_grads = out[4]
    scale = np.abs(ref_logits).max()
    assert np.abs(got_logits - ref_logits).max() <= 1e-6 * scale
    assert ref_grads.keys() == got_grads.keys()
    for name, g in ref_grads.items():
        assert np.abs(got_grads[name] - g).max() <= 1e-6 * max(np.abs(g).max(), 1e-30), name


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("minibatch", [False, True])
def test_fixed_point_aggregation_training_is_bit_identical(sbm, model, minibatch):
    """fpga-emu aggregates (its format comes from the whole input, each row on its own), the
    cpu transforms 3-wide outputs row by row: parameters after a few epochs are the same bits
    with and without overlap, in full-batch and mini-batch training."""
    kw = dict(dataset=sbm, model=model, seeds=[2], epochs=4, progress=False, device="cpu",
              devices=["fpga-emu"], partition="even")
    if minibatch:
        kw.update(batch_size=40, fanouts=(4, 4))
    plain = run_training(TrainConfig(overlap_chunks=1, **kw))
    chunked = run_training(TrainConfig(overlap_chunks=4, **kw))
    assert chunked["seeds"][0]["params_sha256"] == plain["seeds"][0]["params_sha256"]
    assert chunked["busy"]["fpga-emu"]["compute"] > 0


def test_no_overlap_when_one_executor_would_run_two_ops_or_dense_is_fixed_point(sbm):
    n = sbm.graph.num_nodes
    cpu = CpuExecutor("cpu")
    assert not Engine(cpu, shards={"cpu": (cpu, (0, n))}, num_nodes=n, overlap_chunks=4).overlaps()
    assert not Engine(cpu, overlap_chunks=4).overlaps()      # aggregation on the dense device
    emu = FpgaEmuExecutor()
    # a chunk of a fixed-point GEMM would get its own format: the dense side stays whole
    assert not Engine(emu, shards={"cpu:1": (CpuExecutor("cpu:1"), (0, n))}, num_nodes=n,
                      overlap_chunks=4).overlaps()
    assert Engine(cpu, shards={"fpga-emu": (emu, (0, n))}, num_nodes=n,
                  overlap_chunks=4).overlaps()


def test_overlap_chunks_option_and_errors(sbm):
    p = add_train_arguments(argparse.ArgumentParser())
    assert config_from_args(p.parse_args(["--overlap-chunks", "3"])).overlap_chunks == 3
    assert config_from_args(p.parse_args([])).overlap_chunks == 1
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"TrainConfig\.overlap_chunks = .*integer >= 1"):
            run_training(TrainConfig(dataset=sbm, overlap_chunks=bad, epochs=1, progress=False))
    with pytest.raises(ValueError, match=r"^overlap_chunks = 0: expected an integer >= 1$"):
        Engine(CpuExecutor(), overlap_chunks=0)
