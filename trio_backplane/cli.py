"""The ``backplane`` command line.

``backplane schema check FILE`` preflights a file of tools (a JSON array of
``{name, inputSchema}`` records or an MCP ``tools/list`` result) through the
same boundary the runtime uses and prints one line per tool and a summary.
``--example`` checks the example catalog shipped inside the package.
``backplane catalog admit FILE [--mode quarantine]`` admits the same file as
one batch (``trio_backplane.tools.admit_batch``) and prints a table of the
accepted and rejected tools.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any, TextIO

from . import schema, tools
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


class _NoopBackend:
    """The backend ``catalog admit`` gives each tool: admission only checks its shape."""

    async def execute(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover
        return None


def _field(record: dict[str, Any], key: str) -> Any:
    return record.get(key)


def _admit(args: argparse.Namespace, out: TextIO) -> int:
    try:
        records = load_tools(json.loads(_read(args.file)))
    except (OSError, ValueError, Error) as exc:
        print(f"backplane: cannot read tools: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = schema.SchemaOptions(dialects={"2020-12", "draft-07"}) if args.draft_07 else None
    backend = _NoopBackend()
    try:
        descriptors = [
            tools.ToolDescriptor(
                name=_field(record, "name"),
                schema=record.get("inputSchema"),
                backend=backend,
                description=record.get("description") or "",
                schema_options=options,
            )
            for record in records
        ]
        registry = tools.ToolRegistry(descriptors)
        authority = tools.Authority.for_registry(registry, caller="backplane", run_id="cli")
        bundle = tools.admit_batch(registry, authority, mode=args.mode)
    except Error as error:
        print(f"batch refused: {_reason(error)}", file=out)
        return EXIT_REJECTED
    warned = [name for name in bundle.accepted if not tools.is_mcp_name(name)]
    warned += [r.name for r in bundle.rejected if not tools.is_mcp_name(r.name)]
    for name in sorted(warned):
        print(
            f"backplane: warning: tool name {name!r} is outside MCP's advisory [A-Za-z0-9_.-] set",
            file=sys.stderr,
        )
    rows = [(name, "accepted", "") for name in bundle.accepted]
    rows += [(r.name, "rejected", _reason(r.error)) for r in bundle.rejected]
    rows.sort(key=lambda row: row[0])
    summary = f"{len(rows)} tools: {len(bundle.accepted)} accepted, {len(bundle.rejected)} rejected"
    _print_table(rows, set(warned), summary, out)
    return EXIT_OK


def _print_table(
    rows: list[tuple[str, str, str]], warned: set[str], summary: str, out: TextIO
) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the cli extra is optional: plain lines then
        for name, status, reason in rows:
            mark = " (!)" if name in warned else ""
            print(f"{status}  {name}{mark}" + (f"  {reason}" if reason else ""), file=out)
        print(summary, file=out)
        return
    table = Table(title="tool admission", caption=summary)
    table.add_column("tool", overflow="fold")
    table.add_column("status")
    table.add_column("class and reason", overflow="fold")
    for name, status, reason in rows:
        label = f"{name} (!)" if name in warned else name
        table.add_row(label, status, reason)
    Console(file=out, highlight=False, width=120).print(table)


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
    catalog_cmd = commands.add_parser("catalog", help="tool catalogs")
    catalog_sub = catalog_cmd.add_subparsers(dest="catalog_command", required=True)
    admit = catalog_sub.add_parser(
        "admit", help="admit every tool of a file as one batch and report the bundle"
    )
    admit.add_argument("file", help="a JSON tools file, or - for standard input")
    admit.add_argument(
        "--mode",
        choices=sorted(tools.MODES),
        default="strict",
        help="strict fails the batch on any refusal; quarantine omits unsupported schemas",
    )
    admit.add_argument(
        "--draft-07", action="store_true", help="also accept schemas that declare draft-07"
    )
    admit.set_defaults(handler=_admit)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.handler(args, out or sys.stdout)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
