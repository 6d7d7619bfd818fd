"""The OpenAI-compatible provider against a loopback chat-completions server.

``chat_server.ChatServer`` is a real HTTP server on 127.0.0.1 (stdlib, in a
thread) that streams scripted SSE replies; no transport is mocked.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tests.adapters.chat_server import (
    ChatServer,
    Completion,
    Status,
    Stream,
    text_chunks,
    tool_call_chunks,
)
from tests.adapters.provider_runs import CANARY, GET_ME, SCHEMA, Add, GetMe, request
from trio_backplane.adapters.openai import (
    OPENAI_NAME,
    OpenAIProvider,
    ToolAliases,
    transcript_messages,
)
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import encode_record, thaw
from trio_backplane.runtime import (
    Event,
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
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.tools import (
    Authority,
    ProviderTool,
    ToolDescriptor,
    ToolRegistry,
)

#: An image in a user message (MCP's shape), and the part it is sent as.
PIXEL = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
PIXEL_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}

#: A completed answer's message, but for its content: it keeps its finish reason.
STOPPED: dict[str, Any] = {"role": "assistant", "finish_reason": "stop"}


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    with ChatServer().running() as server:
        yield server


async def collect(provider: OpenAIProvider, req: ProviderRequest, key: str = CANARY) -> list[Any]:
    events = []
    with trio.fail_after(10):
        async for event in provider.stream(req, {"api_key": key}):
            events.append(event)
    return events


# -- the whole conversation --------------------------------------------------------


async def test_conversation_with_two_tool_calls(
    chat: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A full run through open_conversation on MemoryStore (real clock): two tool
    calls (one aliased), tool results sent back as tool messages, usage passed
    through, and the canary API key nowhere but the Authorization header."""
    caplog.set_level(logging.DEBUG)
    aliases = ToolAliases([GET_ME, "add"])
    alias = aliases.alias(GET_ME)
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    chat.add(
        tool_call_chunks(
            ("call_a", alias, "{}"), ("call_b", "add", '{"a": 2, "b": 3}'), usage=usage
        ),
        text_chunks("the sum is 5", usage=usage),
    )
    add = Add()
    registry = ToolRegistry(
        [
            ToolDescriptor(GET_ME, {"type": "object"}, GetMe(), description="who am I"),
            ToolDescriptor("add", SCHEMA, add, description="add two integers"),
        ]
    )
    store = MemoryStore()
    provider = OpenAIProvider(chat.base_url, "test-model", timeout=10)
    events: list[Event] = []
    async with open_conversation(
        "run-openai",
        store=store,
        provider=provider,
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id="run-openai"),
        provider_context={"api_key": CANARY},
    ) as conversation:
        channel = conversation.subscribe()
        await conversation.prompt("who am I, and what is 2 + 3?")
        with trio.fail_after(20):
            snapshot = await conversation.wait_settled()
        while True:
            try:
                events.append(channel.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
    assert snapshot.run.state == "completed"
    assert add.calls == [{"a": 2, "b": 3}]
    messages = [thaw(m) for m in snapshot.messages]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = [b for b in messages[1]["content"] if b["type"] == "tool_call"]
    assert [(c["id"], c["name"]) for c in calls] == [("call_a", GET_ME), ("call_b", "add")]
    assert calls[1]["arguments"] == {"a": 2, "b": 3}
    assert messages[2]["name"] == GET_ME
    assert messages[4]["content"] == "the sum is 5"
    assert list(snapshot.usage) == [usage, usage]

    # what the server saw: aliases out, tool messages back
    first, second = chat.requests
    assert first["stream"] is True
    assert [t["function"]["name"] for t in first["tools"]] == ["add", alias]  # name order
    assert first["tools"][0]["function"]["parameters"] == SCHEMA
    assert all(OPENAI_NAME.fullmatch(t["function"]["name"]) for t in first["tools"])
    assistant, tool_a, tool_b = second["messages"][1:4]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == [alias, "add"]
    assert json.loads(assistant["tool_calls"][1]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert tool_a == {"role": "tool", "tool_call_id": "call_a", "content": "octocat"}
    assert tool_b == {"role": "tool", "tool_call_id": "call_b", "content": "5"}

    # events keep the real names
    started = [e.payload["tool_call"]["name"] for e in events if e.type == "tool_call_started"]
    assert started == [GET_ME, "add"]
    assert any(e.type == "usage_updated" for e in events)

    # the canary: sent as the credential, nowhere else
    assert all(h["Authorization"] == f"Bearer {CANARY}" for h in chat.headers)
    assert CANARY not in json.dumps(chat.requests)
    stored = await store.load("run-openai")
    assert stored is not None
    assert CANARY not in json.dumps(encode_record(stored), default=repr)
    assert CANARY not in repr(stored)
    assert CANARY not in repr(events)
    assert CANARY not in repr(snapshot)
    assert CANARY not in caplog.text
    assert CANARY not in repr(provider)
    assert caplog.records  # httpx did log: the key is just not in it


# -- streaming details ----------------------------------------------------------


async def test_stream_events_and_usage(chat: ChatServer) -> None:
    chat.add(
        tool_call_chunks(("call_1", "add", '{"a": 1, "b": 2}'), usage={"total_tokens": 3}),
        text_chunks("hello world"),
    )
    provider = OpenAIProvider(chat.base_url, "m")
    tools = (ProviderTool("add", "", SCHEMA),)
    events = await collect(provider, request(tools))
    kinds = [type(e) for e in events]
    assert kinds[0] is ToolCallStarted
    assert ToolCallArgumentsDelta in kinds
    deltas = "".join(e.delta for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert json.loads(deltas) == {"a": 1, "b": 2}
    assert [e for e in events if isinstance(e, Usage)] == [Usage({"total_tokens": 3})]
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed == [ToolCallCompleted("call_1", "add", {"a": 1, "b": 2})]
    assert isinstance(events[-1], ResponseCompleted)
    events = await collect(provider, request())
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["hello", " world"]
    assert events[-1] == ResponseCompleted(STOPPED | {"content": "hello world"})
    body = chat.requests[1]
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_aliases_are_reversible_and_safe() -> None:
    long_name = "server::" + "x" * 100
    names = [GET_ME, "plain_name", long_name, "a.b", "a_b"]
    aliases = ToolAliases(names)
    seen = set()
    for name in names:
        alias = aliases.alias(name)
        assert OPENAI_NAME.fullmatch(alias), alias
        assert aliases.name(alias) == name
        seen.add(alias)
    assert len(seen) == len(names)
    assert aliases.alias("plain_name") == "plain_name"
    assert aliases.alias("a_b") == "a_b"  # a real name keeps itself; a.b gets a hash
    assert aliases.name("unknown") == "unknown"
    # a real name equal to another name's sanitized stem never collides
    tricky = ToolAliases(["a:b", "a_b_" + ToolAliases(["a:b"]).alias("a:b")[4:]])
    assert (
        len({tricky.alias("a:b"), tricky.alias("a_b_" + ToolAliases(["a:b"]).alias("a:b")[4:])})
        == 2
    )


# -- error mapping -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "error_class", "reason"),
    [
        (Status(429, "slow down"), ErrorClass.TRANSIENT_TRANSPORT, None),
        (Status(503, "overloaded"), ErrorClass.TRANSIENT_TRANSPORT, None),
        (Status(500, "oops"), ErrorClass.TRANSIENT_TRANSPORT, None),
        (Status(401, "bad key"), ErrorClass.FORBIDDEN, None),
        (Status(403, "no"), ErrorClass.FORBIDDEN, None),
        (Status(400, "bad request"), ErrorClass.VALIDATION, None),
        (Status(404, "no model"), ErrorClass.VALIDATION, None),
        (
            Stream(({"choices": [{"index": 0, "delta": {"content": "par"}}]},), drop=True),
            ErrorClass.TRANSIENT_TRANSPORT,
            "connection",
        ),
        (
            Stream(({"choices": [{"index": 0, "delta": {"content": "a"}}]}, "{not json")),
            ErrorClass.EXECUTION_FAILURE,
            "malformed_stream",
        ),
        (Stream(("[1, 2]",)), ErrorClass.EXECUTION_FAILURE, "malformed_stream"),
        (
            Stream(({"choices": [{"index": 0, "delta": {"content": "a"}}]},), done=False),
            ErrorClass.TRANSIENT_TRANSPORT,
            "stream_truncated",
        ),
        (
            Stream(({"error": {"message": "upstream failed"}},)),
            ErrorClass.TRANSIENT_TRANSPORT,
            "stream_error",
        ),
    ],
)
async def test_errors_are_classed(
    chat: ChatServer, reply: Any, error_class: ErrorClass, reason: str | None
) -> None:
    chat.add(reply)
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=5), request())
    assert isinstance(events[-1], ResponseFailed)
    error = events[-1].error
    assert error.error_class is error_class
    if reason is not None:
        assert error.details["reason"] == reason
    if isinstance(reply, Status):
        assert error.details["status"] == reply.status
        assert error.details["provider_message"] == reply.body


async def test_connection_refused_is_transient() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    events = await collect(OpenAIProvider(f"http://127.0.0.1:{port}/v1", "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.TRANSIENT_TRANSPORT


async def test_not_an_event_stream_is_malformed(chat: ChatServer) -> None:
    """A 200 answer that is not text/event-stream is a classed failure."""
    chat.add(Status(200, "json, not sse"))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["reason"] == "malformed_stream"


async def test_echoed_key_is_redacted(chat: ChatServer) -> None:
    chat.add(Status(401, f"invalid key {CANARY}"))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert CANARY not in repr(events[-1].error)
    assert re.search(r"\[redacted\]", events[-1].error.details["provider_message"])


def _fragments(text: str) -> list[str]:
    """Every prefix of the canary of six characters or more found in ``text``."""
    return [CANARY[:n] for n in range(6, len(CANARY) + 1) if CANARY[:n] in text]


@pytest.mark.parametrize("pad", [470, 480, 490, 495, 499])
@pytest.mark.parametrize(
    "reply",
    [
        lambda text: Status(401, text),
        lambda text: Status(500, text, raw=True),
        lambda text: Stream(({"error": {"message": text}},)),
        lambda text: Stream((text,)),  # not JSON: quoted as the malformed detail
    ],
    ids=["http_json", "http_text", "stream_error", "not_json"],
)
async def test_key_straddling_the_cut_is_redacted(chat: ChatServer, pad: int, reply: Any) -> None:
    """PRV-18: a key echoed across the 500-character cut of a provider text
    is redacted before the cut, so not even a prefix of it survives."""
    chat.add(reply("x" * pad + " " + CANARY + " tail"))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert _fragments(repr(events[-1].error)) == []


async def test_key_prefix_the_server_cut_is_redacted(chat: ChatServer) -> None:
    """PRV-18: a key the server itself cut short at the end of its text is
    redacted as well (a prefix of a meaningful length)."""
    chat.add(Status(401, "invalid key " + CANARY[:15]))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    error = events[-1].error
    assert _fragments(repr(error)) == []
    assert error.details["provider_message"] == "invalid key [redacted]"


async def test_no_key_sends_no_authorization(chat: ChatServer) -> None:
    chat.add(text_chunks("ok"))
    provider = OpenAIProvider(chat.base_url, "m")
    with trio.fail_after(10):
        events = [e async for e in provider.stream(request(), None)]
    assert isinstance(events[-1], ResponseCompleted)
    assert "Authorization" not in chat.headers[0]


# -- malformed streams, request shape, options --------------------------------------


def _one(delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta}]}


@pytest.mark.parametrize(
    ("chunk", "detail"),
    [
        ({"choices": {"index": 0}}, "dict"),
        ({"choices": [{"index": 0, "delta": ["text"]}]}, "list"),
        (_one({"tool_calls": ["call"]}), "str"),
        (_one({"tool_calls": 5}), "int"),
        (_one({"tool_calls": {"index": 0}}), "dict"),
        (_one({"tool_calls": [{"index": -1, "function": {"name": "add"}}]}), "-1"),
        (_one({"tool_calls": [{"index": "0", "function": {"name": "add"}}]}), "'0'"),
        (_one({"tool_calls": [{"index": 0, "function": "add"}]}), "function"),
    ],
)
async def test_malformed_chunks_fail_the_attempt_classed(
    chat: ChatServer, chunk: Any, detail: str
) -> None:
    """A chunk of the wrong shape (choices, delta, tool call delta, index,
    function) ends the attempt with one classed ResponseFailed, never a raw
    exception out of the stream."""
    chat.add(Stream((_one({"content": "partial"}), chunk)))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert sum(isinstance(e, ResponseFailed) for e in events) == 1
    error = events[-1].error
    assert error.error_class is ErrorClass.EXECUTION_FAILURE
    assert error.details["reason"] == "malformed_stream"
    assert error.details["detail"] == detail


async def test_reasoning_ids_and_arguments_are_normalized(chat: ChatServer) -> None:
    """Reasoning deltas become ThinkingDelta and a thinking block; other
    choices are ignored; a call without an id gets one from the attempt;
    arguments sent before the name are kept and streamed as one delta once
    the call starts (the deltas join to the arguments); calls start in
    order; empty arguments are ``{}``, and unparsable ones reach the gateway
    as the raw text it then refuses as a validation tool result."""
    chat.add(
        Stream(
            (
                {"choices": None, "usage": {"total_tokens": 1}},
                _one({"reasoning_content": "let me think"}),
                {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
                _one({"content": "calling"}),
                _one({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1,'}}]}),
                _one({"tool_calls": [{"index": 0, "function": {"name": "add"}}]}),
                _one({"tool_calls": [{"index": 0, "function": {"arguments": ' "b": 2}'}}]}),
                _one({"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "add"}}]}),
                _one({"tool_calls": [{"index": 2, "id": "c3", "function": {"name": "add"}}]}),
                _one({"tool_calls": [{"index": 2, "function": {"arguments": "{oops"}}]}),
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            )
        )
    )
    tools = (ProviderTool("add", "", SCHEMA),)
    events = await collect(OpenAIProvider(chat.base_url, "m"), request(tools))
    assert [e.text for e in events if isinstance(e, ThinkingDelta)] == ["let me think"]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["calling"]
    assert [e.usage for e in events if isinstance(e, Usage)] == [{"total_tokens": 1}]
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert [(e.tool_call_id, e.name) for e in started] == [
        ("call_attempt-1_0", "add"),
        ("c2", "add"),
        ("c3", "add"),
    ]
    deltas = [e.delta for e in events if isinstance(e, ToolCallArgumentsDelta)]
    assert deltas == ['{"a": 1, "b": 2}', "{oops"]
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(e.tool_call_id, e.arguments) for e in completed] == [
        ("call_attempt-1_0", {"a": 1, "b": 2}),
        ("c2", {}),
        ("c3", "{oops"),
    ]
    final = events[-1]
    assert isinstance(final, ResponseCompleted)
    blocks = final.message["content"]
    assert blocks[0] == {"type": "thinking", "thinking": "let me think"}
    assert blocks[1] == {"type": "text", "text": "calling"}
    assert [b["id"] for b in blocks[2:]] == ["call_attempt-1_0", "c2", "c3"]


async def test_request_body_carries_the_transcript(chat: ChatServer) -> None:
    """The request body: the system prompt first, then the transcript in
    chat-completions form (user text and image parts, tool calls with
    aliased names and JSON arguments, tool results as text, structured
    content when there is no text), and nothing of our own bookkeeping."""
    chat.add(text_chunks("ok"))
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "a"}, PIXEL]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "let me look"},
                {"type": "tool_call", "id": "c1", "name": GET_ME, "arguments": {"x": 1}},
                {"type": "tool_call", "id": "c2", "name": "add", "arguments": '{"a":1}'},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": GET_ME, "result": {"content": "me"}},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "add",
            "result": {"content": [], "structured_content": {"sum": 1}},
        },
        {"role": "tool", "tool_call_id": "c3", "name": "add", "result": ["raw"]},
        "not a message",
    ]
    tools = (ProviderTool(GET_ME, "who", {"type": "object"}), ProviderTool("add", "", SCHEMA))
    provider = OpenAIProvider(chat.base_url, "m", system="You are terse.", extra_body={"seed": 7})
    events = await collect(provider, request(tools, messages))
    assert isinstance(events[-1], ResponseCompleted)
    body = chat.requests[0]
    alias = ToolAliases([GET_ME, "add"]).alias(GET_ME)
    assert body["model"] == "m"
    assert body["seed"] == 7
    assert body["messages"][:3] == [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, PIXEL_PART]},
    ]
    assistant = body["messages"][3]
    assert assistant["content"] == "let me look"
    assert [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in assistant["tool_calls"]
    ] == [("c1", alias, '{"x":1}'), ("c2", "add", '{"a":1}')]
    tool_texts = [(m["tool_call_id"], m["content"]) for m in body["messages"][4:]]
    assert tool_texts == [("c1", "me"), ("c2", '{"sum": 1}'), ("c3", '["raw"]')]
    assert [t["function"]["name"] for t in body["tools"]] == [alias, "add"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": "ftp://example.test"},
        {"base_url": 7},
        {"model": ""},
        {"timeout": 0},
        {"timeout": float("nan")},
        {"timeout": float("inf")},
        {"timeout": True},
        {"tail_timeout": 0},
        {"tail_timeout": float("inf")},
        {"tail_timeout": "1"},
    ],
)
def test_bad_options_are_refused_up_front(kwargs: dict[str, Any]) -> None:
    options: dict[str, Any] = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(Error) as exc:
        OpenAIProvider(**options)
    assert exc.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize(
    "key", ["", 5, "sk-\u201ccurly\u201d", "sk-new\nline", "sk-nul\x00", " sk-padded", "sk-\u00e9"]
)
async def test_bad_api_key_is_refused_before_any_request(chat: ChatServer, key: Any) -> None:
    """A key that is no HTTP header text (a pasted curly quote, a newline)
    is refused as validation before any request, and the error never
    quotes it (httpx failed on it unclassed, naming the character)."""
    provider = OpenAIProvider(chat.base_url, "m")
    with pytest.raises(Error) as exc:
        provider.stream(request(), {"api_key": key})
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert chat.requests == []
    if isinstance(key, str) and key:
        assert key.strip() not in str(exc.value.to_dict())


async def test_silent_server_times_out_as_transient() -> None:
    """A server that accepts the connection and never answers: the attempt
    fails ``transient_transport`` with reason ``timeout`` once the provider's
    own timeout passes (real clock: the wait is in the socket layer)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        provider = OpenAIProvider(f"http://127.0.0.1:{port}/v1", "m", timeout=0.3)
        events = await collect(provider, request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert events[-1].error.details["reason"] == "timeout"


async def test_http_error_with_a_plain_text_body(chat: ChatServer) -> None:
    """An error answer that is not JSON keeps its text as the provider message."""
    chat.add(Status(502, "bad gateway from the proxy", raw=True))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    error = events[-1].error
    assert error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert error.details == {"status": 502, "provider_message": "bad gateway from the proxy"}


async def test_chunks_after_done_are_never_read(chat: ChatServer) -> None:
    """What a server sends after ``[DONE]`` is ignored: ``[DONE]`` ends the
    response and the HTTP stream is closed (cleanly, no generator left)."""
    chat.add(Stream((_one({"content": "first"}), "[DONE]", _one({"content": "ignored"}), "")))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["first"]
    # no finish reason came: the message has none
    assert events[-1] == ResponseCompleted({"role": "assistant", "content": "first"})


_DEEP = "[" * 100_000 + "]" * 100_000


async def test_deeply_nested_chunk_is_malformed(chat: ChatServer) -> None:
    """PRV-07: a chunk nested too deep to parse (a ``RecursionError``, not a
    ``ValueError``) is one classed ``malformed_stream`` failure, never a raw
    exception out of the stream."""
    chat.add(Stream((_one({"content": "a"}), _DEEP)))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    error = events[-1].error
    assert error.error_class is ErrorClass.EXECUTION_FAILURE
    assert error.details["reason"] == "malformed_stream"


async def test_deeply_nested_arguments_stay_text(chat: ChatServer) -> None:
    """Tool-call arguments nested too deep to parse come through as their raw
    text, like any other arguments that are not JSON (the gateway refuses
    them as a validation tool result)."""
    chat.add(tool_call_chunks(("c1", "add", _DEEP)))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed.arguments == _DEEP
    assert isinstance(events[-1], ResponseCompleted)


async def test_deeply_nested_error_body_keeps_its_status(chat: ChatServer) -> None:
    """An HTTP error whose JSON body is nested too deep to parse is classed by
    its status, with its text (cut) as the provider message, like any other
    body that is not JSON."""
    chat.add(Status(400, '{"error": ' + _DEEP + "}", raw=True))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    error = events[-1].error
    assert error.error_class is ErrorClass.VALIDATION
    assert error.details["status"] == 400
    assert error.details["provider_message"] == ('{"error": ' + _DEEP)[:500]


_LONE = '{"choices": [{"index": 0, "delta": {"content": "a\\ud800b\\uDC00c\\ud83d\\ude00"}}]}'


async def test_lone_surrogates_become_replacement_characters(chat: ChatServer) -> None:
    """A lone UTF-16 surrogate escape in a chunk (valid JSON) decodes to
    U+FFFD, as invalid UTF-8 bytes do; a surrogate pair stays its character.
    Tool-call arguments get the same treatment."""
    chat.add(
        Stream((_LONE,)),
        tool_call_chunks(("c1", "add", '{"a": "x\\uD801y", "b": "\\ud83d\\ude00"}')),
    )
    provider = OpenAIProvider(chat.base_url, "m")
    events = await collect(provider, request())
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["a\ufffdb\ufffdc\U0001f600"]
    events = await collect(provider, request())
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed.arguments == {"a": "x\ufffdy", "b": "\U0001f600"}


async def test_lone_surrogate_text_commits_on_sqlite(chat: ChatServer, tmp_path: Any) -> None:
    """A streamed lone surrogate never reaches the transcript, so the
    provider completion commits on SQLite (no storage_failed)."""
    chat.add(Stream((_LONE, _STOP)))
    async with (
        SQLiteStore(str(tmp_path / "runs.db")) as store,
        open_conversation(
            "run-1", store=store, provider=OpenAIProvider(chat.base_url, "m")
        ) as conversation,
    ):
        with trio.fail_after(10):
            await conversation.prompt("hi")
            snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert snapshot.messages[-1]["content"] == "a\ufffdb\ufffdc\U0001f600"


async def test_a_surrogate_pair_split_across_chunks_stays_one_character(
    chat: ChatServer,
) -> None:
    """A server slicing text by UTF-16 units splits a surrogate pair across
    two chunks (each then a lone surrogate escape): the pair is joined back
    into its character in the deltas and the message, never two U+FFFD; a
    high surrogate at the very end is U+FFFD.  Thinking and tool-call
    argument fragments likewise."""
    chat.add(
        Stream(
            (
                '{"choices": [{"index": 0, "delta": {"content": "a\\ud83d"}}]}',
                '{"choices": [{"index": 0, "delta": {"content": "\\ude00b\\ud83d"}}]}',
            )
        ),
        Stream(
            (
                '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1",'
                ' "function": {"name": "add", "arguments": "{\\"a\\": \\"x\\ud83d"}}]}}]}',
                '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,'
                ' "function": {"arguments": "\\ude00\\"}"}}]}}]}',
            )
        ),
    )
    provider = OpenAIProvider(chat.base_url, "m")
    events = await collect(provider, request())
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["a", "\U0001f600b"]
    assert events[-1] == ResponseCompleted({"role": "assistant", "content": "a\U0001f600b\ufffd"})
    events = await collect(provider, request())
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed.arguments == {"a": "x\U0001f600"}


_STOP = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


@pytest.mark.parametrize("tail", ["drop", "reset", "hang"])
async def test_done_ends_the_response_at_once(chat: ChatServer, tail: str) -> None:
    """PRV-03: ``[DONE]`` ends the response: the provider stops reading and
    closes it, so a connection that then drops, resets or stays open does
    not turn a whole response into a failure."""
    chat.add(Stream((_one({"content": "hello"}), _STOP), tail=tail))
    with trio.fail_after(5):  # well under the provider's read timeout
        events = await collect(OpenAIProvider(chat.base_url, "m", timeout=30), request())
    assert events[-1] == ResponseCompleted(STOPPED | {"content": "hello"})


@pytest.mark.parametrize("tail", ["drop", "reset", "hang"])
async def test_a_finished_response_survives_a_lost_tail(chat: ChatServer, tail: str) -> None:
    """PRV-16: after a finish reason, a connection lost (or a read timeout)
    before ``[DONE]`` completes the response with what arrived; the usage
    that never came is not invented."""
    chat.add(Stream((_one({"content": "hello"}), _STOP), done=False, tail=tail))
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=0.3), request())
    assert events[-1] == ResponseCompleted(STOPPED | {"content": "hello"})
    assert not any(isinstance(e, Usage) for e in events)


@pytest.mark.parametrize("usage", [False, True])
async def test_a_server_silent_after_the_finish_reason_costs_the_tail_timeout(
    chat: ChatServer, usage: bool
) -> None:
    """PRV-16: after a finish reason, a server that keeps the connection
    open without ``[DONE]`` completes the response once ``tail_timeout`` has
    passed, not the read timeout; usage that arrived meanwhile is kept."""
    report = {"choices": [], "usage": {"total_tokens": 3}}
    chunks = (_one({"content": "hello"}), _STOP, *([report] if usage else []))
    chat.add(Stream(chunks, done=False, tail="hang"))
    provider = OpenAIProvider(chat.base_url, "m", timeout=30, tail_timeout=0.2)
    start = trio.current_time()
    with trio.fail_after(5):  # well under the read timeout
        events = await collect(provider, request())
    assert trio.current_time() - start >= 0.2
    assert events[-1] == ResponseCompleted(STOPPED | {"content": "hello"})
    assert [e for e in events if isinstance(e, Usage)] == (
        [Usage({"total_tokens": 3})] if usage else []
    )


async def test_prv_04_a_finish_on_another_choice_does_not_end_the_response(
    chat: ChatServer,
) -> None:
    """PRV-04: only the choice read (index 0) can finish the response: a
    finish reason on choice 1 followed by a lost connection leaves choice 0
    unfinished, a transient failure, not a truncated answer."""
    other = {"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]}
    chat.add(Stream((_one({"content": "The answer is"}), other), done=False, tail="drop"))
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=5), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert events[-1].error.details["reason"] == "connection"


async def test_a_byte_order_mark_does_not_hide_the_first_event(chat: ChatServer) -> None:
    """A stream opening with a UTF-8 byte order mark (which the SSE
    specification drops) keeps its first event."""
    chat.add(Stream((_one({"content": "Hello"}), _STOP), prefix=b"\xef\xbb\xbf"))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert events[-1] == ResponseCompleted(STOPPED | {"content": "Hello"})


@pytest.mark.parametrize(
    ("prefix", "chunk"),
    [
        (b"", {"error": "upstream model overloaded"}),
        (b"event: error\ndata: upstream model overloaded\n\n", None),
    ],
    ids=["bare-error", "error-event"],
)
async def test_prv_04_an_error_in_the_stream_fails_the_response_in_any_shape(
    chat: ChatServer, prefix: bytes, chunk: Any
) -> None:
    """PRV-04: a stream error sent as a bare message (``{"error": "..."}``)
    or as an SSE ``event: error`` fails the response like an error object:
    ``transient_transport``, reason ``stream_error``, never a success."""
    chunks = (_one({"content": "Hi"}), *([chunk] if chunk else []), _STOP)
    chat.add(Stream(chunks, prefix=prefix))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert events[-1].error.details["reason"] == "stream_error"
    assert "overloaded" in events[-1].error.details["provider_message"]


def _calls(*deltas: dict[str, Any]) -> Stream:
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    return Stream((*(_one({"tool_calls": [d]}) for d in deltas), finish))


async def test_prv_07_a_tool_name_streamed_in_pieces_is_joined(chat: ChatServer) -> None:
    """PRV-07: a function name sent in several deltas is the whole name (a
    truncated one could name another tool), and the argument deltas join to
    the arguments."""
    chat.add(
        _calls(
            {"index": 0, "id": "c1", "function": {"name": "delete"}},
            {"index": 0, "function": {"name": "_all_files"}},
            {"index": 0, "function": {"arguments": '{"a":'}},
            {"index": 0, "function": {"arguments": "1}"}},
        )
    )
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    [started] = [e for e in events if isinstance(e, ToolCallStarted)]
    assert (started.tool_call_id, started.name) == ("c1", "delete_all_files")
    deltas = "".join(e.delta for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert deltas == '{"a":1}'
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert (completed.name, completed.arguments) == ("delete_all_files", {"a": 1})


@pytest.mark.parametrize(
    "deltas",
    [
        (
            {"index": 0, "id": "call_1", "function": {"name": "add", "arguments": '{"a":1}'}},
            {"index": 0, "id": "call_2", "function": {"name": "mul", "arguments": '{"b":2}'}},
        ),
        ({"index": 0, "function": {"arguments": "{}"}},),
        ({"index": 0, "id": 7, "function": {"name": "add"}},),
        ({"index": 0, "id": "c1", "function": {"name": ["add"]}},),
        (
            {"index": 0, "id": "c1", "function": {"name": "add", "arguments": "{"}},
            {"index": 0, "function": {"name": "_more"}},
        ),
    ],
    ids=["new-id-at-one-index", "no-name", "id-not-a-string", "name-not-a-string", "late-name"],
)
async def test_prv_07_a_malformed_tool_call_fails_the_response(
    chat: ChatServer, deltas: tuple[dict[str, Any], ...]
) -> None:
    """PRV-07: tool-call deltas that cannot make one well-formed call (a new
    id at an index, no name, an id or name that is not a string, a name
    continued after its arguments began) fail the response as a malformed
    stream; no call is merged, invented or emitted with an empty name."""
    chat.add(_calls(*deltas))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["reason"] == "malformed_stream"
    assert not any(isinstance(e, ToolCallCompleted) for e in events)
    assert all(e.name for e in events if isinstance(e, ToolCallStarted))


async def test_prv_07_a_server_repeating_the_whole_name_each_delta_makes_one_call(
    chat: ChatServer,
) -> None:
    """PRV-07: some servers send the id and the whole function name with
    every delta: that is one call named once, not a name continued."""
    chat.add(
        _calls(
            {"index": 0, "id": "c1", "function": {"name": "add", "arguments": ""}},
            {"index": 0, "id": "c1", "function": {"name": "add", "arguments": '{"a":'}},
            {"index": 0, "id": "c1", "function": {"name": "add", "arguments": "1}"}},
        )
    )
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert [e.name for e in events if isinstance(e, ToolCallStarted)] == ["add"]
    completed = [(e.name, e.arguments) for e in events if isinstance(e, ToolCallCompleted)]
    assert completed == [("add", {"a": 1})]


async def test_prv_07_deltas_without_an_index_continue_the_call(chat: ChatServer) -> None:
    """PRV-07: a server that omits ``index``: a delta naming a call starts
    one, a delta carrying only arguments continues the last one."""
    chat.add(
        _calls(
            {"id": "c1", "function": {"name": "add", "arguments": '{"a":'}},
            {"function": {"arguments": "1}"}},
            {"id": "c2", "function": {"name": "add", "arguments": "{}"}},
        )
    )
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    completed = [(e.tool_call_id, e.arguments) for e in events if isinstance(e, ToolCallCompleted)]
    assert completed == [("c1", {"a": 1}), ("c2", {})]


@pytest.mark.parametrize("tail", ["end", "drop", "hang"])
async def test_no_finish_reason_is_still_a_failure(chat: ChatServer, tail: str) -> None:
    """PRV-04: a stream that ends before any finish reason stays a classed failure."""
    chat.add(Stream((_one({"content": "par"}),), done=False, tail=tail))
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=0.3), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.TRANSIENT_TRANSPORT


async def test_done_then_a_silent_connection_completes_the_run(chat: ChatServer) -> None:
    """PRV-03: in a conversation, a server that keeps the connection open
    after ``[DONE]`` neither times the attempt out nor makes it uncertain."""
    chat.add(Stream((_one({"content": "hello"}), _STOP), tail="hang"))
    async with open_conversation(
        "run-1",
        store=MemoryStore(),
        provider=OpenAIProvider(chat.base_url, "m", timeout=30),
        effect_timeout=2.0,
    ) as conversation:
        with trio.fail_after(10):
            await conversation.prompt("hi")
            snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert snapshot.messages[-1]["content"] == "hello"


async def test_nan_from_the_model_never_reaches_the_transcript(chat: ChatServer) -> None:
    """``NaN``/``Infinity`` are not JSON: tool-call arguments holding one
    come through as their raw text (which the gateway refuses as a
    validation tool result, so the model can try again), and a chunk holding
    one is a malformed stream, not a value the runtime could not commit."""
    chat.add(
        tool_call_chunks(("c1", "add", '{"a": NaN, "b": 1}')),
        Stream(
            (
                {"choices": [], "usage": {"total_tokens": "NaN"}},
                '{"choices": [], "usage": {"t": Infinity}}',
            )
        ),
    )
    provider = OpenAIProvider(chat.base_url, "m")
    events = await collect(provider, request((ProviderTool("add", "", SCHEMA),)))
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed.arguments == '{"a": NaN, "b": 1}'
    assert isinstance(events[-1], ResponseCompleted)
    events = await collect(provider, request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["reason"] == "malformed_stream"


# -- hostile servers: the failure a server reports, bounded reads ------------------

_MID_STREAM_ERROR = {"error": {"message": "context_length_exceeded: too many tokens"}}


async def _failed_within_seconds(chat: ChatServer) -> Error:
    """The error of an attempt (read timeout 30 s, tail_timeout 0.5 s) that
    must end in seconds, not at a read timeout."""
    provider = OpenAIProvider(chat.base_url, "m", timeout=30.0, tail_timeout=0.5)
    start = trio.current_time()
    events = await collect(provider, request())
    assert trio.current_time() - start < 5.0
    assert isinstance(events[-1], ResponseFailed)
    return events[-1].error


@pytest.mark.parametrize(
    "stream",
    [
        Stream((_MID_STREAM_ERROR,), done=True, tail="hang"),  # [DONE], then silence
        Stream((_MID_STREAM_ERROR,), done=False, tail="hang"),  # silence, no [DONE]
        Stream((_MID_STREAM_ERROR,), done=False, drop=True),  # then the connection drops
    ],
    ids=["done-then-silent", "silent", "dropped"],
)
async def test_prv_07_an_error_reported_mid_stream_is_the_failure(
    chat: ChatServer, stream: Stream
) -> None:
    """PRV-07: an error event mid-stream is the response's failure, with the
    server's message: after it ``[DONE]`` ends the read at once, silence
    costs ``tail_timeout`` (not the read timeout), and a dropped connection
    does not replace it with a transport error."""
    chat.add(stream)
    error = await _failed_within_seconds(chat)
    assert error.details["reason"] == "stream_error", error
    assert error.details["provider_message"] == "context_length_exceeded: too many tokens"


async def test_prv_13_an_event_that_never_ends_is_refused_as_it_grows(chat: ChatServer) -> None:
    """PRV-13: a server sending one line that never ends (here 9 MiB, then
    silence) is a malformed stream once the line passes 8 MiB: refused as
    it grows, never held whole, not waited out."""
    chat.add(Stream((), done=False, prefix=b"data: " + b"x" * (9 * 1024 * 1024), tail="hang"))
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=30.0), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.EXECUTION_FAILURE
    assert events[-1].error.message == "stream event is too large"


async def test_prv_05_a_number_no_double_holds_stays_out_of_the_transcript(
    chat: ChatServer,
) -> None:
    """PRV-05: tool arguments holding a number that overflows a double
    (``1e999``, valid JSON Python reads as ``inf``) arrive as their text, as
    NaN does (the gateway refuses them as a validation tool result); usage
    holding one is a malformed stream, classed, never a raw exception."""
    chat.add(tool_call_chunks(("c1", "add", '{"a": 1e999, "b": 1}')))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed.arguments == '{"a": 1e999, "b": 1}'
    chat.add(Stream(({"choices": [], "usage": {"total_tokens": 1e999}},)))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["reason"] == "malformed_stream"


def _call_chunk(**call: Any) -> dict[str, Any]:
    """A chunk of one tool-call delta (``call`` as the server sends it)."""
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


_CALLS_DONE = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}


async def test_prv_a_delta_without_index_repeating_the_last_id_continues_that_call(
    chat: ChatServer,
) -> None:
    """A tool-call delta without an index that repeats the last call's id
    continues that call (as one naming nothing does): one call, whole."""
    chat.add(
        Stream(
            (
                _call_chunk(
                    id="c1", type="function", function={"name": "add", "arguments": '{"a":'}
                ),
                _call_chunk(id="c1", function={"arguments": " 1}"}),
                _CALLS_DONE,
            )
        )
    )
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    completed = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert [(c.tool_call_id, c.name, c.arguments) for c in completed] == [("c1", "add", {"a": 1})]


async def test_prv_argument_deltas_split_inside_a_surrogate_pair_are_unicode(
    chat: ChatServer,
) -> None:
    """A server splitting tool arguments by UTF-16 units sends each half of
    a surrogate pair in its own delta: every ``ToolCallArgumentsDelta`` is
    still Unicode text (encodable as UTF-8), and they join to the arguments."""
    halves = ('{"s": "\ud83d', '\ude00"}')  # each a lone surrogate once the chunk is read
    first = {"name": "add", "arguments": ""}
    chat.add(
        Stream(
            (
                _call_chunk(index=0, id="c1", type="function", function=first),
                *(_call_chunk(index=0, function={"arguments": half}) for half in halves),
                _CALLS_DONE,
            )
        )
    )
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    deltas = [e.delta for e in events if isinstance(e, ToolCallArgumentsDelta)]
    for delta in deltas:
        delta.encode("utf-8")  # no lone surrogate
    [completed] = [e for e in events if isinstance(e, ToolCallCompleted)]
    assert completed.arguments == {"s": "\U0001f600"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"error": "model llama3 not found"}', "model llama3 not found"),
        ('{"object": "error", "message": "bad model", "code": 404}', "bad model"),
        ('{"detail": "Not Found"}', "Not Found"),
    ],
)
async def test_http_error_bodies_of_other_servers_keep_their_message(
    chat: ChatServer, body: str, message: str
) -> None:
    """The server's message of the JSON error shapes other OpenAI-compatible
    servers use (a string ``error``, a top-level ``message``, FastAPI's
    ``detail``) is kept, as the text of a non-JSON body is."""
    chat.add(Status(404, body, raw=True))
    events = await collect(OpenAIProvider(chat.base_url, "m"), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.details["provider_message"] == message


async def test_prv_07_a_reported_error_wins_over_an_oversized_event_after_it(
    chat: ChatServer,
) -> None:
    """PRV-07: an error reported mid-stream, then an event past the bound
    while the stream is drained: the failure is the reported one (its class
    and message), not the malformed event after it."""
    chat.add(Stream((_MID_STREAM_ERROR, "x" * (9 * 1024 * 1024)), done=False, tail="hang"))
    events = await collect(OpenAIProvider(chat.base_url, "m", tail_timeout=5.0), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert events[-1].error.details["provider_message"] == (
        "context_length_exceeded: too many tokens"
    )


async def test_prv_13_many_tiny_data_lines_count_what_they_hold(chat: ChatServer) -> None:
    """PRV-13: the event bound counts what each data line costs, not only
    its characters: 200,000 one-character data lines in one event are
    refused as too large, not held as 200,000 strings."""
    chat.add(Stream(("x" + "\ndata:x" * 200_000,), done=False, tail="hang"))
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=30.0), request())
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.message == "stream event is too large"


async def test_an_error_status_whose_body_stalls_keeps_its_class(chat: ChatServer) -> None:
    """An error response whose body stops half way (a server that announced
    more than it sends) is classed by its status, with what arrived as the
    message, after ``tail_timeout``: not a retryable read timeout."""
    chat.add(Status(401, "invalid api key", stall=True))
    error = await _failed_within_seconds(chat)
    assert error.error_class is ErrorClass.FORBIDDEN, error
    assert "invalid api key" in error.details["provider_message"]


async def test_a_rate_limit_keeps_its_retry_after_and_code_and_a_spent_quota_is_apart(
    chat: ChatServer,
) -> None:
    """A 429 says how long to wait (``retry-after``, for the host, which
    owns retries) and the provider's code; one for an exhausted quota is
    ``budget_exceeded``, not a transient failure a retry would repeat."""
    chat.add(
        Status(429, "slow down", code="rate_limit_exceeded", headers={"retry-after": "2"}),
        Status(429, "You exceeded your current quota", code="insufficient_quota"),
    )
    provider = OpenAIProvider(chat.base_url, "m", timeout=5)
    limited = (await collect(provider, request()))[-1].error
    assert limited.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert limited.details["retry_after"] == 2.0
    assert limited.details["provider_code"] == "rate_limit_exceeded"
    spent = (await collect(provider, request()))[-1].error
    assert spent.error_class is ErrorClass.BUDGET_EXCEEDED
    assert spent.details["provider_code"] == "insufficient_quota"
    assert "retry_after" not in spent.details


def test_a_user_image_is_sent_as_a_data_url() -> None:
    """A user message's image (MCP's shape) goes as an ``image_url`` part
    holding a data URL, beside its text, in order."""
    said = [{"type": "text", "text": "what is this?"}, PIXEL]
    sent = transcript_messages([{"role": "user", "content": said}], ToolAliases([]))
    assert sent == [
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, PIXEL_PART]}
    ]


async def test_a_user_block_the_api_cannot_take_fails_the_turn(chat: ChatServer) -> None:
    """A prompt holding a block that is neither text nor an image: the turn
    fails ``unsupported_capability`` naming its type, and no request left
    (never the message without it)."""
    provider = OpenAIProvider(chat.base_url, "m")
    async with open_conversation("audio", store=MemoryStore(), provider=provider) as conversation:
        with trio.fail_after(10):
            await conversation.prompt([{"type": "text", "text": "listen"}, {"type": "audio"}])
            snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "failed"
    assert snapshot.last_error is not None
    assert snapshot.last_error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert snapshot.last_error.details == {"type": "'audio'"}
    assert chat.requests == []


def test_a_tool_result_s_images_are_noted_in_its_text() -> None:
    """A tool message carries text only: the images of a result are named
    after its text, never dropped unsaid."""
    result = {"content": [{"type": "text", "text": "drawn"}, PIXEL]}
    sent = transcript_messages(
        [{"role": "tool", "tool_call_id": "c1", "name": "draw", "result": result}], ToolAliases([])
    )
    assert sent[0]["content"] == (
        "drawn\n[1 image(s) of the tool result left out: a tool message of this API"
        " carries text only]"
    )


def test_an_empty_answer_is_sent_back_as_an_empty_string() -> None:
    """An assistant message with no text and no calls goes back as content
    ``""``: a null content is refused without ``tool_calls`` beside it."""
    sent = transcript_messages(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], ToolAliases([])
    )
    assert sent[1] == {"role": "assistant", "content": ""}


def _finishing(reason: str, *delta: dict[str, Any]) -> Stream:
    chunks = [{"choices": [{"index": 0, "delta": d}]} for d in delta]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
    return Stream(tuple(chunks))


_CUT_CALL = {
    "tool_calls": [
        {"index": 0, "id": "c1", "type": "function",
         "function": {"name": "lookup", "arguments": '{"q": "tr'}}
    ]
}  # fmt: skip


@pytest.mark.parametrize(
    ("reason", "delta", "error_class"),
    [
        ("length", {"content": "a cut answ"}, ErrorClass.BUDGET_EXCEEDED),
        ("length", _CUT_CALL, ErrorClass.BUDGET_EXCEEDED),
        ("content_filter", {"content": ""}, ErrorClass.FORBIDDEN),
    ],
    ids=["length-text", "length-call", "content-filter"],
)
async def test_a_cut_or_withheld_response_fails_with_its_finish_reason(
    chat: ChatServer, reason: str, delta: dict[str, Any], error_class: ErrorClass
) -> None:
    """``finish_reason`` ``length`` or ``content_filter``: the response
    fails naming it (a call it cut is never completed, so never
    dispatched; a cut answer never passes for a whole one); any other
    finish reason is kept on the completed message."""
    chat.add(_finishing(reason, delta), _finishing("stop", {"content": "fine"}))
    provider = OpenAIProvider(chat.base_url, "m", timeout=5)
    events = await collect(provider, request())
    assert not any(isinstance(e, ToolCallCompleted) for e in events)
    assert isinstance(events[-1], ResponseFailed)
    assert events[-1].error.error_class is error_class
    assert events[-1].error.details["finish_reason"] == reason
    completed = (await collect(provider, request()))[-1]
    assert completed == ResponseCompleted(STOPPED | {"content": "fine"})


async def test_garbage_after_the_finish_reason_is_a_cut_tail_not_a_failure(
    chat: ChatServer,
) -> None:
    """A chunk that is no JSON after the finish reason and usage arrived
    (``[DONE]`` cut to ``[DO``) ends the response as a cut connection there
    would: it completes with what arrived."""
    text = text_chunks("hello", usage={"prompt_tokens": 1, "completion_tokens": 1})
    chat.add(Stream((*text.chunks, "[DO"), done=False))
    events = await collect(OpenAIProvider(chat.base_url, "m", timeout=5), request())
    assert events[-1] == ResponseCompleted(STOPPED | {"content": "hello"})


async def test_a_non_streamed_completion_when_asked(chat: ChatServer) -> None:
    """``streaming=False`` asks for one JSON completion (``"stream": false``)
    and reads it into the same events: text, tool calls, usage, the finish
    reason; an error status is classed as when streaming."""
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}},
        ],
    }
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    chat.add(
        Completion({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                    "usage": usage}),
        Completion({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                 "finish_reason": "stop"}]}),
        Status(429, "slow down", headers={"retry-after": "3"}),
    )  # fmt: skip
    provider = OpenAIProvider(chat.base_url, "m", timeout=5, streaming=False)
    events = await collect(provider, request())
    assert chat.requests[0]["stream"] is False
    assert "stream_options" not in chat.requests[0]
    calls = [
        (e.tool_call_id, e.name, e.arguments) for e in events if isinstance(e, ToolCallCompleted)
    ]
    assert calls == [("c1", "lookup", {}), ("c2", "add", {"a": 1})]
    assert any(isinstance(e, Usage) and e.usage["prompt_tokens"] == 3 for e in events)
    assert events[-1].message["finish_reason"] == "tool_calls"
    text = await collect(provider, request())
    assert text[-1] == ResponseCompleted(STOPPED | {"content": "hi"})
    refused = (await collect(provider, request()))[-1]
    assert isinstance(refused, ResponseFailed)
    assert refused.error.details["retry_after"] == 3.0
