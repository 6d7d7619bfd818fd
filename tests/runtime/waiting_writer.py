"""A host process that leaves a run waiting for an approval in a SQLite file,
then dies: ``python waiting_writer.py DB RUN_ID``.  Prints one JSON line: the
deadline and approval expiry this process reports, and the wall clock around
the run's admission (tests/runtime/test_durable_time.py reads them)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import trio

from trio_backplane import (
    Authority,
    SQLiteStore,
    ToolDescriptor,
    ToolRegistry,
    ToolResult,
    open_conversation,
)
from trio_backplane.testing import ScriptedProvider

RUN_TIMEOUT = 600.0


class Deploy:
    async def execute(self, operation: Any) -> ToolResult:
        return ToolResult("deployed")  # pragma: no cover - never approved here


async def main(db: str, run_id: str) -> None:
    registry = ToolRegistry(
        [ToolDescriptor("deploy", {"type": "object"}, Deploy(), requires_approval=True)]
    )
    provider = ScriptedProvider([ScriptedProvider.tool_calls(("c1", "deploy", {}))])
    async with (
        SQLiteStore(db) as store,
        open_conversation(
            run_id,
            store=store,
            provider=provider,
            registry=registry,
            authority=Authority.for_registry(registry, caller="host", run_id=run_id),
            run_timeout=RUN_TIMEOUT,
        ) as conversation,
    ):
        events = conversation.subscribe()
        before = time.time()
        await conversation.prompt("deploy")
        after = time.time()
        async for event in events:
            if event.type == "interaction_requested":
                operation = event.payload["request"]["operation"]
                break
        report = {
            "deadline": conversation.status().run.deadline,
            "expires_at": operation["expires_at"],
            "before": before,
            "after": after,
            "run_timeout": RUN_TIMEOUT,
        }
        print(json.dumps(report), flush=True)
        os._exit(0)  # a crash: the run stays stored, waiting for its approval


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
