"""Pipeline RTL (Verilator + cocotb) against the golden pipeline, bit for bit.

Every stage's output and input gradient of every microbatch and the final master weights
are compared after several steps; the bubble measured from the cycle counters is
checked against the schedule formula.
"""
from __future__ import annotations

import pytest

from gnnweave.golden.pipeline import bubble_formula
from gnnweave.sim.pipeline_bench import (COCOTB_BUILD, run_cocotb_pipeline, run_cocotb_pipeline_batch,
                                         verify_split_pipeline)


def _check(summary):
    assert summary["match"], summary["mismatches"]
    assert summary["cycles"] > 0
    return summary


@pytest.mark.parametrize("schedule,m", [("gpipe", 4), ("1f1b-flush", 3), ("1f1b-async", 5)])
def test_two_stages_all_schedules(schedule, m):
    s = _check(run_cocotb_pipeline(2, m, schedule, steps=2, seed=m))
    assert s["bubble_formula"] == pytest.approx(bubble_formula(schedule, 2, m))
    # counters saw every op: p stages x (F + B) per microbatch, plus the updates
    ops = sum(c["ops_done"] for c in s["counters"])
    updates = 2 * 2 if schedule != "1f1b-async" else 2 * 2 * m
    assert ops == 2 * 2 * m * 2 + updates


def test_two_stages_single_microbatch_and_momentum_off():
    _check(run_cocotb_pipeline(2, 1, "1f1b-flush", steps=3, momentum=0.0, seed=3))


@pytest.mark.slow
@pytest.mark.parametrize("stages", [1, 3, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-flush", "1f1b-async"])
@pytest.mark.parametrize("m", [1, 4, 16])
def test_stages_schedules_microbatches(stages, schedule, m):
    _check(run_cocotb_pipeline(stages, m, schedule, steps=2, seed=stages * 100 + m))


#: Allowed |measured - predicted| bubble, in fractions. The predictions model ops with no
#: latency between them. The RTL hides the host transfers at the ends (the first stage's
#: forward streams on its arriving input, the last stage's backward on the arriving loss
#: gradient); what is left are one-cycle handoffs between ops: measured within 0.25
#: points with 32-wide stages.
BUBBLE_TOL = {"gpipe": 0.01, "1f1b-flush": 0.01}


@pytest.mark.slow
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_bubble_matches_formula(stages):
    """Balanced 32-wide stages (the bench's build): with dx_first = 0 (textbook order) the
    measured idle share is within 1 point of (p-1)/(m+p-1) (0 for one stage); with the
    default dx_first = 1 it is smaller, close to the timing model where dX leaves after
    half of the backward (schedule_timeline(t_dx=1))."""
    from gnnweave.golden.pipeline import schedule_timeline
    cases = [dict(microbatches=m, schedule=sched, steps=1, dx_first=dxf, dim=32, rows=16,
                  seed=m, momentum=0.0)
             for m in (1, 4, 16) for sched in ("gpipe", "1f1b-flush") for dxf in (0, 1)]
    runs = run_cocotb_pipeline_batch(stages, cases, build={"max_dim": 32, "max_rows": 16})
    by_key = {}
    for s in runs:
        _check(s)
        m, sched = s["microbatches"], s["schedule"]
        if s["dx_first"]:
            predicted = schedule_timeline(sched, stages, m, t_f=1, t_b=2, t_dx=1).bubble_fraction
        else:
            predicted = bubble_formula(sched, stages, m)
        assert abs(s["bubble_fraction"] - predicted) <= BUBBLE_TOL[sched], s
        by_key[(m, sched, s["dx_first"])] = s["bubble_fraction"]
    for (m, sched, dxf), b in by_key.items():
        if dxf and stages > 1:
            assert b < by_key[(m, sched, 0)]


def test_batch_refuses_momentum_after_first_case():
    with pytest.raises(ValueError, match=r"cases\[1\]: momentum must be 0"):
        run_cocotb_pipeline_batch(2, [dict(microbatches=1, schedule="gpipe", steps=1),
                                      dict(microbatches=1, schedule="gpipe", steps=1)])


# ---------------------------------------------------------------- stages split across devices

def _check_split(res):
    assert res["single"]["match"], res["single"]["mismatches"]
    for r in res["split"]:
        assert r["match_golden"] and r["match_single_pipeline"], r
    return res


@pytest.mark.parametrize("schedule", [
    pytest.param("gpipe", marks=pytest.mark.slow), pytest.param("1f1b-flush", marks=pytest.mark.slow),
    "1f1b-async"])
def test_split_devices_amaranth_bit_identical(schedule):
    """Stages 0..1 on one Pipeline, 2..3 on another (stage_offset 2), linked by the bench
    with a 1-cycle and a 9-cycle link: identical to one 4-stage Pipeline and to golden."""
    res = _check_split(verify_split_pipeline((2, 2), 3, schedule, steps=2, link_delays=(1, 9), dim=4,
                                             rows=4, seed=21, simulator="amaranth"))
    # a longer link delays the run, it never changes a number
    assert res["split"][1]["cycles"] > res["split"][0]["cycles"] >= res["single"]["cycles"]


@pytest.mark.slow
@pytest.mark.parametrize("devices", [(2, 2), (1, 3)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-flush", "1f1b-async"])
def test_split_devices_verilator_bit_identical(devices, schedule):
    _check_split(verify_split_pipeline(devices, 4, schedule, steps=2, link_delays=(1, 16), seed=7,
                                       build=dict(COCOTB_BUILD)))
