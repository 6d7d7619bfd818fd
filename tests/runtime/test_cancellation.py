"""Cancellation, deadlines, storage failure and restart: every ``CAN-`` behaviour,
plus KER-09 and KER-10 (the gateway under a failing store and an effect that
outlives ``effect_timeout``).

Everything runs on ``MemoryStore`` (wrapped in the fault-injecting
``FaultyStore``) under ``MockClock(autojump_threshold=0)`` (the
``autojump_clock`` fixture), so every time below is exact.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import TERMINAL_STATES, RunRecord, thaw
from trio_backplane.runtime import Conversation, Event, ResponseCompleted, open_conversation
from trio_backplane.testing import Hang, ScriptedProvider, Sleep
from trio_backplane.tools import ToolRegistry, ToolResult

from .support import (
    RUN_ID,
    TERMINAL_EVENTS,
    Fault,
    FaultyStore,
    ProbeBackend,
    drained,
    granted,
    make_tool,
    probe_tools,
    run_with_host,
    task_tree_size,
)

S = ScriptedProvider


def call(outcome: str = "ok", tool: str = "act", call_id: str = "c1", **extra: Any) -> list[Any]:
    """A response that calls one probe tool."""
    return S.tool_calls((call_id, tool, {"outcome": outcome, **extra}))


class Harness:
    """One conversation over a ``FaultyStore`` with a ``ProbeBackend`` behind
    the tools ``look`` (read-only) and ``act`` (mutating), one subscriber."""

    def __init__(self, responses: Sequence[Sequence[Any]], *faults: Fault) -> None:
        self.store = FaultyStore(None, *faults)
        self.provider = ScriptedProvider(responses)
        self.backend = ProbeBackend(self.store)
        self.registry = ToolRegistry(probe_tools(self.backend))
        self.events: list[Event] = []
        self._channel: trio.MemoryReceiveChannel[Event] | None = None
        self.conversation: Conversation | None = None

    @asynccontextmanager
    async def open(self, **options: Any) -> AsyncIterator[Conversation]:
        async with open_conversation(
            RUN_ID,
            store=self.store,
            provider=self.provider,
            registry=self.registry,
            authority=granted(self.registry),
            **options,
        ) as conversation:
            self.conversation = conversation
            self._channel = conversation.subscribe(buffer=100_000)
            yield conversation
        self.drain()
        assert self.backend.running == 0, "a backend call outlived the conversation"

    def drain(self) -> list[Event]:
        if self._channel is not None:
            while True:
                try:
                    self.events.append(self._channel.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
        return self.events

    def types(self) -> list[str]:
        return [e.type for e in self.drain()]

    def terminal_events(self) -> list[str]:
        return [t for t in self.types() if t in TERMINAL_EVENTS]

    async def stored(self) -> RunRecord:
        record = await self.store.load(RUN_ID)
        assert record is not None
        return record


async def cancel_when(harness: Harness, kind: str) -> None:
    """Call ``cancel()`` as soon as a commit of ``kind`` starts."""
    await harness.store.reached(kind).wait()
    assert harness.conversation is not None
    await harness.conversation.cancel()
    harness.backend.cancel_returned = True


# -- CAN-01, CAN-03, CAN-06 ------------------------------------------------------


async def test_can_01_cancel_returns_before_cleanup_and_settlement(
    autojump_clock: MockClock,
) -> None:
    """CAN-01: cancel() returns at once; the (slow) cleanup commits and the
    settlement come afterwards."""
    h = Harness([[Hang()]], Fault("delay", kind="cancel", delay=2.0))
    async with h.open() as c:
        await c.prompt("hi")
        await h.store.reached("provider_started").wait()
        await trio.sleep(1)
        before = trio.current_time()
        await c.cancel()
        assert trio.current_time() == before
        assert c.status().phase == "cancelling"
        assert c.status().run.state == "running"  # nothing committed yet
        assert "run_cancelled" not in h.types()
        snapshot = await c.wait_settled()
        assert trio.current_time() == before + 2.0
    assert snapshot.phase == "terminal"
    assert h.terminal_events() == ["run_cancelled"]


async def test_can_03_cancel_active_provider_stream(autojump_clock: MockClock) -> None:
    """CAN-03: cancelling while a provider stream is active cancels it and ends
    with run_cancelled, phase terminal."""
    h = Harness([[Hang()]])
    async with h.open() as c:
        await c.prompt("hi")
        await trio.sleep(1)
        await c.cancel()
        snapshot = await c.wait_settled()
    assert snapshot.phase == "terminal"
    assert h.terminal_events() == ["run_cancelled"]
    assert h.provider.closed == 1  # the stream was closed by the cancellation


async def test_can_03_cancel_active_tool_backend(autojump_clock: MockClock) -> None:
    """CAN-03: cancelling while a tool backend runs cancels that worker's scope
    (the backend sees trio.Cancelled) and ends with run_cancelled, phase terminal."""
    h = Harness([call("hang"), S.text("never")])
    async with h.open() as c:
        await c.prompt("hi")
        await trio.sleep(1)
        assert h.backend.running == 1
        await c.cancel()
        snapshot = await c.wait_settled()
    assert snapshot.phase == "terminal"
    assert h.backend.cancelled == 1
    assert h.terminal_events() == ["run_cancelled"]
    assert h.provider.remaining == 1


async def test_can_06_repeated_cancel_during_cleanup_publishes_one_run_cancelled(
    autojump_clock: MockClock,
) -> None:
    """CAN-06: cancel() called again and again while cleanup commits are slow
    publishes exactly one run_cancelled (and settles once)."""
    h = Harness(
        [call("hang")],
        Fault("delay", kind="cancel", delay=1.0),
        Fault("delay", kind="cleanup_settled", delay=1.0),
    )
    async with h.open() as c:
        await c.prompt("hi")
        await trio.sleep(1)
        await c.cancel()
        for _ in range(5):
            await trio.sleep(0.3)
            if c.status().phase == "terminal":
                break
            await c.cancel()
        await c.wait_settled()
    assert h.terminal_events() == ["run_cancelled"]
    assert h.store.acknowledged_kinds().count("cleanup_settled") == 1
    assert h.store.acknowledged_kinds().count("cancel") == 1
    assert (await h.stored()).state == "unknown_outcome"


# -- CAN-02 ----------------------------------------------------------------------------


async def test_can_02_cancel_after_terminal_raises(autojump_clock: MockClock) -> None:
    """CAN-02: cancel() in phase terminal raises resource_conflict "run is not active"."""
    h = Harness([S.text("done")])
    async with h.open() as c:
        await c.prompt("hi")
        await c.wait_settled()
        with pytest.raises(Error) as info:
            await c.cancel()
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert info.value.message == "run is not active"


async def test_can_02_cancel_after_storage_failed_raises(autojump_clock: MockClock) -> None:
    """CAN-02: cancel() in phase storage_failed raises resource_conflict."""
    h = Harness([S.text("done")], Fault("fail", kind="provider_completed"))
    async with h.open() as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
        assert snapshot.phase == "storage_failed"
        with pytest.raises(Error) as info:
            await c.cancel()
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert info.value.message == "run is not active"


async def test_can_02_cancel_in_recovery_required_raises(autojump_clock: MockClock) -> None:
    """CAN-02: cancel() in phase recovery_required raises resource_conflict."""
    h = Harness([S.text("done")], Fault("fail", kind="provider_completed"))
    async with h.open() as c:
        await c.prompt("hi")
        await c.wait_settled()
    stored = await h.stored()
    h2 = Harness([S.text("never")])
    async with h2.open(run=stored) as c2:
        assert c2.status().phase == "recovery_required"
        with pytest.raises(Error) as info:
            await c2.cancel()
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert info.value.message == "run is not active"


# -- CAN-04, KER-09 ---------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["act", "look"])
async def test_can_04_cancel_racing_intent_commit_never_dispatches(
    autojump_clock: MockClock, tool: str
) -> None:
    """CAN-04: a cancel() that arrives while the tool_invoked commit is in
    flight: the commit completes, and the tool is never dispatched; nothing
    was dispatched, so the run ends cancelled."""
    h = Harness(
        [call("ok", tool=tool), S.text("never")], Fault("delay", kind="tool_invoked", delay=1.0)
    )
    async with h.open() as c, trio.open_nursery() as nursery:
        nursery.start_soon(cancel_when, h, "tool_invoked")
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert h.backend.calls == 0
    assert h.backend.violations == []
    assert "tool_invoked" in h.store.acknowledged_kinds()  # the intent did commit
    assert snapshot.run.state == "cancelled"
    assert h.terminal_events() == ["run_cancelled"]
    assert "tool_started" not in h.types()


@pytest.mark.parametrize("action", ["fail", "crash", "hang", "lose_ack", "lose_ack_raise"])
async def test_ker_09_no_dispatch_when_intent_commit_fails_or_times_out(
    autojump_clock: MockClock, action: str
) -> None:
    """KER-09: the gateway dispatches nothing when committing the intent fails
    (an error, a crash, a lost acknowledgement) or times out."""
    h = Harness([call("ok"), S.text("never")], Fault(action, kind="tool_invoked"))
    async with h.open(commit_timeout=2.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert h.backend.calls == 0
    assert snapshot.phase == "storage_failed"
    assert h.terminal_events() == []
    assert "tool_started" not in h.types()
    assert h.provider.remaining == 1


# -- CAN-05 ----------------------------------------------------------------------------


async def test_can_05_cancel_racing_finish_commit_keeps_completed(
    autojump_clock: MockClock,
) -> None:
    """CAN-05: a cancel() racing an in-flight (successful) finish commit
    publishes only run_completed; the run stays completed."""
    h = Harness([S.text("done")], Fault("delay", kind="finish", delay=1.0))
    async with h.open() as c, trio.open_nursery() as nursery:
        nursery.start_soon(cancel_when, h, "finish")
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.run.state == "completed"
    assert (await h.stored()).state == "completed"
    assert h.terminal_events() == ["run_completed"]
    assert all(kind != "cancel" for _n, kind, _at in h.store.attempts)


# -- CAN-07, CAN-20 -----------------------------------------------------------------------


async def test_can_07_cancel_with_unsettled_tool_ends_unknown_outcome(
    autojump_clock: MockClock,
) -> None:
    """CAN-07: a cancellation while a committed tool invocation is unsettled
    ends unknown_outcome, with the invocation as evidence."""
    h = Harness([call("hang")])
    async with h.open() as c:
        await c.prompt("hi")
        await trio.sleep(1)
        await c.cancel()
        snapshot = await c.wait_settled()
    record = await h.stored()
    assert record.state == "unknown_outcome"
    invocation = h.backend.operations[0].invocation_id
    assert invocation in record.active_tools
    assert record.intents[f"tool:{invocation}"]["status"] == "uncertain"
    assert snapshot.run == record


async def test_can_07_cancel_with_unsettled_provider_ends_unknown_outcome(
    autojump_clock: MockClock,
) -> None:
    """CAN-07: a cancellation while a committed provider attempt is unsettled
    ends unknown_outcome."""
    h = Harness([[Hang()]])
    async with h.open() as c:
        await c.prompt("hi")
        await trio.sleep(1)
        await c.cancel()
        await c.wait_settled()
    record = await h.stored()
    assert record.state == "unknown_outcome"
    assert record.outcome["evidence"][0]["effect"].startswith("provider:")


class _HangingStop:
    async def stop(self, outcome: Any, context: Any) -> Any:
        await trio.sleep_forever()


async def test_can_07_can_20_cancel_with_nothing_unsettled_ends_cancelled(
    autojump_clock: MockClock,
) -> None:
    """CAN-07 / CAN-20: a cancellation with neither a provider attempt nor a tool
    unsettled (here: in the stop hook, after the response committed) and, with
    no resource registry, confirmed cleanup ends cancelled."""
    h = Harness([S.text("done")])
    async with h.open(hooks=_HangingStop()) as c:
        await c.prompt("hi")
        await trio.sleep(1)
        await c.cancel()
        snapshot = await c.wait_settled()
    assert snapshot.run.state == "cancelled"
    assert snapshot.run.outcome["cleanup"] == "confirmed"
    assert snapshot.resource_cleanup.status == "confirmed"
    assert h.terminal_events() == ["run_cancelled"]
    cancelled = [e for e in h.drain() if e.type == "run_cancelled"]
    assert cancelled[0].payload["state"] == "cancelled"


# -- CAN-08, KER-10 -------------------------------------------------------------------------


async def test_can_08_deadline_with_confirmed_cleanup_ends_timed_out(
    autojump_clock: MockClock,
) -> None:
    """CAN-08: a run deadline (nothing unsettled: the stop hook is running)
    ends timed_out."""
    h = Harness([S.text("done")])
    async with h.open(hooks=_HangingStop(), run_timeout=10.0, effect_timeout=60.0) as c:
        start = trio.current_time()
        await c.prompt("hi")
        snapshot = await c.wait_settled()
        assert trio.current_time() == start + 10.0
    assert snapshot.run.state == "timed_out"
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"
    assert snapshot.resource_cleanup.status == "confirmed"
    cancelled = [e for e in h.drain() if e.type == "run_cancelled"]
    assert [e.payload["state"] for e in cancelled] == ["timed_out"]


async def test_can_08_deadline_interrupting_provider_ends_unknown_outcome(
    autojump_clock: MockClock,
) -> None:
    """CAN-08: a run deadline that interrupts an active provider attempt ends
    unknown_outcome."""
    h = Harness([[Hang()]])
    async with h.open(run_timeout=10.0, effect_timeout=60.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.run.state == "unknown_outcome"
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"
    assert h.terminal_events() == ["run_cancelled"]


@pytest.mark.parametrize("tool", ["act", "look"])
async def test_ker_10_tool_outliving_effect_timeout_is_uncertain(
    autojump_clock: MockClock, tool: str
) -> None:
    """KER-10: a tool that outlives effect_timeout ends with a timeout whose
    certainty is "uncertain", and the stored run is unknown_outcome, read_only
    included."""
    h = Harness([call("hang", tool=tool), S.text("never")])
    async with h.open(effect_timeout=3.0) as c:
        start = trio.current_time()
        await c.prompt("hi")
        snapshot = await c.wait_settled()
        assert trio.current_time() == start + 3.0
    error = snapshot.last_error
    assert error is not None
    assert error.error_class is ErrorClass.TIMEOUT
    assert error.details["certainty"] == "uncertain"
    record = await h.stored()
    assert record.state == "unknown_outcome"
    invocation = h.backend.operations[0].invocation_id
    assert record.intents[f"tool:{invocation}"]["status"] == "uncertain"
    assert h.backend.cancelled == 1
    assert h.provider.remaining == 1


async def test_ker_10_provider_outliving_effect_timeout_is_uncertain(
    autojump_clock: MockClock,
) -> None:
    """KER-10: a provider attempt that outlives effect_timeout is a timeout with
    certainty "uncertain" and the run ends unknown_outcome."""
    h = Harness([[Sleep(100.0)]])
    async with h.open(effect_timeout=3.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.last_error is not None
    assert snapshot.last_error.error_class is ErrorClass.TIMEOUT
    assert snapshot.last_error.details["certainty"] == "uncertain"
    assert (await h.stored()).state == "unknown_outcome"


@pytest.mark.parametrize("read_only", [True, False])
async def test_ker_10_a_tool_that_ignores_its_cut_and_returns_late_is_uncertain(
    autojump_clock: MockClock, read_only: bool
) -> None:
    """KER-10: a backend that ignores the cancellation of effect_timeout (a
    blocking call in a thread, say) and returns a result well after it has
    outlived effect_timeout all the same: its late result is never
    committed, the run ends unknown_outcome with the intent uncertain, and
    the provider is not asked again (the late result was taken, the run
    completed)."""

    class Late:  # returns with no checkpoint after its shield: the cut never lands
        async def execute(self, operation: Any) -> Any:
            with trio.CancelScope(shield=True):
                await trio.sleep(60)
            return ToolResult("late result")

    provider = S([S.tool_calls(("c1", "slow", {})), S.text("never")])
    tools = [make_tool("slow", Late(), read_only=read_only)]
    finished, _ = await run_with_host(provider, tools, effect_timeout=5.0)
    assert finished.record.state == "unknown_outcome"
    error = finished.snapshot.last_error
    assert error is not None
    assert error.error_class is ErrorClass.TIMEOUT
    assert error.details["certainty"] == "uncertain"
    assert finished.tool_messages() == []
    assert [v["status"] for k, v in finished.record.intents.items() if k.startswith("tool:")] == [
        "uncertain"
    ]
    assert len(provider.requests) == 1


async def test_ker_10_a_provider_answering_past_effect_timeout_is_uncertain(
    autojump_clock: MockClock,
) -> None:
    """KER-10: a provider stream that ignores its cut and sends its terminal
    event past effect_timeout has outlived it: the response is not taken
    (the run completed on it), the run ends unknown_outcome."""

    class Late:  # its terminal event follows its shield with no checkpoint
        def stream(self, request: Any, context: Any) -> Any:
            async def events() -> AsyncIterator[Any]:
                with trio.CancelScope(shield=True):
                    await trio.sleep(60)
                yield ResponseCompleted({"role": "assistant", "content": "late answer"})

            return events()

    finished, _ = await run_with_host(Late(), [], effect_timeout=5.0)
    assert finished.record.state == "unknown_outcome"
    error = finished.snapshot.last_error
    assert error is not None
    assert error.error_class is ErrorClass.TIMEOUT
    assert error.details["certainty"] == "uncertain"
    assert [m["role"] for m in finished.messages] == ["user"]


# -- CAN-09 ----------------------------------------------------------------------------


async def test_can_09_queued_follow_ups_suspended_after_cancel(autojump_clock: MockClock) -> None:
    """CAN-09: queued follow-ups stay in the stored conversation state after
    cancellation, with queue_status "suspended"."""
    h = Harness([[Hang()]])
    async with h.open() as c:
        await c.prompt("hi")
        await c.follow_up("later")
        await c.prompt("and this")  # a prompt while a turn runs is a follow-up
        await c.cancel()
        snapshot = await c.wait_settled()
    state = (await h.stored()).context["conversation"]
    assert [m["content"] for m in state["follow_up"]] == ["later", "and this"]
    assert state["queue_status"] == "suspended"
    assert snapshot.queue_status == "suspended"
    assert [m["content"] for m in snapshot.follow_up] == ["later", "and this"]


async def test_can_09_cancel_during_the_admission_commit_suspends_the_queue(
    autojump_clock: MockClock,
) -> None:
    """CAN-09: ``cancel()`` accepted while ``prompt()``'s admission commit is
    in flight (every commit 0.2 s, the cancel at 0.1 s) settles from the
    record the admission committed: the run is cancelled and its queue
    ``"suspended"``, stored and reported, as for every other cancelled run."""
    h = Harness([[Hang()]], Fault("delay", nth=1, delay=0.2, times=1_000))
    async with h.open() as c, trio.open_nursery() as nursery:

        async def prompt() -> None:
            with pytest.raises(Error):
                await c.prompt("hi")

        nursery.start_soon(prompt)
        await trio.sleep(0.1)
        assert h.store.attempts[0][1] == "admit"
        assert not h.store.acknowledged
        await c.cancel()
        snapshot = await c.wait_settled()
    state = (await h.stored()).context["conversation"]
    assert snapshot.run.state == "cancelled"
    assert state["queue_status"] == "suspended"
    assert snapshot.queue_status == "suspended"


# -- CAN-10 ----------------------------------------------------------------------------


def _after_turn_recorded(kind: str, record: RunRecord) -> bool:
    state = record.context.get("conversation")
    return kind == "conversation_updated" and state is not None and state["last_turn"] is not None


async def test_can_10_deadline_just_before_finish_commit_settles_as_deadline(
    autojump_clock: MockClock,
) -> None:
    """CAN-10: the turn's checkpoint is slow, so the run deadline expires just
    before the finish commit: the run settles as a deadline (timed_out), never
    storage_failed."""
    h = Harness([S.text("done")], Fault("delay", when=_after_turn_recorded, delay=4.0))
    async with h.open(run_timeout=3.0, commit_timeout=5.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "timed_out"
    assert "storage_failed" not in h.types()
    assert h.terminal_events() == ["run_cancelled"]


async def test_can_10_deadline_just_before_provider_completion_commit(
    autojump_clock: MockClock,
) -> None:
    """CAN-10: the deadline expires while the provider_started commit is in
    flight, just before the completion commit: deadline settlement."""
    h = Harness([S.text("done")], Fault("delay", kind="provider_started", delay=4.0))
    async with h.open(run_timeout=3.0, commit_timeout=5.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.phase == "terminal"
    assert snapshot.run.state in ("timed_out", "unknown_outcome")
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"
    assert "storage_failed" not in h.types()


async def test_can_10_deadline_just_before_tool_result_commit(autojump_clock: MockClock) -> None:
    """CAN-10: the deadline expires while the tool_invoked commit is in flight;
    the run settles as a deadline, not storage_failed, and the tool is never
    dispatched after the deadline."""
    h = Harness([call("ok"), S.text("never")], Fault("delay", kind="tool_invoked", delay=4.0))
    async with h.open(run_timeout=3.0, commit_timeout=5.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.phase == "terminal"
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"
    assert h.backend.calls == 0
    assert snapshot.run.state == "timed_out"
    assert "storage_failed" not in h.types()


# -- CAN-11, CAN-12, CAN-17 ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["provider_started", "provider_completed", "tool_completed"])
async def test_can_11_commit_timeout_moves_to_storage_failed(
    autojump_clock: MockClock, kind: str
) -> None:
    """CAN-11: a commit not acknowledged within commit_timeout moves the
    conversation to storage_failed and emits storage_failed with
    recovery_required True."""
    h = Harness([call("ok"), S.text("done")], Fault("hang", kind=kind))
    async with h.open(commit_timeout=2.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert snapshot.phase == "storage_failed"
    failed = [e for e in h.drain() if e.type == "storage_failed"]
    assert len(failed) == 1
    assert failed[0].payload["recovery_required"] is True
    assert failed[0].payload["error"]["class"] == "storage_failed"
    assert h.terminal_events() == []
    assert snapshot.last_error is not None
    assert snapshot.last_error.error_class is ErrorClass.STORAGE_FAILED


async def test_can_12_after_storage_failed_no_effect_and_input_refused(
    autojump_clock: MockClock,
) -> None:
    """CAN-12: after storage_failed no provider or tool effect starts, and
    prompt, steer and follow_up raise resource_conflict."""
    h = Harness([call("ok"), call("ok"), S.text("done")], Fault("fail", kind="tool_completed"))
    async with h.open() as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
        assert snapshot.phase == "storage_failed"
        requests, calls = len(h.provider.requests), h.backend.calls
        for method in (c.prompt, c.steer, c.follow_up):
            with pytest.raises(Error) as info:
                await method("more")
            assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        await trio.sleep(100)
        assert (len(h.provider.requests), h.backend.calls) == (requests, calls) == (1, 1)
    assert "tool_completed" in h.store.carried[-1]  # nothing was attempted after the failure


async def test_can_17_every_waiting_caller_gets_storage_failed(autojump_clock: MockClock) -> None:
    """CAN-17: on a storage failure every waiting caller (prompt, steer,
    follow_up) gets storage_failed, no terminal state is committed and the
    store still holds the last acknowledged record."""
    h = Harness([[Hang()]], Fault("hang", kind="conversation_updated", occurrence=2))
    errors: dict[str, Error] = {}

    async def attempt(name: str, method: Any) -> None:
        try:
            await method("queued " + name)
        except Error as error:
            errors[name] = error

    async with h.open(commit_timeout=2.0) as c:
        await c.prompt("hi")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attempt, "steer", c.steer)  # its commit hangs
            await trio.sleep(0)
            nursery.start_soon(attempt, "follow_up", c.follow_up)  # waits behind it
            nursery.start_soon(attempt, "prompt", c.prompt)
        snapshot = await c.wait_settled()
    assert sorted(errors) == ["follow_up", "prompt", "steer"]
    assert {e.error_class for e in errors.values()} == {ErrorClass.STORAGE_FAILED}
    assert snapshot.phase == "storage_failed"
    stored = await h.stored()
    assert stored == h.store.last_acknowledged()
    assert stored.state not in TERMINAL_STATES
    assert h.terminal_events() == []


async def test_can_17_prompt_waiting_on_admission_gets_storage_failed(
    autojump_clock: MockClock,
) -> None:
    """CAN-17 (and CONV-08): the admission commit hangs: prompt raises
    storage_failed, the provider is never called, nothing terminal is stored."""
    h = Harness([S.text("never")], Fault("hang", kind="admit"))
    async with h.open(commit_timeout=2.0) as c:
        with pytest.raises(Error) as info:
            await c.prompt("hi")
        assert info.value.error_class is ErrorClass.STORAGE_FAILED
        assert c.status().phase == "storage_failed"
    assert h.provider.requests == []
    stored = await h.stored()
    assert stored.revision == 0
    assert stored.state == "queued"


# -- CAN-13 -----------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["lose_ack", "lose_ack_raise"])
async def test_can_13_lost_ack_of_uncertain_settlement(
    autojump_clock: MockClock, action: str
) -> None:
    """CAN-13: the acknowledgement of the uncertain settlement commit is lost:
    the stored run is unknown_outcome with its active tools, and the
    conversation is in storage_failed."""
    h = Harness([call("hang")], Fault(action, kind="cleanup_settled"))
    async with h.open(commit_timeout=2.0) as c:
        await c.prompt("hi")
        await trio.sleep(1)
        await c.cancel()
        snapshot = await c.wait_settled()
    assert snapshot.phase == "storage_failed"
    stored = await h.stored()
    assert stored.state == "unknown_outcome"
    invocation = h.backend.operations[0].invocation_id
    assert invocation in stored.active_tools
    assert h.terminal_events() == []
    assert "storage_failed" in h.types()


# -- CAN-14, CAN-15, CAN-16 ---------------------------------------------------------------


async def _interrupted_record() -> tuple[RunRecord, ProbeBackend]:
    """A run left non-terminal: the tool ran but its result commit failed."""
    h = Harness([call("ok"), S.text("never")], Fault("fail", kind="tool_completed"))
    async with h.open() as c:
        await c.prompt("hi")
        await c.wait_settled()
    return await h.stored(), h.backend


async def test_can_14_stored_non_terminal_run_is_recovery_required(
    autojump_clock: MockClock,
) -> None:
    """CAN-14: opening with a stored non-terminal run reports recovery_required
    and status().run equal to that record, refuses prompt with
    resource_conflict, and calls neither provider nor backend."""
    stored, _ = await _interrupted_record()
    assert stored.state == "running"
    h = Harness([S.text("never"), call("ok")])
    async with h.open(run=stored) as c:
        assert c.status().phase == "recovery_required"
        assert c.status().run == stored
        with pytest.raises(Error) as info:
            await c.prompt("again")
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        snapshot = await c.wait_settled()  # returns at once
        assert snapshot.phase == "recovery_required"
        await trio.sleep(10)
    assert h.provider.requests == []
    assert h.backend.calls == 0
    assert h.store.attempts == []


async def test_can_15_stored_terminal_run_is_terminal(autojump_clock: MockClock) -> None:
    """CAN-15: opening with a stored terminal run reports phase terminal and
    never calls the provider."""
    h1 = Harness([S.text("done")])
    async with h1.open() as c:
        await c.prompt("hi")
        await c.wait_settled()
    stored = await h1.stored()
    assert stored.state == "completed"
    h = Harness([S.text("never")])
    async with h.open(run=stored) as c:
        assert c.status().phase == "terminal"
        assert c.status().run == stored
        with pytest.raises(Error):
            await c.prompt("again")
        await trio.sleep(10)
    assert h.provider.requests == []
    assert h.store.attempts == []


async def test_can_16_restored_run_keeps_budget_and_active_tools(autojump_clock: MockClock) -> None:
    """CAN-16: a restored run keeps the budget it had consumed and the
    active_tools outstanding before the crash."""
    stored, backend = await _interrupted_record()
    invocation = backend.operations[0].invocation_id
    assert invocation in stored.active_tools
    h = Harness([S.text("never")])
    async with h.open(run=stored) as c:
        run = c.status().run
        assert run.budget == stored.budget
        assert run.budget.used == 2  # one provider attempt, one tool
        assert dict(run.active_tools) == dict(stored.active_tools)
    assert h.backend.calls == 0


# -- CAN-18 ----------------------------------------------------------------------------


async def test_can_18_leaving_the_block_cancels_and_settles(autojump_clock: MockClock) -> None:
    """CAN-18: leaving the block while the run is active cancels it as cancel()
    would, settles within cleanup_timeout + commit_timeout and leaves no
    conversation-owned task running."""
    h = Harness([call("hang")])
    async with h.open(cleanup_timeout=4.0, commit_timeout=2.0) as c:
        await c.prompt("hi")
        await trio.sleep(1)
        left = trio.current_time()
    assert trio.current_time() - left <= 4.0 + 2.0
    assert h.terminal_events() == ["run_cancelled"]
    assert (await h.stored()).state == "unknown_outcome"
    assert h.backend.running == 0
    assert h.backend.cancelled == 1
    assert task_tree_size() == 0


async def test_can_18_exit_bounded_when_cleanup_commits_hang(autojump_clock: MockClock) -> None:
    """CAN-18: even when every cleanup commit hangs, leaving the block takes at
    most cleanup_timeout + commit_timeout (the cancel commit times out:
    storage_failed), and nothing keeps running."""
    h = Harness([call("hang")], Fault("hang", kind="cancel"))
    async with h.open(cleanup_timeout=4.0, commit_timeout=2.0) as c:
        await c.prompt("hi")
        await trio.sleep(1)
        left = trio.current_time()
    assert trio.current_time() - left <= 4.0 + 2.0
    assert h.terminal_events() == []
    assert task_tree_size() == 0


async def test_can_18_outer_cancellation_propagates_unchanged_after_settlement(
    autojump_clock: MockClock,
) -> None:
    """CAN-18: an outer cancellation (trio.Cancelled) propagates unchanged out
    of the block once the run is settled."""
    h = Harness([[Hang()]])
    with trio.move_on_after(5) as scope:
        async with h.open() as c:
            await c.prompt("hi")
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert (await h.stored()).state in TERMINAL_STATES
    assert h.terminal_events() == ["run_cancelled"]
    assert task_tree_size() == 0


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, ValueError])
async def test_can_18_body_exception_propagates_after_settlement(
    autojump_clock: MockClock,
    exc_type: type[BaseException],
) -> None:
    """CAN-18: an exception leaving the block (KeyboardInterrupt included)
    propagates unchanged, after the run was settled."""
    h = Harness([[Hang()]])

    async def body() -> None:
        async with h.open() as c:
            await c.prompt("hi")
            await trio.sleep(1)
            raise exc_type("boom")

    with pytest.raises(exc_type):
        await body()
    assert (await h.stored()).state in TERMINAL_STATES
    assert h.terminal_events() == ["run_cancelled"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: ExceptionGroup("host", [ValueError("a"), KeyError("b")]),
        lambda: ExceptionGroup("host", [Error(ErrorClass.VALIDATION, "the host's own")]),
        lambda: BaseExceptionGroup("host", [KeyboardInterrupt()]),
    ],
    ids=["group", "group-of-error", "base-group"],
)
async def test_can_18_a_group_raised_by_the_body_propagates_unchanged(
    autojump_clock: MockClock, make: Any
) -> None:
    """CAN-18: an exception group the host raises in the block (its own
    nursery's, or one it built) leaves the block as that very group, not
    wrapped nor replaced by an ``Error``, so the host's ``except*`` still
    matches; the run is settled first."""
    h = Harness([[Hang()]])
    raised = make()

    async def body() -> None:
        async with h.open() as c:
            await c.prompt("hi")
            await trio.sleep(1)
            raise raised

    with pytest.raises(BaseExceptionGroup) as info:
        await body()
    assert info.value is raised
    assert (await h.stored()).state in TERMINAL_STATES
    assert h.terminal_events() == ["run_cancelled"]


async def test_can_18_settlement_waits_out_input_holding_the_coordinator(
    autojump_clock: MockClock,
) -> None:
    """CAN-18: cancel() arrives while a host's slow steering commit holds the
    commit coordinator for longer than cleanup_timeout, though within its
    own commit_timeout.  The store is healthy, so the settlement waits for
    that commit and then settles the run: one ``run_cancelled``, the
    dispatched and cancelled tool as evidence (``unknown_outcome``), the
    acknowledged steering kept with the queues suspended, all within
    cleanup_timeout + commit_timeout of the cancel."""
    h = Harness([call("hang")])
    async with (
        trio.open_nursery() as nursery,
        h.open(cleanup_timeout=2.0, commit_timeout=10.0) as c,
    ):
        await c.prompt("hi")
        while h.backend.running == 0:
            await trio.sleep(0.1)
        h.store.add(Fault("delay", nth=len(h.store.attempts) + 1, delay=6.0))
        nursery.start_soon(c.steer, "also this")
        await trio.sleep(0.5)
        cancelled_at = trio.current_time()
        await c.cancel()
        snapshot = await c.wait_settled()
        assert trio.current_time() - cancelled_at == pytest.approx(5.5)
    assert trio.current_time() - cancelled_at <= 2.0 + 10.0
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "unknown_outcome"
    assert len(h.terminal_events()) == 1
    assert h.backend.cancelled == 1
    stored = await h.stored()
    assert stored.state == "unknown_outcome"
    conversation = thaw(stored.conversation)
    assert [s["content"] for s in conversation["steering"]] == ["also this"]
    assert conversation["queue_status"] == "suspended"
    assert task_tree_size() == 0


# -- CAN-19 ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["provider_started", "tool_invoked", "tool_completed"])
async def test_can_19_newer_incarnation_stops_without_further_commits(
    autojump_clock: MockClock, kind: str
) -> None:
    """CAN-19: a commit refused with resource_conflict because the stored
    incarnation is newer stops the conversation: no further commit, no effect,
    phase recovery_required, input refused, last_error holds the conflict."""
    h = Harness([call("ok"), call("ok"), S.text("done")], Fault("conflict", kind=kind))
    async with h.open() as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
        assert snapshot.phase == "recovery_required"
        assert snapshot.last_error is not None
        assert snapshot.last_error.error_class is ErrorClass.RESOURCE_CONFLICT
        for method in (c.prompt, c.steer, c.follow_up):
            with pytest.raises(Error) as info:
                await method("more")
            assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        with pytest.raises(Error):
            await c.cancel()
        calls, requests = h.backend.calls, len(h.provider.requests)
        await trio.sleep(50)
        assert (h.backend.calls, len(h.provider.requests)) == (calls, requests)
    assert kind in h.store.carried[-1]  # nothing after the refused commit
    assert (await h.stored()).incarnation == 2
    assert h.terminal_events() == []
    dispatches_expected = {"provider_started": 0, "tool_invoked": 0, "tool_completed": 1}
    assert h.backend.calls == dispatches_expected[kind]


# -- CAN-20 ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("responses", "cancel_after", "options", "state"),
    [
        ([S.text("done")], None, {}, "completed"),
        ([S.failure(Error(ErrorClass.EXECUTION_FAILURE, "nope"))], None, {}, "failed"),
        ([call("ok"), S.text("done")], None, {}, "completed"),
        ([[Hang()]], 1.0, {}, "unknown_outcome"),
        ([[Hang()]], None, {"run_timeout": 5.0}, "unknown_outcome"),
        ([call("error", tool="act")], None, {}, "unknown_outcome"),
    ],
)
async def test_can_20_resource_cleanup_confirmed_on_every_terminal_path(
    autojump_clock: MockClock,
    responses: list[Any],
    cancel_after: float | None,
    options: dict[str, Any],
    state: str,
) -> None:
    """CAN-20: with no resource registry attached, status().resource_cleanup
    is "confirmed" after every terminal path."""
    h = Harness(responses)
    async with h.open(**options) as c:
        await c.prompt("hi")
        if cancel_after is not None:
            await trio.sleep(cancel_after)
            await c.cancel()
        snapshot = await c.wait_settled()
    assert snapshot.run.state == state
    assert snapshot.resource_cleanup.status == "confirmed"
    assert c.status().resource_cleanup.status == "confirmed"
    assert len(h.terminal_events()) == 1


class SlowClose:
    """A provider that answers "done" and, when its stream is closed after
    that terminal event, awaits ``close_seconds`` (``inf``: never finishes)."""

    def __init__(self, close_seconds: float) -> None:
        self.close_seconds = close_seconds
        self.closing_started: float | None = None
        self.closed_fully = False

    async def stream(self, request: Any, context: Any) -> AsyncIterator[Any]:
        from trio_backplane.runtime import ResponseCompleted

        try:
            yield ResponseCompleted({"role": "assistant", "content": "done"})
        finally:
            self.closing_started = trio.current_time()
            await trio.sleep(self.close_seconds)
            self.closed_fully = True

    def open(self, **options: Any) -> Any:
        """A conversation over this provider, with no tools."""
        registry = ToolRegistry([])
        return open_conversation(
            RUN_ID,
            store=FaultyStore(None),
            provider=self,
            registry=registry,
            authority=granted(registry),
            **options,
        )


async def test_can_03_stream_close_is_shielded_from_the_cancellation(
    autojump_clock: MockClock,
) -> None:
    """CAN-03: cancel() arriving while a stream is being closed (after its
    terminal event) does not cut the close short: it runs to its end, then
    the run settles."""
    provider = SlowClose(close_seconds=2.0)
    async with provider.open() as c:
        await c.prompt("hi")
        while provider.closing_started is None:
            await trio.sleep(0.1)
        await c.cancel()
        snapshot = await c.wait_settled()
    assert provider.closed_fully
    assert provider.closing_started + 2.0 <= trio.current_time()
    # the attempt's completion was never committed: unsettled (CAN-07)
    assert snapshot.run.state == "unknown_outcome"


async def test_can_03_stream_close_is_bounded_by_the_effect_deadline(
    autojump_clock: MockClock,
) -> None:
    """A stream whose close never finishes cannot hold the run forever: the
    close is bounded by the attempt's effect deadline.  The terminal event
    had ended the response, so the cut close leaves it as it arrived and the
    run completes (PRV-03)."""
    provider = SlowClose(close_seconds=math.inf)
    async with provider.open(effect_timeout=30.0) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
    assert provider.closing_started is not None
    assert not provider.closed_fully
    assert trio.current_time() == pytest.approx(30.0)
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "completed"


async def test_can_18_a_hanging_stream_close_cannot_hold_a_cancelled_run(
    autojump_clock: MockClock,
) -> None:
    """CAN-18: cancel() while a provider stream's close hangs (effect_timeout
    an hour): the close is cut once the cleanup budget is spent and the run
    settles within cleanup_timeout + commit_timeout of the cancel."""
    provider = SlowClose(close_seconds=math.inf)
    async with provider.open(effect_timeout=3600.0, cleanup_timeout=2.0, commit_timeout=3.0) as c:
        await c.prompt("hi")
        while provider.closing_started is None:
            await trio.sleep(0.5)
        await trio.sleep(1.0)
        cancelled_at = trio.current_time()
        await c.cancel()
        snapshot = await c.wait_settled()
        settled_at = trio.current_time()
    assert not provider.closed_fully
    assert settled_at - cancelled_at <= 2.0 + 3.0
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "unknown_outcome"  # the attempt was interrupted (CAN-07)


async def test_can_08_a_hanging_stream_close_cannot_outlast_the_run_deadline(
    autojump_clock: MockClock,
) -> None:
    """CAN-08/CAN-18: a stream whose close hangs past the run deadline is cut
    once the cleanup budget after the deadline is spent, and the run settles
    within run_timeout + cleanup_timeout + commit_timeout."""
    provider = SlowClose(close_seconds=math.inf)
    async with provider.open(
        run_timeout=5.0, effect_timeout=3600.0, cleanup_timeout=2.0, commit_timeout=3.0
    ) as c:
        await c.prompt("hi")
        snapshot = await c.wait_settled()
        settled_at = trio.current_time()
    assert provider.closing_started is not None
    assert not provider.closed_fully
    assert settled_at <= 5.0 + 2.0 + 3.0
    assert snapshot.phase == "terminal"
    assert snapshot.run.stop_reason == "deadline_exceeded"


def _one_act_call(backend: Any, store: Any, **options: Any) -> Any:
    """``open_conversation`` whose provider calls the tool ``act`` (served by
    ``backend``) once, then answers."""
    from trio_backplane.tools import ToolDescriptor

    registry = ToolRegistry(
        [ToolDescriptor(name="act", schema={"type": "object"}, backend=backend)]
    )
    return open_conversation(
        RUN_ID,
        store=store,
        provider=ScriptedProvider([S.tool_calls(("c1", "act", {})), S.text("never")]),
        registry=registry,
        authority=granted(registry),
        **options,
    )


async def test_can_10_deadline_passing_as_the_tool_returns(autojump_clock: MockClock) -> None:
    """CAN-10: the run deadline passes at the very instant the tool returns
    (the clock jumps inside the backend, no checkpoint between), so the
    kernel refuses the result commit as too late.  The run settles as a
    deadline, never storage_failed; the dispatched tool's result was never
    committed, so its outcome stays unknown (rule 4) with its intent kept."""
    from trio_backplane.tools import ToolResult

    class LateBackend:
        calls = 0

        async def execute(self, operation: Any) -> ToolResult:
            LateBackend.calls += 1
            autojump_clock.jump(10.0)
            return ToolResult("late")

    store = FaultyStore(None)
    async with _one_act_call(LateBackend(), store, run_timeout=3.0) as conversation:
        channel = conversation.subscribe(buffer=1000)
        await conversation.prompt("hi")
        snapshot = await conversation.wait_settled()
        events = drained(channel)
    assert LateBackend.calls == 1
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "unknown_outcome"
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"
    [invocation] = snapshot.run.active_tools
    assert snapshot.run.intents[f"tool:{invocation}"]["status"] != "consumed"
    assert invocation not in snapshot.run.tool_results
    assert snapshot.run.outcome["evidence"] == [
        {"effect": f"tool:{invocation}", "reason": "result not committed before the deadline"}
    ]
    types = [e.type for e in events]
    assert "storage_failed" not in types
    assert [t for t in types if t in TERMINAL_EVENTS] == ["run_cancelled"]


class _Stubborn:
    """A tool backend that ignores cancellation for ``seconds`` (a shielded
    scope, like a blocking call in a thread that cannot be interrupted)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = trio.Event()
        self.returned_at: float | None = None

    async def execute(self, operation: Any) -> Any:
        from trio_backplane.tools import ToolResult

        self.started.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(self.seconds)
        self.returned_at = trio.current_time()
        return ToolResult("late")


@pytest.mark.parametrize("stop", ["cancel", "deadline"])
async def test_can_18_a_worker_ignoring_its_cancellation_does_not_hold_the_settlement(
    autojump_clock: MockClock, stop: str
) -> None:
    """CAN-18/CAN-03: a tool that ignores its cancellation (20 s, shielded)
    does not hold the settlement back: once cleanup_timeout after the stop
    (a cancel, or the run deadline) is spent, the run settles without it:
    one ``run_cancelled``, ``unknown_outcome`` with the dispatched tool as
    evidence, within cleanup_timeout + commit_timeout.  What the tool
    returns afterwards is never committed, and the block exits once it
    returns (Trio cannot stop it) with no error."""
    backend = _Stubborn(20.0)
    store = FaultyStore(None)
    run_timeout = 3.0 if stop == "deadline" else 3600.0
    async with _one_act_call(
        backend,
        store,
        run_timeout=run_timeout,
        effect_timeout=3600.0,
        cleanup_timeout=1.0,
        commit_timeout=1.0,
    ) as conversation:
        channel = conversation.subscribe(buffer=1000)
        await conversation.prompt("hi")
        await backend.started.wait()
        if stop == "cancel":
            await trio.sleep(1.0)
            await conversation.cancel()
        stopped_at = trio.current_time() if stop == "cancel" else run_timeout
        snapshot = await conversation.wait_settled()
        settled_at = trio.current_time()
    assert settled_at - stopped_at <= 1.0 + 1.0
    assert backend.returned_at is not None  # the block waited for it
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "unknown_outcome"
    [invocation] = snapshot.run.active_tools
    assert snapshot.run.outcome["evidence"][0]["effect"] == f"tool:{invocation}"
    stored = await store.load(RUN_ID)
    assert stored == snapshot.run  # nothing committed after the settlement
    assert invocation not in stored.tool_results
    types = [e.type for e in drained(channel)]
    assert [t for t in types if t in TERMINAL_EVENTS] == ["run_cancelled"]
    assert task_tree_size() == 0


def test_can_18_the_watchdog_counts_from_the_stored_run_deadline() -> None:
    """CAN-18: the deadline the watchdog keeps is the run's own (admission +
    run_timeout), whichever of the worker and the watchdog Trio runs first:
    with a prompt hook taking 2 s of a 3 s run, a tool ignoring its
    cancellation is cut loose at 3 + cleanup_timeout, never later (several
    runs cover both scheduling orders)."""

    class SlowHook:
        async def prompt(self, message: Any, context: Any) -> Any:
            await trio.sleep(2.0)
            return message

    async def one() -> tuple[float, float | None, str]:
        async with _one_act_call(
            _Stubborn(20.0),
            FaultyStore(None),
            hooks=SlowHook(),
            run_timeout=3.0,
            effect_timeout=3600.0,
            cleanup_timeout=1.0,
            commit_timeout=1.0,
            wall_clock=trio.current_time,  # stored instants read as MockClock time
        ) as conversation:
            await conversation.prompt("hi")
            snapshot = await conversation.wait_settled()
            return trio.current_time(), snapshot.run.deadline, snapshot.run.state

    for _ in range(12):
        settled_at, deadline, state = trio.run(one, clock=MockClock(autojump_threshold=0))
        assert (settled_at, deadline, state) == (4.0, 3.0, "unknown_outcome")


@pytest.mark.parametrize("call", ["interact", "nested_dispatch"])
async def test_can_18_a_backend_calling_into_a_settled_run_gets_a_classed_error(
    autojump_clock: MockClock, call: str
) -> None:
    """CAN-18/NEST-01: a backend that ignored its cancellation and calls back
    into the run after the settlement (an interaction, a nested tool) gets
    ``cancelled`` "the run is stopping", never an internal exception."""
    from trio_backplane.tools import ToolDescriptor, ToolResult

    seen: dict[str, Any] = {}

    class Late:
        def __init__(self) -> None:
            self.started = trio.Event()

        async def execute(self, operation: Any) -> Any:
            self.started.set()
            with trio.CancelScope(shield=True):
                await trio.sleep(20)
                try:
                    if call == "interact":
                        await operation.context.interact({"q": "still there?"})
                    else:
                        await operation.context.nested_dispatch("other", {})
                except BaseException as exc:
                    seen["raised"] = exc
            return ToolResult("late")

    backend = Late()
    registry = ToolRegistry(
        [
            ToolDescriptor(name="act", schema={"type": "object"}, backend=backend),
            ToolDescriptor(name="other", schema={"type": "object"}, backend=_Stubborn(0)),
        ]
    )
    async with open_conversation(
        RUN_ID,
        store=FaultyStore(None),
        provider=ScriptedProvider([S.tool_calls(("c1", "act", {})), S.text("never")]),
        registry=registry,
        authority=granted(registry),
        effect_timeout=3600.0,
        cleanup_timeout=1.0,
        commit_timeout=1.0,
    ) as conversation:
        await conversation.prompt("hi")
        await backend.started.wait()
        await conversation.cancel()
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"
    raised = seen["raised"]
    assert isinstance(raised, Error), raised
    assert raised.error_class is ErrorClass.CANCELLED


async def test_can_10_the_deadline_passing_in_synchronous_code_is_a_deadline_stop(
    autojump_clock: MockClock,
) -> None:
    """CAN-10: the run deadline passes with no checkpoint between the
    provider's terminal event and its commit (time passing in synchronous
    code): the kernel refuses the commit as too late, and the run settles on
    its deadline (the interrupted attempt as evidence), never an exception
    out of the block."""
    from trio_backplane.runtime import ResponseCompleted

    class Jumping:
        def stream(self, request: Any, context: Any) -> Any:
            return self._events()

        async def _events(self) -> Any:
            autojump_clock.jump(10.0)
            yield ResponseCompleted(message={"role": "assistant", "content": "done"})

    async with open_conversation(
        RUN_ID, store=FaultyStore(None), provider=Jumping(), run_timeout=3.0
    ) as conversation:
        await conversation.prompt("hi")
        snapshot = await conversation.wait_settled()
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "unknown_outcome"
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"


async def test_can_11_a_storage_failure_stays_when_the_worker_unwinds_past_the_deadline(
    autojump_clock: MockClock,
) -> None:
    """CAN-11, CAN-17, CAN-02: a host commit fails (storage_failed) while a
    tool finishes work it cannot interrupt; the worker unwinds after the run
    deadline.  The run stays storage_failed (never moved back to
    cancelling), and cancel() is refused as on any inactive run."""
    store = FaultyStore()
    async with _one_act_call(
        _Stubborn(12.0),  # returns at 12, past the deadline (10)
        store,
        run_timeout=10.0,
        effect_timeout=30.0,
    ) as conversation:
        await conversation.prompt("hi")
        await trio.sleep(8.0)
        store.add(Fault("fail", nth=len(store.attempts) + 1))
        with pytest.raises(Error) as steered:
            await conversation.steer("more")
        assert steered.value.error_class is ErrorClass.STORAGE_FAILED
        await conversation.wait_settled()
        await trio.sleep(20.0)  # the worker unwinds at 12, past the deadline
        status = conversation.status()
        assert status.phase == "storage_failed"
        assert status.last_error is not None
        assert status.last_error.error_class is ErrorClass.STORAGE_FAILED
        with pytest.raises(Error) as cancelled:
            await conversation.cancel()
        assert cancelled.value.error_class is ErrorClass.RESOURCE_CONFLICT


async def test_can_18_a_host_commit_in_flight_does_not_eat_the_settlement_window(
    autojump_clock: MockClock,
) -> None:
    """CAN-18, CAN-11: a tool ignores its cancellation past the run deadline;
    when the watchdog's cleanup budget ends, a host commit to a healthy (1 s)
    store is in flight.  The watchdog waits for that commit, not for a whole
    commit_timeout, and the settlement commits in what is left of its window:
    unknown_outcome, never storage_failed."""
    store = FaultyStore()
    async with _one_act_call(
        _Stubborn(100.0),
        store,
        run_timeout=10.0,
        effect_timeout=60.0,
        cleanup_timeout=5.0,
        commit_timeout=5.0,
    ) as conversation:
        await conversation.prompt("hi")
        await trio.sleep(14.5)
        store.add(Fault("delay", nth=len(store.attempts) + 1, delay=1.0))
        await conversation.steer("more")  # in flight from 14.5 to 15.5
        snapshot = await conversation.wait_settled()
        settled_at = trio.current_time()
    assert snapshot.phase == "terminal", snapshot.last_error
    assert snapshot.run.state == "unknown_outcome"
    assert snapshot.run.outcome["stop_reason"] == "deadline_exceeded"
    assert settled_at <= 10.0 + 5.0 + 5.0


async def test_can_10_a_deadline_noticed_after_the_whole_window_still_settles(
    autojump_clock: MockClock,
) -> None:
    """CAN-10, CAN-11: a backend blocks the event loop past the run deadline
    plus cleanup_timeout plus commit_timeout (the clock jumps in synchronous
    code); the settlement, started after its window, still gives the store
    its commit_timeout: the run ends unknown_outcome on a healthy store, as
    on one that never waits, never storage_failed."""
    from trio_backplane.tools import ToolResult

    class Blocking:
        async def execute(self, operation: Any) -> ToolResult:
            autojump_clock.jump(20.0)
            return ToolResult("late")

    store = FaultyStore()
    async with _one_act_call(
        Blocking(),
        store,
        run_timeout=3.0,
    ) as conversation:
        await conversation.prompt("hi")
        snapshot = await conversation.wait_settled()
    stored = await store.load(RUN_ID)
    assert snapshot.phase == "terminal", snapshot.last_error
    assert snapshot.run.state == "unknown_outcome"
    assert stored is not None
    assert stored.state == "unknown_outcome"
