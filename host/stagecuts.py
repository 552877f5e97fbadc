"""Cuts of a layer DAG: the downward-closed sets of layers a pipeline's stages run between.

A pipeline of a DAG of layers is a chain of downsets ``{} = D_0 < D_1 < ... < D_S = V``
(a downset holds every predecessor of each of its layers); stage ``s`` runs the layers
``D_s - D_{s-1}``, and the activations leaving ``D_{s-1}`` cross the boundary before it.
A chain of layers has exactly ``L + 1`` downsets (its prefixes); a branched DAG has more.

:class:`CutSpace` holds a family of downsets as a boolean membership matrix, their prefix
sums (compute, parameters, activations), the bytes that cross each cut, and which pairs
``(D_k, D_j)`` may be consecutive cuts. Builders:

* :func:`pipedream_cuts` -- PipeDream's antichain DAG (``optimizer_graph_hierarchical.py``):
  from the antichain of the first source, a state's successors replace one node of its
  *augmented* antichain (the antichain plus every predecessor that has an edge leaving the
  predecessors of its antichain node) by one of that node's successors, when no descendant
  of the new node is in the augmented antichain. The bytes crossing a state's cut are the
  activations of its augmented antichain, and a stage may run between a state and any state
  reachable from it, exactly as PipeDream's optimizer counts them.
* :func:`all_cuts` -- every downset (breadth-first, one available layer at a time), with the
  exact crossing bytes: the activations of every layer inside the cut that has a consumer
  outside it. Exponential in the DAG's width; ``limit`` bounds it.
* :func:`chain_cuts` -- the prefixes of one topological order (a chain; what a planner that
  cuts a linearised model sees).

Every family starts with the empty cut (index 0) and ends with the whole graph (last index);
cuts are ordered by size, so a cut's strict subsets come before it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from gnnweave.errors import InputError
from gnnweave.host.profiles import LayerGraph, ProfileError


class CutLimitError(InputError):
    """More downsets than the given limit; the message names the model and the limit."""


@dataclass
class CutSpace:
    """A family of downsets of ``layers`` (see the module docstring).

    Shapes: ``members`` [S, N] bool; ``compute_ms``, ``parameter_bytes``,
    ``activation_bytes``, ``out_bytes`` [S]; ``may_follow`` [S, S] bool with
    ``may_follow[k, j]`` true when a stage may run the layers ``members[j] - members[k]``.
    """

    name: str
    kind: str
    layers: list[str]
    members: np.ndarray
    compute_ms: np.ndarray
    parameter_bytes: np.ndarray
    activation_bytes: np.ndarray
    out_bytes: np.ndarray
    may_follow: np.ndarray
    layer_compute_ms: np.ndarray          # [N] forward + backward of each layer
    layer_parameter_bytes: np.ndarray     # [N]
    layer_activation_bytes: np.ndarray    # [N]

    def __len__(self) -> int:
        return self.members.shape[0]

    @property
    def num_pairs(self) -> int:
        return int(self.may_follow.sum())

    def stage_layers(self, k: int, j: int) -> list[str]:
        """The layers of the stage between cut ``k`` and cut ``j`` (topological order)."""
        idx = np.flatnonzero(self.members[j] & ~self.members[k])
        return [self.layers[i] for i in idx]


def _dag(graph: LayerGraph):
    """Kept node ids (``Input*`` sources and unused ``__getitem__`` sinks dropped, as
    PipeDream's optimizer does), in file order, with successor / predecessor index lists."""
    succ = {n: [] for n in graph.nodes}
    pred = {n: [] for n in graph.nodes}
    for a, b in graph.edges:
        succ[a].append(b)
        pred[b].append(a)
    inputs = {n for n, x in graph.nodes.items() if x.description.startswith("Input") and not pred[n]}
    # PipeDream removes the __getitem__ sinks of the graph left after removing the inputs
    sinks = {n for n, x in graph.nodes.items()
             if n not in inputs and x.description.startswith("__getitem__")
             and not [s for s in succ[n]]}
    keep = [n for n in graph.nodes if n not in inputs and n not in sinks]
    index = {n: i for i, n in enumerate(keep)}
    out = [[index[s] for s in succ[n] if s in index] for n in keep]
    inn = [[index[p] for p in pred[n] if p in index] for n in keep]
    return keep, out, inn


def _closures(out: list[list[int]], inn: list[list[int]], name: str):
    """Strict ancestor and descendant bitsets (Python ints) of every node."""
    n = len(out)
    indeg = [len(p) for p in inn]
    order, queue = [], deque(i for i in range(n) if indeg[i] == 0)
    while queue:
        i = queue.popleft()
        order.append(i)
        for s in out[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    if len(order) != n:
        raise ProfileError(f"{name}: the layer graph has a cycle")
    anc = [0] * n
    for i in order:
        for p in inn[i]:
            anc[i] |= anc[p] | (1 << p)
    desc = [0] * n
    for i in reversed(order):
        for s in out[i]:
            desc[i] |= desc[s] | (1 << s)
    return anc, desc, order


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _to_bool(masks: list[int], n: int) -> np.ndarray:
    """Python-int bitsets as a [len(masks), n] bool matrix (bit i = column i)."""
    nb = max(1, (n + 7) // 8)
    buf = np.frombuffer(b"".join(m.to_bytes(nb, "little") for m in masks), dtype=np.uint8)
    bits = np.unpackbits(buf.reshape(len(masks), nb), axis=1, bitorder="little")
    return bits[:, :n].astype(bool)


def _to_int(row: np.ndarray) -> int:
    return int.from_bytes(np.packbits(row, bitorder="little").tobytes(), "little")


def _nested(members: np.ndarray) -> np.ndarray:
    """[S, S] bool: row k a strict subset of row j (rows sorted by size)."""
    m = members.astype(np.float32)
    size = members.sum(axis=1)
    return ((m @ m.T) == size[:, None]) & (size[:, None] < size[None, :])


def _space(graph: LayerGraph, keep, kind, cuts: list[int], out_bytes, follow) -> CutSpace:
    """``follow``: [len(cuts)]^2 bool in the order of ``cuts``, ``"nested"`` (every strict
    subset) or ``"chain"`` (cuts already in chain order)."""
    nodes = [graph.nodes[n] for n in keep]
    comp = np.array([x.forward_ms + x.backward_ms for x in nodes], dtype=np.float64)
    par = np.array([x.parameter_bytes for x in nodes], dtype=np.float64)
    act = np.array([x.activation_bytes for x in nodes], dtype=np.float64)
    N, S = len(keep), len(cuts)
    members = _to_bool(cuts, N)
    order = np.lexsort((np.arange(S), members.sum(axis=1)))
    members = members[order]
    out_b = np.asarray(out_bytes, dtype=np.float64)[order]
    if isinstance(follow, str) and follow == "chain":
        may = np.triu(np.ones((S, S), dtype=bool), 1)
    elif isinstance(follow, str):
        may = _nested(members)
    else:
        may = np.asarray(follow, dtype=bool)[np.ix_(order, order)]
    names = [f"{n}:{graph.nodes[n].description.split('(')[0]}" for n in keep]
    mf = members.astype(np.float64)
    return CutSpace(graph.name, kind, names, members, mf @ comp, mf @ par, mf @ act, out_b,
                    may, comp, par, act)


def pipedream_cuts(graph: LayerGraph, limit: int = 50000) -> CutSpace:
    """PipeDream's antichain DAG of ``graph`` as a :class:`CutSpace` (module docstring);
    :class:`CutLimitError` past ``limit`` states."""
    keep, out, inn = _dag(graph)
    if not keep:
        raise ProfileError(f"{graph.name}: no layers left after dropping inputs")
    anc, desc, _ = _closures(out, inn, graph.name)
    act = [graph.nodes[n].activation_bytes for n in keep]
    full = (1 << len(keep)) - 1

    # augment(A) = A + the union over a in A of extra(a): the predecessors of a with an edge
    # leaving a's predecessors (a itself excepted); extra(a) depends on a alone
    N = len(keep)
    ancestors = _to_bool(anc, N)                                  # [a, p]: p before a
    inside = ancestors | np.eye(N, dtype=bool)
    adj = _adjacency(out)                                         # [p, y]: edge p -> y
    leaving = (np.asarray(adj.sum(axis=1)).ravel()[None, :]
               - (adj @ inside.T.astype(np.float32)).T)           # [a, p]
    extra = [_to_int(row) for row in ancestors & (leaving > 0.5)]

    # states are antichains as bitsets; a state's transitions are memoised by its id
    def augment(antichain: int) -> int:
        mask = antichain
        for a in _bits(antichain):
            mask |= extra[a]
        return mask

    def deaugment(nodes: int) -> int:   # keep the nodes none of whose descendants is there
        out, rest = nodes, nodes
        while rest:
            low = rest & -rest
            if desc[low.bit_length() - 1] & nodes:
                out ^= low
            rest ^= low
        return out

    def downset(antichain: int) -> int:
        mask = antichain
        for a in _bits(antichain):
            mask |= anc[a]
        return mask

    sources = [i for i in range(N) if not inn[i]]
    start = 1 << sources[0]
    ids = {start: 0}
    states, augmented = [start], [augment(start)]
    edges: list[set[int]] = []
    queue = deque([start])
    while queue:
        a = queue.popleft()
        aug = augmented[ids[a]]
        nexts = set()
        for x in _bits(aug):
            rest = aug & ~(1 << x)
            for y in out[x]:
                if (a >> y) & 1 or desc[y] & aug:
                    continue
                nxt = deaugment(rest | (1 << y))
                if nxt not in ids:
                    if len(ids) >= limit:
                        raise CutLimitError(f"{graph.name}: PipeDream's antichain DAG has more "
                                            f"than {limit} states")
                    ids[nxt] = len(states)
                    states.append(nxt)
                    augmented.append(augment(nxt))
                    queue.append(nxt)
                nexts.add(ids[nxt])
        edges.append(nexts)
    masks = [downset(a) for a in states]
    if full not in masks:
        raise ProfileError(f"{graph.name}: the antichain DAG does not reach the whole graph "
                           f"(several sources?)")
    # transitive successors in the antichain DAG (bit j + 1 for state j: row 0 is the empty
    # cut, which every state may follow)
    sizes = [m.bit_count() for m in masks]
    reach = [0] * len(states)
    for i in sorted(range(len(states)), key=lambda i: -sizes[i]):
        r = 0
        for j in edges[i]:
            r |= reach[j] | (1 << (j + 1))
        reach[i] = r
    S = len(states) + 1
    follow = _to_bool([((1 << S) - 1) ^ 1] + reach, S)
    out_bytes = [0.0] + [sum(act[u] for u in _bits(aug)) for aug in augmented]
    return _space(graph, keep, "pipedream", [0] + masks, out_bytes, follow)


def _adjacency(out):
    """Sparse [N, N] float32: 1 for each edge u -> v."""
    from scipy.sparse import csr_matrix

    rows = [u for u, vs in enumerate(out) for _ in vs]
    cols = [v for vs in out for v in vs]
    return csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)),
                      shape=(len(out), len(out)))


def _frontier_bytes(cuts: list[int], out, act) -> np.ndarray:
    """Bytes leaving each cut: the activations of its layers with a consumer outside it."""
    members = _to_bool(cuts, len(out))
    outside = (_adjacency(out) @ (~members).T.astype(np.float32)).T   # [S, u]: consumers outside
    return (members & (outside > 0.5)).astype(np.float64) @ np.asarray(act, dtype=np.float64)


def all_cuts(graph: LayerGraph, limit: int = 20000) -> CutSpace:
    """Every downset of ``graph`` (exact crossing bytes); :class:`CutLimitError` past
    ``limit`` downsets."""
    keep, out, inn = _dag(graph)
    anc, _, _ = _closures(out, inn, graph.name)
    act = [graph.nodes[n].activation_bytes for n in keep]
    seen = {0}
    queue = deque([0])
    while queue:
        m = queue.popleft()
        for u in range(len(keep)):
            if not (m >> u) & 1 and (anc[u] & m) == anc[u]:
                nm = m | (1 << u)
                if nm not in seen:
                    seen.add(nm)
                    if len(seen) > limit:
                        raise CutLimitError(f"{graph.name}: more than {limit} downsets; use "
                                            f"PipeDream's antichain cuts (cuts='pipedream')")
                    queue.append(nm)
    cuts = sorted(seen, key=lambda c: (c.bit_count(), c))
    return _space(graph, keep, "all", cuts, _frontier_bytes(cuts, out, act), "nested")


def chain_cuts(graph: LayerGraph) -> CutSpace:
    """The prefixes of the topological order of :func:`~gnnweave.host.profiles.linearize`
    (exact crossing bytes); a stage may run between any two prefixes."""
    from gnnweave.host.profiles import linearize

    keep, out, inn = _dag(graph)
    act = [graph.nodes[n].activation_bytes for n in keep]
    index = {n: i for i, n in enumerate(keep)}
    order = [index[m[0]] for m in linearize(graph).members]
    cuts, mask = [0], 0
    for u in order:
        mask |= 1 << u
        cuts.append(mask)
    # a layer's activation crosses the prefixes from its own to its last consumer's
    pos = np.empty(len(keep), dtype=np.int64)
    pos[order] = np.arange(len(order))
    cross = np.zeros(len(cuts) + 1)
    for u, vs in enumerate(out):
        if vs:
            last = max(pos[v] for v in vs)
            if last > pos[u]:
                cross[pos[u] + 1] += act[u]
                cross[last + 1] -= act[u]
    return _space(graph, keep, "chain", cuts, np.cumsum(cross)[:len(cuts)], "chain")


def union_cuts(*spaces: CutSpace) -> CutSpace:
    """The downsets of several families of one graph; a stage may run between any two
    nested ones. The crossing bytes of a cut present in several families: the smallest."""
    first = spaces[0]
    rows: dict[bytes, tuple[np.ndarray, float]] = {}
    for sp in spaces:
        if sp.layers != first.layers:
            raise ValueError("union_cuts: the families describe different graphs")
        for s in range(len(sp)):
            key = np.packbits(sp.members[s]).tobytes()
            prev = rows.get(key)
            if prev is None or sp.out_bytes[s] < prev[1]:
                rows[key] = (sp.members[s], float(sp.out_bytes[s]))
    items = sorted(rows.values(), key=lambda t: int(t[0].sum()))
    members = np.array([m for m, _ in items])
    may = _nested(members)
    mf = members.astype(np.float64)
    return CutSpace(first.name, "+".join(sp.kind for sp in spaces), first.layers, members,
                    mf @ first.layer_compute_ms, mf @ first.layer_parameter_bytes,
                    mf @ first.layer_activation_bytes, np.array([b for _, b in items]), may,
                    first.layer_compute_ms, first.layer_parameter_bytes,
                    first.layer_activation_bytes)
