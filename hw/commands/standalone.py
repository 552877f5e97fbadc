"""``python -m`` entry points of the build flow, mounted the way :mod:`gnnweave.cli` mounts
its commands.

A flow module a user can run alone (``python -m gnnweave.hw.estimate``, ``python -m
gnnweave.hw.flow.report``, ``python -m gnnweave.hw.flow.bitstream``) is a command like the
``gnnweave`` ones: ``add_arguments(parser)`` declares its options and ``run(args)`` does the
work and returns the exit status. :func:`main` builds the parser the same way (every default
shown) and, like ``gnnweave``, prints a :class:`~gnnweave.errors.GnnweaveError` as one line
and exits 2; any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys

from gnnweave.errors import GnnweaveError


def build_parser(command, prog: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (anything with ``add_arguments``), named ``prog``; its
    description is the first line of the command's docstring."""
    from gnnweave.cli import HelpFormatter
    doc = (command.__doc__ or "").strip()
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0] if doc else None,
                                     formatter_class=HelpFormatter)
    command.add_arguments(parser)
    return parser


def main(command, prog: str, argv=None) -> int:
    """Parse ``argv`` with ``command``'s options and run it; the exit status."""
    args = build_parser(command, prog).parse_args(argv)
    try:
        return command.run(args)
    except GnnweaveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
