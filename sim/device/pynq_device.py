"""The simulated PYNQ device: ``pynq.Device`` (when pynq is importable, else a plain object
with the same methods) whose ``read_registers`` / ``write_registers`` reach the simulated
accelerator's AXI4-Lite slave and whose allocator hands out numpy arrays that *are* the
simulated memory."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnweave.contract import (
    CTRL_OFFSET, DATA_WIDTH, UNIT_REGISTER, WORD_BYTES, CtrlBit, Unit, join_words, split_words,
)

from .jobs import regmap
from .memory import SimBuffer, _Allocator, _buffer_class, _SimMemory
from .native import DEFAULT_MEM_BASE, NativeAccelerator
from .overlay import CONTROL_BASE

def _device_base():
    try:
        from pynq.pl_server.device import Device
        return Device
    except ImportError:
        return object


class SimDevice(_device_base()):
    """The simulated PYNQ device (see the module docstring).

    ``mem_size`` bytes of simulated DDR at physical ``mem_base``; ``latency`` read latency
    in cycles (the cocotb bench's definition); ``config`` the hardware configuration.
    Register space: the accelerator's control slave at :data:`CONTROL_BASE`.

    Time: the device clock advances when the host waits -- a read of the CTRL register
    (the polling read) that finds the engine busy (neither done nor idle) runs the
    simulation until the ``interrupt`` output rises or ``poll_cycles`` cycles pass, then
    reads CTRL again; :meth:`advance` does the same on request.

    With ``check_buffers`` the device remembers the register writes and, at every
    ``ap_start``, tells the memory the buffers the host configured for the selected unit
    (Aggregator: indptr, indices, feat, weights when used; out written. MacArray: p, q,
    bias when used; out written); any burst outside them is counted
    (:meth:`memory_faults`, ``stats()["region_violations"]``). Other units run unchecked.
    """

    #: Buffers each unit reads and writes: (read buffer names, written, {buffer: the
    #: register that says it is used}).
    UNIT_BUFFERS = {Unit.AGGREGATOR: (("indptr", "indices", "feat", "weights"), ("out",),
                                      {"weights": "use_weights"}),
                    Unit.MAC_ARRAY: (("p", "q", "bias"), ("out",), {"bias": "use_bias"})}

    _probe_priority_ = None   # never enumerated: a SimDevice is made explicitly

    def __init__(self, mem_size: int = 1 << 26, *, mem_base: int = DEFAULT_MEM_BASE,
                 latency: int = 32, config: str = "small", poll_cycles: int = 1 << 14,
                 max_outstanding: int = 64, tag: str = "gnnweave-sim",
                 check_buffers: bool = False):
        if int(mem_size) <= 0 or int(mem_size) % 4096:
            raise ValueError(f"mem_size must be a positive multiple of 4096, not {mem_size}")
        if int(mem_base) % 4096:
            raise ValueError(f"mem_base must be 4 KiB aligned, not 0x{int(mem_base):x}")
        if _device_base() is not object:
            super().__init__(tag)
        self.name = tag
        self.tag = tag
        self.config = config
        self.regmap = regmap(config)
        self.mem_base = int(mem_base)
        self.memory = np.zeros(int(mem_size), dtype=np.uint8)
        self.control_base = CONTROL_BASE
        self.poll_cycles = int(poll_cycles)
        self._alloc = _Allocator(self.memory.nbytes)
        self.sim = NativeAccelerator(self.memory, self.mem_base, latency=latency, config=config,
                                     max_outstanding=max_outstanding)
        self.default_memory = _SimMemory(self)
        self._buffer_cls = _buffer_class()
        self._bitfile = None
        self.check_buffers = bool(check_buffers)
        self._written: dict[int, int] = {}     # register word offset -> last value written

    # -- pynq.Device interface --------------------------------------------------------
    @property
    def capabilities(self):
        return {"REGISTER_RW": True, "MEMORY_MAPPED": False, "CALLABLE": False}

    def _control_offset(self, address: int, length: int) -> int:
        off = int(address) - self.control_base
        if off < 0 or off + int(length) > self.regmap.size or off % WORD_BYTES or \
                int(length) % WORD_BYTES:
            raise ValueError(
                f"register access at 0x{int(address):x} ({length} bytes) is outside the "
                f"control slave [0x{self.control_base:x}, "
                f"0x{self.control_base + self.regmap.size:x}) or not word aligned")
        return off

    def read_registers(self, address, length):
        off = self._control_offset(address, length)
        words = []
        for i in range(0, int(length), WORD_BYTES):
            value = self.sim.reg_read(off + i)
            if off + i == CTRL_OFFSET and not value & (CtrlBit.AP_DONE.mask | CtrlBit.AP_IDLE.mask):
                # the CTRL poll of a busy engine (neither done nor idle): time passes
                self.advance()
                value |= self.sim.reg_read(off + i)   # ap_ready is clear-on-read too
            words.append(value.to_bytes(WORD_BYTES, "little"))
        return b"".join(words)

    def write_registers(self, address, data):
        data = bytes(data)
        off = self._control_offset(address, len(data))
        for i in range(0, len(data), WORD_BYTES):
            value = int.from_bytes(data[i:i + WORD_BYTES], "little")
            self._written[off + i] = value
            if off + i == CTRL_OFFSET and value & CtrlBit.AP_START.mask and self.check_buffers:
                self._configure_regions()
            self.sim.reg_write(off + i, value)

    def _register_value(self, name: str) -> int:
        reg = self.regmap[name]
        resets = split_words(reg.reset, DATA_WIDTH * reg.words)
        return join_words(self._written.get(reg.offset + WORD_BYTES * w, resets[w])
                          for w in range(reg.words))

    def configured_buffers(self) -> tuple[list, list] | None:
        """``(read, write)`` ``[(addr, size), ...]`` the registers written so far configure for
        the selected unit, or None for a unit whose buffers are not known here."""
        unit = self._register_value(UNIT_REGISTER[0]) if UNIT_REGISTER[0] in self.regmap \
            else Unit.AGGREGATOR
        if unit not in self.UNIT_BUFFERS:
            return None
        reads, writes, used_by = self.UNIT_BUFFERS[unit]

        def buffers(names):
            return [(self._register_value(f"{n}_addr"), self._register_value(f"{n}_size"))
                    for n in names if n not in used_by or self._register_value(used_by[n])]
        return buffers(reads), buffers(writes)

    def _configure_regions(self):
        found = self.configured_buffers()
        reads, writes = found if found is not None else ([], [])
        self.sim.set_regions(read=reads, write=writes)

    def allocate(self, shape, dtype, **kwargs):
        shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = self._alloc.alloc(nbytes)
        addr = self.mem_base + offset
        if self._buffer_cls is not None:
            buf = self._buffer_cls(shape, dtype, buffer=self.memory, offset=offset,
                                   device_address=addr, bo=addr, device=self, coherent=True)
            # PynqBuffer frees through memory/pointer/return_to (also when collected)
            buf.memory, buf.pointer, buf.return_to = self.memory, offset + 1, self
            buf.freed = True      # never munmap: the block is numpy memory, not a mapping
        else:
            buf = SimBuffer(shape, dtype, self.memory, offset, addr, self)
        return buf

    @property
    def allocated_bytes(self) -> int:
        """Bytes of the simulated memory held by live buffers (page-rounded)."""
        return self._alloc.used

    def return_pointer(self, pointer: int):
        self._alloc.free(int(pointer) - 1)

    def _free(self, device_address: int):
        self._alloc.free(int(device_address) - self.mem_base)

    # PynqBuffer calls these with its bo; the simulated memory is coherent
    def flush(self, bo, offset, ptr, size):
        pass

    def invalidate(self, bo, offset, ptr, size):
        pass

    def free(self, bo):
        self._free(bo)

    def close(self):
        self.sim.close()

    def download(self, bitstream, parser=None):
        """Nothing to program: remember the bitstream and refresh the dictionaries."""
        self._bitfile = getattr(bitstream, "bitfile_name", bitstream)
        post = getattr(super(), "post_download", None)
        if post is not None and hasattr(bitstream, "partial"):
            post(bitstream, parser)

    def get_bitfile_metadata(self, bitfile_name, partial=False):
        """pynq's HWH parser on the ``.hwh`` next to ``bitfile_name``."""
        # The Zynq UltraScale+ parser whatever the host CPU (pynq picks its HWH class by
        # the CPU it runs on; on x86 that is the abstract one).
        from pynq.pl_server.hwh_parser import _HWHUltrascale
        hwh = Path(bitfile_name).with_suffix(".hwh")
        if not hwh.is_file():
            raise FileNotFoundError(f"{hwh}: no .hwh next to the bitstream")
        parser = _HWHUltrascale(hwh_data=hwh.read_text())
        if not hasattr(parser, "systemgraph"):
            parser.systemgraph = None       # pynq 4.0 reads it; the .hwh parser has none
        parser.clock_dict = {}              # no PS clock registers to program here
        return parser

    # -- simulation controls ------------------------------------------------------------
    def advance(self, cycles: int | None = None) -> int:
        """Let ``cycles`` (default ``poll_cycles``) pass, stopping early when the
        interrupt rises; returns the cycles run."""
        cycles = self.poll_cycles if cycles is None else int(cycles)
        if self.sim.interrupt:
            return self.sim.step(cycles)
        return self.sim.run_until_interrupt(cycles)

    def reset_accelerator(self):
        """Pulse ``ap_rst_n`` (what a PL reset from the PS does on a board)."""
        self.sim.reset()
        self._written.clear()       # the registers are back at their reset values

    def set_latency(self, latency: int):
        self.sim.set_latency(latency)

    def set_read_stall(self, stall: bool):
        self.sim.set_read_stall(stall)

    def set_memory_model(self, **kw):
        """See :meth:`NativeAccelerator.set_memory_model`."""
        self.sim.set_memory_model(**kw)

    def inject_error(self, kind: str = "read", after: int = 0, resp: str = "SLVERR"):
        """See :meth:`NativeAccelerator.inject_error`."""
        self.sim.inject_error(kind, after, resp)

    def stats(self) -> dict:
        """The memory's counters (bursts, beats, faults, region violations, injected
        errors, reordered bursts, row misses) since the device was made."""
        return self.sim.stats()

    @property
    def cycles(self) -> int:
        return self.sim.cycles

    def memory_faults(self) -> tuple[int, str]:
        """(number of beats outside the memory, malformed bursts and, with
        ``check_buffers``, bursts outside the configured buffers; first description)."""
        st = self.sim.stats()
        return st["faults"] + st["protocol_errors"] + st["region_violations"], self.sim.first_fault()

    def __repr__(self):
        return (f"<SimDevice {self.tag}: {self.memory.nbytes >> 20} MiB at 0x{self.mem_base:x}, "
                f"config {self.config}, latency {self.sim.latency}>")

