"""SGC (Wu et al., ICML 2019) on the bit-exact path: ``S^2 X`` with the golden Aggregator,
then a linear softmax classifier trained in a one-stage :class:`GoldenPipeline`.

``S = D^-1/2 (A + I) D^-1/2`` (``gnnweave.graph.gcn_norm``) with edge weights in
``FixedFormat(16, 14)``; ``X`` is row-normalised and scaled by :data:`FEATURE_SCALE` so
that the propagated features use the 16-bit range; a constant-1 column carries the bias.
Training: full-batch SGD with momentum on the training nodes, split into microbatches
that the pipeline accumulates (synchronous schedules) — the loss gradient
``(softmax(z) - onehot(y)) / n_train`` comes from the host
(:func:`~gnnweave.golden.pipeline.softmax_xent_grad`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnnweave.datasets import data_root
from gnnweave.fixed import FixedFormat
from gnnweave.golden.aggregate import AggregateFormat, aggregate
from gnnweave.golden.mac import SgdFormat, mac_forward
from gnnweave.golden.pipeline import GoldenPipeline, TrainFormat, softmax_xent_grad
from gnnweave.graph import CSRGraph, gcn_norm

#: Row-normalised bag-of-words times this keeps S^2 X inside FixedFormat(16, 11).
FEATURE_SCALE = 15.0
FEATURE_FORMAT = FixedFormat(16, 11)
EDGE_FORMAT = FixedFormat(16, 14)

SGC_FORMAT = TrainFormat(
    act=FixedFormat(16, 8),          # logits
    grad=FixedFormat(16, 15),        # dL/dz = (p - y) / n_train, |.| <= 1
    sgd=SgdFormat(master=FixedFormat(32, 24), weight=FixedFormat(16, 12),
                  grad=FixedFormat(32, 14), lr=FixedFormat(16, 16), wd=FixedFormat(16, 20),
                  mu=FixedFormat(16, 15)),
    input=FEATURE_FORMAT,
)


@dataclass
class SgcConfig:
    lr: float = 0.2
    weight_decay: float = 5e-3
    momentum: float = 0.9
    epochs: int = 100
    microbatches: int = 4
    schedule: str = "gpipe"


@dataclass
class SgcResult:
    test_accuracy: float
    val_accuracy: float
    train_accuracy: float
    epochs: int
    master: np.ndarray = field(repr=False)
    features_q: np.ndarray = field(repr=False)


def load_planetoid(name: str, data_dir=None) -> dict:
    path = Path(data_dir or data_root()) / f"{name}.npz"
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} not found (set GNNWEAVE_DATA)")
    with np.load(path, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def propagate_features(data: dict, hops: int = 2) -> np.ndarray:
    """``S^hops X`` on the golden Aggregator, integers in :data:`FEATURE_FORMAT`, with a
    trailing constant-1 column (the bias input)."""
    x = np.asarray(data["x"], dtype=np.float64)
    n = x.shape[0]
    x = FEATURE_SCALE * x / np.maximum(x.sum(axis=1, keepdims=True), 1.0)
    graph = gcn_norm(CSRGraph.from_edge_index(data["edge_index"], n))
    w_q, _ = EDGE_FORMAT.quantize(graph.weights)
    fmt = AggregateFormat(feat=FEATURE_FORMAT, weight=EDGE_FORMAT, out=FEATURE_FORMAT)
    h, sat = FEATURE_FORMAT.quantize(x)
    if sat:
        raise ValueError(f"{sat} input features saturate {FEATURE_FORMAT}")
    h = h.astype(np.int64)
    for _ in range(hops):
        h = aggregate(graph, h, "sum", fmt, weights=w_q.astype(np.int64)).out
    ones = np.full((n, 1), 1 << FEATURE_FORMAT.frac, dtype=np.int64)
    return np.concatenate([h, ones], axis=1)


def microbatch_rows(n_rows: int, microbatches: int) -> list[np.ndarray]:
    """Split row positions ``0..n_rows-1`` into ``microbatches`` near-equal consecutive parts."""
    if not 1 <= microbatches <= n_rows:
        raise ValueError(f"microbatches must be in 1..{n_rows}, got {microbatches}")
    return np.array_split(np.arange(n_rows), microbatches)


def make_pipeline(n_features: int, n_classes: int, cfg: SgcConfig,
                  fmt: TrainFormat = SGC_FORMAT) -> GoldenPipeline:
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(cfg.lr, cfg.weight_decay, cfg.momentum)
    master = np.zeros((n_features, n_classes), dtype=np.int64)
    return GoldenPipeline([master], relu=[False], fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)


@dataclass
class SgcSetup:
    """The training problem of SGC on one dataset: propagated features, the training
    nodes split into microbatches, their labels and the host loss-gradient scale."""

    data: dict = field(repr=False)
    features_q: np.ndarray = field(repr=False)   # S^2 X (+ bias column), FEATURE_FORMAT
    y: np.ndarray = field(repr=False)
    inputs: list = field(repr=False)            # one microbatch of training rows each
    labels: list = field(repr=False)
    loss_scale: float = 1.0
    n_classes: int = 0

    def loss_grad(self, fmt: TrainFormat = SGC_FORMAT):
        def grad(mb, logits_q):
            return softmax_xent_grad(logits_q, self.labels[mb % len(self.labels)], act=fmt.act,
                                     grad=fmt.grad, scale=self.loss_scale)
        return grad


def prepare_sgc(name: str, cfg: SgcConfig = SgcConfig(), data_dir=None) -> SgcSetup:
    data = load_planetoid(name, data_dir)
    feats = propagate_features(data)
    y = np.asarray(data["y"], dtype=np.int64)
    train = np.flatnonzero(data["train_mask"])
    parts = microbatch_rows(len(train), cfg.microbatches)
    return SgcSetup(data, feats, y, [feats[train[p]] for p in parts], [y[train[p]] for p in parts],
                    1.0 / len(train), int(y.max()) + 1)


def train_sgc(name: str, cfg: SgcConfig = SgcConfig(), data_dir=None, *, progress: bool = False,
              step_hook=None, setup: SgcSetup | None = None) -> SgcResult:
    """Train SGC on the golden path. ``step_hook(epoch, pipeline, inputs, loss_grad)`` runs
    before each epoch's step (a bench can replay that step on the RTL)."""
    setup = setup or prepare_sgc(name, cfg, data_dir)
    data, feats, y = setup.data, setup.features_q, setup.y
    pipe = make_pipeline(feats.shape[1], setup.n_classes, cfg)
    fmt = pipe.fmt
    inputs = setup.inputs
    loss_grad = setup.loss_grad(fmt)

    epochs = range(cfg.epochs)
    if progress:
        from tqdm import tqdm
        epochs = tqdm(epochs, desc=f"SGC {name}")
    for epoch in epochs:
        if step_hook is not None:
            step_hook(epoch, pipe, inputs, loss_grad)
        pipe.run(cfg.schedule, inputs, loss_grad, microbatches=cfg.microbatches)
    w = pipe.weights()[0]

    def accuracy(mask):
        idx = np.flatnonzero(mask)
        logits = mac_forward(feats[idx], w, shift=fmt.fwd_shift_at(0), out_width=fmt.act.width).out
        return float(np.mean(np.argmax(logits, axis=1) == y[idx]))

    return SgcResult(accuracy(data["test_mask"]), accuracy(data["val_mask"]),
                     accuracy(data["train_mask"]), cfg.epochs, pipe.stages[0].master.copy(), feats)
