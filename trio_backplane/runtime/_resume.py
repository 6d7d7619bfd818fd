"""Where a stored run taken over by a new incarnation goes on: pure.

A run can be resumed only at a committed boundary: nothing dispatched and
unsettled (no tool intent, no wait, no child), so that going on replays
nothing.  An interrupted provider attempt is read-only: it is committed as
abandoned and the turn asks again.  The resumed run has the run time the
stored run had left: for a run that waited for a person, what was left when
the wait began (the wait does not count); else what its deadline leaves now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import RunRecord, cleanup_requirements, thaw
from ._attempt import tool_calls
from ._conversation_state import ConversationState

__all__ = ["ABANDONED", "NOT_RESUMABLE", "ResumePoint", "resume_point", "same_call"]

#: The result committed for a provider attempt its host never finished.
ABANDONED: Final = {"abandoned": "its host stopped before the response ended"}


@final
@attrs.frozen(kw_only=True)
class ResumePoint:
    """Where the turn loop picks a resumed run up."""

    turn_id: str
    #: the turn's outcome is committed: follow-ups, or the run's end, next
    turn_ended: bool = False
    #: the committed response the turn goes on from (``None``: a new
    #: provider attempt comes first)
    message: Mapping[str, Any] | None = None
    #: the response's calls that ran nothing yet, in order
    calls: tuple[dict[str, Any], ...] = ()
    #: seconds of run time left
    run_timeout: float = 0.0
    #: the attempt id of an interrupted provider attempt, to abandon
    abandoned: str | None = None
    #: the interaction the stored run waited on, re-asked under its id
    #: (with ``"answer"``: answered and committed, its call not started)
    reopened: Mapping[str, Any] | None = None
    #: the ended turn's failure, as committed
    failed: Error | None = None


#: ``details["reason"]`` of the refusal to resume: the record itself cannot
#: go on (another refusal, a fence lost to a newer owner say, is not this).
NOT_RESUMABLE: Final = "not_resumable"


def _refuse(record: RunRecord, why: str) -> Error:
    return Error(
        ErrorClass.RESOURCE_CONFLICT,
        f"the run cannot be resumed: {why}",
        {
            "reason": NOT_RESUMABLE,
            "run_id": record.run_id,
            "state": record.state,
            "hint": "recovery.settle_run",
        },
    )


def resume_point(record: RunRecord, wall_now: float) -> ResumePoint:
    """Where ``record`` (fenced for the resuming incarnation) goes on;
    ``resource_conflict`` when it holds work in flight or is not running."""
    if record.state != "running":
        raise _refuse(record, f"it is {record.state}")
    outstanding = cleanup_requirements(record)
    if record.active_wait is not None or any(
        outstanding.get(kind) for kind in ("tools", "children", "dependencies")
    ):
        raise _refuse(record, "an effect, a child run or a wait is in flight")
    conversation = ConversationState.of(record)
    if any(
        not isinstance(item, Mapping) or item.get("kind") != "mcp_task"
        for item in conversation.resources
    ):
        # (an MCP task lives as long as its call, which has settled here)
        raise _refuse(record, "a resource its tools started may outlive its host")
    turn_id = conversation.turn_id
    if turn_id is None:
        raise _refuse(record, "no turn was ever started")
    point = ResumePoint(turn_id=turn_id, run_timeout=_time_left(record, conversation, wall_now))
    last = conversation.last_turn
    if last is not None and last.get("turn_id") == turn_id:
        return attrs.evolve(point, turn_ended=True, failed=_failure(last.get("error")))
    if record.active_provider is not None:
        return attrs.evolve(point, abandoned=str(record.active_provider["attempt_id"]))
    message, calls = _response(record, conversation.messages)
    if message is None:
        return point
    return attrs.evolve(
        point, message=message, calls=calls, reopened=_reopened(conversation, calls)
    )


def _reopened(
    conversation: ConversationState, calls: tuple[dict[str, Any], ...]
) -> Mapping[str, Any] | None:
    """The interaction the first call left: still pending, or answered
    (committed with its request) before the call started."""
    if conversation.pending_interaction is not None:
        return conversation.pending_interaction
    resolved = conversation.resolved_interaction
    if resolved is None or not calls or not same_call(resolved.get("request"), calls[0]["id"]):
        return None
    return {"id": resolved.get("interaction_id"), **resolved}


def same_call(request: Any, call_id: Any) -> bool:
    """Whether ``request`` asks permission for the tool call ``call_id``."""
    if not isinstance(request, Mapping) or request.get("kind") != "permission":
        return False
    operation = request.get("operation")
    return isinstance(operation, Mapping) and operation.get("tool_call_id") == call_id


def _failure(error: Any) -> Error | None:
    if not isinstance(error, Mapping):
        return None
    try:
        details = error.get("details")
        return Error(
            str(error.get("class")),
            str(error.get("message")),
            details if isinstance(details, Mapping) else None,
        )
    except (ValueError, TypeError):
        return Error(ErrorClass.EXECUTION_FAILURE, "the turn failed", {"stored": str(error)[:300]})


def _time_left(record: RunRecord, conversation: ConversationState, wall_now: float) -> float:
    pending = conversation.pending_interaction
    remaining = pending.get("remaining") if pending is not None else None
    if isinstance(remaining, int | float) and remaining >= 0:
        return float(remaining)  # the wait froze it
    if record.deadline is None:
        return 0.0
    return max(0.0, record.deadline - wall_now)


def _response(
    record: RunRecord, messages: Sequence[Any]
) -> tuple[Mapping[str, Any] | None, tuple[dict[str, Any], ...]]:
    """The last committed response when the transcript still ends with it
    (and the tool messages of its calls): the response and its calls that
    ran nothing; ``(None, ())`` when a new attempt comes next."""
    stored = record.provider_result
    result = stored.get("result") if stored is not None else None
    message = result.get("message") if isinstance(result, Mapping) else None
    if not isinstance(message, Mapping):
        return None, ()
    index = len(messages) - 1
    while index >= 0 and _role(messages[index]) == "tool":
        index -= 1
    if index < 0 or messages[index] != message:
        return None, ()  # steering, a stop hook's message, ... came after it
    streamed = result.get("calls") if isinstance(result, Mapping) else None
    calls = [dict(c) for c in thaw(streamed)] if streamed else tool_calls(message, [])
    done = {m.get("tool_call_id") for m in messages[index + 1 :] if isinstance(m, Mapping)}
    left = tuple(call for call in calls if call["id"] not in done)
    if calls and not left:
        return None, ()  # the batch ended: the boundary, then a new attempt
    return message, left


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None
