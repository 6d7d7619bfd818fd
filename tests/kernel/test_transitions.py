"""The pure run kernel, behaviour by behaviour (KER-01..08, KER-11..13).

KER-09, KER-10 (the runtime gateway) and KER-14, KER-15 (the tools
package) are tested where they live.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import (
    Budget,
    Command,
    FrozenList,
    RunEvent,
    RunRecord,
    check_json,
    cleanup_requirements,
    decode_record,
    encode_record,
    fence,
    reserve,
    thaw,
    transition,
)

from .support import (
    AFTER_DEADLINE,
    ALLOWED_FROM,
    KINDS,
    PLAUSIBLE_INPUT,
    RUN,
    TERMINAL,
    admitted,
    apply,
    cmd,
    lifecycles,
    outcome_of,
    records_by_label,
    replay,
    running,
    settle_confirmed,
)

KERNEL_DIR = Path(__import__("trio_backplane.kernel").kernel.__file__).parent
INVALID = "command is invalid in the current run state"
UNSETTLED = "required work remains unsettled"


def refused(record: RunRecord, command: Command, error_class: ErrorClass) -> Error:
    """``transition`` refuses with ``error_class``; the record is untouched."""
    before = encode_record(record)
    with pytest.raises(Error) as info:
        transition(record, command)
    assert info.value.error_class is error_class, info.value
    assert encode_record(record) == before
    return info.value


def with_tools(n: int = 2, **kw: Any) -> RunRecord:
    """A running record whose step has ``n`` active tool invocations."""
    record = apply(running(**kw), cmd("provider_started"), cmd("provider_completed"))
    for i in range(n):
        record = apply(record, cmd("tool_invoked", tool_name="echo", tool_call_id=f"call-{i}"))
    return record


# -- KER-01 ---------------------------------------------------------------------


@given(lifecycles())
def test_ker01_equal_records_and_commands_give_equal_results(
    drawn: tuple[RunRecord, list[Command | int]],
) -> None:
    """KER-01: the same commands applied to equal (not identical) records give
    equal records, events and refusals."""
    initial, steps = drawn
    twin = decode_record(json.loads(json.dumps(encode_record(initial))))
    assert twin == initial
    assert twin is not initial
    assert replay(initial, steps) == replay(twin, steps)


@given(lifecycles())
def test_ker01_each_accepted_command_raises_revision_by_one_with_one_event(
    drawn: tuple[RunRecord, list[Command | int]],
) -> None:
    """KER-01: revision + 1 and exactly one ``run.<kind>`` event, stamped with
    the command's time, whose payload is the new state and the input."""
    record, steps = drawn
    for step, outcome in zip(steps, replay(record, steps), strict=True):
        new = outcome[0]
        if not isinstance(new, RunRecord):
            continue
        events = outcome[1]
        assert isinstance(events, list)
        assert new.revision == record.revision + 1
        assert len(events) == 1
        (event,) = events
        assert isinstance(event, RunEvent)
        assert event.sequence is None
        if isinstance(step, int):
            assert event.type == "run.fence"
        else:
            assert event.type == f"run.{step.kind}"
            assert event.occurred_at == step.at
            assert set(event.payload) == {"state", "input"}
        assert event.payload["state"] == new.state
        record = new


def test_ker01_time_comes_only_from_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """KER-01: a whole lifecycle with every clock disabled; every recorded
    time is a command's ``at``."""

    def no_clock(*args: object) -> float:
        raise AssertionError("the kernel read a clock")

    for name in ("time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"):
        monkeypatch.setattr(time, name, no_clock)

    record = RunRecord.new(RUN, work=5)
    script = [
        cmd("admit", 1.0, state="queued", deadline=100.0),
        cmd("start", 2.0),
        cmd("conversation_updated", 3.0, conversation={"messages": [{"role": "user"}]}),
        cmd("provider_started", 4.0),
        cmd("provider_completed", 5.0, result={"tool_calls": 1}),
        cmd("tool_invoked", 6.0, tool_name="echo", tool_call_id="c1"),
        cmd("tool_completed", 7.0, invocation_id="invocation-1-1", result={"content": "x"}),
        cmd("wait_started", 8.0, dependency="dep-1"),
        cmd("wait_resolved", 9.0, wait_id="wait-1-1"),
        cmd("provider_started", 10.0),
        cmd("provider_completed", 11.0, final=True, result={"text": "done"}),
    ]
    for command in script:
        record, (event,) = transition(record, command)
        assert event.occurred_at == command.at
    assert record.state == "completed"
    assert record.intents["provider:attempt-1-1"]["started_at"] == 4.0
    assert record.intents["provider:attempt-1-1"]["completed_at"] == 5.0
    assert record.intents["tool:invocation-1-1"]["started_at"] == 6.0
    assert record.intents["tool:invocation-1-1"]["completed_at"] == 7.0
    assert record.active_wait is None
    # the other path to a terminal state, with a fence on the way
    other = apply(running(deadline=50.0), cmd("provider_started", 1.0))
    other, (fenced,) = fence(other, 2, at=3.0)
    assert fenced.occurred_at == 3.0
    other = apply(
        other,
        cmd("deadline_exceeded", 60.0),
        cmd("cleanup_settled", 61.0, certainty="uncertain", evidence=["lost"]),
    )
    assert other.state == "unknown_outcome"


def test_ker01_events_summarise_large_inputs() -> None:
    """KER-01: the event of a checkpoint carries the conversation's shape,
    not the transcript again."""
    messages = [{"role": "user", "content": "x" * 100}] * 50
    _, (event,) = transition(
        running(), cmd("conversation_updated", conversation={"messages": messages})
    )
    assert thaw(event.payload["input"]["conversation"]) == {"keys": ["messages"], "messages": 50}


# -- KER-02 ---------------------------------------------------------------------

LABELS = records_by_label()
FORBIDDEN_PAIRS = [
    (label, kind) for kind in KINDS for label in LABELS if label not in ALLOWED_FROM[kind]
]


def test_every_state_has_a_record() -> None:
    states = {record.state for record in LABELS.values()}
    assert states == {
        "queued", "running", "waiting_approval", "waiting_result", "cancelling", *TERMINAL,
    }  # fmt: skip
    assert LABELS["queued_admitted"].admitted
    assert not LABELS["queued_new"].admitted


@pytest.mark.parametrize(("label", "kind"), FORBIDDEN_PAIRS)
def test_ker02_command_invalid_in_state(label: str, kind: str) -> None:
    """KER-02: every command, in every state API.md's table does not allow it
    from, raises validation with details state and command; no new record."""
    record = LABELS[label]
    error = refused(record, cmd(kind, **PLAUSIBLE_INPUT[kind]), ErrorClass.VALIDATION)
    assert error.message == INVALID
    assert dict(error.details) == {"state": record.state, "command": kind}


def test_ker02_matrix_covers_every_state_and_command() -> None:
    assert {kind for _, kind in FORBIDDEN_PAIRS} == set(KINDS)
    assert {label for label, _ in FORBIDDEN_PAIRS} == set(LABELS)
    # 5 terminal states refuse all 14 commands
    assert sum(1 for label, _ in FORBIDDEN_PAIRS if label in TERMINAL) == 5 * len(KINDS)


@pytest.mark.parametrize(
    ("record", "command"),
    [
        (running(), cmd("provider_completed")),  # no active provider
        (running(), cmd("tool_invoked", tool_name="echo")),  # no step yet
        (RunRecord.new(RUN), cmd("start")),  # not admitted
    ],
    ids=["provider_completed-without-attempt", "tool_invoked-without-step", "start-unadmitted"],
)
def test_ker02_command_invalid_without_its_precondition(
    record: RunRecord, command: Command
) -> None:
    """KER-02: the table's side conditions that are states, not identities."""
    error = refused(record, command, ErrorClass.VALIDATION)
    assert error.message == INVALID


def test_unknown_command_is_refused() -> None:
    error = refused(running(), cmd("explode"), ErrorClass.VALIDATION)
    assert error.message == "unknown command"


def test_kernel_02_conversation_checkpoint_only_while_running() -> None:
    """KER-02: ``conversation_updated`` applies in ``running`` only (API.md's
    table): a run that waits or is cancelling refuses it with ``validation``
    and nothing changes.  The runtime suspends a conversation's queues in the
    commit that stops it, before the stop (CAN-09, INT-10)."""
    for label in ("cancelling", "waiting_result", "waiting_approval"):
        record = LABELS[label]
        error = refused(
            record,
            cmd("conversation_updated", conversation={"queue_status": "suspended"}),
            ErrorClass.VALIDATION,
        )
        assert error.message == INVALID


# -- KER-03 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "target", [*TERMINAL, "cancelling", "waiting_result", "waiting_approval", "bogus", None, 1]
)
def test_ker03_admit_refuses_a_target_other_than_queued_or_running(target: object) -> None:
    """KER-03: admission state must be queued or running."""
    error = refused(RunRecord.new(RUN), cmd("admit", state=target), ErrorClass.VALIDATION)
    assert error.message == "admission state must be queued or running"


@pytest.mark.parametrize(
    ("given_state", "state"), [({}, "queued"), ({"state": "running"}, "running")]
)
def test_ker03_admit_sets_target_and_deadline(given_state: dict[str, str], state: str) -> None:
    record = apply(RunRecord.new(RUN), cmd("admit", 1.0, deadline=31.0, **given_state))
    assert (record.state, record.admitted, record.deadline, record.revision) == (
        state,
        True,
        31.0,
        1,
    )


@pytest.mark.parametrize("deadline", ["soon", True, [1]])
def test_admit_refuses_a_deadline_that_is_not_a_number(deadline: object) -> None:
    refused(RunRecord.new(RUN), cmd("admit", deadline=deadline), ErrorClass.VALIDATION)


# -- KER-04 and other identities ------------------------------------------------


def test_ker04_provider_completed_from_an_older_incarnation_conflicts() -> None:
    """KER-04: after a fence, the old incarnation's completion is refused."""
    record = apply(running(), cmd("provider_started"))
    attempt = record.active_provider["attempt_id"]  # type: ignore[index]
    fenced, _ = fence(record, 2)
    error = refused(
        fenced,
        cmd("provider_completed", attempt_id=attempt, incarnation=1, result={"text": "late"}),
        ErrorClass.RESOURCE_CONFLICT,
    )
    assert error.details["expected"] == 2
    assert error.details["received"] == 1
    # the current incarnation may still settle it
    done = apply(fenced, cmd("provider_completed", attempt_id=attempt, incarnation=2))
    assert done.intents[f"provider:{attempt}"]["status"] == "consumed"


@pytest.mark.parametrize(
    ("make", "command"),
    [
        (
            lambda: apply(running(), cmd("provider_started")),
            cmd("provider_completed", attempt_id="attempt-1-9"),
        ),
        (running, cmd("finish", status="completed", run_id="run-2")),
        (running, cmd("cancel", incarnation=2)),
        (
            lambda: apply(running(), cmd("provider_started"), cmd("provider_completed")),
            cmd("provider_completed", attempt_id="attempt-1-1"),
        ),
        (lambda: with_tools(1), cmd("tool_invoked", tool_name="echo", step_id="step-1-9")),
        (lambda: with_tools(1), cmd("tool_invoked", tool_name="echo", tool_call_id="call-0")),
        (lambda: with_tools(1), cmd("tool_completed", invocation_id="invocation-1-9")),
        (
            lambda: apply(with_tools(1), cmd("tool_completed", invocation_id="invocation-1-1")),
            cmd("tool_completed", invocation_id="invocation-1-1"),
        ),
        (
            lambda: apply(running(), cmd("wait_started", dependency="d")),
            cmd("wait_resolved", wait_id="wait-1-9"),
        ),
        (running, cmd("child_settled", child_id="child-1")),
        (lambda: apply(running(), cmd("provider_started")), cmd("provider_started")),
        (lambda: with_tools(1), cmd("provider_started")),
    ],
    ids=[
        "stale-attempt",
        "foreign-run",
        "foreign-incarnation",
        "duplicate-provider-completion",
        "stale-step",
        "duplicate-tool-call",
        "unknown-invocation",
        "duplicate-tool-completion",
        "stale-wait",
        "foreign-child",
        "second-provider-attempt",
        "provider-while-tools-active",
    ],
)
def test_stale_foreign_or_duplicate_identity_conflicts(make: Any, command: Command) -> None:
    """KER-04: a stale or foreign identity or a duplicate is resource_conflict."""
    refused(make(), command, ErrorClass.RESOURCE_CONFLICT)


# -- KER-05 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: with_tools(1),
        lambda: apply(running(), cmd("provider_started")),
        lambda: attrs.evolve(running(), active_wait={"wait_id": "wait-1-1", "dependency": "d"}),
        lambda: attrs.evolve(running(), dependencies=("dep-1",)),
        lambda: attrs.evolve(running(), children={"child-1": {"settled": False}}),
    ],
    ids=["active-tool", "active-provider", "active-wait", "dependency", "unsettled-child"],
)
@pytest.mark.parametrize("status", ["completed", "failed"])
def test_ker05_finish_with_unsettled_work_conflicts(make: Any, status: str) -> None:
    """KER-05: finish raises resource_conflict while work remains unsettled."""
    error = refused(make(), cmd("finish", status=status), ErrorClass.RESOURCE_CONFLICT)
    assert error.message == UNSETTLED


def test_ker05_final_provider_completion_with_unsettled_work_conflicts() -> None:
    record = attrs.evolve(apply(running(), cmd("provider_started")), dependencies=("dep-1",))
    error = refused(record, cmd("provider_completed", final=True), ErrorClass.RESOURCE_CONFLICT)
    assert error.message == UNSETTLED


def test_ker05_finish_after_settlement() -> None:
    record = attrs.evolve(running(), children={"child-1": {"settled": False}})
    record = apply(record, cmd("child_settled", child_id="child-1", outcome={"ok": True}))
    assert record.children["child-1"] == {"settled": True, "outcome": {"ok": True}}
    done = apply(record, cmd("finish", status="failed", outcome={"reason": "model gave up"}))
    assert done.state == "failed"
    assert done.outcome == {"status": "failed", "reason": "model gave up"}
    tools = with_tools(2)
    tools = apply(
        tools,
        cmd("tool_completed", invocation_id="invocation-1-2", result={"content": "b"}),
        cmd("tool_completed", invocation_id="invocation-1-1", result={"content": "a"}),
        cmd("finish", status="completed"),
    )
    assert tools.state == "completed"
    assert tools.tool_results == {
        "invocation-1-1": {"content": "a"},
        "invocation-1-2": {"content": "b"},
    }
    assert {i["status"] for i in tools.intents.values()} == {"consumed"}


@pytest.mark.parametrize("status", ["cancelled", "unknown_outcome", None, 3])
def test_finish_status_must_be_completed_or_failed(status: object) -> None:
    refused(running(), cmd("finish", status=status), ErrorClass.VALIDATION)


@pytest.mark.parametrize("outcome", ["done", 5, ["a", "b"], [["status", "x"]]])
def test_finish_outcome_must_be_a_mapping(outcome: object) -> None:
    """A finish outcome that is not a mapping is a validation error, never a
    bare exception."""
    refused(running(), cmd("finish", status="completed", outcome=outcome), ErrorClass.VALIDATION)


def test_finish_outcome_cannot_contradict_the_state() -> None:
    record = apply(
        running(), cmd("finish", status="completed", outcome={"status": "failed", "n": 1})
    )
    assert record.state == "completed"
    assert record.outcome == {"status": "completed", "n": 1}


# -- cancellation, KER-06 -------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "final"), [("cancel", "cancelled"), ("deadline_exceeded", "timed_out")]
)
@pytest.mark.parametrize(
    "label", ["queued_new", "queued_admitted", "running", "waiting_approval", "waiting_result"]
)
def test_stop_goes_through_cancelling(kind: str, final: str, label: str) -> None:
    """cancel and deadline_exceeded → cancelling with cleanup_required and the
    stop reason; a confirmed settlement → cancelled or timed_out."""
    record = LABELS[label]
    stopping = apply(record, cmd(kind))
    assert stopping.state == "cancelling"
    assert stopping.stop_reason == ("cancelled" if kind == "cancel" else "deadline_exceeded")
    assert stopping.cleanup_required == cleanup_requirements(record)
    assert set(stopping.cleanup_required) == {"provider", "tools", "children", "dependencies"}  # type: ignore[arg-type]
    done = settle_confirmed(stopping)
    assert done.state == final
    assert done.outcome is not None
    assert done.outcome["status"] == final
    assert done.outcome["cleanup"] == "confirmed"
    assert done.active_provider is None
    assert not done.active_tools
    assert done.active_wait is None
    assert done.dependencies == ()


def test_cleanup_requirements_lists_outstanding_work() -> None:
    record = attrs.evolve(
        with_tools(2),
        children={"child-b": {"settled": False}, "child-a": {"settled": True}},
        dependencies=("dep-2", "dep-1", "dep-2"),
    )
    assert thaw(cleanup_requirements(record)) == {
        "provider": [],
        "tools": ["invocation-1-1", "invocation-1-2"],
        "children": ["child-b"],
        "dependencies": ["dep-1", "dep-2"],
    }
    provider = apply(running(), cmd("provider_started"))
    assert thaw(cleanup_requirements(provider))["provider"] == ["attempt-1-1"]


def test_ker06_confirmed_cleanup_settles_exactly_the_requirements() -> None:
    """KER-06: exactly the outstanding work, in any order, is accepted;
    started intents are cancelled and consumed ones kept."""
    record = apply(with_tools(2), cmd("tool_completed", invocation_id="invocation-1-1"))
    record = apply(record, cmd("tool_invoked", tool_name="echo", tool_call_id="call-9"))
    stopping = apply(record, cmd("cancel"))
    done = apply(
        stopping,
        cmd(
            "cleanup_settled",
            certainty="confirmed",
            settled={"tools": ["invocation-1-3", "invocation-1-2"], "provider": []},
        ),
    )
    assert done.state == "cancelled"
    assert {k: v["status"] for k, v in done.intents.items()} == {
        "provider:attempt-1-1": "consumed",
        "tool:invocation-1-1": "consumed",
        "tool:invocation-1-2": "cancelled",
        "tool:invocation-1-3": "cancelled",
    }
    assert done.tool_results == {"invocation-1-1": None}


@pytest.mark.parametrize(
    "settled",
    [
        {"tools": ["invocation-1-1"]},  # one missing
        {"tools": ["invocation-1-1", "invocation-1-2", "invocation-1-3"]},  # one extra
        {"tools": ["invocation-1-1", "invocation-1-2"], "children": ["child-1"]},
        {"tools": ["invocation-1-1", "invocation-1-2"], "resources": []},  # unknown key
        {"tools": "invocation-1-1"},
        {"tools": 5},
        {"tools": ["invocation-1-1", 2]},
        {"tools": [{"id": "invocation-1-1"}, {"id": "invocation-1-2"}]},
        ["invocation-1-1", "invocation-1-2"],
        "all",
    ],
)
def test_ker06_confirmed_cleanup_other_than_the_requirements_conflicts(settled: Any) -> None:
    """KER-06: anything but exactly the outstanding work is resource_conflict."""
    stopping = apply(with_tools(2), cmd("cancel"))
    error = refused(
        stopping,
        cmd("cleanup_settled", certainty="confirmed", settled=settled),
        ErrorClass.RESOURCE_CONFLICT,
    )
    assert error.details["required"]["tools"] == ["invocation-1-1", "invocation-1-2"]


def test_ker06_confirmed_cleanup_of_nothing() -> None:
    stopping = apply(running(), cmd("cancel"))
    refused(
        stopping,
        cmd("cleanup_settled", certainty="confirmed", settled={"tools": ["ghost"]}),
        ErrorClass.RESOURCE_CONFLICT,
    )
    assert apply(stopping, cmd("cleanup_settled", certainty="confirmed")).state == "cancelled"


def test_uncertain_cleanup_keeps_active_work() -> None:
    """Uncertain settlement: started intents → uncertain, active work kept,
    → unknown_outcome with the evidence."""
    record = apply(with_tools(2), cmd("tool_completed", invocation_id="invocation-1-1"))
    stopping = apply(record, cmd("deadline_exceeded"))
    done = apply(stopping, cmd("cleanup_settled", certainty="uncertain", evidence=["backend hung"]))
    assert done.state == "unknown_outcome"
    assert set(done.active_tools) == {"invocation-1-2"}
    assert done.intents["tool:invocation-1-2"]["status"] == "uncertain"
    assert done.intents["tool:invocation-1-1"]["status"] == "consumed"
    assert thaw(done.outcome) == {
        "status": "unknown_outcome",
        "stop_reason": "deadline_exceeded",
        "cleanup": "uncertain",
        "evidence": ["backend hung"],
    }
    provider = apply(running(), cmd("provider_started"), cmd("cancel"))
    provider = apply(
        provider, cmd("cleanup_settled", certainty="uncertain", evidence={"why": "lost"})
    )
    assert provider.active_provider == {"attempt_id": "attempt-1-1", "step_id": "step-1-1"}
    assert provider.intents["provider:attempt-1-1"]["status"] == "uncertain"


@pytest.mark.parametrize(
    "given_input",
    [
        {"certainty": "uncertain"},
        {"certainty": "uncertain", "evidence": []},
        {"certainty": "maybe"},
        {},
    ],
)
def test_cleanup_needs_a_certainty_and_evidence(given_input: dict[str, Any]) -> None:
    refused(
        apply(running(), cmd("cancel")),
        cmd("cleanup_settled", **given_input),
        ErrorClass.VALIDATION,
    )


@pytest.mark.parametrize("label", TERMINAL)
@pytest.mark.parametrize("kind", KINDS)
def test_terminal_states_are_final(label: str, kind: str) -> None:
    """A terminal run refuses every command with validation."""
    error = refused(LABELS[label], cmd(kind, **PLAUSIBLE_INPUT[kind]), ErrorClass.VALIDATION)
    assert error.message == INVALID


# -- KER-07 ---------------------------------------------------------------------


def test_ker07_tool_invoked_while_provider_active_conflicts() -> None:
    """KER-07: refused with resource_conflict; no reservation, no intent."""
    record = apply(running(), cmd("provider_started"))
    error = refused(
        record,
        cmd("tool_invoked", tool_name="echo", tool_call_id="c"),
        ErrorClass.RESOURCE_CONFLICT,
    )
    assert error.details["active"]["provider"] == "attempt-1-1"
    assert record.budget.used == 1
    assert set(record.intents) == {"provider:attempt-1-1"}


# -- KER-08 ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_ker08_after_the_deadline_only_stop_cleanup_and_checkpoint_apply(kind: str) -> None:
    """KER-08: after the deadline a command other than cancel,
    deadline_exceeded, cleanup_settled and conversation_updated raises
    timeout "run deadline has expired" (boundary before_store)."""
    record = apply(running(deadline=10.0), cmd("provider_started", 5.0))
    command = cmd(kind, 10.5, **PLAUSIBLE_INPUT[kind])
    if kind in AFTER_DEADLINE:
        _, exc = outcome_of(lambda: transition(record, command))
        assert exc is None or exc.error_class is not ErrorClass.TIMEOUT
    else:
        error = refused(record, command, ErrorClass.TIMEOUT)
        assert error.message == "run deadline has expired"
        assert error.details["boundary"] == "before_store"


def test_ker08_deadline_boundary_and_settlement() -> None:
    record = apply(running(deadline=10.0), cmd("provider_started", 5.0))
    # at the deadline itself the run is still in time
    on_time = apply(record, cmd("provider_completed", 10.0))
    assert on_time.provider_result is not None
    refused(record, cmd("provider_completed", 10.000001), ErrorClass.TIMEOUT)
    refused(admitted(deadline=1.0), cmd("start", 2.0), ErrorClass.TIMEOUT)
    late = apply(
        record,
        cmd("conversation_updated", 11.0, conversation={"messages": []}),
        cmd("conversation_updated", 11.5, conversation={"queue_status": "suspended"}),
        cmd("deadline_exceeded", 12.0),
        cmd("cleanup_settled", 14.0, certainty="uncertain", evidence=["stream cut"]),
    )
    assert late.state == "unknown_outcome"


def test_checkpoint_moves_the_deadline_only_later() -> None:
    """``execution_deadline`` (INT-07) moves the deadline later, never earlier."""
    record = running(deadline=10.0)
    assert apply(record, cmd("conversation_updated", execution_deadline=25.0)).deadline == 25.0
    assert apply(record, cmd("conversation_updated", execution_deadline=5.0)).deadline == 10.0
    extended = apply(record, cmd("conversation_updated", 12.0, execution_deadline=30.0))
    assert apply(extended, cmd("provider_started", 20.0)).active_provider is not None


# -- KER-11 ---------------------------------------------------------------------


class Handle:
    pass


def _handles() -> list[Any]:
    send, receive = trio.open_memory_channel[int](0)
    send.close()
    receive.close()
    return [lambda: None, print, Handle(), object(), send, receive, {1, 2}, b"bytes", 1j]


@pytest.mark.parametrize("handle", _handles(), ids=lambda h: type(h).__name__)
def test_ker11_runtime_handles_are_refused(handle: Any) -> None:
    """KER-11: a callable, a channel or another runtime object anywhere in a
    record or a command input raises validation ("runtime handle")."""
    places: list[Any] = [
        lambda: Command("tool_completed", 0.0, {"result": {"nested": [1, handle]}}),
        lambda: RunRecord.new(RUN, context={"host": handle}),
        lambda: RunRecord(run_id=RUN, intents={"tool:x": {"status": "started", "backend": handle}}),
        lambda: attrs.evolve(running(), context={"deep": [[{"x": handle}]]}),
        lambda: attrs.evolve(running(), outcome={"x": handle}),
        lambda: check_json({"x": handle}),
    ]
    for place in places:
        with pytest.raises(Error) as info:
            place()
        assert info.value.error_class is ErrorClass.VALIDATION
        assert "runtime handle" in info.value.message


def test_ker11_non_string_keys_and_non_finite_numbers_are_refused() -> None:
    with pytest.raises(Error, match="has a key that is not a string"):
        RunRecord.new(RUN, context={"x": {1: "a"}})
    for bad in (float("nan"), float("inf")):
        with pytest.raises(Error, match="non-finite"):
            Command("provider_completed", 0.0, {"result": [bad]})
        with pytest.raises(Error, match="finite number"):
            Command("start", bad)


# -- KER-12, KER-13 --------------------------------------------------------------


def test_ker12_reserving_again_with_the_same_amount_changes_nothing() -> None:
    """KER-12: same id and amount → unchanged (even at the quota)."""
    budget = reserve(reserve(Budget(quota=2), "tool:a"), "tool:b", 1)
    assert reserve(budget, "tool:a") == budget
    assert reserve(budget, "tool:b", 1) == budget
    assert budget.used == 2


def test_ker12_reserving_again_with_another_amount_conflicts() -> None:
    """KER-12: same id, different amount → resource_conflict."""
    budget = reserve(Budget(quota=10), "tool:a", 2)
    with pytest.raises(Error) as info:
        reserve(budget, "tool:a", 3)
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert budget.used == 2


@pytest.mark.parametrize(("quota", "held", "amount"), [(1, 1, 1), (3, 2, 2), (5, 0, 6)])
def test_ker13_reservation_beyond_the_quota(quota: int, held: int, amount: int) -> None:
    """KER-13: budget_exceeded with details used, requested and quota."""
    budget = Budget(quota=quota)
    if held:
        budget = reserve(budget, "tool:held", held)
    with pytest.raises(Error) as info:
        reserve(budget, "tool:new", amount)
    assert info.value.error_class is ErrorClass.BUDGET_EXCEEDED
    assert dict(info.value.details) == {"used": held, "requested": amount, "quota": quota}


@pytest.mark.parametrize("amount", [0, -1, 1.0, True, "1"])
def test_reservation_amount_must_be_a_positive_int(amount: Any) -> None:
    with pytest.raises(Error) as info:
        reserve(Budget(quota=5), "tool:a", amount)
    assert info.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize("quota", [0, -1, 1.5, "3", True])
def test_quota_must_be_a_positive_int(quota: Any) -> None:
    with pytest.raises(Error):
        Budget(quota=quota)


def test_ker13_effects_beyond_the_work_quota_are_refused() -> None:
    """KER-13 through the kernel: each attempt and invocation reserves one unit."""
    record = apply(running(work=2), cmd("provider_started"), cmd("provider_completed"))
    record = apply(record, cmd("tool_invoked", tool_name="echo", tool_call_id="a"))
    assert record.budget.used == 2
    assert dict(record.budget.reservations) == {"provider:attempt-1-1": 1, "tool:invocation-1-1": 1}
    error = refused(
        record, cmd("tool_invoked", tool_name="echo", tool_call_id="b"), ErrorClass.BUDGET_EXCEEDED
    )
    assert dict(error.details) == {"used": 2, "requested": 1, "quota": 2}
    record = apply(record, cmd("tool_completed", invocation_id="invocation-1-1"))
    error = refused(record, cmd("provider_started"), ErrorClass.BUDGET_EXCEEDED)
    assert error.details["quota"] == 2


# -- fence ----------------------------------------------------------------------


def test_fence_raises_incarnation_and_revision() -> None:
    record = apply(running(), cmd("provider_started"))
    fenced, (event,) = fence(record, 3, at=7.0)
    assert (fenced.incarnation, fenced.revision) == (3, record.revision + 1)
    assert attrs.evolve(fenced, incarnation=1, revision=record.revision) == record
    assert event == RunEvent("run.fence", 7.0, {"state": "running", "input": {"incarnation": 3}})
    # new identities carry the new incarnation
    after = apply(fenced, cmd("provider_completed"), cmd("provider_started"))
    assert after.active_provider["attempt_id"] == "attempt-3-2"  # type: ignore[index]
    # a terminal run can be fenced too (recovery fences before classifying)
    assert fence(LABELS["unknown_outcome"], 2)[0].incarnation == 2


@pytest.mark.parametrize("incarnation", [1, 2, 0, -1, "3", 3.0, None])
def test_fence_refuses_a_non_increasing_incarnation(incarnation: Any) -> None:
    record = attrs.evolve(running(), incarnation=2)
    with pytest.raises(Error) as info:
        fence(record, incarnation)
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT


# -- purity and immutability ----------------------------------------------------

FORBIDDEN_MODULES = {"trio", "sqlite3", "socket", "time", "os", "threading", "asyncio"}
PURE_STDLIB = {
    "__future__",
    "re",
    "collections",
    "collections.abc",
    "typing",
    "types",
    "enum",
    "functools",
    "json",  # text encoding of JSON data: no I/O
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in ``path``, however nested."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((0, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            found.append((0, "__import__"))
    return found


def test_kernel_imports_only_pure_modules() -> None:
    """The kernel is sans-I/O: stdlib-pure modules, attrs, cattrs, the
    package's ``errors`` and ``_public`` (module paths) and the kernel's own
    modules; nothing else."""
    modules = sorted(KERNEL_DIR.glob("*.py"))
    assert {m.name for m in modules} >= {
        "__init__.py",
        "_records.py",
        "_transition.py",
        "_codec.py",
    }
    for module in modules:
        for level, name in _imports(module):
            if level == 0:
                top = name.split(".")[0]
                assert (
                    name in PURE_STDLIB
                    or top in {"attrs", "cattrs"}
                    or name
                    in {
                        "trio_backplane.errors",
                        "trio_backplane.kernel",
                    }
                    or name.startswith("trio_backplane.kernel.")
                ), f"{module.name} imports {name}"
            elif level == 1:
                own = name.split(".")[0]
                # a kernel module, or its C accelerator of freeze (no I/O either)
                assert (
                    name == ""
                    or (KERNEL_DIR / f"{own}.py").exists()
                    or (KERNEL_DIR / f"{own}.c").exists()
                ), name
            else:
                assert (level, name) in {(2, "errors"), (2, "_public")}, (
                    f"{module.name} imports {'.' * level}{name}"
                )
    errors = KERNEL_DIR.parent / "errors.py"
    assert not {name.split(".")[0] for _, name in _imports(errors)} & FORBIDDEN_MODULES


def test_importing_the_kernel_loads_no_io_module() -> None:
    """Importing ``trio_backplane.kernel`` alone (not the package's public
    ``__init__``) loads neither Trio nor any I/O module."""
    code = (
        "import importlib.util, sys, types\n"
        "before = set(sys.modules)\n"
        "spec = importlib.util.find_spec('trio_backplane')\n"
        "pkg = types.ModuleType('trio_backplane')\n"
        "pkg.__path__ = list(spec.submodule_search_locations)\n"
        "pkg.__spec__ = spec\n"
        "sys.modules['trio_backplane'] = pkg\n"
        "import trio_backplane.kernel\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout))
    assert "trio_backplane.kernel._transition" in loaded
    # threading comes with attrs' own imports; time and os load at startup
    io = {
        "trio",
        "sqlite3",
        "socket",
        "asyncio",
        "selectors",
        "subprocess",
        "psycopg",
        "trio_backplane.store",
    }
    assert not {m for m in loaded if m.split(".")[0] in io or m in io}


def test_records_are_immutable() -> None:
    record = with_tools(1)
    with pytest.raises(TypeError):
        record.intents["tool:invocation-1-1"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        record.intents["tool:invocation-1-1"]["status"] = "consumed"
    with pytest.raises(TypeError):
        del record.active_tools["invocation-1-1"]  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        record.budget.reservations.update({"x": 1})  # type: ignore[attr-defined]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.state = "completed"  # type: ignore[misc]
    context = RunRecord.new(RUN, context={"list": [1, {"a": [2]}]}).context
    assert isinstance(context["list"], FrozenList)
    with pytest.raises(TypeError):
        context["list"][1]["a"] = 3
    with pytest.raises(TypeError):
        context["list"].append(3)
    with pytest.raises(TypeError):
        context["list"][0] = 5


@given(st.data())
def test_transition_never_mutates_its_input(data: st.DataObject) -> None:
    initial, steps = data.draw(lifecycles(max_steps=20))
    record = initial
    for step in steps:
        snapshot = json.dumps(encode_record(record), sort_keys=True)
        try:
            new = fence(record, step)[0] if isinstance(step, int) else transition(record, step)[0]
        except Error:
            new = record
        assert json.dumps(encode_record(record), sort_keys=True) == snapshot
        record = new


# -- inputs that are not ids: refusals with a class, never a bare exception -----


@pytest.mark.parametrize("dependency", ["", 3, {"child": "c"}, ["a"], None])
def test_wait_dependency_must_be_an_id(dependency: object) -> None:
    """A dependency is an id that cleanup_requirements sorts and settles."""
    error = refused(running(), cmd("wait_started", dependency=dependency), ErrorClass.VALIDATION)
    assert error.message == "wait dependency must be a non-empty str"


def test_wait_round_trip_restores_running() -> None:
    waiting = apply(running(), cmd("wait_started", dependency="child-7"))
    assert waiting.state == "waiting_result"
    assert waiting.dependencies == ("child-7",)
    assert thaw(cleanup_requirements(waiting))["dependencies"] == ["child-7"]
    resumed = apply(waiting, cmd("wait_resolved", wait_id="wait-1-1"))
    assert (resumed.state, resumed.active_wait, resumed.dependencies) == ("running", None, ())


@pytest.mark.parametrize("invocation_id", [{"id": 1}, ["invocation-1-1"], 1, None])
def test_tool_completed_with_a_non_id_conflicts(invocation_id: object) -> None:
    refused(
        with_tools(1),
        cmd("tool_completed", invocation_id=invocation_id),
        ErrorClass.RESOURCE_CONFLICT,
    )


def test_wait_resolved_without_a_stored_wait_conflicts() -> None:
    """A (decoded) record waiting with no wait stored refuses with a class."""
    record = attrs.evolve(running(), state="waiting_result")
    refused(record, cmd("wait_resolved", wait_id="wait-1-1"), ErrorClass.RESOURCE_CONFLICT)


@pytest.mark.parametrize("outcome", ["done", 5, ["a"]])
def test_final_provider_outcome_must_be_a_mapping(outcome: object) -> None:
    record = apply(running(), cmd("provider_started"))
    refused(record, cmd("provider_completed", final=True, outcome=outcome), ErrorClass.VALIDATION)
    done = apply(
        record, cmd("provider_completed", final=True, outcome={"status": "failed", "n": 1})
    )
    assert (done.state, done.outcome) == ("completed", {"n": 1, "status": "completed"})


@pytest.mark.parametrize(
    "at", [2**53 + 1, -(2**53) - 1, 2**63, 10**400, True, float("nan")], ids=repr
)
def test_ker_01_a_time_no_store_can_hold_is_refused(at: Any) -> None:
    """KER-01: a command's time is a finite number every store's time column
    holds exactly: an int of more than 2**53 in magnitude (SQL stores keep
    event times as doubles) is refused with validation like NaN, and so is
    an event carrying one at commit (``check_commit``)."""
    with pytest.raises(Error) as info:
        Command("admit", at, {"state": "running"})
    assert info.value.error_class is ErrorClass.VALIDATION
    for fine in (2**53, -(2**53), 1e300):
        assert Command("admit", fine, {"state": "running"}).at == fine


# -- records as a store may give them back, and records damaged outside ----------


def _reordered(record: RunRecord) -> RunRecord:
    """``record`` with its intents in key order (as a SQL store's part rows
    may come back): equal, in another order."""
    intents = dict(sorted(record.intents.items()))
    reordered = attrs.evolve(record, intents=intents)
    assert reordered == record
    assert list(reordered.intents) != list(record.intents)
    return reordered


def test_ker_01_a_duplicate_call_is_refused_whatever_the_order_of_the_intents() -> None:
    """KER-01, KER-12: a record equal to another gives the same result: a
    second ``tool_invoked`` of a call of the current step is refused with
    ``resource_conflict`` even when the intents come back in key order
    (``invocation-1-10`` before ``invocation-1-9``), as SQLite gives them."""
    record = with_tools(9)
    record = apply(record, *(cmd("tool_completed", invocation_id=i) for i in record.active_tools))
    record = apply(record, cmd("provider_started"), cmd("provider_completed"))
    record = apply(record, cmd("tool_invoked", tool_name="echo", tool_call_id="A"))
    assert "tool:invocation-1-10" in record.intents
    for candidate in (record, _reordered(record)):
        error = refused(
            candidate,
            cmd("tool_invoked", tool_name="echo", tool_call_id="A"),
            ErrorClass.RESOURCE_CONFLICT,
        )
        assert error.message == "tool call already invoked"
        # a call of an earlier step is another step's: invoked again here
        assert transition(candidate, cmd("tool_invoked", tool_name="echo", tool_call_id="call-0"))


def test_ker_12_counters_behind_the_intents_never_reissue_an_effect_id() -> None:
    """KER-12: a record whose counters lag its intents (edited, or restored
    from an older copy) never reissues an effect id: ``resource_conflict``,
    not an overwritten intent and a reservation passed off as a replay."""
    record = with_tools(1)
    record = apply(record, cmd("tool_completed", invocation_id="invocation-1-1"))
    lagging = attrs.evolve(record, counters={**record.counters, "invocation": 0})
    error = refused(lagging, cmd("tool_invoked", tool_name="x"), ErrorClass.RESOURCE_CONFLICT)
    assert error.details["key"] == "tool:invocation-1-1"
    behind = attrs.evolve(record, counters={**record.counters, "attempt": 0})
    refused(behind, cmd("provider_started"), ErrorClass.RESOURCE_CONFLICT)


@pytest.mark.parametrize("counter", [-1, 1.0, True, "1"], ids=repr)
def test_ker_02_a_counter_that_is_not_a_non_negative_int_is_validation(counter: Any) -> None:
    """KER-02: an effect id is never issued from a counter the kernel does
    not keep (negative, a float, a bool, text): ``validation``, never an id
    like ``invocation-1-2.0`` that no duplicate check can find."""
    record = with_tools(1)
    damaged = attrs.evolve(record, counters={**record.counters, "invocation": counter})
    error = refused(damaged, cmd("tool_invoked", tool_name="x"), ErrorClass.VALIDATION)
    assert error.message.startswith("record is malformed")


def test_ker_12_a_duplicate_call_is_refused_after_a_fence_within_the_step() -> None:
    """KER-12: after a fence within a step (the step's tool intents carry
    the old incarnation's ids), a call of that step is still refused as
    invoked, whatever the counters say."""
    record = with_tools(2)
    fenced, _ = fence(record, 2)
    for counters in (fenced.counters, {}):
        candidate = attrs.evolve(fenced, counters=counters)
        refused(
            candidate,
            cmd("tool_invoked", tool_name="echo", tool_call_id="call-1", incarnation=2),
            ErrorClass.RESOURCE_CONFLICT,
        )


def _damaged() -> dict[str, tuple[RunRecord, Command]]:
    """Records the codec decodes whose active work the kernel cannot read,
    and a command that reads it."""
    tools = with_tools(1)
    provider = apply(running(), cmd("provider_started"))
    return {
        "provider without its intent": (
            attrs.evolve(provider, intents={}),
            cmd("provider_completed"),
        ),
        "intent not a mapping": (
            attrs.evolve(tools, intents={**tools.intents, "tool:invocation-1-1": 5}),
            cmd("tool_completed", invocation_id="invocation-1-1"),
        ),
        "child not a mapping": (
            attrs.evolve(running(), children={"c": 5}),
            cmd("cancel"),
        ),
        "counters not ints": (
            attrs.evolve(running(), counters={"attempt": "1"}),
            cmd("provider_started"),
        ),
    }


@pytest.mark.parametrize("case", sorted(_damaged()))
def test_ker_02_a_record_the_kernel_cannot_read_is_validation(case: str) -> None:
    """KER-02, STO-09: a record (built, or decoded from a store) whose active
    work the kernel cannot read makes a command that reads it ``validation``
    "record is malformed", never a raw ``KeyError``/``TypeError``/
    ``AttributeError``; ``cleanup_requirements`` (recovery's reading) too."""
    record, command = _damaged()[case]
    error = refused(record, command, ErrorClass.VALIDATION)
    assert error.message.startswith("record is malformed"), error
    if case == "child not a mapping":
        with pytest.raises(Error) as info:
            cleanup_requirements(record)
        assert info.value.error_class is ErrorClass.VALIDATION


def test_can_08_the_command_decides_timed_out_never_the_reason_text() -> None:
    """CAN-08: ``deadline_exceeded`` with any reason text and a confirmed
    cleanup ends ``timed_out``; a ``cancel`` ends ``cancelled`` whatever its
    reason, and a cancel may not call itself a deadline."""
    for kind, reason, final in (
        ("deadline_exceeded", "run deadline of 300 s passed", "timed_out"),
        ("deadline_exceeded", None, "timed_out"),
        ("cancel", "user pressed stop", "cancelled"),
    ):
        data = {} if reason is None else {"reason": reason}
        stopping = apply(running(), cmd(kind, **data))
        assert settle_confirmed(stopping).state == final, (kind, reason)
    refused(running(), cmd("cancel", reason="deadline_exceeded"), ErrorClass.VALIDATION)


def test_ker01_commands_of_one_commit_share_its_revision() -> None:
    """KER-01 for a commit of several commands: each after the first keeps
    the revision the first raised (the store raises it once); any other
    revision is refused, the record unchanged."""
    record = RunRecord.new("r", work=10)
    admitted, _ = transition(record, Command("admit", 1.0, {"state": "running"}))
    started, events = transition(admitted, Command("provider_started", 2.0), revision=1)
    assert (admitted.revision, started.revision, len(events)) == (1, 1, 1)
    for bad in (0, 3, "2", None.__class__):
        with pytest.raises(Error) as raised:
            transition(admitted, Command("provider_started", 2.0), revision=bad)  # type: ignore[arg-type]
        assert raised.value.error_class is ErrorClass.VALIDATION
    assert transition(admitted, Command("provider_started", 2.0))[0].revision == 2
