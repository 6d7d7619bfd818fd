"""The demo's three tools, ordinary backends admitted like a host's.

``read_package_file`` and ``search_glossary`` are read-only; ``write_note``
is a mutation that needs approval.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import trio

from ...errors import Error, ErrorClass
from ...runtime import ToolOperation
from ...tools import ToolDescriptor, ToolRegistry, ToolResult

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
