"""The tool gateway, results and settlement: the TOOL behaviours of BEHAVIOURS.md.

Conversations run on ``MemoryStore`` (wrapped in ``TimelineStore``) under
``MockClock(autojump_threshold=0)``; ``reject``, ``authorize`` and
``settlement`` are also checked directly where a behaviour is about them.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import thaw
from trio_backplane.recovery import recover
from trio_backplane.runtime import open_conversation
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import (
    IDENTITY_FIELDS,
    Authority,
    Invocation,
    Rejection,
    ToolRegistry,
    ToolResult,
    authorize,
    reject,
    settlement,
)

from .support import (
    RUN_ID,
    Fault,
    FaultyStore,
    Finished,
    RecordingBackend,
    TimelineStore,
    Unreadable,
    assert_no_canary,
    conversation_with,
    granted,
    make_tool,
    run_to_settled,
    string_schema,
)

SP = ScriptedProvider


def calls_then_done(*calls: tuple[str, str, Any]) -> ScriptedProvider:
    """One response calling ``calls``, then a final text response."""
    return SP([SP.tool_calls(*calls), SP.text("done")])


def error_of(message: Any) -> dict[str, Any]:
    result = message["result"]
    assert result["is_error"] is True
    return dict(thaw(result["error"]))


def assert_continued(finished: Finished, provider: ScriptedProvider, attempts: int = 2) -> None:
    """The provider was asked again after the tool and the run completed."""
    assert finished.record.state == "completed"
    assert len(provider.requests) == attempts
    assert provider.remaining == 0
    assert finished.types().count("run_completed") == 1
    assert not finished.record.active_tools


def assert_uncertain_stop(
    finished: Finished, backend: RecordingBackend, provider: ScriptedProvider
) -> str:
    """TOOL-14/16/17/18: the run ended unknown_outcome, keeping the intent (status
    "uncertain") and the active tool as evidence; the provider was not asked again.
    Returns the invocation id."""
    assert backend.calls == 1
    record = finished.record
    assert record.state == "unknown_outcome"
    assert finished.snapshot.phase == "terminal"
    invocation_id = backend.operations[0].invocation_id
    assert invocation_id in record.active_tools
    assert record.intents[f"tool:{invocation_id}"]["status"] == "uncertain"
    assert invocation_id not in record.tool_results
    assert len(provider.requests) == 1
    assert provider.remaining == 1
    [cancelled] = finished.of("run_cancelled")
    assert cancelled.payload["state"] == "unknown_outcome"
    assert "run_completed" not in finished.types()
    assert "run_failed" not in finished.types()
    assert finished.tool_messages() == []
    # run_cancelled comes after the cleanup_settled commit
    timeline = finished.store
    assert timeline.index("event", lambda e: e.type == "run_cancelled") > timeline.index(
        "commit", lambda k: k == "run.cleanup_settled"
    )
    return str(invocation_id)


# -- TOOL-01 .. TOOL-05 ---------------------------------------------------------------


async def test_tool_01_calls_run_one_after_another_after_each_result_commit(
    autojump_clock: MockClock,
) -> None:
    """TOOL-01: the calls of one response run strictly in call order, and a
    backend starts only after the previous call's result is committed."""
    store = TimelineStore(MemoryStore())
    running = 0
    overlap = 0

    async def slow(operation: Any) -> ToolResult:
        nonlocal running, overlap
        running += 1
        overlap = max(overlap, running)
        await trio.sleep(3)
        running -= 1
        return ToolResult(operation.tool_call_id)

    backend = RecordingBackend(slow, store=store)
    provider = calls_then_done(("c1", "t", {"n": 1}), ("c2", "t", {"n": 2}), ("c3", "t", {"n": 3}))
    finished = await run_to_settled(provider, [make_tool("t", backend)], store=store)

    assert_continued(finished, provider)
    assert overlap == 1
    assert [op.tool_call_id for op in backend.operations] == ["c1", "c2", "c3"]
    previous = [op.invocation_id for op in backend.operations]
    for index, record in enumerate(backend.records_at_call):
        assert record is not None
        assert set(record.tool_results) == set(previous[:index])
        assert list(record.active_tools) == [previous[index]]
    assert [m["tool_call_id"] for m in finished.tool_messages()] == ["c1", "c2", "c3"]
    commits = finished.store.commits()
    first_completed = commits.index("run.tool_completed")
    assert commits.count("run.tool_invoked") == 3
    assert commits.index("run.tool_invoked", first_completed) > first_completed


async def test_tool_02_unknown_tool_gives_not_found_without_backend_call(
    autojump_clock: MockClock,
) -> None:
    """TOOL-02: a tool absent from the pinned catalog yields an is_error tool
    message (not_found, "tool is not registered") and no backend call."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = calls_then_done(("c1", "missing", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend)])

    assert_continued(finished, provider)
    assert backend.calls == 0
    assert "run.tool_invoked" not in finished.store.commits()
    [message] = finished.tool_messages()
    assert message["tool_call_id"] == "c1"
    assert message["name"] == "missing"
    error = error_of(message)
    assert (error["class"], error["message"]) == ("not_found", "tool is not registered")
    assert finished.record.budget.used == 2


async def test_tool_03_schema_failure_gives_validation_result_without_backend_call(
    autojump_clock: MockClock,
) -> None:
    """TOOL-03: arguments failing the schema yield an is_error result of class
    validation, and the backend is never called."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = calls_then_done(("c1", "t", {"x": 5}))
    finished = await run_to_settled(provider, [make_tool("t", backend, schema=string_schema("x"))])

    assert_continued(finished, provider)
    assert backend.calls == 0
    assert "run.tool_invoked" not in finished.store.commits()
    [message] = finished.tool_messages()
    error = error_of(message)
    assert error["class"] == "validation"
    assert message["result"]["content"] == error["message"]


async def test_tool_03_arguments_sent_as_json_text(autojump_clock: MockClock) -> None:
    """TOOL-03: arguments a provider sends as JSON text are parsed, then
    validated like any others; text that is not JSON is an is_error
    validation result, with no backend call and no intent committed."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = calls_then_done(
        ("c1", "t", '{"x": "a"}'),
        ("c2", "t", '{"x": '),
        ("c3", "t", '{"x": NaN}'),
        ("c4", "t", "[" * 100_000 + "]" * 100_000),  # too deep for Python's parser
    )
    finished = await run_to_settled(provider, [make_tool("t", backend, schema=string_schema("x"))])

    assert_continued(finished, provider)
    assert [op.arguments for op in backend.operations] == [{"x": "a"}]
    assert finished.store.commits().count("run.tool_invoked") == 1
    first, *refused = finished.tool_messages()
    assert first["result"]["is_error"] is False
    for message in refused:  # not JSON, NaN (not JSON either), nested past any parser
        error = error_of(message)
        assert (error["class"], error["message"]) == ("validation", "tool arguments are not JSON")


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "mutating"])
async def test_tool_12_result_that_is_not_json_data(
    autojump_clock: MockClock, read_only: bool
) -> None:
    """TOOL-12: like an oversize one, a result holding something that is not
    JSON data (NaN, an object, a mapping that fails when read) becomes an
    is_error validation result after
    the backend ran once; the effect is known to have completed, so the
    provider continues whatever the descriptor, and nothing unencodable is
    committed."""
    backend = RecordingBackend(
        ToolResult("ok", {"v": float("nan")}),
        ToolResult("ok", {"o": object()}),
        ToolResult("ok", Unreadable()),
    )
    provider = calls_then_done(("c1", "t", {}), ("c2", "t", {}), ("c3", "t", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend, read_only=read_only)])

    assert_continued(finished, provider)
    assert backend.calls == 3
    for message in finished.tool_messages():
        error = error_of(message)
        assert (error["class"], error["message"]) == ("validation", "tool result is not JSON data")
    stored = list(finished.record.tool_results.values())
    assert len(stored) == 3
    assert all(r["is_error"] and r["structured_content"] is None for r in stored)


async def test_tool_04_backend_receives_arguments_unchanged(autojump_clock: MockClock) -> None:
    """TOOL-04: no default inserted, nothing coerced, no property removed."""
    schema = {
        "type": "object",
        "properties": {
            "count": {"type": ["integer", "string"], "default": 1},
            "mode": {"type": "string", "default": "fast"},
            "nested": {"type": "object", "properties": {"flag": {"default": True}}},
        },
    }
    arguments = {"count": "5", "nested": {}, "extra": [1, 2.5, None, {"k": "v"}]}
    backend = RecordingBackend(ToolResult("ok"))
    provider = calls_then_done(("c1", "t", arguments))
    finished = await run_to_settled(provider, [make_tool("t", backend, schema=schema)])

    assert_continued(finished, provider)
    received = backend.operations[0].arguments
    assert received == {"count": "5", "nested": {}, "extra": [1, 2.5, None, {"k": "v"}]}
    assert type(received["count"]) is str
    assert "mode" not in received
    assert "flag" not in received["nested"]


async def test_tool_04_no_subscriber_can_edit_the_arguments(autojump_clock: MockClock) -> None:
    """TOOL-04: the arguments a ``tool_started`` event carries are a
    read-only copy: a subscriber "redacting" them in place gets a
    ``TypeError`` and neither the backend nor another subscriber sees an
    edit."""
    arguments = {"user": "ann", "password": "hunter2", "tags": ["a"]}
    seen_by_backend: list[Any] = []
    edits: list[BaseException] = []

    async def backend(operation: Any) -> ToolResult:
        await trio.sleep(1)  # the subscriber runs meanwhile
        seen_by_backend.append(thaw(operation.arguments))
        return ToolResult("ok")

    async def redactor(events: Any) -> None:
        async for event in events:
            if event.type == "tool_started":
                payload = event.payload["invocation"]["arguments"]
                try:
                    payload["password"] = "***"
                except TypeError as exc:
                    edits.append(exc)
                try:
                    payload["tags"].append("b")
                except (TypeError, AttributeError) as exc:
                    edits.append(exc)

    provider = calls_then_done(("c1", "login", arguments))
    async with (
        conversation_with(provider, [make_tool("login", RecordingBackend(backend))]) as (
            conversation,
            timeline,
        ),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(redactor, conversation.subscribe())
        await conversation.prompt("go")
        await conversation.wait_settled()
        nursery.cancel_scope.cancel()
    assert seen_by_backend == [arguments]
    assert len(edits) == 2
    [started] = [e for e in timeline.published() if e.type == "tool_started"]
    assert thaw(started.payload["invocation"]["arguments"]) == arguments


async def test_tool_05_operation_carries_the_whole_identity(autojump_clock: MockClock) -> None:
    """TOOL-05: the operation carries run_id, incarnation, step_id, attempt_id,
    invocation_id, tool_call_id, turn_id, tool_name, tool_revision,
    catalog_revision, arguments, caller and effective_authority."""
    backend = RecordingBackend(ToolResult("ok"))
    tool = make_tool("t", backend, revision=4)
    registry = ToolRegistry([tool])
    authority = granted(registry)
    provider = calls_then_done(("call-7", "t", {"q": 1}))
    finished = await run_to_settled(provider, [tool], incarnation=3, authority=authority)

    assert_continued(finished, provider)
    [operation] = backend.operations
    [intent_key] = [k for k in finished.record.intents if k.startswith("tool:")]
    intent = finished.record.intents[intent_key]
    first_request = provider.requests[0]
    assert operation.run_id == RUN_ID
    assert operation.incarnation == 3
    assert operation.step_id == first_request.step_id == intent["step_id"]
    assert operation.attempt_id == first_request.attempt_id
    assert operation.invocation_id == intent["invocation_id"]
    assert intent_key == f"tool:{operation.invocation_id}"
    assert operation.tool_call_id == "call-7"
    assert operation.turn_id == first_request.turn_id == finished.snapshot.turn_id
    assert operation.tool_name == "t"
    assert operation.tool_revision == 4
    assert operation.catalog_revision == 1
    assert operation.arguments == {"q": 1}
    assert operation.caller == "host"
    assert operation.effective_authority == authority


# -- TOOL-06, TOOL-07: authorization ------------------------------------------------------


def test_tool_06_authorize_refuses_ungranted_and_unrevisioned_tools() -> None:
    """TOOL-06: ``authorize`` raises forbidden for a tool missing from the
    grants or with no authorized revision."""
    tool = make_tool("t", RecordingBackend())
    invocation = Invocation(RUN_ID, "t", 1)
    refusals = [
        Authority(grants=frozenset(), caller="host", run_id=RUN_ID, tool_revisions={"t": 1}),
        Authority(grants=frozenset({"other"}), caller="host", run_id=RUN_ID, tool_revision=1),
        Authority(grants=frozenset({"t"}), caller="host", run_id=RUN_ID),
    ]
    for authority in refusals:
        with pytest.raises(Error) as caught:
            authorize(authority, tool, invocation)
        assert caught.value.error_class is ErrorClass.FORBIDDEN
    authorize(
        Authority(grants=frozenset({"t"}), caller="host", run_id=RUN_ID, tool_revision=1),
        tool,
        invocation,
    )


async def test_tool_06_gateway_refusal_is_an_error_result_and_never_dispatched(
    autojump_clock: MockClock,
) -> None:
    """TOOL-06: a call the gateway refuses (granted, but no authorized revision)
    is never dispatched and yields a forbidden error tool result."""
    backend = RecordingBackend(ToolResult("ok"))
    authority = Authority(grants=frozenset({"t"}), caller="host", run_id=RUN_ID)
    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend)], authority=authority)

    assert_continued(finished, provider)
    assert backend.calls == 0
    assert "run.tool_invoked" not in finished.store.commits()
    assert "tool_started" not in finished.types()
    [message] = finished.tool_messages()
    assert error_of(message)["class"] == "forbidden"
    assert finished.record.budget.used == 2


async def test_tool_07_per_tool_revisions_dispatch_mixed_revisions(
    autojump_clock: MockClock,
) -> None:
    """TOOL-07: with tool_revisions each tool is authorized at its own revision,
    so a catalog mixing revisions 1 and 3 dispatches both."""
    backend = RecordingBackend(ToolResult("ok"))
    tools = [make_tool("a", backend, revision=1), make_tool("b", backend, revision=3)]
    authority = Authority(
        grants=frozenset({"a", "b"}),
        caller="host",
        run_id=RUN_ID,
        tool_revisions={"a": 1, "b": 3},
    )
    provider = calls_then_done(("c1", "a", {}), ("c2", "b", {}))
    finished = await run_to_settled(provider, tools, authority=authority)

    assert_continued(finished, provider)
    assert [(op.tool_name, op.tool_revision) for op in backend.operations] == [("a", 1), ("b", 3)]
    assert all(m["result"]["is_error"] is False for m in finished.tool_messages())

    # contrast: one legacy revision authorizes only the tool at that revision
    backend = RecordingBackend(ToolResult("ok"))
    tools = [make_tool("a", backend, revision=1), make_tool("b", backend, revision=3)]
    legacy = Authority(grants=frozenset({"a", "b"}), caller="host", run_id=RUN_ID, tool_revision=1)
    provider = calls_then_done(("c1", "a", {}), ("c2", "b", {}))
    finished = await run_to_settled(provider, tools, authority=legacy)
    assert [op.tool_name for op in backend.operations] == ["a"]
    assert error_of(finished.tool_messages()[1])["class"] == "forbidden"


# -- TOOL-08 .. TOOL-11 ------------------------------------------------------------------


async def test_tool_08_result_is_committed_no_later_than_the_tool_message(
    autojump_clock: MockClock,
) -> None:
    """TOOL-08 (and EVT-13): the result is committed no later than the tool
    message is appended: the ``tool_completed`` command carries both, so no
    stored record shows the message without its result, and the
    tool_completed event follows that commit."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend)])
    assert_continued(finished, provider)

    store = finished.store
    commits = store.commits()
    completed_at = commits.index("run.tool_completed")
    result_record = store.records[completed_at]
    invocation_id = backend.operations[0].invocation_id
    assert invocation_id in result_record.tool_results
    assert [m["role"] for m in result_record.transcript][-1] == "tool"
    for record in store.records[:completed_at]:  # no earlier record shows the message
        assert "tool" not in [m["role"] for m in record.transcript]
    completion = store.index("commit", lambda k: k == "run.tool_completed")
    assert store.index("event", lambda e: e.type == "tool_completed") > completion


async def test_tool_09_tool_message_shape(autojump_clock: MockClock) -> None:
    """TOOL-09: role "tool", the provider's tool_call_id, the tool name and the
    normalized result, whose is_error defaults to False."""
    backend = RecordingBackend(ToolResult([{"type": "text", "text": "hi"}], {"n": 1}))
    provider = calls_then_done(("provider-id-1", "greet", {}))
    finished = await run_to_settled(provider, [make_tool("greet", backend)])

    assert_continued(finished, provider)
    [message] = finished.tool_messages()
    assert thaw(message) == {
        "role": "tool",
        "tool_call_id": "provider-id-1",
        "name": "greet",
        "result": {
            "content": [{"type": "text", "text": "hi"}],
            "structured_content": {"n": 1},
            "is_error": False,
        },
    }
    [event] = finished.of("tool_completed")
    assert thaw(event.payload["message"]) == thaw(message)


async def test_tool_10_stored_intent_has_no_grants_while_backend_gets_full_authority(
    autojump_clock: MockClock,
) -> None:
    """TOOL-10 (and PRV-18): the stored intent's effective_authority holds no
    grants and no host credentials; the backend receives the full authority."""
    secret = "canary-credential-51d0"
    backend = RecordingBackend(ToolResult("ok"))
    tool = make_tool("t", backend, backend_context={"password": secret})
    registry = ToolRegistry([tool])
    authority = granted(registry)
    provider = calls_then_done(("c1", "t", {}))
    store = MemoryStore()
    finished = await run_to_settled(
        provider,
        [tool],
        authority=authority,
        store=store,
        provider_context={"authorization": f"Bearer {secret}"},
    )
    assert_continued(finished, provider)

    [operation] = backend.operations
    assert operation.effective_authority is authority
    assert operation.effective_authority.grants == frozenset({"t"})
    intent = finished.record.intents[f"tool:{operation.invocation_id}"]
    stored = thaw(intent["effective_authority"])
    assert "grants" not in stored
    assert stored == {"caller": "host", "run_id": RUN_ID, "tool_revision": 1}
    [started] = finished.of("tool_started")
    assert "grants" not in repr(started.payload)
    await assert_no_canary(
        store, RUN_ID, [secret], events=finished.events, requests=provider.requests
    )


async def test_tool_11_work_of_one_fails_the_run_before_any_backend_call(
    autojump_clock: MockClock,
) -> None:
    """TOOL-11: with work=1 a response requesting a tool fails the run
    (run_failed, state failed, class budget_exceeded) before any backend call."""
    backend = RecordingBackend(ToolResult("ok"))
    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend)], work=1)

    assert backend.calls == 0
    assert finished.record.state == "failed"
    assert "run.tool_invoked" not in finished.store.commits()
    assert not finished.record.active_tools
    assert finished.record.budget.used == 1
    [failed] = finished.of("run_failed")
    assert failed.payload["outcome"]["error"]["class"] == "budget_exceeded"
    assert finished.record.outcome["error"]["class"] == "budget_exceeded"
    assert len(provider.requests) == 1


# -- TOOL-12 .. TOOL-18: outcomes and settlement -------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
async def test_tool_12_oversized_result_becomes_an_error_after_one_call(
    autojump_clock: MockClock, read_only: bool
) -> None:
    """TOOL-12: a result whose compact JSON exceeds output_limit becomes an
    is_error resource_conflict result, checked after the backend ran once, and
    the provider continues whatever the descriptor."""
    backend = RecordingBackend(ToolResult("x" * 200))
    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(
        provider, [make_tool("t", backend, read_only=read_only)], output_limit=100
    )

    assert_continued(finished, provider)
    assert backend.calls == 1
    [message] = finished.tool_messages()
    error = error_of(message)
    assert error["class"] == "resource_conflict"
    assert error["message"] == "tool output exceeds the configured bound"
    invocation_id = backend.operations[0].invocation_id
    assert finished.record.intents[f"tool:{invocation_id}"]["status"] == "consumed"
    assert "x" * 200 not in repr(finished.record.context)


async def test_tool_13_read_only_error_is_an_ordinary_error_result(
    autojump_clock: MockClock,
) -> None:
    """TOOL-13: a read-only tool raising an Error yields an is_error tool
    message and the provider continues."""
    failure = Error(ErrorClass.NOT_FOUND, "no such file", {"path": "/nope"})
    backend = RecordingBackend(failure)
    provider = calls_then_done(("c1", "read", {}))
    finished = await run_to_settled(provider, [make_tool("read", backend, read_only=True)])

    assert_continued(finished, provider)
    [message] = finished.tool_messages()
    assert error_of(message) == failure.to_dict()
    assert message["result"]["content"] == "no such file"
    invocation_id = backend.operations[0].invocation_id
    assert finished.record.intents[f"tool:{invocation_id}"]["status"] == "consumed"


@pytest.mark.parametrize("outcome", ["read-only-error", "rejection"])
async def test_tool_12_a_refusal_is_held_to_output_limit_too(
    autojump_clock: MockClock, outcome: str
) -> None:
    """TOOL-12: a backend's refusal is its output too: a read-only tool's
    ``Error``, or a rejection, whose message and details exceed
    ``output_limit`` becomes "tool output exceeds the configured bound",
    and the huge text is never committed nor sent to the provider."""
    huge = Error(ErrorClass.EXECUTION_FAILURE, "m" * 200_000, {"blob": "b" * 100_000})

    async def backend(operation: Any) -> Any:
        if outcome == "rejection":
            return reject(operation, huge)
        raise huge

    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(
        provider, [make_tool("t", RecordingBackend(backend), read_only=True)], output_limit=1000
    )
    assert_continued(finished, provider)
    [message] = finished.tool_messages()
    error = error_of(message)
    assert (error["class"], error["message"]) == (
        "resource_conflict",
        "tool output exceeds the configured bound",
    )
    assert "m" * 1000 not in repr(finished.record.tool_results)


async def test_tool_03_tool_13_refusals_quoting_a_lone_surrogate_are_ordinary_results(
    autojump_clock: MockClock,
) -> None:
    """TOOL-03, TOOL-13: a refusal whose text quotes a lone surrogate (the
    schema boundary naming a model's key ``"\udc00"``, a read-only tool's
    error relaying one) is an ordinary is_error result with U+FFFD in its
    place: the provider continues, nothing crashes the run."""
    failure = Error(ErrorClass.EXECUTION_FAILURE, "upstream said \udc00")
    backend = RecordingBackend(failure)
    provider = calls_then_done(("c1", "read", '{"\\udc00": 1}'), ("c2", "read", {}))
    schema = {"type": "object", "additionalProperties": False}
    finished = await run_to_settled(
        provider, [make_tool("read", backend, read_only=True, schema=schema)]
    )
    assert_continued(finished, provider)
    refused, relayed = finished.tool_messages()
    assert error_of(refused)["class"] == "validation"
    assert backend.calls == 1
    assert error_of(relayed)["message"] == "upstream said \ufffd"


@pytest.mark.parametrize(
    "error_class",
    [
        ErrorClass.VALIDATION,
        ErrorClass.NOT_FOUND,
        ErrorClass.FORBIDDEN,
        ErrorClass.TRANSIENT_TRANSPORT,
        ErrorClass.TIMEOUT,
        ErrorClass.UNKNOWN_OUTCOME,
    ],
)
async def test_tool_14_18_mutating_error_stops_as_unknown_outcome(
    autojump_clock: MockClock, error_class: ErrorClass
) -> None:
    """TOOL-14 and TOOL-18: a mutating tool raising an Error of any class stops
    the run (run_cancelled, unknown_outcome), keeps its invocation in the stored
    active_tools, and its stored intent is "uncertain"."""
    backend = RecordingBackend(Error(error_class, "it failed", {"retry_safe": True}))
    provider = calls_then_done(("c1", "write", {}))
    finished = await run_to_settled(provider, [make_tool("write", backend)])

    invocation_id = assert_uncertain_stop(finished, backend, provider)
    evidence = thaw(finished.record.outcome["evidence"])
    assert {"effect": f"tool:{invocation_id}"}.items() <= evidence[0].items()


async def test_tool_15_is_error_tool_result_settles_even_for_a_mutating_tool(
    autojump_clock: MockClock,
) -> None:
    """TOOL-15: a backend returning ToolResult(is_error=True) is settled
    normally, even for a mutating tool, and the provider continues."""
    backend = RecordingBackend(ToolResult("disk full", is_error=True))
    provider = calls_then_done(("c1", "write", {}))
    finished = await run_to_settled(provider, [make_tool("write", backend)])

    assert_continued(finished, provider)
    [message] = finished.tool_messages()
    assert thaw(message["result"]) == {
        "content": "disk full",
        "structured_content": None,
        "is_error": True,
    }
    invocation_id = backend.operations[0].invocation_id
    assert finished.record.intents[f"tool:{invocation_id}"]["status"] == "consumed"
    assert invocation_id in finished.record.tool_results


@pytest.mark.parametrize("read_only", [False, True])
async def test_tool_16_18_foreign_exception_stops_as_unknown_outcome(
    autojump_clock: MockClock, read_only: bool
) -> None:
    """TOOL-16 and TOOL-18: a backend raising an Exception other than Error
    stops the run as unknown_outcome, and the provider is never called again."""
    backend = RecordingBackend(RuntimeError("segfault-ish"))
    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend, read_only=read_only)])

    assert_uncertain_stop(finished, backend, provider)
    assert finished.snapshot.last_error is not None
    assert finished.snapshot.last_error.error_class is ErrorClass.UNKNOWN_OUTCOME


async def test_tool_17_18_read_only_unknown_outcome_is_still_uncertain(
    autojump_clock: MockClock,
) -> None:
    """TOOL-17 and TOOL-18: an explicit unknown_outcome error from a read-only
    tool is still uncertain: the run ends unknown_outcome."""
    backend = RecordingBackend(
        Error(ErrorClass.UNKNOWN_OUTCOME, "connection dropped mid-read", {"retry_safe": True})
    )
    provider = calls_then_done(("c1", "read", {}))
    finished = await run_to_settled(provider, [make_tool("read", backend, read_only=True)])

    assert_uncertain_stop(finished, backend, provider)


# -- TOOL-19 .. TOOL-23: rejections and settlement ------------------------------------------


async def test_tool_19_exact_rejection_is_an_error_result_and_leaves_no_active_tool(
    autojump_clock: MockClock,
) -> None:
    """TOOL-19: ``reject(operation, error)`` for the exact operation yields an
    is_error tool message, the provider continues, and no active tool is left."""
    refusal = Error(ErrorClass.FORBIDDEN, "policy refuses this path", {"path": "/etc"})
    backend = RecordingBackend(lambda operation: reject(operation, refusal))
    provider = calls_then_done(("c1", "write", {}))
    finished = await run_to_settled(provider, [make_tool("write", backend)])

    assert_continued(finished, provider)
    [message] = finished.tool_messages()
    assert error_of(message) == refusal.to_dict()
    assert finished.record.active_tools == {}
    invocation_id = backend.operations[0].invocation_id
    assert finished.record.intents[f"tool:{invocation_id}"]["status"] == "consumed"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("invocation_id", "invocation-9-9"),
        ("tool_call_id", "another-call"),
        ("attempt_id", "attempt-9-9"),
        ("incarnation", 7),
        ("catalog_revision", 2),
    ],
)
async def test_tool_20_mismatched_rejection_stops_as_unknown_outcome(
    autojump_clock: MockClock, field: str, value: Any
) -> None:
    """TOOL-20: a rejection whose identity differs in any field stops a
    mutating run as unknown_outcome ("tool rejection does not prove exact
    non-dispatch")."""
    refusal = Error(ErrorClass.FORBIDDEN, "refused")

    def foreign(operation: Any) -> Rejection:
        return reject(attrs.evolve(operation, **{field: value}), refusal)

    backend = RecordingBackend(foreign)
    provider = calls_then_done(("c1", "write", {}))
    finished = await run_to_settled(provider, [make_tool("write", backend)])

    assert_uncertain_stop(finished, backend, provider)
    last_error = finished.snapshot.last_error
    assert last_error is not None
    assert last_error.message == "tool rejection does not prove exact non-dispatch"
    evidence = thaw(finished.record.outcome["evidence"])
    assert evidence[0]["reason"] == "tool rejection does not prove exact non-dispatch"


def _identity(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "run_id": RUN_ID,
        "incarnation": 1,
        "step_id": "step-1-1",
        "attempt_id": "attempt-1-1",
        "invocation_id": "invocation-1-1",
        "tool_call_id": "c1",
        "turn_id": "turn-1-1",
        "tool_name": "t",
        "tool_revision": 1,
        "catalog_revision": 1,
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not _MISSING}


_MISSING = object()


def test_tool_21_reject_refuses_unknown_outcome_and_incomplete_identity() -> None:
    """TOOL-21: ``reject`` raises unknown_outcome for an unknown_outcome error
    or an incomplete identity (a missing or empty id, a non-positive
    incarnation or revision)."""
    refusal = Error(ErrorClass.FORBIDDEN, "refused")
    rejection = reject(_identity(), refusal)
    assert dict(rejection.identity) == _identity()
    assert rejection.error is refusal

    with pytest.raises(Error) as caught:
        reject(_identity(), Error(ErrorClass.UNKNOWN_OUTCOME, "maybe it ran"))
    assert caught.value.error_class is ErrorClass.UNKNOWN_OUTCOME

    incomplete: list[dict[str, Any]] = []
    for name in IDENTITY_FIELDS:
        incomplete.append(_identity(**{name: _MISSING}))
        incomplete.append(_identity(**{name: None}))
    for name in (
        "run_id",
        "step_id",
        "attempt_id",
        "invocation_id",
        "tool_call_id",
        "turn_id",
        "tool_name",
    ):
        incomplete.append(_identity(**{name: ""}))
    for name in ("incarnation", "tool_revision"):
        incomplete.append(_identity(**{name: 0}))
        incomplete.append(_identity(**{name: -1}))
    incomplete.append(_identity(catalog_revision=-1))
    for identity in incomplete:
        with pytest.raises(Error) as caught:
            reject(identity, refusal)
        assert caught.value.error_class is ErrorClass.UNKNOWN_OUTCOME, identity


@pytest.mark.parametrize(
    "error",
    [Error(ErrorClass.UNKNOWN_OUTCOME, "maybe it ran"), "nope", None],
    ids=["unknown-outcome", "a-str", "none"],
)
def test_tool_21_a_hand_built_rejection_is_held_to_reject_s_rule(error: Any) -> None:
    """TOOL-21: a ``Rejection`` a backend builds itself, holding what
    ``reject`` refuses (an unknown outcome, or no ``Error`` at all), is no
    proof: uncertain, with or without the operation."""
    descriptor = make_tool("t", RecordingBackend())
    rejection = Rejection(identity=_identity(), error=error)
    assert settlement(rejection, descriptor) == "uncertain"
    assert settlement(rejection, descriptor, _identity()) == "uncertain"
    proof = Rejection(identity=_identity(), error=Error(ErrorClass.FORBIDDEN, "refused"))
    assert settlement(proof, descriptor, _identity()) == "settled"


@pytest.mark.parametrize(
    "identity",
    [{}, {"run_id": "r"}, {"tool_name": "t", "invocation_id": "i"}, "drop-one"],
    ids=["empty", "run-only", "two-fields", "all-but-one"],
)
def test_tool_21_a_hand_built_rejection_missing_identity_fields_is_no_proof(
    identity: Any,
) -> None:
    """TOOL-21: a hand-built ``Rejection`` whose identity lacks fields
    (``reject`` refuses such an operation) is uncertain for a mutating tool
    in the two-argument form too, not settled."""
    if identity == "drop-one":
        identity = {k: v for k, v in _identity().items() if k != "turn_id"}
    descriptor = make_tool("t", RecordingBackend())
    rejection = Rejection(identity=identity, error=Error(ErrorClass.FORBIDDEN, "refused"))
    assert settlement(rejection, descriptor) == "uncertain"


@pytest.mark.parametrize("checkpoint", [False, True])
async def test_tool_22_rejection_after_cancel_cannot_complete_the_run(
    autojump_clock: MockClock, checkpoint: bool
) -> None:
    """TOOL-22: a valid rejection returned after ``cancel()`` cannot complete
    the run, which ends unknown_outcome."""
    provider = calls_then_done(("c1", "write", {}))
    holder: dict[str, Any] = {}

    class CancelThenReject(RecordingBackend):
        """Cancels the run, then returns an exact rejection (with no Trio
        checkpoint in between unless ``checkpoint``)."""

        async def execute(self, operation: Any) -> Any:
            self.operations.append(operation)
            await holder["conversation"].cancel()
            if checkpoint:
                await trio.lowlevel.checkpoint()
            return reject(operation, Error(ErrorClass.FORBIDDEN, "refused"))

    backend = CancelThenReject()
    async with conversation_with(provider, [make_tool("write", backend)]) as (conversation, store):
        holder["conversation"] = conversation
        await conversation.prompt("go")
        snapshot = await conversation.wait_settled()
    record = await store.load(RUN_ID)
    assert record is not None

    assert backend.calls == 1
    assert snapshot.phase == "terminal"
    assert record.state == "unknown_outcome"
    assert "run.tool_completed" not in store.commits()
    assert len(provider.requests) == 1
    types = [e.type for e in store.published()]
    assert types.count("run_cancelled") == 1
    assert "run_completed" not in types


def test_tool_23_settlement_trusts_only_the_outcome_kind_and_read_only() -> None:
    """TOOL-23: ``settlement(result, descriptor)`` trusts only the kind of
    outcome and the descriptor's read_only; retry_safe, error text and details
    never settle an uncertain result."""
    mutating = make_tool("w", RecordingBackend())
    read_only = make_tool("r", RecordingBackend(), read_only=True)
    reassuring = Error(
        ErrorClass.TRANSIENT_TRANSPORT,
        "nothing happened, it is safe to retry",
        {"retry_safe": True, "certainty": "settled", "dispatched": False},
    )
    unknown = Error(ErrorClass.UNKNOWN_OUTCOME, "definitely not executed", {"retry_safe": True})
    assert settlement(ToolResult("ok"), mutating) == "settled"
    assert settlement(ToolResult("bad", is_error=True), mutating) == "settled"
    assert settlement(reassuring, mutating) == "uncertain"
    assert settlement(reassuring, read_only) == "settled"
    assert settlement(unknown, read_only) == "uncertain"
    assert settlement(unknown, mutating) == "uncertain"
    for foreign in (
        RuntimeError("safe to retry"),
        trio.TooSlowError(),
        {"content": "ok", "is_error": False},
        None,
        "ok",
    ):
        assert settlement(foreign, read_only) == "uncertain"
        assert settlement(foreign, mutating) == "uncertain"
    exact = reject(_identity(), Error(ErrorClass.FORBIDDEN, "no"))
    assert settlement(exact, mutating) == "settled"
    incomplete = Rejection(identity=_identity(invocation_id=""), error=reassuring)
    assert settlement(incomplete, mutating) == "uncertain"
    assert settlement(incomplete, read_only) == "uncertain"


# -- TOOL-24 .. TOOL-27 ------------------------------------------------------------------


async def test_tool_24_validation_precedes_authorization_approval_budget_and_intent(
    autojump_clock: MockClock,
) -> None:
    """TOOL-24: invalid arguments for an ungranted, approval-gated tool yield a
    validation error result, open no interaction and consume no work; with
    valid arguments authorization refuses next.  With a grant the approval
    interaction comes before any work: tests/runtime/test_interactions.py
    (INT-01, INT-03) covers that step."""
    ungranted = Authority(grants=frozenset({"t"}), caller="host", run_id=RUN_ID)

    async def outcome(arguments: Any, authority: Authority | None) -> tuple[Finished, Any]:
        backend = RecordingBackend(ToolResult("ok"))
        tool = make_tool("t", backend, schema=string_schema("q"), requires_approval=True)
        provider = calls_then_done(("c1", "t", arguments))
        finished = await run_to_settled(provider, [tool], authority=authority)
        assert_continued(finished, provider)
        assert backend.calls == 0
        assert "run.tool_invoked" not in finished.store.commits()
        assert finished.record.budget.used == 2  # the two provider attempts only
        assert finished.snapshot.pending_interaction is None
        assert not [e for e in finished.events if e.type.startswith("interaction_")]
        assert finished.record.state == "completed"
        [message] = finished.tool_messages()
        return finished, error_of(message)["class"]

    _, first = await outcome({"q": 5}, ungranted)
    assert first == "validation"
    _, second = await outcome({"q": "valid"}, ungranted)
    assert second == "forbidden"


async def test_tool_25_result_and_message_commit_together_or_not_at_all(
    autojump_clock: MockClock,
) -> None:
    """TOOL-25 (rule 3): a result is durable no later than the transcript
    message showing it: both ride in one commit.  When that commit fails,
    the stored record holds neither (never a message without its result),
    the backend ran exactly once, the dispatched effect is what recovery
    reports uncertain, and a restart with that record does not run it
    again."""
    store = TimelineStore(MemoryStore())

    def fail_result(kind: str, commits: list[str]) -> BaseException | None:
        if kind == "run.tool_completed":
            return OSError("disk went away")
        return None

    store.fail = fail_result
    backend = RecordingBackend(ToolResult("written", structured_content={"bytes": 5}))
    provider = calls_then_done(("c1", "write", {}))
    finished = await run_to_settled(provider, [make_tool("write", backend)], store=store)

    assert finished.snapshot.phase == "storage_failed"
    assert backend.calls == 1
    record = finished.record
    invocation_id = backend.operations[0].invocation_id
    assert invocation_id not in record.tool_results
    assert invocation_id in record.active_tools
    assert record.intents[f"tool:{invocation_id}"]["status"] == "started"
    assert finished.tool_messages() == []
    assert finished.types().count("storage_failed") == 1
    assert not {"run_completed", "run_failed", "run_cancelled"} & set(finished.types())
    assert len(provider.requests) == 1
    report = recover(record, incarnation=2)
    assert list(report.uncertain_effects) == [f"tool:{invocation_id}"]

    # restart with the stored record: inspection only, nothing runs again
    store.fail = None
    registry = ToolRegistry([make_tool("write", backend)])
    async with open_conversation(
        RUN_ID,
        store=store,
        provider=provider,
        registry=registry,
        authority=granted(registry),
        run=record,
    ) as conversation:
        snapshot = await conversation.wait_settled()
        assert snapshot.phase == "recovery_required"
        with pytest.raises(Error) as caught:
            await conversation.prompt("again")
        assert caught.value.error_class is ErrorClass.RESOURCE_CONFLICT
        await trio.sleep(60)
    assert backend.calls == 1
    assert len(provider.requests) == 1
    assert await store.load(RUN_ID) == record


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("returned", [None, {"content": "ok", "is_error": False}, "ok"])
async def test_tool_26_malformed_return_is_uncertain(
    autojump_clock: MockClock, read_only: bool, returned: Any
) -> None:
    """TOOL-26: a backend returning neither a ToolResult nor a rejection is
    uncertain whatever its descriptor: the run ends unknown_outcome."""
    backend = RecordingBackend(lambda operation: returned)
    provider = calls_then_done(("c1", "t", {}))
    finished = await run_to_settled(provider, [make_tool("t", backend, read_only=read_only)])

    assert_uncertain_stop(finished, backend, provider)


async def test_tool_27_emit_forwards_tool_update_and_a_stale_emit_raises(
    autojump_clock: MockClock,
) -> None:
    """TOOL-27 (and EVT-06): ``operation.context.emit(update)`` forwards a
    transient tool_update; after that tool's effect ended it raises
    resource_conflict "stale stream" and forwards nothing."""
    contexts: list[Any] = []
    stale: list[Error] = []

    async def first(operation: Any) -> ToolResult:
        contexts.append(operation.context)
        operation.context.emit({"progress": 10, "stage": "copy"})
        await trio.sleep(1)
        operation.context.emit({"progress": 100})
        return ToolResult("copied")

    async def second(operation: Any) -> ToolResult:
        try:
            contexts[0].emit({"progress": "from the past"})
        except Error as error:
            stale.append(error)
        return ToolResult("second")

    backend = RecordingBackend(first, second)
    provider = calls_then_done(("c1", "copy", {}), ("c2", "copy", {}))
    finished = await run_to_settled(provider, [make_tool("copy", backend)])
    assert_continued(finished, provider)

    updates = finished.of("tool_update")
    assert [thaw(e.payload) for e in updates] == [
        {"progress": 10, "stage": "copy"},
        {"progress": 100},
    ]
    [error] = stale
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert error.message == "stale stream"
    # the updates of call 1 sit between its tool_started and its tool_completed
    types = finished.types()
    first_started = types.index("tool_started")
    first_completed = types.index("tool_completed")
    positions = [i for i, t in enumerate(types) if t == "tool_update"]
    assert all(first_started < i < first_completed for i in positions)
    # after the run, every context is stale too
    with pytest.raises(Error) as caught:
        contexts[0].emit({"late": True})
    assert caught.value.message == "stale stream"


async def test_tool_27_emit_from_a_worker_thread_is_refused() -> None:
    """TOOL-27: ``emit`` (and every other ``operation.context`` callable)
    belongs to the Trio run of its conversation: called from a worker
    thread it raises ``validation`` ``foreign_trio_run`` there, touching no
    subscriber, and the run goes on (it used to wake no one and crash Trio)."""
    refused: list[Error] = []

    def blocking_work(context: Any) -> None:
        for call in (
            lambda: context.emit({"progress": 50}),
            lambda: context.stage_catalog(object()),
        ):
            try:
                call()
            except Error as error:
                refused.append(error)

    async def worker(operation: Any) -> ToolResult:
        await trio.to_thread.run_sync(blocking_work, operation.context)
        operation.context.emit({"progress": 100})
        return ToolResult("done")

    async def listener(events: Any, seen: list[Any]) -> None:
        async for event in events:
            seen.append(event.type)

    seen: list[Any] = []
    provider = calls_then_done(("c1", "work", {}))
    async with (
        conversation_with(provider, [make_tool("work", RecordingBackend(worker))]) as (
            conversation,
            _,
        ),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(listener, conversation.subscribe(), seen)
        await conversation.prompt("go")
        with trio.fail_after(30):
            snapshot = await conversation.wait_settled()
        nursery.cancel_scope.cancel()
    assert [(e.error_class, e.details["reason"]) for e in refused] == [
        (ErrorClass.VALIDATION, "foreign_trio_run")
    ] * 2
    assert snapshot.run.state == "completed"
    assert seen.count("tool_update") == 1


@pytest.mark.parametrize("last", [True, False])
async def test_tool_25_a_result_committed_as_cancel_arrives_keeps_its_tool_message(
    autojump_clock: MockClock, last: bool
) -> None:
    """TOOL-25, CAN-07: ``cancel()`` while a result's commit is in flight:
    the result commits, the run ends ``cancelled`` with nothing unsettled,
    and the transcript answers the call with its tool message (it kept an
    assistant call with no answer, which a run continued from it shows the
    model as unanswered), whether the message was to commit alone or with
    the next intent."""
    store = FaultyStore(None, Fault("delay", kind="tool_completed", delay=1.0))
    backend = RecordingBackend(ToolResult("wrote 5 bytes"))
    registry = ToolRegistry([make_tool("write", backend)])
    calls = [("c1", "write", {})] if last else [("c1", "write", {}), ("c2", "write", {})]
    provider = ScriptedProvider([ScriptedProvider.tool_calls(*calls), ScriptedProvider.text("x")])
    async with open_conversation(
        RUN_ID, store=store, provider=provider, registry=registry, authority=granted(registry)
    ) as conversation:

        async def cancel_during_the_result_commit() -> None:
            await store.reached("tool_completed").wait()
            await conversation.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_during_the_result_commit)
            await conversation.prompt("write it")
            snapshot = await conversation.wait_settled()
    record = await store.load(RUN_ID)
    assert record is not None
    assert record.state == "cancelled"
    assert backend.calls == 1
    answered = [m["tool_call_id"] for m in snapshot.messages if m["role"] == "tool"]
    assert answered == ["c1"]
    assert thaw(record.tool_results)[next(iter(record.tool_results))]["content"] == "wrote 5 bytes"
