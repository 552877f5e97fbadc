"""MacCore + skewed buffers in the Amaranth simulator, bit-exact against golden/mac.py."""
import numpy as np
import pytest

from gnnweave.golden.mac import mac
from gnnweave.sim.mac_bench import run_mac_rtl

from .test_blocks import simulate


def run_unit(rows, cols, mode, p_mat, q_mat, *, shift, relu=False, bias=None, bias_shift=0,
             ready_pattern=None, out_width=16, **core_options):
    """Load P and Q through the write ports, run one operation, return (out, relu_mask, counters)."""
    res = run_mac_rtl(mode, p_mat, q_mat, shift=shift, relu=relu, bias=bias,
                      bias_shift=bias_shift, array_rows=rows, array_cols=cols,
                      ready_pattern=ready_pattern, out_width=out_width,
                      core_options=core_options)
    return res["out"], res["relu_mask"], res


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


@pytest.mark.parametrize("mode,rows,cols,m,n,k", [("fwd", 3, 2, 5, 7, 3), ("dw", 4, 4, 9, 4, 1)])
def test_settled_configuration_bit_exact(mode, rows, cols, m, n, k):
    # the start-time decode from registers (first tile's extents, k == 1, a zero extent)
    rng = np.random.default_rng(m * 5 + n + k)
    p_mat = _rand(rng, (k, m) if mode == "dw" else (m, k))
    q_mat = _rand(rng, (k, n))
    want = mac(mode, p_mat, q_mat, shift=15)
    out, _, cnt = run_unit(rows, cols, mode, p_mat, q_mat, shift=15, settled_config=True)
    assert np.array_equal(out, want.out)
    assert cnt["mac_ops"] == m * n * k


@pytest.mark.parametrize("mode,rows,cols,m,n,k", [("fwd", 4, 4, 8, 8, 8), ("dx", 3, 5, 7, 11, 2),
                                                  ("dw", 4, 2, 9, 3, 1)])
def test_operand_chain_bit_exact(mode, rows, cols, m, n, k):
    # columns run skewed (the A operand passed along the row): with bias, ReLU,
    # back-pressure and depths shorter than the skew, every row still leaves whole
    rng = np.random.default_rng(m * 3 + n * 5 + k)
    p_mat = _rand(rng, (k, m) if mode == "dw" else (m, k), 12)
    q_mat = _rand(rng, (n, k) if mode == "dx" else (k, n), 12)
    fwd = mode == "fwd"
    bias = _rand(rng, (n,), 20) if fwd else None
    want = mac(mode, p_mat, q_mat, shift=9, relu=fwd, bias_q=bias, bias_shift=3)
    out, mask, cnt = run_unit(rows, cols, mode, p_mat, q_mat, shift=9, relu=fwd, bias=bias,
                              bias_shift=3, ready_pattern=[1, 1, 0], operand_chain=True)
    assert np.array_equal(out, want.out)
    if fwd:
        assert np.array_equal(mask, want.relu_mask)
    assert cnt["saturations"] == want.saturations
    assert cnt["mac_ops"] == m * n * k


def test_forward_bias_relu_backpressure():
    rng = np.random.default_rng(11)
    # more row segments (40 rows x 2 tile columns) than the core's output FIFO holds
    x, w = _rand(rng, (40, 5), 10), _rand(rng, (5, 7), 10)
    b = _rand(rng, (7,), 20)
    want = mac("fwd", x, w, shift=6, relu=True, bias_q=b, bias_shift=2)
    out, mask, cnt = run_unit(4, 4, "fwd", x, w, shift=6, relu=True, bias=b, bias_shift=2,
                              ready_pattern=[1, 0, 0, 1, 0])
    assert np.array_equal(out, want.out)
    assert np.array_equal(mask, want.relu_mask)
    assert cnt["stall_cycles"] > 0  # back-pressure reached the array (credits ran out)


def test_utilization_tile_aligned():
    rng = np.random.default_rng(12)
    x, w = _rand(rng, (16, 16), 8), _rand(rng, (16, 16), 8)
    out, _, cnt = run_unit(4, 4, "fwd", x, w, shift=4)
    assert np.array_equal(out, mac("fwd", x, w, shift=4).out)
    util = cnt["mac_ops"] / (cnt["busy_cycles"] * 16)
    assert util >= 0.85, cnt


def test_array_computes_on_while_the_sink_waits():
    """The output FIFO holds every row segment of this run (8 rows x 2 tile columns): with
    the sink not ready for 300 cycles the array still accumulates every step without a
    stall, and the results come out bit-exact once the sink takes them."""
    rng = np.random.default_rng(13)
    x, w = _rand(rng, (8, 20)), _rand(rng, (20, 8))
    want = mac("fwd", x, w, shift=15)
    out, _, cnt = run_unit(4, 4, "fwd", x, w, shift=15, ready_pattern=[0] * 300 + [1] * 10_000)
    assert np.array_equal(out, want.out)
    assert cnt["active_cycles"] == 4 * 20 and cnt["stall_cycles"] == 0
    assert cnt["busy_cycles"] > 300


@pytest.mark.parametrize("registered", [False, True])
def test_skewed_buffer_reads_zero_at_and_past_the_extent(registered):
    """Every (start, extent, axis) of a filled 8 x 8 buffer, some segments rewritten in
    part: lane ``l`` reads element ``start + l`` along the axis while it is below
    ``extent``, else 0."""
    from gnnweave.hw.mac import SkewedBuffer
    lanes, dim = 4, 8
    buf = SkewedBuffer(lanes=lanes, rows=dim, cols=dim, registered_request=registered)
    matrix = np.arange(1, dim * dim + 1).reshape(dim, dim) * 3 - 100
    partial = [(2, 4, 1), (5, 0, 3), (6, 4, 2)]
    cases = [(rowwise, fixed, start, extent) for rowwise in (0, 1) for fixed in (0, 2, 5, 6)
             for start in range(0, dim - lanes + 1) for extent in range(start, dim + 1)]
    seen = []

    async def bench(ctx):
        for r in range(dim):
            for c in range(0, dim, lanes):
                ctx.set(buf.wr_en, 1)
                ctx.set(buf.wr, {"row": r, "col": c, "count": lanes,
                                 "data": [int(x) for x in matrix[r, c:c + lanes]]})
                await ctx.tick()
        # a partial segment writes its first `count` lanes only
        for r, c, count in partial:
            ctx.set(buf.wr, {"row": r, "col": c, "count": count, "data": [7777] * lanes})
            await ctx.tick()
        ctx.set(buf.wr_en, 0)
        for rowwise, fixed, start, extent in cases:
            ctx.set(buf.rd_en, 1)
            for name, v in (("rd_rowwise", rowwise), ("rd_fixed", fixed), ("rd_start", start),
                            ("rd_extent", extent)):
                ctx.set(getattr(buf, name), v)
            await ctx.tick()
            ctx.set(buf.rd_en, 0)
            await ctx.tick().repeat(buf.read_latency)
            seen.append([ctx.get(buf.rd_data[l]) for l in range(lanes)])

    simulate(buf, bench)
    for r, c, count in partial:
        matrix[r, c:c + count] = 7777
    for (rowwise, fixed, start, extent), got in zip(cases, seen):
        line = matrix[fixed] if rowwise else matrix[:, fixed]
        want = [int(line[start + l]) if start + l < extent else 0 for l in range(lanes)]
        assert got == want, (rowwise, fixed, start, extent)
