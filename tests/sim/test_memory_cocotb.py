"""The Aggregator in cocotb behind a board-like memory (sim/tb.py MemoryModel: reordering
across IDs, random latency, open-row DRAM) and with faults: injected SLVERR/DECERR and a
forced address-guard fault (sim/memory_bench.py)."""
from __future__ import annotations

import pytest

from gnnweave.sim import memory_bench


@pytest.fixture(scope="module")
def built():
    return memory_bench.build_memory_bench()


def _run(built, testcase):
    from gnnweave.sim import runner
    return runner.run(built, memory_bench.BENCH_MODULE, testcase=testcase,
                      params={"config": memory_bench.CONFIG, "seed": 0},
                      run_name=f"memory-{testcase}")


@pytest.mark.slow
def test_bit_exact_behind_a_reordering_dram_with_random_latency(built):
    res = _run(built, "board_memory")
    assert res.failed == 0 and res.tests == 1
    assert res.results["board_memory"]["reordered"] > 0


def test_injected_errors_and_a_forced_address_fault_end_the_run_and_the_next_is_right(built):
    res = _run(built, "injected_errors,forced_addr_fault")
    assert res.failed == 0 and res.tests == 2
    assert res.results["injected_errors"] == ["read:2", "read:3", "write:2", "write:3"]
    assert res.results["forced_addr_fault"]["status"] & (1 << 3)
