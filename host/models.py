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
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnweave.graph import CSRGraph, gcn_norm
from gnnweave.host.engine import Engine, check_shares, cut_rows_by_fractions  # noqa: F401 (re-exported)


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


def sparse_dropout(h, p, rng, train, layer=0):
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


def sparse_dropout_backward(dh, keep, p):
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
        hd, keep = sparse_dropout(x, self.dropout, rng, train, layer=0)
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
                    hd_c, keep_c = sparse_dropout(np.maximum(a_c, 0), self.dropout, rng, train,
                                            layer=i + 1)
                    return a_c, hd_c, keep_c, self._pre(eng, i + 1, hd_c, nxt, rows=(lo, hi))

                parts = eng.pipelined_aggregate(lg.graph, self._agg_input(pre), lg.n_dst,
                                                consume)
                a = np.concatenate([p[0] for p in parts], axis=0)
                cache.append((hd, keep, a))
                hd = np.concatenate([p[1] for p in parts], axis=0)
                hd.flags.writeable = False   # as dropout's output: executors may cache it
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
            hd, keep = sparse_dropout(np.maximum(a, 0), self.dropout, rng, train, layer=i + 1)
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
                da = sparse_dropout_backward(dh, keep, self.dropout)
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
        hd, keep = sparse_dropout(x, self.dropout, rng, train)
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
