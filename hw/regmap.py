"""The one register-map builder: AXI4-Lite control registers behind a Vitis ``ap_ctrl_hs`` block.

A map is described once, in Python, and exported from here to everything that needs it:
the control slave (:mod:`.control`), JSON for the host driver, a C header, and the
``<REGISTERS>`` fragment of a Vivado ``.hwh`` (which PYNQ turns into ``ip.register_map``).

Layout (Vitis HLS conventions, so Vitis-aware tools and PYNQ's ``DefaultIP`` understand it):

* ``0x00 CTRL``: bit 0 ``ap_start`` (RW; the hardware clears it when it accepts the start,
  i.e. on ``ap_ready``, unless ``auto_restart``), bit 1 ``ap_done`` (clear on read), bit 2
  ``ap_idle`` (RO), bit 3 ``ap_ready`` (clear on read), bit 7 ``auto_restart`` (RW).
  Writing 0 to ``ap_start`` has no effect (as in Vitis).
* ``0x04 GIE``: bit 0 global interrupt enable.
* ``0x08 IER``: bit 0 ``ap_done``, bit 1 ``ap_ready`` interrupt enables.
* ``0x0C ISR``: bit 0 ``ap_done``, bit 1 ``ap_ready``; set by the hardware event while
  enabled in IER, toggled by writing 1. ``interrupt = GIE & |ISR``.
* User registers from ``0x10`` on, allocated in call order, naturally aligned. A register
  wider than 32 bits occupies two 32-bit words: low word at its offset, high word at
  offset + 4. For read-only 64-bit registers, reading the low word snapshots the high word,
  so a host that reads low then high gets one consistent value.

This module is pure Python (no Amaranth), so it can be loaded on a board or by tools. The
offsets, bits and unit declarations it lays out are :mod:`gnnweave.contract`'s.
"""
from __future__ import annotations

import enum
import json
import keyword
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from gnnweave.contract import (  # noqa: F401 - re-exported: the map's layout
    BUS_COUNTERS, BUSY_CYCLES, CTRL_OFFSET, DATA_WIDTH, FIRST_REGISTER_OFFSET, GIE_OFFSET,
    IER_OFFSET, ISR_OFFSET, WORD_BYTES, CtrlBit, GieBit, IrqBit, status_register,
)

__all__ = [
    "Access", "Register", "RegisterBuilder", "RegisterMap",
    "CTRL_OFFSET", "GIE_OFFSET", "IER_OFFSET", "ISR_OFFSET", "FIRST_REGISTER_OFFSET",
    "CtrlBit", "GieBit", "IrqBit", "AP_CTRL_NAMES", "DATA_WIDTH",
]


class Access(enum.Enum):
    """RW: the host writes, the hardware reads. RO: the hardware drives, the host reads."""
    RW = "read-write"
    RO = "read-only"


@dataclass(frozen=True)
class _CtrlField:
    name: str
    bit: int
    access: str       # IP-XACT / hwh access: "read-write" or "read-only"
    doc: str
    read_action: str | None = None          # "clear": reading clears it
    modified_write_value: str | None = None  # "oneToToggle": writing 1 flips it


@dataclass(frozen=True)
class _CtrlRegister:
    name: str
    offset: int
    doc: str
    fields: tuple[_CtrlField, ...]


# The ap_ctrl_hs block, written once; JSON, C header, hwh and the control slave all read it.
_AP_CTRL = (
    _CtrlRegister("CTRL", CTRL_OFFSET, "Control signals", (
        _CtrlField("AP_START", CtrlBit.AP_START, "read-write",
                   "Write 1 to start; cleared by the hardware when it accepts the start "
                   "(ap_ready) unless auto_restart is set; writing 0 has no effect"),
        _CtrlField("AP_DONE", CtrlBit.AP_DONE, "read-only",
                   "Set when a run finishes; cleared when CTRL is read", read_action="clear"),
        _CtrlField("AP_IDLE", CtrlBit.AP_IDLE, "read-only", "The engine is idle"),
        _CtrlField("AP_READY", CtrlBit.AP_READY, "read-only",
                   "Set when the engine accepts a start; cleared when CTRL is read",
                   read_action="clear"),
        _CtrlField("AUTO_RESTART", CtrlBit.AUTO_RESTART, "read-write",
                   "Keep ap_start set after each accepted start"),
    )),
    _CtrlRegister("GIE", GIE_OFFSET, "Global interrupt enable", (
        _CtrlField("ENABLE", GieBit.ENABLE, "read-write", "Global interrupt enable"),
    )),
    _CtrlRegister("IER", IER_OFFSET, "Interrupt enable", (
        _CtrlField("AP_DONE", IrqBit.AP_DONE, "read-write", "Enable the ap_done interrupt"),
        _CtrlField("AP_READY", IrqBit.AP_READY, "read-write", "Enable the ap_ready interrupt"),
    )),
    _CtrlRegister("ISR", ISR_OFFSET, "Interrupt status (write 1 to toggle a bit)", (
        _CtrlField("AP_DONE", IrqBit.AP_DONE, "read-write", "ap_done interrupt pending",
                   modified_write_value="oneToToggle"),
        _CtrlField("AP_READY", IrqBit.AP_READY, "read-write", "ap_ready interrupt pending",
                   modified_write_value="oneToToggle"),
    )),
)

#: Names reserved by the ap_ctrl block (compared case-insensitively with user names).
AP_CTRL_NAMES = tuple(r.name for r in _AP_CTRL)

_C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch
    typedef union unsigned void volatile while _Bool _Complex _Imaginary _Alignas _Alignof
    _Atomic _Generic _Noreturn _Static_assert _Thread_local bool true false alignas alignof
    nullptr static_assert thread_local typeof typeof_unqual constexpr
""".split())
_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
# Amaranth reserves this member name on interfaces (rw./ro. sub-interfaces of the control).
_AMARANTH_RESERVED = frozenset({"signature"})


def _check_identifier(what: str, name) -> None:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"{what} {name!r}: name must be a C identifier "
                         f"(a letter, then letters, digits or '_')")
    if name in _C_KEYWORDS or keyword.iskeyword(name) or name in _AMARANTH_RESERVED:
        raise ValueError(f"{what} {name!r}: name is a reserved word in C, Python or Amaranth")


def _ap_ctrl_dict() -> dict:
    return {
        r.name: {
            "offset": r.offset,
            "doc": r.doc,
            "fields": {
                f.name: {"bit": int(f.bit), "access": f.access, "doc": f.doc,
                         **({"read_action": f.read_action} if f.read_action else {}),
                         **({"modified_write_value": f.modified_write_value}
                            if f.modified_write_value else {})}
                for f in r.fields
            },
        }
        for r in _AP_CTRL
    }


@dataclass(frozen=True)
class Register:
    """One user register. ``width`` bits (1..64); wider than 32 bits takes two words."""
    name: str
    offset: int
    width: int
    access: Access
    doc: str
    reset: int = 0

    def __post_init__(self):
        _check_identifier("register", self.name)
        what = f"register {self.name!r}"
        if not isinstance(self.width, int) or isinstance(self.width, bool) \
                or not 1 <= self.width <= 64:
            raise ValueError(f"{what}: width must be an integer from 1 to 64, not {self.width!r}")
        if not isinstance(self.access, Access):
            raise ValueError(f"{what}: access must be Access.RW or Access.RO, not {self.access!r}")
        if not isinstance(self.doc, str):
            raise ValueError(f"{what}: doc must be a string, not {type(self.doc).__name__}")
        if not isinstance(self.reset, int) or isinstance(self.reset, bool) \
                or not 0 <= self.reset < (1 << self.width):
            raise ValueError(f"{what}: reset {self.reset!r} does not fit in {self.width} "
                             f"unsigned bits")
        if not isinstance(self.offset, int) or isinstance(self.offset, bool) or self.offset < 0:
            raise ValueError(f"{what}: offset must be a non-negative integer, not {self.offset!r}")
        if self.offset % self.span_bytes:
            raise ValueError(f"{what}: offset {self.offset:#x} is not aligned to "
                             f"{self.span_bytes} bytes")

    @property
    def words(self) -> int:
        """Number of 32-bit words the register occupies (1 or 2)."""
        return 1 if self.width <= DATA_WIDTH else 2

    @property
    def span_bytes(self) -> int:
        return self.words * WORD_BYTES

    @property
    def end(self) -> int:
        """First byte offset after the register."""
        return self.offset + self.span_bytes

    def to_dict(self) -> dict:
        return {"name": self.name, "offset": self.offset, "width": self.width,
                "access": self.access.name, "doc": self.doc, "reset": self.reset}


class RegisterMap:
    """An immutable, validated register map (an ``ap_ctrl_hs`` block plus user registers).

    Built by :class:`RegisterBuilder` or loaded with :meth:`from_dict` / :meth:`from_json`.
    """

    def __init__(self, name: str, registers, *, data_width: int = DATA_WIDTH):
        _check_identifier("register map", name)
        if data_width != DATA_WIDTH:
            raise ValueError(f"register map {name!r}: data_width must be {DATA_WIDTH} "
                             f"(64-bit registers use two 32-bit words), not {data_width!r}")
        registers = tuple(registers)
        seen: dict[str, str] = {}
        used_end = FIRST_REGISTER_OFFSET
        for reg in registers:
            if not isinstance(reg, Register):
                raise ValueError(f"register map {name!r}: {reg!r} is not a Register")
            folded = reg.name.upper()
            if folded in AP_CTRL_NAMES:
                raise ValueError(f"register {reg.name!r}: name is reserved by the ap_ctrl block "
                                 f"({', '.join(AP_CTRL_NAMES)})")
            if folded in seen:
                raise ValueError(f"register {reg.name!r}: duplicate name (clashes with "
                                 f"{seen[folded]!r}; names are compared case-insensitively "
                                 f"because the C header upper-cases them)")
            seen[folded] = reg.name
            if reg.offset < used_end:
                raise ValueError(f"register {reg.name!r}: offset {reg.offset:#x} overlaps the "
                                 f"ap_ctrl block or an earlier register (next free offset is "
                                 f"{used_end:#x}; registers must be in ascending offset order)")
            used_end = reg.end
        self.name = name
        self.data_width = data_width
        self.registers: tuple[Register, ...] = registers
        self._by_name = {r.name: r for r in registers}
        end = max(used_end, FIRST_REGISTER_OFFSET)
        #: Address span in bytes: the smallest power of two that holds every register.
        self.size = 1 << (end - 1).bit_length()
        #: Byte-address bits needed to decode the span.
        self.addr_width = self.size.bit_length() - 1

    # -- lookup -------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Register:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"register map {self.name!r} has no register {name!r}") from None

    def __iter__(self) -> Iterator[Register]:
        return iter(self.registers)

    def __len__(self) -> int:
        return len(self.registers)

    def __contains__(self, name) -> bool:
        return name in self._by_name

    def __eq__(self, other):
        return (isinstance(other, RegisterMap) and
                (self.name, self.data_width, self.registers) ==
                (other.name, other.data_width, other.registers))

    def __hash__(self):
        return hash((self.name, self.data_width, self.registers))

    def __repr__(self):
        return f"RegisterMap({self.name!r}, {len(self.registers)} registers, size={self.size:#x})"

    @property
    def ap_ctrl(self) -> dict:
        """The ap_ctrl_hs block: ``{reg: {offset, doc, fields: {FIELD: {bit, access, ...}}}}``."""
        return _ap_ctrl_dict()

    def word_map(self) -> dict[int, tuple[Register, int]]:
        """``{byte offset: (register, word index)}`` for every user-register word
        (word index 0 = bits 31..0, 1 = bits 63..32)."""
        return {reg.offset + WORD_BYTES * i: (reg, i)
                for reg in self.registers for i in range(reg.words)}

    # -- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "protocol": "ap_ctrl_hs",
            "data_width": self.data_width,
            "addr_width": self.addr_width,
            "size": self.size,
            "ap_ctrl": _ap_ctrl_dict(),
            "registers": [r.to_dict() for r in self.registers],
        }

    def to_json(self, path=None) -> str:
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, d) -> "RegisterMap":
        if not isinstance(d, dict):
            raise ValueError(f"register map: expected a JSON object, not {type(d).__name__}")
        for key in ("name", "registers"):
            if key not in d:
                raise ValueError(f"register map: missing field {key!r}")
        name = d["name"]
        where = f"register map {name!r}"
        if d.get("protocol", "ap_ctrl_hs") != "ap_ctrl_hs":
            raise ValueError(f"{where}: field 'protocol' must be 'ap_ctrl_hs', "
                             f"not {d['protocol']!r}")
        if "ap_ctrl" in d and d["ap_ctrl"] != _ap_ctrl_dict():
            raise ValueError(f"{where}: field 'ap_ctrl' differs from the ap_ctrl_hs layout "
                             f"this toolkit implements")
        if not isinstance(d["registers"], list):
            raise ValueError(f"{where}: field 'registers' must be a list")
        registers = []
        for index, rd in enumerate(d["registers"]):
            if not isinstance(rd, dict):
                raise ValueError(f"{where}: registers[{index}] must be an object")
            rname = rd.get("name", f"<registers[{index}]>")
            for key in ("name", "offset", "width", "access", "doc"):
                if key not in rd:
                    raise ValueError(f"register {rname!r}: missing field {key!r}")
            unknown = set(rd) - {"name", "offset", "width", "access", "doc", "reset"}
            if unknown:
                raise ValueError(f"register {rname!r}: unknown field(s) {sorted(unknown)}")
            access = rd["access"]
            if not isinstance(access, str) or access.upper() not in Access.__members__:
                raise ValueError(f"register {rname!r}: field 'access' must be 'RW' or 'RO', "
                                 f"not {access!r}")
            registers.append(Register(name=rname, offset=rd["offset"], width=rd["width"],
                                      access=Access[access.upper()], doc=rd["doc"],
                                      reset=rd.get("reset", 0)))
        regmap = cls(name, registers, data_width=d.get("data_width", DATA_WIDTH))
        for key in ("size", "addr_width"):
            if key in d and d[key] != getattr(regmap, key):
                raise ValueError(f"{where}: field {key!r} is {d[key]!r} but the registers "
                                 f"need {getattr(regmap, key)!r}")
        return regmap

    @classmethod
    def from_json(cls, source) -> "RegisterMap":
        """Load from JSON text or from a path to a JSON file."""
        if isinstance(source, (os.PathLike, Path)) or (
                isinstance(source, str) and not source.lstrip().startswith("{")):
            path = Path(source)
            try:
                text = path.read_text()
            except OSError as e:
                raise ValueError(f"{path}: cannot read register map: {e.strerror}") from None
        else:
            path, text = "<json>", source
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None
        return cls.from_dict(d)

    # -- C header -----------------------------------------------------------------------

    def to_c_header(self, prefix: str | None = None) -> str:
        """A C header: ``<PREFIX>_<NAME>_OFFSET`` / ``_WIDTH`` / ``_RESET`` / ``_READ_ONLY`` per
        register, ap_ctrl offsets and ``_MASK`` bit masks, span constants, include guard."""
        prefix = self.name if prefix is None else prefix
        _check_identifier("C header prefix", prefix)
        p = prefix.upper()
        guard = f"{p}_REGMAP_H"

        def comment(text: str) -> str:
            return " ".join(text.replace("*/", "* /").replace("/*", "/ *").split())

        lines = [
            f"/* Register map '{self.name}' (AXI4-Lite, Vitis ap_ctrl_hs).",
            " * Generated by gnnweave.hw.regmap; do not edit.",
            " * Registers wider than 32 bits take two words: low word at _OFFSET, high word at",
            " * _OFFSET + 4. For read-only ones, read the low word first: that read snapshots",
            " * the high word. */",
            f"#ifndef {guard}",
            f"#define {guard}",
            "",
            f"#define {p}_SPAN_BYTES 0x{self.size:X}u",
            f"#define {p}_ADDR_BITS {self.addr_width}",
            f"#define {p}_DATA_BITS {self.data_width}",
            "",
        ]
        for reg in _AP_CTRL:
            lines.append(f"/* {reg.name}: {comment(reg.doc)} */")
            lines.append(f"#define {p}_{reg.name}_OFFSET 0x{reg.offset:02X}")
            for f in reg.fields:
                lines.append(f"#define {p}_{reg.name}_{f.name}_MASK 0x{1 << f.bit:02X}u"
                             f"  /* {comment(f.doc)} */")
            lines.append("")
        for reg in self.registers:
            suffix = "ull" if reg.width > 32 else "u"
            lines.append(f"/* {reg.name} ({reg.access.name}, {reg.width} bits): "
                         f"{comment(reg.doc)} */")
            n = f"{p}_{reg.name.upper()}"
            lines.append(f"#define {n}_OFFSET 0x{reg.offset:02X}")
            lines.append(f"#define {n}_WIDTH {reg.width}")
            lines.append(f"#define {n}_RESET 0x{reg.reset:X}{suffix}")
            lines.append(f"#define {n}_READ_ONLY {1 if reg.access is Access.RO else 0}")
            lines.append("")
        lines.append(f"#endif /* {guard} */")
        return "\n".join(lines) + "\n"

    # -- Vivado .hwh --------------------------------------------------------------------

    def to_hwh_element(self) -> ET.Element:
        """The ``<REGISTERS>`` element of a ``.hwh`` ADDRESSBLOCK (see :meth:`to_hwh_registers`)."""
        root = ET.Element("REGISTERS")

        def prop(parent, name, value):
            ET.SubElement(parent, "PROPERTY", NAME=name, VALUE=value)

        def field(fields, name, doc, access, bit, width, read_action=None, write_value=None):
            fe = ET.SubElement(fields, "FIELD", NAME=name)
            prop(fe, "DESCRIPTION", doc)
            prop(fe, "ADDRESS_OFFSET", "0")
            prop(fe, "ACCESS", access)
            if write_value:
                prop(fe, "MODIFIED_WRITE_VALUE", write_value)
            if read_action:
                prop(fe, "READ_ACTION", read_action)
            prop(fe, "BIT_OFFSET", str(bit))
            prop(fe, "BIT_WIDTH", str(width))

        def register(name, doc, offset, size, access, reset):
            re_ = ET.SubElement(root, "REGISTER", NAME=name)
            prop(re_, "DESCRIPTION", doc)
            prop(re_, "ADDRESS_OFFSET", f"0x{offset:x}")
            prop(re_, "SIZE", str(size))
            prop(re_, "ACCESS", access)
            prop(re_, "IS_ENABLED", "true")
            prop(re_, "RESET_VALUE", f"0x{reset:x}")
            return ET.SubElement(re_, "FIELDS")

        for reg in _AP_CTRL:
            fields = register(reg.name, reg.doc, reg.offset, DATA_WIDTH, "read-write", 0)
            for f in reg.fields:
                field(fields, f.name, f.doc, f.access, int(f.bit), 1,
                      f.read_action, f.modified_write_value)
        for reg in self.registers:
            # SIZE is the bus footprint (32 or 64), as PYNQ maps registers to 32/64-bit views;
            # the single field carries the exact width.
            fields = register(reg.name, reg.doc, reg.offset, reg.words * DATA_WIDTH,
                              reg.access.value, reg.reset)
            field(fields, reg.name, reg.doc, reg.access.value, 0, reg.width)
        return root

    def to_hwh_registers(self) -> str:
        """The ``<REGISTERS>`` XML fragment to place inside the control slave's
        ``<ADDRESSBLOCK ... USAGE="register">`` of a Vivado ``.hwh``, as PYNQ's
        ``pynqmetadata`` reads it: one ``<REGISTER NAME=...>`` per register (ap_ctrl block
        included) with ``DESCRIPTION``, ``ADDRESS_OFFSET`` (hex), ``SIZE`` (bits on the bus:
        32, or 64 for two-word registers), ``ACCESS`` (``read-write``/``read-only``),
        ``IS_ENABLED``, ``RESET_VALUE`` and ``<FIELDS>``."""
        root = self.to_hwh_element()
        ET.indent(root)
        return ET.tostring(root, encoding="unicode") + "\n"


class RegisterBuilder:
    """Collects registers in call order and allocates their offsets.

    ``ap_ctrl()`` must come first; then each ``add()`` takes the next free offset from 0x10,
    naturally aligned (registers wider than 32 bits on 8-byte boundaries).
    """

    def __init__(self, name: str, *, data_width: int = DATA_WIDTH):
        _check_identifier("register map", name)
        if data_width != DATA_WIDTH:
            raise ValueError(f"register map {name!r}: data_width must be {DATA_WIDTH}, "
                             f"not {data_width!r}")
        self.name = name
        self.data_width = data_width
        self._has_ap_ctrl = False
        self._registers: list[Register] = []
        self._next_offset = FIRST_REGISTER_OFFSET

    def ap_ctrl(self) -> "RegisterBuilder":
        """Reserve the Vitis ap_ctrl_hs block at 0x00-0x0F (CTRL, GIE, IER, ISR)."""
        if self._has_ap_ctrl:
            raise ValueError(f"register map {self.name!r}: ap_ctrl() called twice")
        self._has_ap_ctrl = True
        return self

    def add(self, name: str, width: int, access: Access, doc: str, *, reset: int = 0) -> Register:
        if not self._has_ap_ctrl:
            raise ValueError(f"register {name!r}: add() before ap_ctrl(); the ap_ctrl_hs block "
                             f"must be reserved first")
        if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= 64:
            raise ValueError(f"register {name!r}: width must be an integer from 1 to 64, "
                             f"not {width!r}")
        align = WORD_BYTES if width <= DATA_WIDTH else 2 * WORD_BYTES
        offset = -(-self._next_offset // align) * align
        reg = Register(name=name, offset=offset, width=width, access=access, doc=doc, reset=reset)
        # Validate names against the registers so far before committing the allocation.
        RegisterMap(self.name, [*self._registers, reg], data_width=self.data_width)
        self._registers.append(reg)
        self._next_offset = reg.end
        return reg

    @classmethod
    def unit(cls, name: str, config_registers, status_registers) -> RegisterMap:
        """The map of one unit: ``ap_ctrl``, then its ``(name, width, doc)`` configuration
        registers (RW) and status registers (RO), in that order."""
        builder = cls(name)
        builder.ap_ctrl()
        for reg_name, width, doc in config_registers:
            builder.add(reg_name, width, Access.RW, doc)
        for reg_name, width, doc in status_registers:
            builder.add(reg_name, width, Access.RO, doc)
        return builder.build()

    def build(self) -> RegisterMap:
        if not self._has_ap_ctrl:
            raise ValueError(f"register map {self.name!r}: build() without ap_ctrl(); every map "
                             f"starts with the ap_ctrl_hs block")
        return RegisterMap(self.name, self._registers, data_width=self.data_width)
