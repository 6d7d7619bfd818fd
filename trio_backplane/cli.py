"""The ``backplane`` command line.

``backplane schema check FILE`` preflights a file of tools (a JSON array of
``{name, inputSchema}`` records or an MCP ``tools/list`` result) through the
same boundary the runtime uses and prints one line per tool and a summary.
``--example`` checks the example catalog shipped inside the package.
``backplane catalog admit FILE [--mode quarantine]`` admits the same file as
one batch (``trio_backplane.tools.admit_batch``) and prints a table of the
accepted and rejected tools.

``backplane demo`` runs a whole conversation on the embedded default (a
SQLite file in the working directory) with a scripted model (or an
OpenAI-compatible endpoint) and the real tools of ``trio_backplane.demo``,
one of which asks for approval; it shows the event stream live and the final
status.  ``backplane runs list|show|recover STORE_URL`` read a store given by
a URL: ``sqlite:///relative/path``, ``sqlite:////absolute/path``, a bare path,
or a ``postgresql://`` DSN.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any, Final, TextIO

import trio

from . import schema, tools
from .errors import Error, ErrorClass
from .kernel import RUN_STATES

__all__ = ["main"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
#: Standard output's reader went away (128 + SIGPIPE, as a shell reports it).
EXIT_BROKEN_PIPE = 141


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
    cause = error.details.get("cause")
    if isinstance(cause, str) and cause:
        extra.append(f"({_redact_dsn(cause.splitlines()[0])[:200]})")
    head = f"{error.error_class.value}"
    if reason:
        head += f" ({reason})"
    return " ".join([head + ":", error.message, *extra])


def _tools_from(read: Callable[[], str]) -> list[Any] | None:
    """The tool definitions of the text ``read`` gives, or ``None`` once
    the reason they cannot be read is on stderr (exit status 2)."""
    try:
        tools: list[Any] = load_tools(json.loads(read()))
    except RecursionError:
        reason = "JSON nested too deeply"
    except (OSError, ValueError, Error) as exc:
        reason = str(exc)
    else:
        return tools
    print(f"backplane: cannot read tools: {reason}", file=sys.stderr)
    return None


def _check(args: argparse.Namespace, out: TextIO) -> int:
    tools = _tools_from(_example_text if args.example else lambda: _read(args.file))
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
    rows = [(_clean(name), ok, _clean(reason)) for name, ok, reason in rows]
    try:
        from rich.console import Console
        from rich.text import Text
    except ImportError:  # the cli extra is optional: plain lines then
        for name, ok, reason in rows:
            print(
                f"{'accepted' if ok else 'rejected'}  {name}" + (f"  {reason}" if reason else ""),
                file=out,
            )
        print(summary, file=out)
        return
    console = _pipe_to_main(Console(file=out, highlight=False, soft_wrap=True))
    for name, ok, reason in rows:  # names and reasons are text, never markup
        if ok:
            console.print(Text.assemble(("accepted", "green"), "  ", name))
        else:
            console.print(Text.assemble(("rejected", "red"), "  ", name, "  ", reason))
    console.print(summary)


class _NoopBackend:
    """The backend ``catalog admit`` gives each tool: admission only checks its shape."""

    async def execute(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover
        return None


def _field(record: dict[str, Any], key: str) -> Any:
    return record.get(key)


def _admit(args: argparse.Namespace, out: TextIO) -> int:
    records = _tools_from(lambda: _read(args.file))
    if records is None:
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
    rows = [(_clean(name), status, _clean(reason)) for name, status, reason in rows]
    warned = {_clean(name) for name in warned}
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # the cli extra is optional: plain lines then
        for name, status, reason in rows:
            mark = " (!)" if name in warned else ""
            print(f"{status}  {name}{mark}" + (f"  {reason}" if reason else ""), file=out)
        print(summary, file=out)
        return
    table = Table(title="tool admission", caption=Text(summary))
    table.add_column("tool", overflow="fold")
    table.add_column("status")
    table.add_column("class and reason", overflow="fold")
    for name, status, reason in rows:  # names and reasons are text, never markup
        label = f"{name} (!)" if name in warned else name
        table.add_row(Text(label), status, Text(reason))
    _pipe_to_main(Console(file=out, highlight=False, width=120)).print(table)


def _pipe_to_main(console: Any) -> Any:
    """``console`` leaving a broken pipe to :func:`main` (rich's own answer
    is exit status 1, which means "rejected" here)."""

    def broken_pipe() -> None:
        console.quiet = True
        raise BrokenPipeError

    console.on_broken_pipe = broken_pipe
    return console


# -- shared output ---------------------------------------------------------------

#: Rows a table prints (a run's 100,000 intents would take minutes to lay
#: out, and nobody reads them in a terminal): the latest ones.
_MAX_TABLE_ROWS: Final = 500

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

Segment = str | tuple[str, str]


def _clean(text: Any) -> str:
    """Printable text: control characters (terminal escapes included)
    dropped, a lone surrogate (which no output encodes) escaped."""
    cleaned = _CONTROL.sub("", str(text))
    if not cleaned.isascii():
        cleaned = cleaned.encode("utf-8", "backslashreplace").decode("utf-8")
    return cleaned


def _short(value: Any, limit: int = 160) -> str:
    if not isinstance(value, str):
        value = json.dumps(_plain(value), ensure_ascii=False, default=str)
    text = " ".join(_clean(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain(value: Any) -> Any:
    from .kernel import thaw

    return thaw(value)


class _Out:
    """Rich output when the ``cli`` extra is installed, plain lines otherwise.

    Lines are built from segments (``text`` or ``(text, style)``), never parsed
    as markup, so model or tool text can never inject styles; control
    characters are dropped either way.
    """

    def __init__(self, out: TextIO) -> None:
        self.file = out
        self.console: Any = None
        self._status: Any = None
        try:
            from rich.console import Console
        except ImportError:  # the cli extra is optional: plain lines then
            return
        terminal = bool(getattr(out, "isatty", lambda: False)())
        self.console = _pipe_to_main(
            Console(file=out, highlight=False, soft_wrap=True, width=None if terminal else 120)
        )

    @property
    def interactive(self) -> bool:
        return self.console is not None and bool(self.console.is_terminal)

    def line(self, *segments: Segment) -> None:
        if self.console is None:
            text = "".join(s if isinstance(s, str) else s[0] for s in segments)
            print(_clean(text), file=self.file, flush=True)
            return
        from rich.text import Text

        parts = [(_clean(s), "") if isinstance(s, str) else (_clean(s[0]), s[1]) for s in segments]
        self.console.print(Text.assemble(*parts))

    def table(
        self,
        title: str,
        columns: Sequence[str],
        rows: Sequence[Sequence[Any]],
        caption: str = "",
        *,
        header: bool = True,
    ) -> None:
        if len(rows) > _MAX_TABLE_ROWS:  # the latest rows: a run's recent history
            hidden = len(rows) - _MAX_TABLE_ROWS
            rows = rows[hidden:]
            note = f"{hidden} earlier rows not shown (--json prints them all)"
            caption = f"{caption}; {note}" if caption else note
        if self.console is None:
            print(_clean(title), file=self.file)
            for row in rows:
                print("  " + "  ".join(_clean(c) for c in row), file=self.file)
            if caption:
                print(_clean(caption), file=self.file)
            return
        from rich.table import Table
        from rich.text import Text

        # The title holds a run id, the caption counts: text, never markup.
        table = Table(
            title=Text(_clean(title)),
            caption=Text(_clean(caption)) if caption else None,
            title_justify="left",
            show_header=header,
        )
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(Text(_clean(c)) for c in row))
        self.console.print(table)

    # a spinner for waits (only on a terminal)

    def spin(self, text: str) -> None:
        if not self.interactive:
            return
        from rich.text import Text

        shown = Text(_clean(text))  # model text (a tool name): never markup
        if self._status is None:
            self._status = self.console.status(shown)
            self._status.start()
        else:
            self._status.update(shown)

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def progress(self, description: str, total: int) -> Any:
        """A context manager yielding ``advance()``: a progress bar on a terminal."""
        return _progress(self, description, total)


@contextlib.contextmanager
def _progress(out: _Out, description: str, total: int) -> Iterator[Callable[[], None]]:
    if not out.interactive or total < 2:
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(console=out.console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


# -- stores by URL -----------------------------------------------------------------


class _UsageError(Exception):
    """A command-line mistake: reported on stderr, exit status 2."""


def _redact_dsn(url: str) -> str:
    """A DSN for display: the password (up to the last ``@``, which may be a
    raw ``@`` in the password) is never printed."""
    return re.sub(r"(://[^:/@\s]*:)\S*@", r"\1***@", url)


def _dsn_secret_fragments(url: str) -> list[str]:
    """What of a DSN's password may reach an error text, longest first.

    The password runs from the userinfo's first ``:`` to the last ``@``; a
    raw ``@`` (or ``:``, ``/``) in it makes a driver take part of it for the
    host, port or database and print that part.  So every run of its pieces
    between such delimiters (three characters or more), as written and
    percent-decoded, is a fragment to hide.
    """
    _, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return []
    _, colon, secret = rest[: rest.rindex("@")].partition(":")
    if not colon or not secret:
        return []
    bounds = [0, *(m.end() for m in re.finditer(r"[@:/?#]", secret))]
    ends = [*(m.start() for m in re.finditer(r"[@:/?#]", secret)), len(secret)]
    fragments = {secret}
    for i, start in enumerate(bounds):
        for end in ends[i:]:
            if end - start >= 3:
                fragments.add(secret[start:end])
    fragments |= {urllib.parse.unquote(f) for f in fragments}
    return sorted(fragments, key=len, reverse=True)


def _hide_dsn_secret(text: str, url: str) -> str:
    """``text`` with every fragment of ``url``'s password replaced by ``***``:
    anywhere when it is long, else only where it stands alone (not inside a
    word), so a short password neither mangles the message nor shows itself
    by the holes it leaves."""
    for fragment in _dsn_secret_fragments(url):
        if len(fragment) >= _ANYWHERE:
            text = text.replace(fragment, "***")
        else:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(fragment)}(?![A-Za-z0-9])", "***", text)
    return _redact_dsn(text)


#: A password fragment this long is hidden wherever it appears.
_ANYWHERE: Final = 8


def store_path(url: str) -> str:
    """The SQLite file of a store URL: ``sqlite:///relative``, ``sqlite:////absolute``
    (SQLAlchemy's convention) or a bare path."""
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise _UsageError(
                "a SQLite store URL is sqlite:///relative/path or sqlite:////absolute/path"
            )
        return url[len("sqlite:///") :]
    return url


def open_store(url: str, *, must_exist: bool = True, writing: bool = False) -> Any:
    """The store a URL names (not yet connected): ``SQLiteStore`` or
    ``PostgresStore``.  One that must exist, opened only to read, changes
    nothing where it is (no tables, no layout upgrade, no journal switch)."""
    from .store import PostgresStore, SQLiteStore

    if url.startswith(("postgresql://", "postgres://")):
        try:
            # reading a store that must exist creates nothing in a database
            # that holds none (a read would then report "0 runs")
            return PostgresStore(url, create_tables=not must_exist)
        except Error as error:
            raise _UsageError(f"cannot use PostgreSQL: {error.message}") from None
    if "://" in url and not url.startswith("sqlite:"):
        scheme = url.split("://", 1)[0]
        raise _UsageError(
            f"unsupported store URL scheme {scheme!r}: use sqlite:///path or postgresql://..."
        )
    path = store_path(url)
    if must_exist and not os.path.isfile(path):
        hint = ""
        if url.startswith("sqlite:///") and not path.startswith("/"):
            hint = f" (sqlite:/// takes a relative path; for /{path} write sqlite:////{path})"
        raise _UsageError(f"no SQLite store at {path!r}{hint}")
    if must_exist:
        _check_store_file(path)
    return SQLiteStore(path, create_tables=writing or not must_exist)


def _check_store_file(path: str) -> None:
    """Refuse a file that is not a trio_backplane store, looking without
    writing (``mode=ro``): ``SQLiteStore`` would add its tables to another
    application's database (and switch it to WAL), or make an empty file a
    store, and a read would then report "0 runs"."""
    import sqlite3

    uri = "file:" + urllib.parse.quote(os.fsencode(os.path.abspath(path))) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=10.0)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            version = None
            if {"meta", "runs", "run_events"} <= tables:
                version = conn.execute(
                    "SELECT value FROM meta WHERE key = 'layout_version'"
                ).fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        if "not a database" not in str(exc):
            raise _UsageError(f"cannot read {path!r}: {exc}") from None
        version = None
    except UnicodeDecodeError as exc:  # a damaged file: its schema text is not UTF-8
        raise _UsageError(f"cannot read {path!r}: damaged ({exc.reason})") from None
    if version is None or not (str(version[0]).isascii() and str(version[0]).isdigit()):
        raise _UsageError(f"{path!r} is not a trio_backplane store (no layout version)")


def _store_url(path: str) -> str:
    """The URL ``open_store`` maps back to ``path`` (an absolute path gets four slashes)."""
    return "sqlite:///" + path


# -- backplane demo -----------------------------------------------------------------

_SYSTEM_PROMPT = (
    "You are the trio_backplane demo assistant. Use read_package_file to read "
    "__init__.py of the package, search_glossary to look up 'approval', then "
    "write_note (title 'backplane-tour') to save a two-sentence note, and finish "
    "with a one-paragraph summary."
)


class _EventView:
    """Shows the event stream, one line per event (text deltas accumulated into
    one line), and answers permission interactions."""

    def __init__(
        self,
        out: _Out,
        conversation: Any,
        approve: str,
        ask: Callable[[str], str],
        log: TextIO | None,
    ) -> None:
        self.out = out
        self.conversation = conversation
        self.approve = approve
        self.ask = ask
        self.log = log
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.answers: list[str] = []
        #: why the ``--events`` log stopped (a full disk, ...): it is
        #: reported once the run is over, which it does not stop
        self.log_error: OSError | None = None

    def _flush(self) -> None:
        if self.thinking:
            self.out.line(("thinking ▸ ", "dim"), ("".join(self.thinking).strip(), "dim italic"))
            self.thinking.clear()
        if self.text:
            self.out.line(("assistant ▸ ", "bold magenta"), "".join(self.text).strip())
            self.text.clear()

    async def consume(self, events: Any) -> None:
        async with events:
            async for event in events:
                if self.log is not None:
                    try:
                        self.log.write(_event_json(event) + "\n")
                        self.log.flush()
                    except OSError as exc:
                        self.log_error, self.log = exc, None
                await self.show(event)
        self.out.stop()
        self._flush()

    async def show(self, event: Any) -> None:
        kind, payload = event.type, event.payload
        out = self.out
        if kind == "content_text_delta":
            self.text.append(str(payload.get("delta", "")))
            out.spin("assistant ▸ " + "".join(self.text)[-70:])
            return
        if kind == "content_thinking_delta":
            self.thinking.append(str(payload.get("delta", "")))
            out.spin("thinking…")
            return
        if kind in ("tool_call_arguments_delta", "usage_updated"):
            return
        if kind == "tool_call_started":
            call = payload.get("tool_call") or {}
            out.spin(f"the model is writing a call to {_short(call.get('name'), 60)}…")
            return
        out.stop()
        self._flush()
        if kind == "prompt_consumed":
            message = payload.get("message") or {}
            out.line(("user ▸ ", "bold cyan"), _short(message.get("content"), 400))
        elif kind == "response_started":
            out.spin("waiting for the model…")
        elif kind == "tool_call_completed":
            call = payload.get("tool_call") or {}
            out.line(
                ("call ", "yellow"),
                (_short(call.get("name"), 80), "bold"),
                " ",
                _short(call.get("arguments")),
            )
        elif kind == "response_completed":
            usage = payload.get("usage")
            out.line(
                ("response completed", "dim"), (f"  usage {_short(usage)}" if usage else "", "dim")
            )
        elif kind == "response_failed":
            out.line(("response failed  ", "bold red"), _error_text(payload.get("error")))
        elif kind == "tool_started":
            invocation = payload.get("invocation") or {}
            name = _short(invocation.get("tool_name"), 80)
            out.line(("tool ▶ ", "blue"), (name, "bold"), " ", _short(invocation.get("arguments")))
            out.spin(f"running {name}…")
        elif kind == "tool_update":
            out.line(("  · update ", "dim"), (_short(dict(payload)), "dim"))
        elif kind == "tool_completed":
            message = payload.get("message") or {}
            result = message.get("result") or {}
            name = _short(message.get("name"), 80)
            if result.get("is_error"):
                out.line(
                    ("tool ✗ ", "red"),
                    (name, "bold"),
                    "  ",
                    _error_text(result.get("error")) or _short(result.get("content")),
                )
            else:
                out.line(
                    ("tool ✓ ", "green"), (name, "bold"), "  ", _short(result.get("content"), 120)
                )
        elif kind == "interaction_requested":
            await self._interaction(payload)
        elif kind == "interaction_resolved":
            out.line(
                ("interaction resolved ", "dim"), (_short(payload.get("interaction_id")), "dim")
            )
        elif kind in ("turn_completed", "run_completed"):
            out.line((kind.replace("_", " "), "bold green"))
        elif kind in ("turn_failed", "run_failed"):
            error = (payload.get("outcome") or {}).get("error") or payload.get("error")
            out.line((kind.replace("_", " ") + "  ", "bold red"), _error_text(error))
        elif kind == "run_cancelled":
            out.line(("run cancelled  ", "bold red"), _short(payload.get("state")))
        elif kind == "storage_failed":
            out.line(("storage failed  ", "bold red"), _error_text(payload.get("error")))
        elif kind == "events_dropped":
            out.line((f"({payload.get('count')} transient events dropped)", "dim"))
        elif kind == "prompt_rejected":
            out.line(("prompt rejected  ", "red"), _error_text(payload.get("error")))
        else:
            out.line((kind, "dim"), " ", (_short(dict(payload)), "dim"))

    async def _interaction(self, payload: Any) -> None:
        interaction_id = payload.get("interaction_id")
        request = payload.get("request") or {}
        operation = request.get("operation") or {}
        if request.get("kind") != "permission":
            self.out.line(
                ("interaction ", "yellow"), _short(dict(request)), " (answered: unsupported)"
            )
            answer = "unsupported"
        else:
            tool = _short(operation.get("tool_name"), 80)
            self.out.line(
                ("approval needed ", "bold yellow"),
                (tool, "bold"),
                " ",
                _short(operation.get("arguments"), 400),
            )
            if self.approve == "ask":
                reply = await trio.to_thread.run_sync(
                    self.ask, f"approve {tool}? [y/N] ", abandon_on_cancel=True
                )
                approved = reply.strip().lower() in ("y", "yes")
            else:
                approved = self.approve == "yes"
                self.out.line(
                    ("  --approve ", "dim"), (self.approve, "bold"), (" answers for you", "dim")
                )
            answer = "approved" if approved else "denied"
            self.out.line(("  → ", "dim"), (answer, "bold green" if approved else "bold red"))
        self.answers.append(answer)
        try:
            await self.conversation.resolve(interaction_id, answer)
        except Error as error:
            self.out.line(("resolve refused  ", "red"), _reason(error))


def _error_text(error: Any) -> str:
    if not isinstance(error, Mapping):
        return _short(error) if error else ""
    text = f"{error.get('class')}: {error.get('message')}"
    details = error.get("details")
    reason = details.get("reason") if isinstance(details, Mapping) else None
    return _short(f"{text} ({reason})" if reason else text, 300)


def _event_json(event: Any) -> str:
    return json.dumps(
        {
            "type": event.type,
            "payload": _plain(event.payload),
            "run_id": event.run_id,
            "incarnation": event.incarnation,
            "turn_id": event.turn_id,
            "step_id": event.step_id,
            "attempt_id": event.attempt_id,
        },
        ensure_ascii=False,
        default=str,
    )


def _ask_stdin(prompt: str) -> str:
    """Ask on the terminal (or read a line of standard input); EOF answers no."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        sys.stdout.write("\n")
    return line


def _demo_provider(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None, str]:
    from . import demo

    if args.provider == "scripted":
        return demo.DemoProvider(pace=args.pace), None, "scripted model (trio_backplane.demo)"
    try:
        from .adapters.openai import OpenAIProvider
    except ImportError as exc:  # pragma: no cover - httpx ships with the cli extra
        raise _UsageError(f"--provider openai needs httpx ({exc})") from None
    try:
        provider = OpenAIProvider(args.base_url, args.model, system=_SYSTEM_PROMPT)
    except Error as error:
        raise _UsageError(error.message) from None
    key = os.environ.get("OPENAI_API_KEY") or None
    # The key goes only into the trusted provider_context: never the store,
    # an event, or a line printed here.
    context = {"api_key": key} if key else None
    # the whole userinfo hidden: a bare token@ is a secret too
    shown_url = re.sub(r"(://)[^/\s]*@", r"\1***@", args.base_url)  # to the last @
    label = f"{args.model} at {shown_url}" + ("" if key else " (no OPENAI_API_KEY)")
    return provider, context, label


def _demo(args: argparse.Namespace, out: TextIO) -> int:
    if args.provider == "openai" and not (args.base_url and args.model):
        print("backplane: --provider openai needs --base-url URL and --model M", file=sys.stderr)
        return EXIT_USAGE
    if not 0 <= args.pace <= 5:  # NaN too
        print("backplane: --pace must be between 0 and 5 seconds", file=sys.stderr)
        return EXIT_USAGE
    approve = args.approve or ("ask" if sys.stdin.isatty() else "yes")
    try:
        provider, context, label = _demo_provider(args)
    except _UsageError as exc:
        print(f"backplane: {exc}", file=sys.stderr)
        return EXIT_USAGE
    view = _Out(out)
    try:
        log = open(args.events, "w", encoding="utf-8") if args.events else None  # noqa: SIM115
    except OSError as exc:
        print(f"backplane: cannot write --events: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return trio.run(
            functools.partial(
                _demo_run,
                args=args,
                out=view,
                provider=provider,
                provider_context=context,
                label=label,
                approve=approve,
                log=log,
            )
        )
    except KeyboardInterrupt:
        view.stop()
        print("backplane: interrupted; the run was cancelled", file=sys.stderr)
        return 130
    finally:
        if log is not None:
            with contextlib.suppress(OSError):  # a write that failed was reported
                log.close()


async def _demo_run(
    *,
    args: argparse.Namespace,
    out: _Out,
    provider: Any,
    provider_context: dict[str, Any] | None,
    label: str,
    approve: str,
    log: TextIO | None,
) -> int:
    from . import demo
    from .runtime import open_conversation
    from .store import SQLiteStore
    from .tools import Authority

    db = args.db
    notes = args.notes or os.path.join(os.path.dirname(os.path.abspath(db)), "backplane-demo-notes")
    registry = demo.registry(notes)
    run_id = demo.new_run_id()
    authority = Authority.for_registry(registry, caller="backplane-demo", run_id=run_id)
    out.line(("backplane demo ", "bold"), (run_id, "bold cyan"))
    out.line(("  store ", "dim"), _store_url(db), ("   model ", "dim"), label)
    out.line(
        ("  tools ", "dim"), ", ".join(d.name for d in registry), ("   approvals ", "dim"), approve
    )
    out.spin("opening the store…")
    try:
        async with (
            SQLiteStore(db) as store,
            trio.open_nursery() as nursery,
            open_conversation(
                run_id,
                store=store,
                provider=provider,
                registry=registry,
                authority=authority,
                provider_context=provider_context,
                context={"demo": {"notes": notes, "provider": args.provider}},
                work=20,
                run_timeout=600.0,
                effect_timeout=120.0 if args.provider == "openai" else 30.0,
            ) as conversation,
        ):
            view = _EventView(out, conversation, approve, _ask_stdin, log)
            nursery.start_soon(view.consume, conversation.subscribe())
            out.stop()
            await conversation.prompt(demo.PROMPT)
            snapshot = await conversation.wait_settled()
    except (Error, BaseExceptionGroup) as exc:
        # The conversation opens inside the nursery: its refusal (a --db
        # that is no store, say) arrives wrapped in a group, and so do
        # Ctrl-C and a reader closing our output: those go on bare, to the
        # handlers of _demo and main.
        error = _only_error(exc)
        if error is None:
            bare = _leaf(exc, (KeyboardInterrupt, BrokenPipeError))
            if bare is not None:
                raise bare from None
            raise
        out.stop()
        print(f"backplane: demo failed: {_reason(error)}", file=sys.stderr)
        return EXIT_REJECTED
    finally:
        out.stop()
    _final_status(out, snapshot, db, run_id)
    if view.log_error is not None:
        print(f"backplane: cannot write --events: {view.log_error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if snapshot.run.state == "completed" else EXIT_REJECTED


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
    leaf is one; else ``None`` (anything else propagates as it is)."""
    if isinstance(exc, Error):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_only_error(inner) for inner in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


def _final_status(out: _Out, snapshot: Any, db: str, run_id: str) -> None:
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
        rows.append(("error", _error_text(outcome["error"])))
    elif snapshot.last_error is not None:
        rows.append(("error", _reason(snapshot.last_error)))
    out.table("final status", ("", ""), rows, header=False)
    out.line(("inspect it: ", "dim"), f"backplane runs show {_store_url(db)} {run_id}")


# -- backplane runs ------------------------------------------------------------------


def _runs(args: argparse.Namespace, out: TextIO) -> int:
    try:
        _check_run_id(getattr(args, "run_id", None))
        fencing = args.runs_command == "recover" and args.fence
        store = open_store(args.store, writing=fencing)
    except _UsageError as exc:
        print(_hide_dsn_secret(f"backplane: {exc}", args.store), file=sys.stderr)
        return EXIT_USAGE
    handler = {"list": _runs_list, "show": _runs_show, "recover": _runs_recover}[args.runs_command]
    view = _Out(out)
    try:
        status: int = trio.run(_with_store, store, handler, args, view)
    except Error as error:
        view.stop()
        print(_hide_dsn_secret(f"backplane: {_reason(error)}", args.store), file=sys.stderr)
        # a database that holds no store is a usage mistake, as a SQLite file is
        return EXIT_USAGE if error.details.get("reason") == "not_a_store" else EXIT_REJECTED
    return status


def _check_run_id(run_id: str | None) -> None:
    """A run id from the command line that is not UTF-8 (``$'caf\\xe9'``
    arrives with surrogate escapes) can name no stored run."""
    if run_id is None:
        return
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        raise _UsageError(f"run id {_clean(ascii(run_id))} is not valid UTF-8") from None


async def _with_store(store: Any, handler: Any, args: argparse.Namespace, out: _Out) -> int:
    async with store:
        status: int = await handler(store, args, out)
        return status


async def _load(store: Any, run_id: str) -> Any:
    record = await store.load(run_id)
    if record is None:
        raise Error(ErrorClass.NOT_FOUND, f"no run {run_id!r} in the store")
    return record


async def _runs_list(store: Any, args: argparse.Namespace, out: _Out) -> int:
    out.spin("listing runs…")
    summaries = await store.list_runs(states=args.state or None)
    out.stop()
    rows = []
    with out.progress("reading runs", len(summaries)) as advance:
        for summary in summaries:
            record = await store.load(summary.run_id)
            advance()
            messages = len(record.transcript) if record is not None else 0
            used = f"{record.budget.used}/{record.budget.quota}" if record is not None else "?"
            rows.append(
                (
                    summary.run_id,
                    summary.state,
                    summary.incarnation,
                    summary.revision,
                    used,
                    messages,
                )
            )
    if args.json:
        keys = ("run_id", "state", "incarnation", "revision", "work", "messages")
        out.file.write(
            json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2) + "\n"
        )
        return EXIT_OK
    out.table(
        "runs",
        ("run id", "state", "incarnation", "revision", "work", "messages"),
        rows,
        caption=f"{len(rows)} runs",
    )
    return EXIT_OK


def _transcript_rows(messages: Sequence[Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            rows.append(("?", _short(message)))
            continue
        role = str(message.get("role", "?"))
        if role == "tool":
            result = message.get("result")
            if not isinstance(result, Mapping):  # a host's own shape: shown as it is
                text = _short(result, 200)
            elif result.get("is_error"):
                text = "✗ " + (_error_text(result.get("error")) or _short(result.get("content")))
            else:
                text = "✓ " + _short(result.get("content"), 200)
            rows.append((f"tool {_clean(message.get('name'))}", text))
            continue
        content = message.get("content")
        if isinstance(content, str):
            rows.append((role, _short(content, 400)))
            continue
        if not isinstance(content, list | tuple):
            rows.append((role, _short(content)))
            continue
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_call":
                rows.append((role, f"→ {block.get('name')} {_short(block.get('arguments'))}"))
            elif isinstance(block, Mapping) and "text" in block:
                rows.append((role, _short(block.get("text"), 400)))
            else:
                rows.append((role, _short(block)))
    return rows


def _instant(at: float | None) -> str:
    """A stored instant (seconds since the epoch, UTC) as ISO 8601."""
    if at is None:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{at!r} (not a date)"


async def _runs_show(store: Any, args: argparse.Namespace, out: _Out) -> int:
    from .kernel import encode_record

    out.spin("loading the run…")
    record = await _load(store, args.run_id)
    events = await store.events(args.run_id)
    out.stop()
    if args.json:
        out.file.write(json.dumps(encode_record(record), indent=2, default=str) + "\n")
        return EXIT_OK
    budget = record.budget
    reservations = ", ".join(sorted(budget.reservations)) or "none"
    out.table(
        f"run {record.run_id}",
        ("", ""),
        [
            ("state", record.state),
            ("incarnation", str(record.incarnation)),
            ("revision", str(record.revision)),
            ("deadline", _instant(record.deadline)),
            ("budget", f"{budget.used} of {budget.quota} used; reservations: {reservations}"),
            ("stop reason", record.stop_reason or "-"),
            ("stored events", f"{len(events)}"),
        ],
        header=False,
    )
    out.table("transcript", ("role", "content"), _transcript_rows(record.transcript))
    intents = []
    for effect_id in sorted(record.intents, key=_effect_order):
        intent = record.intents[effect_id]
        intents.append(
            (
                effect_id,
                intent.get("kind", effect_id.split(":", 1)[0]),
                intent.get("tool_name") or "-",
                intent.get("status", "?"),
                intent.get("effect_class", "?"),
                intent.get("dispatch_state", "-"),
            )
        )
    out.table(
        "intents",
        ("effect", "kind", "tool", "status", "effect_class", "dispatch_state"),
        intents,
    )
    outcome = _plain(record.outcome) if record.outcome is not None else None
    if outcome is None:
        out.line(("outcome ", "bold"), "none yet (the run is not terminal)")
    else:
        status = str(outcome.get("status", record.state))
        error = outcome.get("error")
        out.line(
            ("outcome ", "bold"),
            (status, "bold green" if status == "completed" else "bold red"),
            f"  turn {outcome.get('turn_id')}" if outcome.get("turn_id") else "",
            f"  {_error_text(error)}" if error else "",
        )
    return EXIT_OK


def _effect_order(effect_id: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", effect_id)
    return (int(digits[-1]) if digits else 0, effect_id)


async def _runs_recover(store: Any, args: argparse.Namespace, out: _Out) -> int:
    import attrs

    from .recovery import recover

    record = await _load(store, args.run_id)
    incarnation = args.incarnation if args.incarnation is not None else record.incarnation + 1
    report = recover(record, incarnation=incarnation)
    if args.json:
        data = attrs.asdict(report)
        data["safe_to_withdraw"] = report.safe_to_withdraw
        out.file.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        out.line(
            ("recovery of ", "bold"),
            (report.run_id, "bold cyan"),
            f"  for incarnation {report.incarnation} (fences incarnation "
            f"{report.fenced_incarnation})",
        )
        out.line(
            ("  state ", "dim"), report.state, ("  terminal" if report.terminal else "", "dim")
        )
        if report.effects:
            out.table(
                "outstanding effects",
                (
                    "effect",
                    "kind",
                    "effect_class",
                    "dispatch_state",
                    "status",
                    "withdraw",
                    "resume",
                ),
                [
                    (
                        e.effect_id,
                        e.kind,
                        e.effect_class,
                        e.dispatch_state,
                        e.status,
                        "safe" if e.safe_to_withdraw else "no",
                        "safe" if e.safe_to_resume else "no",
                    )
                    for e in report.effects
                ],
            )
        elif not any(report.unsettled.get(k) for k in ("children", "dependencies")):
            out.line("  no outstanding effects: nothing to withdraw, resume or reconcile")
        else:
            out.line("  no outstanding effects")
        for kind in ("children", "dependencies"):
            if report.unsettled.get(kind):
                out.line(
                    (f"  unsettled {kind} (settle before resuming) ", "bold yellow"),
                    ", ".join(report.unsettled[kind]),
                )
        if report.uncertain_effects:
            out.line(
                ("  uncertain (reconcile by hand) ", "bold red"),
                ", ".join(report.uncertain_effects),
            )
    if args.fence:
        receipt = await store.fence(args.run_id, incarnation=incarnation)
        message = (
            f"fenced: incarnation {record.incarnation} can no longer commit; the run is at "
            f"incarnation {receipt.incarnation}, revision {receipt.revision}"
        )
        if args.json:
            print(message, file=sys.stderr)
        else:
            out.line(("  " + message, "bold yellow"))
    elif not args.json:
        out.line(
            (
                f"  read-only: nothing was fenced (pass --fence to fence incarnation "
                f"{record.incarnation})",
                "dim",
            )
        )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backplane",
        description="The trio_backplane command line: check tool schemas, admit"
        " catalogs, run the demo, read and recover stored runs.",
    )
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

    demo_cmd = commands.add_parser(
        "demo",
        help="run a whole conversation with real tools and an approval, on SQLite",
        description="Run a whole conversation on the embedded default (a SQLite file) with a "
        "scripted model (or an OpenAI-compatible endpoint) and the tools of trio_backplane.demo; "
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
        choices=("scripted", "openai"),
        default="scripted",
        help="the model: the scripted one (default) or an OpenAI-compatible endpoint "
        "(API key from OPENAI_API_KEY)",
    )
    demo_cmd.add_argument(
        "--base-url", metavar="URL", help="the API root, e.g. https://api.openai.com/v1"
    )
    demo_cmd.add_argument("--model", metavar="M", help="the model name")
    demo_cmd.add_argument(
        "--notes",
        metavar="DIR",
        help="where write_note writes (default: backplane-demo-notes beside the store)",
    )
    demo_cmd.add_argument(
        "--events",
        metavar="FILE",
        help="also write every event as a JSON line to FILE",
    )
    demo_cmd.add_argument(
        "--pace",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="pause between the scripted model's words (default 0.02)",
    )
    demo_cmd.set_defaults(handler=_demo)

    runs_cmd = commands.add_parser(
        "runs",
        help="inspect the runs of a store",
        description="STORE_URL is sqlite:///relative/path, sqlite:////absolute/path, a bare "
        "path, or a postgresql:// DSN.",
    )
    runs_sub = runs_cmd.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_sub.add_parser("list", help="every run: state, incarnation, revision, work")
    runs_list.add_argument("store", metavar="STORE_URL")
    runs_list.add_argument(
        "--state",
        action="append",
        metavar="STATE",
        choices=sorted(RUN_STATES),
        help="only runs in STATE (repeatable): " + ", ".join(sorted(RUN_STATES)),
    )
    runs_show = runs_sub.add_parser(
        "show", help="one run: transcript, intents (status, effect_class), outcome, budget"
    )
    runs_show.add_argument("store", metavar="STORE_URL")
    runs_show.add_argument("run_id", metavar="RUN_ID")
    runs_recover = runs_sub.add_parser(
        "recover",
        help="the recovery classification of a run (read-only unless --fence)",
    )
    runs_recover.add_argument("store", metavar="STORE_URL")
    runs_recover.add_argument("run_id", metavar="RUN_ID")
    runs_recover.add_argument(
        "--incarnation",
        type=int,
        metavar="N",
        help="the recovering incarnation (default: the stored one + 1)",
    )
    runs_recover.add_argument(
        "--fence",
        action="store_true",
        help="also fence the stored incarnation (Store.fence): it can never commit again",
    )
    for command in (runs_list, runs_show, runs_recover):
        command.add_argument("--json", action="store_true", help="print JSON instead of tables")
        command.set_defaults(handler=_runs)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
