"""``SQLiteStore``: the embedded durable store (stdlib ``sqlite3``).

Layout (``meta.layout_version`` = 2)::

    runs(run_id PK, incarnation, revision, state, head TEXT)
    run_parts(run_id, part, key, value, PK(run_id, part, key))
    run_events(run_id, sequence, type, occurred_at, payload, PK(run_id, sequence))

A record is ``join(head, parts)`` decoded with ``decode_record``; the
layout (head + part rows for ``intents``, ``tool_results``,
``budget.reservations``, the transcript messages and the provider usage
reports) and its incremental diff are ``_layout``'s, shared with
``PostgresStore``.  Layout 1 kept ``usage`` inside the head (so a long run
re-wrote every usage report at every commit); layout 2 reads a layout-1
database as it is (a head holding ``usage`` inline is diffed as if its rows
were missing, so the run's next commit writes them) and marks the file 2 on
open, so older code refuses it rather than misread it.

**Incremental commits.**  A commit's cost does not grow with the run.  The
store remembers, per run (the ``_CACHE_RUNS`` most recently used), the
``_layout.Entry`` of the last committed record, the sequence of the run's last
event and the record's head field by field (``_layout.head_fields``).  A
commit whose ``(incarnation, expected_revision)`` matches what is remembered
is decided (``check_commit``, the decision every store shares) and encoded --
``_layout.diff`` encodes just the entries that changed, the head just the
fields that changed, the events their payloads -- by the caller, in ``commit``
on the Trio thread, which has just built the record; the writer thread then
only writes, starting with the compare-and-set ``UPDATE runs ... WHERE run_id
AND incarnation AND revision``.  A row count of 1 proves the remembered run is
what is stored (every write, ``fence`` included, raises the revision, and
every event append goes with one), so the events continue from the remembered
sequence and no ``SELECT`` runs.  A row count of 0 (another process wrote),
nothing remembered or another revision: the row is read inside the
transaction, the commit decided against it and, when it applies, the record
reloaded and the commit encoded again.

**Writer thread.**  Every sqlite call -- reads, ``create``, ``fence`` and
commits -- runs in one dedicated daemon thread per store, started on first
use and fed through a ``queue.SimpleQueue``: one connection
(``check_same_thread=False``) only ever used by that thread, never two
writers racing, work done in submission order.  An outcome reaches Trio
through the ``TrioToken`` captured at submission (``run_sync_soon`` +
``reschedule``); a commit batch's leader (below) instead waits for a byte on
a pipe Trio watches (POSIX; one wake-up of the I/O loop, cheaper than
``run_sync_soon``).  Work submitted is waited out, never abandoned: a read
is only cancellable before it is submitted, and a batch leader cancelled
while its batch is in the thread waits for the outcome shielded (its caller
gets the outcome; the cancellation strikes at its next checkpoint).
``aclose`` lets the work already submitted finish, closes the connection and
joins the thread; a store dropped without ``aclose`` stops its thread from a
``weakref.finalize`` (the thread holds no reference to the store between
calls), and a Trio run ending while the thread lives leaves it idle, never
hanging anything.

**Group commit.**  Concurrent ``commit`` calls queue up; whichever caller
finds no writer active becomes the writer (the batch leader) and hands
everything queued (at most one commit per run, in arrival order) to the
thread as one ``BEGIN IMMEDIATE`` transaction.  Each commit is decided
before it writes (its compare-and-set ``UPDATE`` is its first write; a
refused commit changes no row, which the writer checks with
``total_changes``), so one commit's conflict fails only that commit, with no
savepoint to undo.  Every caller
is acknowledged only after the shared ``COMMIT`` returned; a failed
``COMMIT`` fails the whole batch with ``storage_failed``.  A writer never
waits for a batch to fill: it takes what is queued when it is free (a lone
commit is a batch of one).  When its own commit
is done the writer hands the role to the oldest queued caller.  A queued
commit not yet taken is withdrawn when its caller is cancelled; one taken is
waited out.

**Other connections and processes.**  Many processes may share the file
(compare-and-set keeps them honest).  A batch waits for the write lock
another connection holds until its callers' latest deadline at most
(``busy_timeout`` set per batch; other calls wait up to 10 s), so a commit
is never acknowledged long after its caller stopped waiting; the
conversation treats a receipt arriving after its commit deadline as not
acknowledged (CAN-11).  Opening a laid-out file only reads (WAL readers
take no lock); the write lock is taken to lay a new file out, and the WAL
switch SQLite refuses at once while another process opens the same new
file is retried up to the busy timeout.  Before each ``COMMIT`` the path
must still name the file the connection opened (one ``stat``): a file
removed or replaced under the store fails the batch instead of taking
commits nobody will read.  A store used in a process forked after its
writer thread started refuses every call (the thread did not fork).

**Failures.**  ``Error`` from the decision passes through; any
``sqlite3.Error`` or ``OSError`` becomes ``Error(storage_failed)`` (STO-06),
chained, and drops the cache, so ``load`` reads what is really stored: a
commit whose acknowledgement was lost is reconciled by ``load``.  A closed
store raises ``storage_failed``.  Test hook:
:meth:`SQLiteStore._fail_next_commit`.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar, final

import outcome
import trio

from ..errors import Error, ErrorClass
from ..kernel import RunEvent, RunRecord
from ..kernel import fence as _kernel_fence
from ._group import GroupCommit, Job
from ._layout import (
    NOTHING,
    RESERVATIONS,
    CorruptRecord,
    Deletes,
    Entry,
    Upserts,
    decode_stored,
    decode_stored_event,
    diff,
    encode_part,
    entry_of,
    head_fields,
    join,
    join_head,
    split,
)
from ._protocol import (
    Receipt,
    RunSummary,
    check_arguments,
    check_commit,
    check_states,
    prepare_create,
)

__all__ = ["LAYOUT_VERSION", "RESERVATIONS", "SQLiteStore", "join", "split"]

T = TypeVar("T")

#: Version of the table layout written by this code (``meta.layout_version``).
LAYOUT_VERSION: Final = 2
_BUSY_TIMEOUT_S: Final = 10.0
#: Runs whose last committed (or read) record the store remembers for the
#: commit diff, most recently used kept: a host serving runs for days does
#: not keep every run it ever touched (a miss reads the row back).
_CACHE_RUNS: Final = 256

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
#: The same compare-and-set for a commit that keeps the state: a column in
#: ``SET`` rewrites its index entry even when its value is unchanged, one
#: more page (a ``runs_state`` leaf) written to the WAL and synced.
_UPDATE_RUN_SAME_STATE: Final = (
    "UPDATE runs SET incarnation = ?, revision = ?, head = ?"
    " WHERE run_id = ? AND incarnation = ? AND revision = ?"
)
_SELECT_IDENTITY: Final = "SELECT incarnation, revision FROM runs WHERE run_id = ?"
_SELECT_LAST_SEQUENCE: Final = "SELECT COALESCE(MAX(sequence), 0) FROM run_events WHERE run_id = ?"

#: A batch leader waits for the writer thread on a pipe Trio watches (one
#: wake-up of Trio's I/O loop); where Trio watches sockets only (Windows) it
#: waits like every other call, through the Trio token.
_WAKE_PIPE: Final = os.name == "posix"


# -- the writer thread --------------------------------------------------------------


class _Call:
    """One piece of work for the writer thread, and how its outcome reaches
    Trio: through ``token`` to ``task``, or (no task) a byte on the wake pipe."""

    __slots__ = ("done", "fn", "result", "task", "token")

    def __init__(
        self,
        fn: Callable[[], Any],
        token: trio.lowlevel.TrioToken | None = None,
        task: trio.lowlevel.Task | None = None,
    ) -> None:
        self.fn: Callable[[], Any] | None = fn
        self.token = token
        self.task = task
        self.result: outcome.Outcome[Any] | None = None
        self.done = False


#: Queue items that stop the writer thread: ``_STOP`` from ``aclose`` (which
#: closes the wake pipe after joining the thread), ``_ABANDONED`` from the
#: finalizer of a store nobody holds any more (the thread closes the pipe: it
#: is the last one to write to it).
_STOP: Final = 0
_ABANDONED: Final = 1


class _Rows:
    """The rows of encoded commits, written with one statement per kind of
    row: the compare-and-set updates (state kept, or moved), the part
    upserts and deletes, the events numbered on from each run's last."""

    __slots__ = ("commits", "events", "gone", "moved", "parts", "same")

    def __init__(self) -> None:
        self.commits = 0
        self.same: list[tuple[Any, ...]] = []
        self.moved: list[tuple[Any, ...]] = []
        self.parts: list[tuple[str, str, str, str]] = []
        self.gone: list[tuple[str, str, str]] = []
        self.events: list[tuple[Any, ...]] = []

    def add(self, encoded: _Encoded, last: int | None) -> _Written:
        """Add a commit encoded against the run as stored, whose last event
        sequence is ``last`` (known when it has events); what to remember."""
        stored, entry, upserts, deletes, head, events = encoded
        old = stored[0].record
        record = entry.record
        run_id = record.run_id
        where = (run_id, old.incarnation, old.revision)
        if record.state == old.state:
            self.same.append((record.incarnation, record.revision, join_head(head), *where))
        else:
            self.moved.append(
                (record.incarnation, record.revision, record.state, join_head(head), *where)
            )
        if upserts:
            self.parts += [(run_id, *row) for row in upserts]
        if deletes:
            self.gone += [(run_id, *row) for row in deletes]
        if events:
            assert last is not None
            self.events += [
                (run_id, sequence, *event) for sequence, event in enumerate(events, last + 1)
            ]
            last += len(events)
        self.commits += 1
        return (entry, last, head), len(upserts) + len(deletes)

    def write(self, conn: sqlite3.Connection) -> bool:
        """Write the rows (inside a transaction).  False, with only the
        compare-and-set updates run, when they matched fewer rows than there
        are commits: a run is not as remembered (the caller rolls back)."""
        matched = 0
        if self.same:
            matched += conn.executemany(_UPDATE_RUN_SAME_STATE, self.same).rowcount
        if self.moved:
            matched += conn.executemany(_UPDATE_RUN, self.moved).rowcount
        if matched != self.commits:
            return False
        if self.parts:
            conn.executemany(_UPSERT_PART, self.parts)
        if self.gone:
            conn.executemany(_DELETE_PART, self.gone)
        if self.events:
            conn.executemany(_INSERT_EVENT, self.events)
        return True


def _deliver(call: _Call) -> None:
    assert call.task is not None
    assert call.result is not None
    trio.lowlevel.reschedule(call.task, call.result)


def _serve(requests: queue.SimpleQueue[_Call | int], wake: tuple[int, int] | None) -> None:
    """The writer thread: run the calls in order until told to stop.  Holds no
    reference to the store between calls."""
    stop: int = _STOP
    try:
        while True:
            call = requests.get()
            if not isinstance(call, _Call):
                stop = call
                return
            fn, call.fn = call.fn, None
            assert fn is not None
            call.result = outcome.capture(fn)
            del fn
            call.done = True
            try:
                if call.task is None:
                    assert wake is not None
                    os.write(wake[1], b"\0")
                else:
                    assert call.token is not None
                    call.token.run_sync_soon(_deliver, call)
            except OSError:  # the pipe is full: a wake-up is pending anyway (never closed here)
                pass
            except trio.RunFinishedError:  # the Trio run is over: nobody waits
                pass
            del call
    finally:
        if stop == _ABANDONED and wake is not None:
            for fd in wake:
                os.close(fd)


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
            time.sleep(0.005)  # the writer thread's own sleep: Trio goes on


def _laid_out(conn: sqlite3.Connection, path: str) -> bool:
    """Whether the file holds this layout already (a read, no lock: a host
    only reading a file another process writes never waits for its lock)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone()
    except sqlite3.OperationalError:
        return False  # no tables yet
    if row is None:
        return False
    _check_layout(row[0], path)
    return int(row[0]) == LAYOUT_VERSION


def _layout_of(conn: sqlite3.Connection, path: str) -> int:
    """The layout version of a file not at this code's: ``not_found`` when
    it holds none (no store there)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone()
    except sqlite3.OperationalError:
        row = None  # no tables
    if row is None:
        raise _not_a_store(path)
    return int(row[0])  # _laid_out checked it is a version this code reads


def _not_a_store(path: str) -> Error:
    return Error(
        ErrorClass.NOT_FOUND,
        "no trio_backplane store there (create_tables=False creates none)",
        {"path": path, "reason": "not_a_store"},
    )


def _no_abort(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED  # submitted: the outcome is waited out


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
            query = "SELECT 1 FROM meta WHERE key = 'layout_version'"
            marked = conn.execute(query).fetchone() is not None
        except sqlite3.OperationalError:  # another application's table named meta
            marked = False
    if not marked:
        raise Error(
            ErrorClass.VALIDATION,
            "database is not a trio_backplane store: it holds other tables",
            {"path": path, "tables": sorted(tables)[:10]},
        )


def _check_layout(stored: object, path: str) -> None:
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


def _injected_failure() -> None:
    raise sqlite3.OperationalError("injected I/O failure before COMMIT")


def _conflict(message: str, run_id: str) -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, message, {"run_id": run_id})


#: What the store remembers of a run: the entry of its last committed record,
#: the sequence of its last event (``None``: not read yet) and the record's
#: head field by field (``()``: not encoded yet; see ``_layout.head_fields``).
_Cached = tuple[Entry, int | None, Sequence[str]]
#: A commit written inside the batch transaction: what to remember, part rows.
_Written = tuple[_Cached, int]
#: A commit encoded against the remembered run it was diffed from: that
#: ``_Cached``, the new entry, its part upserts and deletes, its head field by
#: field and its events (type, time, payload text) before they are numbered.
_Encoded = tuple[_Cached, Entry, Upserts, Deletes, list[str], list[tuple[str, Any, str]]]


class _Job(Job):
    """One ``commit`` call, queued for a batch."""

    __slots__ = ("deadline", "encoded")
    #: The caller's deadline, in ``time.monotonic`` seconds (``inf``: none):
    #: a batch waits for the write lock until its callers' latest.
    deadline: float
    #: Encoded by the caller against the run the store remembered then (set
    #: by ``commit`` before the job is queued).
    encoded: _Encoded | None


def _storage_failed(
    exc: BaseException, message: str = "sqlite operation failed", path: str | None = None
) -> Error:
    details = {"cause": f"{type(exc).__name__}: {exc}"[:500]}
    if path is not None:
        details["path"] = path  # which file: what a person fixes (permissions, disk)
    error = Error(ErrorClass.STORAGE_FAILED, message, details)
    error.__cause__ = exc
    return error


@final
class SQLiteStore:
    """Runs in one SQLite file: WAL, ``synchronous=FULL``, atomic compare-and-set
    and fence, group commit.  See the module docstring for the design.

    ``stats`` counts, for diagnostics and tests: ``commits`` (acknowledged),
    ``batches`` (shared transactions), ``part_rows`` (part rows upserted or
    deleted), ``last_part_rows`` (by the last committed batch).

    With ``create_tables=False`` the store changes nothing in the file until
    it writes a run: it creates no file, no tables (where they are missing,
    every call fails with ``not_found``), switches no journal mode and
    upgrades no older layout (it reads it as it is, and refuses to write to
    it with ``unsupported_capability``): an inspector reading a store with a
    newer trio_backplane never locks older hosts out of it.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str], *, create_tables: bool = True) -> None:
        if type(create_tables) is not bool:
            raise Error(ErrorClass.VALIDATION, "create_tables must be a bool")
        self._create_tables = create_tables
        #: the layout of a file opened without ``create_tables``, if older
        #: than this code's (read as it is, never written)
        self._older_layout: int | None = None
        if not isinstance(path, str | os.PathLike) or isinstance(path, bytes):
            raise Error(
                ErrorClass.VALIDATION,
                "path must be a str or os.PathLike naming the SQLite file",
                {"type": type(path).__name__},
            )
        self._path = os.fspath(path)
        if not isinstance(self._path, str) or not self._path:
            raise Error(ErrorClass.VALIDATION, "path must name the SQLite file")
        self._conn: sqlite3.Connection | None = None  # the writer thread's
        self._busy_ms = 0  # the connection's busy_timeout now
        #: ``(st_dev, st_ino)`` of the file the connection opened: a batch
        #: checks the path still names it before its COMMIT
        self._identity: tuple[int, int] | None = None
        self._file = self._path  # made absolute when the connection opens
        self._pid = os.getpid()  # the process whose writer thread this is
        self._closed = False
        # Written by the writer thread only; ``commit`` reads it (single dict
        # reads, atomic) to encode against what the store remembers.
        self._cache: dict[str, _Cached] = {}
        self._group: GroupCommit[_Job] = GroupCommit(self._write_in_thread)
        self._inject: list[Literal["before", "after"]] = []
        self._requests: queue.SimpleQueue[_Call | int] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None
        self._stopped = False  # the writer thread takes no more work
        self._finalizer: weakref.finalize[Any, Any] | None = None
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
        """Close the connection once the work already submitted has finished,
        and stop the writer thread."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        thread = self._thread
        if thread is None or os.getpid() != self._pid:
            # No thread, or one another process started (a fork copies the
            # object, not the thread): nothing here to wait for.
            self._stopped = True
            await trio.lowlevel.checkpoint()
            return
        call = _Call(
            self._close_sync, trio.lowlevel.current_trio_token(), trio.lowlevel.current_task()
        )
        self._requests.put(call)
        self._requests.put(_STOP)
        self._stopped = True
        await trio.lowlevel.wait_task_rescheduled(_no_abort)
        thread.join()  # it has delivered its last outcome: it is returning
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._wake is not None:
            trio.lowlevel.notify_closing(self._wake[0])
            for fd in self._wake:
                os.close(fd)
            self._wake = None

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

    def _submit(self, call: _Call) -> None:
        """Hand ``call`` to the writer thread, starting it on first use."""
        if self._stopped:
            raise Error(ErrorClass.STORAGE_FAILED, "store is closed", {"path": self._path})
        if self._thread is not None and os.getpid() != self._pid:
            # A fork copied the store, not its writer thread: the call would
            # wait for ever.  The connection is not the child's to use either.
            raise Error(
                ErrorClass.STORAGE_FAILED,
                "SQLiteStore used in a forked process: open a new one there",
                {"path": self._path},
            )
        if self._thread is None:
            self._pid = os.getpid()
            self._start()
        self._requests.put(call)

    def _start(self) -> None:
        wake: tuple[int, int] | None = None
        if _WAKE_PIPE:
            wake = os.pipe()
            for fd in wake:
                os.set_blocking(fd, False)
        thread = threading.Thread(
            target=_serve,
            args=(self._requests, wake),
            name=f"trio_backplane SQLiteStore({self._path!r})",
            daemon=True,
        )
        try:
            thread.start()
        except BaseException:
            if wake is not None:
                for fd in wake:
                    os.close(fd)
            raise
        self._thread = thread
        self._wake = wake
        self._finalizer = weakref.finalize(self, self._requests.put, _ABANDONED)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the connection in the writer thread."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        call = _Call(
            partial(self._guarded, fn),
            trio.lowlevel.current_trio_token(),
            trio.lowlevel.current_task(),
        )
        self._submit(call)
        result: T = await trio.lowlevel.wait_task_rescheduled(_no_abort)
        return result

    def _guarded(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """In the writer thread: run ``fn`` on the connection; map I/O failures."""
        try:
            conn = self._connect()
            self._lock_wait(conn, _BUSY_TIMEOUT_S)
            return fn(conn)
        except Error:
            raise
        except (sqlite3.Error, OSError, UnicodeDecodeError) as exc:  # a damaged file too
            self._after_failure()
            raise _storage_failed(exc, path=self._path) from exc

    def _after_failure(self) -> None:
        self._cache.clear()
        conn = self._conn
        if conn is not None and conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")

    def _begin_by(self, conn: sqlite3.Connection, deadline: float) -> None:
        """``BEGIN IMMEDIATE``, waiting for the write lock (another process
        may hold it) until ``deadline`` (``time.monotonic``) at most: a commit
        is never acknowledged long after its callers stopped waiting (CAN-11)."""
        patience = deadline - time.monotonic()
        if patience <= 0:
            raise sqlite3.OperationalError("the commit's deadline passed before it was written")
        self._lock_wait(conn, patience)
        conn.execute("BEGIN IMMEDIATE")

    def _check_identity(self) -> None:
        """Raise unless the path still names the file the connection opened:
        removed or replaced under the store, a COMMIT would land in a file
        nobody opens again, acknowledged and lost.  (A removed path is a
        ``FileNotFoundError``.)"""
        if self._identity is None:
            return  # SQLite's in-memory database: no file to lose
        st = os.stat(self._file)
        if (st.st_dev, st.st_ino) != self._identity:
            raise sqlite3.OperationalError("the database file was removed or replaced")

    def _lock_wait(self, conn: sqlite3.Connection, seconds: float) -> None:
        """Wait at most ``seconds`` (at most the busy timeout) for a lock
        another connection holds (the connection's ``busy_timeout``)."""
        ms = max(1, int(min(seconds, _BUSY_TIMEOUT_S) * 1000))
        if ms != self._busy_ms:
            conn.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_ms = ms

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self._closed:
            raise Error(ErrorClass.STORAGE_FAILED, "store is closed", {"path": self._path})
        # The file, wherever the process's working directory goes next (a
        # relative path is read once, now); ":memory:" is SQLite's own name
        # for a database held in memory, no file.
        in_memory = self._path == ":memory:"
        self._file = self._path if in_memory else os.path.abspath(self._path)
        create = self._create_tables or in_memory
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
            self._busy_ms = int(_BUSY_TIMEOUT_S * 1000)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            _check_ours(conn, self._path)  # before anything changes the file
            if create:
                _check_wal(_journal_wal(conn))
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            if not in_memory:
                st = os.stat(self._file)
                self._identity = (st.st_dev, st.st_ino)
            if not _laid_out(conn, self._path):
                if create:
                    self._lay_out(conn)
                else:
                    self._older_layout = _layout_of(conn, self._path)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _check_writable(self) -> None:
        """Refuse a write to a file this store reads at an older layout."""
        if self._older_layout is not None:
            raise Error(
                ErrorClass.UNSUPPORTED_CAPABILITY,
                "store holds an older layout: open it with create_tables=True to write"
                " (which upgrades it, and older trio_backplane then refuses it)",
                {"path": self._path, "layout_version": self._older_layout},
            )

    def _lay_out(self, conn: sqlite3.Connection) -> None:
        """Create the tables, or bring an older layout up to date (under the
        write lock: another process may be doing the same)."""
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
                _check_layout(row[0], self._path)
                if int(row[0]) < LAYOUT_VERSION:  # readable as is; see the docstring
                    conn.execute(
                        "UPDATE meta SET value = ? WHERE key = 'layout_version'",
                        (str(LAYOUT_VERSION),),
                    )

    # -- reading -----------------------------------------------------------------

    def _read_record(
        self, conn: sqlite3.Connection, run_id: str, head: str
    ) -> tuple[RunRecord, frozenset[str]]:
        """The stored record and the lists its head holds inline."""
        parts = {
            (part, key): value
            for part, key, value in conn.execute(
                "SELECT part, key, value FROM run_parts WHERE run_id = ?", (run_id,)
            )
        }
        return decode_stored(run_id, head, parts, self._path)

    def _stored(self, conn: sqlite3.Connection, run_id: str) -> _Cached | None:
        """The stored run (inside the caller's transaction): cached when the
        cache holds this incarnation and revision, else read and cached."""
        row = conn.execute(
            "SELECT incarnation, revision, head FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        if row is None:
            self._cache.pop(run_id, None)
            return None
        cached = self._cache.get(run_id)
        if cached is not None:
            record = cached[0].record
            if record.incarnation == row[0] and record.revision == row[1]:
                return cached
        cached = (entry_of(*self._read_record(conn, run_id, row[2])), None, ())
        self._remember(run_id, cached)
        return cached

    def _remember(self, run_id: str, cached: _Cached) -> None:
        """In the writer thread: remember ``cached`` as the run's latest,
        forgetting the least recently used run past ``_CACHE_RUNS``.  (The
        Trio thread only reads the cache, one ``get`` at a time.)"""
        cache = self._cache
        cache.pop(run_id, None)  # to the most recent end
        cache[run_id] = cached
        if len(cache) > _CACHE_RUNS:
            del cache[next(iter(cache))]

    async def load(self, run_id: str) -> RunRecord | None:
        check_arguments(run_id)

        def read(conn: sqlite3.Connection) -> RunRecord | None:
            with _transaction(conn, "DEFERRED"):
                stored = self._stored(conn, run_id)
            return None if stored is None else stored[0].record

        return await self._run(read)

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        check_states(states)
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
        check_arguments(run_id, after=after)

        def read(conn: sqlite3.Connection) -> list[RunEvent]:
            return [
                decode_stored_event(run_id, row, self._path)
                for row in conn.execute(
                    "SELECT sequence, type, occurred_at, payload FROM run_events"
                    " WHERE run_id = ? AND sequence > ? ORDER BY sequence",
                    (run_id, after),
                )
            ]

        return await self._run(read)

    # -- writing -----------------------------------------------------------------

    @staticmethod
    def _encode(stored: _Cached, record: RunRecord, events: Sequence[RunEvent]) -> _Encoded:
        """Everything a commit of ``record`` (decided and its events checked:
        ``check_commit``) over the ``stored`` record writes, encoded; no I/O."""
        old, _, old_head = stored
        entry, upserts, deletes = diff(old, record)
        head = head_fields(record, old.record, old_head)
        encoded = [(e.type, e.occurred_at, encode_part(e.payload)) for e in events]
        return stored, entry, upserts, deletes, head, encoded

    @staticmethod
    def _apply(conn: sqlite3.Connection, encoded: _Encoded) -> _Written | None:
        """Write an encoded commit inside a transaction: the compare-and-set
        ``UPDATE`` of the run row first, then the changed parts and the events
        numbered on from the remembered last sequence.  ``None`` when the row
        is not at the remembered incarnation and revision (nothing written)."""
        last = encoded[0][1]
        if encoded[5] and last is None:
            (last,) = conn.execute(_SELECT_LAST_SEQUENCE, (encoded[1].record.run_id,)).fetchone()
        rows = _Rows()
        written = rows.add(encoded, last)
        return written if rows.write(conn) else None

    def _write(
        self,
        conn: sqlite3.Connection,
        stored: _Cached,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> _Written | None:
        """Compare-and-set the ``stored`` record -> ``record`` (inside a
        transaction): :meth:`_encode`, then :meth:`_apply`."""
        return self._apply(conn, self._encode(stored, record, events))

    def _prepared(self, job: _Job) -> _Encoded | None:
        """``job`` decided and encoded against the run the store remembers,
        when that run is at the commit's incarnation and expected revision
        (``None`` otherwise: it is decided from the stored row).  Raises the
        decision's ``validation``."""
        cached = self._cache.get(job.run_id)
        if cached is None:
            return None
        stored = cached[0].record
        if stored.incarnation != job.incarnation or stored.revision != job.expected_revision:
            return None
        check_commit(
            stored,
            job.run_id,
            incarnation=job.incarnation,
            expected_revision=job.expected_revision,
            record=job.record,
            events=job.events,
        )
        return self._encode(cached, job.record, job.events)

    def _apply_commit(self, conn: sqlite3.Connection, job: _Job) -> _Written:
        """One commit inside the batch transaction: decide, then write.

        The fast path: the commit was encoded against the run the store still
        remembers (by the caller, or here), and the compare-and-set row count
        confirms that run is what is stored.  Else the row is read and the
        commit decided from it.
        """
        run_id = job.run_id
        cached = self._cache.get(run_id)
        if cached is not None:
            encoded = job.encoded
            if encoded is None or encoded[0] is not cached:
                encoded = self._prepared(job)
            if encoded is not None:
                written = self._apply(conn, encoded)
                if written is not None:
                    return written
                del self._cache[run_id]  # another writer moved the run on
        row = conn.execute(_SELECT_IDENTITY, (run_id,)).fetchone()
        current: _Cached | None = None
        stand_in: RunRecord | None
        if row is None:
            self._cache.pop(run_id, None)
            stand_in = None
        elif (row[0], row[1]) != (job.incarnation, job.expected_revision):
            # Refused either way: check_commit only needs the identity.
            stand_in = RunRecord(run_id=run_id, incarnation=row[0], revision=row[1])
        else:
            current = self._stored(conn, run_id)
            stand_in = None if current is None else current[0].record
        check_commit(
            stand_in,
            run_id,
            incarnation=job.incarnation,
            expected_revision=job.expected_revision,
            record=job.record,
            events=job.events,
        )
        assert current is not None
        written = self._write(conn, current, job.record, job.events)
        if written is None:  # pragma: no cover - the row was read under BEGIN IMMEDIATE
            raise _conflict("stale revision", run_id)
        return written

    def _write_together(
        self, conn: sqlite3.Connection, jobs: list[_Job], staged: list[tuple[_Job, _Written]]
    ) -> list[_Job] | None:
        """Write, with one statement per kind of row, every job of the batch
        that was encoded against the run the store remembers (and whose last
        event sequence it knows), adding them to ``staged``; the other jobs
        are returned, to be decided one by one.  Each statement runs for all
        the rows at once: the writer thread then takes Python's lock a few
        times a batch, not a few times a commit.

        ``None`` when a compare-and-set matched fewer rows than it should:
        another writer moved a run on.  Then the caller rolls back (every row
        written here goes) and decides each commit from the stored rows.
        """
        cache = self._cache
        rest: list[_Job] = []
        rows = _Rows()
        for job in jobs:
            encoded = job.encoded
            cached = cache.get(job.run_id)
            if encoded is None or encoded[0] is not cached or cached[1] is None:
                rest.append(job)
                continue
            staged.append((job, rows.add(encoded, cached[1])))
        if len(rest) == len(jobs):
            return rest
        return rest if rows.write(conn) else None

    def _write_batch(self, jobs: list[_Job]) -> None:
        """In the writer thread: one transaction for the batch.  The commits
        encoded against the runs the store remembers are written together
        (:meth:`_write_together`); the others one by one, each decided before
        it writes anything (the compare-and-set ``UPDATE`` is its first write,
        and a refused one changes no row), so a refusal needs no savepoint to
        undo; any sqlite failure fails the whole batch.

        Sets every job's ``receipt`` or ``error``; never raises.
        """
        inject = self._inject.pop(0) if self._inject else None
        staged: list[tuple[_Job, _Written]] = []
        try:
            conn = self._connect()
            self._check_writable()
            self._begin_by(conn, max(job.deadline for job in jobs))
            rest = jobs
            if len(jobs) > 1:
                # A savepoint, not a new transaction: the write lock is kept
                conn.execute("SAVEPOINT together")
                together = self._write_together(conn, jobs, staged)
                if together is None:  # another writer moved a run on: decide each alone
                    conn.execute("ROLLBACK TO together")
                    self._cache.clear()
                    staged.clear()
                else:
                    rest = together
                conn.execute("RELEASE together")
            for job in rest:
                changes = conn.total_changes
                try:
                    written = self._apply_commit(conn, job)
                except Error as exc:
                    # A failure of the database fails the batch; one run's
                    # undecodable rows fail its own commit (nothing written).
                    if exc.error_class is ErrorClass.STORAGE_FAILED and not isinstance(
                        exc, CorruptRecord
                    ):
                        raise
                    if conn.total_changes != changes:  # pragma: no cover - a bug
                        raise _storage_failed(exc, "a refused commit wrote rows") from exc
                    job.error = exc  # refused before writing: nothing to undo
                    continue
                staged.append((job, written))
            if not staged:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                return
            if inject == "before":
                _injected_failure()
            self._check_identity()
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError, UnicodeDecodeError, Error) as exc:
            failure = (
                exc if isinstance(exc, Error) else _storage_failed(exc, "commit failed", self._path)
            )
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
        remember = self._remember
        for job, (remembered, rows) in staged:
            remember(job.run_id, remembered)
            rows_written += rows
            record = remembered[0].record
            job.receipt = Receipt(job.run_id, record.incarnation, record.revision)
        stats = self.stats
        stats["commits"] += len(staged)
        stats["batches"] += 1
        stats["part_rows"] += rows_written
        stats["last_part_rows"] = rows_written
        if inject == "after":
            lost = sqlite3.OperationalError("injected loss of the COMMIT acknowledgement")
            self._cache.clear()
            for job, _ in staged:
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
        check_arguments(
            run_id, incarnation=incarnation, expected_revision=expected_revision, events=events
        )
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        job = _Job(run_id, incarnation, expected_revision, record, tuple(events))
        deadline = trio.current_effective_deadline()
        if deadline != math.inf:  # as time.monotonic, which the writer thread reads
            deadline = time.monotonic() + (deadline - trio.current_time())
        job.deadline = deadline
        # Decide and encode here, against the run the store remembers: the
        # caller has just built the record, the writer thread then only writes.
        job.encoded = self._prepared(job)
        receipt: Receipt = await self._group.submit(job)
        return receipt

    async def _write_in_thread(self, batch: list[_Job]) -> None:
        """Have the writer thread write ``batch`` and wait it out, cancelled
        or not; afterwards every job has its receipt or error."""
        call = _Call(partial(self._write_batch, batch))
        if not _WAKE_PIPE:
            call.token = trio.lowlevel.current_trio_token()
            call.task = trio.lowlevel.current_task()
        try:
            self._submit(call)
        except BaseException as exc:  # the thread never got the batch
            failure = exc if isinstance(exc, Error) else _storage_failed(exc, "not attempted")
            for job in batch:
                job.error = failure
            return
        try:
            await self._wait(call)
        except trio.Cancelled:
            # A batch taken is waited out.  Cheaper than a shielded scope
            # around every batch: shield only once cancelled.  The cancelled
            # scope raises again at the caller's next checkpoint.
            with trio.CancelScope(shield=True):
                await self._wait(call)
        result = call.result
        if isinstance(result, outcome.Error):  # pragma: no cover - _write_batch never raises
            for job in batch:
                if job.receipt is None and job.error is None:
                    job.error = result.error

    async def _wait(self, call: _Call) -> None:
        """Until the writer thread has run ``call``: through the token when it
        has a task to reschedule (never interrupted), else on the wake pipe
        (where only a cancellation interrupts the wait)."""
        if call.task is not None:
            with contextlib.suppress(BaseException):  # the writer's outcome: in call.result
                await trio.lowlevel.wait_task_rescheduled(_no_abort)
            return
        wake = self._wake
        assert wake is not None
        while not call.done:
            await trio.lowlevel.wait_readable(wake[0])
            with contextlib.suppress(BlockingIOError):
                os.read(wake[0], 512)

    async def create(self, record: RunRecord) -> Receipt:
        """Store a new run at revision 0; ``resource_conflict`` if it exists."""
        prepare_create(record)
        head = head_fields(record)

        def write(conn: sqlite3.Connection) -> Receipt:
            self._check_writable()
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
                    (
                        record.run_id,
                        record.incarnation,
                        record.revision,
                        record.state,
                        join_head(head),
                    ),
                )
                if upserts:
                    conn.executemany(_UPSERT_PART, [(record.run_id, *row) for row in upserts])
                self._check_identity()  # (its COMMIT comes next)
            self._remember(record.run_id, (entry, None, head))
            return Receipt(record.run_id, record.incarnation, record.revision)

        return await self._run(write)

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        """Advance the run to ``incarnation`` atomically (STO-08): afterwards the
        old incarnation can never commit; ``resource_conflict`` unless it rises."""
        check_arguments(run_id, incarnation=incarnation)
        at = time.time()

        def write(conn: sqlite3.Connection) -> Receipt:
            self._check_writable()
            with _transaction(conn):
                stored = self._stored(conn, run_id)
                if stored is None:
                    raise _conflict("run does not exist", run_id)
                new, events = _kernel_fence(stored[0].record, incarnation, at=at)
                written = self._write(conn, stored, new, events)
                if written is None:  # pragma: no cover - the row was read under BEGIN IMMEDIATE
                    raise _conflict("stale revision", run_id)
                self._check_identity()  # (its COMMIT comes next)
            self._remember(run_id, written[0])
            return Receipt(run_id, new.incarnation, new.revision)

        return await self._run(write)
