"""How SQL stores lay a record out so a commit costs what changed, not the run.

An encoded record (``encode_record``) is split into a small *head* (every
field but the growing ones) and *parts*: one row per entry of the maps that
grow with the run (``intents``, ``tool_results``) and one row per message of
the transcript (``context.conversation.messages``).  A commit diffs the new
parts against the last committed ones and writes only the rows that changed,
so commit 5 000 of a run costs about what commit 10 did.

Pure functions: no I/O.  Both SQL stores use them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["PARTS", "Parts", "diff_parts", "dumps", "join_record", "split_record"]

#: Top-level record fields stored one row per entry.
_KEYED: Final = ("intents", "tool_results")
#: The transcript: ``context["conversation"]["messages"]``, one row per message.
MESSAGES: Final = "messages"
PARTS: Final = (*_KEYED, MESSAGES)
_PLACEHOLDER: Final = "__parts__"

#: {(part, key): JSON text}
Parts = dict[tuple[str, str], str]

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
dumps = _encoder.encode


def _message_key(index: int) -> str:
    return f"{index:010d}"


def split_record(encoded: Mapping[str, Any]) -> tuple[str, Parts]:
    """``(head JSON text, parts)`` for an encoded record."""
    head = dict(encoded)
    parts: Parts = {}
    for field in _KEYED:
        entries = head.get(field) or {}
        for key, value in entries.items():
            parts[(field, key)] = dumps(value)
        head[field] = _PLACEHOLDER
    context = head.get("context")
    if isinstance(context, Mapping):
        conversation = context.get("conversation")
        if isinstance(conversation, Mapping) and isinstance(conversation.get(MESSAGES), list):
            for index, message in enumerate(conversation[MESSAGES]):
                parts[(MESSAGES, _message_key(index))] = dumps(message)
            head["context"] = {
                **context,
                "conversation": {**conversation, MESSAGES: _PLACEHOLDER},
            }
    return dumps(head), parts


def join_record(head_text: str, parts: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """The encoded record again, from its head and parts (inverse of ``split_record``)."""
    head: dict[str, Any] = json.loads(head_text)
    grouped: dict[str, dict[str, Any]] = {}
    for (part, key), text in parts.items():
        grouped.setdefault(part, {})[key] = json.loads(text)
    for field in _KEYED:
        if head.get(field) == _PLACEHOLDER:
            head[field] = grouped.get(field, {})
    context = head.get("context")
    if isinstance(context, dict):
        conversation = context.get("conversation")
        if isinstance(conversation, dict) and conversation.get(MESSAGES) == _PLACEHOLDER:
            messages = grouped.get(MESSAGES, {})
            conversation[MESSAGES] = [messages[k] for k in sorted(messages)]
    return head


def diff_parts(
    old: Mapping[tuple[str, str], str], new: Mapping[tuple[str, str], str]
) -> tuple[dict[tuple[str, str], str], list[tuple[str, str]]]:
    """``(upserts, deletes)`` turning ``old`` parts into ``new``."""
    upserts = {k: v for k, v in new.items() if old.get(k) != v}
    deletes = [k for k in old if k not in new]
    return upserts, deletes
