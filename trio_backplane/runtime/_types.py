"""The Conversation's public records: events, snapshots, hooks."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Literal, Protocol, final

import attrs

from ..errors import Error
from ..kernel import RunRecord

__all__ = [
    "TRANSIENT_EVENTS",
    "Continue",
    "Event",
    "HookContext",
    "Hooks",
    "Phase",
    "ResourceCleanup",
    "Snapshot",
]

#: Events a slow subscriber may lose; every other event is always delivered.
TRANSIENT_EVENTS = frozenset(
    {
        "content_text_delta",
        "content_thinking_delta",
        "tool_call_started",
        "tool_call_arguments_delta",
        "tool_call_completed",
        "usage_updated",
        "tool_update",
        "events_dropped",
    }
)


class Phase(enum.StrEnum):
    """What the live conversation is doing (``Snapshot.phase``); a ``str``,
    so it compares equal to its value."""

    #: opened, before the first prompt (the only phase that takes ``prompt``
    #: as a new run's first message)
    IDLE = "idle"
    RUNNING = "running"
    #: a tool waits for a person's answer; the run's deadlines are suspended
    WAITING_INTERACTION = "waiting_interaction"
    CANCELLING = "cancelling"
    #: the run is settled: completed, failed, cancelled, timed out or uncertain
    TERMINAL = "terminal"
    #: another incarnation owns the run, or it did not settle in time
    RECOVERY_REQUIRED = "recovery_required"
    #: a commit failed or was not acknowledged: recovery decides what happened
    STORAGE_FAILED = "storage_failed"


@final
@attrs.frozen
class Event:
    """One subscriber event (the EVT section of BEHAVIOURS.md)."""

    type: str
    payload: Mapping[str, Any]
    run_id: str
    incarnation: int
    turn_id: str | None
    step_id: str | None = None
    attempt_id: str | None = None


@final
@attrs.frozen
class ResourceCleanup:
    status: Literal["not_requested", "confirmed", "uncertain"] = "not_requested"
    evidence: tuple[Any, ...] = ()


@final
@attrs.frozen
class Snapshot:
    """The last committed state of a conversation."""

    phase: Phase
    run: RunRecord
    messages: tuple[Any, ...]
    steering: tuple[Any, ...]
    follow_up: tuple[Any, ...]
    queue_status: str
    usage: tuple[Any, ...]
    turn_id: str | None
    pending_interaction: Mapping[str, Any] | None
    last_error: Error | None
    catalog_revision: int
    receipts: tuple[Any, ...]
    resource_cleanup: ResourceCleanup


@final
@attrs.frozen
class Continue:
    """A stop hook's synthetic continuation: ``message`` is prompt content."""

    message: Any


@final
@attrs.frozen
class HookContext:
    run_id: str
    incarnation: int
    turn_id: str | None
    mode: Literal["new", "steering", "stop"]


class Hooks(Protocol):
    """Both methods are optional."""

    async def prompt(
        self, message: Mapping[str, Any], context: HookContext
    ) -> Mapping[str, Any]: ...

    async def stop(self, outcome: Mapping[str, Any], context: HookContext) -> Any: ...
