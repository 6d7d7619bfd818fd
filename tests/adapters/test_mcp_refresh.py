"""The ``refresh_tools`` discovery tool of an MCP source (issue 7 item 1, PUB-19),
end to end against the real SDK server subprocess (``mcp_server.py``).

The server's ``change_tools`` tool flips its listing (``lookup`` and ``legacy``
change, ``added_later`` appears) and sends ``notifications/tools/list_changed``.
"""

from __future__ import annotations

import sys
import types as pytypes
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_backplane.adapters.mcp import McpRefreshTool, McpToolSource, connect_stdio
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import thaw
from trio_backplane.runtime import open_conversation
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import Authority, Rejection, ToolDescriptor, ToolRegistry, ToolResult

SERVER = str(Path(__file__).with_name("mcp_server.py"))
LISTED = {
    "calls",
    "change_tools",
    "fail",
    "github::get_me",
    "legacy",
    "lookup",
    "plain",
    "remote_output",  # outputSchema refused, but structured content is not validated
    "slow",
    "unbuildable_output",
    "untyped_root",
}
S = ScriptedProvider


@asynccontextmanager
async def server() -> AsyncIterator[McpToolSource]:
    with trio.fail_after(30):
        async with connect_stdio(sys.executable, [SERVER]) as source:
            yield source


async def server_calls(source: McpToolSource) -> list[str]:
    result = await source.call_tool("calls", {})
    return list(result.structured_content["calls"])


class Echo:
    async def execute(self, operation: Any) -> ToolResult:
        return ToolResult(f"echo {operation.tool_name}")


def host_tool(name: str = "echo") -> ToolDescriptor:
    return ToolDescriptor(name=name, schema={"type": "object"}, backend=Echo(), read_only=True)


def tool_results(snapshot: Any) -> dict[str, Any]:
    return {
        m["tool_call_id"]: m["result"] for m in map(thaw, snapshot.messages) if m["role"] == "tool"
    }


async def converse(
    source: McpToolSource,
    registry: ToolRegistry,
    responses: list[Any],
    run_id: str = "run-refresh",
) -> tuple[Any, ScriptedProvider]:
    provider = ScriptedProvider(responses)
    async with open_conversation(
        run_id,
        store=MemoryStore(),
        provider=provider,
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id=run_id),
    ) as conversation:
        await conversation.prompt("go")
        with trio.fail_after(30):
            snapshot = await conversation.wait_settled()
    return snapshot, provider


def offered(request: Any) -> dict[str, Any]:
    return {tool.name: tool for tool in request.tools}


async def test_refresh_tools_stages_the_new_catalog_after_list_changed() -> None:
    """After tools/list_changed, the model calls refresh_tools: the next provider
    request carries catalog revision 2 and the new tools (the host's own tool
    kept, taken from the active catalog), and a call to a newly listed server
    tool dispatches to the server."""
    async with server() as source:
        refresh = source.refresh_tool()
        assert refresh.name == "refresh_tools"
        assert refresh.read_only is True
        assert isinstance(refresh.backend, McpRefreshTool)
        registry = ToolRegistry([host_tool(), *source.descriptors, refresh])
        snapshot, provider = await converse(
            source,
            registry,
            [
                S.tool_calls(("c1", "change_tools", {})),
                S.tool_calls(("c2", "refresh_tools", {})),
                S.tool_calls(("c3", "added_later", {}), ("c4", "echo", {})),
                S.text("done"),
            ],
        )
        assert snapshot.run.state == "completed"
        requests = provider.requests
        assert len(requests) == 4
        before = LISTED | {"echo", "refresh_tools"}
        assert [r.catalog_revision for r in requests] == [1, 1, 2, 2]
        assert set(offered(requests[0])) == set(offered(requests[1])) == before
        assert set(offered(requests[2])) == before | {"added_later"}
        assert offered(requests[2])["lookup"].description == "Look a user up (v2)"
        assert offered(requests[1])["lookup"].description == "Look a user up"

        results = tool_results(snapshot)
        assert results["c1"]["is_error"] is False
        refreshed = results["c2"]
        assert refreshed["is_error"] is False
        summary = refreshed["structured_content"]
        assert summary["status"] == "staged"
        assert summary["catalog_revision"] == 2
        assert summary["added"] == ["added_later"]
        assert summary["removed"] == []
        assert summary["changed"] == ["legacy", "lookup"]
        assert "added_later" in refreshed["content"]
        assert results["c3"]["is_error"] is False
        assert results["c3"]["content"][0]["text"] == "added_later ok"
        assert results["c4"]["content"] == "echo echo"

        assert snapshot.catalog_revision == 2
        (receipt,) = snapshot.receipts
        assert receipt.status == "published"
        assert receipt.catalog_revision == 2
        assert receipt.publication_id.startswith("mcp-refresh-")
        assert not source.stale
        assert await server_calls(source) == ["change_tools", "added_later"]


async def test_refresh_tools_without_a_change_stages_nothing() -> None:
    """Called while the source is not stale (and the listing is unchanged), it
    answers "no change" and stages nothing: the revision stays 1."""
    async with server() as source:
        registry = ToolRegistry([host_tool(), *source.descriptors, source.refresh_tool()])
        assert not source.stale
        snapshot, provider = await converse(
            source,
            registry,
            [S.tool_calls(("c1", "refresh_tools", {})), S.text("done")],
        )
        assert snapshot.run.state == "completed"
        result = tool_results(snapshot)["c1"]
        assert result["is_error"] is False
        assert result["content"].startswith("no change")
        assert result["structured_content"] == {
            "status": "no_change",
            "catalog_revision": 1,
            "added": [],
            "removed": [],
            "changed": [],
            "was_stale": False,
        }
        assert [r.catalog_revision for r in provider.requests] == [1, 1]
        assert offered(provider.requests[0]).keys() == offered(provider.requests[1]).keys()
        assert snapshot.catalog_revision == 1
        assert snapshot.receipts == ()
        assert not source.stale


async def test_refresh_tools_with_an_explicit_base() -> None:
    """``base`` (here a callable) supplies the host's other tools at call time;
    tools of this source and the refresh tool itself are never taken from it."""
    async with server() as source:
        host_tools = [host_tool("echo")]

        def base() -> list[ToolDescriptor]:
            return [*host_tools, *source.descriptors]  # its MCP tools are ignored

        refresh = source.refresh_tool(base=base, name="reload_mcp")
        registry = ToolRegistry([*host_tools, *source.descriptors, refresh])
        await source.call_tool("change_tools", {})
        with trio.fail_after(10):
            await source.wait_stale()
        host_tools[:] = [host_tool("echo2")]
        snapshot, provider = await converse(
            source,
            registry,
            [
                S.tool_calls(("c1", "reload_mcp", {})),
                S.tool_calls(("c2", "echo2", {})),
                S.text("done"),
            ],
        )
        assert snapshot.run.state == "completed"
        results = tool_results(snapshot)
        summary = results["c1"]["structured_content"]
        assert summary["status"] == "staged"
        assert summary["was_stale"] is True
        assert summary["added"] == ["added_later", "echo2"]
        assert summary["removed"] == ["echo"]
        assert summary["changed"] == ["legacy", "lookup"]
        assert results["c2"]["content"] == "echo echo2"
        assert set(offered(provider.requests[1])) == LISTED | {
            "added_later",
            "echo2",
            "reload_mcp",
        }
        assert provider.requests[1].catalog_revision == 2


async def test_failed_listing_is_an_error_result_and_keeps_the_source_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relisting that fails is an is_error result, stages nothing and leaves
    the source stale, so a later refresh can still pick the change up."""
    async with server() as source:
        registry = ToolRegistry([*source.descriptors, source.refresh_tool()])
        await source.call_tool("change_tools", {})
        with trio.fail_after(10):
            await source.wait_stale()

        async def broken(session: Any) -> list[dict[str, Any]]:
            raise Error(ErrorClass.TRANSIENT_TRANSPORT, "MCP connection failed")

        monkeypatch.setattr(source, "_list", broken)
        snapshot, provider = await converse(
            source,
            registry,
            [S.tool_calls(("c1", "refresh_tools", {})), S.text("done")],
        )
        result = tool_results(snapshot)["c1"]
        assert result["is_error"] is True
        assert snapshot.receipts == ()
        assert [r.catalog_revision for r in provider.requests] == [1, 1]
        assert source.stale
        monkeypatch.undo()
        assert "added_later" in {d.name for d in await source.refresh()}
        assert not source.stale


def operation(**fields: Any) -> Any:
    identity = {
        "run_id": "run-1",
        "incarnation": 1,
        "step_id": "step-1",
        "attempt_id": "attempt-1",
        "invocation_id": "invocation-1",
        "tool_call_id": "call-1",
        "turn_id": "turn-1",
        "tool_name": "refresh_tools",
        "tool_revision": 1,
        "catalog_revision": 1,
        "arguments": {},
    }
    return pytypes.SimpleNamespace(**{**identity, **fields})


async def test_outside_a_conversation_and_name_clashes() -> None:
    """Without ``base`` and outside a conversation there is no active catalog:
    a rejection before anything is sent.  A server tool named like a host tool
    is refused instead of staged."""
    async with server() as source:
        refusal = await source.refresh_tool().backend.execute(operation())
        assert isinstance(refusal, Rejection)
        assert refusal.error.details["reason"] == "no_active_catalog"

        clashing = source.refresh_tool(base=ToolRegistry([host_tool("added_later")]))
        authority = Authority.for_registry(
            [*source.descriptors, clashing.backend.descriptor], caller="host", run_id="run-1"
        )
        await source.call_tool("change_tools", {})
        with pytest.raises(Error) as info:
            await clashing.backend.execute(operation(effective_authority=authority))
        assert info.value.details["reason"] == "duplicate_tool_names"
        assert info.value.details["tools"] == ["added_later"]

        with pytest.raises(Error):
            source.refresh_tool(base="echo")  # type: ignore[arg-type]
