"""Both provider adapters against a third-party model server: llmock
(PyPI, pinned in the test extra), run in-process on a free loopback port.
Its OpenAI and Anthropic routes stream scripted replies, tool calls and
finish reasons, and inject the faults a real API shows; each ends as
``docs/guides/openai.rst`` and ``docs/guides/anthropic.rst`` say.

llmock records request bodies but not headers: a middleware here records
those, to see where the key went.  It emits no thinking blocks: that a
thinking block goes back verbatim is checked on a continued transcript.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import trio
from llmock.scenarios import Fail, Reply, StreamFault, ToolCall
from llmock.simulation import MockResponseSettings
from llmock.testing import LLMockServer

from tests.adapters.provider_runs import (
    CANARY,
    GET_ME,
    Add,
    approving_run,
    assert_no_key,
    registry,
    request,
)
from trio_backplane.adapters._http._aliases import ToolAliases
from trio_backplane.adapters.anthropic import AnthropicProvider
from trio_backplane.adapters.openai import OpenAIProvider
from trio_backplane.errors import ErrorClass
from trio_backplane.kernel import thaw
from trio_backplane.runtime import (
    ResponseFailed,
    open_conversation,
)
from trio_backplane.store import SQLiteStore
from trio_backplane.tools import Authority, ProviderTool

PROVIDERS = ("openai", "anthropic")
ALIAS = ToolAliases([GET_ME, "add"]).alias(GET_ME)


class _Headers:
    """Outermost ASGI middleware: every request's headers, in order."""

    def __init__(self, app: Any, sink: list[dict[str, str]]) -> None:
        self.app, self.sink = app, sink

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/_llmock"):
            self.sink.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


@pytest.fixture(scope="session")
def llmock_peer() -> Iterator[tuple[LLMockServer, list[dict[str, str]]]]:
    # llmock reads rate limits and stream faults from LLMOCK_* variables
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("LLMOCK_")}
    try:
        # tool_mode off: a reply is what a test scripts, never a guess
        server = LLMockServer(responses=MockResponseSettings(tool_mode="off"))
        headers: list[dict[str, str]] = []
        server.app.add_middleware(_Headers, sink=headers)
        with server:
            yield server, headers
    finally:
        os.environ.update(saved)


@pytest.fixture
def peer(
    llmock_peer: tuple[LLMockServer, list[dict[str, str]]],
) -> Iterator[tuple[LLMockServer, list[dict[str, str]]]]:
    server, headers = llmock_peer
    server.state.reset()
    headers.clear()
    yield server, headers
    server.state.reset()


def provider(server: LLMockServer, name: str, **options: Any) -> Any:
    options.setdefault("timeout", 5)
    if name == "openai":
        return OpenAIProvider(server.base_url("openai"), "gpt-mock", **options)
    return AnthropicProvider("claude-mock", base_url=server.base_url("anthropic"), **options)


async def failure_of(source: Any, tools: tuple[ProviderTool, ...] = ()) -> ResponseFailed:
    with trio.fail_after(20):
        events = [e async for e in source.stream(request(tools), {"api_key": CANARY})]
    assert isinstance(events[-1], ResponseFailed), events[-1]
    assert CANARY not in repr(events)
    return events[-1]


def key_header(name: str, headers: dict[str, str]) -> str:
    return headers["authorization"] if name == "openai" else headers["x-api-key"]


def files_hold_no_key(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path


# -- a conversation --------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    [(name, streaming) for name in PROVIDERS for streaming in (True, False)],
    ids=lambda mode: f"{mode[0]}-{'streamed' if mode[1] else 'whole'}",
)
async def test_conversation_with_two_tool_calls_one_approved(
    peer: tuple[LLMockServer, list[dict[str, str]]],
    mode: tuple[str, bool],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two tool calls in one reply (one under an aliased name, one approved
    by the host), then the answer: the run completes on SQLite, the results
    reach llmock in the provider's shape, and the canary key is in the
    key header only: no store row, event, log record or printed line.
    Streamed, and asked for as one JSON response."""
    caplog.set_level(logging.DEBUG)
    name, streaming = mode
    server, headers = peer
    server.state.scenarios.add(
        Reply(tool_calls=(ToolCall(ALIAS, {}), ToolCall("add", {"a": 2, "b": 3}))),
        Reply(text="You are octocat; the sum is 5."),
    )
    add = Add()
    async with SQLiteStore(str(tmp_path / "runs.sqlite3")) as store:
        snapshot, events = await approving_run(
            "run-llmock",
            provider(server, name, streaming=streaming),
            store,
            registry(add, approve_add=True),
        )
        assert snapshot.run.state == "completed", snapshot.last_error
        await assert_no_key(store, "run-llmock", events, snapshot, caplog.text)
    assert add.calls == [{"a": 2, "b": 3}]
    assert [e.payload["request"]["operation"]["tool_name"] for e in events
            if e.type == "interaction_requested"] == ["add"]  # fmt: skip
    messages = [thaw(m) for m in snapshot.messages]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [b["name"] for b in messages[1]["content"]] == [GET_ME, "add"]
    assert messages[-1]["content"] == "You are octocat; the sum is 5."
    first, second = server.state.journal.records(wait=2)
    sent_back = json.dumps(second.body)
    assert '"octocat"' in sent_back
    assert '"5"' in sent_back
    assert first.status == second.status == 200
    assert first.stream is streaming
    assert [key_header(name, h) for h in headers] == [
        f"Bearer {CANARY}" if name == "openai" else CANARY
    ] * 2
    printed = capsys.readouterr()
    assert CANARY not in printed.out + printed.err
    files_hold_no_key(tmp_path)


# -- how a response ends -----------------------------------------------------------

#: what each finish reason fails as: (class, details["reason"]) by provider
CUT = {
    "length": (ErrorClass.BUDGET_EXCEEDED, {"openai": "finish_length",
                                            "anthropic": "finish_max_tokens"}),
    "content_filter": (ErrorClass.FORBIDDEN, {"openai": "finish_content_filter",
                                              "anthropic": "finish_refusal"}),
}  # fmt: skip


@pytest.mark.parametrize("finish", sorted(CUT))
@pytest.mark.parametrize("name", PROVIDERS)
async def test_cut_and_withheld_answers_fail_and_dispatch_nothing(
    peer: tuple[LLMockServer, list[dict[str, str]]], name: str, finish: str, tmp_path: Path
) -> None:
    """A reply cut at the token limit or withheld by a filter fails the run
    with its own class and reason; the tool call it carried never runs."""
    server, _ = peer
    server.state.scenarios.add(
        Reply(text="partial", tool_calls=(ToolCall("add", {"a": 1, "b": 1}),),
              finish_reason=finish)
    )  # fmt: skip
    add = Add()
    async with SQLiteStore(str(tmp_path / "runs.sqlite3")) as store:
        snapshot, _ = await approving_run("run-cut", provider(server, name), store, registry(add))
    error_class, reasons = CUT[finish]
    assert add.calls == []
    assert snapshot.run.state == "failed"
    assert snapshot.last_error is not None
    assert snapshot.last_error.error_class is error_class
    assert snapshot.last_error.details["reason"] == reasons[name]


# -- faults ---------------------------------------------------------------------------


def _retry_after(name: str, error: Any) -> None:
    assert error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert error.details["status"] == 429
    assert error.details["retry_after"] == 2.0  # llmock rounds 1.5 s up
    code = "rate_limit_exceeded" if name == "openai" else "rate_limit_error"
    assert error.details["provider_code"] == code


def _overloaded(name: str, error: Any) -> None:
    assert error.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert error.details["status"] == 529
    assert error.details["provider_code"] == ("overloaded" if name == "openai"
                                              else "overloaded_error")  # fmt: skip


def _unauthorized(name: str, error: Any) -> None:
    assert error.error_class is ErrorClass.FORBIDDEN
    assert error.details["status"] == 401
    assert error.details["provider_code"] == ("invalid_api_key" if name == "openai"
                                              else "authentication_error")  # fmt: skip


def _reason(error_class: ErrorClass, reason: str) -> Callable[[str, Any], None]:
    def check(name: str, error: Any) -> None:
        assert error.error_class is error_class
        assert error.details["reason"] == reason

    return check


FAULTS: dict[str, tuple[Any, Callable[[str, Any], None]]] = {
    "429 with retry-after": (Fail(429, retry_after=1.5), _retry_after),
    "529 overloaded": (Fail(529), _overloaded),
    "401": (Fail(401), _unauthorized),
    "cut stream": (
        StreamFault("disconnect", after_chunks=2),
        _reason(ErrorClass.TRANSIENT_TRANSPORT, "connection"),
    ),
    "truncated stream": (
        StreamFault("truncate", after_chunks=2),
        _reason(ErrorClass.TRANSIENT_TRANSPORT, "stream_truncated"),
    ),
    "corrupted chunk": (
        StreamFault("malformed", after_chunks=1),
        _reason(ErrorClass.EXECUTION_FAILURE, "malformed_stream"),
    ),
    "stall": (
        StreamFault("stall", after_chunks=2, stall_seconds=10.0),
        _reason(ErrorClass.TRANSIENT_TRANSPORT, "timeout"),
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("name", PROVIDERS)
async def test_faults_end_as_documented(
    peer: tuple[LLMockServer, list[dict[str, str]]], name: str, fault: str
) -> None:
    """Each of llmock's faults is one classed ``ResponseFailed`` with the
    details the guides name, and no key in it."""
    server, _ = peer
    behaviour, check = FAULTS[fault]
    server.state.scenarios.add(Reply(text="one two three four five six seven"), behaviour)
    # a stall is a read timeout: short here, the stalled server is let go
    failed = await failure_of(provider(server, name, timeout=0.5 if fault == "stall" else 5))
    check(name, failed.error)
    [record] = server.state.journal.records(wait=2)
    assert record.fault is not None


# -- thinking --------------------------------------------------------------------------


async def test_thinking_block_goes_back_verbatim(
    peer: tuple[LLMockServer, list[dict[str, str]]],
) -> None:
    """A signed thinking block and a redacted one in a continued transcript
    reach llmock's Messages route unchanged, before the tool call, with
    the tool result in the next user turn."""
    server, _ = peer
    server.state.scenarios.add(Reply(text="Continuing."))
    thinking = {"type": "thinking", "thinking": "first look up the user", "signature": "c2ln=="}
    redacted = {"type": "redacted_thinking", "data": "b3BhcXVl"}
    earlier = [
        {"role": "user", "content": "who am I?"},
        {"role": "assistant", "content": [
            thinking, redacted,
            {"type": "tool_call", "id": "toolu_1", "name": GET_ME, "arguments": {}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": GET_ME,
         "result": {"content": "octocat", "is_error": False}},
    ]  # fmt: skip
    tools = registry(Add())
    async with (
        SQLiteStore(":memory:") as store,
        open_conversation(
            "run-thinking",
            store=store,
            provider=provider(server, "anthropic"),
            registry=tools,
            authority=Authority.for_registry(tools, caller="host", run_id="run-thinking"),
            messages=earlier,
            provider_context={"api_key": CANARY},
        ) as conversation,
    ):
        await conversation.prompt("and then?")
        with trio.fail_after(20):
            snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed", snapshot.last_error
    [record] = server.state.journal.records(wait=2)
    assistant = record.body["messages"][1]
    assert assistant["content"][:2] == [thinking, redacted]
    assert assistant["content"][2]["type"] == "tool_use"
    assert record.body["messages"][2]["content"][0]["tool_use_id"] == "toolu_1"
    assert isinstance(snapshot.messages[-1]["content"], str)
