"""hw/configs.py: the gateware's unit configurations are built from gnnweave/buildconfig.py."""
from __future__ import annotations

import dataclasses

import pytest

from gnnweave.buildconfig import (BUILDS, AggregatorParams, BuildConfig, MacArrayParams,
                                  PipelineParams)
from gnnweave.hw.aggregator import AggregatorConfig
from gnnweave.hw.configs import (CONFIGS, MAC_CONFIGS, PIPELINE_CONFIGS, get_config,
                                 get_mac_config, get_pipeline_config, unit_configs)
from gnnweave.hw.mac_array import MacArrayConfig
from gnnweave.hw.pipeline_unit import PipelineUnitConfig

PAIRS = [("aggregator", AggregatorParams, AggregatorConfig),
         ("mac_array", MacArrayParams, MacArrayConfig),
         ("pipeline", PipelineParams, PipelineUnitConfig)]


@pytest.mark.parametrize("unit,params,hw_class", PAIRS, ids=[p[0] for p in PAIRS])
def test_build_parameters_match_the_unit_fields(unit, params, hw_class):
    # a renamed or removed field, or a changed default, of a unit configuration fails here
    hw_fields = {f.name: f for f in dataclasses.fields(hw_class)}
    for f in dataclasses.fields(params):
        assert f.name in hw_fields, (unit, f.name)
        assert hw_fields[f.name].default == f.default, (unit, f.name)


@pytest.mark.parametrize("name", list(BUILDS))
def test_unit_configs_carry_the_build_parameters(name):
    build = BUILDS[name]
    units = unit_configs(build)
    assert units == unit_configs(name)
    for unit, _, _ in PAIRS:
        params, config = getattr(build, unit), getattr(units, unit)
        assert (params is None) == (config is None)
        if params is not None:
            for k, v in dataclasses.asdict(params).items():
                assert getattr(config, k) == v, (name, unit, k)
    assert get_config(name) is CONFIGS[name] == units.aggregator
    assert get_mac_config(name) is MAC_CONFIGS[name]
    assert get_pipeline_config(name) is PIPELINE_CONFIGS[name]


def test_a_unit_check_still_names_its_field():
    # the core checks the build as a whole; what one unit cannot build is refused by its class
    bad = BuildConfig("x", mac_array=MacArrayParams(cols=3))
    with pytest.raises(ValueError, match=r"MacArrayConfig"):
        unit_configs(bad)


def test_unknown_build_is_one_line():
    with pytest.raises(ValueError, match=r"^unknown configuration 'nope'; choose one of "):
        get_config("nope")
