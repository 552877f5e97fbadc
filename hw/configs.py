"""Named build configurations of the accelerator (``make verilog CONFIG=...``)."""
from __future__ import annotations

from .aggregator import AggregatorConfig

CONFIGS: dict[str, AggregatorConfig] = {
    # fast to build and simulate: the unit tests' configuration
    "small": AggregatorConfig(bus_width=128, max_feat_dim=64, reads_in_flight=64, desc_depth=128),
    # a sum-only build (no divider, no comparator): mean/max are refused as config errors
    "small-sum": AggregatorConfig(bus_width=128, max_feat_dim=64, reads_in_flight=64, desc_depth=128,
                                  reduce_ops=("sum",)),
    # the default: 128-bit HP port (Zynq UltraScale+), rows of up to 256 16-bit features
    "default": AggregatorConfig(bus_width=128, max_feat_dim=256, reads_in_flight=128),
    # board-sized: a 128-bit HP port of ZCU104 / KV260 / Ultra96-V2
    "zcu104": AggregatorConfig(bus_width=128, max_feat_dim=512, reads_in_flight=256, desc_depth=512),
    "kv260": AggregatorConfig(bus_width=128, max_feat_dim=512, reads_in_flight=256, desc_depth=512),
    "ultra96v2": AggregatorConfig(bus_width=128, max_feat_dim=256, reads_in_flight=128),
    # Zynq-7000 HP ports are 64-bit
    "pynqz2": AggregatorConfig(bus_width=64, max_feat_dim=128, reads_in_flight=64, addr_width=32),
    # Alveo: 512-bit DDR/HBM port
    "alveo-u250": AggregatorConfig(bus_width=512, max_feat_dim=1024, reads_in_flight=256, desc_depth=512),
}


def get_config(name: str) -> AggregatorConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown configuration {name!r}; choose one of {', '.join(CONFIGS)}") from None
