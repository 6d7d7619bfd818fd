"""exec_command and write_stdin in real conversations, real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import LINUX_ONLY
from tests.runtime.support import (
    Fault,
    FaultyStore,
    conversation_with,
    make_tool,
    run_to_settled,
)
from trio_backplane import Error, ErrorClass
from trio_backplane.resources import LocalCommand, ResourceRegistry, command_tools
from trio_backplane.resources._proc import group_members
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Hang, ScriptedProvider
from trio_backplane.tools import ToolResult

pytestmark = LINUX_ONLY
S = ScriptedProvider


def structured(finished: Any) -> list[Any]:
    return [m["result"]["structured_content"] for m in finished.tool_messages()]


async def test_exec_command_returns_output_and_exit_code(tmp_path: Path) -> None:
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": "echo hi; pwd; exit 4"})),
                S.text("done"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
    [result] = structured(finished)
    assert result == {
        "exit_code": 4,
        "status": "failed",
        "output": f"hi\n{tmp_path.resolve()}",
    }
    assert finished.record.state == "completed"
    assert finished.snapshot.resource_cleanup.status == "confirmed"
    assert registry.owner_status("run-1") == []


async def test_a_running_command_gives_a_session_and_write_stdin_drives_it(
    tmp_path: Path,
) -> None:
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        script = "echo ready; read -r a; echo got $a; read -r b; echo got $b"
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": script, "yield_time_ms": 300})),
                S.tool_calls(
                    ("c2", "write_stdin", {"session_id": 1, "chars": "x\n", "yield_time_ms": 300})
                ),
                S.tool_calls(
                    ("c3", "write_stdin", {"session_id": 1, "chars": "y\n", "yield_time_ms": 5000})
                ),
                S.text("done"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
    first, second, third = structured(finished)
    assert first == {"session_id": 1, "output": "ready"}
    assert second == {"session_id": 1, "output": "got x"}
    assert third == {"exit_code": 0, "status": "completed", "output": "got y"}


async def test_completion_stops_a_command_the_model_left_running(tmp_path: Path) -> None:
    """RES-14 with a real process group: the model leaves a command with
    grandchildren running; the run's completion stops the whole group."""
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        cmd = "sleep 300 & sleep 300 & echo $$; wait"
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": cmd, "yield_time_ms": 300})),
                S.text("leaving it"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
        [result] = structured(finished)
        pgid = int(result["output"])
        assert finished.record.state == "completed"
        assert finished.snapshot.resource_cleanup.status == "confirmed"
        assert group_members(pgid) == []


async def test_cancel_stops_the_command_s_group(tmp_path: Path) -> None:
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        cmd = "echo $$; sleep 300 & sleep 300 & wait"
        provider = S([S.tool_calls(("c1", "exec_command", {"cmd": cmd, "yield_time_ms": 60_000}))])
        async with conversation_with(provider, tools, wall_clock=None) as (conversation, _):
            await conversation.prompt("go")
            with trio.fail_after(10):
                while not command._jobs or not command._jobs[1].lines:
                    await trio.sleep(0.01)
            pgid = int(command._jobs[1].lines[0])
            await conversation.cancel()
            snapshot = await conversation.wait_settled()
        assert snapshot.resource_cleanup.status == "confirmed"
        assert group_members(pgid) == []


async def test_res_13_a_session_of_another_run_is_refused(tmp_path: Path) -> None:
    """RES-13, through the tools: sessions belong to the run executing the
    tool; a session id of another run is ``forbidden``."""
    registry = ResourceRegistry()
    other = registry.register_session("run-other", "not yours")
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        provider = S(
            [
                S.tool_calls(("c1", "write_stdin", {"session_id": other, "chars": "x\n"})),
                S.text("done"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
    [message] = finished.tool_messages()
    assert message["result"]["is_error"] is True
    assert "forbidden" in str(message["result"])
    assert registry.fetch_session(other, "run-other") == "not yours"


async def test_workdir_stays_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": "pwd", "workdir": "sub"})),
                S.tool_calls(("c2", "exec_command", {"cmd": "pwd", "workdir": "../"})),
                S.text("done"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
    inside, outside = finished.tool_messages()
    assert inside["result"]["structured_content"]["output"] == str(tmp_path.resolve() / "sub")
    assert outside["result"]["is_error"] is True
    assert "workdir must be a directory inside the workspace" in str(outside["result"])


async def test_the_tools_are_mutating_and_need_approval_by_default(tmp_path: Path) -> None:
    async with LocalCommand() as command:
        tools = command_tools(ResourceRegistry(), command, workspace=tmp_path)
    assert [(t.name, t.read_only, t.requires_approval) for t in tools] == [
        ("exec_command", False, True),
        ("write_stdin", False, True),
    ]
    with pytest.raises(Error) as exc:
        command_tools(ResourceRegistry(), command, workspace=tmp_path / "missing")
    assert exc.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize("path", ["run_deadline", "provider_failure", "storage_failure"])
async def test_every_terminal_path_leaves_no_process_of_the_group(
    tmp_path: Path, path: str
) -> None:
    """RES-14 with a real process group left running by the model: the run
    deadline, a provider failure and a storage failure each stop it, its
    grandchildren included."""
    registry = ResourceRegistry()
    cmd = "echo $$; sleep 300 & sleep 300 & wait"
    call = S.tool_calls(("c1", "exec_command", {"cmd": cmd, "yield_time_ms": 200}))
    after = {
        "run_deadline": [Hang()],
        "provider_failure": S.failure(Error(ErrorClass.TRANSIENT_TRANSPORT, "provider down")),
        "storage_failure": S.text("done"),
    }[path]
    store = FaultyStore(MemoryStore(), Fault("fail", kind="finish"))
    extra: dict[str, Any] = {
        "run_deadline": {"run_timeout": 1.0},
        "provider_failure": {},
        "storage_failure": {"store": store},
    }[path]
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        finished = await run_to_settled(S([call, after]), tools, wall_clock=None, **extra)
        [result] = structured(finished)
        pgid = int(result["output"])
        assert finished.snapshot.resource_cleanup.status == "confirmed"
        assert group_members(pgid) == []
    expected = {
        "run_deadline": ("unknown_outcome", None),
        "provider_failure": ("failed", None),
        "storage_failure": (None, "storage_failed"),
    }[path]
    if expected[0] is not None:
        assert finished.record.state == expected[0]
    else:
        assert finished.snapshot.phase == expected[1]


async def test_res_07_res_09_a_real_group_that_cannot_be_stopped_is_kept_and_never_retried(
    tmp_path: Path,
) -> None:
    """RES-07, RES-09, RES-15, with a real process group: a command session
    whose group survives its cleanup leaves the registry entry failed; every
    later release raises ``unknown_outcome`` and never runs the cleanup
    again, and the run whose last turn succeeded ends ``unknown_outcome``
    with that evidence, never ``completed``."""
    from tests.resources.test_local_command import Refusing

    registry = ResourceRegistry()
    signaler = Refusing()
    async with LocalCommand(signaler=signaler, cleanup_timeout=0.3) as command:
        confirmations: list[Any] = []
        real_confirm = command.cancel_confirmed

        async def counting(invocation: Any, timeout: float) -> None:
            confirmations.append(invocation)
            await real_confirm(invocation, timeout)

        command.cancel_confirmed = counting  # type: ignore[method-assign]
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        cmd = "echo $$; sleep 300 & sleep 300 & wait"
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": cmd, "yield_time_ms": 200})),
                S.text("leaving it"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
        [result] = structured(finished)
        pgid = int(result["output"])
        assert finished.record.state == "unknown_outcome"
        assert finished.snapshot.resource_cleanup.status == "uncertain"
        assert group_members(pgid) != []
        [kept] = registry.owner_status("run-1")
        assert kept.status == "failed"
        assert len(confirmations) == 1
        for _ in range(2):
            with pytest.raises(Error) as exc:
                await registry.release_session(int(kept.id), "run-1", 1)
            assert exc.value.message == "resource cleanup needs reconciliation"
        assert len(confirmations) == 1  # never cleaned again
        signaler.works = True  # the host reconciles: the group is stopped on leaving
    with trio.fail_after(5):
        while group_members(pgid):
            await trio.sleep(0.01)


async def test_a_human_wait_suspends_a_command_s_deadline(tmp_path: Path) -> None:
    """A person answering another tool's question stops the run's clocks,
    its commands' deadlines included: a command with a 1.5 s deadline is
    still running after a 3 s human wait, and ends at its deadline after."""
    registry = ResourceRegistry()

    class Ask:
        async def execute(self, operation: Any) -> ToolResult:
            answer = await operation.context.interact({"question": "go on?"})
            return ToolResult(str(answer))

    async with LocalCommand() as command:
        tools = [
            *command_tools(
                registry, command, workspace=tmp_path, requires_approval=False, timeout=1.5
            ),
            make_tool("ask", Ask()),
        ]
        poll = {"session_id": 1, "yield_time_ms": 100}
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": "sleep 300", "yield_time_ms": 100})),
                S.tool_calls(("c2", "ask", {})),
                S.tool_calls(("c3", "write_stdin", poll)),
                S.tool_calls(("c4", "write_stdin", {**poll, "yield_time_ms": 10_000})),
                S.text("done"),
            ]
        )
        async with conversation_with(provider, tools, wall_clock=None) as (conversation, _):
            await conversation.prompt("go")
            with trio.fail_after(20):
                while (pending := conversation.status().pending_interaction) is None:
                    await trio.sleep(0.01)
            await trio.sleep(3.0)  # the person takes their time
            await conversation.resolve(pending["id"], "yes")
            snapshot = await conversation.wait_settled()
    results = [
        m["result"]["structured_content"] for m in snapshot.messages if m.get("role") == "tool"
    ]
    assert results[0] == {"session_id": 1, "output": ""}
    assert results[2] == {"session_id": 1, "output": ""}  # still running after the wait
    assert results[3]["status"] == "deadline_exceeded"


async def _session_with_command(
    registry: ResourceRegistry, command: LocalCommand, tmp_path: Path
) -> tuple[int, list[Any]]:
    """A running real command's session in ``registry`` (owner ``run-1``),
    registered the way ``exec_command`` does; the cleanup calls it counts."""
    from trio_backplane.resources import CommandInvocation

    calls: list[Any] = []
    holder: dict[str, CommandInvocation] = {}

    async def cleanup() -> str:
        calls.append(holder["invocation"])
        await command.cancel_confirmed(holder["invocation"], 5.0)
        return "confirmed"

    session_id = registry.register_session("run-1", cleanup=cleanup)
    holder["invocation"] = CommandInvocation(owner="run-1", session_id=session_id)
    await command.start(holder["invocation"], "sleep 300 & sleep 300 & wait", workspace=tmp_path)
    registry.update_session(session_id, "run-1", "running")
    return session_id, calls


async def test_res_08_a_release_racing_close_owner_stops_a_real_group_once(
    tmp_path: Path,
) -> None:
    """RES-08 with a real process group: a release and the owner's close,
    concurrent, run the cleanup once; the group is gone."""
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        session_id, calls = await _session_with_command(registry, command, tmp_path)
        pgid = command._jobs[session_id].launched.pgid
        async with trio.open_nursery() as nursery:
            nursery.start_soon(registry.release_session, session_id, "run-1")
            nursery.start_soon(registry.close_owner, "run-1")
        assert len(calls) == 1
        assert group_members(pgid) == []


async def test_res_10_a_real_cleanup_overrunning_the_registry_bound_is_uncertain(
    tmp_path: Path,
) -> None:
    """RES-10 with a real process group that ignores its stop: the cleanup
    (confirming the group gone) overruns the registry's ``cleanup_timeout``
    and the entry is uncertain, ``unknown_outcome`` on release."""
    from tests.resources.test_local_command import Refusing

    registry = ResourceRegistry(cleanup_timeout=0.5)
    signaler = Refusing()
    async with LocalCommand(signaler=signaler, cleanup_timeout=2.0) as command:
        session_id, _ = await _session_with_command(registry, command, tmp_path)
        pgid = command._jobs[session_id].launched.pgid
        with pytest.raises(Error) as exc:
            await registry.release_session(session_id, "run-1")
        assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
        assert exc.value.message == "resource cleanup is unconfirmed"
        assert group_members(pgid) != []
        signaler.works = True  # leaving the backend stops it
    with trio.fail_after(5):
        while group_members(pgid):
            await trio.sleep(0.01)
