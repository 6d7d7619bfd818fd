"""What the commands print: exit statuses, clean text, and rich tables or plain lines."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TextIO

from ..errors import Error
from ..kernel import thaw
from ._urls import redact_dsn

EXIT_OK: Final = 0
EXIT_REJECTED: Final = 1
EXIT_USAGE: Final = 2
#: Standard output's reader went away (128 + SIGPIPE, as a shell reports it).
EXIT_BROKEN_PIPE: Final = 141

#: Rows a table prints (a run's 100,000 intents would take minutes to lay
#: out, and nobody reads them in a terminal): the latest ones.
_MAX_TABLE_ROWS: Final = 500

_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: A piece of a line: text, or ``(text, rich style)``.
Segment = str | tuple[str, str]


def clean(text: Any) -> str:
    """Printable text: control characters (terminal escapes included)
    dropped, a lone surrogate (which no output encodes) escaped."""
    cleaned = _CONTROL.sub("", str(text))
    if not cleaned.isascii():
        cleaned = cleaned.encode("utf-8", "backslashreplace").decode("utf-8")
    return cleaned


def short(value: Any, limit: int = 160) -> str:
    """``value`` on one clean line of at most ``limit`` characters (JSON unless a string)."""
    if not isinstance(value, str):
        value = json.dumps(thaw(value), ensure_ascii=False, default=str)
    text = " ".join(clean(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def reason(error: Error) -> str:
    """One line naming an error's class, reason, message and telling details."""
    why = error.details.get("reason")
    extra = [
        f"{k}={clean(error.details[k])}"
        for k in ("run_id", "schema", "reference", "path", "schema_version", "supported")
        if error.details.get(k) not in (None, "")
    ]
    cause = error.details.get("cause")
    if isinstance(cause, str) and cause:
        extra.append(f"({redact_dsn(cause.splitlines()[0])[:200]})")
    head = f"{error.error_class.value}"
    if why:
        head += f" ({why})"
    return " ".join([head + ":", error.message, *extra])


def error_text(error: Any) -> str:
    """A stored error (a mapping with ``class`` and ``message``) on one line."""
    if not isinstance(error, Mapping):
        return short(error) if error else ""
    text = f"{error.get('class')}: {error.get('message')}"
    details = error.get("details")
    why = details.get("reason") if isinstance(details, Mapping) else None
    return short(f"{text} ({why})" if why else text, 300)


def pipe_to_main(console: Any) -> Any:
    """``console`` raising ``BrokenPipeError`` for ``main`` to answer (rich's
    own answer is exit status 1, which means "rejected" here)."""

    def broken_pipe() -> None:
        console.quiet = True
        raise BrokenPipeError

    console.on_broken_pipe = broken_pipe
    return console


class Out:
    """Rich output when the ``cli`` extra is installed, plain lines otherwise.

    Lines are built from segments, never parsed as markup, so model or tool
    text cannot inject styles; control characters are dropped either way.
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
        self.console = pipe_to_main(
            Console(file=out, highlight=False, soft_wrap=True, width=None if terminal else 120)
        )

    @property
    def interactive(self) -> bool:
        return self.console is not None and bool(self.console.is_terminal)

    def line(self, *segments: Segment) -> None:
        if self.console is None:
            text = "".join(s if isinstance(s, str) else s[0] for s in segments)
            print(clean(text), file=self.file, flush=True)
            return
        from rich.text import Text

        parts = [(clean(s), "") if isinstance(s, str) else (clean(s[0]), s[1]) for s in segments]
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
        """A table of the latest ``_MAX_TABLE_ROWS`` rows (the caption says how many are not)."""
        if len(rows) > _MAX_TABLE_ROWS:
            hidden = len(rows) - _MAX_TABLE_ROWS
            rows = rows[hidden:]
            note = f"{hidden} earlier rows not shown (--json prints them all)"
            caption = f"{caption}; {note}" if caption else note
        if self.console is None:
            print(clean(title), file=self.file)
            for row in rows:
                print("  " + "  ".join(clean(c) for c in row), file=self.file)
            if caption:
                print(clean(caption), file=self.file)
            return
        from rich.table import Table
        from rich.text import Text

        # The title holds a run id, the caption counts: text, never markup.
        table = Table(
            title=Text(clean(title)),
            caption=Text(clean(caption)) if caption else None,
            title_justify="left",
            show_header=header,
        )
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(Text(clean(c)) for c in row))
        self.console.print(table)

    def spin(self, text: str) -> None:
        """Show ``text`` beside a spinner, on a terminal only."""
        if not self.interactive:
            return
        from rich.text import Text

        shown = Text(clean(text))  # model text (a tool name): never markup
        if self._status is None:
            self._status = self.console.status(shown)
            self._status.start()
        else:
            self._status.update(shown)

    def stop(self) -> None:
        """Remove the spinner, if any."""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def progress(self, description: str, total: int) -> Any:
        """A context manager yielding ``advance()``: a progress bar on a terminal."""
        return _progress(self, description, total)


@contextlib.contextmanager
def _progress(out: Out, description: str, total: int) -> Iterator[Callable[[], None]]:
    if not out.interactive or total < 2:
        yield lambda: None
        return
    from rich.progress import Progress

    with Progress(console=out.console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)


def print_check_rows(rows: list[tuple[str, bool, str]], out: TextIO) -> None:
    """``schema check``'s report: one line per ``(tool, accepted, reason)``, then a summary."""
    accepted = sum(1 for _, ok, _ in rows if ok)
    summary = f"{len(rows)} tools: {accepted} accepted, {len(rows) - accepted} rejected"
    rows = [(clean(name), ok, clean(why)) for name, ok, why in rows]
    try:
        from rich.console import Console
        from rich.text import Text
    except ImportError:  # the cli extra is optional: plain lines then
        for name, ok, why in rows:
            print(
                f"{'accepted' if ok else 'rejected'}  {name}" + (f"  {why}" if why else ""),
                file=out,
            )
        print(summary, file=out)
        return
    console = pipe_to_main(Console(file=out, highlight=False, soft_wrap=True))
    for name, ok, why in rows:  # names and reasons are text, never markup
        if ok:
            console.print(Text.assemble(("accepted", "green"), "  ", name))
        else:
            console.print(Text.assemble(("rejected", "red"), "  ", name, "  ", why))
    console.print(summary)


def print_admission_table(
    rows: list[tuple[str, str, str]], warned: set[str], summary: str, out: TextIO
) -> None:
    """``catalog admit``'s table of ``(tool, status, reason)``; a ``warned`` name gets ``(!)``."""
    rows = [(clean(name), status, clean(why)) for name, status, why in rows]
    warned = {clean(name) for name in warned}
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:  # the cli extra is optional: plain lines then
        for name, status, why in rows:
            mark = " (!)" if name in warned else ""
            print(f"{status}  {name}{mark}" + (f"  {why}" if why else ""), file=out)
        print(summary, file=out)
        return
    table = Table(title="tool admission", caption=Text(summary))
    table.add_column("tool", overflow="fold")
    table.add_column("status")
    table.add_column("class and reason", overflow="fold")
    for name, status, why in rows:  # names and reasons are text, never markup
        label = f"{name} (!)" if name in warned else name
        table.add_row(Text(label), status, Text(why))
    pipe_to_main(Console(file=out, highlight=False, width=120)).print(table)
