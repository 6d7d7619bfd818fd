"""EVT: events (``Conversation.subscribe()``).

Ordering against commits is checked in virtual time: every commit goes through
a ``FaultyStore`` that delays it by one second (``MockClock`` with
``autojump_threshold=0``), and a prompt reader timestamps each event.  An
after-commit event must then carry the acknowledgement time of the commit it
reports, with no later acknowledgement before it; an event published when the
commit *starts* would sit a whole second earlier.

EVT-11 (interactions) and EVT-14 (catalog publication) are not covered here:
the engine does not implement ``interact``/``resolve`` or ``stage_catalog`` yet
(they belong to the interactions/approvals/publication issue).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import pytest
import trio

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import RunRecord, thaw
from trio_backplane.runtime import (
    Event,
    HookContext,
    ResponseCompleted,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
    open_conversation,
)
from trio_backplane.runtime._types import TRANSIENT_EVENTS
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Hang, ScriptedProvider, Sleep
from trio_backplane.tools import ToolResult

from .support import (
    RUN_ID,
    Fault,
    FaultyStore,
    RecordingBackend,
    TimelineStore,
    collect_timed,
    conversation_with,
    drained,
    make_tool,
    mark,
    observed_provider,
)

#: The whole vocabulary (EVT-01): each type and its exact payload fields
#: (``None``: the payload is the backend's own mapping, EVT-06).
VOCABULARY: dict[str, frozenset[str] | None] = {
    "response_started": frozenset(),
    "content_text_delta": frozenset({"delta", "index"}),
    "content_thinking_delta": frozenset({"delta", "index"}),
    "tool_call_started": frozenset({"tool_call"}),
    "tool_call_arguments_delta": frozenset({"delta", "index", "tool_call_id"}),
    "tool_call_completed": frozenset({"tool_call"}),
    "usage_updated": frozenset({"usage"}),
    "tool_update": None,
    "events_dropped": frozenset({"count"}),
    "response_completed": frozenset({"message", "usage"}),
    "response_failed": frozenset({"error"}),
    "prompt_consumed": frozenset({"mode", "message", "turn_id"}),
    "prompt_rejected": frozenset({"message_id", "error"}),
    "interaction_requested": frozenset({"interaction_id", "request"}),
    "interaction_resolved": frozenset({"interaction_id"}),
    "tool_started": frozenset({"invocation"}),
    "tool_completed": frozenset({"message"}),
    "catalog_published": frozenset({"catalog_revision"}),
    "turn_completed": frozenset({"turn_id", "outcome", "error"}),
    "turn_failed": frozenset({"turn_id", "outcome", "error"}),
    "run_completed": frozenset({"outcome"}),
    "run_failed": frozenset({"outcome"}),
    "run_cancelled": frozenset({"outcome", "state"}),
    "storage_failed": frozenset({"error", "recovery_required"}),
}
TERMINAL_EVENTS = frozenset({"run_completed", "run_failed", "run_cancelled"})
DELAY = 1.0


def check_vocabulary(events: Sequence[Event]) -> None:
    """EVT-01: only named types, each with exactly its payload fields."""
    for event in events:
        assert event.type in VOCABULARY, event.type
        fields = VOCABULARY[event.type]
        if fields is not None:
            assert set(event.payload) == fields, (event.type, set(event.payload))
        if event.type == "tool_call_started":
            assert set(event.payload["tool_call"]) == {"id", "name", "index"}
        if event.type == "tool_call_completed":
            assert set(event.payload["tool_call"]) == {"id", "name", "arguments"}
        if event.type in ("turn_completed", "turn_failed"):
            assert set(event.payload["outcome"]) == {"turn_id", "status", "error"}


@attrs.define
class Run:
    """What a timed conversation left: snapshot, ``(time, event)`` pairs, store."""

    snapshot: Any
    timed: list[tuple[float, Event]]
    store: FaultyStore
    timeline: TimelineStore
    raised: Error | None = None

    @property
    def events(self) -> list[Event]:
        return [event for _t, event in self.timed]

    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def of(self, type_: str) -> list[tuple[float, Event]]:
        return [(t, e) for t, e in self.timed if e.type == type_]

    def latest_ack(self, at: float) -> tuple[str, RunRecord, float]:
        """The last commit acknowledged at or before ``at``."""
        before = [ack for ack in self.store.acknowledged if ack[2] <= at]
        assert before, f"no commit acknowledged by t={at}"
        return before[-1]

    def assert_after_commit(
        self,
        type_: str,
        kind: str,
        check: Callable[[Event, RunRecord], None] | None = None,
        *,
        nth: int | None = None,
    ) -> int:
        """Each ``type_`` event (only the ``nth``, 0-based, if given) follows an
        acknowledged ``kind`` commit, with no other acknowledgement in
        between; returns how many were checked."""
        found = self.of(type_)
        if nth is not None:
            found = found[nth : nth + 1]
        for at, event in found:
            _kind, record, _ack_at = self.latest_ack(at)
            # a merged commit is acknowledged once per command, same record
            kinds = [k for k, r, _t in self.store.acknowledged if r is record]
            assert kind in kinds, (type_, kinds, at)
            if check is not None:
                check(event, record)
        return len(found)


async def timed_run(
    provider: Any,
    tools: Sequence[Any] = (),
    *,
    prompt: Any = "hello",
    body: Callable[[Any], Awaitable[None]] | None = None,
    faults: Sequence[Fault] = (),
    delay: float = DELAY,
    setup: Callable[[Any, TimelineStore], None] | None = None,
    **options: Any,
) -> Run:
    """Prompt a conversation whose every commit takes ``delay`` seconds, run
    ``body``, wait for settlement and collect timestamped events."""
    all_faults = list(faults)
    if delay:
        all_faults.append(Fault("delay", when=lambda _k, _r: True, delay=delay, times=10**9))
    store = FaultyStore(None, *all_faults)
    timed: list[tuple[float, Event]] = []
    raised: Error | None = None
    async with (
        trio.open_nursery() as nursery,
        conversation_with(provider, tools, store=store, **options) as (conv, timeline),
    ):
        nursery.start_soon(collect_timed, conv.subscribe(), timed)
        if setup is not None:
            setup(conv, timeline)
        try:
            await conv.prompt(prompt)
        except Error as error:
            raised = error
        if body is not None:
            await body(conv)
        snapshot = await conv.wait_settled()
    run = Run(snapshot, timed, store, timeline, raised)
    check_vocabulary(run.events)
    return run


def streamed_tool_response(call_id: str = "c1", name: str = "work") -> list[Any]:
    """Thinking, text, a fully streamed tool call and usage, then the terminal message."""
    message = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "index": 1},
            {"type": "text", "text": "calling"},
            {"type": "tool_call", "id": call_id, "name": name, "arguments": {"v": 1}},
        ],
    }
    return [
        ThinkingDelta("hmm", index=1),
        TextDelta("calling"),
        ToolCallStarted(call_id, name, index=2),
        ToolCallArgumentsDelta(call_id, '{"v":', index=2),
        ToolCallArgumentsDelta(call_id, "1}", index=2),
        ToolCallCompleted(call_id, name, {"v": 1}),
        Usage({"input_tokens": 7, "detail": {"cached": [1, 2]}}),
        ResponseCompleted(message, usage={"input_tokens": 7, "output_tokens": 3}),
    ]


def emitting_backend(*updates: dict[str, Any]) -> RecordingBackend:
    async def run(operation: Any) -> ToolResult:
        for update in updates:
            operation.context.emit(update)
            await trio.sleep(0.5)
        return ToolResult("worked", structured_content={"ok": True})

    return RecordingBackend(run)


# -- EVT-01 ------------------------------------------------------------------------


async def test_evt_01_only_the_vocabulary_with_exact_fields(autojump_clock: Any) -> None:
    """EVT-01: across success, tool, failure, rejection, cancellation, storage
    failure and loss, subscribers see only named types with exactly their fields;
    provider_hosted_event, context_window_started, session_detach_failed never."""
    seen: set[str] = set()
    backend = emitting_backend({"progress": 0.5})
    success = await timed_run(
        ScriptedProvider([streamed_tool_response(), ScriptedProvider.text("done")]),
        [make_tool("work", backend)],
    )
    seen |= set(success.types())

    class Reject:
        async def prompt(self, message: Any, context: HookContext) -> Any:
            if message["content"] == "bad":
                raise Error(ErrorClass.VALIDATION, "no")
            return message

    failing = await timed_run(
        ScriptedProvider(
            [[Sleep(5), *ScriptedProvider.failure(Error(ErrorClass.TRANSIENT_TRANSPORT, "x"))]]
        ),
        hooks=Reject(),
        body=lambda conv: conv.follow_up("bad"),
    )
    seen |= set(failing.types())
    assert {"response_failed", "prompt_rejected", "turn_failed", "run_failed"} <= seen

    async def cancel(conv: Any) -> None:
        await trio.sleep(10)
        await conv.cancel()

    cancelled = await timed_run(ScriptedProvider([[Hang()]]), body=cancel)
    seen |= set(cancelled.types())
    broken = await timed_run(
        ScriptedProvider([ScriptedProvider.text("x")]), faults=[Fault("fail", kind="finish")]
    )
    seen |= set(broken.types())

    deltas = [TextDelta(f"d{i}") for i in range(8)]
    lossy_provider = ScriptedProvider([[*deltas, *ScriptedProvider.text("end")]])
    async with conversation_with(lossy_provider) as (
        conv,
        timeline,
    ):
        slow = conv.subscribe(buffer=1)
        await conv.prompt("hello")
        await conv.wait_settled()
    lossy = [event async for event in slow]
    check_vocabulary(lossy)
    check_vocabulary(timeline.published())
    seen |= {e.type for e in lossy}

    expected = set(VOCABULARY) - {"interaction_requested", "interaction_resolved"}
    expected -= {"catalog_published"}
    assert expected <= seen, expected - seen
    assert not seen & {"provider_hosted_event", "context_window_started", "session_detach_failed"}


# -- provider events (EVT-02..05, 08) ----------------------------------------------


async def test_evt_02_response_started_between_commit_and_stream(autojump_clock: Any) -> None:
    """EVT-02: response_started (no fields) follows the provider_started commit and
    precedes the adapter's stream call."""
    holder: list[TimelineStore] = []
    provider = observed_provider(
        [ScriptedProvider.tool_calls(("c1", "work", {})), ScriptedProvider.text("done")],
        observe=lambda request: mark(holder[0], "stream", request.attempt_id),
    )
    run = await timed_run(
        provider,
        [make_tool("work", RecordingBackend())],
        setup=lambda _conv, timeline: holder.append(timeline),
    )
    assert run.assert_after_commit("response_started", "provider_started") == 2
    for _at, event in run.of("response_started"):
        assert event.payload == {}
    entries = run.timeline.timeline
    starts = [
        i for i, (tag, v) in enumerate(entries) if tag == "event" and v.type == "response_started"
    ]
    streams = [i for i, (tag, _v) in enumerate(entries) if tag == "stream"]
    commits = [
        i for i, (tag, v) in enumerate(entries) if tag == "commit" and v == "run.provider_started"
    ]
    assert len(starts) == len(streams) == len(commits) == 2
    for commit, start, stream in zip(commits, starts, streams, strict=True):
        assert commit < start < stream
        assert entries[start][1].attempt_id == entries[stream][1]


async def test_evt_03_text_and_thinking_deltas_before_completion_commit(
    autojump_clock: Any,
) -> None:
    """EVT-03: each TextDelta/ThinkingDelta is forwarded, before the provider
    completion commit, as content_text_delta/content_thinking_delta (delta, index)."""
    steps = [
        ThinkingDelta("let me", index=0),
        Sleep(1),
        ThinkingDelta(" think", index=0),
        TextDelta("Hel", index=1),
        Sleep(1),
        TextDelta("lo", index=1),
        ResponseCompleted(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "let me think"},
                    {"type": "text", "text": "Hello"},
                ],
            }
        ),
    ]
    run = await timed_run(ScriptedProvider([steps]))
    thinking = [e.payload for _t, e in run.of("content_thinking_delta")]
    texts = [e.payload for _t, e in run.of("content_text_delta")]
    assert thinking == [{"delta": "let me", "index": 0}, {"delta": " think", "index": 0}]
    assert texts == [{"delta": "Hel", "index": 1}, {"delta": "lo", "index": 1}]
    [(completed_ack, _r, ack_at)] = [
        a for a in run.store.acknowledged if a[0] == "provider_completed"
    ]
    assert completed_ack == "provider_completed"
    [(start_attempt_at, *_)] = [
        (at,) for _n, kind, at in run.store.attempts if kind == "provider_completed"
    ]
    for at, event in run.of("content_thinking_delta") + run.of("content_text_delta"):
        assert at <= start_attempt_at < ack_at  # before the completion commit even starts
        assert event.type in TRANSIENT_EVENTS
    # deltas are streamed as they happen, not batched at the end
    times = [at for at, _e in run.of("content_thinking_delta") + run.of("content_text_delta")]
    assert len(set(times)) == 3
    assert all(e.type.startswith("run.") for e in await run.store.events(RUN_ID))


async def test_evt_04_tool_call_stream_events(autojump_clock: Any) -> None:
    """EVT-04: ToolCallStarted/ArgumentsDelta/Completed become tool_call_started
    (tool_call: id, name, index), tool_call_arguments_delta (delta, index,
    tool_call_id) and tool_call_completed (tool_call: id, name, arguments)."""
    run = await timed_run(
        ScriptedProvider([streamed_tool_response(), ScriptedProvider.text("done")]),
        [make_tool("work", RecordingBackend())],
    )
    [(_a, started)] = run.of("tool_call_started")
    assert thaw(started.payload) == {"tool_call": {"id": "c1", "name": "work", "index": 2}}
    deltas = [thaw(e.payload) for _t, e in run.of("tool_call_arguments_delta")]
    assert deltas == [
        {"delta": '{"v":', "index": 2, "tool_call_id": "c1"},
        {"delta": "1}", "index": 2, "tool_call_id": "c1"},
    ]
    [(_b, completed)] = run.of("tool_call_completed")
    assert thaw(completed.payload) == {
        "tool_call": {"id": "c1", "name": "work", "arguments": {"v": 1}}
    }
    order = [t for t in run.types() if t.startswith("tool_call_")]
    assert order == [
        "tool_call_started",
        "tool_call_arguments_delta",
        "tool_call_arguments_delta",
        "tool_call_completed",
    ]
    for _t, event in run.of("tool_call_completed"):
        assert event.attempt_id is not None


async def test_evt_05_usage_updated_verbatim(autojump_clock: Any) -> None:
    """EVT-05: each Usage event becomes a transient usage_updated whose usage is
    the adapter's mapping unchanged."""
    first = {"input_tokens": 10, "vendor": {"cache": [1, {"hit": True}]}, "cost": 0.25}
    second = {"output_tokens": 4, "odd key": None}
    steps = [Usage(first), TextDelta("hi"), Usage(second), *ScriptedProvider.text("hi")[1:]]
    run = await timed_run(ScriptedProvider([steps]))
    usages = [e.payload for _t, e in run.of("usage_updated")]
    assert [thaw(u["usage"]) for u in usages] == [first, second]
    assert "usage_updated" in TRANSIENT_EVENTS
    assert thaw(list(run.snapshot.usage)) == [first, second]
    stored_types = {e.type for e in await run.store.events(RUN_ID)}
    assert "usage_updated" not in stored_types


async def test_evt_08_response_completed_after_commit(autojump_clock: Any) -> None:
    """EVT-08: response_completed (message, usage or None) follows the
    provider_completed commit."""
    with_usage = ScriptedProvider.text("one", usage={"total": 5})
    without = ScriptedProvider.text("two")

    def check(event: Event, record: RunRecord) -> None:
        assert record.active_provider is None
        assert record.provider_result is not None
        assert record.provider_result["attempt_id"] == event.attempt_id
        assert thaw(record.provider_result["result"]["message"]) == thaw(event.payload["message"])
        assert thaw(record.transcript)[-1] == thaw(event.payload["message"])

    class Again:
        calls = 0

        async def stop(self, outcome: Any, context: HookContext) -> Any:
            from trio_backplane.runtime import Continue

            Again.calls += 1
            return Continue("more") if Again.calls == 1 else "stop"

    run = await timed_run(ScriptedProvider([with_usage, without]), hooks=Again())
    assert run.assert_after_commit("response_completed", "provider_completed", check) == 2
    payloads = [thaw(e.payload) for _t, e in run.of("response_completed")]
    assert payloads == [
        {"message": {"role": "assistant", "content": "one"}, "usage": {"total": 5}},
        {"message": {"role": "assistant", "content": "two"}, "usage": None},
    ]


async def test_evt_08_response_failed_after_commit(autojump_clock: Any) -> None:
    """EVT-08: response_failed (error) follows the commit of the failed provider
    completion."""
    failure = Error(ErrorClass.TRANSIENT_TRANSPORT, "upstream 503", {"status": 503})

    def check(event: Event, record: RunRecord) -> None:
        assert record.provider_result is not None
        assert record.provider_result["attempt_id"] == event.attempt_id
        assert thaw(record.provider_result["result"]["error"]) == failure.to_dict()

    run = await timed_run(ScriptedProvider([ScriptedProvider.failure(failure)]))
    assert run.assert_after_commit("response_failed", "provider_completed", check) == 1
    [(_t, event)] = run.of("response_failed")
    assert thaw(event.payload) == {"error": failure.to_dict()}
    assert "response_completed" not in run.types()


# -- tool events (EVT-06, 12, 13) ------------------------------------------------------


async def test_evt_06_tool_update_is_the_emitted_mapping(autojump_clock: Any) -> None:
    """EVT-06: tool_update is transient and its payload is the mapping the backend
    passed to operation.context.emit; nothing of it is stored."""
    updates = ({"progress": 0.5, "note": "half"}, {"progress": 1, "items": [1, {"a": None}]})
    run = await timed_run(
        ScriptedProvider(
            [ScriptedProvider.tool_calls(("c1", "work", {})), ScriptedProvider.text("done")]
        ),
        [make_tool("work", emitting_backend(*updates))],
    )
    got = run.of("tool_update")
    assert [thaw(e.payload) for _t, e in got] == list(updates)
    assert "tool_update" in TRANSIENT_EVENTS
    [(started_at, _s)] = run.of("tool_started")
    [(completed_at, _c)] = run.of("tool_completed")
    assert all(started_at <= at < completed_at for at, _e in got)
    stored = await run.store.events(RUN_ID)
    assert "progress" not in repr(stored)
    assert "progress" not in repr(run.snapshot.run)


async def test_evt_06_tool_update_can_be_lost_by_a_slow_subscriber(autojump_clock: Any) -> None:
    """EVT-06: tool_update is transient: a full subscriber loses it, counted."""
    backend = emitting_backend(*({"step": i} for i in range(5)))
    provider = ScriptedProvider(
        [ScriptedProvider.tool_calls(("c1", "work", {})), ScriptedProvider.text("done")]
    )
    async with conversation_with(provider, [make_tool("work", backend)]) as (conv, timeline):
        slow = conv.subscribe(buffer=1)
        await conv.prompt("hello")
        await conv.wait_settled()
    received = [event async for event in slow]
    fast_updates = [e for e in timeline.published() if e.type == "tool_update"]
    slow_updates = [e for e in received if e.type == "tool_update"]
    assert len(fast_updates) == 5
    assert len(slow_updates) < 5
    assert sum(e.payload["count"] for e in received if e.type == "events_dropped") >= 5 - len(
        slow_updates
    )


async def test_evt_07_events_dropped_counts_and_precedes(autojump_clock: Any) -> None:
    """EVT-07: events_dropped is transient, carries count, and precedes the next
    event a subscriber receives after it lost transient events (CONV-29)."""
    deltas = [TextDelta(f"d{i}") for i in range(10)]
    provider = ScriptedProvider([[*deltas, *ScriptedProvider.text("end")]])
    async with conversation_with(provider) as (conv, timeline):
        slow = conv.subscribe(buffer=2)
        await conv.prompt("hello")
        await conv.wait_settled()
    received = [event async for event in slow]
    fast = timeline.published()
    assert "events_dropped" in TRANSIENT_EVENTS
    assert "events_dropped" not in [e.type for e in fast]  # the fast reader lost nothing
    drops = [i for i, e in enumerate(received) if e.type == "events_dropped"]
    assert drops, [e.type for e in received]
    for i in drops:
        assert set(received[i].payload) == {"count"}
        assert received[i].payload["count"] >= 1
        assert received[i].run_id == RUN_ID
        assert received[i + 1].type != "events_dropped"
    # the buffer (2) is full of undelivered events: every later delta is lost and
    # counted exactly, and the count arrives before the next delivered event
    fast_deltas = [e for e in fast if e.type == "content_text_delta"]
    slow_deltas = [e for e in received if e.type == "content_text_delta"]
    lost = sum(received[i].payload["count"] for i in drops)
    assert len(fast_deltas) - len(slow_deltas) == lost == 11  # 10 + the "end" delta
    assert received[drops[0] + 1].type == "response_completed"
    stored = await timeline.events(RUN_ID)
    assert "events_dropped" not in repr([e.type for e in stored])


async def test_evt_12_tool_started_between_intent_and_backend(autojump_clock: Any) -> None:
    """EVT-12: tool_started (invocation: identity, tool name, revision, arguments;
    no backend_context, no grants) follows the tool_invoked commit and precedes
    the backend call."""
    holder: list[TimelineStore] = []
    secret = "backend-context-canary"

    async def run_tool(operation: Any) -> ToolResult:
        mark(holder[0], "execute", operation.invocation_id)
        return ToolResult("done")

    backend = RecordingBackend(run_tool)
    tool = attrs.evolve(
        make_tool("work", backend, revision=3, backend_context={"token": secret}),
    )
    provider = ScriptedProvider(
        [
            ScriptedProvider.tool_calls(("c1", "work", {"v": 1}), ("c2", "work", {"v": 2})),
            ScriptedProvider.text("done"),
        ]
    )
    run = await timed_run(provider, [tool], setup=lambda _conv, timeline: holder.append(timeline))

    def check(event: Event, record: RunRecord) -> None:
        invocation = event.payload["invocation"]
        assert invocation["invocation_id"] in record.active_tools
        assert f"tool:{invocation['invocation_id']}" in record.intents

    assert run.assert_after_commit("tool_started", "tool_invoked", check) == 2
    invocations = [thaw(e.payload["invocation"]) for _t, e in run.of("tool_started")]
    for invocation, operation in zip(invocations, backend.operations, strict=True):
        assert invocation == {
            "invocation_id": operation.invocation_id,
            "tool_call_id": operation.tool_call_id,
            "step_id": operation.step_id,
            "tool_name": "work",
            "tool_revision": 3,
            "arguments": operation.arguments,
        }
    assert [i["arguments"] for i in invocations] == [{"v": 1}, {"v": 2}]
    assert secret not in repr(run.events)
    assert "grants" not in repr([e.payload for e in run.events])
    entries = run.timeline.timeline
    for invocation in invocations:
        started = next(
            i
            for i, (tag, v) in enumerate(entries)
            if tag == "event"
            and v.type == "tool_started"
            and v.payload["invocation"]["invocation_id"] == invocation["invocation_id"]
        )
        executed = entries.index(("execute", invocation["invocation_id"]))
        assert started < executed


async def test_evt_13_tool_completed_after_tool_message_checkpoint(autojump_clock: Any) -> None:
    """EVT-13: tool_completed (message) follows each commit that appends a tool
    message: a dispatched tool's result (whose ``tool_completed`` command
    carries its message) and a gateway refusal (a checkpoint) alike."""

    def check(event: Event, record: RunRecord) -> None:
        stored_last = thaw(record.transcript)[-1]
        assert stored_last == thaw(event.payload["message"])

    provider = ScriptedProvider(
        [
            ScriptedProvider.tool_calls(("c1", "work", {}), ("c2", "missing", {})),
            ScriptedProvider.text("done"),
        ]
    )
    run = await timed_run(provider, [make_tool("work", RecordingBackend(ToolResult("r1")))])
    assert run.assert_after_commit("tool_completed", "tool_completed", check, nth=0) == 1
    assert run.assert_after_commit("tool_completed", "conversation_updated", check, nth=1) == 1
    messages = [thaw(e.payload["message"]) for _t, e in run.of("tool_completed")]
    assert messages[0] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "work",
        "result": {"content": "r1", "structured_content": None, "is_error": False},
    }
    assert messages[1]["tool_call_id"] == "c2"
    assert messages[1]["result"]["is_error"] is True
    assert messages[1]["result"]["error"]["class"] == "not_found"
    # the dispatched tool's result is committed with its transcript message
    kinds = run.store.acknowledged_kinds()
    completed = run.store.acknowledged[kinds.index("tool_completed")][1]
    assert thaw(completed.transcript)[-1] == messages[0]
    assert any(completed.tool_results.values())


# -- prompts (EVT-09, 10) -------------------------------------------------------------


async def test_evt_09_prompt_consumed_after_user_message_checkpoint(autojump_clock: Any) -> None:
    """EVT-09: prompt_consumed (mode new/steering, message, turn_id) follows the
    checkpoint that appends the user message."""

    async def body(conv: Any) -> None:
        await conv.steer("s")
        await conv.follow_up("f")

    provider = ScriptedProvider(
        [[Sleep(10), *ScriptedProvider.text("a1")], ScriptedProvider.text("a2")]
    )
    provider.add(ScriptedProvider.text("a3"))

    def check(event: Event, record: RunRecord) -> None:
        state = record.context["conversation"]
        assert thaw(record.transcript)[-1] == thaw(event.payload["message"])
        assert state["turn_id"] == event.payload["turn_id"]

    run = await timed_run(provider, body=body)
    assert run.assert_after_commit("prompt_consumed", "conversation_updated", check) == 3
    payloads = [thaw(e.payload) for _t, e in run.of("prompt_consumed")]
    assert [(p["mode"], p["message"]["content"]) for p in payloads] == [
        ("new", "hello"),
        ("steering", "s"),
        ("new", "f"),
    ]
    turns = [r.turn_id for r in provider.requests]
    assert [p["turn_id"] for p in payloads] == [turns[0], turns[0], turns[2]]
    assert turns[2] != turns[0]
    assert all(set(p["message"]) == {"role", "content", "id"} for p in payloads)


async def test_evt_10_prompt_rejected_never_enters_transcript(autojump_clock: Any) -> None:
    """EVT-10: prompt_rejected (message_id, error) is published when the prompt
    hook raises, and the rejected message never enters the transcript."""
    refusal = Error(ErrorClass.FORBIDDEN, "not allowed", {"why": "policy"})

    class Hooks:
        async def prompt(self, message: Any, context: HookContext) -> Any:
            if message["content"] == "secret-plan":
                raise refusal
            return message

    ids: list[str] = []

    async def body(conv: Any) -> None:
        ids.append(await conv.follow_up("secret-plan"))

    provider = ScriptedProvider([[Sleep(5), *ScriptedProvider.text("a1")]])
    run = await timed_run(provider, hooks=Hooks(), body=body)
    [(at, rejected)] = run.of("prompt_rejected")
    assert thaw(rejected.payload) == {"message_id": ids[0], "error": refusal.to_dict()}
    for _kind, record, _at in run.store.acknowledged:
        messages = thaw(record.transcript)
        assert ids[0] not in [m.get("id") for m in messages]
    assert ids[0] not in [m.get("id") for m in thaw(list(run.snapshot.messages))]
    assert "secret-plan" not in [m.get("content") for m in thaw(list(run.snapshot.messages))]
    assert len(provider.requests) == 1
    # published when decided: before the checkpoint that drops it from the queue
    [drop] = [
        ack
        for ack in run.store.acknowledged
        if ack[0] == "conversation_updated"
        and ack[2] > at
        and not ack[1].context["conversation"]["follow_up"]
    ][:1]
    assert drop[2] > at


# -- turns and runs (EVT-15..19) ----------------------------------------------------------


async def test_evt_15_turn_events_after_turn_checkpoint(autojump_clock: Any) -> None:
    """EVT-15: turn_completed / turn_failed (turn_id, outcome, error) follow the
    checkpoint that records the turn."""
    failure = Error(ErrorClass.TRANSIENT_TRANSPORT, "blip")

    def check(event: Event, record: RunRecord) -> None:
        last_turn = thaw(record.context["conversation"]["last_turn"])
        assert last_turn == thaw(event.payload["outcome"])
        assert last_turn["turn_id"] == event.payload["turn_id"]

    provider = ScriptedProvider(
        [[Sleep(5), *ScriptedProvider.failure(failure)], ScriptedProvider.text("ok")]
    )
    run = await timed_run(provider, body=lambda conv: conv.follow_up("again"))
    assert run.assert_after_commit("turn_failed", "conversation_updated", check) == 1
    assert run.assert_after_commit("turn_completed", "conversation_updated", check) == 1
    [(_a, failed)] = run.of("turn_failed")
    [(_b, completed)] = run.of("turn_completed")
    assert failed.payload["turn_id"] == provider.requests[0].turn_id
    assert thaw(failed.payload["error"]) == failure.to_dict()
    assert thaw(failed.payload["outcome"])["status"] == "failed"
    assert completed.payload["turn_id"] == provider.requests[1].turn_id
    assert completed.payload["error"] is None
    assert thaw(completed.payload["outcome"])["status"] == "completed"


@pytest.mark.parametrize("fails", [False, True])
async def test_evt_16_run_event_after_finish(autojump_clock: Any, fails: bool) -> None:
    """EVT-16: run_completed / run_failed (outcome: the last turn record) follow
    the finish commit."""
    response = (
        ScriptedProvider.failure(Error(ErrorClass.TRANSIENT_TRANSPORT, "blip"))
        if fails
        else ScriptedProvider.text("ok")
    )
    type_ = "run_failed" if fails else "run_completed"

    def check(event: Event, record: RunRecord) -> None:
        assert record.state == ("failed" if fails else "completed")
        assert thaw(record.outcome) == thaw(event.payload["outcome"])
        assert thaw(record.context["conversation"]["last_turn"]) == thaw(event.payload["outcome"])

    run = await timed_run(ScriptedProvider([response]))
    assert run.assert_after_commit(type_, "finish", check) == 1
    assert run.types()[-1] == type_
    assert sum(t in TERMINAL_EVENTS for t in run.types()) == 1


class SlowStop:
    async def stop(self, outcome: Any, context: HookContext) -> str:
        await trio.sleep(100)
        return "stop"


async def _cancel_after(conv: Any, seconds: float = 10.0) -> None:
    await trio.sleep(seconds)
    await conv.cancel()


def _failing_mutation(operation: Any) -> Error:
    return Error(ErrorClass.EXECUTION_FAILURE, "write failed midway")


@pytest.mark.parametrize(
    ("scenario", "state"),
    [
        ("cancel_idle_effects", "cancelled"),
        ("deadline", "timed_out"),
        ("cancel_during_provider", "unknown_outcome"),
        ("uncertain_tool", "unknown_outcome"),
    ],
)
async def test_evt_17_run_cancelled_once_after_cleanup_settled(
    autojump_clock: Any, scenario: str, state: str
) -> None:
    """EVT-17: run_cancelled (outcome, state) is published once, after the
    cleanup_settled commit, for a cancellation, a deadline or an uncertain stop."""
    tools: list[Any] = []
    options: dict[str, Any] = {}
    body: Any = None
    if scenario == "cancel_idle_effects":
        provider = ScriptedProvider([ScriptedProvider.text("a1")])
        options["hooks"] = SlowStop()
        body = _cancel_after
    elif scenario == "deadline":
        provider = ScriptedProvider([ScriptedProvider.text("a1")])
        options.update(hooks=SlowStop(), run_timeout=30.0)
    elif scenario == "cancel_during_provider":
        provider = ScriptedProvider([[Hang()]])
        body = _cancel_after
    else:
        provider = ScriptedProvider([ScriptedProvider.tool_calls(("c1", "write", {}))])
        tools = [make_tool("write", RecordingBackend(_failing_mutation))]
    run = await timed_run(provider, tools, body=body, **options)

    def check(event: Event, record: RunRecord) -> None:
        assert record.state == state
        assert event.payload["state"] == state
        assert thaw(event.payload["outcome"]) == thaw(record.outcome)

    assert run.assert_after_commit("run_cancelled", "cleanup_settled", check) == 1
    types = run.types()
    assert types[-1] == "run_cancelled"
    assert sum(t in TERMINAL_EVENTS for t in types) == 1
    assert run.snapshot.run.state == state
    assert run.snapshot.phase == "terminal"
    if scenario == "deadline":
        [(at, _e)] = run.of("run_cancelled")
        deadline = run.snapshot.run.deadline
        assert deadline is not None
        assert deadline <= at <= deadline + 5 * DELAY


@pytest.mark.parametrize("action", ["fail", "crash", "hang", "lose_ack", "lose_ack_raise"])
@pytest.mark.parametrize("kind", ["provider_started", "tool_completed", "finish"])
async def test_evt_18_storage_failed_and_nothing_terminal(
    autojump_clock: Any, action: str, kind: str
) -> None:
    """EVT-18: storage_failed (error, recovery_required True) is published when a
    commit fails, crashes or outlives commit_timeout, and no run_completed,
    run_failed or run_cancelled follows it."""
    provider = ScriptedProvider(
        [ScriptedProvider.tool_calls(("c1", "work", {})), ScriptedProvider.text("done")]
    )
    tools = [make_tool("work", RecordingBackend())]
    run = await timed_run(provider, tools, faults=[Fault(action, kind=kind)], commit_timeout=3.0)
    [(at, event)] = run.of("storage_failed")
    assert event.payload["recovery_required"] is True
    assert event.payload["error"]["class"] == "storage_failed"
    number, attempt_at = run.store.attempt_with(kind)
    assert [(a, n) for a, _named, n in run.store.fired if a == action] == [(action, number)]
    expected = attempt_at + (3.0 if action in ("hang", "lose_ack") else 0.0)
    assert at == pytest.approx(expected)
    types = run.types()
    after = types[types.index("storage_failed") :]
    assert not set(after) & TERMINAL_EVENTS
    assert not set(types) & TERMINAL_EVENTS
    assert run.snapshot.phase == "storage_failed"
    assert run.store.acknowledged_kinds()[-1] != kind
    assert kind not in run.store.acknowledged_kinds()[-1:]


async def test_evt_19_kernel_events_only_in_the_store(autojump_clock: Any) -> None:
    """EVT-19: the kernel's "run.<command>" events go only to the store's event
    log (read back with Store.events), never to a subscriber."""
    run = await timed_run(
        ScriptedProvider(
            [ScriptedProvider.tool_calls(("c1", "work", {})), ScriptedProvider.text("done")]
        ),
        [make_tool("work", RecordingBackend())],
    )
    stored = await run.store.events(RUN_ID)
    assert [e.type for e in stored] == [f"run.{k}" for k in run.store.acknowledged_kinds()]
    assert {e.type for e in stored} >= {
        "run.admit",
        "run.provider_started",
        "run.provider_completed",
        "run.tool_invoked",
        "run.tool_completed",
        "run.conversation_updated",
        "run.finish",
    }
    assert [e.sequence for e in stored] == list(range(1, len(stored) + 1))
    assert not [e for e in run.events if e.type.startswith("run.")]
    assert {e.type for e in run.events} <= set(VOCABULARY)


class _ShieldedStream:
    """A provider stream that shields each read (a client protecting its
    connection state): it ignores the run's cancellation (CAN-18)."""

    def __init__(self) -> None:
        self.i = 0

    def __aiter__(self) -> _ShieldedStream:
        return self

    async def __anext__(self) -> Any:
        with trio.CancelScope(shield=True):
            await trio.sleep(0.3)
        self.i += 1
        if self.i <= 15:
            return TextDelta(f"chunk{self.i}")
        if self.i == 16:
            return ResponseCompleted({"role": "assistant", "content": "done"})
        raise StopAsyncIteration


class _ShieldedProvider:
    def stream(self, request: Any, context: Any) -> _ShieldedStream:
        return _ShieldedStream()


class _ShieldedTool:
    async def execute(self, operation: Any) -> ToolResult:
        with trio.CancelScope(shield=True):
            for i in range(10):
                await trio.sleep(0.5)
                operation.context.emit({"progress": i})
        return ToolResult("ok")


@pytest.mark.parametrize("ignoring", ["provider", "tool"])
async def test_evt_17_nothing_follows_run_cancelled_from_a_worker_ignoring_cancellation(
    autojump_clock: Any, ignoring: str
) -> None:
    """EVT-17, CAN-18: a worker that ignores its cancellation (a shielded
    stream or tool) goes on after the watchdog settled the run; what it
    publishes then (text deltas, tool updates) reaches no subscriber:
    ``run_cancelled`` is the last event."""
    if ignoring == "provider":
        provider: Any = _ShieldedProvider()
        tools: list[Any] = []
    else:
        provider = ScriptedProvider(
            [ScriptedProvider.tool_calls(("c1", "t", {})), ScriptedProvider.text("x")]
        )
        tools = [make_tool("t", _ShieldedTool(), read_only=True)]
    async with conversation_with(provider, tools, cleanup_timeout=1.0, commit_timeout=1.0) as (
        conversation,
        _,
    ):
        channel = conversation.subscribe(buffer=1000)
        await conversation.prompt("hello")
        await trio.sleep(1)
        await conversation.cancel()
        await conversation.wait_settled()
        await trio.sleep(5)  # the worker goes on meanwhile
        types = [e.type for e in drained(channel)]
    assert types.count("run_cancelled") == 1
    assert types[-1] == "run_cancelled", types[types.index("run_cancelled") :]
    assert ("content_text_delta" if ignoring == "provider" else "tool_update") in types


class _SlowRejectingHook:
    async def prompt(self, message: Any, context: Any) -> Any:
        await trio.sleep(2)  # a moderation call
        raise Error(ErrorClass.FORBIDDEN, "rejected by moderation")


@pytest.mark.parametrize("meanwhile", ["cancel", "storage_failure"])
async def test_conv_12_can_17_a_prompt_rejected_after_the_run_stopped(
    autojump_clock: Any, meanwhile: str
) -> None:
    """CONV-12, CAN-17, EVT-17, EVT-18: the initial prompt hook rejects the
    prompt after the run was cancelled, or after a storage failure, while it
    ran: ``prompt`` raises what the stopped run says (``resource_conflict``
    "run is not accepting input", or ``storage_failed``), not the hook's
    verdict, and no ``prompt_rejected`` follows the run's last event."""
    store = FaultyStore()
    provider = ScriptedProvider([ScriptedProvider.text("hi")])
    async with conversation_with(provider, [], store=store, hooks=_SlowRejectingHook()) as (
        conversation,
        _,
    ):
        channel = conversation.subscribe(buffer=1000)

        async def meanwhile_() -> None:
            await trio.sleep(1)
            if meanwhile == "cancel":
                await conversation.cancel()
            else:
                store.add(Fault("fail", kind="conversation_updated"))
                with pytest.raises(Error):
                    await conversation.steer("more")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(meanwhile_)
            with pytest.raises(Error) as raised:
                await conversation.prompt("hello")
        snapshot = await conversation.wait_settled()
        types = [e.type for e in drained(channel)]
    last = "run_cancelled" if meanwhile == "cancel" else "storage_failed"
    expected = ErrorClass.RESOURCE_CONFLICT if meanwhile == "cancel" else ErrorClass.STORAGE_FAILED
    assert raised.value.error_class is expected, raised.value
    assert types[-1] == last, types
    assert snapshot.phase == ("terminal" if meanwhile == "cancel" else "storage_failed")


async def test_conv_26_a_new_turn_carries_no_step_of_the_last(autojump_clock: Any) -> None:
    """CONV-26: ``step_id`` and ``attempt_id`` are those of the provider step
    current when an event is published: a failed attempt's id is cleared as
    a completed one's is, and a follow-up turn's events never carry the
    previous turn's step."""
    provider = ScriptedProvider(
        [
            ScriptedProvider.failure(Error(ErrorClass.EXECUTION_FAILURE, "overloaded")),
            [Sleep(1), *ScriptedProvider.text("ok")],
        ]
    )
    async with conversation_with(provider, []) as (conversation, _):
        channel = conversation.subscribe(buffer=1000)
        await conversation.prompt("hello")
        await conversation.follow_up("again")
        await conversation.wait_settled()
        events = drained(channel)
    attempts = {r.attempt_id: r.turn_id for r in provider.requests}
    steps = {r.step_id: r.turn_id for r in provider.requests}
    assert len(attempts) == 2
    for event in events:
        if event.attempt_id is not None:
            assert attempts[event.attempt_id] == event.turn_id, event
        if event.step_id is not None:
            assert steps[event.step_id] == event.turn_id, event
    failed = next(e for e in events if e.type == "turn_failed")
    assert failed.attempt_id is None
    second = [e for e in events if e.type == "prompt_consumed"][-1]
    assert (second.step_id, second.attempt_id) == (None, None)


async def test_evt_payloads_are_read_only_for_every_subscriber(autojump_clock: Any) -> None:
    """EVT-01, TOOL-04: every subscriber gets the same payload, read-only:
    one subscriber cannot edit what another receives (a tool's name and
    arguments on ``tool_started``, a consumed prompt's message)."""
    provider = ScriptedProvider(
        [
            ScriptedProvider.tool_calls(("c1", "deploy", {"env": "staging"})),
            ScriptedProvider.text("x"),
        ]
    )
    tool = make_tool("deploy", RecordingBackend(), read_only=True)
    async with conversation_with(provider, [tool]) as (conversation, _):
        rogue = conversation.subscribe(buffer=1000)
        auditor = conversation.subscribe(buffer=1000)
        await conversation.prompt("hello")
        await conversation.wait_settled()
        mine, theirs = drained(rogue), drained(auditor)
    started = next(e for e in mine if e.type == "tool_started")
    consumed = next(e for e in mine if e.type == "prompt_consumed")
    for edit in (
        lambda: started.payload["invocation"].__setitem__("tool_name", "noop"),
        lambda: started.payload["invocation"]["arguments"].__setitem__("env", "production"),
        lambda: consumed.payload["message"].__setitem__("content", "something else"),
    ):
        with pytest.raises(TypeError):
            edit()
    seen = next(e for e in theirs if e.type == "tool_started").payload["invocation"]
    assert (seen["tool_name"], seen["arguments"]) == ("deploy", {"env": "staging"})


async def test_evt_a_subscription_ends_once_the_run_has_said_its_last_word(
    autojump_clock: Any,
) -> None:
    """EVT, CONV-29: after the terminal event a subscriber's channel ends
    (it drains what it holds, then ``async for`` stops), and one made after
    the run ended, or on a stored run that is only inspected, ends at once:
    a subscriber looping over its channel inside the block waited for ever."""
    store = MemoryStore()
    provider = ScriptedProvider([ScriptedProvider.text("done")])
    async with open_conversation("r", store=store, provider=provider) as conversation:
        early = conversation.subscribe()
        await conversation.prompt("hi")
        await conversation.wait_settled()
        with trio.fail_after(1):
            seen = [event.type async for event in early]
            late = [event.type async for event in conversation.subscribe()]
    assert seen[-1] == "run_completed"
    assert late == []
    stored = await store.load("r")
    assert stored is not None
    provider = ScriptedProvider([])
    async with open_conversation("r", store=store, provider=provider, run=stored) as inspected:
        with trio.fail_after(1):
            assert [event async for event in inspected.subscribe()] == []


async def test_can_19_a_subscription_ends_when_another_host_takes_the_run_over(
    tmp_path: Any,
) -> None:
    """CAN-19, CONV-29: a takeover (another host fenced the run) leaves the
    conversation ``recovery_required`` with nothing more to say: its
    subscriptions end (a subscriber loop waited for ever)."""
    from trio_backplane.store import SQLiteStore

    release = trio.Event()

    class Waits:
        def stream(self, request: Any, context: Any) -> Any:
            async def events() -> Any:
                await release.wait()
                yield ResponseCompleted({"role": "assistant", "content": "done"})

            return events()

    async with (
        SQLiteStore(tmp_path / "runs.db") as store,
        open_conversation("r", store=store, provider=Waits()) as conversation,
    ):
        channel = conversation.subscribe()
        await conversation.prompt("hi")
        await store.fence("r", incarnation=2)
        release.set()
        snapshot = await conversation.wait_settled()
        assert snapshot.phase == "recovery_required"
        with trio.fail_after(5):
            seen = [event.type async for event in channel]
    assert "run_completed" not in seen
