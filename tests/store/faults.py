"""Failures injected at a SQL store's driver seam (the engine's own
handling of a failed or unacknowledged ``COMMIT``), from outside the store."""

from __future__ import annotations

import sqlite3
from typing import Any

from trio_backplane.store import SQLiteStore
from trio_backplane.store._sql._sqlite import SQLiteDriver

#: driver classes patched and not yet triggered: {class: original commit}
armed: dict[type, Any] = {}


def driver_class(store: Any) -> tuple[type, type[Exception]]:
    """The driver class of ``store``'s kind and its database's I/O error."""
    if isinstance(store, SQLiteStore):
        return SQLiteDriver, sqlite3.OperationalError
    import psycopg

    from trio_backplane.store._sql._postgres import PostgresDriver

    return PostgresDriver, psycopg.OperationalError


def fail_next_commit(store: Any, *, after_commit: bool = False, skip: int = 0) -> None:
    """The next ``COMMIT`` a driver of ``store``'s kind makes (after ``skip``
    others) fails with its database's I/O error: before it (nothing persists)
    or, ``after_commit``, after it (durable, the acknowledgement lost)."""
    cls, failure = driver_class(store)
    original = armed.setdefault(cls, cls.__dict__["commit"])
    left = [skip]

    def commit(self: Any) -> None:
        if left[0]:
            left[0] -= 1
            original(self)
            return
        disarm(cls)
        if after_commit:
            original(self)
            raise failure("injected loss of the COMMIT acknowledgement")
        raise failure("injected I/O failure before COMMIT")

    cls.commit = commit  # type: ignore[attr-defined]


def disarm(cls: type | None = None) -> None:
    for each in [cls] if cls is not None else list(armed):
        original = armed.pop(each, None)
        if original is not None:
            each.commit = original  # type: ignore[attr-defined]
