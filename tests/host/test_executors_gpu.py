"""The gpu executor's torch code, checked against the cpu executor. On a machine with CUDA
it runs on the GPU; with a CPU-only torch it runs the same code on torch's CPU device;
without torch it is skipped (torch is the optional extra ``gpu``)."""
import numpy as np
import pytest

from tests.conftest import require

torch = require("torch")

from gnnweave.graph import CSRGraph  # noqa: E402
from gnnweave.host.executors import CpuExecutor, GpuExecutor, available_devices  # noqa: E402


@pytest.fixture(scope="module")
def gpu():
    if any(d.startswith("gpu:") for d in available_devices()):
        return GpuExecutor(0)
    return GpuExecutor(0, torch_device="cpu")


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(0)
    return CSRGraph.from_edge_index(rng.integers(0, 80, size=(2, 600)), 80,
                                    rng.uniform(0.1, 1, size=600))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("transpose", [False, True])
def test_gpu_aggregate_matches_cpu(gpu, graph, reduce, transpose):
    x = np.random.default_rng(1).normal(size=(80, 9)).astype(np.float32)
    for rows in (None, (10, 55)):
        got = gpu.aggregate(graph, x, reduce, rows=rows, transpose=transpose)
        ref = CpuExecutor().aggregate(graph, x, reduce, rows=rows, transpose=transpose)
        np.testing.assert_allclose(got.value, ref.value, rtol=1e-5, atol=1e-5)
        assert got.device_seconds is not None and got.executor == gpu.name


def test_gpu_dense_ops_match_cpu(gpu):
    rng = np.random.default_rng(2)
    x, w, b = rng.normal(size=(30, 12)), rng.normal(size=(12, 5)), rng.normal(size=5)
    dy, mask = rng.normal(size=(30, 5)), rng.random((30, 5)) > 0.5
    cpu = CpuExecutor()
    for call in (lambda e: e.dense_forward(x, w, b, relu=True),
                 lambda e: e.dense_input_grad(dy, w, relu_mask=mask),
                 lambda e: e.dense_weight_grad(x, dy, relu_mask=mask)):
        np.testing.assert_allclose(call(gpu).value, call(cpu).value, rtol=1e-5, atol=1e-5)
    moved = gpu.transfer_in(x.astype(np.float32))
    assert moved.bytes_in == x.astype(np.float32).nbytes
    np.testing.assert_array_equal(gpu.transfer_out(moved.value).value, moved.value)


def test_training_through_the_gpu_executor_matches_cpu():
    from gnnweave.datasets import load_dataset
    from gnnweave.host.train import TrainConfig, run_training
    ds = load_dataset("sbm:200:3")
    opts = {} if any(d.startswith("gpu:") for d in available_devices()) else \
        {"gpu": {"torch_device": "cpu"}}
    kw = dict(dataset=ds, seeds=[0], epochs=5, progress=False)
    g = run_training(TrainConfig(device="gpu", executor_options=opts, **kw))
    c = run_training(TrainConfig(device="cpu", **kw))
    assert g["seeds"][0]["final_loss"] == pytest.approx(c["seeds"][0]["final_loss"], abs=1e-4)
