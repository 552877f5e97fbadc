"""Cycle model of the accelerator as built: how many clock cycles a job takes, and how long.

The model follows the Aggregator's structure (``hw/aggregator.py``) node by node, with the
build's parameters and a few constants fitted to the simulated device (the Verilated RTL):

* **edge control** walks the row pointers: ``deg(v) + node_walk`` cycles per node (one per
  edge, one each to read ``indptr[v+1]`` and to close the node), one index per cycle at most;
  the index stream's FIFO (``meta_fifo_beats``) refills once per memory round trip.
* **read channel** (one R beat per cycle, shared by the four readers): a node costs its
  gathered rows (``deg(v) * ceil(F * 2 / bus_bytes)`` beats) plus its share of the index,
  weight and row-pointer streams; a row's beats arrive a memory latency after edge control
  issued it. Row credits: at most ``reads_in_flight`` beats are requested and not yet
  reduced, and the memory holds at most ``max_outstanding`` bursts, so each refills once
  per round trip (``latency + credit_round_trip``).
* **reduce** consumes one beat per cycle as the beats arrive; the accumulators are
  double-banked, so a node's last beat waits until the node before it is drained
  (``row_beats + drain_gap`` cycles after it closed, ``multiply_stages`` more when it had
  edges); an empty node costs one cycle.
* the job ends ``fixed`` cycles after the last node closes (start, check, drain, the last
  write response).

The stages are cut-through queues in series, ``D(v) = max(D(v-1) + s(v), arrival(v))``;
the credit feedback (a row cannot be requested before the beat ``reads_in_flight`` earlier
was reduced) points backwards only, so one pass over the nodes solves it. The per-node
service times are computed with numpy, the pass is a plain loop (about a microsecond a
node). The sequence of in-degrees is the whole input: which sources are gathered does not
change the time (every row is ``ceil(F * 2 / bus_bytes)`` beats), the order of the nodes
does.

A feature width over ``max_feat_dim`` runs as column chunks of at most ``max_feat_dim``
(as the driver's executor runs it), one job each.

The build parameters (exported from ``gnnweave/buildconfig.py`` into
``cyclemodel.json`` beside this module) and the fitted constants are data; refit after an
RTL change with ``python -m gnnweave.host.cyclefit fit`` (and ``fit-mac``), check with
``python -m gnnweave.host.cyclefit check``.

Clock: seconds are ``cycles / clock_hz``; ``clock_hz`` is the clock the build's timing
estimate says it reaches where the data file records one for the configuration, else the
documented default :data:`DEFAULT_CLOCK_MHZ`; :attr:`BuildModel.clock_source` says which.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

#: The fitted constants and the build parameters of every named configuration.
DATA_FILE = Path(__file__).with_name("cyclemodel.json")
FORMAT = "gnnweave-cyclemodel"
FORMAT_VERSION = 1
#: The configuration the ``fpga-sim`` executor builds (``driver.open_sim_accel``).
DEFAULT_CONFIG = "small"
#: Clock when no timing estimate of the build is recorded: deliberately below every measured
#: build (the pipelined units estimate 250 MHz or more on UltraScale+; docs/cycle-model.md),
#: so an unmeasured FPGA is never made to look faster than it is.
DEFAULT_CLOCK_MHZ = 100.0
#: The simulated device's memory: read latency (cycles) and bursts it accepts at once.
DEFAULT_LATENCY = 32
DEFAULT_MAX_OUTSTANDING = 64
REDUCES = ("sum", "mean", "max")


class CycleModelError(ValueError):
    """A cycle-model file or query that cannot be used; the message names the field."""


@dataclass(frozen=True)
class AggregatorBuild:
    """The Aggregator parameters the timing depends on (``hw.aggregator.AggregatorConfig``)."""

    bus_width: int = 128
    elem_width: int = 16
    max_feat_dim: int = 256
    reads_in_flight: int = 128
    meta_fifo_beats: int = 32
    meta_burst_beats: int = 16
    desc_depth: int = 256
    reduce_ops: tuple = REDUCES

    @property
    def bus_bytes(self) -> int:
        return self.bus_width // 8

    def row_beats(self, feat_dim: int) -> int:
        return -(-feat_dim * (self.elem_width // 8) // self.bus_bytes)

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "AggregatorBuild":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise CycleModelError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        kw = {k: (tuple(v) if k == "reduce_ops" else int(v)) for k, v in d.items()}
        return cls(**kw)


@dataclass(frozen=True)
class AggregatorTiming:
    """Constants fitted to the simulated device (cycles).

    ``fixed``: start, configuration check, pipeline fill and the last drain and write
    response; ``node_walk``: edge-control cycles of a node besides its edges (reading its
    row pointer, closing it); ``empty_walk``: the further edge-control cost of a node
    without edges (the row-pointer stream's pace); ``drain_gap``: cycles between a bank's drain and the next
    close beyond its row beats; ``multiply_stages``: the further wait when the drained node
    had edges (its last product still on the way into the bank); ``issue_lead``: from edge control closing a node to its last row request
    (added to the memory latency); ``reduce_lag``: from a node's last beat arriving to the
    node closing; ``credit_round_trip``: a credit's way back beyond the memory latency
    (reduce, credit, request registers); ``edge_credit_lag``: how long after a credit
    frees edge control can close a node that waited for it.
    """

    fixed: float = 70.0
    node_walk: float = 2.0
    empty_walk: float = 0.0
    drain_gap: float = 1.0
    multiply_stages: float = 1.0
    issue_lead: float = 0.0
    reduce_lag: float = 0.0
    credit_round_trip: float = 24.0
    edge_credit_lag: float = 9.0

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "AggregatorTiming":
        return cls(**_numbers(cls, d, where))


def _numbers(cls, d: dict, where: str) -> dict:
    """The fields of the dataclass ``cls`` (all floats) from ``d``, each checked."""
    out = {}
    for f in fields(cls):
        v = d.get(f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise CycleModelError(f"{where}.{f.name} = {v!r}: must be a finite number")
        out[f.name] = float(v)
    return out


def _credit_loop(edge_service, read_service, reduce_service, owner, behind, *, issue, lag,
                 read_wait, edge_wait) -> float:
    """The three stages node by node with the credit feedback: node ``v`` (with
    ``owner[v] >= 0``) waits until the beat ``behind[v]`` beats before the end of node
    ``owner[v] < v`` was reduced. Returns when the last node closed. A plain loop over
    Python floats: every dependency points backwards, so one pass is exact."""
    edge = read = red = 0.0
    reduce_done = []
    append = reduce_done.append
    for es, rs, bs, o, back in zip(edge_service.tolist(), read_service.tolist(),
                                   reduce_service.tolist(), owner.tolist(), behind.tolist()):
        edge += es
        if o >= 0:
            freed = reduce_done[o] - back
            edge = max(edge, freed + edge_wait)
            read = max(read + rs, edge + issue, freed + read_wait)
        else:
            read = max(read + rs, edge + issue)
        red = max(red + bs, read + lag)
        append(red)
    return red


def _crossing_share(stride: int, row_bytes: int, boundary: int = 4096) -> float:
    """Share of rows ``v * stride`` (from a page-aligned base) that cross a 4 KiB boundary
    (those are read as two bursts)."""
    period = boundary // math.gcd(stride, boundary)
    starts = (np.arange(period) * stride) % boundary
    return float(np.mean(starts + row_bytes > boundary))


@dataclass(frozen=True)
class AggregatorModel:
    """Cycles of one Aggregator run; see the module docstring for the structure."""

    build: AggregatorBuild
    timing: AggregatorTiming
    latency: int = DEFAULT_LATENCY
    max_outstanding: int = DEFAULT_MAX_OUTSTANDING

    def job_cycles(self, degrees, feat_dim: int, *, weighted: bool = False,
                   reduce: str = "sum", detail: dict | None = None) -> float:
        """Busy cycles of one run over nodes with in-degrees ``degrees`` (in node order),
        ``feat_dim <= max_feat_dim`` features. ``detail`` (a dict) receives the per-stage
        totals."""
        b, t = self.build, self.timing
        self._check(feat_dim, reduce, limit=b.max_feat_dim)
        deg = np.asarray(degrees, dtype=np.float64)
        if deg.ndim != 1 or (deg.size and deg.min() < 0):
            raise CycleModelError("degrees: must be a 1-D array of non-negative in-degrees")
        if deg.size == 0:
            return float(t.fixed)
        bpb = b.bus_bytes
        rb = b.row_beats(feat_dim)
        round_trip = self.latency + t.credit_round_trip
        # edge control: one edge a cycle, or the index FIFO's refill rate
        per_index = max(1.0, round_trip / (b.meta_fifo_beats * bpb / 4))
        edge_service = deg * per_index + t.node_walk + t.empty_walk * (deg == 0)
        # read channel: rows plus the metadata streams' beats, or the credit/burst refill rate
        meta_beats = deg * (4 / bpb) + (deg * (b.elem_width // 8) / bpb if weighted else 0.0) \
            + 4 / bpb
        bursts = deg * (1.0 + _crossing_share(rb * bpb, rb * bpb))
        read_service = np.maximum.reduce([
            deg * rb + meta_beats,
            deg * rb * round_trip / b.reads_in_flight,
            bursts * round_trip / self.max_outstanding])
        # reduce: a beat a cycle; the bank of the node before must be drained first
        had_edges = np.concatenate([[0.0], (deg[:-1] > 0).astype(np.float64)])
        reduce_service = np.maximum(np.maximum(deg * rb, 1.0),
                                    rb + t.drain_gap + t.multiply_stages * had_edges)
        # credits: node v's last row waits for the beat `reads_in_flight` before its last
        row_end = np.cumsum(deg * rb)
        freeing_beat = row_end - b.reads_in_flight
        owner = np.minimum(np.searchsorted(row_end, freeing_beat, side="left"), deg.size - 1)
        # within one node (a hub of more than `reads_in_flight` beats) the credit refill
        # rate in read_service holds instead
        waits = (freeing_beat > 0) & (owner < np.arange(deg.size))
        reduce_done = _credit_loop(
            edge_service, read_service, reduce_service,
            np.where(waits, owner, -1), row_end - freeing_beat,
            issue=self.latency + t.issue_lead, lag=t.reduce_lag,
            read_wait=round_trip + rb, edge_wait=t.edge_credit_lag)
        if detail is not None:
            detail.update(edge_cycles=float(edge_service.sum()),
                          read_beats=float((deg * rb + meta_beats).sum()),
                          reduce_cycles=float(reduce_service.sum()))
        return float(t.fixed + reduce_done)

    def cycles(self, degrees, feat_dim: int, *, weighted: bool = False,
               reduce: str = "sum") -> float:
        """Busy cycles of an aggregation of any width: column chunks of ``max_feat_dim``."""
        self._check(feat_dim, reduce)
        step = self.build.max_feat_dim
        total = 0.0
        for c0 in range(0, feat_dim, step):
            total += self.job_cycles(degrees, min(step, feat_dim - c0), weighted=weighted,
                                     reduce=reduce)
        return total

    def _check(self, feat_dim, reduce, limit=None):
        if isinstance(feat_dim, bool) or not isinstance(feat_dim, (int, np.integer)) \
                or feat_dim < 1 or (limit is not None and feat_dim > limit):
            top = f"1..{limit}" if limit is not None else ">= 1"
            raise CycleModelError(f"feat_dim = {feat_dim!r}: must be an integer in {top}")
        if reduce not in self.build.reduce_ops:
            raise CycleModelError(f"reduce = {reduce!r}: this build has "
                                  f"{', '.join(self.build.reduce_ops)}")


# --------------------------------------------------------------------------- MacArray


@dataclass(frozen=True)
class MacArrayBuild:
    """The MacArray parameters the timing depends on (``hw.mac_array.MacArrayConfig``)."""

    rows: int = 8
    cols: int = 8
    max_dim: int = 128
    max_depth: int = 128
    bus_width: int = 128
    max_burst: int = 16

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "MacArrayBuild":
        known = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in d.items() if k in known})


@dataclass(frozen=True)
class MacArrayTiming:
    """MacArray constants (cycles): ``fixed`` per run (start, check, first request, last
    write response); ``tile_fill`` per tile beyond its depth (the skewed array's fill and
    drain); ``step_overhead`` per block step; ``write_cycles`` per result beat (single-beat
    writes, one per ``cols`` outputs of a row)."""

    fixed: float = 40.0
    tile_fill: float = 8.0
    step_overhead: float = 4.0
    write_cycles: float = 1.0

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "MacArrayTiming":
        return cls(**_numbers(cls, d, where))


@dataclass(frozen=True)
class MacArrayModel:
    """Cycles of one MacArray run from its tiling (``hw/mac_array.py``).

    The output is cut into ``max_dim`` blocks and the depth into ``max_depth`` blocks; each
    step loads its operand blocks in whole beats (``P`` only when its block changes unless
    the depth is split), double-banked, so a step costs the longer of its load and its
    ``ceil(bm / rows) * ceil(bn / cols)`` tiles of ``depth + tile_fill`` cycles; the last
    depth block writes ``bm * ceil(bn / cols)`` single-beat result segments.
    """

    build: MacArrayBuild
    timing: MacArrayTiming = MacArrayTiming()
    latency: int = DEFAULT_LATENCY

    def _load_beats(self, mode, bm, bn, bd, load_p):
        epb = self.build.bus_width // 16
        beats = lambda rows, cols: rows * -(-cols // epb)  # noqa: E731
        p = {"fwd": beats(bm, bd), "dx": beats(bm, bd), "dw": beats(bd, bm)}[mode]
        q = {"fwd": beats(bd, bn), "dx": beats(bn, bd), "dw": beats(bd, bn)}[mode]
        return (p if load_p else 0) + q

    def cycles(self, m: int, k: int, n: int, mode: str = "fwd") -> float:
        if mode not in ("fwd", "dx", "dw"):
            raise CycleModelError(f"mode = {mode!r}: choose fwd, dx or dw")
        b, t = self.build, self.timing
        split = k > b.max_depth
        total, first = float(t.fixed + self.latency), True
        for bi in range(-(-m // b.max_dim)):
            bm = min(b.max_dim, m - bi * b.max_dim)
            for bj in range(-(-n // b.max_dim)):
                bn = min(b.max_dim, n - bj * b.max_dim)
                for bk in range(-(-k // b.max_depth)):
                    bd = min(b.max_depth, k - bk * b.max_depth)
                    load = self._load_beats(mode, bm, bn, bd, split or bj == 0)
                    compute = -(-bm // b.rows) * -(-bn // b.cols) * (bd + t.tile_fill)
                    total += (load if first else 0) + max(load, compute) + t.step_overhead
                    first = False
                total += t.write_cycles * bm * -(-bn // b.cols)
        return total


# --------------------------------------------------------------------------- the build


@dataclass(frozen=True)
class BuildModel:
    """Every unit's model of one named configuration, and its clock."""

    config: str
    aggregator: AggregatorModel
    mac_array: MacArrayModel | None
    clock_hz: float
    clock_source: str
    fit: dict = field(default_factory=dict)

    def seconds(self, cycles: float) -> float:
        return float(cycles) / self.clock_hz


def read_data(path=None) -> dict:
    path = Path(path) if path is not None else DATA_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CycleModelError(f"{path}: no cycle model data (run `python -m "
                              f"gnnweave.host.cyclemodel fit`)") from None
    except json.JSONDecodeError as e:
        raise CycleModelError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CycleModelError(f"{path}: not a gnnweave cycle model (field 'format')")
    if data.get("version") != FORMAT_VERSION:
        raise CycleModelError(f"{path}: version {data.get('version')!r}, expected {FORMAT_VERSION}")
    for key in ("configs", "aggregator_fit"):
        if not isinstance(data.get(key), dict):
            raise CycleModelError(f"{path}: field {key!r} missing or not an object")
    return data


def load(config: str | None = None, *, latency: int = DEFAULT_LATENCY,
         max_outstanding: int = DEFAULT_MAX_OUTSTANDING, clock_hz: float | None = None,
         path=None) -> BuildModel:
    """The model of the named build (default :data:`DEFAULT_CONFIG`) from the data file."""
    data = read_data(path)
    config = config or DEFAULT_CONFIG
    configs = data["configs"]
    if config not in configs:
        raise CycleModelError(f"config = {config!r}: unknown; the cycle model knows "
                              f"{', '.join(configs)}")
    entry = configs[config]
    where = f"configs.{config}"
    agg = AggregatorBuild.from_dict(entry.get("aggregator") or {}, f"{where}.aggregator")
    fit = data["aggregator_fit"]
    timing = AggregatorTiming.from_dict(fit.get("constants") or {}, "aggregator_fit.constants")
    mac = entry.get("mac_array")
    mac_fit = data.get("mac_array_fit") or {}
    mac_timing = (MacArrayTiming.from_dict(mac_fit["constants"], "mac_array_fit.constants")
                  if mac_fit.get("constants") else MacArrayTiming())
    mac_model = None if mac is None else MacArrayModel(
        MacArrayBuild.from_dict(mac, f"{where}.mac_array"), mac_timing, latency)
    if clock_hz is not None:
        if not clock_hz > 0:
            raise CycleModelError(f"clock_hz = {clock_hz!r}: must be > 0")
        hz, source = float(clock_hz), "given"
    elif entry.get("est_fmax_mhz"):
        hz, source = float(entry["est_fmax_mhz"]) * 1e6, entry.get(
            "clock_source", "timing estimate of the build (est_fmax_mhz)")
    else:
        hz, source = DEFAULT_CLOCK_MHZ * 1e6, (
            f"default {DEFAULT_CLOCK_MHZ:g} MHz (no timing estimate recorded for {config!r})")
    return BuildModel(config, AggregatorModel(agg, timing, int(latency), int(max_outstanding)),
                      mac_model, hz, source, dict(fit))


def report_fields(config: str, degrees, feat_dim: int, *, measured: int, reduce: str = "sum",
                  weighted: bool = False, latency: int = DEFAULT_LATENCY) -> dict:
    """``predicted_cycles`` of a run beside its ``measured`` cycles, for a command's report:
    the relative error, and the predicted time at the build's clock (and where that clock
    comes from). A build or query the model cannot take gives ``predicted_cycles`` None and
    ``cycle_model_error``."""
    try:
        build = load(config, latency=latency)
        cycles = build.aggregator.cycles(degrees, feat_dim, weighted=weighted, reduce=reduce)
    except CycleModelError as exc:
        return {"predicted_cycles": None, "cycle_model_error": str(exc)}
    # the error and the time of the whole cycles printed, so the report agrees with itself
    cycles = round(cycles)
    return {"predicted_cycles": cycles,
            "predicted_error_pct": round(100 * (cycles / max(measured, 1) - 1), 2),
            "predicted_seconds": build.seconds(cycles), "clock_mhz": build.clock_hz / 1e6,
            "clock_source": build.clock_source}
