"""``backplane worker``, ``backplane submit`` and ``backplane wait``: the
fleet on PostgreSQL from a shell."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any, TextIO

import trio

from ..errors import Error, ErrorClass
from ..fleet import Worker, continue_run, load_app, resolve, submit, wait, watch
from ._output import EXIT_OK, EXIT_REJECTED, reason
from ._urls import hide_dsn_secret


def add_parser(commands: Any) -> None:
    """Add ``worker``, ``submit`` and ``wait`` to the top-level ``commands``."""
    worker = commands.add_parser(
        "worker", help="claim and run queued runs of an app's agents (SIGTERM drains)"
    )
    worker.add_argument("--db", required=True, metavar="DSN", help="a postgresql:// DSN")
    worker.add_argument("--app", required=True, metavar="MODULE", help="package.module[:app]")
    worker.add_argument("--concurrency", type=int, default=4, metavar="N")
    worker.add_argument("--lease", type=float, default=10.0, metavar="SECONDS")
    worker.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS")
    worker.add_argument("--on-uncertain", choices=("settle", "park"), default="settle")
    worker.add_argument("--worker-id", metavar="ID")
    worker.add_argument(
        "--idle-bound",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a run waiting this long for a person's approval is released for any "
        "worker to resume once answered",
    )
    worker.add_argument(
        "--agent-limit",
        action="append",
        default=[],
        metavar="AGENT=N",
        help="at most N runs of AGENT at once (repeatable)",
    )
    sub = commands.add_parser("submit", help="queue a run of an agent; prints its run id")
    sub.add_argument("--db", required=True, metavar="DSN")
    sub.add_argument("--agent", required=True)
    sub.add_argument("--run-id", metavar="RUN_ID")
    sub.add_argument("prompt")
    waiting = commands.add_parser("wait", help="wait until a submitted run is finished")
    waiting.add_argument("--db", required=True, metavar="DSN")
    waiting.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")
    waiting.add_argument("run_id", metavar="RUN_ID")
    for command, run in ((worker, _worker), (sub, _submit), (waiting, _wait)):
        command.add_argument("--schema", default="public", help="the database schema")
        command.set_defaults(handler=fleet_command, run=run)


def add_runs(runs_sub: Any) -> None:
    """Add ``runs resolve`` and ``runs watch`` to the ``runs`` subcommands."""
    runs_resolve = runs_sub.add_parser(
        "resolve",
        help="answer a fleet run's pending interaction from any host (postgresql:// only)",
    )
    runs_resolve.add_argument("db", metavar="DSN")
    runs_resolve.add_argument("run_id", metavar="RUN_ID")
    runs_resolve.add_argument("interaction_id", metavar="INTERACTION_ID")
    runs_resolve.add_argument("answer", metavar="ANSWER", help="JSON, or else a string")
    runs_resolve.add_argument("--schema", default="public")
    runs_resolve.set_defaults(handler=fleet_command, run=_resolve)
    runs_watch = runs_sub.add_parser(
        "watch",
        help="print a fleet run's stored events as they come, until it is finished",
    )
    runs_watch.add_argument("db", metavar="DSN")
    runs_watch.add_argument("run_id", metavar="RUN_ID")
    runs_watch.add_argument("--schema", default="public")
    runs_watch.set_defaults(handler=fleet_command, run=_watch)


async def continue_from(store: Any, args: argparse.Namespace) -> tuple[str, str]:
    """``runs recover --continue``: the run id that went on (the run's own
    when resumed, else its replacement's) and its final state."""
    if not args.app or not args.agent:
        raise Error(ErrorClass.VALIDATION, "--continue needs --app MODULE and --agent NAME")
    app = load_app(args.app)
    new_run = f"{args.run_id}#continued"
    spec = await app.spec(args.agent, new_run)
    return await continue_run(store, args.run_id, spec, new_run_id=new_run)


def fleet_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run one fleet command (``args.run``); status 1 for a refusal."""
    try:
        trio.run(args.run, args, out)
    except Error as error:
        print(hide_dsn_secret(f"backplane: {reason(error)}", args.db), file=sys.stderr)
        return EXIT_REJECTED
    return EXIT_OK


async def _worker(args: argparse.Namespace, out: TextIO) -> None:
    worker = Worker(
        args.db,
        load_app(args.app),
        schema=args.schema,
        concurrency=args.concurrency,
        lease=args.lease,
        drain_timeout=args.drain_timeout,
        on_uncertain=args.on_uncertain,
        worker_id=args.worker_id,
        agent_limits=_limits(args.agent_limit),
        idle_bound=args.idle_bound,
    )
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def drain_on_signal() -> None:
                async for _ in signals:
                    worker.drain()  # stop claiming; finish what is held within the bound
                    return

            nursery.start_soon(drain_on_signal)
            print(f"worker {worker.worker_id} serving {', '.join(worker.app.names)}", file=out)
            out.flush()
            await worker.run()
            nursery.cancel_scope.cancel()


def _limits(given: list[str]) -> dict[str, int]:
    limits: dict[str, int] = {}
    for item in given:
        name, _, count = item.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise Error(ErrorClass.VALIDATION, f"--agent-limit wants AGENT=N, not {item!r}")
        limits[name] = int(count)
    return limits


async def _submit(args: argparse.Namespace, out: TextIO) -> None:
    run_id = await submit(
        args.db, agent=args.agent, prompt=args.prompt, run_id=args.run_id, schema=args.schema
    )
    print(run_id, file=out)


async def _wait(args: argparse.Namespace, out: TextIO) -> None:
    status = await wait(args.db, args.run_id, schema=args.schema, timeout=args.timeout)
    print(json.dumps(status), file=out)


async def _resolve(args: argparse.Namespace, out: TextIO) -> None:
    """Commit the answer (JSON, or else a string) for the worker holding the run."""
    try:
        answer = json.loads(args.answer)
    except ValueError:
        answer = args.answer
    await resolve(args.db, args.run_id, args.interaction_id, answer, schema=args.schema)
    print(f"answer committed for {args.run_id} ({args.interaction_id})", file=out)


async def _watch(args: argparse.Namespace, out: TextIO) -> None:
    """One JSON line a stored event: its type, time and the state it left."""
    async for event in watch(args.db, args.run_id, schema=args.schema):
        line = {
            "type": event.type,
            "occurred_at": event.occurred_at,
            "state": (event.payload or {}).get("state"),
        }
        print(json.dumps(line), file=out, flush=True)
