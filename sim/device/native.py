"""The simulated accelerator: the whole Verilated top (every unit of the build) with a C++
memory model and an AXI4-Lite master, loaded with ctypes from the library of
:func:`.build.build_native`.

The clock runs in C++; Python only touches registers. The memory is a numpy byte buffer
used in place (no copies). Its timing is the cocotb bench's (see the comment at the top
of ``sim/native/harness.cpp``), so ``busy_cycles`` are the same for the same job and
latency. Each unit's clock stops while the unit is idle (:mod:`.top`).
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np

from .build import NativeBuild, build_native

#: The harness answers a burst due at edge t at edge t (the cocotb bench's Timer fires
#: before the clock edge of the same time step); checked against the bench by the tests.
R_LEAD = 1


#: Physical address where a SimDevice's memory starts (above 4 GiB: upper address bits used).
DEFAULT_MEM_BASE = 0x1_0000_0000

# stats order of gw_stats
_STATS = ("cycles", "ar_bursts", "aw_bursts", "r_beats", "w_beats", "faults",
          "protocol_errors", "reads_in_flight", "writes_in_flight", "region_violations",
          "injected_errors", "reordered_bursts", "row_misses")
#: AXI responses :meth:`NativeAccelerator.inject_error` can answer with.
ERROR_RESPONSES = {"SLVERR": 2, "DECERR": 3}
#: Default row-miss penalty of the memory model's open-row DRAM (cycles).
ROW_MISS_CYCLES = 12


class DeviceTimeout(TimeoutError):
    """The simulated AXI4-Lite slave did not answer."""


_LIBS: dict[str, ctypes.CDLL] = {}
_LIBS_LOCK = threading.Lock()


def _load(path: Path) -> ctypes.CDLL:
    with _LIBS_LOCK:
        lib = _LIBS.get(str(path))
        if lib is not None:
            return lib
        lib = ctypes.CDLL(str(path))
        vp, u8p, u32, u64, i32 = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                  ctypes.c_uint64, ctypes.c_int)
        sigs = {
            "gw_create": (vp, [u8p, u64, u64, u32, u32, i32]),
            "gw_destroy": (None, [vp]),
            "gw_set_memory": (None, [vp, u8p, u64, u64]),
            "gw_set_latency": (None, [vp, u32, u32]),
            "gw_set_read_stall": (None, [vp, i32]),
            "gw_reset": (None, [vp, u32]),
            "gw_reg_read": (i32, [vp, u32, ctypes.POINTER(u32), u64]),
            "gw_reg_write": (i32, [vp, u32, u32, u32, u64]),
            "gw_step": (u64, [vp, u64]),
            "gw_run_until_interrupt": (u64, [vp, u64]),
            "gw_interrupt": (i32, [vp]),
            "gw_cycles": (u64, [vp]),
            "gw_stats": (i32, [vp, ctypes.POINTER(u64), i32]),
            "gw_first_fault": (i32, [vp, ctypes.c_char_p, i32]),
            "gw_clear_faults": (None, [vp]),
            "gw_bus_bytes": (u32, []),
            "gw_set_memory_model": (None, [vp, i32, i32, u32, i32, u32, u64]),
            "gw_inject_error": (None, [vp, i32, u64, u32]),
            "gw_clear_injections": (None, [vp]),
            "gw_set_regions": (None, [vp, i32, ctypes.POINTER(u64), i32]),
            "gw_set_one_eval": (i32, [vp, i32]),
            "gw_set_check_one_eval": (None, [vp, i32]),
            "gw_one_eval_mismatches": (u64, [vp]),
            "gw_set_unit_gating": (u32, [vp, i32]),
            "gw_unit_mask": (u32, []),
            "gw_unit_edge_counts": (i32, [vp, ctypes.POINTER(u64), i32]),
        }
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        _LIBS[str(path)] = lib
        return lib


#: AXI4-Lite answers within a few cycles; more than this means the slave is broken.
REG_TIMEOUT_CYCLES = 1000


class NativeAccelerator:
    """One simulated accelerator top (every unit of ``config``) with its memory: ``memory``
    (uint8 numpy, used in place) at physical ``base``. ``latency``: read latency in cycles, defined as in the cocotb
    bench (``DelayedReadAddress``); ``max_outstanding``: bursts the memory accepts before
    ARREADY drops (the bench's default 64)."""

    def __init__(self, memory: np.ndarray, base: int = DEFAULT_MEM_BASE, *, latency: int = 32,
                 max_outstanding: int = 64, config: str = "small",
                 build: NativeBuild | None = None):
        self.build = build if build is not None else build_native(config)
        self.config = config
        self._lib = _load(self.build.library)
        self._handle = None
        self._check_memory(memory)
        self.memory = memory
        self.base = int(base)
        self.latency = int(latency)
        self.max_outstanding = int(max_outstanding)
        self._lock = threading.RLock()
        self._handle = self._lib.gw_create(memory.ctypes.data, memory.nbytes, self.base,
                                           self.latency, self.max_outstanding, R_LEAD)
        if not self._handle:
            raise RuntimeError("gw_create failed")

    @staticmethod
    def _check_memory(memory):
        if not isinstance(memory, np.ndarray) or memory.dtype != np.uint8 or memory.ndim != 1 \
                or not memory.flags.c_contiguous or not memory.flags.writeable:
            raise ValueError("memory must be a writeable, contiguous 1-D uint8 numpy array")

    # -- lifetime
    def close(self):
        if self._handle:
            self._lib.gw_destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _h(self):
        if not self._handle:
            raise RuntimeError("the simulated device is closed")
        return self._handle

    # -- configuration
    def set_memory(self, memory: np.ndarray, base: int):
        self._check_memory(memory)
        with self._lock:
            self.memory, self.base = memory, int(base)
            self._lib.gw_set_memory(self._h(), memory.ctypes.data, memory.nbytes, self.base)

    def set_latency(self, latency: int, max_outstanding: int | None = None):
        with self._lock:
            self.latency = int(latency)
            if max_outstanding is not None:
                self.max_outstanding = int(max_outstanding)
            self._lib.gw_set_latency(self._h(), self.latency, self.max_outstanding)

    def set_read_stall(self, stall: bool):
        """``True``: the memory accepts reads but never answers (a hung device)."""
        with self._lock:
            self._lib.gw_set_read_stall(self._h(), int(bool(stall)))

    def set_memory_model(self, *, reorder: bool = False, jitter: int = 0, dram: bool = False,
                         row_miss: int = ROW_MISS_CYCLES, seed: int = 0, on: bool = True):
        """A memory that answers like a board's interconnect and DRAM (``on=False``: the
        exact bench timing again). Every read burst waits ``latency`` plus a random 0..
        ``jitter`` cycles (write responses the same jitter); ``dram``: an 8-bank open-row
        DRAM with 64-byte access granularity shared by all bursts, ``row_miss`` cycles per
        row miss; ``reorder``: bursts of different IDs are answered in the order they
        become ready (each ID's in its own order)."""
        for name, value in (("jitter", jitter), ("row_miss", row_miss)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
                    not 0 <= int(value) < 1 << 20:
                raise ValueError(f"set_memory_model: {name} must be an integer in 0..2**20-1, "
                                 f"not {value!r}")
        with self._lock:
            self._lib.gw_set_memory_model(self._h(), int(bool(on)), int(bool(reorder)),
                                          int(jitter), int(bool(dram)), int(row_miss),
                                          int(seed) & (1 << 64) - 1)

    def inject_error(self, kind: str = "read", after: int = 0, resp: str = "SLVERR"):
        """Answer the ``after``-th ``kind`` (``"read"`` or ``"write"``) burst from now (0:
        the next) with ``resp`` (``"SLVERR"`` or ``"DECERR"``): a read returns its beats
        with that RRESP, a write is dropped and answered with that BRESP."""
        if kind not in ("read", "write"):
            raise ValueError(f"inject_error: kind must be 'read' or 'write', not {kind!r}")
        if resp not in ERROR_RESPONSES:
            raise ValueError(f"inject_error: resp must be one of {sorted(ERROR_RESPONSES)}, "
                             f"not {resp!r}")
        if int(after) < 0:
            raise ValueError(f"inject_error: after must be >= 0, not {after}")
        with self._lock:
            self._lib.gw_inject_error(self._h(), int(kind == "write"), int(after),
                                      ERROR_RESPONSES[resp])

    def clear_injections(self):
        with self._lock:
            self._lib.gw_clear_injections(self._h())

    def set_regions(self, *, read=None, write=None):
        """The buffers bursts may touch, ``[(addr, size), ...]`` per kind (``None``: leave
        that kind as it is, ``[]``: stop checking it). A burst reaching outside every buffer
        of its kind counts in ``stats()["region_violations"]`` (and is still performed)."""
        with self._lock:
            for write_kind, regions in ((0, read), (1, write)):
                if regions is None:
                    continue
                flat = [v for a, n in regions for v in (int(a), int(a) + int(n))]
                arr = (ctypes.c_uint64 * max(len(flat), 1))(*flat)
                self._lib.gw_set_regions(self._h(), write_kind, arr, len(flat) // 2)

    def set_one_eval(self, on: bool) -> bool:
        """One ``eval()`` per cycle (default where the Verilated model allows it) or two
        (clock high, clock low); returns the mode now in force. Cycle timing is the same."""
        with self._lock:
            return bool(self._lib.gw_set_one_eval(self._h(), int(bool(on))))

    def check_one_eval(self, on: bool):
        """Also run the falling-edge ``eval()`` and count cycles where it changed an output
        the bench samples (:attr:`one_eval_mismatches`; any is a bug of the one-eval mode)."""
        with self._lock:
            self._lib.gw_set_check_one_eval(self._h(), int(bool(on)))

    @property
    def one_eval_mismatches(self) -> int:
        return int(self._lib.gw_one_eval_mismatches(self._h()))

    def set_unit_gating(self, on: bool) -> int:
        """``True`` (the default): a unit's clock stops while the unit is idle (see
        :mod:`.top`); ``False``: every unit is clocked every cycle (the same cycles,
        counters and results, slower). Returns the mask of the build's units."""
        with self._lock:
            return int(self._lib.gw_set_unit_gating(self._h(), int(bool(on))))

    def clock_edges(self) -> dict[int, int]:
        """Edges of each gated clock (units and parts) since the device was made, by its
        bit in the harness's clock masks (its port ``unit_clk_<bit>``)."""
        with self._lock:
            mask = int(self._lib.gw_unit_mask())
            buf = (ctypes.c_uint64 * 32)()
            self._lib.gw_unit_edge_counts(self._h(), buf, 32)
        return {b: int(buf[b]) for b in range(32) if mask >> b & 1}

    def unit_edges(self) -> dict[int, int]:
        """Clock edges each unit got since the device was made, by unit value."""
        from .top import FIRST_PART_BIT
        return {b: n for b, n in self.clock_edges().items() if b < FIRST_PART_BIT}

    def part_edges(self) -> dict[str, int]:
        """Clock edges each part of a unit with a clock of its own got since the device
        was made, by ``"<unit>.<part>"`` (see :mod:`.top`)."""
        from .top import PART_CLOCK_BITS
        edges = self.clock_edges()
        return {f"{unit}.{part}": edges[bit] for (unit, part), bit in PART_CLOCK_BITS.items()
                if bit in edges}

    def control_edges(self) -> int:
        """Clock edges the control slave's bus side got since the device was made (its
        clock runs only during register accesses and reset, see :mod:`.top`)."""
        from .top import CONTROL_CLOCK_BIT
        with self._lock:
            buf = (ctypes.c_uint64 * 32)()
            self._lib.gw_unit_edge_counts(self._h(), buf, 32)
        return int(buf[CONTROL_CLOCK_BIT])

    # -- registers (32-bit words)
    def reg_read(self, offset: int) -> int:
        value = ctypes.c_uint32()
        with self._lock:
            if self._lib.gw_reg_read(self._h(), int(offset), ctypes.byref(value),
                                     REG_TIMEOUT_CYCLES) != 0:
                raise DeviceTimeout(f"AXI4-Lite read of offset 0x{offset:x} got no answer in "
                                    f"{REG_TIMEOUT_CYCLES} cycles")
        return value.value

    def reg_write(self, offset: int, value: int, strb: int = 0xF):
        with self._lock:
            if self._lib.gw_reg_write(self._h(), int(offset), int(value) & 0xFFFF_FFFF,
                                      int(strb), REG_TIMEOUT_CYCLES) != 0:
                raise DeviceTimeout(f"AXI4-Lite write of offset 0x{offset:x} got no answer in "
                                    f"{REG_TIMEOUT_CYCLES} cycles")

    # -- the clock
    def step(self, cycles: int) -> int:
        with self._lock:
            return int(self._lib.gw_step(self._h(), int(cycles)))

    def run_until_interrupt(self, max_cycles: int) -> int:
        """Clock until the ``interrupt`` output is high (GIE/IER must enable it) or
        ``max_cycles`` have passed; returns the cycles run."""
        with self._lock:
            return int(self._lib.gw_run_until_interrupt(self._h(), int(max_cycles)))

    @property
    def interrupt(self) -> bool:
        return bool(self._lib.gw_interrupt(self._h()))

    def reset(self, cycles: int = 8):
        with self._lock:
            self._lib.gw_reset(self._h(), int(cycles))

    @property
    def cycles(self) -> int:
        return int(self._lib.gw_cycles(self._h()))

    def stats(self) -> dict:
        buf = (ctypes.c_uint64 * len(_STATS))()
        self._lib.gw_stats(self._h(), buf, len(_STATS))
        return dict(zip(_STATS, (int(v) for v in buf)))

    def first_fault(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self._lib.gw_first_fault(self._h(), buf, 256)
        return buf.value.decode()

    def clear_faults(self):
        self._lib.gw_clear_faults(self._h())


#: The name this class had while the device simulated the Aggregator alone.
NativeAggregator = NativeAccelerator

