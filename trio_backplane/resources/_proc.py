"""What Linux's ``/proc`` says about processes and process groups.

Synchronous and cheap (one directory scan); no signal is sent here.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Final, NamedTuple

__all__ = [
    "GROUP_VAR",
    "ProcStat",
    "group_alive",
    "group_mark",
    "group_members",
    "marked",
    "read_stat",
    "same_process",
    "supported",
]

PROC = "/proc"

#: The environment variable every launched command carries: its group's
#: :func:`group_mark`.  Descendants inherit it whatever session or group they
#: move to, so cleanup finds those that left the group (as Jenkins's process
#: tree killer finds a build's daemons by its cookie).  Not found: a process
#: whose environment this user cannot read (one that made itself
#: non-dumpable, as ``ssh-agent`` does, or ran a setuid program), and one
#: that cleared or rewrote its environment (``env -i``, ``sudo``).
GROUP_VAR: Final = "TRIO_BACKPLANE_GROUP"


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` this package reads."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    #: clock ticks after boot: with the pid, names one process for good
    start_time: int


def supported() -> bool:
    """Whether process groups can be launched and verified here: Linux with
    ``/proc/self``, ``sh`` and ``kill``."""
    return (
        sys.platform.startswith("linux")
        and os.path.exists(f"{PROC}/self/stat")
        and shutil.which("sh") is not None
        and hasattr(os, "killpg")
    )


def read_stat(pid: int) -> ProcStat | None:
    """``pid``'s stat, or ``None`` when there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as file:
            raw = file.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may hold anything: split after it
    fields = raw[raw.rindex(b")") + 2 :].split()
    return ProcStat(
        pid=pid,
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        session=int(fields[3]),
        start_time=int(fields[19]),
    )


def group_mark(pgid: int, leader_start: int) -> str:
    """What names a launched group for good: its id and its leader's start time."""
    return f"{pgid}.{leader_start}"


def marked(mark: str) -> list[ProcStat]:
    """The live processes whose environment holds ``GROUP_VAR=mark``, of
    those whose environment this user can read (see :data:`GROUP_VAR`)."""
    wanted = f"{GROUP_VAR}={mark}".encode()
    found = []
    for name in os.listdir(PROC):
        if name.isdigit() and _holds(name, wanted):
            # Its stat, then the mark again, then the same start time: the
            # process recorded is the one that holds the mark, never one
            # that took a dead one's id between two reads.
            stat = read_stat(int(name))
            if stat is not None and _holds(name, wanted) and same_process(stat):
                found.append(stat)
    return found


def _holds(pid: str, wanted: bytes) -> bool:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as file:
            environ = file.read()
    except OSError:  # gone, or not ours to read
        return False
    return wanted in environ.split(b"\0")


def same_process(stat: ProcStat) -> bool:
    """Whether the process ``stat`` was read from still lives (its id not
    reused: the same start time), not a zombie."""
    now = read_stat(stat.pid)
    return now is not None and now.start_time == stat.start_time and now.state not in ("Z", "X")


def _all() -> Iterator[ProcStat]:
    for name in os.listdir(PROC):
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                yield stat


def group_members(pgid: int) -> list[ProcStat]:
    """The live (not zombie) processes of process group ``pgid``."""
    return [s for s in _all() if s.pgrp == pgid and s.state not in ("Z", "X")]


def group_alive(pgid: int, leader_start: int) -> bool:
    """Whether the group ``pgid`` whose leader started at ``leader_start``
    still has a live process.  A group id reused by a newer leader (another
    start time) means the recorded group is gone: the kernel reuses an id
    only once no process holds it as its group."""
    try:
        os.killpg(pgid, 0)  # no signal: asks whether any process holds the group
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's group: the id was reused, the scan below says so
    leader = read_stat(pgid)
    if leader is not None and leader.start_time != leader_start:
        return False
    return bool(group_members(pgid))
