"""Unit-level tops: one unit behind its own AXI4-Lite control slave (the unit benches'
designs). The product top, every unit of a build behind one slave, is
:class:`~.accelerator.AcceleratorTop`."""
from __future__ import annotations

from typing import Callable

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .aggregator import AggregatorConfig, AggregatorCore, aggregator_regmap
from .axi import AXI4LiteSignature, AXI4Signature, AXIRegisterSlice, unit_bus
from .control import AxiLiteControl
from .regmap import RegisterMap


class UnitTop(wiring.Component):
    """``control`` (AXI4-Lite, Vitis ``ap_ctrl_hs`` at 0x00), ``gmem`` (AXI4 manager),
    ``interrupt`` around the core ``make_core()`` builds (a unit with ``bus``, ``cfg``,
    ``stat``, ``start``, ``idle``, ``done``; see :mod:`.accelerator`). With
    ``register_slices`` both ports pass through an :class:`~.axi.AXIRegisterSlice`, as in
    the accelerator top."""

    def __init__(self, regmap: RegisterMap, bus: AXI4Signature, make_core: Callable[[], object],
                 *, register_slices: bool = False):
        self.regmap = regmap
        self._make_core = make_core
        self.register_slices = register_slices
        super().__init__({
            "control": In(AXI4LiteSignature(addr_width=regmap.addr_width)),
            "gmem": Out(bus),
            "interrupt": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.control = ctrl = AxiLiteControl(self.regmap)
        m.submodules.core = core = self._make_core()
        if self.register_slices:
            m.submodules.control_slice = control_slice = AXIRegisterSlice(self.control.signature.flip())
            m.submodules.gmem_slice = gmem_slice = AXIRegisterSlice(self.gmem.signature)
            wiring.connect(m, wiring.flipped(self.control), control_slice.s)
            wiring.connect(m, control_slice.m, ctrl.bus)
            wiring.connect(m, core.bus, gmem_slice.s)
            wiring.connect(m, gmem_slice.m, wiring.flipped(self.gmem))
        else:
            wiring.connect(m, wiring.flipped(self.control), ctrl.bus)
            wiring.connect(m, core.bus, wiring.flipped(self.gmem))
        for name, sig in core.cfg.items():
            m.d.comb += sig.eq(getattr(ctrl.rw, name))
        for name, sig in core.stat.items():
            m.d.comb += getattr(ctrl.ro, name).eq(sig)
        take = ctrl.start & core.idle
        m.d.comb += [
            core.start.eq(take),
            ctrl.accepted.eq(take),
            ctrl.done.eq(core.done),
            ctrl.idle.eq(core.idle),
            self.interrupt.eq(ctrl.interrupt),
        ]
        return m


class AggregatorTop(UnitTop):
    """The Aggregator alone (the Aggregator benches' design), with the accelerator top's
    register slices, so its cycles are those of the Aggregator in the product top."""

    def __init__(self, config: AggregatorConfig = AggregatorConfig(), *, register_slices: bool = True):
        self.config = config
        super().__init__(aggregator_regmap(config), unit_bus(config), lambda: AggregatorCore(config),
                         register_slices=register_slices)
