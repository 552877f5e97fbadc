"""hw/flow/report.py: the generated resource tables of docs/estimate.md."""
import json

import pytest

from gnnweave.hw.flow import report


def _result(config, board, fits=True):
    yosys_units = {"aggregator/datapath": {"bram36": 3.5, "uram": 0, "dsp": 9, "lut": 1200},
                   "aggregator/check": {"bram36": 0, "uram": 0, "dsp": 0, "lut": 300},
                   "mac_array/datapath": {"bram36": 32, "uram": 8, "dsp": 64, "lut": 9000},
                   "control": {"bram36": 0, "uram": 0, "dsp": 0, "lut": 800},
                   "(glue)": {"bram36": 0, "uram": 0, "dsp": 0, "lut": 10}}
    total = {k: sum(u[k] for u in yosys_units.values()) for k in ("bram36", "uram", "dsp", "lut")}
    budget_units = {"aggregator": {"bram36": 3.5, "uram": 0, "dsp": 9},
                    "mac_array": {"bram36": 32, "uram": 8, "dsp": 64}}
    return {"config": config, "board": board, "yosys_fits": fits, "seconds": 1.0,
            "yosys": {"units": yosys_units, "total": total},
            "budget": {"units": budget_units, "fits": fits,
                       "total": {"bram36": 35.5, "uram": 8, "dsp": 73}}}


def _estimate(config, board, *, dsp):
    """What ``python -m gnnweave.hw.estimate CONFIG --board B --json --out FILE`` writes."""
    units = {"aggregator/walk": {"lut": 100, "ff": 50, "dsp": dsp, "bram36": 2.5, "uram": 0},
             "control": {"lut": 10, "ff": 5, "dsp": 0, "bram36": 0, "uram": 0}}
    total = {k: sum(u[k] for u in units.values()) for k in report.KINDS}
    return {"config": config, "board": board, "method": "m", "family": "xc7",
            "exact": list(report.KINDS), "units": units, "total": total,
            "seconds": {"total": 120.0}}


def _budget(dsp, fits=True):
    return {"method": "b", "units": {"aggregator": {"bram36": 2.5, "uram": 0, "dsp": dsp}},
            "total": {"bram36": 2.5, "uram": 0, "dsp": dsp}, "fits": fits, "margin": 0.9,
            "fits_by_resource": {"bram36": True, "uram": True, "dsp": fits}, "seconds": 2.5}


def test_table_groups_subunits_and_puts_the_budget_beside():
    text = report.table([_result("kv260", "kv260"), _result("pynqz2", "pynqz2", fits=False)])
    lines = text.splitlines()
    assert lines[0].startswith("| build | board | unit | BRAM36 | URAM | DSP | LUT |")
    assert "| `kv260` | kv260 | aggregator | 3.5 | 0 | 9 | 1,500 | 3.5 / 0 / 9 |" in lines
    assert "| `kv260` | kv260 | mac_array | 32 | 8 | 64 | 9,000 | 32 / 8 / 64 |" in lines
    # units outside the three (control, glue) are summed as the rest, without a budget
    assert "| `kv260` | kv260 | (rest) | 0 | 0 | 0 | 810 | 0 / 0 / 0 |" in lines
    assert any("**total** (Yosys fits, budget fits) | 35.5 | 8 | 73 | 11,310" in ln for ln in lines)
    assert any("`pynqz2` | pynqz2 | **total** (Yosys does NOT fit, budget does NOT fit)" in ln
               for ln in lines)


def test_write_replaces_only_between_the_markers(tmp_path):
    doc = tmp_path / "estimate.md"
    doc.write_text(f"# head\n\n{report.BEGIN}\nold\n{report.END}\n\ntail\n")
    report.write(doc, f"{report.BEGIN}\nnew\n{report.END}")
    assert doc.read_text() == f"# head\n\n{report.BEGIN}\nnew\n{report.END}\n\ntail\n"
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    with pytest.raises(ValueError, match="no generated table markers"):
        report.write(bare, "x")


def test_rows_are_every_board_on_its_configuration():
    rows = report.rows()
    assert ("default", "kv260") in rows
    assert {("zcu104", "zcu104"), ("kv260", "kv260"), ("ultra96v2", "ultra96v2"),
            ("pynqz2", "pynqz2"), ("alveo-u250", "alveo-u250")} <= set(rows)


def test_unknown_row_is_one_line(capsys):
    assert report.main(["--measure", "--only", "nope:kv260"]) == 2
    assert "--only nope:kv260: not a row" in capsys.readouterr().err


def test_rows_from_estimate_files_fit_or_name_the_resource_over(tmp_path):
    # pynqz2 has 220 DSPs (bitstreams/boards.json): 200 fit, 230 do not
    for name, dsp in (("fits", 200), ("over", 230)):
        (tmp_path / f"{name}.json").write_text(json.dumps(_estimate("pynqz2", "pynqz2", dsp=dsp)))
        (tmp_path / f"{name}.budget.json").write_text(json.dumps(_budget(dsp, fits=dsp < 198)))
    fits = report.from_files(tmp_path / "fits.json", commit="abc1234")
    over = report.from_files(tmp_path / "over.json", commit="abc1234")
    assert fits["yosys_fits"] and fits["yosys_over"] == []
    assert not over["yosys_fits"] and over["yosys_over"] == ["dsp"]
    assert fits["capacity"]["dsp"] == 220 and fits["commit"] == "abc1234"
    lines = report.fit_table([fits, over]).splitlines()
    assert lines[0].startswith("| build | board | LUT | FF | DSP | BRAM36 | URAM | Yosys fits |")
    assert lines[2] == ("| `pynqz2` | pynqz2 | 110 / 53,200 | 55 / 106,400 | 200 / 220 | 2.5 / 140 "
                        "| 0 / 0 | yes | 2.5 / 0 / 200 | **no** (dsp over) | 2.5 | abc1234 |")
    assert "| 230 / 220 |" in lines[3] and "| **no** (dsp over) |" in lines[3]


def test_add_stores_rows_and_writes_the_doc_from_them(tmp_path, capsys):
    (tmp_path / "e.json").write_text(json.dumps(_estimate("pynqz2", "pynqz2", dsp=9)))
    (tmp_path / "e.budget.json").write_text(json.dumps(_budget(9)))
    doc = tmp_path / "estimate.md"
    doc.write_text(f"# head\n{report.BEGIN}\nold\n{report.END}\n"
                   f"{report.TIMING_BEGIN}\nold\n{report.TIMING_END}\n")
    results = tmp_path / "rows.json"
    args = ["--add", str(tmp_path / "e.json"), "--commit", "abc1234", "--results", str(results),
            "--write", str(doc)]
    assert report.main(args) == 0
    stored = json.loads(results.read_text())["rows"]
    assert [(r["config"], r["board"], r["commit"]) for r in stored] == [("pynqz2", "pynqz2", "abc1234")]
    text = doc.read_text()
    assert "| `pynqz2` | pynqz2 | 110 / 53,200 |" in text and "old" not in text
    assert "Not measured yet: `default` on kv260" in text
    assert "No ECP5 figures kept yet" in text
    # the same row again replaces it; the doc is written from the file alone
    assert report.main(args) == 0
    assert len(json.loads(results.read_text())["rows"]) == 1
    assert report.main(["--results", str(results), "--write", str(doc)]) == 0
    assert doc.read_text() == text


def test_add_without_the_budget_file_is_one_line(tmp_path, capsys):
    (tmp_path / "e.json").write_text(json.dumps(_estimate("pynqz2", "pynqz2", dsp=9)))
    assert report.main(["--add", str(tmp_path / "e.json"), "--results", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --add {tmp_path / 'e.json'}: ") and "e.budget.json not found" in err


def test_timing_table_from_a_bench_result(tmp_path):
    timing = {"commit": "abc1234", "device": "LFE5U-85F", "target_mhz": 100.0,
              "load_average_start": 3.5, "units": {
                  "aggregator": {"config": "small", "stage": "post-route", "fmax_mhz": 41.2,
                                 "meets_target": False, "seconds": {"nextpnr": 900.0, "nextpnr_cpu": 850.0}},
                  "pipeline": {"config": "small", "stage": None, "fmax_mhz": None,
                               "meets_target": None, "seconds": {"nextpnr": 30.0},
                               "stopped": "does not fit the LFE5U-85F: no MULT18X18D left to place"}}}
    bench = tmp_path / "bench_timing.json"
    bench.write_text(json.dumps(timing))
    doc = tmp_path / "estimate.md"
    doc.write_text(f"{report.BEGIN}\n{report.END}\n{report.TIMING_BEGIN}\nold\n{report.TIMING_END}\n")
    assert report.main(["--add-timing", str(bench), "--results", str(tmp_path / "r.json"),
                        "--write", str(doc)]) == 0
    kept = json.loads((tmp_path / report.TIMING_NAME).read_text())
    assert kept["rows"][0] == dict(timing["units"]["aggregator"], unit="aggregator",
                                   commit="abc1234", load_average_start=3.5)
    text = doc.read_text()
    assert "| aggregator | `small` | -6 | 10 | out of context | post-route | 41.2 | **no** | 900 | 850 | - | 1 " \
           "| abc1234 |" in text
    assert "| pipeline | `small` | -6 | 10 | out of context | none | - | - | 30 | - | does not fit the LFE5U-85F" \
        in text

    # a later run of one unit replaces that unit's row only, under its own commit
    later = {"commit": "def5678", "device": "LFE5U-85F", "target_mhz": 100.0,
             "load_average_start": 1.0, "units": {
                 "pipeline": {"config": "small", "stage": "post-route", "fmax_mhz": 55.0,
                              "meets_target": False, "seed": 3, "seconds": {"nextpnr": 2000.0},
                              "printed": ["Info: Max frequency for clock '$glbnet$clk$TRELLIS_IO_IN'"
                                          ": 55.00 MHz (FAIL at 100.00 MHz)"]}}}
    bench.write_text(json.dumps(later))
    assert report.main(["--add-timing", str(bench), "--results", str(tmp_path / "r.json"),
                        "--write", str(doc)]) == 0
    kept = json.loads((tmp_path / report.TIMING_NAME).read_text())
    assert [(r["unit"], r["config"], r["commit"]) for r in kept["rows"]] == [
        ("aggregator", "small", "abc1234"), ("pipeline", "small", "def5678")]
    text = doc.read_text()
    assert "| aggregator | `small` | -6 | 10 | out of context | post-route | 41.2 | **no** | 900 | 850 | - | 1 " \
           "| abc1234 |" in text
    assert "| pipeline | `small` | -6 | 10 | in a port wrapper | post-route | 55 | **no** | 2000 | - | - | 3 " \
           "| def5678 |" in text

    # a unit of another build is a row beside the first build's, in BUILDS order
    other = dict(later, commit="0a1b2c3", units={"pipeline": dict(later["units"]["pipeline"],
                                                                 config="pynqz2", fmax_mhz=76.26)})
    bench.write_text(json.dumps(other))
    assert report.main(["--add-timing", str(bench), "--results", str(tmp_path / "r.json"),
                        "--write", str(doc)]) == 0
    kept = json.loads((tmp_path / report.TIMING_NAME).read_text())
    assert [(r["unit"], r["config"], r["commit"]) for r in kept["rows"]] == [
        ("aggregator", "small", "abc1234"), ("pipeline", "small", "def5678"),
        ("pipeline", "pynqz2", "0a1b2c3")]
    lines = doc.read_text().splitlines()
    assert lines.index(next(l for l in lines if l.startswith("| pipeline | `small`"))) + 1 == \
        lines.index(next(l for l in lines if l.startswith("| pipeline | `pynqz2` |")))

    # and a unit routed at another speed grade is a row of its own beside the -6 one
    faster = dict(later, commit="1f2e3d4", speed_grade=8,
                  units={"pipeline": dict(later["units"]["pipeline"], speed_grade=8, fmax_mhz=62.0)})
    bench.write_text(json.dumps(faster))
    assert report.main(["--add-timing", str(bench), "--results", str(tmp_path / "r.json"),
                        "--write", str(doc)]) == 0
    kept = json.loads((tmp_path / report.TIMING_NAME).read_text())
    assert [(r["unit"], r["config"], r.get("speed_grade", 6), r["commit"]) for r in kept["rows"]] == [
        ("aggregator", "small", 6, "abc1234"), ("pipeline", "small", 6, "def5678"),
        ("pipeline", "small", 8, "1f2e3d4"), ("pipeline", "pynqz2", 6, "0a1b2c3")]
    assert "speed_grade" not in kept
    assert "| pipeline | `small` | -8 | 10 | in a port wrapper | post-route | 62 |" in doc.read_text()


def test_timing_row_of_a_seed_sweep_names_the_other_seeds():
    unit = {"config": "small", "stage": "post-route", "fmax_mhz": 87.62, "meets_target": False,
            "seed": 2, "seconds": {"nextpnr": 443.0},
            "seeds": [{"seed": 1, "stage": "post-route", "fmax_mhz": 83.24, "late_endpoints": 247},
                      {"seed": 2, "stage": "post-route", "fmax_mhz": 87.62, "late_endpoints": 220},
                      {"seed": 3, "stage": "post-route", "fmax_mhz": 68.24, "late_endpoints": 928}]}
    row = report.timing_table({"commit": "abc1234", "units": {"mac_array": unit}}).splitlines()[2]
    assert "| 2 (1: 83.24, 3: 68.24) | abc1234 |" in row


def test_timing_row_of_a_weight_sweep_names_each_routes_weight():
    def route(seed, weight, fmax):
        return {"seed": seed, "placer_timing_weight": weight, "stage": "post-route",
                "fmax_mhz": fmax, "late_endpoints": 0}
    unit = {"config": "pynqz2", "stage": "post-route", "fmax_mhz": 108.64, "meets_target": True,
            "seed": 3, "placer_timing_weight": 30, "seconds": {"nextpnr": 400.0},
            "seeds": [route(3, 10, 83.18), route(1, 30, 97.37), route(3, 30, 108.64)]}
    row = report.timing_table({"commit": "abc1234", "units": {"aggregator": unit}}).splitlines()[2]
    assert row.startswith("| aggregator | `pynqz2` | -6 | 30 | ")
    assert "| 3 (3 at weight 10: 83.18, 1: 97.37) | abc1234 |" in row


def test_a_budget_alone_is_a_row_without_yosys_figures(tmp_path):
    bud = dict(_budget(9), config="pynqz2", board="pynqz2")
    (tmp_path / "e.budget.json").write_text(json.dumps(bud))
    r = report.from_files(tmp_path / "e.json", commit="abc1234")
    assert r["yosys"] is None and r["yosys_fits"] is None
    line = report.fit_table([r]).splitlines()[2]
    assert line == ("| `pynqz2` | pynqz2 | - / 53,200 | - / 106,400 | - / 220 | - / 140 | - / 0 | - "
                    "| 2.5 / 0 / 9 | yes | 2.5 | abc1234 |")
    assert "Budget only, the Yosys run not finished: `pynqz2` on pynqz2" in report.section([r])
