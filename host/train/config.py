"""What a training run is asked to do: :class:`TrainConfig`, its defaults and checks.

Every field is checked before any work starts (:func:`resolve_hyperparameters`,
:func:`check_outputs`); a bad value raises :class:`~gnnweave.errors.InputError` naming
the field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from gnnweave.errors import InputError


@dataclass
class TrainConfig:
    dataset: object = "cora"             # a load_dataset spec, or a Dataset
    model: str = "gcn"                   # gcn | sage | sgc
    device: str = "cpu"                  # dense ops (and aggregation when not partitioned)
    devices: list | None = None          # devices for partition='even' or a callable
    partition: object = "none"           # 'none' | 'even' | 'balanced' | {device: (lo, hi)} | callable
    hidden: int | None = None            # None: the model's published default
    layers: int = 2                      # GCN/SAGE layers; SGC: propagation steps K
    dropout: float | None = None
    lr: float | None = None
    weight_decay: float | None = None
    epochs: int | None = None
    optimizer: str = "adam"              # adam | sgd (momentum)
    momentum: float = 0.9
    seeds: object = (0,)                 # list of seeds, or a count n -> 0..n-1
    batch_size: int | None = None        # None: full-batch
    fanouts: tuple = (10, 10)            # per hop from the seeds (PyG order)
    prefetch: int = 2                    # batches prepared ahead on a background thread
    overlap_chunks: int = 1              # >1: aggregation in row chunks overlapped with the dense device
    eval_every: int = 1
    select: str = "last"                 # 'last' epoch or 'best_val' epoch's test accuracy
    normalize_features: bool = True      # row-normalise non-negative features (Kipf & Welling)
    sparse_input: object = "auto"        # keep input features as CSR: True | False | 'auto' (<10 % non-zero)
    checkpoint_dir: str | None = None     # default: <out_dir>/checkpoints when out_dir is set
    checkpoint_every: int = 10
    resume: bool = False
    out_dir: str | None = None           # timeline.png, partition.txt, result.json
    save_model: str | None = None        # write the first seed's trained model here (.npz)
    cost_model: object = None            # CostModel, its JSON path, or {device: rate}
    rebalance: bool = False              # re-partition after each epoch from measured shard times
    steal: bool = False                  # shard devices steal rows from each other within an aggregation
    progress: bool = True
    executor_options: dict = field(default_factory=dict)   # {device kind: {kwarg: value}}
    on_epoch_end: Callable | None = None  # hook(seed, epoch, stats); may raise KeyboardInterrupt
    # over ranks (gnnweave.host.distributed; docs/distributed.md)
    nproc: int = 1                       # >1: spawn this many local ranks (torch's elastic launcher)
    dist: bool = False                   # this process is one rank of a torchrun job
    rank_devices: object = None          # {rank: [devices]} or '0=fpga-emu,cpu 1=cpu'
    rank_speeds: object = None           # [relative speed per rank] or 'auto' (measured): each rank's share
    partition_method: str = "metis"      # metis | rcm | rows | random (nodes over ranks)
    digest_every: int = 10               # epochs between cross-rank parameter digest checks
    rank_invariant: bool = False         # counter-based dropout and exact bias sums: the bits of any rank count
    dist_backend: str = "auto"           # auto | gloo | nccl (auto: NCCL when every rank is on gpu devices with CUDA)
    comm_timeout_s: float = 60.0         # a collective waiting longer than this ends the run

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise InputError(f"TrainConfig: unknown field {unknown[0]!r}")
        return cls(**d)

    def seed_list(self) -> list[int]:
        if isinstance(self.seeds, int):
            if self.seeds < 1:
                raise InputError(f"TrainConfig.seeds = {self.seeds}: need at least one seed")
            return list(range(self.seeds))
        seeds = [int(s) for s in self.seeds]
        if not seeds:
            raise InputError("TrainConfig.seeds: empty")
        return seeds


#: ``--optimizer sgd`` without ``--lr``: the models' default learning rates are Adam's
#: (Kipf & Welling's 0.01); SGD with momentum 0.9 reached 19.0 % on Cora at 0.01 and 65.9 %
#: at 0.2 in 200 epochs, 76.8 % at 0.2 in 500 (GCN, 3 seeds)
SGD_DEFAULT_LR = 0.2

#: ``--fanouts`` without ``--batch-size``: the seed nodes per mini-batch (GraphSAGE's 512)
DEFAULT_FANOUT_BATCH_SIZE = 512


def resolve_hyperparameters(config: TrainConfig, model_cls) -> dict:
    """The run's hidden width, dropout, learning rate, weight decay and epochs: the
    config's, else the model's published defaults; every field checked."""
    d = model_cls.defaults
    default_lr = d.get("lr", 0.01)
    if str(config.optimizer).lower() == "sgd":
        default_lr = max(default_lr, SGD_DEFAULT_LR)
    hp = dict(hidden=config.hidden if config.hidden is not None else d.get("hidden", 16),
              dropout=config.dropout if config.dropout is not None else d.get("dropout", 0.5),
              lr=config.lr if config.lr is not None else default_lr,
              weight_decay=(config.weight_decay if config.weight_decay is not None
                            else d.get("weight_decay", 5e-4)),
              epochs=config.epochs if config.epochs is not None else d.get("epochs", 200))
    if hp["epochs"] < 1:
        raise InputError(f"TrainConfig.epochs = {hp['epochs']}: must be >= 1")
    if str(config.model).lower() != "sgc":   # SGC: no hidden layer; layers = K hops (0 allowed)
        if hp["hidden"] < 1:
            raise InputError(f"TrainConfig.hidden = {hp['hidden']}: must be >= 1")
        if config.layers < 1:
            raise InputError(f"TrainConfig.layers = {config.layers}: must be >= 1")
    elif config.layers < 0:
        raise InputError(f"TrainConfig.layers = {config.layers}: must be >= 0")
    if not hp["lr"] > 0:
        raise InputError(f"TrainConfig.lr = {hp['lr']}: must be > 0")
    if hp["weight_decay"] < 0:
        raise InputError(f"TrainConfig.weight_decay = {hp['weight_decay']}: must be >= 0")
    if config.checkpoint_every < 0:
        raise InputError(f"TrainConfig.checkpoint_every = {config.checkpoint_every}: must be >= 0 "
                         f"(0: only at the end and on Ctrl-C)")
    if not 0 <= config.momentum < 1:
        raise InputError(f"TrainConfig.momentum = {config.momentum}: must be in [0, 1)")
    if not 0 <= hp["dropout"] < 1:
        raise InputError(f"TrainConfig.dropout = {hp['dropout']}: must be in [0, 1)")
    if config.prefetch < 0:
        raise InputError(f"TrainConfig.prefetch = {config.prefetch}: must be >= 0 (0: inline)")
    if config.nproc < 1:
        raise InputError(f"TrainConfig.nproc = {config.nproc}: must be >= 1")
    return hp


#: bytes per parameter: float32 value, gradient and Adam's two moments, and the float64
#: draw it is initialised from
_BYTES_PER_PARAMETER = 4 * 4 + 8
#: bytes per node and layer width: float32 pre-activation, activation and their gradients
_BYTES_PER_ACTIVATION = 4 * 4


def check_model_fits(hp: dict, layers: int, num_nodes: int, num_features: int,
                     num_classes: int) -> None:
    """Refuse, before any array is allocated, a model whose weights and activations cannot
    fit this machine (``--hidden 100000000``), naming the width."""
    from gnnweave.generators import check_fits_memory
    hidden = int(hp["hidden"] or 0)
    dims = [num_features] + ([hidden] * max(layers - 1, 0) if hidden else []) + [num_classes]
    # two weight matrices per layer at most (GraphSAGE's self and neighbour weights)
    params = 2 * sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    need = params * _BYTES_PER_PARAMETER + num_nodes * sum(dims[1:]) * _BYTES_PER_ACTIVATION
    check_fits_memory(f"TrainConfig.hidden = {hidden}" if hidden else "the model", need,
                      "choose a smaller --hidden (or fewer --layers)")


def resolve_placement(device, devices, partition) -> tuple[str, object, bool]:
    """(device, partition, rebalance) from ``--device``, ``--devices`` and ``--partition``.

    Not given, ``--partition`` is ``even`` over several ``--devices`` and ``none`` otherwise;
    ``auto`` is ``even`` rebalanced after each epoch. One ``--devices`` entry is the device
    that trains (or, beside a different ``--device`` for the dense ops, the one that
    aggregates); ``--partition none`` with several is a contradiction, not a silent split.
    """
    rebalance = False
    if partition == "auto":
        if not devices:
            raise InputError("--partition auto needs --devices (a comma list, e.g. fpga-emu,cpu)")
        partition, rebalance = "even", True
    elif partition is None:
        partition = "even" if devices and len(devices) > 1 else "none"
    elif partition == "none" and devices and len(devices) > 1:
        raise InputError(f"--partition none trains on one device, got --devices "
                         f"{','.join(devices)}: choose --partition even or auto to split them")
    if devices and len(devices) == 1 and partition == "none":
        if device is None or device == devices[0]:
            device = devices[0]
        else:   # --device does the dense ops, the one --devices entry aggregates
            partition = "even"
    return device or "cpu", partition, rebalance


def _writable_folder(option: str, path) -> None:
    """A folder training will write to: refused now if it cannot be, not at the first save."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise InputError(f"TrainConfig.{option} = {str(path)!r}: is a file, not a folder")
    probe = d
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise InputError(f"TrainConfig.{option} = {str(path)!r}: {probe} is not writable")


def check_outputs(config: TrainConfig) -> None:
    """Every path the run will write or read, checked before any training starts."""
    if config.out_dir is not None:
        _writable_folder("out_dir", config.out_dir)
    if config.checkpoint_dir is not None:
        _writable_folder("checkpoint_dir", config.checkpoint_dir)
    if config.save_model is not None:
        from gnnweave.host.modelfile import check_writable
        check_writable(config.save_model)
    cm = config.cost_model
    if isinstance(cm, (str, Path)) and not Path(cm).is_file():
        raise InputError(f"TrainConfig.cost_model = {str(cm)!r}: "
                         + ("is a folder, not a cost model JSON file" if Path(cm).is_dir()
                            else "no such file"))
