"""The Pipeline unit (training Pipeline behind the AXI front end) in cocotb on Verilator:
multi-step training under every schedule, bit-exact with GoldenPipeline (logits, stage 0
dX, final master weights), with the host's loss-gradient doorbell served by the bench,
under AXI backpressure and read latency; refused configurations move no memory."""
from __future__ import annotations

from gnnweave.sim.pipeline_unit_bench import run_bench


def test_train_every_schedule_bit_exact_under_backpressure():
    result = run_bench("train_schedules", latency=12, backpressure=0.3, seed=1)
    assert result.failed == 0 and result.tests == 1
    res = result.results["train_schedules"]
    assert set(res) == {"gpipe", "1f1b-flush", "1f1b-async"}
    for sched, r in res.items():
        assert r["match"], sched
        assert r["saturations"] == r["golden_saturations"], (sched, r)
        # the unit waited for the host's gradients at least once (the doorbell gates reads)
        assert r["grad_wait_cycles"] > 0, (sched, r)
        assert r["stall_cycles"] > 0, (sched, r)     # the pauses reached the unit
        # rows leave whole and consecutive rows join: INCR bursts, not single beats
        assert r["write_beats"] >= 2 * r["write_bursts"], (sched, r)
    assert res["1f1b-flush"]["dx_written"] is False and res["gpipe"]["dx_written"] is True


def test_config_errors_move_no_memory():
    result = run_bench("config_errors")
    assert result.failed == 0 and result.tests == 1
    res = result.results["config_errors"]
    assert len(res["cases"]) == 25
    assert res["after"]["match"]


def test_write_outside_its_buffer_is_refused_and_the_next_run_is_exact():
    result = run_bench("write_fault")
    assert result.failed == 0 and result.tests == 1
    res = result.results["write_fault"]
    assert res["status"] >> 3 & 1
    assert res["beats_before_fault"] >= 1      # the rows inside were written
    assert res["after"]["match"]
