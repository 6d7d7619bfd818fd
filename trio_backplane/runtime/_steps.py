"""What the commit coordinator commits: decided changes (``Step``), built
from the record they land on."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from ..kernel import ConversationUpdated, KernelCommand, RunRecord, build_command
from ._conversation_state import ConversationState

__all__ = ["Step", "checkpoint_step", "command_step"]


class Step(NamedTuple):
    """One decided change for the commit coordinator: ``build`` makes its
    command from the record it lands on and the commit time; ``after`` runs
    once the commit holding it is acknowledged (its events go out then).
    A named tuple: a step is built for every commit, and read once."""

    build: Callable[[RunRecord, float], KernelCommand]
    after: Callable[[], None] | None = None
    #: the invocation whose result this step commits (``tool_completed``)
    settles: str | None = None


def command_step(
    command: type[KernelCommand],
    fields: Mapping[str, Any] | None = None,
    after: Callable[[], None] | None = None,
) -> Step:
    """A step committing ``command(at=now, **fields)`` (a typed command class)."""
    given = {} if fields is None else fields
    return Step(lambda _record, now: build_command(command, now, given), after)


def checkpoint_step(
    update: Callable[[ConversationState], ConversationState] | None = None,
    extra: Mapping[str, Any] | None = None,
    after: Callable[[], None] | None = None,
) -> Step:
    """A ``conversation_updated`` step: ``update`` maps the conversation state
    of the record it lands on to the new state (``None``: unchanged)."""

    def build(record: RunRecord, now: float) -> KernelCommand:
        data: dict[str, Any] = {}
        if update is not None:
            old = ConversationState.of(record)
            data = update(old).changes(old)
        if extra:
            data.update(extra)
        return ConversationUpdated(at=now, **data)

    return Step(build, after)
