"""The accelerator as a PYNQ IP: ``pynq.Overlay(...)`` hands out :class:`GnnweaveAccel`
for the IP whose VLNV is :data:`gnnweave.contract.VLNV`; registers and limits come from
the overlay's ``.hwh``, buffers from ``pynq.allocate``. Works on PYNQ 3.x and 4.x, and on
the simulated device (a ``pynq.Device``)."""
from __future__ import annotations

import time

from gnnweave.contract import VLNV, IpParameters
from gnnweave.host.driver.accel import Accelerator
from gnnweave.host.driver.io import RegisterIo, layout_from_hwh_registers


def pynq_module():
    """The ``pynq`` package, or None where it is not installed."""
    try:
        import pynq
    except ImportError:
        return None
    return pynq


class PynqIo(RegisterIo):
    """Registers through the IP's ``mmio``, buffers from ``pynq.allocate`` on the IP's device."""

    def __init__(self, ip, pynq, device):
        self.ip, self.pynq, self.device = ip, pynq, device

    def read32(self, offset):
        return int(self.ip.mmio.read(offset))

    def write32(self, offset, value):
        self.ip.mmio.write(offset, int(value))

    def allocate(self, shape, dtype):
        target = getattr(self.device, "default_memory", None)
        if target is not None:
            return self.pynq.allocate(shape, dtype, target=target)
        return self.pynq.allocate(shape, dtype)

    def pause(self):
        if not hasattr(self.device, "advance"):   # a board: let the hardware work
            time.sleep(Accelerator.poll_s)

    @property
    def reset(self):
        return getattr(self.device, "reset_accelerator", None)


_pynq = pynq_module()
if _pynq is not None:
    class GnnweaveAccel(_pynq.DefaultIP, Accelerator):
        """The accelerator as a PYNQ IP (``overlay.gnnweave_0``)."""

        bindto = [VLNV]

        def __init__(self, description):
            super().__init__(description)
            device = description.get("device") or getattr(self.mmio, "device", None)
            self.device = device
            self._setup_core(PynqIo(self, _pynq, device),
                             layout_from_hwh_registers(description.get("registers", {})),
                             IpParameters.from_hwh(description.get("parameters", {}) or {}))
else:
    GnnweaveAccel = None


def open_board_accel(bitstream):
    """The driver of the accelerator in the overlay ``bitstream`` (a ``.bit`` with its
    ``.hwh`` beside it) on a PYNQ board; raises ``LookupError`` naming what is missing."""
    pynq = pynq_module()
    if pynq is None:
        raise LookupError("pynq is not installed (pip install pynq)")
    overlay = pynq.Overlay(str(bitstream))
    accels = [getattr(overlay, n) for n, d in overlay.ip_dict.items() if d.get("type") == VLNV]
    if not accels:
        raise LookupError(f"{bitstream} has no IP with VLNV {VLNV}")
    return accels[0]
