"""Board catalogue (``bitstreams/boards.json``): part, PS, HP ports, clocks, PL capacity.

The data lives in JSON so it can be read without Python; this module loads it once and
validates every field, naming the board and field on bad input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gnnweave.buildconfig import BUILDS
from gnnweave.errors import InputError

CATALOGUE_PATH = Path(__file__).resolve().parents[2] / "bitstreams" / "boards.json"
PS_TYPES = ("zynq_ultra_ps_e", "processing_system7", "none")
RESOURCE_KINDS = ("lut", "ff", "dsp", "bram36", "uram")


class BoardCatalogueError(InputError):
    """The board catalogue is malformed (message names file, board and field)."""


@dataclass(frozen=True)
class HpPort:
    name: str
    width: int


@dataclass(frozen=True)
class Board:
    key: str
    name: str
    part: str
    ps_type: str
    hp_ports: tuple[HpPort, ...]
    pl_clock_mhz: float
    resources: dict            # kind -> int or None (None: not verified)
    ddr_bandwidth_gbs: float | None
    config: str
    control_base: int | None
    sources: str

    @property
    def has_ps(self) -> bool:
        return self.ps_type != "none"


def _parse_board(where: str, key: str, d) -> Board:
    def fail(field, why):
        raise BoardCatalogueError(f"{where}: board {key!r} field {field!r}: {why}")

    if not isinstance(d, dict):
        raise BoardCatalogueError(f"{where}: board {key!r}: expected an object, got {type(d).__name__}")
    required = ("name", "part", "ps_type", "hp_ports", "pl_clock_mhz", "resources",
                "ddr_bandwidth_gbs", "config", "control_base", "sources")
    for field in required:
        if field not in d:
            fail(field, "missing")
    unknown = sorted(set(d) - set(required))
    if unknown:
        fail(unknown[0], "unknown field")
    for field in ("name", "part", "sources", "config"):
        if not isinstance(d[field], str) or not d[field]:
            fail(field, "must be a non-empty string")
    if d["ps_type"] not in PS_TYPES:
        fail("ps_type", f"{d['ps_type']!r} is not one of {', '.join(PS_TYPES)}")
    if d["config"] not in BUILDS:
        fail("config", f"{d['config']!r} is not a named build (gnnweave/buildconfig.py)")
    clk = d["pl_clock_mhz"]
    if isinstance(clk, bool) or not isinstance(clk, (int, float)) or not 0 < clk <= 1000:
        fail("pl_clock_mhz", f"{clk!r} is not a clock in (0, 1000] MHz")
    ports = d["hp_ports"]
    if not isinstance(ports, list) or not ports:
        fail("hp_ports", "must be a non-empty list")
    hp = []
    for i, p in enumerate(ports):
        if not isinstance(p, dict) or set(p) != {"name", "width"}:
            fail(f"hp_ports[{i}]", "must be {\"name\": str, \"width\": int}")
        if not isinstance(p["name"], str) or not p["name"]:
            fail(f"hp_ports[{i}].name", "must be a non-empty string")
        if p["width"] not in (32, 64, 128, 256, 512):
            fail(f"hp_ports[{i}].width", f"{p['width']!r} is not 32/64/128/256/512")
        hp.append(HpPort(p["name"], p["width"]))
    res = d["resources"]
    if not isinstance(res, dict):
        fail("resources", "must be an object")
    if set(res) != set(RESOURCE_KINDS):
        fail("resources", f"must have exactly {', '.join(RESOURCE_KINDS)}; got {', '.join(sorted(res))}")
    for kind, n in res.items():
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            fail(f"resources.{kind}", f"{n!r} is not a count >= 0 (or null)")
    bw = d["ddr_bandwidth_gbs"]
    if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0):
        fail("ddr_bandwidth_gbs", f"{bw!r} is not a positive number (or null)")
    base = d["control_base"]
    if d["ps_type"] == "none":
        if base is not None:
            fail("control_base", "must be null for a board without a PS (Vitis assigns it)")
        control_base = None
    else:
        try:
            control_base = int(base, 16)
        except (TypeError, ValueError):
            fail("control_base", f"{base!r} is not a hex address string")
    config = BUILDS[d["config"]].aggregator
    widest = max(p.width for p in hp)
    if config.bus_width > widest:
        fail("config", f"{d['config']!r} has a {config.bus_width}-bit bus, wider than the "
                       f"widest HP port ({widest} bits)")
    return Board(key=key, name=d["name"], part=d["part"], ps_type=d["ps_type"], hp_ports=tuple(hp),
                 pl_clock_mhz=clk, resources=dict(res), ddr_bandwidth_gbs=bw, config=d["config"],
                 control_base=control_base, sources=d["sources"])


def parse_catalogue(data, where: str = "boards.json") -> dict[str, Board]:
    if not isinstance(data, dict) or not isinstance(data.get("boards"), dict):
        raise BoardCatalogueError(f"{where}: expected an object with a 'boards' object")
    return {key: _parse_board(where, key, d) for key, d in data["boards"].items()}


def load_catalogue(path=None) -> dict[str, Board]:
    path = Path(path) if path is not None else CATALOGUE_PATH
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BoardCatalogueError(f"{path}: board catalogue not found") from None
    except json.JSONDecodeError as e:
        raise BoardCatalogueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    return parse_catalogue(data, str(path))


@lru_cache(maxsize=None)
def _default_catalogue() -> dict[str, Board]:
    return load_catalogue()


def boards() -> dict[str, Board]:
    return dict(_default_catalogue())


def get_board(name) -> Board:
    if isinstance(name, Board):
        return name
    cat = _default_catalogue()
    try:
        return cat[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}; choose one of {', '.join(cat)}") from None
