"""gnnweave/buildconfig.py: the named builds, checked field by field without Amaranth."""
from __future__ import annotations

import dataclasses
import sys

import pytest

from gnnweave.buildconfig import (BUILDS, AggregatorParams, BuildConfig, BuildConfigError,
                                  MacArrayParams, PipelineParams, get_build)


def test_every_named_build_is_there_and_frozen():
    assert {"small", "small-agg", "small-sum", "default", "zcu104", "kv260", "ultra96v2",
            "pynqz2", "alveo-u250"} <= set(BUILDS)
    for name, build in BUILDS.items():
        assert build.name == name and build.about
        with pytest.raises(dataclasses.FrozenInstanceError):
            build.aggregator.bus_width = 64          # type: ignore[misc]
    assert BUILDS["small-agg"].mac_array is None and BUILDS["small-agg"].pipeline is None
    assert BUILDS["small-sum"].aggregator.reduce_ops == ("sum",)
    assert set(BUILDS["default"].units()) == {"aggregator", "mac_array", "pipeline"}


def test_unknown_build_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown configuration 'nope'; choose one of small, "):
        get_build("nope")


@pytest.mark.parametrize("make,message", [
    (lambda: BuildConfig("x", AggregatorParams(bus_width=96)),
     r"^build 'x': aggregator\.bus_width = 96: must be one of 64, 128, 256, 512$"),
    (lambda: BuildConfig("x", AggregatorParams(addr_width=16)),
     r"^build 'x': aggregator\.addr_width = 16: must be in 32\.\.64$"),
    (lambda: BuildConfig("x", AggregatorParams(max_feat_dim=0)),
     r"^build 'x': aggregator\.max_feat_dim = 0: must be >= 1$"),
    (lambda: BuildConfig("x", AggregatorParams(desc_depth=True)),
     r"^build 'x': aggregator\.desc_depth = True: must be an integer, not bool$"),
    (lambda: BuildConfig("x", AggregatorParams(reads_in_flight=2.0)),
     r"^build 'x': aggregator\.reads_in_flight = 2\.0: must be an integer, not float$"),
    (lambda: BuildConfig("x", AggregatorParams(reduce_ops=("sum", "min"))),
     r"^build 'x': aggregator\.reduce_ops = \('sum', 'min'\): must be a non-empty subset"),
    (lambda: BuildConfig("x", AggregatorParams(reduce_ops=["sum"])),
     r"^build 'x': aggregator\.reduce_ops = \['sum'\]: must be a tuple, not list$"),
    (lambda: BuildConfig("x", mac_array=MacArrayParams(psum_uram=1)),
     r"^build 'x': mac_array\.psum_uram = 1: must be True or False, not int$"),
    (lambda: BuildConfig("x", mac_array=MacArrayParams(bus_width=64)),
     r"^build 'x': mac_array\.bus_width = 64: the units share one memory port, and "
     r"aggregator\.bus_width is 128$"),
    (lambda: BuildConfig("x", pipeline=PipelineParams(addr_width=32)),
     r"^build 'x': pipeline\.addr_width = 32: the units share one memory port"),
    (lambda: BuildConfig("x", pipeline=MacArrayParams()),
     r"^build 'x': pipeline = MacArrayParams\(.*\): must be PipelineParams or None$"),
    (lambda: BuildConfig(""), r"^build name = '': must be a non-empty string$"),
])
def test_bad_field_is_named(make, message):
    with pytest.raises(BuildConfigError, match=message):
        make()


def test_the_core_needs_no_toolchain():
    # the runtime reads builds without Amaranth: importing the module pulls none of it in
    import subprocess
    code = ("import sys, gnnweave.buildconfig as b; b.get_build('default'); "
            "sys.exit(int(any(m.startswith('amaranth') for m in sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
