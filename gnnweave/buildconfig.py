"""Named builds of the accelerator: one typed :class:`BuildConfig` per build.

A build is the Aggregator, and optionally the MacArray and the training Pipeline, behind one
control slave and one AXI4 memory port. Its parameters are plain Python (no Amaranth): the
gateware (``gnnweave.hw``) builds its unit configurations from them, and the runtime
(``gnnweave.host``) reads them without importing the toolchain.

Every field is checked when a build is made; an error names the build and the field::

    >>> BuildConfig("x", AggregatorParams(bus_width=96))
    Traceback (most recent call last):
    ...
    gnnweave.buildconfig.BuildConfigError: build 'x': aggregator.bus_width = 96: must be one of 64, 128, 256, 512

The checks here are those a build as a whole must pass (types, ranges, the units sharing
one bus); what makes one unit unbuildable (a row longer than a page, too few read credits)
is checked by that unit's own configuration class in ``gnnweave.hw``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from gnnweave.errors import InputError

#: AXI data widths the units support
BUS_WIDTHS = (64, 128, 256, 512)
#: reductions the Aggregator can be built with
REDUCE_OPS = ("sum", "mean", "max")


class BuildConfigError(InputError):
    """A build's parameter is out of range or of the wrong type (message names the field)."""


def _check_fields(params, where: str) -> None:
    """Type of every field of the dataclass ``params`` from its annotation (``int``: an
    integer, not a bool, >= 1; ``bool``; ``tuple``), then the bus fields."""
    for f in fields(params):
        v = getattr(params, f.name)
        bad = None
        if f.type == "int":
            if isinstance(v, bool) or not isinstance(v, int):
                bad = f"must be an integer, not {type(v).__name__}"
            elif v < 1:
                bad = "must be >= 1"
        elif f.type == "bool" and not isinstance(v, bool):
            bad = f"must be True or False, not {type(v).__name__}"
        elif f.type == "tuple" and not isinstance(v, tuple):
            bad = f"must be a tuple, not {type(v).__name__}"
        if bad:
            raise BuildConfigError(f"{where}.{f.name} = {v!r}: {bad}")
    if params.bus_width not in BUS_WIDTHS:
        raise BuildConfigError(f"{where}.bus_width = {params.bus_width!r}: must be one of "
                               f"{', '.join(map(str, BUS_WIDTHS))}")
    if not 32 <= params.addr_width <= 64:
        raise BuildConfigError(f"{where}.addr_width = {params.addr_width!r}: must be in 32..64")


@dataclass(frozen=True)
class AggregatorParams:
    """The Aggregator of a build (``gnnweave.hw.aggregator.AggregatorConfig``)."""

    elem_width: int = 16          # feature / weight / output element width
    bus_width: int = 128          # AXI data width
    max_feat_dim: int = 256       # longest feature row (elements)
    reads_in_flight: int = 128    # beats of gathered rows that may be outstanding
    addr_width: int = 64
    meta_fifo_beats: int = 32     # per metadata stream (indptr, indices, weights)
    meta_burst_beats: int = 16
    desc_depth: int = 256         # edge descriptors buffered ahead of the data
    reduce_ops: tuple = REDUCE_OPS

    def check(self, where: str) -> None:
        _check_fields(self, where)
        ops = self.reduce_ops
        if not ops or len(set(ops)) != len(ops) or not set(ops) <= set(REDUCE_OPS):
            raise BuildConfigError(f"{where}.reduce_ops = {ops!r}: must be a non-empty subset "
                                   f"of {', '.join(REDUCE_OPS)} without repeats")


@dataclass(frozen=True)
class MacArrayParams:
    """The MacArray of a build (``gnnweave.hw.mac_array.MacArrayConfig``)."""

    rows: int = 4              # array rows (output rows per tile)
    cols: int = 4              # array columns, a power of two
    max_dim: int = 64          # output block edge held in the on-chip buffers
    max_depth: int = 64        # largest k (depth) of one block
    bus_width: int = 128
    addr_width: int = 64
    max_burst: int = 16        # beats per read burst
    max_total_depth: int = 2**32 - 1   # largest total k of a run (sets the partial-sum width)
    psum_uram: bool = False    # partial sums in UltraRAM (UltraScale+ parts with URAM)

    def check(self, where: str) -> None:
        _check_fields(self, where)


@dataclass(frozen=True)
class PipelineParams:
    """The training Pipeline of a build (``gnnweave.hw.pipeline_unit.PipelineUnitConfig``)."""

    stages: int = 2
    lanes: int = 4             # MAC array edge of each stage
    max_in: int = 16           # largest d_in of a stage
    max_out: int = 16          # largest d_out of a stage
    max_rows: int = 16         # largest microbatch
    slots: int = 8             # activation stash slots per stage
    versions: int = 4          # MAC weight versions per stage (weight stashing)
    bus_width: int = 128
    addr_width: int = 64
    max_burst: int = 16
    fifo_beats: int = 32       # per read buffer
    uram: bool = False         # master weights, velocity, gradient sums in UltraRAM

    def check(self, where: str) -> None:
        _check_fields(self, where)


#: the unit fields of :class:`BuildConfig`, in the order the units sit behind the control slave
UNITS = ("aggregator", "mac_array", "pipeline")
_PARAMS = {"aggregator": AggregatorParams, "mac_array": MacArrayParams,
           "pipeline": PipelineParams}


@dataclass(frozen=True)
class BuildConfig:
    """One named build: its Aggregator and, where it has them, its MacArray and Pipeline
    (``None``: the build has no such unit). All units share the build's memory port, so
    their ``bus_width`` and ``addr_width`` must agree.

    Args:
        name: the build's name (``make verilog CONFIG=name``).
        aggregator: the Aggregator's parameters.
        mac_array: the MacArray's, or ``None``.
        pipeline: the Pipeline's, or ``None``.
        about: one line on what the build is for.
    """

    name: str
    aggregator: AggregatorParams = AggregatorParams()
    mac_array: MacArrayParams | None = None
    pipeline: PipelineParams | None = None
    about: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise BuildConfigError(f"build name = {self.name!r}: must be a non-empty string")
        where = f"build {self.name!r}"
        for unit in UNITS:
            params = getattr(self, unit)
            if unit != "aggregator" and params is None:
                continue
            if not isinstance(params, _PARAMS[unit]):
                raise BuildConfigError(f"{where}: {unit} = {params!r}: must be "
                                       f"{_PARAMS[unit].__name__}"
                                       + ("" if unit == "aggregator" else " or None"))
            params.check(f"{where}: {unit}")
        agg = self.aggregator
        for unit, params in self.units().items():
            for bus in ("bus_width", "addr_width"):
                if getattr(params, bus) != getattr(agg, bus):
                    raise BuildConfigError(
                        f"{where}: {unit}.{bus} = {getattr(params, bus)}: the units share one "
                        f"memory port, and aggregator.{bus} is {getattr(agg, bus)}")

    def units(self) -> dict:
        """``{unit field: parameters}`` of the units the build has."""
        return {u: getattr(self, u) for u in UNITS if getattr(self, u) is not None}


def _small_agg(**kw) -> AggregatorParams:
    return AggregatorParams(bus_width=128, max_feat_dim=64, reads_in_flight=64, desc_depth=128, **kw)


_BUILDS = [
    BuildConfig(
        "small", _small_agg(),
        MacArrayParams(rows=4, cols=4, max_dim=64, max_depth=64, bus_width=128),
        # two stages of at most 16 x 16: the Verilator builds stay quick
        PipelineParams(stages=2, lanes=4, max_in=16, max_out=16, max_rows=16, slots=8,
                       versions=4, bus_width=128),
        about="fast to build and simulate: the unit tests' configuration"),
    BuildConfig("small-agg", _small_agg(),
                about="the small Aggregator alone: the fastest simulated device for aggregation"),
    BuildConfig("small-sum", _small_agg(reduce_ops=("sum",)),
                about="sum only (no divider, no comparator): mean and max are config errors"),
    BuildConfig(
        "default", AggregatorParams(bus_width=128, max_feat_dim=256, reads_in_flight=128),
        # UltraScale+ parts with UltraRAM hold the MacArray's partial sums in URAM288
        MacArrayParams(rows=8, cols=8, max_dim=128, max_depth=128, bus_width=128,
                       psum_uram=True),
        PipelineParams(stages=2, lanes=4, max_in=64, max_out=64, max_rows=32, slots=8,
                       versions=4, bus_width=128, uram=True),
        about="128-bit HP port (Zynq UltraScale+), rows of up to 256 16-bit features"),
    BuildConfig(
        "zcu104",
        AggregatorParams(bus_width=128, max_feat_dim=512, reads_in_flight=256, desc_depth=512),
        MacArrayParams(rows=8, cols=8, max_dim=256, max_depth=256, bus_width=128,
                       psum_uram=True),
        # about 200 KB of on-chip memory per stage
        PipelineParams(stages=3, lanes=4, max_in=64, max_out=64, max_rows=64, slots=8,
                       versions=5, bus_width=128, uram=True),
        about="ZCU104: a 128-bit HP port, UltraRAM"),
    BuildConfig(
        "kv260",
        AggregatorParams(bus_width=128, max_feat_dim=512, reads_in_flight=256, desc_depth=512),
        MacArrayParams(rows=8, cols=8, max_dim=128, max_depth=128, bus_width=128,
                       psum_uram=True),
        # half ZCU104's block RAM: three stages with smaller activation stashes
        PipelineParams(stages=3, lanes=4, max_in=64, max_out=64, max_rows=32, slots=4,
                       versions=5, bus_width=128, uram=True),
        about="Kria KV260: a 128-bit HP port, UltraRAM"),
    BuildConfig(
        "ultra96v2", AggregatorParams(bus_width=128, max_feat_dim=256, reads_in_flight=64),
        # no UltraRAM: everything in block RAM. An 8 x 8 array brought the build to 97 % of
        # the ZU3EG's LUTs (Yosys): 8 x 4 leaves routing room
        MacArrayParams(rows=8, cols=4, max_dim=128, max_depth=128, bus_width=128),
        # the ZU3EG has 70,560 LUTs: with 4-lane stages and 128 reads in flight this build
        # maps to about 73,800 (Yosys), so its stages have 2 lanes and 64 reads in flight
        PipelineParams(stages=2, lanes=2, max_in=64, max_out=64, max_rows=32, slots=8,
                       versions=4, bus_width=128),
        about="Ultra96-V2: a 128-bit HP port, no UltraRAM"),
    BuildConfig(
        "pynqz2",
        AggregatorParams(bus_width=64, max_feat_dim=128, reads_in_flight=64, addr_width=32),
        MacArrayParams(rows=4, cols=4, max_dim=64, max_depth=128, bus_width=64, addr_width=32),
        # a master word (lanes x 32 bits) must fit one 64-bit beat
        PipelineParams(stages=2, lanes=2, max_in=32, max_out=32, max_rows=32, slots=4,
                       versions=4, bus_width=64, addr_width=32),
        about="PYNQ-Z2 (Zynq-7000): 64-bit HP ports, 32-bit addresses"),
    BuildConfig(
        "alveo-u250",
        AggregatorParams(bus_width=512, max_feat_dim=1024, reads_in_flight=256, desc_depth=512),
        MacArrayParams(rows=32, cols=32, max_dim=512, max_depth=512, bus_width=512,
                       psum_uram=True),
        PipelineParams(stages=4, lanes=8, max_in=256, max_out=256, max_rows=64, slots=16,
                       versions=6, bus_width=512, uram=True),
        about="Alveo U250: a 512-bit DDR/HBM port"),
]

#: every named build, by name
BUILDS: dict[str, BuildConfig] = {b.name: b for b in _BUILDS}

#: The build a command simulates unless ``--config`` says otherwise: it has every unit and
#: is the quickest to build and simulate.
DEFAULT_BUILD = "small"


def get_build(name: str) -> BuildConfig:
    """The named build; a ``ValueError`` lists the names when there is none."""
    try:
        return BUILDS[name]
    except (KeyError, TypeError):
        raise BuildConfigError(f"unknown configuration {name!r}; choose one of "
                               f"{', '.join(BUILDS)}") from None
