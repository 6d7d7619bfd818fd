"""``backplane schema check``: preflight every tool schema of a file."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .. import schema
from ..errors import Error
from ._output import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, print_check_rows, reason
from ._tools_file import example_text, read_text, tools_from


def add_parser(commands: Any) -> None:
    """Add ``schema check`` to the top-level ``commands``."""
    schema_cmd = commands.add_parser("schema", help="the tool-input schema boundary")
    schema_sub = schema_cmd.add_subparsers(dest="schema_command", required=True)
    check = schema_sub.add_parser(
        "check", help="preflight every tool schema of a file and report each one"
    )
    source = check.add_mutually_exclusive_group(required=True)
    source.add_argument("file", nargs="?", help="a JSON tools file, or - for standard input")
    source.add_argument(
        "--example", action="store_true", help="check the example catalog shipped in the package"
    )
    check.add_argument(
        "--draft-07", action="store_true", help="also accept schemas that declare draft-07"
    )
    check.add_argument(
        "--format-assertion", action="store_true", help="treat format as an assertion"
    )
    check.add_argument(
        "--mcp-limits",
        action="store_true",
        help="server-supplied bounds: Limits.mcp() and local references only",
    )
    check.add_argument(
        "--strict", action="store_true", help="exit with status 1 when any tool is rejected"
    )
    check.set_defaults(handler=check_command)


def check_command(args: argparse.Namespace, out: TextIO) -> int:
    """Print one line per tool and a summary; status 1 only with ``--strict`` and a rejection."""
    tools = tools_from(example_text if args.example else lambda: read_text(args.file))
    if tools is None:
        return EXIT_USAGE
    options: dict[str, Any] = {}
    if args.draft_07:
        options["dialects"] = {"2020-12", "draft-07"}
    if args.format_assertion:
        options["format_assertion"] = True
    if args.mcp_limits:
        options["limits"] = schema.Limits.mcp()
        options["allow_external_refs"] = False
    rows: list[tuple[str, bool, str]] = []
    for index, tool in enumerate(tools):
        name = tool.get("name")
        label = name if isinstance(name, str) else f"#{index}"
        try:
            schema.validate_schema(tool.get("inputSchema"), **options)
        except Error as error:
            rows.append((label, False, reason(error)))
        else:
            rows.append((label, True, ""))
    print_check_rows(rows, out)
    rejected = sum(1 for _, ok, _ in rows if not ok)
    return EXIT_REJECTED if rejected and args.strict else EXIT_OK
