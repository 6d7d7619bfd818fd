"""The transition's handlers, one per command kind: each checks its command
against the record and returns the changes to apply (a ``dict`` of fields)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ._checks import (
    _conflict,
    _get,
    _invalid,
    _require_settled,
    _require_state,
    cleanup_requirements,
)
from ._commands import (
    UNSET,
    Admit,
    Cancel,
    ChildSettled,
    CleanupSettled,
    ConversationUpdated,
    DeadlineExceeded,
    Finish,
    KernelCommand,
    ProviderCompleted,
    ProviderStarted,
    Start,
    ToolCompleted,
    ToolInvoked,
    WaitResolved,
    WaitStarted,
)
from ._derived import assoc, dissoc, grown, put
from ._frozen import FrozenDict, FrozenList, thaw
from ._records import ACTIVE_STATES, RunRecord, reserve

__all__: list[str] = []

_Handler = Callable[[RunRecord, Any], dict[str, Any]]

#: The fields of ``tool_invoked`` its intent and active tool keep, when set.
_IDENTITY: Final = (
    "tool_name",
    "tool_revision",
    "tool_call_id",
    "turn_id",
    "arguments_digest",
    "effective_authority",
)


def _next_id(
    record: RunRecord, kind: str, counters: FrozenDict | None = None
) -> tuple[str, FrozenDict]:
    """The next ``<kind>-<incarnation>-<n>`` id and the counters that issued it:
    a copy of the record's, or ``counters`` when given (the copy an earlier
    call of this transition made, not yet in any record: updated in place)."""
    new = FrozenDict(record.counters) if counters is None else counters
    n = new.get(kind, 0)
    if type(n) is not int or n < 0:
        raise Error(
            ErrorClass.VALIDATION,
            "record is malformed: a counter must be a non-negative int",
            {"counter": kind},
        )
    n += 1
    dict.__setitem__(new, kind, n)
    return f"{kind}-{record.incarnation}-{n}", new


def _require_new(record: RunRecord, key: str) -> None:
    """A new effect's id is new: counters behind the intents (a record edited
    or restored from an older copy) never reissue one, overwriting its intent
    and passing its reservation off as a replay."""
    if key in record.intents or key in record.budget.reservations:
        raise _conflict("effect id already used: the record's counters are behind", key=key)


def _invoked_in_step(record: RunRecord, step_id: Any, call_id: Any) -> bool:
    """Whether a tool intent of step ``step_id`` names ``call_id``."""
    # Invocation numbers only grow, and every tool of the current step was
    # invoked after its provider attempt: walk the numbers down from the last
    # one until an intent of another step, so the check costs the step, not
    # the run, whatever order a store gives the intents back in.  An id issued
    # under another incarnation (a fence within the step) or missing is
    # looked for among every intent.
    intents = record.intents
    incarnation = record.incarnation
    n = record.counters.get("invocation", 0)
    while type(n) is int and n > 0:
        intent = intents.get(f"tool:invocation-{incarnation}-{n}")
        if type(intent) is not FrozenDict and not isinstance(intent, Mapping):
            break
        if intent.get("step_id") != step_id:
            return False  # the step's tools are all above this one
        if intent.get("tool_call_id") == call_id:
            return True
        n -= 1
    # No intent of another step bounded the walk (the run's first tools, a
    # fence, counters not as the kernel keeps them): look at every intent.
    return any(
        key.startswith("tool:")
        and isinstance(intent, Mapping)
        and intent.get("step_id") == step_id
        and intent.get("tool_call_id") == call_id
        for key, intent in intents.items()
    )


def _grown(items: FrozenList, more: Any, name: str) -> FrozenList:
    """``items`` with the frozen items of ``more`` appended."""
    if type(more) is not FrozenList and not isinstance(more, list | tuple):
        raise Error(ErrorClass.VALIDATION, f"{name} to append must be a list")
    return grown(items, more)


def _with_context(
    record: RunRecord, command: Admit | ConversationUpdated | ProviderCompleted | ToolCompleted
) -> dict[str, Any]:
    """The changes of a command's ``conversation`` (the new conversation
    state in ``context``), ``messages`` (appended to the transcript) and
    ``usage`` (appended to the usage reports)."""
    changes: dict[str, Any] = {}
    conversation = command.conversation
    if conversation is not UNSET:
        if type(conversation) is not FrozenDict and not isinstance(conversation, Mapping):
            raise Error(ErrorClass.VALIDATION, "conversation state must be a mapping")
        changes["context"] = assoc(record.context, "conversation", conversation)
    if command.messages is not UNSET:
        changes["transcript"] = _grown(record.transcript, command.messages, "messages")
    if command.usage is not UNSET:
        changes["usage"] = _grown(record.usage, command.usage, "usage")
    return changes


# -- handlers: each returns the changes to apply --------------------------------


def _admit(record: RunRecord, command: Admit) -> dict[str, Any]:
    if record.admitted or record.state != "queued":
        raise _invalid(record, command)
    target = _get(command.state, "queued")
    if target not in ("queued", "running"):
        raise Error(
            ErrorClass.VALIDATION,
            "admission state must be queued or running",
            {"state": repr(target)},
        )
    deadline = _get(command.deadline)
    if deadline is not None and (type(deadline) not in (int, float) or deadline - deadline != 0):
        raise Error(ErrorClass.VALIDATION, "deadline must be a finite number")
    return {
        "admitted": True,
        "state": target,
        "deadline": deadline,
        **_with_context(record, command),
    }


def _start(record: RunRecord, command: Start) -> dict[str, Any]:
    if not record.admitted:
        raise _invalid(record, command)
    _require_state(record, command, "queued", "running")
    return {"state": "running"}


def _conversation_updated(record: RunRecord, command: ConversationUpdated) -> dict[str, Any]:
    _require_state(record, command, "running")
    changes = _with_context(record, command)
    later = _get(command.execution_deadline)
    if later is not None:
        if type(later) not in (int, float) or later - later != 0:
            raise Error(ErrorClass.VALIDATION, "execution_deadline must be a finite number")
        if record.deadline is None or later > record.deadline:
            changes["deadline"] = later
    return changes


def _provider_started(record: RunRecord, command: ProviderStarted) -> dict[str, Any]:
    _require_state(record, command, "running")
    if record.active_provider is not None or record.active_tools or record.active_wait:
        raise _conflict("another effect is active", active=_active(record))
    attempt_id, counters = _next_id(record, "attempt")
    step_id, counters = _next_id(record, "step", counters)
    key = f"provider:{attempt_id}"
    _require_new(record, key)
    budget = reserve(record.budget, key)
    intent = {
        "kind": "provider",
        "status": "started",
        "effect_class": "read_only",
        "dispatch_state": "unknown",
        "attempt_id": attempt_id,
        "step_id": step_id,
        "started_at": command.at,
    }
    provider = {"attempt_id": attempt_id, "step_id": step_id}
    if command.turn_id is not UNSET:
        provider["turn_id"] = command.turn_id
        intent["turn_id"] = command.turn_id
    return {
        "counters": counters,
        "step_id": step_id,
        "active_provider": FrozenDict(provider),
        "intents": put(record.intents, key, FrozenDict(intent)),
        "budget": budget,
    }


def _active(record: RunRecord) -> dict[str, Any]:
    return {
        "provider": None
        if record.active_provider is None
        else record.active_provider["attempt_id"],
        "tools": sorted(record.active_tools),
        "wait": None if record.active_wait is None else record.active_wait.get("wait_id"),
    }


def _provider_completed(record: RunRecord, command: ProviderCompleted) -> dict[str, Any]:
    _require_state(record, command, "running")
    provider = record.active_provider
    attempt_id = _get(command.attempt_id)
    if provider is None:
        if attempt_id is not None and f"provider:{attempt_id}" in record.intents:
            raise _conflict("provider attempt already completed", attempt_id=attempt_id)
        raise _invalid(record, command)
    if attempt_id is not None and attempt_id != provider["attempt_id"]:
        raise _conflict(
            "stale provider attempt", expected=provider["attempt_id"], received=attempt_id
        )
    key = f"provider:{provider['attempt_id']}"
    intent = FrozenDict({**record.intents[key], "status": "consumed", "completed_at": command.at})
    changes: dict[str, Any] = {
        "active_provider": None,
        "intents": put(record.intents, key, intent),
        "provider_result": {
            "attempt_id": provider["attempt_id"],
            "result": _get(command.result),
        },
        **_with_context(record, command),
    }
    if command.final is True:
        pending = attrs.evolve(record, active_provider=None)
        _require_settled(pending)
        outcome = _get(command.outcome)
        if outcome is not None and not isinstance(outcome, Mapping):
            raise Error(ErrorClass.VALIDATION, "provider outcome must be a mapping")
        changes["state"] = "completed"
        changes["outcome"] = {**(outcome or {}), "status": "completed"}
    return changes


def _tool_invoked(record: RunRecord, command: ToolInvoked) -> dict[str, Any]:
    _require_state(record, command, "running")
    if record.active_provider is not None:
        raise _conflict("a provider attempt is active", active=_active(record))
    if record.step_id is None:
        raise _invalid(record, command)
    step_id = _get(command.step_id, record.step_id)
    if step_id != record.step_id:
        raise _conflict("stale step", expected=record.step_id, received=step_id)
    call_id = _get(command.tool_call_id)
    if call_id is not None and _invoked_in_step(record, step_id, call_id):
        raise _conflict("tool call already invoked", tool_call_id=call_id)
    invocation_id, counters = _next_id(record, "invocation")
    key = f"tool:{invocation_id}"
    _require_new(record, key)
    budget = reserve(record.budget, key)
    identity = {"invocation_id": invocation_id, "step_id": step_id}
    for name in _IDENTITY:
        value = getattr(command, name)
        if value is not UNSET:
            identity[name] = value
    intent = {
        "kind": "tool",
        "status": "started",
        "effect_class": _get(command.effect_class, "mutation"),
        "dispatch_state": _get(command.dispatch_state, "unknown"),
        "started_at": command.at,
        **identity,
    }
    return {
        "counters": counters,
        "active_tools": put(record.active_tools, invocation_id, FrozenDict(identity)),
        "intents": put(record.intents, key, FrozenDict(intent)),
        "budget": budget,
    }


def _tool_completed(record: RunRecord, command: ToolCompleted) -> dict[str, Any]:
    _require_state(record, command, "running")
    invocation_id = _get(command.invocation_id)
    if type(invocation_id) is not str:  # ids are str; a mapping is not even hashable
        raise _conflict("unknown tool invocation", invocation_id=invocation_id)
    if invocation_id not in record.active_tools:
        if invocation_id in record.tool_results:
            raise _conflict("tool invocation already completed", invocation_id=invocation_id)
        raise _conflict("unknown tool invocation", invocation_id=invocation_id)
    key = f"tool:{invocation_id}"
    intent = FrozenDict({**record.intents[key], "status": "consumed", "completed_at": command.at})
    return {
        "active_tools": dissoc(record.active_tools, str(invocation_id)),
        "intents": put(record.intents, key, intent),
        "tool_results": assoc(record.tool_results, str(invocation_id), _get(command.result)),
        **_with_context(record, command),
    }


def _wait_started(record: RunRecord, command: WaitStarted) -> dict[str, Any]:
    _require_state(record, command, "running")
    if record.active_wait is not None:
        raise _conflict("a wait is already active", wait_id=record.active_wait.get("wait_id"))
    wait_id, counters = _next_id(record, "wait")
    dependency = _get(command.dependency, wait_id)
    if type(dependency) is not str or not dependency:
        # dependencies are ids: sorted and hashed by cleanup_requirements
        raise Error(ErrorClass.VALIDATION, "wait dependency must be a non-empty str")
    return {
        "counters": counters,
        "state": "waiting_result",
        "active_wait": {"wait_id": wait_id, "dependency": dependency, "started_at": command.at},
        "dependencies": (*record.dependencies, dependency),
    }


def _wait_resolved(record: RunRecord, command: WaitResolved) -> dict[str, Any]:
    _require_state(record, command, "waiting_result")
    wait = record.active_wait
    if wait is None or _get(command.wait_id) != wait["wait_id"]:
        raise _conflict(
            "stale wait",
            expected=None if wait is None else wait["wait_id"],
            received=_get(command.wait_id),
        )
    dependencies = tuple(d for d in record.dependencies if d != wait["dependency"])
    return {"state": "running", "active_wait": None, "dependencies": dependencies}


def _child_settled(record: RunRecord, command: ChildSettled) -> dict[str, Any]:
    _require_state(record, command, "running")
    child_id = _get(command.child_id)
    child = record.children.get(child_id) if isinstance(child_id, str) else None
    if child is None or child.get("settled"):
        raise _conflict("not an owned unsettled child", child_id=child_id)
    settled = {**child, "settled": True, "outcome": _get(command.outcome)}
    return {"children": assoc(record.children, str(child_id), settled)}


def _finish(record: RunRecord, command: Finish) -> dict[str, Any]:
    _require_state(record, command, "running")
    status = _get(command.status)
    if status not in ("completed", "failed"):
        raise Error(ErrorClass.VALIDATION, "finish status must be completed or failed")
    outcome = _get(command.outcome)
    if outcome is not None and not isinstance(outcome, Mapping):
        raise Error(ErrorClass.VALIDATION, "finish outcome must be a mapping")
    _require_settled(record)
    # the outcome's status is the state's: a host's "status" key cannot contradict it
    return {"state": status, "outcome": {**(outcome or {}), "status": status}}


def _stop(reason: str) -> _Handler:
    """``cancel`` (its ``reason`` the host's, ``"cancelled"`` by default) or
    ``deadline_exceeded`` (always that reason): the final state follows the
    command, never a reason's text."""

    def handler(record: RunRecord, command: Cancel | DeadlineExceeded) -> dict[str, Any]:
        _require_state(record, command, *sorted(ACTIVE_STATES))
        given = _get(command.reason)
        stop = reason
        if reason != "deadline_exceeded" and isinstance(given, str) and given:
            if given == "deadline_exceeded":
                raise Error(
                    ErrorClass.VALIDATION,
                    "a deadline stop is the deadline_exceeded command, not a cancel reason",
                )
            stop = given
        return {
            "state": "cancelling",
            "stop_reason": stop,
            "cleanup_required": cleanup_requirements(record),
        }

    return handler


def _id_lists(settled: Any, keys: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """``settled`` as sorted id lists over ``keys`` (a missing key is empty);
    ``None`` unless it is a mapping of those keys to lists of str."""
    if not isinstance(settled, Mapping) or set(settled) - set(keys):
        return None
    lists: dict[str, list[str]] = {}
    for key in keys:
        ids = settled.get(key, ())
        if not isinstance(ids, list | tuple) or any(type(i) is not str for i in ids):
            return None
        lists[key] = sorted(ids)
    return lists


def _cleanup_settled(record: RunRecord, command: CleanupSettled) -> dict[str, Any]:
    _require_state(record, command, "cancelling")
    certainty = _get(command.certainty)
    required = thaw(record.cleanup_required or cleanup_requirements(record))
    if certainty == "confirmed":
        settled = _get(command.settled, {})
        if _id_lists(settled, required) != {k: sorted(v) for k, v in required.items()}:
            raise _conflict(
                "confirmed cleanup must settle exactly the outstanding work",
                required=required,
                settled=thaw(settled),
            )
        intents = {
            k: ({**v, "status": "cancelled"} if v.get("status") == "started" else v)
            for k, v in record.intents.items()
        }
        final = "timed_out" if record.stop_reason == "deadline_exceeded" else "cancelled"
        return {
            "state": final,
            "intents": intents,
            "active_provider": None,
            "active_tools": {},
            "active_wait": None,
            "dependencies": (),
            "outcome": {"status": final, "stop_reason": record.stop_reason, "cleanup": "confirmed"},
        }
    if certainty == "uncertain":
        evidence = _get(command.evidence)
        if not evidence:
            raise Error(ErrorClass.VALIDATION, "uncertain cleanup needs evidence")
        intents = {
            k: ({**v, "status": "uncertain"} if v.get("status") == "started" else v)
            for k, v in record.intents.items()
        }
        return {
            "state": "unknown_outcome",
            "intents": intents,
            "outcome": {
                "status": "unknown_outcome",
                "stop_reason": record.stop_reason,
                "cleanup": "uncertain",
                "evidence": evidence,
            },
        }
    raise Error(ErrorClass.VALIDATION, "cleanup certainty must be confirmed or uncertain")


_HANDLERS: Final[Mapping[type[KernelCommand], _Handler]] = {
    Admit: _admit,
    Start: _start,
    ConversationUpdated: _conversation_updated,
    ProviderStarted: _provider_started,
    ProviderCompleted: _provider_completed,
    ToolInvoked: _tool_invoked,
    ToolCompleted: _tool_completed,
    WaitStarted: _wait_started,
    WaitResolved: _wait_resolved,
    ChildSettled: _child_settled,
    Finish: _finish,
    Cancel: _stop("cancelled"),
    DeadlineExceeded: _stop("deadline_exceeded"),
    CleanupSettled: _cleanup_settled,
}
#: ``"run.<command>"`` of every command.
_EVENT_TYPES: Final = {cls: f"run.{cls.kind}" for cls in _HANDLERS}
