"""The worker's own control flow: exceptions that never leave the runtime."""

from __future__ import annotations

from ..errors import Error

__all__ = ["_InputArrived", "_Rejected", "_Stop", "_StorageFailed"]


class _Stop(Exception):
    """Internal: the turn loop must stop (cancel, deadline, uncertainty, storage)."""


class _InputArrived(Exception):
    """Internal: a step that ends a turn or the run was refused because host
    input (steering, a follow-up) is queued in the record it would land on:
    input committed meanwhile is never dropped (CONV-27)."""


class _StorageFailed(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


class _Rejected(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error
