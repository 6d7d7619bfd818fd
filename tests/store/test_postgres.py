"""``PostgresStore`` against a real PostgreSQL server (STO-01, 02, 04, 05, 06,
08, 10), plus the shared conformance suite (STO-11).

The server comes from ``TRIO_BACKPLANE_PG_DSN`` (``nox -s tests`` starts one
with ``scripts/postgres.sh``); without it these tests skip, or fail in CI.
Every test works in its own PostgreSQL schema.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio

from tests.store import faults
from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import Command, RunEvent, RunRecord, evolve_record, thaw, transition
from trio_backplane.store import PostgresStore, Receipt, RunSummary, Store
from trio_backplane.testing import FaultyStore, StoreConformance

if TYPE_CHECKING:  # imported by pytest_plugins, so pytest rewrites its asserts
    from tests.store.postgres_fixture import StoreFactory

pytest_plugins = ["tests.store.postgres_fixture"]


# -- helpers ---------------------------------------------------------------------


def _run_id(name: str = "run") -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


def _step(record: RunRecord, kind: str, at: float = 1.0, **data: Any) -> Any:
    """``kind`` applied to ``record``; a ``conversation`` holding the whole
    transcript (``_messages``) becomes what it appends to the record's, or,
    when it is no extension of it, the transcript set by hand (commands only
    append: a store must store whatever record it is given)."""
    conversation = data.get("conversation")
    if not (isinstance(conversation, dict) and isinstance(conversation.get("messages"), list)):
        return transition(record, Command(kind, at=at, input=data))
    messages = conversation["messages"]
    rest = {k: v for k, v in conversation.items() if k != "messages"}
    had = len(record.transcript)
    if thaw(record.transcript) == messages[:had]:
        data = {**data, "conversation": rest, "messages": messages[had:]}
        return transition(record, Command(kind, at=at, input=data))
    new, events = transition(record, Command(kind, at=at, input={**data, "conversation": rest}))
    return evolve_record(new, transcript=messages), events


async def _commit(
    store: Store, record: RunRecord, new: RunRecord, events: list[RunEvent]
) -> Receipt:
    return await store.commit(
        record.run_id,
        incarnation=record.incarnation,
        expected_revision=record.revision,
        record=new,
        events=events,
    )


async def _advance(store: PostgresStore, record: RunRecord, kind: str, **data: Any) -> RunRecord:
    new, events = _step(record, kind, at=float(record.revision + 1), **data)
    receipt = await _commit(store, record, new, events)
    assert receipt == Receipt(record.run_id, record.incarnation, record.revision + 1)
    return new  # type: ignore[no-any-return]


def _messages(n: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"message {i}"} for i in range(n)]}


async def _running(store: PostgresStore, name: str = "run") -> RunRecord:
    record = RunRecord.new(_run_id(name), context={"tenant": "t1"})
    assert await store.create(record) == Receipt(record.run_id, 1, 0)
    return await _advance(store, record, "admit", state="running", deadline=1e9)


async def _rich(store: PostgresStore, name: str = "rich") -> RunRecord:
    """A run with a transcript, a consumed provider intent and an active tool."""
    record = await _running(store, name)
    record = await _advance(store, record, "conversation_updated", conversation=_messages(3))
    record = await _advance(store, record, "provider_started", turn_id="turn-1")
    record = await _advance(
        store, record, "provider_completed", result={"text": "hi"}, conversation=_messages(4)
    )
    return await _advance(store, record, "tool_invoked", tool_name="echo", tool_call_id="call-1")


async def _raises(error_class: ErrorClass, call: Awaitable[Any]) -> Error:
    with pytest.raises(Error) as raised:
        await call
    assert raised.value.error_class is error_class, raised.value
    return raised.value


def _psycopg() -> Any:
    return importlib.import_module("psycopg")


async def _sql(dsn: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    def run() -> list[tuple[Any, ...]]:
        with _psycopg().connect(dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return [tuple(row) for row in cur.fetchall()] if cur.description else []

    return await trio.to_thread.run_sync(run)


def _drop_schema(dsn: str, schema: str) -> None:
    with _psycopg().connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class _RowLock:
    """Holds ``FOR UPDATE`` on one run row from a third connection, so racing
    writers provably queue on the lock before either may proceed."""

    def __init__(self, dsn: str, schema: str, run_id: str) -> None:
        self.dsn, self.schema, self.run_id = dsn, schema, run_id
        self.conn: Any = None

    async def __aenter__(self) -> _RowLock:
        def lock() -> Any:
            conn = _psycopg().connect(self.dsn)
            conn.execute(
                f'SELECT 1 FROM "{self.schema}".runs WHERE run_id = %s FOR UPDATE',
                (self.run_id,),
            )
            return conn

        self.conn = await trio.to_thread.run_sync(lock)
        return self

    async def wait_for_waiters(self, count: int) -> None:
        """Until ``count`` other sessions wait on a lock for this schema."""
        with trio.fail_after(15):
            while True:
                rows = await _sql(
                    self.dsn,
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND application_name = %s",
                    (self.schema,),
                )
                if rows[0][0] >= count:
                    return
                await trio.sleep(0.01)

    async def release(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            with trio.CancelScope(shield=True):  # a lock left held would hang its waiters
                await trio.to_thread.run_sync(conn.close)  # closing rolls back

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


async def _race(*calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``calls`` concurrently: each one's result or ``Error``."""
    outcomes: list[Any] = [None] * len(calls)

    async def one(i: int) -> None:
        try:
            outcomes[i] = await calls[i]()
        except Error as exc:
            outcomes[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(one, i)
    return outcomes


async def _locked_race(
    dsn: str, schema: str, run_id: str, *calls: Callable[[], Awaitable[Any]]
) -> list[Any]:
    """``_race`` with every call queued on the run's row lock before any may
    proceed: the writers provably contend inside PostgreSQL."""
    outcomes: list[Any] = []

    async def race() -> None:
        outcomes.extend(await _race(*calls))

    async with _RowLock(dsn, schema, run_id) as lock, trio.open_nursery() as nursery:
        nursery.start_soon(race)
        await lock.wait_for_waiters(len(calls))
        await lock.release()
    return outcomes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- construction (no server needed) ----------------------------------------------


def test_missing_psycopg_is_unsupported_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without psycopg, constructing a store names the ``postgres`` extra."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(Error) as raised:
        PostgresStore("postgresql://127.0.0.1/none")
    assert raised.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert "postgres" in raised.value.message
    assert raised.value.details["extra"] == "postgres"


def test_import_does_not_need_psycopg() -> None:
    """``import trio_backplane`` (and the store package) works without psycopg."""
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import trio_backplane, trio_backplane.store\n"
        "assert trio_backplane.store.PostgresStore\n"
        "assert sys.modules['psycopg'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_connections": 0},
        {"max_connections": True},
        {"schema": "Bad-Name"},
        {"schema": ""},
        {"schema": "pg_mystore"},  # PostgreSQL reserves pg_: every call would fail
        {"create_tables": 1},
        {"cache_items": 0},
    ],
)
def test_invalid_options_are_validation(kwargs: dict[str, Any]) -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(Error) as raised:
        PostgresStore("postgresql://127.0.0.1/none", **kwargs)
    assert raised.value.error_class is ErrorClass.VALIDATION


async def test_a_deadline_cut_after_success_never_reaches_the_connection() -> None:
    """A cut that comes just after a call finished never reaches its driver:
    the connection is not shut down under the next call (which would then
    fail as if the server had gone)."""
    from trio_backplane.store._sql._workers import Workers

    interrupted: list[str] = []

    class Driver:
        def interrupt(self) -> None:
            interrupted.append("cut")

        def close(self) -> None:
            pass

    workers = Workers(Driver, 1, "test")  # type: ignore[arg-type]
    result, cut = await workers.run(lambda driver: "done", cut_at=trio.current_time() + 60)
    assert (result.unwrap(), cut) == ("done", False)
    finished = workers._shared
    assert finished is not None
    from trio_backplane.store._sql._workers import _FINISHED, _Call

    call = _Call(lambda driver: None, None)
    call.state = _FINISHED
    workers._cut(call)
    assert interrupted == []
    await workers.aclose()


async def test_a_cut_landing_after_a_call_finished_its_work_costs_the_next_call_nothing(
    pg_store_factory: StoreFactory,
) -> None:
    """A cut may shut a connection's socket down after its call's last
    statement (the call then returns its result); the next call on that
    worker gets a new connection instead of failing ``storage_failed`` on
    the dead one (psycopg notices a shut socket only at its next use)."""
    store = pg_store_factory(max_connections=1)
    record = await _running(store)
    driver = await store._call(lambda driver: driver)
    driver.interrupt()  # as a cut arriving just after the call's work
    assert await store.load(record.run_id) == record
    new, events = _step(record, "conversation_updated", conversation=_messages(2))
    await _commit(store, record, new, events)
    assert await store.load(record.run_id) == new


async def test_sto_event_times_keep_every_digit_whatever_the_server_default(
    pg_dsn: str, pg_schema: str
) -> None:
    """Event times are double precision read back as text: a server, role
    or DSN whose ``extra_float_digits`` is 0 still gives back every digit."""
    psycopg: Any = pytest.importorskip("psycopg")
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, options="-c extra_float_digits=0")
    async with PostgresStore(dsn, schema=pg_schema) as store:
        record = RunRecord.new("digits")
        await store.create(record)
        new, events = transition(record, Command("admit", 1712345999.1234567, {"state": "running"}))
        await store.commit("digits", incarnation=1, expected_revision=0, record=new, events=events)
        stored = await store.events("digits")
    with psycopg.connect(pg_dsn) as conn:  # a test's own cleanup: blocking is fine
        conn.execute(f'DROP SCHEMA "{pg_schema}" CASCADE')
    assert [e.occurred_at for e in stored] == [1712345999.1234567]


# -- STO-01 -------------------------------------------------------------------------


async def test_sto01_commit_writes_record_and_events_together(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-01: a matching commit writes the record and its events together and
    acknowledges ``expected_revision + 1``; events get consecutive sequences."""
    store = pg_store_factory()
    record = RunRecord.new(_run_id(), context={"tenant": "t1"})
    await store.create(record)
    assert await store.load(record.run_id) == record
    assert await store.events(record.run_id) == []

    new, events = _step(record, "admit", state="running", deadline=1e9)
    receipt = await _commit(store, record, new, events)
    assert receipt == Receipt(record.run_id, 1, 1)
    assert await store.load(record.run_id) == new
    stored = await store.events(record.run_id)
    assert [(e.type, e.occurred_at, e.payload, e.sequence) for e in stored] == [
        (events[0].type, events[0].occurred_at, events[0].payload, 1)
    ]

    record = await _rich(store)
    log = await store.events(record.run_id)
    assert [e.sequence for e in log] == list(range(1, record.revision + 1))
    assert [e.type for e in log] == [
        "run.admit",
        "run.conversation_updated",
        "run.provider_started",
        "run.provider_completed",
        "run.tool_invoked",
    ]
    assert await store.events(record.run_id, after=3) == log[3:]
    assert await store.events(record.run_id, after=99) == []
    assert await store.events(_run_id("missing")) == []
    assert await store.load(_run_id("missing")) is None


async def test_sto01_another_instance_loads_the_committed_record(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-01: what one host committed, another host (a new instance) loads
    whole: transcript, intents, active tools, budget."""
    record = await _rich(pg_store_factory())
    other = pg_store_factory()
    loaded = await other.load(record.run_id)
    assert loaded == record
    assert loaded is not None
    assert len(loaded.transcript) == 4
    assert set(loaded.intents) == set(record.intents)
    assert loaded.active_tools
    # ... and it may continue the run from there.
    after = await _advance(other, loaded, "conversation_updated", conversation=_messages(5))
    assert await pg_store_factory().load(record.run_id) == after


async def test_create_twice_is_resource_conflict(pg_store_factory: StoreFactory) -> None:
    store = pg_store_factory()
    record = RunRecord.new(_run_id())
    await store.create(record)
    await _raises(ErrorClass.RESOURCE_CONFLICT, pg_store_factory().create(record))
    await _raises(ErrorClass.VALIDATION, store.create(attrs.evolve(record, revision=1)))


async def test_commits_write_only_what_changed(pg_dsn: str, pg_schema: str) -> None:
    """A commit rewrites changed parts only: an old message row keeps the
    transaction id (xmin) of the commit that wrote it."""
    async with PostgresStore(pg_dsn, schema=pg_schema) as store:
        record = await _running(store)
        record = await _advance(store, record, "conversation_updated", conversation=_messages(2))
        query = f'SELECT part, key, xmin::text FROM "{pg_schema}".run_parts WHERE run_id = %s'
        before = {(p, k): x for p, k, x in await _sql(pg_dsn, query, (record.run_id,))}
        for n in range(3, 8):
            record = await _advance(
                store, record, "conversation_updated", conversation=_messages(n)
            )
        # a fresh instance (nothing cached) diffs against the stored parts
        fresh = PostgresStore(pg_dsn, schema=pg_schema)
        record = await _advance(fresh, record, "conversation_updated", conversation=_messages(8))
        await fresh.aclose()
        after = {(p, k): x for p, k, x in await _sql(pg_dsn, query, (record.run_id,))}
        assert len(after) == 8
        for key, xmin in before.items():
            assert after[key] == xmin, key
        # shrinking the transcript deletes the rows that went away
        record = await _advance(store, record, "conversation_updated", conversation=_messages(1))
        rows = await _sql(pg_dsn, query, (record.run_id,))
        assert len(rows) == 1
        assert await store.load(record.run_id) == record
    await _sql(pg_dsn, f'DROP SCHEMA "{pg_schema}" CASCADE')


# -- STO-02 -------------------------------------------------------------------------


async def test_sto02_stale_revision_and_replay_are_resource_conflict(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-02: a stale ``expected_revision``, and a replay of an accepted
    commit, raise ``resource_conflict`` and never overwrite the newer record."""
    store = pg_store_factory()
    record = await _running(store)  # revision 1
    new, events = _step(record, "conversation_updated", conversation=_messages(1))
    await _commit(store, record, new, events)  # revision 2

    # the same commit again (a replay)
    error = await _raises(ErrorClass.RESOURCE_CONFLICT, _commit(store, record, new, events))
    assert error.details == {"stored": 2, "expected": 1}
    # a different record on the stale revision, from another host too
    other, other_events = _step(record, "conversation_updated", conversation=_messages(9))
    for instance in (store, pg_store_factory()):
        await _raises(ErrorClass.RESOURCE_CONFLICT, _commit(instance, record, other, other_events))
    assert await store.load(record.run_id) == new
    assert len(await store.events(record.run_id)) == 2
    # a commit to a run that does not exist
    ghost = RunRecord.new(_run_id("ghost"))
    ghost_next, ghost_events = _step(ghost, "admit")
    await _raises(ErrorClass.RESOURCE_CONFLICT, _commit(store, ghost, ghost_next, ghost_events))
    assert await store.load(ghost.run_id) is None


# -- STO-04 -------------------------------------------------------------------------


async def test_sto04_wrong_record_revision_is_validation(pg_store_factory: StoreFactory) -> None:
    """STO-04: a record whose own revision is not ``expected_revision + 1``
    raises ``validation`` and writes nothing."""
    store = pg_store_factory()
    record = await _running(store)
    new, events = _step(record, "conversation_updated", conversation=_messages(2))
    for revision in (record.revision, record.revision + 2):
        await _raises(
            ErrorClass.VALIDATION,
            _commit(store, record, attrs.evolve(new, revision=revision), events),
        )
    # a record for another run or incarnation than the commit names
    await _raises(
        ErrorClass.VALIDATION,
        store.commit(
            _run_id("other"),
            incarnation=1,
            expected_revision=record.revision,
            record=new,
            events=events,
        ),
    )
    assert await store.load(record.run_id) == record
    assert len(await store.events(record.run_id)) == 1
    assert await _advance(store, record, "start")  # the run is unharmed


# -- STO-05 / STO-06 ------------------------------------------------------------------


async def test_sto05_failed_commit_leaves_the_previous_record(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-05, STO-06: a commit that fails before it is acknowledged raises
    ``storage_failed`` (never ``resource_conflict``); ``load`` returns exactly
    the previous record and the log has no partial events."""
    store = pg_store_factory()
    record = await _rich(store)
    log = await store.events(record.run_id)
    new, events = _step(record, "tool_completed", invocation_id="invocation-1-1", result={"n": 1})
    faults.fail_next_commit(store)
    error = await _raises(ErrorClass.STORAGE_FAILED, _commit(store, record, new, events))
    assert isinstance(error.__cause__, _psycopg().OperationalError)
    for instance in (store, pg_store_factory()):
        assert await instance.load(record.run_id) == record
        assert await instance.events(record.run_id) == log
    # the hook fires once; the same commit then succeeds
    assert (await _commit(store, record, new, events)).revision == new.revision
    assert await store.load(record.run_id) == new


async def test_sto06_lost_acknowledgement_is_storage_failed_and_reconcilable(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-06: a commit applied but whose acknowledgement was lost raises
    ``storage_failed``, not ``resource_conflict``; ``load`` reconciles it."""
    store = pg_store_factory()
    record = await _running(store)
    new, events = _step(record, "conversation_updated", conversation=_messages(3))
    faults.fail_next_commit(store, after_commit=True)
    await _raises(ErrorClass.STORAGE_FAILED, _commit(store, record, new, events))
    assert await pg_store_factory().load(record.run_id) == new
    assert await store.load(record.run_id) == new
    assert [e.sequence for e in await store.events(record.run_id)] == [1, 2]
    # retrying blindly is a conflict: the caller reconciles through load
    await _raises(ErrorClass.RESOURCE_CONFLICT, _commit(store, record, new, events))


async def test_sto06_unreachable_server_is_storage_failed(pg_dsn: str) -> None:
    """STO-06: a connection failure is ``storage_failed``, chained to psycopg."""
    psycopg = _psycopg()
    dsn = f"postgresql://postgres@127.0.0.1:{_free_port()}/backplane?connect_timeout=5"
    async with PostgresStore(dsn, schema="unreachable") as store:
        error = await _raises(ErrorClass.STORAGE_FAILED, store.load("run"))
        assert isinstance(error.__cause__, psycopg.OperationalError)
        await _raises(ErrorClass.STORAGE_FAILED, store.create(RunRecord.new("run")))


async def test_sto06_killed_connection_is_storage_failed(
    pg_dsn: str, pg_store_factory: StoreFactory, pg_schema: str
) -> None:
    """STO-06: the server dropping the store's connection mid-use is
    ``storage_failed``; nothing is half-written and the store recovers."""
    store = pg_store_factory(max_connections=1)
    store._settings.ping_after = math.inf  # the dead connection is used, not pinged first
    record = await _running(store)
    killed = await _sql(
        pg_dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (pg_schema,),
    )
    assert killed, "the store's pooled connection was not found"
    new, events = _step(record, "conversation_updated", conversation=_messages(2))
    error = await _raises(ErrorClass.STORAGE_FAILED, _commit(store, record, new, events))
    assert isinstance(error.__cause__, _psycopg().OperationalError)
    assert await store.load(record.run_id) == record  # a new connection
    await _commit(store, record, new, events)
    assert await store.load(record.run_id) == new


async def test_sto_06_an_idle_connection_dropped_by_the_server_is_replaced(
    pg_dsn: str, pg_store_factory: StoreFactory, pg_schema: str
) -> None:
    """STO-06: a pooled connection the server dropped while it was idle (a
    restart) is found dead by a ping before it is handed out, and replaced:
    the next call works, no false ``storage_failed``."""
    store = pg_store_factory(max_connections=2)
    store._settings.ping_after = 0.0  # every idle connection is pinged (normally after 1 s idle)
    record = await _running(store)
    assert await store.load(record.run_id) == record
    killed = await _sql(
        pg_dsn,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (pg_schema,),
    )
    assert killed, "the store's pooled connection was not found"
    assert await store.load(record.run_id) == record
    new, events = _step(record, "conversation_updated", conversation=_messages(2))
    await _commit(store, record, new, events)
    assert await store.load(record.run_id) == new


class _Proxy:
    """A TCP proxy to the test server that can stop forwarding: its sockets
    stay open and swallow what they get (a network path gone silent)."""

    def __init__(self, dsn: str) -> None:
        info = _psycopg().conninfo.conninfo_to_dict(dsn)
        self.target = (info.get("host") or "127.0.0.1", int(info.get("port") or 5432))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = _psycopg().conninfo.make_conninfo(
            dsn, host="127.0.0.1", port=self.listener.getsockname()[1]
        )
        self.silent = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                if not self.silent.is_set():
                    b.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.mark.parametrize("bound", ["caller_deadline", "operation_timeout"])
async def test_sto_06_a_silent_network_cuts_the_call_at_its_deadline(
    pg_dsn: str, pg_schema: str, bound: str
) -> None:
    """STO-06: a network path that stops forwarding mid-call (the socket
    open, nothing answering) would hold a blocked libpq call forever.  The
    call is cut at its caller's deadline, or at ``operation_timeout``:
    ``storage_failed``, within about that time, for a commit (the group
    leader's batch) and a load alike; afterwards the store works again."""
    proxy = _Proxy(pg_dsn)
    timeout = 1.0 if bound == "operation_timeout" else 60.0
    store = PostgresStore(proxy.dsn, schema=pg_schema, operation_timeout=timeout)
    try:
        record = await _running(store)
        new, events = _step(record, "conversation_updated", conversation=_messages(2))
        proxy.silent.set()
        for call in (lambda: _commit(store, record, new, events), lambda: store.load("r")):
            started = trio.current_time()
            with trio.move_on_after(1.0 if bound == "caller_deadline" else 30.0):
                error = await _raises(ErrorClass.STORAGE_FAILED, call())
            assert "cut at its deadline" in error.message
            assert trio.current_time() - started < 10.0
        proxy.silent.clear()
        assert await store.load(record.run_id) == record  # nothing of the cut commit landed
        await _commit(store, record, new, events)
        assert await store.load(record.run_id) == new
    finally:
        await store.aclose()
        proxy.close()
        await _sql(pg_dsn, f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')


async def test_sto_06_a_row_lock_never_released_cuts_the_commit_at_its_deadline(
    pg_dsn: str, pg_store_factory: StoreFactory, pg_schema: str
) -> None:
    """STO-06: another session holding the run's row lock without end makes
    a commit wait on it; the wait is cut at the caller's deadline as
    ``storage_failed``, and once the lock goes the commit goes through."""
    store = pg_store_factory()
    record = await _running(store)
    new, events = _step(record, "conversation_updated", conversation=_messages(2))
    psycopg = _psycopg()

    def hold() -> Any:
        conn = psycopg.connect(pg_dsn, autocommit=False)
        conn.execute(
            f'SELECT 1 FROM "{pg_schema}".runs WHERE run_id = %s FOR UPDATE', (record.run_id,)
        )
        return conn

    holder = await trio.to_thread.run_sync(hold)
    try:
        with trio.move_on_after(1.0):
            error = await _raises(ErrorClass.STORAGE_FAILED, _commit(store, record, new, events))
        assert "cut at its deadline" in error.message
    finally:
        await trio.to_thread.run_sync(holder.close)
    assert await store.load(record.run_id) == record
    await _commit(store, record, new, events)
    assert await store.load(record.run_id) == new


async def test_closed_store_is_storage_failed(pg_dsn: str, pg_schema: str) -> None:
    async with PostgresStore(pg_dsn, schema=pg_schema) as store:
        record = await _running(store)
    await _raises(ErrorClass.STORAGE_FAILED, store.load(record.run_id))
    async with PostgresStore(pg_dsn, schema=pg_schema) as again:
        assert await again.load(record.run_id) == record
    await _sql(pg_dsn, f'DROP SCHEMA "{pg_schema}" CASCADE')


# -- STO-08 -------------------------------------------------------------------------


async def test_sto08_fence_advances_incarnation_and_revision(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-08: ``fence`` advances incarnation and revision atomically; the old
    incarnation's commits and a fence that does not raise the incarnation are
    ``resource_conflict``."""
    store = pg_store_factory()
    record = await _rich(store)
    receipt = await store.fence(record.run_id, incarnation=2)
    assert receipt == Receipt(record.run_id, 2, record.revision + 1)
    fenced = await store.load(record.run_id)
    assert fenced == attrs.evolve(record, incarnation=2, revision=record.revision + 1)
    log = await store.events(record.run_id)
    assert log[-1].type == "run.fence"
    assert log[-1].sequence == fenced.revision
    assert log[-1].payload["input"] == {"incarnation": 2}

    # the old incarnation can never commit again, on this host or another
    old, old_events = _step(record, "conversation_updated", conversation=_messages(9))
    for instance in (store, pg_store_factory()):
        await _raises(ErrorClass.RESOURCE_CONFLICT, _commit(instance, record, old, old_events))
        stale = attrs.evolve(old, revision=fenced.revision + 1)
        await _raises(
            ErrorClass.RESOURCE_CONFLICT,
            instance.commit(
                record.run_id,
                incarnation=1,
                expected_revision=fenced.revision,
                record=stale,
                events=old_events,
            ),
        )
    # a fence that does not raise the incarnation
    for incarnation in (2, 1):
        await _raises(
            ErrorClass.RESOURCE_CONFLICT, store.fence(record.run_id, incarnation=incarnation)
        )
    await _raises(ErrorClass.RESOURCE_CONFLICT, store.fence(_run_id("ghost"), incarnation=2))
    assert await store.load(record.run_id) == fenced
    # the new incarnation commits
    later = await _advance(store, fenced, "conversation_updated", conversation=_messages(6))
    assert await pg_store_factory().load(record.run_id) == later
    assert (await store.fence(record.run_id, incarnation=5)).incarnation == 5


# -- STO-10 -------------------------------------------------------------------------


async def test_sto10_two_instances_race_commits_on_one_revision(
    pg_dsn: str, pg_schema: str, pg_store_factory: StoreFactory
) -> None:
    """STO-10: two ``PostgresStore`` instances on one database commit on the
    same revision at once: exactly one succeeds, the other raises
    ``resource_conflict``, and the stored record is the winner's."""
    a, b = pg_store_factory(), pg_store_factory()
    record = await _running(a)
    for round_ in range(12):
        candidates = [
            _step(record, "conversation_updated", at=10.0 + round_, conversation={"w": w})
            for w in range(2)
        ]
        calls = [
            functools.partial(_commit, instance, record, *candidates[w])
            for w, instance in enumerate((a, b))
        ]
        if round_ % 2:  # both provably queue on the row lock first
            outcomes = await _locked_race(pg_dsn, pg_schema, record.run_id, *calls)
        else:  # free-running
            outcomes = await _race(*calls)
        winners = [w for w, outcome in enumerate(outcomes) if isinstance(outcome, Receipt)]
        assert len(winners) == 1, (round_, outcomes)
        loser = outcomes[1 - winners[0]]
        assert isinstance(loser, Error)
        assert loser.error_class is ErrorClass.RESOURCE_CONFLICT
        record = candidates[winners[0]][0]
        for instance in (a, b):
            assert await instance.load(record.run_id) == record
    log = await a.events(record.run_id)
    assert [e.sequence for e in log] == list(range(1, record.revision + 1))


async def test_sto10_racing_fences_one_owner(
    pg_dsn: str, pg_schema: str, pg_store_factory: StoreFactory
) -> None:
    """STO-08, STO-10: two hosts fence the same run to the same incarnation at
    once: exactly one fence wins, so only one host believes it owns it."""
    a, b = pg_store_factory(), pg_store_factory()
    record = await _rich(a)
    for incarnation in range(2, 8):
        calls = [
            functools.partial(instance.fence, record.run_id, incarnation=incarnation)
            for instance in (a, b)
        ]
        if incarnation % 2:
            outcomes = await _locked_race(pg_dsn, pg_schema, record.run_id, *calls)
        else:
            outcomes = await _race(*calls)
        winners = [o for o in outcomes if isinstance(o, Receipt)]
        losers = [o for o in outcomes if isinstance(o, Error)]
        assert len(winners) == 1, outcomes
        assert [e.error_class for e in losers] == [ErrorClass.RESOURCE_CONFLICT]
        assert winners[0].incarnation == incarnation
        loaded = await b.load(record.run_id)
        assert loaded is not None
        assert (loaded.incarnation, loaded.revision) == (incarnation, winners[0].revision)
    fences = [e for e in await a.events(record.run_id) if e.type == "run.fence"]
    assert len(fences) == 6


async def test_sto10_fence_racing_an_old_incarnation_commit(
    pg_dsn: str, pg_schema: str, pg_store_factory: StoreFactory
) -> None:
    """STO-08, STO-10: a fence racing the old incarnation's commit: the commit
    either lands before the fence or is refused; never after it."""
    a, b = pg_store_factory(), pg_store_factory()
    for _ in range(6):
        record = await _running(a)
        new, events = _step(record, "conversation_updated", conversation=_messages(1))
        outcomes = await _locked_race(
            pg_dsn,
            pg_schema,
            record.run_id,
            functools.partial(_commit, a, record, new, events),
            functools.partial(b.fence, record.run_id, incarnation=2),
        )
        committed, fenced = outcomes
        assert isinstance(fenced, Receipt), outcomes
        assert fenced.incarnation == 2
        loaded = await a.load(record.run_id)
        assert loaded is not None
        assert loaded.incarnation == 2
        if isinstance(committed, Receipt):  # the commit came first
            assert fenced.revision == committed.revision + 1
            assert loaded == attrs.evolve(new, incarnation=2, revision=new.revision + 1)
        else:
            assert committed.error_class is ErrorClass.RESOURCE_CONFLICT
            assert loaded == attrs.evolve(record, incarnation=2, revision=record.revision + 1)


# -- listing, concurrency, schema ----------------------------------------------------


async def test_list_runs(pg_store_factory: StoreFactory) -> None:
    store = pg_store_factory()
    queued = RunRecord.new("a-queued")
    await store.create(queued)
    running = await _running(store, "b-running")
    cancelled = await _advance(store, await _running(store, "c-cancelled"), "cancel")
    assert cancelled.state in ("cancelled", "cancelling")
    everything = await store.list_runs()
    assert [s.run_id for s in everything] == sorted(
        [queued.run_id, running.run_id, cancelled.run_id]
    )
    [first, *_] = await store.events(running.run_id)
    assert await store.list_runs(states={"running"}) == [
        RunSummary(running.run_id, 1, running.revision, "running", first.occurred_at)
    ]
    assert everything[0].admitted_at is None  # a run never admitted has no event
    assert await store.list_runs(states=()) == []


async def test_many_concurrent_runs_share_a_bounded_pool(
    pg_dsn: str, pg_schema: str, pg_store_factory: StoreFactory
) -> None:
    """Many tasks at once on ``max_connections=2``: all commit, and the store
    never opens more than two connections."""
    store = pg_store_factory(max_connections=2)
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            rows = await _sql(
                pg_dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (pg_schema,),
            )
            peak = max(peak, rows[0][0])
            await trio.sleep(0.005)

    async def run(i: int) -> None:
        record = await _running(store, f"pool-{i}")
        for n in range(1, 6):
            record = await _advance(
                store, record, "conversation_updated", conversation=_messages(n)
            )
        assert await store.load(record.run_id) == record

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        async with trio.open_nursery() as runs:
            for i in range(16):
                runs.start_soon(run, i)
        nursery.cancel_scope.cancel()
    assert len(await store.list_runs()) == 16
    assert 1 <= peak <= 2, peak
    assert len(store._workers.threads) <= 2


async def test_schema_creation_races_and_isolates(
    pg_dsn: str, pg_store_factory: StoreFactory
) -> None:
    """Stores on a fresh schema create it concurrently without error; a store
    on another schema sees none of its runs."""
    stores = [pg_store_factory() for _ in range(4)]
    records = [RunRecord.new(_run_id(f"s{i}")) for i in range(4)]
    await _race(*[lambda s=s, r=r: s.create(r) for s, r in zip(stores, records, strict=True)])
    assert len(await stores[0].list_runs()) == 4
    elsewhere = f"test_{uuid.uuid4().hex[:16]}"
    async with PostgresStore(pg_dsn, schema=elsewhere) as other:
        assert await other.list_runs() == []
        assert await other.load(records[0].run_id) is None
    await _sql(pg_dsn, f'DROP SCHEMA "{elsewhere}" CASCADE')


# -- STO-11: the shared conformance suite ---------------------------------------------


class TestPostgresConformance(StoreConformance):
    """STO-11: the conformance suite passes on ``PostgresStore``; each
    ``make_store`` is a fresh schema, ``reopen`` a new instance on it."""

    dsn: str
    schemas: list[str]

    @pytest.fixture(autouse=True)
    def _server(self, pg_dsn: str) -> Iterator[None]:
        self.dsn = pg_dsn
        self.schemas = []
        yield
        for schema in self.schemas:
            _drop_schema(pg_dsn, schema)

    async def make_store(self) -> Store:
        schema = f"test_{uuid.uuid4().hex[:16]}"
        self.schemas.append(schema)
        return FaultyStore(PostgresStore(self.dsn, schema=schema))

    async def reopen(self, store: Store) -> Store:
        assert isinstance(store, FaultyStore)
        assert isinstance(store.inner, PostgresStore)
        return FaultyStore(PostgresStore(self.dsn, schema=store.inner.schema))


# -- issue 4 item 8: commit 5 000 costs what commit 10 did ------------------------------


async def test_commit_5000_writes_what_commit_10_did(pg_store_factory: StoreFactory) -> None:
    """The part rows (and head + part bytes) written by commit 5 000 of one run
    equal those of commit 10 for the same kind of commit; a fresh instance
    (nothing cached) reloads the run from the database and then commits
    incrementally too."""
    from trio_backplane.kernel import FrozenList, freeze

    store = pg_store_factory()
    record = RunRecord.new(_run_id("long"), work=100_000, context={"conversation": {}})
    await store.create(record)
    record = await _advance(store, record, "admit", state="running")
    cost: dict[int, tuple[str, int, int]] = {}  # revision -> (kind, part rows, bytes)
    n = 0
    while record.revision < 5_001:
        messages = FrozenList((freeze({"role": "assistant", "content": f"r{n}"}),))
        for kind, data in (
            ("provider_started", {}),
            ("provider_completed", {"result": {"n": n}, "messages": messages}),
        ):
            record = await _advance(store, record, kind, **data)
            cost[record.revision] = (kind, store.stats["last_part_rows"], store.stats["last_bytes"])
        n += 1
    for early, late in ((10, 5_000), (11, 4_999)):
        (kind, rows, size), (late_kind, late_rows, late_size) = cost[early], cost[late]
        assert kind == late_kind
        assert rows == late_rows == 2, (early, cost[early], late, cost[late])
        assert 0 < size <= late_size <= size + 64, (early, cost[early], late, cost[late])
    fresh = pg_store_factory()
    record = await _advance(fresh, record, "provider_started")
    assert fresh.stats["last_part_rows"] == 2
    record = await _advance(fresh, record, "provider_completed", result={"n": n})
    assert fresh.stats["last_part_rows"] == 1  # the intent; the transcript is unchanged
    assert await store.load(record.run_id) == record


async def test_commits_from_a_remembered_run_skip_the_row_lock_read(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-02/STO-10 on the fast path: a store that remembers the run commits
    without the ``SELECT ... FOR UPDATE`` round trip; when another instance
    moved the run on, the remembered commit is still refused with
    ``resource_conflict`` and nothing of it is stored, and the next commit
    from the reloaded record continues the event sequence."""
    a, b = pg_store_factory(), pg_store_factory()
    record = await _running(a)
    for n in range(4):
        record = await _advance(a, record, "conversation_updated", conversation=_messages(n))
    assert a.stats["fast_commits"] >= 4
    moved = await _advance(b, record, "conversation_updated", conversation=_messages(9))
    stale, events = _step(record, "conversation_updated", at=50.0, conversation=_messages(7))
    before = a.stats["fast_commits"]
    await _raises(ErrorClass.RESOURCE_CONFLICT, _commit(a, record, stale, events))
    assert a.stats["fast_commits"] == before
    assert await b.load(record.run_id) == moved
    reloaded = await a.load(record.run_id)
    assert reloaded == moved
    after = await _advance(a, moved, "conversation_updated", conversation=_messages(10))
    after = await _advance(a, after, "conversation_updated", conversation=_messages(11))
    # no row lock read either time: the first reads the event sequence only
    assert a.stats["fast_commits"] == before + 2
    assert await b.load(record.run_id) == after
    log = await b.events(record.run_id)
    assert [e.sequence for e in log] == list(range(1, after.revision + 1))


# -- group commit -------------------------------------------------------------------


async def _all_at_once(
    store: PostgresStore, records: list[RunRecord], messages: int = 2
) -> list[RunRecord | Error]:
    """Commit one conversation checkpoint (``messages`` long) to each run, all
    at once: the new record, or the ``Error`` its commit raised."""
    return await _race(
        *(
            functools.partial(
                _advance, store, record, "conversation_updated", conversation=_messages(messages)
            )
            for record in records
        )
    )


async def test_concurrent_commits_share_transactions(
    pg_store_factory: StoreFactory,
) -> None:
    """STO-01: commits of many runs arriving together are group-committed (a
    transaction holds several runs' commits), and every one lands whole: its
    revision, its parts and its events, readable from another store."""
    store, reader = pg_store_factory(), pg_store_factory()
    records = [await _running(store, f"group{i}") for i in range(12)]
    for messages in (5, 7, 2):  # the last one shortens each transcript: rows deleted
        results = await _all_at_once(store, records, messages)
        assert all(isinstance(r, RunRecord) for r in results), results
        records = results  # type: ignore[assignment]
    assert store.stats["batches"] >= 1
    for record in records:
        assert await reader.load(record.run_id) == record
        assert len(record.transcript) == 2
        log = await reader.events(record.run_id)
        assert [e.sequence for e in log] == list(range(1, record.revision + 1))


async def _grouped(
    store: PostgresStore, pg_dsn: str, pg_schema: str, plug: RunRecord, records: list[RunRecord]
) -> list[RunRecord | Error]:
    """Commit to ``plug`` first and hold that commit inside PostgreSQL (a row
    lock) until the commits to ``records`` are all queued behind it: they
    then go to the store as one group, deterministically."""
    results: list[Any] = []

    async def rest() -> None:
        results.extend(await _all_at_once(store, records))

    async with _RowLock(pg_dsn, pg_schema, plug.run_id) as lock, trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: _race(
                functools.partial(
                    _advance, store, plug, "conversation_updated", conversation=_messages(1)
                )
            )
        )
        await lock.wait_for_waiters(1)
        nursery.start_soon(rest)
        with trio.fail_after(15):
            while len(store._group.queue) < len(records):
                await trio.sleep(0.01)
        await lock.release()
    return results


async def test_sto_10_a_run_moved_on_inside_a_group_rolls_the_group_back(
    pg_store_factory: StoreFactory, pg_dsn: str, pg_schema: str
) -> None:
    """STO-10: when another host moved one run of a group on, the group is
    rolled back whole (nothing of it written) and its commits are made one by
    one: that one gets ``resource_conflict`` and leaves the other host's
    record in place; every other commit lands."""
    a, b = pg_store_factory(), pg_store_factory()
    plug = await _running(a, "plug")
    records = [await _running(a, f"moved{i}") for i in range(4)]
    moved = await _advance(b, records[2], "conversation_updated", conversation=_messages(9))
    batches = a.stats["batches"]
    fast = a.stats["fast_commits"]
    results = await _grouped(a, pg_dsn, pg_schema, plug, records)
    assert isinstance(results[2], Error)
    assert results[2].error_class is ErrorClass.RESOURCE_CONFLICT
    assert await b.load(moved.run_id) == moved
    for i, result in enumerate(results):
        if i != 2:
            assert isinstance(result, RunRecord), result
            assert await b.load(result.run_id) == result
    assert a.stats["batches"] == batches  # the group never committed
    assert a.stats["fast_commits"] > fast  # its commits went one by one


@pytest.mark.parametrize("when", ["before", "after"])
async def test_sto_06_a_failed_group_transaction_reports_every_commit_failed(
    pg_store_factory: StoreFactory, pg_dsn: str, pg_schema: str, when: str
) -> None:
    """STO-06: the COMMIT of a group transaction fails (or its acknowledgement
    is lost): every commit of the group reports ``storage_failed``, never
    success.  Before the COMMIT nothing is written; after it every record is
    durable and ``load`` reconciles it."""
    store, reader = pg_store_factory(), pg_store_factory()
    plug = await _running(store, "plug")
    records = [await _running(store, f"grpfail{i}") for i in range(4)]
    # armed for the group's transaction only (the plug commits alone, first)
    faults.fail_next_commit(store, after_commit=when == "after", skip=1)
    results = await _grouped(store, pg_dsn, pg_schema, plug, records)
    assert all(isinstance(r, Error) for r in results), results
    assert all(r.error_class is ErrorClass.STORAGE_FAILED for r in results)  # type: ignore[union-attr]
    for record in records:
        stored = await reader.load(record.run_id)
        assert stored is not None
        if when == "before":
            assert stored == record
        else:
            assert stored.revision == record.revision + 1
            assert len(stored.transcript) == 2


@pytest.mark.parametrize("when", ["before", "after"])
async def test_sto_06_a_failed_group_fails_every_commit_in_it(
    pg_store_factory: StoreFactory, when: str
) -> None:
    """STO-06: a group whose COMMIT fails (or whose acknowledgement is lost)
    reports ``storage_failed`` to every commit in it, never success; a failure
    before the COMMIT leaves every run as it was."""
    store, reader = pg_store_factory(), pg_store_factory()
    records = [await _running(store, f"fail{i}") for i in range(6)]
    # warm the group path, then fail the next transaction of several commits
    records = await _all_at_once(store, records)  # type: ignore[assignment]
    batches = store.stats["batches"]
    faults.fail_next_commit(store, after_commit=when == "after")
    results = await _all_at_once(store, records)
    failed = [r for r in results if isinstance(r, Error)]
    assert failed
    assert all(e.error_class is ErrorClass.STORAGE_FAILED for e in failed)
    for record, result in zip(records, results, strict=True):
        stored = await reader.load(record.run_id)
        if isinstance(result, RunRecord):
            assert stored == result
        elif when == "before":
            assert stored == record  # nothing of the failed group was written
    assert store.stats["batches"] >= batches


async def test_sto_10_a_group_aborted_before_its_commit_is_committed_one_by_one(
    pg_store_factory: StoreFactory, pg_dsn: str, pg_schema: str
) -> None:
    """STO-10: a group whose transaction the server aborts before the COMMIT
    (a deadlock with another host's group, here simulated) has written
    nothing, so each of its commits is then made alone: all land, none
    reports a failure."""
    store, reader = pg_store_factory(), pg_store_factory()
    records = [await _running(store, f"abort{i}") for i in range(5)]
    psycopg = _psycopg()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE FUNCTION {pg_schema}.deadlock(text[], bigint[], text[],"
            " double precision[], text[]) RETURNS void LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = '40P01'; END $$"
        )
    batches = store.stats["batches"]
    store._settings.sql = {
        **store._settings.sql,
        "insert_events": f"SELECT {pg_schema}.deadlock(%b::text[], %b::bigint[],"
        " %b::text[], %b::double precision[], %b::text[])",
    }
    results = await _all_at_once(store, records)
    assert all(isinstance(r, RunRecord) for r in results), results
    assert store.stats["batches"] == batches  # no group committed
    for result in results:
        assert isinstance(result, RunRecord)
        assert await reader.load(result.run_id) == result
        assert [e.sequence for e in await reader.events(result.run_id)] == list(
            range(1, result.revision + 1)
        )


async def test_sto_06_a_cancelled_group_leader_never_cancels_the_others(
    pg_store_factory: StoreFactory, pg_dsn: str, pg_schema: str
) -> None:
    """STO-06: a commit whose caller is cancelled while it leads the group,
    waiting for a connection, is withdrawn alone: the commits queued behind
    it are not cancelled on its behalf; the next one leads, and both land.
    The withdrawn commit wrote nothing."""
    store = pg_store_factory(max_connections=1)
    plug = await _running(store, "plug")
    leader, second, third = [await _running(store, name) for name in ("l", "y", "z")]
    outcome: dict[str, Any] = {}

    async def commit(name: str, record: RunRecord, scope: trio.CancelScope) -> None:
        with scope:
            outcome[name] = await _advance(
                store, record, "conversation_updated", conversation=_messages(1)
            )
        if scope.cancelled_caught:
            outcome[name] = "cancelled"

    async def until(condition: Callable[[], bool]) -> None:
        with trio.fail_after(15):
            while not condition():
                await trio.sleep(0.01)

    async with _RowLock(pg_dsn, pg_schema, plug.run_id) as lock, trio.open_nursery() as nursery:
        try:
            # A fence holds the only connection, blocked on the row lock.
            nursery.start_soon(_race, functools.partial(store.fence, plug.run_id, incarnation=2))
            await lock.wait_for_waiters(1)
            # The first commit leads and waits for the connection; two more
            # queue behind it.
            scope = trio.CancelScope()
            nursery.start_soon(commit, "l", leader, scope)
            limiter = store._workers.limiter
            assert limiter is not None
            await until(lambda: limiter.statistics().tasks_waiting == 1)
            nursery.start_soon(commit, "y", second, trio.CancelScope())
            nursery.start_soon(commit, "z", third, trio.CancelScope())
            await until(lambda: len(store._group.queue) == 3)
            scope.cancel()
            await until(lambda: "l" in outcome)
        finally:  # never leave the fence's thread blocked behind the nursery
            await lock.release()
    assert outcome["l"] == "cancelled"
    assert isinstance(outcome["y"], RunRecord), outcome["y"]
    assert isinstance(outcome["z"], RunRecord), outcome["z"]
    reader = pg_store_factory()
    assert await reader.load(leader.run_id) == leader  # withdrawn: nothing written
    assert await reader.load(second.run_id) == outcome["y"]
    assert await reader.load(third.run_id) == outcome["z"]


@pytest.mark.parametrize(
    "damage",
    [
        'UPDATE "{schema}".runs SET head = %s WHERE run_id = %s',
        'UPDATE "{schema}".run_events SET payload = %s WHERE run_id = %s',
    ],
)
async def test_sto_06_damaged_rows_are_storage_failed_naming_the_run(
    pg_store_factory: StoreFactory, pg_dsn: str, pg_schema: str, damage: str
) -> None:
    """STO-06: rows damaged outside the store give ``storage_failed`` naming
    the run (never a raw ``JSONDecodeError``); other runs still load."""
    writer = pg_store_factory()
    bad, good = await _running(writer, "bad"), await _running(writer, "good")
    await _sql(pg_dsn, damage.format(schema=pg_schema), ("{not json", bad.run_id))
    reader = pg_store_factory()  # remembers nothing: reads the rows
    read = reader.events if "run_events" in damage else reader.load
    with pytest.raises(Error) as raised:
        await read(bad.run_id)
    assert raised.value.error_class is ErrorClass.STORAGE_FAILED
    assert raised.value.details["run_id"] == bad.run_id
    assert await reader.load(good.run_id) == good


async def test_sto_nul_in_an_event_type_or_a_part_key_is_validation(
    pg_store_factory: StoreFactory, tmp_path: Any
) -> None:
    """An event type or a key of the record's growing maps holding NUL is
    the caller's mistake (``validation``), on PostgreSQL (whose text holds no
    NUL: it was ``storage_failed`` there) as on SQLite, and nothing is
    written: the run commits on afterwards."""
    from trio_backplane.store import SQLiteStore

    async with SQLiteStore(tmp_path / "runs.db") as sqlite:
        for store in (pg_store_factory(), sqlite):
            record = RunRecord.new(_run_id())
            await store.create(record)
            new, events = _step(record, "admit", state="running", deadline=1e9)
            bad_event = [RunEvent(type="run.a\x00b", occurred_at=1.0, payload={})]
            bad_key = attrs.evolve(new, tool_results={"invocation\x00": {"content": []}})
            for record_, events_ in ((new, bad_event), (bad_key, events)):
                await _raises(ErrorClass.VALIDATION, _commit(store, record, record_, events_))
            with pytest.raises(Error) as exc:
                await store.create(attrs.evolve(record, run_id=_run_id(), intents={"\x00": {}}))
            assert exc.value.error_class is ErrorClass.VALIDATION
            assert await store.load(record.run_id) == record
            await _commit(store, record, new, events)
            assert await store.load(record.run_id) == new


async def test_sto_a_role_with_only_row_privileges_uses_existing_tables(
    pg_dsn: str, pg_store_factory: StoreFactory, pg_schema: str
) -> None:
    """A host whose role may read and write the tables but create nothing
    (tables made by a migration or an owner role) opens the store and
    commits: the store creates its tables only when they are missing."""
    import psycopg
    from psycopg import sql

    owner = pg_store_factory()
    record = RunRecord.new(_run_id())
    await owner.create(record)  # lays the tables out, as their owner
    role = f"app_{uuid.uuid4().hex[:12]}"
    ident = sql.Identifier
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident(pg_schema), ident(role))
        )
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                ident(pg_schema), ident(role)
            )
        )
    as_role = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
    try:
        async with PostgresStore(as_role, schema=pg_schema) as host:
            loaded = await host.load(record.run_id)
            assert loaded == record
            new, events = _step(record, "admit", state="running", deadline=1e9)
            await _commit(host, record, new, events)
            other = RunRecord.new(_run_id())
            await host.create(other)
            assert {s.run_id for s in await host.list_runs()} == {record.run_id, other.run_id}
        # ... and still cannot create anything: the privileges were minimal.
        with (
            psycopg.connect(as_role) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(sql.SQL("CREATE TABLE {}.x (a int)").format(ident(pg_schema)))
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(ident(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(ident(role)))


def _deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


async def test_sto_what_a_store_acknowledges_it_reads_back_alike_on_every_store(
    pg_store_factory: StoreFactory, tmp_path: Any
) -> None:
    """STO-01, STO-09: an event log a store acknowledged is read back, the
    same on every store: a command whose input nests as deep as a record
    may (its event wraps it in two more levels) reads back; an int command
    time comes back as the float every store keeps (SQL columns are
    doubles), and an int a double cannot hold exactly is refused; an empty
    event type, which no store reads back, is refused before anything is
    written."""
    from trio_backplane.kernel import RunEvent
    from trio_backplane.store import MemoryStore, SQLiteStore

    with pytest.raises(Error) as exc:
        Command("admit", 2**53 + 1, {"state": "running"})
    assert exc.value.error_class is ErrorClass.VALIDATION
    async with SQLiteStore(tmp_path / "runs.db") as sqlite:
        for store in (pg_store_factory(), sqlite, MemoryStore()):
            record = RunRecord.new(_run_id())
            await store.create(record)
            admitted, events = transition(record, Command("admit", 5, {"state": "running"}))
            empty = [RunEvent(type="", occurred_at=5.0, payload={})]
            await _raises(ErrorClass.VALIDATION, _commit(store, record, admitted, empty))
            await _commit(store, record, admitted, events)
            deep = {"status": "completed", "outcome": _deep(255)}
            finished, more = transition(admitted, Command("finish", 2**53, deep))
            await _commit(store, admitted, finished, more)
            log = await store.events(record.run_id)
            assert [(e.type, e.occurred_at) for e in log] == [
                ("run.admit", 5.0),
                ("run.finish", float(2**53)),
            ], type(store).__name__
            assert all(type(e.occurred_at) is float for e in log)
            assert log[1].payload["input"]["outcome"] == deep["outcome"]
            assert await store.load(record.run_id) == finished


async def test_sto_09_a_context_holding_the_placeholder_text_is_stored_as_it_is(
    pg_store_factory: StoreFactory, tmp_path: Any
) -> None:
    """STO-09: the SQL stores mark the record's growing lists with a
    placeholder in the head; since record schema version 2 those are the
    record's own fields, so a context (the host's data) holding that very
    text is stored and loaded back as it is, on create and on commit."""
    from trio_backplane.store import SQLiteStore
    from trio_backplane.store._layout import PLACEHOLDER

    async with SQLiteStore(tmp_path / "runs.db") as sqlite:
        for store in (pg_store_factory(), sqlite):
            for slot in ("messages", "usage"):
                clash = RunRecord.new(_run_id(), context={"conversation": {slot: PLACEHOLDER}})
                await store.create(clash)
                assert await store.load(clash.run_id) == clash
                record = RunRecord.new(_run_id())
                await store.create(record)
                admitted, events = _step(record, "admit", state="running", deadline=1e9)
                await _commit(store, record, admitted, events)
                record = admitted
                new, events = transition(
                    record,
                    Command(
                        "conversation_updated",
                        1.0,
                        {
                            "conversation": {slot: PLACEHOLDER},
                            "messages": [{"role": "user", "content": PLACEHOLDER}],
                        },
                    ),
                )
                await _commit(store, record, new, events)
                loaded = await store.load(record.run_id)
                assert loaded == new
                assert loaded is not None
                assert loaded.context["conversation"][slot] == PLACEHOLDER


async def test_sto_05_a_commit_no_store_can_hold_is_refused_alone_in_its_group(
    pg_dsn: str, pg_store_factory: StoreFactory, pg_schema: str
) -> None:
    """STO-05, STO-01: a commit refused before anything is sent (a key
    holding NUL, ``validation``) fails alone, refused by its caller before
    it is queued: the commits queued with it land in one transaction (it
    failed them all with its own ``validation`` once)."""
    store = pg_store_factory()
    plug = await _running(store, "plug")
    good = [await _running(store, f"good{i}") for i in range(2)]
    bad = await _running(store, "bad")
    new, events = _step(bad, "conversation_updated", conversation=_messages(1))
    poisoned = attrs.evolve(new, tool_results={"invocation\x00": {"content": []}})
    results: list[Any] = []

    async def rest() -> None:
        results.extend(
            await _race(
                functools.partial(_commit, store, bad, poisoned, events),
                *(
                    functools.partial(
                        _advance, store, record, "conversation_updated", conversation=_messages(1)
                    )
                    for record in good
                ),
            )
        )

    async with _RowLock(pg_dsn, pg_schema, plug.run_id) as lock, trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(
                _advance, store, plug, "conversation_updated", conversation=_messages(1)
            )
        )
        await lock.wait_for_waiters(1)
        nursery.start_soon(rest)
        with trio.fail_after(15):
            # the poisoned commit is refused by its caller, never queued
            while len(store._group.queue) < 2:
                await trio.sleep(0.01)
        await lock.release()
    assert isinstance(results[0], Error)
    assert results[0].error_class is ErrorClass.VALIDATION
    assert all(isinstance(r, RunRecord) for r in results[1:]), results
    for record in results[1:]:
        assert await store.load(record.run_id) == record
    assert await store.load(bad.run_id) == bad


async def test_sto_06_the_server_bounds_what_a_cut_or_vanished_host_holds(
    pg_dsn: str, pg_store_factory: StoreFactory, pg_schema: str
) -> None:
    """STO-06: a session of the store has ``lock_timeout`` and
    ``idle_in_transaction_session_timeout`` of ``operation_timeout`` and
    server-side keepalives: a commit cut while it waits for a row lock
    leaves no session of the store waiting on the server past
    ``operation_timeout`` (it waited on, holding the locks it took, until
    the lock was released)."""
    store = pg_store_factory(operation_timeout=1.0)
    record = await _running(store)

    def settings(driver: Any) -> Any:
        result = driver.connection.execute(
            "SELECT current_setting('lock_timeout'),"
            " current_setting('idle_in_transaction_session_timeout'),"
            " current_setting('tcp_keepalives_idle')"
        ).fetchone()
        driver.rollback()
        return result

    assert await store._call(settings) == ("1s", "1s", "10")
    # PostgreSQL takes these in ms up to 2**31 - 1: a longer operation_timeout
    # is held to that, never a failure of every call
    month = pg_store_factory(operation_timeout=30 * 86400.0)
    assert (await month._call(settings))[:2] == ("2147483647ms", "2147483647ms")
    new, events = _step(record, "conversation_updated", conversation=_messages(2))
    async with _RowLock(pg_dsn, pg_schema, record.run_id) as lock:
        # The caller's deadline (0.3 s) cuts the commit well before the
        # server's lock_timeout (1 s) would end its wait: the order of the two
        # is never a race.  The server's session is left waiting on the lock.
        with trio.move_on_after(0.3):
            error = await _raises(ErrorClass.STORAGE_FAILED, _commit(store, record, new, events))
        assert "cut at its deadline" in error.message
        await trio.sleep(1.5)  # past the server's own lock_timeout
        waiting = await _sql(
            pg_dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE %s",
            (f'%"{pg_schema}"%',),
        )
        assert waiting == [(0,)]
        await lock.release()
    await _commit(store, record, new, events)
    assert await store.load(record.run_id) == new


async def test_sto_runs_written_by_earlier_code_read_as_written(
    pg_dsn: str, pg_schema: str
) -> None:
    """The rows of ``tests/fixtures/layout2.sqlite3`` (written by earlier
    code, the layout both SQL stores share) copied into PostgreSQL read
    through ``PostgresStore`` as ``SQLiteStore`` reads them from the file,
    and the run waiting there commits on (issue 21: both stores read
    databases written by earlier code)."""
    import sqlite3

    from tests.conftest import FIXTURES
    from trio_backplane.store import SQLiteStore

    psycopg = _psycopg()
    with sqlite3.connect(FIXTURES / "layout2.sqlite3") as source:
        tables = {
            name: source.execute(f"SELECT * FROM {name}").fetchall()
            for name in ("runs", "run_parts", "run_events")
        }
    async with PostgresStore(pg_dsn, schema=pg_schema) as store:
        assert await store.list_runs() == []  # lays the tables out
        with psycopg.connect(pg_dsn) as conn:  # a test's own setup: blocking is fine
            for name, rows in tables.items():
                marks = ", ".join(["%s"] * len(rows[0]))
                with conn.cursor() as cur:
                    cur.executemany(f'INSERT INTO "{pg_schema}".{name} VALUES ({marks})', rows)
        async with SQLiteStore(FIXTURES / "layout2.sqlite3", create_tables=False) as original:
            runs = await original.list_runs()
            assert runs
            assert await store.list_runs() == runs
            for summary in runs:
                assert await store.load(summary.run_id) == await original.load(summary.run_id)
                assert await store.events(summary.run_id) == await original.events(summary.run_id)
        waiting = [s for s in runs if s.state == "running"]
        assert waiting
        record = await store.load(waiting[0].run_id)
        assert record is not None
        new, events = _step(record, "conversation_updated", conversation=_messages(2))
        receipt = await _commit(store, record, new, events)
        assert receipt.revision == record.revision + 1
    async with PostgresStore(pg_dsn, schema=pg_schema) as other:
        assert await other.load(record.run_id) == new
