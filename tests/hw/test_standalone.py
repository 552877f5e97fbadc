"""hw/commands/standalone.py: the flow's python -m entry points behave like gnnweave's."""
import pytest

from gnnweave.errors import InputError
from gnnweave.hw.commands import standalone


class Echo:
    """Print the value, or fail the way it is told to."""

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("value")
        parser.add_argument("--times", type=int, default=1, help="how often")

    @staticmethod
    def run(args):
        if args.value == "bad":
            raise InputError("value: 'bad' is not allowed")
        if args.value == "bug":
            raise RuntimeError("a bug")
        print(args.value * args.times)
        return 0


def test_runs_with_the_commands_options(capsys):
    assert standalone.main(Echo, "echo", ["ab", "--times", "2"]) == 0
    assert capsys.readouterr().out == "abab\n"


def test_a_user_error_is_one_line_and_a_bug_keeps_its_traceback(capsys):
    assert standalone.main(Echo, "echo", ["bad"]) == 2
    assert capsys.readouterr().err == "error: value: 'bad' is not allowed\n"
    with pytest.raises(RuntimeError, match="a bug"):
        standalone.main(Echo, "echo", ["bug"])


def test_help_names_the_command_and_shows_defaults():
    text = standalone.build_parser(Echo, "echo").format_help()
    assert text.startswith("usage: echo") and "Print the value" in text
    assert "(default: 1)" in text
