"""The benchmark report lays out what the JSON records, verdicts included."""
import json

from benchmarks.report import figures, verdicts, write_report


def test_verdicts_found_at_any_depth_and_only_booleans():
    result = {"meets_target": True, "graphs": {"cora": {"match": False, "cycles": 9}},
              "cases": [{"meets_target": True}], "fits": "n/a"}
    assert verdicts(result) == [("meets_target", True), ("graphs.cora.match", False),
                                ("cases[0].meets_target", True)]


def test_figures_are_top_level_scalars_and_one_level_of_dicts():
    figs = dict(figures({"seconds": 3.5, "name": "x", "flag": True, "nested": {"a": 1, "b": "s"},
                         "rows": [1, 2]}))
    assert figs == {"seconds": 3.5, "name": "x", "nested.a": 1}


def test_report_written_from_results(tmp_path):
    (tmp_path / "golden.json").write_text(json.dumps(
        {"seconds": 12.0, "result": {"meets_target": False, "ratio": 0.41}}))
    (tmp_path / "mac.json").write_text(json.dumps({"error": "RuntimeError: build failed"}))
    (tmp_path / "summary.json").write_text("{}")
    text = write_report(tmp_path).read_text()
    assert "## golden" in text and "| `meets_target` | **no** |" in text
    assert "| `ratio` | 0.41 |" in text
    assert "## mac" in text and "build failed" in text
    assert "## summary" not in text
