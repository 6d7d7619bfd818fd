"""``PostgresStore``: many hosts, one PostgreSQL database (psycopg 3).

The tables are the SQLite store's (``_layout``), with ``text`` JSON columns:
the store never queries inside the JSON, a reload must give back exactly
the text written (``jsonb`` would reorder keys and normalise numbers), and
text skips the server's parse.  A commit at a run's remembered revision is
one pipeline (compare-and-set ``UPDATE``, part rows and events, each kind of
row one statement of binary arrays) and a ``COMMIT``; any other takes the
run row's lock (``SELECT ... FOR UPDATE``), which serialises writers on one
run across hosts.  ``fence`` takes the same lock.

Every call is bounded: past its caller's deadline, or ``operation_timeout``,
its socket is shut down, so a blocked libpq call fails at once
(``storage_failed``; a ``COMMIT`` in flight is then uncertain, as any lost
acknowledgement is).  The server bounds its side too: each session has
``lock_timeout`` and ``idle_in_transaction_session_timeout`` of
``operation_timeout`` and TCP keepalives of 10 s, every 5 s, 3 times, so a
session cut while waiting for a lock, or a host partitioned away, releases
its locks.  New connections get ``connect_timeout`` and keepalives unless
the DSN sets them; a connection idle for a second is pinged before use and
replaced when dead.  psycopg is imported when a store is constructed, so
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
from collections.abc import Sequence
from typing import Any, Final, final

from ..._numbers import is_seconds
from ...errors import Error, ErrorClass
from ._driver import EventTuple
from ._engine import CACHE_ITEMS, SQLStore
from ._rows import RunRow, Writes

__all__ = ["PostgresDriver", "PostgresStore"]

_SCHEMA_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
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
#: A connection unused this long is pinged before it is used.
_PING_AFTER_S: Final = 1.0

#: A listed run, with its first event's time (one seek in the events' key).
_LISTED: Final = (
    "SELECT run_id, incarnation, revision, state, (SELECT occurred_at FROM {events} e"
    " WHERE e.run_id = r.run_id ORDER BY sequence LIMIT 1) FROM {runs} r"
)
_STATEMENTS: Final = {
    "runs": "CREATE TABLE IF NOT EXISTS {runs} (run_id text PRIMARY KEY,"
    " incarnation bigint NOT NULL, revision bigint NOT NULL, state text NOT NULL,"
    " head text NOT NULL)",
    "run_parts": "CREATE TABLE IF NOT EXISTS {parts} (run_id text NOT NULL, part text NOT NULL,"
    " key text NOT NULL, value text NOT NULL, PRIMARY KEY (run_id, part, key))",
    "run_events": "CREATE TABLE IF NOT EXISTS {events} (run_id text NOT NULL,"
    " sequence bigint NOT NULL, type text NOT NULL, occurred_at double precision NOT NULL,"
    " payload text NOT NULL, PRIMARY KEY (run_id, sequence))",
    "insert_run": "INSERT INTO {runs} (run_id, incarnation, revision, state, head)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
    "lock_run": "SELECT run_id, incarnation, revision, state, head FROM {runs}"
    " WHERE run_id = %s FOR UPDATE",
    "read_run": "SELECT run_id, incarnation, revision, state, head FROM {runs} WHERE run_id = %s",
    "update_run": "UPDATE {runs} SET incarnation = %s, revision = %s, state = %s, head = %s"
    " WHERE run_id = %s AND incarnation = %s AND revision = %s",
    "read_parts": "SELECT part, key, value FROM {parts} WHERE run_id = %s",
    "upsert_part": "INSERT INTO {parts} (run_id, part, key, value) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (run_id, part, key) DO UPDATE SET value = EXCLUDED.value",
    "delete_part": "DELETE FROM {parts} WHERE run_id = %s AND part = %s AND key = %s",
    "insert_event": "INSERT INTO {events} (run_id, sequence, type, occurred_at, payload)"
    " VALUES (%s, %s, %s, %s, %s)",
    "last_sequence": "SELECT coalesce(max(sequence), 0) FROM {events} WHERE run_id = %s",
    "read_events": "SELECT sequence, type, occurred_at, payload FROM {events}"
    " WHERE run_id = %s AND sequence > %s ORDER BY sequence",
    "list_runs": _LISTED + " ORDER BY run_id",
    "list_runs_in": _LISTED + " WHERE state = ANY(%s) ORDER BY run_id",
    # Several rows of a kind in one statement: arrays sent in binary (%b).
    "update_runs": "UPDATE {runs} AS r SET incarnation = v.incarnation, revision = v.revision,"
    " state = v.state, head = v.head"
    " FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::text[], %b::text[],"
    " %b::bigint[], %b::bigint[])"
    " AS v(run_id, incarnation, revision, state, head, old_incarnation, old_revision)"
    " WHERE r.run_id = v.run_id AND r.incarnation = v.old_incarnation"
    " AND r.revision = v.old_revision RETURNING r.run_id",
    "upsert_parts": "INSERT INTO {parts} (run_id, part, key, value)"
    " SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[])"
    " ON CONFLICT (run_id, part, key) DO UPDATE SET value = EXCLUDED.value",
    "delete_parts": "DELETE FROM {parts} AS p"
    " USING unnest(%b::text[], %b::text[], %b::text[]) AS d(run_id, part, key)"
    " WHERE p.run_id = d.run_id AND p.part = d.part AND p.key = d.key",
    "insert_events": "INSERT INTO {events} (run_id, sequence, type, occurred_at, payload)"
    " SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[],"
    " %b::double precision[], %b::text[])",
}


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


def _shut_down(conn: Any) -> None:
    """Shut ``conn``'s socket down (both ways), from any thread."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as dup:
            dup.shutdown(socket.SHUT_RDWR)


def _time(value: Any) -> float | None:
    return None if value is None else float(value)


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as ``width`` column arrays (what ``unnest`` reads)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * width


@final
class _Settings:
    """What the drivers of one store share: how to connect, the statements
    (rendered to text by the first connection) and whether the tables exist."""

    def __init__(
        self,
        psycopg: Any,
        dsn: str,
        *,
        schema: str | None,
        operation_timeout: float,
        create_tables: bool,
    ) -> None:
        self.psycopg = psycopg
        self.dsn = dsn
        self.schema = schema
        self.create_tables = create_tables
        self.operation_timeout = operation_timeout
        self.ping_after = _PING_AFTER_S
        # (PostgreSQL takes at most 2**31 - 1 ms, about 24.8 days)
        ms = min(math.ceil(operation_timeout * 1000), 2**31 - 1)
        self.session = (
            "SET extra_float_digits = 3;"
            f" SET lock_timeout = {ms};"
            f" SET idle_in_transaction_session_timeout = {ms};"
            " SET tcp_keepalives_idle = 10;"
            " SET tcp_keepalives_interval = 5;"
            " SET tcp_keepalives_count = 3"
        )
        try:
            given = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise Error(ErrorClass.VALIDATION, "dsn is not a PostgreSQL connection string") from exc
        try:
            #: the DSN's own connect_timeout, if any (0 or absent: none)
            self.connect_timeout = int(given.get("connect_timeout") or 0)
        except ValueError:
            raise Error(
                ErrorClass.VALIDATION, "dsn connect_timeout must be a whole number of seconds"
            ) from None
        self.connect_options = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given}
        self.lock = threading.Lock()
        self.sql: dict[str, Any] = self._composed()
        self.rendered = False
        self.ready = False

    def _composed(self) -> dict[str, Any]:
        sql = self.psycopg.sql

        def table(name: str) -> Any:
            if self.schema is None:
                return sql.Identifier(name)
            return sql.Identifier(self.schema, name)

        names = {"runs": table("runs"), "parts": table("run_parts"), "events": table("run_events")}
        statements = {name: sql.SQL(text).format(**names) for name, text in _STATEMENTS.items()}
        if self.schema is not None:
            statements["schema"] = sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self.schema)
            )
        # Whether every table exists, found as the statements find them (in
        # the schema, or along the search path): quoted as identifiers.
        quoted = [
            ".".join('"' + part + '"' for part in (self.schema, name) if part is not None)
            for name in ("runs", "run_parts", "run_events")
        ]
        statements["laid_out"] = sql.SQL(
            "SELECT to_regclass({}) IS NOT NULL AND to_regclass({}) IS NOT NULL"
            " AND to_regclass({}) IS NOT NULL"
        ).format(*map(sql.Literal, quoted))
        return statements

    def render(self, conn: Any) -> None:
        """The statements as plain text, once, with the first connection's
        quoting: a ``sql.Composed`` is rendered again on every execute."""
        with self.lock:
            if not self.rendered:
                self.sql = {name: query.as_string(conn) for name, query in self.sql.items()}
                self.rendered = True


@final
class PostgresDriver:
    """One connection of a ``PostgresStore``."""

    def __init__(self, settings: _Settings) -> None:
        self._settings = settings
        self._psycopg = settings.psycopg
        self._conn: Any = None
        self._used = 0.0
        #: a cut shut this connection's socket down: it is replaced
        self._interrupted = False

    @property
    def connection(self) -> Any:
        return self._conn

    def open(self, deadline: float) -> None:
        conn = self._conn
        if self._interrupted:
            # A cut may shut the socket down after the call's last statement:
            # psycopg would notice only at the next call's first one.
            self._interrupted = False
            self.close()
            conn = None
        if conn is not None:
            if not conn.closed and not conn.broken:
                idle = time.monotonic() - self._used
                if idle < self._settings.ping_after or self._alive(conn):
                    return
            self.close()  # dropped while idle (a server restart): a new one
        settings = self._settings
        options = settings.connect_options
        if deadline != math.inf:  # connect within the call's deadline (libpq: 2 s at least)
            left = max(2, math.ceil(deadline - time.monotonic()))
            given = int(options.get("connect_timeout") or settings.connect_timeout or left)
            options = {**options, "connect_timeout": str(min(left, given))}
        conn = self._psycopg.connect(settings.dsn, autocommit=False, **options)
        try:
            # Event times are double precision read back as text: every digit,
            # whatever the server's default; and the server bounds its side.
            conn.execute(settings.session)
            conn.commit()
            settings.render(conn)
            if not settings.ready:
                self._lay_out(conn)
                conn.commit()
                settings.ready = True
        except BaseException:
            conn.close()  # never kept half set up
            raise
        self._conn = conn
        self._used = time.monotonic()

    def _alive(self, conn: Any) -> bool:
        """One empty query on the wire (no transaction starts)."""
        pq = self._psycopg.pq
        try:
            result = conn.pgconn.exec_(b"")
        except Exception:
            return False
        return bool(
            result.status == pq.ExecStatus.EMPTY_QUERY and conn.pgconn.status == pq.ConnStatus.OK
        )

    def _lay_out(self, conn: Any) -> None:
        # Tables made already (by a migration, another host) are used as they
        # are: CREATE ... IF NOT EXISTS needs the CREATE privilege even when
        # nothing is to be made, and a host's role may not have it.
        sql = self._settings.sql
        if conn.execute(sql["laid_out"]).fetchone()[0]:
            return
        if not self._settings.create_tables:
            raise Error(
                ErrorClass.NOT_FOUND,
                "not a trio_backplane store: its tables are missing",
                {"reason": "not_a_store", "schema": self._settings.schema},
            )
        # CREATE ... IF NOT EXISTS races with itself (a unique violation in
        # the catalog): serialise table creation across hosts.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (0x7472696F,))
        if "schema" in sql:
            conn.execute(sql["schema"])
        for name in ("runs", "run_parts", "run_events"):
            conn.execute(sql[name])

    def begin(self, deadline: float) -> None:
        """A transaction starts with its first statement; lock waits are
        bounded by the call's cut and the session's ``lock_timeout``."""

    def begin_read(self) -> None:
        self._conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def commit(self) -> None:
        self._conn.commit()
        self._used = time.monotonic()

    def rollback(self) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return
        try:
            conn.rollback()
        except Exception:
            self.close()
        self._used = time.monotonic()

    def read_run(self, run_id: str, *, lock: bool) -> RunRow | None:
        sql = self._settings.sql["lock_run" if lock else "read_run"]
        row = self._conn.execute(sql, (run_id,)).fetchone()
        if row is None:
            return None
        return RunRow(str(row[0]), int(row[1]), int(row[2]), str(row[3]), str(row[4]))

    def read_parts(self, run_id: str) -> dict[tuple[str, str], str]:
        rows = self._conn.execute(self._settings.sql["read_parts"], (run_id,)).fetchall()
        return {(part, key): value for part, key, value in rows}

    def last_sequence(self, run_id: str) -> int:
        row = self._conn.execute(self._settings.sql["last_sequence"], (run_id,)).fetchone()
        return int(row[0])

    def insert_run(self, row: RunRow) -> bool:
        cur = self._conn.execute(self._settings.sql["insert_run"], row)
        return bool(cur.rowcount == 1)

    def write(self, writes: Writes) -> bool:
        conn = self._conn
        sql = self._settings.sql
        updates = writes.updates
        try:
            with conn.pipeline():
                cur = None
                if len(updates) > 1:  # a group: one statement per kind of row
                    rows = [(*u.row, u.old_incarnation, u.old_revision) for u in updates]
                    cur = conn.execute(sql["update_runs"], _columns(rows, 7))
                    if writes.parts:
                        conn.execute(sql["upsert_parts"], _columns(writes.parts, 4))
                    if writes.gone:
                        conn.execute(sql["delete_parts"], _columns(writes.gone, 3))
                    if writes.events:
                        conn.execute(sql["insert_events"], _columns(writes.events, 5))
                else:  # one run: plain statements, pipelined
                    for u in updates:
                        row = u.row
                        values = (row.incarnation, row.revision, row.state, row.head, row.run_id)
                        cur = conn.execute(sql["update_run"], (*values, *u[1:3]))
                    many = conn.cursor()
                    if writes.parts:
                        many.executemany(sql["upsert_part"], writes.parts)
                    if writes.gone:
                        many.executemany(sql["delete_part"], writes.gone)
                    if writes.events:
                        many.executemany(sql["insert_event"], writes.events)
        except self._psycopg.errors.UniqueViolation:
            return False  # an event sequence was taken: the memory was stale
        matched = 0 if cur is None else cur.rowcount
        return bool(matched == len(updates))

    def list_runs(
        self, states: Sequence[str] | None
    ) -> list[tuple[str, int, int, str, float | None]]:
        sql = self._settings.sql
        if states is None:
            rows = self._conn.execute(sql["list_runs"]).fetchall()
        else:
            rows = self._conn.execute(sql["list_runs_in"], (list(states),)).fetchall()
        return [(str(r[0]), int(r[1]), int(r[2]), str(r[3]), _time(r[4])) for r in rows]

    def read_events(self, run_id: str, after: int) -> list[EventTuple]:
        rows = self._conn.execute(self._settings.sql["read_events"], (run_id, after)).fetchall()
        return [(int(r[0]), str(r[1]), r[2], str(r[3])) for r in rows]

    def interrupt(self) -> None:
        if self._conn is not None:
            self._interrupted = True
            _shut_down(self._conn)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def classify(self, exc: BaseException) -> Error | None:
        if not isinstance(exc, self._psycopg.Error | OSError):
            return None
        cause = f"{type(exc).__name__}: {exc}"[:500]
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate in _CONFLICT_STATES:
            return Error(
                ErrorClass.RESOURCE_CONFLICT,
                "a concurrent writer won",
                {"sqlstate": sqlstate, "cause": cause},
            )
        return Error(ErrorClass.STORAGE_FAILED, "PostgreSQL store failed", {"cause": cause})


@final
class PostgresStore(SQLStore):
    """Run records in PostgreSQL, shared by many hosts.

    ``schema`` puts the tables in that PostgreSQL schema (created if missing),
    so stores on one database can be isolated; by default the tables are
    unqualified and land in the connection's ``search_path``.
    ``max_connections`` worker threads each own one connection; with two
    or more, one of them writes the group commit's batches alone.
    ``operation_timeout`` bounds every database call, in seconds (its
    caller's deadline bounds it too): past it the call is cut and fails with
    ``storage_failed``.  With ``create_tables=False`` the store creates
    nothing: where its tables are missing, every call fails with
    ``not_found``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 4,
        schema: str | None = None,
        operation_timeout: float = 60.0,
        create_tables: bool = True,
        cache_items: int = CACHE_ITEMS,
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
        settings = _Settings(
            _import_psycopg(),
            dsn,
            schema=schema,
            operation_timeout=float(operation_timeout),
            create_tables=create_tables,
        )
        self._settings = settings
        super().__init__(
            lambda: PostgresDriver(settings),
            name="PostgresStore",
            workers=max_connections,
            limited=True,
            cut_after=float(operation_timeout),
            cache_items=cache_items,
        )

    def __repr__(self) -> str:
        return f"PostgresStore(schema={self._settings.schema!r})"

    @property
    def schema(self) -> str | None:
        """The PostgreSQL schema holding the tables (``None``: the search path)."""
        return self._settings.schema
