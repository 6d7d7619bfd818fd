"""``backplane console``: the web console over a store, on loopback."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any, TextIO

import trio

from ..errors import Error
from ._output import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, reason
from ._urls import UsageError, hide_dsn_secret, open_store


def add_parser(commands: Any) -> None:
    """Add ``console`` to the top-level ``commands``."""
    console = commands.add_parser(
        "console", help="runs, transcripts, live events and approvals in the browser"
    )
    console.add_argument(
        "--db", required=True, metavar="STORE_URL", help="sqlite:///... or postgresql://..."
    )
    console.add_argument("--host", default="127.0.0.1", help="where to listen (default loopback)")
    console.add_argument("--port", type=int, default=8765, help="default 8765; 0: any free port")
    console.add_argument(
        "--remote",
        action="store_true",
        help="allow a host that is not loopback (the console shows transcripts)",
    )
    console.set_defaults(handler=console_command)


def console_command(args: argparse.Namespace, out: TextIO) -> int:
    """Serve until interrupted; a PostgreSQL store's questions are answered
    through the fleet (its workers hold the runs), a SQLite store's are shown."""
    try:
        from ..console import Console, FleetAnswers, serve
    except ModuleNotFoundError as exc:
        print(f"backplane: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        store = open_store(args.db)
    except UsageError as exc:
        print(hide_dsn_secret(f"backplane: {exc}", args.db), file=sys.stderr)
        return EXIT_USAGE
    fleet = args.db.startswith(("postgresql://", "postgres://"))
    console = Console(store, answer=FleetAnswers(args.db) if fleet else None)

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with store, trio.open_nursery() as nursery:
                url = await nursery.start(
                    lambda task_status: serve(
                        console, host=args.host, port=args.port, remote=args.remote,
                        task_status=task_status,
                    )
                )  # fmt: skip
                print(f"backplane console on {url}", file=out)
                print(f"sign in: {url}{console.login_path()}", file=out, flush=True)
                async for _ in signals:  # Ctrl-C or SIGTERM: stop serving
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        unusable, rest = group.split(OSError)  # the port taken, or no such port
        if unusable is not None and rest is None:
            print(f"backplane: cannot listen there: {unusable.exceptions[0]}", file=sys.stderr)
            return EXIT_USAGE
        refused, rest = group.split(Error)
        if refused is None or rest is not None:
            raise
        error = refused.exceptions[0]
        assert isinstance(error, Error)
        print(hide_dsn_secret(f"backplane: {reason(error)}", args.db), file=sys.stderr)
        return EXIT_REJECTED
    except Error as error:
        print(hide_dsn_secret(f"backplane: {reason(error)}", args.db), file=sys.stderr)
        return EXIT_REJECTED
    return EXIT_OK
