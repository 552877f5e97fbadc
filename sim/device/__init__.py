"""The simulated device: the accelerator RTL, Verilated into a C++ harness, as a PYNQ device.

* :mod:`.top` -- the Verilog it runs (the accelerator top with a clock per unit, each
  stopped while its unit is idle) and the harness's wrapper;
* :mod:`.build` -- the native build (Verilator + C++, cached per content,
  profile-guided);
* :mod:`.native` -- :class:`NativeAccelerator`, the built top with its memory model and
  AXI4-Lite master, through ctypes;
* :mod:`.jobs` -- one Aggregator job from registers to result rows (:func:`run_job`);
* :mod:`.pynq_device` -- :class:`SimDevice`, a ``pynq.Device`` over it, with the
  allocator of :mod:`.memory`;
* :mod:`.overlay` -- the ``.hwh`` and dummy ``.bit`` that bind the driver
  (:func:`write_overlay`).
"""
from .build import (BUILD_ROOT, DEFAULT_NATIVE_OPT, NATIVE_DIR, OUTPUT_SPLIT_CFUNCS,
                    VERILATOR_ARGS, NativeBuild, NativeBuildError, build_native, build_plan,
                    bus_bytes, cpu_identity, pgo_enabled)
from .jobs import (NativeJobResult, job_buffers, read_register, regmap, run_job,
                   write_register)
from .memory import SimBuffer, SimMemoryError
from .native import (DEFAULT_MEM_BASE, ERROR_RESPONSES, R_LEAD, REG_TIMEOUT_CYCLES,
                     ROW_MISS_CYCLES, DeviceTimeout, NativeAccelerator, NativeAggregator)
from .overlay import CONTROL_BASE, IP_NAME, VLNV, hwh_text, write_overlay
from .pynq_device import SimDevice
from .top import SIM_TOP, TOP, sim_top_verilog, simulated_top

__all__ = [
    "BUILD_ROOT", "CONTROL_BASE", "DEFAULT_MEM_BASE", "DEFAULT_NATIVE_OPT", "ERROR_RESPONSES",
    "IP_NAME", "NATIVE_DIR", "OUTPUT_SPLIT_CFUNCS", "REG_TIMEOUT_CYCLES", "ROW_MISS_CYCLES",
    "R_LEAD", "SIM_TOP", "TOP", "VERILATOR_ARGS", "VLNV", "DeviceTimeout", "NativeAccelerator",
    "NativeAggregator", "NativeBuild", "NativeBuildError", "NativeJobResult", "SimBuffer",
    "SimDevice", "SimMemoryError", "build_native", "build_plan", "bus_bytes", "cpu_identity",
    "hwh_text", "job_buffers", "pgo_enabled", "read_register", "regmap", "run_job",
    "sim_top_verilog", "simulated_top", "write_overlay", "write_register",
]
