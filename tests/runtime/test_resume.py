"""Resuming a run taken over from a dead host on a new incarnation: from
its last committed boundary, with the run time it had left, replaying
nothing.

On SQLite (fencing needs a durable store; its commits run in a thread) and
a MockClock running at the real rate, jumped over the hours a host is dead:
the run's wall clock is Trio's, so the budgets carried are exact."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.runtime.support import Delegating, RecordingBackend, make_tool
from trio_backplane import Authority, Error, ErrorClass, ToolRegistry, open_conversation
from trio_backplane.kernel import RunRecord
from trio_backplane.recovery import settle_run
from trio_backplane.store import SQLiteStore
from trio_backplane.testing import Hang, ScriptedProvider
from trio_backplane.tools import ToolResult

S = ScriptedProvider
RUN = "run-1"
TIMEOUT = 600.0


class DiesAfter(Delegating):
    """A store whose host dies once a commit leaves a record ``last(record)``
    holds for: that commit lands, no later one does."""

    def __init__(self, inner: Any, last: Callable[[RunRecord], bool]) -> None:
        super().__init__(inner)
        self.last = last
        self.dead = False

    async def commit(self, run_id: str, **kwargs: Any) -> Any:
        if self.dead:
            raise Error(ErrorClass.STORAGE_FAILED, "the host is gone")
        receipt = await self.inner.commit(run_id, **kwargs)
        self.dead = self.last(kwargs["record"])
        return receipt


@pytest.fixture
def clock() -> MockClock:
    return MockClock(rate=1.0)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(tmp_path / "runs.sqlite3") as opened:
        yield opened


def _registry(tools: list[Any]) -> tuple[ToolRegistry, Authority]:
    registry = ToolRegistry(tools)
    return registry, Authority.for_registry(registry, caller="host", run_id=RUN)


async def _crash(
    store: Any, provider: Any, tools: list[Any], last: Callable[[RunRecord], bool], **options: Any
) -> None:
    """Run until a commit leaves a record ``last`` holds for; the host then
    dies: no later commit lands.  ``options``: more of ``open_conversation``'s."""
    dying = DiesAfter(store, last)
    registry, authority = _registry(tools)
    async with open_conversation(
        RUN,
        store=dying,
        provider=provider,
        registry=registry,
        authority=authority,
        work=20,
        run_timeout=TIMEOUT,
        wall_clock=trio.current_time,
        **options,
    ) as conversation:
        await conversation.prompt("go")
        while not dying.dead:
            await trio.sleep(0.01)
        with contextlib.suppress(Error):  # its storage may have failed already
            await conversation.cancel()
        await conversation.wait_settled()


async def _resumed(store: Any, provider: Any, tools: list[Any], **options: Any) -> Any:
    """``settle_run(resume=True)``, then the resumed conversation."""
    settled = await settle_run(store, RUN, resume=True, wall_clock=trio.current_time)
    assert settled.resumable
    assert not settled.committed
    assert (settled.record.state, settled.record.incarnation) == ("running", 2)
    registry, authority = _registry(tools)
    return open_conversation(
        RUN,
        store=store,
        provider=provider,
        registry=registry,
        authority=authority,
        resume=settled.record,
        wall_clock=trio.current_time,
        **options,
    )


def _pending(record: RunRecord) -> Any:
    conversation = record.context.get("conversation") or {}
    return conversation.get("pending_interaction")


async def test_a_run_waiting_for_approval_resumes_with_its_pre_wait_budget(
    clock: MockClock, store: Any
) -> None:
    """A run whose host died while a person had not answered its approval:
    resumed on incarnation 2, it asks again under the same interaction id,
    its deadline is the run time left when the wait began (the hour the
    host was dead does not count), and once approved the tool runs once and
    the run completes from the committed response (no provider replay)."""
    deploy = RecordingBackend(ToolResult("deployed"))
    tools = [make_tool("deploy", deploy, requires_approval=True)]
    clock.jump(5.0)  # the run starts past the clock's zero
    started = trio.current_time()
    await _crash(store, S([S.tool_calls(("c1", "deploy", {}))]), tools, lambda r: bool(_pending(r)))
    stored = await store.load(RUN)
    assert stored is not None
    asked = _pending(stored)
    assert TIMEOUT - (asked["requested_at"] - started) <= asked["remaining"] <= TIMEOUT
    clock.jump(3600.0)  # the host is dead for an hour; nobody answered
    resumed_at = trio.current_time()
    provider = S([S.text("deployed it")])
    async with await _resumed(store, provider, tools) as conversation:
        opened_at = trio.current_time()
        with trio.fail_after(5):
            while conversation.status().pending_interaction is None:
                await trio.sleep(0.01)
        again = conversation.status()
        assert again.pending_interaction is not None
        assert again.pending_interaction["id"] == asked["id"]
        assert again.run.incarnation == 2
        deadline = again.run.deadline
        assert resumed_at + asked["remaining"] <= deadline <= opened_at + asked["remaining"]
        await conversation.resolve(asked["id"], "approved")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert deploy.calls == 1
    assert len(provider.requests) == 1  # the committed response was not asked for again
    roles = [m["role"] for m in snapshot.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]


async def test_an_answer_committed_before_the_call_started_is_not_asked_again(
    clock: MockClock, store: Any
) -> None:
    """The host died after committing the person's approval and before the
    tool's intent: the resumed run runs the approved call at once, asking
    nobody again."""
    deploy = RecordingBackend(ToolResult("deployed"))
    tools = [make_tool("deploy", deploy, requires_approval=True)]

    def answered(record: RunRecord) -> bool:
        resolved = (record.context.get("conversation") or {}).get("resolved_interaction")
        return resolved is not None

    async def approve_when_asked() -> None:
        while True:
            record = await store.load(RUN)
            if record is not None and _pending(record):
                break
            await trio.sleep(0.01)

    dying = DiesAfter(store, answered)
    registry, authority = _registry(tools)
    async with open_conversation(
        RUN,
        store=dying,
        provider=S([S.tool_calls(("c1", "deploy", {}))]),
        registry=registry,
        authority=authority,
        run_timeout=TIMEOUT,
        wall_clock=trio.current_time,
    ) as first:
        await first.prompt("go")
        await approve_when_asked()
        asked = first.status().pending_interaction
        assert asked is not None
        await first.resolve(asked["id"], "approved")
        await first.wait_settled()
    assert deploy.calls == 0  # its intent never committed: it never ran
    requested: list[Any] = []
    async with await _resumed(store, S([S.text("done")]), tools) as conversation:
        events = conversation.subscribe()
        snapshot = await conversation.wait_settled()
        async for event in events:
            requested += [event] if event.type == "interaction_requested" else []
    assert snapshot.run.state == "completed"
    assert deploy.calls == 1
    assert requested == []


async def test_an_interrupted_provider_attempt_is_abandoned_and_asked_again(
    clock: MockClock, store: Any
) -> None:
    """The host died during the attempt after a completed tool: the
    resumed run commits that attempt abandoned, asks the provider again,
    never runs the tool again, and its transcript holds each message once."""
    lookup = RecordingBackend(ToolResult("42"))
    tools = [make_tool("lookup", lookup, read_only=True)]
    provider = S([S.tool_calls(("c1", "lookup", {})), [Hang()]])

    def second_attempt(record: RunRecord) -> bool:
        return record.active_provider is not None and len(record.transcript) > 1

    await _crash(store, provider, tools, second_attempt)
    before = await store.load(RUN)
    assert before is not None
    assert before.active_provider is not None
    abandoned = f"provider:{before.active_provider['attempt_id']}"
    async with await _resumed(store, S([S.text("the answer is 42")]), tools) as conversation:
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert lookup.calls == 1
    assert snapshot.run.intents[abandoned]["status"] == "consumed"
    assert [m["role"] for m in snapshot.messages] == ["user", "assistant", "tool", "assistant"]


async def test_a_run_whose_turn_ended_finishes_when_resumed(clock: MockClock, store: Any) -> None:
    """The host died after the turn's outcome committed, before the run
    finished: the resumed run finishes it, calling nothing."""
    provider = S([S.text("hello")])

    def turn_recorded(record: RunRecord) -> bool:
        return bool((record.context.get("conversation") or {}).get("last_turn"))

    await _crash(store, provider, [], turn_recorded)
    again = S([S.text("never")])
    async with await _resumed(store, again, []) as conversation:
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert again.requests == []
    assert [m["role"] for m in snapshot.messages] == ["user", "assistant"]


async def test_a_run_with_an_effect_in_flight_is_never_resumed(
    clock: MockClock, store: Any
) -> None:
    """A dispatched mutation: ``settle_run(resume=True)`` settles the run
    ``unknown_outcome`` as without it, and ``open_conversation(resume=)``
    refuses such a record with ``resource_conflict``."""
    hang = RecordingBackend(lambda _op: trio.sleep_forever())
    tools = [make_tool("transfer", hang)]
    await _crash(
        store, S([S.tool_calls(("c1", "transfer", {}))]), tools, lambda r: bool(r.active_tools)
    )
    stored = await store.load(RUN)
    assert stored is not None
    registry, authority = _registry(tools)
    with pytest.raises(Error) as refused:
        async with open_conversation(
            RUN, store=store, provider=S([]), registry=registry, authority=authority, resume=stored
        ):
            pass  # pragma: no cover - refused before the block
    assert refused.value.error_class is ErrorClass.RESOURCE_CONFLICT
    settled = await settle_run(store, RUN, resume=True, wall_clock=trio.current_time)
    assert not settled.resumable
    assert settled.record.state == "unknown_outcome"
    assert hang.calls == 1


async def test_a_run_out_of_time_when_resumed_times_out(clock: MockClock, store: Any) -> None:
    """The host died in a provider attempt and stayed dead past the run
    deadline: the resumed run stops ``timed_out`` at once, asking nothing."""
    provider = S([[Hang()]])
    await _crash(store, provider, [], lambda r: r.active_provider is not None)
    clock.jump(TIMEOUT + 60.0)
    again = S([S.text("never")])
    async with await _resumed(store, again, []) as conversation:
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "timed_out"
    assert again.requests == []
