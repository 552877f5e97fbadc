"""The host/hardware contract against the conventions it follows (Vitis HLS ``ap_ctrl_hs``,
PYNQ's ``.hwh`` parameters) and its own rules; the gateware, the register map and the
driver are checked against it in their own tests."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gnnweave import contract
from gnnweave.contract import CtrlBit, GieBit, IpParameters, IrqBit, Unit

ROOT = Path(__file__).resolve().parents[2]


def test_ap_ctrl_block_is_the_vitis_layout():
    # Vitis HLS s_axi_control (UG1399, "ap_ctrl_hs"): CTRL, GIE, IER, ISR at 0x00..0x0C
    assert (contract.CTRL_OFFSET, contract.GIE_OFFSET, contract.IER_OFFSET,
            contract.ISR_OFFSET, contract.FIRST_REGISTER_OFFSET) == (0x00, 0x04, 0x08, 0x0C, 0x10)
    assert {b.name: b.mask for b in CtrlBit} == {"AP_START": 0x01, "AP_DONE": 0x02,
                                                  "AP_IDLE": 0x04, "AP_READY": 0x08,
                                                  "AUTO_RESTART": 0x80}
    assert GieBit.ENABLE.mask == 1
    assert (IrqBit.AP_DONE.mask, IrqBit.AP_READY.mask) == (1, 2)


def test_fixed_registers_precede_every_unit():
    assert contract.UNIT_OFFSET == contract.FIRST_REGISTER_OFFSET
    assert contract.UNITS_PRESENT_OFFSET == contract.UNIT_OFFSET + contract.WORD_BYTES
    # units_present has a bit per unit
    assert max(Unit) < contract.UNITS_PRESENT_REGISTER[1]


@pytest.mark.parametrize("unit", list(Unit))
def test_every_unit_shares_the_failure_bits(unit):
    flags = {f.name.lower(): int(f) for f in contract.UNIT_STATUS[unit]}
    agg = {f.name.lower(): int(f) for f in contract.AggregatorStatus}
    for name in contract.RUN_FAILED:
        assert flags[name] == agg[name], (unit, name)


def test_register_declarations_are_unique_and_fit_the_bus():
    sets = [contract.AGGREGATOR_CONFIG_REGISTERS + contract.AGGREGATOR_STATUS_REGISTERS,
            contract.MAC_ARRAY_CONFIG_REGISTERS + contract.MAC_ARRAY_STATUS_REGISTERS,
            contract.pipeline_config_registers(3) + contract.pipeline_status_registers(3)]
    for regs in sets:
        names = contract.names(regs)
        assert len(set(names)) == len(names)
        assert all(1 <= width <= 2 * contract.DATA_WIDTH for _, width, _ in regs)
        assert contract.STATUS_REGISTER in names
    assert contract.names(contract.pipeline_config_registers(2))[-1] == "s1_dx_first"


def test_wide_register_words_low_first():
    value = 0x0123_4567_89AB_CDEF
    assert contract.split_words(value, 64) == [0x89AB_CDEF, 0x0123_4567]
    assert contract.join_words([0x89AB_CDEF, 0x0123_4567]) == value
    assert contract.split_words(7, 8) == [7]
    with pytest.raises(ValueError, match="does not fit 32"):
        contract.split_words(1 << 32, 32)
    with pytest.raises(ValueError, match="does not fit"):
        contract.split_words(-1, 64)


def test_ip_parameters_round_trip_through_hwh_names():
    params = IpParameters(max_feat_dim=32, gmem_data_width=256, mac_max_depth=64,
                          pipe_max_in=16, pipe_max_out=16, pipe_max_rows=8, pipe_slots=4)
    hwh = {name: str(value) for name, value in params.hwh_items()}
    assert hwh["C_MAX_FEAT_DIM"] == "32" and hwh["C_PIPE_SLOTS"] == "4"
    assert IpParameters.from_hwh(hwh) == params
    assert params.bus_bytes == 32
    assert params.pipeline_limits == {"max_in": 16, "max_out": 16, "max_rows": 8, "slots": 4}
    assert IpParameters.from_hwh({}) == IpParameters()
    with pytest.raises(ValueError, match="C_MAX_FEAT_DIM = 'wide': not an integer"):
        IpParameters.from_hwh({"C_MAX_FEAT_DIM": "wide"})


def test_vlnv_is_written_once():
    """Only the contract spells the IP's VLNV; everything else imports it."""
    spelled = []
    for folder in ("gnnweave", "golden", "hw", "sim", "host", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "contract.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                        "gnnweave:hls:" in node.value:
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled == []
    assert contract.VLNV == f"gnnweave:hls:{contract.ACCELERATOR_TOP}:1.0"
