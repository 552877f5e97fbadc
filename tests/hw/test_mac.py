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
