"""Host driver of the gnnweave accelerator (the Aggregator and, where the build has them,
the MacArray and the training Pipeline behind one control slave), the same code on a PYNQ
board and on the simulated device.

* :class:`GnnweaveAccel` (:mod:`.pynq_ip`) -- with pynq installed, a ``pynq.DefaultIP``
  bound to the accelerator's VLNV, so ``pynq.Overlay(...)`` hands it out as
  ``overlay.gnnweave_0``; registers and limits from the overlay's ``.hwh``, buffers from
  ``pynq.allocate``. :func:`open_board_accel` finds it in a bitstream's overlay.
* :class:`SimAccel` (:mod:`.sim`) -- without pynq: the same methods on a
  :class:`gnnweave.sim.device.SimDevice`; :func:`open_sim_accel` opens either on a
  fresh simulated device.
* :func:`available_kinds` / :func:`native_toolchain_problem` (:mod:`.toolchain`) -- what
  this machine can open; the executors (:mod:`gnnweave.host.executors`) build on these.

The register protocol (:mod:`.core`) and each unit's (:mod:`.aggregator`,
:mod:`.mac_array`, :mod:`.pipeline`) read names, offsets and bits from
:mod:`gnnweave.contract` and the ``.hwh``. Every argument is validated (:mod:`.validate`)
before anything touches the device; a run that does not finish raises
:class:`AcceleratorTimeout` with the status bits, a refused job :class:`AcceleratorError`
naming the reason.
"""
from gnnweave.contract import INSTANCE_NAME, VLNV
from gnnweave.host.driver.accel import Accelerator
from gnnweave.host.driver.core import AGGREGATOR_CONFIG, AGGREGATOR_COUNTERS, status_flags
from gnnweave.host.driver.errors import AcceleratorError, AcceleratorTimeout, DeviceBusy, DriverError
from gnnweave.host.driver.io import RegisterIo, Registers, read_hwh
from gnnweave.host.driver.mac_array import MAC_CONFIG, MAC_COUNTERS, MAC_MODES
from gnnweave.host.driver.pipeline import (
    PIPE_CONFIG_NAMES, PIPE_COUNTERS, PIPE_MODES, PIPE_STAGE_COUNTERS, PIPE_STAGE_NAMES,
    PipelineRun,
)
from gnnweave.host.driver.pynq_ip import GnnweaveAccel, open_board_accel
from gnnweave.host.driver.sim import SimAccel, open_sim_accel
from gnnweave.host.driver.toolchain import available_kinds, native_toolchain_problem
from gnnweave.host.driver.validate import CheckedGraph, check_graph, validate_job

#: The Aggregator's registers under their earlier names.
CONFIG_NAMES, COUNTERS = AGGREGATOR_CONFIG, AGGREGATOR_COUNTERS
MAC_CONFIG_NAMES = MAC_CONFIG

__all__ = [
    "VLNV", "INSTANCE_NAME", "Accelerator", "GnnweaveAccel", "SimAccel", "open_sim_accel",
    "open_board_accel", "available_kinds", "native_toolchain_problem", "validate_job",
    "check_graph", "CheckedGraph", "status_flags", "read_hwh", "RegisterIo", "Registers",
    "PipelineRun", "DriverError", "DeviceBusy", "AcceleratorTimeout", "AcceleratorError",
    "CONFIG_NAMES", "COUNTERS", "MAC_CONFIG_NAMES", "MAC_COUNTERS", "MAC_MODES",
    "PIPE_CONFIG_NAMES", "PIPE_COUNTERS", "PIPE_MODES", "PIPE_STAGE_NAMES", "PIPE_STAGE_COUNTERS",
]
