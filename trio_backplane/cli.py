"""The ``backplane`` command line.

``backplane schema check FILE`` preflights a file of tools (a JSON array of
``{name, inputSchema}`` records or an MCP ``tools/list`` result) through the
same boundary the runtime uses and prints one line per tool and a summary.
``--example`` checks the example catalog shipped inside the package.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any, TextIO

from . import schema
from .errors import Error, ErrorClass

__all__ = ["main"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2


def _example_text() -> str:
    return resources.files("trio_backplane").joinpath("examples/tools.json").read_text("utf-8")


def load_tools(data: Any) -> list[dict[str, Any]]:
    """The tool records of a catalog file: an array, ``{"tools": [...]}`` or a
    JSON-RPC response whose ``result`` is one."""
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        data = data["result"]
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise Error(
            ErrorClass.VALIDATION,
            "a tools file is a JSON array of {name, inputSchema} objects "
            "or an MCP tools/list result",
        )
    return data


def _reason(error: Error) -> str:
    reason = error.details.get("reason")
    extra = [
        f"{k}={error.details[k]}"
        for k in ("schema", "reference", "path")
        if error.details.get(k) not in (None, "")
    ]
    head = f"{error.error_class.value}"
    if reason:
        head += f" ({reason})"
    return " ".join([head + ":", error.message, *extra])


def _check(args: argparse.Namespace, out: TextIO) -> int:
    try:
        text = _example_text() if args.example else _read(args.file)
        tools = load_tools(json.loads(text))
    except (OSError, ValueError, Error) as exc:
        print(f"backplane: cannot read tools: {exc}", file=sys.stderr)
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
            rows.append((label, False, _reason(error)))
        else:
            rows.append((label, True, ""))
    _print_rows(rows, out)
    rejected = sum(1 for _, ok, _ in rows if not ok)
    return EXIT_REJECTED if rejected and args.strict else EXIT_OK


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _print_rows(rows: list[tuple[str, bool, str]], out: TextIO) -> None:
    accepted = sum(1 for _, ok, _ in rows if ok)
    summary = f"{len(rows)} tools: {accepted} accepted, {len(rows) - accepted} rejected"
    try:
        from rich.console import Console
    except ImportError:  # the cli extra is optional: plain lines then
        for name, ok, reason in rows:
            print(
                f"{'accepted' if ok else 'rejected'}  {name}" + (f"  {reason}" if reason else ""),
                file=out,
            )
        print(summary, file=out)
        return
    console = Console(file=out, highlight=False, soft_wrap=True)
    for name, ok, reason in rows:
        if ok:
            console.print(f"[green]accepted[/green]  {name}", markup=True)
        else:
            console.print(f"[red]rejected[/red]  {name}  {reason}", markup=True)
    console.print(summary)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="backplane", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
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
    check.set_defaults(handler=_check)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.handler(args, out or sys.stdout)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
