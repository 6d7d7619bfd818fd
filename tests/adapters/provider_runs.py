"""A whole run through a real provider adapter: two tools (one under an
aliased name, one needing approval), approved by the host as asked, and the
places a leaked API key would show."""

from __future__ import annotations

import json
from typing import Any

import trio

from trio_backplane.kernel import encode_record
from trio_backplane.runtime import Event, Provider, ProviderRequest, Snapshot, open_conversation
from trio_backplane.store import Store
from trio_backplane.tools import Authority, ProviderTool, ToolDescriptor, ToolRegistry, ToolResult

CANARY = "sk-canary-5f1d8c0e-never-store-me"
GET_ME = "github::get_me"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}


def request(tools: tuple[ProviderTool, ...] = (), messages: Any = None) -> ProviderRequest:
    """One provider attempt's request: ``messages`` (default: one user
    message) and ``tools``."""
    return ProviderRequest(
        run_id="run-1",
        incarnation=1,
        turn_id="turn-1",
        step_id="step-1",
        attempt_id="attempt-1",
        messages=tuple(messages or [{"role": "user", "content": "hi", "id": "m1"}]),
        catalog_revision=1,
        tools=tools,
    )


class Add:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def execute(self, operation: Any) -> ToolResult:
        self.calls.append(operation.arguments)
        total = operation.arguments["a"] + operation.arguments["b"]
        return ToolResult([{"type": "text", "text": str(total)}], {"sum": total})


class GetMe:
    async def execute(self, operation: Any) -> ToolResult:
        return ToolResult("octocat")


def registry(add: Add, *, approve_add: bool = False) -> ToolRegistry:
    return ToolRegistry(
        [
            ToolDescriptor(GET_ME, {"type": "object"}, GetMe(), description="who am I"),
            ToolDescriptor(
                "add", SCHEMA, add, description="add two integers", requires_approval=approve_add
            ),
        ]
    )


async def approving_run(
    run_id: str, provider: Provider, store: Store, tools: ToolRegistry
) -> tuple[Snapshot, list[Event]]:
    """Prompt once and approve every interaction asked; the settled
    snapshot and every event published."""
    events: list[Event] = []
    async with open_conversation(
        run_id,
        store=store,
        provider=provider,
        registry=tools,
        authority=Authority.for_registry(tools, caller="host", run_id=run_id),
        provider_context={"api_key": CANARY},
    ) as conversation:
        channel = conversation.subscribe()

        async def approve() -> None:
            async for event in channel:
                events.append(event)
                if event.type == "interaction_requested":
                    await conversation.resolve(event.payload["interaction_id"], "approved")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(approve)
            await conversation.prompt("who am I, and what is 2 + 3?")
            with trio.fail_after(20):
                snapshot = await conversation.wait_settled()
            nursery.cancel_scope.cancel()
        while True:  # what was published but not yet read
            try:
                events.append(channel.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
    return snapshot, events


async def assert_no_key(store: Store, run_id: str, *seen: Any) -> None:
    """The canary is in no stored row of the run nor in anything ``seen``
    (events, snapshots, captured output)."""
    stored = await store.load(run_id)
    assert stored is not None
    assert CANARY not in json.dumps(encode_record(stored), default=repr)
    assert CANARY not in repr(stored)
    for thing in seen:
        assert CANARY not in (thing if isinstance(thing, str) else repr(thing))
