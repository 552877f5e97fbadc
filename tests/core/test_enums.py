import enum

import numpy as np
import pytest

from gnnweave.enums import parse_enum
from gnnweave.golden.aggregate import Reduce
from gnnweave.golden.mac import MacMode
from gnnweave.golden.pipeline import Schedule


class Colour(enum.IntEnum):
    DARK_RED = 0
    BLUE = 1


def test_members_values_and_spellings():
    assert parse_enum(Colour, Colour.BLUE, "colour") is Colour.BLUE
    assert parse_enum(Colour, 1, "colour") is Colour.BLUE
    assert parse_enum(Colour, np.int64(0), "colour") is Colour.DARK_RED
    assert parse_enum(Colour, "dark-red", "colour") is Colour.DARK_RED
    assert parse_enum(Colour, "DARK_RED", "colour") is Colour.DARK_RED
    assert parse_enum(Colour, "navy", "colour", lambda c: ("navy",) if c is Colour.BLUE else ()) is Colour.BLUE


@pytest.mark.parametrize("bad", ["green", 7, True, 1.0])
def test_unknown_values_name_the_field_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"unknown colour .*; choose one of dark_red, blue"):
        parse_enum(Colour, bad, "colour")


def test_the_units_enums_share_it():
    assert Schedule.parse("1f1b-async") is Schedule.ONEF1B_ASYNC and Schedule.parse(0) is Schedule.GPIPE
    assert MacMode.parse("dw") is MacMode.DW and Reduce.parse(np.int32(2)) is Reduce.MAX
    with pytest.raises(ValueError, match="choose one of gpipe, 1f1b-flush, 1f1b-async"):
        Schedule.parse("zb-h1")
