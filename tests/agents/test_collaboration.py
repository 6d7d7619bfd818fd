"""A model drives child agents through the collaboration tools."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.agents.support import PARENT, S, child_tools, factory
from tests.runtime.support import drained
from trio_backplane import Authority, Error, ErrorClass, ToolRegistry, open_conversation
from trio_backplane.agents import AgentManager, AgentRequest, agent_tools
from trio_backplane.store import MemoryStore
from trio_backplane.tools import ToolDescriptor


def tools_for(request: AgentRequest) -> list[ToolDescriptor]:
    """The researcher may only search, the writer only write, the rogue
    asks for a tool (``deploy``) its parent was never granted."""
    search, write, _ = child_tools()
    task = request.agent_name.rsplit("/", 1)[1]
    if task == "rogue":
        from tests.runtime.support import make_tool

        return [make_tool("deploy", None)]
    return [search] if task == "researcher" else [write]


PARENT_SCRIPT = [
    S.tool_calls(
        ("p1", "spawn_agent", {"task_name": "researcher", "message": "find facts"}),
        ("p2", "spawn_agent", {"task_name": "writer", "message": "draft it"}),
    ),
    S.tool_calls(("p3", "spawn_agent", {"task_name": "rogue", "message": "deploy"})),
    S.tool_calls(("p4", "wait_agent", {"timeout_ms": 10_000})),
    S.tool_calls(("p5", "wait_agent", {"timeout_ms": 10_000})),
    S.tool_calls(("p6", "followup_task", {"target": "researcher", "message": "more"})),
    S.tool_calls(("p7", "wait_agent", {"timeout_ms": 60_000})),
    S.tool_calls(("p8", "list_agents", {})),
    S.tool_calls(
        ("p9", "close_agent", {"target": "researcher"}),
        ("p10", "close_agent", {"target": "/root/writer"}),
    ),
    S.text("all done"),
]


async def test_a_parent_spawns_waits_follows_up_and_closes(autojump_clock: MockClock) -> None:
    """Two children with different tools; a follow-up after one completed
    is a fresh run fed its transcript with the quota it had left; a child
    asking for a grant its parent lacks is refused; both are closed and the
    parent completes.  The store holds the parent's run and the three
    children's; the parent's subscribers saw ``agent_updated``."""
    scripts = {
        "researcher": [
            [S.tool_calls(("c1", "search", {})), S.text("three facts")],
            [S.text("two more facts")],
        ],
        "writer": [[S.tool_calls(("c1", "write", {})), S.text("a draft")]],
        "rogue": [[S.text("never")]],
    }
    options, asked = factory(scripts, tools=tools_for, work=20)
    store = MemoryStore()
    manager = AgentManager(store=store, parent_run_id=PARENT, child_options=options)
    registry = ToolRegistry([*agent_tools(manager), *child_tools()])
    authority = Authority.for_registry(registry, caller="host", run_id=PARENT)
    async with open_conversation(
        PARENT,
        store=store,
        provider=S(PARENT_SCRIPT),
        registry=registry,
        authority=authority,
        effect_timeout=120.0,
    ) as parent:
        channel = parent.subscribe(buffer=10_000)
        async with manager.open(parent, authority=authority):
            await parent.prompt("research and write")
            snapshot = await parent.wait_settled()
        events = drained(channel)
    assert snapshot.run.state == "completed"
    results = {m["tool_call_id"]: m["result"] for m in snapshot.messages if m["role"] == "tool"}
    assert results["p3"]["is_error"] is True
    assert results["p3"]["error"]["class"] == "forbidden"
    assert results["p3"]["error"]["details"] == {"grants": ["deploy"]}
    assert [r.agent_name for r in asked] == [
        "/root/researcher",
        "/root/writer",
        "/root/rogue",
        "/root/researcher",
    ]
    listed = {a["agent_name"]: a["status"] for a in results["p8"]["structured_content"]["agents"]}
    assert listed == {
        "/root/researcher": {"completed": "two more facts"},
        "/root/writer": {"completed": "a draft"},
    }
    first, second, writer = [
        await store.load(run)
        for run in ("/root/researcher:1", "/root/researcher:2", "/root/writer:1")
    ]
    assert first is not None
    assert second is not None
    assert writer is not None
    assert await store.load("/root/rogue:1") is None
    assert second.budget.quota == 20 - first.budget.used
    earlier = list(first.conversation["messages"])
    assert list(second.conversation["messages"])[: len(earlier)] == earlier
    assert [m["content"] for m in second.conversation["messages"] if m["role"] == "user"] == [
        "find facts",
        "more",
    ]
    assert all(r.state == "completed" for r in (first, second, writer))
    updates = [e.payload for e in events if e.type == "agent_updated"]
    assert {"agent_name": "/root/writer", "status": "completed"} in updates
    assert {"agent_name": "/root/researcher", "status": "shutdown"} in updates
    assert manager.agents()[0].status == "shutdown"


async def test_an_unconfirmed_child_closure_keeps_the_parent_from_completing(
    autojump_clock: MockClock,
) -> None:
    """AGT-02: the parent run's terminal path closes its children; one whose
    conversation died cannot be closed confirmed, so the parent run ends
    ``unknown_outcome`` instead of ``completed``."""
    from tests.agents.support import FailingFor
    from trio_backplane.testing import Hang

    options, _ = factory({"doomed": [[[Hang()]]]})
    store = FailingFor(MemoryStore(), "never")
    manager = AgentManager(store=store, parent_run_id=PARENT, child_options=options)
    registry = ToolRegistry([*agent_tools(manager), *child_tools()])
    authority = Authority.for_registry(registry, caller="host", run_id=PARENT)
    script = [
        S.tool_calls(("p1", "spawn_agent", {"task_name": "doomed", "message": "work"})),
        S.text("done"),
    ]

    async def spawned_then_doomed() -> None:
        # once it runs (its prompt admitted), its store fails: it cannot stop cleanly
        while not manager.agents() or manager.agents()[0].status != "running":
            await trio.sleep(0)
        store.marker = "doomed"

    settled: list[Any] = []

    async def body(parent: Any) -> None:
        async with manager.open(parent, authority=authority), trio.open_nursery() as nursery:
            nursery.start_soon(spawned_then_doomed)
            await parent.prompt("go")
            settled.append(await parent.wait_settled())

    async with open_conversation(
        PARENT, store=store, provider=S(script), registry=registry, authority=authority
    ) as parent:
        with pytest.raises(Error) as exc:  # the block's own closure is unconfirmed too
            await body(parent)
    assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
    [snapshot] = settled
    assert snapshot.run.state == "unknown_outcome"
    assert snapshot.resource_cleanup.status == "uncertain"
    [doomed] = manager.agents()
    assert doomed.closure not in (None, "confirmed")
