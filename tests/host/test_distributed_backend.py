"""The collective backend each rank chooses from the run's configuration."""
from types import SimpleNamespace

import pytest

from gnnweave.host.distributed import choose_backend


def _config(backend="auto", devices=("cpu",), rank_devices=None):
    return SimpleNamespace(dist_backend=backend, devices=list(devices), device=devices[0],
                           rank_devices=rank_devices)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_auto_takes_gloo_unless_every_rank_is_on_gpus():
    assert choose_backend(_config(devices=("cpu",)), 2) == "gloo"
    mixed = _config(devices=("gpu",), rank_devices="0=gpu 1=cpu")
    assert choose_backend(mixed, 2) == "gloo"
    assert choose_backend(_config(devices=("gpu",)), 1) == ("nccl" if _has_cuda() else "gloo")


def test_an_explicit_backend_is_kept():
    assert choose_backend(_config("gloo", devices=("gpu",)), 2) == "gloo"


@pytest.mark.skipif(_has_cuda(), reason="this host has CUDA")
def test_nccl_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="--dist-backend nccl: this host has no CUDA device"):
        choose_backend(_config("nccl"), 2)


def test_an_unknown_backend_is_named():
    with pytest.raises(ValueError, match="--dist-backend 'mpi': choose one of auto, gloo, nccl"):
        choose_backend(_config("mpi"), 2)
