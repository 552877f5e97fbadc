"""A short fuzz campaign (benchmarks/bench_fuzz.py, whose full run is ``make bench
BENCH=fuzz``): random good, driver-malformed, register-malformed and error-injected
aggregate jobs on one simulated device behind the board-like memory; no mismatch against
golden, no hung run, no burst outside the configured buffers or the memory."""
from __future__ import annotations

from benchmarks.bench_fuzz import campaign

CONFIG = "small-agg"


def test_short_fuzz_campaign_is_clean():
    report = campaign(jobs=60, seed=7, config=CONFIG, progress=False)
    assert report["mismatches"] == 0, report["first_mismatches"]
    assert report["hung_runs"] == 0
    assert report["out_of_buffer_accesses"] == 0 and report["memory_faults"] == 0, report["first_fault"]
    assert report["jobs_run"] == 60
    kinds = {k.split(":")[0] for k in report["errors_caught_by_kind"]}
    assert {"driver", "config_error"} <= kinds, report["errors_caught_by_kind"]
    assert report["memory"]["reordered_bursts"] > 0
    assert report["passed"]
