"""MacCore + skewed buffers in the Amaranth simulator, bit-exact against golden/mac.py."""
import numpy as np
import pytest

from gnnweave.golden.mac import mac
from gnnweave.sim.mac_bench import run_mac_rtl


def run_unit(rows, cols, mode, p_mat, q_mat, *, shift, relu=False, bias=None, bias_shift=0,
             ready_pattern=None, out_width=16):
    """Load P and Q through the write ports, run one operation, return (out, relu_mask, counters)."""
    res = run_mac_rtl(mode, p_mat, q_mat, shift=shift, relu=relu, bias=bias,
                      bias_shift=bias_shift, array_rows=rows, array_cols=cols,
                      ready_pattern=ready_pattern, out_width=out_width)
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
