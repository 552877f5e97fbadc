"""RegisterBuilder / RegisterMap: allocation, validation and the JSON, C and .hwh exports."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from gnnweave.hw.regmap import (
    AP_CTRL_NAMES, CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET, Access, CtrlBit, IrqBit,
    Register, RegisterBuilder, RegisterMap,
)

RW, RO = Access.RW, Access.RO


def sample_map() -> RegisterMap:
    b = RegisterBuilder("aggregator")
    b.ap_ctrl()
    b.add("num_nodes", 32, RW, "number of destination nodes", reset=7)
    b.add("feat_base", 64, RW, "feature buffer base address")
    b.add("mode", 2, RW, "reduce: 0 sum, 1 mean, 2 max", reset=1)
    b.add("busy_cycles", 64, RO, "cycles spent busy")
    b.add("edges", 33, RO, "edges processed")
    b.add("errors", 8, RO, "range-check errors */ with a comment closer")
    b.add("version", 16, RO, "gateware version", reset=0x0102)
    return b.build()


# ---- allocation ----------------------------------------------------------------------------

def test_offsets_allocated_in_call_order_and_naturally_aligned():
    regmap = sample_map()
    # worked out by hand: 64-bit registers skip to the next 8-byte boundary, others don't
    assert [(r.name, r.offset) for r in regmap] == [
        ("num_nodes", 0x10), ("feat_base", 0x18), ("mode", 0x20), ("busy_cycles", 0x28),
        ("edges", 0x30), ("errors", 0x38), ("version", 0x3C)]
    assert regmap.size == 0x40 and regmap.addr_width == 6
    assert regmap["feat_base"].words == 2 and regmap["mode"].words == 1
    assert regmap.word_map()[0x1C] == (regmap["feat_base"], 1)
    assert 0x14 not in regmap.word_map()            # alignment hole stays unmapped


def test_ap_ctrl_only_map_and_constants():
    regmap = RegisterBuilder("empty").ap_ctrl().build()
    assert len(regmap) == 0 and regmap.size == 0x10 and regmap.addr_width == 4
    assert (CTRL_OFFSET, GIE_OFFSET, IER_OFFSET, ISR_OFFSET) == (0x0, 0x4, 0x8, 0xC)
    assert [int(b) for b in CtrlBit] == [0, 1, 2, 3, 7]
    assert (IrqBit.AP_DONE, IrqBit.AP_READY) == (0, 1)
    ctrl = regmap.ap_ctrl["CTRL"]["fields"]
    assert {name: f["bit"] for name, f in ctrl.items()} == {
        "AP_START": 0, "AP_DONE": 1, "AP_IDLE": 2, "AP_READY": 3, "AUTO_RESTART": 7}


@pytest.mark.parametrize("seed", range(5))
def test_random_maps_are_aligned_disjoint_and_fit_the_span(seed):
    rng = random.Random(seed)
    b = RegisterBuilder(f"m{seed}").ap_ctrl()
    for i in range(rng.randint(1, 40)):
        b.add(f"r{i}", rng.choice([1, 8, 16, 31, 32, 33, 48, 64]), rng.choice([RW, RO]), "x")
    regmap = b.build()
    used = set(range(0x10))
    prev = 0
    for r in regmap:
        span = 8 if r.width > 32 else 4
        assert r.offset % span == 0 and r.offset >= prev
        cells = set(range(r.offset, r.offset + span))
        assert not cells & used
        used |= cells
        prev = r.offset + span
    assert regmap.size & (regmap.size - 1) == 0            # power of two
    assert max(used) < regmap.size <= 2 * max(max(used) + 1, 16)
    assert regmap.size == 1 << regmap.addr_width


# ---- errors ------------------------------------------------------------------------------

def builder():
    return RegisterBuilder("m").ap_ctrl()


@pytest.mark.parametrize("call, match", [
    (lambda: RegisterBuilder("m").add("x", 32, RW, "d"), "'x'.*before ap_ctrl"),
    (lambda: RegisterBuilder("m").build(), "'m'.*ap_ctrl"),
    (lambda: builder().ap_ctrl(), "'m'.*twice"),
    (lambda: RegisterBuilder("m", data_width=64), "'m'.*data_width"),
    (lambda: RegisterBuilder("9lives"), "'9lives'.*C identifier"),
    (lambda: builder().add("num-nodes", 32, RW, "d"), "'num-nodes'.*C identifier"),
    (lambda: builder().add("_hidden", 32, RW, "d"), "'_hidden'.*C identifier"),
    (lambda: builder().add("", 32, RW, "d"), "''.*C identifier"),
    (lambda: builder().add("int", 32, RW, "d"), "'int'.*reserved"),
    (lambda: builder().add("lambda", 32, RW, "d"), "'lambda'.*reserved"),
    (lambda: builder().add("signature", 32, RW, "d"), "'signature'.*reserved"),
    (lambda: builder().add("isr", 32, RW, "d"), "'isr'.*ap_ctrl"),
    (lambda: builder().add("wide", 65, RW, "d"), "'wide'.*width"),
    (lambda: builder().add("zero", 0, RO, "d"), "'zero'.*width"),
    (lambda: builder().add("flag", True, RO, "d"), "'flag'.*width"),
    (lambda: builder().add("big", 8, RW, "d", reset=256), "'big'.*reset"),
    (lambda: builder().add("neg", 8, RW, "d", reset=-1), "'neg'.*reset"),
    (lambda: builder().add("acc", 8, "RW", "d"), "'acc'.*access"),
    (lambda: builder().add("nodoc", 8, RW, None), "'nodoc'.*doc"),
])
def test_bad_builder_input_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_duplicate_names_rejected_case_insensitively():
    b = builder()
    b.add("num_nodes", 32, RW, "d")
    with pytest.raises(ValueError, match="'num_nodes'.*duplicate"):
        b.add("num_nodes", 8, RO, "d")
    with pytest.raises(ValueError, match="'NUM_NODES'.*duplicate.*'num_nodes'"):
        b.add("NUM_NODES", 8, RO, "d")
    b.add("other", 8, RO, "d")            # a failed add() allocated nothing
    assert b.build()["other"].offset == 0x14


def test_register_map_rejects_overlaps_and_misalignment():
    ok = Register("a", 0x10, 32, RW, "d")
    with pytest.raises(ValueError, match="'b'.*overlaps"):
        RegisterMap("m", [ok, Register("b", 0x10, 8, RO, "d")])
    with pytest.raises(ValueError, match="'b'.*overlaps"):
        RegisterMap("m", [Register("b", 0x0C, 8, RO, "d")])
    with pytest.raises(ValueError, match="'w'.*aligned"):
        Register("w", 0x14, 64, RO, "d")
    with pytest.raises(ValueError, match="'u'.*aligned"):
        Register("u", 0x12, 16, RO, "d")


# ---- JSON --------------------------------------------------------------------------------

def test_json_round_trip_string_and_file(tmp_path):
    regmap = sample_map()
    text = regmap.to_json()
    d = json.loads(text)
    assert d["name"] == "aggregator" and d["data_width"] == 32 and d["addr_width"] == 6
    assert d["ap_ctrl"]["ISR"]["fields"]["AP_READY"]["bit"] == 1
    assert d["registers"][1] == {"name": "feat_base", "offset": 0x18, "width": 64,
                                 "access": "RW", "doc": "feature buffer base address",
                                 "reset": 0}
    assert RegisterMap.from_json(text) == regmap
    path = tmp_path / "regmap.json"
    regmap.to_json(path)
    assert RegisterMap.from_json(path) == regmap
    assert RegisterMap.from_json(str(path)) == regmap
    back = RegisterMap.from_dict(json.loads(text))
    assert back.registers == regmap.registers and back.size == regmap.size


def _mutated(**changes):
    d = sample_map().to_dict()
    for path, value in changes.items():
        target = d
        *head, last = path.split("__")
        for key in head:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is KeyError:
            del target[int(last) if isinstance(target, list) else last]
        else:
            target[int(last) if isinstance(target, list) else last] = value
    return d


@pytest.mark.parametrize("changes, match", [
    ({"name": KeyError}, "missing field 'name'"),
    ({"registers": "nope"}, "'registers' must be a list"),
    ({"registers__2__width": 99}, "'mode'.*width"),
    ({"registers__2__access": "WO"}, "'mode'.*access"),
    ({"registers__2__doc": KeyError}, "'mode'.*missing field 'doc'"),
    ({"registers__2__colour": "red"}, "'mode'.*unknown field"),
    ({"registers__2__reset": 4}, "'mode'.*reset"),
    ({"registers__2__offset": 0x1C}, "'mode'.*overlaps"),
    ({"registers__1__offset": 0x14}, "'feat_base'.*aligned"),
    ({"registers__3__name": "Mode"}, "'Mode'.*duplicate"),
    ({"registers__3__name": "bad name"}, "'bad name'.*C identifier"),
    ({"size": 0x1000}, "'size'"),
    ({"addr_width": 12}, "'addr_width'"),
    ({"data_width": 64}, "data_width"),
    ({"protocol": "ap_ctrl_chain"}, "'protocol'"),
    ({"ap_ctrl__CTRL__fields__AP_START__bit": 4}, "'ap_ctrl'"),
])
def test_from_dict_bad_input_names_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        RegisterMap.from_dict(_mutated(**changes))


def test_from_json_bad_text_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not valid JSON"):
        RegisterMap.from_json("{broken")
    with pytest.raises(ValueError, match="missing.json.*cannot read"):
        RegisterMap.from_json(tmp_path / "missing.json")


# ---- C header ----------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_c_header_compiles_and_its_offsets_equal_the_map(tmp_path):
    regmap = sample_map()
    (tmp_path / "agg_regs.h").write_text(regmap.to_c_header(prefix="xagg"))
    checks = [f"_Static_assert(XAGG_{r.name.upper()}_OFFSET == {r.offset}, \"{r.name}\");\n"
              f"_Static_assert(XAGG_{r.name.upper()}_WIDTH == {r.width}, \"{r.name}\");\n"
              f"_Static_assert(XAGG_{r.name.upper()}_RESET == {r.reset}ull, \"{r.name}\");\n"
              f"_Static_assert(XAGG_{r.name.upper()}_READ_ONLY == {int(r.access is RO)}, "
              f"\"{r.name}\");"
              for r in regmap]
    checks += [
        "_Static_assert(XAGG_CTRL_OFFSET == 0 && XAGG_GIE_OFFSET == 4, \"ap\");",
        "_Static_assert(XAGG_IER_OFFSET == 8 && XAGG_ISR_OFFSET == 12, \"ap\");",
        "_Static_assert(XAGG_CTRL_AP_START_MASK == 1 && XAGG_CTRL_AP_DONE_MASK == 2, \"b\");",
        "_Static_assert(XAGG_CTRL_AP_IDLE_MASK == 4 && XAGG_CTRL_AP_READY_MASK == 8, \"b\");",
        "_Static_assert(XAGG_CTRL_AUTO_RESTART_MASK == 0x80, \"b\");",
        "_Static_assert(XAGG_IER_AP_DONE_MASK == 1 && XAGG_ISR_AP_READY_MASK == 2, \"b\");",
        "_Static_assert(XAGG_GIE_ENABLE_MASK == 1, \"b\");",
        f"_Static_assert(XAGG_SPAN_BYTES == {regmap.size} && XAGG_ADDR_BITS == "
        f"{regmap.addr_width} && XAGG_DATA_BITS == 32, \"span\");",
    ]
    source = tmp_path / "check.c"
    # included twice: the include guard must hold
    source.write_text('#include "agg_regs.h"\n#include "agg_regs.h"\n' + "\n".join(checks) + "\n")
    result = subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", "-pedantic",
                             "-fsyntax-only", str(source)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # and a wrong expectation does fail (the check has teeth)
    source.write_text('#include "agg_regs.h"\n_Static_assert(XAGG_MODE_OFFSET == 0x24, "x");\n')
    result = subprocess.run(["gcc", "-std=c11", "-fsyntax-only", str(source)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0


def test_c_header_default_prefix_and_bad_prefix():
    header = sample_map().to_c_header()
    assert "#ifndef AGGREGATOR_REGMAP_H" in header
    assert "#define AGGREGATOR_FEAT_BASE_OFFSET 0x18" in header
    with pytest.raises(ValueError, match="'x-y'.*C identifier"):
        sample_map().to_c_header(prefix="x-y")


# ---- .hwh --------------------------------------------------------------------------------

def _read_like_pynqmetadata(fragment: str) -> dict:
    """What pynqmetadata's HwhFrontend._populate_subordinate_regmap extracts per REGISTER."""
    out = {}
    for reg in ET.fromstring(fragment).iter("REGISTER"):
        props = {p.get("NAME"): p.get("VALUE") for p in reg.findall("PROPERTY")}
        offset = props["ADDRESS_OFFSET"]
        fields = {}
        for field in reg.iter("FIELD"):
            fp = {p.get("NAME"): p.get("VALUE") for p in field.iter("PROPERTY")}
            fields[field.get("NAME")] = (int(fp["BIT_OFFSET"]), int(fp["BIT_WIDTH"]), fp["ACCESS"])
        out[reg.get("NAME")] = {
            "offset": int(offset, 16 if offset.startswith("0x") else 10),
            "size": int(props["SIZE"]), "access": props["ACCESS"],
            "description": props["DESCRIPTION"], "reset": int(props["RESET_VALUE"], 16),
            "enabled": props["IS_ENABLED"] == "true", "fields": fields,
        }
    return out


def test_hwh_fragment_parses_and_offsets_equal_the_map():
    regmap = sample_map()
    fragment = regmap.to_hwh_registers()
    assert ET.fromstring(fragment).tag == "REGISTERS"
    regs = _read_like_pynqmetadata(fragment)
    assert list(regs) == [*AP_CTRL_NAMES, *(r.name for r in regmap)]
    assert [regs[n]["offset"] for n in AP_CTRL_NAMES] == [0x0, 0x4, 0x8, 0xC]
    assert regs["CTRL"]["fields"]["AP_DONE"] == (1, 1, "read-only")
    assert regs["CTRL"]["fields"]["AUTO_RESTART"] == (7, 1, "read-write")
    assert regs["ISR"]["fields"]["AP_READY"] == (1, 1, "read-write")
    for r in regmap:
        got = regs[r.name]
        assert got["offset"] == r.offset and got["reset"] == r.reset and got["enabled"]
        assert got["size"] == (64 if r.width > 32 else 32)
        assert got["access"] == {RW: "read-write", RO: "read-only"}[r.access]
        assert got["description"] == r.doc
        assert got["fields"] == {r.name: (0, r.width, got["access"])}


def _minimal_hwh(regmap: RegisterMap) -> str:
    """A .hwh with a Zynq UltraScale+ PS and one IP whose s_axi_control carries the map."""
    root = ET.Element("EDKSYSTEM")
    ET.SubElement(root, "SYSTEMINFO", NAME="regmap_test")
    ET.SubElement(root, "EXTERNALPORTS")
    modules = ET.SubElement(root, "MODULES")
    ps = ET.SubElement(modules, "MODULE", FULLNAME="/zynq_ultra_ps_e_0",
                       INSTANCE="zynq_ultra_ps_e_0", IS_PL="FALSE", MODTYPE="zynq_ultra_ps_e",
                       VLNV="xilinx.com:ip:zynq_ultra_ps_e:3.3")
    ET.SubElement(ET.SubElement(ps, "MEMORYMAP"), "MEMRANGE", ADDRESSBLOCK="Reg",
                  BASEVALUE="0xA0000000", HIGHVALUE="0xA000FFFF", INSTANCE="agg_0",
                  MASTERBUSINTERFACE="M_AXI_HPM0_FPD", MEMTYPE="REGISTER",
                  SLAVEBUSINTERFACE="s_axi_control")
    ET.SubElement(ps, "PORTS")
    ET.SubElement(ET.SubElement(ps, "BUSINTERFACES"), "BUSINTERFACE", BUSNAME="ps_axi",
                  NAME="M_AXI_HPM0_FPD", TYPE="MASTER", VLNV="xilinx.com:interface:aximm:1.0")
    ip = ET.SubElement(modules, "MODULE", FULLNAME="/agg_0", INSTANCE="agg_0",
                       MODTYPE="aggregator", VLNV="gnnweave:gnn:aggregator:1.0")
    block = ET.SubElement(ET.SubElement(ip, "ADDRESSBLOCKS"), "ADDRESSBLOCK",
                          ACCESS="read-write", INTERFACE="s_axi_control", NAME="Reg",
                          RANGE=str(regmap.size), USAGE="register")
    block.append(ET.fromstring(regmap.to_hwh_registers()))
    ET.SubElement(ip, "PORTS")
    ET.SubElement(ET.SubElement(ip, "BUSINTERFACES"), "BUSINTERFACE", BUSNAME="ps_axi",
                  NAME="s_axi_control", TYPE="SLAVE", VLNV="xilinx.com:interface:aximm:1.0")
    return ET.tostring(root, encoding="unicode")


def test_hwh_fragment_through_the_real_pynqmetadata_parser():
    """Runs where PYNQ's parser is installed (the `board` extra brings it)."""
    pytest.importorskip("pynqmetadata")
    from pynqmetadata.frontends.hwh_frontend import HwhFrontend
    from pynqmetadata.views.runtime.ip_dict_view import IpDictView

    regmap = sample_map()
    ip = IpDictView(HwhFrontend(_hwhfile=_minimal_hwh(regmap))).view["agg_0"]
    regs = ip["registers"]
    assert ip["phys_addr"] == 0xA000_0000
    assert {n: regs[n]["address_offset"] for n in AP_CTRL_NAMES} == {
        "CTRL": 0, "GIE": 4, "IER": 8, "ISR": 12}
    assert regs["CTRL"]["fields"]["AP_START"]["bit_offset"] == 0
    for r in regmap:
        assert regs[r.name]["address_offset"] == r.offset
        assert regs[r.name]["size"] == (64 if r.width > 32 else 32)
        assert regs[r.name]["access"] == r.access.value
        assert regs[r.name]["fields"][r.name]["bit_width"] == r.width
