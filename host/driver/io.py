"""What the driver needs from below, and the register file it builds on it.

:class:`RegisterIo` is the thin platform interface (32-bit accesses at offsets of the
control slave, buffers with a device address); a PYNQ board and the simulated device each
implement it. :class:`Registers` names the words: ``{name: (offset, words)}`` read from
the ``.hwh`` or the exported register map, the ap_ctrl block from
:mod:`gnnweave.contract`.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from gnnweave import contract
from gnnweave.host.driver.errors import DriverError


class RegisterIo:
    """32-bit register access at byte offsets of the control slave, buffer allocation,
    and what to do between two polls."""

    def read32(self, offset: int) -> int:
        raise NotImplementedError

    def write32(self, offset: int, value: int):
        raise NotImplementedError

    def allocate(self, shape, dtype):
        raise NotImplementedError

    def pause(self):
        """Between two polls of CTRL (a board sleeps; the simulator's CTRL read already
        lets simulated time pass)."""

    #: ``reset()`` where the platform can reset the accelerator from software, else None.
    reset = None


class Registers:
    """The accelerator's registers by name on a :class:`RegisterIo`: ``layout`` is
    ``{name: (offset, words)}``; a value wider than 32 bits is written and read low word
    first (:func:`gnnweave.contract.split_words`)."""

    def __init__(self, io: RegisterIo, layout: dict):
        self.io = io
        self.layout = dict(layout)

    def __contains__(self, name) -> bool:
        return name in self.layout

    def missing(self, names) -> list[str]:
        return [n for n in names if n not in self.layout]

    def write(self, name: str, value: int):
        offset, words = self.layout[name]
        try:
            parts = contract.split_words(value, contract.DATA_WIDTH * words)
        except ValueError:
            raise ValueError(f"register {name}: {value} does not fit "
                             f"{contract.DATA_WIDTH * words} bits") from None
        for i, word in enumerate(parts):
            self.io.write32(offset + contract.WORD_BYTES * i, word)

    def read(self, name: str) -> int:
        offset, words = self.layout[name]
        return contract.join_words(self.io.read32(offset + contract.WORD_BYTES * i)
                                   for i in range(words))


def layout_from_hwh_registers(registers: dict) -> dict:
    """``{name: (offset, words)}`` from pynq's ``ip_dict[...]['registers']``."""
    return {name: (int(reg["address_offset"]), max(1, int(reg["size"]) // contract.DATA_WIDTH))
            for name, reg in registers.items()}


def layout_from_regmap(regmap) -> dict:
    """``{name: (offset, words)}`` from a register map: its exported JSON (a dict, as
    ``RegisterMap.to_dict()`` writes it) or any object iterating registers with ``name``,
    ``offset`` and ``words``."""
    if isinstance(regmap, dict):
        return {r["name"]: (int(r["offset"]), 1 if int(r["width"]) <= contract.DATA_WIDTH else 2)
                for r in regmap["registers"]}
    return {r.name: (int(r.offset), int(r.words)) for r in regmap}


def read_hwh(path, vlnv: str = contract.VLNV) -> tuple[dict, contract.IpParameters]:
    """The register layout and the :class:`~gnnweave.contract.IpParameters` of the IP with
    ``vlnv`` in a Vivado ``.hwh`` (as pynq's parser reads them, without pynq)."""
    path = Path(path)
    try:
        root = ET.fromstring(path.read_text())
    except (OSError, ET.ParseError) as exc:
        raise DriverError(f"{path}: cannot read the .hwh: {exc}") from None
    modules = [m for m in root.iter("MODULE") if m.get("VLNV") == vlnv]
    if len(modules) != 1:
        raise DriverError(f"{path}: {len(modules)} IPs with VLNV {vlnv} (expected one)")
    ip = modules[0]
    params = {p.get("NAME"): p.get("VALUE") for p in ip.iterfind("./PARAMETERS/PARAMETER")}
    layout = {}
    for reg in ip.iter("REGISTER"):
        props = {p.get("NAME"): p.get("VALUE") for p in reg.iterfind("./PROPERTY")}
        layout[reg.get("NAME")] = (int(props["ADDRESS_OFFSET"], 0),
                                   max(1, int(props["SIZE"]) // contract.DATA_WIDTH))
    try:
        parameters = contract.IpParameters.from_hwh(params)
    except ValueError as exc:
        raise DriverError(f"{path}: {exc}") from None
    return layout, parameters


def buffer_address(buf) -> int:
    """The device address of a buffer (pynq's ``device_address``, or ``physical_address``)."""
    for name in ("device_address", "physical_address"):
        value = getattr(buf, name, None)
        if value is not None:
            return int(value)
    raise DriverError(f"buffer {type(buf).__name__} has no device_address")


def flush(buf):
    """Make the host's writes visible to the device (a no-op on coherent memory)."""
    if hasattr(buf, "flush"):
        buf.flush()


def invalidate(buf):
    """Make the device's writes visible to the host (a no-op on coherent memory)."""
    if hasattr(buf, "invalidate"):
        buf.invalidate()


def free(buf):
    fn = getattr(buf, "freebuffer", None)
    if fn is not None:
        fn()


def beat_elements(count: int, item_bytes: int, bus_bytes: int) -> int:
    """``count`` items rounded up to whole bus beats (the engines read and write full beats;
    at least one beat)."""
    return -(-max(count, 1) * item_bytes // bus_bytes) * bus_bytes // item_bytes
