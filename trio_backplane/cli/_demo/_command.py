"""``backplane demo``: run the demo conversation on SQLite, showing its events live."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import secrets
import shlex
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

import attrs
import trio

from ...errors import Error
from ...resources import LocalCommand, ResourceRegistry, command_tools
from ...runtime import open_conversation
from ...store import SQLiteStore
from ...tools import Authority, ToolRegistry
from .._output import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, Out, error_text, reason
from .._urls import UsageError, store_url
from ._model import PROMPT, DemoProvider
from ._spans import SpanTree
from ._tools import registry as demo_registry
from ._view import EventView, ask_stdin

_SYSTEM_PROMPT = (
    "You are the trio_backplane demo assistant. Use read_package_file to read "
    "__init__.py of the package, search_glossary to look up 'approval', then "
    "write_note (title 'backplane-tour') to save a two-sentence note, and finish "
    "with a one-paragraph summary."
)


def add_parser(commands: Any) -> None:
    """Add ``demo`` to the top-level ``commands``."""
    demo_cmd = commands.add_parser(
        "demo",
        help="run a whole conversation with real tools and an approval, on SQLite",
        description="Run a whole conversation on the embedded default (a SQLite file) with a "
        "scripted model (or an OpenAI-compatible endpoint) and its three demo tools; "
        "write_note asks for approval. Shows the event stream live and the final status; "
        "exit status 0 when the run completed.",
    )
    demo_cmd.add_argument(
        "--db",
        default="backplane-demo.sqlite3",
        metavar="PATH",
        help="the SQLite store (default: ./backplane-demo.sqlite3)",
    )
    demo_cmd.add_argument(
        "--approve",
        choices=("yes", "no", "ask"),
        default=None,
        help="answer the approval: ask at the terminal, or yes/no "
        "(default: ask when standard input is a terminal, otherwise yes)",
    )
    demo_cmd.add_argument(
        "--provider",
        choices=("scripted", "openai", "anthropic"),
        default="scripted",
        help="the model: the scripted one (default), an OpenAI-compatible endpoint "
        "(API key from OPENAI_API_KEY) or Anthropic's Messages API (ANTHROPIC_API_KEY)",
    )
    demo_cmd.add_argument(
        "--base-url", metavar="URL", help="the API root (anthropic: api.anthropic.com if not given)"
    )
    demo_cmd.add_argument("--model", metavar="M", help="the model name")
    demo_cmd.add_argument(
        "--notes",
        metavar="DIR",
        help="where write_note writes (default: backplane-demo-notes beside the store)",
    )
    demo_cmd.add_argument(
        "--events", metavar="FILE", help="also write every event as a JSON line to FILE"
    )
    demo_cmd.add_argument(
        "--pace",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="pause between the scripted model's words (default 0.02)",
    )
    demo_cmd.add_argument(
        "--commands",
        action="store_true",
        help="also give the model exec_command and write_stdin (Linux), each under "
        "approval; the scripted model lists the package and runs python -c",
    )
    demo_cmd.add_argument(
        "--otel", action="store_true", help="print the run's OpenTelemetry spans as a tree"
    )
    demo_cmd.set_defaults(handler=demo_command)


def new_run_id() -> str:
    """A fresh, sortable run id: ``demo-<UTC time>-<random>``."""
    return f"demo-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


@attrs.frozen
class _Session:
    """What one demo run is given."""

    args: argparse.Namespace
    out: Out
    provider: Any
    provider_context: dict[str, Any] | None
    label: str
    approve: str
    log: TextIO | None
    spans: SpanTree | None = None


def demo_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run the demo; status 0 when the run completed, 2 for a usage mistake, 130 on Ctrl-C."""
    if args.provider == "openai" and not (args.base_url and args.model):
        print("backplane: --provider openai needs --base-url URL and --model M", file=sys.stderr)
        return EXIT_USAGE
    if args.provider == "anthropic" and not args.model:
        print("backplane: --provider anthropic needs --model M", file=sys.stderr)
        return EXIT_USAGE
    if not 0 <= args.pace <= 5:  # NaN too
        print("backplane: --pace must be between 0 and 5 seconds", file=sys.stderr)
        return EXIT_USAGE
    approve = args.approve or ("ask" if sys.stdin.isatty() else "yes")
    try:
        provider, context, label = _provider(args)
        spans = SpanTree() if args.otel else None
    except UsageError as exc:
        print(f"backplane: {exc}", file=sys.stderr)
        return EXIT_USAGE
    view = Out(out)
    try:
        log = open(args.events, "w", encoding="utf-8") if args.events else None  # noqa: SIM115
    except OSError as exc:
        print(f"backplane: cannot write --events: {exc}", file=sys.stderr)
        return EXIT_USAGE
    session = _Session(args, view, provider, context, label, approve, log, spans)
    try:
        return trio.run(functools.partial(_run, session))
    except KeyboardInterrupt:
        view.stop()
        print("backplane: interrupted; the run was cancelled", file=sys.stderr)
        return 130
    finally:
        if log is not None:
            with contextlib.suppress(OSError):  # a write that failed was reported
                log.close()


def _provider(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None, str]:
    """The model, its ``provider_context`` and how the header names it."""
    if args.provider == "scripted":
        command = _demo_command() if args.commands else None
        return (
            DemoProvider(pace=args.pace, command=command),
            None,
            "scripted model (backplane demo)",
        )
    try:
        provider, variable = _http_provider(args)
    except ImportError as exc:  # pragma: no cover - httpx ships with the cli extra
        raise UsageError(f"--provider {args.provider} needs httpx ({exc})") from None
    except Error as error:
        raise UsageError(error.message) from None
    key = os.environ.get(variable) or None
    # The key goes only into the trusted provider_context: never the store,
    # an event, or a line printed here.
    context = {"api_key": key} if key else None
    # the whole userinfo hidden: a bare token@ is a secret too
    shown_url = re.sub(r"(://)[^/\s]*@", r"\1***@", provider.options.url)  # to the last @
    label = f"{args.model} at {shown_url}" + ("" if key else f" (no {variable})")
    return provider, context, label


def _http_provider(args: argparse.Namespace) -> tuple[Any, str]:
    """The HTTP provider ``--provider`` names, and its key's variable."""
    if args.provider == "anthropic":
        from ...adapters.anthropic import AnthropicProvider

        base_url = args.base_url or "https://api.anthropic.com"
        return (
            AnthropicProvider(args.model, base_url=base_url, system=_SYSTEM_PROMPT),
            "ANTHROPIC_API_KEY",
        )
    from ...adapters.openai import OpenAIProvider

    return OpenAIProvider(args.base_url, args.model, system=_SYSTEM_PROMPT), "OPENAI_API_KEY"


async def _run(session: _Session) -> int:
    out, db = session.out, session.args.db
    notes = session.args.notes or os.path.join(
        os.path.dirname(os.path.abspath(db)), "backplane-demo-notes"
    )
    registry = demo_registry(notes)
    run_id = new_run_id()
    authority = Authority.for_registry(registry, caller="backplane-demo", run_id=run_id)
    out.line(("backplane demo ", "bold"), (run_id, "bold cyan"))
    out.line(("  store ", "dim"), store_url(db), ("   model ", "dim"), session.label)
    out.line(
        ("  tools ", "dim"),
        ", ".join(d.name for d in registry),
        ("   approvals ", "dim"),
        session.approve,
    )
    out.spin("opening the store…")
    try:
        snapshot, view = await _converse(session, registry, authority, run_id, notes)
    except (Error, BaseExceptionGroup) as exc:
        error = _only_error(exc)
        if error is None:
            # Ctrl-C and a reader closing our output go on bare, to
            # demo_command's and main's handlers.
            bare = _leaf(exc, (KeyboardInterrupt, BrokenPipeError))
            if bare is not None:
                raise bare from None
            raise
        out.stop()
        print(f"backplane: demo failed: {reason(error)}", file=sys.stderr)
        return EXIT_REJECTED
    finally:
        out.stop()
    _final_status(out, snapshot, db, run_id)
    if session.spans is not None:
        session.spans.show(out)
    if view.log_error is not None:
        print(f"backplane: cannot write --events: {view.log_error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if snapshot.run.state == "completed" else EXIT_REJECTED


async def _converse(
    session: _Session, registry: ToolRegistry, authority: Authority, run_id: str, notes: str
) -> tuple[Any, EventView]:
    """Prompt the demo conversation and wait until it settles.

    The conversation opens inside a nursery: its refusal (a ``--db`` that
    is no store, say) arrives wrapped in an exception group.
    """
    async with contextlib.AsyncExitStack() as stack:
        if session.args.commands:
            registry, authority = await _with_commands(stack, registry, run_id, notes)
        return await _open(session, registry, authority, run_id, notes)


async def _open(
    session: _Session, registry: ToolRegistry, authority: Authority, run_id: str, notes: str
) -> tuple[Any, EventView]:
    provider = session.args.provider
    async with (
        SQLiteStore(session.args.db) as store,
        trio.open_nursery() as nursery,
        open_conversation(
            run_id,
            store=store,
            provider=session.provider,
            registry=registry,
            authority=authority,
            provider_context=session.provider_context,
            context={"demo": {"notes": notes, "provider": provider}},
            work=20,
            run_timeout=600.0,
            effect_timeout=30.0 if provider == "scripted" else 120.0,
            telemetry=None if session.spans is None else session.spans.telemetry,
        ) as conversation,
    ):
        view = EventView(session.out, conversation, session.approve, ask_stdin, session.log)
        nursery.start_soon(view.consume, conversation.subscribe())
        session.out.stop()
        await conversation.prompt(PROMPT)
        snapshot = await conversation.wait_settled()
    return snapshot, view


def _demo_command() -> str:
    """What the scripted model runs with ``--commands``."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python = 'import sys; print("python", sys.version.split()[0])'
    return f"ls {shlex.quote(package)} | head -n 6 && python3 -c {shlex.quote(python)}"


async def _with_commands(
    stack: contextlib.AsyncExitStack, registry: ToolRegistry, run_id: str, notes: str
) -> tuple[ToolRegistry, Authority]:
    """The demo's tools with ``exec_command`` and ``write_stdin`` added (run
    in the notes directory), and the authority granting them."""
    command = await stack.enter_async_context(LocalCommand())
    os.makedirs(notes, exist_ok=True)
    tools = command_tools(ResourceRegistry(), command, workspace=notes)
    registry = ToolRegistry([*registry, *tools])
    return registry, Authority.for_registry(registry, caller="backplane-demo", run_id=run_id)


def _leaf(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of one of ``kinds`` in ``exc`` or its groups."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for kind in kinds:  # in the order of ``kinds``: Ctrl-C first
            found, _ = exc.split(kind)
            if found is not None:
                first: BaseException = found
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                return first
    return None


def _only_error(exc: BaseException) -> Error | None:
    """``exc`` if it is an ``Error``; the first of a group whose every
    leaf is one; else ``None``."""
    if isinstance(exc, Error):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_only_error(inner) for inner in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


def _final_status(out: Out, snapshot: Any, db: str, run_id: str) -> None:
    record = snapshot.run
    roles: dict[str, int] = {}
    for message in snapshot.messages:
        role = message.get("role", "?") if isinstance(message, Mapping) else "?"
        roles[role] = roles.get(role, 0) + 1
    rows = [
        ("run id", run_id),
        ("phase", snapshot.phase),
        ("run state", record.state),
        ("work used", f"{record.budget.used} of {record.budget.quota}"),
        (
            "messages",
            f"{len(snapshot.messages)} ("
            + ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
            + ")",
        ),
        ("provider responses", str(len(snapshot.usage))),
    ]
    outcome = record.outcome or {}
    if outcome.get("error"):
        rows.append(("error", error_text(outcome["error"])))
    elif snapshot.last_error is not None:
        rows.append(("error", reason(snapshot.last_error)))
    out.table("final status", ("", ""), rows, header=False)
    out.line(("inspect it: ", "dim"), f"backplane runs show {store_url(db)} {run_id}")
