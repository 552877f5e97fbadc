"""The Python front door: train a model, save it, load it, predict with it.

    >>> import gnnweave
    >>> model = gnnweave.train("cora", model="gcn", devices=["fpga-emu", "cpu"], epochs=200)
    >>> model.test_acc                      # as training measured it
    >>> model.save("build/gcn-cora.npz")
    >>> same = gnnweave.load_model("build/gcn-cora.npz")
    >>> same.predict("cora").test_acc       # equal to model.test_acc on the same devices

Keyword options of :func:`train` are the fields of
:class:`gnnweave.host.train.TrainConfig` (``device``, ``devices``, ``partition``,
``hidden``, ``epochs``, ``lr``, ``batch_size``, ``fanouts``, ...); ``device``, ``devices`` and
``partition`` mean what ``gnnweave train``'s options do (``partition="auto"`` splits the
aggregation over ``devices`` and rebalances it after each epoch).
"""
from __future__ import annotations

from pathlib import Path


class TrainedModel:
    """A trained GNN: its parameters and how it was trained (``.saved``), plus, when it
    comes from :func:`train`, the training run's summary (``.result``)."""

    def __init__(self, saved, result: dict | None = None):
        self.saved = saved
        self.result = result

    @property
    def test_acc(self) -> float | None:
        return self.saved.test_acc

    @property
    def params(self) -> dict:
        return self.saved.params

    def save(self, path) -> Path:
        """Write the model (``.npz``, atomically); returns the path."""
        from gnnweave.host.modelfile import save_model
        return save_model(self.saved, path)

    def predict(self, dataset=None, *, device: str | None = None, devices=None):
        """Inference on ``dataset`` (default: the one it was trained on) ->
        :class:`gnnweave.host.predict.Prediction` (``logits``, ``predictions``,
        ``test_acc``)."""
        from gnnweave.host.predict import predict
        return predict(self.saved, dataset if dataset is not None else self.saved.dataset,
                       device=device, devices=devices)

    def to_pyg_state_dict(self) -> dict:
        """The weights as the ``state_dict`` of the matching torch_geometric model: a stack of
        ``GCNConv`` (gcn), ``SAGEConv`` with mean aggregation (sage) or one ``SGConv``
        (sgc), named ``convs.<i>.*`` (``conv.*`` for SGC); see
        :func:`gnnweave.host.pyg_export.pyg_state_dict`."""
        from gnnweave.host.pyg_export import pyg_state_dict
        return pyg_state_dict(self.saved)

    def __repr__(self) -> str:
        s = self.saved
        return (f"TrainedModel({s.model}, {s.layers} layers, {s.in_dim} -> {s.out_dim} "
                f"(hidden {s.hidden}), trained on {s.dataset!r}, test_acc={s.test_acc})")


def train(dataset="cora", model: str = "gcn", *, seed: int = 0, **options) -> TrainedModel:
    """Train one model (one seed) and return it; ``options`` are TrainConfig fields."""
    from gnnweave.host.train import TrainConfig, resolve_placement, run_training
    if "seeds" in options:
        raise TypeError("train() trains one model: give seed=N, not seeds")
    # device, devices and partition mean what they mean on the command line
    # (partition="auto": an even split rebalanced after each epoch)
    device, partition, rebalance = resolve_placement(options.pop("device", None),
                                                   options.get("devices"),
                                                   options.pop("partition", None))
    options.update(device=device, partition=partition,
                   rebalance=options.get("rebalance", False) or rebalance)
    models: list = []
    result = run_training(TrainConfig(dataset=dataset, model=model, seeds=(seed,), **options),
                          models=models)
    return TrainedModel(models[0], result)


def load_model(path) -> TrainedModel:
    """A model written by :meth:`TrainedModel.save` or ``gnnweave train --save-model``."""
    from gnnweave.host.modelfile import load_model as _load
    return TrainedModel(_load(path))
