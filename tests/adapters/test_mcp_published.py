"""The adapter against MCP servers nobody here wrote: the reference
``@modelcontextprotocol/server-everything`` (npm, run by the project's
JavaScript engine from PyPI, Deno) over stdio and streamable HTTP, and
``mcp-server-time`` (PyPI).  Listed, admitted, called with valid and invalid
arguments, structured results validated, a task-only tool run as a task,
conversations completed.

Deno fetches the npm package on first use: without a registry the tests
skip, and fail when ``CI`` is set."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from tests.adapters.test_mcp import converse
from tests.prerequisites import unavailable
from trio_backplane.adapters.mcp import McpToolSource, connect_stdio, connect_streamable_http
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.runtime import open_conversation
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider

S = ScriptedProvider
EVERYTHING = "npm:@modelcontextprotocol/server-everything@2026.8.31"
RESEARCH = "simulate-research-query"

# The SDK's streamable-HTTP client drops its SSE response streams unclosed
# when a session ends; under Trio their finalizer warns (test_mcp_http.py).
pytestmark = pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)2\.:ResourceWarning")


def _unavailable(reason: str) -> None:
    unavailable(reason, tests="the published-server")


def _deno() -> str:
    try:
        import deno
    except ImportError:
        _unavailable("the deno package is not installed (the test extra installs it)")
    return str(deno.find_deno_bin())


@pytest.fixture(scope="module")
def everything() -> list[str]:
    """The server's command line, its npm package fetched into Deno's cache."""
    command = [_deno(), "run", "-A", "--quiet", EVERYTHING]
    fetched = subprocess.run(
        [_deno(), "cache", "--quiet", EVERYTHING],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if fetched.returncode != 0:
        _unavailable(f"deno could not fetch {EVERYTHING}: {fetched.stderr[-300:]}")
    return command


@asynccontextmanager
async def stdio(command: list[str], **options: Any) -> AsyncIterator[McpToolSource]:
    with trio.fail_after(120):
        async with connect_stdio(command[0], [*command[1:], "stdio"], **options) as source:
            yield source


async def test_server_everything_lists_admits_and_validates(everything: list[str]) -> None:
    """Every tool listed and admitted; a valid call answers, an invalid one
    is refused before it is sent; a structured result is validated."""
    async with stdio(
        everything, validate_arguments=True, validate_structured_content=True
    ) as source:
        names = {d.name for d in source.descriptors}
        assert {"echo", "get-sum", "get-structured-content", RESEARCH} <= names
        assert source.rejected == ()
        bundle = source.admit(caller="host", run_id="everything-1")
        assert set(bundle.registry.names) == names
        total = await source.call_tool("get-sum", {"a": 1, "b": 2})
        assert "3" in str(total.content)
        with pytest.raises(Error) as refused:
            await source.call_tool("get-sum", {"a": "one", "b": 2})
        assert refused.value.details["reason"] == "invalid_arguments"
        weather = await source.call_tool("get-structured-content", {"location": "New York"})
        assert isinstance(weather.structured_content, dict)
        assert "temperature" in weather.structured_content


async def test_a_task_only_tool_completes_through_a_conversation_as_a_task(
    everything: list[str],
) -> None:
    """``simulate-research-query`` (``taskSupport: required``) runs as an
    MCP task: the run completes with its report, and the task's id is
    recorded with the call's intent before the wait."""
    async with stdio(everything) as source:
        assert source.catalog.tools[RESEARCH].task_support == "required"
        provider = S([S.tool_calls(("c1", RESEARCH, {"topic": "trio"})), S.text("read it")])
        snapshot = await converse(source, provider, "research-1")
    assert snapshot.run.state == "completed"
    [message] = [m for m in snapshot.messages if m["role"] == "tool"]
    assert not message["result"]["is_error"]
    assert "Research Report: trio" in str(message["result"]["content"])
    [task] = snapshot.run.context["conversation"]["resources"]
    assert task["kind"] == "mcp_task"
    assert task["tool"] == RESEARCH
    assert f"tool:{task['invocation_id']}" in snapshot.run.intents
    assert task["task_id"]


async def test_cancelling_the_run_cancels_its_task(everything: list[str]) -> None:
    """Cancelled while its task runs, the run asks the server to cancel the
    task: the server then reports it ``cancelled``."""
    async with stdio(everything) as source:
        bundle = source.admit(caller="host", run_id="research-2")
        store = MemoryStore()
        provider = S([S.tool_calls(("c1", RESEARCH, {"topic": "slow"}))])
        async with open_conversation(
            "research-2",
            store=store,
            provider=provider,
            registry=bundle.registry,
            authority=bundle.authority,
        ) as conversation:
            await conversation.prompt("go")
            with trio.fail_after(60):
                while not (resources := _resources(await store.load("research-2"))):
                    await trio.sleep(0.05)
            await conversation.cancel()
            snapshot = await conversation.wait_settled()
        assert snapshot.run.state == "unknown_outcome"  # a mutation cut in flight
        status = await source.dispatcher.send_raw_request(
            "tasks/get", {"taskId": resources[0]["task_id"]}
        )
        assert status["status"] == "cancelled"


def _resources(record: Any) -> list[Any]:
    conversation = record.context.get("conversation") if record is not None else None
    return list((conversation or {}).get("resources") or [])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_server_everything_over_streamable_http(everything: list[str]) -> None:
    """The same server over streamable HTTP: listed, called, a conversation
    completed."""
    port = _free_port()
    env = {**os.environ, "PORT": str(port)}
    process = await trio.lowlevel.open_process(
        [*everything, "streamableHttp"], env=env, stdout=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        with trio.fail_after(120):
            while True:  # until it listens
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    await trio.sleep(0.2)
            async with connect_streamable_http(url) as source:
                assert "echo" in {d.name for d in source.descriptors}
                echoed = await source.call_tool("echo", {"message": "over http"})
                assert "over http" in str(echoed.content)
                provider = S([S.tool_calls(("c1", "get-sum", {"a": 2, "b": 5})), S.text("7")])
                snapshot = await converse(source, provider, "http-1")
        assert snapshot.run.state == "completed"
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def test_mcp_server_time_from_pypi() -> None:
    """``mcp-server-time`` (a Python server from PyPI): listed, called with
    valid and invalid arguments, a conversation completed."""
    try:
        import mcp_server_time  # noqa: F401
    except ImportError:
        _unavailable("mcp-server-time is not installed (the test extra installs it)")
    with trio.fail_after(60):
        async with connect_stdio(
            sys.executable, ["-m", "mcp_server_time"], validate_arguments=True
        ) as source:
            assert {"get_current_time", "convert_time"} <= {d.name for d in source.descriptors}
            now = await source.call_tool("get_current_time", {"timezone": "UTC"})
            assert "UTC" in str(now.content)
            with pytest.raises(Error) as refused:
                await source.call_tool("get_current_time", {})
            assert refused.value.error_class is ErrorClass.VALIDATION
            provider = S(
                [S.tool_calls(("c1", "get_current_time", {"timezone": "UTC"})), S.text("ok")]
            )
            snapshot = await converse(source, provider, "time-1")
    assert snapshot.run.state == "completed"
