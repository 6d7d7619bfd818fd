"""Invariants of the Conversation engine under random scripts (issue 5).

Hypothesis draws a whole scenario: provider responses (text, tool calls to a
read-only and a mutating tool and an unknown one, with outcomes that return,
raise ``Error``, raise other exceptions, hang or sleep; failures, hangs,
mid-stream raises, streams without a terminal event), input arriving
mid-run, a cancel time, run/effect/commit/cleanup timeouts, a work quota and
store faults from ``FaultyStore``.  Each scenario runs under
``trio.run(..., clock=MockClock(autojump_threshold=0))``; the instrumented
``ProbeBackend`` and ``FaultyStore`` check during the run, and the test after
it, that:

* no tool is dispatched without an acknowledged ``tool_invoked`` intent, no
  intent is dispatched twice, no tool is dispatched after ``cancel()``
  returned (KER-09, CAN-04, NEST-07) or at or after the run deadline (CAN-10);
* at most one commit is in flight, and nothing is attempted after a commit
  that failed (CAN-11, CAN-12, CAN-19);
* exactly one terminal event unless the phase is ``storage_failed`` or
  ``recovery_required`` (then none) (CAN-06, EVT-17, EVT-18);
* the terminal state agrees with the unsettled work: ``unknown_outcome`` iff
  some dispatched effect was not settled (CAN-07, CAN-08, CAN-20, rule 4);
* virtual time at exit is never past the run deadline plus
  ``cleanup_timeout`` plus ``commit_timeout`` (CAN-18);
* no task is left running after the context exits (CAN-18, rule 6).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from hypothesis import given, note
from hypothesis import strategies as st
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import TERMINAL_STATES
from trio_backplane.runtime import Event, open_conversation
from trio_backplane.testing import Hang, Raise, ScriptedProvider, Sleep
from trio_backplane.tools import ToolRegistry

from .support import (
    RUN_ID,
    TERMINAL_EVENTS,
    Fault,
    FaultyStore,
    ProbeBackend,
    granted,
    probe_tools,
    task_tree_size,
)

S = ScriptedProvider

OUTCOMES = ("ok", "ok", "is_error", "error", "unknown", "crash", "hang", "sleep", "garbage")
TIMES = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 30.0)
KINDS = (
    "admit",
    "conversation_updated",
    "provider_started",
    "provider_completed",
    "tool_invoked",
    "tool_completed",
    "finish",
    "cancel",
    "deadline_exceeded",
    "cleanup_settled",
)
FAILING = frozenset({"fail", "crash", "hang", "lose_ack", "lose_ack_raise", "conflict"})


@st.composite
def tool_call(draw: st.DrawFn, index: int) -> tuple[str, str, Any]:
    tool = draw(st.sampled_from(("look", "act", "act", "nope")))
    outcome = draw(st.sampled_from((*OUTCOMES, "invalid")))
    arguments: dict[str, Any] = {"outcome": outcome}
    if outcome == "sleep":
        arguments["seconds"] = draw(st.sampled_from(TIMES))
    return f"call-{index}", tool, arguments


@st.composite
def response(draw: st.DrawFn, number: int) -> list[Any]:
    kind = draw(
        st.sampled_from(
            (
                *("text", "tools", "tools", "tools", "tools", "tools"),
                *("failure", "hang", "sleep", "raise", "open"),
            )
        )
    )
    if kind == "text":
        return S.text(f"answer {number}")
    if kind == "tools":
        count = draw(st.integers(1, 3))
        calls = [draw(tool_call(number * 10 + i)) for i in range(count)]
        return S.tool_calls(*calls, streamed=draw(st.booleans()))
    if kind == "failure":
        return S.failure(Error(ErrorClass.EXECUTION_FAILURE, "provider refused"))
    if kind == "hang":
        return [Hang()]
    if kind == "sleep":
        return [Sleep(draw(st.sampled_from(TIMES))), *S.text(f"slow answer {number}")]
    if kind == "raise":
        return [*S.text("partial")[:1], Raise(RuntimeError("stream broke"))]
    return S.text("no terminal event")[:1]  # a stream that ends without a terminal event


@st.composite
def fault(draw: st.DrawFn) -> Fault:
    action = draw(st.sampled_from((*sorted(FAILING), "delay", "delay")))
    delay = draw(st.sampled_from(TIMES)) if action == "delay" else 0.0
    if draw(st.booleans()):
        return Fault(action, nth=draw(st.integers(1, 20)), delay=delay)
    return Fault(
        action,
        kind=draw(st.sampled_from(KINDS)),
        occurrence=draw(st.integers(1, 3)),
        delay=delay,
    )


@attrs.frozen
class Scenario:
    responses: list[list[Any]]
    cancel_at: float | None
    inputs: list[tuple[float, str]]
    faults: list[Fault]
    work: int
    run_timeout: float
    effect_timeout: float
    commit_timeout: float
    cleanup_timeout: float
    stop_hook_sleep: float | None


class SleepingStop:
    """A stop hook that takes ``seconds``: time where nothing durable is
    unsettled, so a deadline or cancel there ends timed_out or cancelled."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def stop(self, outcome: Any, context: Any) -> str:
        await trio.sleep(self.seconds)
        return "stop"


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    count = draw(st.integers(1, 5))
    responses = [draw(response(n)) for n in range(count)]
    responses.append(S.text("final answer"))  # later calls past the script fail the turn
    return Scenario(
        responses=responses,
        cancel_at=draw(st.none() | st.sampled_from((0.0, *TIMES)) | st.floats(0, 60)),
        inputs=draw(
            st.lists(
                st.tuples(st.sampled_from((0.0, *TIMES)), st.sampled_from(("steer", "follow_up"))),
                max_size=2,
            )
        ),
        faults=draw(st.lists(fault(), max_size=2)),
        work=draw(st.sampled_from((1, 4, 100, 100, 100, 100))),
        run_timeout=draw(st.sampled_from((4.0, 20.0, 100.0))),
        effect_timeout=draw(st.sampled_from((2.0, 10.0, 30.0))),
        commit_timeout=draw(st.sampled_from((1.0, 2.0, 5.0))),
        cleanup_timeout=draw(st.sampled_from((1.0, 5.0))),
        stop_hook_sleep=draw(st.none() | st.sampled_from(TIMES)),
    )


@attrs.define
class Observed:
    events: list[Event] = attrs.Factory(list)
    phase: str = ""
    snapshot: Any = None
    opened_at: float = 0.0
    exited_at: float = 0.0
    cancel_returned_at: float | None = None
    tasks_left: int = -1


def _expect(error: Error, *classes: ErrorClass) -> None:
    """Input may be refused only with one of ``classes``."""
    if error.error_class not in classes:
        raise AssertionError(f"unexpected refusal: {error!r}") from error


async def _play(scenario: Scenario, store: FaultyStore, backend: ProbeBackend) -> Observed:
    observed = Observed()
    provider = ScriptedProvider(scenario.responses)
    registry = ToolRegistry(probe_tools(backend))
    observed.opened_at = trio.current_time()

    async def cancel_later(conversation: Any, at: float) -> None:
        await trio.sleep(at)
        try:
            await conversation.cancel()
        except Error as error:  # CAN-02: not active any more
            _expect(error, ErrorClass.RESOURCE_CONFLICT)
            return
        backend.cancel_returned = True
        observed.cancel_returned_at = trio.current_time()

    async def send_later(conversation: Any, at: float, method: str) -> None:
        await trio.sleep(at)
        try:
            await getattr(conversation, method)(f"{method} at {at}")
        except Error as error:
            _expect(error, ErrorClass.RESOURCE_CONFLICT, ErrorClass.STORAGE_FAILED)

    with trio.fail_after(100_000):  # a hang is a failure, never a stuck test run
        async with open_conversation(
            RUN_ID,
            store=store,
            provider=provider,
            registry=registry,
            authority=granted(registry),
            work=scenario.work,
            run_timeout=scenario.run_timeout,
            effect_timeout=scenario.effect_timeout,
            commit_timeout=scenario.commit_timeout,
            cleanup_timeout=scenario.cleanup_timeout,
            hooks=None
            if scenario.stop_hook_sleep is None
            else SleepingStop(scenario.stop_hook_sleep),
        ) as conversation:
            channel = conversation.subscribe(buffer=100_000)
            async with trio.open_nursery() as nursery:
                if scenario.cancel_at is not None:
                    nursery.start_soon(cancel_later, conversation, scenario.cancel_at)
                for at, method in scenario.inputs:
                    nursery.start_soon(send_later, conversation, at, method)
                try:
                    await conversation.prompt("go")
                except Error as error:
                    _expect(error, ErrorClass.RESOURCE_CONFLICT, ErrorClass.STORAGE_FAILED)
                observed.snapshot = await conversation.wait_settled()
                nursery.cancel_scope.cancel()
            # leave while the run may be anything: CAN-18 must settle it
        observed.exited_at = trio.current_time()
        observed.phase = conversation.status().phase
        observed.snapshot = conversation.status()
        observed.tasks_left = task_tree_size()
        async for event in channel:
            observed.events.append(event)
    return observed


def _check(scenario: Scenario, store: FaultyStore, backend: ProbeBackend, seen: Observed) -> None:
    note(f"attempts={store.attempts}")
    note(f"fired={store.fired}")
    note(f"events={[e.type for e in seen.events]}")
    note(f"phase={seen.phase} dispatched={[o.invocation_id for o in backend.operations]}")

    # Dispatch promises, checked at each dispatch by the probe.
    assert backend.violations == []
    if seen.cancel_returned_at is not None:
        assert all(t <= seen.cancel_returned_at for t in backend.dispatch_times)

    # No effect starts at or after the run deadline (CAN-10).
    deadline = store.inner._records[RUN_ID].deadline
    if deadline is not None:
        assert all(t < deadline for t in backend.dispatch_times), (backend.dispatch_times, deadline)

    # One commit in flight; nothing attempted after a commit that failed.
    assert store.max_in_flight <= 1
    failed = [number for action, _kind, number in store.fired if action in FAILING]
    if failed:
        assert store.attempts[-1][0] == failed[0], "a commit was attempted after a failure"
        assert seen.phase in ("storage_failed", "recovery_required")

    # Exactly one terminal event, or none after a storage failure.
    terminal = [e for e in seen.events if e.type in TERMINAL_EVENTS]
    if seen.phase in ("storage_failed", "recovery_required"):
        assert terminal == []
    else:
        assert seen.phase == "terminal"
        assert len(terminal) == 1, [e.type for e in seen.events]

    # Terminal state consistent with unsettled work.
    stored = store.inner._records[RUN_ID]
    record = seen.snapshot.run
    dispatched = {op.invocation_id for op in backend.operations}
    unsettled = {i for i in dispatched if record.intents[f"tool:{i}"]["status"] != "consumed"}
    if seen.phase == "terminal":
        assert record == stored == store.last_acknowledged()
        assert record.state in TERMINAL_STATES
        assert seen.snapshot.resource_cleanup.status == "confirmed"  # CAN-20
        event = terminal[0]
        if record.state in ("completed", "failed"):
            assert event.type == f"run_{record.state}"
            assert not record.active_tools
            assert record.active_provider is None
        else:
            assert event.type == "run_cancelled"
            assert event.payload["state"] == record.state
        if unsettled:
            assert record.state == "unknown_outcome"
        if record.state == "unknown_outcome":
            evidence = record.outcome["evidence"]
            assert evidence
            for item in evidence:
                effect = item["effect"]
                if effect.startswith("tool:"):
                    assert effect.removeprefix("tool:") in unsettled
                else:
                    assert effect.startswith("provider:")
                    assert record.intents[effect]["status"] == "uncertain"
        if record.state == "timed_out":
            assert record.stop_reason == "deadline_exceeded"
        if record.state == "cancelled":
            assert record.stop_reason == "cancelled"
    elif unsettled and stored.state in TERMINAL_STATES:
        assert stored.state == "unknown_outcome"  # a lost acknowledgement (CAN-13)

    # Bounded in virtual time, nothing left running.
    bound = scenario.run_timeout + scenario.cleanup_timeout + scenario.commit_timeout
    assert seen.exited_at - seen.opened_at <= bound + 1e-9, (seen.exited_at, bound)
    assert seen.tasks_left == 0
    assert backend.running == 0


@given(scenarios())
def test_invariants_under_random_scripts(scenario: Scenario) -> None:
    """KER-09, CAN-04, CAN-06, CAN-07, CAN-08, CAN-11, CAN-12, CAN-18, CAN-19,
    CAN-20, NEST-06, NEST-07: the engine's invariants under random scripts,
    cancel times, deadlines and store faults."""
    faults = [attrs.evolve(f, fired=0) for f in scenario.faults]
    store = FaultyStore(None, *faults)
    backend = ProbeBackend(store)
    seen = trio.run(_play, scenario, store, backend, clock=MockClock(autojump_threshold=0))
    _check(scenario, store, backend, seen)


LATE_DEADLINE = Scenario(
    responses=[
        ScriptedProvider.tool_calls(("call-0", "look", {"outcome": "sleep", "seconds": 3.0})),
        ScriptedProvider.text("final answer"),
    ],
    cancel_at=None,
    inputs=[],
    faults=[
        Fault("delay", kind="conversation_updated", occurrence=2, delay=3.0),
        Fault("hang", kind="conversation_updated", occurrence=2),
    ],
    work=4,
    run_timeout=4.0,
    effect_timeout=10.0,
    commit_timeout=5.0,
    cleanup_timeout=1.0,
    stop_hook_sleep=None,
)


@given(st.just(LATE_DEADLINE))
def test_can_18_a_deadline_noticed_after_a_slow_commit_still_bounds_the_settlement(
    scenario: Scenario,
) -> None:
    """CAN-18 (found by the soak profile): the run deadline (4 s) passes while
    the worker's own commit is in flight (delayed to 6 s); the worker notices
    the deadline only then, and the settlement commit hangs.  The settlement
    still ends by deadline + cleanup_timeout + commit_timeout (10 s, not 11):
    its budget counts from when the stop was due, not from when it was
    noticed."""
    store = FaultyStore(None, *[attrs.evolve(f, fired=0) for f in scenario.faults])
    backend = ProbeBackend(store)
    seen = trio.run(_play, scenario, store, backend, clock=MockClock(autojump_threshold=0))
    assert [action for action, _kind, _number in store.fired] == ["delay", "hang"]
    assert seen.phase == "storage_failed"
    assert seen.exited_at == 10.0
    _check(scenario, store, backend, seen)
