"""``fpga-sim`` and ``fpga``: the accelerator itself, the simulated device or a PYNQ board,
through :mod:`gnnweave.host.driver`.

:class:`FpgaExecutor` chooses every format exactly as ``fpga-emu`` does (the functions
of :mod:`.formats` and :class:`FpgaEmuExecutor`'s dense path), so its results are
bit-identical to the emulator's; its device times come from the accelerator's cycle
counters. :func:`open_executor` builds one on a fresh simulated device or on the board
of ``$GNNWEAVE_BITSTREAM``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from gnnweave.errors import InputError
from gnnweave.host.executors.base import DeviceUnavailable, dense_array
from gnnweave.host.executors.fpga_emu import FpgaEmuExecutor, shard_graph
from gnnweave.host.executors.formats import prepare_aggregation

KINDS = ("fpga-sim", "fpga")


class FpgaExecutor(FpgaEmuExecutor):
    """Aggregations on the accelerator (board or simulated device), dense ops on its
    MacArray where the build has one.

    Args:
        accel: the driver of one accelerator (``aggregate``, ``mac``, ``max_feat_dim``,
            ``has_mac``), e.g. :class:`gnnweave.host.driver.SimAccel`.
        kind: ``"fpga-sim"`` or ``"fpga"``.
        name: the executor's name (default ``kind``).
        timeout_s: the longest one accelerator run may take.
        owner: closed with the executor (the simulated device and its overlay files).
        dense: ``"device"`` runs dense ops on the MacArray where the build has one (an op
            the unit cannot take, a bias shift over 31, runs on the golden MAC model as in
            ``fpga-emu``, counted in ``emulated_dense_ops``); ``"emulated"`` runs them all
            on the golden model.
        config: the named build, whose cycle model and clock turn counters into seconds.
    """

    def __init__(self, accel, kind: str, name: str | None = None, *, timeout_s: float = 600.0,
                 owner=None, dense: str = "device", config: str | None = None):
        super().__init__(name or kind, config=config)
        if dense not in ("device", "emulated"):
            raise InputError(f"dense must be 'device' or 'emulated', got {dense!r}")
        self.kind = kind
        self.accel = accel
        self.timeout_s = timeout_s
        self._owner = owner
        if dense == "device" and getattr(accel, "has_mac", False):
            self.mac_route = "device"
        self.emulated_dense_ops = 0
        self._mac_cycles = None

    def _gemm(self, mode, a_q, b_q, *, shift, relu=False, relu_mask=None, bias=None):
        # relu_mask is already applied: the callers quantise the masked dY
        fits = self.mac_route == "device" and (bias is None or 0 <= int(bias[1]) <= 31)
        if not fits:
            if self.mac_route == "device":
                self.emulated_dense_ops += 1
            return super()._gemm(mode, a_q, b_q, shift=shift, relu=relu, relu_mask=relu_mask,
                                 bias=bias)
        out, cnt = self.accel.mac(mode, dense_array(a_q), dense_array(b_q), shift=shift,
                                  relu=relu, bias=None if bias is None else bias[0],
                                  bias_shift=0 if bias is None else int(bias[1]),
                                  timeout_s=self.timeout_s)
        self._mac_cycles = (self._mac_cycles or 0) + cnt["busy_cycles"]
        return out, int(cnt["saturations"])

    def _run_gemm(self, *args, **kw):
        self._mac_cycles = None
        res = super()._run_gemm(*args, **kw)
        if self._mac_cycles is not None:        # measured, not modelled
            res.device_seconds = self._mac_cycles / self.cycle_model.clock_hz
        return res

    def aggregate(self, graph, x, reduce="sum", *, rows=None, transpose=False):
        t0 = time.perf_counter()
        job = prepare_aggregation(graph, x, reduce, rows=rows, transpose=transpose)
        q = job.quantized
        shard = shard_graph(job.graph, job.lo, job.hi)
        s, e = job.edge_lo, job.edge_hi
        # checked once, not once per column chunk
        shard = self.accel.check_graph(shard, None if q.weights_q is None else q.weights_q[s:e])
        f = job.features
        out = np.zeros((job.graph.num_nodes, f), dtype=np.int64)
        sat = edges = cycles = 0
        step = self.accel.max_feat_dim       # column chunks: aggregation is per column
        for c0 in range(0, f, step):
            part, cnt = self.accel.aggregate(shard, q.x_q[:, c0:c0 + step], job.reduce,
                                             q.fmt.shift, timeout_s=self.timeout_s)
            out[:, c0:c0 + step] = part
            sat += cnt["saturations"]
            edges = cnt["edges"]
            cycles += cnt["busy_cycles"]
        return job.result(out[: job.hi - job.lo], time.perf_counter() - t0,
                          cycles / self.cycle_model.clock_hz, edges, sat, self.name)

    def close(self):
        if self._owner is not None:
            self._owner.close()
            self._owner = None




def open_executor(kind: str, name: str | None = None, **kw) -> FpgaExecutor:
    """An executor on the accelerator: ``fpga-sim`` (simulated device; options ``config``,
    ``latency``, ``mem_size``, ``use_pynq``, ``timeout_s``, ``dense``) or ``fpga`` (a PYNQ
    board; ``bitstream`` or ``$GNNWEAVE_BITSTREAM``, ``timeout_s``, ``dense``)."""
    from gnnweave.host import driver
    from gnnweave.host.executors.registry import available_devices
    timeout_s = kw.pop("timeout_s", 600.0)
    dense = kw.pop("dense", "device")

    def unavailable(reason: str):
        # the user asked for a device that is not there: say what is
        return DeviceUnavailable(f"{reason}; available: {', '.join(available_devices())}")

    if kind == "fpga-sim":
        problem = driver.native_toolchain_problem()
        if problem:
            raise unavailable(f"no fpga-sim device: {problem}")
        accel, _device, owner = driver.open_sim_accel(**kw)
        return FpgaExecutor(accel, kind, name, timeout_s=timeout_s, owner=owner, dense=dense,
                            config=kw.get("config", "small"))
    if kind == "fpga":
        bit = kw.pop("bitstream", None) or os.environ.get("GNNWEAVE_BITSTREAM")
        if not bit or not Path(bit).is_file():
            raise unavailable(
                f"no fpga device: give bitstream=<path to .bit> or set GNNWEAVE_BITSTREAM "
                f"(got {bit!r})")
        try:
            accel = driver.open_board_accel(bit)
        except LookupError as exc:
            raise unavailable(f"no fpga device: {exc}") from None
        return FpgaExecutor(accel, kind, name, timeout_s=timeout_s, dense=dense)
    raise DeviceUnavailable(f"unknown accelerator kind {kind!r}: choose fpga-sim or fpga")
