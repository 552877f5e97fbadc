"""What each device did when: records of executor ops, a timeline PNG, a partition table.

Every op the trainer runs goes through :meth:`Timeline.record`, which stores the
host-clock interval of the call, the executor's :class:`~gnnweave.host.executors.OpResult`
figures and the op's sizes (the keys the cost model predicts from). The PNG has one row
per device: compute (ops), transfer (host <-> device copies) and the idle gaps between.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


TRANSFER_OPS = ("transfer_in", "transfer_out")
HOST_OPS = ("sample",)   # host work recorded on the 'host' row (neighbour sampling)
FPGA_KINDS = ("fpga", "fpga-sim", "fpga-emu")


@dataclass
class OpRecord:
    device: str
    kind: str                 # the executor's kind: cpu, gpu, fpga-emu, ...
    op: str
    start: float              # host clock (perf_counter) relative to the timeline's origin
    end: float
    wall_seconds: float
    device_seconds: float | None
    bytes_in: int
    bytes_out: int
    epoch: int
    sizes: dict = field(default_factory=dict)
    saturations: int = 0
    cpu_seconds: float | None = None   # CPU time of the calling thread (host executors)

    @property
    def category(self) -> str:
        if self.op in TRANSFER_OPS:
            return "transfer"
        return "host" if self.op in HOST_OPS else "compute"

    @property
    def clock(self) -> str:
        """Which clock :attr:`measured_seconds` reads: ``device`` (an FPGA's cycle counters
        at the board's clock; fpga-emu's cycle model), ``cpu`` (the calling thread's CPU
        time) or ``wall`` (host wall clock)."""
        if self.kind in FPGA_KINDS and self.device_seconds is not None:
            return "device"
        if self.kind == "cpu" and self.cpu_seconds is not None:
            return "cpu"
        return "wall"

    @property
    def measured_seconds(self) -> float:
        """The profiler's clock for the kind: device time on FPGA kinds (the cycle estimate
        on fpga-emu), the calling thread's CPU time on ``cpu`` (shards run in threads
        that wait on each other for the GIL; their wall times would count the waiting),
        else host wall time."""
        if self.kind in FPGA_KINDS and self.device_seconds is not None:
            return float(self.device_seconds)
        if self.kind == "cpu" and self.cpu_seconds is not None:
            return float(self.cpu_seconds)
        return float(self.wall_seconds)


class Timeline:
    """Thread-safe list of :class:`OpRecord` (shards and the prefetcher record concurrently)."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.records: list[OpRecord] = []
        self.epoch = 0
        self._lock = threading.Lock()
        self.enabled = True

    def record(self, executor, result, start: float, end: float, sizes: dict | None = None,
               cpu_seconds: float | None = None) -> OpRecord:
        """Store the op (unless disabled) and return its record."""
        rec = OpRecord(device=executor.name, kind=executor.kind, op=result.op,
                       start=start - self.origin, end=end - self.origin,
                       wall_seconds=float(result.wall_seconds),
                       device_seconds=None if result.device_seconds is None
                       else float(result.device_seconds),
                       bytes_in=int(result.bytes_in), bytes_out=int(result.bytes_out),
                       epoch=self.epoch, sizes=dict(sizes or {}),
                       saturations=int(getattr(result, "saturations", 0)),
                       cpu_seconds=cpu_seconds)
        if self.enabled:
            with self._lock:
                self.records.append(rec)
        return rec

    def record_host(self, op: str, start: float, end: float, sizes: dict | None = None):
        """Host-side work that is no executor op (sampling a mini-batch), on the 'host' row."""
        if not self.enabled:
            return
        rec = OpRecord(device="host", kind="host", op=op, start=start - self.origin,
                       end=end - self.origin, wall_seconds=end - start, device_seconds=None,
                       bytes_in=0, bytes_out=0, epoch=self.epoch, sizes=dict(sizes or {}))
        with self._lock:
            self.records.append(rec)

    def call(self, executor, method: str, *args, sizes: dict | None = None, **kw):
        """Run ``executor.method(*args, **kw)``, record it, return the OpResult."""
        return self.call_timed(executor, method, *args, sizes=sizes, **kw)[0]

    def call_timed(self, executor, method: str, *args, sizes: dict | None = None, **kw):
        """As :meth:`call`; returns ``(OpResult, seconds on the kind's clock)`` (see
        :attr:`OpRecord.measured_seconds`)."""
        c0 = time.thread_time()
        t0 = time.perf_counter()
        res = getattr(executor, method)(*args, **kw)
        t1 = time.perf_counter()
        rec = self.record(executor, res, t0, t1, sizes, time.thread_time() - c0)
        return res, rec.measured_seconds

    def of_epoch(self, epoch: int) -> list[OpRecord]:
        with self._lock:
            return [r for r in self.records if r.epoch == epoch]

    def devices(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.records:
            seen.setdefault(r.device)
        return list(seen)

    def summary(self, epoch: int | None = None) -> dict[str, dict]:
        """Per device: compute / transfer seconds (measured), ops, bytes, saturations."""
        recs = self.records if epoch is None else self.of_epoch(epoch)
        out: dict[str, dict] = {}
        for r in recs:
            d = out.setdefault(r.device, dict(kind=r.kind, compute_s=0.0, transfer_s=0.0,
                                              wall_s=0.0, ops=0, bytes_in=0, bytes_out=0,
                                              saturations=0, by_op={}))
            d[f"{r.category}_s"] = d.get(f"{r.category}_s", 0.0) + r.measured_seconds
            d["wall_s"] += r.wall_seconds
            d["ops"] += 1
            d["bytes_in"] += r.bytes_in
            d["bytes_out"] += r.bytes_out
            d["saturations"] += r.saturations
            d["by_op"][r.op] = d["by_op"].get(r.op, 0.0) + r.measured_seconds
        return out

    def to_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.records]


def _merge(intervals):
    """Union of [start, end) intervals, sorted."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def busy_fractions(records: list[OpRecord]) -> dict[str, dict[str, float]]:
    """Per device: fraction of the span (first start .. last end) in compute / transfer / idle."""
    if not records:
        return {}
    t0 = min(r.start for r in records)
    t1 = max(r.end for r in records)
    span = max(t1 - t0, 1e-12)
    out = {}
    for dev in dict.fromkeys(r.device for r in records):
        mine = [r for r in records if r.device == dev]
        frac = {}
        for cat in ("compute", "transfer", "host"):
            t = sum(e - s for s, e in _merge([(r.start, r.end) for r in mine if r.category == cat]))
            if t or cat != "host":
                frac[cat] = t / span
        busy = sum(e - s for s, e in _merge([(r.start, r.end) for r in mine]))
        out[dev] = dict(frac, idle=max(0.0, 1 - busy / span))
    return out


# what each op is, as the timeline labels it: (label, colour)
OP_LABELS = {
    ("aggregate", 0): ("aggregate fwd", "tab:blue"),
    ("aggregate", 1): ("aggregate bwd", "tab:cyan"),
    ("dense_forward", 0): ("transform fwd", "tab:purple"),
    ("dense_input_grad", 0): ("transform bwd (dX)", "tab:pink"),
    ("dense_weight_grad", 0): ("transform bwd (dW)", "tab:red"),
    ("transfer_in", 0): ("copy in", "tab:orange"),
    ("transfer_out", 0): ("copy out", "gold"),
    ("sample", 0): ("sampling", "tab:green"),
}
CLOCK_NAMES = {"device": "device clock", "cpu": "thread CPU time", "wall": "host wall clock"}


def op_label(record: OpRecord) -> tuple[str, str]:
    """``(label, colour)`` of a record: the operation and, for aggregations, its pass."""
    key = (record.op, int(record.sizes.get("transpose", 0)) if record.op == "aggregate" else 0)
    return OP_LABELS.get(key, (record.op, "0.45"))


def plot_timeline(timeline: Timeline | list[OpRecord], path, *, epochs=None, title: str = "") -> Path:
    """PNG of one training step: one row per device, each block one operation (aggregate /
    transform, forward / backward, copies, sampling), time in ms from the step's start.

    A block starts where the host issued the call and lasts the op's measured time on the
    device's own clock (named on its row: the cycle counters or cycle model on FPGA kinds,
    the thread's CPU time on ``cpu``, else host wall time), so each row's busy time is the
    figure the partition table reports for that device. The row label gives the busy share
    of the step on that clock.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    records = timeline.records if isinstance(timeline, Timeline) else list(timeline)
    if epochs is not None:
        wanted = set(epochs)
        records = [r for r in records if r.epoch in wanted]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    devices = list(dict.fromkeys(r.device for r in records))
    fig, ax = plt.subplots(figsize=(12, 1.4 + 0.7 * max(1, len(devices))))
    used: dict[str, str] = {}
    if records:
        t0 = min(r.start for r in records)
        span = max(max(r.end, r.start + r.measured_seconds) for r in records) - t0
        clocks = measured_clocks(records)
        labels = []
        for row, dev in enumerate(devices):
            mine = [r for r in records if r.device == dev]
            for r in mine:
                label, color = op_label(r)
                used[label] = color
                x, w = 1e3 * (r.start - t0), max(1e3 * r.measured_seconds, 1e-6)
                ax.broken_barh([(x, w)], (row - 0.38, 0.76), facecolors=color,
                               edgecolors="white", linewidth=0.3)
                if w > 0.06 * 1e3 * span:
                    ax.text(x + w / 2, row, label, ha="center", va="center", fontsize=7,
                            color="white", clip_on=True)
            busy = sum(r.measured_seconds for r in mine)
            clock = "host" if dev == "host" else clocks.get(dev, "wall")
            labels.append(f"{dev}\n{CLOCK_NAMES.get(clock, clock)}\n"
                          f"busy {1e3 * busy:.2f} ms ({100 * busy / span:.0f} %)" if span > 0
                          else dev)
        ax.set_yticks(range(len(devices)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_xlim(0, 1e3 * span)
        ax.legend(handles=[Patch(color=c, label=l) for l, c in used.items()], loc="upper left",
                  bbox_to_anchor=(1.005, 1.0), fontsize=8, title="operation", title_fontsize=8)
    ax.set_xlabel("time from the start of the step (ms); block length on the row's clock")
    ax.set_title(title or "training step")
    ax.invert_yaxis()
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def measured_clocks(records: list[OpRecord]) -> dict[str, str]:
    """Per device: the clock(s) its measured seconds come from (:attr:`OpRecord.clock`),
    e.g. ``{'fpga-emu': 'device', 'cpu': 'cpu'}``; ``'device+wall'`` where they mix."""
    seen: dict[str, dict[str, None]] = {}
    for r in records:
        if r.category != "host":
            seen.setdefault(r.device, {})[r.clock] = None
    return {dev: "+".join(clocks) for dev, clocks in seen.items()}


def partition_rows_table(graph, shares: dict, measured: dict | None = None,
                         predicted: dict | None = None, clocks: dict | None = None,
                         ran: dict | None = None) -> list[dict]:
    """One row per device: node range, rows, edges, edge share, measured seconds (and the
    clock they were read from: :func:`measured_clocks`), predicted seconds; ``ran``
    (with work stealing): the share of the aggregated edges each device actually ran."""
    total = max(graph.num_edges, 1)
    rows = []
    for dev, (lo, hi) in shares.items():
        e = int(graph.indptr[hi] - graph.indptr[lo])
        row = dict(device=dev, lo=int(lo), hi=int(hi), rows=int(hi - lo), edges=e,
                   edge_share=e / total)
        if measured is not None:
            row["measured_s"] = measured.get(dev)
            if clocks is not None:
                row["clock"] = clocks.get(dev)
        if predicted is not None:
            row["predicted_s"] = predicted.get(dev)
        if ran is not None:
            row["ran_edge_share"] = ran.get(dev, 0.0)
        rows.append(row)
    return rows


def format_partition_table(rows: list[dict]) -> str:
    """Plain-text table of :func:`partition_rows_table`."""
    cols = ["device", "lo", "hi", "rows", "edges", "edge_share"]
    if rows and "measured_s" in rows[0]:
        cols.append("measured_s")
    if rows and "clock" in rows[0]:
        cols.append("clock")
    if rows and "predicted_s" in rows[0]:
        cols.append("predicted_s")
    if rows and "ran_edge_share" in rows[0]:
        cols.append("ran_edge_share")

    def fmt(col, v):
        if v is None:
            return "-"
        if col in ("edge_share", "ran_edge_share"):
            return f"{v:.3f}"
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)
    table = [cols] + [[fmt(c, r.get(c)) for c in cols] for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(t, widths)) for t in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def interval_overlap(a: list[OpRecord], b: list[OpRecord]) -> float:
    """Seconds during which some record of ``a`` and some record of ``b`` ran at once."""
    ma = _merge([(r.start, r.end) for r in a])
    mb = _merge([(r.start, r.end) for r in b])
    i = j = 0
    total = 0.0
    while i < len(ma) and j < len(mb):
        lo = max(ma[i][0], mb[j][0])
        hi = min(ma[i][1], mb[j][1])
        if hi > lo:
            total += hi - lo
        if ma[i][1] < mb[j][1]:
            i += 1
        else:
            j += 1
    return total


__all__ = ["OpRecord", "Timeline", "busy_fractions", "plot_timeline", "op_label", "measured_clocks",
           "partition_rows_table",
           "format_partition_table", "interval_overlap"]
