"""The fleet benchmark's app: one agent whose run is a provider turn, a
tool that sleeps (I/O-bound), and a final answer."""

from __future__ import annotations

import os
from typing import Any

import trio

from trio_backplane.fleet import AgentSpec, FleetApp
from trio_backplane.testing import Hang
from trio_backplane.testing import ScriptedProvider as S
from trio_backplane.tools import ToolDescriptor, ToolRegistry, ToolResult

app = FleetApp()
_SCHEMA = {"type": "object"}


class _Sleep:
    async def execute(self, operation: Any) -> ToolResult:
        await trio.sleep(float(os.environ.get("BENCH_FLEET_SLEEP", "1.0")))
        return ToolResult("slept")


def _registry() -> ToolRegistry:
    return ToolRegistry(
        [ToolDescriptor(name="io", schema=_SCHEMA, backend=_Sleep(), read_only=True)]
    )


@app.agent("io")
def io(run_id: str) -> AgentSpec:
    provider = S([S.tool_calls(("c1", "io", {})), S.text("done")])
    return AgentSpec(provider=provider, registry=_registry(), work=10, run_timeout=600.0)


class _HangFirst:
    """Waits forever in its first incarnation's attempt; taken over (resumed
    on a later incarnation), it answers at once."""

    def stream(self, request: Any, context: Any) -> Any:
        steps = [Hang()] if request.incarnation == 1 else S.text("taken over")
        return S([steps]).stream(request, context)


@app.agent("hang")
def hang(run_id: str) -> AgentSpec:
    """A run that waits in its provider until taken over (the takeover figure)."""
    return AgentSpec(provider=_HangFirst(), registry=_registry(), run_timeout=600.0)
