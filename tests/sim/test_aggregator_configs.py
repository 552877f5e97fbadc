"""Build-time parameters change the RTL as documented (cocotb on Verilator)."""
from __future__ import annotations

import pytest

from gnnweave.hw.aggregator import Status
from gnnweave.sim import verify
from gnnweave.sim.verify import verify_aggregate


def test_sum_only_build_matches_and_refuses_other_reductions(monkeypatch):
    ok = verify_aggregate("rmat:7:4", 12, "sum", config="small-sum", latency=8, seed=3)
    assert ok["match"], ok.get("error")
    # the host refuses the run before any build, naming the configuration ...
    with pytest.raises(ValueError, match="'small-sum' is built with sum only"):
        verify_aggregate("rmat:7:4", 12, "mean", config="small-sum", latency=8, seed=3)
    # ... and the RTL, asked anyway, refuses it too: a config error and no memory traffic
    monkeypatch.setattr(verify, "check_run_options", lambda *a, **kw: None)
    refused = verify_aggregate("rmat:7:4", 12, "mean", config="small-sum", latency=8, seed=3)
    assert not refused["match"]
    assert refused["status"] & Status.CONFIG_ERROR
    assert refused["read_beats"] == 0 and refused["write_beats"] == 0
