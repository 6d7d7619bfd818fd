"""The checks of a number an option or a caller gives, shared by every
module that takes one (timeouts of the conversation, the stores and the
adapters; times of approvals), and how a stored instant is shown."""

from __future__ import annotations

import datetime
import math
import sys
from typing import Any

__all__ = ["iso_instant", "is_finite", "is_seconds"]


def is_finite(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or a finite ``float`` (a ``bool`` is
    not; an int too large for a float is finite, never an ``OverflowError``)."""
    return type(value) is int or (type(value) is float and math.isfinite(value))


def is_seconds(value: Any, maximum: float = sys.float_info.max) -> bool:
    """Whether ``value`` is a positive, finite ``int`` or ``float`` of at most
    ``maximum`` seconds (by default, at most what a float holds: a duration
    is computed with as one)."""
    return is_finite(value) and 0 < value <= maximum


def iso_instant(at: float | None) -> str:
    """A stored instant (seconds since the epoch) as UTC ISO 8601; ``-``
    for none, and one no date can hold said so."""
    if at is None:
        return "-"
    try:
        return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{at!r} (not a date)"
