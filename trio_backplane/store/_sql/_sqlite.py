"""``SQLiteStore``: the embedded durable store (stdlib ``sqlite3``).

One file, WAL, ``synchronous=FULL``; one worker thread owns the one
connection.  Layout version 2 (``meta.layout_version``); layout 1 files are
read as they are and upgraded on open (``_layout``).  Many processes may
share the file: compare-and-set keeps them honest, and a write waits for
another connection's lock until its callers' latest deadline at most.
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Sequence
from typing import Final, final

from ...errors import Error, ErrorClass
from ._driver import EventTuple
from ._engine import CACHE_ITEMS, SQLStore
from ._rows import RunRow, RunUpdate, Writes

__all__ = ["LAYOUT_VERSION", "SQLiteDriver", "SQLiteStore"]

#: Version of the table layout written by this code (``meta.layout_version``).
LAYOUT_VERSION: Final = 2
_BUSY_TIMEOUT_S: Final = 10.0
_BUSY_MS: Final = int(_BUSY_TIMEOUT_S * 1000)

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS runs ("
    " run_id TEXT PRIMARY KEY, incarnation INTEGER NOT NULL, revision INTEGER NOT NULL,"
    " state TEXT NOT NULL, head TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS run_parts ("
    " run_id TEXT NOT NULL REFERENCES runs(run_id), part TEXT NOT NULL, key TEXT NOT NULL,"
    " value TEXT NOT NULL, PRIMARY KEY (run_id, part, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS run_events ("
    " run_id TEXT NOT NULL REFERENCES runs(run_id), sequence INTEGER NOT NULL,"
    " type TEXT NOT NULL, occurred_at REAL NOT NULL, payload TEXT NOT NULL,"
    " PRIMARY KEY (run_id, sequence)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS runs_state ON runs(state)",
)
_UPSERT_PART: Final = (
    "INSERT INTO run_parts (run_id, part, key, value) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (run_id, part, key) DO UPDATE SET value = excluded.value"
)
#: A listed run's first event's time: one seek in the events' primary key.
_FIRST_EVENT_AT: Final = (
    "SELECT occurred_at FROM run_events e WHERE e.run_id = runs.run_id ORDER BY sequence LIMIT 1"
)
_DELETE_PART: Final = "DELETE FROM run_parts WHERE run_id = ? AND part = ? AND key = ?"
_INSERT_EVENT: Final = (
    "INSERT INTO run_events (run_id, sequence, type, occurred_at, payload) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_RUN: Final = (
    "INSERT INTO runs (run_id, incarnation, revision, state, head) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (run_id) DO NOTHING"
)
_UPDATE_RUN: Final = (
    "UPDATE runs SET incarnation = ?, revision = ?, state = ?, head = ?"
    " WHERE run_id = ? AND incarnation = ? AND revision = ?"
)
#: The same compare-and-set for a commit that keeps the state: a column in
#: ``SET`` rewrites its index entry even when its value is unchanged, one
#: more page (a ``runs_state`` leaf) written to the WAL and synced.
_UPDATE_RUN_SAME_STATE: Final = (
    "UPDATE runs SET incarnation = ?, revision = ?, head = ?"
    " WHERE run_id = ? AND incarnation = ? AND revision = ?"
)
_SELECT_RUN: Final = "SELECT run_id, incarnation, revision, state, head FROM runs WHERE run_id = ?"
_SELECT_PARTS: Final = "SELECT part, key, value FROM run_parts WHERE run_id = ?"
_SELECT_LAST_SEQUENCE: Final = "SELECT COALESCE(MAX(sequence), 0) FROM run_events WHERE run_id = ?"
_SELECT_EVENTS: Final = (
    "SELECT sequence, type, occurred_at, payload FROM run_events"
    " WHERE run_id = ? AND sequence > ? ORDER BY sequence"
)
_SELECT_LAYOUT: Final = "SELECT value FROM meta WHERE key = 'layout_version'"


def _compare_and_set(update: RunUpdate) -> tuple[str, tuple[object, ...]]:
    """The statement and values of ``update``'s compare-and-set."""
    row = update.row
    if update.moved:
        return _UPDATE_RUN, (*row[1:], row.run_id, *update[1:3])
    return _UPDATE_RUN_SAME_STATE, (
        row.incarnation,
        row.revision,
        row.head,
        row.run_id,
        *update[1:3],
    )


def _journal_wal(conn: sqlite3.Connection) -> object:
    """``PRAGMA journal_mode = WAL``, retried while another connection holds
    the lock it needs (a new file several processes open at once): SQLite
    answers that pragma "database is locked" at once, never waiting."""
    give_up = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= give_up:
                raise
            time.sleep(0.005)  # the worker's own sleep: Trio goes on


def _check_layout(stored: object, path: str) -> int:
    try:
        version = int(str(stored))
    except ValueError:
        version = -1
    if version < 1:
        raise Error(
            ErrorClass.STORAGE_FAILED,
            "database layout version is not recognized",
            {"path": path, "layout_version": str(stored)[:100]},
        )
    if version > LAYOUT_VERSION:
        raise Error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "database was written by a newer trio_backplane",
            {"layout_version": version, "supported": LAYOUT_VERSION},
        )
    return version


def _layout(conn: sqlite3.Connection, path: str) -> int | None:
    """The file's layout version (``None``: no store there yet).  A read, no
    lock: opening a file another process writes never waits."""
    try:
        row = conn.execute(_SELECT_LAYOUT).fetchone()
    except sqlite3.OperationalError:
        return None  # no tables yet
    return None if row is None else _check_layout(row[0], path)


def _check_ours(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a database another application owns: it holds tables, but not
    this store's ``meta`` marker.  An empty database becomes a store; nothing
    is written to someone else's (not even the switch to WAL)."""
    tables = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if not tables:
        return
    marked = False
    if "meta" in tables:
        try:
            marked = conn.execute(_SELECT_LAYOUT).fetchone() is not None
        except sqlite3.OperationalError:  # another application's table named meta
            marked = False
    if not marked:
        raise Error(
            ErrorClass.VALIDATION,
            "database is not a trio_backplane store: it holds other tables",
            {"path": path, "tables": sorted(tables)[:10]},
        )


def _not_a_store(path: str) -> Error:
    return Error(
        ErrorClass.NOT_FOUND,
        "no trio_backplane store there (create_tables=False creates none)",
        {"path": path, "reason": "not_a_store"},
    )


@final
class SQLiteDriver:
    """The one connection of a ``SQLiteStore``."""

    def __init__(self, path: str, *, create_tables: bool) -> None:
        self._path = path
        self._create = create_tables
        self._conn: sqlite3.Connection | None = None
        #: the connection's one cursor for the commit path (a connection's
        #: ``execute`` makes a cursor a call)
        self._cursor: sqlite3.Cursor | None = None
        self._busy_ms = 0
        #: ``(st_dev, st_ino)`` of the file the connection opened: checked
        #: before each ``COMMIT``
        self._identity: tuple[int, int] | None = None
        self._file = path
        #: the layout of a file opened without ``create_tables``, if older
        #: than this code's (read as it is, never written)
        self._older: int | None = None

    @property
    def connection(self) -> sqlite3.Connection | None:
        return self._conn

    def open(self, deadline: float) -> None:
        if self._conn is not None:
            return
        # The file, wherever the process's working directory goes next (a
        # relative path is read once, now); ":memory:" is SQLite's own name
        # for a database held in memory, no file.
        in_memory = self._path == ":memory:"
        self._file = self._path if in_memory else os.path.abspath(self._path)
        create = self._create or in_memory
        try:
            conn = sqlite3.connect(
                self._file
                if create
                else "file:" + urllib.parse.quote(os.fsencode(self._file)) + "?mode=rw",
                timeout=_BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
                uri=not create,
            )
        except sqlite3.OperationalError:
            if create or os.path.exists(self._file):
                raise
            raise _not_a_store(self._path) from None
        try:
            self._prepare(conn, create=create, in_memory=in_memory)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._cursor = conn.cursor()

    def _prepare(self, conn: sqlite3.Connection, *, create: bool, in_memory: bool) -> None:
        self._busy_ms = _BUSY_MS
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_MS}")
        _check_ours(conn, self._path)  # before anything changes the file
        if create:
            mode = _journal_wal(conn)
            if str(mode).lower() not in ("wal", "memory"):
                raise sqlite3.OperationalError(f"cannot enable WAL (journal_mode={mode})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        if not in_memory:
            st = os.stat(self._file)
            self._identity = (st.st_dev, st.st_ino)
        version = _layout(conn, self._path)
        if version == LAYOUT_VERSION:
            return
        if create:
            self._lay_out(conn)
        elif version is None:
            raise _not_a_store(self._path)
        else:
            self._older = version

    def _lay_out(self, conn: sqlite3.Connection) -> None:
        """Create the tables, or bring an older layout up to date (under the
        write lock: another process may be doing the same)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA:
                conn.execute(statement)
            row = conn.execute(_SELECT_LAYOUT).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('layout_version', ?)",
                    (str(LAYOUT_VERSION),),
                )
            elif _check_layout(row[0], self._path) < LAYOUT_VERSION:
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'layout_version'",
                    (str(LAYOUT_VERSION),),
                )
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _live(self) -> sqlite3.Connection:
        assert self._conn is not None  # the engine opens before every call
        return self._conn

    def _writes(self) -> sqlite3.Cursor:
        assert self._cursor is not None  # the engine opens before every call
        return self._cursor

    def _lock_wait(self, seconds: float) -> None:
        ms = max(1, int(min(seconds, _BUSY_TIMEOUT_S) * 1000))
        if ms != self._busy_ms:
            self._live().execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_ms = ms

    def begin(self, deadline: float) -> None:
        if self._older is not None:
            raise Error(
                ErrorClass.UNSUPPORTED_CAPABILITY,
                "store holds an older layout: open it with create_tables=True to write"
                " (which upgrades it, and older trio_backplane then refuses it)",
                {"path": self._path, "layout_version": self._older},
            )
        if deadline != math.inf:
            patience = deadline - time.monotonic()
            if patience <= 0:
                raise sqlite3.OperationalError("the commit's deadline passed before it was written")
            self._lock_wait(patience)
        elif self._busy_ms != _BUSY_MS:
            self._lock_wait(_BUSY_TIMEOUT_S)
        self._writes().execute("BEGIN IMMEDIATE")

    def begin_read(self) -> None:
        self._lock_wait(_BUSY_TIMEOUT_S)
        self._live().execute("BEGIN DEFERRED")

    def commit(self) -> None:
        cursor = self._writes()
        if self._identity is not None:
            # Removed or replaced under the store, a COMMIT would land in a
            # file nobody opens again, acknowledged and lost.
            st = os.stat(self._file)
            if (st.st_dev, st.st_ino) != self._identity:
                raise sqlite3.OperationalError("the database file was removed or replaced")
        cursor.execute("COMMIT")

    def rollback(self) -> None:
        conn = self._conn
        if conn is not None and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def read_run(self, run_id: str, *, lock: bool) -> RunRow | None:
        # BEGIN IMMEDIATE holds the write lock already: a read is locked
        row = self._live().execute(_SELECT_RUN, (run_id,)).fetchone()
        return None if row is None else RunRow(*row)

    def read_parts(self, run_id: str) -> dict[tuple[str, str], str]:
        rows = self._live().execute(_SELECT_PARTS, (run_id,))
        return {(part, key): value for part, key, value in rows}

    def last_sequence(self, run_id: str) -> int:
        (last,) = self._live().execute(_SELECT_LAST_SEQUENCE, (run_id,)).fetchone()
        return int(last)

    def insert_run(self, row: RunRow) -> bool:
        return self._live().execute(_INSERT_RUN, tuple(row)).rowcount == 1

    def write(self, writes: Writes) -> bool:
        cursor = self._writes()
        updates = writes.updates
        if len(updates) == 1:  # one run's commit: no lists to build
            cursor.execute(*_compare_and_set(updates[0]))
            if cursor.rowcount != 1:
                return False
        elif not self._update_runs(cursor, updates):
            return False
        # Rows bound as exact tuples: ``sqlite3`` reads any other sequence
        # item by item through ``__getitem__`` (a NamedTuple's costs a method
        # call a field).
        if writes.parts:
            cursor.executemany(_UPSERT_PART, map(tuple, writes.parts))
        if writes.gone:
            cursor.executemany(_DELETE_PART, map(tuple, writes.gone))
        if writes.events:
            try:
                cursor.executemany(_INSERT_EVENT, map(tuple, writes.events))
            except sqlite3.IntegrityError:  # a sequence taken: the memory was stale
                return False
        return True

    @staticmethod
    def _update_runs(cursor: sqlite3.Cursor, updates: list[RunUpdate]) -> bool:
        """Every compare-and-set of ``updates``; whether each matched its row."""
        by_statement: dict[str, list[tuple[object, ...]]] = {}
        for update in updates:
            sql, values = _compare_and_set(update)
            by_statement.setdefault(sql, []).append(values)
        matched = sum(cursor.executemany(sql, rows).rowcount for sql, rows in by_statement.items())
        return matched == len(updates)

    def list_runs(
        self, states: Sequence[str] | None
    ) -> list[tuple[str, int, int, str, float | None]]:
        sql = f"SELECT run_id, incarnation, revision, state, ({_FIRST_EVENT_AT}) FROM runs"
        args: tuple[str, ...] = ()
        if states is not None:
            sql += f" WHERE state IN ({', '.join('?' * len(states))})"
            args = tuple(states)
        return list(self._live().execute(sql + " ORDER BY run_id", args))

    def read_events(self, run_id: str, after: int) -> list[EventTuple]:
        return list(self._live().execute(_SELECT_EVENTS, (run_id, after)))

    def interrupt(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.interrupt()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._cursor = None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def classify(self, exc: BaseException) -> Error | None:
        if not isinstance(exc, sqlite3.Error | OSError | UnicodeDecodeError):
            return None
        return Error(
            ErrorClass.STORAGE_FAILED,
            "sqlite operation failed",
            # which file: what a person fixes (permissions, disk)
            {"cause": f"{type(exc).__name__}: {exc}"[:500], "path": self._path},
        )


@final
class SQLiteStore(SQLStore):
    """Runs in one SQLite file: WAL, ``synchronous=FULL``, atomic compare-and-set
    and fence, group commit; one worker thread owns the connection.

    With ``create_tables=False`` the store changes nothing in the file until
    it writes a run: it creates no file, no tables (where they are missing,
    every call fails with ``not_found``), switches no journal mode and
    upgrades no older layout (it reads it as it is, and refuses to write to
    it with ``unsupported_capability``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create_tables: bool = True,
        cache_items: int = CACHE_ITEMS,
    ) -> None:
        if type(create_tables) is not bool:
            raise Error(ErrorClass.VALIDATION, "create_tables must be a bool")
        if not isinstance(path, str | os.PathLike) or isinstance(path, bytes):
            raise Error(
                ErrorClass.VALIDATION,
                "path must be a str or os.PathLike naming the SQLite file",
                {"type": type(path).__name__},
            )
        text = os.fspath(path)
        if not isinstance(text, str) or not text or "\x00" in text:
            raise Error(ErrorClass.VALIDATION, "path must name the SQLite file (no NUL)")
        self._path = text
        super().__init__(
            lambda: SQLiteDriver(text, create_tables=create_tables),
            name=f"SQLiteStore({text!r})",
            cache_items=cache_items,
            where={"path": text},
        )

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    @property
    def path(self) -> str:
        return self._path
