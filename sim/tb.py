"""cocotb test bench pieces for AXI accelerators (Forencich style) and the Aggregator.

:class:`AxiTB` owns the clock and the active-low reset of a Vitis-style kernel
(``ap_clk``/``ap_rst_n``), a cocotbext-axi ``AxiLiteMaster`` on ``s_axi_control`` and an
``AxiRam`` on ``m_axi_gmem`` with

* a read latency: AR beats accepted by the RAM reach its read process only ``latency``
  cycles later, with up to ``max_outstanding`` bursts in flight (AxiRam itself answers at
  once; see :class:`DelayedReadAddress`);
* pause generators on every AXI channel (:meth:`AxiTB.set_backpressure`);
* optionally a board-like memory (:meth:`AxiTB.set_memory_model`, :class:`MemoryModel`):
  a random extra latency per read burst, an open-row DRAM with 64-byte access
  granularity, bursts of different IDs answered out of order; and injected SLVERR/DECERR
  on chosen bursts (:meth:`AxiTB.inject_error`);
* a memory-safety monitor: every AR/AW burst is checked against the buffers the job
  declared (and against the 4 KiB rule); :attr:`AxiTB.violations` lists offenders;
* register access by name through a register map (``regmap[name].offset``/``.width``,
  64-bit registers as two 32-bit words, low word first).

:class:`AggregatorTB` adds :meth:`~AggregatorTB.run_job` for
:class:`~gnnweave.layout.AggregateJob` and :func:`check_job` compares a run with the
golden model word by word.

The runner hands parameters in as JSON (:func:`load_params`) and takes results back
(:func:`store_result`).
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import random
from collections import deque
from dataclasses import dataclass, field

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, RisingEdge, Timer
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiBus, AxiLiteBus, AxiLiteMaster, AxiRam

from gnnweave import contract
from gnnweave.layout import BUFFERS, AggregateJob

CLOCK_NS = 10
MEMORY_BYTES = 1 << 48
BOUNDARY = 4096

#: status register bits of the Aggregator: {name: bit position}
STATUS_BITS = {f.name.lower(): f.bit_length() - 1 for f in contract.AggregatorStatus}
COUNTERS = tuple(n for n in contract.names(contract.AGGREGATOR_STATUS_REGISTERS)
                 if n != contract.STATUS_REGISTER)

AP_START, AP_DONE, AP_IDLE, AP_READY = (contract.CtrlBit[n].mask for n in (
    "AP_START", "AP_DONE", "AP_IDLE", "AP_READY"))


@dataclass(frozen=True)
class _Reg:
    name: str
    offset: int
    width: int = 32


_AP_CTRL = _Reg("ap_ctrl", contract.CTRL_OFFSET)


# ------------------------------------------------------------------ runner protocol
def load_params() -> dict:
    path = os.environ.get("GNNWEAVE_TB_PARAMS")
    if not path:
        return {}
    with open(path) as fh:
        return json.load(fh)


def store_result(key: str, value) -> None:
    """Add ``key: value`` to the run's results JSON (read back by :func:`gnnweave.sim.runner.run`)."""
    path = os.environ.get("GNNWEAVE_TB_RESULTS")
    if not path:
        return
    data = {}
    if os.path.exists(path):
        with open(path) as fh:
            data = json.load(fh)
    data[key] = value
    with open(path, "w") as fh:
        json.dump(data, fh, indent=1, default=_json_default)


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


# ------------------------------------------------------------------ memory model pieces
@dataclass
class Burst:
    kind: str          # "read" or "write"
    addr: int
    beats: int
    size: int          # bytes per beat
    burst: int         # AxBURST
    time_ns: float

    @property
    def nbytes(self) -> int:
        return self.beats * self.size


class MemoryModel:
    """Timing of a board's memory for read bursts (the native harness's model, see
    ``sim/native/harness.cpp``): after the bench latency, an open-row DRAM (8 banks
    interleaved at 2 KiB, 16 KiB rows; a burst holds its bank and the shared data bus for
    one slot per 64-byte chunk it touches, ``row_miss`` cycles more when its bank has
    another row open), then a random ``0..jitter`` cycles of interconnect. ``reorder``:
    bursts of different IDs are answered in the order they become ready."""

    CHUNK, BANKS, BANK_SHIFT, ROW_SHIFT = 64, 8, 11, 14

    def __init__(self, *, reorder: bool = True, jitter: int = 0, dram: bool = True,
                 row_miss: int = 12, seed: int = 0, bus_bytes: int = 16):
        self.reorder, self.jitter, self.dram, self.row_miss = reorder, int(jitter), dram, int(row_miss)
        self.rng = random.Random(seed)
        self.slot = max(1, self.CHUNK // bus_bytes)
        self.open_row = [None] * self.BANKS
        self.bank_free = [0] * self.BANKS
        self.bus_free = 0
        self.row_misses = 0
        self.reordered = 0

    def ready_cycle(self, addr: int, nbytes: int, cycle: int) -> int:
        """Cycle from which a burst that reached the memory at ``cycle`` may be answered."""
        t = cycle
        if self.dram:
            bank = (addr >> self.BANK_SHIFT) % self.BANKS
            row = addr >> self.ROW_SHIFT
            t = max(t, self.bank_free[bank])
            if self.open_row[bank] != row:
                t += self.row_miss
                self.open_row[bank] = row
                self.row_misses += 1
            t = max(t, self.bus_free)
            chunks = (addr + nbytes - 1) // self.CHUNK - addr // self.CHUNK + 1
            self.bus_free = self.bank_free[bank] = t + chunks * self.slot
        return t + (self.rng.randint(0, self.jitter) if self.jitter else 0)


class DelayedReadAddress:
    """Stands in for ``AxiRamRead.ar_channel``: AR beats reach the RAM's read process
    ``latency`` cycles after the handshake.

    A pump task drains the real AR sink as fast as the pause generator allows (so many
    bursts can be accepted and in flight) and timestamps each; :meth:`recv`, which the
    read process awaits, hands a burst over only once its time has come. At most
    ``max_outstanding`` accepted bursts wait here; beyond that the real sink fills and
    ARREADY drops, as a memory controller's queue would. Everything else (pause
    generators, ``clear`` on reset) goes to the real sink.
    """

    def __init__(self, sink, latency: int, max_outstanding: int, on_burst=None, period_ns=CLOCK_NS):
        self._sink = sink
        self.model: MemoryModel | None = None
        self.errors: dict[int, int] = {}     # read burst ordinal -> injected RRESP
        self.answering: deque = deque()      # [beats left, RRESP] of bursts handed over
        self.accepted = 0
        self.latency = int(latency)
        self.max_outstanding = max(1, int(max_outstanding))
        self.period_ns = period_ns
        self.on_burst = on_burst
        self._pending: deque = deque()
        self._in_flight = 0
        self._arrived = Event()
        self._left = Event()
        self._pump_task = cocotb.start_soon(self._pump())

    def __getattr__(self, name):
        return getattr(self._sink, name)

    async def _pump(self):
        while True:
            while self._in_flight >= self.max_outstanding:
                self._left.clear()
                await self._left.wait()
            ar = await self._sink.recv()
            now = get_sim_time("ns")
            if self.on_burst is not None:
                self.on_burst(ar, now)
            self._in_flight += 1
            resp = self.errors.pop(self.accepted, 0)
            self.accepted += 1
            ready_ns = now + self.latency * self.period_ns
            if self.model is not None:
                nbytes = (int(getattr(ar, "arlen", 0)) + 1) << int(getattr(ar, "arsize", 4))
                cycle = round(ready_ns / self.period_ns)
                ready_ns = self.model.ready_cycle(int(ar.araddr), nbytes, cycle) * self.period_ns
            self._pending.append((ready_ns, ar, resp))
            self._arrived.set()

    async def recv(self):
        while not self._pending:
            self._arrived.clear()
            await self._arrived.wait()
        if self.model is not None and self.model.reorder:
            ready_ns, ar, resp = await self._next_ready()
        else:
            ready_ns, ar, resp = self._pending.popleft()
            # whole ns: a float difference of sim times (319.99999) is refused by Timer at 1 ps
            wait = round(ready_ns - get_sim_time("ns"))
            if wait > 0:
                await Timer(wait, "ns")
        # a burst stops counting as outstanding once its latency has passed
        self._in_flight -= 1
        self._left.set()
        self.answering.append([int(getattr(ar, "arlen", 0)) + 1, resp])
        return ar

    async def _next_ready(self):
        """The earliest-ready burst among the oldest of each ID (each ID stays in order),
        waiting a cycle at a time until one is ready."""
        while True:
            now = get_sim_time("ns")
            seen, best = set(), None
            for i, (ready_ns, ar, _) in enumerate(self._pending):
                arid = int(getattr(ar, "arid", 0))
                if arid in seen:
                    continue
                seen.add(arid)
                if ready_ns <= now + 1e-6 and (best is None or ready_ns < self._pending[best][0]):
                    best = i
            if best is not None:
                entry = self._pending[best]
                del self._pending[best]
                if best:
                    self.model.reordered += 1
                return entry
            await Timer(self.period_ns, "ns")

    def clear(self):
        self._pending.clear()
        self.answering.clear()
        self._in_flight = 0
        self._left.set()
        self._sink.clear()

    def stop(self):
        self._pump_task.cancel()


class RecordingChannel:
    """Stands in for ``AxiRamWrite.aw_channel``: reports each AW burst as it is taken, and
    queues the BRESP chosen for it (``errors``: write burst ordinal -> BRESP)."""

    def __init__(self, sink, on_burst):
        self._sink = sink
        self.on_burst = on_burst
        self.errors: dict[int, int] = {}
        self.responses: deque = deque()
        self.accepted = 0

    def __getattr__(self, name):
        return getattr(self._sink, name)

    async def recv(self):
        aw = await self._sink.recv()
        self.on_burst(aw, get_sim_time("ns"))
        self.responses.append(self.errors.pop(self.accepted, 0))
        self.accepted += 1
        return aw

    def clear(self):
        self.responses.clear()
        self._sink.clear()


class ResponseRewriter:
    """Stands in for the RAM's R or B source: beats it sends get the injected response of
    their burst (``next_resp()`` says which), the rest are passed on untouched."""

    def __init__(self, source, field: str, next_resp):
        self._source = source
        self.field = field
        self.next_resp = next_resp

    def __getattr__(self, name):
        return getattr(self._source, name)

    async def send(self, beat):
        resp = self.next_resp()
        if resp:
            setattr(beat, self.field, resp)
        await self._source.send(beat)


def random_pauses(probability: float, seed: int):
    """Infinite generator of pause flags, True with ``probability``."""
    rng = random.Random(seed)
    return (rng.random() < probability for _ in itertools.count())


# ------------------------------------------------------------------ generic AXI kernel bench
class AxiTB:
    """Clock, reset, AXI4-Lite control and AXI4 memory around a Vitis-style kernel."""

    def __init__(self, dut, regmap=None, *, latency: int = 0, max_outstanding: int = 64,
                 control_prefix="s_axi_control", mem_prefix="m_axi_gmem", quiet: bool = True):
        self.dut = dut
        self.regmap = regmap
        self.log = logging.getLogger("cocotb.tb")
        self.clock = dut.ap_clk
        cocotb.start_soon(Clock(dut.ap_clk, CLOCK_NS, unit="ns").start())
        dut.ap_rst_n.value = 0
        self.control = AxiLiteMaster(AxiLiteBus.from_prefix(dut, control_prefix), dut.ap_clk,
                                     dut.ap_rst_n, reset_active_level=False)
        # sparse memory; 2**48 bytes because len() of the default 2**64 overflows
        self.ram = AxiRam(AxiBus.from_prefix(dut, mem_prefix), dut.ap_clk, dut.ap_rst_n,
                          reset_active_level=False, size=MEMORY_BYTES)
        self.bus_bytes = self.ram.read_if.byte_lanes
        self.bursts: list[Burst] = []
        self.violations: list[str] = []
        self._paused_channels: set[str] = set()
        self.read_regions: list[tuple[str, int, int]] = []   # (name, start, end)
        self.write_regions: list[tuple[str, int, int]] = []
        self.ar_delay = DelayedReadAddress(self.ram.read_if.ar_channel, latency, max_outstanding,
                                           on_burst=lambda ar, t: self._on_burst("read", ar, t))
        self.ram.read_if.ar_channel = self.ar_delay
        self.aw_record = RecordingChannel(
            self.ram.write_if.aw_channel, lambda aw, t: self._on_burst("write", aw, t))
        self.ram.write_if.aw_channel = self.aw_record
        self.ram.read_if.r_channel = ResponseRewriter(self.ram.read_if.r_channel, "rresp",
                                                      self._next_read_resp)
        self.ram.write_if.b_channel = ResponseRewriter(self.ram.write_if.b_channel, "bresp",
                                                       self._next_write_resp)
        if quiet:  # cocotbext-axi logs every burst at INFO: far too slow for long runs
            for obj in (self.control.read_if, self.control.write_if, self.ram.read_if, self.ram.write_if):
                obj.log.setLevel(logging.WARNING)
            logging.getLogger(f"cocotb.{dut._name}").setLevel(logging.WARNING)

    # ---------------------------------------------------------------- memory latency & pauses
    def set_latency(self, latency: int, max_outstanding: int | None = None):
        self.ar_delay.latency = int(latency)
        if max_outstanding is not None:
            self.ar_delay.max_outstanding = max(1, int(max_outstanding))

    def set_memory_model(self, model: MemoryModel | None):
        """Answer reads with ``model``'s timing and order (None: the plain bench memory)."""
        self.ar_delay.model = model

    def inject_error(self, kind: str = "read", after: int = 0, resp: int = 2):
        """Answer the ``after``-th ``kind`` burst from now with ``resp`` (2 SLVERR, 3
        DECERR): every beat of a read, the B of a write (whose data the RAM keeps)."""
        if kind == "read":
            self.ar_delay.errors[self.ar_delay.accepted + int(after)] = int(resp)
        elif kind == "write":
            self.aw_record.errors[self.aw_record.accepted + int(after)] = int(resp)
        else:
            raise ValueError(f"inject_error: kind must be 'read' or 'write', not {kind!r}")

    def _next_read_resp(self) -> int:
        burst = self.ar_delay.answering[0]
        burst[0] -= 1
        if burst[0] == 0:
            self.ar_delay.answering.popleft()
        return burst[1]

    def _next_write_resp(self) -> int:
        return self.aw_record.responses.popleft()

    def channels(self) -> dict:
        r, w = self.ram.read_if, self.ram.write_if
        return {"ar": self.ar_delay._sink, "r": r.r_channel._source, "aw": w.aw_channel._sink,
                "w": w.w_channel, "b": w.b_channel._source,
                "ctl_aw": self.control.write_if.aw_channel, "ctl_w": self.control.write_if.w_channel,
                "ctl_b": self.control.write_if.b_channel, "ctl_ar": self.control.read_if.ar_channel,
                "ctl_r": self.control.read_if.r_channel}

    def set_backpressure(self, probability: float | dict | None, seed: int = 0):
        """Random pauses on every channel (a float, or a dict channel -> probability); None: off."""
        for i, (name, channel) in enumerate(self.channels().items()):
            p = probability.get(name, 0.0) if isinstance(probability, dict) else probability
            if p:
                channel.set_pause_generator(random_pauses(float(p), seed * 1000 + i))
                self._paused_channels.add(name)
            elif name in self._paused_channels:
                # never-pausing rather than cleared: clearing mid-run can leave it paused
                channel.set_pause_generator(itertools.repeat(False))

    # ---------------------------------------------------------------- memory safety
    def allow(self, *, read=(), write=()):
        """Declare the buffers bursts may touch: iterables of (name, start, size)."""
        self.read_regions = [(n, a, a + s) for n, a, s in read]
        self.write_regions = [(n, a, a + s) for n, a, s in write]

    def _on_burst(self, kind, beat, time_ns):
        prefix = "ar" if kind == "read" else "aw"
        addr = int(getattr(beat, prefix + "addr"))
        length = int(getattr(beat, prefix + "len", 0)) + 1
        size = 1 << int(getattr(beat, prefix + "size", (self.bus_bytes - 1).bit_length()))
        btype = int(getattr(beat, prefix + "burst", 1))
        burst = Burst(kind, addr, length, size, btype, time_ns)
        self.bursts.append(burst)
        problem = self.check_burst(burst)
        if problem:
            self.violations.append(problem)
            self.log.error("memory safety: %s", problem)

    def check_burst(self, b: Burst) -> str | None:
        where = f"{b.kind} burst at {b.time_ns:.0f} ns: addr 0x{b.addr:x}, {b.beats} beats of {b.size} B"
        if b.burst != 1:
            return f"{where}: burst type {b.burst}, expected INCR (1)"
        if b.size != self.bus_bytes:
            return f"{where}: narrow beats ({b.size} B on a {self.bus_bytes} B bus)"
        if b.addr % b.size:
            return f"{where}: unaligned"
        if (b.addr % BOUNDARY) + b.nbytes > BOUNDARY:
            return f"{where}: crosses a 4 KiB boundary"
        regions = self.read_regions if b.kind == "read" else self.write_regions
        end = b.addr + b.nbytes
        for name, start, stop in regions:
            if start <= b.addr and end <= stop:
                return None
        allowed = ", ".join(f"{n} [0x{s:x}, 0x{e:x})" for n, s, e in regions) or "nothing"
        return f"{where}: bytes [0x{b.addr:x}, 0x{end:x}) outside the allowed {b.kind} buffers ({allowed})"

    def clear_bursts(self):
        self.bursts.clear()
        self.violations.clear()

    # ---------------------------------------------------------------- clocks & reset
    def now_cycles(self) -> int:
        return int(get_sim_time("ns") // CLOCK_NS)

    async def cycles(self, n: int):
        """Wait ``n`` clock cycles with one timer (cheaper than n edge callbacks)."""
        if n > 0:
            await Timer(n * CLOCK_NS, "ns")
            await RisingEdge(self.clock)

    async def reset(self, cycles: int = 8):
        """Active-low synchronous reset; cocotbext-axi models flush their queues with it."""
        await RisingEdge(self.clock)
        self.dut.ap_rst_n.value = 0
        await ClockCycles(self.clock, cycles)
        self.dut.ap_rst_n.value = 1
        await ClockCycles(self.clock, 2)

    # ---------------------------------------------------------------- registers by name
    def reg(self, name: str):
        if self.regmap is None:
            raise RuntimeError("this bench has no register map")
        try:
            return self.regmap[name]
        except KeyError:
            if name == "ap_ctrl":  # the ap_ctrl_hs block sits at 0x00 outside the user registers
                return _AP_CTRL
            raise KeyError(f"register {name!r} is not in the register map") from None

    async def write_reg(self, name: str, value: int):
        r = self.reg(name)
        width = int(getattr(r, "width", contract.DATA_WIDTH))
        try:
            words = contract.split_words(value, width)
        except ValueError:
            raise ValueError(f"register {name}: value {value} does not fit {width} bits") from None
        for i, word in enumerate(words):
            await self.control.write_dword(r.offset + contract.WORD_BYTES * i, word)

    async def read_reg(self, name: str) -> int:
        r = self.reg(name)
        width = int(getattr(r, "width", contract.DATA_WIDTH))
        words = [await self.control.read_dword(r.offset + contract.WORD_BYTES * i)
                 for i in range(len(contract.split_words(0, width)))]
        return contract.join_words(words)

    # ---------------------------------------------------------------- memory
    def load(self, addr: int, data):
        self.ram.write(addr, bytes(np.asarray(data, dtype=np.uint8)) if isinstance(data, np.ndarray) else bytes(data))

    def dump(self, addr: int, length: int) -> np.ndarray:
        return np.frombuffer(self.ram.read(addr, length), dtype=np.uint8)


# ------------------------------------------------------------------ Aggregator bench

    async def reset_during(self, job, *, reads: int = 20, max_cycles: int) -> int:
        """Start ``job``, reset the kernel once ``reads`` read bursts are out (or after
        ``max_cycles``); returns the bursts seen before the reset."""
        task = cocotb.start_soon(self.run_job(job, timeout_cycles=10**6))
        for _ in range(max_cycles):
            await Timer(CLOCK_NS, "ns")
            if sum(b.kind == "read" for b in self.bursts) >= reads:
                break
        task.cancel()
        before = len(self.bursts)
        await self.reset()
        return before

    #: First and largest gap (cycles) between two polls of ap_ctrl.
    poll_gaps = (8, 512)

    async def wait_done(self, timeout_cycles: int) -> int:
        """Poll ap_ctrl (with growing gaps) until ap_done; returns the ap_ctrl value seen."""
        deadline = self.now_cycles() + timeout_cycles
        gap, max_gap = self.poll_gaps
        while True:
            ctrl = await self.read_reg("ap_ctrl")
            if ctrl & AP_DONE:
                return ctrl
            if self.now_cycles() > deadline:
                raise JobTimeout(f"no ap_done within {timeout_cycles} cycles (ap_ctrl=0x{ctrl:x})")
            await self.cycles(gap)
            gap = min(gap * 2, max_gap)


@dataclass
class JobResult:
    out: np.ndarray
    counters: dict
    status: int
    cycles: int                 # cycles from ap_start to ap_done seen (bench view)
    bursts: list
    violations: list
    stray_writes: np.ndarray
    ap_ctrl_after: int = 0
    sim_seconds: float = 0.0
    flags: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"counters": self.counters, "status": self.status, "flags": self.flags,
                "cycles": self.cycles, "read_bursts": sum(b.kind == "read" for b in self.bursts),
                "write_bursts": sum(b.kind == "write" for b in self.bursts),
                "read_beats_seen": sum(b.beats for b in self.bursts if b.kind == "read"),
                "write_beats_seen": sum(b.beats for b in self.bursts if b.kind == "write"),
                "violations": self.violations[:10], "stray_writes": int(len(self.stray_writes)),
                "sim_seconds": self.sim_seconds}


class JobTimeout(AssertionError):
    pass


class AggregatorTB(AxiTB):
    """The Aggregator kernel: program a job, start it, wait for ap_done, read results."""

    async def program(self, job: AggregateJob):
        for name, value in job.registers().items():
            await self.write_reg(name, value)

    def load_job(self, job: AggregateJob):
        self.load(job.base_addr, job.memory_image())
        self.allow(read=[(n, job.regions[n].addr, job.regions[n].size) for n in BUFFERS
                         if n != "out" and (n != "weights" or job.use_weights)],
                   write=[("out", job.regions["out"].addr, job.regions["out"].size)])

    async def start(self):
        await self.write_reg("ap_ctrl", AP_START)

    async def read_counters(self) -> dict:
        return {name: await self.read_reg(name) for name in COUNTERS}

    async def run_job(self, job: AggregateJob, timeout_cycles: int | None = None,
                      load: bool = True) -> JobResult:
        import time
        if load:
            self.load_job(job)
        self.clear_bursts()
        await self.program(job)
        if timeout_cycles is None:
            beats = job.num_edges * -(-job.row_bytes // self.bus_bytes) + job.num_nodes * 4
            timeout_cycles = 20_000 + 20 * beats * max(1, self.ar_delay.latency // 8)
        wall = time.perf_counter()
        t0 = self.now_cycles()
        await self.start()
        ctrl = await self.wait_done(timeout_cycles)
        cycles = self.now_cycles() - t0
        wall = time.perf_counter() - wall
        counters = await self.read_counters()
        status = await self.read_reg("status")
        after = await self.read_reg("ap_ctrl")
        image = self.dump(job.base_addr, job.image_size)
        return JobResult(out=job.read_output(image), counters=counters, status=status,
                         cycles=cycles, bursts=list(self.bursts), violations=list(self.violations),
                         stray_writes=job.stray_writes(image), ap_ctrl_after=after, sim_seconds=wall,
                         flags={k: bool(status >> b & 1) for k, b in STATUS_BITS.items()})


def golden_for(job: AggregateJob):
    from gnnweave.golden.aggregate import Reduce, aggregate_raw
    return aggregate_raw(job.indptr, job.indices, job.x, reduce=Reduce(int(job.reduce)), shift=int(job.shift),
                         out_width=16, weights=job.weights, num_edges=int(job.num_edges))


def check_job(job: AggregateJob, result: JobResult, *, max_feat_dim: int | None = None) -> dict:
    """Assert the run matches the contract and the golden model; returns a summary."""
    problems = []
    if result.violations:
        problems.append(f"{len(result.violations)} memory-safety violations, first: {result.violations[0]}")
    if len(result.stray_writes):
        off = int(result.stray_writes[0])
        problems.append(f"{len(result.stray_writes)} bytes written outside the output rows "
                        f"(first at 0x{job.base_addr + off:x})")
    if result.ap_ctrl_after & AP_DONE:
        problems.append("ap_done did not clear on read")
    if not result.ap_ctrl_after & AP_IDLE:
        problems.append(f"not idle after done (ap_ctrl=0x{result.ap_ctrl_after:x})")
    if result.flags["axi_error"] or result.flags["addr_fault"]:
        problems.append(f"unexpected status 0x{result.status:x} ({result.flags})")
    config_error = max_feat_dim is not None and job.config_error_expected(max_feat_dim)
    summary = {"mismatches": 0, "config_error": config_error}
    if config_error:
        if not result.flags["config_error"]:
            problems.append("config error expected, status.config_error not set")
        if result.bursts:
            problems.append(f"config error but {len(result.bursts)} bursts issued")
        if np.any(result.out != np.int64(np.int16(np.uint16(0xA5A5)))):
            problems.append("config error but output memory changed")
    else:
        gold = golden_for(job)
        if result.flags["config_error"]:
            problems.append(f"unexpected config_error (registers {job.registers()})")
        else:
            bad = np.argwhere(result.out != gold.out)
            summary["mismatches"] = int(bad.shape[0])
            if bad.size:
                v, f = (int(i) for i in bad[0])
                problems.append(f"{bad.shape[0]} output words differ from golden; first out[{v}][{f}] "
                                f"= {int(result.out[v, f])}, golden {int(gold.out[v, f])}")
            expect = {"edges": gold.edges, "rejected_indices": gold.rejected, "saturations": gold.saturations}
            for name, want in expect.items():
                if result.counters[name] != want:
                    problems.append(f"counter {name} = {result.counters[name]}, golden {want}")
            if result.flags["bad_indptr"] != gold.bad_indptr:
                problems.append(f"status.bad_indptr = {result.flags['bad_indptr']}, golden {gold.bad_indptr}")
            if result.flags["index_rejected"] != (gold.rejected > 0):
                problems.append(f"status.index_rejected = {result.flags['index_rejected']}, "
                                f"golden rejected {gold.rejected}")
            seen_r = sum(b.beats for b in result.bursts if b.kind == "read")
            seen_w = sum(b.beats for b in result.bursts if b.kind == "write")
            if result.counters["read_beats"] != seen_r:
                problems.append(f"counter read_beats = {result.counters['read_beats']}, bench saw {seen_r}")
            if result.counters["write_beats"] != seen_w:
                problems.append(f"counter write_beats = {result.counters['write_beats']}, bench saw {seen_w}")
    if problems:
        raise AssertionError("; ".join(problems))
    return summary
