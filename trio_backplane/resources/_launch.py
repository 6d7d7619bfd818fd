"""Launching one command in its own session and process group, verified
before it runs: the launcher prints a handshake, waits for our ACK, and
only then replaces itself with the command."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Final, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ._proc import ProcStat, group_mark, read_stat

__all__ = ["DEFAULT_ENV", "CommandLimits", "Launched", "LineReader", "launch"]

#: Host variables a command sees by default (only those set).
DEFAULT_ENV: Final = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TERM")

# $1 nonce, $2 command, $3.. `ulimit` options.  The ACK is read before the
# command exists, so a refused launch has run nothing; it ends with the
# leader's start time, which the group's mark (GROUP_VAR) needs.
_LAUNCHER: Final = """
printf 'BACKPLANE_LOCAL_COMMAND %s %s\\n' "$1" "$$"
IFS= read -r ack || exit 125
start=${ack##* }
[ "$ack" = "ACK $1 $$ $start" ] || exit 125
case $start in ''|*[!0-9]*) exit 125;; esac
TRIO_BACKPLANE_GROUP="$$.$start"
export TRIO_BACKPLANE_GROUP
cmd=$2
shift 2
while [ $# -gt 0 ]; do ulimit "$1" "$2" || exit 126; shift 2; done
exec /bin/sh -c "$cmd"
"""


@final
@attrs.frozen(kw_only=True)
class CommandLimits:
    """Per-command resource limits (``setrlimit`` through the shell's
    ``ulimit``); ``None`` leaves the host's."""

    cpu_seconds: int | None = None
    address_space_bytes: int | None = None
    open_files: int | None = None
    processes: int | None = None

    def ulimit_args(self) -> list[str]:
        """The launcher's ``ulimit`` arguments; ``validation`` for a limit
        that is not a positive ``int``."""
        given = {
            "-t": self.cpu_seconds,
            "-v": self.address_space_bytes,
            "-n": self.open_files,
            "-u": self.processes,
        }
        args: list[str] = []
        for flag, value in given.items():
            if value is None:
                continue
            if type(value) is not int or value < 1:
                raise Error(
                    ErrorClass.VALIDATION,
                    "a command limit must be a positive int",
                    {"limit": flag, "value": repr(value)[:100]},
                )
            args += [flag, str(value // 1024 if flag == "-v" else value)]
        return args


def environment(allowed: Collection[str]) -> dict[str, str]:
    """The host's values of the ``allowed`` names, nothing else."""
    return {name: os.environ[name] for name in allowed if name in os.environ}


@final
class LineReader:
    """Lines of a byte stream, in order; the last one may lack its newline."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buffer = bytearray()
        self.eof = False

    async def line(self, limit: int = 65536) -> bytes | None:
        """The next line (without its newline), ``None`` at the end."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0 or len(self._buffer) >= limit:
                cut = end if end >= 0 else limit
                line = bytes(self._buffer[:cut])
                del self._buffer[: cut + (1 if end >= 0 else 0)]
                return line
            if self.eof:
                if not self._buffer:
                    return None
                line = bytes(self._buffer)
                self._buffer.clear()
                return line
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                self.eof = True
            self._buffer += chunk


@final
@attrs.frozen(kw_only=True)
class Launched:
    """A verified launch: the process, its group and its leader's start time."""

    process: trio.Process
    reader: LineReader
    pgid: int
    start_time: int

    @property
    def mark(self) -> str:
        """The group's mark, in the environment of every process it starts."""
        return group_mark(self.pgid, self.start_time)


def _failure(message: str, **details: object) -> Error:
    return Error(ErrorClass.EXECUTION_FAILURE, message, details)


async def launch(
    command: str,
    *,
    workspace: str,
    env: Mapping[str, str],
    limits: CommandLimits,
    startup_timeout: float,
    admit: Callable[[int, int], Awaitable[None]] | None = None,
) -> Launched:
    """Start ``command`` under the launcher, verify its group from ``/proc``,
    await ``admit(pgid, start_time)`` (which raises to refuse) and only then
    let it run; any
    failure kills what was started and raises."""
    nonce = secrets.token_hex(8)
    process = await trio.lowlevel.open_process(
        ["/bin/sh", "-c", _LAUNCHER, "backplane-launcher", nonce, command, *limits.ulimit_args()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=workspace,
        env=dict(env),
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stdin is not None
    reader = LineReader(process.stdout)
    try:
        stat = await _handshake(process, reader, nonce, startup_timeout)
        if admit is not None:
            await admit(process.pid, stat.start_time)
        ack = f"ACK {nonce} {process.pid} {stat.start_time}\n"
        await process.stdin.send_all(ack.encode())
    except BaseException:
        _kill_group(process.pid)
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await process.wait()
        raise
    return Launched(process=process, reader=reader, pgid=process.pid, start_time=stat.start_time)


async def _handshake(
    process: trio.Process, reader: LineReader, nonce: str, timeout: float
) -> ProcStat:
    with trio.move_on_after(timeout):
        line = await reader.line(256)
        if line is None:
            code = await process.wait()
            raise _failure("local command launcher exited before handshake", exit_status=code)
        parts = line.decode("utf-8", "replace").split()
        if parts != ["BACKPLANE_LOCAL_COMMAND", nonce, str(process.pid)]:
            seen = line[:200].decode("utf-8", "replace")
            raise _failure("local command launcher handshake failed", line=seen)
        stat = read_stat(process.pid)
        if stat is None or (stat.ppid, stat.pgrp, stat.session) != (
            os.getpid(),
            process.pid,
            process.pid,
        ):
            raise _failure("local command launcher handshake failed", reason="group not verified")
        return stat
    raise Error(
        ErrorClass.TIMEOUT, "local command launcher handshake timed out", {"timeout": timeout}
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, 9)
