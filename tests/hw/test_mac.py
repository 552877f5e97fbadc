"""MacCore + skewed buffers in the Amaranth simulator, bit-exact against golden/mac.py."""
import numpy as np
import pytest
from amaranth.sim import Simulator

from gnnweave.golden.mac import mac
from gnnweave.hw.mac import MacMode, MacUnit

MODES = {"fwd": MacMode.FWD, "dx": MacMode.DX, "dw": MacMode.DW}


def run_unit(rows, cols, mode, p_mat, q_mat, *, shift, relu=False, bias=None, bias_shift=0,
             max_dim=16, ready_pattern=None, out_width=16):
    """Load P and Q through the write ports, run one operation, return (out, relu_mask, counters)."""
    unit = MacUnit(rows=rows, cols=cols, max_dim=max_dim, out_width=out_width)
    core, lanes = unit.core, unit.core.lanes
    mode = MODES[mode]
    if mode is MacMode.FWD:
        mm, nn, kk = p_mat.shape[0], q_mat.shape[1], p_mat.shape[1]
    elif mode is MacMode.DX:
        mm, nn, kk = p_mat.shape[0], q_mat.shape[0], p_mat.shape[1]
    else:
        mm, nn, kk = p_mat.shape[1], q_mat.shape[1], p_mat.shape[0]
    out = np.full((mm, nn), -999999, dtype=np.int64)
    mask = np.zeros((mm, nn), dtype=bool)
    result = {}

    async def load(ctx, buf, mat):
        for i in range(mat.shape[0]):
            for j0 in range(0, mat.shape[1], lanes):
                seg = mat[i, j0:j0 + lanes]
                ctx.set(buf.wr_en, 1)
                ctx.set(buf.wr.row, i)
                ctx.set(buf.wr.col, j0)
                ctx.set(buf.wr.count, len(seg))
                for l, v in enumerate(seg):
                    ctx.set(buf.wr.data[l], int(v))
                await ctx.tick()
        ctx.set(buf.wr_en, 0)

    async def bench(ctx):
        await load(ctx, unit.p, p_mat)
        await load(ctx, unit.q, q_mat)
        if bias is not None:
            ctx.set(core.bias_clear, 1)
            await ctx.tick()
            ctx.set(core.bias_clear, 0)
            for v in bias:
                ctx.set(core.bias_wr_en, 1)
                ctx.set(core.bias_wr_data, int(v))
                await ctx.tick()
            ctx.set(core.bias_wr_en, 0)
        ctx.set(core.mode, mode)
        ctx.set(core.m, mm)
        ctx.set(core.n, nn)
        ctx.set(core.k, kk)
        ctx.set(core.shift, shift)
        ctx.set(core.relu, int(relu))
        ctx.set(core.use_bias, int(bias is not None))
        ctx.set(core.bias_shift, bias_shift)
        ctx.set(core.start, 1)
        await ctx.tick()
        ctx.set(core.start, 0)
        cycle = 0
        while True:
            ready = 1 if ready_pattern is None else ready_pattern[cycle % len(ready_pattern)]
            ctx.set(core.out.ready, ready)
            if ctx.get(core.out.valid) and ready:
                pl = ctx.get(core.out.payload)
                r, c0, cnt = pl.row, pl.col, pl.count
                for c in range(cnt):
                    out[r, c0 + c] = pl.data[c]
                    mask[r, c0 + c] = (pl.relu_mask >> c) & 1
            done = ctx.get(core.done)
            await ctx.tick()
            cycle += 1
            if done:
                break
            assert cycle < 100000
        for name in ("busy_cycles", "active_cycles", "mac_ops", "stall_cycles", "saturations"):
            result[name] = ctx.get(getattr(core, name))

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out, mask, result


def _rand(rng, shape, bits=16):
    return rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=shape, dtype=np.int64)


@pytest.mark.parametrize("mode", ["fwd", "dx", "dw"])
@pytest.mark.parametrize("rows,cols,m,n,k", [(4, 4, 8, 8, 8), (3, 2, 5, 7, 3), (2, 4, 1, 9, 11)])
def test_modes_bit_exact(mode, rows, cols, m, n, k):
    rng = np.random.default_rng(rows * 7 + m + n * 3 + k)
    if mode == "fwd":
        p_mat, q_mat = _rand(rng, (m, k)), _rand(rng, (k, n))
    elif mode == "dx":
        p_mat, q_mat = _rand(rng, (m, k)), _rand(rng, (n, k))
    else:
        p_mat, q_mat = _rand(rng, (k, m)), _rand(rng, (k, n))
    want = mac(mode, p_mat, q_mat, shift=17)
    out, _, cnt = run_unit(rows, cols, mode, p_mat, q_mat, shift=17)
    assert np.array_equal(out, want.out)
    assert cnt["saturations"] == want.saturations
    assert cnt["mac_ops"] == m * n * k


def test_forward_bias_relu_backpressure():
    rng = np.random.default_rng(11)
    x, w = _rand(rng, (6, 5), 10), _rand(rng, (5, 7), 10)
    b = _rand(rng, (7,), 20)
    want = mac("fwd", x, w, shift=6, relu=True, bias_q=b, bias_shift=2)
    out, mask, cnt = run_unit(4, 4, "fwd", x, w, shift=6, relu=True, bias=b, bias_shift=2,
                              ready_pattern=[1, 0, 0, 1, 0])
    assert np.array_equal(out, want.out)
    assert np.array_equal(mask, want.relu_mask)
    assert cnt["stall_cycles"] > 0  # back-pressure reached the array


def test_utilization_tile_aligned():
    rng = np.random.default_rng(12)
    x, w = _rand(rng, (16, 16), 8), _rand(rng, (16, 16), 8)
    out, _, cnt = run_unit(4, 4, "fwd", x, w, shift=4)
    assert np.array_equal(out, mac("fwd", x, w, shift=4).out)
    util = cnt["mac_ops"] / (cnt["busy_cycles"] * 16)
    assert util >= 0.85, cnt
