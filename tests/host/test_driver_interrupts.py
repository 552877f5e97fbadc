"""The interrupt path (GIE, IER, ISR and the ``interrupt`` output) at system level: the
driver on the simulated device, straight and through genuine pynq classes.

A finished run sets ISR.ap_done only where IER enables it, the line is ``GIE & |ISR``,
writing 1 to an ISR bit clears it (the line falls), ap_ready is reported at the start
where enabled, and a run with every interrupt disabled raises nothing and still finishes
(the driver polls CTRL)."""
from __future__ import annotations

import numpy as np
import pytest

from gnnweave.contract import IrqBit
from gnnweave.generators import rmat
from gnnweave.golden.aggregate import Reduce, aggregate_raw

from .test_driver import BACKENDS, open_accel


@pytest.fixture(scope="module", params=BACKENDS)
def accel_device(request):
    accel, device, owner = open_accel(request.param, config="small", latency=16,
                                      mem_size=1 << 22)
    yield accel, device
    owner.close()


@pytest.fixture
def job():
    g = rmat(6, 4, seed=3)
    x = np.random.default_rng(2).integers(-500, 500, size=(g.num_nodes, 8))
    gold = aggregate_raw(g.indptr, g.indices, x, reduce=Reduce.SUM, shift=0, out_width=16)
    return g, x, gold.out


@pytest.fixture
def settings(accel_device):
    accel, _ = accel_device
    saved = accel.interrupts, accel.global_interrupt, accel.acknowledge
    yield
    accel.interrupts, accel.global_interrupt, accel.acknowledge = saved
    accel.acknowledge_interrupts()


def _run(accel, job):
    g, x, gold = job
    out, _ = accel.aggregate(g, x, "sum", 0)
    np.testing.assert_array_equal(out, gold)


def test_done_interrupt_raised_and_cleared_on_write(accel_device, job, settings):
    accel, device = accel_device
    accel.interrupts, accel.acknowledge = IrqBit.AP_DONE.mask, False
    _run(accel, job)
    assert accel.interrupt_status() == {"ap_done": True, "ap_ready": False}
    assert device.sim.interrupt, "ISR.ap_done set with GIE on: the line must be high"
    accel.acknowledge_interrupts()
    assert accel.interrupt_status() == {"ap_done": False, "ap_ready": False}
    assert not device.sim.interrupt, "ISR cleared: the line must fall"


def test_driver_acknowledges_its_runs(accel_device, job, settings):
    accel, device = accel_device
    accel.interrupts, accel.acknowledge = IrqBit.AP_DONE.mask, True
    for _ in range(2):
        _run(accel, job)
        assert accel.interrupt_status() == {"ap_done": False, "ap_ready": False}
        assert not device.sim.interrupt


def test_stale_interrupt_is_cleared_before_the_next_run(accel_device, job, settings):
    accel, device = accel_device
    accel.interrupts, accel.acknowledge = IrqBit.AP_DONE.mask, False
    _run(accel, job)
    assert device.sim.interrupt
    accel.acknowledge = True
    _run(accel, job)        # the stale ap_done must not end this run early
    assert accel.interrupt_status()["ap_done"] is False and not device.sim.interrupt


def test_ready_interrupt_where_enabled(accel_device, job, settings):
    accel, device = accel_device
    accel.interrupts = IrqBit.AP_DONE.mask | IrqBit.AP_READY.mask
    accel.acknowledge = True
    _run(accel, job)
    # the driver acknowledges ap_done only: ap_ready (the start was accepted) stays pending
    assert accel.interrupt_status() == {"ap_done": False, "ap_ready": True}
    assert device.sim.interrupt
    accel.acknowledge_interrupts()
    assert not device.sim.interrupt


def test_disabled_ier_raises_nothing(accel_device, job, settings):
    accel, device = accel_device
    accel.interrupts, accel.global_interrupt, accel.acknowledge = 0, True, False
    _run(accel, job)
    assert accel.interrupt_status() == {"ap_done": False, "ap_ready": False}
    assert not device.sim.interrupt


def test_gie_gates_the_line_not_the_status(accel_device, job, settings):
    accel, device = accel_device
    accel.interrupts, accel.global_interrupt, accel.acknowledge = IrqBit.AP_DONE.mask, False, False
    _run(accel, job)
    assert accel.interrupt_status()["ap_done"] is True
    assert not device.sim.interrupt, "GIE off: ISR pending but the line must stay low"
