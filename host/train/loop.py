"""The training loop: full-batch or sampled mini-batch GNN training through the executors.

:func:`run_training` trains one model per seed, each through a :class:`Trainer` on one
:class:`~gnnweave.host.engine.Engine`, and returns the summary of
:mod:`gnnweave.host.train.report`.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph
from gnnweave.host.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from gnnweave.host.engine import Engine, check_shares, cut_rows_by_fractions
from gnnweave.host.executors import Executor, make_executor, transposed
from gnnweave.host.models import (
    LayerGraph, make_model, make_optimizer, row_normalize, softmax_cross_entropy,
)
from gnnweave.host.sampling import MiniBatch, NeighborSampler, Prefetcher, seed_batches
from gnnweave.host.timeline import Timeline
from gnnweave.host.train.config import (
    TrainConfig, check_model_fits, check_outputs, resolve_hyperparameters,
)
from gnnweave.host.train.report import aggregation_work, summarize


def load_dataset_spec(dataset):
    """A dataset: a :func:`~gnnweave.datasets.load_dataset` spec loaded, or the object given."""
    if not isinstance(dataset, str):
        return dataset
    from gnnweave.datasets import load_dataset
    return load_dataset(dataset)


def executor_for(name: str, cache: dict, options: dict) -> Executor:
    """The executor of device ``name`` from ``cache``, made (with the options of its kind)
    the first time it is asked for."""
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
            raise InputError("TrainConfig.cost_model: partition='balanced' needs a cost model "
                             "(a profiler CostModel, its JSON path, or {device: rate})")
        from gnnweave.host.partition import partition_rows
        names = list(devices) if devices else None
        if names is None and isinstance(cost_model, dict):
            names = list(cost_model)
        if not names:
            raise InputError("TrainConfig.devices: partition='balanced' needs the list of devices")
        return check_shares(partition_rows(graph, feat_dim, cost_model, devices=names), n)
    if isinstance(partition, str):
        if partition.lower() != "even":
            raise InputError(f"TrainConfig.partition = {partition!r}: choose 'none', 'even', "
                             f"'balanced', a {{device: (lo, hi)}} mapping or a callable")
        if not devices:
            raise InputError("TrainConfig.devices: partition='even' needs the list of devices")
        ranges = cut_rows_by_fractions(graph.indptr, 0, n, [1.0] * len(devices))
        return check_shares(dict(zip(devices, ranges)), n)
    if callable(partition):
        return check_shares(dict(partition(graph, list(devices or [device]))), n)
    return check_shares(dict(partition), n)


def sparse_input_features(x, mode):
    """The input features as CSR when they are mostly zeros (bag of words): dropout draws
    per stored element and the first layer's products skip the zeros."""
    if mode not in (True, False, "auto"):
        raise InputError(f"TrainConfig.sparse_input = {mode!r}: choose True, False or 'auto'")
    dense = np.asarray(x.toarray() if sp.issparse(x) else x, dtype=np.float32)
    if mode is True or (mode == "auto" and dense.size and np.count_nonzero(dense) < 0.1 * dense.size):
        return sp.csr_matrix(dense)
    dense.flags.writeable = False   # constant input: executors and dropout may cache by identity
    return dense


def load_cost_model(cm):
    """A cost model: a CostModel or ``{device: rate}`` as given, a JSON path loaded."""
    if cm is None or hasattr(cm, "predict") or isinstance(cm, dict):
        return cm
    from gnnweave.host.costmodel import CostModel
    return CostModel.load(cm)


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
                raise InputError("TrainConfig.rank_invariant: full-batch training without "
                                 "overlap_chunks only")
            self.dropout_rng = CounterDropout(seed, np.arange(data.graph.num_nodes))
        self.epoch = 0
        self.history: list[dict] = []
        self.best = dict(val_acc=-1.0, test_acc=None, epoch=None)
        self.best_params = None       # the parameters of the best validation epoch
        self.fingerprint = _fingerprint(config, hp, seed, dataset_name)
        self.full_layers = [LayerGraph(data.graph, data.graph.num_nodes)] * self.model.hops
        self.sampler = None
        if config.batch_size is not None:
            if config.batch_size < 1:
                raise InputError(f"TrainConfig.batch_size = {config.batch_size}: must be >= 1")
            if self.model.hops:
                if len(config.fanouts) != self.model.hops:
                    raise InputError(f"TrainConfig.fanouts has {len(config.fanouts)} entries, the "
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
                    best=dict(self.best), best_params=self.best_params)

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
            raise InputError(f"{path}: the checkpoint is at epoch {int(meta['epoch'])}, past the "
                             f"{self.hp['epochs']} epochs asked for: give --epochs "
                             f"{int(meta['epoch'])} or more to continue it")
        params = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("param:")}
        if set(params) != set(self.model.params):
            raise InputError(f"{path}: field param has {sorted(params)}, the model needs "
                             f"{sorted(self.model.params)}")
        for k, v in params.items():
            if v.shape != self.model.params[k].shape:
                raise InputError(f"{path}: field param:{k} has shape {v.shape}, the model needs "
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

    def step(self, x, layers, labels, rows) -> float:
        """One optimiser step on the nodes ``rows`` of ``x`` (labels ``labels``); the loss."""
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
            return self.step(self.x_in, self.full_layers, d.y, d.train_idx)
        losses, weights = [], []
        producer = self._batches(epoch)
        source = Prefetcher(producer, self.config.prefetch) if self.config.prefetch > 0 else None
        try:
            for mb in (source if source is not None else producer):
                layers = [LayerGraph(b.graph, b.n_dst) for b in mb.blocks]
                losses.append(self.step(mb.x, layers, mb.y, None))
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
                        self.best_params = dict(self.model.params)   # replaced, not updated
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
            self.best, self.best_params = snap["best"], snap["best_params"]
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


def prepare(config: TrainConfig, model_cls) -> Prepared:
    ds = load_dataset_spec(config.dataset)
    # Kipf & Welling's row normalisation is for non-negative (bag-of-words) features: a signed
    # row sum can be near 0 and blow a row up (it cost the SBM demo 40 points), so signed
    # features stay as they are
    x = (row_normalize(ds.x) if config.normalize_features and features_are_counts(ds.x)
         else np.asarray(ds.x, np.float32))
    graph = model_cls.norm_graph(ds.graph)
    y = np.asarray(ds.y, dtype=np.int64)
    train_idx = np.flatnonzero(ds.train_mask)
    if not train_idx.size:
        raise InputError(f"dataset {getattr(ds, 'name', config.dataset)!r}: its training mask "
                         f"selects no node, so there is nothing to train on")
    return Prepared(ds, graph, x, y, train_idx, np.flatnonzero(ds.val_mask),
                    np.flatnonzero(ds.test_mask), int(ds.num_classes))


def features_are_counts(x) -> bool:
    """True when no feature is negative: the features row normalisation is meant for."""
    x = x.data if sp.issparse(x) else np.asarray(x)
    return not x.size or bool(x.min() >= 0)


def run_training(config: TrainConfig, models: list | None = None) -> dict:
    """Train ``config.model`` once per seed; returns the JSON-ready summary.

    ``models``: a list to which each seed's trained model is appended
    (:class:`~gnnweave.host.modelfile.SavedModel`); ``config.save_model`` writes the first
    seed's to a file (its path checked before training starts)."""
    from gnnweave.host.models import MODELS
    key = str(config.model).lower()
    if key not in MODELS:
        raise InputError(f"TrainConfig.model = {config.model!r}: choose one of gcn, sage, sgc")
    if config.select not in ("last", "best_val"):
        raise InputError(f"TrainConfig.select = {config.select!r}: choose 'last' or 'best_val'")
    model_cls = MODELS[key]
    check_outputs(config)
    if config.nproc > 1 or config.dist:
        from gnnweave.host.distributed import run_distributed
        return run_distributed(config)
    k = config.overlap_chunks
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"TrainConfig.overlap_chunks = {k!r}: expected an integer >= 1")
    if config.resume and config.checkpoint_dir is None and config.out_dir is None:
        raise InputError("TrainConfig.resume: give checkpoint_dir (--checkpoint-dir) or out_dir "
                         "(--out) to say where the checkpoint is")
    hp = resolve_hyperparameters(config, model_cls)
    data = prepare(config, model_cls)
    check_model_fits(hp, config.layers, data.graph.num_nodes, data.x.shape[1], data.num_classes)
    name = getattr(data.dataset, "name", str(config.dataset))
    executors: dict[str, Executor] = {}
    dense = executor_for(config.device, executors, config.executor_options)
    cost_model = load_cost_model(config.cost_model)
    shares = resolve_shares(config.partition, data.graph, config.device, config.devices,
                            cost_model=cost_model, feat_dim=hp["hidden"] or data.num_classes)
    shards = None
    if shares is not None:
        shards = {dev: (executor_for(dev, executors, config.executor_options), r)
                  for dev, r in shares.items()}
    if config.steal:
        if shares is None or len(set(shares) | set(config.devices or [])) < 2:
            raise InputError("TrainConfig.steal: work stealing needs the aggregation split "
                             "over two or more devices (--devices A,B with a --partition)")
        n = data.graph.num_nodes   # a device the split leaves out may still steal rows
        shards.update({d: (executor_for(d, executors, config.executor_options), (n, n))
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
            x_in = sparse_input_features(x_in, config.sparse_input)
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

    return summarize(config, model=key, dataset=name, graph=data.graph, hp=hp, engine=engine,
                     timeline=timeline, per_seed=per_seed, interrupted=interrupted,
                     rebalances=rebalances, cost_model=cost_model, saved_path=saved_path)
