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


def device_list(option: str, values) -> list[str] | None:
    """Device names from ``--devices``: words separated by commas or spaces, each ``NAME`` or
    ``NAME*COUNT`` (COUNT devices ``NAME:0`` .. ``NAME:COUNT-1``, as ``gnnweave plan``
    reads them). ``=SPEED:MEM`` and ``@GROUP`` are the planner's (speeds are measured
    here); a name given twice is an error."""
    if values is None:
        return None
    words = [values] if isinstance(values, str) else list(values)
    names: list[str] = []
    for word in (w.strip() for text in words for w in str(text).replace(",", " ").split()):
        if "=" in word or "@" in word:
            raise InputError(f"{option}: {word!r}: =SPEED:MEM and @GROUP are for gnnweave plan; "
                             f"here give NAME or NAME*COUNT (speeds are measured)")
        name, star, count = word.partition("*")
        if not name:
            raise InputError(f"{option}: {word!r}: empty device name")
        if not star:
            names.append(name)
            continue
        if not count.isdigit() or int(count) < 1:
            raise InputError(f"{option}: {word!r}: COUNT after '*' must be an integer >= 1")
        names += [f"{name}:{i}" for i in range(int(count))]
    seen: set[str] = set()
    for name in names:
        if name.lower() in seen:
            raise InputError(f"{option}: {name!r} appears twice (name further instances "
                             f"{name}:1, {name}:2, ...)")
        seen.add(name.lower())
    return names or None


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
