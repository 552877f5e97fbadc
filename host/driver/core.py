"""The run protocol every unit shares, on ``ap_ctrl_hs``: select the unit, write its
configuration, start, wait for ``ap_done``, acknowledge the interrupt, read the counters,
raise on an error status. The unit protocols (:mod:`.aggregator`, :mod:`.mac_array`,
:mod:`.pipeline`) build on it."""
from __future__ import annotations

import time

from gnnweave import contract
from gnnweave.contract import CtrlBit, GieBit, IrqBit, Unit
from gnnweave.host.driver.errors import AcceleratorError, AcceleratorTimeout, DeviceBusy, DriverError
from gnnweave.host.driver.io import RegisterIo, Registers

#: Registers every build has (the Aggregator is in every build).
AGGREGATOR_CONFIG = contract.names(contract.AGGREGATOR_CONFIG_REGISTERS)
AGGREGATOR_COUNTERS = tuple(n for n in contract.names(contract.AGGREGATOR_STATUS_REGISTERS)
                            if n != contract.STATUS_REGISTER)


def status_flags(status: int, unit: Unit = Unit.AGGREGATOR) -> dict:
    """``{bit name: set}`` of a unit's ``status`` value (the Aggregator's bits by default)."""
    return {flag.name.lower(): bool(int(status) & flag) for flag in contract.UNIT_STATUS[unit]}


class AccelCore:
    """The driver logic on a :class:`~.io.RegisterIo`; the concrete drivers
    (:class:`~.sim.SimAccel`, :class:`~.pynq_ip.GnnweaveAccel`) call :meth:`_setup_core`
    with the register layout and the build's :class:`~gnnweave.contract.IpParameters`.

    Interrupts: every run writes :attr:`interrupts` into IER (``ap_done`` by default) and
    :attr:`global_interrupt` into GIE (the line is ``GIE & |ISR``); with :attr:`acknowledge`
    (the default) the driver toggles ISR's ``ap_done`` off once it sees the run done, so
    the interrupt line falls again. :meth:`interrupt_status` reads ISR,
    :meth:`acknowledge_interrupts` clears it. The driver itself waits by polling CTRL, so
    a run finishes with interrupts off too."""

    poll_s = 1e-4
    default_timeout_s = 60.0
    #: IER mask every run enables (:class:`~gnnweave.contract.IrqBit` masks; 0: none).
    interrupts = IrqBit.AP_DONE.mask
    #: GIE for every run.
    global_interrupt = True
    #: Acknowledge (clear) ISR.ap_done once a run is seen done.
    acknowledge = True

    def _setup_core(self, io: RegisterIo, layout: dict, parameters: contract.IpParameters):
        #: The platform interface (:class:`~.io.RegisterIo`) the driver runs on.
        self.io = io
        self.registers = Registers(io, layout)
        missing = self.registers.missing(AGGREGATOR_CONFIG + AGGREGATOR_COUNTERS +
                                         (contract.STATUS_REGISTER,))
        if missing:
            raise DriverError(f"the accelerator's register description lacks {missing} "
                              f"(wrong .hwh or bitstream?)")
        self.parameters = parameters
        self.max_feat_dim, self.bus_bytes = parameters.max_feat_dim, parameters.bus_bytes
        present_name = contract.UNITS_PRESENT_REGISTER[0]
        #: Bit ``u`` set: unit ``u`` is in the build (``units_present``).
        self.units_present = self.registers.read(present_name) if present_name in self.registers \
            else 1 << Unit.AGGREGATOR
        self._setup_mac_array()
        self._setup_pipeline()

    def _setup_mac_array(self):
        self.has_mac, self.mac_max_depth = False, 0

    def _setup_pipeline(self):
        self.has_pipeline, self.pipeline_stages = False, 0

    def _has_unit(self, unit: Unit) -> bool:
        return bool(self.units_present >> unit & 1)

    # -- registers by name
    def _write(self, name: str, value: int):
        self.registers.write(name, value)

    def _read(self, name: str) -> int:
        return self.registers.read(name)

    def counters(self, names=AGGREGATOR_COUNTERS, unit: Unit = Unit.AGGREGATOR) -> dict:
        """Performance counters and status of the last run (the Aggregator's by default)."""
        out = {name: self._read(name) for name in names}
        out["status"] = self._read(contract.STATUS_REGISTER)
        out["flags"] = status_flags(out["status"], unit)
        return out

    # -- ap_ctrl_hs
    def ctrl(self) -> int:
        return self.io.read32(contract.CTRL_OFFSET)

    def is_idle(self) -> bool:
        return bool(self.ctrl() & CtrlBit.AP_IDLE.mask)

    def _check_idle(self):
        ctrl = self.ctrl()
        if not ctrl & CtrlBit.AP_IDLE.mask:
            raise DeviceBusy(f"the accelerator is busy (ap_ctrl=0x{ctrl:x}): a previous run "
                             f"has not finished; wait for it or call recover()")

    def interrupt_status(self) -> dict:
        """ISR: ``{"ap_done": pending, "ap_ready": pending}``."""
        isr = self.io.read32(contract.ISR_OFFSET)
        return {bit.name.lower(): bool(isr & bit.mask) for bit in IrqBit}

    def acknowledge_interrupts(self):
        """Clear every pending ISR bit (ISR bits toggle on a written 1)."""
        isr = self.io.read32(contract.ISR_OFFSET)
        if isr:
            self.io.write32(contract.ISR_OFFSET, isr)

    def _arm_interrupts(self):
        self.io.write32(contract.GIE_OFFSET, GieBit.ENABLE.mask if self.global_interrupt else 0)
        self.io.write32(contract.IER_OFFSET, int(self.interrupts))
        if self.io.read32(contract.ISR_OFFSET) & IrqBit.AP_DONE.mask:
            # a stale ap_done from an unacknowledged run
            self.io.write32(contract.ISR_OFFSET, IrqBit.AP_DONE.mask)

    def _run(self, unit: Unit, config_names, regs: dict, counter_names, timeout_s, what: str,
             service=None) -> dict:
        """Select ``unit`` (where the build has a unit register), write ``regs[config_names]``,
        start, wait for ap_done (calling ``service()`` after every poll that did not see it),
        raise on an error status; returns the counters."""
        if contract.UNIT_REGISTER[0] in self.registers:
            self._write(contract.UNIT_REGISTER[0], int(unit))
        for name in config_names:
            self._write(name, regs[name])
        self._arm_interrupts()
        self.io.write32(contract.CTRL_OFFSET, CtrlBit.AP_START.mask)
        deadline = time.monotonic() + float(timeout_s)
        while True:
            ctrl = self.io.read32(contract.CTRL_OFFSET)
            if ctrl & CtrlBit.AP_DONE.mask:
                break
            if time.monotonic() > deadline:
                status = self.counters(counter_names, unit)
                raise AcceleratorTimeout(
                    f"accelerator timeout: no ap_done within {timeout_s} s "
                    f"(ap_ctrl=0x{ctrl:x}, idle={bool(ctrl & CtrlBit.AP_IDLE.mask)}, "
                    f"status=0x{status['status']:x} {[k for k, v in status['flags'].items() if v]}, "
                    f"busy_cycles={status['busy_cycles']}, read_beats={status['read_beats']}); "
                    f"the run is still in progress: call recover() before the next one",
                    status)
            if service is not None:
                service()
            self.io.pause()
        if self.interrupts and self.acknowledge and \
                self.io.read32(contract.ISR_OFFSET) & IrqBit.AP_DONE.mask:
            self.io.write32(contract.ISR_OFFSET, IrqBit.AP_DONE.mask)
        counters = self.counters(counter_names, unit)
        bad = [k for k in contract.RUN_FAILED if counters["flags"].get(k)]
        if bad:
            raise AcceleratorError(
                f"accelerator refused or aborted the run: {', '.join(bad)} "
                f"(status=0x{counters['status']:x}; {what}, buffers "
                f"{', '.join(f'{k}=0x{v:x}' for k, v in regs.items() if k.endswith('_addr'))})",
                counters)
        return counters

    def recover(self):
        """Bring a hung accelerator back: a reset where the platform offers one."""
        reset = getattr(self.io, "reset", None)
        if reset is None:
            raise DriverError("this platform cannot reset the accelerator from software: "
                              "download the overlay again")
        reset()
