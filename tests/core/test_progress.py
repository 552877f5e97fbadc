"""A long step without a count still says what it is doing and how long it took."""
import pytest

from gnnweave.progress import stage


def test_stage_names_itself_and_its_time(capsys):
    with stage("Verilator build of top", note="cached afterwards"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "Verilator build of top (cached afterwards) ..."
    assert err[1].startswith("Verilator build of top: done in ") and err[1].endswith(" s")


def test_a_failing_stage_says_it_stopped(capsys):
    with pytest.raises(RuntimeError):
        with stage("native build"):
            raise RuntimeError("g++ failed")
    assert "native build: stopped in" in capsys.readouterr().err


def test_silenced_by_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("GNNWEAVE_PROGRESS", "0")
    with stage("anything"):
        pass
    assert capsys.readouterr().err == ""
