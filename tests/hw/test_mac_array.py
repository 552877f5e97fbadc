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


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")   # built for their attributes only
def test_core_interface_matches_the_aggregator_core():
    core = MacArrayCore(MacArrayConfig())
    agg = aggregator.AggregatorCore(aggregator.AggregatorConfig())
    for attr in ("bus", "cfg", "stat", "start", "idle", "done"):
        assert hasattr(core, attr)
    assert set(core.cfg) == {n for n, _, _ in CONFIG_REGISTERS}
    assert set(core.stat) == {n for n, _, _ in STATUS_REGISTERS}
    assert len(core.bus.araddr) == 64 and len(core.bus.rdata) == 128 and len(core.bus.arid) == 2
    assert type(core.bus.signature) is type(agg.bus.signature)
    top = MacArrayTop(MacArrayConfig(bus_width=64, rows=2, cols=4))
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
    ({"addr_width": 16}, "MacArrayConfig.addr_width must be in 32..64, got 16"),
])
def test_bad_configs_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MacArrayConfig(**kwargs)


def _simulate_core(config, regs, cycles=80):
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
    seen = _simulate_core(cfg, _good_regs(), cycles=60)
    assert seen["status"] == 0 and seen["ar"] > 0


def test_k_over_max_depth_is_accepted_in_amaranth_sim():
    """Depth tiling: k = 3 * max_depth + 5 is no configuration error and starts reading."""
    cfg = MacArrayConfig(max_dim=16, max_depth=16)
    seen = _simulate_core(cfg, _good_regs(k=3 * 16 + 5), cycles=60)
    assert seen["status"] == 0 and seen["ar"] > 0


def _run_core_depth_split(mode, p, q, *, shift, relu=False, bias=None, bias_shift=0,
                          rows=4, cols=4, max_dim=16, max_depth=8):
    """MacCore with partial sums in the Amaranth simulator, the depth cut into max_depth
    blocks exactly as MacArrayCore does (keep all but the last, init all but the first)."""
    from amaranth.hdl import Module
    from amaranth.sim import Simulator

    from gnnweave.hw.mac import MacCore, MacMode as HwMode, SkewedBuffer, connect_operand
    from gnnweave.sim.mac_bench import load_bias, load_skewed, operand_shapes

    from .mac_core_sim import run_core

    m_, n_, k_ = {0: (p.shape[0], q.shape[1], p.shape[1]), 1: (p.shape[0], q.shape[0], p.shape[1]),
                  2: (p.shape[1], q.shape[1], p.shape[0])}[mode]
    assert operand_shapes(mode, m_, n_, k_) == (p.shape, q.shape)
    core = MacCore(rows=rows, cols=cols, max_dim=max_dim, max_depth=max_depth, partial_sums=True)
    dim = max(max_dim, max_depth)
    pbuf = SkewedBuffer(lanes=core.lanes, rows=dim, cols=max(dim, core.lanes))
    qbuf = SkewedBuffer(lanes=core.lanes, rows=dim, cols=max(dim, core.lanes))
    top = Module()
    top.submodules += [core, pbuf, qbuf]
    connect_operand(top, core.a_req, pbuf, core.a_data)
    connect_operand(top, core.b_req, qbuf, core.b_data)
    out = np.full((m_, n_), np.iinfo(np.int64).min, dtype=np.int64)
    res = {"mac_ops": 0, "saturations": 0, "outputs": 0}

    async def bench(ctx):
        if bias is not None:
            await load_bias(ctx, core, bias)
        for k0 in range(0, k_, max_depth):
            ks = slice(k0, min(k0 + max_depth, k_))
            await load_skewed(ctx, pbuf, p[ks, :] if mode == 2 else p[:, ks], core.lanes)
            await load_skewed(ctx, qbuf, q[:, ks] if mode == 1 else q[ks, :], core.lanes)
            settings = ((core.mode, HwMode(mode)), (core.m, m_), (core.n, n_),
                        (core.k, ks.stop - ks.start), (core.shift, shift), (core.relu, int(relu)),
                        (core.use_bias, int(bias is not None)), (core.bias_shift, bias_shift),
                        (core.acc_init, int(k0 > 0)), (core.acc_keep, int(ks.stop < k_)))
            res["outputs"] += await run_core(ctx, core, settings, out)
            res["mac_ops"] += ctx.get(core.mac_ops)
            res["saturations"] += ctx.get(core.saturations)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    res["out"] = out
    return res


@pytest.mark.parametrize("mode,bias_relu,sat", [(0, True, False), (1, False, False), (2, False, False),
                                                (0, False, True)])
def test_core_partial_sums_split_depth_bit_exact_in_amaranth_sim(mode, bias_relu, sat):
    """k = 3 * max_depth + 5 over four MacCore runs equals golden's one narrowing of the
    exact full-depth sum (bias once, ReLU, saturation), odd m and n."""
    from gnnweave.golden.mac import mac
    from gnnweave.sim.mac_bench import operand_shapes

    rng = np.random.default_rng(10 + mode + 5 * sat)
    m_, n_, k_ = 7, 9, 3 * 8 + 5
    (pr, pc), (qr, qc) = operand_shapes(mode, m_, n_, k_)
    p = rng.integers(-32768, 32768, (pr, pc))
    q = rng.integers(-32768, 32768, (qr, qc))
    shift = 4 if sat else 18
    if sat:
        p[:] = 32767
        q[:] = 32767
    bias = rng.integers(-(1 << 20), 1 << 20, n_) if bias_relu else None
    want = mac(mode, p, q, shift=shift, relu=bias_relu, bias_q=bias, bias_shift=3 if bias_relu else 0)
    got = _run_core_depth_split(mode, p, q, shift=shift, relu=bias_relu, bias=bias,
                                bias_shift=3 if bias_relu else 0)
    assert np.array_equal(got["out"], want.out)
    assert got["saturations"] == want.saturations and (want.saturations > 0) == sat
    assert got["mac_ops"] == m_ * n_ * k_
    assert got["outputs"] == m_ * -(-n_ // 4)        # only the last depth block writes
    if bias_relu:
        assert np.count_nonzero(want.out == 0) > 0
