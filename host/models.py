"""GNN models with manual backprop through the executor ops, host optimisers, the loss.

Every matrix op of a training step goes through an :class:`Engine`: dense ops (feature
transform, input and weight gradients) run on one executor; each aggregation runs as
row shards on the executors of a partition (or whole on one executor) and the shards
are concatenated in row order. Forward aggregation walks the graph, backward
aggregation its transpose (``transpose=True``). Elementwise work (bias, ReLU, dropout,
softmax, optimiser) stays on the host in float32.

Models (``make_model``):

* ``gcn``  Kipf & Welling: ``A_hat relu(A_hat drop(X) W0 + b0) ... W1 + b1`` with
  ``A_hat = D^-1/2 (A + I) D^-1/2``; the transform runs before the aggregation (fewer
  features to gather); weight decay on the first layer only, as in the paper's code.
* ``sage`` GraphSAGE, mean aggregator: ``h W_self + mean_{u in N(v)} h_u W_neigh + b``
  (the mean is a weighted sum with ``1 / deg`` edge weights, so the backward pass is the
  same weighted sum on the transpose).
* ``sgc``  Wu et al.: ``softmax(S^K X W + b)``; ``S^K X`` is computed once, through the
  executors, before training.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnweave.graph import CSRGraph, gcn_norm
from gnnweave.host.executors import Executor, _nbytes, transposed
from gnnweave.host.timeline import FPGA_KINDS, Timeline


# --------------------------------------------------------------------------- engine


def cut_rows_by_fractions(indptr, lo: int, hi: int, fractions) -> list[tuple[int, int]]:
    """Contiguous row ranges of ``[lo, hi)`` holding about ``fractions`` of its edges."""
    fr = np.asarray(fractions, dtype=np.float64)
    fr = fr / fr.sum() if fr.sum() > 0 else np.full(len(fr), 1.0 / len(fr))
    e0, e1 = int(indptr[lo]), int(indptr[hi])
    bounds = [lo]
    cum = np.cumsum(fr)[:-1]
    for c in cum:
        target = e0 + c * (e1 - e0)
        b = int(np.searchsorted(indptr[lo:hi + 1], target, side="left")) + lo
        bounds.append(min(max(b, bounds[-1]), hi))
    bounds.append(hi)
    return list(zip(bounds[:-1], bounds[1:]))


def check_shares(shares: dict, num_nodes: int) -> dict[str, tuple[int, int]]:
    """Validate ``{device: (lo, hi)}``: contiguous, in order, covering ``0..num_nodes``."""
    if not isinstance(shares, dict) or not shares:
        raise ValueError("partition: expected a non-empty {device: (lo, hi)} mapping")
    out = {}
    expect = 0
    for dev, rng in shares.items():
        try:
            lo, hi = (int(v) for v in rng)
        except (TypeError, ValueError):
            raise ValueError(f"partition[{dev!r}] = {rng!r}: expected (lo, hi)") from None
        if lo != expect or hi < lo:
            raise ValueError(f"partition[{dev!r}] = ({lo}, {hi}): ranges must be contiguous from 0 "
                             f"in device order (expected lo = {expect}, lo <= hi)")
        out[str(dev)] = (lo, hi)
        expect = hi
    if expect != num_nodes:
        raise ValueError(f"partition: ranges end at node {expect}, the graph has {num_nodes} nodes")
    return out


class Engine:
    """Runs and records the ops of a training step on executors.

    ``shards``: ``{device: (executor, (lo, hi))}`` over the nodes of the full graph, or
    None for aggregation on ``dense`` alone. A graph with a different node count (a
    sampled block) is cut into row ranges holding the same edge fractions.

    ``steal``: the shard devices steal rows from each other within each aggregation
    (:func:`~gnnweave.host.partition.run_with_stealing`): a device whose rows are done takes
    the back end of a slower one's. The chunks run one after another on the host, scheduled
    on the devices' own clocks (device time on FPGA kinds, CPU time on cpu), which is the
    order concurrent devices would run them in; ``steal_costs`` (``{device: ShareCost}``,
    default: equal per-edge costs, corrected from the first chunks) predict the chunks.
    """

    def __init__(self, dense: Executor, timeline: Timeline | None = None, *,
                 shards: dict[str, tuple[Executor, tuple[int, int]]] | None = None,
                 num_nodes: int | None = None, base_graph: CSRGraph | None = None,
                 overlap_chunks: int = 1, steal: bool = False, steal_costs=None):
        if (isinstance(overlap_chunks, bool) or not isinstance(overlap_chunks, (int, np.integer))
                or overlap_chunks < 1):
            raise ValueError(f"overlap_chunks = {overlap_chunks!r}: expected an integer >= 1")
        self.dense = dense
        self.timeline = timeline or Timeline()
        self.num_nodes = num_nodes
        self.base_graph = base_graph
        self.overlap_chunks = int(overlap_chunks)
        self.steal = bool(steal)
        self.steal_costs = steal_costs
        self.steals = 0          # row ranges stolen so far (reported per run)
        self.row_sum = None      # sum over rows for bias gradients; None: a.sum(axis=0)
        self.shards = None
        self._pool = None
        self._dense_worker = None
        self._fractions = None
        self.set_shards(shards)

    def set_shards(self, shards: dict[str, tuple[Executor, tuple[int, int]]] | None):
        """Replace the partition (between steps; the rebalancer calls this)."""
        self.close()
        self.shards = shards if shards else None
        self._fractions = None
        if self.shards:
            g = self.base_graph
            self._fractions = [int(g.indptr[hi] - g.indptr[lo]) if g is not None else hi - lo
                               for _, (lo, hi) in self.shards.values()]
            if len(self.shards) > 1:
                self._pool = ThreadPoolExecutor(max_workers=len(self.shards),
                                                thread_name_prefix="gnnweave-shard")

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._dense_worker is not None:
            self._dense_worker.shutdown(wait=True)
            self._dense_worker = None

    def overlaps(self) -> bool:
        """True when a layer's aggregation runs in row chunks overlapped with the dense work
        they feed: ``overlap_chunks > 1``, the aggregation is partitioned onto executors
        that are not the dense one (one executor never runs two ops at once), and the dense
        executor computes each row on its own (an FPGA kind quantises a whole operand with
        one format taken from its range, so a chunk would round differently)."""
        if self.overlap_chunks < 2 or not self.shards:
            return False
        if any(ex is self.dense for ex, _ in self.shards.values()):
            return False
        return getattr(self.dense, "kind", "") not in FPGA_KINDS

    def pipelined_aggregate(self, graph: CSRGraph, x: np.ndarray, n_dst: int, consume) -> list:
        """Aggregate rows ``[0, n_dst)`` in ``overlap_chunks`` row chunks (about equal edge
        counts); ``consume(lo, hi, out_rows)`` runs on one dense worker thread, in chunk
        order, while the aggregation executors work on the next chunk (HyGCN / HP-GNN's
        aggregation -> combination pipeline). Returns ``consume``'s results in row order."""
        ranges = [r for r in cut_rows_by_fractions(graph.indptr, 0, n_dst,
                                                   [1.0] * self.overlap_chunks) if r[1] > r[0]]
        if isinstance(x, np.ndarray) and x.base is None:
            # every chunk reads all of x: read-only, an FPGA executor quantises it once for
            # all chunks (its cache holds read-only arrays) instead of once per chunk
            x.flags.writeable = False
        if self._dense_worker is None:
            self._dense_worker = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="gnnweave-dense")
        futures = []
        try:
            for lo, hi in ranges:
                part = self.aggregate(graph, x, rows=(lo, hi))
                futures.append(self._dense_worker.submit(consume, lo, hi, part))
            return [f.result() for f in futures]
        finally:
            for f in futures:   # never leave the dense executor busy behind an error
                f.cancel() or f.exception()

    def _call(self, ex, method, *args, sizes=None, **kw):
        return self.timeline.call(ex, method, *args, sizes=sizes, **kw).value

    def _agg_timed(self, ex, graph, x, reduce, rows, transpose):
        """One executor's aggregation of ``rows``, recorded: ``(result rows, seconds on the
        kind's clock)``."""
        g = transposed(graph) if transpose else graph
        lo, hi = rows
        sizes = dict(edges=int(g.indptr[hi] - g.indptr[lo]), rows=hi - lo, feat=int(x.shape[1]),
                     nodes=int(g.num_nodes), transpose=int(bool(transpose)))
        res, seconds = self.timeline.call_timed(ex, "aggregate", graph, x, reduce, rows=rows,
                                                transpose=transpose, sizes=sizes)
        return res.value, seconds

    def _agg_one(self, ex, graph, x, reduce, rows, transpose):
        return self._agg_timed(ex, graph, x, reduce, rows, transpose)[0]

    def aggregate(self, graph: CSRGraph, x: np.ndarray, *, rows=None, transpose=False,
                  reduce="sum") -> np.ndarray:
        n = graph.num_nodes
        lo, hi = rows if rows is not None else (0, n)
        if self.shards is None:
            return self._agg_one(self.dense, graph, x, reduce, (lo, hi), transpose)
        if n == self.num_nodes and (lo, hi) == (0, n):
            ranges = [r for _, r in self.shards.values()]
        else:
            g = transposed(graph) if transpose else graph
            ranges = cut_rows_by_fractions(g.indptr, lo, hi, self._fractions)
        if self.steal and len(self.shards) > 1:
            return self._aggregate_stealing(graph, x, reduce, transpose, ranges, lo, hi)
        jobs = [(ex, r) for (ex, _), r in zip(self.shards.values(), ranges) if r[1] > r[0]]
        if not jobs:
            return np.zeros((0, x.shape[1]), dtype=np.float32)
        if self._pool is None or len(jobs) == 1:
            parts = [self._agg_one(ex, graph, x, reduce, r, transpose) for ex, r in jobs]
        else:
            futures = [self._pool.submit(self._agg_one, ex, graph, x, reduce, r, transpose)
                       for ex, r in jobs]
            parts = [f.result() for f in futures]
        return np.concatenate(parts, axis=0)

    def _aggregate_stealing(self, graph, x, reduce, transpose, ranges, lo, hi):
        from gnnweave.host.partition import ShareCost, run_with_stealing
        g = transposed(graph) if transpose else graph
        names = list(self.shards)
        shares = dict(zip(names, ranges))
        costs = self.steal_costs or {d: ShareCost(per_edge_s=1e-9, per_row_s=1e-12)
                                     for d in names}
        parts = {}

        def run_chunk(d, a, b, first):
            parts[a], seconds = self._agg_timed(self.shards[d][0], graph, x, reduce, (a, b),
                                                transpose)
            return seconds
        run = run_with_stealing(g.indptr, shares, costs, run_chunk)
        self.steals += run.steals
        if not parts:
            return np.zeros((0, x.shape[1]), dtype=np.float32)
        out = np.concatenate([parts[a] for a in sorted(parts)], axis=0)
        assert out.shape[0] == hi - lo, (out.shape, lo, hi)
        return out

    def sum_rows(self, a) -> np.ndarray:
        """A bias gradient (a sum over the rows); ``row_sum`` when set (an order-independent
        sum, see :func:`gnnweave.host.distributed.invariant_row_sum`)."""
        return a.sum(axis=0) if self.row_sum is None else self.row_sum(a)

    def dense_forward(self, x, w, b=None, *, relu=False):
        return self._call(self.dense, "dense_forward", x, w, b, relu=relu,
                          sizes=dict(m=x.shape[0], k=x.shape[1], n=w.shape[1]))

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        return self._call(self.dense, "dense_input_grad", dy, w, relu_mask=relu_mask,
                          sizes=dict(m=dy.shape[0], k=w.shape[0], n=dy.shape[1]))

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        return self._call(self.dense, "dense_weight_grad", x, dy, relu_mask=relu_mask,
                          sizes=dict(m=x.shape[0], k=x.shape[1], n=dy.shape[1]))

    def transfer_in(self, array):
        return self._call(self.dense, "transfer_in", array, sizes=dict(nbytes=_nbytes(array)))


# --------------------------------------------------------------------------- layers' graphs


@dataclass
class LayerGraph:
    """The graph a layer aggregates over: destinations are rows ``[0, n_dst)``."""

    graph: CSRGraph
    n_dst: int

    @property
    def n_src(self) -> int:
        return self.graph.num_nodes


def mean_norm(graph: CSRGraph) -> CSRGraph:
    """Edge weights ``1 / in_degree(v)`` (mean over the neighbours), self loops removed."""
    n = graph.num_nodes
    dst = np.repeat(np.arange(n, dtype=np.int64), graph.in_degree)
    keep = graph.indices != dst
    src, dst = graph.indices[keep], dst[keep]
    deg = np.bincount(dst, minlength=n).astype(np.float64)
    return CSRGraph.from_edge_index(np.stack([src, dst]), n, 1.0 / deg[dst])


def row_normalize(x: np.ndarray) -> np.ndarray:
    """Features divided by their row sums (rows summing to 0 stay 0), as Kipf & Welling."""
    x = np.asarray(x, dtype=np.float32)
    s = x.sum(axis=1, keepdims=True)
    return np.where(s != 0, x / np.where(s != 0, s, 1), 0).astype(np.float32)


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)


def _pad_rows(a: np.ndarray, n: int) -> np.ndarray:
    if a.shape[0] == n:
        return a
    out = np.zeros((n, a.shape[1]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


_NZ_CACHE: list = []   # [(array, its non-zero flat positions)] for the last large input


def _nonzero_positions(h: np.ndarray) -> np.ndarray:
    """``flatnonzero(h)``, remembered for the (constant) input feature matrix."""
    if h.size < (1 << 16):
        return np.flatnonzero(h)
    if _NZ_CACHE and _NZ_CACHE[0][0] is h and not h.flags.writeable:
        return _NZ_CACHE[0][1]
    nz = np.flatnonzero(h)
    if not h.flags.writeable:
        _NZ_CACHE[:] = [(h, nz)]
    return nz


def _draw(rng, layer, count, rows, cols):
    """``count`` uniform draws for the elements at ``rows(), cols()``: in sequence from a
    numpy Generator, or by position from a counter-based one
    (:class:`~gnnweave.host.dropout.CounterDropout`)."""
    if hasattr(rng, "draw_at"):
        return rng.draw_at(layer, rows(), cols())
    return rng.random(count, dtype=np.float32)


def _dropout(h, p, rng, train, layer=0):
    """Inverted dropout that draws only for the non-zero elements (Kipf & Welling's sparse
    dropout): a zero stays zero whether dropped or not, and bag-of-words inputs are ~99 %
    zeros. ``layer`` keys a counter-based generator. Returns (output, keep mask)."""
    if not train or p <= 0:
        return h, None
    if sp.issparse(h):
        # the same draw per stored element; the structure (and so the CSR arrays) is kept
        h = sp.csr_matrix(h)
        keep = _draw(rng, layer, h.nnz,
                     lambda: np.repeat(np.arange(h.shape[0]), np.diff(h.indptr)),
                     lambda: h.indices) >= p
        data = (h.data * keep) * np.float32(1.0 / (1.0 - p))
        return sp.csr_matrix((data.astype(h.dtype), h.indices, h.indptr), shape=h.shape), None
    flat = h.reshape(-1)
    nz = _nonzero_positions(h)
    cols = max(h.shape[1], 1)
    kept = nz[_draw(rng, layer, nz.shape[0], lambda: nz // cols, lambda: nz % cols) >= p]
    out = np.zeros_like(h)
    out.reshape(-1)[kept] = flat[kept] * np.float32(1.0 / (1.0 - p))
    keep = np.zeros(h.shape, dtype=bool)
    keep.reshape(-1)[kept] = True
    out.flags.writeable = False   # read by a forward and a backward op: executors may cache it
    return out, keep


def _dropout_back(dh, keep, p):
    if keep is None:
        return dh
    return (dh * keep) * np.float32(1.0 / (1.0 - p))


# --------------------------------------------------------------------------- models


class Model:
    name = "model"
    hops = 2                      # layers that aggregate (sampling depth)
    defaults: dict = {}

    def __init__(self, in_dim, hidden, out_dim, *, layers=2, dropout=0.5, seed=0):
        self.in_dim, self.hidden, self.out_dim = in_dim, hidden, out_dim
        self.num_layers = layers
        self.dropout = dropout
        self.params: dict[str, np.ndarray] = {}
        self.decay: list[str] = []
        self._init(np.random.default_rng([seed, 0x1417]))

    def dims(self):
        d = [self.in_dim] + [self.hidden] * (self.num_layers - 1) + [self.out_dim]
        return list(zip(d[:-1], d[1:]))

    @classmethod
    def norm_graph(cls, graph: CSRGraph) -> CSRGraph:
        """The weighted graph the model aggregates over."""
        return gcn_norm(graph)

    def prepare_features(self, engine: Engine, graph: CSRGraph, x: np.ndarray) -> np.ndarray:
        """Input features the training step sees (SGC propagates them once here)."""
        return x


class _MessagePassing(Model):
    """The layer loop GCN and SAGE share: dropout, the layer's transform + aggregation,
    ReLU between layers; subclasses give one layer's forward (``_pre``: the dense work
    before the aggregation, ``_agg_input``: what is aggregated, ``_post``: output rows from
    their aggregation) and backward. With ``Engine.overlaps()`` the forward pipelines a
    layer's aggregation with the next layer's transform in row chunks; the backward pass
    runs its ops one after the other."""

    def forward(self, eng: Engine, x, layers: list[LayerGraph], *, train, rng):
        cache = []
        L = self.num_layers
        hd, keep = _dropout(x, self.dropout, rng, train, layer=0)
        pre = self._pre(eng, i=0, hd=hd, lg=layers[0])
        for i in range(L):
            lg = layers[i]
            if i < L - 1 and lg.n_dst > 1 and eng.overlaps():
                # a layer's output rows feed the next layer's transform row by row: chunk k's
                # ReLU, dropout and transform run on the dense device while the aggregation
                # devices work on chunk k+1. The chunks draw the dropout in row order, so
                # the numbers are those of the unchunked step.
                nxt = layers[i + 1]

                def consume(lo, hi, agg, i=i, pre=pre, nxt=nxt):
                    a_c = self._post(i, pre, agg, lo, hi)
                    hd_c, keep_c = _dropout(np.maximum(a_c, 0), self.dropout, rng, train,
                                            layer=i + 1)
                    return a_c, hd_c, keep_c, self._pre(eng, i + 1, hd_c, nxt, rows=(lo, hi))

                parts = eng.pipelined_aggregate(lg.graph, self._agg_input(pre), lg.n_dst,
                                                consume)
                a = np.concatenate([p[0] for p in parts], axis=0)
                cache.append((hd, keep, a))
                hd = np.concatenate([p[1] for p in parts], axis=0)
                hd.flags.writeable = False   # as _dropout's output: executors may cache it
                keep = (None if parts[0][2] is None
                        else np.concatenate([p[2] for p in parts], axis=0))
                pre = tuple(np.concatenate([p[3][j] for p in parts], axis=0)
                            for j in range(len(parts[0][3])))
                continue
            a = self._post(i, pre, eng.aggregate(lg.graph, self._agg_input(pre),
                                                 rows=(0, lg.n_dst)), 0, lg.n_dst)
            cache.append((hd, keep, a))
            if i == L - 1:
                return a, cache
            hd, keep = _dropout(np.maximum(a, 0), self.dropout, rng, train, layer=i + 1)
            pre = self._pre(eng, i + 1, hd, layers[i + 1])
        return a, cache

    def backward(self, eng: Engine, dout, cache, layers: list[LayerGraph]):
        grads = {}
        da = dout
        for i in reversed(range(self.num_layers)):
            hd, keep, a = cache[i]
            if i < self.num_layers - 1:
                da = da * (a > 0)
            grads[f"b{i}"] = eng.sum_rows(da)
            dh = self._layer_backward(eng, i, hd, da, layers[i], grads, input_grad=i > 0)
            if i > 0:
                da = _dropout_back(dh, keep, self.dropout)
        return grads


class GCN(_MessagePassing):
    """``a = S (h W) + b`` (transform first: the aggregation runs on the narrower width)."""

    name = "gcn"
    defaults = dict(hidden=16, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200)

    def _init(self, rng):
        for i, (a, b) in enumerate(self.dims()):
            self.params[f"W{i}"] = glorot(rng, a, b)
            self.params[f"b{i}"] = np.zeros(b, dtype=np.float32)
        self.decay = ["W0"]
        self.hops = self.num_layers

    def _pre(self, eng, i, hd, lg, rows=None):
        """Dense work before layer ``i``'s aggregation, on all of ``hd`` or on its rows
        ``rows`` (``hd`` is then just those rows): ``(h W,)``."""
        return (eng.dense_forward(hd, self.params[f"W{i}"]),)

    @staticmethod
    def _agg_input(pre):
        return pre[0]

    def _post(self, i, pre, agg, lo, hi):
        """Layer ``i``'s output rows ``[lo, hi)`` from their aggregation ``agg``."""
        return agg + self.params[f"b{i}"]

    def _layer_backward(self, eng, i, hd, da, lg, grads, *, input_grad):
        dz = eng.aggregate(lg.graph, _pad_rows(da, lg.n_src), transpose=True)
        grads[f"W{i}"] = eng.dense_weight_grad(hd, dz)
        return eng.dense_input_grad(dz, self.params[f"W{i}"]) if input_grad else None


class SAGE(_MessagePassing):
    """``a = h_dst Ws + b + mean_N(h Wn)`` (GraphSAGE, mean aggregator)."""

    name = "sage"
    defaults = dict(hidden=16, dropout=0.5, lr=0.01, weight_decay=5e-4, epochs=200)

    def _init(self, rng):
        for i, (a, b) in enumerate(self.dims()):
            self.params[f"Ws{i}"] = glorot(rng, a, b)
            self.params[f"Wn{i}"] = glorot(rng, a, b)
            self.params[f"b{i}"] = np.zeros(b, dtype=np.float32)
        self.decay = [k for k in self.params if k.startswith("W")]
        self.hops = self.num_layers

    @classmethod
    def norm_graph(cls, graph):
        return mean_norm(graph)

    def _pre(self, eng, i, hd, lg, rows=None):
        """``(h_dst Ws + b, h Wn)`` on all of ``hd`` or on its rows ``rows`` (``hd`` is then
        just those rows; the self term covers the part of them below ``n_dst``)."""
        lo, hi = rows if rows is not None else (0, hd.shape[0])
        n_self = max(0, min(hi, lg.n_dst) - lo)
        ws, b = self.params[f"Ws{i}"], self.params[f"b{i}"]
        zs = (eng.dense_forward(hd[:n_self], ws, b) if n_self or rows is None
              else np.zeros((0, ws.shape[1]), dtype=np.float32))
        return zs, eng.dense_forward(hd, self.params[f"Wn{i}"])

    @staticmethod
    def _agg_input(pre):
        return pre[1]

    def _post(self, i, pre, agg, lo, hi):
        return pre[0][lo:hi] + agg

    def _layer_backward(self, eng, i, hd, da, lg, grads, *, input_grad):
        grads[f"Ws{i}"] = eng.dense_weight_grad(hd[: lg.n_dst], da)
        dzn = eng.aggregate(lg.graph, _pad_rows(da, lg.n_src), transpose=True)
        grads[f"Wn{i}"] = eng.dense_weight_grad(hd, dzn)
        if not input_grad:
            return None
        dh = eng.dense_input_grad(dzn, self.params[f"Wn{i}"])
        dh += _pad_rows(eng.dense_input_grad(da, self.params[f"Ws{i}"]), lg.n_src)
        return dh


class SGC(Model):
    name = "sgc"
    defaults = dict(hidden=0, dropout=0.0, lr=0.2, weight_decay=5e-5, epochs=100)

    def __init__(self, in_dim, hidden, out_dim, *, layers=2, dropout=0.0, seed=0):
        self.k = layers
        super().__init__(in_dim, hidden, out_dim, layers=1, dropout=dropout, seed=seed)
        self.hops = 0

    def _init(self, rng):
        self.params["W0"] = glorot(rng, self.in_dim, self.out_dim)
        self.params["b0"] = np.zeros(self.out_dim, dtype=np.float32)
        self.decay = ["W0"]

    def prepare_features(self, engine, graph, x):
        x = x.toarray() if sp.issparse(x) else x
        for _ in range(self.k):
            x = engine.aggregate(graph, x)
        return x

    def forward(self, eng, x, layers, *, train, rng):
        hd, keep = _dropout(x, self.dropout, rng, train)
        return eng.dense_forward(hd, self.params["W0"], self.params["b0"]), [hd]

    def backward(self, eng, dout, cache, layers):
        return {"W0": eng.dense_weight_grad(cache[0], dout), "b0": eng.sum_rows(dout)}


MODELS = {"gcn": GCN, "sage": SAGE, "graphsage": SAGE, "sgc": SGC}


def make_model(name: str, in_dim: int, out_dim: int, *, hidden: int = 16, layers: int = 2,
               dropout: float = 0.5, seed: int = 0) -> Model:
    key = str(name).lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of gcn, sage, sgc")
    return MODELS[key](in_dim, hidden, out_dim, layers=layers, dropout=dropout, seed=seed)


# --------------------------------------------------------------------------- loss, optimisers


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray, rows=None):
    """Mean cross entropy over ``rows`` (all rows when None); returns (loss, dlogits)."""
    logits = np.asarray(logits, dtype=np.float32)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    idx = np.arange(logits.shape[0]) if rows is None else np.asarray(rows)
    n = max(idx.shape[0], 1)
    loss = float(-logp[idx, labels[idx]].mean()) if idx.size else 0.0
    d = np.zeros_like(logits)
    p = np.exp(logp[idx])
    p[np.arange(idx.shape[0]), labels[idx]] -= 1.0
    d[idx] = p / n
    return loss, d


class Optimizer:
    def __init__(self, params: dict[str, np.ndarray], lr: float, weight_decay: float,
                 decay: list[str]):
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.decay = set(decay)
        self.t = 0

    def _grad(self, name, g, w):
        g = np.asarray(g, dtype=np.float32)
        if self.weight_decay and name in self.decay:
            g = g + np.float32(self.weight_decay) * w
        return g

    def state_arrays(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def load_state(self, arrays: dict[str, np.ndarray], t: int):
        raise NotImplementedError


class Adam(Optimizer):
    """Adam with L2 weight decay added to the gradient (torch.optim.Adam's weight_decay)."""

    def __init__(self, params, lr=0.01, weight_decay=0.0, decay=(), betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, lr, weight_decay, list(decay))
        self.b1, self.b2 = betas
        self.eps = eps
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> dict:
        """New parameter dict (the old arrays are not modified)."""
        t = self.t + 1
        new_p, new_m, new_v = {}, {}, {}
        c1 = 1 - self.b1 ** t
        c2 = 1 - self.b2 ** t
        for k, w in params.items():
            g = self._grad(k, grads[k], w)
            m = self.b1 * self.m[k] + (1 - self.b1) * g
            v = self.b2 * self.v[k] + (1 - self.b2) * g * g
            step = (self.lr / c1) * m / (np.sqrt(v / c2) + self.eps)
            new_p[k] = (w - step).astype(np.float32)
            new_m[k], new_v[k] = m.astype(np.float32), v.astype(np.float32)
        self.m, self.v, self.t = new_m, new_v, t
        return new_p

    def state_arrays(self):
        out = {f"adam_m:{k}": v for k, v in self.m.items()}
        out.update({f"adam_v:{k}": v for k, v in self.v.items()})
        return out

    def load_state(self, arrays, t):
        self.m = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("adam_m:")}
        self.v = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("adam_v:")}
        self.t = int(t)


class SGD(Optimizer):
    """SGD with momentum, torch.optim.SGD semantics (``buf = mu buf + g; w -= lr buf``)."""

    def __init__(self, params, lr=0.1, weight_decay=0.0, decay=(), momentum=0.9):
        super().__init__(params, lr, weight_decay, list(decay))
        self.momentum = float(momentum)
        self.buf = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads):
        new_p, new_b = {}, {}
        for k, w in params.items():
            g = self._grad(k, grads[k], w)
            b = (self.momentum * self.buf[k] + g) if self.t > 0 else g
            new_b[k] = b.astype(np.float32)
            new_p[k] = (w - self.lr * b).astype(np.float32)
        self.buf, self.t = new_b, self.t + 1
        return new_p

    def state_arrays(self):
        return {f"sgd_buf:{k}": v for k, v in self.buf.items()}

    def load_state(self, arrays, t):
        self.buf = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("sgd_buf:")}
        self.t = int(t)


def make_optimizer(name: str, params, *, lr, weight_decay, decay, momentum=0.9) -> Optimizer:
    key = str(name).lower()
    if key == "adam":
        return Adam(params, lr, weight_decay, decay)
    if key in ("sgd", "momentum"):
        return SGD(params, lr, weight_decay, decay, momentum)
    raise ValueError(f"unknown optimizer {name!r}; choose adam or sgd")
