"""Provider streams and output accounting: the PRV behaviours of BEHAVIOURS.md.

Every test runs on ``MemoryStore`` (wrapped in ``TimelineStore`` so subscriber
events can be ordered against commits) under ``MockClock(autojump_threshold=0)``.
PRV-11 is withdrawn.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.runtime import (
    ProviderRequest,
    ResponseCompleted,
    ResponseFailed,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
    open_conversation,
)
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Raise, ScriptedProvider
from trio_backplane.tools import ProviderTool, ToolResult

from .support import (
    RUN_ID,
    Finished,
    RecordingBackend,
    TimelineStore,
    assert_no_canary,
    make_tool,
    run_to_settled,
    string_schema,
)

SP = ScriptedProvider


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def turn_error(finished: Finished) -> dict[str, Any]:
    """The error of the run's (last) turn, as stored."""
    last_turn = finished.conversation_state["last_turn"]
    assert last_turn is not None
    assert last_turn["status"] == "failed"
    error = last_turn["error"]
    assert error is not None
    return dict(error)


def assert_failed_run(finished: Finished) -> None:
    assert finished.record.state == "failed"
    assert finished.snapshot.phase == "terminal"
    assert finished.types().count("run_failed") == 1
    assert "run_completed" not in finished.types()


class ProbingProvider(ScriptedProvider):
    """Notes the last acknowledged record each time ``stream`` is called."""

    def __init__(self, responses: Any, store: TimelineStore) -> None:
        super().__init__(responses)
        self.store = store
        self.commits_at_call: list[list[str]] = []
        self.records_at_call: list[Any] = []

    def stream(self, request: ProviderRequest, context: Any) -> Any:
        self.commits_at_call.append(self.store.commits())
        self.records_at_call.append(self.store.records[-1])
        return super().stream(request, context)


# -- PRV-01, PRV-02 ----------------------------------------------------------------


async def test_prv_01_request_carries_identity_messages_catalog_and_tools(
    autojump_clock: MockClock,
) -> None:
    """PRV-01: each request carries run_id, incarnation, step_id, attempt_id,
    turn_id, messages, catalog_revision and the pinned catalog's tools."""
    backend = RecordingBackend(ToolResult("ok"))
    tool = make_tool("lookup", backend, schema=string_schema("q"))
    provider = SP([SP.tool_calls(("c1", "lookup", {"q": "x"})), SP.text("done")])
    finished = await run_to_settled(provider, [tool], incarnation=2)

    assert finished.record.state == "completed"
    assert len(provider.requests) == 2
    attempts = sorted(
        (v for k, v in finished.record.intents.items() if k.startswith("provider:")),
        key=lambda intent: intent["started_at"],
    )
    turn_id = finished.snapshot.turn_id
    assert turn_id is not None
    for request, intent in zip(provider.requests, attempts, strict=True):
        assert isinstance(request, ProviderRequest)
        assert request.run_id == RUN_ID
        assert request.incarnation == 2
        assert request.step_id == intent["step_id"]
        assert request.attempt_id == intent["attempt_id"]
        assert request.turn_id == turn_id == intent["turn_id"]
        assert request.catalog_revision == 1
        assert list(request.tools) == [
            ProviderTool("lookup", "the lookup tool", string_schema("q"))
        ]
    assert provider.requests[0].attempt_id != provider.requests[1].attempt_id
    messages = finished.messages
    # first request: the prompt only; second: prompt, assistant tool call, tool result
    assert [m["role"] for m in provider.requests[0].messages] == ["user"]
    assert provider.requests[0].messages[0]["content"] == "hello"
    assert list(provider.requests[1].messages) == [dict_of(m) for m in messages[:3]]
    assert [m["role"] for m in provider.requests[1].messages] == ["user", "assistant", "tool"]


def dict_of(value: Any) -> Any:
    from trio_backplane.kernel import thaw

    return thaw(value)


async def test_prv_02_provider_started_commits_and_reserves_work_before_stream(
    autojump_clock: MockClock,
) -> None:
    """PRV-02: every attempt commits provider_started, reserving one work unit,
    before the adapter's ``stream`` is called."""
    store = TimelineStore(MemoryStore())
    provider = ProbingProvider(
        [SP.tool_calls(("c1", "t", {})), SP.text("done")],
        store,
    )
    backend = RecordingBackend(ToolResult("ok"))
    finished = await run_to_settled(provider, [make_tool("t", backend)], store=store)

    assert finished.record.state == "completed"
    assert len(provider.commits_at_call) == 2
    for call, commits in enumerate(provider.commits_at_call, 1):
        assert commits[-1] == "run.provider_started"
        assert commits.count("run.provider_started") == call
    first, second = provider.records_at_call
    assert first.active_provider is not None
    assert first.budget.used == 1
    assert f"provider:{first.active_provider['attempt_id']}" in first.budget.reservations
    # second attempt: provider 1 + tool 1 + provider 2
    assert second.budget.used == 3
    assert f"provider:{second.active_provider['attempt_id']}" in second.budget.reservations
    # response_started is published after that commit and before stream is called
    timeline = finished.store
    started = timeline.index("commit", lambda k: k == "run.provider_started")
    response_started = timeline.index("event", lambda e: e.type == "response_started")
    assert response_started > started


# -- PRV-03 .. PRV-08 ----------------------------------------------------------------


async def test_prv_03_first_response_completed_ends_the_response(autojump_clock: MockClock) -> None:
    """PRV-03: the first ResponseCompleted ends the response: iteration stops,
    the stream is closed, later events are ignored, the run completes once."""
    provider = SP(
        [
            [
                TextDelta("first"),
                ResponseCompleted(assistant("first")),
                TextDelta("late"),
                ResponseCompleted(assistant("second")),
                Raise(RuntimeError("iterated past the terminal event")),
            ]
        ]
    )
    finished = await run_to_settled(provider)

    assert finished.record.state == "completed"
    assert provider.closed == 1
    assert [m["content"] for m in finished.messages if m["role"] == "assistant"] == ["first"]
    deltas = [e.payload["delta"] for e in finished.of("content_text_delta")]
    assert deltas == ["first"]
    assert finished.types().count("response_completed") == 1
    assert finished.types().count("run_completed") == 1
    assert finished.store.commits().count("run.provider_completed") == 1
    assert finished.store.commits().count("run.finish") == 1


class _ClosingBadly:
    """A stream that completes, then misbehaves when closed: ``mode`` is
    ``"raise"`` (a RuntimeError), ``"error"`` (our Error), ``"hang"`` (never
    returns: cut by effect_timeout) or ``"yield"`` (an async generator that
    yields again while closing)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: list[Any] = []

    def stream(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        if self.mode == "yield":
            return self._generator()
        return self

    async def _generator(self) -> Any:
        try:
            yield ResponseCompleted(assistant("done"))
        finally:
            yield TextDelta("while closing")

    def __aiter__(self) -> Any:
        self._sent = False
        return self

    async def __anext__(self) -> Any:
        if self._sent:
            return TextDelta("after the terminal event")
        self._sent = True
        return ResponseCompleted(assistant("done"))

    async def aclose(self) -> None:
        if self.mode == "raise":
            raise RuntimeError("close failed")
        if self.mode == "error":
            raise Error(ErrorClass.EXECUTION_FAILURE, "close failed")
        if self.mode == "hang":
            await trio.sleep_forever()


@pytest.mark.parametrize("mode", ["raise", "error", "hang", "yield"])
async def test_prv_03_closing_after_the_terminal_event_cannot_fail_the_response(
    autojump_clock: MockClock, mode: str
) -> None:
    """PRV-03: once ``ResponseCompleted`` ended the response, trouble closing
    the stream (an error, a hang cut by effect_timeout, a generator yielding
    again) changes nothing: the response stands and the run completes once."""
    provider = _ClosingBadly(mode)
    finished = await run_to_settled(provider, effect_timeout=2.0)
    assert finished.record.state == "completed"
    assert [m["content"] for m in finished.messages if m["role"] == "assistant"] == ["done"]
    assert finished.types().count("response_completed") == 1
    assert finished.types().count("run_completed") == 1
    assert "response_failed" not in finished.types()


class _HangThenCloseBadly:
    """A stream that never sends a terminal event, and whose ``aclose``
    raises ``ValueError`` (or our ``Error``)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def stream(self, request: Any, context: Any) -> Any:
        return self

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        await trio.sleep_forever()

    async def aclose(self) -> None:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [ValueError("close failed"), Error(ErrorClass.EXECUTION_FAILURE, "close failed")],
    ids=["raw", "classed"],
)
async def test_can_08_a_close_failing_after_effect_timeout_keeps_the_attempt_uncertain(
    autojump_clock: MockClock, error: BaseException
) -> None:
    """CAN-08 (rule 4): a provider attempt cut by ``effect_timeout`` stays
    uncertain even when closing its stream then fails: the close error
    cannot turn the interrupted attempt into a settled failure."""
    finished = await run_to_settled(_HangThenCloseBadly(error), effect_timeout=2.0)
    assert finished.record.state == "unknown_outcome"
    [intent] = finished.record.intents.values()
    assert intent["status"] == "uncertain"


async def test_prv_04_stream_without_terminal_event_fails_the_turn(
    autojump_clock: MockClock,
) -> None:
    """PRV-04: a stream that ends without a terminal event fails the turn."""
    provider = SP([[TextDelta("partial")]])
    finished = await run_to_settled(provider)

    assert_failed_run(finished)
    error = turn_error(finished)
    assert error["message"] == "provider ended without terminal event"
    assert finished.record.provider_result["result"]["error"]["message"] == error["message"]
    assert [m["role"] for m in finished.messages] == ["user"]


async def test_prv_05_non_assistant_terminal_message_is_rejected(autojump_clock: MockClock) -> None:
    """PRV-05: a ResponseCompleted whose role is not "assistant" is rejected
    and never enters the stored transcript."""
    provider = SP([[ResponseCompleted({"role": "user", "content": "IMPOSTOR"})]])
    finished = await run_to_settled(provider)

    assert_failed_run(finished)
    assert turn_error(finished)["class"] == "validation"
    assert [m["content"] for m in finished.messages] == ["hello"]
    assert "IMPOSTOR" not in repr(finished.record.context)
    assert "response_completed" not in finished.types()
    assert finished.types().count("response_failed") == 1


async def test_prv_06_unsupported_event_object_fails_the_turn(autojump_clock: MockClock) -> None:
    """PRV-06: an object that is not a provider event type fails the turn."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP([[{"type": "text", "text": "a dict, not an event"}, *SP.text("x")]])
    finished = await run_to_settled(provider, [make_tool("t", backend)])

    assert_failed_run(finished)
    error = turn_error(finished)
    assert error["message"] == "unsupported normalized provider event"
    assert error["details"] == {"type": "dict"}
    assert "response_completed" not in finished.types()
    assert provider.closed == 1


@pytest.mark.parametrize("how", ["response_failed", "raise"])
async def test_prv_07_failure_commits_completion_then_emits_response_failed(
    autojump_clock: MockClock, how: str
) -> None:
    """PRV-07: ResponseFailed(error), or an Error raised mid-stream, commits the
    provider completion with that error, emits response_failed after the
    commit and fails the turn without running any tool."""
    error = Error(ErrorClass.TRANSIENT_TRANSPORT, "upstream reset", {"status": 502})
    failing = ResponseFailed(error) if how == "response_failed" else Raise(error)
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP([[ToolCallCompleted("c1", "t", {}), failing]])
    finished = await run_to_settled(provider, [make_tool("t", backend)])

    assert_failed_run(finished)
    assert backend.calls == 0
    assert "run.tool_invoked" not in finished.store.commits()
    assert finished.record.provider_result["result"] == {"error": error.to_dict()}
    assert turn_error(finished) == error.to_dict()
    timeline = finished.store
    completion = timeline.index("commit", lambda k: k == "run.provider_completed")
    failed = timeline.index("event", lambda e: e.type == "response_failed")
    assert failed > completion
    assert timeline.timeline[failed][1].payload == {"error": error.to_dict()}
    assert finished.types().count("response_failed") == 1
    assert "response_completed" not in finished.types()


@pytest.mark.parametrize("streamed", [True, False])
async def test_prv_08_duplicate_tool_call_ids_fail_the_turn(
    autojump_clock: MockClock, streamed: bool
) -> None:
    """PRV-08: two completed tool calls with one id fail the turn with
    "duplicate tool call id", and no tool runs."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP([SP.tool_calls(("c1", "t", {"n": 1}), ("c1", "t", {"n": 2}), streamed=streamed)])
    finished = await run_to_settled(provider, [make_tool("t", backend)])

    assert_failed_run(finished)
    assert turn_error(finished)["message"] == "duplicate tool call id"
    assert backend.calls == 0
    assert "run.tool_invoked" not in finished.store.commits()
    assert finished.tool_messages() == []
    assert provider.remaining == 0
    assert len(provider.requests) == 1


async def test_prv_09_terminal_message_tool_calls_run_without_streamed_completions(
    autojump_clock: MockClock,
) -> None:
    """PRV-09: tool-call blocks of the terminal message are executed even when
    no ToolCallCompleted was streamed."""
    backend = RecordingBackend(ToolResult("found"))
    provider = SP([SP.tool_calls(("c1", "lookup", {"q": "trio"}), streamed=False), SP.text("done")])
    finished = await run_to_settled(provider, [make_tool("lookup", backend)])

    assert finished.record.state == "completed"
    assert "tool_call_completed" not in finished.types()
    assert backend.calls == 1
    assert backend.operations[0].tool_call_id == "c1"
    assert backend.operations[0].arguments == {"q": "trio"}
    [tool_message] = finished.tool_messages()
    assert tool_message["tool_call_id"] == "c1"
    assert tool_message["result"]["content"] == "found"


async def test_prv_10_incremental_events_precede_the_completion_commit(
    autojump_clock: MockClock,
) -> None:
    """PRV-10 (with EVT-03..05): incremental events reach subscribers before the
    provider completion commit, and response_completed only after it."""
    provider = SP(
        [
            [
                ThinkingDelta("hmm"),
                TextDelta("hel"),
                Usage({"input_tokens": 4}),
                TextDelta("lo"),
                ResponseCompleted(assistant("hello"), usage={"output_tokens": 2}),
            ]
        ]
    )
    finished = await run_to_settled(provider)

    assert finished.record.state == "completed"
    timeline = finished.store
    completion = timeline.index("commit", lambda k: k == "run.provider_completed")
    incremental = {"content_thinking_delta", "content_text_delta", "usage_updated"}
    positions = [
        i
        for i, (tag, v) in enumerate(timeline.timeline)
        if tag == "event" and v.type in incremental
    ]
    assert len(positions) == 4
    assert all(i < completion for i in positions)
    completed = timeline.index("event", lambda e: e.type == "response_completed")
    assert completed > completion
    assert [(e.type, dict(e.payload)) for e in finished.events if e.type in incremental] == [
        ("content_thinking_delta", {"delta": "hmm", "index": 0}),
        ("content_text_delta", {"delta": "hel", "index": 0}),
        ("usage_updated", {"usage": {"input_tokens": 4}}),
        ("content_text_delta", {"delta": "lo", "index": 0}),
    ]


# -- PRV-12 .. PRV-15: output accounting --------------------------------------------------


async def test_prv_12_output_accounting_restarts_at_every_attempt(
    autojump_clock: MockClock,
) -> None:
    """PRV-12: several tool continuations each below provider_output_limit never
    trip it together."""
    backend = RecordingBackend(ToolResult("ok"))
    # each attempt: 8 bytes of arguments or text; together 24 > 10
    provider = SP(
        [
            SP.tool_calls(("c1", "t", {"a": 12})),
            SP.tool_calls(("c2", "t", {"a": 34})),
            SP.text("12345678"),
        ]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)], provider_output_limit=10)

    assert finished.record.state == "completed"
    assert backend.calls == 2
    assert len(provider.requests) == 3
    assert finished.store.commits().count("run.provider_completed") == 3


@pytest.mark.parametrize(
    ("first", "breach", "size"),
    [
        (TextDelta("12345"), TextDelta("678901"), 11),
        (ThinkingDelta("12345"), ThinkingDelta("678901"), 11),
        (
            ToolCallArgumentsDelta("c1", '{"a":'),
            ToolCallArgumentsDelta("c1", '"123456"}'),
            14,
        ),
    ],
)
async def test_prv_13_output_limit_breach_fails_and_is_not_forwarded(
    autojump_clock: MockClock, first: Any, breach: Any, size: int
) -> None:
    """PRV-13: text, thinking and tool-argument bytes beyond a finite limit fail
    the attempt with resource_conflict "provider output limit exceeded" and
    details {scope, size, limit}; the breaching event is not forwarded."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP(
        [[ToolCallStarted("c1", "t"), first, breach, *SP.tool_calls(("c1", "t", {"a": 1}))]]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)], provider_output_limit=10)

    assert_failed_run(finished)
    error = turn_error(finished)
    assert error == {
        "class": "resource_conflict",
        "message": "provider output limit exceeded",
        "details": {"scope": "provider_response", "size": size, "limit": 10},
    }
    assert finished.record.provider_result["result"]["error"] == error
    forwarded = [
        e.payload["delta"]
        for e in finished.events
        if e.type in ("content_text_delta", "content_thinking_delta", "tool_call_arguments_delta")
    ]
    assert forwarded == [first.text if hasattr(first, "text") else first.delta]
    assert backend.calls == 0


@pytest.mark.parametrize("kind", ["text", "tool_call"])
async def test_prv_13_blocks_sharing_a_key_each_count(autojump_clock: MockClock, kind: str) -> None:
    """PRV-13: blocks of one final message that repeat an index (or a tool
    call id) each count: a thousand 10-byte blocks cannot pass a 100-byte
    limit as one block, and nothing of them is committed."""
    if kind == "text":
        blocks = [{"type": "text", "text": "C" * 10, "index": 0} for _ in range(1000)]
    else:
        blocks = [
            {"type": "tool_call", "id": "c1", "name": "t", "arguments": {"a": "x" * 10}}
            for _ in range(1000)
        ]
    provider = SP([[ResponseCompleted(assistant(blocks))]])
    finished = await run_to_settled(
        provider, [make_tool("t", RecordingBackend(ToolResult("ok")))], provider_output_limit=100
    )
    assert_failed_run(finished)
    assert turn_error(finished)["message"] == "provider output limit exceeded"
    assert [m["role"] for m in finished.messages] == ["user"]


async def test_prv_14_a_block_counts_once_as_the_larger_of_deltas_and_snapshot(
    autojump_clock: MockClock,
) -> None:
    """PRV-14: a block counts once, as the larger of its summed deltas and its
    largest snapshot (a final message repeating streamed text does not double
    it), and usage fields are not counted."""
    big_usage = {"input_tokens": 10**9, "note": "u" * 500}
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP(
        [
            # tool arguments: deltas 10 bytes, ToolCallCompleted and block snapshots 10 bytes
            [
                ToolCallStarted("c1", "t"),
                ToolCallArgumentsDelta("c1", '{"a":'),
                ToolCallArgumentsDelta("c1", '"xy"}'),
                ToolCallCompleted("c1", "t", {"a": "xy"}),
                Usage(big_usage),
                ResponseCompleted(
                    assistant(
                        [{"type": "tool_call", "id": "c1", "name": "t", "arguments": {"a": "xy"}}]
                    ),
                    usage=big_usage,
                ),
            ],
            # text: deltas 10 bytes, final message repeats it (snapshot 10 bytes)
            [TextDelta("hello"), TextDelta("world"), ResponseCompleted(assistant("helloworld"))],
        ]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)], provider_output_limit=10)
    assert finished.record.state == "completed"
    assert backend.calls == 1

    # the larger of the two counts: 3 bytes of deltas, an 11-byte snapshot
    provider = SP([[TextDelta("abc"), ResponseCompleted(assistant("abcdefghijk"))]])
    finished = await run_to_settled(provider, provider_output_limit=10)
    assert_failed_run(finished)
    assert turn_error(finished)["details"] == {
        "scope": "provider_response",
        "size": 11,
        "limit": 10,
    }


async def test_prv_14_thinking_then_text_message_is_not_double_counted(
    autojump_clock: MockClock,
) -> None:
    """PRV-14: a terminal message repeating a streamed thinking block and a
    streamed text block (each at index 0 of its kind) counts each block once:
    3 + 5 bytes fit a limit of 8."""
    message = assistant(
        [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "hello"}]
    )
    provider = SP([[ThinkingDelta("hmm"), TextDelta("hello"), ResponseCompleted(message)]])
    finished = await run_to_settled(provider, provider_output_limit=8)
    assert finished.record.state == "completed"

    provider = SP([[ThinkingDelta("hmm"), TextDelta("hello"), ResponseCompleted(message)]])
    finished = await run_to_settled(provider, provider_output_limit=7)
    assert_failed_run(finished)
    assert turn_error(finished)["details"]["size"] == 8


async def test_prv_15_text_indexes_count_separately_in_utf8_bytes(
    autojump_clock: MockClock,
) -> None:
    """PRV-15: text blocks at different ``index`` values count separately, and
    text counts UTF-8 bytes ("é" counts 2)."""
    # "ééé" is 3 characters but 6 bytes
    provider = SP([[TextDelta("ééé"), ResponseCompleted(assistant("ééé"))]])
    finished = await run_to_settled(provider, provider_output_limit=5)
    assert_failed_run(finished)
    assert turn_error(finished)["details"]["size"] == 6

    # the same 6 bytes fit a limit of 6
    provider = SP([[TextDelta("ééé"), ResponseCompleted(assistant("ééé"))]])
    finished = await run_to_settled(provider, provider_output_limit=6)
    assert finished.record.state == "completed"

    # two indexes: 6 + 5 bytes; a repeated block at one index would be 6
    provider = SP(
        [
            [
                TextDelta("ééé", index=0),
                TextDelta("abcde", index=1),
                ResponseCompleted(
                    assistant([{"type": "text", "text": "ééé"}, {"type": "text", "text": "abcde"}])
                ),
            ]
        ]
    )
    finished = await run_to_settled(provider, provider_output_limit=10)
    assert_failed_run(finished)
    assert turn_error(finished)["details"]["size"] == 11
    assert [e.payload["index"] for e in finished.of("content_text_delta")] == [0]


# -- PRV-16, PRV-17 ----------------------------------------------------------------------


async def test_prv_16_usage_is_appended_verbatim_and_never_counts_as_work(
    autojump_clock: MockClock,
) -> None:
    """PRV-16: usage from Usage events and the terminal event is appended
    verbatim, no field is invented, and usage never counts against work."""
    streamed = {"input_tokens": 12, "cache": {"hit": True}}
    final = {"output_tokens": 3}
    provider = SP([[Usage(streamed), TextDelta("ok"), ResponseCompleted(assistant("ok"), final)]])
    finished = await run_to_settled(provider, work=1)

    assert finished.record.state == "completed"
    assert dict_of(finished.conversation_state["usage"]) == [streamed, final]
    assert [dict_of(u) for u in finished.snapshot.usage] == [streamed, final]
    assert finished.record.budget.used == 1
    assert finished.record.budget.quota == 1
    [updated] = finished.of("usage_updated")
    assert dict_of(updated.payload["usage"]) == streamed


async def test_prv_16_no_usage_reported_means_none_stored(autojump_clock: MockClock) -> None:
    """PRV-16: without usage from the provider, none is invented."""
    finished = await run_to_settled(SP([SP.text("ok")]))
    assert finished.record.state == "completed"
    assert list(finished.conversation_state["usage"]) == []
    assert finished.of("response_completed")[0].payload["usage"] is None


async def test_prv_17_terminal_blocks_are_authoritative_over_streamed_calls(
    autojump_clock: MockClock,
) -> None:
    """PRV-17: tool-call blocks of the terminal message are authoritative, and
    streamed ToolCallCompleted calls are not executed again."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP(
        [
            [
                ToolCallCompleted("c1", "t", {"v": "streamed"}),
                ToolCallCompleted("c2", "t", {"v": "streamed"}),
                ResponseCompleted(
                    assistant(
                        [
                            {"type": "tool_call", "id": "c2", "name": "t", "arguments": {"v": "b"}},
                            {"type": "tool_call", "id": "c1", "name": "t", "arguments": {"v": "a"}},
                        ]
                    )
                ),
            ],
            SP.text("done"),
        ]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)])

    assert finished.record.state == "completed"
    assert [(op.tool_call_id, op.arguments) for op in backend.operations] == [
        ("c2", {"v": "b"}),
        ("c1", {"v": "a"}),
    ]
    assert [m["tool_call_id"] for m in finished.tool_messages()] == ["c2", "c1"]


async def test_prv_17_without_blocks_streamed_calls_run_in_completion_order(
    autojump_clock: MockClock,
) -> None:
    """PRV-17: without tool-call blocks the incrementally completed calls run,
    in completion order."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = SP(
        [
            [
                ToolCallStarted("c1", "t", index=0),
                ToolCallStarted("c2", "t", index=1),
                ToolCallCompleted("c2", "t", {"n": 2}),
                ToolCallCompleted("c1", "t", {"n": 1}),
                ResponseCompleted(assistant("calling tools")),
            ],
            SP.text("done"),
        ]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)])

    assert finished.record.state == "completed"
    assert [(op.tool_call_id, op.arguments) for op in backend.operations] == [
        ("c2", {"n": 2}),
        ("c1", {"n": 1}),
    ]


async def test_prv_17_duplicates_are_judged_within_the_chosen_source(
    autojump_clock: MockClock,
) -> None:
    """PRV-17: duplicate ids among the ignored streamed calls do not fail a turn
    whose terminal blocks are distinct; duplicate blocks do, even when the
    streamed calls are distinct."""
    backend = RecordingBackend(ToolResult("ok"))
    blocks = [
        {"type": "tool_call", "id": "c1", "name": "t", "arguments": {}},
        {"type": "tool_call", "id": "c2", "name": "t", "arguments": {}},
    ]
    provider = SP(
        [
            [
                ToolCallCompleted("c1", "t", {}),
                ToolCallCompleted("c1", "t", {}),
                ResponseCompleted(assistant(blocks)),
            ],
            SP.text("done"),
        ]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)])
    assert finished.record.state == "completed"
    assert [op.tool_call_id for op in backend.operations] == ["c1", "c2"]

    backend = RecordingBackend(ToolResult("ok"))
    provider = SP(
        [
            [
                ToolCallCompleted("c1", "t", {}),
                ToolCallCompleted("c2", "t", {}),
                ResponseCompleted(assistant([blocks[0], blocks[0]])),
            ]
        ]
    )
    finished = await run_to_settled(provider, [make_tool("t", backend)])
    assert_failed_run(finished)
    assert turn_error(finished)["message"] == "duplicate tool call id"
    assert backend.calls == 0


# -- PRV-18 ------------------------------------------------------------------------------

PROVIDER_CANARY = "canary-provider-7f3a9c"
BACKEND_CANARY = "canary-backend-b41e2d"


async def test_prv_18_trusted_contexts_never_reach_store_events_or_requests(
    autojump_clock: MockClock,
) -> None:
    """PRV-18 (and TOOL-10): provider_context and backend_context contents never
    appear in a stored record, the stored event log, a subscriber event or a
    provider request, on MemoryStore (the check is ``support.assert_no_canary``)."""
    provider_context = {"api_key": PROVIDER_CANARY}
    backend_context = {"token": BACKEND_CANARY}

    async def echo(operation: Any) -> ToolResult:
        assert operation.backend_context == backend_context
        operation.context.emit({"progress": 50})
        return ToolResult("done", structured_content={"ok": True})

    backend = RecordingBackend(echo)
    tool = make_tool("t", backend, backend_context=backend_context)
    provider = SP([SP.tool_calls(("c1", "t", {"q": "x"})), SP.text("done")])
    store = MemoryStore()
    finished = await run_to_settled(
        provider, [tool], store=store, provider_context=provider_context
    )

    assert finished.record.state == "completed"
    # the trusted contexts were delivered where they belong...
    assert provider.contexts == [provider_context, provider_context]
    assert backend.operations[0].backend_context == backend_context
    assert finished.of("tool_update")
    # ...and nowhere else
    await assert_no_canary(
        store,
        RUN_ID,
        [PROVIDER_CANARY, BACKEND_CANARY],
        events=finished.events,
        requests=provider.requests,
    )


async def test_prv_18_canary_check_detects_a_leak(autojump_clock: MockClock) -> None:
    """PRV-18: the canary check itself fails when a canary is stored."""
    provider = SP([SP.text(PROVIDER_CANARY)])
    store = MemoryStore()
    finished = await run_to_settled(provider, store=store)
    with pytest.raises(AssertionError, match="canary leaked"):
        await assert_no_canary(store, RUN_ID, [PROVIDER_CANARY], events=finished.events)


class _Returns:
    """A provider whose ``stream`` returns ``value`` (made by ``make``)."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def stream(self, request: Any, context: Any) -> Any:
        return self.make()


async def _coroutine() -> Any:
    return ScriptedProvider.text("never")  # pragma: no cover - never awaited


@pytest.mark.parametrize(
    "make",
    [list, lambda: None, _coroutine, lambda: ScriptedProvider.text("x")],
    ids=["list", "None", "coroutine", "list-of-events"],
)
async def test_prv_04_stream_that_is_not_an_async_iterator_fails_the_turn(
    autojump_clock: MockClock, make: Any, recwarn: pytest.WarningsRecorder
) -> None:
    """PRV-04: a provider whose ``stream`` returns something other than an
    async iterator (an ``async def`` that returns, a list, ``None``) fails the
    turn with ``execution_failure`` naming what it returned; a coroutine it
    returned is closed, never left un-awaited."""
    finished = await run_to_settled(_Returns(make))
    assert finished.record.state == "failed"
    error = finished.record.outcome["error"]
    assert (error["class"], error["message"]) == (
        "execution_failure",
        "provider stream must be an async iterator",
    )
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        (
            [ResponseCompleted({"role": "assistant", "content": math.nan})],
            "provider response is not JSON data",
        ),
        (
            [
                ResponseCompleted(
                    {"role": "assistant", "content": [{"type": "text", "text": object()}]}
                )
            ],
            "provider response is not JSON data",
        ),
        (
            [Usage({"tokens": object()}), ResponseCompleted({"role": "assistant", "content": "x"})],
            "provider usage is not JSON data",
        ),
        (
            [ResponseCompleted({"role": "assistant", "content": "x"}, usage={"t": math.inf})],
            "provider usage is not JSON data",
        ),
        (
            [
                ToolCallCompleted("c1", math.nan, {}),
                ResponseCompleted({"role": "assistant", "content": ""}),
            ],
            "provider tool call needs a str id and name",
        ),
        (
            [
                ResponseCompleted(
                    {"role": "assistant", "content": [{"type": "tool_call", "id": 5, "name": "t"}]}
                )
            ],
            "provider tool call needs a str id and name",
        ),
    ],
    ids=["nan-content", "object-block", "usage-event", "usage-nan", "call-name", "call-id"],
)
async def test_prv_05_a_response_that_cannot_be_committed_fails_the_turn(
    autojump_clock: MockClock, steps: list[Any], message: str
) -> None:
    """PRV-05: a terminal message, a usage report or a tool call the runtime
    cannot commit (not JSON data; a call without a str id and name) fails
    the attempt and the turn with ``validation``, committed like any failed
    attempt; it never escapes the conversation, and nothing of it is stored
    (usage that is not JSON data is dropped)."""
    finished = await run_to_settled(SP([steps, SP.text("never")]))
    assert_failed_run(finished)
    error = turn_error(finished)
    assert (error["class"], error["message"]) == ("validation", message)
    assert finished.record.provider_result["result"]["error"]["message"] == message
    assert [m["role"] for m in finished.messages] == ["user"]
    assert finished.snapshot.usage == ()


@pytest.mark.parametrize("error", [None, "timeout", ValueError("raw"), {"class": "x"}])
async def test_prv_04_response_failed_without_a_classed_error(
    autojump_clock: MockClock, error: Any
) -> None:
    """PRV-04: a provider whose ``ResponseFailed`` carries something other
    than an ``Error`` fails the turn all the same, classed
    ``execution_failure`` naming what it carried; the conversation does not
    crash."""
    from trio_backplane.runtime import ResponseFailed

    finished = await run_to_settled(SP([[ResponseFailed(error)]]))
    assert_failed_run(finished)
    failure = turn_error(finished)
    assert (failure["class"], failure["message"]) == (
        "execution_failure",
        "provider failed without a classed error",
    )
    assert failure["details"] == {"type": type(error).__name__}


# -- streams that misbehave --------------------------------------------------------------


class _Stream:
    """A provider whose ``stream`` returns what ``make(request)`` builds."""

    def __init__(self, make: Any) -> None:
        self.make = make

    def stream(self, request: Any, context: Any) -> Any:
        return self.make(request)


@pytest.mark.parametrize("cut", ["cancel", "effect_timeout"])
async def test_can_03_a_stream_whose_own_nursery_fails_when_cut_leaves_the_block_quietly(
    autojump_clock: MockClock, cut: str
) -> None:
    """CAN-03, KER-10, CAN-18: a stream running a helper task in its own
    nursery (as HTTP clients do), which raises while being cancelled, gives
    a group of the cancellation and that error: the run settles
    ``unknown_outcome`` and leaving the block raises nothing (the group
    escaped as ``execution_failure``)."""

    async def events(request: Any) -> Any:
        async def reader() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise ConnectionResetError("peer went away")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.sleep_forever()
        yield ResponseCompleted(assistant("never"))  # pragma: no cover

    store = MemoryStore()
    async with open_conversation(
        RUN_ID, store=store, provider=_Stream(events), effect_timeout=5.0
    ) as conversation:
        await conversation.prompt("hi")
        if cut == "cancel":
            await trio.sleep(1)
            await conversation.cancel()
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"


@pytest.mark.parametrize("field", ["id", "name"])
async def test_prv_05_a_streamed_tool_call_that_cannot_be_committed_fails_the_turn(
    autojump_clock: MockClock, field: str
) -> None:
    """PRV-05: a streamed tool call whose id or name holds a lone surrogate
    (a naive adapter of a server's ``"\\ud800"``) fails the attempt and the
    turn with ``validation``; it never escapes the conversation."""
    call = {"id": "c1", "name": "t", field: "a\ud800b"}

    async def events(request: Any) -> Any:
        yield ToolCallCompleted(call["id"], call["name"], {})
        yield ResponseCompleted(assistant([]))

    tool = make_tool("t", RecordingBackend(ToolResult("ok")))
    finished = await run_to_settled(_Stream(events), [tool])
    assert finished.record.state == "failed"
    assert turn_error(finished)["class"] == "validation"


async def test_prv_03_the_iterator_of_an_iterable_stream_is_the_one_closed(
    autojump_clock: MockClock,
) -> None:
    """PRV-03, CAN-18: a stream that is an async iterable (an SDK's response
    object, whose ``__aiter__`` makes an iterator) has that iterator closed
    once its terminal event arrived, and the iterable's own ``aclose`` run:
    the iterator's cleanup ran late, from the garbage collector."""
    closed: list[str] = []

    class Response:
        def __aiter__(self) -> Any:
            return self.events()

        async def events(self) -> Any:
            try:
                yield ResponseCompleted(assistant("hi"))
                yield ResponseCompleted(assistant("never"))  # pragma: no cover
            finally:
                closed.append("iterator")

        async def aclose(self) -> None:
            closed.append("response")

    finished = await run_to_settled(_Stream(lambda request: Response()))
    assert finished.record.state == "completed"
    assert closed == ["iterator", "response"]


async def test_prv_18_a_credential_quoted_by_a_provider_failure_is_never_stored(
    autojump_clock: MockClock,
) -> None:
    """PRV-18: a provider failure quoting a credential of its
    ``provider_context`` (an HTTP error echoing ``?key=...``), raised or
    reported, is committed and published with the credential redacted."""

    async def raises(request: Any) -> Any:
        raise ConnectionError(f"GET https://api.test/v1?key={PROVIDER_CANARY} failed")
        yield  # pragma: no cover

    async def reports(request: Any) -> Any:
        yield ResponseFailed(
            Error(ErrorClass.TRANSIENT_TRANSPORT, "refused", {"url": f"?key={PROVIDER_CANARY}"})
        )

    for events in (raises, reports):
        store = MemoryStore()
        finished = await run_to_settled(
            _Stream(events), store=store, provider_context={"api_key": PROVIDER_CANARY}
        )
        assert finished.record.state == "failed"
        assert "[redacted]" in str(turn_error(finished))
        await assert_no_canary(store, RUN_ID, [PROVIDER_CANARY], events=finished.events)


async def test_prv_05_prv_13_the_terminal_message_checked_is_the_one_committed(
    autojump_clock: MockClock,
) -> None:
    """PRV-05, PRV-13: the terminal message is copied when it arrives and
    the copy is checked and committed: a mapping whose ``get`` disagrees with
    its items no longer passes a ``user`` message, 1000 bytes long, past a
    10-byte output limit."""

    class TwoFaced(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            return {"role": "assistant", "content": ""}.get(key, dict.get(self, key, default))

    async def events(request: Any) -> Any:
        yield ResponseCompleted(TwoFaced(role="user", content="x" * 1000))

    finished = await run_to_settled(_Stream(events), provider_output_limit=10)
    assert finished.record.state == "failed"
    assert [m["role"] for m in finished.messages] == ["user"]
    assert len(finished.messages[0]["content"]) < 1000


async def test_prv_05_failures_of_the_terminal_event_are_classed_as_what_they_are(
    autojump_clock: MockClock,
) -> None:
    """PRV-05: a terminal event without a message is a message that is not
    an assistant's (not a stream "without terminal event"); a streamed
    tool call whose arguments are not JSON data is ``validation`` (it was
    ``execution_failure``, "provider stream failed")."""

    async def no_message(request: Any) -> Any:
        yield ResponseCompleted(None)  # type: ignore[arg-type]

    async def not_json(request: Any) -> Any:
        yield ToolCallCompleted("c1", "t", {"x": math.nan})
        yield ResponseCompleted(assistant([]))

    finished = await run_to_settled(_Stream(no_message))
    assert turn_error(finished)["message"] == "provider message role must be assistant"
    finished = await run_to_settled(_Stream(not_json))
    error = turn_error(finished)
    assert (error["class"], error["message"]) == (
        "validation",
        "provider tool call is not JSON data",
    )


async def test_prv_18_tool_10_credentials_are_redacted_however_they_are_quoted(
    autojump_clock: MockClock,
) -> None:
    """PRV-18, TOOL-10: a credential that JSON escapes (a PEM key with its
    newlines, a quote, a backslash), one cut short by the bound on a quoted
    cause, and a tool's ``backend_context`` token quoted by its refusal are
    all redacted from what is committed and published."""
    pem = f"-----BEGIN PRIVATE KEY-----\nMIIE{PROVIDER_CANARY}\n-----END PRIVATE KEY-----"
    for secret, text in (
        (pem, f"handshake failed for key {pem}"),
        ('pa"ss\\w0rd-' + PROVIDER_CANARY, 'auth "pa\\"ss" failed'),
        (PROVIDER_CANARY, "x" * 480 + f" key={PROVIDER_CANARY} rejected"),
    ):

        async def raises(request: Any, text: str = text, secret: str = secret) -> Any:
            raise ConnectionError(text if secret in text else f"{text} {secret}")
            yield  # pragma: no cover

        store = MemoryStore()
        finished = await run_to_settled(
            _Stream(raises), store=store, provider_context={"credential": secret}
        )
        assert finished.record.state == "failed"
        await assert_no_canary(store, RUN_ID, [PROVIDER_CANARY], events=finished.events)

    async def refuses(operation: Any) -> Any:
        raise Error(
            ErrorClass.FORBIDDEN, f"token {BACKEND_CANARY} refused", {"token": BACKEND_CANARY}
        )

    tool = make_tool(
        "t", RecordingBackend(refuses), read_only=True, backend_context={"token": BACKEND_CANARY}
    )
    store = MemoryStore()
    finished = await run_to_settled(
        SP([SP.tool_calls(("c1", "t", {"q": "x"})), SP.text("done")]), [tool], store=store
    )
    assert finished.record.state == "completed"
    await assert_no_canary(store, RUN_ID, [BACKEND_CANARY], events=finished.events)


async def test_prv_03_every_part_of_a_stream_is_closed_whatever_fails(
    autojump_clock: MockClock,
) -> None:
    """PRV-03: the iterable a provider returned is closed when its
    ``__aiter__`` is an ``async def`` (no iterator: the attempt fails,
    classed) and when its iterator's ``aclose`` fails (each closer runs)."""
    closed: list[str] = []

    class AsyncAiter:
        async def __aiter__(self) -> Any:  # a mistake: __aiter__ must not be async
            return self  # pragma: no cover

        async def aclose(self) -> None:
            closed.append("async-aiter")

    class FailingIteratorClose:
        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:
            return ResponseCompleted(assistant("hi"))

        async def aclose(self) -> None:
            raise OSError("already closed")

    class Wrapper:
        def __init__(self) -> None:
            self.inner = FailingIteratorClose()

        def __aiter__(self) -> Any:
            return self.inner

        async def aclose(self) -> None:
            closed.append("wrapper")

    finished = await run_to_settled(_Stream(lambda request: AsyncAiter()))
    assert finished.record.state == "failed"
    assert turn_error(finished)["message"] == "provider stream must be an async iterator"
    finished = await run_to_settled(_Stream(lambda request: Wrapper()))
    assert finished.record.state == "completed"
    assert closed == ["async-aiter", "wrapper"]


async def test_prv_18_the_names_of_credentials_are_kept_only_their_values_redacted(
    autojump_clock: MockClock,
) -> None:
    """PRV-18: redaction looks for the values of ``provider_context``, not
    its keys: a 401 body "Incorrect api_key provided: <key>" keeps the word
    ``api_key`` and loses the key."""

    async def reports(request: Any) -> Any:
        yield ResponseFailed(
            Error(ErrorClass.FORBIDDEN, f"Incorrect api_key provided: {PROVIDER_CANARY}")
        )

    store = MemoryStore()
    finished = await run_to_settled(
        _Stream(reports), store=store, provider_context={"api_key": PROVIDER_CANARY}
    )
    assert turn_error(finished)["message"] == "Incorrect api_key provided: [redacted]"
    await assert_no_canary(store, RUN_ID, [PROVIDER_CANARY], events=finished.events)
