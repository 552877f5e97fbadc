"""The Aggregator's protocol: ``out[v] = reduce_{u -> v} w_uv x_q[u]`` over a CSR graph."""
from __future__ import annotations

import numpy as np

from gnnweave.contract import Unit
from gnnweave.host.driver.core import AGGREGATOR_CONFIG, AGGREGATOR_COUNTERS
from gnnweave.host.driver.io import beat_elements, buffer_address, flush, free, invalidate
from gnnweave.host.driver.validate import check_graph, check_timeout, validate_job


class AggregatorProtocol:
    """:meth:`aggregate` on an :class:`~.core.AccelCore`."""

    def check_graph(self, graph, weights=None):
        """Validate ``graph`` (and its int16 edge ``weights``) once -> a
        :class:`~.validate.CheckedGraph` to pass to every :meth:`aggregate` of it (the
        column chunks of a wide feature matrix)."""
        return check_graph(graph, weights)

    def aggregate(self, graph, x_q, reduce="sum", shift: int = 0, weights=None, *,
                  timeout_s: float | None = None):
        """``out[v] = reduce_{u -> v} w_uv x_q[u]`` on the accelerator -> ``(out, counters)``.

        ``graph`` a CSR graph (``.indptr``, ``.indices``) or a :class:`~.validate.CheckedGraph`
        (then ``weights`` are its own);
        ``x_q`` int16 values ``[N, F]`` (``1 <= F <=`` :attr:`max_feat_dim`), ``weights``
        int16 per edge (or None), ``shift`` the narrowing shift (0..63). ``out`` is int64
        ``[N, F]``; ``counters`` the performance counters and status flags of the run.
        """
        timeout_s = check_timeout(timeout_s, self.default_timeout_s)
        indptr, indices, x, red, shift, w = validate_job(
            graph, x_q, reduce, shift, weights, max_feat_dim=self.max_feat_dim,
            timeout_s=timeout_s)
        n, f = x.shape
        e = indices.shape[0]
        self._check_idle()
        beat = self.bus_bytes
        stride_elems = beat_elements(f, 2, beat)
        bufs = {}
        try:
            bufs["indptr"] = self.io.allocate((beat_elements(n + 1, 4, beat),), np.uint32)
            bufs["indices"] = self.io.allocate((beat_elements(e, 4, beat),), np.uint32)
            bufs["weights"] = self.io.allocate((beat_elements(e, 2, beat),), np.int16) \
                if w is not None else None
            bufs["feat"] = self.io.allocate((max(n, 1), stride_elems), np.int16)
            bufs["out"] = self.io.allocate((max(n, 1), stride_elems), np.int16)
            _fill(bufs["indptr"], indptr)
            _fill(bufs["indices"], indices)
            if w is not None:
                _fill(bufs["weights"], w)
            bufs["feat"][:n, :f] = x
            bufs["feat"][:n, f:] = 0
            bufs["out"][:] = 0
            for b in bufs.values():
                if b is not None:
                    flush(b)
            regs = {"num_nodes": n, "num_edges": e, "feat_dim": f, "reduce_op": int(red),
                    "use_weights": int(w is not None), "shift": shift,
                    "feat_stride": 2 * stride_elems, "out_stride": 2 * stride_elems}
            for name, b in bufs.items():
                regs[f"{name}_addr"] = buffer_address(b) if b is not None else 0
                regs[f"{name}_size"] = b.nbytes if b is not None else 0
            counters = self._run(Unit.AGGREGATOR, AGGREGATOR_CONFIG, regs, AGGREGATOR_COUNTERS,
                                 timeout_s, f"N={n}, E={e}, F={f}")
            invalidate(bufs["out"])
            return np.array(bufs["out"][:n, :f], dtype=np.int64), counters
        finally:
            for b in bufs.values():
                if b is not None:
                    free(b)


def _fill(buf, values):
    """``values`` at the start of a 1-D buffer, zeros after them."""
    buf[:len(values)] = values
    buf[len(values):] = 0
