"""Code Mode in real conversations: cells whose tool calls are nested
invocations, cells that outlive a call, cell state, deadlines, cleanup.

Trio's clock is a ``MockClock`` at real-time rate (cleanup polls a real
process group), which a test may jump; no Trio deadline races the worker:
``yield_time_ms`` 0 yields at once, and ``FOREVER`` is never reached."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import LINUX_ONLY
from tests.runtime.support import (
    RecordingBackend,
    make_tool,
    run_to_settled,
    run_with_host,
    string_schema,
)
from trio_backplane import Error, ErrorClass
from trio_backplane.codemode import code_mode_tools
from trio_backplane.resources import ResourceRegistry
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import ToolDescriptor, ToolResult

pytestmark = LINUX_ONLY
S = ScriptedProvider
FOREVER = 300_000  # yield_time_ms the still clock never reaches


@pytest.fixture
def clock() -> MockClock:
    """pytest-trio runs each test that asks for it on this clock."""
    return MockClock(rate=1.0)


def workers() -> set[int]:
    """Pids of live Code Mode workers (a deno running ``_worker.js``)."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"codemode/_worker.js" in argv:
                found.add(int(name))
    return found


async def real_pause() -> None:
    await trio.sleep(0.01)


async def no_workers_left(before: set[int]) -> None:
    for _ in range(500):
        if not workers() - before:
            return
        await real_pause()
    raise AssertionError(f"Code Mode workers left: {workers() - before}")


def cell_results(finished: Any) -> list[dict[str, Any]]:
    return [m["result"]["structured_content"] for m in finished.tool_messages()]


def nested_intents(record: Any, tool: str) -> list[dict[str, Any]]:
    return [i for i in record.intents.values() if i.get("tool_name") == tool]


SUMMARY = """
const prices = await tools.lookup({x: "alpha"});
let transfer;
try { transfer = await tools.transfer({x: "100"}); } catch (e) { transfer = e.name; }
let refused = null;
try { await tools.lookup({x: 42}); } catch (e) { refused = e.name; }
let gated = null;
try { await tools.deploy({x: "now"}); } catch (e) { gated = e.name; }
text(`transfer: ${JSON.stringify(transfer)}`);
return {price: prices.value, transfer, refused, gated};
"""


async def test_a_cell_calls_catalog_tools_each_a_committed_nested_intent(
    clock: MockClock,
) -> None:
    """One cell calls a read-only tool, a tool whose approval the host
    answers (an interaction inside the nested call), a call refused by
    schema validation and an approval-gated tool (``approval_required``,
    NEST-03): the refused and gated calls never reach their backends, the
    others are committed intents with their own results, the cell's
    summary is the tool's result and the run completes."""
    lookup = RecordingBackend(
        lambda op: ToolResult("ok", structured_content={"value": op.arguments["x"].upper()})
    )

    async def transfer(operation: Any) -> ToolResult:
        answer = await operation.context.interact(
            {"kind": "approval", "question": f"transfer {operation.arguments['x']}?"}
        )
        return ToolResult("sent", structured_content={"approved": answer == "yes"})

    transferring, deploy = RecordingBackend(transfer), RecordingBackend()
    registry = ResourceRegistry()
    tools = [
        *code_mode_tools(registry),
        make_tool("lookup", lookup, schema=string_schema("x"), read_only=True),
        make_tool("transfer", transferring, schema=string_schema("x")),
        make_tool("deploy", deploy, schema=string_schema("x"), requires_approval=True),
    ]
    before = workers()
    code = {"code": SUMMARY, "yield_time_ms": FOREVER}
    provider = S([S.tool_calls(("c1", "code", code)), S.text("done")])
    finished, host = await run_with_host(provider, tools, lambda _e: (0.0, "yes"))
    assert finished.record.state == "completed"
    [result] = cell_results(finished)
    assert result["status"] == "completed"
    assert result["value"] == {
        "price": "ALPHA",
        "transfer": {"approved": True},
        "refused": "validation",
        "gated": "approval_required",
    }
    assert result["output"] == ['transfer: {"approved":true}']
    assert [op.arguments for op in lookup.operations] == [{"x": "alpha"}]
    assert (transferring.calls, deploy.calls) == (1, 0)
    assert len(host.resolved) == 1
    for tool in ("lookup", "transfer"):
        [intent] = nested_intents(finished.record, tool)
        assert intent["status"] == "consumed"
    assert nested_intents(finished.record, "deploy") == []
    [evidence] = finished.conversation_state["resources"]
    assert (evidence["kind"], evidence["cell_id"]) == ("process_group", result["cell_id"])
    await no_workers_left(before)


async def test_a_cell_outlives_its_call_and_code_wait_goes_on(clock: MockClock) -> None:
    """A cell still running after ``yield_time_ms`` returns its cell id and
    its output so far; ``code_wait`` resumes it with the same identity and
    counter, through its own invocation's nested dispatch; its worker is
    gone once it ends."""
    echo = RecordingBackend(lambda op: ToolResult("ok", structured_content=op.arguments))
    registry = ResourceRegistry()
    tools = [*code_mode_tools(registry), make_tool("echo", echo, read_only=True)]
    cell = """
        const first = await tools.echo({n: 1});
        console.log("first", first.n);
        await new Promise((resolve) => setTimeout(resolve, 300));
        const second = await tools.echo({n: 2});
        return first.n + second.n;
    """
    provider = S(
        [
            S.tool_calls(("c1", "code", {"code": cell, "yield_time_ms": 0})),
            S.tool_calls(("c2", "code_wait", {"cell_id": "res_1", "yield_time_ms": FOREVER})),
            S.text("done"),
        ]
    )
    before = workers()
    finished = await run_to_settled(provider, tools)
    assert finished.record.state == "completed"
    waiting, ended = cell_results(finished)
    assert (waiting["status"], waiting["cell_id"]) == ("running", "res_1")
    assert (ended["status"], ended["value"], ended["cell_id"]) == ("completed", 3, "res_1")
    assert waiting["output"] + ended["output"] == ["first 1"]
    # the second call ran in code_wait's step, not code's
    assert [op.arguments for op in echo.operations] == [{"n": 1}, {"n": 2}]
    assert registry.owner_status(finished.record.run_id) == []
    await no_workers_left(before)


async def test_cells_are_bounded_and_the_run_s_end_stops_them(clock: MockClock) -> None:
    """At most ``max_continuations`` live cells: one more is refused with
    ``overloaded`` "Code Mode cell capacity reached" (nothing started);
    cells still running when the run completes are stopped and confirmed
    gone; ``terminate`` stops one on request."""
    registry = ResourceRegistry(max_continuations=2)
    forever = {"code": "await new Promise(() => {});", "yield_time_ms": 0}
    provider = S(
        [
            S.tool_calls(("c1", "code", forever)),
            S.tool_calls(("c2", "code", forever)),
            S.tool_calls(("c3", "code", forever)),
            S.tool_calls(("c4", "code_wait", {"cell_id": "res_1", "terminate": True})),
            S.tool_calls(("c5", "code", forever)),
            S.text("done"),
        ]
    )
    before = workers()
    finished = await run_to_settled(provider, code_mode_tools(registry))
    assert finished.record.state == "completed"
    messages = [m["result"] for m in finished.tool_messages()]
    statuses = [(m["structured_content"] or {}).get("status") for m in messages]
    assert statuses[:2] == ["running", "running"]
    assert messages[2]["is_error"] is True
    assert "Code Mode cell capacity reached" in str(messages[2]["content"])
    assert statuses[3:] == ["terminated", "running"]
    assert registry.owner_status(finished.record.run_id) == []
    await no_workers_left(before)


async def test_cell_state_is_kept_per_identity_and_bounded(clock: MockClock) -> None:
    """``store``/``load`` keep JSON values between cells of one identity
    (``state``), apart from other identities; a value past the 1 MiB
    budget is refused with ``budget_exceeded``, which the cell can read."""
    registry = ResourceRegistry()
    store = """
        await store("count", {n: 41});
        let over = null;
        try { await store("big", "x".repeat(1100000)); } catch (e) { over = e.name; }
        return over;
    """
    load = 'const c = await load("count"); return c === null ? null : c.n + 1;'
    provider = S(
        [
            S.tool_calls(("c1", "code", {"code": store, "yield_time_ms": FOREVER})),
            S.tool_calls(("c2", "code", {"code": load, "yield_time_ms": FOREVER})),
            S.tool_calls(("c3", "code", {"code": load, "state": "other", "yield_time_ms": 1e5})),
            S.text("done"),
        ]
    )
    finished = await run_to_settled(provider, code_mode_tools(registry))
    values = [r.get("value") for r in cell_results(finished)]
    assert values == ["budget_exceeded", 42, None]


async def test_a_human_wait_inside_a_nested_call_suspends_the_cell_s_deadline(
    clock: MockClock,
) -> None:
    """The cell runs under the effect's deadline; an interaction in one of
    its nested calls suspends it: 100 s of waiting against a 10 s effect
    timeout, and the cell still completes."""

    async def ask(operation: Any) -> ToolResult:
        answer = await operation.context.interact({"question": "go on?"})
        return ToolResult("ok", structured_content={"answer": answer})

    registry = ResourceRegistry()
    tools = [*code_mode_tools(registry), make_tool("ask", RecordingBackend(ask), read_only=True)]
    cell = {"code": "return (await tools.ask({})).answer;", "yield_time_ms": 5_000}

    async def answer_late(conversation: Any, host: Any) -> None:
        while not host.requested:
            await real_pause()
        clock.jump(100)
        await conversation.resolve(host.requested[0][1], "yes")

    provider = S([S.tool_calls(("c1", "code", cell)), S.text("done")])
    finished, _ = await run_with_host(
        provider, tools, lambda _e: None, during=answer_late, effect_timeout=10.0
    )
    assert finished.record.state == "completed"
    [result] = cell_results(finished)
    assert result.get("value") == "yes", result


async def test_cancelling_a_cell_stops_its_worker(clock: MockClock) -> None:
    """Cancel while a cell waits forever: the worker's group is stopped and
    confirmed gone, and the run (a dispatched, mutating cell) ends
    ``unknown_outcome``."""
    from tests.runtime.support import conversation_with

    before = workers()
    cell = {"code": "await new Promise(() => {});", "yield_time_ms": FOREVER}
    provider = S([S.tool_calls(("c1", "code", cell))])
    async with conversation_with(provider, code_mode_tools(ResourceRegistry())) as (
        conversation,
        _,
    ):
        await conversation.prompt("go")
        while not workers() - before:
            await real_pause()
        await conversation.cancel()
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"
    await no_workers_left(before)


async def test_the_effect_deadline_cuts_a_busy_cell(clock: MockClock) -> None:
    """A cell busy past the effect's deadline is cut: its worker is stopped
    and confirmed gone, and the run (a dispatched, mutating effect that
    outlived its deadline, KER-10) ends ``unknown_outcome``."""
    from tests.runtime.support import conversation_with

    before = workers()
    cell = {"code": "while (true) {}", "yield_time_ms": FOREVER}
    provider = S([S.tool_calls(("c1", "code", cell))])
    async with conversation_with(
        provider, code_mode_tools(ResourceRegistry()), effect_timeout=10.0
    ) as (conversation, _):
        await conversation.prompt("go")
        while not workers() - before:
            await real_pause()
        clock.jump(11)
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"
    await no_workers_left(before)


async def test_a_cell_that_exhausts_memory_fails_and_the_run_goes_on(
    clock: MockClock,
) -> None:
    """A cell that ends its worker (out of memory) is a failed tool result
    the model reads, not a hung run; its worker is confirmed gone."""
    registry = ResourceRegistry()
    hog = "const xs = []; while (true) { xs.push(new Array(1e6).fill(1)); }"
    provider = S(
        [S.tool_calls(("c1", "code", {"code": hog, "yield_time_ms": FOREVER})), S.text("done")]
    )
    before = workers()
    finished = await run_to_settled(provider, code_mode_tools(registry, heap_mib=32))
    assert finished.record.state == "completed"
    [result] = cell_results(finished)
    assert (result["status"], result["error"]) == ("failed", "execution_failure")
    await no_workers_left(before)


async def test_code_wait_refuses_cells_it_does_not_own(clock: MockClock) -> None:
    """An unknown cell, or one another Code Mode call is driving, is
    rejected before anything runs."""
    registry = ResourceRegistry()
    tools = code_mode_tools(registry)
    provider = S(
        [
            S.tool_calls(("c1", "code_wait", {"cell_id": "res_99"})),
            S.text("done"),
        ]
    )
    finished = await run_to_settled(provider, tools)
    [message] = finished.tool_messages()
    assert message["result"]["is_error"] is True
    assert "not found" in str(message["result"]["content"])


def test_the_description_declares_the_catalog_in_typescript() -> None:
    """Input schemas become TypeScript parameter types; one without a
    faithful form is ``unknown`` with the schema in a comment; the cell's
    helpers are declared; Code Mode's own tools are not."""
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
    registry = ResourceRegistry()
    own = code_mode_tools(registry)
    code, _wait = code_mode_tools(registry, tools=[lookup, *own])
    assert "lookup(args: { x: string" in code.description
    assert "declare function store(key: string, value: unknown)" in code.description
    assert "code(args" not in code.description
    assert "code_wait(args" not in code.description


def test_options_are_checked() -> None:
    with pytest.raises(Error) as exc:
        code_mode_tools(ResourceRegistry(), heap_mib=8)
    assert exc.value.error_class is ErrorClass.VALIDATION
    tools: list[ToolDescriptor] = code_mode_tools(
        ResourceRegistry(), name="js", wait_name="js_wait"
    )
    assert [t.name for t in tools] == ["js", "js_wait"]
    assert "call js_wait to go on" in tools[0].description
