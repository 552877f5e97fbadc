"""The Pipeline unit's build parameters and register declarations (no simulation): clear
errors for builds that cannot work, one register map with the other units in every
named configuration, and the driver's register names matching the hardware's."""
from __future__ import annotations

import pytest

from gnnweave import contract
from gnnweave.hw.accelerator import Unit, accelerator_regmap, build_regmap, unit_registers
from gnnweave.hw.configs import CONFIGS, get_pipeline_config
from gnnweave.hw.pipeline_unit import (STAGE_REGISTERS, PipelineMode, PipelineUnitConfig,
                                       config_registers, status_registers)
from gnnweave.host import driver


@pytest.mark.parametrize("kw,msg", [
    (dict(stages=9), r"stages must be in 1..8, got 9"),
    (dict(lanes=3), r"lanes must be a power of two"),
    (dict(lanes=8), r"lanes must be a power of two with lanes \* 32 <= bus_width \(128\), got 8"),
    (dict(lanes=2, bus_width=64, max_in=12), r"max_in must be a power of two, got 12"),
    (dict(max_out=2), r"max_out must be in lanes \(4\) .. 4096, got 2"),
    (dict(stages=3, slots=2), r"slots must be >= stages \(3\)"),
    (dict(stages=3, versions=4), r"versions must be >= stages \+ 2 \(5\)"),
    (dict(max_burst=64), r"max_burst must be in 1..min\(256, fifo_beats=32\), got 64"),
    (dict(bus_width=96), r"bus_width must be 64, 128, 256 or 512, not 96"),
    (dict(addr_width=72), r"addr_width must be in 32..64, got 72"),
])
def test_config_errors_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=r"PipelineUnitConfig\." + msg):
        PipelineUnitConfig(**kw)


def test_registers_per_stage():
    names = [n for n, _, _ in config_registers(3)]
    assert [n for n in names if n.startswith("s2_")] == [f"s2_{n}" for n, _ in STAGE_REGISTERS]
    assert "s3_d_in" not in names and len(names) == len(set(names))
    stat = {n: w for n, w, _ in status_registers(3)}
    assert stat["s2_mac_ops"] == 64 and stat["s2_wait_cycles"] == 32 and stat["logits_done"] == 32


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_named_build_has_one_register_map(name):
    units = [r.unit for r in unit_registers(name)]
    assert (Unit.PIPELINE in units) == (get_pipeline_config(name) is not None)
    regmap = build_regmap(name)
    # a register several units declare has one width and means the same in each
    for shared in ("status", "busy_cycles", "read_beats", "write_beats", "stall_cycles"):
        assert shared in regmap
    if Unit.PIPELINE in units:
        k = get_pipeline_config(name).stages
        assert f"s{k - 1}_dx_first" in regmap and f"s{k}_d_in" not in regmap
        assert regmap["grads_ready"].access.name == "RW" and regmap["logits_done"].access.name == "RO"


def test_shared_names_keep_one_meaning():
    sets = unit_registers("small")
    by_unit = {s.unit: {n: w for n, w, _ in s.status} for s in sets}
    pipe = by_unit[Unit.PIPELINE]
    for unit, regs in by_unit.items():
        for n in set(regs) & set(pipe):
            assert regs[n] == pipe[n], (unit, n)
    # no name is a configuration register of one unit and a status register of another
    accelerator_regmap(sets)


def test_driver_names_match_the_hardware():
    cfg = {n for n, _, _ in config_registers(2)}
    stat = {n for n, _, _ in status_registers(2)}
    assert set(driver.PIPE_CONFIG_NAMES) <= cfg
    assert set(driver.PIPE_COUNTERS) <= stat
    assert tuple(driver.PIPE_STAGE_NAMES) == tuple(n for n, _ in STAGE_REGISTERS)
    assert {f"s1_{n}" for n in driver.PIPE_STAGE_COUNTERS} <= stat
    assert Unit is contract.Unit     # the gateware's unit ids are the driver's
    assert driver.PIPE_MODES == {m.name.lower(): m.value for m in PipelineMode}


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("name", ["small", "pynqz2"])
def test_stage_memories_match_the_elaborated_stage(name):
    """The memory shapes the budget is computed from are those the RTL builds."""
    import re
    from collections import Counter

    from amaranth.back import rtlil
    config = get_pipeline_config(name)
    text = rtlil.convert(config.pipeline().stage_list[0], name="stage", emit_src=False)
    built = Counter((int(d), int(w)) for w, d in re.findall(r"memory width (\d+) size (\d+)", text))
    wanted = Counter()
    for count, depth, width in config.stage_memories().values():
        wanted[(depth, width)] += count
    assert not wanted - built, (wanted - built, built)
