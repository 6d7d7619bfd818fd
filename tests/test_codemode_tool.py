"""The Code Mode tool in a real conversation: one cell, several nested calls."""

from __future__ import annotations

from typing import Any

from tests.conftest import LINUX_ONLY
from tests.runtime.support import RecordingBackend, make_tool, run_to_settled, string_schema
from trio_backplane.codemode import code_mode_tool
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import ToolResult

pytestmark = LINUX_ONLY
S = ScriptedProvider

CELL = """
const a = await tools.lookup({x: "alpha"});
const b = await tools.lookup({x: "beta"});
let refused = null;
try { await tools.lookup({x: 42}); } catch (e) { refused = e.name; }
let self = null;
try { await tools.code({code: "return 1"}); } catch (e) { self = e.name; }
console.log("looked up", [a, b].length);
return {found: [a.value, b.value], refused, self};
"""


async def test_a_cell_calls_catalog_tools_as_nested_invocations() -> None:
    """Each ``tools.lookup`` is a committed nested intent with its own
    result; the call refused by schema validation never reaches the
    backend; the tool cannot call itself; the run completes with the
    cell's value as the result."""
    lookup = RecordingBackend(
        lambda op: ToolResult("ok", structured_content={"value": op.arguments["x"].upper()})
    )
    tools = [
        code_mode_tool(cell_timeout=30.0),
        make_tool("lookup", lookup, schema=string_schema("x"), read_only=True),
    ]
    provider = S([S.tool_calls(("c1", "code", {"code": CELL})), S.text("done")])
    finished = await run_to_settled(provider, tools, wall_clock=None, effect_timeout=60.0)
    assert finished.record.state == "completed"
    [message] = finished.tool_messages()
    result: dict[str, Any] = message["result"]["structured_content"]
    assert result["value"] == {
        "found": ["ALPHA", "BETA"],
        "refused": "validation",
        "self": "resource_conflict",
    }
    assert result["output"] == ["looked up 2"]
    assert [op.arguments for op in lookup.operations] == [{"x": "alpha"}, {"x": "beta"}]
    nested = [
        intent
        for intent in finished.record.intents.values()
        if intent.get("kind") != "provider" and intent.get("tool_name") == "lookup"
    ]
    assert len(nested) == 2
    assert all(intent["status"] == "consumed" for intent in nested)


def _workers() -> list[int]:
    """Pids of live Code Mode workers (a deno running ``_worker.js``)."""
    import os
    from pathlib import Path

    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"codemode/_worker.js" in argv:
                found.append(int(name))
    return found


async def test_cancelling_a_cell_stops_its_worker() -> None:
    """Cancel while a cell waits forever: the worker's group is stopped
    and confirmed gone; no Deno process is left."""
    import trio

    from tests.runtime.support import conversation_with

    before = set(_workers())
    provider = S([S.tool_calls(("c1", "code", {"code": "await new Promise(() => {});"}))])
    async with conversation_with(
        provider, [code_mode_tool()], wall_clock=None, effect_timeout=60.0
    ) as (conversation, _):
        await conversation.prompt("go")
        with trio.fail_after(20):
            while not set(_workers()) - before:
                await trio.sleep(0.01)
        await conversation.cancel()
        snapshot = await conversation.wait_settled()
    # the cell was dispatched and is not read-only: what it did is not known
    assert snapshot.run.state == "unknown_outcome"
    with trio.fail_after(5):
        while set(_workers()) - before:
            await trio.sleep(0.01)


def test_the_description_declares_the_catalog_in_typescript() -> None:
    """Input schemas become TypeScript parameter types; one without a
    faithful form is ``unknown`` with the schema in a comment."""
    from trio_backplane.codemode._typescript import declarations

    lookup = make_tool("lookup", None, schema=string_schema("x"))
    rich = make_tool(
        "search",
        None,
        schema={
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "mode": {"enum": ["fast", "exact"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "odd-key": {"type": ["string", "null"]},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    )
    patterned = make_tool("code_like", None, schema={"type": "object", "minProperties": 1})
    text = declarations([lookup, rich, patterned])
    assert text.splitlines() == [
        "declare const tools: {",
        "  lookup(args: { x: string; [key: string]: unknown }): Promise<unknown>;",
        '  search(args: { query: string; limit?: number; mode?: "fast" | "exact"; '
        'tags?: Array<string>; "odd-key"?: string | null }): Promise<unknown>;',
        '  code_like(args: unknown): Promise<unknown>;  // schema: {"type": "object", '
        '"minProperties": 1}',
        "};",
    ]
    tool = code_mode_tool(tools=[lookup, code_mode_tool()])
    assert "lookup(args: { x: string" in tool.description
    assert "code(args" not in tool.description  # never itself
