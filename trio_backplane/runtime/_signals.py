"""The worker's own control flow: exceptions that never leave the runtime."""

from __future__ import annotations

from typing import Any

import trio

from ..errors import Error, ErrorClass, exception_leaves

__all__ = [
    "_InputArrived",
    "_Rejected",
    "_Stop",
    "_StorageFailed",
    "_TurnFailed",
    "only_the_cut",
    "storage_error",
]


class _Stop(Exception):
    """Internal: the turn loop must stop (cancel, deadline, uncertainty, storage)."""


class _InputArrived(Exception):
    """Internal: a step that ends a turn or the run was refused because host
    input (steering, a follow-up) is queued in the record it would land on:
    input committed meanwhile is never dropped."""


class _StorageFailed(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


class _TurnFailed(Exception):
    """Internal: the turn fails with ``error`` (the run goes on)."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


class _Rejected(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


def storage_error(message: str) -> Error:
    """A storage failure: the run needs recovery."""
    return Error(ErrorClass.STORAGE_FAILED, message, {"recovery_required": True})


def only_the_cut(group: BaseExceptionGroup[Any]) -> BaseException:
    """What a backend's or a provider stream's own nursery raised when the
    effect was cut: its cancellation alone, which its scope takes (the
    effect's other errors are moot, it was interrupted: uncertain); the
    group itself when it holds a ``KeyboardInterrupt``, ``SystemExit`` or
    another ``BaseException``, which propagate as they are."""
    if any(not isinstance(leaf, Exception | trio.Cancelled) for leaf in exception_leaves(group)):
        return group
    cancelled, _ = group.split(trio.Cancelled)
    assert cancelled is not None  # else it is an ExceptionGroup, an Exception
    return cancelled
