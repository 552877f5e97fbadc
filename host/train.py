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
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp

from gnnweave.graph import CSRGraph
from gnnweave.host.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from gnnweave.host.executors import Executor, make_executor, transposed
from gnnweave.host.models import (
    Engine, LayerGraph, check_shares, cut_rows_by_fractions, make_model, make_optimizer,
    row_normalize, softmax_cross_entropy,
)
from gnnweave.host.sampling import MiniBatch, NeighborSampler, Prefetcher, seed_batches
from gnnweave.host.timeline import (
    Timeline, busy_fractions, format_partition_table, interval_overlap, measured_clocks,
    partition_rows_table, plot_timeline,
)


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

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown field {unknown[0]!r}")
        return cls(**d)

    def seed_list(self) -> list[int]:
        if isinstance(self.seeds, int):
            if self.seeds < 1:
                raise ValueError(f"TrainConfig.seeds = {self.seeds}: need at least one seed")
            return list(range(self.seeds))
        seeds = [int(s) for s in self.seeds]
        if not seeds:
            raise ValueError("TrainConfig.seeds: empty")
        return seeds


# --------------------------------------------------------------------------- setup


def _load(dataset):
    if not isinstance(dataset, str):
        return dataset
    from gnnweave.datasets import load_dataset
    return load_dataset(dataset)


#: ``--optimizer sgd`` without ``--lr``: the models' default learning rates are Adam's
#: (Kipf & Welling's 0.01); SGD with momentum 0.9 reached 19.0 % on Cora at 0.01 and 65.9 %
#: at 0.2 in 200 epochs, 76.8 % at 0.2 in 500 (GCN, 3 seeds)
SGD_DEFAULT_LR = 0.2


def _resolved(config: TrainConfig, model_cls) -> dict:
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
        raise ValueError(f"TrainConfig.epochs = {hp['epochs']}: must be >= 1")
    if str(config.model).lower() != "sgc":   # SGC: no hidden layer; layers = K hops (0 allowed)
        if hp["hidden"] < 1:
            raise ValueError(f"TrainConfig.hidden = {hp['hidden']}: must be >= 1")
        if config.layers < 1:
            raise ValueError(f"TrainConfig.layers = {config.layers}: must be >= 1")
    elif config.layers < 0:
        raise ValueError(f"TrainConfig.layers = {config.layers}: must be >= 0")
    if not hp["lr"] > 0:
        raise ValueError(f"TrainConfig.lr = {hp['lr']}: must be > 0")
    if hp["weight_decay"] < 0:
        raise ValueError(f"TrainConfig.weight_decay = {hp['weight_decay']}: must be >= 0")
    if config.checkpoint_every < 0:
        raise ValueError(f"TrainConfig.checkpoint_every = {config.checkpoint_every}: must be >= 0 "
                         f"(0: only at the end and on Ctrl-C)")
    if not 0 <= config.momentum < 1:
        raise ValueError(f"TrainConfig.momentum = {config.momentum}: must be in [0, 1)")
    if not 0 <= hp["dropout"] < 1:
        raise ValueError(f"TrainConfig.dropout = {hp['dropout']}: must be in [0, 1)")
    return hp


def _executor_for(name: str, cache: dict, options: dict) -> Executor:
    if name not in cache:
        kind = name.partition(":")[0].lower()
        cache[name] = make_executor(name, **options.get(kind, {}))
    return cache[name]


def resolve_shares(partition, graph: CSRGraph, device: str, devices, *, cost_model=None,
                   feat_dim: int = 16) -> dict[str, tuple[int, int]] | None:
    """The partition as ``{device: (lo, hi)}``, or None for no partition.

    ``'balanced'`` asks :func:`gnnweave.host.partition.partition_rows` for the split with the
    smallest predicted makespan under ``cost_model`` (a fitted CostModel or
    ``{device: relative rate}``) over ``devices``.
    """
    n = graph.num_nodes
    if partition is None or (isinstance(partition, str) and partition.lower() in ("none", "")):
        return None
    if isinstance(partition, str) and partition.lower() == "balanced":
        if cost_model is None:
            raise ValueError("TrainConfig.cost_model: partition='balanced' needs a cost model "
                             "(a profiler CostModel, its JSON path, or {device: rate})")
        from gnnweave.host.partition import partition_rows
        names = list(devices) if devices else None
        if names is None and isinstance(cost_model, dict):
            names = list(cost_model)
        if not names:
            raise ValueError("TrainConfig.devices: partition='balanced' needs the list of devices")
        return check_shares(partition_rows(graph, feat_dim, cost_model, devices=names), n)
    if isinstance(partition, str):
        if partition.lower() != "even":
            raise ValueError(f"TrainConfig.partition = {partition!r}: choose 'none', 'even', "
                             f"'balanced', a {{device: (lo, hi)}} mapping or a callable")
        if not devices:
            raise ValueError("TrainConfig.devices: partition='even' needs the list of devices")
        ranges = cut_rows_by_fractions(graph.indptr, 0, n, [1.0] * len(devices))
        return check_shares(dict(zip(devices, ranges)), n)
    if callable(partition):
        return check_shares(dict(partition(graph, list(devices or [device]))), n)
    return check_shares(dict(partition), n)


def _maybe_sparse(x, mode):
    """The input features as CSR when they are mostly zeros (bag of words): dropout draws
    per stored element and the first layer's products skip the zeros."""
    if mode not in (True, False, "auto"):
        raise ValueError(f"TrainConfig.sparse_input = {mode!r}: choose True, False or 'auto'")
    dense = np.asarray(x.toarray() if sp.issparse(x) else x, dtype=np.float32)
    if mode is True or (mode == "auto" and dense.size and np.count_nonzero(dense) < 0.1 * dense.size):
        return sp.csr_matrix(dense)
    dense.flags.writeable = False   # constant input: executors and dropout may cache by identity
    return dense


def _cost_model(cm):
    if cm is None or hasattr(cm, "predict") or isinstance(cm, dict):
        return cm
    from gnnweave.host.costmodel import CostModel
    return CostModel.load(cm)


def predicted_vs_measured(records, cost_model) -> dict | None:
    """Per device: the cost model's predicted seconds for the recorded ops vs measured.

    ``predicted_s`` sums the ops the device's model covers and ``ratio`` is measured /
    predicted over those same ops; ops it has no model for (a cpu's no-op transfers, say)
    are listed with their measured seconds under ``unmodelled``.
    """
    if cost_model is None or not hasattr(cost_model, "predict"):
        return None   # no model, or bare relative rates
    out = {}
    records = [r for r in records if r.kind != "host"]   # sampling: no device, no model
    for dev in dict.fromkeys(r.device for r in records):
        mine = [r for r in records if r.device == dev]
        entry = dict(measured_s=sum(r.measured_seconds for r in mine), predicted_s=None,
                     ratio=None)
        name = None
        for candidate in (dev, dev.partition(":")[0]):
            try:
                cost_model.device(candidate) if hasattr(cost_model, "device") else None
                name = candidate
                break
            except (ValueError, KeyError) as exc:
                entry["error"] = str(exc).splitlines()[0]
        if name is None:
            out[dev] = entry
            continue
        entry.pop("error", None)
        predicted, modelled, unmodelled, covered, last_error = 0.0, 0.0, {}, 0, None
        for r in mine:
            try:
                predicted += cost_model.predict(name, r.op, **r.sizes)
                modelled += r.measured_seconds
                covered += 1
            except (ValueError, KeyError) as exc:
                unmodelled[r.op] = unmodelled.get(r.op, 0.0) + r.measured_seconds
                last_error = str(exc).splitlines()[0]
        if covered:
            entry.update(predicted_s=predicted, measured_modelled_s=modelled,
                         ratio=modelled / predicted if predicted > 0 else None)
        elif last_error:
            entry["error"] = last_error
        if unmodelled:
            entry["unmodelled"] = unmodelled
        out[dev] = entry
    return out


def aggregation_work(records, devices) -> tuple[dict, dict]:
    """Per device of ``devices``, over the aggregate ops in ``records``: ``({device: seconds
    on its clock}, {device: (edges, rows)})``."""
    times = {d: 0.0 for d in devices}
    work = {d: (0, 0) for d in devices}
    for r in records:
        if r.op == "aggregate" and r.device in times:
            times[r.device] += r.measured_seconds
            e, n = work[r.device]
            work[r.device] = (e + int(r.sizes.get("edges", 0)), n + int(r.sizes.get("rows", 0)))
    return times, work


class _EpochRebalancer:
    """After each epoch: feed each shard device's measured aggregation time of that epoch to
    :class:`~gnnweave.host.partition.Rebalancer` and move the engine to the partition it
    returns (if any). Without a cost model the first split is calibrated on the graph
    (:func:`~gnnweave.host.profiler.calibrated_partition`) and logged as ``after_epoch=0``."""

    def __init__(self, engine, graph, shares, executors, cost_model, feat_dim, log, seed):
        from gnnweave.host.partition import Rebalancer
        devices = list(shares)
        if hasattr(cost_model, "share_cost") or isinstance(cost_model, dict):
            costs = cost_model
        else:   # no cost model: start from a split calibrated on this graph (profiler)
            from gnnweave.host.profiler import calibrated_partition
            shares, costs, fits = calibrated_partition({d: executors[d] for d in devices},
                                                       graph, feat_dim, seed=seed)
            log.append(dict(seed=seed, after_epoch=0, calibrated={
                d: {k: v for k, v in f.to_dict().items() if k != "samples"}
                for d, f in fits.items()}, shares={d: list(r) for d, r in shares.items()}))
        self.engine, self.executors, self.log, self.seed = engine, executors, log, seed
        self.devices, self.num_nodes = devices, graph.num_nodes
        self._set_shards(shares)
        self.rebalancer = Rebalancer(graph, feat_dim, costs, devices=devices,
                                     partition=dict(shares))
        if engine.steal:   # the split's models also predict the stolen chunks
            engine.steal_costs = self.rebalancer.corrected_costs()

    def _set_shards(self, partition):
        shards = {d: (self.executors[d], r) for d, r in partition.items()}
        if self.engine.steal:   # a device the split leaves out may still steal rows
            n = self.num_nodes
            shards.update({d: (self.executors[d], (n, n)) for d in self.devices
                           if d not in shards})
        self.engine.set_shards(shards)

    def __call__(self, epoch: int):
        if epoch == 0:
            return   # the first epoch builds per-graph caches on each device: not its speed
        current = self.rebalancer.partition
        names = list(self.engine.shards or current) if self.engine.steal else list(current)
        times, work = aggregation_work(self.engine.timeline.of_epoch(epoch), names)
        if self.engine.steal:
            # each device is judged on the rows it aggregated, whoever's share they were
            ran = {d: t for d, t in times.items() if t > 0 and work[d][1] > 0}
            if not ran:
                return
            new = self.rebalancer.update(ran, work=work)
            self.engine.steal_costs = self.rebalancer.corrected_costs()
        else:
            if any(t <= 0 for t in times.values()):
                return
            new = self.rebalancer.update(times)
        if new is not None:
            self._set_shards(new)
            self.log.append(dict(seed=self.seed, after_epoch=epoch + 1, measured_s=times,
                                 shares={d: list(r) for d, r in new.items()}))


#: ``--fanouts`` without ``--batch-size``: the seed nodes per mini-batch (GraphSAGE's 512)
DEFAULT_FANOUT_BATCH_SIZE = 512


@dataclass
class Prepared:
    dataset: object
    graph: CSRGraph              # the model's normalised graph
    x: np.ndarray                # row-normalised features (before model preprocessing)
    y: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int


def _fingerprint(config: TrainConfig, hp: dict, seed: int, name: str) -> dict:
    return dict(dataset=name, model=config.model.lower(), device=config.device,
                partition=str(config.partition) if isinstance(config.partition, (str, dict))
                else "callable", devices=list(config.devices or []), layers=config.layers,
                optimizer=config.optimizer, momentum=config.momentum, seed=seed,
                batch_size=config.batch_size, fanouts=list(config.fanouts),
                normalize_features=config.normalize_features,
                executor_options=json.loads(json.dumps(config.executor_options, default=str)),
                **{k: v for k, v in hp.items() if k != "epochs"})


def params_digest(params: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(params[k]).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- one seed


class Trainer:
    """Trains one model (one seed) through an :class:`Engine`."""

    def __init__(self, config: TrainConfig, data: Prepared, engine: Engine, hp: dict, seed: int,
                 x_in: np.ndarray, dataset_name: str):
        self.config, self.data, self.engine, self.hp, self.seed = config, data, engine, hp, seed
        self.x_in = x_in
        self.model = make_model(config.model, x_in.shape[1], data.num_classes, hidden=hp["hidden"],
                                layers=config.layers, dropout=hp["dropout"], seed=seed)
        self.opt = make_optimizer(config.optimizer, self.model.params, lr=hp["lr"],
                                  weight_decay=hp["weight_decay"], decay=self.model.decay,
                                  momentum=config.momentum)
        self.rng = np.random.default_rng([seed, 0xD0])
        self.dropout_rng = self.rng
        if config.rank_invariant:
            from gnnweave.host.dropout import CounterDropout
            if config.batch_size is not None or config.overlap_chunks > 1:
                raise ValueError("TrainConfig.rank_invariant: full-batch training without "
                                 "overlap_chunks only")
            self.dropout_rng = CounterDropout(seed, np.arange(data.graph.num_nodes))
        self.epoch = 0
        self.history: list[dict] = []
        self.best = dict(val_acc=-1.0, test_acc=None, epoch=None)
        self.fingerprint = _fingerprint(config, hp, seed, dataset_name)
        self.full_layers = [LayerGraph(data.graph, data.graph.num_nodes)] * self.model.hops
        self.sampler = None
        if config.batch_size is not None:
            if config.batch_size < 1:
                raise ValueError(f"TrainConfig.batch_size = {config.batch_size}: must be >= 1")
            if self.model.hops:
                if len(config.fanouts) != self.model.hops:
                    raise ValueError(f"TrainConfig.fanouts has {len(config.fanouts)} entries, the "
                                     f"{config.model} model has {self.model.hops} layers")
                self.sampler = NeighborSampler(data.graph, config.fanouts)
        self.epoch_seconds: list[float] = []
        self.rebalancer = None        # callable(epoch) set by run_training
        self._committed = self._snapshot()

    # -- state

    def _snapshot(self) -> dict:
        return dict(epoch=self.epoch, params=dict(self.model.params),
                    opt=dict(self.opt.state_arrays()), t=self.opt.t,
                    rng=self.rng.bit_generator.state, history=list(self.history),
                    best=dict(self.best))

    def checkpoint_path(self) -> Path | None:
        d = self.config.checkpoint_dir
        if d is None and self.config.out_dir is not None:
            d = Path(self.config.out_dir) / "checkpoints"
        if d is None:
            return None
        return Path(d) / f"{self.config.model.lower()}-seed{self.seed}.npz"

    def save(self, snap: dict | None = None) -> Path | None:
        path = self.checkpoint_path()
        if path is None:
            return None
        snap = snap or self._committed
        arrays = {f"param:{k}": v for k, v in snap["params"].items()}
        arrays.update({f"opt:{k}": v for k, v in snap["opt"].items()})
        meta = dict(epoch=snap["epoch"], opt_t=snap["t"], rng=snap["rng"], history=snap["history"],
                    best=snap["best"], config=self.fingerprint)
        return save_checkpoint(path, arrays, meta)

    def restore(self) -> bool:
        path = self.checkpoint_path()
        if path is None or not path.is_file():
            return False
        arrays, meta = load_checkpoint(path)
        check_compatible(path, meta.get("config", {}), self.fingerprint)
        if int(meta["epoch"]) > self.hp["epochs"]:
            raise ValueError(f"{path}: the checkpoint is at epoch {int(meta['epoch'])}, past the "
                             f"{self.hp['epochs']} epochs asked for: give --epochs "
                             f"{int(meta['epoch'])} or more to continue it")
        params = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("param:")}
        if set(params) != set(self.model.params):
            raise ValueError(f"{path}: field param has {sorted(params)}, the model needs "
                             f"{sorted(self.model.params)}")
        for k, v in params.items():
            if v.shape != self.model.params[k].shape:
                raise ValueError(f"{path}: field param:{k} has shape {v.shape}, the model needs "
                                 f"{self.model.params[k].shape}")
        self.model.params = params
        self.opt.load_state({k.split(":", 1)[1]: v for k, v in arrays.items()
                             if k.startswith("opt:")}, meta["opt_t"])
        self.rng.bit_generator.state = meta["rng"]
        self.epoch = int(meta["epoch"])
        self.history = list(meta["history"])
        self.best = dict(meta["best"])
        self._committed = self._snapshot()
        return True

    # -- steps

    def _step(self, x, layers, labels, rows):
        eng = self.engine
        logits, cache = self.model.forward(eng, x, layers, train=True, rng=self.dropout_rng)
        loss, dlogits = softmax_cross_entropy(logits, labels, rows)
        grads = self.model.backward(eng, dlogits, cache, layers)
        self.model.params = self.opt.step(self.model.params, grads)
        return loss

    def _batches(self, epoch: int):
        """Producer of the epoch's mini-batches: sample, gather, copy to the device."""
        d = self.data
        rng = np.random.default_rng([self.seed, epoch, 0x5A])
        for i, seeds in enumerate(seed_batches(d.train_idx, self.config.batch_size, rng)):
            if self.sampler is not None:
                t0 = time.perf_counter()
                blocks = self.sampler.sample(seeds, rng)
                self.engine.timeline.record_host("sample", t0, time.perf_counter(),
                                                 dict(seeds=len(seeds)))
                nodes = blocks[0].src_nodes
            else:
                blocks, nodes = [], seeds
            xb = self.x_in[nodes]
            x = self.engine.transfer_in(xb if sp.issparse(xb) else np.ascontiguousarray(xb))
            yield MiniBatch(i, seeds, blocks, x, d.y[seeds])

    def train_epoch(self, epoch: int) -> float:
        d = self.data
        if self.dropout_rng is not self.rng:
            self.dropout_rng.epoch = epoch
        if self.config.batch_size is None:
            return self._step(self.x_in, self.full_layers, d.y, d.train_idx)
        losses, weights = [], []
        producer = self._batches(epoch)
        source = Prefetcher(producer, self.config.prefetch) if self.config.prefetch > 0 else None
        try:
            for mb in (source if source is not None else producer):
                layers = [LayerGraph(b.graph, b.n_dst) for b in mb.blocks]
                losses.append(self._step(mb.x, layers, mb.y, None))
                weights.append(len(mb.seeds))
        finally:
            if source is not None:
                source.close()
        return float(np.average(losses, weights=weights)) if losses else 0.0

    def evaluate(self) -> dict:
        d = self.data
        tl = self.engine.timeline
        was, tl.enabled = tl.enabled, False
        try:
            logits, _ = self.model.forward(self.engine, self.x_in, self.full_layers, train=False,
                                           rng=None)
        finally:
            tl.enabled = was
        pred = logits.argmax(axis=1)
        acc = {name: float((pred[idx] == d.y[idx]).mean()) if idx.size else None
               for name, idx in (("train_acc", d.train_idx), ("val_acc", d.val_idx),
                                 ("test_acc", d.test_idx))}
        acc["val_loss"] = softmax_cross_entropy(logits, d.y, d.val_idx)[0]
        return acc

    def run(self) -> dict:
        cfg = self.config
        epochs = self.hp["epochs"]
        resumed_from = None
        if cfg.resume and self.restore():
            resumed_from = self.epoch
        interrupted = False
        from tqdm.auto import tqdm
        bar = tqdm(total=epochs, initial=self.epoch, desc=f"{cfg.model} seed {self.seed}",
                   unit="epoch", disable=not cfg.progress, leave=False)
        try:
            while self.epoch < epochs:
                e = self.epoch
                self.engine.timeline.epoch = e
                t0 = time.perf_counter()
                loss = self.train_epoch(e)
                self.epoch_seconds.append(time.perf_counter() - t0)
                stats = dict(epoch=e + 1, loss=loss)
                if (e + 1) % max(cfg.eval_every, 1) == 0 or e + 1 == epochs:
                    stats.update(self.evaluate())
                    if stats["val_acc"] is not None and stats["val_acc"] > self.best["val_acc"]:
                        self.best = dict(val_acc=stats["val_acc"], test_acc=stats["test_acc"],
                                         epoch=e + 1)
                self.history.append(stats)
                self.epoch = e + 1
                self._committed = self._snapshot()
                bar.update(1)
                val = stats.get("val_acc")
                bar.set_postfix(loss=f"{loss:.3f}", val="-" if val is None else f"{val:.3f}")
                if cfg.checkpoint_every and self.epoch % cfg.checkpoint_every == 0:
                    self.save()
                if self.rebalancer is not None:
                    self.rebalancer(e)
                if cfg.on_epoch_end is not None:
                    cfg.on_epoch_end(self.seed, self.epoch, stats)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
        path = self.save() if (interrupted or self.epoch == epochs) else None
        if interrupted:
            # the live state may be mid-step: report (and keep) the last completed epoch
            snap = self._committed
            self.model.params, self.epoch, self.history = snap["params"], snap["epoch"], snap["history"]
            self.best = snap["best"]
        final = next((h for h in reversed(self.history) if "test_acc" in h), {})
        test_acc = (self.best["test_acc"] if cfg.select == "best_val" else final.get("test_acc"))
        return dict(seed=self.seed, test_acc=test_acc, val_acc=final.get("val_acc"),
                    train_acc=final.get("train_acc"), best_val=self.best,
                    final_loss=self.history[-1]["loss"] if self.history else None,
                    epochs_done=self.epoch, resumed_from=resumed_from, interrupted=interrupted,
                    epoch_seconds=(float(np.mean(self.epoch_seconds)) if self.epoch_seconds
                                   else None),
                    params_sha256=params_digest(self.model.params),
                    checkpoint=str(path) if path else None,
                    history=self.history)


# --------------------------------------------------------------------------- entry point


def prepare(config: TrainConfig, model_cls) -> Prepared:
    ds = _load(config.dataset)
    # Kipf & Welling's row normalisation is for non-negative (bag-of-words) features: a signed
    # row sum can be near 0 and blow a row up (it cost the SBM demo 40 points), so signed
    # features stay as they are
    x = (row_normalize(ds.x) if config.normalize_features and features_are_counts(ds.x)
         else np.asarray(ds.x, np.float32))
    graph = model_cls.norm_graph(ds.graph)
    y = np.asarray(ds.y, dtype=np.int64)
    train_idx = np.flatnonzero(ds.train_mask)
    if not train_idx.size:
        raise ValueError(f"dataset {getattr(ds, 'name', config.dataset)!r}: its training mask "
                         f"selects no node, so there is nothing to train on")
    return Prepared(ds, graph, x, y, train_idx, np.flatnonzero(ds.val_mask),
                    np.flatnonzero(ds.test_mask), int(ds.num_classes))


def features_are_counts(x) -> bool:
    """True when no feature is negative: the features row normalisation is meant for."""
    x = x.data if sp.issparse(x) else np.asarray(x)
    return not x.size or bool(x.min() >= 0)


def _writable_folder(option: str, path) -> None:
    """A folder training will write to: refused now if it cannot be, not at the first save."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise ValueError(f"TrainConfig.{option} = {str(path)!r}: is a file, not a folder")
    probe = d
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise ValueError(f"TrainConfig.{option} = {str(path)!r}: {probe} is not writable")


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
        raise ValueError(f"TrainConfig.cost_model = {str(cm)!r}: "
                         + ("is a folder, not a cost model JSON file" if Path(cm).is_dir()
                            else "no such file"))


def run_training(config: TrainConfig, models: list | None = None) -> dict:
    """Train ``config.model`` once per seed; returns the JSON-ready summary.

    ``models``: a list to which each seed's trained model is appended
    (:class:`~gnnweave.host.modelfile.SavedModel`); ``config.save_model`` writes the first
    seed's to a file (its path checked before training starts)."""
    from gnnweave.host.models import MODELS
    key = str(config.model).lower()
    if key not in MODELS:
        raise ValueError(f"TrainConfig.model = {config.model!r}: choose one of gcn, sage, sgc")
    if config.select not in ("last", "best_val"):
        raise ValueError(f"TrainConfig.select = {config.select!r}: choose 'last' or 'best_val'")
    model_cls = MODELS[key]
    check_outputs(config)
    if config.nproc > 1 or config.dist:
        from gnnweave.host.distributed import run_distributed
        return run_distributed(config)
    k = config.overlap_chunks
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"TrainConfig.overlap_chunks = {k!r}: expected an integer >= 1")
    if config.resume and config.checkpoint_dir is None and config.out_dir is None:
        raise ValueError("TrainConfig.resume: give checkpoint_dir (--checkpoint-dir) or out_dir "
                         "(--out) to say where the checkpoint is")
    hp = _resolved(config, model_cls)
    data = prepare(config, model_cls)
    name = getattr(data.dataset, "name", str(config.dataset))
    executors: dict[str, Executor] = {}
    dense = _executor_for(config.device, executors, config.executor_options)
    cost_model = _cost_model(config.cost_model)
    shares = resolve_shares(config.partition, data.graph, config.device, config.devices,
                            cost_model=cost_model, feat_dim=hp["hidden"] or data.num_classes)
    shards = None
    if shares is not None:
        shards = {dev: (_executor_for(dev, executors, config.executor_options), r)
                  for dev, r in shares.items()}
    if config.steal:
        if shares is None or len(set(shares) | set(config.devices or [])) < 2:
            raise ValueError("TrainConfig.steal: work stealing needs the aggregation split "
                             "over two or more devices (--devices A,B with a --partition)")
        n = data.graph.num_nodes   # a device the split leaves out may still steal rows
        shards.update({d: (_executor_for(d, executors, config.executor_options), (n, n))
                       for d in config.devices or [] if d not in shards})
    engine = Engine(dense, Timeline(), shards=shards, num_nodes=data.graph.num_nodes,
                    base_graph=data.graph, overlap_chunks=config.overlap_chunks,
                    steal=config.steal)
    transposed(data.graph)   # built once here, not inside the first shard that needs it
    if config.rank_invariant:
        from gnnweave.host.distributed import invariant_row_sum
        engine.row_sum = invariant_row_sum
    per_seed, interrupted = [], False
    saved_path = None
    timeline = None
    rebalances: list[dict] = []
    try:
        for seed in config.seed_list():
            engine.timeline = timeline = Timeline()
            timeline.epoch = -1   # preprocessing (SGC's propagation) is recorded as epoch -1
            model_proto = make_model(key, data.x.shape[1], data.num_classes, hidden=hp["hidden"],
                                     layers=config.layers, dropout=hp["dropout"], seed=seed)
            x_in = model_proto.prepare_features(engine, data.graph, data.x)
            x_in = _maybe_sparse(x_in, config.sparse_input)
            trainer = Trainer(config, data, engine, hp, seed, x_in, name)
            if config.rebalance and shares is not None:
                trainer.rebalancer = _EpochRebalancer(engine, data.graph, shares, executors,
                                                      cost_model, hp["hidden"] or data.num_classes,
                                                      rebalances, seed)
            res = trainer.run()
            per_seed.append(res)
            if models is not None or (config.save_model is not None and saved_path is None):
                from gnnweave.host.modelfile import from_training, save_model
                snap = from_training(config, trainer, engine, name)
                if models is not None:
                    models.append(snap)
                if config.save_model is not None and saved_path is None:
                    saved_path = save_model(snap, config.save_model)
            if res["interrupted"]:
                interrupted = True
                break
    finally:
        engine.close()
        for ex in executors.values():
            ex.close()

    accs = [r["test_acc"] for r in per_seed if r["test_acc"] is not None]
    eps = [r["epoch_seconds"] for r in per_seed if r["epoch_seconds"] is not None]
    last_epoch = max((r.epoch for r in timeline.records), default=None) if timeline else None
    last_records = timeline.of_epoch(last_epoch) if last_epoch is not None else []
    share_map = ({d: r for d, (_, r) in engine.shards.items()} if engine.shards
                 else {config.device: (0, data.graph.num_nodes)})
    if engine.shards:
        # a listed device the split left without rows (a rebalance can) is shown with none
        n = data.graph.num_nodes
        share_map.update({d: (n, n) for d in (config.devices or []) if d not in share_map})
    measured = {dev: s.get("compute_s", 0.0) + s.get("transfer_s", 0.0)
                for dev, s in (timeline.summary(last_epoch).items() if timeline else [])}
    pvm = predicted_vs_measured(last_records, cost_model)
    # measured seconds are device time on FPGA kinds, CPU time on cpu, else wall: say which
    clocks = measured_clocks(last_records)
    ran = None
    if config.steal:   # the split is where each device starts; stealing moves rows
        ran_edges = {d: e for d, (e, _) in aggregation_work(last_records, share_map)[1].items()}
        total_ran = sum(ran_edges.values())
        ran = {d: (e / total_ran if total_ran else 0.0) for d, e in ran_edges.items()}
    table_rows = partition_rows_table(data.graph, share_map, measured,
                                      {d: v["predicted_s"] for d, v in pvm.items()} if pvm else None,
                                      clocks, ran)
    result = dict(
        dataset=name, model=key, device=config.device,
        mode="mini-batch" if config.batch_size is not None else "full-batch",
        hyperparameters=dict(hp, layers=config.layers, optimizer=config.optimizer,
                             batch_size=config.batch_size,
                             fanouts=list(config.fanouts) if config.batch_size else None),
        test_acc_mean=float(np.mean(accs)) if accs else None,
        test_acc_std=float(np.std(accs)) if accs else None,
        epoch_seconds=float(np.mean(eps)) if eps else None,
        shares={d: dict(lo=r["lo"], hi=r["hi"], rows=r["rows"], edges=r["edges"],
                        edge_share=r["edge_share"]) for d, r in zip(share_map, table_rows)},
        partition_table=format_partition_table(table_rows),
        predicted_vs_measured=pvm,
        measured_clock=clocks,
        busy=busy_fractions(last_records),
        saturations=sum(r.saturations for r in (timeline.records if timeline else [])),
        interrupted=interrupted,
        rebalances=rebalances if config.rebalance else None,
        steals=engine.steals if config.steal else None,
        seeds=[{k: v for k, v in r.items() if k != "history"} for r in per_seed],
        saved_model=str(saved_path) if saved_path is not None else None,
    )
    if config.batch_size is not None and timeline is not None:
        prep = [r for r in last_records if r.category in ("transfer", "host")]
        comp = [r for r in last_records if r.category == "compute"]
        # seconds of the last epoch in which preparing a batch (sampling, copying it in)
        # ran while an op computed: what the prefetcher hides
        result["prefetch_overlap_s"] = interval_overlap(prep, comp)
    if config.out_dir is not None:
        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if timeline is not None and timeline.records:
            epochs_to_plot = sorted({r.epoch for r in timeline.records if r.epoch >= 0})[-1:]
            result["timeline_png"] = str(plot_timeline(
                timeline, out / "timeline.png", epochs=epochs_to_plot,
                title=f"{key} on {name}: training step of epoch {epochs_to_plot[0] + 1}"
                      + (" (mini-batches)" if config.batch_size else "")))
        (out / "partition.txt").write_text(result["partition_table"] + "\n")
        result["histories"] = {r["seed"]: r["history"] for r in per_seed}
        (out / "result.json").write_text(json.dumps(result, indent=2, default=_json_default))
        result.pop("histories")
    return result


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


__all__ = ["TrainConfig", "Trainer", "run_training", "resolve_shares", "predicted_vs_measured",
           "params_digest", "add_train_arguments", "config_from_args", "train_main"]


# --------------------------------------------------------------------------- command line


def _ranges_arg(text: str) -> dict:
    """'cpu=0:1200,fpga-emu=1200:2708' -> {'cpu': (0, 1200), 'fpga-emu': (1200, 2708)}."""
    out = {}
    for part in text.split(","):
        dev, sep, rng = part.partition("=")
        lo, sep2, hi = rng.partition(":")
        if not (sep and sep2):
            raise ValueError(f"--partition: {part!r} is not DEVICE=LO:HI")
        try:
            out[dev.strip()] = (int(lo), int(hi))
        except ValueError:
            raise ValueError(f"--partition: {part!r}: LO and HI must be integers") from None
    return out


def _ints_arg(option: str, text: str) -> tuple[int, ...]:
    """'10,5' -> (10, 5); anything else is a one-line error naming the option."""
    try:
        return tuple(int(f) for f in str(text).split(","))
    except ValueError:
        raise ValueError(f"--{option}: {text!r} is not a comma list of integers, e.g. 10,5") from None


def _devices_arg(text) -> list[str] | None:
    if not text:
        return None
    names = [d.strip() for d in str(text).split(",") if d.strip()]
    seen = set()
    for name in names:
        if name.lower() in seen:
            raise ValueError(f"--devices: {name!r} appears twice (name further instances "
                             f"{name}:1, {name}:2, ...)")
        seen.add(name.lower())
    return names or None


def _placement_args(device, devices, partition) -> tuple[str, object, bool]:
    """(device, partition, rebalance) from ``--device``, ``--devices`` and ``--partition``.

    Not given, ``--partition`` is ``even`` over several ``--devices`` and ``none`` otherwise;
    ``auto`` is ``even`` rebalanced after each epoch. One ``--devices`` entry is the device
    that trains (or, beside a different ``--device`` for the dense ops, the one that
    aggregates); ``--partition none`` with several is a contradiction, not a silent split.
    """
    rebalance = False
    if partition == "auto":
        if not devices:
            raise ValueError("--partition auto needs --devices (a comma list, e.g. fpga-emu,cpu)")
        partition, rebalance = "even", True
    elif partition is None:
        partition = "even" if devices and len(devices) > 1 else "none"
    elif partition == "none" and devices and len(devices) > 1:
        raise ValueError(f"--partition none trains on one device, got --devices "
                         f"{','.join(devices)}: choose --partition even or auto to split them")
    if devices and len(devices) == 1 and partition == "none":
        if device is None or device == devices[0]:
            device = devices[0]
        else:   # --device does the dense ops, the one --devices entry aggregates
            partition = "even"
    return device or "cpu", partition, rebalance


def add_train_arguments(parser):
    """The ``gnnweave train`` options (for the CLI to mount on its sub-parser)."""
    p = parser
    p.add_argument("--dataset", default="cora", help="cora, citeseer, sbm[:N:C], a path, ...")
    p.add_argument("--model", default="gcn", choices=["gcn", "sage", "sgc"])
    p.add_argument("--device", default=None,
                   help="executor for dense ops (and aggregation); default: the one --devices "
                        "entry, else cpu")
    p.add_argument("--devices", default=None,
                   help="comma list: the devices that share the aggregation (one: trains on it)")
    p.add_argument("--partition", default=None,
                   help="auto (a split calibrated on the graph, rebalanced after each epoch) | none | "
                        "even | balanced (needs "
                        "--cost-model) | DEVICE=LO:HI,DEVICE=LO:HI; default: even over several "
                        "--devices, else none")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=None)
    p.add_argument("--lr", type=float, default=None,
                   help=f"default: the model's (Adam) or {SGD_DEFAULT_LR} with --optimizer sgd")
    p.add_argument("--weight-decay", type=float, default=None)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--momentum", type=float, default=0.9, help="for --optimizer sgd")
    p.add_argument("--seeds", type=int, default=1, help="train seeds 0..N-1")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"mini-batch (default full-batch; {DEFAULT_FANOUT_BATCH_SIZE} with --fanouts)")
    p.add_argument("--fanouts", default=None,
                   help="neighbours sampled per hop, e.g. 25,10; turns on mini-batch training "
                        "(default 10 per hop with --batch-size)")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--overlap-chunks", type=int, default=1,
                   help="split each layer's aggregation into K row chunks; the dense device "
                        "transforms chunk k while the --devices aggregate chunk k+1 (1: no overlap)")
    p.add_argument("--select", default="last", choices=["last", "best_val"])
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="epochs between checkpoints (0: only at the end and on Ctrl-C)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--out", default=None, help="folder for result.json, timeline.png, partition.txt")
    p.add_argument("--save-model", default=None, metavar="PATH",
                   help="write the trained model (first seed) to PATH (.npz) for gnnweave predict")
    p.add_argument("--cost-model", default=None, help="cost model JSON (fills predicted_vs_measured)")
    p.add_argument("--rebalance", action="store_true",
                   help="re-partition after each epoch from the measured shard times")
    p.add_argument("--steal", action="store_true",
                   help="work stealing: a device whose rows of an aggregation are done takes "
                        "rows from a slower one (within each aggregation; --rebalance still "
                        "moves the split between epochs)")
    p.add_argument("--no-progress", action="store_true")
    d = p.add_argument_group("over ranks (docs/distributed.md)")
    d.add_argument("--nproc", type=int, default=1,
                   help="spawn N local ranks (torch.distributed, gloo) and train over them")
    d.add_argument("--dist", action="store_true",
                   help="be one rank of a torchrun job (torchrun --nproc-per-node N -m gnnweave "
                        "train --dist ...)")
    d.add_argument("--rank-devices", default=None,
                   help="each rank's devices, e.g. '0=fpga-emu,cpu 1=cpu' (default: --devices, "
                        "else --device)")
    d.add_argument("--rank-speeds", default=None,
                   help="relative rank speeds, e.g. 2,1, or auto (each rank times its dense "
                        "device on the graph): each rank's share of the nodes' work")
    d.add_argument("--partition-method", default="metis",
                   choices=["metis", "rcm", "rows", "random"],
                   help="how nodes are split over ranks (metis falls back to rcm without pymetis)")
    d.add_argument("--digest-every", type=int, default=10,
                   help="epochs between cross-rank parameter digest checks (0: never)")
    d.add_argument("--rank-invariant", action="store_true",
                   help="one process: counter-based dropout and exact bias sums, the bits that "
                        "any number of ranks gives")
    return parser


def config_from_args(args) -> TrainConfig:
    """TrainConfig from parsed ``gnnweave train`` options; options a caller's parser does
    not define take the defaults of :func:`add_train_arguments`."""
    import argparse
    defaults = vars(add_train_arguments(argparse.ArgumentParser()).parse_args([]))
    a = {k: getattr(args, k, v) for k, v in defaults.items()}
    devices = _devices_arg(a["devices"])
    device, part, auto = _placement_args(a["device"], devices, a["partition"])
    if part not in ("none", "even", "balanced"):
        part = _ranges_arg(part)
    if a["fanouts"] is not None and a["batch_size"] is None:
        # fan-outs only mean something for mini-batches: asking for them asks for mini-batch
        a["batch_size"] = DEFAULT_FANOUT_BATCH_SIZE
    fanouts = (_ints_arg("fanouts", a["fanouts"]) if a["fanouts"] is not None
               else (10,) * max(a["layers"], 1))
    return TrainConfig(
        dataset=a["dataset"], model=a["model"], device=device, devices=devices,
        partition=part, hidden=a["hidden"], layers=a["layers"], dropout=a["dropout"], lr=a["lr"],
        weight_decay=a["weight_decay"], epochs=a["epochs"], optimizer=a["optimizer"],
        momentum=a["momentum"], seeds=a["seeds"], batch_size=a["batch_size"], fanouts=fanouts, prefetch=a["prefetch"],
        overlap_chunks=a["overlap_chunks"],
        select=a["select"], checkpoint_dir=a["checkpoint_dir"],
        checkpoint_every=a["checkpoint_every"], resume=a["resume"], out_dir=a["out"],
        save_model=a.get("save_model"),
        cost_model=a["cost_model"], rebalance=a["rebalance"] or auto, steal=a["steal"],
        progress=not a["no_progress"], nproc=a["nproc"], dist=a["dist"],
        rank_devices=a["rank_devices"],
        rank_speeds=(a["rank_speeds"] if a["rank_speeds"] in (None, "auto") else
                     [float(v) for v in _ints_or_floats("rank-speeds", a["rank_speeds"])]),
        partition_method=a["partition_method"], digest_every=a["digest_every"],
        rank_invariant=a["rank_invariant"])


def _ints_or_floats(option: str, text: str) -> list[float]:
    try:
        return [float(f) for f in str(text).split(",")]
    except ValueError:
        raise ValueError(f"--{option}: {text!r} is not a comma list of numbers, e.g. 2,1") from None


def train_main(argv=None) -> dict:
    """``gnnweave train``: parse ``argv`` (a list, or an argparse Namespace), train, return
    the summary dict (the CLI prints it as JSON)."""
    import argparse
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        args = add_train_arguments(argparse.ArgumentParser(prog="gnnweave train")).parse_args(argv)
    return run_training(config_from_args(args))
