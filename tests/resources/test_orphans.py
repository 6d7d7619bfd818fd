"""A host killed with SIGKILL leaves its commands' process groups behind:
the record names them, and ``runs recover --kill-orphans`` stops them."""

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
from tests.resources.test_local_command import _sleepers
from trio_backplane.recovery import recover
from trio_backplane.resources import kill_orphans
from trio_backplane.store import SQLiteStore

pytestmark = LINUX_ONLY

HOST = textwrap.dedent(
    """
    import sys, trio
    from trio_backplane import open_conversation, SQLiteStore, ToolRegistry, Authority
    from trio_backplane.resources import LocalCommand, ResourceRegistry, command_tools
    from trio_backplane.testing import Hang, ScriptedProvider as S

    db, workspace, mark = sys.argv[1], sys.argv[2], sys.argv[3]
    cmd = f"sleep {mark} & sleep {mark} & setsid sleep {mark} & wait"

    async def main():
        async with SQLiteStore(db) as store, LocalCommand() as command:
            registry = ToolRegistry(
                command_tools(ResourceRegistry(), command, workspace=workspace,
                              requires_approval=False)
            )
            provider = S([
                S.tool_calls(("c1", "exec_command", {"cmd": cmd, "yield_time_ms": 100})),
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


def _load(db: Path) -> Any:
    async def load() -> Any:
        async with SQLiteStore(db) as store:
            return await store.load("host-run")

    return trio.run(load)


def test_a_sigkilled_host_s_groups_are_recorded_and_kill_orphans_stops_them(
    tmp_path: Path,
) -> None:
    """After a host SIGKILL, ``recover`` reports the command's process group
    (recorded with the run before the model heard of it), its processes
    still run (one in a session of its own), and ``backplane runs recover
    --kill-orphans`` stops them all and says so; a second pass finds it gone."""
    db, mark = tmp_path / "runs.sqlite3", 47_123
    host = subprocess.Popen([sys.executable, "-c", HOST, str(db), str(tmp_path), str(mark)])
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the host never recorded its command"
            assert host.poll() is None, "the host exited"
            record = db.exists() and _load(db)
            recorded = record and recover(record, incarnation=record.incarnation + 1).resources
            if recorded and len(_sleepers({mark})) == 3:
                break
            time.sleep(0.05)
    finally:
        host.send_signal(signal.SIGKILL)
        host.wait()
    [group] = recover(record, incarnation=record.incarnation + 1).resources
    assert group["kind"] == "process_group"
    # the host is dead, its command's group is not, nor the sleeper that
    # left the group for a session of its own
    assert len(_sleepers({mark})) == 3
    result = subprocess.run(
        [sys.executable, "-m", "trio_backplane.cli", "runs", "recover", f"sqlite:///{db}",
         "host-run", "--kill-orphans"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"orphan process group {group['pgid']} killed" in result.stdout
    assert _sleepers({mark}) == []
    [again] = trio.run(kill_orphans, [group])
    assert again["status"] == "gone"


def test_kill_orphans_leaves_other_hosts_boots_and_reused_ids_alone(tmp_path: Path) -> None:
    async def main() -> list[dict[str, Any]]:
        process = await trio.lowlevel.open_process(["sleep", "47124"], start_new_session=True)
        try:
            from trio_backplane.resources._orphans import group_evidence

            real = group_evidence(process.pid, 0, session_id=1)
            reused = {**real}  # a start time that is not the leader's: another group
            moved = {**real, "host": "elsewhere"}
            rebooted = {**real, "boot_id": "another-boot"}
            return await kill_orphans([reused, moved, rebooted, {"kind": "file"}])
        finally:
            process.kill()
            await process.wait()

    reports = trio.run(main)
    assert [(r["status"], r.get("reason")) for r in reports] == [
        ("gone", None),
        ("skipped", "another host"),
        ("skipped", "an earlier boot: gone"),
    ]
