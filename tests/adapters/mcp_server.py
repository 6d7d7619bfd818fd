"""An MCP server for the adapter tests, written with the official SDK.

Run as ``python mcp_server.py`` (stdio) or ``python mcp_server.py --http``
(streamable HTTP on a loopback port of the system's choosing, printed as the
first line of stdout once the socket listens).  ``MCP_TEST_REF_PORT`` names the loopback
port the ``remote_ref`` tool's schema points at (MCP-05); with
``MCP_TEST_REFUSE_CODE`` set, calls to ``plain`` are refused with that
JSON-RPC error code (the connection stays healthy).  Every
``tools/call`` it receives is logged; the ``calls`` tool returns that log, so
a test can prove a request never reached the server.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

REF_PORT = os.environ.get("MCP_TEST_REF_PORT", "9")
REFUSE_CODE = os.environ.get("MCP_TEST_REFUSE_CODE")

USER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user": {"$ref": "#/$defs/user"},
        "mode": {"enum": ["ok", "bad", "missing", "null"]},
    },
    "required": ["user"],
    "$defs": {
        "user": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1}},
            "required": ["id"],
        }
    },
}
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
    "required": ["id", "name"],
}


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"n": schema}}
    return schema


def tools(changed: bool) -> list[dict[str, Any]]:
    listing: list[dict[str, Any]] = [
        {
            "name": "lookup",
            "description": "Look a user up" + (" (v2)" if changed else ""),
            "inputSchema": USER_SCHEMA,
            "outputSchema": PROFILE_SCHEMA,
        },
        {
            "name": "legacy",
            "description": "A draft-07 tool",
            "inputSchema": {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {
                    "tags": {
                        "type": "array",
                        "items": [{"type": "string"}],
                        "additionalItems": changed,
                    }
                },
                "definitions": {"unused": {"type": "integer"}},
            },
        },
        {
            "name": "ancient",
            "inputSchema": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"},
        },
        {
            "name": "remote_ref",
            "inputSchema": {
                "type": "object",
                "properties": {"x": {"$ref": f"http://127.0.0.1:{REF_PORT}/schema.json"}},
            },
        },
        {"name": "deep", "inputSchema": _nested(40)},
        {
            "name": "broken_pattern",
            "inputSchema": {"type": "object", "properties": {"p": {"pattern": "(?P<n>a)"}}},
        },
        {
            "name": "remote_output",
            "inputSchema": {"type": "object"},
            "outputSchema": {
                "type": "object",
                "properties": {"x": {"$ref": f"http://127.0.0.1:{REF_PORT}/out.json"}},
            },
        },
        {
            "name": "unbuildable_output",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
        },
        {
            "name": "fail",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "required": ["never"]},
        },
        {"name": "plain", "inputSchema": {"type": "object"}},
        {"name": "untyped_root", "inputSchema": {"type": "object", "properties": {}}},
        {
            "name": "slow",
            "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
        },
        {
            "name": "github::get_me",
            "description": "A name outside SEP-986, marked read-only by the server",
            "inputSchema": {"type": "object"},
            "annotations": {"readOnlyHint": True},
        },
        {"name": "has space", "inputSchema": {"type": "object"}},
        {"name": "x" * 129, "inputSchema": {"type": "object"}},
        {"name": "ctl\u0007bell", "inputSchema": {"type": "object"}},
        {"name": "", "inputSchema": {"type": "object"}},
        {"name": "change_tools", "inputSchema": {"type": "object"}},
        {"name": "calls", "inputSchema": {"type": "object"}},
    ]
    if changed:
        listing.append({"name": "added_later", "inputSchema": {"type": "object"}})
    return listing


class State:
    changed = False
    calls: list[str] = []  # noqa: RUF012 - one process, one server


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult.model_validate({"tools": tools(State.changed)})


def text(value: str) -> list[types.TextContent]:
    return [types.TextContent(type="text", text=value)]


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    name = params.name
    arguments = params.arguments or {}
    if name == "calls":
        return types.CallToolResult(
            content=text(",".join(State.calls)), structured_content={"calls": list(State.calls)}
        )
    State.calls.append(name)
    if name == "lookup":
        mode = arguments.get("mode", "ok")
        user_id = arguments.get("user", {}).get("id", 0)
        if mode == "bad":
            return types.CallToolResult(content=text("bad"), structured_content={"id": "one"})
        if mode == "missing":
            return types.CallToolResult(content=text("no structured content"))
        return types.CallToolResult(
            content=text(f"user {user_id}"),
            structured_content={"id": user_id, "name": f"user-{user_id}"},
        )
    if name == "fail":
        return types.CallToolResult(content=text("the tool failed"), is_error=True)
    if name == "plain" and REFUSE_CODE is not None:
        raise MCPError(int(REFUSE_CODE), "database is locked, refusing")
    if name == "slow":
        await anyio.sleep(float(arguments.get("seconds", 30)))
        return types.CallToolResult(content=text("slept"))
    if name == "change_tools":
        State.changed = True
        await ctx.session.send_tool_list_changed()
        return types.CallToolResult(content=text("changed"))
    return types.CallToolResult(
        content=text(f"{name} ok"), structured_content={"tool": name, "arguments": arguments}
    )


server = Server("trio-backplane-test", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def main_http() -> None:
    import socket

    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[listener])


if __name__ == "__main__":
    anyio.run(main_http if "--http" in sys.argv else main)
