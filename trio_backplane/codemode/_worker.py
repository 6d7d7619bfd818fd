"""One Deno worker: permissionless, in its own verified process group,
spoken to in JSON lines; stopped and confirmed gone when it closes."""

from __future__ import annotations

import importlib
import json
import math
import os
import shlex
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Final, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..resources._jobs import clean_group, default_signaler
from ..resources._launch import CommandLimits, Launched, environment, launch

__all__ = ["CellResult", "CodeWorker", "ToolCall", "deno_binary"]

#: What answers ``tools.<name>(args)`` in a cell: the tool's JSON result.
ToolCall = Callable[[str, Any], Awaitable[Any]]

#: The V8 heap a worker may use, in MiB.
HEAP_MIB: Final = 128
#: The longest reply line read from a worker (a cell's value and output).
REPLY_LIMIT: Final = 4 << 20


def deno_binary() -> str:
    """The Deno executable of the ``deno`` package (the ``codemode`` extra)."""
    try:
        # an optional, untyped package: imported by name, typed as Any
        deno: Any = importlib.import_module("deno")
    except ImportError:
        raise Error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "Code Mode needs the codemode extra (pip install 'trio_backplane[codemode]')",
        ) from None
    return str(deno.find_deno_bin())


def _command(binary: str, script: str, heap_mib: int) -> str:
    # No --allow-* flag at all: every file, network, environment, process and
    # FFI access is refused by Deno itself, and nothing remote is imported.
    argv = [
        binary,
        "run",
        "--no-prompt",
        "--no-config",
        "--no-remote",
        "--no-npm",
        "--no-lock",
        f"--v8-flags=--max-old-space-size={heap_mib}",
        script,
    ]
    return "exec " + " ".join(shlex.quote(part) for part in argv)


@final
@attrs.frozen(kw_only=True)
class CellResult:
    """What one cell came to: its JSON ``value``, or ``error`` and
    ``message`` when it threw; ``output`` holds what it logged."""

    ok: bool
    value: Any = None
    error: str | None = None
    message: str | None = None
    output: tuple[str, ...] = ()
    truncated: bool = False


@final
class CodeWorker:
    """A Deno worker; ``async with CodeWorker() as worker`` starts it and
    leaving stops its whole process group (confirmed from ``/proc``)."""

    def __init__(self, *, heap_mib: int = HEAP_MIB, startup_timeout: float = 10.0) -> None:
        if type(heap_mib) is not int or not 16 <= heap_mib <= 4096:
            raise Error(ErrorClass.VALIDATION, "heap_mib must be an int in 16..4096")
        self._heap_mib = heap_mib
        self._startup_timeout = startup_timeout
        self._launched: Launched | None = None
        self._ids = 0
        self.cleanup_error: str | None = None

    @property
    def pgid(self) -> int | None:
        return None if self._launched is None else self._launched.pgid

    async def __aenter__(self) -> CodeWorker:
        script = resources.files("trio_backplane.codemode").joinpath("_worker.js")
        with resources.as_file(script) as path:
            command = _command(deno_binary(), str(path), self._heap_mib)
            self._launched = await launch(
                command,
                workspace=os.path.dirname(str(path)),
                env={**environment(("PATH", "HOME", "LANG")), "NO_COLOR": "1"},
                limits=CommandLimits(),
                startup_timeout=self._startup_timeout,
            )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the worker's process group; ``cleanup_error`` says why it
        could not be confirmed gone (``None``: gone)."""
        launched, self._launched = self._launched, None
        if launched is None:
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(2.0) as scope:
                self.cleanup_error = await clean_group(
                    launched.pgid, launched.start_time, default_signaler
                )
            if scope.cancelled_caught:
                self.cleanup_error = "the worker did not stop within 2 s"
            with trio.move_on_after(1.0):
                await launched.process.wait()

    async def run(
        self, code: str, *, timeout: float = math.inf, call: ToolCall | None = None
    ) -> CellResult:
        """Run ``code`` as an async function body; its return value (JSON)
        and output.  ``tools.<name>(args)`` inside awaits ``call(name,
        args)``, one at a time (an ``Error`` it raises rejects the cell's
        promise with its class and message).  A cell past ``timeout``
        seconds, or one that ends the worker, raises a classed ``Error`` and
        the worker is stopped."""
        launched = self._launched
        if launched is None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "the Code Mode worker is not running")
        if type(code) is not str:
            raise Error(ErrorClass.VALIDATION, "code must be a str")
        self._ids += 1
        reply: CellResult | None = None
        with trio.move_on_after(timeout) as scope:
            reply = await self._exchange(launched, {"id": self._ids, "code": code}, call)
        if scope.cancelled_caught:
            await self.aclose()
            raise Error(
                ErrorClass.TIMEOUT,
                "the cell did not finish in time; its worker was stopped",
                {"timeout": timeout},
            )
        if reply is None:
            # it ended (out of memory, say) or broke the protocol: unusable
            await self.aclose()
            raise Error(
                ErrorClass.EXECUTION_FAILURE,
                "the Code Mode worker ended during the cell (out of memory?)",
            )
        return reply

    async def _exchange(
        self, launched: Launched, request: dict[str, Any], call: ToolCall | None
    ) -> CellResult | None:
        """Send the cell, answer its tool calls, return its reply (``None``:
        the worker ended or answered something else)."""
        try:
            await _send(launched, request)
            while (line := await launched.reader.line(REPLY_LIMIT)) is not None:
                message = _message(line)
                if message is None:
                    return None
                if "call" not in message:
                    return _reply(message)
                await _send(launched, await _answer(message, call))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        return None


async def _send(launched: Launched, message: dict[str, Any]) -> None:
    assert launched.process.stdin is not None
    await launched.process.stdin.send_all((json.dumps(message) + "\n").encode())


async def _answer(message: dict[str, Any], call: ToolCall | None) -> dict[str, Any]:
    """The host's reply to one ``tools.<name>(args)`` call."""
    reply: dict[str, Any] = {"reply": message["call"]}
    if call is None:
        return {**reply, "ok": False, "error": "unsupported_capability", "message": "no tools"}
    try:
        value = await call(str(message.get("tool")), message.get("args"))
    except Error as error:
        return {**reply, "ok": False, "error": error.error_class.value, "message": error.message}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        why = "the tool's result is not JSON data"
        return {**reply, "ok": False, "error": "malformed_result", "message": why}
    return {**reply, "ok": True, "value": value}


def _message(line: bytes) -> dict[str, Any] | None:
    """One message of the worker; ``None`` for a line that is not one."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


def _reply(reply: dict[str, Any]) -> CellResult:
    return CellResult(
        ok=bool(reply.get("ok")),
        value=reply.get("value"),
        error=reply.get("error"),
        message=reply.get("message"),
        output=tuple(reply.get("output") or ()),
        truncated=bool(reply.get("truncated")),
    )
