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
cuts from the last, ``F[k, n, t]`` is the smallest bottleneck of the stages after cut
``k`` when they use ``n`` (a vector of per-class counts) and the first of them runs on slot
``t = (class, replicas)``; knowing ``n`` gives the minibatches in flight, knowing ``t`` the
link and replica terms of the boundary at ``k``. With ``K = prod_c (n_c + 1)`` count
vectors, ``T = sum_c n_c`` slots (``C`` without replication), ``S`` cuts and ``Q`` nested
pairs of cuts (``Q <= S^2 / 2``), the cost is ``O(Q K T + S K T^2)`` time (``Q K T C`` with
``comm="sender"``) and ``O(S K T)`` memory: polynomial in the number of devices for a fixed
number of classes (``K <= (D / C + 1)^C``). Fully distinct devices (every device its own
class) make ``K = 2^D``: the exact subset search, refused past ``max_count_vectors``.

Bound and relaxation (what :func:`plan_stages` runs; same optimum, far fewer states)
----------------------------------------------------------------------------------
Under a bound ``B`` on the bottleneck a stage on slot ``t`` must take ``<= B``; with ``s_c``
the least speed-up of class ``c`` over the slowest on every layer, its *capacity*
``r s_c`` ignores the device counts. ``need_after[j]`` (``need_before[j]``), the least
capacity sum of stages of time ``<= B`` covering the layers after (before) cut ``j``, are
shortest paths over the ``Q`` pairs (Dijkstra, ``O(Q T + Q log S)``; on a chain of cuts a
stage's time grows with its end, so each cut's reachable ends are a binary search and the
paths one pass, ``O(S T log S)``, with no pair table). Any plan of bottleneck ``<= B`` has
``need_after[j] <= cap(n) <= cap(N) - need_before[j]`` at each of its cuts, and each of its
stages has ``need_before[j] + r s_c + need_after[k] <= cap(N)``: the program visits only
those count vectors and (pair, slot)s, joins each pair with the count vectors open after
its end whose capacity falls in the window (a range of capacity ranks; ragged, no padding)
and keeps the best per state by a scatter-minimum, so its cost is ``O(E)`` for the
``E <= Q K T`` candidates inside the window. When devices may
stay unused, a count vector after a cut that one with fewer devices of every class matches
is dropped too (pairwise among the open ones, or ``O(S K T C)`` over the grid). The cuts are
solved a level at a time (the most stages a chain from the cut to the last can have; no cut
follows another of its level), which pays numpy's per-call cost per level, not per cut.
``B`` starts at
the smallest bound the relaxation accepts (bisected to 0.5 % from the lower bound
``max(work / cap(N), costliest layer alone)``) and grows by 1 %, 2 %, 4 % ... until a plan is
found; that plan is optimal, since the optimal plan lies inside the window of every bound
at least its bottleneck. ``plan_stages(..., prune=False)`` runs the full program.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gnnweave.errors import InputError
from gnnweave.host.stagecuts import CutSpace

INF = math.inf
COMM_MODELS = ("none", "overlap", "sender")


class InfeasibleStagesError(InputError):
    """No plan meets the memory limits (or uses exactly the devices asked for)."""


class PlanSizeError(InputError):
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


def plan_stages(problem: StageProblem, *, prune: bool = True) -> StagePlan:
    """The optimal plan under the model of this module (dynamic program, module docstring).

    ``prune`` (default) runs the program under a bound ``B`` on the bottleneck: states and
    stages that no plan of bottleneck ``<= B`` can use are skipped, and ``B`` grows from a
    lower bound until a plan is found, which is then optimal (every state of an optimal plan
    lies inside the bound's window). ``prune=False`` runs the full program once.
    """
    dp = _Program(problem)
    if not prune:
        return dp.solve(INF) or dp.infeasible()
    bound = dp.first_bound()
    growth = FIRST_SLACK
    while True:
        plan = dp.solve(bound)
        if plan is not None:
            return plan
        if bound == INF:
            return dp.infeasible()
        bound = bound * (1.0 + growth) if bound * (1.0 + growth) < dp.upper_bound() else INF
        growth *= 2.0


FIRST_SLACK = 0.01     # bounds grow by 1 %, 2 %, 4 % ... of the last until a plan is found
RELAXED_PRECISION = 0.005   # the relaxation's smallest bound is bracketed to 0.5 %
DOMINANCE_BEFORE_LINKS = 64   # a level's F is pruned before its link terms past this many
                              # open (cut, count vector)s


class _Program:
    """The tables of the dynamic program that do not depend on the bound."""

    def __init__(self, problem: StageProblem):
        self.problem = p = problem
        cuts, slots = p.cuts, p.slots()
        self.slots = slots
        self.S, self.C, self.T = len(cuts), len(p.classes), len(slots)
        self.K, self.vec, strides = _count_vectors(p.counts, p.max_count_vectors)
        K, T = self.K, self.T
        self.tot = self.vec.sum(axis=1)
        self.grid_shape = tuple(n + 1 for n in reversed(p.counts))   # K as a C-order grid
        self.sc = np.array([c for c, _ in slots])
        self.sr = np.array([r for _, r in slots], dtype=np.float64)
        # shift[t, n] = index of n minus slot t's devices, -1 when n has too few
        shift = np.full((T, K), -1, dtype=np.int64)
        for t, (c, r) in enumerate(slots):
            ok = self.vec[:, c] >= r
            shift[t, ok] = np.arange(K)[ok] - r * strides[c]
        self.shift = shift
        self.valid_shift = shift >= 0
        self.safe_shift = np.where(self.valid_shift, shift, 0)
        # grow[t, m] = index of m plus slot t's devices, -1 past the class's count
        grow = np.full((T, K), -1, dtype=np.int64)
        for t in range(T):
            ok = self.valid_shift[t]
            grow[t, shift[t, ok]] = np.arange(K)[ok]
        self.grow = grow
        self.pre_c = cuts.members.astype(np.float64) @ p.compute_s                # [S, C]
        self.mem_lim = np.array([cl.memory_bytes for cl in p.classes])[self.sc]    # [T]
        self.check_mem = bool(np.isfinite(self.mem_lim).any())
        self.inflight = (np.ceil(self.tot[:, None] / self.sr[None, :]) if p.in_flight == "1f1b"
                         else np.ones((K, T)))                                      # [K, T]
        bw, lat = p.links.bandwidth, p.links.latency_s
        r = self.sr
        self.ar_coef = np.where(r > 1, 4.0 * (r - 1) / r / bw[self.sc, self.sc], 0.0)   # [T]
        self.ar_const = np.where(r > 1, 2.0 * (r - 1) * lat[self.sc, self.sc], 0.0)
        self.bw_tt = bw[np.ix_(self.sc, self.sc)]                                     # [T, T]
        self.lat_tt = lat[np.ix_(self.sc, self.sc)]
        self._capacity()
        # a chain of cuts (each a prefix of the next): a stage's time grows with its end, so
        # the stages from a cut under a bound end in a range, and no pair table is needed
        self.chain = bool(cuts.kind == "chain" and np.array_equal(
            cuts.may_follow, np.triu(np.ones((self.S, self.S), dtype=bool), 1)))
        if self.chain:
            self._chain_tables()
        else:
            self._pairs()
        self.level_of, self.level_order = self._levels()

    def _capacity(self):
        """Work ``u_l`` (seconds on the slowest class) and each class's speed-up ``s_c`` on it
        (``compute_s[l, c] >= u_l / s_c``): a suffix of work ``R`` needs ``R <= B sum_c n_c
        s_c`` under bound ``B``, since each stage's time is at least its work / (r s_c)."""
        comp = self.problem.compute_s
        u = comp.max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(u[:, None] > 0, u[:, None] / comp, 0.0)
        speedup = ratio.max(axis=0) if ratio.size else np.zeros(self.C)
        self.windowed = bool(np.isfinite(speedup).all() and u.sum() > 0)
        self.work_total = float(u.sum())
        self.speedup = np.where(np.isfinite(speedup), speedup, 0.0)
        self.cap = self.vec @ self.speedup                                          # [K]
        self.cap_all = float(self.cap[-1])
        order = np.argsort(self.cap, kind="stable")
        self.cap_by_rank = self.cap[order]
        self.cap_rank = np.empty(self.K, dtype=np.int64)
        self.cap_rank[order] = np.arange(self.K)
        self.by_cap_rank = order

    def lower_bound(self) -> float:
        """No plan beats all work spread over every device, nor its costliest layer alone
        on the best (class, replicas)."""
        p = self.problem
        single = ((p.compute_s[:, self.sc] + self.ar_coef * p.cuts.layer_parameter_bytes[:, None]
                   + self.ar_const) / self.sr)                                      # [N, T]
        layer = float(single.min(axis=1).max()) if single.size else 0.0
        spread = self.work_total / self.cap_all if self.windowed and self.cap_all > 0 else 0.0
        return max(layer, spread)

    def upper_bound(self) -> float:
        """Above this every term of every plan fits: no pruning left to gain."""
        p = self.problem
        bw_min, lat_max = p.links.bandwidth.min(), p.links.latency_s.max()
        n = sum(p.counts)
        stage = (p.compute_s.max(axis=1).sum() + 4.0 * p.cuts.layer_parameter_bytes.sum() / bw_min
                 + 2.0 * n * lat_max)
        link = 2.0 * (p.cuts.out_bytes.max() / bw_min + lat_max)
        return float(stage + link) * 2.0

    def _pairs(self):
        """Every (cut, later cut) pair with its stage's time on each slot, rounded down to
        float32 for the relaxation (which may only err towards keeping a pair); a stage
        that does not fit one minibatch on a slot's device is out."""
        cuts = self.problem.cuts
        pj, pk = np.nonzero(cuts.may_follow)
        self.pair_j, self.pair_k = pj, pk
        self.row_start = np.searchsorted(pj, np.arange(self.S + 1))
        self.by_col = np.argsort(pk, kind="stable")
        self.col_start = np.searchsorted(pk[self.by_col], np.arange(self.S + 1))
        self.slot_cap = self.sr * self.speedup[self.sc]                              # [T]
        cap32 = self.slot_cap.astype(np.float32)   # rounded down: needs never overstated
        over = cap32 > self.slot_cap
        cap32[over] = np.nextafter(cap32[over], np.float32(0))
        # columns: slots by increasing capacity, so that under a bound the least capacity on
        # which a pair's stage fits is that of its first fitting column
        self.cap_order = o = np.argsort(cap32, kind="stable")
        self.cap_sorted = np.append(cap32[o], np.float32(INF))
        sc, sr, const, mem = self.sc[o], self.sr[o], self.ar_const[o], self.mem_lim[o]
        # stage time on column t = (Y[k, t] - Y[j, t] + const[t]) / sr[t]
        Y = self.pre_c[:, sc] + self.ar_coef[o] * cuts.parameter_bytes[:, None]      # [S, T]
        need_mem = cuts.parameter_bytes + cuts.activation_bytes
        self.pair_own32 = own32 = np.empty((pj.size, self.T), dtype=np.float32)
        # [T, pairs]: the least time over the columns so far; under a bound the columns a
        # stage does not fit on are those where it is still above
        self.pair_low32 = low = np.empty((self.T, pj.size), dtype=np.float32)
        for a in range(0, pj.size, 1 << 16):
            j, k = pj[a:a + (1 << 16)], pk[a:a + (1 << 16)]
            own = Y[k]
            own *= 1.0 - 1e-13   # below the rounding of Y's sums (solve() sums otherwise)
            own -= Y[j]
            own += const
            own /= sr
            own[(need_mem[k] - need_mem[j])[:, None] > mem * (1.0 + 1e-12)] = INF
            own *= 1.0 - 1e-7    # float32 rounds to nearest: stay below (own < 0: a ~0 stage)
            own32[a:a + (1 << 16)] = own
            block = low[:, a:a + (1 << 16)]
            block[...] = own32[a:a + (1 << 16)].T
            for t in range(1, self.T):
                np.minimum(block[t - 1], block[t], out=block[t])

    def _levels(self) -> tuple[np.ndarray, np.ndarray]:
        """[S]: each cut's level (the most stages a chain from it to the last cut can have;
        no cut may follow another of its level, so each level is solved at once), and the
        cuts by level from the lowest. The empty cut comes alone, last; cuts no chain reaches
        the end from are left out."""
        S = self.S
        level = np.full(S, -1, dtype=np.int64)
        level[S - 1] = 0
        if self.chain:
            level[:S - 1] = np.arange(S - 1, 0, -1)
        else:
            for j in range(S - 2, -1, -1):
                ks = self.pair_k[self.row_start[j]:self.row_start[j + 1]]
                top = level[ks].max() if ks.size else -1
                level[j] = top + 1 if top >= 0 else -1
        level[0] = level.max() + 1
        order = np.argsort(level, kind="stable")
        return level, order[level[order] > 0]

    def _chain_tables(self):
        cuts = self.problem.cuts
        self.slot_cap = self.sr * self.speedup[self.sc]                              # [T]
        # stage time on slot t = (X[t, k] - X[t, j] + ar_const[t]) / r_t, X nondecreasing in k
        self.chain_x = (self.pre_c[:, self.sc] + self.ar_coef[None, :]
                        * cuts.parameter_bytes[:, None]).T                           # [T, S]
        self.chain_mem = cuts.parameter_bytes + cuts.activation_bytes                 # [S]

    def _far(self, bound: float) -> np.ndarray:
        """chain: [S, T] the last cut a stage from each cut may end at on each slot under
        ``bound`` (one minibatch in memory); ``<= j`` when none."""
        tol = min(bound, 1e300) * (1.0 + 2e-9)
        out = np.empty((self.T, self.S), dtype=np.int64)
        for t in range(self.T):
            x = self.chain_x[t]
            far = np.searchsorted(x, x + (tol * self.sr[t] - self.ar_const[t]), side="right")
            room = self.chain_mem + self.mem_lim[t] * (1.0 + 1e-12)
            out[t] = np.minimum(far, np.searchsorted(self.chain_mem, room, side="right")) - 1
        return out.T

    def _chain_relaxed(self, bound: float, before: bool):
        far = self._far(bound)
        S, cap = self.S, self.slot_cap
        valid = far > np.arange(S)[:, None]
        after = np.full(S, INF)
        after[-1] = 0.0
        for j in range(S - 2, -1, -1):
            v = valid[j]
            if v.any():
                after[j] = (cap[v] + after[far[j, v]]).min()
        after = np.minimum.accumulate(after)   # a later cut never needs more: keep it exact
        if not before:
            return after, None
        # the first cut whose stage on slot t reaches k (far is nondecreasing in the cut)
        near = np.stack([np.searchsorted(far[:, t], np.arange(S), side="left")
                         for t in range(self.T)], axis=1)                             # [S, T]
        ahead = np.full(S, INF)
        ahead[0] = 0.0
        for k in range(1, S):
            v = near[k] < k
            if v.any():
                ahead[k] = (ahead[near[k, v]] + cap[v]).min()
        ahead = np.minimum.accumulate(ahead[::-1])[::-1]
        return after, ahead

    def _need(self, bound: float) -> np.ndarray:
        """[pairs]: the least slot capacity (r s_c) on which each pair's stage fits ``bound``."""
        tol = np.float32(min(bound * (1.0 + 1e-9), 3e38))
        too_slow = np.zeros(self.pair_j.size, dtype=np.uint8 if self.T < 256 else np.int64)
        for low in self.pair_low32:
            too_slow += low > tol
        return self.cap_sorted[too_slow].astype(np.float64)

    def relaxed(self, bound: float, before: bool = True):
        """Capacity (sum of r s_c over the stages) that the cuts after / before each cut need
        under ``bound`` when device counts are ignored: ``[S]`` each (INF: none suffices),
        shortest paths over the pairs weighted by :meth:`_need`. A plan of bottleneck
        ``<= bound`` whose stages after cut ``j`` use ``n`` has ``need_after[j] <= cap(n)``
        and ``need_before[j] <= cap(N) - cap(n)``."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import dijkstra

        if self.chain:
            return self._chain_relaxed(bound, before)
        S = self.S
        if not hasattr(self, "_graphs"):   # the pairs as edges, both ways; weights per bound
            zeros = np.zeros(self.pair_j.size)
            self._graphs = (csr_matrix((zeros, self.pair_k, self.row_start), shape=(S, S)),
                            csr_matrix((zeros.copy(), self.pair_j[self.by_col], self.col_start),
                                       shape=(S, S)))
        ahead_g, after_g = self._graphs
        need = self._need(bound)            # INF: no edge
        after_g.data[:] = need[self.by_col]
        after = dijkstra(after_g, indices=S - 1)
        if not before:
            return after, None
        ahead_g.data[:] = need
        return after, dijkstra(ahead_g, indices=0)

    def relaxed_need(self, bound: float) -> float:
        """The capacity the whole model needs under ``bound`` (relaxation, INF: none)."""
        return float(self.relaxed(bound, before=False)[0][0])

    def first_bound(self) -> float:
        """The smallest bound the relaxation accepts, to :data:`RELAXED_PRECISION`: no plan
        has a smaller bottleneck than a bound it refuses. Capacity needed scales about as
        1 / bound, which the search uses for its next guess from below."""
        lo = self.lower_bound()
        if not (self.windowed and lo > 0):
            return INF
        room = self.cap_all * (1 + 1e-9)
        ceiling = self.upper_bound()
        hi = lo
        while True:
            need = self.relaxed_need(hi)
            if need <= room:
                break
            lo = hi
            grow = need / self.cap_all if math.isfinite(need) else 2.0
            hi = hi * min(max(grow, 1.0 + RELAXED_PRECISION), 2.0)
            if hi >= ceiling:
                return INF
        while hi > lo * (1.0 + RELAXED_PRECISION):
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if self.relaxed_need(mid) <= room else (mid, hi)
        return hi

    def window(self, bound: float):
        """[S, K]: count vectors the stages after each cut may use under ``bound``; [S, 2]:
        the capacity range of those (``win[j, n]`` only if ``cap(n)`` lies in row ``j``);
        and a function of a cut ``j`` giving the (next cut, slot) pairs a stage from it may
        use."""
        if bound == INF or not self.windowed:
            every = np.tile([-INF, INF], (self.S, 1))
            return np.ones((self.S, self.K), dtype=bool), every, self._every_stage
        after, ahead = self.relaxed(bound)
        eps = 1e-9 * self.cap_all
        span = np.stack([after - eps, self.cap_all - ahead + eps], axis=1)
        win = ((self.cap[None, :] >= after[:, None] - eps)
               & (self.cap_all - self.cap[None, :] >= ahead[:, None] - eps))
        # a (pair, slot) is usable when the cuts before it, it and those after fit in cap(N)
        if self.chain:
            room = self.cap_all + eps - ahead[:, None] - self.slot_cap[None, :]        # [S, T]
            lo = np.searchsorted(-after, -room.ravel(), side="left").reshape(room.shape)
            lo = np.maximum(lo, np.arange(self.S)[:, None] + 1)
            far = self._far(bound)
            return win, span, lambda js: _ranges_from(js, lo[js], far[js])
        tol = np.float32(bound * (1.0 + 1e-9))
        room = self.cap_all + eps - ahead[self.pair_j] - after[self.pair_k]          # [pairs]
        usable = ((self.pair_own32 <= tol)         # columns in self.cap_order
                  & (room[:, None] >= self.slot_cap[self.cap_order]))

        def stages(js):
            q = _ranges(self.row_start[js], self.row_start[js + 1] - 1)[0]
            qi, tq = np.nonzero(usable[q])
            return self.pair_j[q[qi]], self.pair_k[q[qi]], self.cap_order[tq]

        return win, span, stages

    def _every_stage(self, js: np.ndarray):
        """Every (cut, next cut, slot) from the cuts ``js``."""
        if self.chain:
            return _ranges_from(js, np.repeat(js[:, None] + 1, self.T, axis=1),
                                np.full((js.size, self.T), self.S - 1))
        q = np.repeat(_ranges(self.row_start[js], self.row_start[js + 1] - 1)[0], self.T)
        return self.pair_j[q], self.pair_k[q], np.tile(np.arange(self.T), q.size // self.T)

    def infeasible(self):
        raise InfeasibleStagesError(_why_infeasible(self.problem))

    def solve(self, bound: float) -> StagePlan | None:
        """The best plan of bottleneck ``<= bound`` (None when there is none).

        Sparse over the cuts, a level at a time (cuts of one level never follow each other,
        so a level reads only the levels done before it): for cut ``j``, the (next cut ``k``,
        slot ``t``) pairs whose stage fits the bound, joined with the count vectors ``m``
        still open after ``k``, give the candidates of ``F[j, m + devices of t, t]``; the best
        per state is a scatter-minimum. ``after[k, m, t_a]``: the best of the stages after cut
        ``k`` using ``m`` devices, seen from the stage ending at ``k`` on slot ``t_a`` (link
        terms of the boundary included; ``comm="sender"``: by the next stage's class, the
        link added at the sender)."""
        p = self.problem
        S, K, T = self.S, self.K, self.T
        win, span, stages_from = self.window(bound)
        width = self.C if p.comm == "sender" else T
        ends_first = None
        if p.comm == "overlap":   # where the first stage may end
            ends_first = np.zeros(S, dtype=bool)
            ends_first[stages_from(np.zeros(1, dtype=np.int64))[1]] = True
        st = _SolveState(S, K, T, width, ends_first)
        st.below[S - 1, self.cap_rank[0] + 1:] = 1
        final = None
        order = self.level_order[win.any(axis=1)[self.level_order]]
        for js in np.split(order, np.flatnonzero(np.diff(self.level_of[order])) + 1):
            if js.size == 0:
                continue
            level = self._level(js, bound, span, stages_from, st)
            if level is None:
                continue
            F, li, mo = level
            if js[0] == 0:
                final = F[0]
                break
            self._close_level(js, F, li, mo, st)
        if final is None:
            return None
        return self._trace(final, st)

    def _level(self, js, bound, span, stages_from, st):
        """[L, K, T]: ``F`` of the cuts ``js`` (one level), best next cut and slot noted;
        and the (cut in level, count vector)s with a finite entry (None: no entry)."""
        p, cuts = self.problem, self.problem.cuts
        K, T = self.K, self.T
        tol = bound * (1.0 + 1e-9)
        jq, kq, tq = stages_from(js)
        par = cuts.parameter_bytes[kq] - cuts.parameter_bytes[jq]
        cq = self.sc[tq]
        own = ((self.pre_c[kq, cq] - self.pre_c[jq, cq] + self.ar_coef[tq] * par
                + self.ar_const[tq]) / self.sr[tq])                                   # [P]
        fits = (own <= tol) & st.alive[kq]
        if not fits.any():
            return None
        jq, kq, tq, own, par = jq[fits], kq[fits], tq[fits], own[fits], par[fits]
        # each pair joined with the open count vectors after its cut whose capacity, with
        # the slot's, lies in the window (a range of their capacity ranks; the margin only
        # keeps a few more)
        margin = 1e-7 * self.cap_all
        rank_lo = np.searchsorted(self.cap_by_rank, span[jq, 0] - self.slot_cap[tq] - margin)
        rank_hi = np.searchsorted(self.cap_by_rank, span[jq, 1] - self.slot_cap[tq] + margin,
                                  side="right")
        lo = st.below[kq, rank_lo]
        cnt = np.maximum(st.below[kq, rank_hi] - lo, 0)
        pi = np.repeat(np.arange(kq.size), cnt)
        if pi.size == 0:
            return None
        offs = np.arange(pi.size) + np.repeat(lo - (np.cumsum(cnt) - cnt), cnt)
        kk, tt = kq[pi], tq[pi]
        mm = st.rows[kk, offs]
        nn = self.grow[tt, mm]
        ok = nn >= 0
        if not ok.any():
            return None
        kk, tt, mm, nn, pi = kk[ok], tt[ok], mm[ok], nn[ok], pi[ok]
        jj, stage = jq[pi], own[pi]
        src, src_slot = (st.first, st.first_slot) if js[0] == 0 else (st.after, st.after_slot)
        kr = st.first_row[kk] if js[0] == 0 else kk           # rows of src
        if p.comm == "sender":
            x = (2.0 * (cuts.out_bytes[kk][:, None] / p.links.bandwidth[self.sc[tt]]
                        + p.links.latency_s[self.sc[tt]]) / self.sr[tt][:, None])      # [E, C]
            x[kk == self.S - 1] = 0.0
            both = np.maximum(stage[:, None] + x, src[kr, mm])
            cb = np.argmin(both, axis=1)
            val = both[np.arange(cb.size), cb]
            at = (kr * K + mm) * self.C + cb      # src_slot[kr, mm, cb], flat
        else:
            at = (kr * K + mm) * T + tt           # src[kr, mm, tt], flat
            val = np.maximum(stage, src.reshape(-1)[at])
        keep = val <= tol
        nt = nn * T + tt
        if self.check_mem:
            act = cuts.activation_bytes[kq] - cuts.activation_bytes[jq]
            keep &= self._fits(par[pi], act[pi], tt, nt)
        if not keep.all():
            if not keep.any():
                return None
            jj, kk, tt, nt, val, at = jj[keep], kk[keep], tt[keep], nt[keep], val[keep], at[keep]
        pos = st.pos
        pos[js] = np.arange(js.size)
        key = pos[jj] * (K * T) + nt
        best = np.full(js.size * K * T, INF)
        np.minimum.at(best, key, val)
        won = np.flatnonzero(val == best[key])
        cell = jj[won] * (K * T) + nt[won]
        st.arg_k.reshape(-1)[cell] = kk[won]
        st.arg_t.reshape(-1)[cell] = src_slot.reshape(-1)[at[won]]
        # the (cut, count vector)s with a finite entry, by cut
        cells = np.zeros(js.size * K, dtype=bool)
        cells[(key // T)[np.isfinite(val)]] = True
        li, mo = np.divmod(np.flatnonzero(cells), K)
        st.alive[js[np.unique(li)] if js.size > 1 else js[:li.size]] = True
        return best.reshape(js.size, K, T), li, mo

    def _close_level(self, js, F, li, mo, st):
        """``after`` (and ``first``) of the cuts ``js`` from their ``F``; the count vectors
        left open after each, by increasing capacity.

        Unless every device must be used, an entry ``[j, m, t]`` of ``F`` or of the tables
        is dropped where a count vector ``m' <= m``, ``m' != m``, open after the same cut,
        does at least as well: a plan may always use fewer devices, and fewer downstream
        means fewer minibatches in flight upstream, so ``m`` is never needed."""
        p, K = self.problem, self.K
        prune = not p.use_all_devices
        Fr = F[li, mo]                                                              # [R, T]
        if prune and li.size > DOMINANCE_BEFORE_LINKS:   # fewer link tables to build
            Fr[self._beaten(js.size, li, mo, Fr)] = INF
            live = np.isfinite(Fr).any(axis=1)
            li, mo, Fr = li[live], mo[live], Fr[live]
        if li.size == 0:
            return
        jr = js[li]
        with_first = st.ends_first[jr]
        if p.comm == "sender":
            for c in range(self.C):
                ts = np.flatnonzero(self.sc == c)
                a = np.argmin(Fr[:, ts], axis=1)
                st.after[jr, mo, c] = Fr[np.arange(li.size), ts[a]]
                st.after_slot[jr, mo, c] = ts[a]
        elif p.comm == "none":
            a = np.argmin(Fr, axis=1)
            st.after[jr, mo] = Fr[np.arange(li.size), a][:, None]
            st.after_slot[jr, mo] = a[:, None]
        else:
            # overlap: boundary k costs X(c_a, c_b) / r_b at the receiver, / r_a at the
            # sender (not for the first stage)
            X = 2.0 * (p.cuts.out_bytes[js][:, None, None] / self.bw_tt[None]
                       + self.lat_tt[None])                                         # [L, T, T]
            recv = X / self.sr[None, None, :]
            for term, dst, dst_slot, rows, at in (
                    (np.maximum(recv, X / self.sr[None, :, None]), st.after, st.after_slot,
                     slice(None), jr),
                    (recv, st.first, st.first_slot, with_first, st.first_row[jr])):
                if rows is with_first and not with_first.any():
                    continue
                val = np.maximum(Fr[rows][:, None, :], term[li[rows]])              # [R, T, T]
                dst[at[rows], mo[rows]] = val.min(axis=2)
                dst_slot[at[rows], mo[rows]] = val.argmin(axis=2)
        if prune:
            live = np.zeros(li.size, dtype=bool)
            tables = [(st.after, np.ones(li.size, dtype=bool), jr)]
            if st.first is not st.after and with_first.any():
                tables.append((st.first, with_first, st.first_row[jr]))
            for H, rows, at in tables:
                h = H[at, mo] if rows.all() else np.where(rows[:, None], H[at, mo], INF)
                h[self._beaten(js.size, li, mo, h)] = INF
                H[at[rows], mo[rows]] = h[rows]
                live |= np.isfinite(h).any(axis=1)
            li, jr, mo = li[live], jr[live], mo[live]
        rank = self.cap_rank[mo]
        if js.size == 1:   # a chain of cuts: one cut per level
            order = np.argsort(rank, kind="stable")
            st.rows[js[0], :mo.size] = mo[order]
            st.below[js[0]] = np.searchsorted(rank[order], np.arange(K + 1))
            return
        order = np.lexsort((rank, li))
        li, jr, mo, rank = li[order], jr[order], mo[order], rank[order]
        n = np.bincount(li, minlength=js.size)
        start = np.cumsum(n) - n
        st.rows[jr, np.arange(li.size) - start[li]] = mo
        hist = np.zeros((js.size, K + 1), dtype=np.int64)
        np.add.at(hist, (li, rank + 1), 1)
        st.below[js] = np.cumsum(hist, axis=1)

    def _beaten(self, L, li, mo, h):
        """[R, width]: where entry ``h[i]`` of count vector ``mo[i]`` after cut ``li[i]`` (of
        ``L``; ``li`` ascending) is no better than that of a smaller count vector of the same
        cut. Pairwise within each cut for few vectors, else by running minima over the grid."""
        n = np.bincount(li, minlength=L)
        per_row = n[li]
        if int(per_row.sum()) > 2 * L * self.K:
            return self._beaten_grid(L, li, mo, h)
        a, b = _ranges((np.cumsum(n) - n)[li], (np.cumsum(n) - n)[li] + per_row - 1)
        lower = (self.vec[mo[a]] <= self.vec[mo[b]]).all(axis=1) & (a != b)
        a, b = a[lower], b[lower]                             # a may beat b; grouped by b
        out = np.zeros(h.shape, dtype=bool)
        if a.size:
            heads = np.flatnonzero(np.concatenate(([True], b[1:] != b[:-1])))
            out[b[heads]] = np.logical_or.reduceat(h[a] <= h[b], heads, axis=0)
        return out

    def _beaten_grid(self, L, li, mo, h):
        """:meth:`_beaten` on the whole count-vector grid of each cut."""
        dense = np.full((L, self.K, h.shape[1]), INF)
        dense[li, mo] = h
        grid = dense.reshape((L,) + self.grid_shape + (h.shape[1],))
        low = grid
        for axis in range(1, 1 + len(self.grid_shape)):
            low = np.minimum.accumulate(low, axis=axis)
        below = np.full_like(grid, INF)
        for axis in range(1, 1 + len(self.grid_shape)):   # the best strictly below, by class
            src = [slice(None)] * grid.ndim
            dst = [slice(None)] * grid.ndim
            src[axis], dst[axis] = slice(0, -1), slice(1, None)
            np.minimum(below[tuple(dst)], low[tuple(src)], out=below[tuple(dst)])
        return (below <= grid).reshape(L, self.K, -1)[li, mo]

    def _trace(self, final, st):
        """The plan behind the best entry of ``final`` (F of the empty cut), scored anew."""
        p, K, S = self.problem, self.K, self.S
        n_idx = np.array([K - 1]) if p.use_all_devices else np.arange(K)
        sub = final[n_idx]
        if not np.isfinite(sub).any():
            return None
        n0, t0 = np.unravel_index(int(np.argmin(sub)), sub.shape)
        n0 = int(n_idx[n0])
        plan, j, n, t = [], 0, n0, int(t0)
        while True:
            k = int(st.arg_k[j, n, t])
            plan.append((j, k, t))
            if k == S - 1:
                break
            t_next = int(st.arg_t[j, n, t])
            n = int(self.shift[t, n])
            j, t = k, t_next
        result = evaluate_stages(p, plan, total_devices=int(self.tot[n0]))
        if not math.isclose(result.bottleneck_s, float(sub.min()), rel_tol=1e-9, abs_tol=1e-15):
            raise AssertionError(f"planner: the plan scores {result.bottleneck_s}, the dynamic "
                                 f"program claimed {float(sub.min())}")
        return result

    def _fits(self, par, act, tt, nt):
        """Whether each candidate stage (``par`` parameter and ``act`` activation bytes, on
        slot ``tt``, count vector from it to the end and slot ``nt = n T + t``) fits its
        devices' memory (1F1B: the devices from it to the end / replicas in flight)."""
        infl = self.inflight.reshape(-1)[nt]
        need = par * (infl if self.problem.stash_weights else 1.0) + act * infl
        return need <= self.mem_lim[tt]


class _SolveState:
    """The tables one :meth:`_Program.solve` fills, level by level."""

    def __init__(self, S: int, K: int, T: int, width: int, ends_first: np.ndarray | None):
        self.after = np.full((S, K, width), INF)
        self.after_slot = np.empty((S, K, width), dtype=np.int16)   # read where after is
        self.after[S - 1, 0] = 0.0
        self.first, self.first_slot = self.after, self.after_slot
        self.first_row = np.arange(S)
        self.ends_first = np.zeros(S, dtype=bool)
        if ends_first is not None:
            # overlap: the first stage sends nothing, so it sees the cuts after it its own
            # way; rows only for the cuts it may end at (row first_row[k])
            self.ends_first = ends_first
            self.first_row = np.cumsum(ends_first) - 1
            self.first = np.full((int(ends_first.sum()), K, width), INF)
            self.first_slot = np.empty(self.first.shape, dtype=np.int16)
            if ends_first[S - 1]:
                self.first[self.first_row[S - 1], 0] = 0.0
        # open count vectors after each cut by increasing capacity; below[k, r]: how many
        # of them have a capacity rank < r
        self.rows = np.zeros((S, K), dtype=np.int64)
        self.below = np.zeros((S, K + 1), dtype=np.int64)
        self.alive = np.zeros(S, dtype=bool)
        self.alive[S - 1] = True
        self.pos = np.zeros(S, dtype=np.int64)               # a cut's place in its level
        self.arg_k = np.empty((S, K, T), dtype=np.int32)      # read on the traced plan only
        self.arg_t = np.empty((S, K, T), dtype=np.int16)


def _ranges_from(js: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """(cut, next cut, slot) for next cuts ``lo[i, t]..hi[i, t]`` from cut ``js[i]`` on each
    slot ``t``."""
    kq, at = _ranges(lo.ravel(), hi.ravel())
    return js[at // lo.shape[1]], kq, at % lo.shape[1]


def _ranges(lo: np.ndarray, hi: np.ndarray):
    """(next cut, slot) pairs for next cuts ``lo[t]..hi[t]`` on each slot ``t``."""
    n = np.clip(hi - lo + 1, 0, None)
    tq = np.repeat(np.arange(lo.size), n)
    kq = np.repeat(lo, n) + (np.arange(tq.size) - np.repeat(np.cumsum(n) - n, n))
    return kq, tq


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
