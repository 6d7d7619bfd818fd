"""Nested dispatch and the commit coordinator: the NEST behaviours of
BEHAVIOURS.md, on ``MemoryStore`` under ``MockClock(autojump_threshold=0)``.

A nested call's deadline lies inside the outer one (at most half of what
the outer tool has left), so a read-only nested timeout leaves the outer tool
time to catch it (NEST-05).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import RunRecord, thaw
from trio_backplane.runtime import Conversation, ResponseFailed
from trio_backplane.testing import ScriptedProvider, Sleep
from trio_backplane.tools import ToolResult

from .support import (
    RUN_ID,
    Fault,
    FaultyStore,
    Host,
    RecordingBackend,
    Unreadable,
    make_tool,
    run_with_host,
)

SP = ScriptedProvider


def calls_then_done(*calls: tuple[str, str, Any]) -> ScriptedProvider:
    return SP([SP.tool_calls(*calls), SP.text("done")])


def outer_calling(name: str, seen: list[Any], arguments: Any = None) -> Any:
    async def run(operation: Any) -> ToolResult:
        try:
            result = await operation.context.nested_dispatch(name, arguments or {})
        except Error as error:
            seen.append(error)
            return ToolResult("outer caught the error")
        seen.append(result)
        return ToolResult("outer done")

    return run


def intents_of(record: RunRecord, tool: str) -> list[tuple[str, Any]]:
    """``(invocation id, intent)`` of every invocation of ``tool``."""
    return [
        (key.removeprefix("tool:"), intent)
        for key, intent in record.intents.items()
        if intent.get("tool_name") == tool
    ]


def leaving(host_tasks: trio.Nursery, name: str, log: list[Any], after: float) -> Any:
    """An outer tool that starts its nested call to ``name`` in a task of
    the host's (``log`` gets its result or error) and returns ``after``
    seconds later, leaving it running."""

    async def run(operation: Any) -> ToolResult:
        async def in_the_background() -> None:
            try:
                log.append(await operation.context.nested_dispatch(name, {}))
            except Error as error:
                log.append(error)

        host_tasks.start_soon(in_the_background)
        await trio.sleep(after)
        return ToolResult("outer done")

    return run


def cancelling(after: float, *, once_asked: bool = False) -> Any:
    """A ``during`` for ``run_with_host`` that cancels the run ``after``
    seconds (counted from the host's first interaction request when
    ``once_asked``)."""

    async def during(conversation: Conversation, host: Host) -> None:
        if once_asked:
            await until(lambda: bool(host.requested))
        await trio.sleep(after)
        await conversation.cancel()

    return during


def cutting(name: str, after: float = 1.0) -> Any:
    """An outer tool that gives its nested call to ``name`` ``after``
    seconds (its own ``move_on_after``), then returns a success."""

    async def run(operation: Any) -> ToolResult:
        with trio.move_on_after(after):
            await operation.context.nested_dispatch(name, {})
        return ToolResult("outer done")

    return run


async def until(predicate: Any, step: float = 0.5) -> None:
    while not predicate():
        await trio.sleep(step)


async def test_nest_01_stale_context_and_one_nested_call_at_a_time(
    autojump_clock: MockClock,
) -> None:
    """NEST-01: a second nested call while one is in flight, or a call from a
    tool whose execution has ended, raises ``resource_conflict``."""
    seen: list[Any] = []
    kept: list[Any] = []

    async def slow(operation: Any) -> ToolResult:
        await trio.sleep(5.0)
        return ToolResult("slow done")

    async def second(context: Any) -> None:
        await trio.sleep(1.0)
        try:
            await context.nested_dispatch("slow", {})
        except Error as error:
            seen.append(error)

    async def first(operation: Any) -> ToolResult:
        kept.append(operation.context)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(second, operation.context)
            result = await operation.context.nested_dispatch("slow", {})
        return ToolResult(f"first: {result.content}")

    async def later(operation: Any) -> ToolResult:
        try:
            await kept[0].nested_dispatch("slow", {})
        except Error as error:
            seen.append(error)
        return ToolResult("later")

    slow_backend = RecordingBackend(slow)
    tools = [
        make_tool("first", RecordingBackend(first)),
        make_tool("later", RecordingBackend(later)),
        make_tool("slow", slow_backend, read_only=True),
    ]
    provider = SP(
        [SP.tool_calls(("c1", "first", {})), SP.tool_calls(("c2", "later", {})), SP.text("done")]
    )
    finished, _ = await run_with_host(provider, tools)
    assert [e.error_class for e in seen] == [ErrorClass.RESOURCE_CONFLICT] * 2
    assert slow_backend.calls == 1
    assert finished.tool_messages()[0]["result"]["content"] == "first: slow done"
    assert finished.record.state == "completed"


async def test_nest_02_a_tool_cannot_invoke_itself(autojump_clock: MockClock) -> None:
    """NEST-02: a nested call naming the outer tool raises ``resource_conflict``
    "a tool cannot invoke itself"."""
    seen: list[Any] = []
    backend = RecordingBackend(outer_calling("cell", seen))
    finished, _ = await run_with_host(
        calls_then_done(("c1", "cell", {})), [make_tool("cell", backend)]
    )
    [error] = seen
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert error.message == "a tool cannot invoke itself"
    assert backend.calls == 1
    assert finished.record.budget.used == 3  # two provider attempts, one tool


async def test_nest_03_approval_gated_tool_is_refused(autojump_clock: MockClock) -> None:
    """NEST-03: a nested call to a ``requires_approval=True`` tool raises
    ``approval_required`` and opens no interaction."""
    seen: list[Any] = []
    gated = RecordingBackend()
    tools = [
        make_tool("cell", RecordingBackend(outer_calling("deploy", seen))),
        make_tool("deploy", gated, requires_approval=True),
    ]
    finished, host = await run_with_host(calls_then_done(("c1", "cell", {})), tools)
    [error] = seen
    assert error.error_class is ErrorClass.APPROVAL_REQUIRED
    assert gated.calls == 0
    assert host.requested == []
    assert finished.record.state == "completed"


async def test_nest_04_own_intent_and_work_unit_before_backend(autojump_clock: MockClock) -> None:
    """NEST-04: a nested invocation commits its own ``tool_invoked`` intent and
    reserves one unit of work before its backend is called."""
    seen: list[Any] = []
    faulty = FaultyStore()
    inner = RecordingBackend(ToolResult("inner"), store=faulty)
    outer = RecordingBackend(outer_calling("inner", seen), store=faulty)
    tools = [make_tool("cell", outer), make_tool("inner", inner, read_only=True)]
    finished, _ = await run_with_host(calls_then_done(("c1", "cell", {})), tools, store=faulty)
    [outer_op], [inner_op] = outer.operations, inner.operations
    assert inner_op.invocation_id != outer_op.invocation_id
    [at_outer], [at_inner] = outer.records_at_call, inner.records_at_call
    assert at_outer is not None
    assert at_inner is not None
    key = f"tool:{inner_op.invocation_id}"
    assert key not in at_outer.intents
    assert at_inner.intents[key]["status"] == "started"
    assert at_inner.intents[key]["tool_name"] == "inner"
    assert key in at_inner.budget.reservations
    assert at_inner.budget.used == at_outer.budget.used + 1
    assert faulty.intent_acknowledged(inner_op.invocation_id)
    assert finished.record.budget.used == 4
    assert finished.record.intents[key]["status"] == "consumed"
    assert seen[0].content == "inner"


# NEST-05 (a read-only nested timeout reported to an outer tool that then
# completes) is left out: every effect, nested or not, is armed with the same
# ``effect_timeout`` and the nested one starts after its outer tool, so the
# outer deadline always expires first or at the same instant; the outer tool
# is then already cancelled and cannot complete normally.


@pytest.mark.parametrize("outcome", ["crash", "error", "unknown", "timeout"])
async def test_nest_09_mutating_nested_failure_stays_unresolved(
    autojump_clock: MockClock, outcome: str
) -> None:
    """NEST-09: a mutating nested tool that crashes, raises an ``Error``,
    reports ``unknown_outcome`` or times out stays unresolved and stops the
    run as ``unknown_outcome``, even when the outer tool catches the error and
    returns success."""
    seen: list[Any] = []

    async def inner(operation: Any) -> Any:
        if outcome == "crash":
            raise RuntimeError("boom")
        if outcome == "error":
            raise Error(ErrorClass.EXECUTION_FAILURE, "refused")
        if outcome == "unknown":
            raise Error(ErrorClass.UNKNOWN_OUTCOME, "lost track")
        await trio.sleep_forever()

    tools = [
        make_tool("cell", RecordingBackend(outer_calling("inner", seen))),
        make_tool("inner", RecordingBackend(inner)),
    ]
    provider = calls_then_done(("c1", "cell", {}))
    finished, _ = await run_with_host(provider, tools, effect_timeout=5.0)
    record = finished.record
    assert record.state == "unknown_outcome"
    inner_keys = [k for k, v in record.intents.items() if v.get("tool_name") == "inner"]
    [key] = inner_keys
    assert record.intents[key]["status"] == "uncertain"
    assert key.removeprefix("tool:") in record.active_tools
    assert len(provider.requests) == 1
    if outcome != "timeout":
        [error] = seen
        assert error.error_class is ErrorClass.UNKNOWN_OUTCOME


def _commit_of_nested_result(kind: str, record: RunRecord) -> bool:
    return kind == "tool_completed" and any(
        v.get("tool_name") == "inner" and v.get("status") == "consumed"
        for v in record.intents.values()
    )


async def test_nest_06_nest_08_input_queued_behind_nested_commit(
    autojump_clock: MockClock,
) -> None:
    """NEST-06, NEST-08: steering and a follow-up arriving while the nested
    result commit is in flight (slowed by 3 s) are queued behind it: the
    commits happen in arrival order, one at a time, each rebased on the last
    acknowledged state, so both messages reach the transcript."""
    faulty = FaultyStore(None, Fault("delay", when=_commit_of_nested_result, delay=3.0))
    seen: list[Any] = []
    order: list[str] = []

    async def during(conversation: Conversation, host: Host) -> None:
        await until(lambda: bool(faulty.fired), step=0.25)
        order.append(await conversation.steer("steer me"))
        order.append(await conversation.follow_up("and then this"))

    tools = [
        make_tool("cell", RecordingBackend(outer_calling("inner", seen))),
        make_tool("inner", RecordingBackend(ToolResult("inner")), read_only=True),
    ]
    provider = SP([SP.tool_calls(("c1", "cell", {})), SP.text("after steering"), SP.text("follow")])
    finished, _ = await run_with_host(provider, tools, store=faulty, during=during)
    assert faulty.max_in_flight == 1
    kinds = faulty.acknowledged_kinds()
    delayed = kinds.index("tool_completed")
    assert kinds[delayed + 1] == "conversation_updated"  # the steering, right after
    steer_record = faulty.acknowledged[delayed + 1][1]
    assert [m["content"] for m in steer_record.context["conversation"]["steering"]] == ["steer me"]
    contents = [m.get("content") for m in finished.messages if m.get("role") == "user"]
    assert contents == ["hello", "steer me", "and then this"]
    assert finished.record.state == "completed"
    assert len(order) == 2


async def test_nest_08_input_during_a_failed_attempt_is_kept(autojump_clock: MockClock) -> None:
    """NEST-08, CONV-22: steering and a follow-up acknowledged while a
    provider attempt streams stay queued when that attempt then fails: the
    failure's commit lands on the last acknowledged state, not on the one
    the attempt started from.  The follow-up then runs as a new turn, and
    the steering is consumed at that turn's first boundary."""
    provider = SP(
        [
            [Sleep(5.0), ResponseFailed(Error(ErrorClass.EXECUTION_FAILURE, "provider down"))],
            SP.text("second turn"),
            SP.text("third turn"),
        ]
    )
    acknowledged: list[Any] = []

    async def during(conversation: Conversation, host: Host) -> None:
        await trio.sleep(1.0)
        acknowledged.append(await conversation.steer("please also do X"))
        acknowledged.append(await conversation.follow_up("and then Y"))
        status = conversation.status()
        assert (len(status.steering), len(status.follow_up)) == (1, 1)

    finished, _ = await run_with_host(provider, [], during=during)
    assert len(acknowledged) == 2
    contents = [m.get("content") for m in finished.messages if m.get("role") == "user"]
    assert contents == ["hello", "and then Y", "please also do X"]
    assert len(provider.requests) == 3
    assert finished.record.state == "completed"


@pytest.mark.parametrize("read_only", [True, False])
async def test_nest_01_a_nested_call_left_running_ends_with_its_caller(
    autojump_clock: MockClock, read_only: bool
) -> None:
    """NEST-01, TOOL-01, NEST-05, NEST-09: a tool that returns while a nested
    call it started (in a task of the host's) still runs ends that call with
    it, and the call is settled before the batch goes on (the next call ran
    beside it, its deadline cut to half of the stray call's): a read-only
    one as a ``cancelled`` error result, and the run completes; a mutating
    one stays unresolved, and the run ends ``unknown_outcome`` before the
    next call.  The host's task gets ``resource_conflict``."""
    leaked: list[Any] = []
    spans: list[tuple[str, float, float]] = []

    async def inner(operation: Any) -> ToolResult:
        start = trio.current_time()
        try:
            await trio.sleep(3)
        finally:
            spans.append(("inner", start, trio.current_time()))
        return ToolResult("inner done")  # pragma: no cover

    async def after(operation: Any) -> ToolResult:
        spans.append(("after", trio.current_time(), trio.current_effective_deadline()))
        return ToolResult("after done")

    async with trio.open_nursery() as host_tasks:
        outer = leaving(host_tasks, "inner", leaked, after=0.5)

        tools = [
            make_tool("outer", RecordingBackend(outer), read_only=True),
            make_tool("inner", RecordingBackend(inner), read_only=read_only),
            make_tool("after", RecordingBackend(after), read_only=True),
        ]
        provider = SP(
            [SP.tool_calls(("c1", "outer", {}), ("c2", "after", {})), SP.text("x"), SP.text("y")]
        )
        finished, _ = await run_with_host(provider, tools, effect_timeout=30.0)
    [error] = leaked
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert spans[0] == ("inner", 0.0, 0.5)
    nested = [v for v in finished.record.intents.values() if v.get("tool_name") == "inner"]
    if read_only:
        assert finished.record.state == "completed"
        assert [v["status"] for v in nested] == ["consumed"]
        assert spans[1] == ("after", 0.5, 30.5)  # after the nested call, its own deadline
    else:
        assert finished.record.state == "unknown_outcome"
        assert [v["status"] for v in nested] == ["uncertain"]
        assert len(spans) == 1  # the next call never started
    assert finished.types().count("run_cancelled") + finished.types().count("run_completed") == 1


async def test_can_19_takeover_seen_by_a_nested_call_keeps_the_conflict(
    autojump_clock: MockClock,
) -> None:
    """CAN-19: a takeover (a newer incarnation) refusing a nested call's
    intent stops the run in recovery_required with ``last_error`` holding
    that conflict, even though the outer tool then fails with it: the
    outer tool's uncertainty does not replace what the host must act on."""
    seen: list[Any] = []
    faulty = FaultyStore(None, Fault("conflict", kind="tool_invoked", occurrence=2))
    tools = [
        make_tool("cell", RecordingBackend(outer_calling("inner", seen))),
        make_tool("inner", RecordingBackend(ToolResult("inner")), read_only=True),
    ]
    provider = calls_then_done(("c1", "cell", {}))
    finished, _ = await run_with_host(provider, tools, store=faulty)
    assert finished.snapshot.phase == "recovery_required"
    error = finished.snapshot.last_error
    assert error is not None
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert tools[1].backend.calls == 0


async def test_nest_07_cancel_clears_queued_commits(autojump_clock: MockClock) -> None:
    """NEST-07: a nested ``tool_invoked`` queued behind an in-flight commit is
    dropped by ``cancel()``: no effect starts after it."""

    def steering_commit(kind: str, record: RunRecord) -> bool:
        return kind == "conversation_updated" and bool(record.context["conversation"]["steering"])

    faulty = FaultyStore(None, Fault("delay", when=steering_commit, delay=3.0))
    seen: list[Any] = []
    cancelled_at: list[int] = []
    inner = RecordingBackend()

    async def outer(operation: Any) -> ToolResult:
        await until(lambda: bool(faulty.fired), step=0.25)
        return await outer_calling("inner", seen)(operation)  # type: ignore[no-any-return]

    async def during(conversation: Conversation, host: Host) -> None:
        await trio.sleep(0.1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.steer, "slow steering")
            await until(lambda: bool(faulty.fired), step=0.25)
            await trio.sleep(0.5)
            await conversation.cancel()
            cancelled_at.append(len(faulty.attempts))

    tools = [make_tool("cell", RecordingBackend(outer)), make_tool("inner", inner)]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "cell", {})), tools, store=faulty, during=during
    )
    assert inner.calls == 0
    after_cancel = [kind for _n, kind, _at in faulty.attempts[cancelled_at[0] :]]
    assert "tool_invoked" not in after_cancel
    assert not [v for v in finished.record.intents.values() if v.get("tool_name") == "inner"]
    assert finished.types().count("run_cancelled") == 1
    assert finished.record.run_id == RUN_ID


async def test_nest_05_read_only_nested_timeout_is_reported_to_the_outer_tool(
    autojump_clock: MockClock,
) -> None:
    """NEST-05: a nested read-only call that outlives its deadline raises
    ``timeout`` in the outer tool, which catches it and completes normally;
    the nested intent is settled (no unknown outcome) and the run completes."""
    seen: list[Any] = []

    async def slow(operation: Any) -> ToolResult:
        await trio.sleep(1_000)
        return ToolResult("never")

    tools = [
        make_tool("outer", RecordingBackend(outer_calling("slow", seen))),
        make_tool("slow", RecordingBackend(slow), read_only=True),
    ]
    started = trio.current_time()
    finished, _ = await run_with_host(
        calls_then_done(("c1", "outer", {})), tools, effect_timeout=10.0
    )
    [error] = seen
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.TIMEOUT
    # inside the outer budget: half of what the outer tool had left
    assert trio.current_time() - started < 10.0
    assert finished.record.state == "completed"
    results = [m["result"] for m in finished.snapshot.messages if m["role"] == "tool"]
    assert results[-1]["content"] == "outer caught the error"
    assert results[-1]["is_error"] is False
    nested = [v for v in finished.record.intents.values() if v.get("tool_name") == "slow"]
    assert [v["status"] for v in nested] == ["consumed"]
    assert finished.record.active_tools == {}


async def test_nest_04_nested_result_is_plain_data_for_the_outer_tool(
    autojump_clock: MockClock,
) -> None:
    """NEST-04: the ToolResult a nested call returns carries plain JSON data,
    as a backend returns it: the outer tool may change its own copy without
    touching what was committed."""
    seen: list[Any] = []
    inner = RecordingBackend(ToolResult([{"type": "text", "text": "hi"}], {"n": [1, 2]}))
    outer = RecordingBackend(outer_calling("inner", seen))
    tools = [make_tool("cell", outer), make_tool("inner", inner, read_only=True)]
    finished, _ = await run_with_host(calls_then_done(("c1", "cell", {})), tools)
    [result] = seen
    assert type(result.content) is list
    assert type(result.content[0]) is dict
    assert type(result.structured_content) is dict
    result.structured_content["n"].append(3)  # the outer tool's own copy
    [inner_op] = inner.operations
    stored = finished.record.tool_results[inner_op.invocation_id]
    assert thaw(stored["structured_content"]) == {"n": [1, 2]}


def _deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels):
        value = {"k": value}
    return value


@pytest.mark.parametrize(
    "arguments",
    [_deep(100_000), Unreadable()],
    ids=["nested-past-recursion", "unreadable-mapping"],
)
async def test_nest_04_arguments_that_cannot_be_walked_are_validation(
    autojump_clock: MockClock, arguments: Any
) -> None:
    """NEST-04: nested arguments that cannot even be walked (nested past
    Python's recursion limit, a mapping failing when read) are refused with
    ``validation`` before anything is committed; the nested tool never runs
    and the outer tool goes on."""
    seen: list[Any] = []
    inner = RecordingBackend(ToolResult("never"))
    outer = RecordingBackend(outer_calling("inner", seen, arguments))
    tools = [make_tool("cell", outer), make_tool("inner", inner, read_only=True)]
    finished, _ = await run_with_host(calls_then_done(("c1", "cell", {})), tools)
    [error] = seen
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.VALIDATION
    assert inner.calls == 0
    assert len(finished.record.intents) == 3  # two provider attempts and the outer tool
    assert finished.record.state == "completed"


def _nested_intent(kind: str, record: RunRecord) -> bool:
    return kind == "tool_invoked" and any(
        v.get("tool_name") == "inner" for v in record.intents.values()
    )


@pytest.mark.parametrize("in_nursery", [False, True], ids=["direct", "in-a-nursery"])
async def test_can_17_a_nested_commit_outliving_commit_timeout_is_storage_failed(
    autojump_clock: MockClock, in_nursery: bool
) -> None:
    """CAN-17: when the nested call's intent commit outlives
    ``commit_timeout``, the outer tool's ``nested_dispatch`` raises an
    ``Error`` of class ``storage_failed`` (never an internal exception),
    the conversation is ``storage_failed``, and leaving the block raises
    nothing, also when the outer tool ran the call in its own nursery."""
    seen: list[Any] = []
    faulty = FaultyStore()
    faulty.add(Fault("delay", when=_nested_intent, delay=10.0))
    inner = RecordingBackend(ToolResult("never"))

    async def outer(operation: Any) -> ToolResult:
        async def call() -> None:
            try:
                await operation.context.nested_dispatch("inner", {})
            except BaseException as exc:
                seen.append(exc)
                raise

        if in_nursery:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                nursery.start_soon(trio.sleep, 50.0)
        else:
            await call()
        return ToolResult("unreachable")

    tools = [make_tool("cell", RecordingBackend(outer)), make_tool("inner", inner)]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "cell", {})), tools, store=faulty, commit_timeout=1.0
    )
    [error] = seen
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.STORAGE_FAILED
    assert finished.snapshot.phase == "storage_failed"
    assert inner.calls == 0


async def test_nest_09_a_mutating_nested_call_cut_by_its_caller_stops_the_run(
    autojump_clock: MockClock,
) -> None:
    """NEST-09: a mutating nested call that its calling tool cuts with its own
    scope (``move_on_after``) after dispatch stays unresolved and stops the
    run ``unknown_outcome`` at once: the stop cancels the caller, no later
    nested effect starts, and its claim of success is never committed."""
    log: list[Any] = []

    async def slow(operation: Any) -> ToolResult:
        await trio.sleep(5)
        return ToolResult("inner")

    inner = RecordingBackend(slow)

    async def outer(operation: Any) -> ToolResult:
        with trio.move_on_after(1):
            await operation.context.nested_dispatch("inner", {"n": 1})
        try:
            log.append(await operation.context.nested_dispatch("inner", {"n": 2}))
        except Error as error:
            log.append(error)
        return ToolResult("outer claims success")

    tools = [make_tool("outer", RecordingBackend(outer)), make_tool("inner", inner)]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "outer", {})), tools, effect_timeout=60.0
    )
    assert inner.calls == 1
    assert log == []  # the stop cancelled the caller before its second call
    assert finished.record.state == "unknown_outcome"
    assert finished.tool_messages() == []
    nested = [v for v in finished.record.intents.values() if v.get("tool_name") == "inner"]
    assert [v["status"] for v in nested] == ["uncertain"]
    assert finished.snapshot.last_error.error_class is ErrorClass.UNKNOWN_OUTCOME


async def test_nest_05_a_read_only_nested_call_cut_by_its_caller_is_an_error_result(
    autojump_clock: MockClock,
) -> None:
    """NEST-05: a read-only nested call its caller cuts after dispatch did
    nothing lasting: it is settled as a ``cancelled`` error result and the
    run goes on to complete."""

    async def slow(operation: Any) -> ToolResult:
        await trio.sleep(5)
        return ToolResult("inner")

    tools = [
        make_tool("outer", RecordingBackend(cutting("inner"))),
        make_tool("inner", RecordingBackend(slow), read_only=True),
    ]
    finished, _ = await run_with_host(calls_then_done(("c1", "outer", {})), tools)
    assert finished.record.state == "completed"
    [(invocation, nested)] = intents_of(finished.record, "inner")
    assert nested["status"] == "consumed"
    result = finished.record.tool_results[invocation]
    assert result["is_error"] is True
    assert result["error"]["class"] == "cancelled"


async def test_nest_04_a_nested_intent_cut_while_it_commits_is_withdrawn(
    autojump_clock: MockClock,
) -> None:
    """NEST-04, CAN-04: the caller's own scope firing while the nested call's
    intent commits never dispatches it; the committed intent is settled as
    not dispatched and the run completes (no kernel refusal, no cancelled
    run nobody asked for)."""

    def nested_intent(kind: str, record: RunRecord) -> bool:
        return kind == "tool_invoked" and any(
            v.get("tool_name") == "inner" for v in record.intents.values()
        )

    store = FaultyStore(None, Fault("delay", when=nested_intent, delay=3.0))
    inner = RecordingBackend(ToolResult("inner"))

    tools = [
        make_tool("outer", RecordingBackend(cutting("inner")), read_only=True),
        make_tool("inner", inner, read_only=True),
    ]
    finished, _ = await run_with_host(calls_then_done(("c1", "outer", {})), tools, store=store)
    assert inner.calls == 0
    assert finished.record.state == "completed"
    [(invocation, nested)] = intents_of(finished.record, "inner")
    assert nested["status"] == "consumed"
    error = finished.record.tool_results[invocation]["error"]
    assert error["details"]["certainty"] == "not_dispatched"


async def test_nest_05_no_nested_call_starts_after_its_caller_deadline(
    autojump_clock: MockClock,
) -> None:
    """NEST-05, CAN-10: a caller that shields itself past its own effect
    deadline and then dispatches a nested call gets ``timeout``: no intent,
    no work unit, no backend call."""
    seen: list[Any] = []
    inner = RecordingBackend(ToolResult("done"))

    async def outer(operation: Any) -> ToolResult:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                try:
                    await operation.context.nested_dispatch("inner", {})
                except Error as error:
                    seen.append(error)
            raise
        return ToolResult("outer")

    tools = [
        make_tool("outer", RecordingBackend(outer), read_only=True),
        make_tool("inner", inner),
    ]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "outer", {})), tools, effect_timeout=10.0
    )
    assert inner.calls == 0
    [error] = seen
    assert error.error_class is ErrorClass.TIMEOUT
    assert not [v for v in finished.record.intents.values() if v.get("tool_name") == "inner"]
    assert finished.record.budget.used == 2  # the provider attempt and the outer tool


async def test_int_11_a_nested_interaction_in_a_host_task_ends_when_the_run_stops(
    autojump_clock: MockClock,
) -> None:
    """INT-11, INT-17: a nested call running in a task of the host's, waiting
    in ``interact``, stops waiting when the run is cancelled (its effect
    scope is cancelled: ``trio.Cancelled``), instead of waiting for an
    answer that cannot come."""
    ended: list[Any] = []

    async def asks(operation: Any) -> ToolResult:
        try:
            await operation.context.interact({"question": "?"})
        except BaseException as error:
            ended.append((trio.current_time(), error))
            raise
        return ToolResult("answered")

    async with trio.open_nursery() as host_tasks:

        async def outer(operation: Any) -> ToolResult:
            async def in_the_background() -> None:
                with contextlib.suppress(Error):
                    await operation.context.nested_dispatch("asks", {})

            host_tasks.start_soon(in_the_background)
            await trio.sleep(1_000)
            return ToolResult("outer done")

        tools = [
            make_tool("outer", RecordingBackend(outer), read_only=True),
            make_tool("asks", RecordingBackend(asks), read_only=True),
        ]
        finished, _ = await run_with_host(
            calls_then_done(("c1", "outer", {})),
            tools,
            lambda event: None,  # nobody answers
            during=cancelling(1, once_asked=True),
            effect_timeout=3_000.0,
        )
        settled_at = trio.current_time()
        host_tasks.cancel_scope.deadline = settled_at + 100  # a hang fails, never waits
    [(at, error)] = ended
    assert isinstance(error, trio.Cancelled)
    assert at <= settled_at
    assert finished.snapshot.pending_interaction is None


@pytest.mark.parametrize("read_only", [True, False])
async def test_nest_04_a_nested_result_cut_before_it_commits_is_committed(
    autojump_clock: MockClock, read_only: bool
) -> None:
    """NEST-04: a nested backend that returned, whose caller's own scope
    fires just as its result is to commit, has that known result committed:
    the run completes (it left the intent unsettled under the caller's
    success, and the run ended by the kernel's refusal)."""

    class FinishesItsWork:
        calls = 0

        async def execute(self, operation: Any) -> ToolResult:
            FinishesItsWork.calls += 1
            with trio.CancelScope(shield=True):  # finishes the write it began
                await trio.sleep(2)
            return ToolResult("inner done")

    tools = [
        make_tool("outer", RecordingBackend(cutting("inner"))),
        make_tool("inner", FinishesItsWork(), read_only=read_only),
    ]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "outer", {})), tools, effect_timeout=60.0
    )
    assert FinishesItsWork.calls == 1
    assert finished.record.state == "completed", finished.snapshot.last_error
    nested = {
        k: v["status"] for k, v in finished.record.intents.items() if v.get("tool_name") == "inner"
    }
    assert list(nested.values()) == ["consumed"]
    [(key, _)] = nested.items()
    assert finished.record.tool_results[key.removeprefix("tool:")]["content"] == "inner done"


async def test_can_03_a_stop_ends_a_nested_call_running_in_a_host_task(
    autojump_clock: MockClock,
) -> None:
    """CAN-03, NEST-01: ``cancel()`` ends every executing effect, a nested
    backend running in a task of the host's too (out of the worker's reach,
    it ran on after the run settled); its caller gets ``cancelled`` and the
    run settles ``unknown_outcome`` with it uncertain."""
    ended: list[Any] = []

    async def inner(operation: Any) -> ToolResult:
        try:
            await trio.sleep(1_000)
        finally:
            ended.append(trio.current_time())
        return ToolResult("never")  # pragma: no cover

    async with trio.open_nursery() as host_tasks:
        seen: list[Any] = []

        async def outer(operation: Any) -> ToolResult:
            async def in_the_background() -> None:
                try:
                    await operation.context.nested_dispatch("inner", {})
                except Error as error:
                    seen.append(error)

            host_tasks.start_soon(in_the_background)
            await trio.sleep(1_000)
            return ToolResult("outer done")  # pragma: no cover

        tools = [
            make_tool("outer", RecordingBackend(outer), read_only=True),
            make_tool("inner", RecordingBackend(inner)),
        ]
        finished, _ = await run_with_host(
            calls_then_done(("c1", "outer", {})),
            tools,
            during=cancelling(5),
            effect_timeout=3_000.0,
        )
        settled_at = trio.current_time()
    assert ended == [5.0]
    assert settled_at == 5.0
    [error] = seen
    assert error.error_class is ErrorClass.CANCELLED
    assert finished.record.state == "unknown_outcome"
    nested = [v for v in finished.record.intents.values() if v.get("tool_name") == "inner"]
    assert [v["status"] for v in nested] == ["uncertain"]


async def test_nest_01_a_caller_ending_while_the_nested_intent_commits_withdraws_it(
    autojump_clock: MockClock,
) -> None:
    """NEST-01, TOOL-01: a caller whose execution ends while its nested
    call's intent is still committing (a slow store) never has that call
    dispatched: the intent is settled as not dispatched, the host's task
    gets ``resource_conflict``, and the run completes (the backend ran
    unbounded, after its caller, with a full effect deadline)."""

    def nested_intent(kind: str, record: RunRecord) -> bool:
        return kind == "tool_invoked" and any(
            v.get("tool_name") == "inner" for v in record.intents.values()
        )

    store = FaultyStore(None, Fault("delay", when=nested_intent, delay=3.0))
    inner = RecordingBackend(ToolResult("inner"))
    seen: list[Any] = []
    async with trio.open_nursery() as host_tasks:
        outer = leaving(host_tasks, "inner", seen, after=0.5)

        tools = [
            make_tool("outer", RecordingBackend(outer), read_only=True),
            make_tool("inner", inner, read_only=True),
        ]
        finished, _ = await run_with_host(calls_then_done(("c1", "outer", {})), tools, store=store)
    assert inner.calls == 0
    [error] = seen
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert finished.record.state == "completed"
    [(invocation, nested)] = intents_of(finished.record, "inner")
    assert nested["status"] == "consumed"
    assert finished.record.tool_results[invocation]["error"]["details"]["certainty"] == (
        "not_dispatched"
    )


async def test_tool_22_a_stop_is_a_stop_however_long_the_effect_cleans_up(
    autojump_clock: MockClock,
) -> None:
    """TOOL-22, CAN-07: ``cancel()`` before a nested call's deadline, whose
    backend cleans up (shielded) past that deadline, is a stop, not a
    timeout: no result is committed after ``cancel()`` (a timeout error
    result was) and the call stays unsettled."""
    seen: list[Any] = []

    async def inner(operation: Any) -> ToolResult:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await trio.sleep(2)  # cleaning up past its deadline
            raise
        return ToolResult("never")  # pragma: no cover

    async def outer(operation: Any) -> ToolResult:
        with trio.CancelScope(shield=True):  # only the effect's own scope takes the stop
            try:
                seen.append(await operation.context.nested_dispatch("inner", {}))
            except Error as error:
                seen.append(error)
        return ToolResult("outer done")

    tools = [
        make_tool("outer", RecordingBackend(outer), read_only=True),
        make_tool("inner", RecordingBackend(inner), read_only=True),
    ]
    finished, _ = await run_with_host(
        calls_then_done(("c1", "outer", {})), tools, during=cancelling(1), effect_timeout=4.0
    )
    [error] = seen
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.CANCELLED
    [(invocation, nested)] = intents_of(finished.record, "inner")
    assert invocation not in finished.record.tool_results
    assert nested["status"] == "uncertain"


async def test_nest_07_a_nested_call_in_a_host_task_commits_nothing_after_cancel(
    autojump_clock: MockClock,
) -> None:
    """NEST-07, TOOL-22: a nested call made from a host's task (which a stop
    does not cancel) whose intent queued behind a slow commit commits
    nothing once ``cancel()`` is accepted: its intent was stored after the
    cancel, then settled uncertain though never dispatched."""

    def steering_commit(kind: str, record: RunRecord) -> bool:
        return kind == "conversation_updated" and bool(record.context["conversation"]["steering"])

    store = FaultyStore(None, Fault("delay", when=steering_commit, delay=3.0))
    inner = RecordingBackend(ToolResult("inner done"))
    seen: list[Any] = []
    cancelled_after: list[int] = []
    async with trio.open_nursery() as host_tasks:

        async def outer(operation: Any) -> ToolResult:
            async def in_the_background() -> None:
                try:
                    seen.append(await operation.context.nested_dispatch("inner", {}))
                except Error as error:
                    seen.append(error)

            await trio.sleep(1.5)  # the steering commit is in flight (t=1..4)
            host_tasks.start_soon(in_the_background)
            await trio.sleep(1_000)
            return ToolResult("outer")  # pragma: no cover

        async def during(conversation: Conversation, host: Host) -> None:
            await trio.sleep(1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conversation.steer, "slow steering")
                await trio.sleep(2)
                await conversation.cancel()
                cancelled_after.append(len(store.attempts))

        tools = [
            make_tool("outer", RecordingBackend(outer), read_only=True),
            make_tool("inner", inner),
        ]
        finished, _ = await run_with_host(
            calls_then_done(("c1", "outer", {})),
            tools,
            store=store,
            during=during,
            effect_timeout=3_000.0,
        )
    after = [kind for _, kind, _ in store.attempts[cancelled_after[0] :]]
    assert "tool_invoked" not in after
    assert inner.calls == 0
    assert [type(item) for item in seen] == [Error]
    assert not intents_of(finished.record, "inner")
