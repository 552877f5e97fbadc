"""The engine of a training step: every matrix op goes through it.

Dense ops (feature transform, input and weight gradients) run on one executor; each
aggregation runs as row shards on the executors of a partition (or whole on one
executor), the shards concatenated in row order, optionally overlapped with the dense
device (row chunks) and with work stealing between shard devices. Every op is recorded
on a :class:`~gnnweave.host.timeline.Timeline`.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gnnweave.errors import InputError
from gnnweave.graph import CSRGraph
from gnnweave.host.executors import Executor, operand_nbytes, transposed
from gnnweave.host.timeline import FPGA_KINDS, Timeline


def cut_rows_by_fractions(indptr, lo: int, hi: int, fractions) -> list[tuple[int, int]]:
    """Contiguous row ranges of ``[lo, hi)`` holding about ``fractions`` of its edges."""
    fr = np.asarray(fractions, dtype=np.float64)
    fr = fr / fr.sum() if fr.sum() > 0 else np.full(len(fr), 1.0 / len(fr))
    e0, e1 = int(indptr[lo]), int(indptr[hi])
    bounds = [lo]
    cum = np.cumsum(fr)[:-1]
    for c in cum:
        target = e0 + c * (e1 - e0)
        b = int(np.searchsorted(indptr[lo:hi + 1], target, side="left")) + lo
        bounds.append(min(max(b, bounds[-1]), hi))
    bounds.append(hi)
    return list(zip(bounds[:-1], bounds[1:]))


def check_shares(shares: dict, num_nodes: int) -> dict[str, tuple[int, int]]:
    """Validate ``{device: (lo, hi)}``: contiguous, in order, covering ``0..num_nodes``."""
    if not isinstance(shares, dict) or not shares:
        raise InputError("partition: expected a non-empty {device: (lo, hi)} mapping")
    out = {}
    expect = 0
    for dev, rng in shares.items():
        try:
            lo, hi = (int(v) for v in rng)
        except (TypeError, ValueError):
            raise InputError(f"partition[{dev!r}] = {rng!r}: expected (lo, hi)") from None
        if lo != expect or hi < lo:
            raise InputError(f"partition[{dev!r}] = ({lo}, {hi}): ranges must be contiguous from 0 "
                             f"in device order (expected lo = {expect}, lo <= hi)")
        out[str(dev)] = (lo, hi)
        expect = hi
    if expect != num_nodes:
        raise InputError(f"partition: ranges end at node {expect}, the graph has {num_nodes} nodes")
    return out


class Engine:
    """Runs and records the ops of a training step on executors.

    ``shards``: ``{device: (executor, (lo, hi))}`` over the nodes of the full graph, or
    None for aggregation on ``dense`` alone. A graph with a different node count (a
    sampled block) is cut into row ranges holding the same edge fractions.

    ``steal``: the shard devices steal rows from each other within each aggregation
    (:func:`~gnnweave.host.partition.run_with_stealing`): a device whose rows are done takes
    the back end of a slower one's. The chunks run one after another on the host, scheduled
    on the devices' own clocks (device time on FPGA kinds, CPU time on cpu), which is the
    order concurrent devices would run them in; ``steal_costs`` (``{device: ShareCost}``,
    default: equal per-edge costs, corrected from the first chunks) predict the chunks.
    """

    def __init__(self, dense: Executor, timeline: Timeline | None = None, *,
                 shards: dict[str, tuple[Executor, tuple[int, int]]] | None = None,
                 num_nodes: int | None = None, base_graph: CSRGraph | None = None,
                 overlap_chunks: int = 1, steal: bool = False, steal_costs=None):
        if (isinstance(overlap_chunks, bool) or not isinstance(overlap_chunks, (int, np.integer))
                or overlap_chunks < 1):
            raise InputError(f"overlap_chunks = {overlap_chunks!r}: expected an integer >= 1")
        self.dense = dense
        self.timeline = timeline or Timeline()
        self.num_nodes = num_nodes
        self.base_graph = base_graph
        self.overlap_chunks = int(overlap_chunks)
        self.steal = bool(steal)
        self.steal_costs = steal_costs
        self.steals = 0          # row ranges stolen so far (reported per run)
        self.row_sum = None      # sum over rows for bias gradients; None: a.sum(axis=0)
        self.shards = None
        self._pool = None
        self._dense_worker = None
        self._fractions = None
        self.set_shards(shards)

    def set_shards(self, shards: dict[str, tuple[Executor, tuple[int, int]]] | None):
        """Replace the partition (between steps; the rebalancer calls this)."""
        self.close()
        self.shards = shards if shards else None
        self._fractions = None
        if self.shards:
            g = self.base_graph
            self._fractions = [int(g.indptr[hi] - g.indptr[lo]) if g is not None else hi - lo
                               for _, (lo, hi) in self.shards.values()]
            if len(self.shards) > 1:
                self._pool = ThreadPoolExecutor(max_workers=len(self.shards),
                                                thread_name_prefix="gnnweave-shard")

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._dense_worker is not None:
            self._dense_worker.shutdown(wait=True)
            self._dense_worker = None

    def overlaps(self) -> bool:
        """True when a layer's aggregation runs in row chunks overlapped with the dense work
        they feed: ``overlap_chunks > 1``, the aggregation is partitioned onto executors
        that are not the dense one (one executor never runs two ops at once), and the dense
        executor computes each row on its own (an FPGA kind quantises a whole operand with
        one format taken from its range, so a chunk would round differently)."""
        if self.overlap_chunks < 2 or not self.shards:
            return False
        if any(ex is self.dense for ex, _ in self.shards.values()):
            return False
        return getattr(self.dense, "kind", "") not in FPGA_KINDS

    def pipelined_aggregate(self, graph: CSRGraph, x: np.ndarray, n_dst: int, consume) -> list:
        """Aggregate rows ``[0, n_dst)`` in ``overlap_chunks`` row chunks (about equal edge
        counts); ``consume(lo, hi, out_rows)`` runs on one dense worker thread, in chunk
        order, while the aggregation executors work on the next chunk (HyGCN / HP-GNN's
        aggregation -> combination pipeline). Returns ``consume``'s results in row order."""
        ranges = [r for r in cut_rows_by_fractions(graph.indptr, 0, n_dst,
                                                   [1.0] * self.overlap_chunks) if r[1] > r[0]]
        if isinstance(x, np.ndarray) and x.base is None:
            # every chunk reads all of x: read-only, an FPGA executor quantises it once for
            # all chunks (its cache holds read-only arrays) instead of once per chunk
            x.flags.writeable = False
        if self._dense_worker is None:
            self._dense_worker = ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="gnnweave-dense")
        futures = []
        try:
            for lo, hi in ranges:
                part = self.aggregate(graph, x, rows=(lo, hi))
                futures.append(self._dense_worker.submit(consume, lo, hi, part))
            return [f.result() for f in futures]
        finally:
            for f in futures:   # never leave the dense executor busy behind an error
                f.cancel() or f.exception()

    def _call(self, ex, method, *args, sizes=None, **kw):
        return self.timeline.call(ex, method, *args, sizes=sizes, **kw).value

    def _agg_timed(self, ex, graph, x, reduce, rows, transpose):
        """One executor's aggregation of ``rows``, recorded: ``(result rows, seconds on the
        kind's clock)``."""
        g = transposed(graph) if transpose else graph
        lo, hi = rows
        sizes = dict(edges=int(g.indptr[hi] - g.indptr[lo]), rows=hi - lo, feat=int(x.shape[1]),
                     nodes=int(g.num_nodes), transpose=int(bool(transpose)))
        res, seconds = self.timeline.call_timed(ex, "aggregate", graph, x, reduce, rows=rows,
                                                transpose=transpose, sizes=sizes)
        return res.value, seconds

    def _agg_one(self, ex, graph, x, reduce, rows, transpose):
        return self._agg_timed(ex, graph, x, reduce, rows, transpose)[0]

    def aggregate(self, graph: CSRGraph, x: np.ndarray, *, rows=None, transpose=False,
                  reduce="sum") -> np.ndarray:
        n = graph.num_nodes
        lo, hi = rows if rows is not None else (0, n)
        if self.shards is None:
            return self._agg_one(self.dense, graph, x, reduce, (lo, hi), transpose)
        if n == self.num_nodes and (lo, hi) == (0, n):
            ranges = [r for _, r in self.shards.values()]
        else:
            g = transposed(graph) if transpose else graph
            ranges = cut_rows_by_fractions(g.indptr, lo, hi, self._fractions)
        if self.steal and len(self.shards) > 1:
            return self._aggregate_stealing(graph, x, reduce, transpose, ranges, lo, hi)
        jobs = [(ex, r) for (ex, _), r in zip(self.shards.values(), ranges) if r[1] > r[0]]
        if not jobs:
            return np.zeros((0, x.shape[1]), dtype=np.float32)
        if self._pool is None or len(jobs) == 1:
            parts = [self._agg_one(ex, graph, x, reduce, r, transpose) for ex, r in jobs]
        else:
            futures = [self._pool.submit(self._agg_one, ex, graph, x, reduce, r, transpose)
                       for ex, r in jobs]
            parts = [f.result() for f in futures]
        return np.concatenate(parts, axis=0)

    def _aggregate_stealing(self, graph, x, reduce, transpose, ranges, lo, hi):
        from gnnweave.host.partition import ShareCost, run_with_stealing
        g = transposed(graph) if transpose else graph
        names = list(self.shards)
        shares = dict(zip(names, ranges))
        costs = self.steal_costs or {d: ShareCost(per_edge_s=1e-9, per_row_s=1e-12)
                                     for d in names}
        parts = {}

        def run_chunk(d, a, b, first):
            parts[a], seconds = self._agg_timed(self.shards[d][0], graph, x, reduce, (a, b),
                                                transpose)
            return seconds
        run = run_with_stealing(g.indptr, shares, costs, run_chunk)
        self.steals += run.steals
        if not parts:
            return np.zeros((0, x.shape[1]), dtype=np.float32)
        out = np.concatenate([parts[a] for a in sorted(parts)], axis=0)
        assert out.shape[0] == hi - lo, (out.shape, lo, hi)
        return out

    def sum_rows(self, a) -> np.ndarray:
        """A bias gradient (a sum over the rows); ``row_sum`` when set (an order-independent
        sum, see :func:`gnnweave.host.distributed.invariant_row_sum`)."""
        return a.sum(axis=0) if self.row_sum is None else self.row_sum(a)

    def dense_forward(self, x, w, b=None, *, relu=False):
        return self._call(self.dense, "dense_forward", x, w, b, relu=relu,
                          sizes=dict(m=x.shape[0], k=x.shape[1], n=w.shape[1]))

    def dense_input_grad(self, dy, w, *, relu_mask=None):
        return self._call(self.dense, "dense_input_grad", dy, w, relu_mask=relu_mask,
                          sizes=dict(m=dy.shape[0], k=w.shape[0], n=dy.shape[1]))

    def dense_weight_grad(self, x, dy, *, relu_mask=None):
        return self._call(self.dense, "dense_weight_grad", x, dy, relu_mask=relu_mask,
                          sizes=dict(m=x.shape[0], k=x.shape[1], n=dy.shape[1]))

    def transfer_in(self, array):
        return self._call(self.dense, "transfer_in", array, sizes=dict(nbytes=operand_nbytes(array)))


# --------------------------------------------------------------------------- layers' graphs
