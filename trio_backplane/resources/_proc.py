"""What Linux's ``/proc`` says about processes and process groups.

Synchronous and cheap (one directory scan); no signal is sent here.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import NamedTuple

__all__ = ["ProcStat", "group_alive", "group_members", "read_stat", "supported"]

PROC = "/proc"


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
