"""The ``backplane`` command line.

``schema check`` and ``catalog admit`` check a tools file, ``demo`` runs a
whole conversation on SQLite, ``runs list|show|recover`` read a store
given by URL, and ``worker``, ``submit`` and ``wait`` run a fleet on
PostgreSQL.  Exit statuses: 0 success, 1 a refusal, 2 a usage mistake,
130 interrupted, 141 the output's reader went away.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from . import _catalog, _console, _demo, _fleet, _runs, _schema
from ._output import EXIT_BROKEN_PIPE
from ._output import Out as _Out  # noqa: F401  (importable here, as before the split)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; each sets ``handler(args, out) -> status``."""
    parser = argparse.ArgumentParser(
        prog="backplane",
        description="The trio_backplane command line: check tool schemas, admit"
        " catalogs, run the demo, read and recover stored runs.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (_schema, _catalog, _demo, _runs, _fleet, _console):
        group.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    try:
        status: int = args.handler(args, out)
        out.flush()  # here, so a reader that went away is seen here
    except BrokenPipeError:
        _discard_output(out)
        return EXIT_BROKEN_PIPE
    return status


def _discard_output(out: TextIO) -> None:
    """Point ``out``'s file descriptor at ``/dev/null``, so what is still
    buffered is dropped at exit instead of raising again (the recipe of
    Python's ``signal`` documentation for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a StringIO): nothing to drop
        pass
