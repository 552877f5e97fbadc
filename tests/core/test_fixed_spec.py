"""gnnweave.fixed against an independent reference: Python integers and Fractions
(``round(Fraction)`` rounds half to even), exhaustively on small ranges."""
from fractions import Fraction
from math import floor

import numpy as np
import pytest

from gnnweave.fixed import (
    ACC_GUARD_BITS,
    MEAN_RECIP_BITS,
    FixedFormat,
    accumulator_width,
    choose_frac,
    mean_reciprocal,
    narrow,
    shift_round_half_even,
)


def clamp(value: int, width: int) -> int:
    return min(max(value, -(1 << (width - 1))), (1 << (width - 1)) - 1)


@pytest.mark.parametrize("shift", range(0, 9))
def test_shift_round_half_even_exhaustive(shift):
    a = np.arange(-(1 << 12), 1 << 12)
    want = [round(Fraction(int(v), 1 << shift)) for v in a]
    np.testing.assert_array_equal(shift_round_half_even(a, shift), want)


def test_shift_round_half_even_ties_and_extremes():
    # ties go to the even neighbour, both signs
    assert shift_round_half_even([1, 3, 5, -1, -3, -5], 1).tolist() == [0, 2, 2, 0, -2, -2]
    big = np.array([2**62 - 1, -(2**62), 2**61 + 2**20], dtype=np.int64)
    for shift in (1, 21, 40, 62):
        want = [round(Fraction(int(v), 1 << shift)) for v in big]
        assert shift_round_half_even(big, shift).tolist() == want
    with pytest.raises(ValueError):
        shift_round_half_even([1], -1)


@pytest.mark.parametrize("width", [2, 3, 5, 8])
@pytest.mark.parametrize("shift", [0, 1, 3])
def test_narrow_exhaustive(width, shift):
    a = np.arange(-(1 << (width + shift + 1)), 1 << (width + shift + 1))
    values, saturated = narrow(a, shift, FixedFormat(width, 0))
    for v, got, sat in zip(a.tolist(), values.tolist(), saturated.tolist()):
        rounded = round(Fraction(v, 1 << shift))
        assert got == clamp(rounded, width)
        assert sat == (clamp(rounded, width) != rounded)


@pytest.mark.parametrize("width, frac", [(4, 0), (6, 2), (8, 5), (8, -2), (11, 8)])
def test_quantize_on_a_quarter_lsb_grid(width, frac):
    fmt = FixedFormat(width, frac)
    # every multiple of a quarter lsb from well below min to well above max
    steps = np.arange(-(4 << width), (4 << width) + 1)
    x = np.ldexp(steps.astype(np.float64), -frac - 2)
    q, saturations = fmt.quantize(x)
    want = [round(Fraction(float(v)) * Fraction(2) ** frac) for v in x]
    assert q.tolist() == [clamp(v, width) for v in want]
    assert saturations == sum(clamp(v, width) != v for v in want)
    assert q.dtype == fmt.dtype
    # values on the lsb grid inside the range come back exactly
    on_grid = (steps % 4 == 0) & (np.array(want) == q)
    np.testing.assert_array_equal(fmt.to_float(q)[on_grid], x[on_grid])


def test_quantize_random_floats_against_fractions():
    rng = np.random.default_rng(3)
    fmt = FixedFormat(12, 7)
    x = rng.normal(0, 10, 5000)
    q, saturations = fmt.quantize(x)
    exact = [round(Fraction(float(v)) * 2**7) for v in x]
    assert q.tolist() == [clamp(v, 12) for v in exact]
    assert saturations == sum(clamp(v, 12) != v for v in exact) > 0
    err = np.abs(fmt.to_float(q) - x)[np.array(exact) == q]
    assert err.max() <= fmt.lsb / 2


def test_quantize_infinities_saturate_and_nan_is_refused():
    fmt = FixedFormat(8, 4)
    q, saturations = fmt.quantize([np.inf, -np.inf, 1.0])
    assert q.tolist() == [127, -128, 16] and saturations == 2
    with pytest.raises(ValueError, match=r"NaN \(first at index \(1,\)\)"):
        fmt.quantize([0.0, np.nan])


def test_saturate_counts():
    fmt = FixedFormat(8, 0)
    values, mask = fmt.saturate([-129, -128, 0, 127, 128, 10**12])
    assert values.tolist() == [-128, -128, 0, 127, 127, 127]
    assert mask.tolist() == [True, False, False, False, True, True]


def test_format_properties_and_limits():
    fmt = FixedFormat(16, 8)
    assert (fmt.min_int, fmt.max_int, fmt.lsb) == (-32768, 32767, 1 / 256)
    assert fmt.max_value == 32767 / 256 and fmt.min_value == -128.0
    assert FixedFormat(17, 0).dtype == np.int32 and FixedFormat(16, 0).dtype == np.int16
    assert fmt.with_frac(3) == FixedFormat(16, 3)
    for bad in (dict(width=1), dict(width=33), dict(frac=65), dict(frac=-65)):
        with pytest.raises(ValueError):
            FixedFormat(**{"width": 16, "frac": 0, **bad})


def test_mean_reciprocal_rounds_half_up():
    d = np.concatenate([np.arange(0, 5000), [2**20 - 1, 2**20, 3 * 2**22, 2**32 - 1]])
    want = [0] + [floor(Fraction(1 << MEAN_RECIP_BITS, int(v)) + Fraction(1, 2)) for v in d[1:]]
    assert mean_reciprocal(d).tolist() == want


def test_accumulator_width_holds_2_to_the_32_extreme_products():
    for wi in range(2, 17):
        for ww in range(2, 17):
            worst = (-(1 << (wi - 1))) * (-(1 << (ww - 1))) * (1 << ACC_GUARD_BITS)
            assert worst <= (1 << (accumulator_width(wi, ww) - 1)) - 1


# ------------------------------------------------------------------ choose_frac

def fits(peak: float, width: int, frac: int) -> bool:
    """Does +peak (and so -peak) quantise without saturation? Exact, via Fractions."""
    return round(Fraction(peak) * Fraction(2) ** frac) <= (1 << (width - 1)) - 1


def interesting_peaks(rng):
    peaks = [float(v) for v in np.ldexp(1.0, np.arange(-20, 21))]
    peaks += [float(np.nextafter(p, 0)) for p in peaks] + [float(np.nextafter(p, 2 * p)) for p in peaks]
    peaks += [float(v) for v in np.exp(rng.uniform(np.log(1e-6), np.log(1e6), 300))]
    # values that round up to a power of two at some frac
    peaks += [2.0**k - 2.0 ** (k - w) for k in range(-5, 6) for w in (4, 8, 16)]
    return peaks


@pytest.mark.parametrize("width", [4, 8, 12, 16, 24, 32])
@pytest.mark.parametrize("headroom", [0, 2])
def test_choose_frac_is_the_largest_that_fits(width, headroom):
    rng = np.random.default_rng(width * 10 + headroom)
    for peak in interesting_peaks(rng):
        x = np.array([peak * 0.25, -peak, peak * 0.5])
        frac = choose_frac(x, width, headroom_bits=headroom)
        grown = peak * 2.0**headroom
        assert fits(grown, width, frac), (peak, width, headroom, frac)
        assert not fits(grown, width, frac + 1), (peak, width, headroom, frac)
        assert FixedFormat(width, frac).quantize(x * 2.0**headroom)[1] == 0


def test_choose_frac_with_headroom_away_from_rounding_edges():
    # the part of the headroom contract that holds today: peaks that do not round up
    rng = np.random.default_rng(9)
    for width in (8, 16):
        for headroom in (1, 3):
            for peak in np.exp(rng.uniform(np.log(1e-3), np.log(1e3), 200)):
                frac = choose_frac([peak], width, headroom_bits=headroom)
                grown = float(peak) * 2.0**headroom
                if round(Fraction(float(peak)) * Fraction(2) ** (frac + headroom)) < (1 << (width - 1)):
                    assert fits(grown, width, frac) and not fits(grown, width, frac + 1)


def test_choose_frac_edge_cases():
    assert choose_frac(np.zeros(3), 16) == 15
    assert choose_frac(np.zeros(0), 16, headroom_bits=3) == 12
    with pytest.raises(ValueError, match="non-finite"):
        choose_frac([1.0, np.inf], 16)
    with pytest.raises(ValueError, match="non-finite"):
        choose_frac([np.nan], 16)
