"""``clean_group`` against reads of ``/proc`` that race a process leaving
its group."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import trio

from tests.conftest import LINUX_ONLY
from trio_backplane.resources import _jobs
from trio_backplane.resources._proc import ProcStat, read_stat, same_process

pytestmark = LINUX_ONLY


async def test_a_member_leaving_between_the_reads_is_not_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group's last member moves to a session of its own right after
    the first read of ``/proc``, whichever read that is: the group is read
    first, so the scan after it finds the process, which is stopped before
    the cleanup confirms."""
    mover = await trio.lowlevel.open_process(["sleep", "47401"], start_new_session=True)
    stat = read_stat(mover.pid)
    assert stat is not None
    moved = [False]

    def group_alive(pgid: int, start_time: int) -> bool:
        alive = not moved[0]
        moved[0] = True  # it leaves the group now
        return alive

    def escapees(pgid: int, start_time: int) -> list[ProcStat]:
        out = moved[0]
        moved[0] = True
        return [stat] if out and same_process(stat) else []

    monkeypatch.setattr(_jobs, "group_alive", group_alive)
    monkeypatch.setattr(_jobs, "escapees", escapees)
    sent: list[Any] = []
    try:
        with trio.fail_after(5):
            error = await _jobs.clean_group(999_999, 1, lambda *args: sent.append(args))
            assert error is None
            assert await mover.wait() == -signal.SIGTERM
    finally:
        mover.kill()
        await mover.wait()
    assert sent == []  # gone by the time it would be signalled: its id may be another's


async def test_an_empty_scan_is_confirmed_by_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """A marked process that forks and exits while a scan runs hides its
    child from that scan: nothing left is believed only when a second scan
    agrees, and the child it finds is stopped."""
    child = await trio.lowlevel.open_process(["sleep", "47402"], start_new_session=True)
    stat = read_stat(child.pid)
    assert stat is not None
    scans = [0]

    def escapees(pgid: int, start_time: int) -> list[ProcStat]:
        scans[0] += 1
        return [stat] if scans[0] > 1 and same_process(stat) else []

    monkeypatch.setattr(_jobs, "group_alive", lambda pgid, start_time: False)
    monkeypatch.setattr(_jobs, "escapees", escapees)
    try:
        with trio.fail_after(5):
            assert await _jobs.clean_group(999_999, 1, lambda *args: None) is None
            assert await child.wait() == -signal.SIGTERM
    finally:
        child.kill()
        await child.wait()


async def test_polling_reads_proc_off_the_trio_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting for a group to go scans ``/proc`` (every process) at each
    poll: never on the Trio thread, where it would stall every other task."""
    import threading

    group = await trio.lowlevel.open_process(["sleep", "47402"], start_new_session=True)
    stat = read_stat(group.pid)
    assert stat is not None
    readers: list[bool] = []
    real = _jobs.group_alive

    def group_alive(pgid: int, start_time: int) -> bool:
        readers.append(threading.current_thread() is threading.main_thread())
        return real(pgid, start_time)

    monkeypatch.setattr(_jobs, "group_alive", group_alive)
    outcome = await _jobs.clean_group(stat.pgrp, stat.start_time, _jobs.default_signaler)
    await group.wait()
    assert outcome is None
    # one round (sleep stops at SIGTERM): the look before and after it and
    # the polls between run in threads; only the check just before the
    # signal stays next to it, on the Trio thread
    assert len(readers) >= 3, readers
    assert readers.count(True) == 1, readers
