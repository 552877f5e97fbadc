"""The driver on the simulated device (:mod:`gnnweave.sim`): straight on its registers
(:class:`SimAccel`) or through genuine pynq classes (``pynq.Overlay`` on the overlay
files the simulator writes); either way the registers and limits come from the device's
``.hwh``."""
from __future__ import annotations

import tempfile
from pathlib import Path

from gnnweave.contract import INSTANCE_NAME
from gnnweave.host.driver.accel import Accelerator
from gnnweave.host.driver.errors import DriverError
from gnnweave.host.driver.io import RegisterIo, read_hwh
from gnnweave.host.driver.pynq_ip import pynq_module


class SimDeviceIo(RegisterIo):
    """Registers and buffers straight on a SimDevice (no pynq)."""

    def __init__(self, device):
        self.device = device
        self.base = device.control_base

    def read32(self, offset):
        return int.from_bytes(self.device.read_registers(self.base + offset, 4), "little")

    def write32(self, offset, value):
        self.device.write_registers(self.base + offset, int(value).to_bytes(4, "little"))

    def allocate(self, shape, dtype):
        return self.device.allocate(shape, dtype)

    def reset(self):
        self.device.reset_accelerator()


def overlay_description(config: str) -> tuple[dict, object]:
    """The register layout and IP parameters of the simulated device's ``.hwh``."""
    from gnnweave.sim.device import write_overlay
    with tempfile.TemporaryDirectory(prefix="gnnweave-overlay-") as tmp:
        bit = write_overlay(tmp, config=config)
        return read_hwh(Path(bit).with_suffix(".hwh"))


class SimAccel(Accelerator):
    """The driver on a :class:`~gnnweave.sim.device.SimDevice` without pynq."""

    def __init__(self, device):
        self.device = device
        layout, parameters = overlay_description(device.config)
        self._setup_core(SimDeviceIo(device), layout, parameters)


class SimOwner:
    """Keeps the SimDevice (and the overlay files) alive as long as the driver's user."""

    def __init__(self, device, tmpdir=None):
        self.device, self.tmpdir = device, tmpdir

    def close(self):
        self.device.close()
        if self.tmpdir is not None:
            self.tmpdir.cleanup()


def open_sim_accel(*, config: str = "small", latency: int = 32, mem_size: int = 1 << 30,
                   use_pynq: bool | None = None):
    """A driver on a fresh SimDevice -> ``(accel, device, owner)``: through genuine pynq
    (``Overlay`` + :class:`~.pynq_ip.GnnweaveAccel`) when pynq is importable (or
    ``use_pynq``), else :class:`SimAccel`. ``owner.close()`` ends the device. The simulated
    memory costs nothing until touched (zero pages), so the default is large."""
    from gnnweave.sim.device import SimDevice, write_overlay
    pynq = pynq_module()
    if use_pynq is None:
        use_pynq = pynq is not None
    if use_pynq and pynq is None:
        raise DriverError("use_pynq=True but pynq is not installed")
    device = SimDevice(mem_size, latency=latency, config=config)
    if use_pynq:
        tmp = tempfile.TemporaryDirectory(prefix="gnnweave-overlay-")
        bit = write_overlay(tmp.name, config=config)
        overlay = pynq.Overlay(str(bit), device=device)
        return getattr(overlay, INSTANCE_NAME), device, SimOwner(device, tmp)
    return SimAccel(device), device, SimOwner(device)
