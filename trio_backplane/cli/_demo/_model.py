"""The demo's scripted model and the prompt it answers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

from ...runtime import (
    ProviderEvent,
    ProviderRequest,
    ResponseCompleted,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
)
from ...testing import ScriptedProvider, Sleep

#: The user's prompt of the demo run.
PROMPT: Final = (
    "Give me a quick tour of trio_backplane: look at the package's public names, "
    "find what the glossary says about approvals, and save a short note about it."
)

#: The note the scripted model asks to write (``<notes>/<NOTE_TITLE>.md``).
NOTE_TITLE: Final = "backplane-tour"


class DemoProvider(ScriptedProvider):
    """Two read-only calls in one response, one approval-gated write, then a
    summary of what the tools returned (and whether the write was approved).

    Text streams word by word, ``pace`` seconds apart.
    """

    def __init__(self, *, pace: float = 0.02, command: str | None = None) -> None:
        self.pace = pace
        super().__init__(
            [
                self._turn(
                    "I'll look at the package's public names and search the glossary first.",
                    ("call_read", "read_package_file", {"path": "__init__.py", "max_lines": 12}),
                    ("call_search", "search_glossary", {"query": "approval", "limit": 2}),
                ),
                *self._command_turn(command),
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

    def _command_turn(self, command: str | None) -> list[list[Any]]:
        """With ``--commands``: one turn running ``command`` (under approval)."""
        if command is None:
            return []
        arguments = {"cmd": command, "yield_time_ms": 10_000}
        text = "Let me run a command to look at the package and the Python it runs on."
        return [self._turn(text, ("call_cmd", "exec_command", arguments))]

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
    ran = results.get("exec_command", {})
    if ran:
        shown = (ran.get("structured_content") or {}).get("exit_code")
        parts.append(
            f"The command exited {shown}." if shown is not None else "The command did not run."
        )
    note = results.get("write_note", {})
    if note and not note.get("is_error"):
        parts.append(f"Your note is saved: {note.get('content')}.")
    elif note:
        error = (note.get("error") or {}).get("message") or note.get("content")
        parts.append(f"The note was not written ({error}): nothing touched the disk.")
    parts.append("That's the tour.")
    return " ".join(parts)
