"""What every ``gnnweave`` sub-command shares.

A sub-command is a module with two functions, mounted by :mod:`gnnweave.cli`:

* ``add_arguments(parser)`` adds its options (each with help text; the parser shows every
  default);
* ``run(args) -> int`` does the work and returns the exit status.

Output folders are checked here before any work starts, reports print as JSON
(``--json``) or as an aligned table for people, and ``--devices`` lists are read the same
way by every command.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gnnweave.errors import InputError


def json_default(o):
    """``json.dumps`` ``default=``: numpy scalars and arrays, paths."""
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=json_default))


def format_value(value) -> str:
    """A report value for people: floats to 4 significant digits, lists and dicts flat."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={format_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    return str(value)


def format_table(report: dict, keys=()) -> str:
    """``key  value`` lines, the keys aligned (``keys``: which and in what order)."""
    keys = [k for k in (keys or report) if k in report]
    width = max((len(k) for k in keys), default=0)
    return "\n".join(f"{k.replace('_', ' '):<{width}}  {format_value(report[k])}" for k in keys)


def emit(report: dict, as_json: bool, summary_keys=()) -> None:
    """The whole report as JSON, or the ``summary_keys`` of it as a table."""
    if as_json:
        print_json(report)
    else:
        print(format_table(report, summary_keys))


def output_folder(option: str, path, *, create: bool = True) -> Path:
    """An output folder, checked for writing (and created) before any work starts."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"{option} {path}: is a file; give a folder")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{option} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: {probe} is not writable")
    if create:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{option} {path}: cannot create the folder ({exc.strerror})") from None
    return out


def positive(option: str, value, *, minimum=1):
    """``value`` when ``>= minimum``, else a one-line error naming the option."""
    if value is not None and value < minimum:
        raise InputError(f"{option} must be >= {minimum}, got {value}")
    return value


def device_words(values) -> list[str]:
    """The words of a ``--devices`` value: separated by commas or spaces, in one argument or
    several (``cpu,fpga-emu`` = ``cpu fpga-emu`` = ``cpu, fpga-emu``)."""
    if values is None:
        return []
    texts = [values] if isinstance(values, str) else list(values)
    return [w.strip() for text in texts for w in str(text).replace(",", " ").split()]


def unique_names(option: str, names) -> list[str]:
    """``names`` when no device appears twice (case-insensitively), else a one-line error."""
    seen: set[str] = set()
    for name in names:
        if name.lower() in seen:
            raise InputError(f"{option}: {name!r} appears twice (name further instances "
                             f"{name}:1, {name}:2, ...)")
        seen.add(name.lower())
    return list(names)


def device_list(option: str, values, *, specs: bool = False) -> list[str] | None:
    """The devices of ``--devices``, one syntax for every command.

    ``values``: words separated by commas or spaces (:func:`device_words`), each ``NAME`` or
    ``NAME*COUNT`` (COUNT devices ``NAME:0`` .. ``NAME:COUNT-1``). With ``specs`` (``gnnweave
    plan``, which measures nothing and so is told each device's speed, memory and place)
    a word may go on with ``=SPEED[:MEM_GB]`` and ``@GROUP``, kept on every device it names:
    ``gpu*2=1:16`` -> ``gpu:0=1:16``, ``gpu:1=1:16``. A name given twice is an error.
    """
    if values is None:
        return None
    devices: list[str] = []
    names: list[str] = []
    for word in device_words(values):
        cut = min((i for i in (word.find("="), word.find("@")) if i >= 0), default=len(word))
        head, spec = word[:cut], word[cut:]
        if spec and not specs:
            raise InputError(f"{option}: {word!r}: =SPEED:MEM and @GROUP are for gnnweave plan; "
                             f"here give NAME or NAME*COUNT (speeds are measured)")
        name, star, count = head.partition("*")
        if not name:
            raise InputError(f"{option}: {word!r}: empty device name")
        if star and (not count.isdigit() or int(count) < 1):
            raise InputError(f"{option}: {word!r}: COUNT after '*' must be an integer >= 1")
        expanded = [f"{name}:{i}" for i in range(int(count))] if star else [name]
        names += expanded
        devices += [n + spec for n in expanded]
    unique_names(option, names)
    return devices or None


class _DeprecatedName(argparse.Action):
    """Stores like the option it stands for, and says on stderr which name to use."""

    def __call__(self, parser, namespace, values, option_string=None):
        new_name = "--" + self.dest.replace("_", "-")
        print(f"gnnweave: {option_string} is deprecated: use {new_name}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_dataset_option(parser, *, required: bool, help: str, old_name: str | None = None,
                       default=None) -> None:
    """``--dataset`` (and, where a command had it, its deprecated old name, e.g. ``--graph``)."""
    if old_name is None:
        parser.add_argument("--dataset", required=required, default=default, help=help)
        return
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--dataset", default=default, help=help)
    group.add_argument(old_name, dest="dataset", action=_DeprecatedName, metavar="DATASET",
                       help="deprecated name of --dataset")


#: the Pipeline's schedules, as `verify pipeline` and `device run pipeline` take them
SCHEDULES = ["gpipe", "1f1b-flush", "1f1b-async"]


def add_aggregation_options(parser) -> None:
    """The graph, feature width and reduction of one Aggregator run (``verify aggregate``,
    ``device run aggregate``)."""
    add_dataset_option(parser, required=True, old_name="--graph",
                       help="cora | citeseer | rmat:SCALE:EDGEFACTOR | PATH.npz")
    parser.add_argument("--feat-dim", type=int, required=True, help="feature columns")
    parser.add_argument("--reduce", default="sum", choices=["sum", "mean", "max"],
                        help="the reduction")


def add_config_option(parser, *, default: str | None = None, what: str = "") -> None:
    """``--config NAME``: one of the named builds of :mod:`gnnweave.buildconfig`, listed in
    the help (default :data:`~gnnweave.buildconfig.DEFAULT_BUILD`); ``what``: the units the
    command needs of it."""
    from gnnweave.buildconfig import BUILDS, DEFAULT_BUILD
    need = f", one with {what}" if what else ""
    parser.add_argument("--config", default=default or DEFAULT_BUILD, metavar="BUILD",
                        help=f"the build{need}: {' | '.join(BUILDS)} (gnnweave/buildconfig.py)")


def named_build(name: str, option: str = "--config"):
    """The named build, or a one-line error naming ``option`` and listing the names."""
    from gnnweave.buildconfig import BuildConfigError, get_build
    try:
        return get_build(name)
    except BuildConfigError as exc:
        raise InputError(f"{option}: {exc}") from None
