"""Durable instants: what a run stores is wall-clock time, what it waits on is
Trio's clock.

Trio's clock has an arbitrary offset per run (and ``MockClock`` none that
means anything), so a time read from it means nothing to another process.
Every instant a conversation stores (the run deadline, an approval's
expiry, a command's time) is seconds since the Unix epoch, UTC; the timers
keep Trio's clock.  The two are tied once, when the conversation opens:
afterwards an instant is Trio time plus that fixed offset, so a wall clock
stepped by NTP meanwhile never moves a deadline in flight.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import final

import attrs
import trio

from ..errors import Error, ErrorClass

__all__ = ["DurableClock", "check_wall_clock"]


def check_wall_clock(wall_clock: object) -> Callable[[], float]:
    """``wall_clock`` as the option gives it (``None``: ``time.time``), checked
    to be a callable; what it returns is checked when it is read."""
    if wall_clock is None:
        return time.time
    if not callable(wall_clock):
        raise Error(
            ErrorClass.VALIDATION,
            "wall_clock must be a callable returning seconds since the epoch, or None",
            {"option": "wall_clock"},
        )
    return wall_clock


@final
@attrs.frozen
class DurableClock:
    """Maps Trio's clock to wall-clock seconds for one conversation."""

    #: wall-clock seconds minus Trio seconds, read once
    offset: float

    @classmethod
    def anchored(cls, wall_clock: Callable[[], float]) -> DurableClock:
        """Tie ``wall_clock`` to the current Trio clock, now."""
        wall = wall_clock()
        if type(wall) not in (int, float) or not math.isfinite(wall):
            raise Error(
                ErrorClass.VALIDATION,
                "wall_clock must return a finite number of seconds",
                {"option": "wall_clock", "type": type(wall).__name__},
            )
        return cls(offset=float(wall) - trio.current_time())

    def wall(self, trio_time: float) -> float:
        """The wall-clock instant of a Trio time."""
        return trio_time + self.offset

    def trio(self, wall_time: float) -> float:
        """The Trio time of a wall-clock instant (``inf`` stays ``inf``)."""
        return wall_time - self.offset
