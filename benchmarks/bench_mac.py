"""MacArray utilization on the RTL (Amaranth simulator), against the >= 0.85 target.

Tile-aligned problems in every mode on a 4 x 4 array, plus one odd-size problem for
reference: ``mac_utilization = useful MACs / (busy cycles x cells)`` from the unit's
own counters, every result checked bit for bit against golden.

    python -m benchmarks.bench_mac [OUT_DIR]     # writes OUT_DIR/bench_mac.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tqdm import tqdm

from gnnweave.sim.mac_bench import verify_mac

TARGET = 0.85
CASES = [(16, 16, 64, "fwd"), (16, 16, 64, "dx"), (16, 16, 64, "dw"), (32, 32, 32, "fwd"),
         (13, 7, 29, "fwd")]


def run() -> dict:
    rows = []
    for m, n, k, mode in tqdm(CASES, desc="MacArray"):
        r = verify_mac(m, n, k, mode, seed=m + n + k)
        aligned = m % 4 == 0 and n % 4 == 0
        rows.append({k2: r[k2] for k2 in ("mode", "rows", "cols", "depth", "match", "cycles",
                                          "busy_cycles", "mac_ops", "mac_utilization")}
                    | {"tile_aligned": aligned})
    aligned = [r for r in rows if r["tile_aligned"]]
    return {"bench": "mac", "array": [4, 4], "target_utilization": TARGET, "cases": rows,
            "all_match": all(r["match"] for r in rows),
            "min_aligned_utilization": min(r["mac_utilization"] for r in aligned),
            "meets_target": all(r["mac_utilization"] >= TARGET for r in aligned)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else Path("benchmarks/results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run()
    (out_dir / "bench_mac.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}))
    return 0 if result["all_match"] and result["meets_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
