"""Reader of PipeDream per-layer profiles (``graph.txt``) and their linearisation to a chain.

Format (one line per node, then one tab-indented line per edge)::

    nodeID -- Description -- forward_compute_time=F, backward_compute_time=B, activation_size=A, parameter_size=P
    \tnodeA -- nodeB

Times are milliseconds per minibatch on the GPU PipeDream profiled; sizes are bytes.

Linearisation (how a DAG becomes a chain the pipeline planner can cut). PipeDream's
optimizer builds an "antichain DAG" and orders its states topologically; any prefix of
a topological order of the layer DAG is a downward-closed set of layers, i.e. a legal
pipeline cut. We take one deterministic topological order (Kahn's algorithm, ties broken by
the smaller node number, so a straight model such as vgg16 keeps its natural order) and
let the planner cut between any two consecutive layers. The bytes crossing the cut after
position ``k`` are counted exactly on the DAG: the activations of every layer at position
``<= k`` that has a consumer at position ``> k`` (each sent once, however many consumers).
As in PipeDream's optimizer, ``Input*`` source nodes (data loading) are dropped - the input
always lives with the first stage - and unused ``__getitem__`` sinks are removed.
"""
from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnnweave.errors import InputError

_NODE_RE = re.compile(r"^(node\d+)\s+--\s+(.*)\s+--\s+(forward_compute_time=.*)$")
_EDGE_RE = re.compile(r"^\s+(node\d+)\s+--\s+(node\d+)\s*$")
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


class ProfileError(InputError):
    """A profile file that cannot be read; the message names the file and line."""


class ProfileNotFoundError(ProfileError, FileNotFoundError):
    """No layer profile of that name or path."""


@dataclass
class LayerNode:
    node_id: str
    description: str
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float


@dataclass
class LayerGraph:
    """The profiled DAG, nodes in file order, edges as (source, target) node ids."""

    name: str
    nodes: dict[str, LayerNode]
    edges: list[tuple[str, str]]


@dataclass
class LayerChain:
    """A chain of layers the planner can cut between any two consecutive entries.

    ``boundary_bytes[k]`` is what crosses the cut after layer ``k`` (length ``L - 1``).
    ``compute_ms`` is forward + backward time per minibatch on the profiled device.
    """

    name: str
    names: list[str]
    compute_ms: np.ndarray          # [L] forward + backward
    forward_ms: np.ndarray          # [L]
    backward_ms: np.ndarray         # [L]
    activation_bytes: np.ndarray    # [L] output activation of each layer (stashed for backward)
    parameter_bytes: np.ndarray     # [L]
    boundary_bytes: np.ndarray      # [L - 1]
    members: list[list[str]] = field(default_factory=list)  # node ids merged into each layer

    def __len__(self) -> int:
        return len(self.names)

    def coarsen(self, num_layers: int) -> "LayerChain":
        """Merge consecutive layers into ``num_layers`` blocks of about equal compute.

        A cut between blocks is a cut of the original chain, so its boundary size is kept
        exactly; compute, activations and parameters add up.
        """
        n = len(self)
        if not 1 <= num_layers <= n:
            raise ValueError(f"coarsen: num_layers={num_layers} must be in 1..{n}")
        if num_layers == n:
            return self
        cum = np.cumsum(self.compute_ms)
        total = cum[-1]
        cuts: list[int] = []   # block ends (exclusive)
        last = 0
        for b in range(1, num_layers):
            target = total * b / num_layers
            pos = int(np.searchsorted(cum, target, side="left")) + 1
            # leave room: every block keeps >= 1 layer
            pos = min(max(pos, last + 1), n - (num_layers - b))
            cuts.append(pos)
            last = pos
        bounds = [0, *cuts, n]
        spans = list(zip(bounds[:-1], bounds[1:]))

        def add(a):
            return np.array([a[lo:hi].sum() for lo, hi in spans], dtype=np.float64)

        members = self.members or [[nm] for nm in self.names]
        return LayerChain(
            name=f"{self.name}/{num_layers}",
            names=[f"{self.names[lo]}..{self.names[hi - 1]}" if hi - lo > 1 else self.names[lo]
                   for lo, hi in spans],
            compute_ms=add(self.compute_ms), forward_ms=add(self.forward_ms),
            backward_ms=add(self.backward_ms), activation_bytes=add(self.activation_bytes),
            parameter_bytes=add(self.parameter_bytes),
            boundary_bytes=np.array([self.boundary_bytes[c - 1] for c in cuts], dtype=np.float64),
            members=[sum(members[lo:hi], []) for lo, hi in spans])


def profiles_dir() -> Path:
    """``$GNNWEAVE_PROFILES`` if set, else ``<repo>/../shared/profiles``."""
    env = os.environ.get("GNNWEAVE_PROFILES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "profiles"


def available_profiles() -> list[str]:
    root = profiles_dir() / "pipedream"
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob("*/graph.txt"))


def resolve_profile(name_or_path: str | os.PathLike) -> Path:
    """A model name (``vgg16``), a directory holding ``graph.txt``, or a file path."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.is_dir() and (p / "graph.txt").is_file():
        return p / "graph.txt"
    cand = profiles_dir() / "pipedream" / str(name_or_path) / "graph.txt"
    if cand.is_file():
        return cand
    names = ", ".join(available_profiles()) or f"none found under {profiles_dir()}"
    raise ProfileNotFoundError(f"profile {str(name_or_path)!r} not found (known: {names}; "
                            f"set GNNWEAVE_PROFILES to the folder holding pipedream/)")


def parse_graph(text: str, name: str = "<text>") -> LayerGraph:
    nodes: dict[str, LayerNode] = {}
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _EDGE_RE.match(line)
        if m:
            edges.append((m.group(1), m.group(2)))
            continue
        m = _NODE_RE.match(line)
        if not m:
            raise ProfileError(f"{name}:{lineno}: not a node or edge line: {line[:80]!r}")
        values = {}
        for item in m.group(3).split(","):
            key, _, val = item.strip().partition("=")
            try:
                # a node with several outputs lists them as "[a; b; c]": they all leave it
                parts = val.strip().strip("[]").split(";")
                values[key] = sum(float(x) for x in parts)
            except ValueError:
                raise ProfileError(f"{name}:{lineno}: field {key!r} has non-numeric value "
                                   f"{val!r}") from None
        missing = [f for f in _FIELDS if f not in values]
        if missing:
            raise ProfileError(f"{name}:{lineno}: missing field(s) {', '.join(missing)}")
        bad = [f for f in _FIELDS if not np.isfinite(values[f]) or values[f] < 0]
        if bad:
            raise ProfileError(f"{name}:{lineno}: field {bad[0]} = {values[bad[0]]} must be "
                               f"finite and >= 0")
        node_id = m.group(1)
        if node_id in nodes:
            raise ProfileError(f"{name}:{lineno}: node {node_id} defined twice")
        nodes[node_id] = LayerNode(node_id, m.group(2).strip(), values["forward_compute_time"],
                                   values["backward_compute_time"], values["activation_size"],
                                   values["parameter_size"])
    for a, b in edges:
        for x in (a, b):
            if x not in nodes:
                raise ProfileError(f"{name}: edge {a} -- {b} names unknown node {x}")
    return LayerGraph(name, nodes, edges)


def load_graph(name_or_path) -> LayerGraph:
    path = resolve_profile(name_or_path)
    graph = parse_graph(path.read_text(), name=str(path))
    graph.name = path.parent.name if path.name == "graph.txt" else path.stem
    return graph


def _node_number(node_id: str) -> int:
    return int(node_id[4:])


def linearize(graph: LayerGraph) -> LayerChain:
    """Topological order of the DAG (see the module docstring) as a :class:`LayerChain`."""
    succ: dict[str, list[str]] = {n: [] for n in graph.nodes}
    pred: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for a, b in graph.edges:
        succ[a].append(b)
        pred[b].append(a)
    drop = {n for n, node in graph.nodes.items()
            if (node.description.startswith("Input") and not pred[n])
            or (node.description.startswith("__getitem__") and not succ[n])}
    keep = [n for n in graph.nodes if n not in drop]
    indeg = {n: sum(1 for p in pred[n] if p not in drop) for n in keep}
    heap = [(_node_number(n), n) for n in keep if indeg[n] == 0]
    heapq.heapify(heap)
    order: list[str] = []
    while heap:
        _, n = heapq.heappop(heap)
        order.append(n)
        for s in succ[n]:
            if s in drop:
                continue
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (_node_number(s), s))
    if len(order) != len(keep):
        stuck = sorted(set(keep) - set(order), key=_node_number)[:3]
        raise ProfileError(f"{graph.name}: the layer graph has a cycle (through {', '.join(stuck)})")
    pos = {n: i for i, n in enumerate(order)}
    L = len(order)
    # layer i's activation crosses every cut k with i <= k < (position of its last consumer)
    diff = np.zeros(L + 1)
    for n in order:
        consumers = [pos[s] for s in succ[n] if s in pos]
        if consumers:
            i, last = pos[n], max(consumers)
            diff[i] += graph.nodes[n].activation_bytes
            diff[last] -= graph.nodes[n].activation_bytes
    boundary = np.cumsum(diff)[: max(L - 1, 0)]
    nodes = [graph.nodes[n] for n in order]
    fwd = np.array([x.forward_ms for x in nodes], dtype=np.float64)
    bwd = np.array([x.backward_ms for x in nodes], dtype=np.float64)
    return LayerChain(
        name=graph.name, names=[f"{x.node_id}:{x.description.split('(')[0]}" for x in nodes],
        compute_ms=fwd + bwd, forward_ms=fwd, backward_ms=bwd,
        activation_bytes=np.array([x.activation_bytes for x in nodes], dtype=np.float64),
        parameter_bytes=np.array([x.parameter_bytes for x in nodes], dtype=np.float64),
        boundary_bytes=np.clip(boundary, 0.0, None), members=[[n] for n in order])


def load_chain(name_or_path) -> LayerChain:
    """Read a PipeDream profile and linearise it."""
    return linearize(load_graph(name_or_path))
