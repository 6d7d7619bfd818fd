"""The rows a SQL store reads and writes, as small typed records.

They are ``NamedTuple`` values: a driver hands them to its database's
``executemany`` as they are, and a reader names their fields.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple, TypeVar

__all__ = ["EventRow", "PartKey", "PartRow", "RunRow", "RunUpdate", "Writes", "maker"]

R = TypeVar("R", bound=tuple[Any, ...])


def maker(row: type[R]) -> Callable[[Iterable[Any]], R]:
    """``row``'s constructor from an iterable of its fields, with no Python
    frame (a ``NamedTuple``'s own ``__new__`` is Python code): for the rows
    a commit builds, several a commit."""
    return partial(tuple.__new__, row)


class RunRow(NamedTuple):
    """A run's row: its identity, state and head (every field but the growing ones)."""

    run_id: str
    incarnation: int
    revision: int
    state: str
    head: str


class RunUpdate(NamedTuple):
    """The compare-and-set of a run row: ``row`` replaces the row stored at
    ``(old_incarnation, old_revision)``, or nothing happens."""

    row: RunRow
    old_incarnation: int
    old_revision: int
    #: whether ``row.state`` differs from the stored state (a driver may then
    #: leave the state column, and its index, alone)
    moved: bool


class PartRow(NamedTuple):
    """One entry of a growing field, as JSON text."""

    run_id: str
    part: str
    key: str
    value: str


class PartKey(NamedTuple):
    """The key of a part row to delete."""

    run_id: str
    part: str
    key: str


class EventRow(NamedTuple):
    """One event of a run's log."""

    run_id: str
    sequence: int
    type: str
    occurred_at: float
    payload: str


class Writes:
    """What one transaction writes: compare-and-set updates first, then part
    upserts, part deletes and events."""

    __slots__ = ("events", "gone", "parts", "updates")

    def __init__(self) -> None:
        self.updates: list[RunUpdate] = []
        self.parts: list[PartRow] = []
        self.gone: list[PartKey] = []
        self.events: list[EventRow] = []
