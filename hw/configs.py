"""The unit configurations of every named build (``make verilog CONFIG=...``).

The builds themselves are :class:`gnnweave.buildconfig.BuildConfig` (plain Python, read by
the runtime too); this module turns one into the gateware's unit configurations, whose
own checks then run. ``CONFIGS``, ``MAC_CONFIGS`` and ``PIPELINE_CONFIGS`` are those of
every named build, by name (``None``: the build has no such unit).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from gnnweave.buildconfig import BUILDS, BuildConfig, get_build

from .aggregator import AggregatorConfig
from .mac_array import MacArrayConfig
from .pipeline_unit import PipelineUnitConfig


class UnitConfigs(NamedTuple):
    """The gateware configuration of each unit of one build."""

    aggregator: AggregatorConfig
    mac_array: MacArrayConfig | None
    pipeline: PipelineUnitConfig | None


def _make(cls, params):
    return None if params is None else cls(**dataclasses.asdict(params))


def unit_configs(build: BuildConfig | str) -> UnitConfigs:
    """The unit configurations of ``build`` (a :class:`BuildConfig` or a build's name)."""
    if isinstance(build, str):
        build = get_build(build)
    return UnitConfigs(_make(AggregatorConfig, build.aggregator),
                       _make(MacArrayConfig, build.mac_array),
                       _make(PipelineUnitConfig, build.pipeline))


_UNITS = {name: unit_configs(build) for name, build in BUILDS.items()}
CONFIGS: dict[str, AggregatorConfig] = {n: u.aggregator for n, u in _UNITS.items()}
MAC_CONFIGS: dict[str, MacArrayConfig | None] = {n: u.mac_array for n, u in _UNITS.items()}
PIPELINE_CONFIGS: dict[str, PipelineUnitConfig | None] = {n: u.pipeline for n, u in _UNITS.items()}


def get_config(name: str) -> AggregatorConfig:
    """The Aggregator of the named build (a ``ValueError`` names the builds there are)."""
    return _UNITS[get_build(name).name].aggregator


def get_mac_config(name: str) -> MacArrayConfig | None:
    """The MacArray of the named build (None when the build has none)."""
    return _UNITS[get_build(name).name].mac_array


def get_pipeline_config(name: str) -> PipelineUnitConfig | None:
    """The training Pipeline of the named build (None when the build has none)."""
    return _UNITS[get_build(name).name].pipeline
