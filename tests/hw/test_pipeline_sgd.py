"""The pipelined SGD update (hw/sgd_pipeline.py) in the Amaranth simulator, element by
element against golden ``sgd_update``: random words over the formats' full ranges (the
extremes included, so every saturation is reached), with and without momentum, words
back to back and with gaps, results exactly ``LATENCY`` cycles after their input."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from gnnweave.golden.mac import SgdFormat, sgd_update
from gnnweave.hw.arith import ECP5_TILE, fabric_multiplier_tile
from gnnweave.hw.sgd_pipeline import SgdPipeline

FMT = SgdFormat()
LANES = 4


def _dut():
    return SgdPipeline(lanes=LANES, tag_width=8, master=FMT.master, weight=FMT.weight,
                       grad_sum=FMT.grad, velocity=FMT.master, lr=FMT.lr, wd=FMT.wd, mu=FMT.mu)


def _values(rng, width, n):
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    v = rng.integers(lo, hi + 1, size=n)
    small = rng.integers(-(1 << 14), 1 << 14, size=n)          # no saturation
    pick = rng.random(n)
    v = np.where(pick < 0.4, small, v)
    v = np.where(pick > 0.95, rng.choice([lo, hi, 0, -1], size=n), v)
    return v.astype(np.int64)


def _expected(w, g, v, lr, wd, mu, on):
    res = []
    for i in range(len(w)):
        r = sgd_update(w[i:i + 1], g[i:i + 1], lr_q=lr, wd_q=wd, mu_q=mu,
                       velocity_q=v[i:i + 1] if mu else None, fmt=FMT)
        res.append((int(r.master[0]), None if r.velocity is None else int(r.velocity[0]),
                    int(r.weight[0]), r.saturations * int(on[i])))
    return res


@pytest.mark.parametrize("tile", [None, ECP5_TILE])
@pytest.mark.parametrize("lr,wd,mu", [(6554, 1049, 16384), (32767, 32767, 32767), (13107, 0, 0),
                                      (1, 32767, 0)])
def test_sgd_pipeline_matches_golden(lr, wd, mu, tile):
    """Bit-exact at the same latency whatever the fabric's multiplier tile."""
    with fabric_multiplier_tile(tile):
        _check_sgd(lr, wd, mu)


def _check_sgd(lr, wd, mu):
    rng = np.random.default_rng(lr + wd + mu)
    words = 48
    n = words * LANES
    w, g, v = _values(rng, 32, n), _values(rng, 32, n), _values(rng, 32, n)
    on = rng.random(n) < 0.85
    expect = _expected(w, g, v, lr, wd, mu, on)
    gaps = rng.random(words) < 0.3
    dut = _dut()
    got, sats = {}, {}

    async def bench(ctx):
        ctx.set(dut.lr, lr)
        ctx.set(dut.wd, wd)
        ctx.set(dut.mu, mu)
        await ctx.tick()
        sent, cycle, issued = 0, 0, {}
        pending_sat = None
        while sent < words or ctx.get(dut.busy):
            if sent < words and not gaps[sent]:
                k = slice(sent * LANES, (sent + 1) * LANES)
                ctx.set(dut.valid, 1)
                ctx.set(dut.tag, sent)
                ctx.set(dut.lane_on, int(sum(int(b) << i for i, b in enumerate(on[k]))))
                for lane in range(LANES):
                    ctx.set(dut.w[lane], int(w[k][lane]))
                    ctx.set(dut.g[lane], int(g[k][lane]))
                    ctx.set(dut.v[lane], int(v[k][lane]))
                issued[sent] = cycle
                sent += 1
            else:
                ctx.set(dut.valid, 0)
                if sent < words:
                    gaps[sent] = False
            if ctx.get(dut.out_valid):
                t = ctx.get(dut.out_tag)
                assert cycle - issued[t] == SgdPipeline.LATENCY
                got[t] = [(ctx.get(dut.master[lane]), ctx.get(dut.velocity[lane]),
                           ctx.get(dut.weight[lane])) for lane in range(LANES)]
            if pending_sat is not None:
                assert ctx.get(dut.sat_valid)
                sats[pending_sat] = ctx.get(dut.sat_count)
            pending_sat = ctx.get(dut.out_tag) if ctx.get(dut.out_valid) else None
            await ctx.tick()
            cycle += 1
            assert cycle < 10 * words + 100

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert sorted(got) == list(range(words))
    for t in range(words):
        for lane in range(LANES):
            master, vel, weight, _ = expect[t * LANES + lane]
            assert got[t][lane][0] == master, (t, lane)
            assert got[t][lane][2] == weight, (t, lane)
            if mu:
                assert got[t][lane][1] == vel, (t, lane)
        assert sats[t] == sum(e[3] for e in expect[t * LANES:(t + 1) * LANES]), t
    # the extremes reached every kind of saturation at least once in the heavy case
    if (lr, wd, mu) == (32767, 32767, 32767):
        assert sum(sats.values()) > 0


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_hyper_parameter_too_wide():
    from gnnweave.fixed import FixedFormat
    with pytest.raises(ValueError, match="SgdPipeline: lr must be at most 16 bits, got 18"):
        SgdPipeline(lanes=2, tag_width=1, master=FMT.master, weight=FMT.weight, grad_sum=FMT.grad,
                    velocity=FMT.master, lr=FixedFormat(18, 16), wd=FMT.wd, mu=FMT.mu)
