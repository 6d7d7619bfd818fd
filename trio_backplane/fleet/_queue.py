"""The fleet's queue in PostgreSQL: one row a submitted run, claimed with
``FOR UPDATE SKIP LOCKED`` and held by a lease.  Synchronous SQL over one
short-lived psycopg connection a call (run in a thread by the caller)."""

from __future__ import annotations

import importlib
import json
import re
import threading
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass

__all__ = ["Claim", "Queue", "RowState"]

#: A row's states: ``queued`` for a worker, ``claimed`` by one, ``waiting``
#: for a person (held by no worker: claimable once an answer is given), or
#: finished (``done``: the run terminal; ``parked`` for a reconciler).
RowState = str
_DONE: Final = ("done", "parked")

_TABLE: Final = """
CREATE TABLE IF NOT EXISTS {schema}.backplane_fleet (
    run_id text PRIMARY KEY,
    agent text NOT NULL,
    prompt text NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    worker text,
    lease_until double precision,
    claims integer NOT NULL DEFAULT 0,
    current_run text NOT NULL,
    outcome text,
    submitted_at double precision NOT NULL DEFAULT extract(epoch FROM clock_timestamp())
)
"""
_ANSWERS: Final = """
CREATE TABLE IF NOT EXISTS {schema}.backplane_fleet_answers (
    id bigserial PRIMARY KEY,
    run_id text NOT NULL,
    interaction_id text NOT NULL,
    answer text NOT NULL,
    applied boolean NOT NULL DEFAULT false,
    error text
)
"""
_UNAPPLIED: Final = """
CREATE INDEX IF NOT EXISTS backplane_fleet_unapplied
ON {schema}.backplane_fleet_answers (run_id) WHERE NOT applied
"""
_NOW: Final = "extract(epoch FROM clock_timestamp())"
_SCHEMA: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@final
@attrs.frozen(kw_only=True)
class Claim:
    """A row a worker now holds: ``claims`` counts every claim of it (more
    than one: an earlier worker's lease lapsed or it handed the run back)."""

    run_id: str
    agent: str
    prompt: Any
    claims: int
    current_run: str


@final
class Queue:
    """The queue table in ``schema`` of the database at ``dsn``."""

    def __init__(self, dsn: str, *, schema: str = "public") -> None:
        try:
            self._psycopg: Any = importlib.import_module("psycopg")
        except ImportError as exc:
            raise Error(
                ErrorClass.UNSUPPORTED_CAPABILITY,
                "the fleet needs psycopg: install the 'postgres' extra",
                {"extra": "postgres"},
            ) from exc
        if not _SCHEMA.fullmatch(schema) or schema.startswith("pg_"):
            raise Error(ErrorClass.VALIDATION, "schema must be a lower-case SQL identifier")
        self._dsn = dsn
        self._schema = schema
        #: what ``LISTEN`` hears when a row is submitted or finished
        self.channel = f"backplane_fleet_{schema}"
        self._conn: Any = None
        self._lock = threading.Lock()

    def _sql(self, text: str) -> str:
        return text.replace("{schema}", self._schema)

    def _run(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One statement on the queue's connection (one at a time: callers
        run in threads); a broken connection is ``storage_failed``."""
        with self._lock:
            try:
                conn = self._conn
                if conn is None or conn.closed or conn.broken:
                    conn = self._conn = self._psycopg.connect(
                        self._dsn, autocommit=True, connect_timeout=10
                    )
                cursor = conn.execute(self._sql(text), params)
                return list(cursor.fetchall()) if cursor.description else []
            except self._psycopg.Error as exc:
                # not known whether it applied: the caller decides; the next
                # call opens a new connection
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                raise Error(ErrorClass.STORAGE_FAILED, f"fleet queue: {exc}"[:300]) from None

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the queue's connection (a later call opens another)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def ensure(self) -> None:
        """Create the tables if they are missing: in one transaction under
        an advisory lock, so workers starting together on a fresh database
        do not race PostgreSQL's catalog."""
        self._run(
            "DO $$ BEGIN PERFORM pg_advisory_xact_lock(hashtext('backplane_fleet'));"
            f" CREATE SCHEMA IF NOT EXISTS {self._schema};"
            f" {_TABLE}; {_ANSWERS}; {_UNAPPLIED}; END $$"
        )

    def submit(self, run_id: str, agent: str, prompt: Any) -> None:
        """Queue ``run_id`` (``resource_conflict`` if it exists): one commit."""
        rows = self._run(
            "INSERT INTO {schema}.backplane_fleet (run_id, agent, prompt, current_run)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
            (run_id, agent, json.dumps(prompt), run_id),
        )
        if not rows:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run already submitted", {"run_id": run_id})
        self._run("SELECT pg_notify(%s, %s)", (self.channel, run_id))

    def claim(self, worker: str, lease: float, agents: list[str] | None = None) -> Claim | None:
        """Take the oldest row that is queued, whose lease has lapsed, or
        that waits for a person who has answered."""
        rows = self._run(
            "UPDATE {schema}.backplane_fleet SET state = 'claimed', worker = %s,"
            f" lease_until = {_NOW} + %s, claims = claims + 1"
            " WHERE run_id = (SELECT run_id FROM {schema}.backplane_fleet f"
            f" WHERE (state = 'queued' OR (state = 'claimed' AND lease_until < {_NOW})"
            " OR (state = 'waiting' AND EXISTS (SELECT 1 FROM {schema}.backplane_fleet_answers a"
            " WHERE a.run_id = f.run_id AND NOT a.applied)))"
            " AND (%s::text[] IS NULL OR agent = ANY(%s::text[]))"
            " ORDER BY submitted_at LIMIT 1 FOR UPDATE SKIP LOCKED)"
            " RETURNING run_id, agent, prompt, claims, current_run",
            (worker, lease, agents, agents),
        )
        if not rows:
            return None
        run_id, agent, prompt, claims, current = rows[0]
        return Claim(
            run_id=run_id,
            agent=agent,
            prompt=json.loads(prompt),
            claims=claims,
            current_run=current,
        )

    def renew(self, run_id: str, worker: str, lease: float) -> bool:
        """Extend our lease; ``False`` if the row is no longer ours."""
        rows = self._run(
            f"UPDATE {{schema}}.backplane_fleet SET lease_until = {_NOW} + %s"
            " WHERE run_id = %s AND worker = %s AND state = 'claimed' RETURNING run_id",
            (lease, run_id, worker),
        )
        return bool(rows)

    def move(self, run_id: str, worker: str, current_run: str) -> bool:
        """Record the run id now carrying ``run_id`` (a replacement)."""
        rows = self._run(
            "UPDATE {schema}.backplane_fleet SET current_run = %s"
            " WHERE run_id = %s AND worker = %s AND state = 'claimed' RETURNING run_id",
            (current_run, run_id, worker),
        )
        return bool(rows)

    def finish(self, run_id: str, worker: str, state: RowState, outcome: str) -> bool:
        """Mark our row ``done`` or ``parked`` with the run's outcome."""
        assert state in _DONE
        rows = self._run(
            "UPDATE {schema}.backplane_fleet SET state = %s, outcome = %s, lease_until = NULL"
            " WHERE run_id = %s AND worker = %s AND state = 'claimed' RETURNING run_id",
            (state, outcome, run_id, worker),
        )
        if rows:
            self._run("SELECT pg_notify(%s, %s)", (self.channel, run_id))
        return bool(rows)

    def note(self, run_id: str, worker: str, text: str) -> None:
        """Keep why our attempt at a row failed (its ``outcome``, until done)."""
        self._run(
            "UPDATE {schema}.backplane_fleet SET outcome = %s"
            " WHERE run_id = %s AND worker = %s AND state = 'claimed'",
            (text, run_id, worker),
        )

    def hand_back(self, run_id: str, worker: str) -> None:
        """Let another worker claim our row at once (a draining worker)."""
        self._run(
            "UPDATE {schema}.backplane_fleet SET state = 'queued', worker = NULL,"
            " lease_until = NULL WHERE run_id = %s AND worker = %s AND state = 'claimed'",
            (run_id, worker),
        )

    def release(self, run_id: str, worker: str) -> None:
        """Let go of our row while its run waits for a person: no worker
        holds it until an answer is given.  A clean hand-off, not counted
        as a claim (``max_claims`` is for hosts that keep failing)."""
        self._run(
            "UPDATE {schema}.backplane_fleet SET state = 'waiting', worker = NULL,"
            " lease_until = NULL, claims = claims - 1"
            " WHERE run_id = %s AND worker = %s AND state = 'claimed'",
            (run_id, worker),
        )

    def answer(self, run_id: str, interaction_id: str, answer: Any) -> None:
        """Commit a person's answer for whichever worker holds the run."""
        if self.status(run_id) is None:
            raise Error(ErrorClass.NOT_FOUND, "no such run in the fleet", {"run_id": run_id})
        self._run(
            "INSERT INTO {schema}.backplane_fleet_answers (run_id, interaction_id, answer)"
            " VALUES (%s, %s, %s)",
            (run_id, interaction_id, json.dumps(answer)),
        )
        self._run("SELECT pg_notify(%s, %s)", (self.channel, run_id))

    def answers(self, run_id: str) -> list[tuple[int, str, Any]]:
        """Answers for ``run_id`` not applied yet, oldest first."""
        rows = self._run(
            "SELECT id, interaction_id, answer FROM {schema}.backplane_fleet_answers"
            " WHERE run_id = %s AND NOT applied ORDER BY id",
            (run_id,),
        )
        return [(n, interaction, json.loads(answer)) for n, interaction, answer in rows]

    def applied(self, answer_id: int, error: str | None) -> None:
        """Mark an answer handled (``error``: why the run refused it)."""
        self._run(
            "UPDATE {schema}.backplane_fleet_answers SET applied = true, error = %s WHERE id = %s",
            (error, answer_id),
        )

    def status(self, run_id: str) -> dict[str, Any] | None:
        rows = self._run(
            "SELECT state, outcome, current_run, claims, worker FROM {schema}.backplane_fleet"
            " WHERE run_id = %s",
            (run_id,),
        )
        if not rows:
            return None
        state, outcome, current, claims, worker = rows[0]
        return {
            "state": state,
            "outcome": outcome,
            "current_run": current,
            "claims": claims,
            "worker": worker,
        }

    def listen(self, timeout: float) -> None:
        """Return once the queue's channel is notified (a row submitted or
        finished, an answer given) or ``timeout`` seconds pass.  Only a
        wake-up: the tables are the truth, so a lost notification costs
        one ``timeout``, never an event."""
        try:
            conn = self._psycopg.connect(self._dsn, autocommit=True, connect_timeout=10)
        except self._psycopg.Error as exc:  # the database away: classed, like every call
            raise Error(ErrorClass.STORAGE_FAILED, f"fleet queue: {exc}"[:300]) from None
        try:
            conn.execute(f'LISTEN "{self.channel}"')
            for _ in conn.notifies(timeout=timeout, stop_after=1):
                break
        except self._psycopg.Error as exc:
            raise Error(ErrorClass.STORAGE_FAILED, f"fleet queue: {exc}"[:300]) from None
        finally:
            conn.close()

    def counts(self) -> dict[str, int]:
        rows = self._run("SELECT state, count(*) FROM {schema}.backplane_fleet GROUP BY state")
        return {state: int(n) for state, n in rows}
