"""The trainer: full-batch or sampled mini-batch GNN training through the executors.

``run_training(TrainConfig(...)) -> dict`` trains one model per seed and returns the
JSON-ready summary (mean/std test accuracy, epoch time, the partition's shares, the cost
model's predicted vs measured device times, per-seed results).

* Full-batch: every epoch is one step on the whole graph.
* Mini-batch (``batch_size``): seed nodes in shuffled batches, neighbour sampling with
  ``fanouts`` per hop; a background thread samples the next batch and copies its
  features to the device while the current batch computes (``prefetch`` batches ahead;
  ``prefetch=0`` runs the same work inline).
* Partitioned (``partition``): every aggregation runs as row shards on several
  executors at once (``{device: (lo, hi)}``, ``'even'`` over ``devices`` by edge count,
  or a callable ``f(graph, devices) -> shares``); dense ops run on ``device``.
* Checkpoints every ``checkpoint_every`` epochs (atomic), ``resume`` continues
  bit-identically (parameters, optimiser state, dropout RNG state), Ctrl-C saves the
  last completed epoch and returns with ``interrupted: true``.

Modules: :mod:`.config` (what a run is asked to do, checked up front), :mod:`.loop`
(the trainer), :mod:`.report` (the summary, its files and its table).
"""
from gnnweave.host.train.config import (
    DEFAULT_FANOUT_BATCH_SIZE, SGD_DEFAULT_LR, TrainConfig, check_outputs, resolve_hyperparameters,
    resolve_placement,
)
from gnnweave.host.train.loop import (
    Prepared, Trainer, executor_for, features_are_counts, load_cost_model, load_dataset_spec,
    params_digest, prepare, resolve_shares, run_training, sparse_input_features,
)
from gnnweave.host.train.report import (
    aggregation_work, format_summary, json_default, predicted_vs_measured, summarize,
)

# The names these had when they were private to one module; callers still use them.
_resolved = resolve_hyperparameters
_placement_args = resolve_placement
_executor_for = executor_for
_load = load_dataset_spec
_maybe_sparse = sparse_input_features
_cost_model = load_cost_model
_json_default = json_default


def __getattr__(name):
    # the command-line functions live with the command; importing them from here still works
    if name in ("add_train_arguments", "config_from_args", "train_main"):
        from gnnweave.host.commands import train as command
        return {"add_train_arguments": command.add_arguments,
                "config_from_args": command.config_from_args,
                "train_main": command.train_main}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_FANOUT_BATCH_SIZE", "Prepared", "SGD_DEFAULT_LR", "TrainConfig", "Trainer",
    "aggregation_work", "check_outputs", "executor_for", "features_are_counts", "format_summary",
    "json_default", "load_cost_model", "load_dataset_spec", "params_digest", "predicted_vs_measured",
    "prepare", "resolve_hyperparameters", "resolve_placement", "resolve_shares", "run_training",
    "sparse_input_features", "summarize",
]
