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

__all__ = [
    "Answer",
    "CellResult",
    "CodeWorker",
    "ToolCall",
    "answer_tools",
    "check_heap",
    "deno_binary",
]

#: What answers ``tools.<name>(args)`` in a cell: the tool's JSON result.
ToolCall = Callable[[str, Any], Awaitable[Any]]
#: What answers one request of a cell (a tool call, ``store``, ``load``):
#: the reply sent back to it.
Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

#: The V8 heap a worker may use, in MiB.
HEAP_MIB: Final = 128
#: The longest line read from a worker (a cell's value, a request).
REPLY_LIMIT: Final = 4 << 20
#: The output one cell may produce, in characters; the rest is dropped.
OUTPUT_LIMIT: Final = 65536


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


def check_heap(heap_mib: object) -> None:
    """``validation`` unless ``heap_mib`` is an int of MiB in 16..4096."""
    if type(heap_mib) is not int or not 16 <= heap_mib <= 4096:
        raise Error(ErrorClass.VALIDATION, "heap_mib must be an int in 16..4096")


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
    """A Deno worker running one cell at a time; ``async with CodeWorker()
    as worker`` starts it and leaving stops its whole process group
    (confirmed from ``/proc``).  Not for concurrent use."""

    def __init__(self, *, heap_mib: int = HEAP_MIB, startup_timeout: float = 10.0) -> None:
        check_heap(heap_mib)
        self._heap_mib = heap_mib
        self._startup_timeout = startup_timeout
        self._launched: Launched | None = None
        self._ids = 0
        #: the running cell's output so far, and whether some was dropped
        self.output: list[str] = []
        self.truncated = False
        self._used = 0
        self.cleanup_error: str | None = None

    @property
    def pgid(self) -> int | None:
        return None if self._launched is None else self._launched.pgid

    async def start(self, *, admit: Callable[[int, int], Awaitable[None]] | None = None) -> None:
        """Launch the worker; ``admit(pgid, start_time)`` is awaited with its
        verified group before any of its code runs (raise to refuse)."""
        script = resources.files("trio_backplane.codemode").joinpath("_worker.js")
        with resources.as_file(script) as path:
            command = _command(deno_binary(), str(path), self._heap_mib)
            self._launched = await launch(
                command,
                workspace=os.path.dirname(str(path)),
                env={**environment(("PATH", "HOME", "LANG")), "NO_COLOR": "1"},
                limits=CommandLimits(),
                startup_timeout=self._startup_timeout,
                admit=admit,
            )

    async def __aenter__(self) -> CodeWorker:
        await self.start()
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

    def _running(self) -> Launched:
        if self._launched is None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "the Code Mode worker is not running")
        return self._launched

    async def begin(self, code: str) -> None:
        """Start ``code`` (an async function body) as the worker's cell."""
        launched = self._running()
        if type(code) is not str:
            raise Error(ErrorClass.VALIDATION, "code must be a str")
        self._ids += 1
        self.output, self.truncated, self._used = [], False, 0
        try:
            await _send(launched, {"id": self._ids, "code": code})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self._ended()

    async def drive(
        self, answer: Answer, *, until: Callable[[], float] = lambda: math.inf
    ) -> CellResult | None:
        """Answer the cell's requests until it ends (its result), or until
        Trio time ``until()`` passes while it computes (``None``: still
        running; call again to go on).  A request is answered whole: the
        yield never cuts a tool call.  A worker that ends or stops
        speaking is stopped, and ``execution_failure`` raised."""
        launched = self._running()
        while True:
            line = None
            with trio.move_on_at(until()):
                line = await _next_line(launched)
                if line is None:
                    await self._ended()
            if line is None:
                return None
            message = _message(line)
            if message is None:
                self._log(line.decode("utf-8", "replace"))  # written around the protocol
            elif "call" in message:
                if not await _reply(launched, await answer(message)):
                    await self._ended()
            elif "id" in message:
                return self._result(message)
            else:
                self._log(str(message.get("log", "")))

    async def run(
        self,
        code: str,
        *,
        timeout: float = math.inf,
        call: ToolCall | None = None,
        answer: Answer | None = None,
    ) -> CellResult:
        """Run ``code`` to its end; ``tools.<name>(args)`` inside awaits
        ``call(name, args)`` (or ``answer`` handles every request).  A cell
        past ``timeout`` seconds raises ``timeout`` and stops the worker."""
        await self.begin(code)
        handler = answer if answer is not None else answer_tools(call)
        deadline = trio.current_time() + timeout
        result = await self.drive(handler, until=lambda: deadline)
        if result is None:
            await self.aclose()
            raise Error(
                ErrorClass.TIMEOUT,
                "the cell did not finish in time; its worker was stopped",
                {"timeout": timeout},
            )
        return result

    def _log(self, line: str) -> None:
        if self.truncated:
            return
        if self._used + len(line) > OUTPUT_LIMIT:
            self.truncated = True
            return
        self._used += len(line)
        self.output.append(line)

    def _result(self, reply: dict[str, Any]) -> CellResult:
        ok = reply.get("ok") is True
        return CellResult(
            ok=ok,
            value=reply.get("value") if ok else None,
            error=None if ok else str(reply.get("error"))[:100],
            message=None if ok else str(reply.get("message"))[:2000],
            output=tuple(self.output),
            truncated=self.truncated,
        )

    async def _ended(self) -> None:
        """The worker ended (out of memory, say) or broke the protocol."""
        last = self.output[-3:]
        await self.aclose()
        raise Error(
            ErrorClass.EXECUTION_FAILURE,
            "the Code Mode worker ended during the cell (out of memory?)",
            {"output": [line[:300] for line in last]},
        )


async def _next_line(launched: Launched) -> bytes | None:
    try:
        return await launched.reader.line(REPLY_LIMIT)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return None


async def _send(launched: Launched, message: dict[str, Any]) -> None:
    assert launched.process.stdin is not None
    await launched.process.stdin.send_all((json.dumps(message) + "\n").encode())


async def _reply(launched: Launched, reply: dict[str, Any]) -> bool:
    """Send ``reply``; ``False`` when the worker is gone."""
    try:
        await _send(launched, reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


def answer_tools(call: ToolCall | None) -> Answer:
    """Answer tool calls with ``call``; ``store``/``load`` are refused."""

    async def answer(message: dict[str, Any]) -> dict[str, Any]:
        if "state" in message or call is None:
            return refusal(message, Error(ErrorClass.UNSUPPORTED_CAPABILITY, "not available here"))
        try:
            value = await call(str(message.get("tool")), message.get("args"))
        except Error as error:
            return refusal(message, error)
        return fulfilment(message, value)

    return answer


def refusal(message: dict[str, Any], error: Error) -> dict[str, Any]:
    """The reply that rejects a request's promise with ``error``'s class."""
    reply = message.get("call")
    return {"reply": reply, "ok": False, "error": error.error_class.value, "message": error.message}


def fulfilment(message: dict[str, Any], value: Any) -> dict[str, Any]:
    """The reply that resolves a request's promise with ``value`` (JSON)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        error = Error(ErrorClass.MALFORMED_RESULT, "the tool's result is not JSON data")
        return refusal(message, error)
    return {"reply": message.get("call"), "ok": True, "value": value}


def _message(line: bytes) -> dict[str, Any] | None:
    """One protocol message of the worker; ``None`` for a line that is not one."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or not ({"call", "id", "log"} & message.keys()):
        return None
    return message
