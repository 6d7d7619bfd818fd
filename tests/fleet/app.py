"""A fleet app for the tests: agents whose mutating tool records every
backend invocation in a table, so a replay would show."""

from __future__ import annotations

import importlib
import os
from typing import Any

import trio

from trio_backplane.fleet import AgentSpec, FleetApp
from trio_backplane.testing import Hang
from trio_backplane.testing import ScriptedProvider as S
from trio_backplane.tools import ToolDescriptor, ToolRegistry, ToolResult

app = FleetApp()
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


def _ledger() -> tuple[str, str]:
    return os.environ["FLEET_TEST_DSN"], os.environ["FLEET_TEST_SCHEMA"]


def record_call(run_id: str, invocation_id: str, tool: str, incarnation: int) -> None:
    psycopg: Any = importlib.import_module("psycopg")
    dsn, schema = _ledger()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {schema}.calls (run_id, invocation_id, tool, incarnation)"
            " VALUES (%s, %s, %s, %s)",
            (run_id, invocation_id, tool, incarnation),
        )


class _Write:
    """A mutating tool that records its invocation, then takes a while."""

    async def execute(self, operation: Any) -> ToolResult:
        await trio.to_thread.run_sync(
            record_call,
            operation.run_id,
            operation.invocation_id,
            operation.tool_name,
            operation.incarnation,
        )
        await trio.sleep(float(os.environ.get("FLEET_TEST_TOOL_SLEEP", "0.05")))
        return ToolResult("written")


def tools() -> ToolRegistry:
    return ToolRegistry(
        [ToolDescriptor(name="write", schema=SCHEMA, backend=_Write(), description="write")]
    )


class Model:
    """A stand-in for a model, answering from the transcript as one would:
    ``call`` until a tool result is in it, then ``final`` (text, or a
    function of the request giving scripted steps).  A resumed run asks it
    again from wherever its transcript stands."""

    def __init__(self, call: tuple[str, str, Any], final: Any) -> None:
        self.call, self.final = call, final

    def stream(self, request: Any, context: Any) -> Any:
        answered = any(m.get("role") == "tool" for m in request.messages)
        if not answered:
            step = S.tool_calls(self.call)
        else:
            step = S.text(self.final) if isinstance(self.final, str) else self.final(request)
        return S([step]).stream(request, context)


@app.agent("writer")
def writer(run_id: str) -> AgentSpec:
    provider = Model(("c1", "write", {"n": 1}), "done")
    return AgentSpec(provider=provider, registry=tools(), work=10, run_timeout=120.0)


@app.agent("approver")
def approver(run_id: str) -> AgentSpec:
    """Its one tool needs a person's approval."""
    registry = ToolRegistry(
        [
            ToolDescriptor(
                name="deploy",
                schema=SCHEMA,
                backend=_Write(),
                description="deploy",
                requires_approval=True,
            )
        ]
    )
    provider = Model(("c1", "deploy", {"n": 1}), "deployed")
    return AgentSpec(provider=provider, registry=registry, work=10, run_timeout=300.0)


@app.agent("resumable")
def resumable(run_id: str) -> AgentSpec:
    """Writes, then waits in its provider on its first incarnation (where
    a test stops its host); taken over (resumed, or replaced: ``#`` in its
    id), it answers."""

    def final(request: Any) -> Any:
        if request.incarnation == 1 and "#" not in request.run_id:
            return [Hang()]
        return S.text("finished after takeover")

    provider = Model(("c1", "write", {"n": 1}), final)
    return AgentSpec(provider=provider, registry=tools(), work=10, run_timeout=300.0)


@app.agent("broken")
def broken(run_id: str) -> AgentSpec:
    """A host bug: its factory fails every time."""
    raise RuntimeError("the factory is broken")
