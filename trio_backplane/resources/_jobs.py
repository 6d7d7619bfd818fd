"""A launched command's record and the cleanup of its process group."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Final, Literal, final

import attrs
import trio

from ._launch import Launched
from ._ledger import Obligation
from ._proc import ProcStat, group_alive, group_mark, marked, same_process

__all__ = ["CommandOutput", "Job", "Signaler", "clean_group", "escapees", "left_behind"]

#: Sends a signal to a process group: ``os.killpg`` unless a test swaps it.
Signaler = Callable[[int, int], None]

Status = Literal[
    "running",
    "completed",
    "failed",
    "cancelled",
    "deadline_exceeded",
    "output_limit_exceeded",
    "execution_failure",
    "cleanup_failed",
]
#: terminations that override an exit seen first
_OVERRIDING: Final = ("deadline_exceeded", "output_limit_exceeded")
#: what a line costs against the output limit, besides its bytes
LINE_COST: Final = 8
_TERM_WAIT: Final = 0.15
_KILL_WAIT: Final = 0.3
_POLL: Final = 0.01


@final
@attrs.frozen(kw_only=True)
class CommandOutput:
    """What :meth:`LocalCommand.read` returns: lines from a cursor, and the
    command's state.  ``cursor`` is the number of lines so far."""

    session_id: int
    output: tuple[str, ...]
    cursor: int
    status: Status
    exit_status: int | None
    termination_status: str
    cleanup_status: str
    cleanup_error: str | None
    output_limit_exceeded: bool


@attrs.define(kw_only=True)
class Job:
    """One command, from its launch to its confirmed (or kept) cleanup."""

    obligation: Obligation
    launched: Launched
    workspace: str
    deadline: float
    output_limit: int
    lines: list[str] = attrs.Factory(list)
    used: int = 0
    status: Status = "running"
    exit_status: int | None = None
    #: what ended it, if we did: "not_requested" until then
    termination: str = "not_requested"
    cleanup_status: str = "not_started"
    cleanup_error: str | None = None
    finished_at: float | None = None
    exited: trio.Event = attrs.Factory(trio.Event)
    #: set once the output has reached its end (no writer left)
    drained: trio.Event = attrs.Factory(trio.Event)
    #: set once cleanup has an outcome (a retry makes a new one)
    settled: trio.Event = attrs.Factory(trio.Event)
    #: the wait for the command's exit: cancelled to end it early; its
    #: deadline is the command's (moved by a human wait)
    waiting: trio.CancelScope = attrs.Factory(trio.CancelScope)
    #: when a human wait of its owner began (``None``: not suspended)
    suspended_at: float | None = None
    cleaning: bool = False

    @property
    def session_id(self) -> int:
        return self.obligation.session_id

    def end(self, status: Status) -> None:
        """Record a terminal status by precedence: ``cancelled`` always wins;
        the deadline and the output limit override an exit; else the first."""
        if (
            status == "cancelled"
            or self.status == "running"
            or (status in _OVERRIDING and self.status not in ("cancelled", *_OVERRIDING))
        ):
            self.status = status
        if status in ("cancelled", *_OVERRIDING) and self.termination == "not_requested":
            self.termination = status

    def output(self, cursor: int) -> CommandOutput:
        return CommandOutput(
            session_id=self.session_id,
            output=tuple(self.lines[max(cursor, 0) :]),
            cursor=len(self.lines),
            status=self.status,
            exit_status=self.exit_status,
            termination_status=self.termination,
            cleanup_status=self.cleanup_status,
            cleanup_error=self.cleanup_error,
            output_limit_exceeded=self.termination == "output_limit_exceeded",
        )


def _any_alive(pgid: int, start_time: int, escaped: list[ProcStat]) -> bool:
    return group_alive(pgid, start_time) or any(map(same_process, escaped))


async def _gone_within(pgid: int, start_time: int, escaped: list[ProcStat], seconds: float) -> None:
    """Poll until the group and ``escaped`` are gone, for at most ``seconds``;
    each look (a scan of ``/proc`` while the group lives) runs in a thread."""
    with trio.move_on_after(seconds):
        while await trio.to_thread.run_sync(
            _any_alive, pgid, start_time, escaped, abandon_on_cancel=True
        ):
            await trio.sleep(_POLL)


def escapees(pgid: int, start_time: int) -> list[ProcStat]:
    """The live processes that carry group ``pgid``'s mark outside it: its
    descendants that started a session or group of their own."""
    return [s for s in marked(group_mark(pgid, start_time)) if s.pgrp != pgid]


async def left_behind(pgid: int, start_time: int) -> tuple[bool, list[ProcStat]]:
    """Whether the group lives, then what left it: in that order, so a
    member leaving the group between the two reads is seen by the second.
    Nothing left only when a second look, begun after the first ended,
    agrees: a marked process that forks and exits while a scan runs hides
    its child from that scan, not from the next.  The reads of ``/proc``
    run in a thread (they read every process), abandoned on cancellation."""
    for _ in range(2):
        alive = await trio.to_thread.run_sync(group_alive, pgid, start_time, abandon_on_cancel=True)
        escaped = await trio.to_thread.run_sync(escapees, pgid, start_time, abandon_on_cancel=True)
        if alive or escaped:
            break
    return alive, escaped


async def clean_group(pgid: int, start_time: int, signaler: Signaler) -> str | None:
    """Stop process group ``pgid`` and every process that left it carrying
    its mark: TERM, a short wait, KILL, then their absence verified from
    ``/proc``.  ``None`` once all are gone, else why not."""
    alive, escaped = await left_behind(pgid, start_time)
    if not alive and not escaped:
        return None
    for sig, wait in ((signal.SIGTERM, _TERM_WAIT), (signal.SIGKILL, _KILL_WAIT)):
        # (a group id no longer ours may be another's by now: never signalled)
        if group_alive(pgid, start_time):
            try:
                signaler(pgid, sig)
            except ProcessLookupError:
                pass
            except OSError as exc:
                return f"could not signal the group: {exc}"[:300]
        for stat in escaped:
            signal_process(stat, sig)
        await _gone_within(pgid, start_time, escaped, wait)
        alive, escaped = await left_behind(pgid, start_time)  # (with any started meanwhile)
        if not alive and not escaped:
            return None
    if alive:
        return f"process group {pgid} is still alive after SIGKILL"
    return f"{len(escaped)} processes that left process group {pgid} are alive after SIGKILL"


def signal_process(stat: ProcStat, sig: int) -> None:
    """Send ``sig`` to the process ``stat`` names, never to one that reused
    its id: through a pidfd (Linux 5.3+), checked against its start time."""
    try:
        fd: int | None = os.pidfd_open(stat.pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd here: the id is checked just before the signal
        fd = None
    try:
        if not same_process(stat):
            return
        if fd is None:
            os.kill(stat.pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
    except (ProcessLookupError, PermissionError):
        pass  # gone meanwhile; another user's: the verification says so
    finally:
        if fd is not None:
            os.close(fd)


def default_signaler(pgid: int, sig: int) -> None:
    os.killpg(pgid, sig)
