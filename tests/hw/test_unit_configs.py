"""Every unit configuration refuses unbuildable parameters with an error naming the field
(the AXI bus checks are shared: hw/axi.py ``BusParams``)."""
from __future__ import annotations

import pytest

from gnnweave.hw.aggregator import AggregatorConfig
from gnnweave.hw.configs import CONFIGS, MAC_CONFIGS, PIPELINE_CONFIGS
from gnnweave.hw.mac_array import MacArrayConfig
from gnnweave.hw.pipeline_unit import PipelineUnitConfig

UNIT_CONFIGS = [AggregatorConfig, MacArrayConfig, PipelineUnitConfig]


@pytest.mark.parametrize("config_class", UNIT_CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("field,value,message", [
    ("bus_width", 96, "bus_width must be 64, 128, 256 or 512, not 96"),
    ("bus_width", 1024, "bus_width must be 64, 128, 256 or 512, not 1024"),
    ("addr_width", 31, "addr_width must be in 32..64, got 31"),
    ("addr_width", 65, "addr_width must be in 32..64, got 65"),
])
def test_bus_parameters_are_checked_by_every_unit(config_class, field, value, message):
    with pytest.raises(ValueError, match=rf"^{config_class.__name__}\.{message}$"):
        config_class(**{field: value})


@pytest.mark.parametrize("config_class", UNIT_CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bus_width", [64, 128, 256, 512])
def test_beat_geometry_follows_the_bus(config_class, bus_width):
    kwargs = {"bus_width": bus_width}
    if config_class is PipelineUnitConfig:
        kwargs["lanes"] = 2        # lanes * 32 <= bus_width
    elif config_class is MacArrayConfig:
        kwargs.update(rows=2, cols=2, max_dim=64)
    config = config_class(**kwargs)
    assert config.bytes_per_beat * 8 == bus_width
    if config_class is not AggregatorConfig:
        assert config.elems_per_beat == bus_width // 16     # int16 operands


@pytest.mark.parametrize("kwargs,message", [
    ({"elem_width": 12}, "elem_width must be 8 or 16, not 12"),
    ({"max_feat_dim": 4096}, "max_feat_dim=4096: a row must fit one 4 KiB page"),
    ({"reduce_ops": ("sum", "min")}, "reduce_ops must be a non-empty subset"),
    ({"reduce_ops": ()}, "reduce_ops must be a non-empty subset"),
    ({"max_feat_dim": 256, "reads_in_flight": 16}, "reads_in_flight must hold at least one whole row"),
])
def test_aggregator_config_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AggregatorConfig(**kwargs)


def test_every_named_build_is_valid():
    # constructing them ran every check; the geometry the RTL uses must agree between units
    for name, agg in CONFIGS.items():
        for unit in (MAC_CONFIGS[name], PIPELINE_CONFIGS[name]):
            if unit is not None:
                assert unit.addr_width == agg.addr_width, name
