"""``PostgresStore``: many hosts, one PostgreSQL database (psycopg 3).

Trio has no native PostgreSQL driver, so every database call runs a *sync*
psycopg connection in a worker thread (``trio.to_thread.run_sync``), bounded
by a ``trio.CapacityLimiter(max_connections)``.  The store keeps its own small
pool: a list of idle connections, never more than ``max_connections`` (one
per worker the limiter admits).  ``psycopg_pool`` would add a dependency and
background threads for what is a list and a lock here.

Tables (the layout the SQLite store shares; see ``_layout``)::

    runs(run_id PK, incarnation, revision, state, head)
    run_parts(run_id, part, key, value, PK(run_id, part, key))
    run_events(run_id, sequence, type, occurred_at, payload, PK(run_id, sequence))

JSON columns are ``text``, not ``jsonb``: the store never queries inside the
JSON, a reload must give back exactly the text ``_layout`` wrote (jsonb
would reorder keys and normalise numbers), and text skips the server-side
parse on every write.

A commit is one transaction: ``SELECT ... FOR UPDATE`` of the run row, the
shared compare-and-set decision (``prepare_commit``: identity and revision
only) against that row, an ``UPDATE ... WHERE run_id AND incarnation AND
revision`` whose row count is checked, then only the changed parts and the
new events with consecutive sequences.  The row lock serialises writers on
one run across hosts: a second writer waits, then sees the new revision and
gets ``resource_conflict`` (STO-10).  ``fence`` takes the same lock (STO-08).

The fast path: when the store remembers the run at the commit's incarnation
and expected revision, and the run's last event sequence, it skips the lock
read: the compare-and-set ``UPDATE`` (which takes the same row lock), the
part rows and the events go in one psycopg pipeline, then ``COMMIT``.  An
``UPDATE`` that matched no row, or an event sequence already taken, proves
the memory stale: the transaction rolls back and the commit is made the
locking way above, so the decision is always made against the stored row.

Group commit: concurrent commits on one store queue behind a leader task,
which takes one commit per run (sorted by run id, so hosts lock rows in one
order) and commits those of remembered runs together: one compare-and-set
``UPDATE`` of all their run rows, then one statement each for their part
rows, deleted parts and events (``unnest`` of arrays sent in binary), one
``COMMIT``.  A compare-and-set that matched no row or an event sequence
already taken rolls the whole group back (nothing written) and each of its
commits is then made alone, the locking way: a stale commit is refused by
itself, the others land.  A failed or unacknowledged group ``COMMIT`` is
``storage_failed`` for every commit in it.

Incremental commits use the same mechanism as ``SQLiteStore``
(``_layout.diff``): the store remembers, per run (LRU of ``_CACHE_RUNS``), the
``_layout.Entry`` of the last record it committed or loaded; a commit whose
locked row shows that entry's incarnation and revision diffs the new record
against it by identity and encodes only what changed, so commit 5 000 of a run
costs what commit 10 did.  Any other row (another host committed, the cache
was evicted) makes the commit read the record back from the database first.

Bounded calls.  A worker thread blocked in libpq cannot be cancelled, and a
network that stops forwarding (or a row lock another host never releases)
would hold it forever.  So every call has a deadline: its caller's effective
deadline (for a group-commit batch, the latest of its callers'), and at most
``operation_timeout`` seconds.  When it passes, a watchdog shuts the call's
socket down: the blocked call fails at once, ``storage_failed``, and its
connection is discarded (a commit whose ``COMMIT`` may have been sent is
then uncertain, as any lost acknowledgement is).  New connections get
``connect_timeout`` and TCP keepalives unless the DSN sets them; an idle
connection unused for a second is pinged before it is handed out, so one
dropped by a server restart is replaced rather than failing a call.  The
server's side is bounded too: it notices a shut socket only when it next
writes, so a session cut while waiting for a row lock would wait on
(holding the locks it took), and one whose client was partitioned away
would hold its transaction open until TCP gives up (two hours by default).
Every session therefore has ``lock_timeout`` and
``idle_in_transaction_session_timeout`` of ``operation_timeout``, and
server-side TCP keepalives of 10 s, every 5 s, 3 times: a cut lock wait
ends within ``operation_timeout``, and a host that went away is noticed
within about 25 s.  (PostgreSQL 15 does not arm the idle-in-transaction
timer after a pipeline, which the fast path ends with: there the
keepalives bound it.  A cancel request would end a lock wait sooner, but
libpq's blocks holding Python's lock until the server answers, which a
partitioned server never does.)

Errors: an ``Error`` from the decision passes through; a serialization
failure, deadlock or unique violation is ``resource_conflict``; any other
psycopg error or ``OSError`` is ``storage_failed`` with the cause chained
(STO-06).  psycopg is imported when a store is constructed, so
``import trio_backplane`` works without the ``postgres`` extra.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Final, TypeVar, final

import outcome
import trio

from .._numbers import is_seconds
from ..errors import Error, ErrorClass
from ..kernel import RunEvent, RunRecord, encode_event
from ..kernel import fence as kernel_fence
from ._group import GroupCommit, Job
from ._layout import (
    NOTHING,
    Deletes,
    Entry,
    Parts,
    Upserts,
    decode_stored,
    decode_stored_event,
    diff,
    encode_part,
    entry_of,
    head_text,
)
from ._protocol import (
    PreparedCommit,
    Receipt,
    RunSummary,
    check_arguments,
    check_states,
    prepare_commit,
    prepare_create,
)

__all__ = ["PostgresStore"]

_T = TypeVar("_T")

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: Runs whose last committed entry this store remembers (for the commit diff).
_CACHE_RUNS: Final = 256
#: SQLSTATEs a concurrent writer causes: serialization failure, deadlock,
#: unique violation.
_CONFLICT_STATES: Final = frozenset({"40001", "40P01", "23505"})
#: Connection settings a DSN gets unless it sets them: give up connecting
#: after 10 s; probe an idle TCP peer after 10 s, every 5 s, 3 times.
_CONNECT_DEFAULTS: Final = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
#: An idle connection unused this long is pinged before it is handed out.
_PING_AFTER_S: Final = 1.0


class _Flight:
    """One worker-thread call: the connection it uses, so the Trio side can
    cut the call at its deadline by shutting that connection's socket down
    (a blocked libpq read or write then fails at once)."""

    __slots__ = ("_lock", "conn", "cut", "deadline")

    def __init__(self, deadline: float) -> None:
        self._lock = threading.Lock()
        self.conn: Any = None
        self.cut = False
        #: ``time.monotonic()`` of the cut: connecting (no socket to shut
        #: down yet) is bounded by it through libpq's ``connect_timeout``
        self.deadline = deadline

    def attach(self, conn: Any) -> None:
        with self._lock:
            self.conn = conn
            if self.cut:
                _shut_down(conn)

    def detach(self) -> bool:
        """Stop sharing the connection; whether a cut reached it first."""
        with self._lock:
            reached = self.cut and self.conn is not None
            self.conn = None
            return reached

    def interrupt(self) -> None:
        with self._lock:
            self.cut = True
            if self.conn is not None:
                _shut_down(self.conn)


def _shut_down(conn: Any) -> None:
    """Shut ``conn``'s socket down (both ways), from any thread."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as dup:
            dup.shutdown(socket.SHUT_RDWR)


#: The call the current worker thread is making (set by ``_bounded``).
_THREAD = threading.local()


def _import_psycopg() -> Any:
    try:
        return importlib.import_module("psycopg")
    except ImportError as exc:
        raise Error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "PostgresStore needs psycopg: install the 'postgres' extra "
            "(pip install 'trio_backplane[postgres]')",
            {"extra": "postgres"},
        ) from exc


class _SimulatedFailure(OSError):
    """What the test hooks raise inside a commit (an I/O failure)."""


class _Job(Job):
    """One ``commit`` call, queued for a batch, with its caller's deadline."""

    __slots__ = ("deadline",)
    deadline: float


@final
class PostgresStore:
    """Run records in PostgreSQL, shared by many hosts.

    ``schema`` puts the tables in that PostgreSQL schema (created if missing),
    so stores on one database can be isolated; by default the tables are
    unqualified and land in the connection's ``search_path``.
    ``operation_timeout`` bounds every database call, in seconds (its
    caller's deadline bounds it too): past it the call is cut and fails with
    ``storage_failed``.  With ``create_tables=False`` the store creates
    nothing: where its tables are missing, every call fails with
    ``not_found`` (an inspector pointed at another database never adds
    tables to it).
    """

    durable = True

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 4,
        schema: str | None = None,
        operation_timeout: float = 60.0,
        create_tables: bool = True,
    ) -> None:
        if type(create_tables) is not bool:
            raise Error(ErrorClass.VALIDATION, "create_tables must be a bool")
        if type(max_connections) is not int or max_connections < 1:
            raise Error(ErrorClass.VALIDATION, "max_connections must be a positive int")
        if not is_seconds(operation_timeout):
            raise Error(ErrorClass.VALIDATION, "operation_timeout must be a positive number")
        if schema is not None and (not _SCHEMA_NAME.fullmatch(schema) or schema.startswith("pg_")):
            raise Error(
                ErrorClass.VALIDATION,
                "schema must be a lower-case SQL identifier not starting with pg_"
                " (PostgreSQL reserves those)",
                {"schema": repr(schema)[:100]},
            )
        self._psycopg = _import_psycopg()
        self._dsn = dsn
        self._operation_timeout = float(operation_timeout)
        # (PostgreSQL takes at most 2**31 - 1 ms, about 24.8 days)
        ms = min(math.ceil(self._operation_timeout * 1000), 2**31 - 1)
        self._session_settings = (
            "SET extra_float_digits = 3;"
            f" SET lock_timeout = {ms};"
            f" SET idle_in_transaction_session_timeout = {ms};"
            " SET tcp_keepalives_idle = 10;"
            " SET tcp_keepalives_interval = 5;"
            " SET tcp_keepalives_count = 3"
        )
        self._ping_after = _PING_AFTER_S
        try:
            given = self._psycopg.conninfo.conninfo_to_dict(dsn)
        except self._psycopg.Error as exc:
            raise Error(ErrorClass.VALIDATION, "dsn is not a PostgreSQL connection string") from exc
        self._connect_options = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given}
        #: the DSN's own connect_timeout, if any (0 or absent: none)
        try:
            self._connect_timeout = int(given.get("connect_timeout") or 0)
        except ValueError:
            raise Error(
                ErrorClass.VALIDATION, "dsn connect_timeout must be a whole number of seconds"
            ) from None
        self._schema = schema
        self._create_tables = create_tables
        self._max_connections = max_connections
        self._limiter = trio.CapacityLimiter(max_connections)
        self._lock = threading.Lock()  # guards _idle, _cache, _closed, hooks
        self._idle: list[tuple[Any, float]] = []  # (connection, idle since)
        self._cache: OrderedDict[str, Entry] = OrderedDict()
        #: run -> (incarnation, revision, last event sequence) after a commit
        #: this store made or saw: a hint the fast path proves by its
        #: compare-and-set (and the events' primary key), never trusted alone.
        self._sequences: dict[str, tuple[int, int, int]] = {}
        self._closed = False
        self._ready = False
        self._ready_lock = trio.Lock()
        self._fail_next: str | None = None  # None, "before" or "after" the commit
        #: For a thread whose connection slot its caller holds already.
        self._slot_held = trio.CapacityLimiter(math.inf)
        self._group: GroupCommit[_Job] = GroupCommit(self._commit_in_thread, self._limiter)
        self._sql = self._statements()
        self._rendered = False
        #: Diagnostics and tests: ``commits`` (acknowledged), ``batches``
        #: (transactions that committed several runs' commits), ``fast_commits``
        #: (of those, made without the row lock read), ``part_rows``
        #: (part rows upserted or deleted), ``last_part_rows`` and
        #: ``last_bytes`` (head and part text written) of the last commit.
        self.stats: dict[str, int] = {
            "commits": 0,
            "batches": 0,
            "fast_commits": 0,
            "part_rows": 0,
            "last_part_rows": 0,
            "last_bytes": 0,
        }

    @property
    def schema(self) -> str | None:
        """The PostgreSQL schema holding the tables (``None``: the search path)."""
        return self._schema

    # -- SQL ---------------------------------------------------------------------

    def _statements(self) -> dict[str, Any]:
        sql = self._psycopg.sql

        def table(name: str) -> Any:
            if self._schema is None:
                return sql.Identifier(name)
            return sql.Identifier(self._schema, name)

        names = {
            "runs": table("runs"),
            "parts": table("run_parts"),
            "events": table("run_events"),
        }

        def q(text: str) -> Any:
            return sql.SQL(text).format(**names)

        statements = {
            "runs": q(
                "CREATE TABLE IF NOT EXISTS {runs} ("
                " run_id text PRIMARY KEY,"
                " incarnation bigint NOT NULL,"
                " revision bigint NOT NULL,"
                " state text NOT NULL,"
                " head text NOT NULL)"
            ),
            "run_parts": q(
                "CREATE TABLE IF NOT EXISTS {parts} ("
                " run_id text NOT NULL,"
                " part text NOT NULL,"
                " key text NOT NULL,"
                " value text NOT NULL,"
                " PRIMARY KEY (run_id, part, key))"
            ),
            "run_events": q(
                "CREATE TABLE IF NOT EXISTS {events} ("
                " run_id text NOT NULL,"
                " sequence bigint NOT NULL,"
                " type text NOT NULL,"
                " occurred_at double precision NOT NULL,"
                " payload text NOT NULL,"
                " PRIMARY KEY (run_id, sequence))"
            ),
            "insert_run": q(
                "INSERT INTO {runs} (run_id, incarnation, revision, state, head)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING"
            ),
            "lock_run": q(
                "SELECT incarnation, revision, state, head FROM {runs} WHERE run_id = %s FOR UPDATE"
            ),
            "read_run": q(
                "SELECT incarnation, revision, state, head FROM {runs} WHERE run_id = %s"
            ),
            "update_run": q(
                "UPDATE {runs} SET incarnation = %s, revision = %s, state = %s, head = %s"
                " WHERE run_id = %s AND incarnation = %s AND revision = %s"
            ),
            "read_parts": q("SELECT part, key, value FROM {parts} WHERE run_id = %s"),
            "upsert_part": q(
                "INSERT INTO {parts} (run_id, part, key, value) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (run_id, part, key) DO UPDATE SET value = EXCLUDED.value"
            ),
            "delete_part": q("DELETE FROM {parts} WHERE run_id = %s AND part = %s AND key = %s"),
            "last_sequence": q("SELECT coalesce(max(sequence), 0) FROM {events} WHERE run_id = %s"),
            "insert_event": q(
                "INSERT INTO {events} (run_id, sequence, type, occurred_at, payload)"
                " VALUES (%s, %s, %s, %s, %s)"
            ),
            "read_events": q(
                "SELECT sequence, type, occurred_at, payload FROM {events}"
                " WHERE run_id = %s AND sequence > %s ORDER BY sequence"
            ),
            "list_runs": q(
                "SELECT run_id, incarnation, revision, state FROM {runs} ORDER BY run_id"
            ),
            "list_runs_in": q(
                "SELECT run_id, incarnation, revision, state FROM {runs}"
                " WHERE state = ANY(%s) ORDER BY run_id"
            ),
            # A group's statements: one per kind of row, whatever its size.
            "update_runs": q(
                "UPDATE {runs} AS r SET incarnation = v.incarnation, revision = v.revision,"
                " state = v.state, head = v.head"
                " FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::text[], %b::text[],"
                " %b::bigint[], %b::bigint[])"
                " AS v(run_id, incarnation, revision, state, head, old_incarnation, old_revision)"
                " WHERE r.run_id = v.run_id AND r.incarnation = v.old_incarnation"
                " AND r.revision = v.old_revision RETURNING r.run_id"
            ),
            "upsert_parts": q(
                "INSERT INTO {parts} (run_id, part, key, value)"
                " SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[])"
                " ON CONFLICT (run_id, part, key) DO UPDATE SET value = EXCLUDED.value"
            ),
            "delete_parts": q(
                "DELETE FROM {parts} AS p"
                " USING unnest(%b::text[], %b::text[], %b::text[]) AS d(run_id, part, key)"
                " WHERE p.run_id = d.run_id AND p.part = d.part AND p.key = d.key"
            ),
            "insert_events": q(
                "INSERT INTO {events} (run_id, sequence, type, occurred_at, payload)"
                " SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[],"
                " %b::double precision[], %b::text[])"
            ),
        }
        if self._schema is not None:
            statements["schema"] = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self._schema)
            )
        # Whether every table exists, found as the statements find them (in
        # the schema, or along the search path): quoted as identifiers.
        quoted = [
            ".".join('"' + part + '"' for part in (self._schema, name) if part is not None)
            for name in ("runs", "run_parts", "run_events")
        ]
        statements["laid_out"] = sql.SQL(
            "SELECT to_regclass({}) IS NOT NULL AND to_regclass({}) IS NOT NULL"
            " AND to_regclass({}) IS NOT NULL"
        ).format(*map(sql.Literal, quoted))
        return statements

    # -- connections and errors (worker threads) ---------------------------------

    def _checkout(self, flight: _Flight | None) -> Any:
        while True:
            with self._lock:
                if self._closed:
                    raise Error(ErrorClass.STORAGE_FAILED, "the store is closed")
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            if conn.closed or conn.broken:
                continue
            if flight is not None:
                flight.attach(conn)
            if time.monotonic() - since < self._ping_after or self._alive(conn):
                return conn
            conn.close()  # dropped while idle (a server restart): a new one
        options = self._connect_options
        if flight is not None:  # connect within the call's deadline (libpq: 2 s at least)
            left = max(2, math.ceil(flight.deadline - time.monotonic()))
            given = int(options.get("connect_timeout") or self._connect_timeout or left)
            options = {**options, "connect_timeout": str(min(left, given))}
        conn = self._psycopg.connect(self._dsn, autocommit=False, **options)
        if flight is not None:
            flight.attach(conn)
        # Event times are double precision read back as text: every digit,
        # whatever the server's, role's or database's default says.  And the
        # server bounds its side as the watchdog bounds ours (see the module
        # docstring): a session whose client was cut or partitioned away
        # releases its row locks.
        try:
            conn.execute(self._session_settings)
            conn.commit()
        except BaseException:
            conn.close()  # never left open, never pooled
            raise
        if not self._rendered:
            self._render(conn)
        return conn

    def _alive(self, conn: Any) -> bool:
        """One empty query on the wire (no transaction starts): whether the
        server still answers on ``conn``."""
        pq = self._psycopg.pq
        try:
            result = conn.pgconn.exec_(b"")
        except Exception:
            return False
        return bool(
            result.status == pq.ExecStatus.EMPTY_QUERY and conn.pgconn.status == pq.ConnStatus.OK
        )

    def _render(self, conn: Any) -> None:
        """Turn the composed statements into plain text, once, with the first
        connection's quoting: a ``sql.Composed`` is rendered again on every
        execute (a fifth of a group commit's client time)."""
        rendered = {name: query.as_string(conn) for name, query in self._sql.items()}
        with self._lock:
            self._sql = rendered
            self._rendered = True

    def _checkin(self, conn: Any) -> None:
        healthy = (
            not conn.closed
            and not conn.broken
            and conn.info.transaction_status == self._psycopg.pq.TransactionStatus.IDLE
        )
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self._max_connections:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def _classify(self, exc: BaseException) -> Error:
        if isinstance(exc, Error):
            return exc
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate in _CONFLICT_STATES:
            return Error(
                ErrorClass.RESOURCE_CONFLICT,
                "a concurrent writer won",
                {"sqlstate": sqlstate, "cause": _describe(exc)},
            )
        return Error(
            ErrorClass.STORAGE_FAILED, "PostgreSQL store failed", {"cause": _describe(exc)}
        )

    @contextlib.contextmanager
    def _checked_out(self) -> Iterator[Any]:
        """A pooled connection for one transaction (worker thread): rolled
        back if the body raises, back in the pool afterwards."""
        flight: _Flight | None = getattr(_THREAD, "flight", None)
        conn = self._checkout(flight)
        try:
            yield conn
        except BaseException:
            if not conn.closed and not conn.broken:
                try:
                    conn.rollback()
                except Exception:  # the original error is the one to report
                    conn.close()
            raise
        finally:
            # A late cut never reaches a pooled connection; one that came
            # just before (its call had succeeded) shut its socket down:
            # that connection is closed, never pooled for the next call.
            if flight is not None and flight.detach():
                conn.close()
            self._checkin(conn)

    def _transaction(self, body: Callable[[Any], _T]) -> _T:
        """Run ``body(conn)`` in one transaction and commit it (worker thread)."""
        try:
            with self._checked_out() as conn:
                result = body(conn)
                conn.commit()
            return result
        except Error:
            raise
        except (self._psycopg.Error, OSError) as exc:
            flight: _Flight | None = getattr(_THREAD, "flight", None)
            if flight is not None and flight.cut:
                raise Error(
                    ErrorClass.STORAGE_FAILED,
                    "PostgreSQL call cut at its deadline",
                    {"cause": _describe(exc), "operation_timeout": self._operation_timeout},
                ) from exc
            raise self._classify(exc) from exc

    async def _bounded(
        self, fn: Callable[..., _T], *args: Any, limiter: Any, deadline: float
    ) -> _T:
        """``fn(*args)`` in a worker thread, waited out whatever happens (a
        cancelled caller learns of it once the call has ended), and cut at
        ``deadline``, at most ``operation_timeout`` from now: a watchdog
        shuts the call's socket down, so the call fails rather than hangs."""
        now = trio.current_time()
        deadline = min(deadline, now + self._operation_timeout)
        flight = _Flight(time.monotonic() + (deadline - now))
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        result: list[outcome.Outcome[_T]] = []

        def run() -> _T:
            _THREAD.flight = flight
            try:
                return fn(*args)
            finally:
                _THREAD.flight = None

        def deliver(value: outcome.Outcome[_T]) -> None:
            result.append(value)
            with contextlib.suppress(trio.RunFinishedError):  # nobody waits any more
                token.run_sync_soon(done.set)

        async with limiter:  # cancellable while waiting: nothing started yet
            trio.lowlevel.start_thread_soon(run, deliver)
            with trio.CancelScope(shield=True, deadline=deadline):
                await done.wait()
            if not done.is_set():
                flight.interrupt()
                with trio.CancelScope(shield=True):
                    await done.wait()
        return result[0].unwrap()

    async def _run(self, body: Callable[[Any], _T]) -> _T:
        await self._ensure_schema()
        return await self._in_thread(body)

    async def _in_thread(self, body: Callable[[Any], _T]) -> _T:
        # Never abandoned: a cancelled caller waits for its transaction to end,
        # so nothing commits behind its back after it has moved on; the wait
        # is bounded by the caller's deadline and operation_timeout.
        return await self._bounded(
            self._transaction,
            body,
            limiter=self._limiter,
            deadline=trio.current_effective_deadline(),
        )

    async def _ensure_schema(self) -> None:
        if not self._ready:
            async with self._ready_lock:
                if not self._ready:  # another task may have made it meanwhile
                    await self._in_thread(self._create_schema)
                    self._ready = True

    def _create_schema(self, conn: Any) -> None:
        # Tables made already (by a migration, another host or an earlier
        # run) are used as they are: CREATE ... IF NOT EXISTS needs the CREATE
        # privilege even when nothing is to be made, and a host's role may
        # well have only SELECT, INSERT, UPDATE and DELETE on them.
        if conn.execute(self._sql["laid_out"]).fetchone()[0]:
            return
        if not self._create_tables:
            raise Error(
                ErrorClass.NOT_FOUND,
                "not a trio_backplane store: its tables are missing",
                {"reason": "not_a_store", "schema": self._schema},
            )
        # CREATE ... IF NOT EXISTS races with itself in PostgreSQL (a unique
        # violation in the catalog): serialise schema creation across hosts.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (0x7472696F,))
        if "schema" in self._sql:
            conn.execute(self._sql["schema"])
        for name in ("runs", "run_parts", "run_events"):
            conn.execute(self._sql[name])

    # -- the run entry cache (worker threads) --------------------------------------

    def _read_record(self, conn: Any, run_id: str, head: str) -> tuple[RunRecord, frozenset[str]]:
        """The stored record and the lists its head holds inline."""
        rows = conn.execute(self._sql["read_parts"], (run_id,)).fetchall()
        parts: Parts = {(part, key): value for part, key, value in rows}
        return decode_stored(run_id, head, parts)

    def _entry(self, conn: Any, run_id: str, incarnation: int, revision: int, head: str) -> Entry:
        """The stored run whose locked row is ``(incarnation, revision, head)``:
        the cached entry when it is that revision, else read from the database."""
        with self._lock:
            entry = self._cache.get(run_id)
            if entry is not None:
                self._cache.move_to_end(run_id)
        if (
            entry is not None
            and entry.record.incarnation == incarnation
            and entry.record.revision == revision
        ):
            return entry
        return entry_of(*self._read_record(conn, run_id, head))

    def _remember(self, entry: Entry) -> None:
        """Cache ``entry`` unless a later revision of its run is cached already."""
        record = entry.record
        with self._lock:
            cached = self._cache.get(record.run_id)
            if cached is not None and (cached.record.incarnation, cached.record.revision) > (
                record.incarnation,
                record.revision,
            ):
                return
            self._cache[record.run_id] = entry
            self._cache.move_to_end(record.run_id)
            while len(self._cache) > _CACHE_RUNS:
                self._cache.popitem(last=False)

    def _forget(self, run_id: str) -> None:
        with self._lock:
            self._cache.pop(run_id, None)
            self._sequences.pop(run_id, None)

    def _sequenced(self, record: RunRecord, last: int) -> None:
        """Remember that ``record``'s revision ends the run's events at ``last``."""
        with self._lock:
            self._sequences[record.run_id] = (record.incarnation, record.revision, last)
            while len(self._sequences) > _CACHE_RUNS:
                del self._sequences[next(iter(self._sequences))]

    def _write(
        self,
        conn: Any,
        run_id: str,
        upserts: Upserts,
        deletes: Deletes,
        events: Sequence[dict[str, Any]],
        *,
        last: int | None = None,
    ) -> int | None:
        """Write the part rows and the events after sequence ``last`` (read
        when not given); returns the run's last sequence (``None`` when no
        event was written and ``last`` was not given)."""
        if upserts:
            with conn.cursor() as cur:
                cur.executemany(
                    self._sql["upsert_part"],
                    [(run_id, part, key, value) for part, key, value in upserts],
                )
        if deletes:
            with conn.cursor() as cur:
                cur.executemany(
                    self._sql["delete_part"], [(run_id, part, key) for part, key in deletes]
                )
        if events:
            if last is None:
                row = conn.execute(self._sql["last_sequence"], (run_id,)).fetchone()
                last = int(row[0])
            with conn.cursor() as cur:
                cur.executemany(
                    self._sql["insert_event"],
                    [
                        (
                            run_id,
                            last + index,
                            data["type"],
                            data["occurred_at"],
                            encode_part(data["payload"]),
                        )
                        for index, data in enumerate(events, start=1)
                    ],
                )
            last += len(events)
        return last

    def _replace(
        self,
        conn: Any,
        old: Entry,
        new: RunRecord,
        events: Sequence[dict[str, Any]],
    ) -> tuple[Entry, int, int, int | None]:
        """Compare-and-set ``old`` -> ``new`` under the row lock: the run row,
        the changed parts and the events.  Returns ``new``'s entry, the part
        rows written, the bytes of head and part text written and the run's
        last event sequence (``None``: no event written)."""
        cur, written = self._send(conn, old, new, events)
        if cur.rowcount != 1:  # cannot happen under the row lock; never trust it
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "stale revision",
                {"run_id": new.run_id, "expected": old.record.revision},
            )
        return written

    def _send(
        self,
        conn: Any,
        old: Entry,
        new: RunRecord,
        events: Sequence[dict[str, Any]],
        *,
        last: int | None = None,
    ) -> tuple[Any, tuple[Entry, int, int, int | None]]:
        """Send the compare-and-set ``UPDATE`` of ``old`` -> ``new``, the changed
        parts and the events (after sequence ``last``, read when not given):
        the ``UPDATE``'s cursor (its row count says whether it applied) and
        what :meth:`_replace` returns."""
        entry, upserts, deletes = diff(old, new)
        head = head_text(new)
        cur = conn.execute(
            self._sql["update_run"],
            (
                new.incarnation,
                new.revision,
                new.state,
                head,
                new.run_id,
                old.record.incarnation,
                old.record.revision,
            ),
        )
        last = self._write(conn, new.run_id, upserts, deletes, events, last=last)
        size = len(head) + sum(len(r[2]) for r in upserts)
        return cur, (entry, len(upserts) + len(deletes), size, last)

    def _take_failure(self) -> str | None:
        with self._lock:
            failure, self._fail_next = self._fail_next, None
            return failure

    # -- the protocol --------------------------------------------------------------

    async def create(self, record: RunRecord) -> Receipt:
        prepare_create(record)
        entry, upserts, _ = diff(NOTHING, record)
        head = head_text(record)

        def body(conn: Any) -> Receipt:
            cur = conn.execute(
                self._sql["insert_run"],
                (record.run_id, record.incarnation, record.revision, record.state, head),
            )
            if cur.rowcount != 1:
                raise Error(
                    ErrorClass.RESOURCE_CONFLICT, "run already exists", {"run_id": record.run_id}
                )
            self._write(conn, record.run_id, upserts, [], ())
            return Receipt(record.run_id, record.incarnation, record.revision)

        receipt = await self._run(body)
        self._remember(entry)
        self._sequenced(record, 0)
        return receipt

    async def load(self, run_id: str) -> RunRecord | None:
        check_arguments(run_id)

        def body(conn: Any) -> tuple[RunRecord, frozenset[str]] | None:
            # One snapshot for the head and its parts: never a torn record.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = conn.execute(self._sql["read_run"], (run_id,)).fetchone()
            if row is None:
                return None
            return self._read_record(conn, run_id, row[3])

        read = await self._run(body)
        if read is None:
            self._forget(run_id)
            return None
        record, inline = read
        self._remember(entry_of(record, inline))
        return record

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        """Compare-and-set on ``(run_id, incarnation, expected_revision)``
        (STO-01..05), group-committed with this store's concurrent callers:
        one batch in flight, one transaction per batch (see the module)."""
        check_arguments(
            run_id, incarnation=incarnation, expected_revision=expected_revision, events=events
        )
        await self._ensure_schema()
        job = _Job(run_id, incarnation, expected_revision, record, events)
        job.deadline = trio.current_effective_deadline()
        receipt: Receipt = await self._group.submit(job)
        return receipt

    async def _commit_in_thread(self, batch: list[_Job]) -> None:
        # The leader holds a connection slot already (the group's ``slot``,
        # waited for before the batch was taken).  Never abandoned: a taken
        # batch is waited out, cancelled or not, so every job learns its
        # outcome, and no caller's cancellation reaches another's commit.
        # Cut once every caller's deadline has passed (or operation_timeout).
        deadline = max(job.deadline for job in batch)
        with trio.CancelScope(shield=True):
            await self._bounded(
                self._commit_batch, batch, limiter=self._slot_held, deadline=deadline
            )

    def _commit_batch(self, jobs: list[Job]) -> None:
        """In a worker thread: every job gets its receipt or error.  Jobs on
        remembered runs share one transaction (:meth:`_commit_together`); the
        others, and any the shared transaction could not prove, commit one by
        one as a single commit would."""
        jobs.sort(key=lambda job: job.run_id)  # one row-lock order across hosts
        for job in self._commit_together(jobs) if len(jobs) > 1 else jobs:
            try:
                job.receipt = self._transaction(partial(self._commit_one, job))
            except Error as exc:
                job.error = exc
            except BaseException as exc:  # pragma: no cover - a bug: never half-acknowledge
                job.error = Error(
                    ErrorClass.STORAGE_FAILED, "commit failed", {"cause": _describe(exc)}
                )

    def _commit_one(self, job: Job, conn: Any) -> Receipt:
        """One commit in its own transaction: the fast path, else the row lock."""
        run_id, incarnation, expected = job.run_id, job.incarnation, job.expected_revision
        fast = self._commit_fast(conn, job)
        if fast is not None:
            return fast
        row = conn.execute(self._sql["lock_run"], (run_id,)).fetchone()
        # The decision needs only the locked row's identity and revision.
        stored = None
        if row is not None:
            stored = RunRecord(run_id=run_id, incarnation=row[0], revision=row[1])
        prepared = prepare_commit(
            stored,
            run_id,
            incarnation=incarnation,
            expected_revision=expected,
            record=job.record,
            events=job.events,
        )
        assert row is not None  # prepare_commit refuses a missing run
        stored_incarnation, stored_revision, _state, stored_head = row
        old = self._entry(conn, run_id, stored_incarnation, stored_revision, stored_head)
        entry, rows, size, last = self._replace(conn, old, prepared.record, prepared.events)
        return self._finish_commit(conn, entry, rows, size, last)

    def _commit_together(self, jobs: list[Job]) -> list[Job]:
        """Group commit: the commits of remembered runs (the fast path's
        condition) share one transaction of a few statements, one per kind of
        row (``unnest`` of arrays): the compare-and-set ``UPDATE`` of every
        run row first, then the part rows, the deleted parts and the events.
        Returns the jobs still to commit one by one: runs not remembered, and
        every job of the group when any compare-and-set matched no row or an
        event sequence was taken (rolled back: nothing of it was written)."""
        alone: list[Job] = []
        group: list[tuple[Job, Entry, RunRecord, Any, int]] = []
        for job in jobs:
            try:
                decided = self._decided(job)
                if decided is None:
                    alone.append(job)
                    continue
                cached, prepared, last = decided
                record = prepared.record
                # Encoded here, job by job: a record no store can hold (a NUL
                # in a key, ...) is refused alone, never with its batch.
                encoded = (
                    *diff(cached, record),
                    head_text(record),
                    [encode_part(data["payload"]) for data in prepared.events],
                )
            except Error as exc:
                job.error = exc  # decided against: nothing to send
                continue
            group.append((job, cached, record, (prepared.events, *encoded), last))
        if len(group) < 2:
            return alone + [item[0] for item in group]
        runs: list[list[Any]] = [[] for _ in range(7)]
        parts: list[list[Any]] = [[] for _ in range(4)]
        gone: list[list[Any]] = [[] for _ in range(3)]
        events: list[list[Any]] = [[] for _ in range(5)]
        written: list[tuple[Job, tuple[Entry, int, int, int | None]]] = []
        for job, cached, record, encoded, last in group:
            new_events, entry, upserts, deletes, head, payloads = encoded
            old = cached.record
            row = (record.run_id, record.incarnation, record.revision, record.state, head)
            for column, value in zip(runs, (*row, old.incarnation, old.revision), strict=True):
                column.append(value)
            for part, key, value in upserts:
                for column, item in zip(parts, (record.run_id, part, key, value), strict=True):
                    column.append(item)
            for part, key in deletes:
                for column, item in zip(gone, (record.run_id, part, key), strict=True):
                    column.append(item)
            for sequence, (data, payload) in enumerate(
                zip(new_events, payloads, strict=True), last + 1
            ):
                event = (record.run_id, sequence, data["type"], data["occurred_at"], payload)
                for column, item in zip(events, event, strict=True):
                    column.append(item)
            size = len(head) + sum(len(r[2]) for r in upserts)
            end = last + len(new_events) if new_events else None
            written.append((job, (entry, len(upserts) + len(deletes), size, end)))
        psycopg = self._psycopg
        try:
            with self._checked_out() as conn:
                try:
                    # Arrays go in binary (%b): no per-item quoting of JSON text.
                    cur = conn.execute(self._sql["update_runs"], runs)
                    updated = {r[0] for r in cur.fetchall()}
                    stale = [job for job, *_ in group if job.run_id not in updated]
                    if not stale:
                        with conn.pipeline():
                            if parts[0]:
                                conn.execute(self._sql["upsert_parts"], parts)
                            if gone[0]:
                                conn.execute(self._sql["delete_parts"], gone)
                            if events[0]:
                                conn.execute(self._sql["insert_events"], events)
                except psycopg.Error as exc:
                    # Before the COMMIT nothing is written: a deadlock with
                    # another host's group, a serialization failure or a
                    # taken event sequence is settled commit by commit.
                    conn.rollback()
                    if isinstance(exc, psycopg.errors.UniqueViolation):
                        for job, *_ in group:
                            self._forget(job.run_id)  # a sequence hint was stale
                    return alone + [item[0] for item in group]
                if stale:
                    conn.rollback()  # another host moved these runs on
                    for job in stale:
                        self._forget(job.run_id)
                    return alone + [item[0] for item in group]
                failure = self._commit_transaction(conn)
        except (Error, psycopg.Error, OSError) as exc:
            # The COMMIT failed, or its acknowledgement was lost: never success.
            error = self._classify(exc)
            if error.error_class is not ErrorClass.STORAGE_FAILED:
                error = Error(ErrorClass.STORAGE_FAILED, error.message, error.details)
            for job, *_ in group:
                job.error = error
            return alone
        with self._lock:
            self.stats["batches"] += 1
        for job, result in written:
            job.receipt = self._acknowledged(*result, fast=True)
        if failure == "after":
            lost = Error(
                ErrorClass.STORAGE_FAILED,
                "PostgreSQL store failed",
                {"cause": "simulated lost acknowledgement after the commit"},
            )
            for job, *_ in group:
                job.receipt = None
                job.error = lost
        return alone

    def _finish_commit(
        self,
        conn: Any,
        entry: Entry,
        rows: int,
        size: int,
        last: int | None,
        *,
        fast: bool = False,
    ) -> Receipt:
        """COMMIT the written transaction and remember the run (test hooks:
        a failure before the COMMIT, or a lost acknowledgement after it)."""
        failure = self._commit_transaction(conn)
        receipt = self._acknowledged(entry, rows, size, last, fast=fast)
        if failure == "after":
            raise _SimulatedFailure("simulated lost acknowledgement after the commit")
        return receipt

    def _commit_transaction(self, conn: Any) -> str | None:
        """COMMIT, unless a test asked for a failure before it; returns the
        test hook still to apply ("after": the acknowledgement is lost)."""
        failure = self._take_failure()
        if failure == "before":
            raise _SimulatedFailure("simulated failure before the commit")
        conn.commit()
        return failure

    def _acknowledged(
        self, entry: Entry, rows: int, size: int, last: int | None, *, fast: bool = False
    ) -> Receipt:
        """A committed record: remember it and its last event sequence."""
        record = entry.record
        self._remember(entry)
        if last is not None:
            self._sequenced(record, last)
        else:
            with self._lock:
                known = self._sequences.get(record.run_id)
            if known is not None and known[:2] == (record.incarnation, record.revision - 1):
                self._sequenced(record, known[2])  # no event: the sequence carries over
        with self._lock:
            self.stats["commits"] += 1
            self.stats["fast_commits"] += fast
            self.stats["part_rows"] += rows
            self.stats["last_part_rows"] = rows
            self.stats["last_bytes"] = size
        return Receipt(record.run_id, record.incarnation, record.revision)

    def _decided(self, job: Job) -> tuple[Entry, PreparedCommit, int] | None:
        """``job`` decided against the run this store remembers, with the run's
        last event sequence, when it remembers the run at the job's
        incarnation and expected revision (``None`` otherwise: the stored row
        decides).  ``Error`` from the decision passes through."""
        with self._lock:
            cached = self._cache.get(job.run_id)
            known = self._sequences.get(job.run_id)
        identity = (job.incarnation, job.expected_revision)
        if (
            cached is None
            or known is None
            or (cached.record.incarnation, cached.record.revision) != identity
            or known[:2] != identity
        ):
            return None
        prepared = prepare_commit(
            cached.record,
            job.run_id,
            incarnation=job.incarnation,
            expected_revision=job.expected_revision,
            record=job.record,
            events=job.events,
        )
        return cached, prepared, known[2]

    def _commit_fast(self, conn: Any, job: Job) -> Receipt | None:
        """The commit in two round trips when :meth:`_decided` can decide it:
        the compare-and-set ``UPDATE``, the part rows and the events go in one
        pipeline, then ``COMMIT``.  An ``UPDATE`` that matched no row (another
        host moved the run on) or an event sequence already taken rolls back
        and returns ``None``: the commit is then made the locking way.
        ``Error`` from the decision passes through (nothing was sent)."""
        decided = self._decided(job)
        if decided is None:
            return None
        cached, prepared, last = decided
        run_id = job.run_id
        try:
            with conn.pipeline():
                cur, written = self._send(conn, cached, prepared.record, prepared.events, last=last)
        except self._psycopg.errors.UniqueViolation:
            conn.rollback()  # an event sequence was taken: the hint was stale
            self._forget(run_id)
            return None
        if cur.rowcount != 1:
            conn.rollback()
            self._forget(run_id)
            return None
        return self._finish_commit(conn, *written, fast=True)

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        check_arguments(run_id, incarnation=incarnation)
        at = time.time()

        def body(conn: Any) -> tuple[Receipt, Entry, int | None]:
            row = conn.execute(self._sql["lock_run"], (run_id,)).fetchone()
            if row is None:
                raise Error(ErrorClass.RESOURCE_CONFLICT, "run does not exist", {"run_id": run_id})
            stored_incarnation, stored_revision, _state, stored_head = row
            old = self._entry(conn, run_id, stored_incarnation, stored_revision, stored_head)
            new, events = kernel_fence(old.record, incarnation, at=at)
            entry, _, _, last = self._replace(conn, old, new, [encode_event(e) for e in events])
            return Receipt(run_id, new.incarnation, new.revision), entry, last

        receipt, entry, last = await self._run(body)
        self._remember(entry)
        if last is not None:
            self._sequenced(entry.record, last)
        return receipt

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        check_states(states)

        def body(conn: Any) -> list[tuple[Any, ...]]:
            if states is None:
                rows = conn.execute(self._sql["list_runs"]).fetchall()
            else:
                rows = conn.execute(self._sql["list_runs_in"], (list(states),)).fetchall()
            return [tuple(row) for row in rows]

        rows = await self._run(body)
        return [RunSummary(str(r[0]), int(r[1]), int(r[2]), str(r[3])) for r in rows]

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        check_arguments(run_id, after=after)

        def body(conn: Any) -> list[tuple[Any, ...]]:
            rows = conn.execute(self._sql["read_events"], (run_id, after)).fetchall()
            return [tuple(row) for row in rows]

        rows = await self._run(body)
        return [
            decode_stored_event(run_id, (int(sequence), type_, occurred_at, payload))
            for sequence, type_, occurred_at, payload in rows
        ]

    # -- lifetime ------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the idle connections; busy ones close when their call ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = [conn for conn, _ in self._idle], []
        if idle:
            await trio.to_thread.run_sync(_close_all, idle)

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- test hooks ----------------------------------------------------------------

    def _fail_next_commit(self) -> None:
        """The next commit raises ``storage_failed`` and persists nothing."""
        with self._lock:
            self._fail_next = "before"

    def _lose_next_ack(self) -> None:
        """The next commit persists, then raises ``storage_failed`` (a lost
        acknowledgement: ``load`` shows the new revision)."""
        with self._lock:
            self._fail_next = "after"


def _close_all(connections: list[Any]) -> None:
    for conn in connections:
        conn.close()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]
