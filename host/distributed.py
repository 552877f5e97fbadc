"""Full-graph GNN training over ranks (processes, hosts) with ``torch.distributed``.

Each rank owns a contiguous range of relabelled nodes (:mod:`gnnweave.host.graphpart`: rank 0
partitions, the others receive its assignment) and trains on its local block: its own rows
as destinations, own + halo rows as sources. The models of :mod:`gnnweave.host.models` run
unchanged on a :class:`DistEngine`, which

* fetches halo rows before each aggregation with one ``all_to_all_single`` in the local
  dtype (GCN and GraphSAGE transform before aggregating, so hidden-width rows move);
* in the backward pass computes the transposed block's rows for own *and* halo nodes and
  sends the halo rows' partial sums back to their owners, who add them in (reverse
  exchange, scatter-add);
* turns the gradients (all sums over nodes) into one flat all-reduce per step: float64 on
  the float path, int64 accumulators on the fixed-point path;
* on the fixed-point path (every device ``fpga-emu``) computes each op as the fpga-emu
  executor does, with the formats agreed across ranks (``all_reduce`` MAX of the peaks the
  executor would take over the whole tensor), so the integers are those of one process.

Dropout draws come from :class:`gnnweave.host.dropout.CounterDropout` (keyed by seed, epoch,
layer and global node id) and bias gradients are exact integer sums (:func:`exact_row_sum`):
N ranks give the parameters of one process bit for bit on the fixed-point path, and the
same process trained with ``TrainConfig.rank_invariant`` (``gnnweave train
--rank-invariant``) is that one process.

A digest of the parameters is compared across ranks every ``digest_every`` epochs; a
mismatch stops the run (:class:`DivergenceError`).
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from gnnweave.clitools import device_list, unique_names
from gnnweave.errors import GnnweaveError, InputError
from gnnweave.fixed import FixedFormat, choose_frac, narrow
from gnnweave.graph import CSRGraph

FPGA_WIDTH = 16


class DivergenceError(GnnweaveError, RuntimeError):
    """Ranks hold different parameters (a bug or a fault: they must agree bit for bit)."""


class RankLost(GnnweaveError, RuntimeError):
    """A collective failed: another rank died, hung past the timeout, or left the group."""

    # gloo's worker thread may still be freeing the failed collective's tensors; an
    # interpreter shutdown racing it aborts the process instead of exiting 2
    exit_at_once = True


def _collective(comm, what, fn):
    try:
        return fn()
    except RuntimeError as exc:
        # gloo's first sentence names the peer and the socket error; the rest is advice
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0]
        first = re.sub(r"^\[[^\]]*\]\s*", "", first)[:200]   # gloo's source location
        raise RankLost(f"rank {comm.rank} of {comm.world}: {what} failed at epoch "
                       f"{comm.epoch}: another rank has stopped or is unreachable ({first})") \
            from None


# --------------------------------------------------------------------------- communication


class Comm:
    """The collectives a rank uses, counting the bytes it sends to other ranks.

    ``Comm()`` is a world of one (no torch needed); :meth:`from_env` joins the process
    group that ``torchrun`` (or ``gnnweave train --nproc``) describes in the environment.
    """

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = int(rank), int(world)
        self.halo_bytes = 0           # halo rows sent to other ranks (both directions)
        self.allreduce_bytes = 0      # gradient all-reduce payload
        self.format_bytes = 0         # fixed-point format agreement (peaks)
        self.comm_seconds = 0.0
        self.epoch = 0                # for error messages
        self.records: list[tuple] = []   # (category, start, end, bytes)
        self.backend = "none"         # torch.distributed's backend once joined

    #: torch device the collectives' tensors live on: None (host memory, gloo) or the
    #: rank's CUDA device (NCCL reduces only CUDA tensors)
    device = None

    @classmethod
    def from_env(cls, timeout_s: float = 60.0, backend: str = "gloo") -> "Comm":
        import datetime

        import torch
        import torch.distributed as dist
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
        comm = cls(dist.get_rank(), dist.get_world_size())
        comm.backend = str(dist.get_backend())
        if comm.backend == "nccl":
            comm.device = torch.device("cuda", torch.cuda.current_device())
        return comm

    def _tensor(self, a: np.ndarray):
        import torch
        t = torch.from_numpy(a)
        return t if self.device is None else t.to(self.device)

    @staticmethod
    def _numpy(t) -> np.ndarray:
        return t.cpu().numpy()     # no copy for a host tensor

    def _record(self, category, t0, nbytes):
        t1 = time.perf_counter()
        self.comm_seconds += t1 - t0
        self.records.append((category, t0, t1, nbytes))

    def all_to_all(self, send: np.ndarray, send_counts, recv_counts) -> np.ndarray:
        """Rows ``send`` (grouped by destination rank, ``send_counts`` each) out, rows from
        every rank (``recv_counts`` each, in rank order) in; same dtype and row width."""
        send = np.ascontiguousarray(send)
        width = send.shape[1] if send.ndim == 2 else 0
        out = np.empty((int(sum(recv_counts)), width), dtype=send.dtype)
        if self.world == 1:
            return out
        import torch
        import torch.distributed as dist
        t0 = time.perf_counter()
        row = width * send.dtype.itemsize
        # as bytes: gloo has no int16, and every dtype travels unchanged this way
        src = self._tensor(send.view(np.uint8).reshape(-1)) if send.size else \
            torch.empty(0, dtype=torch.uint8, device=self.device)
        dst = self._tensor(out.view(np.uint8).reshape(-1)) if out.size else \
            torch.empty(0, dtype=torch.uint8, device=self.device)
        _collective(self, "the halo exchange", lambda: dist.all_to_all_single(
            dst, src, output_split_sizes=[int(c) * row for c in recv_counts],
            input_split_sizes=[int(c) * row for c in send_counts]))
        if self.device is not None and out.size:
            out.view(np.uint8).reshape(-1)[:] = self._numpy(dst)
        nbytes = sum(int(c) for q, c in enumerate(send_counts) if q != self.rank) * row
        self.halo_bytes += nbytes
        self._record("exchange", t0, nbytes)
        return out

    def _reduce(self, a: np.ndarray, op: str, counter: str) -> np.ndarray:
        a = np.ascontiguousarray(a)
        if self.world == 1:
            return a.copy()
        import torch
        import torch.distributed as dist
        t0 = time.perf_counter()
        t = self._tensor(a.copy())
        _collective(self, f"an all-reduce ({op})", lambda: dist.all_reduce(
            t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX))
        setattr(self, counter, getattr(self, counter) + a.nbytes)
        self._record("allreduce", t0, a.nbytes)
        return self._numpy(t)

    def sum(self, a, counter="allreduce_bytes"):
        return self._reduce(a, "sum", counter)

    def max(self, a, counter="format_bytes"):
        return self._reduce(a, "max", counter)

    def peak(self, x) -> float:
        """``max |x|`` over the whole (row-split) tensor."""
        data = x.data if sp.issparse(x) else np.asarray(x)
        local = float(np.max(np.abs(data))) if data.size else 0.0
        return float(self.max(np.array([local], dtype=np.float64))[0])

    def broadcast(self, a: np.ndarray) -> np.ndarray:
        """Rank 0's ``a`` (every rank passes an array of the same shape and dtype)."""
        a = np.ascontiguousarray(a)
        if self.world == 1:
            return a
        import torch.distributed as dist
        t = self._tensor(a.copy())
        _collective(self, "a broadcast from rank 0", lambda: dist.broadcast(t, src=0))
        return self._numpy(t)

    def check_same(self, value: int, what: str):
        """Raise :class:`DivergenceError` unless every rank passes the same integer."""
        v = np.array([value, -value], dtype=np.int64)
        hi, neg_lo = self.max(v, counter="format_bytes")
        if hi != -neg_lo:
            raise DivergenceError(f"rank {self.rank}: {what} differs between ranks")


# --------------------------------------------------------------------------- exact sums


def exact_row_sum(a, comm: Comm | None = None, total_rows: int | None = None):
    """This rank's share of ``a.sum(axis=0)`` as ``(int64 sums, scale)``, independent of how
    the rows are split over ranks (:func:`finish_row_sum` turns the ranks' added shares
    into float32).

    Every element is rounded onto one grid ``2**-scale`` fine enough that ``total_rows`` of
    them add up in int64 without overflow (the scale comes from the peak over all ranks);
    integer sums do not depend on the order, so any row split gives the same bits. The grid
    keeps at least 62 - log2(rows) significant bits of the largest element."""
    a = np.asarray(a.toarray() if sp.issparse(a) else a)
    comm = comm or Comm()
    n = a.shape[0] if total_rows is None else int(total_rows)
    peak = comm.peak(a)
    if peak == 0.0 or n == 0:
        return np.zeros(a.shape[1], dtype=np.int64), 0
    scale = 62 - math.ceil(math.log2(max(n, 1) + 1)) - (math.frexp(peak)[1])
    q = np.rint(np.ldexp(a.astype(np.float64), scale)).astype(np.int64)
    return q.sum(axis=0), scale


def finish_row_sum(partial) -> np.ndarray:
    """float32 column sums from ``(int64 sums, scale)``."""
    if isinstance(partial, np.ndarray):
        return partial
    s, scale = partial
    return np.ldexp(np.asarray(s, dtype=np.int64).astype(np.float64), -scale).astype(np.float32)


def invariant_row_sum(a) -> np.ndarray:
    """:func:`exact_row_sum` in one process (``Engine.row_sum`` for ``rank_invariant``)."""
    return finish_row_sum(exact_row_sum(a))


# --------------------------------------------------------------------------- fixed point


def _q16(x, frac: int):
    """fpga-emu's ``quantize16`` with a given ``frac`` (the one agreed across ranks)."""
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        data = np.rint(np.ldexp(np.asarray(x.data, dtype=np.float64), frac)).astype(np.int16)
        return sp.csr_matrix((data, x.indices, x.indptr), shape=x.shape)
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        return FixedFormat(FPGA_WIDTH, frac).quantize(x)[0]
    return np.rint(np.ldexp(x, frac)).astype(np.int16)


def _frac(peak: float) -> int:
    return choose_frac(np.array([peak]), FPGA_WIDTH)


@dataclass
class _Accumulated:
    """A weight gradient's exact MAC accumulators, narrowed after the all-reduce."""

    acc: np.ndarray      # int64
    product_frac: int


class DistEngine:
    """The :class:`~gnnweave.host.models.Engine` interface over one rank's local block.

    Args:
        comm: the rank's :class:`Comm`.
        block: its :class:`~gnnweave.host.graphpart.LocalBlock` of the normalised graph.
        global_graph: the whole normalised graph (for the fixed-point output bounds, which
            the fpga-emu executor takes over the whole graph).
        local: the rank's own :class:`~gnnweave.host.models.Engine` (its dense executor and
            the devices its block's aggregations are split over); float path only.
        fixed: compute the fixed-point ops here with formats agreed across ranks.
        total_rows: nodes over all ranks (the exact bias sums' grid).
        shares: fixed-point path: ``[(executor, (lo, hi))]``, the rank's fpga-emu devices
            and the rows of the block (of ``n_src``) each aggregates; each device's share
            of every product is computed apart and timed by that device's cycle model.
            The first executor times the dense ops. Rows are independent, so any split
            gives the same integers.
    """

    def __init__(self, comm: Comm, block, global_graph: CSRGraph, *, local=None,
                 fixed: bool = False, total_rows: int, shares=None):
        from gnnweave.host.timeline import Timeline
        self.comm, self.block, self.local, self.fixed = comm, block, local, bool(fixed)
        self.total_rows = int(total_rows)
        self.timeline = local.timeline if local is not None else Timeline()
        self.shares = list(shares or [])
        self.saturations = 0
        self.steals = 0
        self._send = block.send_index
        if self.fixed:
            from gnnweave.host.executors import abs_row_weight_max, quantize_dynamic, transposed
            w = global_graph.weights
            self._w_fmt = None if w is None else quantize_dynamic(w)[1]
            self._row_bound = {False: abs_row_weight_max(global_graph),
                               True: abs_row_weight_max(transposed(global_graph))}
            g = block.graph
            data = (np.ones(g.num_edges, dtype=np.int64) if g.weights is None
                    else self._w_fmt.quantize(g.weights)[0].astype(np.int64))
            self._a_q = sp.csr_matrix((data, g.indices, g.indptr), shape=(g.num_nodes,) * 2)
            self._at_q = self._a_q.T.tocsr()
            self._graphs = {False: g, True: transposed(g)}

    # -- plumbing the models use

    def overlaps(self) -> bool:
        return False

    def close(self):
        if self.local is not None:
            self.local.close()

    def transfer_in(self, array):
        return self.local.transfer_in(array) if self.local is not None else array

    @property
    def n_own(self) -> int:
        return self.block.n_own

    # -- halo exchange

    def _fetch_halo(self, x: np.ndarray) -> np.ndarray:
        b = self.block
        halo = self.comm.all_to_all(x[self._send], b.send_counts, b.recv_counts)
        return np.concatenate([x, halo], axis=0)

    def _return_halo(self, rows: np.ndarray) -> np.ndarray:
        """Send rows ``n_own..n_src`` (partial sums for halo nodes) to their owners; add
        what comes back into the own rows."""
        b = self.block
        back = self.comm.all_to_all(rows[b.n_own:], b.recv_counts, b.send_counts)
        own = rows[: b.n_own].copy()
        np.add.at(own, self._send, back)
        return own

    # -- aggregation

    def aggregate(self, graph, x, *, rows=None, transpose=False, reduce="sum"):
        if str(reduce).lower() != "sum":
            raise ValueError(f"DistEngine: reduce {reduce!r}: only 'sum' runs over ranks")
        x = x.toarray() if sp.issparse(x) else np.asarray(x)
        b = self.block
        if x.shape[0] != b.n_own:
            raise ValueError(f"DistEngine.aggregate: x has {x.shape[0]} rows, the rank owns "
                             f"{b.n_own}")
        if self.fixed:
            return self._aggregate_fixed(x, transpose)
        if not transpose:
            return self.local.aggregate(b.graph, self._fetch_halo(x), rows=(0, b.n_own))
        pad = np.zeros((b.n_src, x.shape[1]), dtype=x.dtype)
        pad[: b.n_own] = x
        return self._return_halo(self.local.aggregate(b.graph, pad, transpose=True))

    def _aggregate_fixed(self, x, transpose):
        b = self.block
        peak = self.comm.peak(x)
        feat_frac = _frac(peak)
        x_q = _q16(x, feat_frac)
        product_frac = feat_frac + (self._w_fmt.frac if self._w_fmt is not None else 0)
        out_frac = min(_frac(self._row_bound[transpose] * peak), product_frac)
        shift = product_frac - out_frac
        if not transpose:
            src = self._fetch_halo(x_q).astype(np.int64)
            acc = self._shared_product(False, src, b.n_own)
        else:
            pad = np.zeros((b.n_src, x.shape[1]), dtype=np.int64)
            pad[: b.n_own] = x_q
            acc = self._return_halo(self._shared_product(True, pad, b.n_src))
        z, saturated = narrow(acc, shift, FixedFormat(FPGA_WIDTH, 0))
        self.saturations += int(np.count_nonzero(saturated))
        return FixedFormat(FPGA_WIDTH, out_frac).to_float(z).astype(np.float32)

    def _shared_product(self, transpose: bool, src: np.ndarray, n_rows: int) -> np.ndarray:
        """Rows ``0..n_rows`` of the block's (transposed) integer matrix times ``src``,
        each device computing the rows of its share, recorded with its modelled time."""
        a = self._at_q if transpose else self._a_q
        if not self.shares:
            return np.asarray(a[:n_rows] @ src)
        from gnnweave.host.executors import OpResult, job_degrees
        out = np.zeros((n_rows, src.shape[1]), dtype=np.int64)
        g = self._graphs[transpose]
        for ex, (lo, hi) in self.shares:
            lo, hi = min(lo, n_rows), min(hi, n_rows)
            t0 = time.perf_counter()
            if hi > lo:
                out[lo:hi] = a[lo:hi] @ src
            t1 = time.perf_counter()
            dev = ex.cycle_model.aggregate_seconds(job_degrees(g, lo, hi), src.shape[1],
                                                   weighted=g.weights is not None)
            edges = int(g.indptr[hi] - g.indptr[lo])
            self.timeline.record(ex, OpResult(None, t1 - t0, dev, edges * src.shape[1] * 2,
                                              (hi - lo) * src.shape[1] * 2, "aggregate",
                                              ex.name), t0, t1, dict(rows=(lo, hi)))
        return out

    def _record_dense(self, op, mode, a, b, t0):
        if not self.shares:
            return
        from gnnweave.host.executors import OpResult
        from gnnweave.host.executors.fpga_emu import matmul_dims
        ex = self.shares[0][0]
        m, k, n = matmul_dims(mode, a, b)
        t1 = time.perf_counter()
        self.timeline.record(ex, OpResult(None, t1 - t0, ex.cycle_model.matmul_seconds(m, k, n, mode),
                                          (a.shape[0] * a.shape[1] + b.size) * 2, m * n * 2,
                                          op, ex.name), t0, t1)

    # -- dense ops

    def _gemm_fixed(self, mode, a, b, *, bias=None, relu=False, reduce_over_ranks=False):
        from gnnweave.host.executors import FpgaEmuExecutor
        t0 = time.perf_counter()
        a_frac = _frac(self.comm.peak(a))
        b_frac = _frac(self.comm.peak(b)) if mode == "dw" else _frac(_local_peak(b))
        a_q, b_q = _q16(a, a_frac), _q16(b, b_frac)
        product_frac = a_frac + b_frac
        bias_q = None
        if bias is not None:
            bias = np.asarray(bias, dtype=np.float64).reshape(-1)
            bfmt = FixedFormat(FPGA_WIDTH, min(choose_frac(bias, FPGA_WIDTH), product_frac))
            bias_q = (bfmt.quantize(bias)[0].astype(np.int64), product_frac - bfmt.frac)
        acc = FpgaEmuExecutor.accumulator(mode, a_q, b_q, bias=bias_q).astype(np.int64)
        self._record_dense(_DENSE_OPS[mode], mode, a, b, t0)
        if reduce_over_ranks:
            return _Accumulated(acc, product_frac)
        peak = float(np.max(np.abs(acc))) * 2.0 ** -product_frac if acc.size else 0.0
        return self._narrow_acc(acc, product_frac, self.comm.peak(np.array([peak])), relu)

    def _narrow_acc(self, acc, product_frac, peak, relu=False):
        out_frac = min(_frac(peak), product_frac)
        z, saturated = narrow(acc, product_frac - out_frac, FixedFormat(FPGA_WIDTH, 0))
        self.saturations += int(np.count_nonzero(saturated))
        if relu:
            z = np.where(z > 0, z, 0)
        return np.ldexp(z.astype(np.float64), -out_frac).astype(np.float32)

    def dense_forward(self, x, w, b=None, *, relu=False):
        if self.fixed:
            return self._gemm_fixed("fwd", x, w, bias=b, relu=relu)
        return self.local.dense_forward(x, w, b, relu=relu)

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        if relu_mask is not None:
            dy = dy * relu_mask
        if self.fixed:
            return self._gemm_fixed("dx", dy, w)
        return self.local.dense_input_grad(dy, w)

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        """This rank's share of ``x^T dy`` (a sum over nodes): :meth:`reduce_gradients`
        adds the ranks' shares."""
        if relu_mask is not None:
            dy = dy * relu_mask
        if self.fixed:
            return self._gemm_fixed("dw", x, dy, reduce_over_ranks=True)
        return self.local.dense_weight_grad(x, dy)

    def sum_rows(self, a):
        """Bias gradients: exact integer sums on the fixed-point path (the same bits for
        any row split), float64 sums on the float path; added over ranks with the rest."""
        if self.fixed:
            return exact_row_sum(a, self.comm, self.total_rows)
        a = a.toarray() if sp.issparse(a) else np.asarray(a)
        return a.sum(axis=0, dtype=np.float64)

    # -- the step's one all-reduce

    def reduce_gradients(self, grads: dict) -> dict:
        """Every gradient is a sum over nodes: add the ranks' shares in one flat
        all-reduce (int64 on the fixed-point path: MAC accumulators and exact bias sums;
        float64 otherwise), then narrow the fixed-point ones as one process would."""
        names = sorted(grads)
        parts = []
        for k in names:
            g = grads[k]
            if isinstance(g, _Accumulated):
                parts.append(g.acc.reshape(-1))
            elif isinstance(g, tuple):   # exact_row_sum's (int64 sums, scale)
                parts.append(np.asarray(g[0], dtype=np.int64).reshape(-1))
            else:
                parts.append(np.asarray(g, dtype=np.float64).reshape(-1))
        kinds = {p.dtype for p in parts}
        if len(kinds) > 1:   # a float gradient on the fixed path: keep it exact as int64
            raise ValueError(f"DistEngine.reduce_gradients: mixed gradient kinds {kinds}")
        flat = self.comm.sum(np.concatenate(parts) if parts else np.zeros(0))
        out, at = {}, 0
        for k, p in zip(names, parts):
            seg = flat[at:at + p.shape[0]]
            at += p.shape[0]
            g = grads[k]
            if isinstance(g, _Accumulated):
                acc = seg.reshape(g.acc.shape)
                peak = float(np.max(np.abs(acc))) * 2.0 ** -g.product_frac if acc.size else 0.0
                out[k] = self._narrow_acc(acc, g.product_frac, peak)
            elif isinstance(g, tuple):
                out[k] = finish_row_sum((seg, g[1]))
            else:
                out[k] = seg.reshape(np.shape(g)).astype(np.float32)
        return out


_DENSE_OPS = {"fwd": "dense_forward", "dx": "dense_input_grad", "dw": "dense_weight_grad"}


def _local_peak(x) -> float:
    data = x.data if sp.issparse(x) else np.asarray(x)
    return float(np.max(np.abs(data))) if data.size else 0.0


# --------------------------------------------------------------------------- one rank's run


class _RankLayer:
    """A layer graph as the models see it on a rank: own rows in, own rows out (the
    engine fetches the halo rows itself)."""

    def __init__(self, graph, n_own):
        self.graph, self.n_dst, self.n_src = graph, n_own, n_own


def parse_rank_devices(spec) -> dict[int, list[str]]:
    """``'0=fpga-emu,cpu 1=cpu'`` (or a dict) -> ``{0: ['fpga-emu', 'cpu'], 1: ['cpu']}``."""
    if spec is None or isinstance(spec, dict):
        return {int(k): list(v) for k, v in (spec or {}).items()}
    out = {}
    for item in str(spec).split():
        rank, sep, devs = item.partition("=")
        if not sep or not rank.strip().isdigit() or not devs.strip(","):
            raise InputError(f"--rank-devices: {item!r} is not RANK=DEVICE[,DEVICE...]")
        out[int(rank)] = device_list(f"--rank-devices: rank {int(rank)}", devs)
    return out


def _loss_and_grad(logits, labels, rows, total: int):
    """:func:`~gnnweave.host.models.softmax_cross_entropy` over this rank's ``rows`` with the
    mean taken over ``total`` rows on all ranks (the same float32 ops row by row)."""
    logits = np.asarray(logits, dtype=np.float32)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = max(int(total), 1)
    d = np.zeros_like(logits)
    p = np.exp(logp[rows])
    p[np.arange(rows.shape[0]), labels[rows]] -= 1.0
    d[rows] = p / n
    return float(-logp[rows, labels[rows]].astype(np.float64).sum()), d


def _rank_device_rows(graph: CSRGraph, devices: list[str], rank: int) -> dict:
    """The rows of a rank's block each of its devices aggregates: cuts of equal edge
    counts (:func:`~gnnweave.host.models.cut_rows_by_fractions`), as ``--partition even``
    splits one process's graph."""
    from gnnweave.host.models import cut_rows_by_fractions
    unique_names(f"--rank-devices: rank {rank}", devices)
    ranges = cut_rows_by_fractions(graph.indptr, 0, graph.num_nodes, [1.0] * len(devices))
    return dict(zip(devices, ranges))


def _devices_of(config, rank) -> list[str]:
    rd = parse_rank_devices(config.rank_devices)
    if rank in rd:
        return rd[rank]
    return list(config.devices or [config.device])


def _speeds(config, comm=None, data=None) -> list[float] | None:
    """``rank_speeds`` as numbers; ``'auto'`` measures them (:func:`measure_rank_speeds`)."""
    s = getattr(config, "rank_speeds", None)
    if isinstance(s, str):
        if s.lower() != "auto":
            raise InputError(f"--rank-speeds {s!r}: give numbers (e.g. 2,1) or auto")
        return measure_rank_speeds(config, comm, data)
    return None if s is None else [float(v) for v in s]


def model_node_costs(config, graph, hp):
    """Per-node work from ``config.cost_model`` (a fitted CostModel or its JSON): the dense
    device's per-row and per-edge aggregation seconds at the hidden width; None (the
    default ``1 + in_degree``) without one."""
    from gnnweave.host.graphpart import node_costs
    from gnnweave.host.train import load_cost_model
    cm = config.cost_model
    cm = cm if hasattr(cm, "share_cost") else load_cost_model(cm)
    if cm is None or not hasattr(cm, "share_cost"):
        return None
    device = _devices_of(config, 0)[0] if config.rank_devices else config.device
    cost = cm.share_cost(device, feat_dim=int(hp["hidden"] or 16), num_nodes=graph.num_nodes)
    return node_costs(graph, per_edge=cost.per_edge_s, per_row=cost.per_row_s)


def measure_rank_speeds(config, comm: Comm, data, repeats: int = 3) -> list[float]:
    """Each rank times its dense device aggregating the whole normalised graph at the
    hidden width (the fastest of ``repeats`` after a warm-up, on the device's clock: device
    time on FPGA kinds, CPU time on cpu); speeds are the inverse times, known to all."""
    from gnnweave.host.timeline import Timeline
    from gnnweave.host.train import executor_for
    devices = _devices_of(config, comm.rank)
    name = devices[0] if config.rank_devices else config.device
    executors = {}
    ex = executor_for(name, executors, config.executor_options)
    timeline = Timeline()
    x = np.random.default_rng(0).uniform(-1, 1, (data.graph.num_nodes, 16)).astype(np.float32)
    try:
        times = [timeline.call_timed(ex, "aggregate", data.graph, x, "sum",
                                     rows=(0, data.graph.num_nodes))[1]
                 for _ in range(repeats + 1)][1:]
    finally:
        for ex in executors.values():
            ex.close()
    mine = np.zeros(comm.world, dtype=np.float64)
    mine[comm.rank] = 1.0 / max(min(times), 1e-9)
    return [float(v) for v in comm.sum(mine, counter="format_bytes")]


def run_rank(config, comm: Comm) -> dict:
    """Train ``config`` (full-batch, one seed at a time) as rank ``comm.rank``; every rank
    returns the same summary."""
    from gnnweave.host.graphpart import METHODS, GraphPartition, local_block, partition_graph
    from gnnweave.host.models import MODELS, Engine
    from gnnweave.host.timeline import Timeline
    from gnnweave.host.train import executor_for, params_digest, prepare, resolve_hyperparameters

    key = str(config.model).lower()
    if key not in MODELS:
        raise InputError(f"TrainConfig.model = {config.model!r}: choose one of gcn, sage, sgc")
    model_cls = MODELS[key]
    hp = resolve_hyperparameters(config, model_cls)
    data = prepare(config, model_cls)
    if config.batch_size is not None:
        return run_rank_minibatch(config, comm, hp, key, data)
    n = data.graph.num_nodes
    if comm.world > n:
        raise InputError(f"{comm.world} ranks for a graph of {n} nodes")
    # rank 0 partitions (METIS is not deterministic across processes) and broadcasts
    method = str(getattr(config, "partition_method", "metis")).lower()
    parts = np.zeros(n, dtype=np.int64)
    meta = np.zeros(2, dtype=np.int64)
    speeds = _speeds(config, comm, data)   # every rank takes part when they are measured
    if method not in METHODS:
        raise InputError(f"--partition-method {method!r}: choose one of {', '.join(METHODS)}")
    if comm.rank == 0:
        p0 = partition_graph(data.dataset.graph, comm.world, method=method,
                             node_cost=model_node_costs(config, data.dataset.graph, hp),
                             speeds=speeds, seed=0)
        parts, meta = p0.parts, np.array([METHODS.index(p0.method), 0], dtype=np.int64)
    parts = comm.broadcast(parts)
    ran = METHODS[int(comm.broadcast(meta)[0])]
    part = GraphPartition(parts, comm.world, ran, method,
                          None if ran == method else f"{method} unavailable on rank 0",
                          None if speeds is None else np.asarray(speeds) / np.sum(speeds))
    block = local_block(data.graph, part, comm.rank)
    own = block.own

    devices = _devices_of(config, comm.rank)
    # with --rank-devices a rank's first device does its dense ops, else --device does
    dense_name = devices[0] if config.rank_devices else config.device
    kinds = {d.partition(":")[0].lower() for d in devices + [dense_name]}
    fixed_here = kinds == {"fpga-emu"}
    fixed_all = comm.sum(np.array([int(fixed_here)], dtype=np.int64),
                         counter="format_bytes")[0] == comm.world
    executors = {}
    local, shares = None, None
    rows = _rank_device_rows(block.graph, devices, comm.rank)
    if not fixed_all:
        dense = executor_for(dense_name, executors, config.executor_options)
        shards = None
        if len(devices) > 1:
            shards = {d: (executor_for(d, executors, config.executor_options), r)
                      for d, r in rows.items()}
        local = Engine(dense, Timeline(), shards=shards, num_nodes=block.n_src,
                       base_graph=block.graph)
    elif (config.executor_options.get("fpga-emu", {}).get("dense_range", "peak") != "peak"):
        raise InputError("executor_options['fpga-emu']['dense_range']: only 'peak' runs over ranks")
    else:
        order = [dense_name] + [d for d in rows if d != dense_name]
        shares = [(executor_for(d, executors, config.executor_options), rows.get(d, (0, 0)))
                  for d in order]
    eng = DistEngine(comm, block, data.graph, local=local, fixed=fixed_all, total_rows=n,
                     shares=shares)

    train_local = np.flatnonzero(np.isin(own, data.train_idx))
    val_local = np.flatnonzero(np.isin(own, data.val_idx))
    test_local = np.flatnonzero(np.isin(own, data.test_idx))
    y_own = data.y[own]
    x_own = data.x[own]
    per_seed = []
    try:
        for seed in config.seed_list():
            per_seed.append(_train_seed(config, comm, eng, hp, key, data, block, x_own, y_own,
                                        (train_local, val_local, test_local), seed,
                                        params_digest))
    finally:
        eng.close()
        for ex in executors.values():
            ex.close()
    widths = _exchanged_widths(key, hp, config.layers, data.num_classes)
    fwd_b, bwd_b = (2, 8) if fixed_all else (4, 4)
    report = part.report(data.dataset.graph, widths, forward_itemsize=fwd_b,
                         backward_itemsize=bwd_b)
    accs = [r["test_acc"] for r in per_seed]
    return dict(
        dataset=getattr(data.dataset, "name", str(config.dataset)), model=key,
        device=dense_name, mode="full-batch", numeric="fixed" if fixed_all else "float",
        world_size=comm.world, dist_backend=comm.backend, rank_speeds=speeds,
        rank_devices={r: _devices_of(config, r) for r in range(comm.world)},
        partition_method=ran, partition_requested=method, partition=report,
        halo_nodes=report["halo_nodes"],
        hyperparameters=dict(hp, layers=config.layers, optimizer=config.optimizer),
        test_acc_mean=float(np.mean(accs)), test_acc_std=float(np.std(accs)),
        epoch_seconds=float(np.mean([r["epoch_seconds"] for r in per_seed])),
        comm_bytes_per_epoch=per_seed[-1]["comm_bytes_per_epoch"],
        predicted_comm_bytes_per_epoch=report["predicted_bytes_per_step"],
        allreduce_bytes_per_step=per_seed[-1]["allreduce_bytes_per_step"],
        rank_epoch_seconds=per_seed[-1]["rank_epoch_seconds"],
        rank_timeline=per_seed[-1].pop("rank_timeline"),
        saturations=eng.saturations,
        rank_device_shares=_gather_device_shares(comm, config, eng, rows),
        seeds=per_seed)


def _gather_device_shares(comm: Comm, config, eng: DistEngine, rows: dict) -> dict:
    """``{rank: {device: {rows, seconds_last_epoch}}}``: the rows of its block each device
    of each rank aggregates and the time its ops took in the last epoch on the device's
    clock (modelled device time on fpga kinds)."""
    names = {r: _devices_of(config, r) for r in range(comm.world)}
    width = max(len(v) for v in names.values())
    mine = np.zeros((comm.world, width, 3), dtype=np.float64)
    records = eng.timeline.of_epoch(eng.timeline.epoch)
    for i, d in enumerate(names[comm.rank]):
        lo, hi = rows.get(d, (0, 0))
        secs = sum(r.measured_seconds for r in records if r.device == d)
        mine[comm.rank, i] = (lo, hi, secs)
    every = comm.sum(mine.reshape(-1), counter="format_bytes").reshape(mine.shape)
    return {r: {d: dict(rows=[int(every[r, i, 0]), int(every[r, i, 1])],
                        seconds_last_epoch=float(every[r, i, 2]))
                for i, d in enumerate(names[r])} for r in range(comm.world)}


def _exchanged_widths(model, hp, layers, num_classes) -> list[int]:
    """Row widths the halo exchanges move per step (both directions count in the report)."""
    if model == "sgc":
        return []
    return [hp["hidden"]] * (layers - 1) + [num_classes]


def _train_seed(config, comm, eng, hp, key, data, block, x_own, y_own, splits, seed, digest):
    from gnnweave.host.dropout import CounterDropout
    from gnnweave.host.models import make_model, make_optimizer
    from gnnweave.host.train import sparse_input_features
    train_local, val_local, test_local = splits
    totals = comm.sum(np.array([len(train_local), len(val_local), len(test_local)],
                               dtype=np.int64), counter="format_bytes")
    model = make_model(key, data.x.shape[1], data.num_classes, hidden=hp["hidden"],
                       layers=config.layers, dropout=hp["dropout"], seed=seed)
    x_in = model.prepare_features(eng, block.graph, x_own)
    # one decision for all ranks, as one process would take it on the whole matrix
    dense = x_in.toarray() if sp.issparse(x_in) else np.asarray(x_in)
    nnz, size = comm.sum(np.array([np.count_nonzero(dense), dense.size], dtype=np.int64),
                         counter="format_bytes")
    mode = config.sparse_input
    if mode == "auto":
        mode = bool(size and nnz < 0.1 * size)
    x_in = sparse_input_features(x_in, mode)
    opt = make_optimizer(config.optimizer, model.params, lr=hp["lr"],
                         weight_decay=hp["weight_decay"], decay=model.decay,
                         momentum=config.momentum)
    layers = [_RankLayer(block.graph, block.n_own)] * model.hops
    rng = CounterDropout(seed, block.own)
    epochs = hp["epochs"]
    history, times, halo_per_epoch, ar_per_step = [], [], 0, 0
    last_step = None
    ckpt = _Checkpoints(config, hp, key, seed, data, eng.fixed)
    epoch, resumed_from = 0, None
    if config.resume:
        state = ckpt.load()
        if state is not None:
            model.params, epoch, history = state["params"], state["epoch"], state["history"]
            opt.load_state(state["opt"], state["t"])
            resumed_from = epoch
    digest_every = max(int(getattr(config, "digest_every", 10) or 0), 0)
    from tqdm.auto import tqdm
    bar = tqdm(total=epochs, initial=epoch, desc=f"{key} seed {seed} ({comm.world} ranks)",
               unit="epoch", disable=not config.progress or comm.rank != 0, leave=False)
    try:
        while epoch < epochs:
            rng.epoch = comm.epoch = eng.timeline.epoch = epoch
            h0, a0 = comm.halo_bytes, comm.allreduce_bytes
            t0 = time.perf_counter()
            first_record = len(comm.records)
            logits, cache = model.forward(eng, x_in, layers, train=True, rng=rng)
            loss_sum, dlogits = _loss_and_grad(logits, y_own, train_local, totals[0])
            grads = model.backward(eng, dlogits, cache, layers)
            grads = eng.reduce_gradients(grads)
            model.params = opt.step(model.params, grads)
            times.append(time.perf_counter() - t0)
            last_step = (t0, times[-1], comm.records[first_record:])
            halo_per_epoch = comm.halo_bytes - h0
            ar_per_step = comm.allreduce_bytes - a0
            epoch += 1
            stats = dict(epoch=epoch)
            if epoch % max(config.eval_every, 1) == 0 or epoch == epochs:
                stats.update(_evaluate(comm, eng, model, x_in, layers, y_own, splits, totals,
                                       loss_sum))
            history.append(stats)
            if digest_every and (epoch % digest_every == 0 or epoch == epochs):
                comm.check_same(int(digest(model.params)[:15], 16),
                                f"parameter digest after epoch {epoch}")
            bar.update(1)
            if comm.rank == 0 and (epoch == epochs or (config.checkpoint_every and
                                                       epoch % config.checkpoint_every == 0)):
                ckpt.save(model.params, opt, epoch, history)
            if config.on_epoch_end is not None:
                config.on_epoch_end(seed, epoch, dict(stats, rank=comm.rank))
    finally:
        bar.close()
    # per-rank epoch times, each rank in its own slot
    mine = np.zeros(comm.world, dtype=np.float64)
    mine[comm.rank] = float(np.mean(times)) if times else 0.0
    rank_times = comm.sum(mine, counter="format_bytes")
    halo_total = int(comm.sum(np.array([halo_per_epoch], dtype=np.int64),
                              counter="format_bytes")[0])
    final = history[-1] if history else {}
    timeline = _gather_timeline(comm, last_step if epoch > 0 and times else None)
    return dict(seed=seed, test_acc=final.get("test_acc"), rank_timeline=timeline, val_acc=final.get("val_acc"),
                train_acc=final.get("train_acc"), epochs_done=epoch, resumed_from=resumed_from,
                checkpoint=str(ckpt.path) if ckpt.path else None,
                final_loss=final.get("loss"), params_sha256=digest(model.params),
                epoch_seconds=float(np.mean(times)) if times else None,
                comm_bytes_per_epoch=halo_total, allreduce_bytes_per_step=int(ar_per_step),
                rank_epoch_seconds=[float(t) for t in rank_times], history=history,
                params={k: np.array(v) for k, v in model.params.items()})


class _Checkpoints:
    """Rank 0's checkpoints (atomic, :func:`~gnnweave.host.checkpoint.save_checkpoint`):
    parameters, optimiser state, epoch and history. Full-batch checkpoints hold nothing that
    depends on the number of ranks (the dropout generator is keyed by the epoch), so any
    world size resumes them; mini-batch ones record the ranks and speeds they need."""

    def __init__(self, config, hp, model, seed, data, fixed, **extra):
        from pathlib import Path
        d = config.checkpoint_dir
        if d is None and config.out_dir is not None:
            d = Path(config.out_dir) / "checkpoints"
        self.path = None if d is None else Path(d) / f"{model}-seed{seed}.npz"
        self.fingerprint = dict(
            dataset=getattr(data.dataset, "name", str(config.dataset)), model=model,
            layers=config.layers, optimizer=config.optimizer, momentum=config.momentum,
            seed=seed, numeric="fixed" if fixed else "float", ranks="any",
            normalize_features=config.normalize_features,
            **{k: v for k, v in hp.items() if k != "epochs"})
        self.fingerprint.update(extra)   # mini-batch: the ranks and speeds it needs

    def save(self, params, opt, epoch, history):
        from gnnweave.host.checkpoint import save_checkpoint
        if self.path is None:
            return
        arrays = {f"param:{k}": v for k, v in params.items()}
        arrays.update({f"opt:{k}": v for k, v in opt.state_arrays().items()})
        save_checkpoint(self.path, arrays, dict(epoch=epoch, opt_t=opt.t, history=history,
                                                config=self.fingerprint))

    def load(self):
        from gnnweave.host.checkpoint import check_compatible, load_checkpoint
        if self.path is None or not self.path.is_file():
            return None
        arrays, meta = load_checkpoint(self.path)
        check_compatible(self.path, meta.get("config", {}), self.fingerprint)
        return dict(params={k[6:]: v for k, v in arrays.items() if k.startswith("param:")},
                    opt={k[4:]: v for k, v in arrays.items() if k.startswith("opt:")},
                    t=int(meta["opt_t"]), epoch=int(meta["epoch"]),
                    history=list(meta["history"]))


def _evaluate(comm, eng, model, x_in, layers, y_own, splits, totals, loss_sum) -> dict:
    """Accuracies and validation loss over all ranks, and the step's training loss."""
    logits, _ = model.forward(eng, x_in, layers, train=False, rng=None)
    pred = logits.argmax(axis=1)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    local = [float(np.count_nonzero(pred[idx] == y_own[idx])) for idx in splits]
    local.append(float(-logp[splits[1], y_own[splits[1]]].astype(np.float64).sum()))
    local.append(loss_sum)
    s = comm.sum(np.array(local, dtype=np.float64), counter="format_bytes")
    acc = {name: (float(s[i] / totals[i]) if totals[i] else float("nan"))
           for i, name in enumerate(("train_acc", "val_acc", "test_acc"))}
    acc["val_loss"] = float(s[3] / max(totals[1], 1))
    acc["loss"] = float(s[4] / max(totals[0], 1))
    return acc


# --------------------------------------------------------------------------- launching


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BACKENDS = ("auto", "gloo", "nccl")


def choose_backend(config, world: int | None = None) -> str:
    """``config.dist_backend``: ``gloo``, ``nccl``, or ``auto`` (NCCL when every rank runs
    on ``gpu`` devices only and this host has a CUDA device per local rank, else gloo).
    Every rank decides alike from the config (the world size from the environment)."""
    want = str(getattr(config, "dist_backend", "auto") or "auto").lower()
    if want not in BACKENDS:
        raise InputError(f"--dist-backend {want!r}: choose one of {', '.join(BACKENDS)}")
    world = int(world or os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    try:
        import torch
        cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local
    except ImportError:
        cuda = False
    if want == "nccl" and not cuda:
        raise InputError(f"--dist-backend nccl: this host has no CUDA device for each of its "
                         f"{local} local ranks")
    if want != "auto":
        return want
    kinds = {d.partition(":")[0].lower() for r in range(world) for d in _devices_of(config, r)}
    return "nccl" if cuda and kinds == {"gpu"} else "gloo"


def _rank_jobs(jobs, timeout_s):
    """A spawned rank: join the group once, run every job in turn."""
    comm = Comm.from_env(timeout_s, choose_backend(jobs[0]))
    try:
        return [run_rank(job, comm) for job in jobs]
    finally:
        import torch.distributed as dist
        dist.destroy_process_group()


def launch(jobs, nproc: int, *, max_restarts: int = 0, timeout_s: float = 60.0) -> list[dict]:
    """Run the TrainConfigs ``jobs`` one after another on ``nproc`` local ranks spawned by
    torch's elastic launcher (the ranks start, and import torch, once for all jobs);
    returns rank 0's summaries. A rank that fails stops the others (the launcher ends
    them) and raises ``torch.distributed.elastic.multiprocessing.errors.ChildFailedError``."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    if isinstance(nproc, bool) or not isinstance(nproc, (int, np.integer)) or nproc < 1:
        raise InputError(f"--nproc {nproc!r}: expected an integer >= 1")
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=int(nproc),
                       run_id=f"gnnweave-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                       rdzv_endpoint=f"127.0.0.1:{_free_port()}", max_restarts=max_restarts,
                       monitor_interval=0.2, start_method="spawn")
    backends = {choose_backend(j, int(nproc)) for j in jobs}
    if len(backends) > 1:
        raise InputError(f"launch: the jobs need different backends {sorted(backends)}; "
                         f"launch them apart")
    out = elastic_launch(cfg, _rank_jobs)([replace(j, nproc=1, dist=True) for j in jobs],
                         timeout_s)
    return out[0]


def run_distributed(config) -> dict:
    """``run_training`` over ranks: spawn ``config.nproc`` local ranks, or (``config.dist``)
    be one rank of a torchrun job. Returns the run's summary (rank 0 writes ``out_dir``)."""
    unsupported = [name for name, on in (
        ("overlap_chunks", config.overlap_chunks != 1), ("steal", config.steal),
        ("rebalance", config.rebalance), ("save_model", getattr(config, "save_model", None)))
        if on]
    if unsupported:
        raise InputError(f"TrainConfig.{unsupported[0]}: not available over ranks "
                         f"(--nproc/--dist); see docs/distributed.md")
    timeout_s = config.comm_timeout_s
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not 0 < timeout_s < float("inf"):
        raise InputError(f"TrainConfig.comm_timeout_s = {timeout_s!r}: must be a positive "
                         f"number of seconds")
    if config.dist:
        comm = Comm.from_env(float(timeout_s), choose_backend(config))
        result = run_rank(config, comm)
    else:
        result = launch([config], config.nproc, timeout_s=float(timeout_s))[0]
    for r in result["seeds"]:
        r.pop("params", None)
    if config.out_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        import json
        from pathlib import Path
        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
        if result.get("rank_timeline"):
            result["timeline_png"] = str(plot_rank_timeline(
                result["rank_timeline"], out / "timeline.png",
                f"{result['model']} on {result['dataset']}: last training step on "
                f"{result['world_size']} ranks"))
    return result


# --------------------------------------------------------------------------- mini-batch


def batch_shares(size: int, fractions) -> np.ndarray:
    """Cut points ``[k+1]`` splitting a batch of ``size`` seeds over ranks in proportion to
    ``fractions`` (largest remainders; every rank gets a share, possibly empty)."""
    fr = np.asarray(fractions, dtype=np.float64)
    fr = fr / fr.sum()
    raw = fr * size
    counts = np.floor(raw).astype(np.int64)
    short = size - int(counts.sum())
    counts[np.argsort(-(raw - counts), kind="stable")[:short]] += 1
    return np.concatenate([[0], np.cumsum(counts)])


def run_rank_minibatch(config, comm: Comm, hp, key, data) -> dict:
    """Mini-batch training over ranks, the graph replicated on every rank.

    Every rank draws the same shuffled global batches (seeded by seed and epoch), so all
    take the same number of steps by construction; rank ``r`` trains on its share of each
    batch (in proportion to ``rank_speeds``: a faster rank takes more of the fixed global
    batch), samples its own blocks, and scales its mean loss gradient by its share of the
    batch, so the all-reduced sum is the gradient of the whole batch's mean loss."""
    from gnnweave.host.models import Engine, make_model, make_optimizer
    from gnnweave.host.sampling import NeighborSampler, seed_batches
    from gnnweave.host.timeline import Timeline
    from gnnweave.host.train import executor_for, params_digest, sparse_input_features
    devices = _devices_of(config, comm.rank)
    executors = {}
    dense_name = devices[0] if config.rank_devices else config.device
    engine = Engine(executor_for(dense_name, executors, config.executor_options), Timeline())
    speeds = _speeds(config, comm, data)
    fractions = np.ones(comm.world) if speeds is None else np.asarray(speeds, dtype=np.float64)
    if fractions.shape[0] != comm.world or not np.all(fractions > 0):
        raise InputError(f"--rank-speeds: {comm.world} positive numbers needed, got {speeds}")
    per_seed = []
    try:
        for seed in config.seed_list():
            model = make_model(key, data.x.shape[1], data.num_classes, hidden=hp["hidden"],
                               layers=config.layers, dropout=hp["dropout"], seed=seed)
            x_in = sparse_input_features(model.prepare_features(engine, data.graph, data.x),
                                 config.sparse_input)
            opt = make_optimizer(config.optimizer, model.params, lr=hp["lr"],
                                 weight_decay=hp["weight_decay"], decay=model.decay,
                                 momentum=config.momentum)
            if model.hops and len(config.fanouts) != model.hops:
                raise InputError(f"TrainConfig.fanouts has {len(config.fanouts)} entries, the "
                                 f"{key} model has {model.hops} layers")
            sampler = NeighborSampler(data.graph, config.fanouts) if model.hops else None
            steps = seeds_trained = 0
            times = []
            # each rank samples with its own generator: bit-identical resumes need the same
            # ranks at the same speeds, which the checkpoint records
            ckpt = _Checkpoints(config, hp, key, seed, data, False, ranks=comm.world,
                                rank_speeds=[float(f) for f in fractions / fractions.sum()],
                                batch_size=config.batch_size, fanouts=list(config.fanouts))
            start, resumed_from = 0, None
            state = ckpt.load() if config.resume else None
            if state is not None:
                model.params, start = state["params"], state["epoch"]
                opt.load_state(state["opt"], state["t"])
                resumed_from = start
            for epoch in range(start, hp["epochs"]):
                comm.epoch = epoch
                t0 = time.perf_counter()
                batches = seed_batches(data.train_idx, config.batch_size,
                                       np.random.default_rng([seed, epoch, 0x5A]))
                for step, batch in enumerate(batches):
                    cuts = batch_shares(batch.shape[0], fractions)
                    mine = batch[cuts[comm.rank]:cuts[comm.rank + 1]]
                    grads = _minibatch_grads(model, engine, sampler, x_in, data, mine,
                                             mine.shape[0] / batch.shape[0],
                                             np.random.default_rng([seed, epoch, step,
                                                                    comm.rank, 0x5B]))
                    names = sorted(model.params)
                    flat = comm.sum(np.concatenate([np.asarray(grads[k], np.float64).ravel()
                                                    for k in names]))
                    at, out = 0, {}
                    for k in names:
                        size = model.params[k].size
                        out[k] = flat[at:at + size].reshape(model.params[k].shape).astype(np.float32)
                        at += size
                    model.params = opt.step(model.params, out)
                    steps += 1
                    seeds_trained += mine.shape[0]
                times.append(time.perf_counter() - t0)
                if comm.rank == 0 and (epoch + 1 == hp["epochs"] or (
                        config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0)):
                    ckpt.save(model.params, opt, epoch + 1, [])
                digest_every = int(getattr(config, "digest_every", 10) or 0)
                if digest_every and ((epoch + 1) % digest_every == 0 or epoch + 1 == hp["epochs"]):
                    comm.check_same(int(params_digest(model.params)[:15], 16),
                                    f"parameter digest after epoch {epoch + 1}")
            acc = _full_graph_accuracy(engine, model, x_in, data)
            mine = np.zeros((3, comm.world), dtype=np.float64)
            mine[:, comm.rank] = (steps, seeds_trained, float(np.mean(times)) if times else 0.0)
            every = comm.sum(mine, counter="format_bytes")
            per_seed.append(dict(seed=seed, **acc, epochs_done=hp["epochs"],
                                 resumed_from=resumed_from,
                                 checkpoint=str(ckpt.path) if ckpt.path else None,
                                 params_sha256=params_digest(model.params),
                                 rank_steps=[int(v) for v in every[0]],
                                 rank_seeds=[int(v) for v in every[1]],
                                 rank_epoch_seconds=[float(v) for v in every[2]],
                                 epoch_seconds=float(np.mean(times)) if times else None,
                                 params={k: np.array(v) for k, v in model.params.items()}))
    finally:
        engine.close()
        for ex in executors.values():
            ex.close()
    accs = [r["test_acc"] for r in per_seed]
    grad_bytes = 8 * sum(int(v.size) for v in model.params.values())
    return dict(dataset=getattr(data.dataset, "name", str(config.dataset)), model=key,
                device=dense_name, mode="mini-batch", numeric="float", world_size=comm.world,
                partition_method=None, halo_nodes=None, comm_bytes_per_epoch=0,
                predicted_comm_bytes_per_epoch=0, allreduce_bytes_per_step=grad_bytes,
                rank_epoch_seconds=per_seed[-1]["rank_epoch_seconds"],
                rank_speeds=[float(f) for f in fractions],
                hyperparameters=dict(hp, layers=config.layers, optimizer=config.optimizer,
                                     batch_size=config.batch_size,
                                     fanouts=list(config.fanouts)),
                test_acc_mean=float(np.mean(accs)), test_acc_std=float(np.std(accs)),
                epoch_seconds=float(np.mean([r["epoch_seconds"] for r in per_seed])),
                seeds=per_seed)


def _minibatch_grads(model, engine, sampler, x_in, data, seeds, share, rng) -> dict:
    """Gradients of ``share`` x the mean loss over ``seeds`` (zeros for no seeds: the rank
    still joins the step's all-reduce)."""
    from gnnweave.host.models import LayerGraph, softmax_cross_entropy
    if seeds.shape[0] == 0:
        return {k: np.zeros_like(v) for k, v in model.params.items()}
    if sampler is not None:
        blocks = sampler.sample(seeds, rng)
        x = x_in[blocks[0].src_nodes]
        layers = [LayerGraph(b.graph, b.n_dst) for b in blocks]
    else:
        x, layers = x_in[seeds], []
    logits, cache = model.forward(engine, x, layers, train=True, rng=rng)
    _, d = softmax_cross_entropy(logits, data.y[seeds])
    return model.backward(engine, d * np.float32(share), cache, layers)


def _full_graph_accuracy(engine, model, x_in, data) -> dict:
    """Accuracy of the replicated model on the whole graph (every rank has it)."""
    from gnnweave.host.models import LayerGraph
    layers = [LayerGraph(data.graph, data.graph.num_nodes)] * model.hops
    logits, _ = model.forward(engine, x_in, layers, train=False, rng=None)
    pred = logits.argmax(axis=1)
    return {name: float((pred[idx] == data.y[idx]).mean())
            for name, idx in (("train_acc", data.train_idx), ("val_acc", data.val_idx),
                              ("test_acc", data.test_idx))}


# --------------------------------------------------------------------------- timeline

_CATEGORIES = ("exchange", "allreduce")
_MAX_RECORDS = 512


def _gather_timeline(comm: Comm, last_step) -> list[dict]:
    """Every rank's last training step: its length and its collectives, in seconds from
    the step's start on the rank's own clock (ranks' clocks are not compared)."""
    mine = np.zeros((comm.world, _MAX_RECORDS + 1, 3), dtype=np.float64)
    if last_step is not None:
        t0, seconds, records = last_step
        mine[comm.rank, 0] = (seconds, len(records), 0)
        for i, (cat, a, b, nbytes) in enumerate(records[:_MAX_RECORDS]):
            mine[comm.rank, i + 1] = (_CATEGORIES.index(cat), a - t0, b - t0)
    every = comm.sum(mine.reshape(-1), counter="format_bytes").reshape(mine.shape)
    out = []
    for r in range(comm.world):
        seconds, count = every[r, 0, 0], int(min(every[r, 0, 1], _MAX_RECORDS))
        spans = [dict(category=_CATEGORIES[int(c)], start=float(a), end=float(b))
                 for c, a, b in every[r, 1:count + 1]]
        out.append(dict(rank=r, step_seconds=float(seconds), spans=spans))
    return out


def plot_rank_timeline(timeline: list[dict], path, title: str = ""):
    """One row per rank: the step's compute (what is not a collective), halo exchanges and
    all-reduces (which include the time a rank waits for the others in them), and idle:
    from the rank's own step end to the slowest rank's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colours = {"compute": "#4c72b0", "exchange": "#dd8452", "allreduce": "#c44e52",
               "idle": "#d9d9d9"}
    fig, ax = plt.subplots(figsize=(9, 1 + 0.6 * len(timeline)))
    slowest = max((row["step_seconds"] for row in timeline), default=0.0)
    for row in timeline:
        y = row["rank"]
        ax.barh(y, row["step_seconds"], left=0, color=colours["compute"], height=0.6)
        ax.barh(y, slowest - row["step_seconds"], left=row["step_seconds"], height=0.6,
                color=colours["idle"])
        for span in row["spans"]:
            ax.barh(y, span["end"] - span["start"], left=span["start"], height=0.6,
                    color=colours[span["category"]])
    ax.set_yticks([r["rank"] for r in timeline], [f"rank {r['rank']}" for r in timeline])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the step's start (each rank's own clock)")
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=k) for k, c in colours.items()],
              loc="upper right", fontsize=8)
    ax.set_title(title or "training step per rank")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
