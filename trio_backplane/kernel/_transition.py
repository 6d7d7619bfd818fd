"""``transition(record, command) -> (record, events)``: the pure run state machine.

In the spirit of h11: explicit states, one function per command, no I/O, no
clock (time comes inside the command).  A command the state does not allow
raises ``validation``; a stale or foreign identity or a duplicate raises
``resource_conflict``; an accepted command raises the revision by exactly one
and yields one ``"run.<command>"`` event (KER-01..08).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ._records import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Command,
    FrozenDict,
    FrozenList,
    RunEvent,
    RunRecord,
    assoc,
    dissoc,
    evolve_record,
    freeze,
    kernel_event,
    put,
    reserve,
    thaw,
)

__all__ = ["COMMANDS", "cleanup_requirements", "fence", "transition"]

_Handler = Callable[[RunRecord, Command], dict[str, Any]]

#: Commands that still apply after the run deadline (KER-08).
_AFTER_DEADLINE: Final = frozenset(
    {"cancel", "deadline_exceeded", "cleanup_settled", "conversation_updated"}
)
#: Input keys whose (possibly large) values events summarise, so the event
#: log does not repeat the transcript at every checkpoint.
_DIGESTED: Final = frozenset({"conversation", "result", "messages", "usage"})


def _invalid(record: RunRecord, command: Command) -> Error:
    return Error(
        ErrorClass.VALIDATION,
        "command is invalid in the current run state",
        {"state": record.state, "command": command.kind},
    )


def _conflict(message: str, **details: Any) -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, message, details)


def _require_state(record: RunRecord, command: Command, *states: str) -> None:
    if record.state not in states:
        raise _invalid(record, command)


def _check_identity(record: RunRecord, command: Command) -> None:
    """A command naming another run or incarnation is foreign (KER-04)."""
    given = command.input
    if "run_id" in given and given["run_id"] != record.run_id:
        raise _conflict("command belongs to another run", run_id=given["run_id"])
    if "incarnation" in given and given["incarnation"] != record.incarnation:
        raise _conflict(
            "command belongs to another incarnation",
            expected=record.incarnation,
            received=given["incarnation"],
        )


def _next_id(
    record: RunRecord, kind: str, counters: Mapping[str, int] | None = None
) -> tuple[str, FrozenDict]:
    """The next ``<kind>-<incarnation>-<n>`` id and the counters that issued it
    (from ``counters`` when given, else the record's)."""
    new = FrozenDict(record.counters if counters is None else counters)
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
    """Whether a tool intent of step ``step_id`` names ``call_id``.

    Invocation numbers only grow, and every tool of the current step was
    invoked after its provider attempt: walk the numbers down from the last
    one until an intent of another step, so the check costs the step, not the
    run, whatever order a store gives the intents back in.  An id issued
    under another incarnation (a fence within the step) or missing is looked
    for among every intent."""
    intents = record.intents
    incarnation = record.incarnation
    n = record.counters.get("invocation", 0)
    while type(n) is int and n > 0:
        intent = intents.get(f"tool:invocation-{incarnation}-{n}")
        if not isinstance(intent, Mapping):
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
    grown = FrozenList(items)
    list.extend(grown, more)
    return grown


def _with_context(record: RunRecord, command: Command) -> dict[str, Any]:
    """The changes of a command's ``conversation`` (the new conversation
    state in ``context``), ``messages`` (appended to the transcript) and
    ``usage`` (appended to the usage reports) inputs."""
    given = command.input
    changes: dict[str, Any] = {}
    if "conversation" in given:
        conversation = given["conversation"]
        if type(conversation) is not FrozenDict and not isinstance(conversation, Mapping):
            raise Error(ErrorClass.VALIDATION, "conversation state must be a mapping")
        changes["context"] = assoc(record.context, "conversation", conversation)
    if "messages" in given:
        changes["transcript"] = _grown(record.transcript, given["messages"], "messages")
    if "usage" in given:
        changes["usage"] = _grown(record.usage, given["usage"], "usage")
    return changes


# -- handlers: each returns the changes to apply --------------------------------


def _admit(record: RunRecord, command: Command) -> dict[str, Any]:
    if record.admitted or record.state != "queued":
        raise _invalid(record, command)
    target = command.input.get("state", "queued")
    if target not in ("queued", "running"):
        raise Error(
            ErrorClass.VALIDATION,
            "admission state must be queued or running",
            {"state": repr(target)},
        )
    deadline = command.input.get("deadline")
    if deadline is not None and (type(deadline) not in (int, float) or deadline - deadline != 0):
        raise Error(ErrorClass.VALIDATION, "deadline must be a finite number")
    return {
        "admitted": True,
        "state": target,
        "deadline": deadline,
        **_with_context(record, command),
    }


def _start(record: RunRecord, command: Command) -> dict[str, Any]:
    if not record.admitted:
        raise _invalid(record, command)
    _require_state(record, command, "queued", "running")
    return {"state": "running"}


def _conversation_updated(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    changes = _with_context(record, command)
    later = command.input.get("execution_deadline")
    if later is not None:
        if type(later) not in (int, float) or later - later != 0:
            raise Error(ErrorClass.VALIDATION, "execution_deadline must be a finite number")
        if record.deadline is None or later > record.deadline:
            changes["deadline"] = later
    return changes


def _provider_started(record: RunRecord, command: Command) -> dict[str, Any]:
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
    if "turn_id" in command.input:
        provider["turn_id"] = command.input["turn_id"]
        intent["turn_id"] = command.input["turn_id"]
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


def _provider_completed(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    provider = record.active_provider
    attempt_id = command.input.get("attempt_id")
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
            "result": command.input.get("result"),
        },
        **_with_context(record, command),
    }
    if command.input.get("final") is True:
        pending = attrs.evolve(record, active_provider=None)
        _require_settled(pending)
        outcome = command.input.get("outcome")
        if outcome is not None and not isinstance(outcome, Mapping):
            raise Error(ErrorClass.VALIDATION, "provider outcome must be a mapping")
        changes["state"] = "completed"
        changes["outcome"] = {**(outcome or {}), "status": "completed"}
    return changes


def _tool_invoked(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    if record.active_provider is not None:
        raise _conflict("a provider attempt is active", active=_active(record))
    if record.step_id is None:
        raise _invalid(record, command)
    step_id = command.input.get("step_id", record.step_id)
    if step_id != record.step_id:
        raise _conflict("stale step", expected=record.step_id, received=step_id)
    call_id = command.input.get("tool_call_id")
    if call_id is not None and _invoked_in_step(record, step_id, call_id):
        raise _conflict("tool call already invoked", tool_call_id=call_id)
    invocation_id, counters = _next_id(record, "invocation")
    key = f"tool:{invocation_id}"
    _require_new(record, key)
    budget = reserve(record.budget, key)
    effect_class = command.input.get("effect_class", "mutation")
    identity = {
        "invocation_id": invocation_id,
        "step_id": step_id,
        **{
            k: command.input[k]
            for k in (
                "tool_name",
                "tool_revision",
                "tool_call_id",
                "turn_id",
                "arguments_digest",
                "effective_authority",
            )
            if k in command.input
        },
    }
    intent = {
        "kind": "tool",
        "status": "started",
        "effect_class": effect_class,
        "dispatch_state": command.input.get("dispatch_state", "unknown"),
        "started_at": command.at,
        **identity,
    }
    return {
        "counters": counters,
        "active_tools": put(record.active_tools, invocation_id, FrozenDict(identity)),
        "intents": put(record.intents, key, FrozenDict(intent)),
        "budget": budget,
    }


def _tool_completed(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    invocation_id = command.input.get("invocation_id")
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
        "tool_results": assoc(record.tool_results, str(invocation_id), command.input.get("result")),
        **_with_context(record, command),
    }


def _wait_started(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    if record.active_wait is not None:
        raise _conflict("a wait is already active", wait_id=record.active_wait.get("wait_id"))
    wait_id, counters = _next_id(record, "wait")
    dependency = command.input.get("dependency", wait_id)
    if type(dependency) is not str or not dependency:
        # dependencies are ids: sorted and hashed by cleanup_requirements
        raise Error(ErrorClass.VALIDATION, "wait dependency must be a non-empty str")
    return {
        "counters": counters,
        "state": "waiting_result",
        "active_wait": {"wait_id": wait_id, "dependency": dependency, "started_at": command.at},
        "dependencies": (*record.dependencies, dependency),
    }


def _wait_resolved(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "waiting_result")
    wait = record.active_wait
    if wait is None or command.input.get("wait_id") != wait["wait_id"]:
        raise _conflict(
            "stale wait",
            expected=None if wait is None else wait["wait_id"],
            received=command.input.get("wait_id"),
        )
    dependencies = tuple(d for d in record.dependencies if d != wait["dependency"])
    return {"state": "running", "active_wait": None, "dependencies": dependencies}


def _child_settled(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    child_id = command.input.get("child_id")
    child = record.children.get(child_id) if isinstance(child_id, str) else None
    if child is None or child.get("settled"):
        raise _conflict("not an owned unsettled child", child_id=child_id)
    settled = {**child, "settled": True, "outcome": command.input.get("outcome")}
    return {"children": assoc(record.children, str(child_id), settled)}


def _unsettled(record: RunRecord) -> dict[str, list[str]]:
    return {
        "provider": []
        if record.active_provider is None
        else [record.active_provider["attempt_id"]],
        "tools": sorted(record.active_tools),
        "children": sorted(k for k, c in record.children.items() if not c.get("settled")),
        "dependencies": sorted(set(record.dependencies)),
    }


def _require_settled(record: RunRecord) -> None:
    unsettled = _unsettled(record)
    if any(unsettled.values()) or record.active_wait is not None:
        raise _conflict("required work remains unsettled", unsettled=unsettled)


def _finish(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "running")
    status = command.input.get("status")
    if status not in ("completed", "failed"):
        raise Error(ErrorClass.VALIDATION, "finish status must be completed or failed")
    outcome = command.input.get("outcome")
    if outcome is not None and not isinstance(outcome, Mapping):
        raise Error(ErrorClass.VALIDATION, "finish outcome must be a mapping")
    _require_settled(record)
    # the outcome's status is the state's: a host's "status" key cannot contradict it
    return {"state": status, "outcome": {**(outcome or {}), "status": status}}


def _stop(reason: str) -> _Handler:
    """``cancel`` (its ``reason`` the host's, ``"cancelled"`` by default) or
    ``deadline_exceeded`` (always that reason): the final state follows the
    command, never a reason's text (CAN-08)."""

    def handler(record: RunRecord, command: Command) -> dict[str, Any]:
        _require_state(record, command, *sorted(ACTIVE_STATES))
        given = command.input.get("reason")
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


def _cleanup_settled(record: RunRecord, command: Command) -> dict[str, Any]:
    _require_state(record, command, "cancelling")
    certainty = command.input.get("certainty")
    required = thaw(record.cleanup_required or cleanup_requirements(record))
    if certainty == "confirmed":
        settled = command.input.get("settled", {})
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
        evidence = command.input.get("evidence")
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


COMMANDS: Final[Mapping[str, _Handler]] = {
    "admit": _admit,
    "start": _start,
    "conversation_updated": _conversation_updated,
    "provider_started": _provider_started,
    "provider_completed": _provider_completed,
    "tool_invoked": _tool_invoked,
    "tool_completed": _tool_completed,
    "wait_started": _wait_started,
    "wait_resolved": _wait_resolved,
    "child_settled": _child_settled,
    "finish": _finish,
    "cancel": _stop("cancelled"),
    "deadline_exceeded": _stop("deadline_exceeded"),
    "cleanup_settled": _cleanup_settled,
}
#: ``"run.<command>"`` of every command.
_EVENT_TYPES: Final = {kind: f"run.{kind}" for kind in COMMANDS}


def cleanup_requirements(record: RunRecord) -> Mapping[str, Any]:
    """The outstanding work a confirmed cleanup must settle, exactly:
    ``{"provider", "tools", "children", "dependencies"}`` (sorted id lists)."""
    try:
        unsettled = _unsettled(record)
    except (KeyError, TypeError, AttributeError) as exc:
        raise _malformed(exc) from None
    return freeze(unsettled)  # type: ignore[no-any-return]


def _malformed(exc: BaseException) -> Error:
    return Error(
        ErrorClass.VALIDATION,
        "record is malformed: the kernel cannot read its active work",
        {"cause": f"{type(exc).__name__}: {exc}"[:300]},
    )


#: Sorted key lists of summarised inputs, by their keys in order (a
#: conversation state has the same few keys at every checkpoint).
_KEY_LISTS: Final[dict[tuple[str, ...], FrozenList]] = {}


def _summary(value: Any) -> FrozenDict:
    """What an event says of a large input: its shape, in constant time."""
    if type(value) is FrozenDict or isinstance(value, Mapping):
        keys = tuple(value)
        listed = _KEY_LISTS.get(keys)
        if listed is None:
            listed = FrozenList(sorted(keys)[:32])
            if len(_KEY_LISTS) < 256:
                _KEY_LISTS[keys] = listed
        summary: dict[str, Any] = {"keys": listed}
        messages = value.get("messages")
        if isinstance(messages, tuple | list):
            summary["messages"] = len(messages)
        return FrozenDict(summary)
    if type(value) is FrozenList or isinstance(value, list | tuple):
        return FrozenDict({"items": len(value)})
    return FrozenDict({"type": type(value).__name__})


def _event_input(command: Command) -> FrozenDict:
    """The command input (frozen already) with large values summarised."""
    given = command.input
    if not _DIGESTED.intersection(given):
        return given  # type: ignore[return-value]  # a FrozenDict (Command freezes it)
    return FrozenDict({k: (_summary(v) if k in _DIGESTED else v) for k, v in given.items()})


def transition(
    record: RunRecord, command: Command, *, revision: int | None = None
) -> tuple[RunRecord, list[RunEvent]]:
    """Apply ``command`` to ``record``: a new record (revision + 1) and one event.

    ``revision``: the new record's revision when several commands go into one
    store commit, which raises the stored revision once: each command after
    the first keeps its record's (``revision == record.revision``)."""
    if type(record) is not RunRecord:
        raise Error(ErrorClass.VALIDATION, "transition needs a RunRecord")
    if not isinstance(command, Command):
        raise Error(ErrorClass.VALIDATION, "transition needs a Command")
    kind = command.kind
    handler = COMMANDS.get(kind) if type(kind) is str else None
    if handler is None:
        raise Error(
            ErrorClass.VALIDATION,
            "unknown command",
            {"command": kind[:100] if type(kind) is str else repr(kind)[:100]},
        )
    if record.state in TERMINAL_STATES:
        raise _invalid(record, command)
    _check_identity(record, command)
    if (
        record.deadline is not None
        and command.at > record.deadline
        and command.kind not in _AFTER_DEADLINE
    ):
        raise Error(
            ErrorClass.TIMEOUT,
            "run deadline has expired",
            {"boundary": "before_store", "deadline": record.deadline, "at": command.at},
        )
    try:
        changes = handler(record, command)
    except (KeyError, TypeError, AttributeError) as exc:
        # A record built or decoded with active work the kernel cannot read
        # (an intent that is not a mapping, an active provider without its
        # intent, ...): the caller's data, classed, never a raw exception.
        raise _malformed(exc) from None
    if revision is None:
        revision = record.revision + 1
    elif type(revision) is not int or not record.revision <= revision <= record.revision + 1:
        raise Error(
            ErrorClass.VALIDATION,
            "a transition keeps its record's revision or raises it by one",
            {"revision": repr(revision)[:100], "record_revision": record.revision},
        )
    new = evolve_record(record, revision=revision, **changes)
    payload = FrozenDict({"state": new.state, "input": _event_input(command)})
    # A float, as every store gives event times back (SQL columns are doubles)
    at = command.at
    return new, [
        kernel_event(_EVENT_TYPES[command.kind], at if type(at) is float else float(at), payload)
    ]


def fence(
    record: RunRecord, incarnation: int, *, at: float = 0.0
) -> tuple[RunRecord, list[RunEvent]]:
    """Advance ``record`` to a newer ``incarnation`` (STO-08): the old one can
    never commit again.  ``resource_conflict`` unless it is strictly newer."""
    if type(incarnation) is not int or incarnation <= record.incarnation:
        raise _conflict(
            "fence must raise the incarnation",
            stored=record.incarnation,
            requested=incarnation,
        )
    new = attrs.evolve(record, incarnation=incarnation, revision=record.revision + 1)
    event = RunEvent(
        type="run.fence",
        occurred_at=at,
        payload={"state": new.state, "input": {"incarnation": incarnation}},
    )
    return new, [event]
