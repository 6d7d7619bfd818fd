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


def record_call(run_id: str, invocation_id: str, tool: str) -> None:
    psycopg: Any = importlib.import_module("psycopg")
    dsn, schema = _ledger()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {schema}.calls (run_id, invocation_id, tool) VALUES (%s, %s, %s)",
            (run_id, invocation_id, tool),
        )


class _Write:
    """A mutating tool that records its invocation, then takes a while."""

    async def execute(self, operation: Any) -> ToolResult:
        await trio.to_thread.run_sync(
            record_call, operation.run_id, operation.invocation_id, "write"
        )
        await trio.sleep(float(os.environ.get("FLEET_TEST_TOOL_SLEEP", "0.05")))
        return ToolResult("written")


def tools() -> ToolRegistry:
    return ToolRegistry(
        [ToolDescriptor(name="write", schema=SCHEMA, backend=_Write(), description="write")]
    )


@app.agent("writer")
def writer(run_id: str) -> AgentSpec:
    provider = S([S.tool_calls(("c1", "write", {"n": 1})), S.text("done")])
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
    provider = S([S.tool_calls(("c1", "deploy", {"n": 1})), S.text("deployed")])
    return AgentSpec(provider=provider, registry=registry, work=10, run_timeout=300.0)


@app.agent("resumable")
def resumable(run_id: str) -> AgentSpec:
    """Writes, then waits in its provider (where a test stops its host); a
    replacement run (``#`` in its id) just answers."""
    if "#" in run_id:
        return AgentSpec(provider=S([S.text("finished after takeover")]), registry=tools())
    provider = S([S.tool_calls(("c1", "write", {"n": 1})), [Hang()]])
    return AgentSpec(provider=provider, registry=tools(), work=10, run_timeout=300.0)


@app.agent("broken")
def broken(run_id: str) -> AgentSpec:
    """A host bug: its factory fails every time."""
    raise RuntimeError("the factory is broken")
