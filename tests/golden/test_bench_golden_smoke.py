"""benchmarks/bench_golden.run works end to end (tiny graph; the real figures come from
`make bench`)."""
import json

from benchmarks.bench_golden import run


def test_bench_golden_runs_and_writes_json(tmp_path):
    result = run(tmp_path, scale=9, edge_factor=4, feat_dim=8, repeats=1)
    written = json.loads((tmp_path / "bench_golden.json").read_text())
    assert written == json.loads(json.dumps(result))
    for key in ("golden_seconds", "scipy_seconds", "ratio_golden_speed_vs_scipy",
                "golden_mean_seconds", "golden_max_seconds"):
        assert result[key] > 0
    assert result["ratio_golden_speed_vs_scipy"] == result["scipy_seconds"] / result["golden_seconds"]
    assert result["golden_sum_equals_scipy_where_unsaturated"] is True
    assert (result["nodes"], result["edges"]) == (512, 2048)
