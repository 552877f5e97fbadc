"""The require/skip helpers: a skip where a part is missing, a failure under its switch."""
import pytest

from tests import conftest


@pytest.mark.parametrize("switch, outcome", [(None, pytest.skip.Exception),
                                             ("1", pytest.fail.Exception)])
def test_a_missing_icarus_skips_unless_its_own_switch_is_set(monkeypatch, switch, outcome):
    from gnnweave.sim import toolchain
    monkeypatch.setattr(toolchain, "have_icarus", lambda: False)
    monkeypatch.setenv("GNNWEAVE_REQUIRE_DATA", "1")     # the data switch is not icarus's
    if switch is None:
        monkeypatch.delenv("GNNWEAVE_REQUIRE_ICARUS", raising=False)
    else:
        monkeypatch.setenv("GNNWEAVE_REQUIRE_ICARUS", switch)
    with pytest.raises(outcome, match="Icarus Verilog"):
        conftest.require_icarus()


@pytest.mark.parametrize("switch, outcome", [(None, pytest.skip.Exception),
                                             ("1", pytest.fail.Exception)])
def test_a_missing_dataset_skips_unless_data_is_required(monkeypatch, tmp_path, switch, outcome):
    monkeypatch.setenv("GNNWEAVE_DATA", str(tmp_path))
    if switch is None:
        monkeypatch.delenv("GNNWEAVE_REQUIRE_DATA", raising=False)
    else:
        monkeypatch.setenv("GNNWEAVE_REQUIRE_DATA", switch)
    with pytest.raises(outcome, match="cora"):
        conftest.require_dataset("cora")


def test_an_optional_module_follows_its_purposes_switch(monkeypatch):
    monkeypatch.setenv("GNNWEAVE_REQUIRE_TORCH", "1")
    monkeypatch.delenv("GNNWEAVE_REQUIRE_PYNQ", raising=False)
    monkeypatch.setitem(conftest.MODULE_PURPOSE, "no_such_module_x", "pynq")
    with pytest.raises(pytest.skip.Exception):
        conftest.require("no_such_module_x")
    monkeypatch.setitem(conftest.MODULE_PURPOSE, "no_such_module_x", "torch")
    with pytest.raises(pytest.fail.Exception, match="GNNWEAVE_REQUIRE_TORCH=1"):
        conftest.require("no_such_module_x")
    assert conftest.require("json").dumps([]) == "[]"
