"""The Anthropic Messages provider against a loopback server streaming
scripted Messages events (``chat_server.message_stream``): no transport is
mocked."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tests.adapters.chat_server import ChatServer, Completion, Status, Stream, message_stream
from tests.adapters.provider_runs import (
    CANARY,
    GET_ME,
    SCHEMA,
    Add,
    approving_run,
    assert_no_key,
    registry,
    request,
)
from trio_backplane.adapters._http._aliases import ToolAliases
from trio_backplane.adapters.anthropic import ANTHROPIC_VERSION, AnthropicProvider
from trio_backplane.adapters.anthropic._provider import PAUSES
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import thaw
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
)
from trio_backplane.store import MemoryStore
from trio_backplane.tools import ProviderTool

THINKING = {"type": "thinking", "thinking": "2 + 3 is 5", "signature": "sig-Zm9vYmFy=="}
REDACTED = {"type": "redacted_thinking", "data": "b3BhcXVl"}


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with ChatServer().running() as running:
        yield running


def provider(server: ChatServer, **options: Any) -> AnthropicProvider:
    base = server.base_url.removesuffix("/v1")
    options.setdefault("timeout", 5)
    return AnthropicProvider("claude-test", base_url=base, **options)


async def collect(source: AnthropicProvider, req: ProviderRequest) -> list[Any]:
    with trio.fail_after(10):
        return [event async for event in source.stream(req, {"api_key": CANARY})]


def tool_use(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


# -- the whole conversation --------------------------------------------------------


async def test_conversation_with_two_tool_calls_one_approved(
    server: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A run through open_conversation: thinking, two tool calls (one under an
    aliased name, one approved by the host), the results sent back as
    ``tool_result`` blocks of one user turn, the thinking block sent back
    verbatim with its signature, the system prompt apart, the key only in
    ``x-api-key``."""
    caplog.set_level(logging.DEBUG)
    source = provider(server, system="be brief")
    alias = ToolAliases([GET_ME, "add"]).alias(GET_ME)
    server.add(
        message_stream(
            THINKING,
            REDACTED,
            {"type": "text", "text": "let me look"},
            tool_use("toolu_a", alias, {}),
            tool_use("toolu_b", "add", {"a": 2, "b": 3}),
            stop_reason="tool_use",
        ),
        message_stream({"type": "text", "text": "you are octocat; the sum is 5"}),
    )
    store, add = MemoryStore(), Add()
    tools = registry(add, approve_add=True)
    snapshot, events = await approving_run("run-anthropic", source, store, tools)

    assert snapshot.run.state == "completed", snapshot.last_error
    assert add.calls == [{"a": 2, "b": 3}]
    [asked] = [e for e in events if e.type == "interaction_requested"]
    assert asked.payload["request"]["operation"]["tool_name"] == "add"
    messages = [thaw(m) for m in snapshot.messages]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[1]["content"][:2] == [THINKING, REDACTED]
    assert messages[1]["finish_reason"] == "tool_use"
    assert messages[4]["content"] == "you are octocat; the sum is 5"

    first, second = server.requests
    assert [t["name"] for t in first["tools"]] == ["add", alias]
    assert first["tools"][0] == {
        "name": "add",
        "description": "add two integers",
        "input_schema": SCHEMA,
    }
    assert first["system"] == "be brief"
    assert first["max_tokens"] == 4096
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "who am I, and what is 2 + 3?"}]}
    ]
    assistant, results = second["messages"][1:]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        THINKING,
        REDACTED,
        {"type": "text", "text": "let me look"},
        tool_use("toolu_a", alias, {}),
        tool_use("toolu_b", "add", {"a": 2, "b": 3}),
    ]
    assert results == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a",
             "content": [{"type": "text", "text": "octocat"}]},
            {"type": "tool_result", "tool_use_id": "toolu_b",
             "content": [{"type": "text", "text": "5"}]},
        ],
    }  # fmt: skip
    assert all(h["x-api-key"] == CANARY for h in server.headers)
    assert all(h["anthropic-version"] == ANTHROPIC_VERSION for h in server.headers)
    assert all("Authorization" not in h for h in server.headers)
    assert CANARY not in json.dumps(server.requests)
    await assert_no_key(store, "run-anthropic", events, snapshot, caplog.text, source)
    assert caplog.records  # httpx did log: the key is just not in it


# -- the stream --------------------------------------------------------------------


async def test_stream_events_usage_and_finish_reason(server: ChatServer) -> None:
    """Deltas by block, usage merged over message_start, the stop reason on
    the message; a text-only answer's content is its text."""
    server.add(
        message_stream(
            THINKING,
            {"type": "text", "text": "hello world"},
            tool_use("toolu_1", "add", {"a": 1, "b": 2}),
            stop_reason="tool_use",
            usage={"output_tokens": 42},
        ),
        message_stream({"type": "text", "text": "hello"}, {"type": "text", "text": " again"}),
    )
    events = await collect(provider(server), request((ProviderTool("add", "", SCHEMA),)))
    assert [e.text for e in events if isinstance(e, ThinkingDelta)] == ["2 + 3", " is 5"]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["hello", " world"]
    [started] = [e for e in events if isinstance(e, ToolCallStarted)]
    assert started == ToolCallStarted("toolu_1", "add", 0)
    deltas = "".join(e.delta for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert json.loads(deltas) == {"a": 1, "b": 2}
    assert [e for e in events if isinstance(e, ToolCallCompleted)] == [
        ToolCallCompleted("toolu_1", "add", {"a": 1, "b": 2})
    ]
    usage = [e.usage for e in events if isinstance(e, Usage)]
    assert usage == [{"input_tokens": 10, "output_tokens": 42}]  # one report, merged
    done = events[-1]
    assert isinstance(done, ResponseCompleted)
    assert done.message["finish_reason"] == "tool_use"
    assert [b["type"] for b in done.message["content"]] == ["thinking", "text", "tool_call"]
    assert done.message["content"][0] == THINKING
    events = await collect(provider(server), request())
    assert [e.index for e in events if isinstance(e, TextDelta)] == [0, 0, 1, 1]
    assert events[-1] == ResponseCompleted(
        {"role": "assistant", "content": "hello again", "finish_reason": "end_turn"}
    )
    assert "tools" not in server.requests[1]


async def test_transcript_shapes(server: ChatServer) -> None:
    """System messages join the system prompt; an empty assistant answer is
    left out and the user turns around it join; an error result is
    ``is_error``; structured content without text is sent as JSON; a
    thinking block without a signature (another provider's) is not sent."""
    server.add(message_stream({"type": "text", "text": "ok"}))
    transcript = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "two"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "unsigned"},
            {"type": "tool_call", "id": "c1", "name": "add", "arguments": "not json"},
        ]},
        {"role": "tool", "tool_call_id": "c1", "name": "add",
         "result": {"content": "tool arguments are not JSON", "is_error": True}},
        {"role": "tool", "tool_call_id": "c2", "name": "add",
         "result": {"content": [], "structured_content": {"sum": 3}}},
        {"role": "tool", "tool_call_id": "c3", "name": "add",
         "result": {"content": [], "is_error": True, "error": {"message": "it broke"}}},
    ]  # fmt: skip
    events = await collect(provider(server, system="be brief"), request(messages=transcript))
    assert isinstance(events[-1], ResponseCompleted)
    body = server.requests[0]
    assert body["system"] == "be brief\n\nrules"
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "one"},
                                     {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": [tool_use("c1", "add", {})]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "is_error": True,
             "content": [{"type": "text", "text": "tool arguments are not JSON"}]},
            {"type": "tool_result", "tool_use_id": "c2",
             "content": [{"type": "text", "text": '{"sum": 3}'}]},
            {"type": "tool_result", "tool_use_id": "c3", "is_error": True,
             "content": [{"type": "text", "text": "it broke"}]},
        ]},
    ]  # fmt: skip


PIXEL = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}


async def test_a_user_image_is_sent_as_an_image_block(server: ChatServer) -> None:
    """A user message's image (MCP's shape) goes as a base64 ``image``
    block beside its text, in order."""
    server.add(message_stream({"type": "text", "text": "a pixel"}))
    said = [{"type": "text", "text": "what is this?"}, PIXEL]
    await collect(provider(server), request(messages=[{"role": "user", "content": said}]))
    assert server.requests[0]["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image",
             "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "block",
    [
        {"type": "audio", "data": "AAAA"},
        {"type": "image", "data": "AAAA"},
        {"type": "image", "data": "AAAA", "mimeType": "image/png, text/html"},
        {"type": "image", "data": "AAAA", "mimeType": ["image/png"]},
        {"text": "untyped"},
    ],
    ids=["audio", "image-without-type", "image-of-another-type", "type-not-a-str", "untyped"],
)
async def test_a_user_block_the_api_cannot_take_fails_the_attempt(
    server: ChatServer, block: dict[str, Any]
) -> None:
    """A user content block that is neither text nor an image is refused,
    ``unsupported_capability`` naming its type, and nothing is sent: never
    the message without it."""
    said = [{"type": "text", "text": "listen"}, block]
    with pytest.raises(Error) as exc:
        await collect(provider(server), request(messages=[{"role": "user", "content": said}]))
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert exc.value.details == {"type": repr(block.get("type"))}
    assert server.requests == []


async def test_a_tool_result_image_the_api_cannot_take_is_noted(server: ChatServer) -> None:
    """A tool result's PNG goes as an image block; its SVG, which the API
    cannot take, is named in a text block instead of sent."""
    server.add(message_stream({"type": "text", "text": "ok"}))
    svg = {"type": "image", "data": "PHN2Zz4=", "mimeType": "image/svg+xml"}
    result = {"content": [PIXEL, svg]}
    transcript = [
        {"role": "user", "content": "draw"},
        {"role": "assistant", "content": [
            {"type": "tool_call", "id": "c1", "name": "add", "arguments": {}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "add", "result": result},
    ]  # fmt: skip
    await collect(provider(server), request(messages=transcript))
    [block] = server.requests[0]["messages"][-1]["content"]
    assert block["content"] == [
        {"type": "image",
         "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "[1 image(s) of the tool result left out: only PNG, JPEG,"
                                 " GIF and WebP images are sent]"},
    ]  # fmt: skip


async def test_extra_body_and_tool_choice(server: ChatServer) -> None:
    """``extra_body`` reaches the body (thinking, tool_choice, max_tokens
    overridden); a tool_choice is dropped when the request has no tools."""
    server.add(message_stream({"type": "text", "text": "a"}))
    server.add(message_stream({"type": "text", "text": "b"}))
    web_search = {"type": "web_search_20250305", "name": "web_search"}
    extra = {
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tool_choice": {"type": "any"},
        "max_tokens": 2048,
        "tools": [web_search],
    }
    source = provider(server, extra_body=extra)
    await collect(source, request((ProviderTool("add", "", SCHEMA),)))
    await collect(source, request())
    with_tools, without = server.requests
    assert with_tools["thinking"] == extra["thinking"]
    assert with_tools["tool_choice"] == {"type": "any"}
    assert with_tools["max_tokens"] == 2048
    assert [t["name"] for t in with_tools["tools"]] == ["web_search", "add"]  # server tools kept
    assert without["tools"] == [web_search]


# -- how a response ends -----------------------------------------------------------


@pytest.mark.parametrize(
    ("stop_reason", "error_class"),
    [
        ("max_tokens", ErrorClass.BUDGET_EXCEEDED),
        ("model_context_window_exceeded", ErrorClass.BUDGET_EXCEEDED),
        ("refusal", ErrorClass.FORBIDDEN),
    ],
)
async def test_cut_or_refused_message_fails(
    server: ChatServer, stop_reason: str, error_class: ErrorClass
) -> None:
    """A message cut at its token limit or refused fails with its own class
    and ``finish_<stop reason>``; the tool call it cut never completes."""
    server.add(
        message_stream(
            {"type": "text", "text": "partial"},
            tool_use("toolu_1", "add", {"a": 1}),
            stop_reason=stop_reason,
        )
    )
    events = await collect(provider(server), request((ProviderTool("add", "", SCHEMA),)))
    assert not [e for e in events if isinstance(e, ToolCallCompleted)]
    failed = events[-1]
    assert isinstance(failed, ResponseFailed)
    assert failed.error.error_class is error_class
    assert failed.error.details["reason"] == f"finish_{stop_reason}"
    assert failed.error.details["finish_reason"] == stop_reason


async def test_max_tokens_in_a_conversation_dispatches_nothing(server: ChatServer) -> None:
    """Through a conversation: the cut call is never run, the run fails
    ``budget_exceeded``."""
    server.add(message_stream(tool_use("toolu_1", "add", {"a": 2}), stop_reason="max_tokens"))
    store, add = MemoryStore(), Add()
    snapshot, _ = await approving_run("run-cut", provider(server), store, registry(add))
    assert add.calls == []
    assert snapshot.run.state == "failed"
    assert snapshot.last_error is not None
    assert snapshot.last_error.error_class is ErrorClass.BUDGET_EXCEEDED


def _anthropic_error(kind: str, message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}})


@pytest.mark.parametrize(
    ("reply", "error_class", "details"),
    [
        (
            Status(429, _anthropic_error("rate_limit_error", "slow down"), raw=True,
                   headers={"retry-after": "7"}),
            ErrorClass.TRANSIENT_TRANSPORT,
            {"status": 429, "provider_code": "rate_limit_error", "retry_after": 7.0,
             "provider_message": "slow down"},
        ),
        (
            Status(529, _anthropic_error("overloaded_error", "Overloaded"), raw=True),
            ErrorClass.TRANSIENT_TRANSPORT,
            {"status": 529, "provider_code": "overloaded_error"},
        ),
        (
            Status(401, _anthropic_error("authentication_error", "invalid x-api-key"), raw=True),
            ErrorClass.FORBIDDEN,
            {"status": 401, "provider_code": "authentication_error",
             "provider_message": "invalid x-api-key"},
        ),
        (
            Status(400, _anthropic_error("invalid_request_error", "max_tokens: too big"),
                   raw=True),
            ErrorClass.VALIDATION,
            {"status": 400, "provider_code": "invalid_request_error"},
        ),
        (
            Status(402, _anthropic_error("billing_error", "credit balance too low"), raw=True),
            ErrorClass.BUDGET_EXCEEDED,
            {"status": 402, "provider_code": "billing_error"},
        ),
        (
            Stream((("message_start", {"type": "message_start", "message": {}}),
                    ("error", json.loads(_anthropic_error("overloaded_error", "Overloaded")))),
                   done=False),
            ErrorClass.TRANSIENT_TRANSPORT,
            {"reason": "stream_error", "provider_code": "overloaded_error",
             "provider_message": "Overloaded"},
        ),
        (
            Stream(message_stream({"type": "text", "text": "cut"}, stop_reason=None,
                                  stop=False).chunks, done=False, drop=True),
            ErrorClass.TRANSIENT_TRANSPORT,
            {"reason": "connection"},
        ),
        (
            Stream(message_stream({"type": "text", "text": "cut"}, stop_reason=None,
                                  stop=False).chunks, done=False),
            ErrorClass.TRANSIENT_TRANSPORT,
            {"reason": "stream_truncated"},
        ),
        (
            Stream((*message_stream({"type": "text", "text": "a"}).chunks[:3],
                    ("content_block_delta", '{"type": "content_block_delta", "ind')), done=False),
            ErrorClass.EXECUTION_FAILURE,
            {"reason": "malformed_stream"},
        ),
        (
            Stream((("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": ["text"]}}),),
                   done=False),
            ErrorClass.EXECUTION_FAILURE,
            {"reason": "malformed_stream"},
        ),
        (
            Stream((("content_block_delta", {"type": "content_block_delta", "index": 3,
                                             "delta": {"type": "text_delta", "text": "x"}}),),
                   done=False),
            ErrorClass.EXECUTION_FAILURE,
            {"reason": "malformed_stream"},
        ),
    ],
)  # fmt: skip
async def test_errors_are_classed(
    server: ChatServer, reply: Any, error_class: ErrorClass, details: dict[str, Any]
) -> None:
    """HTTP errors in the Messages error shape, a mid-stream ``error`` event,
    a cut connection, a stream ended early and a corrupted event: each a
    classed failure with the details the host acts on."""
    server.add(reply)
    events = await collect(provider(server), request())
    failed = events[-1]
    assert isinstance(failed, ResponseFailed)
    assert failed.error.error_class is error_class
    assert details.items() <= failed.error.details.items()


async def test_garbage_after_the_stop_reason_is_a_cut_tail(server: ChatServer) -> None:
    """A corrupted event after ``message_delta`` (``message_stop`` cut short)
    is a cut tail: what arrived is the response."""
    whole = message_stream({"type": "text", "text": "all here"}, stop=False)
    server.add(Stream((*whole.chunks, ("message_stop", "{")), done=False, tail="hang"))
    events = await collect(provider(server, tail_timeout=0.2), request())
    assert events[-1] == ResponseCompleted(
        {"role": "assistant", "content": "all here", "finish_reason": "end_turn"}
    )


async def test_an_error_after_the_stop_reason_still_fails(server: ChatServer) -> None:
    """An ``error`` event the server sends after the stop reason is its
    report, not a cut tail."""
    whole = message_stream({"type": "text", "text": "all here"}, stop=False)
    error = ("error", json.loads(_anthropic_error("api_error", "internal")))
    server.add(Stream((*whole.chunks, error), done=False))
    events = await collect(provider(server), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["provider_code"] == "api_error"


async def test_a_stalled_stream_times_out(server: ChatServer) -> None:
    """A stream that goes silent before the stop reason fails ``timeout``
    after ``timeout`` seconds of silence."""
    cut = message_stream({"type": "text", "text": "a"}, stop_reason=None, stop=False)
    server.add(Stream(cut.chunks, done=False, tail="hang"))
    events = await collect(provider(server, timeout=0.3), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["reason"] == "timeout"


async def test_unknown_events_and_pings_are_ignored(server: ChatServer) -> None:
    whole = message_stream({"type": "text", "text": "fine"})
    extra = ("something_new", {"type": "something_new", "x": 1})
    server.add(Stream((whole.chunks[0], extra, *whole.chunks[1:]), done=False))
    events = await collect(provider(server), request())
    assert isinstance(events[-1], ResponseCompleted)
    assert events[-1].message["content"] == "fine"


async def test_echoed_key_is_redacted(server: ChatServer) -> None:
    server.add(Status(401, _anthropic_error("authentication_error", f"bad {CANARY}"), raw=True))
    events = await collect(provider(server), request())
    assert isinstance(events[-1], ResponseFailed)
    assert CANARY not in repr(events[-1].error)
    assert "[redacted]" in events[-1].error.details["provider_message"]


# -- arguments ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"timeout": -1}, "timeout"),
        ({"version": ""}, "version"),
        ({"streaming": 1}, "streaming"),
        ({"extra_body": {"x": float("nan")}}, "extra_body"),
    ],
)
def test_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(Error) as raised:
        AnthropicProvider("m", **options)
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert message in raised.value.message


@pytest.mark.parametrize("key", ["", "k\n", "k\u201c", 42])
def test_a_key_that_is_no_header_value_is_refused_unquoted(key: Any) -> None:
    with pytest.raises(Error) as raised:
        AnthropicProvider("m").stream(request(), {"api_key": key})
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert "printable ASCII" in raised.value.message
    assert raised.value.details == {}


def _message(*content: dict[str, Any], stop_reason: str = "end_turn") -> Completion:
    return Completion(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": list(content),
            "stop_reason": stop_reason,
            "usage": {"input_tokens": 7, "output_tokens": 3},
        }
    )


async def test_a_non_streamed_message_gives_the_same_events(server: ChatServer) -> None:
    """``streaming=False``: one JSON message (``"stream": false``) becomes the
    events its stream would give: thinking kept with its signature, text,
    a tool call with its input, one usage report, the stop reason."""
    server.add(
        _message(THINKING, {"type": "text", "text": "checking"},
                 tool_use("toolu_1", "add", {"a": 1, "b": 2}), stop_reason="tool_use"),
        _message({"type": "text", "text": "cut"}, stop_reason="max_tokens"),
    )  # fmt: skip
    source = provider(server, streaming=False)
    events = await collect(source, request((ProviderTool("add", "", SCHEMA),)))
    assert server.requests[0]["stream"] is False
    assert [e.text for e in events if isinstance(e, ThinkingDelta)] == ["2 + 3 is 5"]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["checking"]
    assert [e for e in events if isinstance(e, ToolCallCompleted)] == [
        ToolCallCompleted("toolu_1", "add", {"a": 1, "b": 2})
    ]
    assert [e.usage for e in events if isinstance(e, Usage)] == [
        {"input_tokens": 7, "output_tokens": 3}
    ]
    done = events[-1]
    assert isinstance(done, ResponseCompleted)
    assert done.message["content"][0] == THINKING
    assert done.message["finish_reason"] == "tool_use"
    cut = (await collect(source, request()))[-1]
    assert isinstance(cut, ResponseFailed)
    assert cut.error.details["reason"] == "finish_max_tokens"


SEARCH = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
          "input": {"query": "trio"}}  # fmt: skip
FOUND = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}


@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "whole"])
async def test_a_paused_turn_is_sent_back_and_continued(
    server: ChatServer, streaming: bool
) -> None:
    """``pause_turn`` (the API stopped a long turn of its server tools):
    the turn so far is sent back as the last assistant message and the
    continuation joins it, one response with every block in order and the
    usage of both messages summed."""
    said = {"type": "text", "text": "searching"}
    done = {"type": "text", "text": "found it"}
    if streaming:
        server.add(
            message_stream(said, SEARCH, FOUND, stop_reason="pause_turn"), message_stream(done)
        )
    else:
        server.add(_message(said, SEARCH, FOUND, stop_reason="pause_turn"), _message(done))
    events = await collect(provider(server, streaming=streaming), request())
    first, second = server.requests
    assert second["messages"] == [
        *first["messages"],
        {"role": "assistant", "content": [said, SEARCH, FOUND]},
    ]
    texts = [(e.index, e.text) for e in events if isinstance(e, TextDelta)]
    assert ["".join(t for i, t in texts if i == n) for n in (0, 1)] == ["searching", "found it"]
    usage = [e.usage for e in events if isinstance(e, Usage)]
    assert usage[-1] == (
        {"input_tokens": 20, "output_tokens": 10}
        if streaming
        else {"input_tokens": 14, "output_tokens": 6}
    )
    completed = events[-1]
    assert isinstance(completed, ResponseCompleted)
    assert completed.message["content"] == [said, SEARCH, FOUND, done]
    assert completed.message["finish_reason"] == "end_turn"


async def test_a_turn_paused_twice_is_sent_back_whole_once(server: ChatServer) -> None:
    """Each continuation sends the transcript and the whole turn so far as
    one assistant message (never the earlier pause's again); usage counts,
    nested ones too, are summed over the three messages."""
    searched = {"input_tokens": 10, "server_tool_use": {"web_search_requests": 1}}
    one, two, three = ({"type": "text", "text": t} for t in ("one", "two", "three"))
    server.add(
        message_stream(one, SEARCH, stop_reason="pause_turn", usage=searched),
        message_stream(two, FOUND, stop_reason="pause_turn", usage=searched),
        message_stream(three),
    )
    events = await collect(provider(server), request())
    first, _, third = server.requests
    assert third["messages"] == [
        *first["messages"],
        {"role": "assistant", "content": [one, SEARCH, two, FOUND]},
    ]
    usage = [e.usage for e in events if isinstance(e, Usage)][-1]
    assert usage["server_tool_use"] == {"web_search_requests": 2}
    assert usage["input_tokens"] == 30
    completed = events[-1]
    assert isinstance(completed, ResponseCompleted)
    assert completed.message["content"] == [one, SEARCH, two, FOUND, three]


async def test_a_turn_paused_past_the_limit_fails(server: ChatServer) -> None:
    """A turn the API keeps pausing ends after ``PAUSES`` continuations:
    ``budget_exceeded`` (``finish_pause_turn``), no further request."""
    server.add(*[message_stream(SEARCH, stop_reason="pause_turn")] * (PAUSES + 1))
    events = await collect(provider(server), request())
    failed = events[-1]
    assert isinstance(failed, ResponseFailed)
    assert failed.error.error_class is ErrorClass.BUDGET_EXCEEDED
    assert failed.error.details["reason"] == "finish_pause_turn"
    assert len(server.requests) == PAUSES + 1
    assert not any(isinstance(e, ResponseCompleted) for e in events)


async def test_a_non_streamed_conversation_runs_its_tool(server: ChatServer) -> None:
    server.add(
        _message(tool_use("toolu_1", "add", {"a": 2, "b": 3}), stop_reason="tool_use"),
        _message({"type": "text", "text": "5"}),
    )
    add = Add()
    snapshot, _ = await approving_run(
        "run-plain", provider(server, streaming=False), MemoryStore(), registry(add)
    )
    assert snapshot.run.state == "completed", snapshot.last_error
    assert add.calls == [{"a": 2, "b": 3}]
    assert server.requests[1]["messages"][-1]["content"][0]["type"] == "tool_result"
