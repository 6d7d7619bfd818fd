"""``SQLiteStore``: the embedded durable store (stdlib ``sqlite3``).

Layout (``meta.layout_version`` = 1)::

    runs(run_id PK, incarnation, revision, state, head TEXT)
    run_parts(run_id, part, key, value, PK(run_id, part, key))
    run_events(run_id, sequence, type, occurred_at, payload, PK(run_id, sequence))

A record is ``join(head, parts)`` decoded with ``decode_record``; the
layout (head + part rows for ``intents``, ``tool_results``,
``budget.reservations`` and the transcript messages) and its incremental diff
are ``_layout``'s, shared with ``PostgresStore``.

**Incremental commits.**  A commit's cost does not grow with the run.  The
store keeps, per run, the ``_layout.Entry`` of the last committed record
(keyed by incarnation and revision, checked against the row read inside the
transaction; a miss or a stale entry reloads the record from the database).
``prepare_commit`` -- the compare-and-set decision every store shares --
checks identity and revision only; ``_layout.diff`` then encodes just the
entries that changed, and the head (which holds no growing field).

**Threads.**  All blocking work runs in ``trio.to_thread.run_sync`` under one
``CapacityLimiter(1)`` on one connection (``check_same_thread=False``, only
ever used under the limiter): never two writers racing.

**Group commit.**  Concurrent ``commit`` calls queue up; whichever caller
finds no writer active becomes the writer and writes everything queued (at
most one commit per run, in arrival order) in one ``BEGIN IMMEDIATE``
transaction with a ``SAVEPOINT`` per commit, so one commit's conflict rolls
back only that commit.  Every caller is acknowledged only after the shared
``COMMIT`` returned; a failed ``COMMIT`` fails the whole batch with
``storage_failed``.  A writer never waits for a batch to fill: it takes what
is queued when it is free (a lone commit is a batch of one, written without
savepoints).  When its own commit is done the writer hands the role to the
oldest queued caller.

**Failures.**  ``Error`` from the decision passes through; any
``sqlite3.Error`` or ``OSError`` becomes ``Error(storage_failed)`` (STO-06),
chained, and drops the cache, so ``load`` reads what is really stored: a
commit whose acknowledgement was lost is reconciled by ``load``.  Test hook:
:meth:`SQLiteStore._fail_next_commit`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, TypeVar

import attrs
import outcome
import trio

from ..errors import Error, ErrorClass
from ..kernel import RunEvent, RunRecord, decode_event, encode_event
from ..kernel import decode_record as _decode_record
from ..kernel import fence as _kernel_fence
from ._layout import (
    NOTHING,
    RESERVATIONS,
    Entry,
    diff,
    dumps,
    entry_of,
    head_text,
    join,
    split,
)
from ._protocol import Receipt, RunSummary, prepare_commit, prepare_create

__all__ = ["LAYOUT_VERSION", "RESERVATIONS", "SQLiteStore", "join", "split"]

T = TypeVar("T")

#: Version of the table layout written by this code (``meta.layout_version``).
LAYOUT_VERSION: Final = 1
_BUSY_TIMEOUT_S: Final = 10.0

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
_DELETE_PART: Final = "DELETE FROM run_parts WHERE run_id = ? AND part = ? AND key = ?"
_INSERT_EVENT: Final = (
    "INSERT INTO run_events (run_id, sequence, type, occurred_at, payload) VALUES (?, ?, ?, ?, ?)"
)
_UPDATE_RUN: Final = (
    "UPDATE runs SET incarnation = ?, revision = ?, state = ?, head = ?"
    " WHERE run_id = ? AND incarnation = ? AND revision = ?"
)


# -- the store -------------------------------------------------------------------


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, mode: str = "IMMEDIATE") -> Iterator[None]:
    conn.execute(f"BEGIN {mode}")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _check_wal(mode: object) -> None:
    if str(mode).lower() not in ("wal", "memory"):
        raise sqlite3.OperationalError(f"cannot enable WAL (journal_mode={mode})")


def _check_layout(version: int) -> None:
    if version > LAYOUT_VERSION:
        raise Error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "database was written by a newer trio_backplane",
            {"layout_version": version, "supported": LAYOUT_VERSION},
        )


def _injected_failure() -> None:
    raise sqlite3.OperationalError("injected I/O failure before COMMIT")


def _conflict(message: str, run_id: str) -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, message, {"run_id": run_id})


_QUEUED: Final = 0
_IN_FLIGHT: Final = 1
_DONE: Final = 2


@attrs.define(eq=False)
class _Job:
    run_id: str
    incarnation: int
    expected_revision: int
    record: RunRecord
    events: tuple[RunEvent, ...]
    task: trio.lowlevel.Task
    state: int = _QUEUED
    receipt: Receipt | None = None
    error: BaseException | None = None


def _storage_failed(exc: BaseException, message: str = "sqlite operation failed") -> Error:
    error = Error(
        ErrorClass.STORAGE_FAILED, message, {"cause": f"{type(exc).__name__}: {exc}"[:500]}
    )
    error.__cause__ = exc
    return error


class SQLiteStore:
    """Runs in one SQLite file: WAL, ``synchronous=FULL``, atomic compare-and-set
    and fence, group commit.  See the module docstring for the design.

    ``stats`` counts, for diagnostics and tests: ``commits`` (acknowledged),
    ``batches`` (shared transactions), ``part_rows`` (part rows upserted or
    deleted), ``last_part_rows`` (by the last committed batch).
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._limiter = trio.CapacityLimiter(1)
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._cache: dict[str, Entry] = {}
        self._queue: list[_Job] = []
        self._leading = False
        self._inject: list[Literal["before", "after"]] = []
        self.stats: dict[str, int] = {
            "commits": 0,
            "batches": 0,
            "part_rows": 0,
            "last_part_rows": 0,
        }

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    @property
    def path(self) -> str:
        return self._path

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection once the work already running has finished."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._close_sync, limiter=self._limiter)

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        self._cache.clear()
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _fail_next_commit(self, *, after_commit: bool = False) -> None:
        """Test hook: the next commit batch fails with ``storage_failed``.

        By default the failure strikes just before ``COMMIT`` (an I/O failure):
        nothing is persisted.  With ``after_commit=True`` the batch is committed
        and durable but its acknowledgement is lost: the caller still gets
        ``storage_failed`` and must reconcile with ``load``.
        """
        self._inject.append("after" if after_commit else "before")

    # -- thread plumbing ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Error(ErrorClass.STORAGE_FAILED, "store is closed", {"path": self._path})

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._check_open()
        return await trio.to_thread.run_sync(self._guarded, fn, limiter=self._limiter)

    def _guarded(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """In the worker thread: run ``fn`` on the connection; map I/O failures."""
        try:
            return fn(self._connect())
        except Error:
            raise
        except (sqlite3.Error, OSError) as exc:
            self._after_failure()
            raise _storage_failed(exc) from exc

    def _after_failure(self) -> None:
        self._cache.clear()
        conn = self._conn
        if conn is not None and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self._closed:
            raise Error(ErrorClass.STORAGE_FAILED, "store is closed", {"path": self._path})
        conn = sqlite3.connect(
            self._path,
            timeout=_BUSY_TIMEOUT_S,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            _check_wal(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            with _transaction(conn):
                for statement in _SCHEMA:
                    conn.execute(statement)
                row = conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('layout_version', ?)",
                        (str(LAYOUT_VERSION),),
                    )
                else:
                    _check_layout(int(row[0]))
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    # -- reading -----------------------------------------------------------------

    @staticmethod
    def _read_record(conn: sqlite3.Connection, run_id: str, head: str) -> RunRecord:
        parts = {
            (part, key): value
            for part, key, value in conn.execute(
                "SELECT part, key, value FROM run_parts WHERE run_id = ?", (run_id,)
            )
        }
        return _decode_record(join(head, parts))

    def _entry(self, conn: sqlite3.Connection, run_id: str) -> Entry | None:
        """The stored run (inside the caller's transaction): cached when the
        cache holds this incarnation and revision, else read and cached."""
        row = conn.execute(
            "SELECT incarnation, revision, head FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        if row is None:
            self._cache.pop(run_id, None)
            return None
        cached = self._cache.get(run_id)
        if (
            cached is not None
            and cached.record.incarnation == row[0]
            and cached.record.revision == row[1]
        ):
            return cached
        record = self._read_record(conn, run_id, row[2])
        entry = entry_of(record)
        self._cache[run_id] = entry
        return entry

    async def load(self, run_id: str) -> RunRecord | None:
        def read(conn: sqlite3.Connection) -> RunRecord | None:
            with _transaction(conn, "DEFERRED"):
                entry = self._entry(conn, run_id)
            return None if entry is None else entry.record

        return await self._run(read)

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        wanted = None if states is None else sorted(set(states))

        def read(conn: sqlite3.Connection) -> list[RunSummary]:
            sql = "SELECT run_id, incarnation, revision, state FROM runs"
            args: tuple[Any, ...] = ()
            if wanted is not None:
                if not wanted:
                    return []
                sql += f" WHERE state IN ({', '.join('?' * len(wanted))})"
                args = tuple(wanted)
            return [RunSummary(*row) for row in conn.execute(sql + " ORDER BY run_id", args)]

        return await self._run(read)

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        def read(conn: sqlite3.Connection) -> list[RunEvent]:
            return [
                decode_event(
                    {
                        "sequence": sequence,
                        "type": kind,
                        "occurred_at": occurred_at,
                        "payload": json.loads(payload),
                    }
                )
                for sequence, kind, occurred_at, payload in conn.execute(
                    "SELECT sequence, type, occurred_at, payload FROM run_events"
                    " WHERE run_id = ? AND sequence > ? ORDER BY sequence",
                    (run_id, after),
                )
            ]

        return await self._run(read)

    # -- writing -----------------------------------------------------------------

    @staticmethod
    def _append_events(
        conn: sqlite3.Connection, run_id: str, events: Sequence[Mapping[str, Any]]
    ) -> None:
        if not events:
            return
        (last,) = conn.execute(
            "SELECT COALESCE(MAX(sequence), 0) FROM run_events WHERE run_id = ?", (run_id,)
        ).fetchone()
        rows = []
        for offset, event in enumerate(events, start=1):
            occurred_at = event["occurred_at"]
            if not isinstance(occurred_at, int | float) or not math.isfinite(occurred_at):
                raise Error(ErrorClass.VALIDATION, "event time must be a finite number")
            rows.append(
                (run_id, last + offset, event["type"], occurred_at, dumps(event["payload"]))
            )
        conn.executemany(_INSERT_EVENT, rows)

    def _write(
        self,
        conn: sqlite3.Connection,
        old: Entry,
        record: RunRecord,
        head: str,
        events: Sequence[Mapping[str, Any]],
    ) -> tuple[Entry, int]:
        """Compare-and-set ``old`` -> ``record`` (inside a transaction)."""
        entry, upserts, deletes = diff(old, record)
        run_id = record.run_id
        cursor = conn.execute(
            _UPDATE_RUN,
            (
                record.incarnation,
                record.revision,
                record.state,
                head,
                run_id,
                old.record.incarnation,
                old.record.revision,
            ),
        )
        if cursor.rowcount != 1:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT, "stale revision", {"run_id": run_id}
            )  # pragma: no cover - the row was read under BEGIN IMMEDIATE
        if upserts:
            conn.executemany(_UPSERT_PART, [(run_id, *row) for row in upserts])
        if deletes:
            conn.executemany(_DELETE_PART, [(run_id, *row) for row in deletes])
        self._append_events(conn, run_id, events)
        return entry, len(upserts) + len(deletes)

    def _apply_commit(self, conn: sqlite3.Connection, job: _Job) -> tuple[Entry, int]:
        """One commit inside the batch transaction: decide, then write."""
        row = conn.execute(
            "SELECT incarnation, revision FROM runs WHERE run_id = ?", (job.run_id,)
        ).fetchone()
        stored: RunRecord | None
        old: Entry | None = None
        if row is None:
            stored = None
        elif (row[0], row[1]) != (job.incarnation, job.expected_revision):
            # Refused either way: prepare_commit only needs the identity.
            stored = RunRecord(run_id=job.run_id, incarnation=row[0], revision=row[1])
        else:
            old = self._entry(conn, job.run_id)
            stored = None if old is None else old.record
        prepared = prepare_commit(
            stored,
            job.run_id,
            incarnation=job.incarnation,
            expected_revision=job.expected_revision,
            record=job.record,
            events=job.events,
        )
        assert old is not None
        record = prepared.record
        return self._write(conn, old, record, head_text(record), prepared.events)

    def _write_batch(self, jobs: list[_Job]) -> None:
        """In the worker thread: one transaction, a savepoint per commit.

        Sets every job's ``receipt`` or ``error``; never raises.
        """
        inject = self._inject.pop(0) if self._inject else None
        staged: list[tuple[_Job, Entry, int]] = []
        conn: sqlite3.Connection | None = None
        try:
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            single = len(jobs) == 1
            for job in jobs:
                if not single:
                    conn.execute("SAVEPOINT batch_commit")
                try:
                    entry, rows = self._apply_commit(conn, job)
                except Error as exc:
                    if exc.error_class is ErrorClass.STORAGE_FAILED:
                        raise
                    conn.execute("ROLLBACK TO batch_commit" if not single else "ROLLBACK")
                    if not single:
                        conn.execute("RELEASE batch_commit")
                    job.error = exc
                    continue
                if not single:
                    conn.execute("RELEASE batch_commit")
                staged.append((job, entry, rows))
            if not staged:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                return
            if inject == "before":
                _injected_failure()
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError, Error) as exc:
            failure = exc if isinstance(exc, Error) else _storage_failed(exc, "commit failed")
            self._after_failure()
            for job in jobs:
                if job.error is None or job.receipt is not None:
                    job.error = failure
            return
        except BaseException as exc:  # a bug: fail the batch, never half-acknowledge
            self._after_failure()
            for job in jobs:
                job.error = exc
            return
        rows_written = 0
        for job, entry, rows in staged:
            self._cache[job.run_id] = entry
            rows_written += rows
            job.receipt = Receipt(job.run_id, entry.record.incarnation, entry.record.revision)
        self.stats["commits"] += len(staged)
        self.stats["batches"] += 1
        self.stats["part_rows"] += rows_written
        self.stats["last_part_rows"] = rows_written
        if inject == "after":
            lost = sqlite3.OperationalError("injected loss of the COMMIT acknowledgement")
            self._cache.clear()
            for job, _, _ in staged:
                job.receipt = None
                job.error = _storage_failed(lost, "commit acknowledgement lost")

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        """Atomic compare-and-set on ``(run_id, incarnation, expected_revision)``
        (STO-01..05), group-committed with concurrent callers."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        job = _Job(
            run_id,
            incarnation,
            expected_revision,
            record,
            tuple(events),
            trio.lowlevel.current_task(),
        )
        self._queue.append(job)
        if self._leading:

            def abort(_: Any) -> trio.lowlevel.Abort:
                if job.state == _QUEUED:  # not taken yet: withdraw it
                    self._queue.remove(job)
                    job.state = _DONE
                    return trio.lowlevel.Abort.SUCCEEDED
                return trio.lowlevel.Abort.FAILED  # in flight: wait for the outcome

            role = await trio.lowlevel.wait_task_rescheduled(abort)
            if role == "lead":
                await self._lead(job)
        else:
            self._leading = True
            await self._lead(job)
        if job.error is not None:
            raise job.error
        assert job.receipt is not None
        return job.receipt

    def _take_batch(self) -> list[_Job]:
        batch: list[_Job] = []
        seen: set[str] = set()
        rest: list[_Job] = []
        for job in self._queue:
            if job.run_id in seen:
                rest.append(job)  # a run's commits stay in order: one per batch
            else:
                seen.add(job.run_id)
                job.state = _IN_FLIGHT
                batch.append(job)
        self._queue = rest
        return batch

    async def _lead(self, own: _Job) -> None:
        """Write batches until ``own`` is done, then hand the role on."""
        try:
            with trio.CancelScope(shield=True):  # a batch is bounded; callers wait it out
                while own.state != _DONE:
                    batch = self._take_batch()
                    try:
                        await trio.to_thread.run_sync(
                            self._write_batch, batch, limiter=self._limiter
                        )
                    except BaseException as exc:  # the thread never ran the batch
                        for job in batch:
                            if job.error is None and job.receipt is None:
                                job.error = _storage_failed(exc, "commit not attempted")
                    for job in batch:
                        job.state = _DONE
                        if job is not own:
                            trio.lowlevel.reschedule(job.task, outcome.Value("done"))
        finally:
            if self._queue:
                trio.lowlevel.reschedule(self._queue[0].task, outcome.Value("lead"))
            else:
                self._leading = False

    async def create(self, record: RunRecord) -> Receipt:
        """Store a new run at revision 0; ``resource_conflict`` if it exists."""
        prepare_create(record)
        head = head_text(record)

        def write(conn: sqlite3.Connection) -> Receipt:
            with _transaction(conn):
                exists = conn.execute(
                    "SELECT 1 FROM runs WHERE run_id = ?", (record.run_id,)
                ).fetchone()
                if exists is not None:
                    raise _conflict("run already exists", record.run_id)
                entry, upserts, _ = diff(NOTHING, record)
                conn.execute(
                    "INSERT INTO runs (run_id, incarnation, revision, state, head)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (record.run_id, record.incarnation, record.revision, record.state, head),
                )
                if upserts:
                    conn.executemany(_UPSERT_PART, [(record.run_id, *row) for row in upserts])
            self._cache[record.run_id] = entry
            return Receipt(record.run_id, record.incarnation, record.revision)

        return await self._run(write)

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        """Advance the run to ``incarnation`` atomically (STO-08): afterwards the
        old incarnation can never commit; ``resource_conflict`` unless it rises."""
        at = time.time()

        def write(conn: sqlite3.Connection) -> Receipt:
            with _transaction(conn):
                old = self._entry(conn, run_id)
                if old is None:
                    raise _conflict("run does not exist", run_id)
                new, events = _kernel_fence(old.record, incarnation, at=at)
                entry, _ = self._write(
                    conn, old, new, head_text(new), [encode_event(e) for e in events]
                )
            self._cache[run_id] = entry
            return Receipt(run_id, new.incarnation, new.revision)

        return await self._run(write)
