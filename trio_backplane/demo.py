"""The ``backplane demo`` conversation: three real tools and a scripted model.

The tools are ordinary tool backends, admitted through the same boundary a
host's tools cross:

* ``read_package_file`` (read-only) reads a text file of the installed
  ``trio_backplane`` package (a relative path inside the package, nothing
  else);
* ``search_glossary`` (read-only) searches a small in-memory glossary;
* ``write_note`` (``requires_approval=True``, a mutation) writes a Markdown
  note into the demo's notes folder, only once a person (or the host) has
  approved the exact arguments.

:class:`DemoProvider` is a :class:`~trio_backplane.testing.ScriptedProvider`
that plays a short session: it reads a file and searches the glossary (two
tool calls in one response), asks to write a note, then summarises what
happened, including whether the note was approved.  Text is streamed word by
word, ``pace`` seconds apart, so the event stream is worth watching.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import trio

from .errors import Error, ErrorClass
from .runtime import (
    ProviderEvent,
    ProviderRequest,
    ResponseCompleted,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    ToolOperation,
)
from .testing import ScriptedProvider, Sleep
from .tools import ToolDescriptor, ToolRegistry, ToolResult

__all__ = [
    "GLOSSARY",
    "NOTE_TITLE",
    "PROMPT",
    "DemoProvider",
    "ReadPackageFile",
    "SearchGlossary",
    "WriteNote",
    "new_run_id",
    "registry",
]

#: The user's prompt of the demo run.
PROMPT: Final = (
    "Give me a quick tour of trio_backplane: look at the package's public names, "
    "find what the glossary says about approvals, and save a short note about it."
)

#: The note the scripted model asks to write (``<notes>/<NOTE_TITLE>.md``).
NOTE_TITLE: Final = "backplane-tour"

#: A small in-memory glossary: ``(term, definition)``.
GLOSSARY: Final[tuple[tuple[str, str], ...]] = (
    ("run", "One durable conversation: a RunRecord committed revision by revision to a store."),
    ("incarnation", "The executor generation of a run; recovery fences older incarnations."),
    (
        "approval",
        "A tool with requires_approval opens a permission interaction before any intent "
        "is committed; only the exact answer 'approved' dispatches it.",
    ),
    (
        "interaction",
        "A question to a person: interaction_requested, then the host calls resolve(id, answer).",
    ),
    ("intent", "The durable record of an effect before it happens, with its effect_class."),
    (
        "effect class",
        "read_only, idempotent or mutation: decides whether recovery may resume an effect.",
    ),
    ("budget", "The run's work quota: one unit per provider attempt and per tool call."),
    ("store", "Where runs live: MemoryStore, SQLiteStore (the embedded default) or Postgres."),
    ("schema boundary", "Tool arguments are validated by JSON Schema 2020-12 before dispatch."),
    ("recovery", "recover(record, incarnation=n) classifies outstanding effects after a crash."),
)

_PATH_PART: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_TEXT_SUFFIXES: Final = frozenset({".py", ".pyi", ".json", ".md", ".txt", ".typed", ".c"})

READ_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "path": {
            "type": "string",
            "description": "a file of the trio_backplane package, e.g. __init__.py",
            "pattern": "^[A-Za-z0-9_][A-Za-z0-9_./-]*$",
            "maxLength": 200,
        },
        "max_lines": {"type": "integer", "minimum": 1, "maximum": 200, "default": 40},
    },
    "required": ["path"],
    "additionalProperties": False,
}

SEARCH_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 200},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
    },
    "required": ["query"],
    "additionalProperties": False,
}

NOTE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "title": {
            "type": "string",
            "description": "the note's file name, without .md",
            "pattern": "^[a-z0-9][a-z0-9-]{0,62}$",
        },
        "body": {"type": "string", "minLength": 1, "maxLength": 4000},
    },
    "required": ["title", "body"],
    "additionalProperties": False,
}


class ReadPackageFile:
    """Read-only: the first lines of a text file inside the installed package."""

    async def execute(self, operation: ToolOperation) -> ToolResult:
        arguments = operation.arguments
        relative = str(arguments["path"])
        max_lines = int(arguments.get("max_lines", 40))
        parts = relative.split("/")
        if not all(_PATH_PART.fullmatch(part) and part not in (".", "..") for part in parts):
            raise Error(
                ErrorClass.VALIDATION, "path must stay inside the package", {"path": relative}
            )
        target = resources.files("trio_backplane").joinpath(*parts)
        if Path(relative).suffix not in _TEXT_SUFFIXES or not target.is_file():
            raise Error(
                ErrorClass.NOT_FOUND, "no such text file in the package", {"path": relative}
            )
        text = await trio.to_thread.run_sync(target.read_text, "utf-8")
        lines = text.splitlines()
        shown = "\n".join(lines[:max_lines])
        return ToolResult(
            shown,
            structured_content={
                "path": relative,
                "lines": len(lines),
                "shown": min(max_lines, len(lines)),
            },
        )


class SearchGlossary:
    """Read-only: glossary entries ranked by how many query words they contain."""

    def __init__(self, entries: Sequence[tuple[str, str]] = GLOSSARY) -> None:
        self.entries = tuple(entries)

    async def execute(self, operation: ToolOperation) -> ToolResult:
        await trio.lowlevel.checkpoint()
        query = str(operation.arguments["query"]).lower()
        limit = int(operation.arguments.get("limit", 3))
        words = [w for w in re.split(r"\W+", query) if w]
        scored = []
        for term, definition in self.entries:
            haystack = f"{term} {definition}".lower()
            score = sum(haystack.count(w) for w in words) + (3 if term in query else 0)
            if score:
                scored.append((score, term, definition))
        scored.sort(key=lambda item: (-item[0], item[1]))
        hits = [{"term": t, "definition": d} for _, t, d in scored[:limit]]
        operation.context.emit({"scanned": len(self.entries), "hits": len(hits)})
        text = "\n".join(f"{h['term']}: {h['definition']}" for h in hits) or "no match"
        return ToolResult(text, structured_content={"query": query, "hits": hits})


class WriteNote:
    """A mutation behind an approval: writes ``<folder>/<title>.md``."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)

    async def execute(self, operation: ToolOperation) -> ToolResult:
        title = str(operation.arguments["title"])
        body = str(operation.arguments["body"])
        path = self.folder / f"{title}.md"
        data = f"# {title}\n\n{body}\n".encode()
        operation.context.emit({"writing": str(path), "bytes": len(data)})
        await trio.to_thread.run_sync(_write_atomically, path, data)
        return ToolResult(
            f"wrote {len(data)} bytes to {path}",
            structured_content={"path": str(path), "bytes": len(data)},
        )


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def registry(notes: str | os.PathLike[str]) -> ToolRegistry:
    """The demo's three tools; ``write_note`` writes into ``notes``."""
    return ToolRegistry(
        [
            ToolDescriptor(
                name="read_package_file",
                schema=READ_SCHEMA,
                backend=ReadPackageFile(),
                description="Read the first lines of a text file of the trio_backplane package.",
                read_only=True,
            ),
            ToolDescriptor(
                name="search_glossary",
                schema=SEARCH_SCHEMA,
                backend=SearchGlossary(),
                description="Search the trio_backplane glossary.",
                read_only=True,
            ),
            ToolDescriptor(
                name="write_note",
                schema=NOTE_SCHEMA,
                backend=WriteNote(notes),
                description="Write a Markdown note into the demo's notes folder (asks first).",
                requires_approval=True,
            ),
        ]
    )


def new_run_id() -> str:
    """A fresh, sortable run id: ``demo-<UTC time>-<random>``."""
    return f"demo-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


# -- the scripted model ---------------------------------------------------------


class DemoProvider(ScriptedProvider):
    """The demo's scripted model: two read-only calls, one approval-gated write,
    then a summary that says what the tools returned (and whether the write was
    approved).  ``pace`` is the pause between streamed words, in seconds."""

    def __init__(self, *, pace: float = 0.02) -> None:
        self.pace = pace
        super().__init__(
            [
                self._turn(
                    "I'll look at the package's public names and search the glossary first.",
                    ("call_read", "read_package_file", {"path": "__init__.py", "max_lines": 12}),
                    ("call_search", "search_glossary", {"query": "approval", "limit": 2}),
                ),
                self._turn(
                    "Now I'll save a short note. Writing a file needs your approval.",
                    (
                        "call_note",
                        "write_note",
                        {
                            "title": NOTE_TITLE,
                            "body": (
                                "trio_backplane runs agent conversations whose tool calls cross "
                                "a strict, durable boundary. Approval-gated tools ask first: "
                                "only the exact answer 'approved' dispatches them."
                            ),
                        },
                    ),
                ),
            ]
        )

    def stream(
        self, request: ProviderRequest, context: Mapping[str, Any] | None
    ) -> AsyncIterator[ProviderEvent]:
        if not self.remaining:
            self.add(self._text(_summary(request.messages)))
        return super().stream(request, context)

    def _words(self, text: str) -> list[Any]:
        steps: list[Any] = []
        for word in re.findall(r"\S+\s*", text):
            if self.pace:
                steps.append(Sleep(self.pace))
            steps.append(TextDelta(word))
        return steps

    def _text(self, text: str) -> list[Any]:
        return [
            *self._words(text),
            ResponseCompleted(
                {"role": "assistant", "content": text},
                usage={"input_tokens": 0, "output_tokens": len(text.split()), "scripted": True},
            ),
        ]

    def _turn(self, text: str, *calls: tuple[str, str, dict[str, Any]]) -> list[Any]:
        steps = self._words(text)
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
        for index, (call_id, name, arguments) in enumerate(calls):
            encoded = json.dumps(arguments)
            steps += [
                ToolCallStarted(call_id, name, index),
                ToolCallArgumentsDelta(call_id, encoded, index),
                ToolCallCompleted(call_id, name, arguments),
            ]
            blocks.append(
                {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
            )
        steps.append(
            ResponseCompleted(
                {"role": "assistant", "content": blocks},
                usage={"input_tokens": 0, "output_tokens": len(text.split()), "scripted": True},
            )
        )
        return steps


def _summary(messages: Sequence[Any]) -> str:
    results = {
        m.get("name"): m.get("result") or {}
        for m in messages
        if isinstance(m, Mapping) and m.get("role") == "tool"
    }
    parts = []
    read = results.get("read_package_file", {})
    if read and not read.get("is_error"):
        lines = (read.get("structured_content") or {}).get("lines", "?")
        parts.append(f"__init__.py has {lines} lines and re-exports the public API.")
    search = results.get("search_glossary", {})
    hits = (search.get("structured_content") or {}).get("hits") or []
    if hits:
        parts.append(f"The glossary entry '{hits[0]['term']}' explains how approvals work.")
    note = results.get("write_note", {})
    if note and not note.get("is_error"):
        parts.append(f"Your note is saved: {note.get('content')}.")
    elif note:
        error = (note.get("error") or {}).get("message") or note.get("content")
        parts.append(f"The note was not written ({error}): nothing touched the disk.")
    parts.append("That's the tour.")
    return " ".join(parts)
