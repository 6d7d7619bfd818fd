"""One cleanup callback, run once and judged: what a registry entry's
release comes to (pure apart from awaiting the callback)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, final

import attrs
import trio

__all__ = ["CONFIRMING", "Cleanup", "CleanupResult", "call_bounded", "run_cleanup"]

#: A cleanup callback: called with no argument; may be a coroutine function.
Cleanup = Callable[[], Awaitable[object] | object]

#: The only answers of a callback that confirm a release.
CONFIRMING: Final = frozenset({"confirmed", "released", "done"})

Status = Literal["confirmed", "not_requested", "failed", "uncertain", "pending", "active"]


@final
@attrs.frozen(kw_only=True)
class CleanupResult:
    """The cleanup of one registry entry.

    ``status``: ``"not_requested"`` (no callback) and ``"confirmed"`` are
    confirmed; ``"failed"`` (the callback raised) and ``"uncertain"`` (any
    other answer, or the cleanup timeout) are not, and the entry is kept as
    evidence; ``"pending"`` (cleanup in progress) and ``"active"`` (never
    released) describe a live entry.  ``reason`` says why when not confirmed.
    """

    id: str | int
    kind: str
    owner: str
    incarnation: int
    status: Status
    reason: str | None = None

    @property
    def confirmed(self) -> bool:
        """Whether the entry is known to be released."""
        return self.status in ("confirmed", "not_requested")


async def call_bounded(callback: Callable[[], Any], timeout: float) -> tuple[str, Any]:
    """Call ``callback`` (plain or coroutine function) once within
    ``timeout`` seconds: ``("answered", value)``, ``("raised", "Type:
    message")`` or ``("timeout", None)``."""
    answer: Any = None
    with trio.move_on_after(timeout) as scope:
        try:
            answer = callback()
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:  # the callback's failure is evidence, not ours
            return "raised", f"{type(exc).__name__}: {exc}"[:300]
    if scope.cancelled_caught:
        return "timeout", None
    return "answered", answer


async def run_cleanup(cleanup: Cleanup | None, timeout: float) -> tuple[Status, str | None]:
    """Run ``cleanup`` once within ``timeout`` seconds and judge it: only
    ``"confirmed"``, ``"released"`` or ``"done"`` confirm; raising fails;
    any other answer (``None`` included) or the timeout is uncertain."""
    if cleanup is None:
        return "not_requested", None
    how, answer = await call_bounded(cleanup, timeout)
    if how == "raised":
        return "failed", answer
    if how == "timeout":
        return "uncertain", f"cleanup did not answer within {timeout} s"
    if type(answer) is str and answer in CONFIRMING:
        return "confirmed", None
    return "uncertain", f"cleanup answered {answer!r}"[:300]
