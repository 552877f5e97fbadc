"""A trained model on disk: architecture, hyperparameters, parameters, how it was trained.

One ``.npz`` file (numpy's own container, no pickle): each parameter as ``param/<name>``
and one JSON document ``meta`` with

* ``model``, ``in_dim``, ``hidden``, ``out_dim``, ``layers``: the architecture
  (:func:`gnnweave.host.models.make_model` rebuilds it);
* ``hyperparameters``, ``seed``, ``epochs_done``;
* ``device``, ``devices``, ``shares``, ``executor_options``, ``normalize_features``,
  ``sparse_input``: what ran the forward pass, so inference can run it the same way (on
  ``fpga-emu`` the fixed-point formats follow from the data and the executor, so the same
  executor on the same data gives the same words);
* ``dataset`` (its name) and ``dataset_sha256`` (graph, features, labels and masks), and
  ``test_acc`` and ``params_sha256`` as training measured them.

Files are written atomically (a temporary file in the same folder, then renamed).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gnnweave.errors import GnnweaveError
from gnnweave.host.checkpoint import write_npz_atomic

FORMAT = "gnnweave-model"
VERSION = 1


class ModelFileError(GnnweaveError, ValueError):
    """A model file that is missing, unreadable or not a gnnweave model; names the file."""


@dataclass
class SavedModel:
    model: str
    in_dim: int
    hidden: int
    out_dim: int
    layers: int
    params: dict[str, np.ndarray]
    hyperparameters: dict = field(default_factory=dict)
    seed: int = 0
    epochs_done: int = 0
    device: str = "cpu"
    devices: list[str] | None = None
    shares: dict[str, list[int]] | None = None
    executor_options: dict = field(default_factory=dict)
    normalize_features: bool = True
    sparse_input: object = "auto"
    dataset: str = ""
    dataset_sha256: str = ""
    test_acc: float | None = None
    params_sha256: str = ""

    def meta(self) -> dict:
        d = asdict(self)
        d.pop("params")
        return dict(format=FORMAT, version=VERSION, **d)


def dataset_sha256(dataset) -> str:
    """A digest of what a model sees of a dataset: graph, features, labels and masks."""
    h = hashlib.sha256()
    g = dataset.graph
    for a in (g.indptr, g.indices, g.weights if g.weights is not None else np.zeros(0),
              np.asarray(dataset.x.toarray() if hasattr(dataset.x, "toarray") else dataset.x,
                         dtype=np.float32),
              dataset.y, dataset.train_mask, dataset.val_mask, dataset.test_mask):
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def check_writable(path) -> Path:
    """The path a model will be written to, checked before any training starts."""
    path = Path(path)
    if path.is_dir():
        raise ModelFileError(f"{path}: is a folder; give a file name, e.g. {path / 'model.npz'}")
    parent = path.parent if str(path.parent) else Path(".")
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ModelFileError(f"{path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise ModelFileError(f"{path}: folder {existing} is not writable")
    parent.mkdir(parents=True, exist_ok=True)   # as --out does
    if path.exists() and not os.access(path, os.W_OK):
        raise ModelFileError(f"{path}: exists and is not writable")
    return path


def save_model(saved: SavedModel, path) -> Path:
    """Write ``saved`` to ``path`` (``.npz``) atomically; returns the path."""
    path = check_writable(path)
    arrays = {f"param/{k}": np.asarray(v) for k, v in saved.params.items()}
    from gnnweave.host.train import _json_default   # numpy scalars, as result.json
    arrays["meta"] = np.array(json.dumps(saved.meta(), default=_json_default))
    return write_npz_atomic(path, arrays)


def load_model(path) -> SavedModel:
    """Read a model written by :func:`save_model`; errors name the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "meta" not in z.files:
                raise ModelFileError(f"{path}: not a gnnweave model (no 'meta' entry)")
            meta = json.loads(str(z["meta"]))
            params = {k[len("param/"):]: z[k] for k in z.files if k.startswith("param/")}
    except ModelFileError:
        raise
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: not a readable model file ({exc})") from None
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a gnnweave model (format {meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise ModelFileError(f"{path}: model file version {meta.get('version')}, this gnnweave "
                             f"reads version {VERSION}")
    fields = {k: v for k, v in meta.items() if k not in ("format", "version")}
    try:
        return SavedModel(params=params, **fields)
    except TypeError as exc:
        raise ModelFileError(f"{path}: unexpected fields in meta ({exc})") from None


def from_training(config, trainer, engine, dataset_name: str) -> SavedModel:
    """The model a :class:`~gnnweave.host.train.Trainer` reports, with what inference needs
    to run it as training evaluated it: its last completed epoch, or with
    ``select='best_val'`` the best validation epoch (where this run saw it: a run resumed
    past that epoch keeps its last)."""
    m = trainer.model
    final = next((h for h in reversed(trainer.history) if "test_acc" in h), {})
    params, test_acc, epochs = m.params, final.get("test_acc"), trainer.epoch
    if config.select == "best_val" and trainer.best_params is not None:
        params, test_acc, epochs = (trainer.best_params, trainer.best["test_acc"],
                                    trainer.best["epoch"])
    shares = ({d: [int(lo), int(hi)] for d, (_, (lo, hi)) in engine.shards.items()}
              if engine.shards else None)
    from gnnweave.host.train import params_digest
    return SavedModel(
        model=m.name, in_dim=int(m.in_dim), hidden=int(m.hidden), out_dim=int(m.out_dim),
        layers=int(config.layers), params={k: np.array(v) for k, v in params.items()},
        hyperparameters=dict(trainer.hp, optimizer=config.optimizer), seed=int(trainer.seed),
        epochs_done=int(epochs), device=config.device,
        devices=list(config.devices) if config.devices else None, shares=shares,
        executor_options=dict(config.executor_options),
        normalize_features=bool(config.normalize_features), sparse_input=config.sparse_input,
        dataset=config.dataset if isinstance(config.dataset, str) else dataset_name,
        dataset_sha256=dataset_sha256(trainer.data.dataset),
        test_acc=test_acc, params_sha256=params_digest(params))
