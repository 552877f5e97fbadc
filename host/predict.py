"""Inference with a saved model: the forward pass training evaluates, on any executor.

:func:`predict` rebuilds the model from a :class:`~gnnweave.host.modelfile.SavedModel`,
prepares the dataset exactly as training did (feature normalisation, the model's
normalised graph, SGC's propagation, the sparse input), and runs the forward pass with
dropout off through an :class:`~gnnweave.host.engine.Engine` on the given devices (by
default the ones that trained it). On the same data and devices the logits are those
training evaluated, so ``test_acc`` reproduces the training run's: bit for bit on
``fpga-emu`` (its fixed-point formats follow from the data), and on ``cpu`` as far as the
same float operations in the same order give the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gnnweave.errors import GnnweaveError
from gnnweave.host.modelfile import SavedModel, dataset_sha256


class PredictError(GnnweaveError, ValueError):
    """A model and a dataset (or devices) that do not fit together."""


@dataclass
class Prediction:
    logits: np.ndarray            # float [N, classes]
    predictions: np.ndarray       # int64 [N]: argmax of the logits
    test_acc: float | None        # None when the dataset has no test nodes
    dataset: str
    dataset_matches_training: bool
    device: str
    devices: list[str] | None
    timings: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return dict(dataset=self.dataset, nodes=int(self.predictions.shape[0]),
                    test_acc=self.test_acc,
                    dataset_matches_training=self.dataset_matches_training,
                    device=self.device, devices=self.devices)


def _shares_for(saved: SavedModel, devices, num_nodes: int):
    """Row ranges per aggregation device: training's final split where the devices and the
    graph are the same, else an even split (results do not depend on the split)."""
    if not devices or len(devices) < 2:
        return None
    if saved.shares and list(saved.shares) == list(devices) and \
            max(hi for _, hi in saved.shares.values()) == num_nodes:
        return {d: (int(lo), int(hi)) for d, (lo, hi) in saved.shares.items()}
    return "even"


def predict(saved: SavedModel, dataset, *, device: str | None = None,
            devices: list[str] | None = None, executor_options: dict | None = None) -> Prediction:
    """Logits and predicted classes of every node of ``dataset`` (a spec or a Dataset).

    Args:
        saved: the model (:func:`gnnweave.host.modelfile.load_model`).
        dataset: what :func:`gnnweave.datasets.load_dataset` takes, or a ``Dataset``.
        device: the dense ops' device (default: training's).
        devices: the aggregation's devices (default: training's; one entry runs everything
            there).
    """
    from gnnweave.host.engine import Engine
    from gnnweave.host.models import MODELS, LayerGraph, make_model
    from gnnweave.host.timeline import Timeline
    from gnnweave.host.train import (TrainConfig, _executor_for, _load, _maybe_sparse,
                                     prepare, resolve_shares)

    model_cls = MODELS.get(saved.model)
    if model_cls is None:
        raise PredictError(f"model {saved.model!r}: this gnnweave knows gcn, sage, sgc")
    ds = _load(dataset)
    device = device or saved.device
    devices = list(devices) if devices is not None else saved.devices
    if devices and len(devices) == 1:
        device, devices = devices[0], None
    config = TrainConfig(dataset=ds, model=saved.model, device=device, devices=devices,
                         normalize_features=saved.normalize_features,
                         sparse_input=saved.sparse_input, progress=False,
                         executor_options=executor_options if executor_options is not None
                         else saved.executor_options)
    data = prepare(config, model_cls)
    if data.x.shape[1] != saved.in_dim:
        raise PredictError(f"dataset {ds.name!r} has {data.x.shape[1]} features per node, the "
                           f"model was trained on {saved.in_dim}")
    if data.num_classes > saved.out_dim:
        raise PredictError(f"dataset {ds.name!r} has {data.num_classes} classes, the model "
                           f"predicts {saved.out_dim}")
    executors: dict = {}
    try:
        dense = _executor_for(device, executors, config.executor_options)
        shares = resolve_shares(_shares_for(saved, devices, data.graph.num_nodes), data.graph,
                                device, devices)
        shards = ({d: (_executor_for(d, executors, config.executor_options), r)
                   for d, r in shares.items()} if shares else None)
        engine = Engine(dense, Timeline(), shards=shards, num_nodes=data.graph.num_nodes,
                        base_graph=data.graph)
        try:
            model = make_model(saved.model, saved.in_dim, saved.out_dim, hidden=saved.hidden,
                               layers=saved.layers, dropout=0.0, seed=saved.seed)
            _load_params(model, saved)
            x_in = _maybe_sparse(model.prepare_features(engine, data.graph, data.x),
                                 config.sparse_input)
            layers = [LayerGraph(data.graph, data.graph.num_nodes)] * model.hops
            logits, _ = model.forward(engine, x_in, layers, train=False, rng=None)
        finally:
            engine.close()
    finally:
        for ex in executors.values():
            ex.close()
    pred = np.asarray(logits).argmax(axis=1).astype(np.int64)
    test = data.test_idx
    acc = float((pred[test] == data.y[test]).mean()) if test.size else None
    return Prediction(logits=np.asarray(logits), predictions=pred, test_acc=acc,
                      dataset=getattr(ds, "name", str(dataset)),
                      dataset_matches_training=dataset_sha256(ds) == saved.dataset_sha256,
                      device=device, devices=devices)


def _load_params(model, saved: SavedModel) -> None:
    if set(model.params) != set(saved.params):
        raise PredictError(f"model file holds parameters {sorted(saved.params)}, a {saved.model} "
                           f"of this shape has {sorted(model.params)}")
    for k, v in saved.params.items():
        if v.shape != model.params[k].shape:
            raise PredictError(f"parameter {k}: shape {v.shape} in the file, the model needs "
                               f"{model.params[k].shape}")
        model.params[k] = np.array(v)   # the trained dtype: a cast would change the bits
