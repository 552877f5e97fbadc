"""AXI4 and AXI4-Lite interface signatures (AMBA AXI IHI0022), as seen from the manager.

Member names are the AXI signal names without prefix, so that the generated Verilog
ports read ``m_axi_gmem_araddr`` / ``s_axi_control_awvalid`` (see :mod:`.verilog`), which
Vivado's IP packager infers as AXI interfaces and cocotbext-axi's ``from_prefix`` finds.
"""
from __future__ import annotations

import enum

from amaranth.hdl import Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

#: AXI4 bursts may not cross a 4 KiB address boundary (AXI spec A3.4.1).
BOUNDARY_BYTES = 4096
#: Longest INCR burst in AXI4.
MAX_BURST_BEATS = 256


class Burst(enum.IntEnum):
    FIXED = 0
    INCR = 1
    WRAP = 2


class Resp(enum.IntEnum):
    OKAY = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3


class AXI4Signature(wiring.Signature):
    """Full AXI4 manager port (read and write), single outstanding-ID domain by default."""

    def __init__(self, *, addr_width: int = 64, data_width: int = 128, id_width: int = 1):
        if data_width not in (32, 64, 128, 256, 512, 1024):
            raise ValueError(f"AXI data width must be a power of two from 32 to 1024, not {data_width}")
        self.addr_width = addr_width
        self.data_width = data_width
        self.id_width = id_width
        super().__init__({
            "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8),
            "awsize": Out(3), "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wlast": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8),
            "arsize": Out(3), "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
            "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "rvalid": In(1), "rready": Out(1),
        })

    @property
    def bytes_per_beat(self) -> int:
        return self.data_width // 8

    def __eq__(self, other):
        return (isinstance(other, AXI4Signature) and
                (self.addr_width, self.data_width, self.id_width) ==
                (other.addr_width, other.data_width, other.id_width))

    def __repr__(self):
        return (f"AXI4Signature(addr_width={self.addr_width}, data_width={self.data_width}, "
                f"id_width={self.id_width})")


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite manager port (the control slave uses ``In(AXI4LiteSignature(...))``)."""

    def __init__(self, *, addr_width: int = 12, data_width: int = 32):
        if data_width not in (32, 64):
            raise ValueError(f"AXI4-Lite data width must be 32 or 64, not {data_width}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "awaddr": Out(addr_width), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AXI4LiteSignature) and
                (self.addr_width, self.data_width) == (other.addr_width, other.data_width))

    def __repr__(self):
        return f"AXI4LiteSignature(addr_width={self.addr_width}, data_width={self.data_width})"


def size_code(data_width: int) -> int:
    """AxSIZE for full-width beats."""
    return (data_width // 8).bit_length() - 1


#: AXI data widths every unit supports.
BUS_WIDTHS = (64, 128, 256, 512)


class BusParams:
    """What the configuration of every unit with an AXI4 manager port shares (a dataclass
    with ``bus_width`` and ``addr_width`` fields): their checks and the beat geometry."""

    def check_bus(self):
        """Raise ``ValueError`` naming the field (``<Config>.bus_width ...``) if the bus
        parameters are not buildable."""
        name = type(self).__name__
        if self.bus_width not in BUS_WIDTHS:
            raise ValueError(f"{name}.bus_width must be "
                             f"{', '.join(map(str, BUS_WIDTHS[:-1]))} or {BUS_WIDTHS[-1]}, "
                             f"not {self.bus_width}")
        if not 32 <= self.addr_width <= 64:
            raise ValueError(f"{name}.addr_width must be in 32..64, got {self.addr_width}")

    @property
    def bytes_per_beat(self) -> int:
        return self.bus_width // 8


def unit_bus(config) -> AXI4Signature:
    """The AXI4 manager port of a unit built with ``config`` (its ``addr_width`` and
    ``bus_width``; two ID bits, as every unit uses)."""
    return AXI4Signature(addr_width=config.addr_width, data_width=config.bus_width, id_width=2)


class UnitCore(wiring.Component):
    """The contract every unit of the accelerator keeps (:mod:`.accelerator`), as a
    component: an AXI4 manager port ``m_axi`` (:func:`unit_bus`; ``bus`` names it too),
    ``cfg_<name>`` in per configuration register the unit reads, ``stat_<name>`` out per
    status register it drives, ``start`` in, ``idle`` and ``done`` out. ``cfg`` and
    ``stat`` map each register's name to its port. Registers are ``(name, width, doc)``
    declarations."""

    def __init__(self, config, config_registers, status_registers):
        self.config = config
        members = {"m_axi": Out(unit_bus(config)), "start": In(1), "idle": Out(1),
                   "done": Out(1)}
        for prefix, flow, registers in (("cfg", In, config_registers),
                                        ("stat", Out, status_registers)):
            for name, width, _ in registers:
                member = f"{prefix}_{name}"
                if member in members:
                    raise ValueError(f"{type(self).__name__}: register {name!r} declared twice "
                                     f"or clashing with the port {member!r}")
                members[member] = flow(width)
        super().__init__(members)
        self.bus = self.m_axi
        self.cfg = {name: getattr(self, f"cfg_{name}") for name, _, _ in config_registers}
        self.stat = {name: getattr(self, f"stat_{name}") for name, _, _ in status_registers}


class SkidBuffer(wiring.Component):
    """Two-entry register slice on a stream of ``shape``: full throughput, and ``i.ready``,
    ``o.valid`` and ``o.payload`` all leave from flip-flops, so no combinational path runs
    through it in either direction.

    ``o`` is fed from the main register; when ``o`` stalls with the main register full, the
    beat in flight on ``i`` (accepted because ``i.ready`` was decided a cycle earlier) is
    caught by the skid register, and ``i.ready`` drops until it drains.
    """

    def __init__(self, shape):
        self.shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        main_valid = Signal()
        # the skid register's emptiness, not its valid, is the flip-flop: it is i.ready and
        # the skid's wide enable as it stands, with no inverter between
        skid_empty = Signal(init=1)
        # datapath registers: only the valids need a reset
        main = Signal(self.shape, reset_less=True)
        skid = Signal(self.shape, reset_less=True)
        m.d.comb += [self.i.ready.eq(skid_empty), self.o.valid.eq(main_valid),
                     self.o.payload.eq(main)]
        with m.If(~main_valid | self.o.ready):
            with m.If(~skid_empty):
                m.d.sync += [main.eq(skid), main_valid.eq(1), skid_empty.eq(1)]
            with m.Else():
                m.d.sync += [main.eq(self.i.payload), main_valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & skid_empty):
            m.d.sync += skid_empty.eq(0)
        # an empty skid register takes every payload: its wide enable is one flip-flop,
        # not the (late) o.ready of whatever reads the slice
        with m.If(skid_empty):
            m.d.sync += skid.eq(self.i.payload)
        return m


def axi_channels(signature: wiring.Signature) -> dict[str, tuple[bool, list[str]]]:
    """The channels of an AXI4 or AXI4-Lite signature: ``{prefix: (forward, payload
    members)}`` where ``forward`` is true for a channel the manager drives (AW, W, AR) and
    the payload is every member of the channel except its ``valid``/``ready``."""
    members = dict(signature.members.items())
    channels = {}
    for name, member in members.items():
        if name.endswith("valid"):
            prefix = name[:-len("valid")]
            fields = [n for n in members if n.startswith(prefix)
                      and n not in (f"{prefix}valid", f"{prefix}ready")]
            channels[prefix] = (member.flow == Out, fields)
    return channels


class AXIRegisterSlice(wiring.Component):
    """A :class:`SkidBuffer` on every channel of an AXI4 or AXI4-Lite interface
    (``signature``, seen from the manager): ``s`` faces the manager, ``m`` the
    subordinate. Each channel gains one cycle of latency and keeps full throughput and
    its order; no valid or ready passes combinationally from one side to the other."""

    def __init__(self, signature: wiring.Signature):
        self.bus_signature = signature
        self.channels = axi_channels(signature)
        super().__init__({"s": In(signature), "m": Out(signature)})

    def elaborate(self, platform):
        m = Module()
        for prefix, (forward, fields) in self.channels.items():
            src, dst = (self.s, self.m) if forward else (self.m, self.s)
            layout = data.StructLayout({f: len(getattr(src, f)) for f in fields})
            m.submodules[f"{prefix}_slice"] = skid = SkidBuffer(layout)
            m.d.comb += [skid.i.valid.eq(getattr(src, f"{prefix}valid")),
                         getattr(src, f"{prefix}ready").eq(skid.i.ready),
                         getattr(dst, f"{prefix}valid").eq(skid.o.valid),
                         skid.o.ready.eq(getattr(dst, f"{prefix}ready"))]
            for f in fields:
                m.d.comb += [getattr(skid.i.payload, f).eq(getattr(src, f)),
                             getattr(dst, f).eq(getattr(skid.o.payload, f))]
        return m
