"""Memory image and register values of one Aggregator job.

The Aggregator reads five buffers from memory (see :mod:`gnnweave.golden.aggregate` for
the semantics and the DUT contract in ``hw/aggregator.py``):

========== =============================================================
indptr     ``N + 1`` little-endian uint32
indices    ``E`` little-endian uint32 source node ids, CSR by destination
weights    ``E`` little-endian int16 (only read when ``use_weights``)
feat       ``N`` rows of ``F`` int16, row ``v`` at ``feat_addr + v * feat_stride``
out        ``N`` rows of ``F`` int16, row ``v`` at ``out_addr + v * out_stride``
========== =============================================================

:class:`AggregateJob` lays these out in one byte image, each buffer aligned to the bus
width and separated from the next by a guard gap, fills every byte the engine has no
business writing (guards, row padding, the output rows themselves) with a known pattern,
and produces the register values. It deliberately accepts malformed jobs (raw
``indptr``/``indices`` words, undersized buffers, misaligned addresses or strides, bad
reduce codes) so that tests can check how the hardware rejects them.

Only numpy here: the same job drives the cocotb bench, the simulated PYNQ device and a
real board.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Order of the buffers in the image (and of their ``*_addr``/``*_size`` registers).
BUFFERS = ("indptr", "indices", "weights", "feat", "out")

#: Byte written into every location the engine must not change (guards, padding, and
#: the output rows before the run); 0xA5A5 as int16 is an unlikely result value.
FILL_BYTE = 0xA5


def round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple


@dataclass(frozen=True)
class Region:
    """One buffer: absolute byte address and the size the host declares for it."""

    addr: int
    size: int

    @property
    def end(self) -> int:
        return self.addr + self.size

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.end


@dataclass
class AggregateJob:
    """One Aggregator run: graph words, features, options and the memory layout.

    ``indptr`` and ``indices`` are taken as the raw 32-bit words to store (so malformed
    row pointers and out-of-range indices can be expressed); ``x`` is ``[N, F]`` integers
    that fit int16; ``weights`` int16 per index word or None (unweighted).

    Layout knobs: ``base_addr`` (where the image starts; above 4 GiB by default so the
    upper address bits are exercised), ``bus_bytes`` (alignment unit), ``guard_bytes``
    (gap between buffers, default just over 4 KiB so buffers straddle 4 KiB pages),
    ``feat_stride``/``out_stride`` (bytes, default the row size rounded up to the bus).
    ``sizes``/``addr_offsets`` override the declared size / shift the address of named
    buffers for malformed-job tests; ``registers_override`` replaces register values.
    """

    indptr: np.ndarray
    indices: np.ndarray
    x: np.ndarray
    reduce: int = 0
    shift: int = 0
    weights: np.ndarray | None = None
    num_edges: int | None = None
    base_addr: int = 0x1_2340_0000
    bus_bytes: int = 16
    guard_bytes: int = 4096 + 3 * 16
    feat_stride: int | None = None
    out_stride: int | None = None
    sizes: dict = field(default_factory=dict)
    addr_offsets: dict = field(default_factory=dict)
    registers_override: dict = field(default_factory=dict)

    def __post_init__(self):
        self.indptr = np.asarray(self.indptr).astype(np.int64) & 0xFFFF_FFFF
        self.indices = np.asarray(self.indices).astype(np.int64) & 0xFFFF_FFFF
        self.x = np.asarray(self.x)
        if self.x.ndim != 2:
            raise ValueError(f"AggregateJob.x must be 2-D [nodes, features], got shape {self.x.shape}")
        if self.x.size and (self.x.min() < -32768 or self.x.max() > 32767):
            raise ValueError("AggregateJob.x: values must fit int16")
        self.x = self.x.astype(np.int64)
        if self.indptr.ndim != 1 or self.indices.ndim != 1:
            raise ValueError("AggregateJob.indptr and .indices must be 1-D")
        if self.num_edges is None:
            self.num_edges = int(self.indices.shape[0])
        if self.num_edges > self.indices.shape[0]:
            raise ValueError(f"AggregateJob.num_edges={self.num_edges} but only "
                             f"{self.indices.shape[0]} index words are given")
        if self.indptr.shape[0] != self.num_nodes + 1:
            raise ValueError(f"AggregateJob.indptr has {self.indptr.shape[0]} words, "
                             f"needs num_nodes + 1 = {self.num_nodes + 1}")
        if self.weights is not None:
            self.weights = np.asarray(self.weights).astype(np.int64)
            if self.weights.shape != self.indices.shape:
                raise ValueError(f"AggregateJob.weights: shape {self.weights.shape}, expected "
                                 f"{self.indices.shape} (one per index word)")
            if self.weights.size and (self.weights.min() < -32768 or self.weights.max() > 32767):
                raise ValueError("AggregateJob.weights: values must fit int16")
        row = round_up(max(self.feat_dim, 1) * 2, self.bus_bytes)
        if self.feat_stride is None:
            self.feat_stride = row
        if self.out_stride is None:
            self.out_stride = row
        unknown = (set(self.sizes) | set(self.addr_offsets)) - set(BUFFERS)
        if unknown:
            raise ValueError(f"AggregateJob: unknown buffer name(s) {sorted(unknown)}; "
                             f"choose from {', '.join(BUFFERS)}")
        self._layout()

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_graph(cls, graph, x, *, reduce=0, shift: int = 0, weights=None, **kwargs) -> "AggregateJob":
        """From a :class:`~gnnweave.graph.CSRGraph` and integer features/weights."""
        return cls(indptr=graph.indptr, indices=graph.indices, x=x, reduce=int(_reduce_code(reduce)),
                   shift=shift, weights=weights, **kwargs)

    # ---------------------------------------------------------------- shape
    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def feat_dim(self) -> int:
        return int(self.x.shape[1])

    @property
    def use_weights(self) -> bool:
        return self.weights is not None

    @property
    def row_bytes(self) -> int:
        """Real bytes of one feature/output row (F int16)."""
        return 2 * self.feat_dim

    # ---------------------------------------------------------------- layout
    def natural_sizes(self) -> dict:
        """Bytes each buffer needs, rounded up to the bus width (as an allocator would)."""
        n, e = self.num_nodes, int(self.indices.shape[0])
        rows = lambda stride: (n - 1) * stride + self.row_bytes if n else 0  # noqa: E731
        return {
            "indptr": round_up((n + 1) * 4, self.bus_bytes),
            "indices": round_up(e * 4, self.bus_bytes),
            "weights": round_up(e * 2, self.bus_bytes) if self.use_weights else 0,
            "feat": round_up(rows(self.feat_stride), self.bus_bytes),
            "out": round_up(rows(self.out_stride), self.bus_bytes),
        }

    def _layout(self):
        natural = self.natural_sizes()
        self.regions: dict[str, Region] = {}
        cursor = round_up(self.guard_bytes, self.bus_bytes)
        # storage extent: at least what the data needs, even if a smaller size is declared
        self._extent = {}
        for name in BUFFERS:
            declared = int(self.sizes.get(name, natural[name]))
            stored = max(declared, natural[name])
            addr = self.base_addr + cursor + int(self.addr_offsets.get(name, 0))
            self.regions[name] = Region(addr, declared)
            self._extent[name] = stored
            cursor += round_up(stored + abs(int(self.addr_offsets.get(name, 0))), self.bus_bytes)
            cursor += round_up(self.guard_bytes, self.bus_bytes)
        self.image_size = cursor

    def _image_offset(self, name: str) -> int:
        return self.regions[name].addr - self.base_addr

    def memory_image(self) -> np.ndarray:
        """The whole image as uint8 (to be loaded at ``base_addr``)."""
        img = np.full(self.image_size, FILL_BYTE, dtype=np.uint8)

        def put(name, array_bytes):
            off = self._image_offset(name)
            img[off:off + len(array_bytes)] = np.frombuffer(array_bytes, dtype=np.uint8)

        put("indptr", self.indptr.astype("<u4").tobytes())
        put("indices", self.indices.astype("<u4").tobytes())
        if self.use_weights:
            put("weights", self.weights.astype("<i2").tobytes())
        feat = self.x.astype("<i2")
        off = self._image_offset("feat")
        for v in range(self.num_nodes):  # rows may be padded: write row by row
            start = off + v * self.feat_stride
            img[start:start + self.row_bytes] = np.frombuffer(feat[v].tobytes(), dtype=np.uint8)
        return img

    def output_mask(self) -> np.ndarray:
        """bool per image byte: True where the engine is allowed to write (real output bytes)."""
        mask = np.zeros(self.image_size, dtype=bool)
        off = self._image_offset("out")
        for v in range(self.num_nodes):
            start = off + v * self.out_stride
            mask[start:start + self.row_bytes] = True
        return mask

    def read_output(self, memory) -> np.ndarray:
        """Output rows ``[N, F]`` (int64) from the image after the run (bytes-like or uint8)."""
        mem = np.frombuffer(bytes(memory), dtype=np.uint8) if not isinstance(memory, np.ndarray) else memory
        if mem.shape[0] < self.image_size:
            raise ValueError(f"memory holds {mem.shape[0]} bytes, the job image needs {self.image_size}")
        off = self._image_offset("out")
        n, f = self.num_nodes, self.feat_dim
        idx = off + np.arange(n)[:, None] * self.out_stride + np.arange(2 * f)[None, :]
        raw = np.ascontiguousarray(mem[idx]).view("<i2").reshape(n, f)
        return raw.astype(np.int64)

    def stray_writes(self, memory) -> np.ndarray:
        """Image offsets that changed although the engine may not write there."""
        mem = np.frombuffer(bytes(memory), dtype=np.uint8) if not isinstance(memory, np.ndarray) else memory
        changed = mem[: self.image_size] != self.memory_image()
        return np.flatnonzero(changed & ~self.output_mask())

    # ---------------------------------------------------------------- registers
    def registers(self) -> dict:
        """Register name -> value, in the names of ``aggregator_regmap``."""
        regs = {
            "num_nodes": self.num_nodes,
            "num_edges": int(self.num_edges),
            "feat_dim": self.feat_dim,
            "reduce_op": int(self.reduce),
            "use_weights": int(self.use_weights),
            "shift": int(self.shift),
            "feat_stride": int(self.feat_stride),
            "out_stride": int(self.out_stride),
        }
        for name in BUFFERS:
            regs[f"{name}_addr"] = self.regions[name].addr
            regs[f"{name}_size"] = self.regions[name].size
        regs.update(self.registers_override)
        return regs

    # ---------------------------------------------------------------- expectations
    def config_error_expected(self, max_feat_dim: int) -> bool:
        """Whether the contract says the engine must refuse this job without memory traffic."""
        regs = self.registers()
        n, e, f = regs["num_nodes"], regs["num_edges"], regs["feat_dim"]
        row = 2 * f
        need = {   # the index streams are read in whole bus beats
            "indptr": round_up((n + 1) * 4, self.bus_bytes),
            "indices": round_up(e * 4, self.bus_bytes),
            "weights": round_up(e * 2, self.bus_bytes) if regs["use_weights"] else 0,
            "feat": (n - 1) * regs["feat_stride"] + row if n else 0,
            "out": (n - 1) * regs["out_stride"] + row if n else 0,
        }
        if f == 0 or f > max_feat_dim or regs["reduce_op"] not in (0, 1, 2):
            return True
        for stride in ("feat_stride", "out_stride"):
            if regs[stride] % self.bus_bytes or regs[stride] < round_up(row, self.bus_bytes):
                return True
        for name in BUFFERS:
            if name == "weights" and not regs["use_weights"]:
                continue
            if regs[f"{name}_addr"] % self.bus_bytes or regs[f"{name}_size"] < need[name]:
                return True
        return False


def _reduce_code(reduce) -> int:
    if isinstance(reduce, (int, np.integer)):
        return int(reduce)
    names = {"sum": 0, "mean": 1, "max": 2}
    try:
        return names[str(reduce).lower()]
    except KeyError:
        raise ValueError(f"unknown reduce {reduce!r}; choose one of sum, mean, max") from None
