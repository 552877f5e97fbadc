"""Synthetic graphs and datasets that need no download.

* :func:`rmat` — Graph500 R-MAT (Kronecker) graphs for benchmarks: skewed degrees,
  any size, generated vectorised in numpy (scale 18, edge factor 16 takes ~1 s).
* :func:`sbm` — a stochastic block model with planted classes and class-correlated
  features, split like Planetoid, on which a GCN learns a meaningful classifier.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph

if TYPE_CHECKING:
    from gnnweave.datasets import Dataset

#: Graph500 initiator probabilities (A, B, C; D = 1 - A - B - C).
GRAPH500_ABC = (0.57, 0.19, 0.19)


# int64 source and target, a float32 draw and masks per level, the CSR and its sort
_RMAT_BYTES_PER_EDGE = 48


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_memory(what: str, need_bytes: int, advice: str) -> None:
    """Refuse up front what cannot fit this machine's memory, instead of a MemoryError (or
    a swapping machine) later; ``advice`` says what to make smaller."""
    have = _physical_memory_bytes()
    if have is not None and need_bytes > have:
        raise InputError(f"{what}: needs about {need_bytes / 2**30:,.1f} GiB, this machine has "
                         f"{have / 2**30:,.1f} GiB; {advice}")


def rmat_edges(scale: int, edge_factor: int, *, a: float = GRAPH500_ABC[0],
               b: float = GRAPH500_ABC[1], c: float = GRAPH500_ABC[2], seed=0,
               permute: bool = True) -> np.ndarray:
    """The R-MAT edge list as an int64 ``[2, E]`` array (row 0 source, row 1 target).

    ``E = edge_factor * 2**scale`` edges exactly as drawn, the way the Graph500
    reference generator draws them: at each of the ``scale`` levels an edge falls into
    the quadrant (source bit, target bit) = (0,0), (0,1), (1,0), (1,1) with probability
    a, b, c, d = 1-a-b-c. Duplicate edges and self loops are kept (Graph500 keeps them
    too and leaves it to the kernel to ignore them). ``permute`` relabels the vertices
    with a random permutation and shuffles the edge order, as Graph500 does, so that
    vertex id carries no information about degree.
    """
    if not 0 <= scale <= 40:
        raise InputError(f"rmat: scale must be in 0..40, got {scale}")
    if edge_factor < 0:
        raise InputError(f"rmat: edge_factor must be >= 0, got {edge_factor}")
    d = 1.0 - a - b - c
    if min(a, b, c) < 0 or d < -1e-12:
        raise InputError(f"rmat: a, b, c must be >= 0 with a + b + c <= 1, got {a}, {b}, {c}")
    rng = np.random.default_rng(seed)
    num_nodes = 1 << scale
    num_edges = int(edge_factor) * num_nodes
    check_fits_memory(f"rmat:{scale}:{edge_factor}", num_edges * _RMAT_BYTES_PER_EDGE,
                      "choose a smaller scale or edge factor")
    src = np.zeros(num_edges, dtype=np.int64)
    dst = np.zeros(num_edges, dtype=np.int64)
    # One uniform u per level picks the quadrant: [0, a) -> (0,0), [a, a+b) -> (0,1),
    # [a+b, a+b+c) -> (1,0), [a+b+c, 1) -> (1,1). Same distribution as Graph500's two
    # draws (source bit, then target bit given it), half the random numbers.
    t_a, t_ab, t_abc = (np.float32(t) for t in (a, a + b, a + b + c))
    for level in range(scale):
        u = rng.random(num_edges, dtype=np.float32)
        src_bit = u >= t_ab
        dst_bit = (u >= t_a) ^ src_bit ^ (u >= t_abc)
        src |= src_bit.astype(np.int64) << level
        dst |= dst_bit.astype(np.int64) << level
    if permute:
        relabel = rng.permutation(num_nodes)
        order = rng.permutation(num_edges)
        src, dst = relabel[src[order]], relabel[dst[order]]
    return np.stack([src, dst])


def rmat(scale: int, edge_factor: int, *, a: float = GRAPH500_ABC[0],
         b: float = GRAPH500_ABC[1], c: float = GRAPH500_ABC[2], seed=0,
         symmetric: bool = False, permute: bool = True) -> CSRGraph:
    """Graph500 R-MAT graph with ``N = 2**scale`` nodes as a destination-grouped CSR.

    ``edge_factor * N`` edges are drawn (see :func:`rmat_edges`; duplicates and self
    loops kept as drawn). ``symmetric=True`` also stores every edge reversed (2E
    directed edges, an undirected graph as Graph500 treats it); otherwise the edges are
    directed source -> target. Unweighted.
    """
    edges = rmat_edges(scale, edge_factor, a=a, b=b, c=c, seed=seed, permute=permute)
    if symmetric:
        edges = np.concatenate([edges, edges[::-1]], axis=1)
    return CSRGraph.from_edge_index(edges, 1 << scale)


#: What ``sbm`` / ``load_dataset("sbm")`` use when not told (Cora-sized).
SBM_DEFAULTS = dict(num_nodes=2708, num_classes=7, feat_dim=64, avg_degree=8.0, homophily=0.8)


def sbm_edges(block_sizes, p_in: float, p_out: float, *, seed=0) -> np.ndarray:
    """Undirected stochastic-block-model edges over nodes ``0..N-1`` laid out block after
    block: each unordered pair inside a block is an edge with probability ``p_in``, each
    pair across two blocks with ``p_out``, independently. Returns int64 ``[2, 2M]`` with
    both directions of every edge, no self loops, no duplicates.

    Vectorised: the edge count of each block pair is drawn from its binomial, then that
    many distinct pairs uniformly (so it scales to large sparse graphs).
    """
    for name, p in (("p_in", p_in), ("p_out", p_out)):
        if not 0.0 <= p <= 1.0:
            raise InputError(f"sbm: {name} must be in [0, 1], got {p}")
    sizes = np.asarray(block_sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    rng = np.random.default_rng(seed)
    src_parts, dst_parts = [], []
    for i in range(sizes.shape[0]):
        for j in range(i, sizes.shape[0]):
            if i == j:
                pairs = int(sizes[i] * (sizes[i] - 1) // 2)
                count = rng.binomial(pairs, p_in) if pairs else 0
                chosen = rng.choice(pairs, size=count, replace=False) if count else np.zeros(0, np.int64)
                high, low = unrank_lower_triangle(chosen)
                src_parts.append(starts[i] + high)
                dst_parts.append(starts[i] + low)
            else:
                pairs = int(sizes[i] * sizes[j])
                count = rng.binomial(pairs, p_out) if pairs else 0
                chosen = rng.choice(pairs, size=count, replace=False) if count else np.zeros(0, np.int64)
                src_parts.append(starts[i] + chosen // sizes[j])
                dst_parts.append(starts[j] + chosen % sizes[j])
    src = np.concatenate(src_parts).astype(np.int64) if src_parts else np.zeros(0, np.int64)
    dst = np.concatenate(dst_parts).astype(np.int64) if dst_parts else np.zeros(0, np.int64)
    return np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])])


def unrank_lower_triangle(rank) -> tuple[np.ndarray, np.ndarray]:
    """Rank r of the strict lower triangle (row-major: (1,0), (2,0), (2,1), (3,0), ...)
    -> (row, column)."""
    rank = np.asarray(rank, dtype=np.int64)
    row = np.floor((1.0 + np.sqrt(1.0 + 8.0 * rank.astype(np.float64))) / 2.0).astype(np.int64)
    # float sqrt may be one off for large ranks: fix up so that row*(row-1)/2 <= r < row*(row+1)/2
    row -= (row * (row - 1) // 2) > rank
    row += ((row + 1) * row // 2) <= rank
    return row, rank - row * (row - 1) // 2


def sbm(num_nodes: int = SBM_DEFAULTS["num_nodes"],
        num_classes: int = SBM_DEFAULTS["num_classes"], *,
        p_in: float | None = None, p_out: float | None = None,
        feat_dim: int = SBM_DEFAULTS["feat_dim"], seed=0,
        avg_degree: float = SBM_DEFAULTS["avg_degree"],
        homophily: float = SBM_DEFAULTS["homophily"],
        feature_signal: float = 1.0, name: str | None = None) -> "Dataset":
    """A node-classification dataset with planted classes (no download needed).

    * Classes: ``num_classes`` blocks of (nearly) equal size; node ids are shuffled so a
      block is not a contiguous id range.
    * Graph: :func:`sbm_edges` (undirected, both directions stored, no self loops).
      ``p_in``/``p_out`` default to the values that give an expected degree of
      ``avg_degree`` with a fraction ``homophily`` of the edges inside a class.
    * Features: float32 ``feature_signal * mean[class] + N(0, I)``, the class means
      random Gaussian vectors of norm ~1 (two means ~1.4 apart, against unit noise). With the
      defaults the features alone are a weak signal and neighbourhood averaging (what a
      GCN does) makes them much stronger: a GCN reaches a clearly better accuracy than
      a feature-only model.
    * Split: :func:`gnnweave.datasets.standard_split` (20 per class / 500 / 1000).
    """
    from gnnweave.datasets import Dataset, standard_split
    if num_classes < 1 or num_nodes < num_classes:
        raise InputError(f"sbm: need 1 <= num_classes <= num_nodes, got {num_classes}, {num_nodes}")
    sizes = np.full(num_classes, num_nodes // num_classes, dtype=np.int64)
    sizes[: num_nodes % num_classes] += 1
    if p_in is None or p_out is None:
        inside = float(np.sum(sizes * (sizes - 1))) / num_nodes    # same-class others per node
        across = float(num_nodes - 1) - inside
        if p_in is None:
            p_in = min(1.0, homophily * avg_degree / inside) if inside > 0 else 0.0
        if p_out is None:
            p_out = min(1.0, (1 - homophily) * avg_degree / across) if across > 0 else 0.0
    rng = np.random.default_rng([seed, 10])
    edges = sbm_edges(sizes, p_in, p_out, seed=[seed, 11])
    block_of = np.repeat(np.arange(num_classes, dtype=np.int64), sizes)
    relabel = rng.permutation(num_nodes)        # position in block layout -> node id
    y = np.empty(num_nodes, dtype=np.int64)
    y[relabel] = block_of
    edges = relabel[edges]
    means = rng.standard_normal((num_classes, feat_dim)) / np.sqrt(max(feat_dim, 1))
    x = (feature_signal * means[y] + rng.standard_normal((num_nodes, feat_dim))).astype(np.float32)
    train, val, test = standard_split(y, seed=seed)
    graph = CSRGraph.from_edge_index(edges, num_nodes)
    return Dataset(name or f"sbm:{num_nodes}:{num_classes}", graph, x, y, train, val, test)
