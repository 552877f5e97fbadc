"""Which accelerator kinds this machine can open: ``fpga-sim`` where the native simulator
can be built, ``fpga`` where pynq finds a board."""
from __future__ import annotations

import os
import shutil

from gnnweave.host.driver.pynq_ip import pynq_module


def native_toolchain_problem() -> str | None:
    """Why the simulated device cannot be built here (one line), or None."""
    try:
        from gnnweave.sim import toolchain
        toolchain.verilator_root()
    except Exception as exc:  # noqa: BLE001 - any failure means no simulated device
        return str(exc)
    for tool in ("g++", "make", "perl"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH"
    return None


def available_kinds() -> list[str]:
    """``fpga-sim`` where the native simulator can be built; ``fpga`` where pynq finds a
    board and ``$GNNWEAVE_BITSTREAM`` names the overlay."""
    kinds = []
    if native_toolchain_problem() is None:
        kinds.append("fpga-sim")
    pynq = pynq_module()
    if pynq is not None and os.environ.get("GNNWEAVE_BITSTREAM"):
        try:
            if pynq.Device.devices:
                kinds.append("fpga")
        except Exception:  # noqa: BLE001 - no board
            pass
    return kinds
