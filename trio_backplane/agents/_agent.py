"""One child agent: a stable name over a sequence of runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs
import trio

from ..runtime import Conversation, Snapshot
from ..tools import Authority

__all__ = ["FINAL", "LIVE", "Agent", "final_text", "status_of"]

#: Statuses of an agent whose current run is over.
FINAL: Final = frozenset({"completed", "interrupted", "errored"})
#: Statuses that count against ``max_agents``.
LIVE: Final = frozenset({"pending_init", "running", "completed", "interrupted", "errored"})


@final
@attrs.define(kw_only=True, eq=False)
class Agent:
    """An agent's identity (``name``), what it may still use (``quota``
    minus ``used``, until ``deadline``), and its current run."""

    name: str
    #: the caller that spawned it (``/root`` or another agent's name)
    parent: str
    quota: int
    deadline: float
    authority: Authority
    sequence: int = 0
    run_id: str = ""
    incarnation: int = 1
    #: work its settled runs used, and the last run counted
    used: int = 0
    used_run: str = ""
    status: str = "pending_init"
    final: Any = None
    reason: str | None = None
    #: ``None``; ``"confirmed"``; or why it could not be confirmed (kept)
    closure: str | None = None
    #: the last settled run's snapshot, tagged with its run and incarnation
    snapshot: tuple[str, int, Snapshot] | None = None
    conversation: Conversation | None = None
    #: set to make the current run's task leave its conversation
    release: trio.Event = attrs.Factory(trio.Event)
    #: set once that task has left it; ``died`` says why if it failed
    done: trio.Event = attrs.Factory(trio.Event)
    died: str | None = None

    def remaining_work(self) -> int:
        return self.quota - self.used

    def public_status(self) -> Any:
        """The status a model reads."""
        if self.closure not in (None, "confirmed"):
            return {"unknown_outcome": self.closure}
        if self.status == "completed":
            return {"completed": self.final}
        if self.status == "errored":
            return {"errored": self.reason}
        return self.status


def status_of(snapshot: Snapshot) -> tuple[str, str | None]:
    """An agent's status from its run's settled snapshot, and why."""
    state = snapshot.run.state
    if state == "completed":
        return "completed", None
    if state in ("cancelled", "timed_out", "unknown_outcome"):
        return "interrupted", None if state == "cancelled" else state
    error = snapshot.last_error
    return "errored", state if error is None else f"{error.error_class.value}: {error.message}"


def final_text(snapshot: Snapshot) -> Any:
    """The last assistant message's content, if any."""
    for message in reversed(snapshot.messages):
        if isinstance(message, Mapping) and message.get("role") == "assistant":
            return message.get("content")
    return None
