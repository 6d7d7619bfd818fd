"""Process groups a crashed host left behind: recorded, then found and stopped."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from typing import Any

from ._jobs import Signaler, clean_group, default_signaler, left_behind

__all__ = ["boot_id", "group_evidence", "kill_orphans"]


def boot_id() -> str | None:
    """This boot's id (a process start time means nothing across boots)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return None


def group_evidence(pgid: int, start_time: int, **names: int | str) -> dict[str, Any]:
    """What names a launched process group for good: its id, its leader's
    start time, this host and this boot, and ``names`` (``session_id=``, a
    command session; ``cell_id=``, a Code Mode cell)."""
    return {
        "kind": "process_group",
        "pgid": pgid,
        "start_time": start_time,
        **names,
        "host": socket.gethostname(),
        "boot_id": boot_id(),
    }


def _verdict_elsewhere(item: Mapping[str, Any]) -> str | None:
    if item.get("host") != socket.gethostname():
        return "another host"
    if item.get("boot_id") != boot_id():
        return "an earlier boot: gone"
    return None


async def kill_orphans(
    resources: Iterable[Mapping[str, Any]], *, signaler: Signaler = default_signaler
) -> list[dict[str, Any]]:
    """Stop every recorded process group of this host and boot that is still
    alive (its leader's start time checked: a reused id is left alone), and
    the processes that left it carrying its mark.
    One report per process group: ``status`` is ``"killed"``, ``"gone"``
    (nothing left), ``"skipped"`` (another host or boot, ``reason`` says)
    or ``"alive"`` (it survived SIGKILL, ``reason`` says why)."""
    reports: list[dict[str, Any]] = []
    for item in resources:
        if item.get("kind") != "process_group":
            continue
        pgid, start = item.get("pgid"), item.get("start_time")
        report = {"pgid": pgid, "session_id": item.get("session_id")}
        if "cell_id" in item:
            report["cell_id"] = item["cell_id"]
        elsewhere = _verdict_elsewhere(item)
        if elsewhere is not None:
            reports.append({**report, "status": "skipped", "reason": elsewhere})
        elif type(pgid) is not int or type(start) is not int or pgid < 2:
            reports.append({**report, "status": "skipped", "reason": "malformed evidence"})
        elif not any(await left_behind(pgid, start)):
            reports.append({**report, "status": "gone"})
        else:
            error = await clean_group(pgid, start, signaler)
            status = {"status": "killed"} if error is None else {"status": "alive", "reason": error}
            reports.append({**report, **status})
    return reports
