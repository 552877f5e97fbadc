"""`gnnweave device run aggregate`: the driver on the simulated device, from the command line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_device_run_aggregate_matches_golden():
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", "device", "run", "aggregate",
                           "--dataset", "rmat:8:8", "--feat-dim", "12", "--reduce", "max", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["match"] and report["mismatches"] == 0
    assert report["edges"] == 8 * 256 and report["cycles"] > report["read_beats"] > 0
    assert report["sim_cycles_per_second"] > 0 and report["wall_seconds"] > 0
    # the cycle model beside the measurement (a graph its fit never saw)
    assert abs(report["predicted_cycles"] / report["cycles"] - 1) <= 0.05, report
    assert report["predicted_error_pct"] == pytest.approx(
        100 * (report["predicted_cycles"] / report["cycles"] - 1), abs=0.01)
    assert report["clock_mhz"] > 0 and report["clock_source"]
    assert report["predicted_seconds"] == pytest.approx(
        report["predicted_cycles"] / (report["clock_mhz"] * 1e6), rel=1e-3)


def test_device_run_mac_matches_golden_with_a_split_depth():
    proc = subprocess.run([sys.executable, "-m", "gnnweave.cli", "device", "run", "mac",
                           "--rows", "23", "--cols", "19", "--depth", "150", "--mode", "dw",
                           "--shift", "11", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["match"] and report["mismatches"] == 0
    assert report["counters"]["mac_ops"] == 23 * 19 * 150
    assert report["saturations"] == report["golden_saturations"]
    assert 0 < report["mac_utilization"] <= 1 and report["sim_cycles_per_second"] > 0
