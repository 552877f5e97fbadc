"""The whole accelerator top of a named build on Verilator: Aggregator and MacArray jobs
back to back through one control slave and one gmem port, each bit-exact with golden."""
from __future__ import annotations

import pytest

from gnnweave.hw.accelerator import Unit, build_regmap, unit_registers

pytest.importorskip("cocotb")


def test_named_builds_list_their_units():
    assert [r.unit for r in unit_registers("small")] == [Unit.AGGREGATOR, Unit.MAC_ARRAY, Unit.PIPELINE]
    assert [r.unit for r in unit_registers("small-sum")] == [Unit.AGGREGATOR]
    regmap = build_regmap("small")
    for name in ("num_nodes", "feat_addr", "mode", "p_addr", "q_stride", "mac_ops", "edges",
                 "pipe_mode", "grads_ready", "logits_done", "s1_d_out", "s0_wait_cycles"):
        assert name in regmap
    with pytest.raises(ValueError, match="unknown configuration 'nope'"):
        build_regmap("nope")


def test_aggregator_and_mac_array_share_one_top():
    from gnnweave.sim.accelerator_bench import run_accelerator
    result = run_accelerator("small", seed=3, latency=8, backpressure=0.3)
    units = [j["unit"] for j in result["jobs"]]
    assert units.count("aggregator") == 3 and units.count("mac_array") == 5
    assert units.count("pipeline") == 1


def test_make_lint_is_clean_on_the_accelerator_top():
    from gnnweave.hw.accelerator import ACCELERATOR_TOP
    from gnnweave.sim.accelerator_bench import accelerator_verilog
    from gnnweave.sim.lint import lint_verilog
    report = lint_verilog(accelerator_verilog("small"), ACCELERATOR_TOP)
    assert report["clean"], report["log"]
    # the waivers are the named Amaranth idioms only, nothing else
    assert set(report["waived_rules"]) <= {"CASEINCOMPLETE", "DECLFILENAME", "PROCASSINIT", "SYMRSVDWORD",
                                           "UNUSEDSIGNAL", "WIDTHEXPAND", "WIDTHTRUNC"}
