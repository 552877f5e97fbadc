"""Pipeline planner (PipeDream's dynamic program on mixed devices and links) and op placement.

Pipeline model (what :func:`plan_pipeline` minimises, and :func:`evaluate_pipeline` computes)
------------------------------------------------------------------------------------------
A chain of ``L`` layers is cut into contiguous stages; each stage runs on one device and each
device runs at most one stage (devices may stay unused; no data-parallel replicas). With
``compute[l, d]`` the forward + backward time of layer ``l`` on device ``d``:

* stage compute ``C = sum_{l in stage} compute[l, d]``
* the boundary after the stage moves the activations forward and the same number of bytes of
  gradients backward over the link ``d -> next``: ``X = 2 * (bytes / bandwidth[d, next] +
  latency[d, next])``. ``comm="sender"`` (default) charges ``X`` to the upstream stage
  (stage time ``C + X``: the device is busy sending/receiving); ``comm="overlap"`` treats the
  link as its own pipeline resource that runs concurrently (stage time ``C``, and ``X`` enters
  the maximum on its own, as PipeDream's optimizer does when it models communication).
* memory of a stage on ``d``: ``weights + in_flight * activations`` (``* in_flight`` on the
  weights too with ``stash_weights``, PipeDream's weight stashing), where ``in_flight`` is the
  number of stages from this one to the last (1F1B keeps that many minibatches in flight at
  stage ``i`` of ``S``), or 1 with ``in_flight="one"``; it must not exceed ``memory[d]``.
* the step time of the steady pipeline is its slowest element (the bottleneck).

Dynamic program (exact for this model): over suffixes, ``F[l, d, M]`` = the smallest
bottleneck of a plan for layers ``l..L-1`` whose first stage is on ``d`` and which uses exactly
the device set ``M`` (``d`` in ``M``). Knowing ``M`` gives the number of stages from here to
the end (``|M|``), hence the 1F1B memory; charging a link to its sender makes each stage's time
depend only on its own device and its successor's, which the transition chooses:
``F[l, d, M] = min_{r, q in M-d} max(C(l..r, d) + X(r, d, q), F[r+1, q, M-d])``.
Cost ``O(L^2 D^2 2^D)`` vectorised with numpy (64 layers x 8 devices: well under a second).

Op placement (:func:`plan_placement`) is a separate, simpler model for a GCN layer sequence;
see its docstring.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gnnweave.errors import InputError

INF = math.inf
MAX_DEVICES = 14   # 2^D states per (layer, device); beyond this group identical devices


class InfeasiblePlanError(InputError):
    """No plan satisfies the memory limits; the message says what the smallest need is."""


@dataclass
class DeviceSpec:
    """A device for planning: ``speed`` divides the profiled times (2.0 = twice as fast);
    ``group`` places it in a two-level topology (devices of one group share a fast network,
    groups are joined by a slower link)."""

    name: str
    speed: float = 1.0
    memory_bytes: float = INF
    group: str = ""

    @classmethod
    def parse(cls, text: str) -> "DeviceSpec":
        """One device, ``NAME[=SPEED[:MEMORY_GB]][@GROUP]``, e.g. ``gpu:0=1.0:16``,
        ``fpga=0.25``, ``gpu:4=1.0:32@dc2``."""
        body, _, group = text.partition("@")
        name, _, rest = body.partition("=")
        if not name:
            raise InputError(f"--devices: {text!r}: empty device name")
        speed, mem = 1.0, INF
        if rest:
            s, _, m = rest.partition(":")
            try:
                speed = float(s)
                mem = float(m) * 1e9 if m else INF
            except ValueError:
                raise InputError(f"--devices: {text!r}: expected NAME[*COUNT][=SPEED[:MEM_GB]]"
                                 f"[@GROUP]") from None
        if not speed > 0 or not mem > 0:
            raise InputError(f"--devices: {text!r}: SPEED and MEM_GB must be > 0")
        return cls(name, speed, mem, group)

    @classmethod
    def parse_many(cls, text) -> list["DeviceSpec"]:
        """Every device of a ``--devices`` value (a string or a list of words): the one
        syntax of every command (:func:`gnnweave.clitools.device_list`: commas or spaces,
        ``NAME*COUNT``) with the planner's ``=SPEED[:MEM_GB]`` and ``@GROUP``."""
        from gnnweave.clitools import device_list
        return [cls.parse(d) for d in device_list("--devices", text, specs=True) or []]


def device_classes(specs: list[DeviceSpec], distinct: bool = False):
    """Group devices of equal speed, memory and group into
    :class:`~gnnweave.host.stageplan.DeviceClass` es (first-seen order); ``distinct``: one
    class per device (the exact subset search)."""
    from gnnweave.host.stageplan import DeviceClass

    groups: dict = {}
    for s in specs:
        key = (s.name,) if distinct else (s.speed, s.memory_bytes, s.group)
        groups.setdefault(key, []).append(s)
    out = []
    for members in groups.values():
        base = members[0].name.rsplit(":", 1)[0] if len(members) > 1 else members[0].name
        label = base + (f"@{members[0].group}" if members[0].group else "")
        if any(c.name == label for c in out):
            label = f"{label}#{len(out)}"
        out.append(DeviceClass(label, len(members), members[0].speed, members[0].memory_bytes,
                               members[0].group, [m.name for m in members]))
    return out


@dataclass
class PipelineProblem:
    layer_names: list[str]
    devices: list[str]
    compute_s: np.ndarray          # [L, D]
    weight_bytes: np.ndarray       # [L]
    activation_bytes: np.ndarray   # [L]
    boundary_bytes: np.ndarray     # [L - 1]
    memory_bytes: np.ndarray       # [D]
    bandwidth: np.ndarray          # [D, D] bytes/s
    latency_s: np.ndarray          # [D, D]
    comm: str = "sender"
    in_flight: str = "1f1b"
    stash_weights: bool = False

    def __post_init__(self):
        self.compute_s = np.asarray(self.compute_s, dtype=np.float64)
        L, D = self.compute_s.shape if self.compute_s.ndim == 2 else (-1, -1)
        if L < 1 or D < 1:
            raise ValueError(f"compute_s: shape {np.shape(self.compute_s)}, expected [layers, devices]")
        for nm, shape in (("weight_bytes", (L,)), ("activation_bytes", (L,)),
                          ("boundary_bytes", (L - 1,)), ("memory_bytes", (D,)),
                          ("bandwidth", (D, D)), ("latency_s", (D, D))):
            arr = np.broadcast_to(np.asarray(getattr(self, nm), dtype=np.float64), shape).copy()
            setattr(self, nm, arr)
        for nm in ("compute_s", "weight_bytes", "activation_bytes", "boundary_bytes",
                   "latency_s"):
            arr = getattr(self, nm)
            if np.isnan(arr).any() or (arr < 0).any():
                idx = np.argwhere(np.isnan(arr) | (arr < 0))[0]
                raise ValueError(f"{nm}{[int(i) for i in idx]} = {arr[tuple(idx)]}: must be >= 0")
        if not (self.bandwidth > 0).all():
            idx = np.argwhere(~(self.bandwidth > 0))[0]
            raise ValueError(f"bandwidth{[int(i) for i in idx]} = {self.bandwidth[tuple(idx)]}: must be > 0")
        if len(self.devices) != D or len(set(self.devices)) != D:
            raise ValueError(f"devices: need {D} distinct names, got {self.devices}")
        if len(self.layer_names) != L:
            raise ValueError(f"layer_names: {len(self.layer_names)} names for {L} layers")
        if self.comm not in ("sender", "overlap"):
            raise ValueError(f"comm={self.comm!r}: choose 'sender' or 'overlap'")
        if self.in_flight not in ("1f1b", "one"):
            raise ValueError(f"in_flight={self.in_flight!r}: choose '1f1b' or 'one'")

    @property
    def num_layers(self) -> int:
        return self.compute_s.shape[0]

    @property
    def num_devices(self) -> int:
        return self.compute_s.shape[1]

    def link_seconds(self, boundary: int, src: int, dst: int) -> float:
        """Forward activations + backward gradients across the cut after layer ``boundary``."""
        return 2.0 * (self.boundary_bytes[boundary] / self.bandwidth[src, dst]
                      + self.latency_s[src, dst])

    def stage_memory(self, first: int, last: int, stages_to_end: int) -> float:
        k = stages_to_end if self.in_flight == "1f1b" else 1
        w = float(self.weight_bytes[first:last + 1].sum())
        a = float(self.activation_bytes[first:last + 1].sum())
        return w * (k if self.stash_weights else 1) + k * a

    @classmethod
    def from_chain(cls, chain, devices: list[DeviceSpec], *, bandwidth=10e9, latency_s=0.0,
                   comm="sender", in_flight="1f1b", stash_weights=False) -> "PipelineProblem":
        """From a :class:`~gnnweave.host.profiles.LayerChain` (times in ms on the profiled
        device) and device specs; ``bandwidth`` in bytes/s: a scalar, a [D, D] matrix, or a
        dict ``{(src, dst): bytes_per_s}`` (missing pairs: ``default`` key or 10 GB/s)."""
        names = [d.name for d in devices]
        speed = np.array([d.speed for d in devices], dtype=np.float64)
        compute = np.asarray(chain.compute_ms, dtype=np.float64)[:, None] * 1e-3 / speed[None, :]
        return cls(list(chain.names), names, compute, chain.parameter_bytes,
                   chain.activation_bytes, chain.boundary_bytes,
                   np.array([d.memory_bytes for d in devices], dtype=np.float64),
                   _link_matrix(bandwidth, names, 10e9), _link_matrix(latency_s, names, 0.0),
                   comm=comm, in_flight=in_flight, stash_weights=stash_weights)


def _link_matrix(spec, names: list[str], default: float) -> np.ndarray:
    D = len(names)
    if isinstance(spec, dict):
        m = np.full((D, D), float(spec.get("default", default)))
        idx = {n: i for i, n in enumerate(names)}
        for key, val in spec.items():
            if key == "default":
                continue
            a, b = key
            if a not in idx or b not in idx:
                raise ValueError(f"link {key}: unknown device (devices: {names})")
            m[idx[a], idx[b]] = float(val)
        return m
    return np.broadcast_to(np.asarray(spec, dtype=np.float64), (D, D)).copy()


@dataclass
class Stage:
    first: int               # first layer (inclusive)
    last: int                # last layer (inclusive)
    device: str
    compute_s: float
    comm_s: float            # link to the next stage (0 for the last stage)
    time_s: float            # what this stage contributes to the maximum
    memory_bytes: float


@dataclass
class PipelinePlan:
    stages: list[Stage]
    bottleneck_s: float
    bottleneck: str          # "stage 2 (gpu:0)" or "link 1->2 (gpu:0->fpga)"
    comm: str = "sender"
    layer_names: list[str] = field(default_factory=list)

    @property
    def cuts(self) -> list[int]:
        return [s.last + 1 for s in self.stages[:-1]]

    @property
    def devices(self) -> list[str]:
        return [s.device for s in self.stages]

    def to_dict(self) -> dict:
        stages = []
        for s in self.stages:
            d = asdict(s)
            if self.layer_names:
                d["first_layer"] = self.layer_names[s.first]
                d["last_layer"] = self.layer_names[s.last]
            stages.append(d)
        return {"stages": stages, "bottleneck_s": self.bottleneck_s,
                "bottleneck": self.bottleneck, "comm": self.comm,
                "throughput_per_s": (1.0 / self.bottleneck_s) if self.bottleneck_s > 0 else None}


def evaluate_pipeline(problem: PipelineProblem, stages: list[tuple[int, int, int]]) -> PipelinePlan:
    """Score a plan given as ``[(first, last, device_index), ...]`` under the model above.

    Plain loops on purpose: this is the reference the optimisers are checked against.
    Raises :class:`InfeasiblePlanError` if the plan breaks a rule or a memory limit.
    """
    L, D = problem.num_layers, problem.num_devices
    if not stages or stages[0][0] != 0 or stages[-1][1] != L - 1:
        raise InfeasiblePlanError(f"stages must cover layers 0..{L - 1}: {stages}")
    for (a0, a1, _), (b0, _, _) in zip(stages, stages[1:]):
        if b0 != a1 + 1:
            raise InfeasiblePlanError(f"stages are not contiguous at layer {a1}->{b0}")
    used = [d for _, _, d in stages]
    if len(set(used)) != len(used) or not all(0 <= d < D for d in used):
        raise InfeasiblePlanError(f"device used twice or unknown: {used}")
    out: list[Stage] = []
    worst, worst_what = -1.0, ""
    S = len(stages)
    for i, (first, last, d) in enumerate(stages):
        if first > last:
            raise InfeasiblePlanError(f"stage {i} is empty ({first}..{last})")
        compute = 0.0
        for layer in range(first, last + 1):
            compute += problem.compute_s[layer, d]
        comm = 0.0 if i == S - 1 else problem.link_seconds(last, d, stages[i + 1][2])
        mem = problem.stage_memory(first, last, S - i)
        if mem > problem.memory_bytes[d]:
            raise InfeasiblePlanError(
                f"stage {i} (layers {first}..{last}) needs {mem:.4g} B on "
                f"{problem.devices[d]}, which has {problem.memory_bytes[d]:.4g} B")
        time = compute + comm if problem.comm == "sender" else compute
        out.append(Stage(first, last, problem.devices[d], compute, comm, time, mem))
        if time > worst:
            worst, worst_what = time, f"stage {i} ({problem.devices[d]})"
        if problem.comm == "overlap" and i < S - 1 and comm > worst:
            worst = comm
            worst_what = f"link {i}->{i + 1} ({problem.devices[d]}->{problem.devices[stages[i + 1][2]]})"
    return PipelinePlan(out, worst, worst_what, problem.comm, list(problem.layer_names))


def _popcount(n: int) -> int:
    return bin(n).count("1")


def plan_pipeline(problem: PipelineProblem) -> PipelinePlan:
    """The optimal plan under the model of this module (dynamic program, see docstring)."""
    L, D = problem.num_layers, problem.num_devices
    if D > MAX_DEVICES:
        raise ValueError(f"{D} devices: the exact planner handles at most {MAX_DEVICES}")
    nM = 1 << D
    pc = np.array([_popcount(m) for m in range(nM)])
    prefix_c = np.vstack([np.zeros(D), np.cumsum(problem.compute_s, axis=0)])   # [L+1, D]
    prefix_w = np.concatenate([[0.0], np.cumsum(problem.weight_bytes)])
    prefix_a = np.concatenate([[0.0], np.cumsum(problem.activation_bytes)])
    # link[r, d, q]: both directions over the cut after layer r (r < L-1)
    link = 2.0 * (problem.boundary_bytes[:, None, None] / problem.bandwidth[None, :, :]
                  + problem.latency_s[None, :, :])
    F = np.full((L + 1, D, nM), INF)
    choice_r = np.full((L, D, nM), -1, dtype=np.int64)
    choice_q = np.full((L, D, nM), -1, dtype=np.int64)
    k_of_mask = pc if problem.in_flight == "1f1b" else np.ones(nM, dtype=np.int64)
    w_mult = k_of_mask if problem.stash_weights else np.ones(nM, dtype=np.int64)
    masks = np.arange(nM)
    with_d = [masks[(masks >> d) & 1 == 1] for d in range(D)]
    for l in range(L - 1, -1, -1):
        rs = np.arange(l, L)                                             # stage end (incl.)
        w = prefix_w[rs + 1] - prefix_w[l]                               # [R]
        a = prefix_a[rs + 1] - prefix_a[l]
        for d in range(D):
            Ms = with_d[d]
            rest = Ms ^ (1 << d)
            c = prefix_c[rs + 1, d] - prefix_c[l, d]                     # [R]
            mem = w[:, None] * w_mult[Ms][None, :] + a[:, None] * k_of_mask[Ms][None, :]
            ok = mem <= problem.memory_bytes[d]                          # [R, nMs]
            best = np.full(Ms.shape[0], INF)
            best_r = np.full(Ms.shape[0], -1)
            best_q = np.full(Ms.shape[0], -1)
            # last stage: r = L-1, M == {d}
            single = rest == 0
            last_val = np.where(single & ok[-1], c[-1], INF)
            upd = last_val < best
            best[upd], best_r[upd] = last_val[upd], L - 1
            if l < L - 1:
                R = L - 1 - l                                            # r = l..L-2
                sub = F[l + 1:L][:, :, rest]                             # [R, D(q), nMs]
                lk = link[l:L - 1, d, :]                                 # [R, D]
                if problem.comm == "sender":
                    stage = (c[:R, None] + lk)[:, :, None]
                    val = np.maximum(stage, sub)
                else:
                    val = np.maximum(np.maximum(c[:R, None, None], lk[:, :, None]), sub)
                val = np.where(ok[:R, None, :], val, INF)
                flat = val.reshape(R * D, -1)
                arg = np.argmin(flat, axis=0)
                v = flat[arg, np.arange(flat.shape[1])]
                upd = v < best
                best[upd] = v[upd]
                best_r[upd] = l + arg[upd] // D
                best_q[upd] = arg[upd] % D
            F[l, d, Ms] = best
            choice_r[l, d, Ms] = best_r
            choice_q[l, d, Ms] = best_q
    flat0 = F[0].ravel()
    i = int(np.argmin(flat0))
    if not np.isfinite(flat0[i]):
        raise InfeasiblePlanError(_infeasible_message(problem))
    d, M = divmod(i, nM)
    stages = []
    l = 0
    while True:
        r = int(choice_r[l, d, M])
        stages.append((l, r, d))
        if r == L - 1:
            break
        q = int(choice_q[l, d, M])
        M ^= 1 << d
        l, d = r + 1, q
    plan = evaluate_pipeline(problem, stages)
    # the DP and the reference scorer must agree on the value they optimise
    assert math.isclose(plan.bottleneck_s, flat0[i], rel_tol=1e-9, abs_tol=1e-15), \
        (plan.bottleneck_s, flat0[i])
    return plan


def _infeasible_message(problem: PipelineProblem) -> str:
    per_layer = problem.weight_bytes + problem.activation_bytes
    worst = int(np.argmax(per_layer))
    biggest = float(problem.memory_bytes.max())
    if per_layer[worst] > biggest:
        return (f"no pipeline plan fits the memory limits: layer {worst} "
                f"({problem.layer_names[worst]}) alone needs {per_layer[worst]:.4g} B and the "
                f"largest device ({problem.devices[int(np.argmax(problem.memory_bytes))]}) "
                f"has {biggest:.4g} B")
    return (f"no pipeline plan fits the memory limits: {problem.num_layers} layers need "
            f"{problem.weight_bytes.sum():.4g} B of weights + {problem.activation_bytes.sum():.4g} B "
            f"of activations per minibatch in flight; devices have "
            f"{', '.join(f'{n}={m:.4g} B' for n, m in zip(problem.devices, problem.memory_bytes))}")


def plan_pipeline_exhaustive(problem: PipelineProblem) -> PipelinePlan:
    """Brute force over every composition of the chain and every device sequence (oracle
    for tests; fine up to about 6 devices x 12 layers)."""
    L, D = problem.num_layers, problem.num_devices
    best_val, best_stages = INF, None
    for S in range(1, min(D, L) + 1):
        perms = np.array(list(itertools.permutations(range(D), S)), dtype=np.int64)  # [P, S]
        for cuts in itertools.combinations(range(1, L), S - 1):
            bounds = (0, *cuts, L)
            spans = [(bounds[s], bounds[s + 1] - 1) for s in range(S)]
            total = np.zeros(perms.shape[0])
            for s, (first, last) in enumerate(spans):
                dev = perms[:, s]
                comp = problem.compute_s[first:last + 1, :].sum(axis=0)[dev]
                mem = problem.stage_memory(first, last, S - s)
                feasible = mem <= problem.memory_bytes[dev]
                if s < S - 1:
                    nxt = perms[:, s + 1]
                    lk = 2.0 * (problem.boundary_bytes[last] / problem.bandwidth[dev, nxt]
                                + problem.latency_s[dev, nxt])
                else:
                    lk = np.zeros(perms.shape[0])
                if problem.comm == "sender":
                    t = comp + lk
                else:
                    t = np.maximum(comp, lk)
                t = np.where(feasible, t, INF)
                total = np.maximum(total, t)
            j = int(np.argmin(total))
            if total[j] < best_val:
                best_val = float(total[j])
                best_stages = [(first, last, int(perms[j, s])) for s, (first, last) in enumerate(spans)]
    if best_stages is None:
        raise InfeasiblePlanError(_infeasible_message(problem))
    return evaluate_pipeline(problem, best_stages)


# --------------------------------------------------------------------------- op placement


@dataclass
class OpDevice:
    """Throughputs of a device for the placement model (elements per second) and its link."""

    name: str
    gather_rate: float = 1e9       # aggregation: edges x features per second
    mac_rate: float = 1e10         # dense: multiply-accumulates per second
    link_bytes_per_s: float = 10e9  # to/from the host (transfers between two devices: min)
    launch_s: float = 0.0          # fixed cost per op


def _op_list(num_edges, num_nodes, dims, batches):
    """Ops of one training step of a GCN on one minibatch (1 / batches of the nodes/edges):
    forward aggregate -> dense per layer, then backward in reverse (dense grads, aggregate
    on the transposed graph). Returns (layer, kind, work, out_bytes)."""
    e, n = num_edges / batches, num_nodes / batches
    ops = []
    for i, (fi, fo) in enumerate(zip(dims[:-1], dims[1:])):
        ops.append((i, "agg", e * fi, n * fi * 4))
        ops.append((i, "dense", n * fi * fo, n * fo * 4))
    for i in reversed(range(len(dims) - 1)):
        fi, fo = dims[i], dims[i + 1]
        ops.append((i, "dense", 2 * n * fi * fo, n * fi * 4))   # dX and dW
        ops.append((i, "agg", e * fi, n * fi * 4))              # on the transposed graph
    return ops


def simulate_placement(placement, devices: list[OpDevice], num_edges, num_nodes, dims,
                       batches: int = 4) -> dict:
    """List-schedule ``batches`` minibatches through the ops with ``placement[layer] =
    (agg_device, dense_device)``; each device and each link runs one thing at a time, ops in
    op-then-minibatch order (GPipe-like fill and drain), and an op starts when its input has
    arrived over the link and its device is free -- so minibatch b+1's aggregation overlaps
    minibatch b's dense work on another device (the HyGCN / HP-GNN split). Returns the
    makespan of the step (all minibatches) and each device's busy time."""
    dev = {d.name: d for d in devices}
    ops = _op_list(num_edges, num_nodes, dims, batches)
    free = {d.name: 0.0 for d in devices}
    link_free: dict[tuple, float] = {}
    busy = {d.name: 0.0 for d in devices}
    ready = [0.0] * batches
    where: list = [None] * batches
    prev_bytes = [0.0] * batches
    # op-major order (GPipe-like): every minibatch through op k before op k+1, so minibatch
    # b+1's aggregation runs while minibatch b is in the dense op on another device
    for layer, kind, work, out_bytes in ops:
        d = placement[layer][0 if kind == "agg" else 1]
        spec = dev[d]
        for b in range(batches):
            if where[b] is not None and where[b] != d:
                bw = min(spec.link_bytes_per_s, dev[where[b]].link_bytes_per_s)
                key = tuple(sorted((where[b], d)))
                start = max(ready[b], link_free.get(key, 0.0))
                ready[b] = start + prev_bytes[b] / bw
                link_free[key] = ready[b]
            t = spec.launch_s + work / (spec.gather_rate if kind == "agg" else spec.mac_rate)
            start = max(ready[b], free[d])
            free[d] = ready[b] = start + t
            busy[d] += t
            where[b], prev_bytes[b] = d, out_bytes
    end = max(ready)
    return {"makespan_s": end, "step_s": end, "per_batch_s": end / batches, "busy_s": busy}


def plan_placement(devices: list[OpDevice], *, num_edges: int, num_nodes: int, dims: list[int],
                   batches: int = 4, max_exhaustive: int = 20000) -> dict:
    """Choose (aggregation device, dense device) per GCN layer to minimise the simulated step
    time of :func:`simulate_placement`: exhaustive over all ``D^(2L)`` placements when there
    are at most ``max_exhaustive``, else coordinate descent from the best single device."""
    names = [d.name for d in devices]
    L = len(dims) - 1
    if L < 1:
        raise ValueError(f"dims={dims}: need at least input and output widths")

    def score(p):
        return simulate_placement(p, devices, num_edges, num_nodes, dims, batches)["makespan_s"]

    pairs = [(a, b) for a in names for b in names]
    if len(pairs) ** L <= max_exhaustive:
        best = min(itertools.product(pairs, repeat=L), key=score)
        method = "exhaustive"
    else:
        best = min(([(d, d)] * L for d in names), key=score)
        best, improved = list(best), True
        while improved:
            improved = False
            for i in range(L):
                for pr in pairs:
                    cand = best[:i] + [pr] + best[i + 1:]
                    if score(cand) < score(best) * (1 - 1e-12):
                        best, improved = cand, True
        method = "coordinate-descent"
    best = [tuple(p) for p in best]
    sim = simulate_placement(best, devices, num_edges, num_nodes, dims, batches)
    single = {d: simulate_placement([(d, d)] * L, devices, num_edges, num_nodes, dims,
                                    batches)["makespan_s"] for d in names}
    return {"placement": [{"layer": i, "aggregate": a, "dense": b} for i, (a, b) in enumerate(best)],
            "method": method, "batches": batches, "predicted_step_s": sim["makespan_s"],
            "busy_s": sim["busy_s"], "single_device_step_s": single}


# --------------------------------------------------------------------------- CLI entry


def _dataset_shape(dataset: str) -> tuple[int, int, int, int, "object"]:
    """(nodes, edges, features, classes, CSRGraph) of any ``load_dataset`` spec (name,
    ``sbm[:N:C]``, ``rmat:...``, OGB folder, edge list); an ``.npz`` file needs only ``x``,
    ``y`` and ``edge_index`` (a plan needs no split)."""
    from pathlib import Path

    from gnnweave.datasets import load_dataset
    from gnnweave.graph import CSRGraph

    p = Path(dataset)
    if not (p.suffix.lower() == ".npz" and p.is_file()):
        ds = load_dataset(dataset)
        return ds.num_nodes, ds.num_edges, ds.num_features, ds.num_classes, ds.graph
    with np.load(p, allow_pickle=False) as z:
        for key in ("x", "y", "edge_index"):
            if key not in z:
                raise InputError(f"{p}: missing array {key!r}")
        n, f = z["x"].shape
        if not n:
            raise InputError(f"--dataset {p}: the graph has no nodes")
        classes = int(z["y"].max()) + 1
        try:
            g = CSRGraph.from_edge_index(z["edge_index"], n)
        except ValueError as exc:
            raise InputError(f"{p.name}: {exc}") from None
    return n, g.num_edges, f, classes, g


def _op_devices(specs: list[DeviceSpec], cost_model=None) -> list[OpDevice]:
    out = []
    for s in specs:
        if cost_model is not None and s.name in cost_model.devices:
            dm = cost_model.devices[s.name]
            agg, dense = dm.op("aggregate").coef, dm.op("dense_forward").coef
            link = dm.link
            bw = (link or {}).get("transfer_in", {}).get("bandwidth_bytes_per_s") or 1e12
            out.append(OpDevice(s.name, 1.0 / max(agg["edge_feats"] + agg["edge_feats_miss"], 1e-15),
                                1.0 / max(dense["mkn"], 1e-15), bw, agg["fixed"]))
        else:
            # nominal rates scaled by the given speed: 1 G gathered elements/s, 10 G MAC/s
            out.append(OpDevice(s.name, 1e9 * s.speed, 1e10 * s.speed, 10e9))
    return out


def format_plan(report: dict) -> str:
    """A human-readable table of a :func:`plan_main` report."""
    lines = []
    pipe = report.get("pipeline")
    if pipe and "replicas" in (pipe["stages"][0] if pipe["stages"] else {}):
        m = pipe["model"]
        lines.append(f"pipeline plan for {report['model']} ({report['num_layers']} layers, "
                     f"comm={m['comm']}, cuts={m['cuts']}, "
                     f"{'replicas allowed' if m['replicate'] else 'straight'}):")
        lines.append(f"  {'stage':>5} {'layers':>6} {'devices':>20} {'compute ms':>11} "
                     f"{'allred ms':>9} {'comm ms':>8} {'stage ms':>9} {'memory GB':>10}")
        for i, s in enumerate(pipe["stages"]):
            devs = ",".join(s["devices"])
            devs = devs if len(devs) <= 20 else f"{s['replicas']}x {s['device_class']}"
            lines.append(f"  {i:>5} {len(s['layers']):>6} {devs:>20} {s['compute_s'] * 1e3:>11.3f} "
                         f"{s['allreduce_s'] * 1e3:>9.3f} {s['comm_s'] * 1e3:>8.3f} "
                         f"{s['time_s'] * 1e3:>9.3f} {s['memory_bytes'] / 1e9:>10.3f}")
        lines.append(f"  bottleneck: {pipe['bottleneck']} at {pipe['bottleneck_s'] * 1e3:.3f} ms "
                     f"per minibatch")
    elif pipe:
        lines.append(f"pipeline plan for {report['model']} ({report['num_layers']} layers):")
        lines.append(f"  {'stage':>5} {'layers':>11} {'device':>12} {'compute ms':>11} "
                     f"{'comm ms':>9} {'stage ms':>9} {'memory GB':>10}")
        for i, s in enumerate(pipe["stages"]):
            lines.append(f"  {i:>5} {s['first']:>5}..{s['last']:<5} {s['device']:>12} "
                         f"{s['compute_s'] * 1e3:>11.3f} {s['comm_s'] * 1e3:>9.3f} "
                         f"{s['time_s'] * 1e3:>9.3f} {s['memory_bytes'] / 1e9:>10.3f}")
        lines.append(f"  bottleneck: {pipe['bottleneck']} at {pipe['bottleneck_s'] * 1e3:.3f} ms "
                     f"per minibatch")
    if report.get("placement"):
        pl = report["placement"]
        lines.append(f"op placement ({pl['method']}, {pl['batches']} minibatches overlapped): "
                     f"predicted step {pl['predicted_step_s'] * 1e3:.3f} ms")
        for p in pl["placement"]:
            lines.append(f"  layer {p['layer']}: aggregate on {p['aggregate']}, dense on {p['dense']}")
    nominal = [d for d, src in report.get("rates_from", {}).items() if src != "cost model"]
    if nominal and len(nominal) < len(report["rates_from"]):
        lines.append(f"rates: not in the cost model, nominal x SPEED: {', '.join(nominal)}")
    if report.get("partition"):
        lines.append("aggregation row split: " + ", ".join(
            f"{d} rows {lo}..{hi}" for d, (lo, hi) in report["partition"].items()))
    return "\n".join(lines)


CUT_CHOICES = ("auto", "pipedream", "chain", "all")
COMM_CHOICES = ("none", "overlap", "sender")
AUTO_MAX_STATES = 3000   # PipeDream's antichain DAG above this: the chain's cuts


def model_cuts(graph, cuts: str = "auto"):
    """The cut family for ``graph``: ``pipedream`` (its antichain DAG), ``chain`` (prefixes
    of one topological order), ``all`` (every downset, bounded), or ``auto``: PipeDream's
    cuts together with the chain's when the antichain DAG has at most
    :data:`AUTO_MAX_STATES` states, else the chain's."""
    from gnnweave.host.stagecuts import (CutLimitError, all_cuts, chain_cuts, pipedream_cuts,
                                         union_cuts)

    if cuts == "pipedream":
        return pipedream_cuts(graph)
    if cuts == "chain":
        return chain_cuts(graph)
    if cuts == "all":
        return all_cuts(graph)
    if cuts != "auto":
        raise ValueError(f"cuts={cuts!r}: choose one of {', '.join(CUT_CHOICES)}")
    try:
        pd = pipedream_cuts(graph, limit=AUTO_MAX_STATES)
    except CutLimitError:
        return chain_cuts(graph)
    return union_cuts(pd, chain_cuts(graph))


EXAMPLE_PROFILES = Path(__file__).resolve().parent / "example_profiles"


def example_profiles() -> list[str]:
    """The profiles shipped with the package (see ``example_profiles/README.md``)."""
    return sorted(p.parent.name for p in (EXAMPLE_PROFILES / "pipedream").glob("*/graph.txt"))


def locate_profile(name_or_path: str) -> Path:
    """A profile's ``graph.txt``: a path, else ``$GNNWEAVE_PROFILES/pipedream/NAME``, else
    ``../shared/profiles/pipedream/NAME``, else the examples shipped with the package."""
    from gnnweave.host.profiles import ProfileNotFoundError, available_profiles, resolve_profile

    try:
        return resolve_profile(name_or_path)
    except ProfileNotFoundError:
        shipped = EXAMPLE_PROFILES / "pipedream" / str(name_or_path) / "graph.txt"
        if shipped.is_file():
            return shipped
        known = sorted(set(available_profiles()) | set(example_profiles()))
        raise ProfileNotFoundError(
            f"--model {str(name_or_path)!r}: profile not found (known: {', '.join(known)}; "
            f"others from $GNNWEAVE_PROFILES/pipedream/NAME/graph.txt)") from None


def _plan_model(report: dict, model: str, specs: list[DeviceSpec], *, comm: str,
                bandwidth_gbps: float, latency_us: float, inter_group_gbps: float | None,
                inter_group_latency_us: float | None, straight: bool, cuts: str,
                exact_devices: bool, use_all_devices: bool):
    from gnnweave.host.profiles import load_graph
    from gnnweave.host.stageplan import Links, StageProblem, plan_stages

    source = locate_profile(model)
    graph = load_graph(source)
    report["profile"] = str(source)
    space = model_cuts(graph, cuts)
    classes = device_classes(specs, distinct=exact_devices)
    bw, lat = bandwidth_gbps * 1e9, latency_us * 1e-6
    links = Links.two_level(classes, bw, lat,
                            bw if inter_group_gbps is None else inter_group_gbps * 1e9,
                            lat if inter_group_latency_us is None else inter_group_latency_us * 1e-6)
    problem = StageProblem(space, classes, links, comm=comm, replicate=not straight,
                           use_all_devices=use_all_devices)
    plan = plan_stages(problem)
    report["model"] = graph.name
    report["num_layers"] = len(space.layers)
    report["device_classes"] = [{"name": c.name, "count": c.count, "speed": c.speed,
                                 "memory_bytes": c.memory_bytes, "group": c.group}
                                for c in classes]
    pipe = plan.to_dict()
    pipe["model"].update({
        "bandwidth_bytes_per_s": bw, "latency_s": lat, "links_bandwidth_bytes_per_s":
        links.bandwidth.tolist(), "links_latency_s": links.latency_s.tolist(),
        "num_cuts": len(space), "num_cut_pairs": space.num_pairs,
        "use_all_devices": use_all_devices, "exact_devices": exact_devices,
        "stage_time": "(compute + allreduce) / replicas; allreduce = 4 (r-1)/r P/b + 2 (r-1) l",
        "link": "2 (bytes / b + l) per boundary; "
                + {"none": "not counted", "overlap": "max term / replicas (receiver, sender)",
                   "sender": "added to the sending stage, / its replicas"}[comm]})
    report["pipeline"] = pipe
    report["bottleneck"] = plan.bottleneck
    report["bottleneck_s"] = plan.bottleneck_s
    report["stage_times_s"] = pipe["stage_times_s"]
    return plan


def _json_safe(value):
    """Infinite memory limits as null: the file stays strict JSON."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _check_links(bandwidth_gbps, latency_us, inter_group_gbps, inter_group_latency_us) -> None:
    """Link figures a plan can use: bandwidths > 0, latencies >= 0 (one line naming the option)."""
    for option, value, least in (("--bandwidth-gbps", bandwidth_gbps, None),
                                 ("--latency-us", latency_us, 0.0),
                                 ("--inter-group-gbps", inter_group_gbps, None),
                                 ("--inter-group-latency-us", inter_group_latency_us, 0.0)):
        if value is None:
            continue
        if least is None and not value > 0:       # an infinite bandwidth: a free link
            raise InputError(f"{option} {value:g}: must be > 0")
        if least is not None and not least <= value < INF:
            raise InputError(f"{option} {value:g}: must be a number >= {least:g}")


def plan_main(model: str | None = None, devices: list[str] | None = None, *,
              dataset: str | None = None, hidden: int = 16, layers: int = 2,
              bandwidth_gbps: float = 10.0, latency_us: float = 0.0,
              cost_model: str | None = None, comm: str = "sender", coarsen: int | None = None,
              batches: int = 4, out: str | None = None, straight: bool = False,
              cuts: str = "auto", inter_group_gbps: float | None = None,
              inter_group_latency_us: float | None = None, exact_devices: bool = False,
              use_all_devices: bool = False) -> dict:
    """``gnnweave plan (--model NAME|PATH | --dataset NAME) --devices D[=SPEED[:MEM_GB]],... --json``.

    * ``model``: a PipeDream profile (``vgg16``, a folder or a graph.txt): the optimal pipeline
      of its layer DAG (:mod:`gnnweave.host.stageplan`: stages between cuts, replicas unless
      ``straight``, the ``comm`` model, two-level links from the devices' ``@GROUP``); device
      SPEED divides the profiled GPU times, MEM_GB caps the stage memory (1F1B stashing).
    * ``dataset`` (+ ``hidden``, ``layers``): a GCN on that graph: the op placement (which
      device aggregates and which transforms, minibatches overlapped), the row split of the
      aggregation over the devices, and a pipeline over the op chain.
    ``cost_model``: a profile JSON; then the GNN rates come from it instead of SPEED.
    ``bandwidth_gbps`` is GB/s (1e9 bytes/s); ``comm``: ``none``, ``overlap`` or ``sender``
    (see :mod:`gnnweave.host.stageplan`; the GNN op chain takes ``overlap`` or ``sender``,
    ``none`` there means free links).
    ``out``: a folder (checked, and created, before any work) for ``plan.json`` and the
    stage-time picture ``plan.png``. Returns the report.
    """
    if (model is None) == (dataset is None):
        raise InputError("give exactly one of model (PipeDream profile) or dataset (GNN)")
    specs = DeviceSpec.parse_many(devices)
    if not specs:
        raise InputError("--devices: give at least one, e.g. gpu*2=1:16,fpga=0.3:4")
    names = [s.name for s in specs]
    _check_links(bandwidth_gbps, latency_us, inter_group_gbps, inter_group_latency_us)
    if out is not None:     # checked before any work: a plan is cheap, a lost one is not
        from gnnweave.clitools import output_folder
        out = output_folder("--out", out)
    cm = None
    if cost_model:
        from gnnweave.host.costmodel import CostModel
        cm = CostModel.load(cost_model)
    report: dict = {"devices": [asdict(s) for s in specs], "bandwidth_gbps": bandwidth_gbps,
                    "latency_us": latency_us, "comm": comm}
    from gnnweave.host.stageplan import COMM_MODELS
    if comm not in COMM_MODELS:
        raise ValueError(f"comm={comm!r}: choose one of {', '.join(COMM_MODELS)}")
    if model is not None:
        plan = _plan_model(report, model, specs, comm=comm, bandwidth_gbps=bandwidth_gbps,
                           latency_us=latency_us, inter_group_gbps=inter_group_gbps,
                           inter_group_latency_us=inter_group_latency_us, straight=straight,
                           cuts=cuts, exact_devices=exact_devices,
                           use_all_devices=use_all_devices)
    else:
        from gnnweave.host.partition import ShareCost, partition_rows
        n, e, f, classes, graph = _dataset_shape(dataset)
        dims = [f] + [hidden] * (layers - 1) + [classes]
        opdevs = _op_devices(specs, cm)
        # a device the cost model does not hold gets nominal rates x SPEED: say which is which
        report["rates_from"] = {s.name: "cost model" if cm is not None and s.name in cm.devices
                                else "nominal x speed" for s in specs}
        report["model"] = f"gcn{layers} on {dataset}"
        report["graph"] = {"nodes": n, "edges": e, "features": f, "classes": classes, "dims": dims}
        report["placement"] = plan_placement(opdevs, num_edges=e, num_nodes=n, dims=dims,
                                             batches=batches)
        costs = {d.name: ShareCost(d.launch_s, f / d.gather_rate, 0.0) for d in opdevs}
        report["partition"] = {d: list(r) for d, r in partition_rows(graph, f, costs).items()}
        # the op chain (agg, dense per layer, forward + backward) as a pipeline
        names_ops, comp, acts = [], [], []
        for i, (fi, fo) in enumerate(zip(dims[:-1], dims[1:])):
            names_ops += [f"agg{i}", f"dense{i}"]
            comp.append([2 * e * fi / d.gather_rate + 2 * d.launch_s for d in opdevs])
            comp.append([3 * n * fi * fo / d.mac_rate + 3 * d.launch_s for d in opdevs])
            acts += [n * fi * 4, n * fo * 4]
        free = comm == "none"
        problem = PipelineProblem(names_ops, names, np.array(comp), np.zeros(len(comp)),
                                  np.array(acts, dtype=float), np.array(acts[:-1], dtype=float),
                                  np.array([s.memory_bytes for s in specs]),
                                  np.inf if free else bandwidth_gbps * 1e9,
                                  0.0 if free else latency_us * 1e-6,
                                  comm="overlap" if free else comm)
        plan = plan_pipeline(problem)
        report["num_layers"] = problem.num_layers
        report["pipeline"] = plan.to_dict()
        report["bottleneck"] = plan.bottleneck
        report["bottleneck_s"] = plan.bottleneck_s
        report["stage_times_s"] = [s.time_s for s in plan.stages]
    report["text"] = format_plan(report)
    if out is not None:
        import json
        path = out / "plan.json"
        path.write_text(json.dumps(_json_safe(report), indent=1))
        report["out"] = str(path)
        try:
            plot_stages(plan, path.with_suffix(".png"), title=report["model"])
            report["plot"] = str(path.with_suffix(".png"))
        except Exception as ex:   # the JSON is the result
            report["plot_error"] = f"{type(ex).__name__}: {ex}"
    return report


def plot_stages(plan, png, title: str = "") -> None:
    """Stacked bars, one per stage, in ms per minibatch: compute and all-reduce (per replica
    share) and the link time charged to the stage; the bottleneck stage's compute in red.
    Takes a :class:`PipelinePlan` (chain planner) or a
    :class:`~gnnweave.host.stageplan.StagePlan`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dag = hasattr(plan.stages[0], "replicas") if plan.stages else False
    n = len(plan.stages)
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * n + 2.5), 3.8))
    xs = np.arange(n)
    reps = [s.replicas if dag else 1 for s in plan.stages]
    comp = [s.compute_s * 1e3 / r for s, r in zip(plan.stages, reps)]
    allred = [(s.allreduce_s * 1e3 / r) if dag else 0.0 for s, r in zip(plan.stages, reps)]
    comm = [s.comm_s * 1e3 for s in plan.stages]
    worst = int(np.argmax([s.time_s for s in plan.stages]))
    ax.bar(xs, comp, color=["C3" if i == worst else "C0" for i in xs],
           label="compute / replicas (bottleneck stage in red)")
    if any(allred):
        ax.bar(xs, allred, bottom=comp, color="C2", label="weight all-reduce / replicas")
    base = [c + a for c, a in zip(comp, allred)]
    if plan.comm == "overlap":   # a term of its own in the maximum, not added to compute
        ax.bar(xs + 0.3, comm, width=0.2, color="C1",
               label="largest link term of the stage (concurrent)")
    elif any(comm):
        ax.bar(xs, comm, bottom=base, color="C1", label="link time added to the stage")
    if dag:
        labels = [f"{len(s.layers)} layers\n{s.replicas}x {s.device_class}" for s in plan.stages]
    else:
        labels = [f"{s.device}\n{s.first}..{s.last}" for s in plan.stages]
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("time per minibatch (ms)")
    ax.axhline(plan.bottleneck_s * 1e3, color="k", lw=0.8, ls="--",
               label=f"bottleneck {plan.bottleneck_s * 1e3:.2f} ms")
    ax.set_title(f"{title} ({plan.comm} links)" if title else f"{plan.comm} links", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def add_plan_arguments(parser) -> None:
    """The ``gnnweave plan`` options (the CLI's ``plan`` subcommand calls this)."""
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="NAME|PATH",
                     help="PipeDream layer profile: a name (shipped: "
                          f"{', '.join(example_profiles())}; more from $GNNWEAVE_PROFILES or "
                          "../shared/profiles), a folder holding graph.txt, or a graph.txt")
    src.add_argument("--dataset", metavar="SPEC",
                     help="GNN dataset for the op placement (cora, citeseer, sbm, rmat, a path)")
    parser.add_argument("--devices", nargs="+", required=True,
                        metavar="NAME[*COUNT][=SPEED[:MEM_GB]][@GROUP]",
                        help="the devices, separated by commas or spaces, as train and profile "
                             "take them (NAME*COUNT is NAME:0..NAME:COUNT-1), each optionally "
                             "with what the planner cannot measure: SPEED divides the profiled "
                             "times (default 1), MEM_GB caps its memory (default: no cap), "
                             "GROUP places it in a two-level topology (default: one group); "
                             "e.g. gpu*8=1:32@dc1,fpga*4=0.3:8@dc2")
    parser.add_argument("--hidden", type=int, default=16,
                        help="with --dataset: hidden width of the GCN (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=2,
                        help="with --dataset: number of GCN layers (default: %(default)s)")
    parser.add_argument("--comm", choices=COMM_CHOICES, default="sender",
                        help="link model: none (PipeDream's default: links ignored), overlap "
                             "(PipeDream's activation transfers, concurrent with compute), "
                             "sender (the sending stage is busy for the transfer) "
                             "(default: %(default)s)")
    parser.add_argument("--bandwidth-gbps", "--bandwidth-gb-per-s", dest="bandwidth_gbps",
                        type=float, default=10.0, metavar="GB_PER_S",
                        help="link bandwidth in GB/s (1e9 bytes/s) within a group "
                             "(default: %(default)s)")
    parser.add_argument("--latency-us", type=float, default=0.0, metavar="US",
                        help="link latency in microseconds within a group (default: %(default)s)")
    parser.add_argument("--inter-group-gbps", type=float, default=None, metavar="GB_PER_S",
                        help="bandwidth in GB/s of the link between device groups (@GROUP) "
                             "(default: --bandwidth-gbps)")
    parser.add_argument("--inter-group-latency-us", type=float, default=None, metavar="US",
                        help="latency in microseconds of the link between device groups "
                             "(default: --latency-us)")
    parser.add_argument("--straight", action="store_true",
                        help="no stage replicas (PipeDream's --straight_pipeline) "
                             "(default: replicas allowed)")
    parser.add_argument("--cuts", choices=CUT_CHOICES, default="auto",
                        help="where stages may be cut: PipeDream's antichain DAG, one "
                             "topological order, every downset, or auto: PipeDream's and the "
                             "chain's (see docs/planner.md) (default: %(default)s)")
    parser.add_argument("--exact-devices", action="store_true",
                        help="treat every device as distinct (exact subset search, "
                             "exponential: at most 14 devices) (default: identical devices "
                             "grouped into classes)")
    parser.add_argument("--use-all-devices", action="store_true",
                        help="use every device (PipeDream's default) (default: at most all)")
    parser.add_argument("--cost-model", default=None, metavar="JSON",
                        help="with --dataset: a profile JSON from `gnnweave profile` whose rates "
                             "replace SPEED (default: nominal rates x SPEED)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for plan.json and the stages' picture plan.png "
                             "(default: nothing written)")
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON (default: a text summary)")


def plan_from_args(a) -> dict:
    """:func:`plan_main` with the options of :func:`add_plan_arguments`."""
    return plan_main(a.model, a.devices, dataset=a.dataset, hidden=a.hidden, layers=a.layers,
                     bandwidth_gbps=a.bandwidth_gbps, latency_us=a.latency_us,
                     cost_model=a.cost_model, comm=a.comm, out=a.out, straight=a.straight,
                     cuts=a.cuts, inter_group_gbps=a.inter_group_gbps,
                     inter_group_latency_us=a.inter_group_latency_us,
                     exact_devices=a.exact_devices, use_all_devices=a.use_all_devices)
