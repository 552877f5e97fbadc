"""The simulated device behind a board-like memory (sim/native/harness.cpp's memory model):
results bit-exact when bursts of different IDs come back out of order, each after a random
latency and an open-row DRAM's bank and row costs; injected SLVERR/DECERR raise
``axi_error``, end the run and leave the device good for the next job; every burst stays
inside the buffers the host configured; the interrupt (GIE/IER/ISR) ends each wait of
the driver on the simulated device.
"""
from __future__ import annotations

import numpy as np
import pytest

from gnnweave.contract import (
    CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, AggregatorStatus, CtrlBit, GieBit, IrqBit,
)
from gnnweave.sim import device as simdevice
from gnnweave.sim.aggregate_bench import MAX, MEAN, SUM, random_graph_job

from .test_simdevice import check

#: the Aggregator alone: the memory model is the same for every build, and this one
#: builds fastest
CONFIG = "small-agg"

AXI_ERROR = AggregatorStatus.AXI_ERROR


@pytest.fixture(scope="module")
def native():
    simdevice.build_native(CONFIG)
    sim = simdevice.NativeAccelerator(np.zeros(4096, np.uint8), 0x1000_0000, latency=16,
                                     config=CONFIG)
    yield sim
    sim.close()


@pytest.fixture
def board_memory(native):
    native.set_memory_model(reorder=True, jitter=48, dram=True, seed=5)
    yield native
    native.set_memory_model(on=False)
    native.clear_injections()


def _delta(before, after, key):
    return after[key] - before[key]


@pytest.mark.parametrize("reduce", [SUM, MEAN, MAX])
def test_out_of_order_random_latency_dram_bit_exact(board_memory, reduce):
    rng = np.random.default_rng(40 + reduce)
    before = board_memory.stats()
    for n, deg, f, weighted in ((90, 4.0, 16, True), (70, 3.0, 40, False), (40, 6.0, 64, reduce != MAX)):
        job = random_graph_job(rng, n, deg, f, reduce, weighted)
        res = simdevice.run_job(job, latency=int(rng.integers(0, 24)), sim=board_memory,
                                config=CONFIG)
        check(job, res, "board memory")
        assert res.region_violations == 0
    after = board_memory.stats()
    assert _delta(before, after, "reordered_bursts") > 0, "no burst came back out of order"
    assert _delta(before, after, "row_misses") > 0


def test_memory_model_changes_timing_not_results(native):
    rng = np.random.default_rng(9)
    job = random_graph_job(rng, 120, 5.0, 32, SUM, True)
    exact = simdevice.run_job(job, latency=16, sim=native, config=CONFIG)
    native.set_memory_model(reorder=True, jitter=64, dram=True, seed=1)
    try:
        board = simdevice.run_job(job, latency=16, sim=native, config=CONFIG)
    finally:
        native.set_memory_model(on=False)
    again = simdevice.run_job(job, latency=16, sim=native, config=CONFIG)
    check(job, exact, "exact")
    check(job, board, "board")
    assert np.array_equal(exact.out, board.out)
    assert board.counters["busy_cycles"] > exact.counters["busy_cycles"]
    assert again.counters == exact.counters, "the exact timing is back when the model is off"


@pytest.mark.parametrize("kind,resp,after", [("read", "SLVERR", 0), ("read", "DECERR", 25),
                                             ("write", "SLVERR", 2), ("write", "DECERR", 0)])
def test_injected_error_sets_axi_error_ends_the_run_and_the_next_job_is_right(
        board_memory, kind, resp, after):
    rng = np.random.default_rng(hash((kind, resp, after)) % 1000)
    job = random_graph_job(rng, 60, 4.0, 24, MEAN, True)
    before = board_memory.stats()
    board_memory.inject_error(kind, after=after, resp=resp)
    res = simdevice.run_job(job, latency=8, sim=board_memory, config=CONFIG, max_cycles=200_000)
    assert not res.timed_out, "an error response must end the run"
    assert _delta(before, board_memory.stats(), "injected_errors") == 1
    assert res.status & AXI_ERROR, f"status 0x{res.status:x}: axi_error not set"
    assert res.faults == 0 and res.region_violations == 0
    assert board_memory.reg_read(CTRL_OFFSET) & CtrlBit.AP_IDLE.mask, "idle after the failed run"
    good = random_graph_job(rng, 50, 3.0, 16, SUM, False)
    check(good, simdevice.run_job(good, latency=8, sim=board_memory, config=CONFIG), "next job")


def test_a_burst_outside_the_configured_buffers_is_counted(native):
    """The harness's own check has teeth: the same run with its feature buffer declared as
    row 0 only is reported (the hardware, whose registers say otherwise, runs as usual)."""
    rng = np.random.default_rng(12)
    job = random_graph_job(rng, 30, 4.0, 16, SUM, False)
    regs = job.registers()
    reads, writes = simdevice.job_buffers(job)
    shrunk = [(a, regs["feat_stride"]) if a == regs["feat_addr"] else (a, s) for a, s in reads]
    native.set_memory(job.memory_image(), job.base_addr)
    native.set_regions(read=shrunk, write=writes)
    native.clear_faults()
    before = native.stats()
    regmap = simdevice.regmap(CONFIG)
    for name, value in regs.items():
        simdevice.write_register(native, regmap[name], value)
    native.reg_write(GIE_OFFSET, GieBit.ENABLE.mask)
    native.reg_write(IER_OFFSET, IrqBit.AP_DONE.mask)
    native.reg_write(CTRL_OFFSET, CtrlBit.AP_START.mask)
    native.run_until_interrupt(200_000)
    assert native.interrupt
    native.reg_write(ISR_OFFSET, IrqBit.AP_DONE.mask)
    native.set_regions(read=[], write=[])
    violations = _delta(before, native.stats(), "region_violations")
    first = native.first_fault()
    native.clear_faults()
    assert violations >= int(np.count_nonzero(job.indices != 0)) > 0
    assert "outside the configured read buffers" in first


def test_driver_interrupt_path_and_error_recovery():
    """Through the driver on a SimDevice: the device's clock stops at the interrupt
    (GIE/IER set by the driver), the driver acknowledges ISR, an injected error surfaces as
    AcceleratorError naming axi_error, and the next run is bit-exact; no burst leaves the
    buffers the driver configured."""
    from gnnweave.golden.aggregate import Reduce, aggregate_raw
    from gnnweave.graph import CSRGraph
    from gnnweave.host.driver import AcceleratorError, SimAccel
    from gnnweave.hw.regmap import GIE_OFFSET, IER_OFFSET, ISR_OFFSET

    device = simdevice.SimDevice(1 << 22, config=CONFIG, latency=16, check_buffers=True)
    try:
        accel = SimAccel(device)
        rng = np.random.default_rng(3)
        job = random_graph_job(rng, 40, 3.0, 12, SUM, False)
        graph = CSRGraph(job.indptr, job.indices, job.num_nodes)
        x = job.x.astype(np.int64)
        gold = aggregate_raw(job.indptr, job.indices, x, reduce=Reduce.SUM, shift=0, out_width=16)
        start = device.cycles
        out, counters = accel.aggregate(graph, x, "sum")
        assert np.array_equal(out, gold.out)
        ran = device.cycles - start
        assert ran < counters["busy_cycles"] + device.poll_cycles // 4, \
            f"{ran} cycles for a {counters['busy_cycles']}-cycle run: the interrupt did not stop the clock"
        base = device.control_base
        read = lambda off: int.from_bytes(device.read_registers(base + off, 4), "little")  # noqa: E731
        assert read(GIE_OFFSET) == 1 and read(IER_OFFSET) & 1
        assert read(ISR_OFFSET) == 0 and not device.sim.interrupt, "ap_done left pending"

        device.set_memory_model(reorder=True, jitter=32, dram=True, seed=2)
        device.inject_error("read", after=4, resp="DECERR")
        with pytest.raises(AcceleratorError, match="axi_error"):
            accel.aggregate(graph, x, "sum")
        out2, _ = accel.aggregate(graph, x, "sum")
        assert np.array_equal(out2, gold.out)
        faults, first = device.memory_faults()
        assert faults == 0, first
        assert device.stats()["reordered_bursts"] >= 0
    finally:
        device.close()
