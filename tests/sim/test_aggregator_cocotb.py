"""The Aggregator RTL in cocotb, bit-exact against the golden model.

Verilator runs the whole bench (:mod:`gnnweave.sim.aggregate_bench`); Icarus runs a
subset (marker ``icarus``). Each pytest function starts one simulator process for one
group of cocotb tests; the build is shared (cached by Verilog content under build/sim).
"""
from __future__ import annotations

import pytest

from gnnweave.sim import runner
from tests.conftest import require_file, require_icarus

BENCH = runner.BENCH_MODULE


@pytest.fixture(scope="module")
def verilator_build():
    return runner.build_aggregator("default", "verilator")


@pytest.fixture(scope="module")
def icarus_build():
    require_icarus()
    return runner.build_aggregator("default", "icarus")


def _run(built, testcase, **params):
    return runner.run(built, BENCH, testcase=testcase, params={"config": "default", **params},
                      run_name=testcase.replace(",", "+"))


def test_edge_cases(verilator_build):
    from gnnweave.sim.aggregate_bench import EDGE_CASES
    result = _run(verilator_build, "edge_cases", latency=8)
    assert result.failed == 0 and result.tests == len(EDGE_CASES)
    res = result.results
    assert set(res) == {f"edge_cases/{c}" for c in EDGE_CASES}
    # the cases exercise what they are named after
    assert res["edge_cases/empty"]["edges"] == 0
    assert res["edge_cases/bad_index"]["rejected"] > 0
    assert res["edge_cases/saturate"]["saturations"] > 0
    assert res["edge_cases/hub"]["edges"] >= 6 * 600


def test_config_errors_and_fast_path(verilator_build):
    result = _run(verilator_build, "config_errors,no_backpressure_fast_path")
    assert result.failed == 0 and result.tests == 2
    assert len(result.results["config_errors"]) == 17


def test_random_graphs_under_backpressure_and_latency(verilator_build):
    result = _run(verilator_build, "random_graphs", latency=32, backpressure=0.3, seed=1)
    assert result.failed == 0 and result.tests == 6


def test_reset_in_the_middle_of_a_run(verilator_build):
    result = _run(verilator_build, "reset_mid_run")
    assert result.failed == 0
    assert result.results["reset_mid_run"]["bursts_before_reset"] >= 20


def _dataset_or_skip(name):
    from gnnweave.datasets import data_root
    require_file(data_root() / f"{name}.npz", "dataset")


def test_cora_all_reductions(verilator_build):
    _dataset_or_skip("cora")
    result = _run(verilator_build, "dataset_graph", dataset="cora", latency=32)
    assert result.failed == 0
    out = result.results["dataset_graph"]
    assert set(out) == {"sum", "mean", "max"}
    assert all(v["edges"] == 10556 for v in out.values())


def test_verify_aggregate_reports_speed():
    from gnnweave.sim.verify import verify_aggregate
    rep = verify_aggregate("rmat:8:8", feat_dim=16, reduce="mean", weighted=True, seed=3)
    assert rep["match"] and rep["mismatches"] == 0, rep.get("error")
    assert rep["nodes"] == 256 and rep["edges"] == rep["graph_edges"] == 256 * 8
    assert 0 < rep["port_utilization"] <= 1
    assert rep["read_beats"] >= rep["ideal_cycles"] > 2 * rep["edges"]
    assert rep["cycles"] >= rep["ideal_cycles"]
    assert rep["sim_cycles_per_second"] > 0


@pytest.mark.slow
def test_citeseer_and_large_rmat(verilator_build):
    _dataset_or_skip("citeseer")
    result = _run(verilator_build, "dataset_graph", dataset="citeseer", latency=32)
    assert result.failed == 0
    from gnnweave.sim.verify import verify_aggregate
    rep = verify_aggregate("rmat:12:16", feat_dim=24, reduce="max", seed=5, backpressure=0.2)
    assert rep["match"], rep.get("error")


@pytest.mark.icarus
def test_icarus_subset(icarus_build):
    result = _run(icarus_build, "edge_cases/case=feat_dims,edge_cases/case=bad_index,"
                                "config_errors,reset_mid_run", latency=8)
    assert result.failed == 0 and result.tests == 4


@pytest.mark.icarus
@pytest.mark.slow
def test_icarus_random_graphs(icarus_build):
    result = _run(icarus_build, "random_graphs", latency=16, backpressure=0.3)
    assert result.failed == 0 and result.tests == 6
