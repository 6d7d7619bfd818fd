"""Deadlines as generation-tagged budgets on Trio cancel scopes.

Each arming of a budget (the run, one effect, one commit, the cleanup) makes
a fresh generation.  ``suspend`` remembers the remaining time and stops the
clock; ``resume`` re-arms with only what remained.  A timeout decided under
an older generation is ignored (ARCHITECTURE.md rule 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import final

import trio

__all__ = ["DeadlineBudget"]


@final
class DeadlineBudget:
    """``seconds`` of time, spent only while armed and not suspended."""

    __slots__ = ("_generation", "_now", "_remaining", "_scope", "_suspended", "name")

    def __init__(
        self, name: str, seconds: float, now: Callable[[], float] = trio.current_time
    ) -> None:
        """``now``: the run's clock (``trio.current_time`` or the bound
        ``current_time`` of ``trio.lowlevel.current_clock()``, which skips
        the lookup of the run on every reading)."""
        self.name = name
        self._now = now
        self._remaining = float(seconds)
        self._generation = 0
        self._scope: trio.CancelScope | None = None
        self._suspended = False

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def suspended(self) -> bool:
        return self._suspended

    @property
    def deadline(self) -> float:
        """The absolute deadline now in force (``inf`` while suspended)."""
        if self._scope is None:
            return self._now() + self._remaining
        return self._scope.deadline

    def remaining(self) -> float:
        if self._scope is None or self._suspended:
            return self._remaining
        return max(0.0, self._scope.deadline - self._now())

    def arm(self, *, shield: bool = False) -> trio.CancelScope:
        """A new cancel scope whose deadline spends this budget (new
        generation).  Arming again spends only what the last arming left."""
        if self._scope is not None and not self._suspended:
            self._remaining = max(0.0, self._scope.deadline - self._now())
        self._generation += 1
        self._suspended = False
        self._scope = trio.CancelScope(deadline=self._now() + self._remaining, shield=shield)
        return self._scope

    def suspend(self) -> int:
        """Stop the clock; returns the new generation."""
        if self._scope is not None and not self._suspended:
            self._remaining = max(0.0, self._scope.deadline - self._now())
            self._scope.deadline = math.inf
        self._suspended = True
        self._generation += 1
        return self._generation

    def resume(self, at: float | None = None) -> int:
        """Re-arm with only the remaining time; returns the new generation.
        A budget that was not suspended (armed during the wait) is left alone."""
        if not self._suspended:
            return self._generation
        self._generation += 1
        self._suspended = False
        if self._scope is not None:
            self._scope.deadline = (self._now() if at is None else at) + self._remaining
        return self._generation

    def timed_out(self, generation: int | None = None) -> bool:
        """Whether this budget's deadline passed while it was armed (in
        ``generation``, when given: an older generation's verdict is
        ignored)."""
        scope = self._scope
        if scope is None or self._suspended:
            return False
        if generation is not None and generation != self._generation:
            return False
        # Its deadline cancelled the scope: what it bounds either gave way
        # (caught), or ignored the cancellation and ended late, which is a
        # timeout all the same.
        return scope.cancel_called and self._now() >= scope.deadline
