"""``benchmarks/results/REPORT.md``: the measured figures of every benchmark JSON, as tables.

``make bench`` calls :func:`write_report` after its benchmarks; ``python -m benchmarks.report``
rebuilds the report from the JSON already under ``benchmarks/results/``. The JSON is the
record; the report only lays it out: for each benchmark its purpose (the first line of its
module docstring), its run time, every target verdict found in it (keys ending in
``meets_target``/``meets_targets``, ``match``/``all_match``, ``passed``, ``fits``), its
top-level figures, and the markdown tables a benchmark puts in its result's ``tables``.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
VERDICT_KEYS = ("meets_target", "meets_targets", "all_meet_targets", "all_match", "match",
                "passed", "fits")
MAX_FIGURES = 24


def _purpose(name: str) -> str:
    try:
        doc = importlib.import_module(f"benchmarks.bench_{name}").__doc__ or ""
    except Exception:  # noqa: BLE001 - a bench that no longer imports still has its JSON
        return ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def verdicts(obj, path: str = "") -> list[tuple[str, object]]:
    """Every ``(dotted.path, value)`` whose last key is a verdict, depth first."""
    found = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            sub = f"{path}.{key}" if path else str(key)
            if any(str(key).endswith(v) for v in VERDICT_KEYS) and isinstance(value, bool):
                found.append((sub, value))
            else:
                found.extend(verdicts(value, sub))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found.extend(verdicts(value, f"{path}[{i}]"))
    return found


def figures(result: dict) -> list[tuple[str, object]]:
    """Top-level scalars of a result (numbers and short strings), one level into dicts."""
    out = []
    for key, value in result.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            if not isinstance(value, str) or len(value) <= 60:
                out.append((key, value))
        elif isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out.append((f"{key}.{sub}", v))
    return out[:MAX_FIGURES]


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def section(name: str, report: dict) -> str:
    lines = [f"## {name}", ""]
    purpose = _purpose(name)
    if purpose:
        lines += [purpose, ""]
    if "error" in report:
        return "\n".join(lines + [f"**failed:** `{report['error']}`", ""])
    result = report.get("result", report)
    if "seconds" in report:
        lines += [f"Run time: {report['seconds']:.0f} s", ""]
    found = verdicts(result)
    if found:
        lines += ["| verdict | value |", "|---|---|"]
        lines += [f"| `{path}` | {'yes' if ok else '**no**'} |" for path, ok in found]
        lines.append("")
    if isinstance(result, dict):
        figs = figures(result)
        if figs:
            lines += ["| figure | value |", "|---|---|"]
            lines += [f"| `{k}` | {_fmt(v)} |" for k, v in figs]
            lines.append("")
    if isinstance(result, dict) and isinstance(result.get("tables"), list):
        for table in result["tables"]:   # markdown the benchmark laid out itself
            lines += [str(table), ""]
    lines += [f"Full record: `{name}.json`.", ""]
    return "\n".join(lines)


def write_report(results: Path = RESULTS) -> Path:
    """Write ``REPORT.md`` from every ``<name>.json`` in ``results`` (``summary.json`` aside)."""
    results = Path(results)
    names = sorted(p.stem for p in results.glob("*.json") if p.stem != "summary")
    parts = ["# Benchmark report", "",
             "Generated from the JSON beside this file by `benchmarks/report.py`; "
             "`make bench` rewrites it. Speed figures of one run are comparable only with "
             "figures measured side by side in the same run.", ""]
    for name in names:
        try:
            report = json.loads((results / f"{name}.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            parts += [f"## {name}", "", f"**unreadable:** `{exc}`", ""]
            continue
        parts.append(section(name, report if isinstance(report, dict) else {"result": report}))
    out = results / "REPORT.md"
    out.write_text("\n".join(parts))
    return out


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    results = Path(args[0]) if args else RESULTS
    if not results.is_dir():
        print(f"error: no benchmark results folder {results}", file=sys.stderr)
        return 2
    print(f"wrote {write_report(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
