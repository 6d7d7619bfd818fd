"""Human interactions, approvals and deadline suspension: the INT behaviours
(and EVT-11) of BEHAVIOURS.md.

Every conversation runs on ``MemoryStore`` (wrapped in ``TimelineStore``, and
in ``FaultyStore`` where a commit must be slowed or broken) under
``MockClock(autojump_threshold=0)``, so the times below are exact.  The host
is a :class:`Host` task reading ``conversation.subscribe()`` and calling
``conversation.resolve``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import RunRecord, thaw
from trio_backplane.runtime import Conversation, DeadlineBudget, Event
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import (
    Approval,
    ApprovalDecision,
    ToolResult,
    arguments_digest,
    decide_approval,
)

from .support import (
    RUN_ID,
    Fault,
    FaultyStore,
    Host,
    RecordingBackend,
    conversation_with,
    make_tool,
    pending_of,
    run_with_host,
    string_schema,
)

SP = ScriptedProvider
QUESTION = {"kind": "question", "text": "Which branch?"}


def calls_then_done(*calls: tuple[str, str, Any]) -> ScriptedProvider:
    return SP([SP.tool_calls(*calls), SP.text("done")])


def after(delay: float, answer: Any = "approved") -> Any:
    """A host policy: answer every interaction ``delay`` seconds after it is requested."""
    return lambda _event: (delay, answer)


def never(_event: Event) -> None:
    return None


async def until(predicate: Any, step: float = 0.5) -> None:
    """Poll (in mock time) until ``predicate()`` holds."""
    while not predicate():
        await trio.sleep(step)


def resolution_commit(store: FaultyStore) -> Any:
    """A ``Fault.when`` matching the checkpoint that resolves an interaction."""

    def when(kind: str, record: RunRecord) -> bool:
        last = store.last_acknowledged()
        return (
            kind == "conversation_updated"
            and pending_of(record) is None
            and last is not None
            and pending_of(last) is not None
        )

    return when


def pending_commit(kind: str, record: RunRecord) -> bool:
    """A ``Fault.when`` matching the checkpoint that opens an interaction."""
    return kind == "conversation_updated" and pending_of(record) is not None


def asking(log: dict[str, Any], then: Any = None) -> Any:
    """A backend outcome: ask ``QUESTION``, note the answer and when it arrived,
    then run ``then(operation)`` (async) if given."""

    async def run(operation: Any) -> Any:
        log["asked_at"] = trio.current_time()
        try:
            log["answer"] = await operation.context.interact(QUESTION)
        except trio.Cancelled:
            log["cancelled_at"] = trio.current_time()
            raise
        log["answered_at"] = trio.current_time()
        if then is not None:
            return await then(operation)
        return ToolResult(f"answer: {log['answer']}")

    return run


# -- approvals -------------------------------------------------------------------


async def test_int_01_permission_request_before_any_backend_call(
    autojump_clock: MockClock,
) -> None:
    """INT-01: an approval-gated call emits ``interaction_requested`` with
    ``{"kind": "permission", "operation": <the invocation>}`` and no backend is
    called before the resolution."""
    backend = RecordingBackend()
    calls_at_request: list[int] = []

    def policy(_event: Event) -> tuple[float, Any]:
        calls_at_request.append(backend.calls)
        return 12.0, "approved"

    arguments = {"target": "prod"}
    tool = make_tool("deploy", backend, schema=string_schema("target"), requires_approval=True)
    provider = calls_then_done(("call-1", "deploy", arguments))
    finished, host = await run_with_host(provider, [tool], policy)

    [requested] = host.of("interaction_requested")
    request = requested.payload["request"]
    assert request["kind"] == "permission"
    assert set(request) == {"kind", "operation"}
    operation = request["operation"]
    assert operation["tool_name"] == "deploy"
    assert operation["tool_call_id"] == "call-1"
    assert operation["run_id"] == RUN_ID
    assert operation["incarnation"] == 1
    assert operation["tool_revision"] == 1
    assert operation["arguments"] == arguments
    assert operation["arguments_digest"] == arguments_digest(arguments)
    assert calls_at_request == [0]
    assert backend.calls == 1
    assert backend.operations[0].arguments == arguments
    assert finished.record.state == "completed"
    [(resolved_at, _)] = host.resolved
    assert resolved_at == host.requested[0][0] + 12.0


async def test_int_02_exact_approved_dispatches(autojump_clock: MockClock) -> None:
    """INT-02: exactly ``"approved"`` dispatches the tool."""
    backend = RecordingBackend(ToolResult("deployed"))
    tool = make_tool("deploy", backend, requires_approval=True)
    provider = calls_then_done(("call-1", "deploy", {}))
    finished, host = await run_with_host(provider, [tool], after(1.0, "approved"))
    assert backend.calls == 1
    [message] = finished.tool_messages()
    assert message["result"]["is_error"] is False
    assert message["result"]["content"] == "deployed"
    assert host.errors == []
    assert finished.record.state == "completed"


@pytest.mark.parametrize("answer", [True, "yes", "Approved", "approved ", "denied", None, 1, {}])
async def test_int_02_int_03_any_other_answer_denies(
    autojump_clock: MockClock, answer: Any
) -> None:
    """INT-02, INT-03: any answer other than ``"approved"`` is a denial: an
    error tool result "approval denied", no backend call, the provider
    continues, ``resolve`` does not raise, and no unit of work is consumed."""
    backend = RecordingBackend()
    tool = make_tool("deploy", backend, requires_approval=True)
    provider = calls_then_done(("call-1", "deploy", {}))
    finished, host = await run_with_host(provider, [tool], after(3.0, answer))
    assert backend.calls == 0
    assert host.errors == []
    assert len(host.resolved) == 1
    [message] = finished.tool_messages()
    assert message["result"]["is_error"] is True
    assert message["result"]["content"] == "approval denied"
    assert len(provider.requests) == 2
    assert finished.record.state == "completed"
    # INT-03: only the two provider attempts reserved work, no tool did
    assert finished.record.budget.used == 2
    assert not [key for key in finished.record.intents if key.startswith("tool:")]


async def test_int_03_denial_consumes_no_work_where_approval_would(
    autojump_clock: MockClock,
) -> None:
    """INT-03: with ``work=2`` a denied call leaves the run able to finish, while
    an approved one spends the quota (its reservation is the third unit)."""
    denied, _ = await run_with_host(
        calls_then_done(("call-1", "deploy", {})),
        [make_tool("deploy", RecordingBackend(), requires_approval=True)],
        after(1.0, "no"),
        work=2,
    )
    assert denied.record.state == "completed"
    assert denied.record.budget.used == 2
    approved, _ = await run_with_host(
        calls_then_done(("call-1", "deploy", {})),
        [make_tool("deploy", RecordingBackend(), requires_approval=True)],
        after(1.0, "approved"),
        work=2,
    )
    assert approved.record.state == "failed"
    assert approved.record.outcome is not None
    assert approved.record.outcome["error"]["class"] == "budget_exceeded"


# -- resolve ---------------------------------------------------------------------


async def test_int_04_unknown_and_repeated_ids_are_not_found(autojump_clock: MockClock) -> None:
    """INT-04: an unknown id, or a second resolve of a resolved id, raises
    ``not_found`` and leaves the pending interaction untouched."""
    log: dict[str, Any] = {}
    backend = RecordingBackend(asking(log))
    tool = make_tool("ask", backend)
    outcomes: dict[str, Any] = {}

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        interaction_id = host.requested[0][1]
        for bogus in ("interaction-1-999", "", 42):
            with pytest.raises(Error) as caught:
                await conversation.resolve(bogus, "x")  # type: ignore[arg-type]
            assert caught.value.error_class is ErrorClass.NOT_FOUND
        pending = conversation.status().pending_interaction
        assert pending is not None
        assert pending["id"] == interaction_id
        assert conversation.status().phase == "waiting_interaction"
        await conversation.resolve(interaction_id, "main")
        with pytest.raises(Error) as again:
            await conversation.resolve(interaction_id, "other")
        outcomes["again"] = again.value.error_class

    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, during=during
    )
    assert outcomes["again"] is ErrorClass.NOT_FOUND
    assert log["answer"] == "main"
    assert finished.record.state == "completed"


async def test_int_04_answer_no_store_can_encode_is_refused(autojump_clock: MockClock) -> None:
    """INT-04, KER-11: an answer holding an integer of more than 4,300
    digits (which no store can encode, or no process read back) is refused
    with ``validation`` before anything is committed; the interaction stays
    pending and a later answer is delivered."""
    log: dict[str, Any] = {}
    tool = make_tool("ask", RecordingBackend(asking(log)))
    refused: list[Error] = []

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        interaction_id = host.requested[0][1]
        with pytest.raises(Error) as caught:
            await conversation.resolve(interaction_id, {"n": 10**5000})
        refused.append(caught.value)
        pending = conversation.status().pending_interaction
        assert pending is not None
        assert pending["id"] == interaction_id
        await conversation.resolve(interaction_id, {"n": 10**4299})

    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, during=during
    )
    [error] = refused
    assert error.error_class is ErrorClass.VALIDATION
    assert error.details["reason"] == "integer_too_large"
    assert log["answer"] == {"n": 10**4299}
    assert finished.record.state == "completed"


async def test_int_05_evt_11_answer_delivered_after_the_resolution_commit(
    autojump_clock: MockClock,
) -> None:
    """INT-05, EVT-11: ``interaction_requested`` follows the pending checkpoint,
    and the answer reaches ``interact`` (and ``interaction_resolved`` is
    published) only once the resolution checkpoint is acknowledged, here
    slowed by 4 seconds."""
    faulty = FaultyStore()
    faulty.add(Fault("delay", when=resolution_commit(faulty), delay=4.0))
    log: dict[str, Any] = {}
    records: list[RunRecord | None] = []

    async def then(operation: Any) -> ToolResult:
        records.append(await faulty.load(RUN_ID))
        return ToolResult("ok")

    tool = make_tool("ask", RecordingBackend(asking(log, then)))
    finished, host = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], after(10.0, {"branch": "main"}), store=faulty
    )
    assert log["answer"] == {"branch": "main"}
    [(requested_at, interaction_id)] = host.requested
    [(resolved_at, _)] = host.resolved
    assert resolved_at == requested_at + 10.0 + 4.0
    assert log["answered_at"] == resolved_at
    # the answer was committed before the backend saw it: the stored record
    # says which interaction was answered, and how (spec 002: durable before
    # the worker goes on, so a crash right after resolve loses nothing)
    assert pending_of(records[0]) is None
    assert records[0] is not None
    assert records[0].conversation is not None
    resolved = thaw(records[0].conversation["resolved_interaction"])
    assert resolved == {
        "interaction_id": interaction_id,
        "answer": {"branch": "main"},
        # with what it answered: a resumed run knows which question it was
        "request": {"kind": "question", "text": "Which branch?"},
    }
    resolution = [
        at
        for kind, record, at in faulty.acknowledged
        if kind == "conversation_updated"
        and pending_of(record) is None
        and record.deadline is not None
        and record.deadline > 300.0
    ]
    assert resolution
    assert resolution[0] <= log["answered_at"]
    # EVT-11: the stored record named the interaction when it was announced ...
    [at_request] = host.records_at_request
    assert pending_of(at_request)["id"] == interaction_id
    assert thaw(pending_of(at_request)["request"]) == QUESTION
    [event] = host.of("interaction_requested")
    assert event.payload == {"interaction_id": interaction_id, "request": QUESTION}
    # ... and had cleared it when the resolution was announced
    [resolved] = host.of("interaction_resolved")
    assert resolved.payload == {"interaction_id": interaction_id}
    assert pending_of(host.records_at_resolved_event[0]) is None
    assert finished.record.state == "completed"


# -- deadline suspension -----------------------------------------------------------


async def test_int_06_run_deadline_does_not_expire_while_waiting(autojump_clock: MockClock) -> None:
    """INT-06: while the answer is awaited the phase is ``waiting_interaction``
    and a wait five times ``run_timeout`` does not expire the run."""
    log: dict[str, Any] = {}
    phases: list[str] = []

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        for _ in range(4):
            await trio.sleep(10.0)
            phases.append(conversation.status().phase)

    tool = make_tool("ask", RecordingBackend(asking(log)))
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        after(50.0, "yes"),
        during=during,
        run_timeout=10.0,
    )
    assert phases == ["waiting_interaction"] * 4
    assert log["answer"] == "yes"
    assert finished.record.state == "completed"
    assert finished.snapshot.phase == "terminal"


async def test_int_07_stored_deadline_moves_by_exactly_the_wait(autojump_clock: MockClock) -> None:
    """INT-07: the stored run deadline moves later by exactly the time waited,
    and the effect deadline resumes with only its remaining budget: a tool
    with ``effect_timeout=10`` that ran 4 s before a 30 s wait is cancelled 6 s
    after the resolution."""
    log: dict[str, Any] = {}

    async def then(operation: Any) -> ToolResult:
        log["after"] = await faulty.load(RUN_ID)
        try:
            await trio.sleep(100.0)
        except trio.Cancelled:
            log["effect_cancelled_at"] = trio.current_time()
            raise
        return ToolResult("late")

    async def first(operation: Any) -> Any:
        await trio.sleep(4.0)
        log["before"] = await faulty.load(RUN_ID)
        return await asking(log, then)(operation)

    faulty = FaultyStore()
    tool = make_tool("ask", RecordingBackend(first), read_only=True)
    finished, _host = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        after(30.0),
        store=faulty,
        run_timeout=100.0,
        effect_timeout=10.0,
    )
    waited = log["answered_at"] - log["asked_at"]
    assert waited == 30.0
    assert log["after"].deadline == log["before"].deadline + waited
    assert log["before"].deadline == 100.0
    assert log["effect_cancelled_at"] == log["answered_at"] + 6.0
    assert finished.record.state == "unknown_outcome"  # the effect outlived its budget


@pytest.mark.parametrize("commit_delay", [0.0, 3.0])
async def test_int_07_run_deadline_resumes_with_its_remaining_budget(
    autojump_clock: MockClock, commit_delay: float
) -> None:
    """INT-07: the run deadline resumes with its remaining budget only: with
    ``run_timeout=20``, a wait of 30 s started at t=4 moves the run's expiry
    to t=50, which is the stored deadline.  The wait ends when ``resolve``
    measures it: a slow resolution commit after it (3 s) counts against the
    budgets, as commits do (rule 5), so the run still stops at t=50."""
    log: dict[str, Any] = {}
    faulty = FaultyStore()
    if commit_delay:
        faulty.add(Fault("delay", when=resolution_commit(faulty), delay=commit_delay))

    async def then(operation: Any) -> ToolResult:
        log["after"] = await faulty.load(RUN_ID)
        try:
            await trio.sleep_forever()
        finally:
            log["stopped_at"] = trio.current_time()

    async def first(operation: Any) -> Any:
        await trio.sleep(4.0)
        return await asking(log, then)(operation)

    tool = make_tool("ask", RecordingBackend(first), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        after(30.0),
        store=faulty,
        run_timeout=20.0,
        effect_timeout=1000.0,
    )
    assert log["answered_at"] == 4.0 + 30.0 + commit_delay  # delivered after the commit
    assert log["after"].deadline == 50.0
    assert log["stopped_at"] == 50.0
    assert finished.record.deadline == 50.0
    assert finished.record.stop_reason is not None
    assert finished.types().count("run_cancelled") == 1


async def test_int_08_old_generation_timeout_is_ignored(autojump_clock: MockClock) -> None:
    """INT-08: a budget's deadline from before a suspension decides nothing
    after resumption: the effect deadline (t=10) passes during the wait and the
    tool still completes; ``DeadlineBudget.timed_out`` ignores a verdict asked
    for an older generation."""
    log: dict[str, Any] = {}

    async def first(operation: Any) -> Any:
        await trio.sleep(9.0)

        async def then(_operation: Any) -> ToolResult:
            await trio.sleep(0.5)
            return ToolResult("in time")

        return await asking(log, then)(operation)

    tool = make_tool("ask", RecordingBackend(first))
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], after(20.0), effect_timeout=10.0
    )
    [message] = finished.tool_messages()
    assert message["result"]["content"] == "in time"
    assert finished.record.state == "completed"

    budget = DeadlineBudget("effect", 5.0)
    start = trio.current_time()
    with budget.arm() as scope:
        armed = budget.generation
        await trio.sleep(3.0)
        suspended = budget.suspend()
        assert budget.remaining() == 2.0
        await trio.sleep(10.0)  # past the armed deadline: nothing happens
        resumed = budget.resume()
        assert armed < suspended < resumed
        assert budget.deadline == trio.current_time() + 2.0
        await trio.sleep(5.0)
    assert scope.cancelled_caught
    assert trio.current_time() == start + 15.0
    assert budget.timed_out()
    assert not budget.timed_out(armed)
    assert not budget.timed_out(suspended)
    assert budget.timed_out(resumed)


async def test_int_09_simultaneous_run_and_effect_expiry_one_run_cancelled(
    autojump_clock: MockClock,
) -> None:
    """INT-09: the run and effect deadlines expiring at the same instant (both
    resumed with 10 s after a wait) publish exactly one ``run_cancelled``."""
    log: dict[str, Any] = {}

    async def then(operation: Any) -> ToolResult:
        try:
            await trio.sleep_forever()
        finally:
            log["stopped_at"] = trio.current_time()

    tool = make_tool("ask", RecordingBackend(asking(log, then)), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        after(30.0),
        run_timeout=10.0,
        effect_timeout=10.0,
    )
    assert log["stopped_at"] == 40.0
    assert finished.types().count("run_cancelled") == 1
    assert not {"run_completed", "run_failed"} & set(finished.types())
    assert finished.record.state in ("timed_out", "unknown_outcome")


# -- cancellation -------------------------------------------------------------------


async def test_int_10_cancel_wins_during_pending_checkpoint(autojump_clock: MockClock) -> None:
    """INT-10: a cancellation while the pending-interaction checkpoint commits
    means no ``interaction_requested`` and a stored ``pending_interaction`` of
    ``None``."""
    faulty = FaultyStore(None, Fault("delay", when=pending_commit, delay=3.0))
    log: dict[str, Any] = {}

    async def during(conversation: Conversation, host: Host) -> None:
        await faulty.reached("conversation_updated").wait()
        await until(lambda: bool(faulty.fired))
        await conversation.cancel()

    tool = make_tool("ask", RecordingBackend(asking(log)), read_only=True)
    finished, host = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], after(1.0), store=faulty, during=during
    )
    assert faulty.fired
    assert faulty.fired[0][0] == "delay"
    assert host.of("interaction_requested") == []
    assert pending_of(finished.record) is None
    assert "answer" not in log
    assert finished.types().count("run_cancelled") == 1


async def test_int_10_deadline_wins_during_pending_checkpoint(autojump_clock: MockClock) -> None:
    """INT-10: the run deadline expiring while the pending-interaction
    checkpoint commits (it takes 5 s; the run has 3 s left) wins: no
    ``interaction_requested``, ``pending_interaction`` ends ``None``, the run
    is stopped by its deadline."""
    faulty = FaultyStore(None, Fault("delay", when=pending_commit, delay=5.0))
    log: dict[str, Any] = {}

    async def first(operation: Any) -> Any:
        await trio.sleep(7.0)
        return await asking(log)(operation)

    tool = make_tool("ask", RecordingBackend(first), read_only=True)
    finished, host = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        after(1.0),
        store=faulty,
        run_timeout=10.0,
        commit_timeout=30.0,
    )
    assert faulty.fired
    assert faulty.fired[0][0] == "delay"
    assert host.of("interaction_requested") == []
    assert "answer" not in log
    assert pending_of(finished.record) is None
    assert finished.record.stop_reason == "deadline_exceeded"
    assert finished.types().count("run_cancelled") == 1


async def test_int_10_int_07_interaction_given_up_is_withdrawn(autojump_clock: MockClock) -> None:
    """INT-10, INT-07: a tool that stops waiting for an answer (its own
    ``move_on_after``) and goes on leaves no pending interaction behind: the
    stored record, ``status()`` and a late ``resolve`` (``not_found``) agree,
    and the stored run deadline moved by the time waited, as the run's own
    budget did."""
    seen: dict[str, Any] = {}
    conversations: list[Conversation] = []

    async def impatient(operation: Any) -> Any:
        [conversation] = conversations
        seen["deadline_before"] = conversation.status().run.deadline
        with trio.move_on_after(5.0):
            await operation.context.interact(QUESTION)
        status = conversation.status()
        seen["pending_after"] = status.pending_interaction
        seen["deadline_after"] = status.run.deadline
        seen["enforced"] = conversation._state.run_budget.deadline
        with pytest.raises(Error) as late:
            await conversation.resolve(seen["interaction_id"], "too late")
        seen["late"] = late.value.error_class
        return ToolResult("went on without an answer")

    async def during(conversation: Conversation, host: Host) -> None:
        conversations.append(conversation)
        await until(lambda: bool(host.requested))
        seen["interaction_id"] = host.requested[0][1]

    tool = make_tool("ask", RecordingBackend(impatient), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, during=during, run_timeout=100.0
    )
    assert seen["pending_after"] is None
    assert seen["late"] is ErrorClass.NOT_FOUND
    assert seen["deadline_after"] == seen["deadline_before"] + 5.0
    assert seen["deadline_after"] == seen["enforced"]
    assert pending_of(finished.record) is None
    assert finished.record.state == "completed"


async def test_int_04_resolve_before_the_request_is_not_found(autojump_clock: MockClock) -> None:
    """INT-04: while the pending-interaction checkpoint still commits (no
    ``interaction_requested`` yet, nothing stored) the interaction cannot be
    answered, even by a host that guessed its id: ``not_found``; once
    requested, the answer is delivered."""
    faulty = FaultyStore(None, Fault("delay", when=pending_commit, delay=3.0))
    log: dict[str, Any] = {}
    early: list[Error] = []

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(faulty.fired), step=0.25)
        assert host.of("interaction_requested") == []
        with pytest.raises(Error) as caught:
            # the id a host could guess (interaction-<incarnation>-<n>)
            await conversation.resolve(conversation._state.pending.interaction_id, "early")
        early.append(caught.value)

    tool = make_tool("ask", RecordingBackend(asking(log)), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        after(1.0, "later"),
        store=faulty,
        during=during,
    )
    [error] = early
    assert error.error_class is ErrorClass.NOT_FOUND
    assert log["answer"] == "later"
    assert finished.record.state == "completed"


@pytest.mark.parametrize("overlap", [False, True])
async def test_int_17_interaction_outliving_its_effect_ends_with_it(
    autojump_clock: MockClock, overlap: bool
) -> None:
    """INT-17: an ``interact`` left waiting by a tool that returned (in a task
    of the host's that outlived it) ends with the effect: it raises
    resource_conflict "stale or overlapping interaction", the interaction is
    withdrawn from the stored record and the run deadline runs again.  A
    second ``interact`` meanwhile is refused, and leaves the first bound."""
    outcome: list[BaseException] = []
    refused: list[Error] = []
    started = trio.Event()

    async def leaves_it_waiting(operation: Any) -> Any:
        async def ask() -> None:
            try:
                await operation.context.interact(QUESTION)
            except Error as error:
                outcome.append(error)

        nursery.start_soon(ask)
        await started.wait()
        if overlap:
            with pytest.raises(Error) as second:
                await operation.context.interact(QUESTION)
            refused.append(second.value)
        return ToolResult("returned while asking")

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        started.set()

    async with trio.open_nursery() as nursery:
        tool = make_tool("ask", RecordingBackend(leaves_it_waiting), read_only=True)
        finished, _ = await run_with_host(
            calls_then_done(("c1", "ask", {})), [tool], never, during=during, run_timeout=100.0
        )
    assert [e.error_class for e in refused] == [ErrorClass.RESOURCE_CONFLICT] * overlap
    [error] = outcome
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert error.message == "stale or overlapping interaction"
    assert pending_of(finished.record) is None
    assert finished.record.state == "completed"


async def test_int_11_cancel_while_pending_cancels_interact(autojump_clock: MockClock) -> None:
    """INT-11: cancelling while an interaction is pending makes ``interact``
    raise ``trio.Cancelled`` and stores ``pending_interaction: None``."""
    log: dict[str, Any] = {}

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        await trio.sleep(5.0)
        log["cancel_at"] = trio.current_time()
        await conversation.cancel()

    tool = make_tool("ask", RecordingBackend(asking(log)), read_only=True)
    finished, _host = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, during=during
    )
    assert log["cancelled_at"] == log["cancel_at"]
    assert "answer" not in log
    assert pending_of(finished.record) is None
    assert finished.snapshot.pending_interaction is None
    assert finished.types().count("run_cancelled") == 1


async def test_int_12_resolve_racing_cancel_raises_cancelled(autojump_clock: MockClock) -> None:
    """INT-12: a ``resolve`` whose checkpoint is in flight when ``cancel()`` is
    called raises ``cancelled``, and the answer never reaches ``interact``."""
    faulty = FaultyStore()
    faulty.add(Fault("delay", when=resolution_commit(faulty), delay=3.0))
    log: dict[str, Any] = {}
    raised: list[Error] = []

    async def resolve(conversation: Conversation, interaction_id: str) -> None:
        try:
            await conversation.resolve(interaction_id, "main")
        except Error as error:
            raised.append(error)

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(resolve, conversation, host.requested[0][1])
            await until(lambda: bool(faulty.fired), step=0.25)
            await conversation.cancel()

    tool = make_tool("ask", RecordingBackend(asking(log)), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, store=faulty, during=during
    )
    [error] = raised
    assert error.error_class is ErrorClass.CANCELLED
    assert "answer" not in log
    assert "cancelled_at" in log
    assert finished.types().count("run_cancelled") == 1
    assert not [e for e in finished.events if e.type == "interaction_resolved"]


async def test_int_13_cancel_during_approval_wait(autojump_clock: MockClock) -> None:
    """INT-13: cancelling during an approval wait never calls the backend, and
    a ``resolve`` after ``cancel()`` returned raises ``not_found``."""
    backend = RecordingBackend()
    raised: list[Error] = []

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        await conversation.cancel()
        try:
            await conversation.resolve(host.requested[0][1], "approved")
        except Error as error:
            raised.append(error)

    tool = make_tool("deploy", backend, requires_approval=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "deploy", {})), [tool], never, during=during
    )
    [error] = raised
    assert error.error_class is ErrorClass.NOT_FOUND
    assert backend.calls == 0
    assert finished.record.state == "cancelled"
    assert pending_of(finished.record) is None


async def test_int_14_nested_worker_dying_during_wait(autojump_clock: MockClock) -> None:
    """INT-14: a nested invocation whose worker dies while its interaction is
    pending stops the run as ``unknown_outcome`` and clears the stored
    interaction."""
    log: dict[str, Any] = {}

    async def inner(operation: Any) -> Any:
        async def die() -> None:
            await trio.sleep(5.0)
            raise RuntimeError("nested worker died")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(die)
            await asking(log)(operation)
        return ToolResult("unreachable")

    async def outer(operation: Any) -> Any:
        try:
            await operation.context.nested_dispatch("inner", {})
        except Error as error:
            log["outer_saw"] = error.error_class
        return ToolResult("outer claims success")

    tools = [
        make_tool("outer", RecordingBackend(outer)),
        make_tool("inner", RecordingBackend(inner)),
    ]
    finished, host = await run_with_host(calls_then_done(("c1", "outer", {})), tools, never)
    assert len(host.requested) == 1
    assert "answer" not in log
    assert finished.record.state == "unknown_outcome"
    assert pending_of(finished.record) is None
    assert finished.snapshot.pending_interaction is None
    inner_intents = [v for v in finished.record.intents.values() if v.get("tool_name") == "inner"]
    assert [intent["status"] for intent in inner_intents] == ["uncertain"]


# -- approval binding ----------------------------------------------------------------


def _approval(**changes: Any) -> Approval:
    fields: dict[str, Any] = {
        "approval_id": "approval-1",
        "run_id": RUN_ID,
        "incarnation": 1,
        "tool_name": "deploy",
        "tool_revision": 2,
        "arguments_digest": arguments_digest({"target": "prod"}),
        "expires_at": 100.0,
    }
    fields.update(changes)
    return Approval(**fields)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("approval_id", "approval-2"),
        ("run_id", "run-2"),
        ("incarnation", 2),
        ("tool_name", "destroy"),
        ("tool_revision", 3),
        ("arguments_digest", arguments_digest({"target": "staging"})),
    ],
)
def test_int_15_decision_must_match_every_bound_field(field: str, value: Any) -> None:
    """INT-15: ``decide_approval`` raises ``forbidden`` when the decision
    differs from the approval in any bound field."""
    approval = _approval()
    base = {n: getattr(approval, n) for n in (a.name for a in attrs.fields(Approval))}
    del base["expires_at"]
    good = ApprovalDecision(**base, decision="approved", resolver_id="host")
    assert decide_approval(approval, good, now=50.0) == "approved"
    bad = attrs.evolve(good, **{field: value})
    with pytest.raises(Error) as caught:
        decide_approval(approval, bad, now=50.0)
    assert caught.value.error_class is ErrorClass.FORBIDDEN


def test_int_15_digest_is_sha256_of_jcs() -> None:
    """INT-15: ``arguments_digest`` is the lower-case hex SHA-256 of the RFC 8785
    encoding, so key order does not matter and any value change does."""
    import hashlib

    assert (
        arguments_digest({"b": 1, "a": [1.0, "é"]})
        == hashlib.sha256('{"a":[1,"é"],"b":1}'.encode()).hexdigest()
    )
    assert arguments_digest({"a": 1, "b": 2}) == arguments_digest({"b": 2, "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": 2})


async def test_int_15_dispatched_arguments_match_the_approved_digest(
    autojump_clock: MockClock,
) -> None:
    """INT-15: the gateway dispatches exactly the arguments whose digest was
    approved; a decision built for other arguments is refused (nothing is
    dispatched)."""
    backend = RecordingBackend()
    arguments = {"target": "prod", "replicas": 3}
    tool = make_tool("deploy", backend, requires_approval=True, revision=2)
    finished, host = await run_with_host(
        calls_then_done(("c1", "deploy", arguments)), [tool], after(1.0)
    )
    [event] = host.of("interaction_requested")
    approved = event.payload["request"]["operation"]
    [operation] = backend.operations
    assert arguments_digest(operation.arguments) == approved["arguments_digest"]
    assert operation.tool_revision == approved["tool_revision"] == 2
    assert finished.record.state == "completed"
    approval = _approval(
        approval_id=approved["approval_id"],
        tool_revision=2,
        arguments_digest=approved["arguments_digest"],
    )
    patched = ApprovalDecision(
        approval_id=approved["approval_id"],
        run_id=RUN_ID,
        incarnation=1,
        tool_name="deploy",
        tool_revision=2,
        arguments_digest=arguments_digest({**arguments, "replicas": 30}),
        decision="approved",
        resolver_id="host",
    )
    with pytest.raises(Error) as caught:
        decide_approval(approval, patched, now=0.0)
    assert caught.value.error_class is ErrorClass.FORBIDDEN


# -- commit deadlines, request validation, nested interactions ------------------------


async def test_int_16_commit_deadline_runs_during_wait(autojump_clock: MockClock) -> None:
    """INT-16: a checkpoint commit that hangs during a human wait (a steering
    message) moves the conversation to ``storage_failed`` after
    ``commit_timeout``."""

    def steering_commit(kind: str, record: RunRecord) -> bool:
        return kind == "conversation_updated" and bool(record.context["conversation"]["steering"])

    faulty = FaultyStore(None, Fault("hang", when=steering_commit))
    log: dict[str, Any] = {}
    seen: dict[str, Any] = {}

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        start = trio.current_time()
        with pytest.raises(Error) as caught:
            await conversation.steer("also this")
        seen["class"] = caught.value.error_class
        seen["took"] = trio.current_time() - start

    tool = make_tool("ask", RecordingBackend(asking(log)), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})),
        [tool],
        never,
        store=faulty,
        during=during,
        commit_timeout=4.0,
    )
    assert seen == {"class": ErrorClass.STORAGE_FAILED, "took": 4.0}
    assert finished.snapshot.phase == "storage_failed"
    assert "storage_failed" in finished.types()
    assert not {"run_completed", "run_failed", "run_cancelled"} & set(finished.types())


async def test_int_17_request_must_be_a_mapping(autojump_clock: MockClock) -> None:
    """INT-17: ``interact`` with a request that is not a mapping raises
    ``validation``."""
    seen: list[ErrorClass] = []

    async def run(operation: Any) -> ToolResult:
        for request in ("question?", ["a"], None):
            try:
                await operation.context.interact(request)
            except Error as error:
                seen.append(error.error_class)
        return ToolResult("ok")

    finished, host = await run_with_host(
        calls_then_done(("c1", "t", {})), [make_tool("t", RecordingBackend(run))], after(1.0)
    )
    assert seen == [ErrorClass.VALIDATION] * 3
    assert host.requested == []
    assert pending_of(finished.record) is None
    assert finished.record.state == "completed"


async def test_int_17_overlapping_and_stale_interactions(autojump_clock: MockClock) -> None:
    """INT-17: a second ``interact`` while one is pending, or one from an effect
    that has ended, raises ``resource_conflict`` "stale or overlapping
    interaction"."""
    seen: list[Error] = []
    kept: list[Any] = []

    async def second(context: Any) -> None:
        await trio.sleep(1.0)
        try:
            await context.interact({"kind": "question", "text": "again?"})
        except Error as error:
            seen.append(error)

    async def first(operation: Any) -> ToolResult:
        kept.append(operation.context)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second, operation.context)
            answer = await operation.context.interact(QUESTION)
        return ToolResult(f"answer {answer}")

    async def later(operation: Any) -> ToolResult:
        try:
            await kept[0].interact(QUESTION)
        except Error as error:
            seen.append(error)
        return ToolResult("later")

    tools = [
        make_tool("first", RecordingBackend(first)),
        make_tool("later", RecordingBackend(later)),
    ]
    provider = SP(
        [SP.tool_calls(("c1", "first", {})), SP.tool_calls(("c2", "later", {})), SP.text("done")]
    )
    finished, host = await run_with_host(provider, tools, after(5.0, "main"))
    assert len(seen) == 2
    for error in seen:
        assert error.error_class is ErrorClass.RESOURCE_CONFLICT
        assert error.message == "stale or overlapping interaction"
    assert len(host.requested) == 1
    assert finished.tool_messages()[0]["result"]["content"] == "answer main"
    assert finished.record.state == "completed"


async def test_int_18_nested_interaction_suspends_every_deadline(
    autojump_clock: MockClock,
) -> None:
    """INT-18: an interaction from a nested invocation suspends the root,
    outer-effect and nested deadlines; after resolution each resumes with only
    its remaining pre-wait budget (root 15, outer 5, nested 1 here: the nested
    budget is half of the outer's 8 s left when it started, NEST-05), and the
    nested effect then expires exactly 1 s after the resolution."""
    log: dict[str, Any] = {}
    budgets: dict[str, Any] = {}
    conversations: list[Conversation] = []

    async def inner(operation: Any) -> ToolResult:
        await trio.sleep(3.0)
        conversation = conversations[0]

        async def then(_operation: Any) -> ToolResult:
            budgets["after"] = (
                conversation._state.run_budget.deadline - trio.current_time(),
                [b.deadline - trio.current_time() for b in conversation._state.effects],
            )
            try:
                await trio.sleep(6.0)
            except trio.Cancelled:
                log["inner_cancelled_at"] = trio.current_time()
                raise
            return ToolResult("inner done")

        async def spy() -> None:
            await until(lambda: conversation._state.pending is not None, step=1.0)
            await trio.sleep(50.0)
            budgets["during"] = (
                conversation._state.run_budget.remaining(),
                [b.remaining() for b in conversation._state.effects],
                conversation._state.run_budget.deadline,
                [b.deadline for b in conversation._state.effects],
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(spy)
            return await asking(log, then)(operation)  # type: ignore[no-any-return]

    async def outer(operation: Any) -> ToolResult:
        await trio.sleep(2.0)
        await operation.context.nested_dispatch("inner", {})
        return ToolResult("outer done")

    async def during(conversation: Conversation, host: Host) -> None:
        conversations.append(conversation)

    tools = [
        make_tool("outer", RecordingBackend(outer), read_only=True),
        make_tool("inner", RecordingBackend(inner), read_only=True),
    ]
    # ``during`` runs right after the prompt is admitted, before the provider
    # reaches the tool (the provider first sleeps 1 s)
    from trio_backplane.testing import Sleep

    provider = SP([[Sleep(1.0), *SP.tool_calls(("c1", "outer", {}))], SP.text("done")])
    finished, _host = await run_with_host(
        provider, tools, after(100.0), during=during, run_timeout=21.0, effect_timeout=10.0
    )
    assert log["asked_at"] == 6.0
    assert log["answered_at"] == 106.0
    run_left, effects_left, run_deadline, effect_deadlines = budgets["during"]
    assert run_left == 15.0
    assert effects_left == [5.0, 1.0]
    assert run_deadline == math.inf
    assert effect_deadlines == [math.inf, math.inf]
    assert budgets["after"] == (15.0, [5.0, 1.0])
    assert log["inner_cancelled_at"] == 107.0  # the nested effect's remaining 1 s
    assert finished.record.deadline == 21.0 + 100.0
    # read-only all the way: the nested timeout reaches the outer tool as an
    # error, the outer tool's error is an ordinary result, the run completes
    assert finished.record.state == "completed"
    assert finished.types().count("run_completed") == 1


async def test_int_05_a_failed_resolution_commit_reaches_the_resolver(
    autojump_clock: MockClock,
) -> None:
    """INT-05: when the checkpoint that records an answer fails, ``resolve``
    raises that ``storage_failed`` to the host, the answer never reaches the
    tool (it was not committed), and the conversation stops storage_failed
    with the tool's dispatched effect left for recovery."""
    faulty = FaultyStore()
    faulty.add(Fault("fail", when=resolution_commit(faulty)))
    log: dict[str, Any] = {}
    tool = make_tool("ask", RecordingBackend(asking(log)))
    finished, host = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], after(2.0), store=faulty
    )
    [error] = host.errors
    assert error.error_class is ErrorClass.STORAGE_FAILED
    assert host.resolved == []
    assert "answer" not in log
    assert "cancelled_at" in log
    assert finished.snapshot.phase == "storage_failed"
    assert pending_of(finished.record) is not None  # the stored run still waits


async def test_an_interaction_request_must_be_a_mapping(autojump_clock: MockClock) -> None:
    """``interact`` with a request that is not a mapping raises ``validation``
    in the tool without opening an interaction (no request event, nothing
    pending), and the tool goes on."""
    raised: list[Error] = []

    async def ask_badly(operation: Any) -> ToolResult:
        try:
            await operation.context.interact("approve?")
        except Error as error:
            raised.append(error)
        return ToolResult("asked badly")

    tool = make_tool("ask", RecordingBackend(ask_badly))
    finished, host = await run_with_host(calls_then_done(("c1", "ask", {})), [tool], never)
    [error] = raised
    assert error.error_class is ErrorClass.VALIDATION
    assert host.requested == []
    assert pending_of(finished.record) is None
    assert finished.record.state == "completed"


async def test_int_04_a_cancelled_resolve_leaves_the_interaction_open(
    autojump_clock: MockClock,
) -> None:
    """INT-04/INT-05: a ``resolve`` whose caller is cancelled before its
    commit committed nothing: the interaction stays pending, a retry with the
    same id is accepted (never ``not_found``), and the answer reaches the
    tool."""
    log: dict[str, Any] = {}
    tool = make_tool("ask", RecordingBackend(asking(log)))
    outcomes: dict[str, Any] = {}

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        interaction_id = host.requested[0][1]
        with trio.CancelScope() as scope:
            scope.cancel()
            await conversation.resolve(interaction_id, "first")
        outcomes["cancelled"] = scope.cancelled_caught
        pending = conversation.status().pending_interaction
        outcomes["still_pending"] = pending is not None and pending["id"] == interaction_id
        await conversation.resolve(interaction_id, "second")

    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, during=during
    )
    assert outcomes == {"cancelled": True, "still_pending": True}
    assert log["answer"] == "second"
    assert finished.record.state == "completed"


# -- second-order races (a probe's findings) --------------------------------------


def _slow_steering_store() -> FaultyStore:
    """A store whose commits of queued steering take 3 s (the coordinator is
    held meanwhile)."""

    def steering_commit(kind: str, record: RunRecord) -> bool:
        return kind == "conversation_updated" and bool(record.context["conversation"]["steering"])

    return FaultyStore(None, Fault("delay", when=steering_commit, delay=3.0))


def _ask_then_two_answers() -> ScriptedProvider:
    """One call to ``ask``, then an answer for the turn and one for the
    steering's turn."""
    return ScriptedProvider(
        [
            ScriptedProvider.tool_calls(("c1", "ask", {})),
            ScriptedProvider.text("done"),
            ScriptedProvider.text("done 2"),
        ]
    )


@pytest.mark.parametrize("nested_starts", ["during the wait", "before the wait"])
async def test_int_18_a_nested_call_settles_during_a_long_wait_past_the_stored_deadline(
    autojump_clock: MockClock, nested_starts: str
) -> None:
    """INT-06, INT-18: a tool asks a question at 0.5 s (run_timeout 20 s,
    answered at 100 s) while a nested call of its own starts (at 30 s) or
    settles (at 30 s) during the wait.  The wait has moved the run deadline
    in memory; the commits of the nested call past the stored deadline first
    move the stored one too: nothing is refused as too late, the question is
    answered and the run completes."""
    log: dict[str, Any] = {}

    async def inner(operation: Any) -> ToolResult:
        if nested_starts == "before the wait":
            await trio.sleep(30.0)  # its budget is suspended by the wait
        return ToolResult("inner done")

    async def outer(operation: Any) -> ToolResult:
        context = operation.context

        async def nested() -> None:
            if nested_starts == "during the wait":
                await trio.sleep(30.0)
            log["nested"] = (await context.nested_dispatch("inner", {})).content

        async with trio.open_nursery() as nursery:
            nursery.start_soon(nested)
            await trio.sleep(0.5)
            log["answer"] = await context.interact({"kind": "question"})
        return ToolResult("outer done")

    tools = [
        make_tool("outer", RecordingBackend(outer), read_only=True),
        make_tool("inner", RecordingBackend(inner), read_only=True),
    ]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "outer", {})),
        tools,
        lambda _event: (100.0, "yes"),
        run_timeout=20.0,
        effect_timeout=60.0,
    )
    assert finished.record.state == "completed", finished.snapshot.last_error
    assert log == {"nested": "inner done", "answer": "yes"}
    # the stored deadline moved by the whole wait (the answer came 100 s after
    # the question), once: never twice for the steps it took
    assert finished.record.deadline == pytest.approx(20.0 + 100.0)


async def test_int_05_the_tool_gets_the_committed_answer_not_the_hosts_object(
    autojump_clock: MockClock,
) -> None:
    """INT-05: ``interact`` returns the answer as committed, a copy of the
    tool's own: a host that reuses (mutates) its answer object after
    ``resolve`` returned changes nothing the tool acts on."""
    seen: dict[str, Any] = {}

    async def ask(operation: Any) -> ToolResult:
        answer = await operation.context.interact({"kind": "question", "text": "branch?"})
        seen["answer"] = answer
        return ToolResult(f"deploying {answer['branch']}")

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(host.requested))
        answer = {"branch": "main"}
        await conversation.resolve(host.requested[0][1], answer)
        answer["branch"] = "prod-EVIL"

    tool = make_tool("ask", RecordingBackend(ask), read_only=True)
    finished, _ = await run_with_host(
        calls_then_done(("c1", "ask", {})), [tool], never, during=during
    )
    assert seen["answer"] == {"branch": "main"}
    stored = finished.record.context["conversation"]["resolved_interaction"]
    assert thaw(stored["answer"]) == {"branch": "main"}


async def test_int_11_interact_while_the_run_stops_is_refused_at_once(
    autojump_clock: MockClock,
) -> None:
    """INT-11, CAN-18: a tool asking for a confirmation in its shielded
    cleanup after ``cancel()`` is refused at once ("the run is stopping"), as
    ``nested_dispatch`` is: no interaction is stored for a stopping run, and
    the conversation block exits."""
    seen: dict[str, Any] = {}

    async def body(operation: Any) -> ToolResult:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                try:
                    await operation.context.interact({"kind": "confirm", "text": "roll back?"})
                    seen["interact"] = "returned"
                except Error as error:
                    seen["interact"] = error.error_class
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    tools = [make_tool("t", RecordingBackend(body), read_only=True)]
    with trio.fail_after(600):
        async with conversation_with(
            calls_then_done(("c1", "t", {})), tools, cleanup_timeout=5.0
        ) as (conversation, timeline):
            await conversation.prompt("go")
            await trio.sleep(1.0)
            await conversation.cancel()
            snapshot = await conversation.wait_settled()
    assert seen["interact"] is ErrorClass.CANCELLED
    assert snapshot.phase == "terminal"
    stored = await timeline.load(RUN_ID)
    assert stored is not None
    assert pending_of(stored) is None


async def test_int_10_a_cancelled_resolve_after_the_tool_gave_up_withdraws_it(
    autojump_clock: MockClock,
) -> None:
    """INT-10, INT-07: a ``resolve`` queued behind a slow commit, while the
    asking tool gives up on its own timeout, then cancelled by its caller
    before it commits: the interaction is withdrawn (not left stored and
    shown pending), and the stored deadline moved by the wait the tool had."""

    faulty = _slow_steering_store()
    log: dict[str, Any] = {}
    holder: list[Conversation] = []

    async def ask(operation: Any) -> ToolResult:
        with trio.move_on_after(9.5):
            await operation.context.interact({"kind": "question"})
        log["enforced"] = holder[0]._state.run_budget.deadline
        await trio.sleep(5.0)
        return ToolResult("gave up waiting")

    async def during(conversation: Conversation, host: Host) -> None:
        holder.append(conversation)
        await until(lambda: bool(host.requested))
        interaction = host.requested[0][1]
        await trio.sleep(8.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.steer, "also this")
            await until(lambda: bool(faulty.fired), 0.01)
            with trio.move_on_after(2.5):
                await conversation.resolve(interaction, "main")
        await trio.sleep(1.0)
        log["status pending"] = conversation.status().pending_interaction
        log["stored deadline"] = conversation._state.record.deadline

    tool = make_tool("ask", RecordingBackend(ask), read_only=True)
    finished, _ = await run_with_host(
        _ask_then_two_answers(),
        [tool],
        never,
        store=faulty,
        during=during,
        run_timeout=60.0,
    )
    assert log["status pending"] is None
    assert pending_of(finished.record) is None
    assert log["stored deadline"] == pytest.approx(log["enforced"])


async def test_int_07_a_resolve_queued_behind_a_slow_commit_moves_the_deadline_by_the_wait(
    autojump_clock: MockClock,
) -> None:
    """INT-07: a ``resolve`` queued 3 s behind a slow commit, past the stored
    deadline: the stored deadline moves by the time waited up to the answer
    (as the budgets resume), not by the time the answer's commit queued."""

    faulty = _slow_steering_store()
    log: dict[str, Any] = {}
    holder: list[Conversation] = []

    async def ask(operation: Any) -> ToolResult:
        log["before"] = holder[0]._state.record.deadline
        await operation.context.interact({"kind": "question"})
        log["enforced"] = holder[0]._state.run_budget.deadline
        return ToolResult("ok")

    async def during(conversation: Conversation, host: Host) -> None:
        holder.append(conversation)
        await until(lambda: bool(host.requested), 0.01)
        asked_at, interaction = host.requested[0][0], host.requested[0][1]
        await trio.sleep(18.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.steer, "also this")
            await until(lambda: bool(faulty.fired), 0.01)
            log["waited"] = trio.current_time() - asked_at
            await conversation.resolve(interaction, "main")
        log["stored"] = conversation._state.record.deadline

    tool = make_tool("ask", RecordingBackend(ask), read_only=True)
    await run_with_host(
        _ask_then_two_answers(),
        [tool],
        never,
        store=faulty,
        during=during,
        run_timeout=20.0,
        effect_timeout=60.0,
    )
    assert log["stored"] == pytest.approx(log["before"] + log["waited"], abs=0.1)
    assert log["stored"] == pytest.approx(log["enforced"], abs=0.1)


async def test_int_17_an_interaction_left_waiting_is_withdrawn_before_the_next_call(
    autojump_clock: MockClock,
) -> None:
    """INT-17, INT-01: an interaction a tool left waiting in a host's task
    ends with the tool and is withdrawn before the batch goes on: the next
    call's approval is asked for (it was refused as "stale or overlapping
    interaction", its backend never called)."""
    seen: list[Any] = []
    gated = RecordingBackend(ToolResult("gated ran"))
    async with trio.open_nursery() as host_tasks:

        async def asks(operation: Any) -> ToolResult:
            async def in_the_background() -> None:
                try:
                    seen.append(await operation.context.interact({"question": "?"}))
                except Error as error:  # the effect ended while it waited (INT-17)
                    seen.append(error)

            host_tasks.start_soon(in_the_background)
            await trio.sleep(1)  # the request is committed and announced
            return ToolResult("asked")

        def policy(event: Event) -> tuple[float, Any] | None:
            if event.payload["request"].get("kind") == "permission":
                return (0.5, "approved")
            return None  # the question is never answered

        tools = [
            make_tool("asks", RecordingBackend(asks), read_only=True),
            make_tool("gated", gated, requires_approval=True),
        ]
        provider = ScriptedProvider(
            [
                ScriptedProvider.tool_calls(("c1", "asks", {}), ("c2", "gated", {})),
                ScriptedProvider.text("done"),
            ]
        )
        finished, host = await run_with_host(provider, tools, policy, effect_timeout=60.0)
    assert gated.calls == 1
    kinds = [e.payload["request"].get("kind", "question") for e in host.of("interaction_requested")]
    assert kinds == ["question", "permission"]
    assert finished.record.state == "completed"
    [error] = seen
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT


async def test_int_17_two_interactions_of_one_tool_may_end_in_any_order(
    autojump_clock: MockClock,
) -> None:
    """INT-17, INT-05: a tool gives up one interaction (its own scope) while
    its withdrawal commits slowly, and asks another meanwhile: the second
    one's committed answer reaches the tool (the first ending first broke
    the second's bookkeeping: a raw AttributeError, the run unknown_outcome)."""

    def withdrawal(kind: str, record: RunRecord) -> bool:
        state = record.context["conversation"]
        return (
            kind == "conversation_updated"
            and state.get("pending_interaction") is None
            and state.get("resolved_interaction") is None
        )

    store = FaultyStore(None)
    seen: dict[str, Any] = {}

    async def asks_twice(operation: Any) -> ToolResult:
        store.add(Fault("delay", when=withdrawal, delay=2.0))  # the first one's withdrawal

        async def first() -> None:
            with trio.move_on_after(1):
                await operation.context.interact({"question": "A"})
            seen["first"] = "given up"

        async def second() -> None:
            await trio.sleep(1.5)
            seen["second"] = await operation.context.interact({"question": "B"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
        return ToolResult("asked")

    def policy(event: Event) -> tuple[float, Any] | None:
        return (0.5, "B-answer") if event.payload["request"]["question"] == "B" else None

    tools = [make_tool("asks", RecordingBackend(asks_twice), read_only=True)]
    finished, _ = await run_with_host(
        ScriptedProvider(
            [ScriptedProvider.tool_calls(("c1", "asks", {})), ScriptedProvider.text("done")]
        ),
        tools,
        policy,
        store=store,
        effect_timeout=60.0,
    )
    assert seen == {"first": "given up", "second": "B-answer"}
    assert finished.record.state == "completed"
