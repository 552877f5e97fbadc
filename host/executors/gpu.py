"""``gpu`` / ``gpu:<i>``: torch float32 on CUDA device ``i`` (the optional extra ``gpu``)."""
from __future__ import annotations

import time
import warnings

import numpy as np

from gnnweave.golden.aggregate import Reduce
from gnnweave.graph import CSRGraph
from gnnweave.host.executors.base import (
    GRAPH_CACHE, DeviceUnavailable, Executor, OpResult, apply_relu_mask, check_dense,
    check_features, check_rows, dense_array, oriented,
)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def cuda_count() -> int:
    """CUDA devices torch sees (0 without torch or with a broken driver)."""
    torch = _torch()
    if torch is None:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver counts as no device
        return 0


class GpuExecutor(Executor):
    """torch float32 on one CUDA device; host arrays in and out (each op copies)."""

    kind = "gpu"

    def __init__(self, index: int = 0, name: str | None = None, *,
                 torch_device: str | None = None):
        """``torch_device`` runs the same code on another torch device (the tests use
        ``'cpu'`` where there is no CUDA); times then come from the host clock."""
        from gnnweave.host.executors.registry import available_devices
        torch = _torch()
        if torch is None:
            raise DeviceUnavailable(
                "no CUDA device: torch is not installed (pip install 'gnnweave[gpu]'); "
                f"available: {', '.join(available_devices())}")
        self.torch = torch
        if torch_device is not None:
            self.device = torch.device(torch_device)
        else:
            count = cuda_count()
            if index >= count:
                raise DeviceUnavailable(
                    f"no CUDA device gpu:{index} ({count} visible): "
                    f"available: {', '.join(available_devices())}")
            self.device = torch.device("cuda", index)
        self.name = name or f"gpu:{index}"

    def _timed(self, fn):
        torch = self.torch
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            out = fn()
            return out, time.perf_counter() - t0
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        stop.record()
        stop.synchronize()
        return out, start.elapsed_time(stop) / 1e3

    def _to(self, a, dtype=None):
        # torch shares memory with a read-only array and warns; copy only those (e.g. views
        # of a cached graph), writable contiguous arrays still go over without a host copy
        host = np.require(a, dtype=dtype or np.float32, requirements=("C", "W"))
        return self.torch.from_numpy(host).to(self.device, non_blocking=False)

    def _graph(self, g: CSRGraph):
        def build():
            torch = self.torch
            w = g.weights if g.weights is not None else np.ones(g.num_edges)
            return (torch.from_numpy(g.indptr).to(self.device),
                    torch.from_numpy(g.indices).to(self.device),
                    torch.from_numpy(w.astype(np.float32)).to(self.device))
        return GRAPH_CACHE.get(g, f"torch:{self.device}", build)

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        torch = self.torch
        reduce = Reduce.parse(reduce)
        g = oriented(graph, transpose)
        x = check_features(g, x)
        lo, hi = check_rows(g, rows)
        indptr, indices, w = self._graph(g)
        xt = self._to(x)
        s, e = int(g.indptr[lo]), int(g.indptr[hi])
        f = x.shape[1]

        def run():
            crow = indptr[lo:hi + 1] - s
            if reduce is Reduce.MAX:
                deg = crow[1:] - crow[:-1]
                dst = torch.repeat_interleave(torch.arange(hi - lo, device=self.device), deg)
                prod = xt[indices[s:e]] * w[s:e, None]
                out = torch.zeros((hi - lo, f), device=self.device)
                with warnings.catch_warnings():   # "index_reduce() is in beta"
                    warnings.simplefilter("ignore", UserWarning)
                    out.index_reduce_(0, dst, prod, "amax", include_self=False)
                return out
            with warnings.catch_warnings():   # "sparse CSR support is in beta"
                warnings.simplefilter("ignore", UserWarning)
                a = torch.sparse_csr_tensor(crow, indices[s:e], w[s:e],
                                            size=(hi - lo, g.num_nodes), check_invariants=False)
            out = a @ xt
            if reduce is Reduce.MEAN:
                deg = (crow[1:] - crow[:-1]).clamp(min=1).to(out.dtype)
                out = out / deg[:, None]
            return out

        out, dev = self._timed(run)
        value = out.cpu().numpy()
        return OpResult(value, time.perf_counter() - t0, dev, x.nbytes, value.nbytes,
                        "aggregate", self.name)

    def _dense(self, op, fn, nbytes_in):
        t0 = time.perf_counter()
        out, dev = self._timed(fn)
        value = out.cpu().numpy()
        return OpResult(value, time.perf_counter() - t0, dev, nbytes_in, value.nbytes,
                        op, self.name)

    def dense_forward(self, x, w, b=None, *, relu=False):
        x, w = check_dense(x, w)
        x = dense_array(x)
        xt, wt = self._to(x), self._to(w)
        bt = None if b is None else self._to(b)

        def run():
            y = xt @ wt
            if bt is not None:
                y = y + bt
            return self.torch.relu(y) if relu else y
        return self._dense("dense_forward", run, x.size * 4 + w.size * 4)

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        dy = apply_relu_mask(np.asarray(dy, dtype=np.float32), relu_mask)
        w = np.asarray(w)
        if dy.ndim != 2 or w.ndim != 2 or dy.shape[1] != w.shape[1]:
            raise ValueError(f"dense_input_grad: dy shape {dy.shape} does not match w shape {w.shape}")
        dyt, wt = self._to(dy), self._to(w)
        return self._dense("dense_input_grad", lambda: dyt @ wt.T, dy.nbytes + w.size * 4)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        dy = apply_relu_mask(np.asarray(dy, dtype=np.float32), relu_mask)
        x = dense_array(x)
        if x.ndim != 2 or dy.ndim != 2 or x.shape[0] != dy.shape[0]:
            raise ValueError(f"dense_weight_grad: x shape {x.shape} does not match dy shape {dy.shape}")
        xt, dyt = self._to(x), self._to(dy)
        return self._dense("dense_weight_grad", lambda: xt.T @ dyt, x.size * 4 + dy.nbytes)

    def transfer_in(self, array):
        t0 = time.perf_counter()
        a = np.ascontiguousarray(dense_array(array))
        src = self.torch.from_numpy(a)
        out, dev = self._timed(lambda: src.to(self.device))
        return OpResult(a, time.perf_counter() - t0, dev, a.nbytes, 0, "transfer_in", self.name)

    def transfer_out(self, array):
        t0 = time.perf_counter()
        a = np.ascontiguousarray(array)
        on_dev = self.torch.from_numpy(a).to(self.device)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        out, dev = self._timed(lambda: on_dev.cpu())
        return OpResult(out.numpy(), time.perf_counter() - t0, dev, 0, a.nbytes,
                        "transfer_out", self.name)
