"""AxiLiteControl in Amaranth's simulator, driven by a small AXI4-Lite manager model with
random valid/ready delays, checked against a Python model of the registers."""
from __future__ import annotations

import random

import pytest
from amaranth.back import verilog
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect
from amaranth.sim import Simulator

from gnnweave.contract import CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, CtrlBit
from gnnweave.hw.axi import Resp
from gnnweave.hw.control import AxiLiteControl, ro_signature, rw_signature
from gnnweave.hw.regmap import Access, RegisterBuilder

OKAY, SLVERR = int(Resp.OKAY), int(Resp.SLVERR)
CTRL, GIE, IER, ISR = CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET
AP_START, AP_DONE, AP_IDLE, AP_READY, AUTO_RESTART = (CtrlBit[n].mask for n in (
    "AP_START", "AP_DONE", "AP_IDLE", "AP_READY", "AUTO_RESTART"))
TIMEOUT = 400

# Expected layout, written out by hand (independent of the allocator):
#   0x10 num_nodes(32) 0x14 hole 0x18/0x1C feat_base(64) 0x20 mode(3) 0x24 scale(20)
#   0x28/0x2C busy_cycles(RO 64) 0x30 status(RO 32) 0x38/0x3C wide_ro(RO 40)
#   0x40 version(RO 16) -> span 0x80
RW_RESET = {"num_nodes": 0x1234_5678, "feat_base": 0x0123_4567_89AB_CDEF, "mode": 5, "scale": 0}
RW_WIDTH = {"num_nodes": 32, "feat_base": 64, "mode": 3, "scale": 20}
RW_OFFSET = {"num_nodes": 0x10, "feat_base": 0x18, "mode": 0x20, "scale": 0x24}
RO_OFFSET = {"busy_cycles": 0x28, "status": 0x30, "wide_ro": 0x38, "version": 0x40}
MAPPED = {CTRL, GIE, IER, ISR, 0x10, 0x18, 0x1C, 0x20, 0x24, 0x28, 0x2C, 0x30, 0x38, 0x3C,
          0x40}
SPAN = 0x80


def make_map():
    b = RegisterBuilder("testctl")
    b.ap_ctrl()
    b.add("num_nodes", 32, Access.RW, "number of nodes", reset=RW_RESET["num_nodes"])
    b.add("feat_base", 64, Access.RW, "feature buffer address", reset=RW_RESET["feat_base"])
    b.add("mode", 3, Access.RW, "reduce mode", reset=RW_RESET["mode"])
    b.add("scale", 20, Access.RW, "a register narrower than its bytes")
    b.add("busy_cycles", 64, Access.RO, "busy cycles")
    b.add("status", 32, Access.RO, "status word")
    b.add("wide_ro", 40, Access.RO, "40-bit counter")
    b.add("version", 16, Access.RO, "left undriven: reads its reset", reset=0x0102)
    return b.build()


def test_layout_matches_hand_written_expectation():
    regmap = make_map()
    assert {r.name: r.offset for r in regmap if r.access is Access.RW} == RW_OFFSET
    assert {r.name: r.offset for r in regmap if r.access is Access.RO} == RO_OFFSET
    assert regmap.size == SPAN and regmap.addr_width == 7


class RegModel:
    """Byte-level model of the RW registers, as the host sees them through the bus."""

    def __init__(self):
        self.value = dict(RW_RESET)

    def write(self, addr, data, strb):
        word = addr & ~3
        for name, off in RW_OFFSET.items():
            for index in range((RW_WIDTH[name] + 31) // 32):
                if word != off + 4 * index:
                    continue
                v = self.value[name]
                for byte in range(4):
                    if strb >> byte & 1:
                        shift = 32 * index + 8 * byte
                        v = v & ~(0xFF << shift) | ((data >> 8 * byte) & 0xFF) << shift
                self.value[name] = v & ((1 << RW_WIDTH[name]) - 1)

    def read(self, addr):
        word = addr & ~3
        for name, off in RW_OFFSET.items():
            for index in range((RW_WIDTH[name] + 31) // 32):
                if word == off + 4 * index:
                    return self.value[name] >> 32 * index & 0xFFFF_FFFF
        return None


class Manager:
    """AXI4-Lite manager: random valid delays, random ready, garbage payloads while invalid.

    Checks the slave's side of the protocol as it goes: B/R only after their requests,
    BVALID/RVALID and payloads stable until the handshake."""

    def __init__(self, bus, rng, *, max_delay=3, ready_prob=0.6):
        self.bus, self.rng = bus, rng
        self.max_delay, self.ready_prob = max_delay, ready_prob
        self.addr_bits = len(bus.awaddr)
        self.last = {}

    async def write(self, ctx, addr, data, strb=0xF, *, order="random", hold=None):
        bus, rng = self.bus, self.rng
        d_aw = rng.randint(0, self.max_delay)
        d_w = d_aw if order == "same" else rng.randint(0, self.max_delay)
        aw_at = w_at = b_first = None
        resp = None
        ready_while_b = []
        cycle = 0
        while True:
            if order == "w_first":
                aw_go = aw_at is None and w_at is not None and cycle > w_at + d_aw
            else:
                aw_go = aw_at is None and cycle >= d_aw
            if order == "aw_first":
                w_go = w_at is None and aw_at is not None and cycle > aw_at + d_w
            else:
                w_go = w_at is None and cycle >= d_w
            ctx.set(bus.awvalid, aw_go)
            ctx.set(bus.awaddr, addr if aw_go else rng.getrandbits(self.addr_bits))
            ctx.set(bus.wvalid, w_go)
            ctx.set(bus.wdata, data if w_go else rng.getrandbits(32))
            ctx.set(bus.wstrb, strb if w_go else rng.getrandbits(4))
            if hold is not None:
                bready = b_first is not None and cycle >= b_first + hold
            else:
                bready = rng.random() < self.ready_prob
            ctx.set(bus.bready, bready)
            aw_hs = aw_go and ctx.get(bus.awready)
            w_hs = w_go and ctx.get(bus.wready)
            bvalid = ctx.get(bus.bvalid)
            if bvalid:
                assert aw_at is not None and w_at is not None, "B before AW and W handshakes"
                if resp is None:
                    resp, b_first = ctx.get(bus.bresp), cycle
                assert ctx.get(bus.bresp) == resp, "BRESP changed while BVALID waited"
                ready_while_b.append((ctx.get(bus.awready), ctx.get(bus.wready)))
            else:
                assert resp is None, "BVALID dropped before BREADY"
            await ctx.tick()
            if aw_hs:
                aw_at = cycle
            if w_hs:
                w_at = cycle
            if bvalid and bready:
                break
            cycle += 1
            assert cycle < TIMEOUT, f"write to {addr:#x} timed out"
        for s in (bus.awvalid, bus.wvalid, bus.bready):
            ctx.set(s, 0)
        self.last = {"aw_at": aw_at, "w_at": w_at, "b_first": b_first, "b_done": cycle,
                     "ready_while_b": ready_while_b}
        return resp

    async def read(self, ctx, addr, *, hold=None):
        bus, rng = self.bus, self.rng
        d_ar = rng.randint(0, self.max_delay)
        ar_at = r_first = None
        seen = None
        arready_while_r = []
        cycle = 0
        while True:
            ar_go = ar_at is None and cycle >= d_ar
            ctx.set(bus.arvalid, ar_go)
            ctx.set(bus.araddr, addr if ar_go else rng.getrandbits(self.addr_bits))
            if hold is not None:
                rready = r_first is not None and cycle >= r_first + hold
            else:
                rready = rng.random() < self.ready_prob
            ctx.set(bus.rready, rready)
            ar_hs = ar_go and ctx.get(bus.arready)
            rvalid = ctx.get(bus.rvalid)
            if rvalid:
                assert ar_at is not None, "R before AR handshake"
                now = (ctx.get(bus.rdata), ctx.get(bus.rresp))
                if seen is None:
                    seen, r_first = now, cycle
                assert now == seen, "RDATA/RRESP changed while RVALID waited"
                arready_while_r.append(ctx.get(bus.arready))
            else:
                assert seen is None, "RVALID dropped before RREADY"
            await ctx.tick()
            if ar_hs:
                ar_at = cycle
            if rvalid and rready:
                break
            cycle += 1
            assert cycle < TIMEOUT, f"read of {addr:#x} timed out"
        ctx.set(bus.arvalid, 0)
        ctx.set(bus.rready, 0)
        self.last = {"ar_at": ar_at, "r_first": r_first, "arready_while_r": arready_while_r}
        return seen


async def wait_until(ctx, condition, limit=TIMEOUT):
    for _ in range(limit):
        if condition():
            return
        await ctx.tick()
    raise AssertionError(f"condition not met within {limit} cycles")


def simulate(dut, *testbenches, background=()):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    bus_domain = getattr(dut, "bus_domain", "sync")
    if bus_domain != "sync":            # the bus side's own clock, running with sync's
        sim.add_clock(1e-8, domain=bus_domain)
    for tb in background:
        sim.add_testbench(tb, background=True)
    for tb in testbenches:
        sim.add_testbench(tb)
    sim.run()


def engine_model(dut, *, run_cycles, log):
    """Background engine: starts on start & idle, pulses accepted, runs, pulses done."""
    async def engine(ctx):
        ctx.set(dut.idle, 1)
        while True:
            if ctx.get(dut.start) and ctx.get(dut.idle):
                ctx.set(dut.accepted, 1)
                await ctx.tick()
                log.append("start")
                ctx.set(dut.accepted, 0)
                ctx.set(dut.idle, 0)
                for _ in range(run_cycles - 1):
                    await ctx.tick()
                ctx.set(dut.done, 1)
                ctx.set(dut.idle, 1)
                await ctx.tick()
                log.append("done")
                ctx.set(dut.done, 0)
            else:
                await ctx.tick()
    return engine


# ---- register round trips ----------------------------------------------------------------

def test_reset_values_and_undriven_ro_reads_its_reset():
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(1))
        model = RegModel()
        for name, off in RW_OFFSET.items():
            assert ctx.get(getattr(dut.rw, name)) == RW_RESET[name]
            for index in range((RW_WIDTH[name] + 31) // 32):
                addr = off + 4 * index
                assert await mgr.read(ctx, addr) == (model.read(addr), OKAY), name
        assert await mgr.read(ctx, RO_OFFSET["version"]) == (0x0102, OKAY)
        for addr in (CTRL, GIE, IER, ISR):      # idle input low, nothing pending
            assert await mgr.read(ctx, addr) == (0, OKAY)
        assert ctx.get(dut.start) == 0 and ctx.get(dut.interrupt) == 0

    simulate(dut, tb)


def bus_side_in(domain: str) -> AxiLiteControl:
    dut = AxiLiteControl(make_map())
    dut.bus_domain = domain
    return dut


#: The bus side in sync (the board) and in a domain of its own clocked with sync's (the
#: simulated device's build, between whose register accesses that clock stops).
BUS_DOMAINS = pytest.mark.parametrize("bus_domain", ["sync", "bus"])


@BUS_DOMAINS
def test_rw_round_trips_with_byte_strobes_against_model(bus_domain):
    dut = bus_side_in(bus_domain)
    rw_words = [off + 4 * i for n, off in RW_OFFSET.items() for i in range((RW_WIDTH[n] + 31) // 32)]

    async def tb(ctx):
        rng = random.Random(2)
        mgr = Manager(dut.bus, rng)
        model = RegModel()
        for step in range(70):
            addr = rng.choice(rw_words) | rng.choice([0, 0, 0, 1, 2, 3])   # low bits ignored
            data, strb = rng.getrandbits(32), rng.choice([0xF, rng.getrandbits(4)])
            order = rng.choice(["aw_first", "w_first", "same", "random"])
            assert await mgr.write(ctx, addr, data, strb, order=order) == OKAY
            model.write(addr, data, strb)
            probe = rng.choice(rw_words)
            assert await mgr.read(ctx, probe) == (model.read(probe), OKAY), (step, hex(probe))
            for name in RW_OFFSET:        # what the hardware reads equals the model
                assert ctx.get(getattr(dut.rw, name)) == model.value[name], (step, name)
        for addr in rw_words:
            assert await mgr.read(ctx, addr) == (model.read(addr), OKAY)

    simulate(dut, tb)


def test_ro_registers_visible_and_writes_to_them_ignored():
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(3))
        ctx.set(dut.ro.status, 0xDEAD_BEEF)
        ctx.set(dut.ro.busy_cycles, 0x1122_3344_5566_7788)
        ctx.set(dut.ro.wide_ro, 0xAB_CDEF_0123)
        assert await mgr.read(ctx, 0x30) == (0xDEAD_BEEF, OKAY)
        assert await mgr.read(ctx, 0x28) == (0x5566_7788, OKAY)
        assert await mgr.read(ctx, 0x2C) == (0x1122_3344, OKAY)
        assert await mgr.read(ctx, 0x38) == (0xCDEF_0123, OKAY)
        assert await mgr.read(ctx, 0x3C) == (0xAB, OKAY)
        for addr in (0x30, 0x28, 0x2C, 0x40):
            assert await mgr.write(ctx, addr, 0x5A5A_5A5A) == OKAY   # mapped: OKAY, ignored
        assert await mgr.read(ctx, 0x30) == (0xDEAD_BEEF, OKAY)
        assert await mgr.read(ctx, 0x40) == (0x0102, OKAY)

    simulate(dut, tb)


@BUS_DOMAINS
def test_64bit_ro_low_read_snapshots_high_word(bus_domain):
    dut = bus_side_in(bus_domain)

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(4))
        ctx.set(dut.ro.busy_cycles, 0x0000_0001_FFFF_FFFF)
        assert await mgr.read(ctx, 0x28) == (0xFFFF_FFFF, OKAY)
        ctx.set(dut.ro.busy_cycles, 0x0000_0002_0000_0000)     # carry between the two reads
        assert await mgr.read(ctx, 0x2C) == (0x1, OKAY)         # snapshot, not the live 2
        assert await mgr.read(ctx, 0x2C) == (0x1, OKAY)         # high alone: still the snapshot
        assert await mgr.read(ctx, 0x28) == (0x0, OKAY)
        # an address on the bus without ARVALID must not take a new snapshot
        ctx.set(dut.bus.araddr, 0x28)
        ctx.set(dut.ro.busy_cycles, 0x0000_0007_0000_0000)
        for _ in range(4):
            await ctx.tick()
        assert await mgr.read(ctx, 0x2C) == (0x2, OKAY)

    simulate(dut, tb)


def test_64bit_counter_read_low_then_high_is_consistent_across_carries():
    dut = AxiLiteControl(make_map())
    start = (1 << 32) - 40
    history = []

    async def counter(ctx):
        value = start
        while True:
            ctx.set(dut.ro.busy_cycles, value)
            history.append(value)
            await ctx.tick()
            value += 3

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(5), max_delay=2)
        previous = 0
        for _ in range(12):
            before = history[-1]
            lo, _ = await mgr.read(ctx, 0x28)
            hi, _ = await mgr.read(ctx, 0x2C)
            value = hi << 32 | lo
            assert before <= value <= history[-1], (hex(before), hex(value), hex(history[-1]))
            assert value >= previous
            previous = value
        assert previous > 1 << 32          # the run crossed the carry

    simulate(dut, tb, background=[counter])


# ---- bus behaviour -------------------------------------------------------------------------

def test_unmapped_offsets_answer_slverr_and_change_nothing():
    dut = AxiLiteControl(make_map())
    unmapped = [a for a in range(0, SPAN, 4) if a not in MAPPED]
    assert 0x14 in unmapped and 0x34 in unmapped and 0x7C in unmapped

    async def tb(ctx):
        rng = random.Random(6)
        mgr = Manager(dut.bus, rng)
        model = RegModel()
        for addr in unmapped:
            assert await mgr.write(ctx, addr, rng.getrandbits(32)) == SLVERR, hex(addr)
            assert await mgr.read(ctx, addr) == (0, SLVERR), hex(addr)
        for addr in sorted(MAPPED - {CTRL, GIE, IER, ISR}):
            if model.read(addr) is not None:
                assert await mgr.read(ctx, addr) == (model.read(addr), OKAY)
        for addr in (CTRL, GIE, IER, ISR):
            assert await mgr.read(ctx, addr) == (0, OKAY)

    simulate(dut, tb)


@pytest.mark.parametrize("order", ["aw_first", "w_first", "same"])
def test_write_channel_orders(order):
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        rng = random.Random(7)
        mgr = Manager(dut.bus, rng, max_delay=6)
        model = RegModel()
        for i in range(6):
            data = rng.getrandbits(32)
            assert await mgr.write(ctx, 0x10, data, order=order) == OKAY
            model.write(0x10, data, 0xF)
            aw_at, w_at = mgr.last["aw_at"], mgr.last["w_at"]
            if order == "aw_first":
                assert aw_at < w_at
            elif order == "w_first":
                assert w_at < aw_at
            else:
                assert aw_at == w_at
            assert mgr.last["b_first"] > max(aw_at, w_at)
            assert await mgr.read(ctx, 0x10) == (model.read(0x10), OKAY)

    simulate(dut, tb)


def test_responses_held_under_backpressure_one_outstanding():
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(8))
        assert await mgr.write(ctx, 0x10, 0xCAFE_F00D, hold=40) == OKAY
        assert mgr.last["b_done"] - mgr.last["b_first"] >= 40
        assert mgr.last["ready_while_b"] and all(r == (0, 0) for r in mgr.last["ready_while_b"])
        assert await mgr.write(ctx, 0x14, 1, hold=25) == SLVERR
        assert await mgr.read(ctx, 0x10, hold=40) == (0xCAFE_F00D, OKAY)
        assert len(mgr.last["arready_while_r"]) > 40 and not any(mgr.last["arready_while_r"])
        assert await mgr.read(ctx, 0x7C, hold=30) == (0, SLVERR)

    simulate(dut, tb)


def test_concurrent_reads_and_writes():
    """The read and write channels work at the same time, from separate managers."""
    dut = AxiLiteControl(make_map())
    written = []

    async def writer(ctx):
        rng = random.Random(9)
        mgr = Manager(dut.bus, rng)
        for _ in range(15):
            value = rng.getrandbits(32)
            assert await mgr.write(ctx, 0x24, value) == OKAY
            written.append(value & 0xF_FFFF)
            assert ctx.get(dut.rw.scale) == value & 0xF_FFFF

    async def reader(ctx):
        rng = random.Random(10)
        mgr = Manager(dut.bus, rng)
        ctx.set(dut.ro.status, 0x600D)
        for _ in range(15):
            assert await mgr.read(ctx, 0x30) == (0x600D, OKAY)
            data, resp = await mgr.read(ctx, 0x24)
            assert resp == OKAY and data in [0, *written]

    simulate(dut, writer, reader)


# ---- ap_ctrl_hs ------------------------------------------------------------------------------

@BUS_DOMAINS
def test_ap_ctrl_start_ready_done_idle_and_interrupts(bus_domain):
    dut = bus_side_in(bus_domain)
    log = []

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(11))
        await ctx.tick()
        assert await mgr.read(ctx, CTRL) == (AP_IDLE, OKAY)
        assert await mgr.write(ctx, IER, 0x3) == OKAY
        assert await mgr.write(ctx, GIE, 0x1) == OKAY
        assert await mgr.read(ctx, IER) == (0x3, OKAY)
        assert await mgr.read(ctx, GIE) == (0x1, OKAY)
        assert await mgr.write(ctx, CTRL, AP_START) == OKAY
        # the engine accepted at once: ap_start cleared, ap_ready sticky, busy
        assert await mgr.read(ctx, CTRL) == (AP_READY, OKAY)
        assert log == ["start"]
        assert await mgr.read(ctx, CTRL) == (0, OKAY)        # ap_ready cleared by the read
        assert await mgr.read(ctx, ISR) == (0b10, OKAY)      # ready event pending
        assert ctx.get(dut.interrupt) == 1
        assert await mgr.write(ctx, ISR, 0b10) == OKAY       # toggle it off
        assert ctx.get(dut.interrupt) == 0
        polls = 0
        while True:
            value, _ = await mgr.read(ctx, CTRL)
            polls += 1
            if value & AP_DONE:
                break
            assert value == 0 and polls < 50
        assert value == AP_DONE | AP_IDLE
        assert await mgr.read(ctx, CTRL) == (AP_IDLE, OKAY)  # ap_done cleared by the read
        assert log == ["start", "done"]
        assert ctx.get(dut.interrupt) == 1
        assert await mgr.read(ctx, ISR) == (0b01, OKAY)
        assert await mgr.write(ctx, ISR, 0b01) == OKAY       # toggle-on-write clears it
        assert await mgr.read(ctx, ISR) == (0b00, OKAY)
        assert ctx.get(dut.interrupt) == 0
        assert await mgr.write(ctx, ISR, 0b11) == OKAY       # ... and toggles 0 -> 1
        assert await mgr.read(ctx, ISR) == (0b11, OKAY)
        assert ctx.get(dut.interrupt) == 1
        assert await mgr.write(ctx, GIE, 0) == OKAY          # GIE masks the line
        assert ctx.get(dut.interrupt) == 0
        assert await mgr.write(ctx, ISR, 0b11) == OKAY
        assert await mgr.write(ctx, GIE, 1) == OKAY
        assert ctx.get(dut.interrupt) == 0
        assert await mgr.write(ctx, CTRL, 0) == OKAY         # writing 0 does not start
        for _ in range(10):
            await ctx.tick()
        assert log == ["start", "done"] and ctx.get(dut.start) == 0

    simulate(dut, tb, background=[engine_model(dut, run_cycles=60, log=log)])


def test_ap_ctrl_events_masked_by_ier_and_strobes():
    dut = AxiLiteControl(make_map())
    log = []

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(12))
        assert await mgr.write(ctx, GIE, 1) == OKAY
        assert await mgr.write(ctx, IER, 0b01) == OKAY       # done only
        assert await mgr.write(ctx, CTRL, AP_START, strb=0b1110) == OKAY   # byte 0 not strobed
        for _ in range(5):
            await ctx.tick()
        assert log == [] and ctx.get(dut.start) == 0
        assert await mgr.write(ctx, CTRL, AP_START, strb=0b0001) == OKAY
        await wait_until(ctx, lambda: len(log) >= 2)
        assert await mgr.read(ctx, ISR) == (0b01, OKAY)      # ready not enabled: not latched
        assert await mgr.read(ctx, CTRL) == (AP_DONE | AP_READY | AP_IDLE, OKAY)

    simulate(dut, tb, background=[engine_model(dut, run_cycles=8, log=log)])


def test_auto_restart_keeps_starting_until_cleared():
    dut = AxiLiteControl(make_map())
    log = []

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(13))
        assert await mgr.write(ctx, CTRL, AUTO_RESTART | AP_START) == OKAY
        await wait_until(ctx, lambda: log.count("done") >= 3)
        value, _ = await mgr.read(ctx, CTRL)
        assert value & (AP_START | AUTO_RESTART) == AP_START | AUTO_RESTART
        assert await mgr.write(ctx, CTRL, 0) == OKAY          # clear auto_restart
        starts = log.count("start")
        for _ in range(60):
            await ctx.tick()
        # at most the start that was already pending runs once more, then it stops
        assert log.count("start") - starts <= 1
        assert log[-1] == "done" and ctx.get(dut.start) == 0
        value, _ = await mgr.read(ctx, CTRL)
        assert value & (AP_START | AUTO_RESTART) == 0 and value & AP_IDLE

    simulate(dut, tb, background=[engine_model(dut, run_cycles=10, log=log)])


def test_ap_start_waits_for_accept_and_writing_zero_does_not_cancel():
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        mgr = Manager(dut.bus, random.Random(16))
        ctx.set(dut.idle, 0)                                   # engine busy: no accept
        assert await mgr.write(ctx, CTRL, AP_START) == OKAY
        assert ctx.get(dut.start) == 1
        assert await mgr.write(ctx, CTRL, 0) == OKAY          # Vitis: 0 has no effect
        for _ in range(5):
            await ctx.tick()
        assert ctx.get(dut.start) == 1
        assert await mgr.read(ctx, CTRL) == (AP_START, OKAY)
        ctx.set(dut.accepted, 1)
        await ctx.tick()
        ctx.set(dut.accepted, 0)
        assert ctx.get(dut.start) == 0
        assert await mgr.read(ctx, CTRL) == (AP_READY, OKAY)

    simulate(dut, tb)


def test_events_win_over_same_cycle_clears():
    """done in the cycle a CTRL read samples, and an ISR toggle in the cycle of an event:
    the event wins, so nothing is lost."""
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        bus = dut.bus
        mgr = Manager(dut.bus, random.Random(14), max_delay=0)
        assert await mgr.write(ctx, IER, 0b01) == OKAY
        # a CTRL read that samples in the same cycle as done
        ctx.set(bus.arvalid, 1)
        ctx.set(bus.araddr, CTRL)
        assert ctx.get(bus.arready)
        for _ in range(dut.read_sample_delay):
            await ctx.tick()
            ctx.set(bus.arvalid, 0)
        ctx.set(dut.done, 1)
        await ctx.tick()
        ctx.set(dut.done, 0)
        ctx.set(bus.rready, 1)
        for _ in range(dut.read_latency - dut.read_sample_delay - 1):
            assert not ctx.get(bus.rvalid)
            await ctx.tick()
        assert ctx.get(bus.rvalid) and ctx.get(bus.rdata) & AP_DONE == 0   # old value
        await ctx.tick()
        ctx.set(bus.rready, 0)
        assert await mgr.read(ctx, CTRL) == (AP_DONE, OKAY)                 # kept
        assert await mgr.read(ctx, ISR) == (0b01, OKAY)
        # ISR toggle write performed in the same cycle as another done: stays set
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.awaddr, ISR)
        ctx.set(bus.wvalid, 1)
        ctx.set(bus.wdata, 0b01)
        ctx.set(bus.wstrb, 0xF)
        await ctx.tick()                       # AW and W latched
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        for _ in range(dut.write_delay - 1):
            await ctx.tick()
        ctx.set(dut.done, 1)                   # the write happens at this edge
        await ctx.tick()
        ctx.set(dut.done, 0)
        ctx.set(bus.bready, 1)
        assert ctx.get(bus.bvalid)
        await ctx.tick()
        ctx.set(bus.bready, 0)
        assert await mgr.read(ctx, ISR) == (0b01, OKAY)

    simulate(dut, tb)


def test_read_and_write_latency_as_declared():
    """RVALID and BVALID rise exactly ``read_latency`` / ``write_delay + 1`` cycles after the
    handshakes (a manager that is always ready), and not a cycle earlier."""
    dut = AxiLiteControl(make_map())

    async def tb(ctx):
        bus = dut.bus
        ctx.set(bus.araddr, RW_OFFSET["num_nodes"])
        ctx.set(bus.arvalid, 1)
        assert ctx.get(bus.arready)
        await ctx.tick()
        ctx.set(bus.arvalid, 0)
        cycles = 1
        while not ctx.get(bus.rvalid):
            assert not ctx.get(bus.arready), "a second AR accepted while the read is in flight"
            await ctx.tick()
            cycles += 1
        assert cycles == dut.read_latency
        assert ctx.get(bus.rdata) == RW_RESET["num_nodes"]
        ctx.set(bus.rready, 1)
        await ctx.tick()
        ctx.set(bus.rready, 0)
        assert not ctx.get(bus.rvalid) and ctx.get(bus.arready)

        ctx.set(bus.awaddr, RW_OFFSET["num_nodes"])
        ctx.set(bus.wdata, 0xC0FFEE)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.awvalid, 1)
        ctx.set(bus.wvalid, 1)
        assert ctx.get(bus.awready) and ctx.get(bus.wready)
        await ctx.tick()
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        cycles = 1
        while not ctx.get(bus.bvalid):
            await ctx.tick()
            cycles += 1
        assert cycles == dut.write_delay + 1
        assert ctx.get(dut.rw.num_nodes) == 0xC0FFEE

    simulate(dut, tb)


# ---- integration -------------------------------------------------------------------------

def test_signatures_connect_naturally_to_an_engine():
    regmap = make_map()

    class Engine(wiring.Component):
        def __init__(self):
            super().__init__({"args": In(rw_signature(regmap)), "status": Out(ro_signature(regmap))})

        def elaborate(self, platform):
            m = Module()
            m.d.comb += [self.status.status.eq(self.args.num_nodes + self.args.mode),
                         self.status.version.eq(0x0203)]
            return m

    top = Module()
    top.submodules.ctrl = ctrl = AxiLiteControl(regmap)
    top.submodules.engine = engine = Engine()
    connect(top, ctrl.rw, engine.args)
    connect(top, engine.status, ctrl.ro)

    async def tb(ctx):
        mgr = Manager(ctrl.bus, random.Random(15))
        assert await mgr.write(ctx, 0x10, 1000) == OKAY
        assert await mgr.read(ctx, 0x30) == (1000 + RW_RESET["mode"], OKAY)
        assert await mgr.read(ctx, 0x40) == (0x0203, OKAY)

    simulate(top, tb)


def test_verilog_conversion_smoke():
    regmap = make_map()
    text = verilog.convert(AxiLiteControl(regmap), name="gnnweave_testctl")
    assert "module gnnweave_testctl" in text
    for port, width in [("bus__awaddr", 7), ("bus__wdata", 32), ("bus__wstrb", 4),
                        ("bus__rdata", 32), ("rw__feat_base", 64), ("rw__mode", 3),
                        ("ro__busy_cycles", 64), ("ro__wide_ro", 40)]:
        assert f"[{width - 1}:0] {port};" in text, port
    for port in ("start", "accepted", "done", "idle", "interrupt", "bus__bvalid"):
        assert f" {port};" in text, port


def test_rejects_a_non_regmap():
    with pytest.raises(TypeError, match="RegisterMap"):
        AxiLiteControl({"name": "x"})
