"""``make bench``: run every benchmark, one JSON per benchmark under benchmarks/results/.

``python -m benchmarks.run [NAME ...]`` runs a subset (names: golden, aggregator, device,
train, partition, planner, mac, pipeline, fuzz, dist, cyclemodel). Each benchmark measures its figures side by side in
one run and reports them with the target it is compared with.
"""
from __future__ import annotations

import importlib
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

from tqdm import tqdm

from benchmarks.report import write_report

BENCHMARKS = ["golden", "planner", "partition", "train", "aggregator", "device", "mac", "pipeline", "fuzz",
              "dist", "cyclemodel"]
RESULTS = Path(__file__).resolve().parent / "results"


def run_one(name: str, out_dir: Path) -> dict:
    module = importlib.import_module(f"benchmarks.bench_{name}")
    params = inspect.signature(module.run).parameters
    start = time.perf_counter()
    result = module.run(out_dir) if params else module.run()
    return {"seconds": round(time.perf_counter() - start, 2), "result": result}


def main(argv=None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary, failed = {}, []
    for name in tqdm(names, desc="benchmarks", unit="bench"):
        out_dir = RESULTS / name
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            report = run_one(name, out_dir)
        except Exception as exc:  # noqa: BLE001 - one failing bench must not hide the others
            traceback.print_exc()
            report = {"error": f"{type(exc).__name__}: {exc}"}
            failed.append(name)
        (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1, default=str))
        summary[name] = report
        tqdm.write(f"{name}: {'FAILED ' + report['error'] if 'error' in report else 'done'} "
                   f"-> {RESULTS / (name + '.json')}")
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"wrote {RESULTS / 'summary.json'} and {write_report(RESULTS)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
