"""Data split of an aggregation (and its GEMM) over devices by destination-row ranges.

Each device ``d`` gets one contiguous range ``[lo, hi)`` of destination nodes (CSR rows); the
ranges, in the given device order, cover ``0..N``. The predicted time of a share is a
:class:`ShareCost`: ``fixed + per_edge * edges + per_row * rows`` when the share is not empty
and 0 when it is (the device is not launched). ``fixed`` holds launch overheads and the
transfer of the input features to the device, ``per_row`` the result rows coming back (and
the GEMM on those rows when ``out_dim`` is given), ``per_edge`` the gathers.

``partition_rows`` minimises the predicted makespan ``max_d time_d`` exactly up to row
granularity: bisection on the makespan ``T``; for a given ``T`` the devices, in order, take
the longest prefix of the remaining rows whose time stays ``<= T`` (time is monotone in the
range end, so the longest prefix is found by binary search on cumulative edges/rows); ``T``
is feasible when the last device reaches row ``N``. ``method="even"`` cuts at equal edge
counts instead.

:class:`Rebalancer` corrects each device's model by the ratio of measured to predicted time
after every epoch (exponentially smoothed, or the median of the last few epochs' ratios:
``window``) and re-partitions only when the re-partition is
predicted to cut the makespan by more than ``threshold`` (hysteresis: noise of a few percent
on a balanced split predicts a gain below the threshold, so the split stays put).

:func:`fit_share_cost` is the per-graph calibration (profiling on the workload, as HyScale-GNN
and Poplar do): from a device's measured times on a few row ranges of the graph that will be
split, either *rescale* a prior model (one factor: the median of measured / predicted) or
*refit* ``fixed, per_edge, per_row`` (non-negative least squares on relative residuals); with
``method="auto"`` the one with the smaller leave-one-out error is kept, so three free
coefficients are only used where the samples support them.
:func:`gnnweave.host.profiler.calibrate_shares` takes those measurements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

Partition = dict  # device -> (lo, hi)


@dataclass(frozen=True)
class ShareCost:
    """Predicted seconds for one device to handle ``edges`` edges over ``rows`` destination rows."""

    fixed_s: float = 0.0
    per_edge_s: float = 0.0
    per_row_s: float = 0.0

    def __post_init__(self):
        for name in ("fixed_s", "per_edge_s", "per_row_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"ShareCost.{name} = {v}: must be finite and >= 0")
        if self.per_edge_s == 0 and self.per_row_s == 0:
            raise ValueError("ShareCost: per_edge_s and per_row_s are both 0 (the device "
                             "would take every row for free)")

    def __call__(self, edges, rows):
        edges = np.asarray(edges, dtype=np.float64)
        rows = np.asarray(rows, dtype=np.float64)
        t = self.fixed_s + self.per_edge_s * edges + self.per_row_s * rows
        return np.where(rows > 0, t, 0.0)

    def chunk(self, edges: int, rows: int, first: bool) -> float:
        """Seconds of one chunk of a work-stealing run: the fixed cost only on the device's
        ``first`` chunk (``x`` is on the device after it)."""
        return (self.per_edge_s * edges + self.per_row_s * rows
                + (self.fixed_s if first else 0.0))

    def scaled(self, factor: float) -> "ShareCost":
        return ShareCost(self.fixed_s * factor, self.per_edge_s * factor, self.per_row_s * factor)


def share_costs(costs, devices=None, *, feat_dim: int, num_nodes: int,
                out_dim: int | None = None) -> dict[str, ShareCost]:
    """Normalise ``costs`` into ``{device: ShareCost}``.

    ``costs``: ``{device: rate}`` (edge x feature elements per second; relative speeds work
    too), ``{device: ShareCost}``, or an object with
    ``share_cost(device, feat_dim=, num_nodes=, out_dim=)`` (a fitted
    :class:`~gnnweave.host.costmodel.CostModel`, then ``devices`` lists the devices to use).
    """
    if hasattr(costs, "share_cost"):
        if not devices:
            devices = list(costs.devices)
        return {d: costs.share_cost(d, feat_dim=feat_dim, num_nodes=num_nodes, out_dim=out_dim)
                for d in devices}
    if not isinstance(costs, Mapping) or not costs:
        raise ValueError("costs: expected a non-empty {device: rate or ShareCost} or a CostModel")
    out = {}
    for d in (devices or list(costs)):
        if d not in costs:
            raise ValueError(f"costs: no entry for device {d!r} (have {sorted(costs)})")
        c = costs[d]
        if isinstance(c, ShareCost):
            out[d] = c
        else:
            rate = float(c)
            if not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"costs[{d!r}] = {c}: a rate must be finite and > 0")
            out[d] = ShareCost(per_edge_s=feat_dim / rate)
    return out


def _cum(graph):
    edges = np.asarray(graph.indptr, dtype=np.float64)          # cumulative edges per row bound
    rows = np.arange(graph.num_nodes + 1, dtype=np.float64)
    return edges, rows


def predict_times(graph, partition: Mapping, costs: Mapping[str, ShareCost]) -> dict[str, float]:
    """Predicted seconds per device for ``partition`` (``{device: (lo, hi)}``)."""
    out = {}
    for d, (lo, hi) in partition.items():
        e = int(graph.indptr[hi] - graph.indptr[lo])
        out[d] = float(costs[d](e, hi - lo))
    return out


def _greedy(E, R, costs: list[ShareCost], T: float):
    """Ranges for makespan ``T``: each device takes the longest prefix it can finish in T."""
    n = len(R) - 1
    bounds = [0]
    lo = 0
    for c in costs:
        if lo >= n or c.fixed_s > T:
            bounds.append(lo)
            continue
        # g[h] = per_edge*E[h] + per_row*R[h] is nondecreasing in h
        budget = T - c.fixed_s + c.per_edge_s * E[lo] + c.per_row_s * R[lo]
        g = c.per_edge_s * E[lo:] + c.per_row_s * R[lo:]
        hi = lo + int(np.searchsorted(g, budget * (1 + 1e-12), side="right")) - 1
        hi = max(hi, lo)
        bounds.append(hi)
        lo = hi
    return bounds


def partition_rows(graph, feat_dim: int, costs, *, devices=None, method: str = "balanced",
                   out_dim: int | None = None, keep_empty: bool = False) -> Partition:
    """Split destination rows over devices: ``{device: (lo, hi)}`` in device order.

    ``method="balanced"`` minimises the predicted makespan (see module docstring);
    ``method="even"`` gives every device the same number of edges (``costs`` may then be
    just a list of device names). Devices that get no rows are left out unless
    ``keep_empty``.
    """
    n = graph.num_nodes
    if feat_dim < 1:
        raise ValueError(f"feat_dim={feat_dim}: must be >= 1")
    if method == "even":
        names = list(devices or (costs if not hasattr(costs, "share_cost") else costs.devices))
        if not names:
            raise ValueError("partition_rows: no devices")
        total = graph.num_edges
        bounds = [0]
        for k in range(1, len(names)):
            b = int(np.searchsorted(graph.indptr, total * k / len(names), side="left"))
            bounds.append(min(max(b, bounds[-1]), n))
        bounds.append(n)
        if total == 0:   # no edges: equal rows
            bounds = [round(n * k / len(names)) for k in range(len(names) + 1)]
    elif method == "balanced":
        sc = share_costs(costs, devices, feat_dim=feat_dim, num_nodes=n, out_dim=out_dim)
        names = list(sc)
        clist = [sc[d] for d in names]
        E, R = _cum(graph)
        if n == 0:
            bounds = [0] * (len(names) + 1)
        else:
            hi_T = min(float(c(E[-1], R[-1])) for c in clist)   # best single device
            lo_T = 0.0
            for _ in range(100):
                mid = 0.5 * (lo_T + hi_T)
                if _greedy(E, R, clist, mid)[-1] >= n:
                    hi_T = mid
                else:
                    lo_T = mid
                if hi_T - lo_T <= 1e-9 * hi_T:
                    break
            bounds = _greedy(E, R, clist, hi_T)
            bounds[-1] = n  # hi_T is feasible; guard against rounding at the last row
    else:
        raise ValueError(f"method={method!r}: choose 'balanced' or 'even'")
    part = {d: (int(bounds[i]), int(bounds[i + 1])) for i, d in enumerate(names)}
    if not keep_empty:
        part = {d: r for d, r in part.items() if r[1] > r[0]} or {names[0]: (0, n)}
    return part


def ideal_makespan(graph, costs: Mapping[str, ShareCost]) -> float:
    """Total work over summed rates: ``1 / sum_d (1 / T_d)`` with ``T_d`` the time of device
    ``d`` alone on the whole graph (the fluid lower bound when overheads are negligible)."""
    e, r = graph.num_edges, graph.num_nodes
    return 1.0 / sum(1.0 / float(c(e, r)) for c in costs.values())


class Rebalancer:
    """Re-partition after each epoch from measured per-device times, with hysteresis.

    ``update({device: seconds})`` takes the measured time of each device's share of the last
    epoch and returns a new partition, or None to keep the current one.

    ``prior_weight``: the weight of the prior model in a device's first correction. 0
    (default): the first measured ratio replaces the prior -- right for a prior from a size
    sweep (off by 35-300 % on a skewed graph) or measured in other units (one aggregation,
    while an epoch runs several). With a prior calibrated on the same graph in the same units
    (:func:`~gnnweave.host.profiler.calibrate_shares`), one measured step is a second
    estimate of the same thing, taken over a few seconds, and on a loaded host a few seconds
    can sit inside one burst of other processes' load: in the partition benchmark (15 device
    sets with a CPU device, loads 5-8) replacing the calibrated model by one step shortened
    the judged makespan in 4 sets and lengthened it in 7. ``prior_weight=0.5`` averages the
    two; for two devices the split then lies between the two splits, so its makespan is at
    most the worse of theirs.

    ``window``: None (default) smooths each device's correction exponentially
    (``smoothing``). An integer keeps the last ``window`` corrections of each device (the
    first correction, then each later measured ratio) and uses their median: on a host whose
    speed comes in bursts (a neighbour's memory traffic slowing one shard's calls 1.5-3x for a
    second), one disturbed epoch moves an exponential average by ``smoothing`` times the
    burst, and the split with it, while a median of 5 ignores up to 2 disturbed epochs and
    still follows a lasting change after 3.
    """

    def __init__(self, graph, feat_dim: int, costs, *, devices=None, partition=None,
                 out_dim: int | None = None, threshold: float = 0.05, smoothing: float = 0.5,
                 prior_weight: float = 0.0, window: int | None = None):
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing={smoothing}: must be in (0, 1]")
        if not 0 <= prior_weight < 1:
            raise ValueError(f"prior_weight={prior_weight}: must be in [0, 1)")
        if threshold < 0:
            raise ValueError(f"threshold={threshold}: must be >= 0")
        if window is not None and (int(window) != window or window < 1):
            raise ValueError(f"window={window}: must be an integer >= 1 or None")
        self.window = None if window is None else int(window)
        self._corrections: dict[str, list[float]] = {}
        self.graph = graph
        self.feat_dim = feat_dim
        self.out_dim = out_dim
        self.base = share_costs(costs, devices, feat_dim=feat_dim, num_nodes=graph.num_nodes,
                                out_dim=out_dim)
        self.factor = {d: 1.0 for d in self.base}
        self.threshold = threshold
        self.smoothing = smoothing
        self.prior_weight = prior_weight
        self.partition = dict(partition) if partition is not None else partition_rows(
            graph, feat_dim, self.base, out_dim=out_dim)
        unknown = set(self.partition) - set(self.base)
        if unknown:
            raise ValueError(f"partition: device(s) {sorted(unknown)} have no cost entry")
        self.history: list[dict] = []
        self._measured: set[str] = set()

    def corrected_costs(self) -> dict[str, ShareCost]:
        return {d: c.scaled(self.factor[d]) for d, c in self.base.items()}

    def update(self, measured_times: Mapping[str, float],
               work: Mapping[str, tuple[int, int]] | None = None) -> Partition | None:
        """``work``: ``{device: (edges, rows)}`` each device aggregated, when that is not its
        share of the partition (a run with :func:`run_with_stealing`); a device's model is
        then corrected by its measured time over the predicted time of that work."""
        if work is None:
            for d in self.partition:
                if d not in measured_times:
                    raise ValueError(f"measured_times: no time for device {d!r} "
                                     f"(partition has {sorted(self.partition)})")
        for d, t in measured_times.items():
            if work is None and d not in self.partition:
                raise ValueError(f"measured_times: device {d!r} has no share in the partition")
            if work is not None and d not in work:
                raise ValueError(f"measured_times: device {d!r} has no entry in work "
                                 f"(have {sorted(work)})")
            if d not in self.base:
                raise ValueError(f"measured_times: device {d!r} has no cost entry")
            if not (math.isfinite(t) and t > 0):
                raise ValueError(f"measured_times[{d!r}] = {t}: must be finite and > 0")
        if work is None:
            predicted = predict_times(self.graph, self.partition, self.base)
        else:
            predicted = {d: float(self.base[d](int(e), int(r))) for d, (e, r) in work.items()
                         if d in measured_times}
        ratios = {}
        for d, t in measured_times.items():
            if predicted[d] > 0:
                ratios[d] = ratio = t / predicted[d]
                if d not in self._measured:   # a first measurement replaces the prior,
                    # or is averaged with it
                    self.factor[d] = self.prior_weight + (1 - self.prior_weight) * ratio
                    self._corrections[d] = [self.factor[d]]
                elif self.window is not None:
                    self._corrections[d] = (self._corrections[d] + [ratio])[-self.window:]
                    self.factor[d] = float(np.median(self._corrections[d]))
                else:
                    self.factor[d] = ((1 - self.smoothing) * self.factor[d]
                                      + self.smoothing * ratio)
                self._measured.add(d)
        if ratios:
            # a device never measured (no share yet) has no evidence of its own; it takes what
            # the measured ones have in common (e.g. the epoch ran k aggregations, not one),
            # so an idle device does not look k times faster than the busy ones
            common = float(np.median(list(ratios.values())))
            for d in self.base:
                if d not in self._measured:
                    self.factor[d] = common
        costs = self.corrected_costs()
        current = max(predict_times(self.graph, self.partition, costs).values())
        candidate = partition_rows(self.graph, self.feat_dim, costs, out_dim=self.out_dim)
        new = max(predict_times(self.graph, candidate, costs).values())
        gain = (current - new) / current if current > 0 else 0.0
        changed = gain > self.threshold and candidate != self.partition
        self.history.append({"measured": dict(measured_times), "predicted_current": current,
                             "predicted_new": new, "gain": gain, "changed": changed})
        if changed:
            self.partition = candidate
            return dict(candidate)
        return None


@dataclass(frozen=True)
class ShareFit:
    """A device's :class:`ShareCost` calibrated on measured shares of one graph."""

    cost: ShareCost
    method: str                      # 'refit' | 'scale'
    scale: float | None              # median measured / prior-predicted; None without a prior
    loo_median_rel_err: float | None  # leave-one-out median relative error of ``method``
    fit_median_rel_err: float        # on the samples themselves
    samples: tuple = ()              # ((edges, rows, seconds), ...)

    def to_dict(self) -> dict:
        return {"fixed_s": self.cost.fixed_s, "per_edge_s": self.cost.per_edge_s,
                "per_row_s": self.cost.per_row_s, "method": self.method, "scale": self.scale,
                "loo_median_rel_err": self.loo_median_rel_err,
                "fit_median_rel_err": self.fit_median_rel_err,
                "samples": [list(s) for s in self.samples]}


def _check_samples(samples) -> np.ndarray:
    arr = []
    for i, s in enumerate(samples):
        try:
            e, r, t = (float(v) for v in s)
        except (TypeError, ValueError):
            raise ValueError(f"samples[{i}] = {s!r}: expected (edges, rows, seconds)") from None
        if not (math.isfinite(e) and e >= 0 and math.isfinite(r) and r >= 1):
            raise ValueError(f"samples[{i}]: edges={e}, rows={r}: need edges >= 0 and rows >= 1")
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"samples[{i}]: seconds={t}: must be finite and > 0")
        arr.append((e, r, t))
    if not arr:
        raise ValueError("samples: no measured shares to calibrate on")
    return np.array(arr)


def _refit(s: np.ndarray) -> ShareCost | None:
    from scipy.optimize import nnls
    for columns in ((0, 1, 2), (1, 2)):   # without a work term: no fixed cost, so rows cost
        A = np.column_stack([np.ones(len(s)), s[:, 0], s[:, 1]])[:, columns] / s[:, 2:3]
        norms = np.linalg.norm(A, axis=0)
        norms[norms == 0] = 1.0
        sol, _ = nnls(A / norms, np.ones(len(s)), maxiter=200)
        coef = dict(zip(columns, (float(v) for v in sol / norms)))
        if coef.get(1, 0.0) > 0 or coef.get(2, 0.0) > 0:
            return ShareCost(coef.get(0, 0.0), coef.get(1, 0.0), coef.get(2, 0.0))
    return None


def _rescale(s: np.ndarray, prior: ShareCost) -> tuple[ShareCost, float]:
    pred = prior(s[:, 0], s[:, 1])
    factor = float(np.median(s[:, 2] / pred))
    return prior.scaled(factor), factor


def _rel_err(cost: ShareCost, s: np.ndarray) -> np.ndarray:
    return np.abs(cost(s[:, 0], s[:, 1]) - s[:, 2]) / s[:, 2]


def _loo(s: np.ndarray, fit) -> float | None:
    """Median relative error on each sample of a model fitted without it."""
    if len(s) < 2:
        return None
    errs = []
    for i in range(len(s)):
        model = fit(np.delete(s, i, axis=0))
        if model is None:
            return None
        errs.append(float(_rel_err(model, s[i:i + 1])[0]))
    return float(np.median(errs))


def fit_share_cost(samples, prior: ShareCost | None = None, *, method: str = "auto") -> ShareFit:
    """Calibrate a device's :class:`ShareCost` on measured shares of one graph.

    ``samples``: ``[(edges, rows, seconds), ...]`` measured on row ranges of the graph;
    ``prior``: the device's model before calibration (e.g. from the profiler's size sweep).
    ``method``: ``'scale'`` (the prior times the median measured/predicted ratio; needs a
    prior), ``'refit'`` (new ``fixed, per_edge, per_row`` by NNLS on relative residuals;
    needs 3 samples) or ``'auto'`` (of those possible, the one with the smaller
    leave-one-out median relative error).
    """
    s = _check_samples(samples)
    if method not in ("auto", "scale", "refit"):
        raise ValueError(f"method={method!r}: choose 'auto', 'scale' or 'refit'")
    if method == "scale" and prior is None:
        raise ValueError("method='scale' needs a prior ShareCost to rescale")
    if method == "refit" and len(s) < 3:
        raise ValueError(f"method='refit' needs >= 3 samples (got {len(s)})")
    options = {}
    if prior is not None and method in ("auto", "scale"):
        options["scale"] = lambda sub: _rescale(sub, prior)[0]
    if len(s) >= 3 and method in ("auto", "refit"):
        options["refit"] = _refit
    if not options:
        raise ValueError(f"fit_share_cost: {len(s)} sample(s) and no prior: need >= 3 "
                         "samples to fit a model")
    loo = {name: _loo(s, fit) for name, fit in options.items()}
    if len(options) == 1:
        chosen = next(iter(options))
    else:   # both possible: the smaller held-out error (a missing LOO loses)
        chosen = min(options, key=lambda k: math.inf if loo[k] is None else loo[k])
    cost = options[chosen](s)
    if cost is None:   # a refit with no work term: fall back to the prior
        if prior is None:
            raise ValueError("fit_share_cost: the samples give no per-edge or per-row cost")
        chosen, cost = "scale", _rescale(s, prior)[0]
    scale = _rescale(s, prior)[1] if prior is not None else None
    return ShareFit(cost, chosen, scale, loo[chosen] if chosen in loo else None,
                    float(np.median(_rel_err(cost, s))),
                    tuple(tuple(float(v) for v in row) for row in s))


# --------------------------------------------------------------------------- work stealing


@dataclass
class StealRun:
    """What :func:`run_with_stealing` did: the row ranges each device ran (in its order),
    each device's clock when it went idle, and how many ranges were stolen."""

    chunks: dict            # device -> [(lo, hi, seconds), ...]
    finish_s: dict          # device -> its clock after its last chunk (0 if it ran none)
    steals: int

    @property
    def makespan_s(self) -> float:
        return max(self.finish_s.values(), default=0.0)

    def work(self, indptr) -> dict:
        """``{device: (edges, rows)}`` the device aggregated (for :meth:`Rebalancer.update`)."""
        return {d: (int(sum(int(indptr[hi] - indptr[lo]) for lo, hi, _ in c)),
                    int(sum(hi - lo for lo, hi, _ in c))) for d, c in self.chunks.items()}

    def busy_s(self) -> dict:
        return {d: float(sum(t for _, _, t in c)) for d, c in self.chunks.items()}


def run_with_stealing(indptr, shares: Mapping, costs: Mapping[str, ShareCost], run_chunk, *,
                      min_chunk_edges: int | None = None, first_fraction: float = 0.5) -> StealRun:
    """Run a split aggregation whose devices steal rows from each other as they go idle.

    A static split is sized from predicted speeds; when a device turns out faster or slower
    than predicted *during* the call (a host CPU whose speed moves 1.5-2x within seconds, a
    board sharing its memory), the split's makespan follows the slowest surprise. Here each
    device starts on its share of ``shares`` (``{device: (lo, hi)}``, e.g. from
    :func:`partition_rows`) and runs it front to back in chunks, each predicted to take
    ``first_fraction`` of the time all rows left would take on all devices together (guided
    self-scheduling in time, at least ``min_chunk_edges``: few calls, the last ones short,
    and a device found slow commits to short ones); a device that runs out of rows takes the
    back end of another device's remaining rows, cut where both are predicted to finish together
    (each device's :class:`ShareCost`, corrected during the run by its measured / predicted
    ratio so far), and only if that finishes the rows earlier than leaving them. Every chunk
    is a contiguous row range, and every row is aggregated exactly once.

    ``run_chunk(device, lo, hi, first)`` runs destination rows ``[lo, hi)`` on ``device``
    and returns the seconds it took on the device's own clock (``first``: the device's first
    call of this aggregation, which pays its fixed cost, e.g. copying ``x`` in). The devices
    are scheduled as concurrent devices would run: the device whose clock is earliest picks
    next, so the calls can run one after another on the host (emulated devices) and the
    makespan is the latest clock.
    """
    indptr = np.asarray(indptr)
    total_edges = int(indptr[-1] - indptr[0])
    if not 0 < first_fraction <= 1:
        raise ValueError(f"first_fraction={first_fraction}: must be in (0, 1]")
    names = list(shares)
    if not names:
        raise ValueError("run_with_stealing: no shares")
    for d in names:
        if d not in costs:
            raise ValueError(f"costs: no entry for device {d!r} (have {sorted(costs)})")
    if min_chunk_edges is None:
        min_chunk_edges = max(1, total_edges // (32 * len(names)))
    front = {d: int(shares[d][0]) for d in names}
    back = {d: int(shares[d][1]) for d in names}
    avail = {d: 0.0 for d in names}     # when the device picks its next rows
    finish = {d: 0.0 for d in names}    # the end of its last chunk
    done = {d: [] for d in names}
    measured = {d: 0.0 for d in names}
    predicted = {d: 0.0 for d in names}
    retired: set = set()
    steals = 0

    def edges(lo, hi):
        return int(indptr[hi] - indptr[lo])

    def raw(d, lo, hi):
        return costs[d].chunk(edges(lo, hi), hi - lo, first=not done[d])

    def ratio(d):
        """d's measured / predicted seconds over its chunks so far (1 before any)."""
        return measured[d] / predicted[d] if predicted[d] > 0 else 1.0

    def estimate(d, lo, hi):
        """Predicted seconds of rows [lo, hi) on d, corrected by d's ratio so far."""
        return raw(d, lo, hi) * ratio(d) if hi > lo else 0.0

    avg_rows_per_edge = (len(indptr) - 1) / max(total_edges, 1)

    def per_edge(d):
        """d's predicted seconds per edge (rows at the graph's average), corrected so far."""
        c = costs[d]
        return (c.per_edge_s + c.per_row_s * avg_rows_per_edge) * ratio(d)

    def run(d, lo, hi):
        pred = raw(d, lo, hi)
        first = not done[d]
        t = float(run_chunk(d, lo, hi, first))
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"run_chunk({d!r}, {lo}, {hi}) returned {t}: expected seconds >= 0")
        done[d].append((lo, hi, t))
        avail[d] = finish[d] = avail[d] + t
        measured[d] += t
        predicted[d] += pred

    def best_steal(d):
        """(gain, victim, cut): d takes the victim's rows [cut, back); None if no gain."""
        best = None
        for v in names:
            if v == d or front[v] >= back[v]:
                continue
            lo, hi = front[v], back[v]
            keep_all = avail[v] + estimate(v, lo, hi)
            # v keeps [lo, c), d takes [c, hi): v's finish grows with c, d's falls; the
            # later of the two is smallest where they cross (binary search on rows)
            a, b = lo, hi
            while b - a > 1:
                m = (a + b) // 2
                if avail[v] + estimate(v, lo, m) < avail[d] + estimate(d, m, hi):
                    a = m
                else:
                    b = m
            for c in (a, b):
                if lo <= c < hi:
                    fin = max(avail[v] + estimate(v, lo, c), avail[d] + estimate(d, c, hi))
                    if fin < keep_all and (best is None or keep_all - fin > best[0]):
                        best = (keep_all - fin, v, c)
        return best

    while True:
        live = [d for d in names if d not in retired]
        if not live or all(front[v] >= back[v] for v in names):
            break
        d = min(live, key=lambda k: (avail[k], front[k] >= back[k], names.index(k)))
        if front[d] >= back[d]:   # idle: take the back end of rows that would finish last
            steal = best_steal(d)
            if steal is None:
                # nothing to gain now; look again when the next busy device picks
                later = [avail[v] for v in live if v != d and avail[v] > avail[d]]
                if later:
                    avail[d] = min(later)
                else:
                    retired.add(d)
                continue
            _, v, c = steal
            front[d], back[d] = c, back[v]
            back[v] = c
            steals += 1
        lo, hi = front[d], back[d]
        # its own rows, from the front: a chunk predicted to take first_fraction of the time
        # all rows left would take on all devices (guided self-scheduling in time: chunks
        # shrink as the end nears, and a device found slow commits to short ones)
        left_edges = sum(edges(front[v], back[v]) for v in names)
        speed = sum(1.0 / per_edge(v) for v in names if v not in retired)
        budget = first_fraction * left_edges / speed
        if edges(lo, hi) <= 2 * min_chunk_edges or estimate(d, lo, hi) <= budget:
            c = hi
        else:
            a, b = lo + 1, hi   # the longest chunk within budget, at least min_chunk_edges
            while a < b:
                m = (a + b + 1) // 2
                if estimate(d, lo, m) <= budget or edges(lo, m) <= min_chunk_edges:
                    a = m
                else:
                    b = m - 1
            c = a
        front[d] = c
        run(d, lo, c)
    return StealRun(chunks=done, finish_s=dict(finish), steals=steals)
