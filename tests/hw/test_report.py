"""hw/flow/report.py: the generated resource table of docs/estimate.md."""
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
    assert report.main(["--only", "nope:kv260"]) == 2
    assert "--only nope:kv260: not a row" in capsys.readouterr().err
