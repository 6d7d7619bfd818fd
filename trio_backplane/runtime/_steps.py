"""What the commit coordinator commits: decided changes (``Step``), built
from the record they land on, and the conversation state they change."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..kernel import Command, RunRecord, appended, freeze

__all__ = [
    "EMPTY_CONVERSATION",
    "Step",
    "append_to",
    "checkpoint_step",
    "command_step",
    "conversation_of",
    "listed",
]


EMPTY_CONVERSATION: Final[Mapping[str, Any]] = freeze(
    {
        "messages": [],
        "steering": [],
        "follow_up": [],
        "queue_status": "active",
        "usage": [],
        "turn_id": None,
        "pending_interaction": None,
        "catalog_revision": 1,
        "last_turn": None,
    }
)


@attrs.frozen
class Step:
    """One decided change for the commit coordinator: ``build`` makes its
    command from the record it lands on and the commit time; ``after`` runs
    once the commit holding it is acknowledged (its events go out then)."""

    build: Callable[[RunRecord, float], Command]
    after: Callable[[], None] | None = None
    #: the invocation whose result this step commits (``tool_completed``)
    settles: str | None = None


def command_step(
    kind: str, data: Mapping[str, Any] | None = None, after: Callable[[], None] | None = None
) -> Step:
    """A step committing ``Command(kind, now, data)``."""
    return Step(lambda _record, now: Command(kind, now, data), after)


def conversation_of(record: RunRecord) -> Mapping[str, Any]:
    """The record's conversation state, or the empty one before any checkpoint."""
    state = record.conversation
    return EMPTY_CONVERSATION if state is None else state


def checkpoint_step(
    update: Callable[[dict[str, Any]], Mapping[str, Any]],
    extra: Mapping[str, Any] | None = None,
    after: Callable[[], None] | None = None,
) -> Step:
    """A ``conversation_updated`` step: ``update`` maps the conversation state
    of the record it lands on to the new state."""

    def build(record: RunRecord, now: float) -> Command:
        # Frozen level by level: each freeze is one check and one copy of a
        # mapping of frozen values, and the command takes the result unwalked.
        data = {"conversation": freeze(update(dict(conversation_of(record))))}
        if extra:
            data.update(extra)
        return Command("conversation_updated", now, freeze(data))

    return Step(build, after)


def append_to(
    record: RunRecord, *, message: Any = None, usage: list[Any] | None = None
) -> Mapping[str, Any]:
    """The record's conversation state with ``message`` and ``usage``
    appended, frozen (a command takes it unwalked)."""
    state = conversation_of(record)
    new = dict(state)
    if message is not None:
        new["messages"] = appended(state.get("messages", ()), message)
    if usage:
        new["usage"] = appended(state.get("usage", ()), *usage)
    frozen: Mapping[str, Any] = freeze(new)
    return frozen


def listed(state: Mapping[str, Any], key: str) -> tuple[Any, ...]:
    """The list ``state`` holds at ``key``: a stored conversation state is
    any mapping the kernel took, so a restored one may hold something else
    there, read as no items (the record itself is shown as stored)."""
    items = state.get(key)
    return tuple(items) if isinstance(items, list | tuple) else ()
