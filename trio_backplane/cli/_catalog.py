"""``backplane catalog admit``: admit every tool of a file as one batch."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from .. import schema, tools
from ..errors import Error
from ._output import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, print_admission_table, reason
from ._tools_file import read_text, tools_from


def add_parser(commands: Any) -> None:
    """Add ``catalog admit`` to the top-level ``commands``."""
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
    admit.set_defaults(handler=admit_command)


class _NoopBackend:
    """The backend each admitted tool gets: admission only checks its shape."""

    async def execute(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover
        return None


def _admit(records: list[Any], args: argparse.Namespace) -> tools.AdmittedBundle:
    options = schema.SchemaOptions(dialects={"2020-12", "draft-07"}) if args.draft_07 else None
    backend = _NoopBackend()
    descriptors = [
        tools.ToolDescriptor(
            name=record.get("name"),
            schema=record.get("inputSchema"),
            backend=backend,
            description=record.get("description") or "",
            schema_options=options,
        )
        for record in records
    ]
    registry = tools.ToolRegistry(descriptors)
    authority = tools.Authority.for_registry(registry, caller="backplane", run_id="cli")
    return tools.admit_batch(registry, authority, mode=args.mode)


def admit_command(args: argparse.Namespace, out: TextIO) -> int:
    """Print the accepted and rejected tools; status 1 when the batch is refused."""
    records = tools_from(lambda: read_text(args.file))
    if records is None:
        return EXIT_USAGE
    try:
        bundle = _admit(records, args)
    except Error as error:
        print(f"batch refused: {reason(error)}", file=out)
        return EXIT_REJECTED
    warned = [name for name in bundle.accepted if not tools.is_mcp_name(name)]
    warned += [r.name for r in bundle.rejected if not tools.is_mcp_name(r.name)]
    for name in sorted(warned):
        print(
            f"backplane: warning: tool name {name!r} is outside MCP's advisory [A-Za-z0-9_.-] set",
            file=sys.stderr,
        )
    rows = [(name, "accepted", "") for name in bundle.accepted]
    rows += [(r.name, "rejected", reason(r.error)) for r in bundle.rejected]
    rows.sort(key=lambda row: row[0])
    summary = f"{len(rows)} tools: {len(bundle.accepted)} accepted, {len(bundle.rejected)} rejected"
    print_admission_table(rows, set(warned), summary, out)
    return EXIT_OK
