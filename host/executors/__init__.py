"""One executor interface for every device the trainer and planner can use.

Every op takes and returns host ``numpy`` arrays and reports what it cost in an
:class:`OpResult` (wall time on the host, device time where the device can say,
bytes moved), so the profiler, the cost model and the timeline read the same records
whatever device ran the op.

Devices (``make_executor(name)``), one module each:

* ``cpu`` (also ``cpu:1``, ...): numpy/scipy float32 (:mod:`.cpu`).
* ``gpu`` / ``gpu:<i>``: torch on CUDA device ``i``; needs the optional extra ``gpu``
  (:mod:`.gpu`).
* ``fpga-emu`` (also ``fpga-emu:1``, ...): the bit-exact golden models, with the formats
  of :mod:`.formats` and device times from the build's cycle model (:mod:`.fpga_emu`).
* ``fpga-sim`` / ``fpga``: the simulated device and a PYNQ board, through
  ``gnnweave.host.driver`` (:mod:`.fpga`); constructing them where that is not possible
  raises :class:`DeviceUnavailable` naming what is missing.

``aggregate(graph, x, reduce, rows=(lo, hi), transpose=False)`` computes
``out[v] = reduce_{u -> v} w_uv * x[u]`` for the destination nodes ``lo <= v < hi`` of
``graph`` (or of ``graph.transpose()`` for the backward pass), so a partitioned
aggregation is the concatenation of the shards' results in row order.
"""
from gnnweave.host.executors.base import (
    GRAPH_CACHE, DeviceUnavailable, Executor, OpResult, PerGraphCache, abs_row_weight_max,
    abs_weight_max, apply_relu_mask, as_operand, check_dense, check_features, check_rows,
    dense_array, operand_nbytes, oriented, shard_edges, transposed,
)
from gnnweave.host.executors.cpu import CpuExecutor
from gnnweave.host.executors.formats import (
    FPGA_WIDTH, QuantizedAggregation, bool_mask, frac_for_bound, peak_frac,
    quantize16, quantize_aggregation, quantize_dynamic, quantized_weights,
)
from gnnweave.host.executors.fpga import FpgaExecutor, open_executor
from gnnweave.host.executors.fpga_emu import (
    CycleModel, FpgaEmuExecutor, job_degrees, shard_graph,
)
from gnnweave.host.executors.gpu import GpuExecutor, cuda_count
from gnnweave.host.executors.registry import (
    available_devices, default_device, make_executor, split_name,
)

__all__ = [
    "CpuExecutor", "CycleModel", "DeviceUnavailable", "Executor", "FPGA_WIDTH", "FpgaEmuExecutor",
    "FpgaExecutor", "GpuExecutor", "OpResult", "PerGraphCache", "QuantizedAggregation",
    "abs_row_weight_max", "abs_weight_max", "apply_relu_mask", "as_operand", "available_devices",
    "bool_mask", "check_dense", "check_features", "check_rows", "cuda_count", "default_device",
    "dense_array", "frac_for_bound", "job_degrees", "shard_graph", "make_executor", "open_executor",
    "operand_nbytes", "oriented", "peak_frac", "quantize16", "quantize_aggregation",
    "quantize_dynamic", "quantized_weights", "shard_edges", "split_name", "transposed",
]
