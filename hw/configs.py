"""Named build configurations of the accelerator (``make verilog CONFIG=...``)."""
from __future__ import annotations

from .aggregator import AggregatorConfig
from .mac_array import MacArrayConfig
from .pipeline_unit import PipelineUnitConfig

CONFIGS: dict[str, AggregatorConfig] = {
    # fast to build and simulate: the unit tests' configuration
    "small": AggregatorConfig(bus_width=128, max_feat_dim=64, reads_in_flight=64, desc_depth=128),
    # the small Aggregator alone (no MacArray): the fastest simulated device for aggregation
    "small-agg": AggregatorConfig(bus_width=128, max_feat_dim=64, reads_in_flight=64, desc_depth=128),
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


#: The MacArray of each named build (same bus as the Aggregator; an array of at most one bus
#: beat of 16-bit elements per side, the largest each bus allows). Its two operand buffers
#: are square, ``max(max_dim, max_depth)`` 16-bit elements a side (a DW operand is stored
#: ``k x m``), so the on-chip memory grows with the square of the larger; the partial-sum
#: store holds one ``max_dim x max_dim`` block of 65-bit sums. Sizes are chosen so every board
#: build fits its board by the budget (``make estimate BUDGET=1``, docs/estimate.md) with
#: at least 10 % of its block RAM, UltraRAM and DSPs to spare. None: the build has no MacArray.
MAC_CONFIGS: dict[str, MacArrayConfig | None] = {
    "small": MacArrayConfig(rows=4, cols=4, max_dim=64, max_depth=64, bus_width=128),
    "small-agg": None,
    "small-sum": None,
    # UltraScale+ parts with UltraRAM hold the partial sums (2048 x 520 bits at 8 x 8, 128)
    # in 8 URAM288; the operand buffers (128 deep) take 32 BRAM36
    "default": MacArrayConfig(rows=8, cols=8, max_dim=128, max_depth=128, bus_width=128,
                              psum_uram=True),
    "zcu104": MacArrayConfig(rows=8, cols=8, max_dim=256, max_depth=256, bus_width=128,
                             psum_uram=True),
    "kv260": MacArrayConfig(rows=8, cols=8, max_dim=128, max_depth=128, bus_width=128,
                            psum_uram=True),
    # no UltraRAM: partial sums in block RAM
    "ultra96v2": MacArrayConfig(rows=8, cols=8, max_dim=128, max_depth=128, bus_width=128),
    "pynqz2": MacArrayConfig(rows=4, cols=4, max_dim=64, max_depth=128, bus_width=64,
                             addr_width=32),
    "alveo-u250": MacArrayConfig(rows=32, cols=32, max_dim=512, max_depth=512, bus_width=512,
                                 psum_uram=True),
}
assert MAC_CONFIGS.keys() == CONFIGS.keys()


#: The training Pipeline of each named build (:mod:`.pipeline_unit`; same bus as the other
#: units). Its on-chip memory per stage grows with ``versions * max_in * max_out`` (MAC
#: weights) plus three 32-bit ``max_in x max_out`` arrays (master, velocity, gradient sum)
#: and ``slots * max_rows * max_in`` stashed activations. None: the build has none.
PIPELINE_CONFIGS: dict[str, PipelineUnitConfig | None] = {
    # two stages of at most 16 x 16: the Verilator builds of `small` stay quick
    "small": PipelineUnitConfig(stages=2, lanes=4, max_in=16, max_out=16, max_rows=16, slots=8,
                                versions=4, bus_width=128),
    "small-agg": None,
    "small-sum": None,
    "default": PipelineUnitConfig(stages=2, lanes=4, max_in=64, max_out=64, max_rows=32, slots=8,
                                  versions=4, bus_width=128, uram=True),
    # about 200 KB of on-chip memory per stage (from the sizes above); master weights,
    # velocity and gradient sums in UltraRAM (uram) on the parts that have it
    "zcu104": PipelineUnitConfig(stages=3, lanes=4, max_in=64, max_out=64, max_rows=64, slots=8,
                                 versions=5, bus_width=128, uram=True),
    # KV260 has half ZCU104's block RAM: three stages with smaller activation stashes
    "kv260": PipelineUnitConfig(stages=3, lanes=4, max_in=64, max_out=64, max_rows=32, slots=4,
                                versions=5, bus_width=128, uram=True),
    "ultra96v2": PipelineUnitConfig(stages=2, lanes=4, max_in=64, max_out=64, max_rows=32, slots=8,
                                    versions=4, bus_width=128),
    # 64-bit HP port: a master word (lanes x 32 bits) must fit one beat
    "pynqz2": PipelineUnitConfig(stages=2, lanes=2, max_in=32, max_out=32, max_rows=32, slots=4,
                                 versions=4, bus_width=64, addr_width=32),
    "alveo-u250": PipelineUnitConfig(stages=4, lanes=8, max_in=256, max_out=256, max_rows=64, slots=16,
                                     versions=6, bus_width=512, uram=True),
}
assert PIPELINE_CONFIGS.keys() == CONFIGS.keys()


def get_config(name: str) -> AggregatorConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown configuration {name!r}; choose one of {', '.join(CONFIGS)}") from None


def get_mac_config(name: str) -> MacArrayConfig | None:
    """The MacArray of the named build (None when the build has none)."""
    get_config(name)    # the same error for an unknown name
    return MAC_CONFIGS[name]


def get_pipeline_config(name: str) -> PipelineUnitConfig | None:
    """The training Pipeline of the named build (None when the build has none)."""
    get_config(name)    # the same error for an unknown name
    return PIPELINE_CONFIGS[name]
