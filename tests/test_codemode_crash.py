"""A host SIGKILLed while a cell runs: the record names the cell's worker,
recovery classifies its nested calls and replays nothing, and
``runs recover --kill-orphans`` leaves no Deno process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import trio

from tests.conftest import LINUX_ONLY
from tests.resources.test_orphans import _load
from trio_backplane import Authority, ToolRegistry, open_conversation
from trio_backplane.codemode import code_mode_tools
from trio_backplane.recovery import recover
from trio_backplane.resources import ResourceRegistry, kill_orphans
from trio_backplane.resources._proc import group_members
from trio_backplane.store import SQLiteStore
from trio_backplane.testing import ScriptedProvider

pytestmark = LINUX_ONLY

TOOLS = textwrap.dedent(
    """
    import trio
    from trio_backplane import ToolDescriptor
    from trio_backplane.tools import ToolResult

    SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}

    def tools(marks):
        async def note(operation):
            with open(marks, "a") as file:
                file.write("note\\n")
            return ToolResult("noted", structured_content={"ok": True})

        async def transfer(operation):
            with open(marks, "a") as file:
                file.write("transfer\\n")
            await trio.sleep_forever()

        class Backend:
            def __init__(self, run):
                self.execute = run

        return [
            ToolDescriptor(name="note", schema=SCHEMA, backend=Backend(note), read_only=True),
            ToolDescriptor(name="transfer", schema=SCHEMA, backend=Backend(transfer)),
        ]
    """
)
HOST = textwrap.dedent(
    """
    import sys, trio
    from trio_backplane import open_conversation, SQLiteStore, ToolRegistry, Authority
    from trio_backplane.codemode import code_mode_tools
    from trio_backplane.resources import ResourceRegistry
    from trio_backplane.testing import Hang, ScriptedProvider as S
    from crash_tools import tools

    db, marks = sys.argv[1], sys.argv[2]
    # busy after its call: a worker that never reads again outlives its host
    CELL = 'await tools.note({x: "a"}); tools.transfer({x: "b"}); while (true) {}'

    async def main():
        async with SQLiteStore(db) as store:
            registry = ToolRegistry([*code_mode_tools(ResourceRegistry()), *tools(marks)])
            provider = S([
                S.tool_calls(("c1", "code", {"code": CELL, "yield_time_ms": 300000})),
                [Hang()],
            ])
            async with open_conversation(
                "host-run", store=store, provider=provider, registry=registry,
                authority=Authority.for_registry(registry, caller="host", run_id="host-run"),
            ) as conversation:
                await conversation.prompt("go")
                await trio.sleep_forever()

    trio.run(main)
    """
)


def _crash_during_the_cell(tmp_path: Path) -> Any:
    """Run the host until the cell's mutating nested call is dispatched,
    SIGKILL it, and return the stored record."""
    db, marks = tmp_path / "runs.sqlite3", tmp_path / "marks.txt"
    (tmp_path / "crash_tools.py").write_text(TOOLS)
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, str(db), str(marks)],
        env={"PYTHONPATH": f"{tmp_path}:{Path.cwd()}", "PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 60
        while not (marks.exists() and "transfer" in marks.read_text()):
            assert time.monotonic() < deadline, "the cell never called transfer"
            assert host.poll() is None, "the host exited"
            time.sleep(0.05)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    return _load(db)


def test_a_sigkilled_host_s_cell_is_reported_classified_and_killed(tmp_path: Path) -> None:
    """After a SIGKILL mid-cell: ``recover`` reports the cell's worker group
    (recorded before the cell ran) and classifies the cell and its
    dispatched mutating nested call as uncertain, the read-only one settled;
    reopening the run replays nothing (``recovery_required``, no backend
    called again); ``--kill-orphans`` stops the worker and no Deno process
    of it is left."""
    record = _crash_during_the_cell(tmp_path)
    report = recover(record, incarnation=record.incarnation + 1)
    [group] = report.resources
    try:
        assert (group["kind"], group["cell_id"]) == ("process_group", "res_1")
        assert group_members(group["pgid"]) != []  # the host is dead, its worker is not
        tools_by_id = {
            effect_id: intent.get("tool_name") for effect_id, intent in record.intents.items()
        }
        uncertain = sorted(tools_by_id[effect_id] for effect_id in report.uncertain_effects)
        assert uncertain == ["code", "transfer"]
        [note] = [i for i in record.intents.values() if i.get("tool_name") == "note"]
        assert note["status"] == "consumed"

        async def reopen() -> str:
            async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
                registry = ToolRegistry(code_mode_tools(ResourceRegistry()))
                async with open_conversation(
                    "host-run",
                    store=store,
                    provider=ScriptedProvider([ScriptedProvider.text("never")]),
                    registry=registry,
                    authority=Authority.for_registry(registry, caller="host", run_id="host-run"),
                    run=record,
                ) as conversation:
                    return conversation.status().phase

        assert trio.run(reopen) == "recovery_required"
        assert (tmp_path / "marks.txt").read_text().split() == ["note", "transfer"]

        result = subprocess.run(
            [sys.executable, "-m", "trio_backplane.cli", "runs", "recover",
             f"sqlite:///{tmp_path / 'runs.sqlite3'}", "host-run", "--kill-orphans"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert f"orphan process group {group['pgid']} killed" in result.stdout
        assert group_members(group["pgid"]) == []
    finally:  # a failed check leaves no busy Deno behind (a no-op once killed)
        trio.run(kill_orphans, report.resources)
