"""The accelerator top: the Aggregator behind one AXI4-Lite control slave."""
from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .aggregator import AggregatorConfig, AggregatorCore, aggregator_regmap
from .axi import AXI4LiteSignature, AXI4Signature
from .control import AxiLiteControl


class AggregatorTop(wiring.Component):
    """``control`` (AXI4-Lite, Vitis ``ap_ctrl_hs`` at 0x00), ``gmem`` (AXI4 manager), ``interrupt``."""

    def __init__(self, config: AggregatorConfig = AggregatorConfig()):
        self.config = config
        self.regmap = aggregator_regmap(config)
        super().__init__({
            "control": In(AXI4LiteSignature(addr_width=self.regmap.addr_width)),
            "gmem": Out(AXI4Signature(addr_width=config.addr_width, data_width=config.bus_width,
                                      id_width=2)),
            "interrupt": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.control = ctrl = AxiLiteControl(self.regmap)
        m.submodules.core = core = AggregatorCore(self.config)
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
