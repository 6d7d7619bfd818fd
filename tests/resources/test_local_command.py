"""LocalCommand with real processes: groups, handshake, output, cleanup
confirmed from /proc, reservations and receipts."""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.conftest import LINUX_ONLY
from trio_backplane import Error, ErrorClass
from trio_backplane.resources import CommandInvocation, CommandLimits, LocalCommand
from trio_backplane.resources._proc import GROUP_VAR, group_members

pytestmark = LINUX_ONLY

GRANDCHILDREN = "sleep 300 & sleep 300 & wait"


def inv(session_id: int, owner: str = "run-1", incarnation: int = 1) -> CommandInvocation:
    return CommandInvocation(owner=owner, session_id=session_id, incarnation=incarnation)


@pytest.fixture
async def command() -> AsyncIterator[LocalCommand]:
    async with LocalCommand(completion_retention=60.0) as backend:
        yield backend


async def settled(backend: LocalCommand, invocation: CommandInvocation) -> Any:
    return await backend.wait(invocation, 30.0)


async def pgid_of(backend: LocalCommand, invocation: CommandInvocation) -> int:
    return backend._jobs[invocation.session_id].launched.pgid


async def test_res_11_a_command_runs_in_its_own_group_with_allow_listed_env(
    command: LocalCommand, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RES-11: each command leads its own session and process group, sees
    only the allow-listed variables (and its group's mark), runs in the
    workspace, and reports cleanup confirmed once its group is gone."""
    monkeypatch.setenv("BACKPLANE_SECRET", "canary-123")
    async with LocalCommand(env_allow=("PATH",)) as backend:
        first = await backend.start(
            inv(1), "echo $$ $(ps -o pgid= -p $$) $(ps -o sid= -p $$); env; pwd", workspace=tmp_path
        )
        assert first.status == "running"
        done = await settled(backend, inv(1))
    pid, pgid, sid = (int(x) for x in done.output[0].split())
    assert pid == pgid == sid != os.getpid()
    variables = dict(line.split("=", 1) for line in done.output[1:-1] if "=" in line)
    assert "BACKPLANE_SECRET" not in variables
    assert set(variables) <= {"PATH", "PWD", "SHLVL", "_", GROUP_VAR}
    # the group's mark: its id and its leader's start time
    assert variables[GROUP_VAR].split(".")[0] == str(pgid)
    assert variables[GROUP_VAR].split(".")[1].isdigit()
    assert done.output[-1] == str(tmp_path.resolve())
    assert (done.status, done.exit_status, done.cleanup_status) == ("completed", 0, "confirmed")
    assert group_members(pgid) == []


async def test_a_failing_command_and_its_output(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(inv(1), "printf 'a\\nb\\n'; printf c; exit 3", workspace=tmp_path)
    done = await settled(command, inv(1))
    assert (done.output, done.cursor, done.status, done.exit_status) == (
        ("a", "b", "c"),
        3,
        "failed",
        3,
    )
    assert command.read(inv(1), cursor=2).output == ("c",)


async def test_grandchildren_are_gone_after_the_command_completes(
    command: LocalCommand, tmp_path: Path
) -> None:
    """A command that leaves background processes in its group: completion
    stops them too, and the cleanup is confirmed only once none is left."""
    await command.start(inv(1), "sleep 300 & sleep 300 & echo started", workspace=tmp_path)
    pgid = await pgid_of(command, inv(1))
    done = await settled(command, inv(1))
    assert (done.status, done.cleanup_status) == ("completed", "confirmed")
    assert group_members(pgid) == []


async def test_a_descendant_in_a_session_of_its_own_is_stopped_on_cancel(
    command: LocalCommand, tmp_path: Path
) -> None:
    """A descendant that left the command's group and session (``setsid``)
    still carries the group's mark: cancelling the command stops it too, and
    the cleanup is confirmed only once it is gone."""
    mark = 47_201
    escape = f"setsid sh -c 'echo $$ $(ps -o sid= -p $$); exec sleep {mark}' & wait"
    await command.start(inv(1), escape, workspace=tmp_path)
    pgid = await pgid_of(command, inv(1))
    with trio.fail_after(10):
        while not (_sleepers({mark}) and command.read(inv(1), cursor=0).output):
            await trio.sleep(0.01)
    pid, sid = (int(x) for x in command.read(inv(1), cursor=0).output[0].split())
    assert pid == sid != pgid  # out of the command's session and group
    command.cancel("run-1")
    done = await settled(command, inv(1))
    assert (done.status, done.cleanup_status) == ("cancelled", "confirmed")
    assert _sleepers({mark}) == []


async def test_a_daemon_a_completed_command_left_behind_is_killed(
    command: LocalCommand, tmp_path: Path
) -> None:
    """A command that exits leaving a daemon (double fork, own session,
    SIGTERM ignored): the cleanup finds it by the group's mark, kills it, and
    only then confirms."""
    mark = 47_202
    daemon = f"(setsid sh -c \"trap '' TERM; touch ready; exec sleep {mark}\" &)"
    wait_ready = "while [ ! -e ready ]; do sleep 0.01; done"
    await command.start(inv(1), f"{daemon}; {wait_ready}; echo started", workspace=tmp_path)
    done = await settled(command, inv(1))
    assert (done.status, done.output, done.cleanup_status) == (
        "completed",
        ("started",),
        "confirmed",
    )
    assert _sleepers({mark}) == []
    assert marked_anywhere(mark) == []


def marked_anywhere(mark: int) -> list[int]:
    """Pids of live processes whose environment names the mark variable and
    whose command line holds ``mark``."""
    found = []
    for name in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            argv = Path(f"/proc/{name}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if GROUP_VAR.encode() in environ and str(mark).encode() in argv:
            found.append(int(name))
    return found


async def test_cancel_stops_the_whole_group(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(inv(1), GRANDCHILDREN, workspace=tmp_path)
    pgid = await pgid_of(command, inv(1))
    with trio.fail_after(10):
        while len(group_members(pgid)) < 3:
            await trio.sleep(0.01)
    command.cancel("run-1")
    done = await settled(command, inv(1))
    assert (done.status, done.termination_status, done.cleanup_status) == (
        "cancelled",
        "cancelled",
        "confirmed",
    )
    assert group_members(pgid) == []
    assert command.owner_status("run-1") == "confirmed"


async def test_a_command_deadline_ends_it(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(inv(1), GRANDCHILDREN, workspace=tmp_path, timeout=0.5)
    pgid = await pgid_of(command, inv(1))
    done = await settled(command, inv(1))
    assert (done.status, done.termination_status, done.cleanup_status) == (
        "deadline_exceeded",
        "deadline_exceeded",
        "confirmed",
    )
    assert group_members(pgid) == []


async def test_the_output_limit_ends_the_command(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(
        inv(1), f"sleep 300 & yes {'x' * 30}", workspace=tmp_path, output_limit=4000
    )
    pgid = await pgid_of(command, inv(1))
    done = await settled(command, inv(1))
    assert (done.status, done.output_limit_exceeded, done.cleanup_status) == (
        "output_limit_exceeded",
        True,
        "confirmed",
    )
    assert sum(len(line) + 8 for line in done.output) <= 4000
    assert group_members(pgid) == []


async def test_write_reaches_the_command_s_input(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(inv(1), "read -r line; echo got $line", workspace=tmp_path)
    await command.write(inv(1), "hello\n")
    done = await settled(command, inv(1))
    assert done.output == ("got hello",)
    with pytest.raises(Error) as exc:
        await command.write(inv(1), "late\n")
    assert exc.value.error_class is ErrorClass.RESOURCE_CONFLICT


async def test_a_workspace_holds_one_command(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(inv(1), "sleep 300", workspace=tmp_path)
    with pytest.raises(Error) as exc:
        await command.start(inv(2), "true", workspace=tmp_path)
    assert (exc.value.error_class, exc.value.message) == (
        ErrorClass.RESOURCE_CONFLICT,
        "workspace already has an active command",
    )
    command.cancel("run-1")  # fences the refused session 2 as well
    await settled(command, inv(1))
    await command.start(inv(3), "true", workspace=tmp_path)


async def test_limits_apply_to_the_command(command: LocalCommand, tmp_path: Path) -> None:
    await command.start(
        inv(1),
        "ulimit -n; ulimit -t",
        workspace=tmp_path,
        limits=CommandLimits(open_files=17, cpu_seconds=9),
    )
    assert (await settled(command, inv(1))).output == ("17", "9")
    with pytest.raises(Error) as exc:
        await command.start(inv(2), "true", workspace=tmp_path, limits=CommandLimits(open_files=0))
    assert exc.value.error_class is ErrorClass.VALIDATION


async def test_res_01_owner_wide_cancel_fences_never_launched_reservations(
    command: LocalCommand, tmp_path: Path
) -> None:
    """RES-01: after an owner-wide cancel, a reserved session of that owner
    never launches: ``cancelled``, and nothing is spawned."""
    command.reserve(inv(1))
    command.cancel("run-1")
    marker = tmp_path / "ran"
    with pytest.raises(Error) as exc:
        await command.start(inv(1), f"touch {marker}", workspace=tmp_path)
    assert exc.value.error_class is ErrorClass.CANCELLED
    assert exc.value.details["launch_status"] == "never_started"
    assert not marker.exists()
    assert command.session_status(inv(1)) == "confirmed"


async def test_res_02_another_owner_s_reservation_stays_usable(tmp_path: Path) -> None:
    """RES-02: another owner's reservation survives an owner-wide cancel
    and the eviction of receipts."""
    async with LocalCommand(receipt_capacity=1) as backend:
        backend.reserve(inv(10, owner="run-2"))
        backend.reserve(inv(1))
        backend.cancel("run-1")
        backend.acknowledge_release(inv(1))
        backend.reserve(inv(2))
        backend.cancel("run-1")
        backend.acknowledge_release(inv(2))  # evicts session 1's receipt
        await backend.start(inv(10, owner="run-2"), "echo ok", workspace=tmp_path)
        assert (await settled(backend, inv(10, owner="run-2"))).output == ("ok",)


async def test_res_03_session_capacity_refuses_with_never_started(tmp_path: Path) -> None:
    """RES-03: past ``session_capacity`` unresolved sessions a reservation
    is ``overloaded`` with never-started details; existing evidence stays."""
    async with LocalCommand(session_capacity=2) as backend:
        backend.reserve(inv(1))
        backend.reserve(inv(2))
        with pytest.raises(Error) as exc:
            backend.reserve(inv(3))
        assert exc.value.error_class is ErrorClass.OVERLOADED
        assert {k: exc.value.details[k] for k in ("launch_status", "reservation")} == {
            "launch_status": "never_started",
            "reservation": "not_created",
        }
        backend.reserve(inv(1))  # still there, still reusable
        backend.reserve(inv(2))


async def test_res_04_an_evicted_receipt_answers_expired(tmp_path: Path) -> None:
    """RES-04: once an acknowledged release is evicted past
    ``receipt_capacity``, ``cancel_confirmed`` raises ``unknown_outcome``
    with ``receipt: "expired"``."""
    async with LocalCommand(receipt_capacity=1) as backend:
        for session_id in (1, 2):
            await backend.start(inv(session_id), "true", workspace=tmp_path)
            await settled(backend, inv(session_id))
            await backend.cancel_confirmed(inv(session_id), 5.0)
            backend.acknowledge_release(inv(session_id))
        await backend.cancel_confirmed(inv(2), 5.0)  # its receipt answers
        with pytest.raises(Error) as exc:
            await backend.cancel_confirmed(inv(1), 5.0)
        assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
        assert exc.value.details["receipt"] == "expired"


class Refusing:
    """A signaler that sends nothing (a group it cannot stop) until told."""

    def __init__(self) -> None:
        self.works = False

    def __call__(self, pgid: int, sig: int) -> None:
        if self.works:
            os.killpg(pgid, sig)


async def test_res_05_res_06_a_failed_cleanup_keeps_evidence_and_a_retry_confirms_it(
    tmp_path: Path,
) -> None:
    """RES-05: a group that cannot be stopped gives ``cleanup_failed`` and
    ``uncertain``, and the workspace stays blocked after the output record
    expires.  RES-06: a verified retry through ``cancel_confirmed`` marks
    the kept record confirmed without changing its status, exit, output or
    recorded cleanup error."""
    signaler = Refusing()
    async with LocalCommand(
        signaler=signaler, cleanup_timeout=0.5, completion_retention=0.1
    ) as backend:
        await backend.start(inv(1), "echo hi; sleep 300", workspace=tmp_path, timeout=0.3)
        pgid = await pgid_of(backend, inv(1))
        done = await settled(backend, inv(1))
        assert (done.status, done.cleanup_status) == ("cleanup_failed", "uncertain")
        assert group_members(pgid) != []
        with pytest.raises(Error) as exc:
            await backend.cancel_confirmed(inv(1), 2.0)
        assert exc.value.message == "local command cleanup is uncertain"
        await trio.sleep(0.3)  # past completion_retention: the output record expires
        with pytest.raises(Error) as exc:
            backend.read(inv(1))
        assert exc.value.message == "job not found"
        with pytest.raises(Error) as exc:
            await backend.start(inv(2), "true", workspace=tmp_path)
        assert exc.value.message == "workspace already has an active command"
        kept = backend._evidence[1]
        signaler.works = True
        await backend.cancel_confirmed(inv(1), 5.0)
        assert group_members(pgid) == []
        assert (kept.status, kept.cleanup_status, kept.lines) == (
            "cleanup_failed",
            "confirmed",
            ["hi"],
        )
        assert kept.cleanup_error is not None
        await backend.start(inv(2), "true", workspace=tmp_path)


async def test_res_12_capacities_default_to_256_and_are_checked() -> None:
    """RES-12: ``receipt_capacity`` and ``session_capacity`` default to 256;
    anything but a positive int is ``validation``."""
    backend = LocalCommand()
    assert (backend.receipt_capacity, backend.session_capacity) == (256, 256)
    for bad in (0, -1, 1.0, True, "256", None):
        for name in ("receipt_capacity", "session_capacity"):
            with pytest.raises(Error) as exc:
                LocalCommand(**{name: bad})
            assert exc.value.error_class is ErrorClass.VALIDATION


async def test_res_13_sessions_are_fenced_by_owner_and_incarnation(
    command: LocalCommand, tmp_path: Path
) -> None:
    """RES-13: another owner is ``forbidden``; a replacement incarnation
    reusing the numeric id is ``resource_conflict`` "stale command session
    incarnation", for polling and for release alike."""
    await command.start(inv(1), "sleep 300", workspace=tmp_path)
    with pytest.raises(Error) as exc:
        command.read(inv(1, owner="run-2"))
    assert exc.value.error_class is ErrorClass.FORBIDDEN
    for call in (
        lambda: command.read(inv(1, incarnation=2)),
        lambda: command.acknowledge_release(inv(1, incarnation=2)),
    ):
        with pytest.raises(Error) as exc:
            call()
        assert (exc.value.error_class, exc.value.message) == (
            ErrorClass.RESOURCE_CONFLICT,
            "stale command session incarnation",
        )
    with pytest.raises(Error) as exc:
        await command.cancel_confirmed(inv(1, incarnation=2), 1.0)
    assert exc.value.message == "stale command session incarnation"
    await command.cancel_confirmed(inv(1), 5.0)


async def test_cancel_confirmed_of_an_unknown_session_fences_it(
    command: LocalCommand, tmp_path: Path
) -> None:
    with pytest.raises(Error) as exc:
        await command.cancel_confirmed(inv(7), 1.0)
    assert exc.value.message == "local command cleanup identity is unknown"
    with pytest.raises(Error) as exc:
        await command.start(inv(7), "true", workspace=tmp_path)
    assert exc.value.error_class is ErrorClass.CANCELLED


async def test_leaving_kills_every_group_still_owned(tmp_path: Path) -> None:
    async with LocalCommand() as backend:
        await backend.start(inv(1), GRANDCHILDREN, workspace=tmp_path)
        pgid = await pgid_of(backend, inv(1))
    with trio.fail_after(5):
        while group_members(pgid):
            await trio.sleep(0.01)


async def test_unsupported_platforms_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """RES-11: elsewhere than Linux, ``unsupported_capability``."""
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(Error) as exc:
        async with LocalCommand():
            pass
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY


def _sleepers(marks: set[int]) -> list[int]:
    """Pids of live ``sleep N`` processes whose N is one of ``marks``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        running = argv[0] == b"sleep" and len(argv) > 1 and state != b"Z"
        if running and argv[1].isdigit() and int(argv[1]) in marks:
            found.append(int(name))
    return found


async def test_no_orphan_at_200_randomized_cancel_times(tmp_path: Path) -> None:
    """Owner-wide cancels at 200 random moments (before, during and after
    the launch and its handshake) of a command whose grandchildren share
    its group: no process of any of them is left alive."""
    rng = random.Random(20261202)
    marks: set[int] = set()
    async with LocalCommand() as backend:
        for n in range(200):
            owner, mark = f"run-{n}", 40_000 + n
            marks.add(mark)
            delay = rng.uniform(0.0, 0.03)

            async def launch(owner: str = owner, mark: int = mark) -> None:
                cmd = f"sleep {mark} & sleep {mark} & wait"
                with contextlib.suppress(Error):  # a cancel before the ACK refuses it
                    await backend.start(inv(1, owner=owner), cmd, workspace=tmp_path / owner)

            (tmp_path / owner).mkdir()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(launch)
                await trio.sleep(delay)
                backend.cancel(owner)
            with trio.fail_after(10):
                while backend.owner_status(owner) == "pending":
                    await trio.sleep(0.005)
            assert backend.owner_status(owner) == "confirmed"
    with trio.fail_after(5):
        while _sleepers(marks):
            await trio.sleep(0.01)
    assert _sleepers(marks) == []


async def test_a_cancel_landing_after_admission_still_stops_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner-wide cancel that lands after the launch was admitted but
    before its command is registered (while the launcher is acknowledged)
    stops the command as soon as it is: the owner's cleanup is confirmed and
    no process is left.  (It was left running, its owner pending for ever:
    the 200-cancel test above found it on a loaded machine.)"""
    from trio_backplane.resources import _command

    mark = 40_999
    real = _command.launch
    async with LocalCommand() as backend:

        async def launch_then_cancel(*args: Any, **kwargs: Any) -> Any:
            launched = await real(*args, **kwargs)
            backend.cancel("late")  # admitted, acknowledged, not yet registered
            return launched

        monkeypatch.setattr(_command, "launch", launch_then_cancel)
        (tmp_path / "w").mkdir()
        command = f"sleep {mark} & sleep {mark} & wait"
        out = await backend.start(inv(1, owner="late"), command, workspace=tmp_path / "w")
        assert out.status == "cancelled"
        with trio.fail_after(10):  # a hang guard: it settles in about 0.1 s
            while backend.owner_status("late") == "pending":
                await trio.sleep(0.005)
        assert backend.owner_status("late") == "confirmed"
        assert _sleepers({mark}) == []


@pytest.mark.parametrize("when", ["before admission", "after admission"])
async def test_cancel_confirmed_during_a_launch_waits_for_it_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """``cancel_confirmed`` of a session whose launch is in progress fences
    it and waits: refused at its admission (nothing ran), or stopped as
    soon as it is registered; either way the cleanup is confirmed and no
    process is left.  (It answered ``unknown_outcome`` at once and the
    command ran on.)"""
    from trio_backplane.resources import _command

    mark = 40_998
    real = _command.launch
    outcome: list[BaseException | None] = []
    async with LocalCommand() as backend, trio.open_nursery() as nursery:

        async def cancel() -> None:
            try:
                await backend.cancel_confirmed(inv(1, owner="mid"), 5.0)
                outcome.append(None)
            except Error as exc:
                outcome.append(exc)

        async def launch_with_cancel(*args: Any, **kwargs: Any) -> Any:
            if when == "before admission":
                nursery.start_soon(cancel)
                await trio.testing.wait_all_tasks_blocked()
                return await real(*args, **kwargs)
            launched = await real(*args, **kwargs)
            nursery.start_soon(cancel)
            await trio.testing.wait_all_tasks_blocked()  # it fenced the launch, and waits
            return launched

        monkeypatch.setattr(_command, "launch", launch_with_cancel)
        (tmp_path / "w").mkdir()
        command = f"sleep {mark} & sleep {mark} & wait"
        if when == "before admission":
            with pytest.raises(Error) as refused:
                await backend.start(inv(1, owner="mid"), command, workspace=tmp_path / "w")
            assert refused.value.details["launch_status"] == "never_started"
        else:
            out = await backend.start(inv(1, owner="mid"), command, workspace=tmp_path / "w")
            assert out.status == "cancelled"
        with trio.fail_after(10):  # a hang guard: it settles in about 0.1 s
            while not outcome:
                await trio.sleep(0.005)
        assert outcome == [None]
        assert backend.session_status(inv(1, owner="mid")) == "confirmed"
        assert _sleepers({mark}) == []


async def test_a_backend_closed_during_a_launch_kills_the_command_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch that completes after its backend closed has no supervisor:
    its group is stopped and its cleanup verified, ``start`` raises
    ``unknown_outcome`` (the command ran), and a ``cancel_confirmed``
    waiting on the launch returns confirmed at once (it waited out its
    timeout and left the command running)."""
    from trio_backplane.resources import _command

    mark, at_gate, gate = 41_777, trio.Event(), trio.Event()
    real = _command.launch

    async def gated(*args: Any, **kwargs: Any) -> Any:
        launched = await real(*args, **kwargs)  # admitted and acknowledged
        at_gate.set()
        await gate.wait()
        return launched

    monkeypatch.setattr(_command, "launch", gated)
    (tmp_path / "w").mkdir()
    results: dict[str, BaseException | None] = {}

    async def record(name: str, call: Any) -> None:
        try:
            await call()
            results[name] = None
        except Error as exc:
            results[name] = exc

    async with trio.open_nursery() as outer:
        async with LocalCommand() as backend:
            command = f"sleep {mark} & sleep {mark} & wait"
            start = partial(backend.start, inv(1, owner="o"), command, workspace=tmp_path / "w")
            outer.start_soon(record, "start", start)
            await at_gate.wait()
            confirm = partial(backend.cancel_confirmed, inv(1, owner="o"), 60.0)
            outer.start_soon(record, "confirm", confirm)
            await trio.testing.wait_all_tasks_blocked()
        gate.set()
        with trio.fail_after(10):  # a hang guard: the confirm waited 60 s before
            while len(results) < 2:
                await trio.sleep(0.005)
    error = results["start"]
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.UNKNOWN_OUTCOME
    assert results["confirm"] is None
    assert backend._launching == {}
    assert backend.session_status(inv(1, owner="o")) == "confirmed"
    assert _sleepers({mark}) == []


async def test_before_run_sees_the_verified_group_and_its_refusal_runs_nothing(
    command: LocalCommand, tmp_path: Path
) -> None:
    """``before_run`` gets the group's evidence before the command runs;
    when it raises (a record that could not be made durable), the command
    never ran and the launcher is gone."""
    seen: list[dict[str, Any]] = []

    async def refuse(evidence: dict[str, Any]) -> None:
        seen.append(evidence)
        assert group_members(evidence["pgid"]) != []  # the launcher, waiting for our ACK
        raise Error(ErrorClass.STORAGE_FAILED, "store is down")

    marker = tmp_path / "ran"
    with pytest.raises(Error) as exc:
        await command.start(inv(1), f"touch {marker}", workspace=tmp_path, before_run=refuse)
    assert exc.value.error_class is ErrorClass.STORAGE_FAILED
    [evidence] = seen
    assert evidence["kind"] == "process_group"
    assert evidence["session_id"] == 1
    assert not marker.exists()
    assert group_members(evidence["pgid"]) == []
