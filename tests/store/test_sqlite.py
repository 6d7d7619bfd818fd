"""``SQLiteStore``: STO-01, 02, 04, 05, 06, 08, 09, group commit, incremental commits."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.store import faults
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import Command, RunEvent, RunRecord, evolve_record, transition
from trio_backplane.store import SQLiteStore
from trio_backplane.store._diff import split
from trio_backplane.store._layout import join, join_record


def _admitted(run_id: str, **kwargs: Any) -> RunRecord:
    record = RunRecord.new(run_id, **kwargs)
    record, _ = transition(record, Command("admit", 0.0, {"state": "running"}))
    return record


async def _fresh(store: SQLiteStore, run_id: str, **kwargs: Any) -> RunRecord:
    record = RunRecord.new(run_id, **kwargs)
    await store.create(record)
    return record


async def _step(store: SQLiteStore, record: RunRecord, command: Command) -> RunRecord:
    new, events = transition(record, command)
    receipt = await store.commit(
        record.run_id,
        incarnation=record.incarnation,
        expected_revision=record.revision,
        record=new,
        events=events,
    )
    assert receipt.revision == record.revision + 1
    return new


def _turn(record: RunRecord, n: int) -> list[Command]:
    """A provider_started / provider_completed pair appending one message."""
    message = {"role": "assistant", "content": f"reply {n}"}
    return [
        Command("provider_started", float(n)),
        Command(
            "provider_completed",
            float(n),
            {"result": {"text": f"reply {n}"}, "messages": [message]},
        ),
    ]


async def _run_turns(store: SQLiteStore, record: RunRecord, turns: int) -> RunRecord:
    for n in range(turns):
        started, _ = transition(record, Command("provider_started", float(n)))
        record = await _step(store, record, Command("provider_started", float(n)))
        assert record == started
        record = await _step(store, record, _turn(record, n)[1])
    return record


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    async with SQLiteStore(tmp_path / "runs.db") as s:
        yield s


async def test_sto01_commit_is_compare_and_set_with_events(store: SQLiteStore) -> None:
    """STO-01: a matching commit writes record and events; revision + 1."""
    record = await _fresh(store, "r1")
    new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    receipt = await store.commit(
        "r1", incarnation=1, expected_revision=0, record=new, events=events
    )
    assert (receipt.run_id, receipt.incarnation, receipt.revision) == ("r1", 1, 1)
    assert await store.load("r1") == new
    logged = await store.events("r1")
    assert [(e.sequence, e.type) for e in logged] == [(1, "run.admit")]
    assert logged[0].payload["state"] == "running"


async def test_sto02_stale_revision_and_replay_conflict(store: SQLiteStore) -> None:
    """STO-02: a stale expected_revision, an accepted commit replayed included,
    raises resource_conflict and never overwrites the newer record."""
    record = await _fresh(store, "r1")
    new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    await store.commit("r1", incarnation=1, expected_revision=0, record=new, events=events)
    newer = await _step(store, new, Command("provider_started", 2.0))
    with pytest.raises(Error) as info:  # replay of the accepted commit
        await store.commit("r1", incarnation=1, expected_revision=0, record=new, events=events)
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    other, other_events = transition(new, Command("start", 3.0))
    with pytest.raises(Error) as info:  # stale revision
        await store.commit(
            "r1", incarnation=1, expected_revision=1, record=other, events=other_events
        )
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert await store.load("r1") == newer
    assert len(await store.events("r1")) == 2


async def test_sto04_record_revision_must_follow(store: SQLiteStore) -> None:
    """STO-04: a record whose revision is not expected_revision + 1 raises
    validation and writes nothing."""
    record = await _fresh(store, "r1")
    new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    with pytest.raises(Error) as info:
        await store.commit("r1", incarnation=1, expected_revision=1, record=new, events=events)
    assert info.value.error_class is ErrorClass.VALIDATION
    assert await store.load("r1") == record
    assert await store.events("r1") == []


async def test_create_conflict_and_revision_zero(store: SQLiteStore) -> None:
    record = await _fresh(store, "r1")
    with pytest.raises(Error) as info:
        await store.create(record)
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    later, _ = transition(record, Command("admit", 1.0))
    with pytest.raises(Error) as info:
        await store.create(later)
    assert info.value.error_class is ErrorClass.VALIDATION
    assert await store.load("missing") is None
    new, events = transition(RunRecord.new("ghost"), Command("admit", 1.0))
    with pytest.raises(Error) as info:
        await store.commit("ghost", incarnation=1, expected_revision=0, record=new, events=events)
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT


async def test_sto05_sto06_failed_commit_leaves_previous_record(store: SQLiteStore) -> None:
    """STO-05 / STO-06: an I/O failure before COMMIT raises storage_failed (never
    resource_conflict); load returns exactly the previous record, no events."""
    record = await _fresh(store, "r1")
    record = await _step(store, record, Command("admit", 1.0, {"state": "running"}))
    new, events = transition(record, Command("provider_started", 2.0))
    faults.fail_next_commit(store)
    with pytest.raises(Error) as info:
        await store.commit("r1", incarnation=1, expected_revision=1, record=new, events=events)
    assert info.value.error_class is ErrorClass.STORAGE_FAILED
    assert isinstance(info.value.__cause__, sqlite3.Error)
    assert await store.load("r1") == record
    assert len(await store.events("r1")) == 1
    # the same commit goes through afterwards
    await store.commit("r1", incarnation=1, expected_revision=1, record=new, events=events)
    assert await store.load("r1") == new


async def test_sto06_lost_acknowledgement_is_reconciled_by_load(tmp_path: Path) -> None:
    """STO-06: a commit applied but whose acknowledgement is lost raises
    storage_failed; load (also after reopen) shows it was applied."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r1")
        new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
        faults.fail_next_commit(store, after_commit=True)
        with pytest.raises(Error) as info:
            await store.commit("r1", incarnation=1, expected_revision=0, record=new, events=events)
        assert info.value.error_class is ErrorClass.STORAGE_FAILED
        assert await store.load("r1") == new
    async with SQLiteStore(path) as again:
        assert await again.load("r1") == new
        assert [e.sequence for e in await again.events("r1")] == [1]


async def test_sto06_unwritable_path_is_storage_failed(tmp_path: Path) -> None:
    """STO-06: an I/O failure (here: the database cannot be opened)."""
    async with SQLiteStore(tmp_path / "missing-dir" / "runs.db") as store:
        with pytest.raises(Error) as info:
            await store.load("r1")
    assert info.value.error_class is ErrorClass.STORAGE_FAILED
    assert isinstance(info.value.__cause__, sqlite3.Error)


async def test_sto06_closed_store(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    await store.aclose()
    with pytest.raises(Error) as info:
        await store.load("r1")
    assert info.value.error_class is ErrorClass.STORAGE_FAILED


async def test_sto08_fence_is_atomic(tmp_path: Path) -> None:
    """STO-08: fence raises incarnation and revision atomically; the old
    incarnation's commit and a non-raising fence raise resource_conflict."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r1")
        record = await _step(store, record, Command("admit", 1.0, {"state": "running"}))
        receipt = await store.fence("r1", incarnation=2)
        assert (receipt.incarnation, receipt.revision) == (2, 2)
        stale, events = transition(record, Command("provider_started", 2.0))
        with pytest.raises(Error) as info:
            await store.commit(
                "r1", incarnation=1, expected_revision=1, record=stale, events=events
            )
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        for incarnation in (2, 1):
            with pytest.raises(Error) as info:
                await store.fence("r1", incarnation=incarnation)
            assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        with pytest.raises(Error) as info:
            await store.fence("missing", incarnation=5)
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        fenced = await store.load("r1")
        assert fenced is not None
        assert (fenced.incarnation, fenced.revision, fenced.state) == (2, 2, "running")
        logged = await store.events("r1")
        assert [e.type for e in logged] == ["run.admit", "run.fence"]
        # the new incarnation commits on
        await _step(store, fenced, Command("provider_started", 3.0))
    async with SQLiteStore(path) as again:
        reloaded = await again.load("r1")
        assert reloaded is not None
        assert (reloaded.incarnation, reloaded.revision) == (2, 3)


async def test_sto09_reopen_loads_equal_record(tmp_path: Path) -> None:
    """STO-09: a new SQLiteStore on the same file loads a record equal to the
    last committed one: conversation state, budget, intents, active work."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r1", work=50, context={"conversation": {"messages": []}})
        record = await _step(store, record, Command("admit", 1.0, {"state": "running"}))
        record = await _run_turns(store, record, 3)
        record = await _step(store, record, Command("provider_started", 9.0))
        record = await _step(
            store,
            record,
            Command(
                "provider_completed",
                9.5,
                {
                    "conversation": {"turn": 4},
                    "messages": [{"role": "user", "content": "ünï"}],
                },
            ),
        )
        record = await _step(
            store, record, Command("tool_invoked", 10.0, {"tool_name": "t", "tool_call_id": "c1"})
        )
        record = await _step(
            store, record, Command("tool_invoked", 10.5, {"tool_name": "t", "tool_call_id": "c2"})
        )
        first = sorted(record.active_tools)[0]
        record = await _step(
            store,
            record,
            Command("tool_completed", 11.0, {"invocation_id": first, "result": {"ok": 1.5}}),
        )
        assert record.active_tools
        assert record.tool_results
        assert record.budget.reservations
        assert await store.load("r1") == record
    async with SQLiteStore(path) as again:
        reloaded = await again.load("r1")
        assert reloaded == record
        assert reloaded is not None
        assert reloaded.conversation == record.conversation
        assert reloaded.budget == record.budget
        assert reloaded.intents == record.intents
        assert reloaded.active_tools == record.active_tools
        # a cold store commits on from what it read
        await _step(again, reloaded, Command("cancel", 12.0))
        assert [s.state for s in await again.list_runs()] == ["cancelling"]


async def test_list_runs_and_events_after(store: SQLiteStore) -> None:
    a = await _fresh(store, "a")
    await _fresh(store, "b")
    await _step(store, a, Command("admit", 1.0, {"state": "running"}))
    runs = await store.list_runs()
    assert [(r.run_id, r.revision, r.state) for r in runs] == [
        ("a", 1, "running"),
        ("b", 0, "queued"),
    ]
    assert [r.run_id for r in await store.list_runs(states={"queued"})] == ["b"]
    assert await store.list_runs(states=()) == []
    record = await store.load("a")
    assert record is not None
    await _run_turns(store, record, 2)
    assert [e.sequence for e in await store.events("a", after=2)] == [3, 4, 5]


async def test_layout_is_join_record_compatible(tmp_path: Path) -> None:
    """The head and parts written are the ``_layout`` ones (plus reservations)."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r1", context={"conversation": {"messages": []}})
        record = await _step(store, record, Command("admit", 1.0, {"state": "running"}))
        record = await _run_turns(store, record, 3)
    with sqlite3.connect(path) as conn:
        (head,) = conn.execute("SELECT head FROM runs").fetchone()
        parts = {(p, k): v for p, k, v in conn.execute("SELECT part, key, value FROM run_parts")}
    conn.close()
    assert (head, parts) == split(record)
    plain = join_record(head, parts)
    assert len(plain["transcript"]) == 3
    assert len(plain["intents"]) == 3
    assert join(head, parts)["budget"]["reservations"] == dict(record.budget.reservations)


# -- group commit ----------------------------------------------------------------


async def test_group_commit_100_runs_20_commits(store: SQLiteStore) -> None:
    """100 runs committing at once, 20 commits each: all succeed, batched,
    and every run's events are in order."""
    records = {}
    for i in range(100):
        records[f"run-{i:03d}"] = await _fresh(store, f"run-{i:03d}", work=100)

    async def drive(run_id: str) -> None:
        record = await _step(store, records[run_id], Command("admit", 0.0, {"state": "running"}))
        for n in range(19):
            record = await _step(
                store,
                record,
                _turn(record, n)[n % 2] if n % 2 else Command("provider_started", float(n)),
            )
        records[run_id] = record

    async with trio.open_nursery() as nursery:
        for run_id in records:
            nursery.start_soon(drive, run_id)
    assert store.stats["commits"] == 2000
    assert store.stats["batches"] < 2000 / 4, store.stats
    for run_id, record in records.items():
        assert record.revision == 20
        assert await store.load(run_id) == record
        logged = await store.events(run_id)
        assert [e.sequence for e in logged] == list(range(1, 21))
        assert [e.occurred_at for e in logged][1:] == sorted(e.occurred_at for e in logged[1:])


async def _commit_into(
    results: dict[Any, Any], key: Any, store: SQLiteStore, record: RunRecord, command: Command
) -> None:
    """Commit ``command`` over ``record``: ``results[key]`` is the receipt or
    the ``Error`` (for commits raced in one nursery)."""
    new, events = transition(record, command)
    try:
        results[key] = await store.commit(
            record.run_id,
            incarnation=1,
            expected_revision=record.revision,
            record=new,
            events=events,
        )
    except Error as exc:
        results[key] = exc


async def test_group_commit_conflict_fails_alone(store: SQLiteStore) -> None:
    """A conflicting commit inside a batch fails alone; the others commit."""
    records = [await _fresh(store, f"r{i}") for i in range(10)]
    # run 9 moves on first, so the batch below carries one stale commit for it
    ahead = await _step(store, records[9], Command("admit", 0.5, {"state": "queued"}))
    results: dict[int, Any] = {}
    admit = Command("admit", 1.0, {"state": "running"})

    async def commit(i: int, record: RunRecord) -> None:
        await _commit_into(results, i, store, record, admit)

    before = store.stats["batches"]
    async with trio.open_nursery() as nursery:
        for i, record in enumerate(records):
            nursery.start_soon(commit, i, record)
        # a second writer races run 3 on the same revision (it queues behind
        # the first: a run's commits are never in one batch together)
        nursery.start_soon(commit, 30, records[3])
    conflicts = sorted(i for i, r in results.items() if isinstance(r, Error))
    assert len(conflicts) == 2
    assert 9 in conflicts
    assert set(conflicts) - {9} <= {3, 30}  # whichever of the racers lost
    for i in conflicts:
        assert results[i].error_class is ErrorClass.RESOURCE_CONFLICT
    # the leader's own batch of one, then everything else together, then the racer
    assert store.stats["batches"] - before <= 3
    for record in records[:9]:
        loaded = await store.load(record.run_id)
        assert loaded is not None
        assert loaded.revision == 1
        assert len(await store.events(record.run_id)) == 1
    assert await store.load("r9") == ahead


async def test_group_commit_failure_fails_whole_batch(store: SQLiteStore) -> None:
    """A failed shared COMMIT fails every commit of the batch with storage_failed
    and leaves each of their runs untouched; the others commit."""
    records = [await _fresh(store, f"r{i}") for i in range(20)]
    outcomes: dict[str, Any] = {}

    async def commit(record: RunRecord) -> None:
        new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
        try:
            outcomes[record.run_id] = await store.commit(
                record.run_id, incarnation=1, expected_revision=0, record=new, events=events
            )
        except Error as exc:
            outcomes[record.run_id] = exc

    faults.fail_next_commit(store)
    async with trio.open_nursery() as nursery:
        for record in records:
            nursery.start_soon(commit, record)
    failed = {run_id for run_id, o in outcomes.items() if isinstance(o, Error)}
    assert failed
    for run_id, result in outcomes.items():
        loaded = await store.load(run_id)
        assert loaded is not None
        if run_id in failed:
            assert result.error_class is ErrorClass.STORAGE_FAILED
            assert loaded.revision == 0
            assert await store.events(run_id) == []
        else:
            assert loaded.revision == 1
            assert len(await store.events(run_id)) == 1


async def test_cancelled_queued_commit_writes_nothing(store: SQLiteStore) -> None:
    """A commit cancelled before its batch is taken is withdrawn."""
    a = await _fresh(store, "a")
    b = await _fresh(store, "b")
    new_a, ev_a = transition(a, Command("admit", 1.0))
    new_b, ev_b = transition(b, Command("admit", 1.0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: store.commit("a", incarnation=1, expected_revision=0, record=new_a, events=ev_a)
        )
        await trio.lowlevel.checkpoint()  # "a" leads, "b" queues behind it
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.commit("b", incarnation=1, expected_revision=0, record=new_b, events=ev_b)
    assert await store.load("a") == new_a
    assert await store.load("b") == b


# -- incremental commits ---------------------------------------------------------


async def test_commit_cost_does_not_grow_with_the_run(store: SQLiteStore) -> None:
    """Part rows written by commit N do not grow with N."""
    record = await _fresh(store, "r1", work=10_000, context={"conversation": {"messages": []}})
    record = await _step(store, record, Command("admit", 1.0, {"state": "running"}))
    rows: list[int] = []
    for n in range(60):
        for command in _turn(record, n):
            record = await _step(store, record, command)
            rows.append(store.stats["last_part_rows"])
    # provider_started: intent + reservation; provider_completed: intent + message
    assert set(rows) == {2}
    assert await store.load("r1") == record


async def test_3000_messages_reload_equal(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    messages = tuple(
        {"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(3000)
    )
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r1", context={"conversation": {"messages": []}})
        record = await _step(
            store,
            record,
            Command("admit", 1.0, {"state": "running", "messages": messages}),
        )
        record = await _run_turns(store, record, 2)
        assert store.stats["last_part_rows"] == 2
        # a transcript rewritten in the middle (by hand: commands only
        # append) rewrites only what changed
        edited = list(record.transcript)
        edited[1500] = {"role": "user", "content": "edited"}
        del edited[-1]
        new = evolve_record(record, transcript=edited, revision=record.revision + 1)
        await store.commit(
            "r1", incarnation=1, expected_revision=record.revision, record=new, events=[]
        )
        assert store.stats["last_part_rows"] == 2
        record = new
    async with SQLiteStore(path) as again:
        reloaded = await again.load("r1")
        assert reloaded == record
        assert reloaded is not None
        assert reloaded.conversation is not None
        assert len(reloaded.conversation["messages"]) == 3001
        assert reloaded.conversation["messages"][1500]["content"] == "edited"


# -- issue 4 item 8: commit 5 000 costs what commit 10 did ------------------------


def _long_turn(record: RunRecord, n: int) -> list[Command]:
    """Like ``_turn``, with the transcript kept frozen (as the runtime keeps it),
    so building 5 000 commits costs the test nothing per message."""
    from trio_backplane.kernel import FrozenList, freeze

    message = freeze({"role": "assistant", "content": f"reply {n}: " + "lorem ipsum " * 4})
    return [
        Command("provider_started", float(n)),
        Command(
            "provider_completed",
            float(n),
            {"result": {"text": f"reply {n}"}, "messages": FrozenList((message,))},
        ),
    ]


async def test_commit_5000_writes_and_encodes_what_commit_10_did(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The part rows written and the bytes encoded by commit 5 000 of one run
    equal those of commit 10 for the same kind of commit: the cost of a
    commit does not grow with the transcript (2 500 messages by then)."""
    from trio_backplane.store import _layout

    encoded: list[int] = []
    real_dumps = _layout.dumps

    def counting_dumps(value: Any) -> str:
        text = real_dumps(value)
        encoded.append(len(text))
        return text

    monkeypatch.setattr(_layout, "dumps", counting_dumps)
    record = await _fresh(store, "long", work=100_000, context={"conversation": {"messages": []}})
    record = await _step(store, record, Command("admit", 1.0, {"state": "running"}))
    cost: dict[int, tuple[str, int, int]] = {}  # revision -> (kind, part rows, bytes)
    n = 0
    while record.revision < 5_001:
        for command in _long_turn(record, n):
            encoded.clear()
            record = await _step(store, record, command)
            cost[record.revision] = (command.kind, store.stats["last_part_rows"], sum(encoded))
        n += 1
    for early, late in ((10, 5_000), (11, 4_999)):
        (kind, rows, size), (late_kind, late_rows, late_size) = cost[early], cost[late]
        assert kind == late_kind
        assert rows == late_rows == 2, (early, cost[early], late, cost[late])
        assert size > 0, cost[early]
        # only the digits of the growing ids and counters differ
        assert size <= late_size <= size + 64, (early, cost[early], late, cost[late])
    assert record.conversation is not None
    assert len(record.conversation["messages"]) == 2_500
    assert await store.load("long") == record


async def test_sto_06_a_damaged_schema_text_is_storage_failed(tmp_path: Path) -> None:
    """STO-06: a store file whose schema text is no longer UTF-8 (a torn
    write, a bad sector) is ``storage_failed`` naming the file, never a raw
    UnicodeDecodeError; ``backplane`` reports it without a traceback."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        await _fresh(store, "r")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    name = data.find(b"tablerun_partsrun_parts", 0, 4096)
    assert name > 0
    data[name + 5 : name + 7] = b"\xff\xfe"  # the table name's first bytes: not UTF-8
    path.write_bytes(bytes(data))
    async with SQLiteStore(path) as store:
        with pytest.raises(Error) as info:
            await store.load("r")
    assert info.value.error_class is ErrorClass.STORAGE_FAILED
    assert info.value.details["path"] == str(path)
    from trio_backplane.cli import main

    assert main(["runs", "list", str(path)]) == 2


@pytest.mark.parametrize("where", ["directory", "missing-parent", "not-a-database"])
async def test_a_file_that_cannot_be_a_store_says_which_and_why(tmp_path: Path, where: str) -> None:
    """A path that is a directory, under a missing directory, or a file that
    is not a database: ``storage_failed`` naming the path and sqlite's
    reason, so a person knows what to fix."""
    path = {
        "directory": tmp_path,
        "missing-parent": tmp_path / "missing" / "runs.db",
        "not-a-database": tmp_path / "notes.txt",
    }[where]
    if where == "not-a-database":
        path.write_text("plain text, not sqlite\n" * 100)
    async with SQLiteStore(path) as store:
        with pytest.raises(Error) as raised:
            await store.create(RunRecord.new("r"))
    assert raised.value.error_class is ErrorClass.STORAGE_FAILED
    assert raised.value.details["path"] == str(path)
    assert raised.value.details["cause"].split(":")[0] in ("OperationalError", "DatabaseError")


def _tables_and_journal(path: Path) -> tuple[list[str], str]:
    conn = sqlite3.connect(path)
    try:
        tables = sorted(n for (n,) in conn.execute("SELECT name FROM sqlite_master"))
        (journal,) = conn.execute("PRAGMA journal_mode").fetchone()
        return tables, journal
    finally:
        conn.close()


@pytest.mark.parametrize(
    "schema",
    [
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        "CREATE TABLE meta (name TEXT, value TEXT)",  # someone else's "meta"
    ],
)
async def test_sto_06_another_applications_database_is_refused_untouched(
    tmp_path: Path, schema: str
) -> None:
    """STO-06: a SQLite file another application owns (tables, but not this
    store's marker) is refused with ``validation`` naming the file; nothing
    is written to it, not even the switch to WAL."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute(schema)
    conn.commit()
    conn.close()
    before = _tables_and_journal(path)
    async with SQLiteStore(path) as store:
        for call in (store.list_runs, lambda: store.load("r"), lambda: _fresh(store, "r")):
            with pytest.raises(Error) as raised:
                await call()
            assert raised.value.error_class is ErrorClass.VALIDATION
            assert raised.value.details["path"] == str(path)
    assert _tables_and_journal(path) == before
    assert before[1] == "delete"


async def test_an_empty_database_file_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r")
        assert await store.load("r") == record


@pytest.mark.parametrize(
    ("table", "damage"),
    [
        ("runs", "UPDATE runs SET head = '{not json' WHERE run_id = 'bad'"),
        ("runs", "UPDATE runs SET head = '[1, 2]' WHERE run_id = 'bad'"),
        ("run_parts", "UPDATE run_parts SET value = '{' WHERE run_id = 'bad'"),
        ("run_events", "UPDATE run_events SET payload = 'nope' WHERE run_id = 'bad'"),
    ],
)
async def test_sto_06_damaged_rows_are_storage_failed_for_their_run_alone(
    tmp_path: Path, table: str, damage: str
) -> None:
    """STO-06: rows damaged outside the store give ``storage_failed`` naming
    the run and the file (never a raw ``JSONDecodeError``); a group commit
    carrying a commit to that run fails that commit alone, and the other
    runs' commits in the same transaction land."""
    path = tmp_path / "s.db"
    async with SQLiteStore(path) as store:
        bad = await _step(
            store, await _fresh(store, "bad"), Command("admit", 0.5, {"state": "running"})
        )
        bad = await _step(
            store,
            bad,
            Command("conversation_updated", 1.0, {"messages": ["hi"]}),
        )
        good = [await _fresh(store, f"good{i}") for i in range(5)]
    conn = sqlite3.connect(path)
    conn.execute(damage)
    conn.commit()
    conn.close()
    async with SQLiteStore(path) as store:  # remembers nothing: reads every run
        if table == "run_events":
            with pytest.raises(Error) as raised:
                await store.events("bad")
            assert raised.value.error_class is ErrorClass.STORAGE_FAILED
            assert raised.value.details["run_id"] == "bad"
            assert raised.value.details["path"] == str(path)
            return
        with pytest.raises(Error) as raised:
            await store.load("bad")
        assert raised.value.error_class is ErrorClass.STORAGE_FAILED
        assert (raised.value.details["run_id"], raised.value.details["path"]) == ("bad", str(path))
        results: dict[str, Any] = {}

        async def commit(record: RunRecord) -> None:
            command = (
                Command("admit", 2.0, {"state": "running"})
                if record.state == "queued"
                else Command("conversation_updated", 2.0, {"conversation": {"messages": []}})
            )
            await _commit_into(results, record.run_id, store, record, command)

        batches = store.stats["batches"]
        async with trio.open_nursery() as nursery:
            for record in (good[0], bad, *good[1:]):
                nursery.start_soon(commit, record)
        assert store.stats["batches"] - batches <= 2  # the rest shared one transaction
        assert isinstance(results["bad"], Error)
        assert results["bad"].error_class is ErrorClass.STORAGE_FAILED
        for record in good:
            loaded = await store.load(record.run_id)
            assert loaded is not None
            assert loaded.revision == record.revision + 1


async def test_sto_01_an_event_time_no_column_holds_fails_its_commit_alone(
    store: SQLiteStore,
) -> None:
    """STO-01: a commit carrying an event whose time no store column can hold
    (a hand-built ``RunEvent`` at 2**63) is refused with validation before it
    joins a batch; the commits racing it in one nursery go through."""
    records = [await _fresh(store, f"r{i}") for i in range(4)]
    results: dict[int, Any] = {}
    admit = Command("admit", 1.0, {"state": "running"})

    async def commit(i: int, record: RunRecord) -> None:
        new, events = transition(record, admit)
        if i == 2:
            events = [RunEvent(type=events[0].type, occurred_at=2**63, payload=events[0].payload)]
        try:
            results[i] = await store.commit(
                record.run_id, incarnation=1, expected_revision=0, record=new, events=events
            )
        except Error as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i, record in enumerate(records):
            nursery.start_soon(commit, i, record)
    refused = results.pop(2)
    assert isinstance(refused, Error)
    assert refused.error_class is ErrorClass.VALIDATION
    assert all(receipt.revision == 1 for receipt in results.values()), results
    assert await store.load("r2") == records[2]


@pytest.mark.parametrize("field", ["incarnation", "expected_revision"])
async def test_sto_08_an_identity_no_column_holds_is_validation(
    store: SQLiteStore, field: str
) -> None:
    """STO-08: an incarnation or revision of 2**63 (past SQLite's 64-bit
    integers) is refused with validation, for a fence and a commit alike,
    never a raw OverflowError; the run is untouched."""
    record = await _fresh(store, "r")
    new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    arguments: dict[str, Any] = {"incarnation": 1, "expected_revision": 0, field: 2**63}
    with pytest.raises(Error) as info:
        await store.commit("r", record=new, events=events, **arguments)
    assert info.value.error_class is ErrorClass.VALIDATION
    with pytest.raises(Error) as info:
        await store.fence("r", incarnation=2**63)
    assert info.value.error_class is ErrorClass.VALIDATION
    with pytest.raises(Error) as info:
        RunRecord(run_id="r", incarnation=2**63)
    assert info.value.error_class is ErrorClass.VALIDATION
    assert await store.load("r") == record


# -- other connections, other processes, the file under the store ----------------------


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """Another connection (as another process would) holding the write lock."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


async def test_sto_06_a_commit_waits_for_the_write_lock_until_its_deadline(
    tmp_path: Path,
) -> None:
    """STO-06, CAN-11: while another connection holds the write lock, a
    commit waits for it until its caller's deadline, no longer (not the 10 s
    busy timeout), and fails storage_failed with nothing written; once the
    lock is free the same commit goes through."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r")
        new, events = transition(record, Command("admit", 0.0, {"state": "running"}))
        other = _hold_write_lock(path)
        try:
            start = trio.current_time()
            with trio.CancelScope(shield=True, deadline=start + 0.5), pytest.raises(Error) as exc:
                await store.commit(
                    "r", incarnation=1, expected_revision=0, record=new, events=events
                )
            waited = trio.current_time() - start
        finally:
            other.rollback()
            other.close()
        assert exc.value.error_class is ErrorClass.STORAGE_FAILED
        assert "locked" in exc.value.details["cause"]
        assert 0.4 < waited < 3.0
        assert await store.load("r") == record
        receipt = await store.commit(
            "r", incarnation=1, expected_revision=0, record=new, events=events
        )
        assert receipt.revision == 1


async def test_can_11_sqlite_commit_outliving_commit_timeout_is_storage_failed(
    tmp_path: Path,
) -> None:
    """CAN-11: on SQLiteStore too, a checkpoint commit held up by another
    process's write lock past ``commit_timeout`` moves the conversation to
    ``storage_failed`` at that timeout (it used to be acknowledged after the
    lock was released, however late)."""
    from trio_backplane.runtime import open_conversation
    from trio_backplane.testing import ScriptedProvider
    from trio_backplane.tools import Authority, ToolRegistry

    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        await store.list_runs()  # the file is laid out
        registry = ToolRegistry([])
        async with open_conversation(
            "run-1",
            store=store,
            provider=ScriptedProvider([ScriptedProvider.text("hi")]),
            registry=registry,
            authority=Authority.for_registry(registry, caller="host", run_id="run-1"),
            commit_timeout=0.5,
        ) as conversation:
            other = _hold_write_lock(path)
            try:
                start = trio.current_time()
                with pytest.raises(Error) as exc:
                    await conversation.prompt("hello")
                waited = trio.current_time() - start
            finally:
                other.rollback()
                other.close()
            assert exc.value.error_class is ErrorClass.STORAGE_FAILED
            assert waited < 3.0
            assert conversation.status().phase == "storage_failed"


async def test_a_reader_never_waits_for_another_writer(tmp_path: Path) -> None:
    """A store opened on a file another connection is writing reads at once
    (WAL readers take no lock): it only takes the write lock to lay a new
    file out, never to check a laid-out one."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        await _fresh(store, "r")
    other = _hold_write_lock(path)
    try:
        async with SQLiteStore(path) as reader:
            with trio.fail_after(5):
                loaded = await reader.load("r")
                runs = await reader.list_runs()
    finally:
        other.rollback()
        other.close()
    assert loaded is not None
    assert [run.run_id for run in runs] == ["r"]


def test_switching_a_new_file_to_wal_waits_out_a_lock() -> None:
    """Several processes opening a new file at once: SQLite answers the WAL
    switch "database is locked" at once, without waiting; the store retries
    it until the busy timeout instead of failing the first call."""
    from trio_backplane.store._sql._sqlite import _journal_wal

    class Busy:
        def __init__(self, failures: int) -> None:
            self.failures = failures

        def execute(self, sql: str) -> Any:
            assert sql == "PRAGMA journal_mode = WAL"
            if self.failures:
                self.failures -= 1
                raise sqlite3.OperationalError("database is locked")
            return self

        def fetchone(self) -> tuple[str]:
            return ("wal",)

    class Broken(Busy):
        def execute(self, sql: str) -> Any:
            raise sqlite3.OperationalError("disk I/O error")

    assert _journal_wal(Busy(3)) == "wal"  # type: ignore[arg-type]
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        _journal_wal(Broken(0))  # type: ignore[arg-type]


async def test_sto_06_a_store_used_across_fork_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """STO-06: a store whose writer thread was started in another process
    (a fork copies the object, not the thread) refuses every call with
    storage_failed at once instead of waiting for ever."""
    import os

    async with SQLiteStore(tmp_path / "runs.db") as store:
        await _fresh(store, "r")
        parent = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: parent + 1)
        with trio.fail_after(5), pytest.raises(Error) as exc:
            await store.load("r")
        assert exc.value.error_class is ErrorClass.STORAGE_FAILED
        assert "forked" in exc.value.message
        monkeypatch.setattr(os, "getpid", lambda: parent)
        assert await store.load("r") is not None


@pytest.mark.parametrize("how", ["removed", "replaced"])
async def test_sto_06_a_commit_into_a_file_gone_from_its_path_fails(
    tmp_path: Path, how: str
) -> None:
    """STO-06: the file removed (or replaced by another) under a live store:
    a commit would land in a file nobody opens again, acknowledged and lost;
    it fails storage_failed instead, and a reopen never shows it."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        if how == "replaced":
            async with SQLiteStore(path) as replacement:
                await _fresh(replacement, "other")
        new, events = transition(record, Command("admit", 0.0, {"state": "running"}))
        with pytest.raises(Error) as exc:
            await store.commit("r", incarnation=1, expected_revision=0, record=new, events=events)
        assert exc.value.error_class is ErrorClass.STORAGE_FAILED
    async with SQLiteStore(path) as reopened:
        stored = await reopened.load("r")
    assert stored is None or stored.revision == 0


async def test_the_store_remembers_runs_up_to_a_number_of_entries(tmp_path: Path) -> None:
    """A host serving runs for days: what the store remembers is bounded by
    the entries of the records it remembers (``cache_items``), not by a
    number of runs (it kept 256 runs, and a 257th made every commit read its
    run back); a run it forgot commits on, read back from its row."""
    async with SQLiteStore(tmp_path / "runs.db", cache_items=50) as store:
        first = await _fresh(store, "run-0")
        for n in range(1, 100):
            await _step(
                store, await _fresh(store, f"run-{n}"), Command("admit", 0.0, {"state": "running"})
            )
        kept = [store.remembered(f"run-{n}") for n in range(100)]
        assert sum(run.size for run in kept if run is not None) <= 50
        assert kept[0] is None
        assert kept[-1] is not None
        admitted = await _step(store, first, Command("admit", 0.0, {"state": "running"}))
        assert await store.load("run-0") == admitted
        assert store.remembered("run-0") is not None


async def test_more_live_runs_than_a_run_count_commit_without_reading(tmp_path: Path) -> None:
    """300 live runs (more than the 256 the store used to remember) all stay
    remembered: each one's next commit is decided without a read."""
    async with SQLiteStore(tmp_path / "runs.db") as store:
        records = [await _fresh(store, f"run-{n}") for n in range(300)]
        admitted = [
            await _step(store, record, Command("admit", 0.0, {"state": "running"}))
            for record in records
        ]
        assert all(store.remembered(r.run_id) is not None for r in admitted)
        fast = store.stats["fast_commits"]
        for record in admitted:
            await _step(store, record, Command("provider_started", 1.0))
        assert store.stats["fast_commits"] == fast + 300


async def test_a_relative_path_names_one_file_whatever_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store opened on a relative path keeps committing to that file after
    the process changes directory (the identity check resolved the path
    again, and failed every commit)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    async with SQLiteStore("runs.db") as store:
        record = await _fresh(store, "r")
        monkeypatch.chdir(elsewhere)
        admitted = await _step(store, record, Command("admit", 0.0, {"state": "running"}))
        assert await store.load("r") == admitted
    assert not (elsewhere / "runs.db").exists()


async def test_sto_06_create_and_fence_into_a_removed_file_fail(tmp_path: Path) -> None:
    """STO-06, STO-08: ``create`` and ``fence`` commit too: into a file gone
    from its path they fail storage_failed, never acknowledged and lost."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        await _fresh(store, "r1")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        for call in (
            lambda: store.fence("r1", incarnation=2),
            lambda: store.create(RunRecord.new("r2")),
        ):
            with pytest.raises(Error) as exc:
                await call()
            assert exc.value.error_class is ErrorClass.STORAGE_FAILED


async def test_aclose_in_a_forked_process_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``aclose`` of a store whose writer thread another process started
    (a fork) returns at once instead of waiting for ever for that thread."""
    import os

    store = SQLiteStore(tmp_path / "runs.db")
    await _fresh(store, "r")
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)
    with trio.fail_after(5):
        await store.aclose()
    monkeypatch.setattr(os, "getpid", lambda: parent)
    (thread,) = store._workers.threads  # the real thread (this process's): stop it
    assert store._workers._shared is not None
    store._workers._shared.requests.put(None)
    thread.join(5)
    assert not thread.is_alive()


async def test_memory_database_stays_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SQLiteStore(":memory:")`` is SQLite's in-memory database: it
    commits and loads, and writes no file into the working directory."""
    monkeypatch.chdir(tmp_path)
    async with SQLiteStore(":memory:") as store:
        record = await _fresh(store, "r")
        admitted = await _step(store, record, Command("admit", 0.0, {"state": "running"}))
        assert await store.load("r") == admitted
        await store.fence("r", incarnation=2)
    assert list(tmp_path.iterdir()) == []


async def test_sto_a_run_id_holding_nul_is_validation_on_every_store(tmp_path: Path) -> None:
    """A run id holding NUL is a caller's mistake on every store
    (``validation``): PostgreSQL text cannot hold one, so it would otherwise
    be refused there as failed storage and kept elsewhere."""
    from trio_backplane.store import MemoryStore

    with pytest.raises(Error) as exc:
        RunRecord.new("run\x00id")
    assert exc.value.error_class is ErrorClass.VALIDATION
    async with SQLiteStore(tmp_path / "runs.db") as store:
        for current in (store, MemoryStore()):
            for call in (
                lambda s=current: s.load("run\x00id"),
                lambda s=current: s.events("run\x00id"),
                lambda s=current: s.fence("run\x00id", incarnation=2),
            ):
                with pytest.raises(Error) as exc:
                    await call()
                assert exc.value.error_class is ErrorClass.VALIDATION


async def test_sto_a_store_that_creates_no_tables_changes_nothing_it_reads(
    tmp_path: Path,
) -> None:
    """``create_tables=False`` (what an inspector uses): no file, no tables
    are created where there is no store (``not_found``, reason
    ``not_a_store``); a store written by an older trio_backplane (layout 1)
    is read as it is, never upgraded (older hosts would refuse it from then
    on), and a write to it is refused (``unsupported_capability``)."""
    missing = tmp_path / "missing.db"
    for path in (missing, tmp_path / "empty.db"):
        if path.name == "empty.db":
            path.write_bytes(b"")
        async with SQLiteStore(path, create_tables=False) as store:
            with pytest.raises(Error) as exc:
                await store.load("r")
            assert exc.value.error_class is ErrorClass.NOT_FOUND
            assert exc.value.details["reason"] == "not_a_store"
    assert not missing.exists()
    assert (tmp_path / "empty.db").read_bytes() == b""

    db = tmp_path / "old.db"
    record = RunRecord.new("r")
    async with SQLiteStore(db) as store:
        await store.create(record)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'layout_version'")
    conn.close()
    async with SQLiteStore(db, create_tables=False) as store:
        assert await store.load("r") == record
        new, events = transition(record, Command("admit", at=1.0, input={"state": "running"}))
        with pytest.raises(Error) as exc:
            await store.commit("r", incarnation=1, expected_revision=0, record=new, events=events)
        assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        for write in (store.create(RunRecord.new("s")), store.fence("r", incarnation=2)):
            with pytest.raises(Error) as exc:
                await write
            assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone() == ("1",)
    conn.close()
    with pytest.raises(Error) as exc:
        SQLiteStore(db, create_tables=1)  # type: ignore[arg-type]
    assert exc.value.error_class is ErrorClass.VALIDATION
