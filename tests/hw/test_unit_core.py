"""hw/axi.py UnitCore: every unit is a wiring.Component with the one contract."""
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.hw.aggregator import AggregatorCore, AggregatorConfig
from gnnweave.hw.axi import AXI4Signature, UnitCore


class _Core(UnitCore):
    def elaborate(self, platform):
        m = Module()
        m.d.comb += [self.stat["status"].eq(self.cfg["mode"]), self.idle.eq(1)]
        return m


class _Config:
    bus_width, addr_width = 64, 32


def test_the_contract_is_a_signature():
    core = _Core(_Config(), [("mode", 8, "")], [("status", 8, ""), ("busy_cycles", 64, "")])
    members = core.signature.members
    assert members["m_axi"] == Out(AXI4Signature(addr_width=32, data_width=64, id_width=2))
    assert members["start"] == In(1) and members["idle"] == Out(1) and members["done"] == Out(1)
    assert members["cfg_mode"] == In(8) and members["stat_busy_cycles"] == Out(64)
    assert core.bus is core.m_axi and core.cfg["mode"] is core.cfg_mode
    assert list(core.stat) == ["status", "busy_cycles"]
    # the manager port connects to a subordinate with connect()
    m = Module()
    sub = AXI4Signature(addr_width=32, data_width=64, id_width=2).flip().create()
    wiring.connect(m, core.bus, sub)


def test_a_register_twice_is_refused():
    with pytest.raises(ValueError, match=r"_Core: register 'mode' declared twice"):
        _Core(_Config(), [("mode", 8, ""), ("mode", 8, "")], [])


def test_units_are_components():
    core = AggregatorCore(AggregatorConfig())
    assert isinstance(core, wiring.Component)
    ports = {".".join(map(str, path)) for path, _, _ in core.signature.flatten(core)}
    assert {"start", "idle", "done", "cfg_num_nodes", "stat_status", "m_axi.araddr"} <= ports
