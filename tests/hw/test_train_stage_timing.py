"""Cycle-level regression of the TrainStage's registered control: the op's ``hold`` (read
one cycle ahead from the fill trackers and the core's depth flags) and the SGD walk's
issue register (the U phase AND no gradient-sum write in flight) shadow combinational
decisions; a cycle early corrupts the result, a cycle late moves these counts. The counts
are those of the combinational decisions they replace."""
import numpy as np
import pytest

from gnnweave.golden.pipeline import GoldenPipeline
from gnnweave.sim.pipeline_bench import BENCH_FORMAT, make_problem, run_pipeline_rtl

COUNTS = ("busy_cycles", "fwd_cycles", "bwd_cycles", "upd_cycles", "wait_cycles")


@pytest.mark.parametrize("schedule,mbs,dim,rows,seed,dx_first,gaps,want_cycles,want", [
    # both ends streaming, the dW half first: the last stage's dW holds on dY's rows
    ("1f1b-flush", 2, 8, 8, 5, False, 0.0, 607,
     [(606, 120, 240, 37, 190), (483, 120, 240, 37, 67)]),
    # an update after every backward (the walk starts as the last dW write lands)
    ("1f1b-async", 3, 4, 4, 11, True, 0.0, 469,
     [(468, 96, 192, 75, 84), (433, 96, 192, 75, 49)]),
    # the host's streams idle on random cycles
    ("1f1b-flush", 2, 8, 8, 6, True, 0.35, 555,
     [(554, 120, 242, 37, 136), (489, 124, 240, 37, 69)]),
    # a last row block of one row (5 rows) and a single short block (3 rows): the fill
    # trackers' block ends come from the last block's low row bits
    ("1f1b-flush", 2, 8, 5, 21, True, 0.3, 506,
     [(505, 114, 210, 37, 125), (445, 114, 210, 37, 65)]),
    ("1f1b-flush", 2, 4, 3, 22, False, 0.1, 333,
     [(332, 62, 124, 25, 102), (267, 62, 124, 25, 37)]),
])
def test_stage_cycle_counts(schedule, mbs, dim, rows, seed, dx_first, gaps, want_cycles, want):
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(2, mbs, 1, dim=dim, rows=rows, seed=seed)
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(0.25, 1e-3, 0.5)
    relu = [True, False]
    trace = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q).run(
        schedule, xs, loss_grad, microbatches=mbs)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule=schedule, microbatches=mbs, relu=relu,
                           lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=4, dx_first=dx_first,
                           gaps=gaps, gap_seed=3)
    for s in range(2):
        assert np.array_equal(run.masters[s], trace.masters[s]), s
    assert run.cycles == want_cycles
    assert [tuple(c[k] for k in COUNTS) for c in run.counters] == want


def test_stage_saturation_counts_match_golden():
    """Masters far outside the MAC weight's range: the forward's products and the SGD's
    narrowing saturate; each stage's counter adds both, as the golden model counts."""
    fmt = BENCH_FORMAT
    masters, xs, loss_grad = make_problem(2, 2, 1, dim=4, rows=4, seed=3)
    masters = [np.clip(m.astype(np.int64) * 64, -(1 << 31), (1 << 31) - 1) for m in masters]
    lr_q, wd_q, mu_q = fmt.sgd.quantize_hyper(0.25, 1e-3, 0.5)
    relu = [True, False]
    trace = GoldenPipeline(masters, relu=relu, fmt=fmt, lr_q=lr_q, wd_q=wd_q, mu_q=mu_q).run(
        "1f1b-flush", xs, loss_grad, microbatches=2)
    run = run_pipeline_rtl(masters, xs, loss_grad, schedule="1f1b-flush", microbatches=2, relu=relu,
                           lr_q=lr_q, wd_q=wd_q, mu_q=mu_q, fmt=fmt, lanes=4)
    for s in range(2):
        assert np.array_equal(run.masters[s], trace.masters[s]), s
    assert min(trace.saturations) > 0
    assert [c["saturations"] for c in run.counters] == list(trace.saturations)
