"""Golden MacArray and SGD models against independent oracles (float64, Python ints)."""
from fractions import Fraction

import numpy as np
import pytest

from gnnweave.fixed import FixedFormat
from gnnweave.golden.mac import (
    MacMode,
    SgdFormat,
    mac,
    mac_accumulator_width,
    mac_forward,
    mac_forward_float,
    mac_input_grad,
    mac_input_grad_float,
    mac_weight_grad,
    mac_weight_grad_float,
    master_to_weight,
    sgd_update,
    sgd_update_float,
)


def _oracle_narrow(exact, shift, width):
    """Round half to even with Python Fractions, then clip: independent of fixed.py."""
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    flat = []
    for v in np.asarray(exact, dtype=object).reshape(-1):
        q = Fraction(int(v), 1 << shift)
        r = round(q)  # Python rounds Fractions half to even
        flat.append(min(max(r, lo), hi))
    return np.array(flat, dtype=np.int64).reshape(np.shape(exact))


def _rand(rng, shape, lo=-(1 << 15), hi=(1 << 15)):
    return rng.integers(lo, hi, size=shape, dtype=np.int64)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (16, 33, 9), (40, 3, 17)])
def test_forward_matches_python_int_oracle(m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    x, w, b = _rand(rng, (m, k)), _rand(rng, (k, n)), _rand(rng, (n,), -(1 << 20), 1 << 20)
    shift, bias_shift = 14, 3
    res = mac_forward(x, w, b, shift=shift, bias_shift=bias_shift)
    exact = x.astype(object) @ w.astype(object) + (b.astype(object) * (1 << bias_shift))[None, :]
    want = _oracle_narrow(exact, shift, 16)
    assert np.array_equal(res.out, want)
    lo, hi = -(1 << 15), (1 << 15) - 1
    raw = np.array([round(Fraction(int(v), 1 << shift)) for v in exact.reshape(-1)]).reshape(exact.shape)
    assert res.saturations == int(np.count_nonzero((raw < lo) | (raw > hi)))
    if m * n >= 20:
        assert res.saturations > 0  # full-range inputs must saturate some outputs
    assert res.relu_mask is None


def test_forward_relu_mask_is_output_positive_and_matches_float():
    rng = np.random.default_rng(1)
    x, w = _rand(rng, (9, 6), -64, 64), _rand(rng, (6, 5), -64, 64)
    res = mac_forward(x, w, shift=4, relu=True)
    plain = mac_forward(x, w, shift=4)
    assert np.array_equal(res.relu_mask, plain.out > 0)
    assert np.array_equal(res.out, np.where(plain.out > 0, plain.out, 0))
    ref, _ = mac_forward_float(x / 16.0, w / 16.0, relu=True)
    # x, w at frac 4, out at frac 4: shift 4; float result within half an LSB
    assert np.max(np.abs(res.out / 16.0 - ref)) <= 0.5 / 16 + 1e-12


def test_half_way_cases_round_to_even():
    x = np.array([[1, 3, 5, 7, -1, -3]]).T   # [6, 1]
    w = np.array([[1]])
    res = mac_forward(x, w, shift=1)
    assert res.out.ravel().tolist() == [0, 2, 2, 4, 0, -2]


def test_input_grad_uses_forward_weight_layout_and_mask():
    rng = np.random.default_rng(2)
    dy, w = _rand(rng, (8, 5)), _rand(rng, (7, 5))
    mask = rng.random((8, 5)) > 0.4
    res = mac_input_grad(dy, w, shift=15, relu_mask=mask)
    exact = np.where(mask, dy, 0).astype(object) @ w.T.astype(object)
    assert np.array_equal(res.out, _oracle_narrow(exact, 15, 16))
    ref = mac_input_grad_float(dy, w, relu_mask=mask) / 2**15
    assert np.max(np.abs(np.clip(ref, -32768, 32767) - res.out)) <= 0.5


def test_weight_grad_sums_over_rows():
    rng = np.random.default_rng(3)
    x, dy = _rand(rng, (13, 4)), _rand(rng, (13, 6))
    mask = rng.random((13, 6)) > 0.5
    res = mac_weight_grad(x, dy, shift=18, relu_mask=mask)
    exact = x.T.astype(object) @ np.where(mask, dy, 0).astype(object)
    assert np.array_equal(res.out, _oracle_narrow(exact, 18, 16))
    ref = mac_weight_grad_float(x, dy, relu_mask=mask) / 2**18
    assert np.max(np.abs(np.clip(ref, -32768, 32767) - res.out)) <= 0.5


def test_dispatch_and_mode_parse():
    rng = np.random.default_rng(4)
    a, b = _rand(rng, (3, 4), -9, 9), _rand(rng, (4, 2), -9, 9)
    assert np.array_equal(mac("fwd", a, b, shift=0).out, a @ b)
    assert np.array_equal(mac(MacMode.DX, a @ b, b, shift=0, out_width=32).out, (a @ b) @ b.T)
    assert np.array_equal(mac(2, a, a @ b, shift=0, out_width=32).out, a.T @ (a @ b))
    with pytest.raises(ValueError, match="unknown MAC mode"):
        MacMode.parse("conv")


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match=r"x_q\[0, 1\] = 40000"):
        mac_forward(np.array([[0, 40000]]), np.zeros((2, 1), int), shift=0)
    with pytest.raises(ValueError, match="x_q has 2 columns but w_q has 3 rows"):
        mac_forward(np.zeros((1, 2), int), np.zeros((3, 1), int), shift=0)
    with pytest.raises(ValueError, match="relu_mask: shape"):
        mac_input_grad(np.zeros((2, 2), int), np.zeros((3, 2), int), shift=0,
                       relu_mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="shift must be"):
        mac_weight_grad(np.zeros((2, 2), int), np.zeros((2, 2), int), shift=-1)


def test_accumulator_width_bounds_worst_case():
    for depth in (1, 2, 3, 100, 4096):
        width = mac_accumulator_width(depth)
        worst = depth * (1 << 30)  # (-2**15) * (-2**15) summed depth times
        assert worst <= (1 << (width - 1)) - 1


# ---------------------------------------------------------------- SGD

def test_sgd_matches_float_when_exact():
    fmt = SgdFormat()
    rng = np.random.default_rng(5)
    w_f = rng.integers(-2000, 2000, size=(6, 4)) / 2**10    # representable in master
    g_f = rng.integers(-3000, 3000, size=(6, 4)) / 2**12    # grad frac 12
    lr_q, wd_q, mu_q = fmt.quantize_hyper(0.25, 2**-8, 0.5)   # powers of two: exact products
    w_q, _ = fmt.master.quantize(w_f)
    g_q, _ = fmt.grad.quantize(g_f)
    res = sgd_update(w_q, g_q, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt)
    ref_w, ref_v = sgd_update_float(w_f, g_f, lr=0.25, wd=2**-8, mu=0.5)
    assert np.array_equal(fmt.master.to_float(res.master), ref_w)
    assert np.array_equal(fmt.master.to_float(res.velocity), ref_v)
    res2 = sgd_update(res.master, g_q, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q,
                      velocity_q=res.velocity, fmt=fmt)
    ref_w2, _ = sgd_update_float(ref_w, g_f, lr=0.25, wd=2**-8, mu=0.5, velocity=ref_v)
    assert np.allclose(fmt.master.to_float(res2.master), ref_w2, atol=2 * fmt.master.lsb)
    assert res.saturations == 0
    w_mac, sat = master_to_weight(res.master, fmt)
    assert np.array_equal(w_mac, res.weight) and sat == 0
    assert np.max(np.abs(fmt.weight.to_float(w_mac) - ref_w)) <= fmt.weight.lsb / 2


def test_sgd_rounds_half_even_and_saturates():
    fmt = SgdFormat(master=FixedFormat(20, 12), weight=FixedFormat(8, 4), grad=FixedFormat(16, 12),
                    lr=FixedFormat(16, 1))
    # lr = 0.5: step = rhe(g / 2): g = 1 -> 0 (tie to even), g = 3 -> 2
    res = sgd_update(np.array([0, 0, (1 << 19) - 1]), np.array([1, 3, -32768]), lr_q=1, fmt=fmt)
    assert res.master.tolist() == [0, -2, (1 << 19) - 1]
    assert res.saturations == 1
    assert res.velocity is None


def test_sgd_rejects_bad_registers():
    with pytest.raises(ValueError, match="lr_q=-1"):
        sgd_update(np.zeros(2, int), np.zeros(2, int), lr_q=-1)
    with pytest.raises(ValueError, match="grad_q: shape"):
        sgd_update(np.zeros(2, int), np.zeros(3, int), lr_q=1)
    with pytest.raises(ValueError, match="lr=4.0 does not fit"):
        SgdFormat().quantize_hyper(4.0)
