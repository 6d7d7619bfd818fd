"""The MCP tool source over streamable HTTP, against the same SDK server as
the stdio tests (``mcp_server.py --http``, a subprocess on a loopback port).

The adapter's checks do not depend on the transport; these tests prove the
HTTP transport carries them: listing with refusals, argument validation
before sending, structured-content validation, an error result, a
conversation calling a remote tool, and a server that is gone.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_backplane.adapters.mcp import McpToolSource, connect_streamable_http
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import thaw
from trio_backplane.testing import ScriptedProvider

from .test_mcp import converse

SERVER = str(Path(__file__).with_name("mcp_server.py"))

# The SDK's streamable-HTTP client (mcp 2.3 on httpx2) drops its SSE response
# streams without closing them when a session ends; under Trio their
# finalizer warns.  Those streams are the SDK's own, not ours to close.
pytestmark = pytest.mark.filterwarnings(r"ignore:Async generator 'http(x|core)2\.:ResourceWarning")


#: A web server that is no MCP server, printing its port like ``SERVER``.
PLAIN_WEB = (
    "import http.server as h; s = h.HTTPServer(('127.0.0.1', 0), h.SimpleHTTPRequestHandler);"
    " print(s.server_port, flush=True); s.serve_forever()"
)


@asynccontextmanager
async def http_server(*command: str) -> AsyncIterator[str]:
    """The server's URL while it runs (``command``: another server than the
    MCP test server's); it is killed and reaped afterwards."""
    process = await trio.lowlevel.open_process(
        [sys.executable, *(command or (SERVER, "--http"))], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(64)
                if not chunk:
                    raise AssertionError("the MCP test server exited before listening")
                line += chunk
        yield f"http://127.0.0.1:{int(line)}/mcp"
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


@asynccontextmanager
async def source(**options: Any) -> AsyncIterator[McpToolSource]:
    async with http_server() as url:
        with trio.fail_after(30):
            async with connect_streamable_http(url, **options) as connected:
                yield connected


async def test_mcp_http_lists_tools_and_refuses_the_same_ones() -> None:
    """MCP-06 over streamable HTTP: the listing and its refusals match stdio's."""
    async with source() as tools:
        names = {d.name for d in tools.descriptors}
        assert {"lookup", "fail", "plain", "calls"} <= names
        refused = {r.name for r in tools.rejected}
        assert {"deep", "remote_ref", "broken_pattern", "ancient"} <= refused
        assert not names & refused


async def test_mcp_http_08_09_arguments_and_structured_content_checked() -> None:
    """MCP-08 and MCP-09 over streamable HTTP: invalid arguments are refused
    before sending (the server's call log stays empty); a structuredContent
    that misses the output schema is malformed_result; a valid call passes."""
    async with source(validate_arguments=True, validate_structured_content=True) as tools:
        with pytest.raises(Error) as info:
            await tools.call_tool("lookup", {"user": {"id": 0}})
        assert info.value.error_class is ErrorClass.VALIDATION
        assert info.value.details["reason"] == "invalid_arguments"
        calls = await tools.call_tool("calls", {})
        assert calls.structured_content["calls"] == []
        with pytest.raises(Error) as info:
            await tools.call_tool("lookup", {"user": {"id": 1}, "mode": "bad"})
        assert info.value.error_class is ErrorClass.MALFORMED_RESULT
        ok = await tools.call_tool("lookup", {"user": {"id": 5}})
        assert thaw(ok.structured_content) == {"id": 5, "name": "user-5"}


async def test_mcp_http_14_conversation_calls_a_remote_tool() -> None:
    """MCP-14 over streamable HTTP: a conversation dispatches to the remote
    tool, and an isError result is an ordinary error tool message."""
    async with source(validate_arguments=True) as tools:
        provider = ScriptedProvider(
            [
                ScriptedProvider.tool_calls(("c1", "lookup", {"user": {"id": 3}})),
                ScriptedProvider.tool_calls(("c2", "fail", {})),
                ScriptedProvider.text("done"),
            ]
        )
        snapshot = await converse(tools, provider, "run-http")
        assert snapshot.run.state == "completed"
        results = [thaw(m["result"]) for m in snapshot.messages if m["role"] == "tool"]
        assert results[0]["structured_content"] == {"id": 3, "name": "user-3"}
        assert results[0]["is_error"] is False
        assert results[1]["is_error"] is True


async def test_mcp_http_unreachable_server_is_a_classed_error() -> None:
    """Connecting to a server that is not there raises a classed Error
    (transient_transport, naming the URL and the cause), never the
    transport's raw exception or the SDK's task-group wrapper."""
    async with http_server() as url:
        with trio.fail_after(30):
            async with connect_streamable_http(url) as tools:
                assert tools.descriptors
    # the server is gone: nobody listens on its port any more
    with trio.fail_after(30), pytest.raises(Error) as info:
        async with connect_streamable_http(url, read_timeout=5):
            raise AssertionError("connected to a server that is gone")
    assert info.value.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert info.value.details["server"] == url
    assert "ConnectError" in info.value.details["cause"]


async def test_mcp_http_errors_of_the_block_pass_through() -> None:
    """What the caller's block raises comes out as it is: not reclassed as a
    connection failure, not wrapped in the SDK's exception group, its own
    cause kept."""
    cause = ValueError("why")
    with pytest.raises(KeyError) as info:
        async with source():
            raise KeyError("the host's own") from cause
    assert info.value.__cause__ is cause


async def test_mcp_http_server_lost_mid_session_is_a_classed_error() -> None:
    """A server that dies while the source is in use: the SDK's transport
    fails and cancels the caller's block, and what comes out of the block is
    one classed Error (transient_transport, method "session", naming the
    server and the cause), not the transport's raw exception."""
    process = await trio.lowlevel.open_process(
        [sys.executable, SERVER, "--http"], stdout=subprocess.PIPE
    )
    reached_after_kill: list[str] = []
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(30):
            while not line.endswith(b"\n"):
                line += await process.stdout.receive_some(64)
        url = f"http://127.0.0.1:{int(line)}/mcp"

        async def use_then_lose_the_server() -> None:
            async with connect_streamable_http(url, read_timeout=5) as tools:
                process.kill()
                await process.wait()
                await tools.call_tool("plain", {})
                reached_after_kill.append("the call returned")

        with trio.fail_after(30), pytest.raises(Error) as info:
            await use_then_lose_the_server()
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
    assert reached_after_kill == []
    assert info.value.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert info.value.details["method"] == "session"
    assert info.value.details["server"] == url
    assert "ConnectError" in info.value.details["cause"]


async def test_mcp_http_a_host_cancellation_passes_through() -> None:
    """The host cancelling its own block is a cancellation, never reclassed:
    the host's scope catches it and the server is closed."""
    with trio.move_on_after(3) as scope:
        async with source() as tools:
            assert tools.descriptors
            await trio.sleep_forever()
    assert scope.cancelled_caught


async def test_a_wrong_url_or_a_web_server_is_a_transport_error_naming_the_url() -> None:
    """A path the MCP server does not serve, or a plain web server: no
    JSON-RPC came back, so ``transient_transport`` naming the URL, never
    "the server refused initialize"."""
    async with http_server() as mcp_url, http_server("-c", PLAIN_WEB) as web_url:
        wrong = (mcp_url.replace("/mcp", "/nope"), web_url.replace("/mcp", "/"))
        for url in wrong:
            with pytest.raises(Error) as failed, trio.fail_after(30):
                async with connect_streamable_http(url):
                    pass  # pragma: no cover - never connected
            error = failed.value
            assert error.error_class is ErrorClass.TRANSIENT_TRANSPORT, url
            assert url in error.message
            assert error.details["server"] == url
            assert error.details["reason"] == "not_an_mcp_endpoint"
