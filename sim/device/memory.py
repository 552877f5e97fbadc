"""The simulated device's memory: page-aligned first-fit allocation in its numpy array,
and the buffer pynq's ``allocate`` returns where pynq is not installed."""
from __future__ import annotations

import threading

import numpy as np

class SimMemoryError(MemoryError):
    """The simulated memory cannot hold the requested buffer."""


class _Allocator:
    """First-fit allocation of page-aligned blocks in ``[0, size)`` of the memory array."""

    ALIGN = 4096

    def __init__(self, size: int):
        self.size = size
        self._blocks: dict[int, int] = {}   # offset -> bytes
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> int:
        want = -(-max(int(nbytes), 1) // self.ALIGN) * self.ALIGN
        with self._lock:
            cursor = 0
            for off in sorted(self._blocks):
                if off - cursor >= want:
                    break
                cursor = off + -(-self._blocks[off] // self.ALIGN) * self.ALIGN
            if cursor + want > self.size:
                raise SimMemoryError(
                    f"simulated memory full: {nbytes} bytes requested, "
                    f"{self.size - sum(self._blocks.values())} of {self.size} free "
                    f"(make the SimDevice with a larger mem_size)")
            self._blocks[cursor] = want
            return cursor

    def free(self, offset: int):
        with self._lock:
            self._blocks.pop(offset, None)

    @property
    def used(self) -> int:
        return sum(self._blocks.values())


def _buffer_class():
    try:
        from pynq.buffer import PynqBuffer
        return PynqBuffer
    except ImportError:
        return None


class SimBuffer(np.ndarray):
    """Stand-in for ``pynq.buffer.PynqBuffer`` without pynq: a numpy view into the
    simulated memory with ``physical_address`` / ``device_address``."""

    def __new__(cls, shape, dtype, buffer, offset, device_address, device):
        obj = super().__new__(cls, shape, dtype, buffer=buffer, offset=offset)
        obj.device_address = device_address
        obj.physical_address = device_address
        obj.sim_device = device   # not `.device`: numpy 2 arrays have a read-only one
        obj.coherent = True
        obj.bo = device_address
        return obj

    def __array_finalize__(self, obj):
        if obj is None:
            return
        offset = self.__array_interface__["data"][0] - obj.__array_interface__["data"][0] \
            if isinstance(obj, SimBuffer) else 0
        addr = getattr(obj, "device_address", None)
        self.device_address = self.physical_address = None if addr is None else addr + offset
        self.coherent, self.bo = getattr(obj, "coherent", None), getattr(obj, "bo", None)
        self.sim_device = None            # only the allocation itself frees the block

    def flush(self):
        pass

    def invalidate(self):
        pass

    sync_to_device = flush
    sync_from_device = invalidate

    def __del__(self):
        self.freebuffer()

    def freebuffer(self):
        if getattr(self, "sim_device", None) is not None:
            self.sim_device._free(self.device_address)
            self.sim_device = None

    close = freebuffer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.freebuffer()
        return False


class _SimMemory:
    """``device.default_memory``: what ``pynq.allocate`` calls ``allocate`` on."""

    def __init__(self, device):
        self.device = device

    def allocate(self, shape, dtype, **kwargs):
        return self.device.allocate(shape, dtype, **kwargs)

