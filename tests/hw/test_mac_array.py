"""MacArray front end: configuration, register map, interface contract, and the
configuration check in the Amaranth simulator (no toolchain)."""
from __future__ import annotations

import numpy as np
import pytest

from gnnweave.hw import aggregator
from gnnweave.hw.mac_array import (CONFIG_REGISTERS, STATUS_REGISTERS, MacArrayConfig, MacArrayCore,
                                   MacArrayTop, Status, mac_array_regmap)
from gnnweave.hw.regmap import Access


def test_regmap_has_every_register_in_order_and_aligned():
    rm = mac_array_regmap(MacArrayConfig())
    names = [r.name for r in rm]
    assert names == [n for n, _, _ in CONFIG_REGISTERS] + [n for n, _, _ in STATUS_REGISTERS]
    for name, width, _ in CONFIG_REGISTERS:
        assert rm[name].access is Access.RW and rm[name].width == width
    for name, width, _ in STATUS_REGISTERS:
        assert rm[name].access is Access.RO and rm[name].width == width
    offsets = [r.offset for r in rm]
    assert offsets[0] == 0x10 and offsets == sorted(offsets)
    assert all(r.offset % (8 if r.width > 32 else 4) == 0 for r in rm)
    # exported like the Aggregator's
    assert "MODE" in rm.to_c_header().upper() and '"mac_ops"' in rm.to_json()


def test_status_bits_share_the_aggregators_positions():
    for flag in Status:
        assert flag.value == aggregator.Status[flag.name].value


def test_core_interface_matches_the_aggregator_core():
    core = MacArrayCore(MacArrayConfig())
    agg = aggregator.AggregatorCore(aggregator.AggregatorConfig())
    core._MustUse__silence = agg._MustUse__silence = True   # built for their attributes only
    for attr in ("bus", "cfg", "stat", "start", "idle", "done"):
        assert hasattr(core, attr)
    assert set(core.cfg) == {n for n, _, _ in CONFIG_REGISTERS}
    assert set(core.stat) == {n for n, _, _ in STATUS_REGISTERS}
    assert len(core.bus.araddr) == 64 and len(core.bus.rdata) == 128 and len(core.bus.arid) == 2
    assert type(core.bus.signature) is type(agg.bus.signature)
    top = MacArrayTop(MacArrayConfig(bus_width=64, rows=2, cols=4))
    top._MustUse__silence = True
    assert top.gmem.signature.data_width == 64


@pytest.mark.parametrize("kwargs,match", [
    ({"bus_width": 96}, "bus_width"),
    ({"cols": 3}, "cols must be a power of two"),
    ({"rows": 16, "cols": 16}, "needs a bus of at least 256 bits"),
    ({"max_dim": 48}, "max_dim must be a power of two"),
    ({"max_dim": 2, "rows": 2, "cols": 2}, "max_dim=2"),
    ({"max_dim": 4, "rows": 4, "cols": 4}, "multiple of 8 \\(int16 elements per bus beat\\)"),
    ({"max_depth": 8192}, "max_depth must be <= 4096"),
    ({"max_burst": 0}, "max_burst"),
])
def test_bad_configs_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MacArrayConfig(**kwargs)


def _simulate_core(config, regs, cycles=40):
    from amaranth.sim import Simulator
    core = MacArrayCore(config)
    seen = {"ar": 0, "aw": 0, "done": None}

    async def bench(ctx):
        for name, value in regs.items():
            ctx.set(core.cfg[name], value)
        ctx.set(core.start, 1)
        await ctx.tick()
        ctx.set(core.start, 0)
        for cycle in range(cycles):
            seen["ar"] += ctx.get(core.bus.arvalid)
            seen["aw"] += ctx.get(core.bus.awvalid)
            if ctx.get(core.done) and seen["done"] is None:
                seen["done"] = cycle
            await ctx.tick()
        seen["status"] = ctx.get(core.stat["status"])
        seen["idle"] = ctx.get(core.idle)

    sim = Simulator(core)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return seen


def _good_regs(m=5, n=6, k=7):
    from gnnweave.sim.mac_array_bench import MacJob
    rng = np.random.default_rng(0)
    job = MacJob(mode=0, p=rng.integers(-9, 9, (m, k)), q=rng.integers(-9, 9, (k, n)), shift=2)
    return job.registers()


def test_config_error_finishes_without_traffic_in_amaranth_sim():
    cfg = MacArrayConfig(max_dim=16, max_depth=16)
    regs = _good_regs() | {"k": 17}            # over max_depth
    seen = _simulate_core(cfg, regs)
    assert seen["status"] == Status.CONFIG_ERROR
    assert seen["ar"] == 0 and seen["aw"] == 0 and seen["done"] is not None and seen["idle"]


def test_good_config_starts_reading_in_amaranth_sim():
    cfg = MacArrayConfig(max_dim=16, max_depth=16)
    seen = _simulate_core(cfg, _good_regs(), cycles=12)
    assert seen["status"] == 0 and seen["ar"] > 0
