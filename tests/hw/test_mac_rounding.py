"""MacCore's narrowing (its rounding mask and half latched with the shift at start) against
golden/mac.py bit for bit: every shift 0..63 the tops accept, on exact halves and their
neighbours, and runs started in the cycle after the previous run's ``done`` with another
shift, so the first output of a run shows the new shift's constants."""
from __future__ import annotations

import numpy as np
from amaranth.sim import Simulator

from gnnweave.golden.mac import mac
from gnnweave.hw.mac import MacMode, MacUnit
from gnnweave.sim.mac_bench import load_bias, load_skewed

from .mac_core_sim import run_core

ROWS, COLS = 2, 4
# FWD with depth 1: out[i, j] = narrow(x[i] * w[j] + (bias[j] << bias_shift), shift)
X = np.array([[0], [1], [-1], [2], [-2], [3], [-3], [-12345]], dtype=np.int64)
W = np.array([[1, -1, 1, 7]], dtype=np.int64)


def _tie_bias(shift: int) -> tuple[np.ndarray, int]:
    """A bias and bias_shift whose aligned values are exact halves at ``shift`` (the rows of
    X then add -3..3 around them, and a large product)."""
    if shift == 0:
        return np.array([5, -7, 1 << 30, -(1 << 31)], dtype=np.int64), 0
    bias_shift = min(31, max(0, shift - 21))
    e = shift - 1 - bias_shift                  # bias << bias_shift == (2t + 1) << (shift - 1)
    fits = [b for b in ((1 << e), -(1 << e), 3 << e, -(3 << e), 5 << e, -(5 << e))
            if -(1 << 31) <= b < (1 << 31)]
    return np.array([fits[i % len(fits)] for i in range(COLS)], dtype=np.int64), bias_shift


def _run_back_to_back(runs):
    """``runs``: (shift, bias, bias_shift); the bias is rewritten only when it changes, else
    each run starts in the cycle after the previous ``done``. Returns [(out, saturations)]."""
    unit = MacUnit(rows=ROWS, cols=COLS, max_dim=8)
    core = unit.core
    results = []

    async def bench(ctx):
        await load_skewed(ctx, unit.p, X, core.lanes)
        await load_skewed(ctx, unit.q, W, core.lanes)
        loaded = None
        for shift, bias, bias_shift in runs:
            if loaded is None or not np.array_equal(bias, loaded):
                await load_bias(ctx, core, bias)
                loaded = bias
            settings = ((core.mode, MacMode.FWD), (core.m, X.shape[0]), (core.n, W.shape[1]),
                        (core.k, 1), (core.shift, shift), (core.relu, 0), (core.use_bias, 1),
                        (core.bias_shift, bias_shift))
            out = np.full((X.shape[0], W.shape[1]), np.iinfo(np.int64).min, dtype=np.int64)
            await run_core(ctx, core, settings, out, max_cycles=1000)
            results.append((out, ctx.get(core.saturations)))

    sim = Simulator(unit)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return results


def _check(runs, results):
    ties = 0
    for (shift, bias, bias_shift), (out, saturations) in zip(runs, results, strict=True):
        want = mac("fwd", X, W, shift=shift, bias_q=bias, bias_shift=bias_shift)
        assert np.array_equal(out, want.out), (shift, bias_shift, out, want.out)
        assert saturations == want.saturations, (shift, saturations, want.saturations)
        if shift:
            exact = X @ W + (bias << bias_shift)
            ties += int(np.sum((exact & ((1 << shift) - 1)) == 1 << (shift - 1)))
    return ties


def test_every_shift_bit_exact_on_halves():
    runs = [(shift, *_tie_bias(shift)) for shift in range(64)]
    ties = _check(runs, _run_back_to_back(runs))
    assert ties >= 63 * COLS                     # row 0 of X is an exact half in every column


def test_new_shift_from_the_first_output_of_a_run():
    # one bias for all runs: each run starts in the cycle after the previous done
    bias, bias_shift = _tie_bias(40)
    shifts = [40, 63, 0, 40, 1, 39, 62, 17, 41]
    runs = [(shift, bias, bias_shift) for shift in shifts]
    _check(runs, _run_back_to_back(runs))
