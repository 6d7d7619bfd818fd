"""Write ``tests/fixtures/layout2.sqlite3``: runs stored by this code's
SQLite layout (``meta.layout_version`` 2), for the test that every later
layout still reads them (``tests/store/test_layout_fixture.py``).

    python scripts/make_layout_fixture.py [PATH]

Deterministic: MockClock, a fixed wall clock, scripted providers.  The file
holds three runs:

- ``done``: completed after two tool steps, with usage reports;
- ``asking``: running, a permission interaction pending (the file is copied,
  by SQLite's backup API, while the conversation waits: a host that
  stopped there);
- ``stopped``: cancelled while its tool ran (``unknown_outcome``).

Regenerate it only when a test says the fixture itself is wrong: it stands
for the databases hosts hold today.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
import trio.testing

from trio_backplane import Authority, ToolDescriptor, ToolRegistry, ToolResult, open_conversation
from trio_backplane.store import SQLiteStore
from trio_backplane.testing import ScriptedProvider

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "tests" / "fixtures" / "layout2.sqlite3"
#: The wall clock the runs were written at: 2026-06-01T00:00:00Z.
WALL = 1_780_272_000.0
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


class Echo:
    async def execute(self, operation: Any) -> ToolResult:
        return ToolResult(f"echo {operation.arguments['n']}")


class Slow:
    async def execute(self, operation: Any) -> ToolResult:
        await trio.sleep(3600)
        return ToolResult("never")


def _registry() -> ToolRegistry:
    return ToolRegistry(
        [
            ToolDescriptor(name="echo", schema=SCHEMA, backend=Echo(), read_only=True),
            ToolDescriptor(name="gated", schema=SCHEMA, backend=Echo(), requires_approval=True),
            ToolDescriptor(name="slow", schema=SCHEMA, backend=Slow()),
        ]
    )


async def _open(store: SQLiteStore, run_id: str, responses: list[Any]) -> Any:
    registry = _registry()
    return open_conversation(
        run_id,
        store=store,
        provider=ScriptedProvider(responses),
        registry=registry,
        authority=Authority.for_registry(registry, caller="fixture", run_id=run_id),
        wall_clock=lambda: WALL,
        run_timeout=600.0,
    )


async def _done(store: SQLiteStore) -> None:
    usage = {"input_tokens": 10, "output_tokens": 3}
    responses = [
        ScriptedProvider.tool_calls(("call-1", "echo", {"n": 1}), text="first"),
        ScriptedProvider.tool_calls(("call-2", "echo", {"n": 2})),
        ScriptedProvider.text("all done", usage=usage),
    ]
    async with await _open(store, "done", responses) as conversation:
        await conversation.prompt("count to two")
        await conversation.wait_settled()


async def _asking(store: SQLiteStore, path: Path, target: Path) -> None:
    responses = [ScriptedProvider.tool_calls(("call-1", "gated", {"n": 7}))]
    async with await _open(store, "asking", responses) as conversation:
        await _prompted_until(conversation, "do the gated thing", "interaction_requested")
        _backup(path, target)  # the host stops here: the run waits for its answer


async def _stopped(store: SQLiteStore) -> None:
    responses = [ScriptedProvider.tool_calls(("call-1", "slow", {"n": 3}))]
    async with await _open(store, "stopped", responses) as conversation:
        await _prompted_until(conversation, "start the slow thing", "tool_started")
        await conversation.cancel()
        await conversation.wait_settled()


async def _prompted_until(conversation: Any, prompt: str, event_type: str) -> None:
    """Prompt, then wait for the first event of ``event_type``."""
    events = conversation.subscribe()
    await conversation.prompt(prompt)
    async for event in events:
        if event.type == event_type:
            return


def _backup(path: Path, target: Path) -> None:
    """A consistent copy of the database at ``path`` (WAL included)."""
    target.unlink(missing_ok=True)
    with sqlite3.connect(path) as source, sqlite3.connect(target) as copy:
        source.backup(copy)
    copy.close()
    source.close()


async def main(target: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "runs.sqlite3"
        async with SQLiteStore(path) as store:
            await _done(store)
            await _stopped(store)
            await _asking(store, path, target)
    copy = sqlite3.connect(target)
    copy.execute("PRAGMA journal_mode=DELETE")  # one file, no WAL beside it
    copy.execute("VACUUM")
    copy.close()


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET
    trio.run(
        main, out, clock=trio.testing.MockClock()
    )  # time stands still: every stored instant is WALL
    print(f"wrote {out}")
