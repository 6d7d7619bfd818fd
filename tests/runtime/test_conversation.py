"""CONV: conversation lifecycle and input (``open_conversation``).

Every test runs on ``MemoryStore`` (usually behind the ``FaultyStore`` or
``TimelineStore`` wrappers of ``support``) under Trio's ``MockClock`` with
``autojump_threshold=0``, so time is exact.  CONV-04 is withdrawn.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import trio

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import UNSET, ConversationUpdated, RunRecord, thaw
from trio_backplane.runtime import (
    Continue,
    HookContext,
    Phase,
    ResourceCleanup,
    ResponseFailed,
    open_conversation,
)
from trio_backplane.runtime._types import TRANSIENT_EVENTS
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Hang, ScriptedProvider, Sleep
from trio_backplane.tools import Authority, ToolRegistry, ToolResult

from .support import (
    RUN_ID,
    Fault,
    FaultyStore,
    RecordingBackend,
    Unreadable,
    conversation_with,
    granted,
    make_tool,
    run_to_settled,
    stored_kinds,
)

TIMEOUT_OPTIONS = ("run_timeout", "effect_timeout", "commit_timeout", "cleanup_timeout")
BAD_TIMEOUTS = (0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, None, True, False, 3600.5, "5")


class ExplodingStore:
    """A store that fails the test on any call: options must be refused first."""

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"store.{name} called before validation")

        return call


def text(content: str, **kwargs: Any) -> list[Any]:
    return ScriptedProvider.text(content, **kwargs)


def slow_text(content: str, seconds: float = 1.0) -> list[Any]:
    return [Sleep(seconds), *ScriptedProvider.text(content)]


def contents(messages: Any) -> list[Any]:
    return [m.get("content") for m in thaw(list(messages))]


def user_contents(messages: Any) -> list[Any]:
    return [m["content"] for m in thaw(list(messages)) if m["role"] == "user"]


async def open_refused(**options: Any) -> None:
    provider = ScriptedProvider([text("never")])
    async with open_conversation(RUN_ID, store=ExplodingStore(), provider=provider, **options):
        raise AssertionError("opened")  # pragma: no cover


class RecordingHooks:
    """Hooks that record each call; ``reject`` is a set of contents to refuse
    and ``stops`` the scripted stop results (then ``"stop"``)."""

    def __init__(self, *, reject: Any = (), stops: Any = ()) -> None:
        self.prompts: list[tuple[str, Any, HookContext]] = []
        self.stop_calls: list[tuple[Any, HookContext]] = []
        self.reject = set(reject)
        self.stops = list(stops)
        self.errors: list[Error] = []
        self.conversation: Any = None
        self.seen_at_stop: list[Any] = []

    async def prompt(self, message: Any, context: HookContext) -> Any:
        self.prompts.append((context.mode, message["content"], context))
        if message["content"] in self.reject:
            error = Error(ErrorClass.VALIDATION, f"refused {message['content']}")
            self.errors.append(error)
            raise error
        return message

    async def stop(self, outcome: Any, context: HookContext) -> Any:
        self.stop_calls.append((outcome, context))
        if self.conversation is not None:
            self.seen_at_stop.append(self.conversation.status())
        return self.stops.pop(0) if self.stops else "stop"


# -- options (CONV-01, 02, 03, 31) ---------------------------------------------


@pytest.mark.parametrize("name", TIMEOUT_OPTIONS)
@pytest.mark.parametrize("value", BAD_TIMEOUTS, ids=repr)
async def test_conv_01_timeouts_must_be_finite_positive(name: str, value: Any) -> None:
    """CONV-01: a non-positive, non-finite, non-number or > 3600 timeout raises
    validation "<name> must be a finite positive timeout" before any store call."""
    with pytest.raises(Error) as info:
        await open_refused(**{name: value})
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.message == f"{name} must be a finite positive timeout"


async def test_conv_01_timeout_bounds_accepted(autojump_clock: Any) -> None:
    """CONV-01: 3600 and small positive values (int or float) are accepted."""
    provider = ScriptedProvider([text("ok")])
    finished = await run_to_settled(
        provider,
        run_timeout=3600,
        effect_timeout=0.5,
        commit_timeout=3600.0,
        cleanup_timeout=1,
    )
    assert finished.record.state == "completed"
    assert finished.record.deadline == pytest.approx(3600.0)


@pytest.mark.parametrize("value", [math.inf, None, -1, 1.5, 1024.0, True, "10"], ids=repr)
async def test_conv_02_output_limit_must_be_non_negative_int(value: Any) -> None:
    """CONV-02: output_limit must be a non-negative int."""
    with pytest.raises(Error) as info:
        await open_refused(output_limit=value)
    assert info.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize("value", [-1, 1.5, -math.inf, math.nan, "inf", True], ids=repr)
async def test_conv_02_provider_output_limit_refusals(value: Any) -> None:
    """CONV-02: provider_output_limit accepts a non-negative int or math.inf only."""
    with pytest.raises(Error) as info:
        await open_refused(provider_output_limit=value)
    assert info.value.error_class is ErrorClass.VALIDATION


async def test_conv_02_provider_limit_defaults_to_output_limit(autojump_clock: Any) -> None:
    """CONV-02: without provider_output_limit the provider is bounded by output_limit."""
    provider = ScriptedProvider([text("x" * 11)])
    finished = await run_to_settled(provider, output_limit=10)
    assert finished.record.state == "failed"
    [failed] = finished.of("response_failed")
    assert failed.payload["error"]["class"] == "resource_conflict"
    assert failed.payload["error"]["details"]["limit"] == 10


async def test_conv_02_default_output_limit_is_one_mebibyte(autojump_clock: Any) -> None:
    """CONV-02: the default output_limit is 1 048 576 bytes (exactly that passes)."""
    ok = await run_to_settled(ScriptedProvider([text("a" * 1_048_576)]))
    assert ok.record.state == "completed"
    over = await run_to_settled(ScriptedProvider([text("a" * 1_048_577)]))
    assert over.record.state == "failed"
    assert over.of("response_failed")[0].payload["error"]["details"]["limit"] == 1_048_576


async def test_conv_02_inf_disables_provider_bound_not_tool_bound(autojump_clock: Any) -> None:
    """CONV-02: provider_output_limit=math.inf lets a large response through while
    a tool result over output_limit still becomes an error result."""
    backend = RecordingBackend(ToolResult("y" * 200))
    provider = ScriptedProvider(
        [ScriptedProvider.tool_calls(("c1", "big", {}), text="z" * 500), text("done")]
    )
    finished = await run_to_settled(
        provider,
        [make_tool("big", backend)],
        output_limit=100,
        provider_output_limit=math.inf,
    )
    assert finished.record.state == "completed"
    assert backend.calls == 1
    [tool_message] = finished.tool_messages()
    result = tool_message["result"]
    assert result["is_error"] is True
    assert result["error"]["class"] == "resource_conflict"
    assert result["error"]["details"]["scope"] == "tool_result"
    assert result["error"]["details"]["limit"] == 100


@pytest.mark.parametrize("mode", ["lenient", "", None, "STRICT", 1])
async def test_conv_03_schema_admission_mode(mode: Any) -> None:
    """CONV-03: a schema_admission other than strict/quarantine is refused."""
    with pytest.raises(Error) as info:
        await open_refused(schema_admission=mode)
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.message == "admission mode must be strict or quarantine"


@pytest.mark.parametrize("work", [True, False, 0, -1, 1.0, 2.5, None, "3"], ids=repr)
async def test_conv_31_work_must_be_int_at_least_one(work: Any) -> None:
    """CONV-31: work must be an int >= 1, refused before any store or provider call."""
    provider = ScriptedProvider([text("never")])
    with pytest.raises(Error) as info:
        async with open_conversation(RUN_ID, store=ExplodingStore(), provider=provider, work=work):
            raise AssertionError("opened")  # pragma: no cover
    assert info.value.error_class is ErrorClass.VALIDATION
    assert provider.requests == []


async def test_conv_31_work_one_is_enough_for_one_response(autojump_clock: Any) -> None:
    """CONV-31: work=1 is valid and funds exactly one provider attempt."""
    finished = await run_to_settled(ScriptedProvider([text("ok")]), work=1)
    assert finished.record.state == "completed"
    assert finished.record.budget.quota == 1
    assert finished.record.budget.used == 1


# -- admission of the catalog (CONV-30) ----------------------------------------

DRAFT_07 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}


async def test_conv_30_strict_refused_schema_before_store() -> None:
    """CONV-30: under strict admission a refused schema raises its own error and
    nothing is created in the store."""
    registry = ToolRegistry([make_tool("old", RecordingBackend(), schema=DRAFT_07)])
    provider = ScriptedProvider([text("never")])
    with pytest.raises(Error) as info:
        async with open_conversation(
            RUN_ID,
            store=ExplodingStore(),
            provider=provider,
            registry=registry,
            authority=granted(registry),
        ):
            raise AssertionError("opened")  # pragma: no cover
    assert info.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert provider.requests == []


async def test_conv_30_grants_must_equal_tool_names() -> None:
    """CONV-30 / CAT-10: grants that differ from the tool names raise forbidden
    before any store call; nothing is stored."""
    registry = ToolRegistry(
        [make_tool("a", RecordingBackend()), make_tool("b", RecordingBackend())]
    )
    store = MemoryStore()
    for grants in (frozenset({"a"}), frozenset({"a", "b", "c"}), frozenset()):
        authority = Authority(
            grants=grants, caller="host", run_id=RUN_ID, tool_revisions={"a": 1, "b": 1}
        )
        with pytest.raises(Error) as info:
            async with open_conversation(
                RUN_ID,
                store=store,
                provider=ScriptedProvider(),
                registry=registry,
                authority=authority,
            ):
                raise AssertionError("opened")  # pragma: no cover
        assert info.value.error_class is ErrorClass.FORBIDDEN
    assert await store.load(RUN_ID) is None
    assert await store.list_runs() == []


async def test_conv_30_quarantine_drops_refused_tool(autojump_clock: Any) -> None:
    """CONV-30: under quarantine the refused tool is left out of the catalog the
    provider sees and the conversation opens."""
    registry = ToolRegistry(
        [
            make_tool("old", RecordingBackend(), schema=DRAFT_07),
            make_tool("new", RecordingBackend()),
        ]
    )
    provider = ScriptedProvider([text("ok")])
    finished = await run_to_settled(
        provider,
        list(registry),
        authority=granted(registry),
        schema_admission="quarantine",
    )
    assert finished.record.state == "completed"
    assert [tool.name for tool in provider.requests[0].tools] == ["new"]


# -- opening and the first prompt (CONV-05..09) ---------------------------------


async def test_conv_05_fresh_conversation_is_idle() -> None:
    """CONV-05: phase idle, run state queued, revision 0, incarnation 1."""
    store = MemoryStore()
    async with open_conversation(RUN_ID, store=store, provider=ScriptedProvider()) as conversation:
        snapshot = conversation.status()
        assert snapshot.phase == "idle"
        assert snapshot.phase is Phase.IDLE
        assert snapshot.run.state == "queued"
        assert snapshot.run.revision == 0
        assert snapshot.run.incarnation == 1
        assert snapshot.messages == ()
        stored = await store.load(RUN_ID)
        assert stored == snapshot.run


async def test_conv_06_admit_commits_before_any_provider_request(autojump_clock: Any) -> None:
    """CONV-06: the first prompt commits admit (state running) before the
    provider's stream is called."""
    store = FaultyStore()
    seen: list[RunRecord | None] = []

    class Provider(ScriptedProvider):
        def stream(self, request: Any, context: Any) -> Any:
            seen.append(store.last_acknowledged())
            return super().stream(request, context)

    provider = Provider([text("ok")])
    async with conversation_with(provider, store=store) as (conversation, _timeline):
        await conversation.prompt("hello")
        await conversation.wait_settled()
    kinds = store.acknowledged_kinds()
    assert kinds[0] == "admit"
    assert kinds.index("admit") < kinds.index("provider_started")
    admitted = store.acknowledged[0][1]
    assert admitted.state == "running"
    assert admitted.admitted is True
    [at_stream] = seen
    assert at_stream is not None
    assert at_stream.state == "running"
    assert at_stream.active_provider is not None  # provider_started committed too
    assert (await stored_kinds(store))[0] == "admit"


async def test_conv_07_prompt_returns_after_admit_hook_and_checkpoint(
    autojump_clock: Any,
) -> None:
    """CONV-07: prompt returns the message id only after the admission commit,
    the prompt hook and the message checkpoint; the id is in the stored transcript."""
    store = FaultyStore(
        None, Fault("delay", kind="conversation_updated", delay=2.0)
    )  # a slow message checkpoint
    hook_seen: list[list[str]] = []

    class Hooks:
        async def prompt(self, message: Any, context: HookContext) -> Any:
            hook_seen.append(store.acknowledged_kinds())
            await trio.sleep(1.0)
            return {**message, "content": "edited"}

    provider = ScriptedProvider([[Hang()]])
    async with conversation_with(provider, store=store, hooks=Hooks()) as (conversation, _tl):
        message_id = await conversation.prompt("hello")
        returned_at = trio.current_time()
        acknowledged = store.acknowledged_kinds()
        stored = await store.load(RUN_ID)
        await conversation.cancel()
    assert hook_seen == [["admit"]]  # the hook ran after the admission commit
    assert returned_at == pytest.approx(3.0)  # hook (1 s) then the slow checkpoint (2 s)
    assert acknowledged[:2] == ["admit", "conversation_updated"]
    assert stored is not None
    messages = thaw(stored.transcript)
    assert messages == [{"role": "user", "content": "edited", "id": message_id}]


@pytest.mark.parametrize("action", ["fail", "crash", "hang", "lose_ack", "lose_ack_raise"])
async def test_conv_08_admission_commit_failure(autojump_clock: Any, action: str) -> None:
    """CONV-08: a failed or timed-out admission commit makes prompt raise
    storage_failed, the phase storage_failed, and stream is never called."""
    store = FaultyStore(None, Fault(action, kind="admit"))
    provider = ScriptedProvider([text("never")])
    async with conversation_with(provider, store=store, commit_timeout=2.0) as (conversation, _tl):
        with pytest.raises(Error) as info:
            await conversation.prompt("hello")
        assert info.value.error_class is ErrorClass.STORAGE_FAILED
        assert conversation.status().phase == "storage_failed"
        settled = await conversation.wait_settled()
        assert settled.phase == "storage_failed"
        if action in ("hang", "lose_ack"):
            assert trio.current_time() == pytest.approx(2.0)  # commit_timeout decided
    assert provider.requests == []
    assert store.acknowledged_kinds() == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "prompt must not be empty"),
        ([], "prompt must not be empty"),
        (42, "content must be text or content blocks"),
        (None, "content must be text or content blocks"),
        (["text"], "content must be text or content blocks"),
        ({"type": "text", "text": "x"}, "content must be text or content blocks"),
        ("bad \ud800 text", "message content contains text that is not valid Unicode"),
        ([Unreadable()], "message content could not be read as JSON data"),
    ],
    ids=repr,
)
async def test_conv_09_prompt_content_validation(content: Any, message: str) -> None:
    """CONV-09: empty prompts, non-content, text that is not Unicode (a lone
    surrogate) and blocks that fail when read are refused with validation
    and nothing is committed: a corrected prompt is then admitted."""
    store = FaultyStore()
    provider = ScriptedProvider([text("never")])
    async with conversation_with(provider, store=store) as (conversation, _timeline):
        with pytest.raises(Error) as info:
            await conversation.prompt(content)
        assert info.value.error_class is ErrorClass.VALIDATION
        assert info.value.message.startswith(message)
        assert conversation.status().phase == "idle"
        assert conversation.status().run.revision == 0
        assert store.attempts == []
        stored = await store.load(RUN_ID)
        assert stored is not None
        assert stored.revision == 0
    assert provider.requests == []


async def test_conv_09_a_conversation_refuses_calls_from_another_trio_run() -> None:
    """CONV-09: every call of a conversation from another Trio run (another
    thread) is refused with validation before it touches anything: the
    conversation stays usable from its own run."""
    provider = ScriptedProvider([text("hi")])
    async with conversation_with(provider) as (conversation, _timeline):
        refused: list[Any] = []

        async def elsewhere() -> None:
            for call in (
                lambda: conversation.prompt("from elsewhere"),
                lambda: conversation.steer("x"),
                lambda: conversation.follow_up("x"),
                lambda: conversation.resolve("i-1", True),
                conversation.cancel,
                conversation.wait_settled,
            ):
                try:
                    await call()
                except Error as exc:
                    refused.append((exc.error_class, exc.details.get("reason")))
            try:
                conversation.subscribe()
            except Error as exc:
                refused.append((exc.error_class, exc.details.get("reason")))

        await trio.to_thread.run_sync(trio.run, elsewhere)
        assert refused == [(ErrorClass.VALIDATION, "foreign_trio_run")] * 7
        assert conversation.status().run.revision == 0
        await conversation.prompt("hello")
        assert (await conversation.wait_settled()).run.state == "completed"


# -- input while running (CONV-10, 11, 12) --------------------------------------


async def test_conv_10_prompt_while_running_is_a_follow_up(autojump_clock: Any) -> None:
    """CONV-10: a prompt during a turn is queued as a follow-up, not steering, and
    starts its own turn afterwards."""
    provider = ScriptedProvider([slow_text("a1"), text("a2")])
    async with conversation_with(provider) as (conversation, timeline):
        await conversation.prompt("first")
        second_id = await conversation.prompt("second")
        snapshot = conversation.status()
        assert [m["id"] for m in snapshot.follow_up] == [second_id]
        assert snapshot.steering == ()
        await conversation.wait_settled()
    assert len(provider.requests) == 2
    assert provider.requests[0].turn_id != provider.requests[1].turn_id
    assert user_contents(provider.requests[0].messages) == ["first"]
    assert user_contents(provider.requests[1].messages) == ["first", "second"]
    consumed = [e for e in timeline.published() if e.type == "prompt_consumed"]
    assert [(e.payload["mode"], e.payload["message"]["content"]) for e in consumed] == [
        ("new", "first"),
        ("new", "second"),
    ]


@pytest.mark.parametrize("method", ["steer", "follow_up"])
async def test_conv_11_queue_returns_after_checkpoint(autojump_clock: Any, method: str) -> None:
    """CONV-11: steer and follow_up return the id only after the queue checkpoint
    is acknowledged (a slow commit delays the return; the stored queue holds it)."""
    queue = "steering" if method == "steer" else "follow_up"

    def queued_slow(kind: str, record: RunRecord) -> bool:
        state = record.context.get("conversation") or {}
        return kind == "conversation_updated" and any(
            m["content"] == "queued" for m in state.get(queue, ())
        )

    store = FaultyStore(None, Fault("delay", when=queued_slow, delay=3.0))
    provider = ScriptedProvider([slow_text("a1", 10.0), text("a2"), text("a3")])
    async with conversation_with(provider, store=store) as (conversation, _timeline):
        await conversation.prompt("hello")
        started = trio.current_time()
        message_id = await getattr(conversation, method)("queued")
        assert trio.current_time() - started == pytest.approx(3.0)
        stored = await store.load(RUN_ID)
        assert stored is not None
        assert [m["id"] for m in stored.context["conversation"][queue]] == [message_id]
        assert store.acknowledged_kinds()[-1] == "conversation_updated"
        await conversation.wait_settled()


@pytest.mark.parametrize("method", ["steer", "follow_up"])
async def test_conv_11_queue_commit_failure_returns_no_id(autojump_clock: Any, method: str) -> None:
    """CONV-11: when the queue checkpoint fails, no id is returned (storage_failed)."""
    provider = ScriptedProvider([slow_text("a1", 10.0), text("a2")])
    store = FaultyStore()
    async with conversation_with(provider, store=store) as (conversation, _timeline):
        await conversation.prompt("hello")
        store.add(Fault("fail", nth=len(store.attempts) + 1))
        with pytest.raises(Error) as info:
            await getattr(conversation, method)("queued")
        assert info.value.error_class is ErrorClass.STORAGE_FAILED
    stored = await store.load(RUN_ID)
    assert stored is not None
    assert list(stored.context["conversation"]["steering"]) == []
    assert list(stored.context["conversation"]["follow_up"]) == []


async def _assert_refuses_input(conversation: Any) -> None:
    for method in ("prompt", "steer", "follow_up"):
        with pytest.raises(Error) as info:
            await getattr(conversation, method)("more")
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert info.value.message == "run is not accepting input"


async def test_conv_12_no_input_while_cancelling(autojump_clock: Any) -> None:
    """CONV-12: phase cancelling refuses prompt, steer and follow_up."""
    store = FaultyStore()
    provider = ScriptedProvider([[Hang()]])
    async with conversation_with(provider, store=store) as (conversation, _timeline):
        await conversation.prompt("hello")
        await trio.sleep(1)
        attempts = len(store.attempts)
        await conversation.cancel()
        assert conversation.status().phase == "cancelling"
        await _assert_refuses_input(conversation)
        assert len(store.attempts) == attempts  # refused input committed nothing
        await conversation.wait_settled()


async def test_conv_12_no_input_when_terminal(autojump_clock: Any) -> None:
    """CONV-12: phase terminal refuses input."""
    async with conversation_with(ScriptedProvider([text("ok")])) as (conversation, _tl):
        await conversation.prompt("hello")
        snapshot = await conversation.wait_settled()
        assert snapshot.phase == "terminal"
        await _assert_refuses_input(conversation)


async def test_conv_12_no_input_when_recovery_required() -> None:
    """CONV-12: phase recovery_required (a stored non-terminal run) refuses input."""
    store = MemoryStore()
    record = RunRecord.new(RUN_ID)
    await store.create(record)
    provider = ScriptedProvider([text("never")])
    async with open_conversation(RUN_ID, store=store, provider=provider, run=record) as conv:
        assert conv.status().phase == "recovery_required"
        await _assert_refuses_input(conv)
    assert provider.requests == []
    assert await store.load(RUN_ID) == record


async def test_conv_12_no_input_when_storage_failed(autojump_clock: Any) -> None:
    """CONV-12: phase storage_failed refuses input."""
    store = FaultyStore(None, Fault("fail", kind="provider_started"))
    async with conversation_with(ScriptedProvider([text("x")]), store=store) as (conv, _tl):
        await conv.prompt("hello")
        snapshot = await conv.wait_settled()
        assert snapshot.phase == "storage_failed"
        await _assert_refuses_input(conv)


# -- steering (CONV-13, 14) -------------------------------------------------------


async def test_conv_13_one_steering_per_boundary_after_whole_batch(autojump_clock: Any) -> None:
    """CONV-13: steering is consumed only after the response and its complete
    sequential tool batch (or a response without tools), one item per boundary."""
    started = trio.Event()
    release = trio.Event()

    async def first(operation: Any) -> ToolResult:
        started.set()
        await release.wait()
        return ToolResult("r1")

    backend = RecordingBackend(first, ToolResult("r2"))
    provider = ScriptedProvider(
        [
            ScriptedProvider.tool_calls(("c1", "work", {}), ("c2", "work", {})),
            text("a2"),
            text("a3"),
        ]
    )
    async with conversation_with(provider, [make_tool("work", backend)]) as (conv, timeline):
        await conv.prompt("hello")
        await started.wait()
        await conv.steer("s1")
        await conv.steer("s2")
        assert [m["content"] for m in conv.status().steering] == ["s1", "s2"]
        release.set()
        snapshot = await conv.wait_settled()
    assert backend.calls == 2
    assert len(provider.requests) == 3
    second, third = provider.requests[1], provider.requests[2]
    assert [(m["role"], m.get("content")) for m in second.messages][2:] == [
        ("tool", None),
        ("tool", None),
        ("user", "s1"),
    ]
    assert [m.get("tool_call_id") for m in second.messages[2:4]] == ["c1", "c2"]
    assert user_contents(second.messages) == ["hello", "s1"]  # s2 still queued
    assert user_contents(third.messages) == ["hello", "s1", "s2"]  # after a text response
    assert contents(third.messages)[-2:] == ["a2", "s2"]
    assert snapshot.steering == ()
    published = timeline.published()
    types = [e.type for e in published]
    steering = [i for i, e in enumerate(published) if e.payload.get("mode") == "steering"]
    tool_done = [i for i, t in enumerate(types) if t == "tool_completed"]
    assert len(steering) == 2
    assert max(tool_done) < steering[0]
    response_started = [i for i, t in enumerate(types) if t == "response_started"]
    assert response_started[1] < steering[1] < response_started[2]


async def test_conv_14_steering_consumed_before_stop_hook(autojump_clock: Any) -> None:
    """CONV-14: queued steering is consumed before the stop hook runs; the stop
    hook sees it in the transcript and an empty steering queue."""
    hooks = RecordingHooks()
    provider = ScriptedProvider([slow_text("a1"), text("a2")])
    async with conversation_with(provider, hooks=hooks) as (conversation, _timeline):
        hooks.conversation = conversation
        await conversation.prompt("hello")
        await conversation.steer("s")
        await conversation.wait_settled()
    assert len(hooks.stop_calls) == 1
    outcome, context = hooks.stop_calls[0]
    assert outcome["message"]["content"] == "a2"
    assert context.mode == "stop"
    [seen] = hooks.seen_at_stop
    assert seen.steering == ()
    assert contents(seen.messages) == ["hello", "a1", "s", "a2"]


# -- follow-ups, work and deadline (CONV-15, 16, 17, 22) ----------------------------


async def test_conv_15_follow_up_new_turn_after_outcome_commit(autojump_clock: Any) -> None:
    """CONV-15: a follow-up starts a new turn with a new turn_id only after the
    previous turn's outcome checkpoint has been acknowledged."""
    store = FaultyStore()
    provider = ScriptedProvider([slow_text("a1"), text("a2")])
    async with conversation_with(provider, store=store) as (conversation, timeline):
        await conversation.prompt("hello")
        await conversation.follow_up("again")
        await conversation.wait_settled()
    first, second = (r.turn_id for r in provider.requests)
    assert first != second
    acknowledged = store.acknowledged
    outcome_index = next(
        i
        for i, (kind, record, _at) in enumerate(acknowledged)
        if kind == "conversation_updated"
        and (record.context["conversation"].get("last_turn") or {}).get("turn_id") == first
    )
    second_start = next(
        i
        for i, (kind, record, _at) in enumerate(acknowledged)
        if kind == "provider_started"
        and record.active_provider is not None
        and i > 0
        and record.counters.get("attempt") == 2
    )
    assert outcome_index < second_start
    last_turn = acknowledged[outcome_index][1].context["conversation"]["last_turn"]
    assert last_turn["status"] == "completed"
    published = timeline.published()
    done = next(i for i, e in enumerate(published) if e.type == "turn_completed")
    consumed = [i for i, e in enumerate(published) if e.type == "prompt_consumed"]
    assert published[done].payload["turn_id"] == first
    assert done < consumed[1]
    assert published[consumed[1]].payload["turn_id"] == second


async def test_conv_16_follow_up_shares_the_work_quota(autojump_clock: Any) -> None:
    """CONV-16: all turns draw on one work quota: a follow-up does not reset it."""
    provider = ScriptedProvider([slow_text("a1"), text("a2"), text("a3")])
    store = FaultyStore()
    async with conversation_with(provider, store=store, work=2) as (conversation, _tl):
        await conversation.prompt("hello")
        await conversation.follow_up("two")
        await conversation.follow_up("three")
        await conversation.wait_settled()
    assert len(provider.requests) == 2  # the third turn's attempt was refused
    record = await store.load(RUN_ID)
    assert record is not None
    assert record.state == "failed"
    assert record.budget.quota == 2
    assert record.budget.used == 2
    assert record.outcome is not None
    assert record.outcome["error"]["class"] == "budget_exceeded"
    assert {r.budget.quota for _k, r, _at in store.acknowledged} == {2}


async def test_conv_16_follow_up_shares_the_run_deadline(autojump_clock: Any) -> None:
    """CONV-16: all turns share one run deadline: a follow-up does not move it."""

    class SlowStop:
        calls = 0

        async def stop(self, outcome: Any, context: HookContext) -> str:
            SlowStop.calls += 1
            if SlowStop.calls == 2:
                await trio.sleep(5)
            return "stop"

    provider = ScriptedProvider([slow_text("a1", 4.0), slow_text("a2", 4.0)])
    store = FaultyStore()
    async with conversation_with(provider, store=store, run_timeout=10.0, hooks=SlowStop()) as (
        conversation,
        timeline,
    ):
        await conversation.prompt("hello")
        await conversation.follow_up("again")
        snapshot = await conversation.wait_settled()
        settled_at = trio.current_time()
    assert len(provider.requests) == 2
    assert settled_at == pytest.approx(10.0)
    assert snapshot.run.state == "timed_out"
    deadlines = {r.deadline for _k, r, _at in store.acknowledged}
    assert len(deadlines) == 1
    assert deadlines.pop() == pytest.approx(10.0)
    assert [e.type for e in timeline.published()].count("run_cancelled") == 1


async def test_conv_17_prompt_after_run_completed(autojump_clock: Any) -> None:
    """CONV-17: after run_completed a further prompt raises resource_conflict."""
    store = FaultyStore()
    async with conversation_with(ScriptedProvider([text("ok")]), store=store) as (conv, tl):
        await conv.prompt("hello")
        await conv.wait_settled()
        attempts = len(store.attempts)
        with pytest.raises(Error) as info:
            await conv.prompt("again")
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert len(store.attempts) == attempts
    assert "run_completed" in [e.type for e in tl.published()]


async def test_conv_22_failed_turn_then_successful_follow_up(autojump_clock: Any) -> None:
    """CONV-22: a failed turn followed by a successful follow-up ends with
    run_completed whose outcome error is None."""
    boom = Error(ErrorClass.TRANSIENT_TRANSPORT, "provider hiccup")
    provider = ScriptedProvider([[Sleep(1), *ScriptedProvider.failure(boom)], text("fine")])
    async with conversation_with(provider) as (conversation, timeline):
        await conversation.prompt("hello")
        await conversation.follow_up("again")
        snapshot = await conversation.wait_settled()
    types = [e.type for e in timeline.published()]
    assert types.count("turn_failed") == 1
    assert types.count("turn_completed") == 1
    assert types.index("turn_failed") < types.index("turn_completed")
    assert types[-1] == "run_completed"
    [completed] = [e for e in timeline.published() if e.type == "run_completed"]
    assert completed.payload["outcome"]["error"] is None
    assert completed.payload["outcome"]["turn_id"] == provider.requests[1].turn_id
    assert snapshot.run.state == "completed"


# -- hooks (CONV-18..21, 28) -------------------------------------------------------


async def test_conv_18_initial_prompt_rejected_by_hook(autojump_clock: Any) -> None:
    """CONV-18: a prompt hook Error on the initial prompt is raised by prompt
    itself, emits prompt_rejected and fails the turn (no provider attempt)."""
    hooks = RecordingHooks(reject={"bad"})
    provider = ScriptedProvider([text("never")])
    async with conversation_with(provider, hooks=hooks) as (conversation, timeline):
        with pytest.raises(Error) as info:
            await conversation.prompt("bad")
        snapshot = await conversation.wait_settled()
    assert info.value is hooks.errors[0]
    assert provider.requests == []
    published = timeline.published()
    types = [e.type for e in published]
    assert types == ["prompt_rejected", "turn_failed", "run_failed"]
    rejected = published[0]
    assert rejected.payload["error"] == hooks.errors[0].to_dict()
    assert snapshot.run.state == "failed"
    assert snapshot.messages == ()
    assert published[1].payload["error"] == hooks.errors[0].to_dict()


async def test_conv_19_continue_appends_without_prompt_hook(autojump_clock: Any) -> None:
    """CONV-19: Continue(message) appends that user message and starts a new
    provider attempt without calling the prompt hook for it."""
    hooks = RecordingHooks(stops=[Continue("keep going")])
    provider = ScriptedProvider([text("a1"), text("a2")])
    finished = await run_to_settled(provider, hooks=hooks)
    assert [(mode, content) for mode, content, _ in hooks.prompts] == [("new", "hello")]
    assert len(provider.requests) == 2
    assert provider.requests[0].turn_id == provider.requests[1].turn_id
    assert contents(provider.requests[1].messages) == ["hello", "a1", "keep going"]
    assert provider.requests[1].messages[-1]["role"] == "user"
    assert len(hooks.stop_calls) == 2
    assert finished.record.state == "completed"
    assert contents(finished.messages) == ["hello", "a1", "keep going", "a2"]


class _EqRaises:
    """A result whose ``==`` raises (an array-like's)."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("ambiguous truth value")

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    "result", ["continue", None, "STOP", {"stop": True}, 1, _EqRaises()], ids=repr
)
async def test_conv_20_invalid_stop_hook_result(autojump_clock: Any, result: Any) -> None:
    """CONV-20: a stop result other than "stop" or a Continue fails the turn with
    "invalid stop hook result"."""
    hooks = RecordingHooks(stops=[result])
    finished = await run_to_settled(ScriptedProvider([text("a1")]), hooks=hooks)
    [failed] = finished.of("turn_failed")
    assert failed.payload["error"]["message"] == "invalid stop hook result"
    assert finished.record.state == "failed"
    assert finished.record.outcome is not None
    assert finished.record.outcome["error"]["message"] == "invalid stop hook result"


class CustomHooks:
    """Hooks given as plain coroutines (``None``: the default)."""

    def __init__(self, prompt: Any = None, stop: Any = None) -> None:
        if prompt is not None:
            self.prompt = prompt
        if stop is not None:
            self.stop = stop


async def _hang(*_: Any) -> Any:
    await trio.sleep_forever()


async def _late(message: Any, context: HookContext) -> Any:
    """A hook that ignores its cancellation (a blocking call in a thread,
    say) and answers well past effect_timeout: timed out all the same."""
    with trio.CancelScope(shield=True):
        await trio.sleep(60)
    return message if context.mode != "stop" else "stop"


async def _assistant(message: Any, context: HookContext) -> Any:
    return {"role": "assistant", "content": "not a user message"}


async def _host_bug(*_: Any) -> Any:
    raise ValueError("a bug in the host's hook")


async def _not_json(message: Any, context: HookContext) -> Any:
    return {**message, "content": math.nan}


def _not_async(message: Any, context: HookContext) -> Any:
    return message


async def _no_content(message: Any, context: HookContext) -> Any:
    return {"role": "user"}


async def _empty_content(message: Any, context: HookContext) -> Any:
    return {"role": "user", "content": ""}


async def _unreadable(message: Any, context: HookContext) -> Any:
    return Unreadable()


async def test_conv_07_a_prompt_hook_cannot_change_a_message_id(autojump_clock: Any) -> None:
    """CONV-07, CONV-11: the id ``prompt``, ``steer`` and ``follow_up``
    return is the message's, and ids stay unique, even when the prompt hook
    rewrites ``message["id"]`` in the dict it is given."""

    async def hijack(message: Any, context: HookContext) -> Any:
        message["id"] = "hijacked"
        return message

    provider = ScriptedProvider([text("a1"), text("a2")])
    async with conversation_with(provider, hooks=CustomHooks(prompt=hijack)) as (conversation, _):
        first = await conversation.prompt("hello")
        second = await conversation.follow_up("more")
        snapshot = await conversation.wait_settled()
    ids = [m["id"] for m in snapshot.messages if m["role"] == "user"]
    assert ids == [first, second]
    assert "hijacked" not in ids


@pytest.mark.parametrize(
    ("hook", "error_class", "message", "after"),
    [
        (_hang, ErrorClass.TIMEOUT, "prompt hook timed out", 2.0),
        (_late, ErrorClass.TIMEOUT, "prompt hook timed out", 60.0),
        (_assistant, ErrorClass.VALIDATION, "prompt hook must return a user message", 0.0),
        (_host_bug, ErrorClass.EXECUTION_FAILURE, "prompt hook failed", 0.0),
        (_not_async, ErrorClass.EXECUTION_FAILURE, "prompt hook failed", 0.0),
        (_not_json, ErrorClass.VALIDATION, "prompt hook must return a user message", 0.0),
        (_no_content, ErrorClass.VALIDATION, "prompt hook must return a user message", 0.0),
        (_empty_content, ErrorClass.VALIDATION, "prompt hook must return a user message", 0.0),
        (_unreadable, ErrorClass.VALIDATION, "prompt hook must return a user message", 0.0),
    ],
    ids=[
        "hangs",
        "answers-late",
        "returns-an-assistant-message",
        "raises-ValueError",
        "not-async",
        "not-json",
        "no-content",
        "empty-content",
        "unreadable-mapping",
    ],
)
async def test_conv_18_prompt_hook_timeout_or_bad_result_is_a_rejection(
    autojump_clock: Any, hook: Any, error_class: ErrorClass, message: str, after: float
) -> None:
    """CONV-18: a prompt hook bounded by effect_timeout that hangs, answers
    past it (ignoring its cancellation), or returns something other than a
    user message, rejects the prompt as a
    raised hook Error would: prompt raises a classed error, prompt_rejected
    names it, the turn fails and no provider attempt is made."""
    provider = ScriptedProvider([text("never")])
    async with conversation_with(provider, hooks=CustomHooks(prompt=hook), effect_timeout=2.0) as (
        conversation,
        timeline,
    ):
        start = trio.current_time()
        with pytest.raises(Error) as info:
            await conversation.prompt("hello")
        assert trio.current_time() - start == pytest.approx(after)
        snapshot = await conversation.wait_settled()
    assert info.value.error_class is error_class
    assert info.value.message == message
    assert provider.requests == []
    published = timeline.published()
    assert [e.type for e in published] == ["prompt_rejected", "turn_failed", "run_failed"]
    assert published[0].payload["error"]["message"] == message
    assert snapshot.run.state == "failed"
    assert snapshot.messages == ()


async def _refuse(outcome: Any, context: HookContext) -> Any:
    raise Error(ErrorClass.FORBIDDEN, "policy says no")


async def _empty_continue(outcome: Any, context: HookContext) -> Any:
    return Continue("")


@pytest.mark.parametrize(
    ("hook", "error_class", "message"),
    [
        (_hang, ErrorClass.TIMEOUT, "stop hook timed out"),
        (_late, ErrorClass.TIMEOUT, "stop hook timed out"),
        (_refuse, ErrorClass.FORBIDDEN, "policy says no"),
        (_empty_continue, ErrorClass.VALIDATION, "prompt must not be empty"),
        (_host_bug, ErrorClass.EXECUTION_FAILURE, "stop hook failed"),
    ],
    ids=["hangs", "answers-late", "raises", "continues-with-nothing", "raises-ValueError"],
)
async def test_conv_20_stop_hook_failures_fail_the_turn_classed(
    autojump_clock: Any, hook: Any, error_class: ErrorClass, message: str
) -> None:
    """CONV-20: a stop hook that hangs past effect_timeout (or answers past
    it, ignoring its cancellation), raises an Error, or
    continues with empty content fails the turn with that classed error; the
    response it judged stays in the transcript and nothing more is asked."""
    provider = ScriptedProvider([text("a1"), text("never")])
    finished = await run_to_settled(provider, hooks=CustomHooks(stop=hook), effect_timeout=2.0)
    [failed] = finished.of("turn_failed")
    assert failed.payload["error"]["class"] == error_class.value
    assert failed.payload["error"]["message"] == message
    assert finished.record.state == "failed"
    assert len(provider.requests) == 1
    assert contents(finished.messages) == ["hello", "a1"]


class OnlyPrompt:
    def __init__(self) -> None:
        self.calls = 0

    async def prompt(self, message: Any, context: HookContext) -> Any:
        self.calls += 1
        return message


class OnlyStop:
    def __init__(self) -> None:
        self.calls = 0

    async def stop(self, outcome: Any, context: HookContext) -> str:
        self.calls += 1
        return "stop"


@pytest.mark.parametrize("hooks", [None, object(), OnlyPrompt(), OnlyStop()], ids=repr)
async def test_conv_21_missing_hooks_get_defaults(autojump_clock: Any, hooks: Any) -> None:
    """CONV-21: missing hooks pass the message through unchanged and stop."""
    provider = ScriptedProvider([text("a1"), text("never")])
    finished = await run_to_settled(provider, prompt=[{"type": "text", "text": "hi"}], hooks=hooks)
    assert len(provider.requests) == 1  # the default stop hook stopped
    assert finished.record.state == "completed"
    user = finished.messages[0]
    assert thaw(user["content"]) == [{"type": "text", "text": "hi"}]
    assert set(user) == {"role", "content", "id"}
    if isinstance(hooks, OnlyPrompt | OnlyStop):
        assert hooks.calls == 1


async def test_conv_28_prompt_hook_modes_and_no_continue(autojump_clock: Any) -> None:
    """CONV-28: the prompt hook runs for each consumed steering (mode steering) and
    follow-up (mode new) message, never for a stop-hook continuation."""
    hooks = RecordingHooks(stops=[Continue("synthetic")])
    provider = ScriptedProvider([slow_text("a1"), text("a2"), text("a3"), text("a4")])
    async with conversation_with(provider, hooks=hooks) as (conversation, timeline):
        await conversation.prompt("p")
        await conversation.steer("s")
        await conversation.follow_up("f")
        await conversation.wait_settled()
    assert [(mode, content) for mode, content, _ in hooks.prompts] == [
        ("new", "p"),
        ("steering", "s"),
        ("new", "f"),
    ]
    turns = {r.turn_id for r in provider.requests}
    assert len(turns) == 2
    assert hooks.prompts[1][2].turn_id == provider.requests[0].turn_id
    assert hooks.prompts[2][2].turn_id == provider.requests[3].turn_id
    consumed = [
        (e.payload["mode"], e.payload["message"]["content"])
        for e in timeline.published()
        if e.type == "prompt_consumed"
    ]
    assert consumed == [("new", "p"), ("steering", "s"), ("new", "f")]
    assert "synthetic" in contents(provider.requests[2].messages)


async def test_conv_28_rejected_steering_fails_turn(autojump_clock: Any) -> None:
    """CONV-28: a steering message the hook rejects emits prompt_rejected and fails
    the turn without another provider attempt."""
    hooks = RecordingHooks(reject={"bad"})
    provider = ScriptedProvider([slow_text("a1"), text("never")])
    async with conversation_with(provider, hooks=hooks) as (conversation, timeline):
        await conversation.prompt("hello")
        bad_id = await conversation.steer("bad")
        snapshot = await conversation.wait_settled()
    assert len(provider.requests) == 1
    published = timeline.published()
    [rejected] = [e for e in published if e.type == "prompt_rejected"]
    assert rejected.payload["message_id"] == bad_id
    assert rejected.payload["error"] == hooks.errors[0].to_dict()
    assert [e.type for e in published][-2:] == ["turn_failed", "run_failed"]
    assert snapshot.run.state == "failed"
    assert "bad" not in contents(snapshot.messages)
    assert snapshot.steering == ()


async def test_conv_28_rejected_follow_up_fails_turn(autojump_clock: Any) -> None:
    """CONV-28: a follow-up the hook rejects emits prompt_rejected and fails its
    turn without a provider attempt; the run then fails (its last turn failed)."""
    hooks = RecordingHooks(reject={"bad"})
    provider = ScriptedProvider([slow_text("a1"), text("never")])
    async with conversation_with(provider, hooks=hooks) as (conversation, timeline):
        await conversation.prompt("hello")
        bad_id = await conversation.follow_up("bad")
        snapshot = await conversation.wait_settled()
    assert len(provider.requests) == 1
    published = timeline.published()
    [rejected] = [e for e in published if e.type == "prompt_rejected"]
    assert rejected.payload["message_id"] == bad_id
    turn_failed = [e for e in published if e.type == "turn_failed"]
    assert len(turn_failed) == 1
    new_turn = hooks.prompts[-1][2].turn_id
    assert new_turn != provider.requests[0].turn_id
    assert turn_failed[0].payload["turn_id"] == new_turn
    assert rejected.turn_id == turn_failed[0].turn_id == new_turn  # CONV-26
    assert snapshot.run.state == "failed"
    assert snapshot.follow_up == ()
    assert "bad" not in contents(snapshot.messages)


# -- snapshots and stored state (CONV-23, 24, 25) -----------------------------------


async def test_conv_23_status_is_last_committed_state(autojump_clock: Any) -> None:
    """CONV-23: status() reports the last committed state: record, transcript,
    queues, usage, phase, last error, catalog revision, receipts, resource_cleanup;
    a commit in flight is not visible until acknowledged."""
    started = trio.Event()
    release = trio.Event()

    async def gated(operation: Any) -> ToolResult:
        started.set()
        await release.wait()
        return ToolResult("r")

    def slow_steer(kind: str, record: RunRecord) -> bool:
        state = record.context.get("conversation") or {}
        return any(m["content"] == "slow" for m in state.get("steering", ()))

    store = FaultyStore(None, Fault("delay", when=slow_steer, delay=3.0))
    provider = ScriptedProvider(
        [
            [
                ScriptedProvider.usage({"input_tokens": 3, "extra": {"cached": [1]}}),
                *ScriptedProvider.tool_calls(("c1", "work", {})),
            ],
            text("a2"),
            text("a3"),
            text("a4"),
        ]
    )
    tools = [make_tool("work", RecordingBackend(gated))]
    async with conversation_with(provider, tools, store=store) as (conversation, _tl):
        await conversation.prompt("hello")
        await started.wait()
        await conversation.follow_up("later")
        snapshot = conversation.status()
        stored = await store.load(RUN_ID)
        assert snapshot.run == stored
        assert snapshot.phase == "running"
        assert contents(snapshot.messages)[0] == "hello"
        assert snapshot.messages[1]["role"] == "assistant"
        assert thaw(list(snapshot.messages)) == thaw(stored.transcript)
        assert [m["content"] for m in snapshot.follow_up] == ["later"]
        assert snapshot.steering == ()
        assert snapshot.queue_status == "active"
        assert thaw(list(snapshot.usage)) == [{"input_tokens": 3, "extra": {"cached": [1]}}]
        assert snapshot.turn_id == provider.requests[0].turn_id
        assert snapshot.pending_interaction is None
        assert snapshot.last_error is None
        assert snapshot.catalog_revision == 1
        assert snapshot.receipts == ()
        assert snapshot.resource_cleanup == ResourceCleanup("not_requested")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(conversation.steer, "slow")
            await trio.sleep(1)  # the steering commit is in flight
            in_flight = conversation.status()
            assert in_flight.steering == ()
            assert in_flight.run.revision == snapshot.run.revision
        after = conversation.status()
        assert [m["content"] for m in after.steering] == ["slow"]
        assert after.run.revision == snapshot.run.revision + 1
        release.set()
        final = await conversation.wait_settled()
    assert final.phase == "terminal"
    assert final.run == await store.load(RUN_ID)
    assert final.resource_cleanup.status == "confirmed"
    assert final.follow_up == ()
    assert final.steering == ()


async def test_conv_24_stored_messages_equal_status(autojump_clock: Any) -> None:
    """CONV-24: after completion the stored conversation messages equal status().messages."""
    provider = ScriptedProvider([ScriptedProvider.tool_calls(("c1", "echo", {})), text("done")])
    finished = await run_to_settled(provider, [make_tool("echo", RecordingBackend())])
    assert finished.record.state == "completed"
    assert thaw(finished.messages) == thaw(list(finished.snapshot.messages))
    assert [m["role"] for m in finished.messages] == ["user", "assistant", "tool", "assistant"]


async def test_conv_25_host_context_survives_every_checkpoint(autojump_clock: Any) -> None:
    """CONV-25: context= keys are stored beside "conversation" and survive every
    checkpoint of the turn loop unchanged."""
    host = {"tenant": "acme", "labels": {"tier": ["gold", 1]}, "flag": None}
    store = FaultyStore()
    provider = ScriptedProvider(
        [[Sleep(1), *ScriptedProvider.tool_calls(("c1", "echo", {}))], text("a2"), text("a3")]
    )
    tools = [make_tool("echo", RecordingBackend())]
    async with conversation_with(provider, tools, store=store, context=host) as (conv, _tl):
        await conv.prompt("hello")
        await conv.steer("s")
        await conv.follow_up("f")
        await conv.wait_settled()
    kinds = {kind for kind, _record, _at in store.acknowledged}
    assert {"admit", "conversation_updated", "provider_started", "tool_invoked"} <= kinds
    assert {"tool_completed", "provider_completed", "finish"} <= kinds
    records = [record for _kind, record, _at in store.acknowledged]
    stored = await store.load(RUN_ID)
    assert stored is not None
    for record in [*records, stored]:
        assert set(record.context) == {"tenant", "labels", "flag", "conversation"}
        assert thaw({k: v for k, v in record.context.items() if k != "conversation"}) == host


async def test_conv_25_conversation_key_is_reserved() -> None:
    """CONV-25: the "conversation" key belongs to the engine."""
    with pytest.raises(Error) as info:
        await open_refused(context={"conversation": {}})
    assert info.value.error_class is ErrorClass.VALIDATION


# -- events (CONV-26, 27, 29) ---------------------------------------------------------

#: the commands whose commit an after-commit event reports (a dispatched
#: tool's message rides in its ``tool_completed``, a refusal's in a checkpoint)
AFTER_COMMIT = {
    "response_started": {"provider_started"},
    "response_completed": {"provider_completed"},
    "response_failed": {"provider_completed"},
    "tool_started": {"tool_invoked"},
    "tool_completed": {"tool_completed", "conversation_updated"},
    "prompt_consumed": {"conversation_updated"},
    "turn_completed": {"conversation_updated"},
    "turn_failed": {"conversation_updated"},
    "run_completed": {"finish"},
    "run_failed": {"finish"},
    "run_cancelled": {"cleanup_settled"},
}


async def test_conv_26_event_identity_and_after_commit_order(autojump_clock: Any) -> None:
    """CONV-26: every event carries run_id, incarnation and turn_id (step_id and
    attempt_id while a provider step is current); an after-commit event follows
    the commit it reports."""
    provider = ScriptedProvider(
        [
            [
                ScriptedProvider.usage({"n": 1}),
                *ScriptedProvider.tool_calls(("c1", "echo", {"v": 1}), text="calling"),
            ],
            [Sleep(1), *text("a2")],
            text("a3"),
        ]
    )
    async with conversation_with(
        provider, [make_tool("echo", RecordingBackend())], incarnation=3
    ) as (conversation, timeline):
        await conversation.prompt("hello")
        await conversation.follow_up("again")
        await conversation.wait_settled()
    published = timeline.published()
    turns = [r.turn_id for r in provider.requests]
    assert turns[0] == turns[1] != turns[2]
    for event in published:
        assert event.run_id == RUN_ID
        assert event.incarnation == 3
        assert event.turn_id in turns
    # events of each provider attempt carry its step and attempt ids
    attempt = 0
    current: Any = None
    for event in published:
        if event.type == "response_started":
            current = provider.requests[attempt]
            attempt += 1
        if current is not None and event.type in (
            "response_started",
            "content_text_delta",
            "tool_call_completed",
            "usage_updated",
            "response_completed",
        ):
            assert (event.step_id, event.attempt_id, event.turn_id) == (
                current.step_id,
                current.attempt_id,
                current.turn_id,
            )
        if event.type == "response_completed":
            current = None
    assert attempt == 3
    first = published[0]
    assert first.type == "prompt_consumed"
    assert (first.step_id, first.attempt_id) == (None, None)
    # after-commit events come after their commit in the timeline (a merged
    # commit lists each of its commands: the event's is among the last ones)
    last_commits: list[str] = []
    previous = "event"
    for tag, value in timeline.timeline:
        if tag == "commit":
            if previous != "commit":
                last_commits = []
            last_commits.append(value.removeprefix("run."))
        elif value.type in AFTER_COMMIT:
            assert AFTER_COMMIT[value.type] & set(last_commits), (value.type, timeline.describe())
        previous = tag


async def test_conv_26_rejected_prompt_events_carry_turn_id(autojump_clock: Any) -> None:
    """CONV-26: even for a rejected initial prompt, every event carries the turn_id
    of the turn that failed."""
    hooks = RecordingHooks(reject={"bad"})
    async with conversation_with(ScriptedProvider(), hooks=hooks) as (conversation, timeline):
        with pytest.raises(Error):
            await conversation.prompt("bad")
        await conversation.wait_settled()
    turn_id = hooks.prompts[0][2].turn_id
    assert turn_id is not None
    published = timeline.published()
    assert [e.type for e in published] == ["prompt_rejected", "turn_failed", "run_failed"]
    assert [e.turn_id for e in published] == [turn_id] * 3
    assert published[1].payload["turn_id"] == turn_id


@pytest.mark.parametrize("fails", [False, True])
async def test_conv_27_turn_end_commits_finish(autojump_clock: Any, fails: bool) -> None:
    """CONV-27: a turn ending with no follow-up commits finish: completed or failed,
    run_completed or run_failed, phase terminal (idle only before the first prompt)."""
    step = (
        ScriptedProvider.failure(Error(ErrorClass.TRANSIENT_TRANSPORT, "hiccup"))
        if fails
        else text("ok")
    )
    store = FaultyStore()
    async with conversation_with(ScriptedProvider([step]), store=store) as (conv, timeline):
        assert conv.status().phase == "idle"
        await conv.prompt("hello")
        assert conv.status().phase == "running"
        snapshot = await conv.wait_settled()
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == ("failed" if fails else "completed")
    assert store.acknowledged_kinds()[-1] == "finish"
    assert (await stored_kinds(store))[-1] == "finish"
    assert snapshot.resource_cleanup.status == "confirmed"
    types = [e.type for e in timeline.published()]
    assert types[-1] == ("run_failed" if fails else "run_completed")
    assert types.count("run_failed") + types.count("run_completed") == 1
    assert "run_cancelled" not in types


async def test_conv_29_slow_subscriber_loses_only_transient(autojump_clock: Any) -> None:
    """CONV-29: a subscriber that never reads delays nothing; once its buffer is
    full its transient events are dropped and counted (events_dropped with count
    precedes the next event it gets), every other event is delivered."""
    deltas = [ScriptedProvider.text(f"d{i}")[0] for i in range(12)]
    provider = ScriptedProvider(
        [
            [*deltas, *ScriptedProvider.tool_calls(("c1", "echo", {}))],
            [*deltas, *text("end")],
        ]
    )
    async with conversation_with(provider, [make_tool("echo", RecordingBackend())]) as (
        conversation,
        timeline,
    ):
        slow = conversation.subscribe(buffer=3)
        await conversation.prompt("hello")
        snapshot = await conversation.wait_settled()
        assert trio.current_time() == 0.0  # nothing waited for the slow reader
    assert snapshot.run.state == "completed"
    fast = timeline.published()
    received = [event async for event in slow]
    lost = sum(e.payload["count"] for e in received if e.type == "events_dropped")
    assert lost > 0
    fast_transient = [e for e in fast if e.type in TRANSIENT_EVENTS]
    slow_transient = [
        e for e in received if e.type in TRANSIENT_EVENTS and e.type != "events_dropped"
    ]
    assert len(fast_transient) - len(slow_transient) == lost
    durable = [e for e in fast if e.type not in TRANSIENT_EVENTS]
    assert [e for e in received if e.type not in TRANSIENT_EVENTS] == durable
    for i, event in enumerate(received):
        if event.type == "events_dropped":
            assert i + 1 < len(received)
            assert received[i + 1].type != "events_dropped"


# -- a replacement run continues a transcript (messages=) -----------------------------


async def test_a_new_run_continues_the_committed_messages_of_a_finished_one(
    autojump_clock: Any,
) -> None:
    """A completed run takes no more prompts; its committed messages (tool
    results included) open a new run with ``messages=``, whose first provider
    request carries all of them and then the new prompt, which is not
    resubmitted, and whose stored record holds them from revision 0."""
    store = MemoryStore()
    tool = make_tool("t", RecordingBackend(ToolResult("tool said hi")))
    first = await run_to_settled(
        ScriptedProvider([ScriptedProvider.tool_calls(("c1", "t", {})), text("a1")]),
        [tool],
        store=store,
        run_id="run-1",
    )
    assert first.record.state == "completed"
    earlier = first.snapshot.messages
    assert [m["role"] for m in earlier] == ["user", "assistant", "tool", "assistant"]

    provider = ScriptedProvider([text("a2")])
    async with conversation_with(
        provider, [tool], store=store, run_id="run-2", messages=earlier
    ) as (conversation, _):
        created = await store.load("run-2")
        assert created is not None
        assert created.revision == 0
        assert [thaw(m) for m in created.conversation["messages"]] == [thaw(m) for m in earlier]
        await conversation.prompt("and now?")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    [request] = provider.requests
    sent = [thaw(m) for m in request.messages]
    assert sent[:4] == [thaw(m) for m in earlier]
    assert [m["role"] for m in sent[4:]] == ["user"]
    assert contents(request.messages)[4:] == ["and now?"]
    assert contents(snapshot.messages) == [*contents(earlier), "and now?", "a2"]
    # ids stay unique in the new run: its first message does not take the
    # id of the continued run's first one (both runs are at incarnation 1)
    ids = [m["id"] for m in snapshot.messages if "id" in m]
    assert len(ids) == len(set(ids)) == 2, ids


@pytest.mark.parametrize(
    "messages",
    [
        "hello",
        {"role": "user", "content": "hi"},
        [5],
        [{"content": "no role"}],
        [{"role": 1, "content": "a role that is not a string"}],
        [{"role": "user", "content": math.nan}],
        [{"role": "user", "content": object()}],
    ],
    ids=["str", "mapping", "not-an-object", "no-role", "int-role", "nan", "object"],
)
async def test_bad_messages_are_refused_before_the_store(
    autojump_clock: Any, messages: Any
) -> None:
    """``messages`` that are not a list of message objects with a role, or
    hold something that is not JSON data, raise ``validation`` before any
    store or provider call: no run is created."""
    store = MemoryStore()
    provider = ScriptedProvider([text("never")])
    with pytest.raises(Error) as exc:
        async with open_conversation("run-x", store=store, provider=provider, messages=messages):
            pytest.fail("opened")  # pragma: no cover
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert await store.load("run-x") is None
    assert provider.requests == []


async def test_run_and_messages_together_are_refused(autojump_clock: Any) -> None:
    store = MemoryStore()
    await store.create(RunRecord.new("run-y"))
    with pytest.raises(Error) as exc:
        async with open_conversation(
            "run-y",
            store=store,
            provider=ScriptedProvider([]),
            run=await store.load("run-y"),
            messages=[{"role": "user", "content": "hi"}],
        ):
            pytest.fail("opened")  # pragma: no cover
    assert exc.value.error_class is ErrorClass.VALIDATION


async def test_supplied_provider_tools_reach_the_provider(autojump_clock: Any) -> None:
    """CAT-13 through open_conversation: ``tools=`` (the host's own provider
    tool definitions, same names and schemas as the registry) is what the
    provider is offered; a list naming another tool is refused before the
    store is called."""
    from trio_backplane.tools import ProviderTool

    tool = make_tool("t", RecordingBackend())
    supplied = [ProviderTool("t", "described by the host", tool.schema)]
    provider = ScriptedProvider([text("ok")])
    registry = ToolRegistry([tool])
    async with open_conversation(
        "run-s",
        store=MemoryStore(),
        provider=provider,
        registry=registry,
        authority=granted(registry, "run-s"),
        tools=supplied,  # conversation_with's `tools` are the descriptors
    ) as conversation:
        await conversation.prompt("hi")
        assert (await conversation.wait_settled()).run.state == "completed"
    [request] = provider.requests
    assert [(t.name, t.description) for t in request.tools] == [("t", "described by the host")]

    store = MemoryStore()
    with pytest.raises(Error) as exc:
        async with open_conversation(
            "run-z",
            store=store,
            provider=ScriptedProvider([]),
            registry=registry,
            authority=granted(registry, "run-z"),
            tools=[ProviderTool("other", "", tool.schema)],
        ):
            pytest.fail("opened")  # pragma: no cover
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert exc.value.details["unknown"] == ["other"]
    assert await store.load("run-z") is None


@pytest.mark.parametrize("name", ["prompt", "stop"])
async def test_hooks_that_cannot_be_called_are_refused_up_front(
    autojump_clock: Any, name: str
) -> None:
    """A hooks object whose ``prompt`` or ``stop`` is not callable is refused
    with ``validation`` before the run is created (an absent or ``None`` hook
    is the default, CONV-21)."""
    store = MemoryStore()
    with pytest.raises(Error) as exc:
        async with open_conversation(
            "run-h", store=store, provider=ScriptedProvider([]), hooks=CustomHooks(**{name: 5})
        ):
            pytest.fail("opened")  # pragma: no cover
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert exc.value.details["hook"] == name
    assert await store.load("run-h") is None


async def test_a_refused_first_message_checkpoint_still_settles_the_run(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However the checkpoint of the first message is refused after the
    admission commit (here a kernel refusal injected into it), ``prompt``
    raises that error and the run still settles (``failed``): it is never
    left running with no worker to finish it."""
    from trio_backplane.runtime import _coordinator

    real = _coordinator.transition
    injected = Error(ErrorClass.VALIDATION, "injected refusal")

    def refusing(record: Any, command: Any, **options: Any) -> Any:
        state = command.conversation if isinstance(command, ConversationUpdated) else UNSET
        if state is not UNSET and state.get("turn_id") and command.messages is not UNSET:
            raise injected
        return real(record, command, **options)

    monkeypatch.setattr(_coordinator, "transition", refusing)
    provider = ScriptedProvider([text("never")])
    async with conversation_with(provider) as (conversation, timeline):
        with pytest.raises(Error) as exc:
            await conversation.prompt("hello")
        with trio.fail_after(60):
            snapshot = await conversation.wait_settled()
    assert exc.value is injected
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "failed"
    assert provider.requests == []
    assert [e.type for e in timeline.published()][-1] == "run_failed"


async def test_conv_07_conv_27_a_cancelled_first_prompt_never_leaves_the_run_hanging(
    autojump_clock: Any,
) -> None:
    """CONV-07/CONV-27: a first ``prompt`` cancelled by its caller after the
    admission commit (here during the prompt hook) never leaves the run
    admitted with no worker: its message was not committed, so the turn
    fails ``cancelled`` and the run finishes ``failed``; the caller's
    ``Cancelled`` propagates unchanged and the provider is never called."""

    class SlowHook:
        async def prompt(self, message: Any, context: HookContext) -> Any:
            await trio.sleep(10)
            return message

    provider = ScriptedProvider([text("never")])
    async with conversation_with(provider, hooks=SlowHook()) as (conversation, timeline):
        with trio.move_on_after(1) as scope:
            await conversation.prompt("first")
        assert scope.cancelled_caught
        with trio.fail_after(60):
            snapshot = await conversation.wait_settled()
    assert snapshot.phase == "terminal"
    assert snapshot.run.state == "failed"
    outcome = thaw(snapshot.run.outcome)
    assert outcome["error"]["class"] == "cancelled"
    assert snapshot.messages == ()
    assert provider.requests == []
    types = [event.type for event in timeline.published()]
    assert types.count("run_failed") == 1


async def test_conv_07_a_prompt_cancelled_before_admission_admits_nothing(
    autojump_clock: Any,
) -> None:
    """CONV-07: a first ``prompt`` whose caller is cancelled before the
    admission commit commits nothing; the conversation stays ``idle`` and a
    later prompt runs normally."""
    provider = ScriptedProvider([text("answer")])
    async with conversation_with(provider) as (conversation, _timeline):
        with trio.CancelScope() as scope:
            scope.cancel()
            await conversation.prompt("first")
        status = conversation.status()
        assert (status.phase, status.run.state, status.run.revision) == ("idle", "queued", 0)
        await conversation.prompt("second")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert [m["content"] for m in snapshot.messages if m["role"] == "user"] == ["second"]


def _turn_record(kind: str, record: RunRecord) -> bool:
    """The checkpoint recording a turn's outcome."""
    conversation = record.conversation
    return (
        kind == "conversation_updated"
        and conversation is not None
        and conversation.get("last_turn") is not None
    )


@pytest.mark.parametrize("method", ["follow_up", "steer", "prompt"])
async def test_conv_27_input_acknowledged_as_the_turn_ends_is_never_dropped(
    autojump_clock: Any, method: str
) -> None:
    """CONV-27/CONV-15/CONV-11: input whose commit lands after the worker
    last looked at the queues (its turn-outcome commit in flight) but before
    ``finish`` is never dropped: ``finish`` is decided against the queues as
    committed, so the message starts a new turn and is answered.  Trio
    schedules the racing tasks in either order: several rounds cover both."""
    for round_ in range(6):
        store = FaultyStore(None, Fault("delay", when=_turn_record, delay=1.0))
        provider = ScriptedProvider([text("first answer"), text("second answer")])
        run_id = f"{RUN_ID}-{round_}"
        async with conversation_with(provider, store=store, run_id=run_id) as (conversation, _tl):
            await conversation.prompt("hello")
            while not store.fired:  # the turn-outcome commit is in flight (slow)
                await trio.sleep(0.01)
            await getattr(conversation, method)("and another thing")
            snapshot = await conversation.wait_settled()
        assert snapshot.run.state == "completed"
        assert snapshot.follow_up == ()
        assert snapshot.steering == ()
        assert len(provider.requests) == 2
        last_request = [thaw(m) for m in provider.requests[1].messages]
        users = [m["content"] for m in last_request if m["role"] == "user"]
        assert users[-1] == "and another thing"


async def test_conv_13_steering_arriving_during_the_stop_hook_continues_the_turn(
    autojump_clock: Any,
) -> None:
    """CONV-13/CONV-14: steering committed while the stop hook decides is
    consumed by the same turn (one steering item, then another provider
    attempt and the stop hook again), never left queued by a finished run."""
    stop_calls: list[float] = []

    class SlowStop:
        async def stop(self, turn: Any, context: HookContext) -> Any:
            stop_calls.append(trio.current_time())
            await trio.sleep(1)
            return "stop"

    provider = ScriptedProvider([text("first answer"), text("second answer")])
    async with conversation_with(provider, hooks=SlowStop()) as (conversation, timeline):
        await conversation.prompt("hello")
        while not stop_calls:
            await trio.sleep(0.01)
        await conversation.steer("also this")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert snapshot.steering == ()
    assert len(provider.requests) == 2
    assert len(stop_calls) == 2
    published = timeline.published()
    assert [event.type for event in published].count("turn_completed") == 1  # one turn, steered
    [consumed] = [
        e for e in published if e.type == "prompt_consumed" and e.payload["mode"] == "steering"
    ]
    assert consumed.payload["message"]["content"] == "also this"


async def test_can_14_a_stored_conversation_state_of_any_shape_opens_for_inspection() -> None:
    """CAN-14: a stored run whose conversation state holds something else
    than lists where the runtime keeps them (any mapping the kernel took)
    opens ``recovery_required``, and ``status()`` shows the record as stored
    with those lists empty: it raised a raw ``TypeError``."""
    from trio_backplane.kernel import Command, transition

    store = MemoryStore()
    record = RunRecord.new("odd")
    await store.create(record)
    for kind, data in (
        ("admit", {"state": "running"}),
        ("conversation_updated", {"conversation": {"messages": 5, "steering": 3, "usage": 7}}),
    ):
        new, events = transition(record, Command(kind, at=1.0, input=data))
        await store.commit(
            "odd", incarnation=1, expected_revision=record.revision, record=new, events=events
        )
        record = new
    provider = ScriptedProvider([])
    async with open_conversation("odd", store=store, provider=provider, run=record) as c:
        snapshot = c.status()
        assert snapshot.phase == "recovery_required"
        assert snapshot.run == record
        assert (snapshot.messages, snapshot.steering, snapshot.usage) == ((), (), ())
    assert provider.requests == []


async def test_conv_messages_are_checked_before_the_store_is_called() -> None:
    """API: ``messages=`` is checked before any store call: a message that
    fails when read is ``validation`` (it escaped raw), and an id of the
    runtime's shape with more digits than Python converts is a host's own id
    (it failed the open after the run was created, and the stored run could
    never be opened again)."""

    class Unreadable(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("unreadable")

        def __iter__(self) -> Iterator[str]:
            return iter(["role"])

        def __len__(self) -> int:
            return 1

    store = MemoryStore()
    provider = ScriptedProvider([ScriptedProvider.text("done")])
    with pytest.raises(Error) as raised:
        async with open_conversation("r", store=store, provider=provider, messages=[Unreadable()]):
            pytest.fail("opened")  # pragma: no cover
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert await store.load("r") is None
    huge = {"role": "user", "content": "hi", "id": "msg-1-" + "9" * 5000}
    async with open_conversation("r", store=store, provider=provider, messages=[huge]) as c:
        await c.prompt("go")
        snapshot = await c.wait_settled()
    assert snapshot.run.state == "completed"
    ids = [m["id"] for m in snapshot.messages if "id" in m]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("cause", ["output_limit", "provider_failed"])
async def test_a_failed_run_s_snapshot_carries_its_error(autojump_clock: Any, cause: str) -> None:
    """A run that ends ``failed`` (its provider's output past the limit, or
    a failed provider response) says why in ``snapshot.last_error``, not
    only in its events: the error of its outcome."""
    if cause == "output_limit":
        response = ScriptedProvider.tool_calls(("c1", "t", {"x": "y" * 2_000_000}))
    else:
        response = [ResponseFailed(Error(ErrorClass.TRANSIENT_TRANSPORT, "upstream went away"))]
    async with open_conversation(
        RUN_ID, store=MemoryStore(), provider=ScriptedProvider([response])
    ) as conversation:
        await conversation.prompt("go")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "failed"
    assert snapshot.last_error is not None
    assert snapshot.last_error.to_dict() == thaw(snapshot.run.outcome["error"])
