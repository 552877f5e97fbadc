import copy
import json

import pytest

from gnnweave.hw.flow.boards import (BoardCatalogueError, CATALOGUE_PATH, boards, get_board,
                                load_catalogue, parse_catalogue)
from gnnweave.hw.configs import CONFIGS

EXPECTED = {"zcu104", "kv260", "ultra96v2", "pynqz2", "alveo-u250"}


def test_catalogue_has_every_board_and_valid_configs():
    cat = boards()
    assert EXPECTED <= set(cat)
    for key, b in cat.items():
        assert b.config in CONFIGS
        # the config's bus fits an HP port of the board
        assert CONFIGS[b.config].bus_width <= max(p.width for p in b.hp_ports)


def test_ps_types_and_address_map():
    assert get_board("zcu104").ps_type == "zynq_ultra_ps_e"
    assert get_board("zcu104").control_base == 0xA0000000
    assert get_board("pynqz2").ps_type == "processing_system7"
    assert get_board("pynqz2").control_base == 0x43C00000
    assert get_board("pynqz2").part.startswith("xc7z020")
    assert get_board("alveo-u250").ps_type == "none" and get_board("alveo-u250").control_base is None


def test_unknown_board_names_choices():
    with pytest.raises(ValueError, match="unknown board 'zcu999'.*zcu104"):
        get_board("zcu999")


def _raw():
    return json.loads(CATALOGUE_PATH.read_text())


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d["boards"]["kv260"].pop("part"), r"'kv260' field 'part': missing"),
    (lambda d: d["boards"]["zcu104"].__setitem__("ps_type", "zynq"), r"'zcu104' field 'ps_type'"),
    (lambda d: d["boards"]["pynqz2"]["resources"].__setitem__("dsp", -1), r"'pynqz2' field 'resources.dsp'"),
    (lambda d: d["boards"]["pynqz2"].__setitem__("config", "zcu104"), r"'pynqz2' field 'config'.*128-bit"),
    (lambda d: d["boards"]["kv260"].__setitem__("config", "nope"), r"'kv260' field 'config'"),
    (lambda d: d["boards"]["kv260"]["hp_ports"][1].__setitem__("width", 100), r"'kv260' field 'hp_ports\[1\].width'"),
    (lambda d: d["boards"]["alveo-u250"].__setitem__("control_base", "0x0"), r"'alveo-u250' field 'control_base'"),
    (lambda d: d["boards"]["zcu104"].__setitem__("extra", 1), r"'zcu104' field 'extra': unknown"),
])
def test_bad_catalogue_names_board_and_field(mutate, match):
    d = copy.deepcopy(_raw())
    mutate(d)
    with pytest.raises(BoardCatalogueError, match=match):
        parse_catalogue(d)


def test_bad_json_names_file(tmp_path):
    p = tmp_path / "boards.json"
    p.write_text("{ nope")
    with pytest.raises(BoardCatalogueError, match="boards.json: not valid JSON"):
        load_catalogue(p)
