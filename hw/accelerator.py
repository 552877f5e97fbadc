"""The accelerator top: every unit of a build behind one AXI4-Lite control slave and one
AXI4 manager port (the Aggregator; the MacArray and the training Pipeline,
:mod:`.pipeline_unit`, where the build has them).

Units (:class:`Unit`) are engines with the same small contract as
:class:`~gnnweave.hw.aggregator.AggregatorCore`: an AXI4 manager ``bus``, dicts ``cfg``
(register name -> signal the unit reads) and ``stat`` (register name -> signal the unit
drives), and ``start`` / ``idle`` / ``done``. Each unit module declares its registers as
``CONFIG_REGISTERS`` / ``STATUS_REGISTERS`` tuples ``(name, width, doc)``.

Register map (:func:`accelerator_regmap`, built once with
:class:`~gnnweave.hw.regmap.RegisterBuilder`): the ``ap_ctrl_hs`` block, ``unit`` (which
unit ``ap_start`` runs), ``units_present`` (a bit per unit in this build), then the union of
the units' registers. A name that several units declare is one register: a configuration
register feeds every unit that has it (``shift`` is the narrowing shift of whichever unit
runs), a status register shows the value of the unit that ran last, so counters such as
``busy_cycles`` read the same whatever unit ran. ``unit`` and ``units_present`` sit at 0x10
and 0x14 in every build; hosts take every other offset from the exported map.

Bus sharing: the unit of the last accepted start owns ``gmem`` until the next start; a
start is accepted only while every unit is idle, and a unit is idle only once all its
responses are in, so ownership never changes with a transaction in flight. A start of a
unit that is not in the build finishes at once with ``status`` = CONFIG_ERROR (bit 0 in
every unit) and no memory traffic.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Const, DomainRenamer, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.contract import (  # noqa: F401 - the IP's names, re-exported
    ACCELERATOR_TOP, INSTANCE_NAME, STATUS_REGISTER, UNIT_REGISTER, UNITS_PRESENT_REGISTER, VLNV,
    AggregatorStatus, Unit,
)

from .axi import AXI4LiteSignature, AXI4Signature, AXIRegisterSlice
from .control import AxiLiteControl
from .regmap import Access, RegisterBuilder, RegisterMap

#: ``status`` bit every unit uses for "run refused before any memory traffic".
STATUS_CONFIG_ERROR = int(AggregatorStatus.CONFIG_ERROR)


@dataclass(frozen=True)
class UnitRegisters:
    """A unit's register declarations (``(name, width, doc)`` tuples)."""

    unit: Unit
    config: tuple
    status: tuple


def _merge(sets: list[UnitRegisters], which: str) -> list[tuple[str, int, str, list[Unit]]]:
    """Union by name, in order of first appearance; width is the widest declaration."""
    merged: dict[str, list] = {}
    for regs in sets:
        for name, width, doc in getattr(regs, which):
            if name in merged:
                entry = merged[name]
                entry[1] = max(entry[1], width)
                entry[3].append(regs.unit)
            else:
                merged[name] = [name, width, doc, [regs.unit]]
    return [tuple(e) for e in merged.values()]


def accelerator_regmap(sets: list[UnitRegisters], name: str = "gnnweave") -> RegisterMap:
    """The register map of a build holding the units of ``sets`` (the one source of offsets)."""
    units = [s.unit for s in sets]
    if not units:
        raise ValueError("an accelerator needs at least one unit")
    if len(set(units)) != len(units):
        raise ValueError(f"unit listed twice: {[u.name for u in units]}")
    cfg_names = {n for n, *_ in _merge(sets, "config")}
    for n, *_ in _merge(sets, "status"):
        if n in cfg_names:
            raise ValueError(f"register {n!r} is a configuration register of one unit and a "
                             f"status register of another")
    builder = RegisterBuilder(name)
    builder.ap_ctrl()
    builder.add(*UNIT_REGISTER[:2], Access.RW, UNIT_REGISTER[2])
    builder.add(*UNITS_PRESENT_REGISTER[:2], Access.RO, UNITS_PRESENT_REGISTER[2])
    for reg_name, width, doc, owners in _merge(sets, "config"):
        builder.add(reg_name, width, Access.RW, _owned(doc, owners, len(units)))
    for reg_name, width, doc, owners in _merge(sets, "status"):
        builder.add(reg_name, width, Access.RO, _owned(doc, owners, len(units)))
    return builder.build()


def _owned(doc: str, owners: list[Unit], n_units: int) -> str:
    if n_units == 1:
        return doc
    return f"{doc} [{', '.join(u.name.lower() for u in owners)}]"


@dataclass
class UnitInstance:
    """A unit's core and its register declarations."""

    registers: UnitRegisters
    core: object

    @property
    def unit(self) -> Unit:
        return self.registers.unit


def _bus_shape(core) -> AXI4Signature:
    sig = core.bus.signature
    if not isinstance(sig, AXI4Signature):
        raise TypeError(f"unit bus must be an AXI4 manager interface, not {sig!r}")
    return sig


class AcceleratorTop(wiring.Component):
    """``control`` (AXI4-Lite slave, ``ap_ctrl_hs`` at 0x00), ``gmem`` (AXI4 manager),
    ``interrupt``; the units of ``units`` (a list of :class:`UnitInstance`) inside.

    With ``register_slices`` (the default) an :class:`~.axi.AXIRegisterSlice` sits on
    every channel of ``control`` and ``gmem``: no valid or ready travels combinationally
    between the IP's pins and the control slave, the bus gating or the units (one cycle
    more each way on every channel).

    ``unit_slice_domains`` (set before elaboration; default None: one shared slice in
    ``sync``): ``{unit: domain}`` gives each unit a ``gmem`` register slice of its own in
    that domain instead, the port driven by the owner's slice and the port's valids and
    readies reaching only the owner's. Same cycles: only the owner has traffic, and every
    slice is empty when ownership changes (a start is accepted only with every unit idle).
    The simulated device's build uses it so that no unit's logic reads an ``ap_clk``
    register on the bus path (see ``sim/device/top.py``).

    ``status_domain`` (set before elaboration; default None: ``sync``): the domain of a copy
    of the owner register (and the refused-start flag) that selects what the status
    registers show. The copy takes the owner's next value at each edge of that domain, so
    it equals the owner whenever that domain's clock also had the previous edge; the
    simulated device's build puts it on the control's bus clock, which runs on every cycle
    of a register access (an AR reaches the control at least one edge after the access
    began), so the status multiplexer no longer hangs on ``ap_clk``."""

    unit_slice_domains = None
    status_domain = None

    def __init__(self, units: list[UnitInstance], *, name: str = "gnnweave",
                 register_slices: bool = True):
        self.units = list(units)
        self.register_slices = register_slices
        self.regmap = accelerator_regmap([u.registers for u in self.units], name)
        sigs = [_bus_shape(u.core) for u in self.units]
        addr_width = {s.addr_width for s in sigs}
        data_width = {s.data_width for s in sigs}
        if len(addr_width) != 1 or len(data_width) != 1:
            raise ValueError("all units of one accelerator need the same AXI address and data "
                             f"widths, got {[(s.addr_width, s.data_width) for s in sigs]}")
        self.gmem_signature = AXI4Signature(addr_width=addr_width.pop(), data_width=data_width.pop(),
                                            id_width=max(s.id_width for s in sigs))
        super().__init__({
            "control": In(AXI4LiteSignature(addr_width=self.regmap.addr_width)),
            "gmem": Out(self.gmem_signature),
            "interrupt": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.control = ctrl = AxiLiteControl(self.regmap)
        units = self.units
        per_unit = self.register_slices and self.unit_slice_domains is not None
        unit_bus = {u.unit: u.core.bus for u in units}
        if self.register_slices:
            m.submodules.control_slice = control_slice = AXIRegisterSlice(self.control.signature.flip())
            wiring.connect(m, wiring.flipped(self.control), control_slice.s)
            wiring.connect(m, control_slice.m, ctrl.bus)
        else:
            wiring.connect(m, wiring.flipped(self.control), ctrl.bus)
        gmem = self.gmem
        if per_unit:
            for u in units:
                unit_slice = DomainRenamer({"sync": self.unit_slice_domains[u.unit]})(
                    AXIRegisterSlice(u.core.bus.signature))
                m.submodules[f"gmem_slice_{u.unit.name.lower()}"] = unit_slice
                wiring.connect(m, u.core.bus, unit_slice.s)
                unit_bus[u.unit] = unit_slice.m
        elif self.register_slices:
            m.submodules.gmem_slice = gmem_slice = AXIRegisterSlice(self.gmem_signature)
            wiring.connect(m, gmem_slice.m, wiring.flipped(self.gmem))
            gmem = gmem_slice.s         # the units' side of the slice, driven as the port
        for u in units:
            m.submodules[u.unit.name.lower()] = u.core

        # configuration registers fan out to every unit that declares them
        for u in units:
            for name, sig in u.core.cfg.items():
                m.d.comb += sig.eq(getattr(ctrl.rw, name))

        selected = ctrl.rw.unit
        present = Signal()
        m.d.comb += present.eq(sum(selected == u.unit.value for u in units) != 0)
        all_idle = Signal()
        m.d.comb += all_idle.eq(sum(~u.core.idle for u in units) == 0)
        # ownership of gmem and of the status registers: the unit of the last start
        owner = Signal(8, init=units[0].unit.value)
        refused = Signal()          # the last start named a unit not in this build
        refuse_done = Signal()      # its done pulse, the cycle after the start
        take = Signal()
        m.d.comb += take.eq(ctrl.start & all_idle & ~refuse_done)
        m.d.sync += refuse_done.eq(0)
        with m.If(take):
            m.d.sync += owner.eq(selected)
            with m.If(~present):
                m.d.sync += [refused.eq(1), refuse_done.eq(1)]
            with m.Else():
                m.d.sync += refused.eq(0)
        for u in units:
            m.d.comb += u.core.start.eq(take & (selected == u.unit.value))
        m.d.comb += [
            ctrl.accepted.eq(take),
            ctrl.done.eq(refuse_done | (sum(u.core.done for u in units) != 0)),
            ctrl.idle.eq(all_idle & ~refuse_done),
            self.interrupt.eq(ctrl.interrupt),
        ]

        if self.status_domain is not None:
            shown_owner, shown_refused = Signal.like(owner), Signal()
            m.d[self.status_domain] += [shown_owner.eq(Mux(take, selected, owner)),
                                        shown_refused.eq(Mux(take, ~present, refused))]
        else:
            shown_owner, shown_refused = owner, refused

        # status registers: the owner's value (0 from a unit that does not declare one)
        ctrl_ro = ctrl.ro
        m.d.comb += ctrl_ro.units_present.eq(sum(1 << u.unit.value for u in units))
        for reg in self.regmap:
            if reg.access is not Access.RO or reg.name == UNITS_PRESENT_REGISTER[0]:
                continue
            value = Const(0, reg.width)
            for u in units:
                if reg.name in u.core.stat:
                    value = Mux(shown_owner == u.unit.value, u.core.stat[reg.name], value)
            if reg.name == STATUS_REGISTER:
                value = Mux(shown_refused, STATUS_CONFIG_ERROR, value)
            m.d.comb += getattr(ctrl_ro, reg.name).eq(value)

        # gmem: manager outputs from the owner; responses and readies only to the owner
        for path, member, _ in self.gmem_signature.flatten(gmem):
            (port,) = path
            out = getattr(gmem, port)
            if member.flow == Out:
                value = Const(0, len(out))
                for u in units:
                    value = Mux(owner == u.unit.value, getattr(unit_bus[u.unit], port), value)
                m.d.comb += out.eq(value)
            else:
                for u in units:
                    mine = owner == u.unit.value
                    dst = getattr(unit_bus[u.unit], port)
                    if port.endswith(("valid", "ready")):
                        m.d.comb += dst.eq(out & mine)
                    else:
                        m.d.comb += dst.eq(out)
        return m


def _aggregator_registers() -> UnitRegisters:
    from . import aggregator
    return UnitRegisters(Unit.AGGREGATOR, aggregator.CONFIG_REGISTERS, aggregator.STATUS_REGISTERS)


def _mac_array_registers() -> UnitRegisters:
    from . import mac_array
    return UnitRegisters(Unit.MAC_ARRAY, mac_array.CONFIG_REGISTERS, mac_array.STATUS_REGISTERS)


def _pipeline_registers(config) -> UnitRegisters:
    from . import pipeline_unit
    return UnitRegisters(Unit.PIPELINE, pipeline_unit.config_registers(config.stages),
                         pipeline_unit.status_registers(config.stages))


def aggregator_unit(config) -> UnitInstance:
    from .aggregator import AggregatorCore
    return UnitInstance(_aggregator_registers(), AggregatorCore(config))


def mac_array_unit(config) -> UnitInstance:
    from .mac_array import MacArrayCore
    return UnitInstance(_mac_array_registers(), MacArrayCore(config))


def pipeline_unit(config) -> UnitInstance:
    from .pipeline_unit import PipelineUnitCore
    return UnitInstance(_pipeline_registers(config), PipelineUnitCore(config))


def unit_registers(config_name: str) -> list[UnitRegisters]:
    """The register declarations of the named build's units (no gateware built)."""
    from .configs import get_config, get_mac_config, get_pipeline_config
    get_config(config_name)
    sets = [_aggregator_registers()]
    if get_mac_config(config_name) is not None:
        sets.append(_mac_array_registers())
    pipe = get_pipeline_config(config_name)
    if pipe is not None:
        sets.append(_pipeline_registers(pipe))
    return sets


def build_regmap(config_name: str) -> RegisterMap:
    """The register map of the named build's accelerator top."""
    return accelerator_regmap(unit_registers(config_name), ACCELERATOR_TOP)


def build_accelerator(config_name: str) -> AcceleratorTop:
    """The accelerator top of a named build (``hw/configs.py``): the Aggregator, and the
    MacArray and the training Pipeline where the build has them."""
    from .configs import get_config, get_mac_config, get_pipeline_config
    units = [aggregator_unit(get_config(config_name))]
    mac = get_mac_config(config_name)
    if mac is not None:
        units.append(mac_array_unit(mac))
    pipe = get_pipeline_config(config_name)
    if pipe is not None:
        units.append(pipeline_unit(pipe))
    top = AcceleratorTop(units, name=ACCELERATOR_TOP)
    assert top.regmap == build_regmap(config_name)
    return top
