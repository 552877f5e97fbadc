r"""Pipeline planner on a layer DAG: stages between cuts, device classes, replicas, links.

Model (what :func:`plan_stages` minimises and :func:`evaluate_stages` recomputes)
--------------------------------------------------------------------------------
A plan is a chain of cuts ``{} = D_0 < D_1 < ... < D_S = V`` of a
:class:`~gnnweave.host.stagecuts.CutSpace`; stage ``s`` runs the layers
``D_s - D_{s-1}`` on ``r_s`` identical devices of class ``c_s`` as data-parallel replicas
(``r_s = 1`` with ``replicate=False``, PipeDream's ``--straight_pipeline``). With ``C`` the
stage's forward + backward seconds on its class and ``P`` its parameter bytes, the stage
alone takes

.. math::
    t_s = \frac{C + AR}{r_s}, \qquad
    AR = \frac{4 (r_s - 1)}{r_s} \frac{P}{b_{cc}} + 2 (r_s - 1)\, \ell_{cc}

(``AR``: all-reduce of the weights over the class's own link of bandwidth ``b_cc`` bytes/s and
latency ``l_cc`` s; PipeDream's hierarchical optimizer uses the same formula with ``l = 0``).
A boundary carries its cut's bytes ``B`` forward and the same number of gradient bytes back
over the link between the two stages' classes: ``X = 2 (B / b_{ab} + \ell_{ab})``.
``comm`` says how that time counts:

* ``"none"`` -- not at all (PipeDream's default);
* ``"overlap"`` -- links are resources of their own running alongside compute (PipeDream with
  ``--activation_compression_ratio 1``): each boundary adds the terms ``X / r_b`` (received
  by the downstream stage's replicas) and ``X / r_a`` (sent by the upstream stage's replicas;
  not for the first stage, which PipeDream charges only at the receiver);
* ``"sender"`` -- the upstream stage's devices send and receive, and are busy meanwhile:
  ``t_a + X / r_a`` is its time.

The step time of the steady pipeline (the bottleneck) is the largest stage time or link term.
Memory of a stage on a device of class ``c``: ``P * (m if stash_weights else 1) + m * A``
with ``A`` the stage's activation bytes and ``m = ceil(devices from this stage to the end /
r_s)`` minibatches in flight (PipeDream's 1F1B count), or ``m = 1`` with ``in_flight="one"``;
it must not exceed the class's memory.

Dynamic program (exact for this model on the given cuts)
------------------------------------------------------
Devices are grouped into classes of identical devices (speed, memory, group); the program
counts how many devices of each class the stages after a cut use, not which ones. Over the
cuts in decreasing order, ``F[k, n, t]`` is the smallest bottleneck of the stages after cut
``k`` when they use ``n`` (a vector of per-class counts) and the first of them runs on slot
``t = (class, replicas)``; knowing ``n`` gives the minibatches in flight, knowing ``t`` the
link and replica terms of the boundary at ``k``. With ``K = prod_c (n_c + 1)`` count
vectors, ``T = sum_c n_c`` slots (``C`` without replication), ``S`` cuts and ``Q`` nested
pairs of cuts (``Q <= S^2 / 2``), the cost is ``O(Q K T + S K T^2)`` time (``Q K T C`` with
``comm="sender"``) and ``O(S K T)`` memory: polynomial in the number of devices for a fixed
number of classes (``K <= (D / C + 1)^C``). Fully distinct devices (every device its own
class) make ``K = 2^D``: the exact subset search, refused past ``max_count_vectors``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gnnweave.host.stagecuts import CutSpace

INF = math.inf
COMM_MODELS = ("none", "overlap", "sender")


class InfeasibleStagesError(ValueError):
    """No plan meets the memory limits (or uses exactly the devices asked for)."""


class PlanSizeError(ValueError):
    """The device classes make too many count vectors for the dynamic program."""


@dataclass
class DeviceClass:
    """``count`` identical devices: ``speed`` divides the profiled times; ``group`` names
    the part of a two-level topology they sit in; ``names`` the devices (default
    ``name:0`` ...)."""

    name: str
    count: int = 1
    speed: float = 1.0
    memory_bytes: float = INF
    group: str = ""
    names: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"device class {self.name!r}: count={self.count} must be >= 1")
        if not self.speed > 0 or not self.memory_bytes > 0:
            raise ValueError(f"device class {self.name!r}: speed and memory must be > 0")
        if not self.names:
            self.names = [self.name] if self.count == 1 else [f"{self.name}:{i}" for i in range(self.count)]
        if len(self.names) != self.count:
            raise ValueError(f"device class {self.name!r}: {len(self.names)} names for "
                             f"{self.count} devices")


@dataclass
class Links:
    """Bandwidth (bytes/s) and latency (s) between device classes, ``[C, C]``; the
    diagonal is the link between two devices of one class (replicas, consecutive stages)."""

    bandwidth: np.ndarray
    latency_s: np.ndarray

    @classmethod
    def uniform(cls, num_classes: int, bandwidth: float, latency_s: float = 0.0) -> "Links":
        return cls(np.full((num_classes, num_classes), float(bandwidth)),
                   np.full((num_classes, num_classes), float(latency_s)))

    @classmethod
    def two_level(cls, classes: list[DeviceClass], bandwidth: float, latency_s: float,
                  inter_bandwidth: float, inter_latency_s: float) -> "Links":
        """Classes in one group talk over ``bandwidth``/``latency_s``, classes in different
        groups over the slow inter-group link."""
        g = np.array([c.group for c in classes])
        same = g[:, None] == g[None, :]
        return cls(np.where(same, float(bandwidth), float(inter_bandwidth)),
                   np.where(same, float(latency_s), float(inter_latency_s)))


@dataclass
class StageProblem:
    """A planning problem; ``compute_s`` [N, C] defaults to the profile's milliseconds
    divided by each class's speed."""

    cuts: CutSpace
    classes: list[DeviceClass]
    links: Links
    comm: str = "none"
    replicate: bool = True
    use_all_devices: bool = False
    in_flight: str = "1f1b"
    stash_weights: bool = False
    compute_s: np.ndarray | None = None
    max_count_vectors: int = 1 << 14

    def __post_init__(self):
        C = len(self.classes)
        if C < 1:
            raise ValueError("classes: give at least one device class")
        if self.comm not in COMM_MODELS:
            raise ValueError(f"comm={self.comm!r}: choose one of {', '.join(COMM_MODELS)}")
        if self.in_flight not in ("1f1b", "one"):
            raise ValueError(f"in_flight={self.in_flight!r}: choose '1f1b' or 'one'")
        names = [n for c in self.classes for n in c.names]
        if len(set(names)) != len(names):
            raise ValueError(f"devices: names repeat in {names}")
        for nm in ("bandwidth", "latency_s"):
            arr = np.asarray(getattr(self.links, nm), dtype=np.float64)
            if arr.shape != (C, C):
                raise ValueError(f"links.{nm}: shape {arr.shape}, expected ({C}, {C})")
            setattr(self.links, nm, arr)
        if not (self.links.bandwidth > 0).all():
            raise ValueError(f"links.bandwidth: {self.links.bandwidth.min()} must be > 0")
        if not (self.links.latency_s >= 0).all():
            raise ValueError(f"links.latency_s: {self.links.latency_s.min()} must be >= 0")
        N = len(self.cuts.layers)
        if self.compute_s is None:
            speed = np.array([c.speed for c in self.classes])
            self.compute_s = self.cuts.layer_compute_ms[:, None] * 1e-3 / speed[None, :]
        self.compute_s = np.asarray(self.compute_s, dtype=np.float64)
        if self.compute_s.shape != (N, C):
            raise ValueError(f"compute_s: shape {self.compute_s.shape}, expected ({N}, {C})")
        if np.isnan(self.compute_s).any() or (self.compute_s < 0).any():
            raise ValueError("compute_s: every entry must be >= 0")

    @property
    def counts(self) -> list[int]:
        return [c.count for c in self.classes]

    def slots(self) -> list[tuple[int, int]]:
        """(class, replicas) pairs a stage may use."""
        return [(c, r) for c, cl in enumerate(self.classes)
                for r in range(1, (cl.count if self.replicate else 1) + 1)]

    # per-stage terms, shared by the optimiser and the plain evaluator
    def allreduce_s(self, params: float | np.ndarray, c: int, r: int):
        if r == 1:
            return 0.0 * params
        return (4.0 * (r - 1) / r * params / self.links.bandwidth[c, c]
                + 2.0 * (r - 1) * self.links.latency_s[c, c])

    def link_s(self, cut: int, a: int, b: int) -> float:
        return 2.0 * (self.cuts.out_bytes[cut] / self.links.bandwidth[a, b]
                      + self.links.latency_s[a, b])


@dataclass
class PlannedStage:
    first_cut: int
    last_cut: int
    layers: list[str]
    device_class: str
    devices: list[str]
    replicas: int
    compute_s: float         # forward + backward of one minibatch on one device
    allreduce_s: float
    comm_s: float            # link terms charged to this stage (see the model)
    time_s: float            # what this stage contributes to the maximum
    memory_bytes: float


@dataclass
class StagePlan:
    stages: list[PlannedStage]
    bottleneck_s: float
    bottleneck: str
    comm: str
    cuts: str
    replicate: bool

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return {"stages": [asdict(s) for s in self.stages], "bottleneck_s": self.bottleneck_s,
                "bottleneck": self.bottleneck, "stage_times_s": [s.time_s for s in self.stages],
                "model": {"comm": self.comm, "cuts": self.cuts, "replicate": self.replicate}}


def evaluate_stages(problem: StageProblem, plan: list[tuple[int, int, int]],
                    total_devices: int | None = None) -> StagePlan:
    """Score ``[(cut_before, cut_after, slot), ...]`` (slots of :meth:`StageProblem.slots`)
    under the model of this module with plain loops: the reference the optimiser is
    checked against. Raises :class:`InfeasibleStagesError` when a rule or limit is broken."""
    cuts, slots = problem.cuts, problem.slots()
    S = len(cuts)
    if not plan or plan[0][0] != 0 or plan[-1][1] != S - 1:
        raise InfeasibleStagesError(f"stages must run from the empty cut to cut {S - 1}: {plan}")
    used = [0] * len(problem.classes)
    for i, (k, j, t) in enumerate(plan):
        if i and plan[i - 1][1] != k:
            raise InfeasibleStagesError(f"stage {i} does not start where stage {i - 1} ends")
        if not cuts.may_follow[k, j]:
            raise InfeasibleStagesError(f"stage {i}: cut {j} may not follow cut {k}")
        used[slots[t][0]] += slots[t][1]
    for c, cl in enumerate(problem.classes):
        if used[c] > cl.count or (problem.use_all_devices and used[c] != cl.count):
            raise InfeasibleStagesError(f"class {cl.name}: plan uses {used[c]} of {cl.count}")
    out: list[PlannedStage] = []
    downstream = sum(slots[t][1] for _, _, t in plan) if total_devices is None else total_devices
    pools = {c: list(cl.names) for c, cl in enumerate(problem.classes)}
    worst, what = -1.0, ""
    for i, (k, j, t) in enumerate(plan):
        c, r = slots[t]
        layers = np.flatnonzero(cuts.members[j] & ~cuts.members[k])
        comp = sum(problem.compute_s[l, c] for l in layers)
        par = sum(cuts.layer_parameter_bytes[l] for l in layers)
        act = sum(cuts.layer_activation_bytes[l] for l in layers)
        ar = problem.allreduce_s(par, c, r)
        terms = [((comp + ar) / r, "compute")]
        comm = 0.0
        if i + 1 < len(plan):
            nc, nr = slots[plan[i + 1][2]]
            x = problem.link_s(j, c, nc)
            if problem.comm == "sender":
                comm = x / r
                terms = [((comp + ar) / r + comm, "compute + send")]
            elif problem.comm == "overlap" and i > 0:
                terms.append((x / r, "send"))
                comm = max(comm, x / r)
        if i > 0 and problem.comm == "overlap":
            pc = slots[plan[i - 1][2]][0]
            x = problem.link_s(k, pc, c)
            terms.append((x / r, "receive"))
            comm = max(comm, x / r)
        m = -(-downstream // r) if problem.in_flight == "1f1b" else 1
        mem = par * (m if problem.stash_weights else 1) + m * act
        if mem > problem.classes[c].memory_bytes:
            raise InfeasibleStagesError(
                f"stage {i} needs {mem:.4g} B per device of {problem.classes[c].name}, "
                f"which has {problem.classes[c].memory_bytes:.4g} B")
        downstream -= r
        devs, pools[c] = pools[c][:r], pools[c][r:]
        time = max(v for v, _ in terms)
        for v, name in terms:
            if v > worst:
                worst, what = v, f"stage {i} ({name})"
        out.append(PlannedStage(k, j, [cuts.layers[l] for l in layers], problem.classes[c].name,
                                devs, r, float(comp), float(ar), float(comm), float(time),
                                float(mem)))
    return StagePlan(out, float(worst), what, problem.comm, cuts.kind, problem.replicate)


def _count_vectors(counts: list[int], limit: int):
    K = 1
    for n in counts:
        K *= n + 1
    if K > limit:
        raise PlanSizeError(f"{len(counts)} device classes with counts {counts} make {K} count "
                            f"vectors (limit {limit}): group identical devices into classes "
                            f"(same speed, memory and group)")
    strides = np.cumprod([1] + [n + 1 for n in counts[:-1]])
    idx = np.arange(K)
    vec = np.stack([(idx // s) % (n + 1) for s, n in zip(strides, counts)], axis=1)
    return K, vec, strides


def plan_stages(problem: StageProblem) -> StagePlan:
    """The optimal plan under the model of this module (dynamic program, module docstring)."""
    cuts, slots = problem.cuts, problem.slots()
    S, C, T = len(cuts), len(problem.classes), len(slots)
    K, vec, strides = _count_vectors(problem.counts, problem.max_count_vectors)
    tot = vec.sum(axis=1)
    sc = np.array([c for c, _ in slots])
    sr = np.array([r for _, r in slots], dtype=np.float64)
    # shift[t][n] = index of n minus slot t's devices, -1 when n has too few
    shift = np.full((T, K), -1, dtype=np.int64)
    for t, (c, r) in enumerate(slots):
        ok = vec[:, c] >= r
        shift[t, ok] = np.arange(K)[ok] - r * strides[c]
    valid_shift = shift >= 0
    safe_shift = np.where(valid_shift, shift, 0)
    pre_c = cuts.members.astype(np.float64) @ problem.compute_s          # [S, C]
    pre_p, pre_a = cuts.parameter_bytes, cuts.activation_bytes
    bw, lat = problem.links.bandwidth, problem.links.latency_s
    mem_lim = np.array([cl.memory_bytes for cl in problem.classes])[sc]   # [T]
    check_mem = np.isfinite(mem_lim).any()
    inflight = (np.ceil(tot[:, None] / sr[None, :]) if problem.in_flight == "1f1b"
                else np.ones((K, T)))                                      # [K, T]
    inflight_max = inflight.max(axis=0)                                    # [T]
    ar_bw = np.array([bw[c, c] for c, _ in slots])
    ar_lat = np.array([lat[c, c] for c, _ in slots])
    x_rt = 1.0 / sr
    sender = problem.comm == "sender"
    # per cut k: what the stages after k offer the stage that ends at k, already shifted to
    # the count vector n of that stage and its successors ([K, T]; sender: [K, C] unshifted)
    store = _AfterStore(S, K, T, C, sender)
    store.put(S - 1, _after(problem, S - 1, None, sc, sr, K, S), safe_shift, valid_shift)
    arg_k = np.full((S, K, T), -1, dtype=np.int32)
    arg_t = np.full((S, K, T), -1, dtype=np.int16)
    nn, tt = np.arange(K)[:, None], np.arange(T)[None, :]
    final = None
    for j in range(S - 2, -1, -1):
        ks = np.flatnonzero(cuts.may_follow[j])
        if ks.size == 0:
            continue
        comp = pre_c[ks][:, sc] - pre_c[j][None, sc]                            # [Q, T]
        par = pre_p[ks] - pre_p[j]                                               # [Q]
        own = (comp + np.where(sr > 1, 4.0 * (sr - 1) / sr * par[:, None] / ar_bw
                               + 2.0 * (sr - 1) * ar_lat, 0.0)) * x_rt           # [Q, T]
        if sender:
            xs = (2.0 * (cuts.out_bytes[ks][:, None, None] / bw[sc][None]
                         + lat[sc][None]) * x_rt[None, :, None])                 # [Q, T, C]
            xs[ks == S - 1] = 0.0
            Hs = np.where(valid_shift.T[None, ..., None], store.by_class[ks][:, safe_shift.T],
                          INF)                                                   # [Q, K, T, C]
            val = np.maximum(own[:, None, :, None] + xs[:, None], Hs)
            cb = np.argmin(val, axis=3)                                          # [Q, K, T]
            cand = np.take_along_axis(val, cb[..., None], axis=3)[..., 0]
        else:
            cand = np.maximum(own[:, None, :], (store.first if j == 0 else store.best)[ks])
        if check_mem:
            act = pre_a[ks] - pre_a[j]
            # the most minibatches in flight first: the full [Q, K, T] test only if needed
            hi = inflight_max if problem.stash_weights else 1.0
            if (par[:, None] * hi + act[:, None] * inflight_max > mem_lim).any():
                wmul = inflight if problem.stash_weights else 1.0
                need = par[:, None, None] * wmul + act[:, None, None] * inflight[None]
                cand = np.where(need <= mem_lim[None, None, :], cand, INF)
        q = np.argmin(cand, axis=0)                                              # [K, T]
        Fj = np.take_along_axis(cand, q[None], axis=0)[0]
        kk = ks[q]
        arg_k[j] = kk
        if sender:
            cbq = np.take_along_axis(cb, q[None], axis=0)[0]
            arg_t[j] = store.by_class_slot[kk, safe_shift.T, cbq]
        else:
            arg_t[j] = (store.first_slot if j == 0 else store.best_slot)[kk, nn, tt]
        if j == 0:
            final = Fj
        else:
            store.put(j, _after(problem, j, Fj, sc, sr, K, S), safe_shift, valid_shift)
    if final is None:
        raise InfeasibleStagesError(f"{cuts.name}: no stage may start at the empty cut")
    if problem.use_all_devices:
        n_idx = np.array([K - 1])
    else:
        n_idx = np.arange(K)
    sub = final[n_idx]
    if not np.isfinite(sub).any():
        raise InfeasibleStagesError(_why_infeasible(problem))
    n0, t0 = np.unravel_index(int(np.argmin(sub)), sub.shape)
    n0 = int(n_idx[n0])
    plan, j, n, t = [], 0, n0, int(t0)
    while True:
        k = int(arg_k[j, n, t])
        plan.append((j, k, t))
        if k == S - 1:
            break
        t_next = int(arg_t[j, n, t])
        n = int(shift[t, n])
        j, t = k, t_next
    result = evaluate_stages(problem, plan, total_devices=int(tot[n0]))
    if not math.isclose(result.bottleneck_s, float(sub.min()), rel_tol=1e-9, abs_tol=1e-15):
        raise AssertionError(f"planner: the plan scores {result.bottleneck_s}, the dynamic "
                             f"program claimed {float(sub.min())}")
    return result


@dataclass
class _After:
    """The best of the stages after a cut, seen from the stage that ends there: ``best[n,
    t_a]`` (link terms of the boundary included) and ``first`` (when that stage is the first
    one), with the next stage's slot; for ``comm="sender"`` ``by_class[n, c_b]`` (next stage
    on class ``c_b``, link not included: it adds to the sender) and its best slot."""

    best: np.ndarray | None = None
    best_slot: np.ndarray | None = None
    first: np.ndarray | None = None
    first_slot: np.ndarray | None = None
    by_class: np.ndarray | None = None
    by_class_slot: np.ndarray | None = None


class _AfterStore:
    """:class:`_After` of every cut, shifted by each slot's devices (none/overlap)."""

    def __init__(self, S, K, T, C, sender):
        if sender:
            self.by_class = np.full((S, K, C), INF)
            self.by_class_slot = np.full((S, K, C), -1, dtype=np.int16)
        else:
            self.best = np.full((S, K, T), INF)
            self.best_slot = np.full((S, K, T), -1, dtype=np.int16)
            self.first, self.first_slot = self.best, self.best_slot
        self.sender = sender
        self.separate_first = False

    def put(self, k, after: _After, safe_shift, valid_shift):
        if self.sender:
            self.by_class[k], self.by_class_slot[k] = after.by_class, after.by_class_slot
            return
        T = safe_shift.shape[0]
        tt = np.arange(T)[None, :]
        idx = safe_shift.T
        if after.first is not after.best and not self.separate_first:
            self.first, self.first_slot = self.best.copy(), self.best_slot.copy()
            self.separate_first = True
        self.best[k] = np.where(valid_shift.T, after.best[idx, tt], INF)
        self.best_slot[k] = after.best_slot[idx, tt]
        if self.separate_first:
            self.first[k] = np.where(valid_shift.T, after.first[idx, tt], INF)
            self.first_slot[k] = after.first_slot[idx, tt]


def _after(problem, k, Fk, sc, sr, K, S) -> _After:
    T, C = len(sc), len(problem.classes)
    if k == S - 1:   # nothing after the whole graph: only n = 0, no link terms
        H = np.full((K, T), INF)
        H[0] = 0.0
        none = np.full((K, T), -1, dtype=np.int16)
        Hc = np.full((K, C), INF)
        Hc[0] = 0.0
        return _After(H, none, H, none, Hc, np.full((K, C), -1, dtype=np.int16))
    rows = np.arange(K)
    if problem.comm == "sender":
        Hc = np.full((K, C), INF)
        slot = np.full((K, C), -1, dtype=np.int16)
        for c in range(C):
            ts = np.flatnonzero(sc == c)
            a = np.argmin(Fk[:, ts], axis=1)
            Hc[:, c] = Fk[rows, ts[a]]
            slot[:, c] = ts[a]
        return _After(by_class=Hc, by_class_slot=slot)
    if problem.comm == "none":
        a = np.argmin(Fk, axis=1)
        H = np.repeat(Fk[rows, a][:, None], T, axis=1)
        arg = np.repeat(a[:, None].astype(np.int16), T, axis=1)
        return _After(H, arg, H, arg)
    # overlap: boundary k costs X(c_a, c_b) / r_b at the receiver, / r_a at the sender
    cuts, bw, lat = problem.cuts, problem.links.bandwidth, problem.links.latency_s
    X = 2.0 * (cuts.out_bytes[k] / bw[np.ix_(sc, sc)] + lat[np.ix_(sc, sc)])   # [T_a, T_b]
    recv = X / sr[None, :]
    out = []
    for term in (np.maximum(recv, X / sr[:, None]), recv):
        val = np.maximum(Fk[:, None, :], term[None])                            # [K, T_a, T_b]
        a = np.argmin(val, axis=2)
        out.append((np.take_along_axis(val, a[..., None], axis=2)[..., 0], a.astype(np.int16)))
    (H, Ha), (H1, H1a) = out
    return _After(H, Ha, H1, H1a)


def _why_infeasible(problem: StageProblem) -> str:
    cuts = problem.cuts
    layer_need = cuts.layer_parameter_bytes + cuts.layer_activation_bytes
    biggest = float(layer_need.max()) if layer_need.size else 0.0
    mem = max(cl.memory_bytes for cl in problem.classes)
    extra = " using every device exactly" if problem.use_all_devices else ""
    return (f"no plan of {cuts.name} fits{extra}: the largest layer needs {biggest:.4g} B "
            f"(weights + one activation), the largest device memory is {mem:.4g} B")


def simulate_stages(problem: StageProblem, plan: StagePlan, minibatches: int = 0) -> dict:
    """Push minibatches through the plan's resources one at a time and measure the period.

    Each replica of a stage is a server that takes ``compute + all-reduce`` per minibatch it
    receives (minibatches go round-robin over the replicas), plus, with ``comm="sender"``,
    the transfer to the next stage; with ``comm="overlap"`` every replica also has a receive
    and a send link of its own (the first stage's send is charged at the receiver only, as
    in the model). A minibatch enters a resource when it has left the previous one and the
    resource is free. Returns the steady period (seconds between finished minibatches over
    the second half of the run) and each stage's measured busy time per minibatch, to be
    compared with ``plan.bottleneck_s`` and the stages' ``time_s``. Forward and backward are
    one task per stage here (their sum), as in the model.
    """
    slots = {(cl.name): c for c, cl in enumerate(problem.classes)}
    stages = plan.stages
    S = len(stages)
    lcm = 1
    for st in stages:
        lcm = lcm * st.replicas // math.gcd(lcm, st.replicas)
    M = minibatches or 2 * lcm * max(50, 4000 // lcm)
    comp_free = [[0.0] * st.replicas for st in stages]
    recv_free = [[0.0] * st.replicas for st in stages]
    send_free = [[0.0] * st.replicas for st in stages]
    busy = [0.0] * S
    xs = []
    for i in range(S - 1):
        a, b = slots[stages[i].device_class], slots[stages[i + 1].device_class]
        xs.append(problem.link_s(stages[i].last_cut, a, b))
    done = []
    half = M // 2
    for m in range(M):
        t = 0.0
        for i, st in enumerate(stages):
            q = m % st.replicas
            if problem.comm == "overlap" and i > 0:
                t = max(t, recv_free[i][q]) + xs[i - 1]
                recv_free[i][q] = t
            service = st.compute_s + st.allreduce_s
            if problem.comm == "sender" and i < S - 1:
                service += xs[i]
            t = max(t, comp_free[i][q]) + service
            comp_free[i][q] = t
            if m >= half:
                busy[i] += service / st.replicas
            if problem.comm == "overlap" and 0 < i < S - 1:
                t = max(t, send_free[i][q]) + xs[i]
                send_free[i][q] = t
        done.append(t)
    # replicas finish out of order: the period between the k-th and the last finish
    done.sort()
    window = M - 1 - half
    return {"period_s": (done[-1] - done[half]) / window, "minibatches": M,
            "stage_busy_s": [b / (M - half) for b in busy]}
