"""Pipeline RTL in the Amaranth simulator (no Verilog toolchain): a small run, bit-exact
against golden. The full matrix of stages x schedules x microbatches runs on Verilator
(tests/sim/test_pipeline_cocotb.py)."""
import numpy as np
import pytest

from gnnweave.golden.pipeline import GoldenPipeline
from gnnweave.hw.pipeline import Pipeline, Schedule as HwSchedule
from gnnweave.golden.pipeline import Schedule
from gnnweave.sim.pipeline_bench import BENCH_FORMAT, PipelineHost, make_problem, run_pipeline_rtl


def test_schedule_encoding_matches_golden():
    assert [s.value for s in HwSchedule] == [int(s) for s in Schedule]


def test_two_stage_async_weight_stashing_bit_exact():
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(2, 3, 1, dim=4, rows=4, seed=11)
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(0.25, 1e-3, 0.5)
    relu = [True, False]
    golden = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q)
    trace = golden.run("1f1b-async", xs, loss_grad, microbatches=3)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule="1f1b-async", microbatches=3, relu=relu,
                           lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=4)
    assert trace.fwd_version[0] == {0: 0, 1: 0, 2: 1}   # stage 0 runs F2 on the weights after B0
    for s in range(2):
        for i in range(3):
            assert np.array_equal(run.outputs[s][i], trace.outputs[s][i]), (s, i)
            assert np.array_equal(run.input_grads[s][i], trace.input_grads[s][i]), (s, i)
        assert np.array_equal(run.masters[s], trace.masters[s])
    assert all(c["ops_done"] == 3 * 3 for c in run.counters)  # F, B and U per microbatch


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_bad_stage_count():
    with pytest.raises(ValueError, match="num_stages must be in 1..8"):
        Pipeline(0)


@pytest.mark.parametrize("dx_first", [False, True])
def test_streaming_ends_bit_exact_in_any_segment_order(dx_first):
    """The first stage's forward starts while its input is arriving and the last stage's
    backward while the loss gradient is (held per row block / word until the data is in).
    In the streaming order that saves the transfer time; in another order (row by row)
    the stages wait for whole microbatches. Both must train bit-exactly."""
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(2, 2, 1, dim=8, rows=8, seed=5)
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(0.25, 1e-3, 0.5)
    relu = [True, False]
    trace = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q).run(
        "1f1b-flush", xs, loss_grad, microbatches=2)
    runs = {}
    for order in ("streaming", "rows"):
        run = run_pipeline_rtl(masters, xs, loss_grad, schedule="1f1b-flush", microbatches=2,
                               relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=4,
                               dx_first=dx_first, segment_order=order)
        for s in range(2):
            for i in range(2):
                assert np.array_equal(run.outputs[s][i], trace.outputs[s][i]), (order, s, i)
                assert np.array_equal(run.input_grads[s][i], trace.input_grads[s][i]), (order, s, i)
            assert np.array_equal(run.masters[s], trace.masters[s]), order
        runs[order] = run
    # row by row: stage 0 waits for 8 rows x 2 words of input before its first forward;
    # streaming: only for the first word of the first row block (4 segments)
    assert runs["streaming"].cycles < runs["rows"].cycles
    assert runs["streaming"].counters[0]["wait_cycles"] < runs["rows"].counters[0]["wait_cycles"]


@pytest.mark.parametrize("dx_first", [False, True])
def test_streaming_ends_bit_exact_with_uneven_arrival(dx_first):
    """The stages' ``hold`` and ``ready`` are registers computed a cycle ahead: with the
    host's streams idle and its ready low on random cycles (segments arrive just before,
    at and after the read that needs them), every result is still bit-exact."""
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(2, 2, 1, dim=8, rows=8, seed=6)
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(0.25, 1e-3, 0.5)
    relu = [True, False]
    trace = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q).run(
        "1f1b-flush", xs, loss_grad, microbatches=2)
    steady = run_pipeline_rtl(masters, xs, loss_grad, schedule="1f1b-flush", microbatches=2,
                              relu=relu, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=4,
                              dx_first=dx_first)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule="1f1b-flush", microbatches=2, relu=relu,
                           lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=4, dx_first=dx_first,
                           gaps=0.35, gap_seed=3)
    for s in range(2):
        for i in range(2):
            assert np.array_equal(run.outputs[s][i], trace.outputs[s][i]), (s, i)
            assert np.array_equal(run.input_grads[s][i], trace.input_grads[s][i]), (s, i)
        assert np.array_equal(run.masters[s], trace.masters[s])
    # the gaps were real: the first stage waited longer for its input
    assert run.counters[0]["wait_cycles"] > steady.counters[0]["wait_cycles"]


def test_host_gaps_out_of_range():
    with pytest.raises(ValueError, match=r"gaps must be in \[0, 1\), got 1.5"):
        PipelineHost([np.zeros((4, 4))], [np.zeros((4, 4))], None, schedule="gpipe", microbatches=1,
                     relu=[False], lr_q=0, wd_q=0, mu_q=0, fmt=BENCH_FORMAT, lanes=4, seg_layout=None,
                     master_width=32, gaps=1.5)


def test_velocity_port_resumes_momentum_bit_exact():
    """A run resumed with a non-zero SGD velocity (written through ``s<i>_v_*`` while
    idle) trains exactly as golden started from the same masters and velocity; without
    it (momentum restarted) the final masters differ, so the port is what makes it match."""
    import dataclasses
    from gnnweave.sim.pipeline_bench import compare_problem, random_problem, run_problem_rtl
    problem = random_problem(2, 2, 1, "1f1b-flush", dim=4, rows=4, seed=9)
    rng = np.random.default_rng(9)
    vel = [problem.fmt.sgd.velocity.quantize(rng.normal(0, 0.5, w.shape))[0].astype(np.int64)
           for w in problem.masters]
    loaded = dataclasses.replace(problem, velocities=vel)
    golden = loaded.run_golden()
    run = run_problem_rtl(loaded, simulator="amaranth")
    assert compare_problem(loaded, golden, run) == []
    restarted = problem.run_golden()
    assert any(not np.array_equal(a, b) for a, b in zip(golden.masters, restarted.masters))
