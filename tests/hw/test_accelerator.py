"""AcceleratorTop: register-map union, start routing, status ownership and gmem sharing,
checked in Amaranth's simulator with two small fake units that each read one word."""
from __future__ import annotations

import random

import pytest
from amaranth.hdl import Elaboratable, Module, Signal

from gnnweave.contract import CTRL_OFFSET, CtrlBit
from gnnweave.hw.accelerator import (STATUS_CONFIG_ERROR, AcceleratorTop, Unit, UnitInstance,
                                     UnitRegisters, accelerator_regmap)
from gnnweave.hw.axi import AXI4Signature
from gnnweave.hw.regmap import Access

from .test_control import Manager, simulate, wait_until

CTRL = CTRL_OFFSET
AP_START, AP_DONE, AP_IDLE = (CtrlBit[n].mask for n in ("AP_START", "AP_DONE", "AP_IDLE"))


class FakeUnit(Elaboratable):
    """Reads the word at ``addr`` (one single-beat burst, ID ``arid``), adds ``shift`` and
    reports it in ``value``; ``addr == 0`` is refused with CONFIG_ERROR (no traffic)."""

    def __init__(self, tag: str, arid: int, busy_width: int):
        self.bus = AXI4Signature(addr_width=32, data_width=64, id_width=2).create(path=(tag,))
        self.arid = arid
        self.cfg = {"addr": Signal(64), "shift": Signal(8), f"only_{tag}": Signal(32)}
        self.stat = {"status": Signal(32), "busy_cycles": Signal(busy_width), "value": Signal(32)}
        self.start, self.idle, self.done = Signal(), Signal(), Signal()
        self.registers = (
            tuple((n, len(s), f"{tag} {n}") for n, s in self.cfg.items()),
            tuple((n, len(s), f"{tag} {n}") for n, s in self.stat.items()),
        )

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        state = Signal(2)    # 0 idle, 1 address, 2 data
        m.d.comb += self.idle.eq(state == 0)
        with m.If(state != 0):
            m.d.sync += self.stat["busy_cycles"].eq(self.stat["busy_cycles"] + 1)
        with m.Switch(state):
            with m.Case(0):
                with m.If(self.start):
                    m.d.sync += self.stat["busy_cycles"].eq(0)
                    with m.If(self.cfg["addr"] == 0):
                        m.d.sync += self.stat["status"].eq(STATUS_CONFIG_ERROR)
                        m.d.comb += self.done.eq(1)
                    with m.Else():
                        m.d.sync += [self.stat["status"].eq(0), state.eq(1)]
            with m.Case(1):
                m.d.comb += [bus.arvalid.eq(1), bus.araddr.eq(self.cfg["addr"]), bus.arlen.eq(0),
                             bus.arid.eq(self.arid), bus.arsize.eq(3), bus.arburst.eq(1)]
                with m.If(bus.arready):
                    m.d.sync += state.eq(2)
            with m.Case(2):
                m.d.comb += bus.rready.eq(1)
                with m.If(bus.rvalid):
                    m.d.sync += [self.stat["value"].eq(bus.rdata[:32] + self.cfg["shift"]),
                                 state.eq(0)]
                    m.d.comb += self.done.eq(1)
        return m


def fake(unit: Unit, tag: str, arid: int, busy_width: int = 32) -> UnitInstance:
    core = FakeUnit(tag, arid, busy_width)
    return UnitInstance(UnitRegisters(unit, *core.registers), core)


def test_regmap_unit_select_first_and_shared_names_merged():
    a, b = fake(Unit.AGGREGATOR, "a", 1), fake(Unit.MAC_ARRAY, "b", 2, busy_width=48)
    regmap = accelerator_regmap([a.registers, b.registers])
    assert regmap["unit"].offset == 0x10 and regmap["units_present"].offset == 0x14
    assert regmap["unit"].access is Access.RW and regmap["units_present"].access is Access.RO
    names = [r.name for r in regmap]
    assert names.count("shift") == 1 and names.count("status") == 1
    assert {"only_a", "only_b"} <= set(names)
    assert regmap["busy_cycles"].width == 48       # the widest declaration
    assert "[aggregator, mac_array]" in regmap["shift"].doc


def test_regmap_refuses_duplicate_units_and_role_clashes():
    a = fake(Unit.AGGREGATOR, "a", 1)
    with pytest.raises(ValueError, match="listed twice"):
        accelerator_regmap([a.registers, a.registers])
    clash = UnitRegisters(Unit.MAC_ARRAY, (("value", 32, "a config named like a status"),), ())
    with pytest.raises(ValueError, match="'value'"):
        accelerator_regmap([a.registers, clash])
    with pytest.raises(ValueError, match="at least one unit"):
        accelerator_regmap([])


def memory(top, log):
    """AXI4 read subordinate on gmem: word at address A reads A * 3 + 1, ID echoed."""
    gmem = top.gmem

    async def run(ctx):
        pending = []
        while True:
            ctx.set(gmem.arready, 1)
            r = pending[0] if pending else None
            ctx.set(gmem.rvalid, r is not None)
            if r is not None:
                ctx.set(gmem.rdata, r[0] * 3 + 1)
                ctx.set(gmem.rid, r[1])
                ctx.set(gmem.rlast, 1)
            ar = (ctx.get(gmem.araddr), ctx.get(gmem.arid)) if ctx.get(gmem.arvalid) else None
            r_taken = r is not None and ctx.get(gmem.rready)
            await ctx.tick()
            if ar:
                log.append(ar)
                pending.append(ar)
            if r_taken:
                pending.pop(0)
    return run


def reg(top, name):
    return top.regmap[name].offset


def test_start_routes_to_selected_unit_and_status_follows_owner():
    a, b = fake(Unit.AGGREGATOR, "a", 1), fake(Unit.MAC_ARRAY, "b", 2)
    top = AcceleratorTop([a, b])
    ars = []
    host = Manager(top.control, random.Random(1))
    seen_by_idle_unit = []

    async def watch(ctx):
        while True:
            # a unit that does not own gmem never sees a response or a ready
            for u in (a, b):
                if ctx.get(u.core.idle) and (ctx.get(u.core.bus.rvalid) or ctx.get(u.core.bus.arready)) \
                        and ars and ars[-1][1] != u.core.arid:
                    seen_by_idle_unit.append(u.unit)
            await ctx.tick()

    async def run_unit(ctx, unit: Unit):
        await host.write(ctx, reg(top, "unit"), unit.value)
        await host.write(ctx, CTRL, AP_START)
        for _ in range(200):
            if (await host.read(ctx, CTRL))[0] & AP_DONE:
                return
        raise AssertionError("no ap_done")

    async def tb(ctx):
        assert (await host.read(ctx, reg(top, "units_present")))[0] == 0b11
        await host.write(ctx, reg(top, "addr"), 0x100)
        await host.write(ctx, reg(top, "shift"), 5)
        await run_unit(ctx, Unit.MAC_ARRAY)
        assert ars == [(0x100, 2)]
        assert (await host.read(ctx, reg(top, "value")))[0] == 0x100 * 3 + 1 + 5
        assert ctx.get(b.core.stat["value"]) == 0x100 * 3 + 1 + 5
        assert ctx.get(a.core.stat["value"]) == 0
        await host.write(ctx, reg(top, "addr"), 0x200)
        await run_unit(ctx, Unit.AGGREGATOR)
        assert ars == [(0x100, 2), (0x200, 1)]
        assert (await host.read(ctx, reg(top, "value")))[0] == 0x200 * 3 + 1 + 5
        assert (await host.read(ctx, reg(top, "status")))[0] == 0
        # a refused run of the owner shows its own status
        await host.write(ctx, reg(top, "addr"), 0)
        await run_unit(ctx, Unit.AGGREGATOR)
        assert (await host.read(ctx, reg(top, "status")))[0] == STATUS_CONFIG_ERROR
        assert len(ars) == 2
        assert seen_by_idle_unit == []

    simulate(top, tb, background=[memory(top, ars), watch])


def test_unit_not_in_build_finishes_with_config_error_and_no_traffic():
    a = fake(Unit.AGGREGATOR, "a", 1)
    top = AcceleratorTop([a])
    ars = []
    host = Manager(top.control, random.Random(2))

    async def tb(ctx):
        assert (await host.read(ctx, reg(top, "units_present")))[0] == 0b1
        await host.write(ctx, reg(top, "addr"), 0x100)
        await host.write(ctx, reg(top, "unit"), Unit.PIPELINE.value)
        await host.write(ctx, CTRL, AP_START)
        await wait_until(ctx, lambda: ctx.get(top.control.rvalid) == 0)
        for _ in range(50):
            ctrl = (await host.read(ctx, CTRL))[0]
            if ctrl & AP_DONE:
                break
        else:
            raise AssertionError("no ap_done for a unit that is not in the build")
        assert ctrl & AP_IDLE
        assert (await host.read(ctx, reg(top, "status")))[0] == STATUS_CONFIG_ERROR
        assert ars == []
        # and the present unit still runs afterwards, its status clean again
        await host.write(ctx, reg(top, "unit"), Unit.AGGREGATOR.value)
        await host.write(ctx, CTRL, AP_START)
        for _ in range(200):
            if (await host.read(ctx, CTRL))[0] & AP_DONE:
                break
        assert ars == [(0x100, 1)]
        assert (await host.read(ctx, reg(top, "status")))[0] == 0

    simulate(top, tb, background=[memory(top, ars)])
