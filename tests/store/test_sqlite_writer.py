"""``SQLiteStore``'s writer thread and its commit cache: one thread owns the
connection, the hot path skips the reads, a stale cache is caught by the
compare-and-set, cancellation and closing keep their semantics."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.store import faults
from tests.store.test_sqlite import _step
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import Command, RunRecord, transition
from trio_backplane.store import SQLiteStore
from trio_backplane.store._sql import _workers


@pytest.fixture(params=["pipe", "token"])
def wake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A batch leader waits on the wake-up pipe (POSIX) or, as on Windows,
    through the Trio token like every other call."""
    if request.param == "token":
        monkeypatch.setattr(_workers, "_PIPES", False)
    return str(request.param)


def _command(record: RunRecord, n: int) -> Command:
    if record.state == "queued":
        return Command("admit", float(n), {"state": "running"})
    if record.active_provider is None:
        return Command("provider_started", float(n))
    message = {"role": "assistant", "content": f"m{n}"}
    return Command("provider_completed", float(n), {"messages": [message]})


def _next(record: RunRecord, n: int) -> tuple[RunRecord, list[Any]]:
    return transition(record, _command(record, n))


async def _commit(store: SQLiteStore, record: RunRecord, n: int = 0) -> RunRecord:
    return await _step(store, record, _command(record, n))


async def _fresh(store: SQLiteStore, run_id: str) -> RunRecord:
    record = RunRecord.new(run_id, context={"conversation": {}})
    await store.create(record)
    return record


def _writers(store: SQLiteStore) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"trio_backplane {store!r}")]


async def test_one_daemon_writer_thread_runs_every_sqlite_call(tmp_path: Path, wake: str) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    assert not _writers(store)  # started lazily
    seen: set[int] = set()
    statements: list[str] = []
    guarded = store._guarded

    def record_thread(fn: Any, driver: Any) -> Any:
        seen.add(threading.get_ident())
        return guarded(fn, driver)

    store._guarded = record_thread  # type: ignore[method-assign]
    record = await _fresh(store, "r")
    (writer,) = _writers(store)
    assert writer.daemon
    await store._call(lambda driver: driver.connection.set_trace_callback(statements.append))  # type: ignore[attr-defined]
    for n in range(4):
        record = await _commit(store, record, n)
    await store.fence("r", incarnation=2)
    assert await store.list_runs()
    assert len(await store.events("r")) == 5
    loaded = await store.load("r")
    assert loaded is not None
    assert (loaded.incarnation, loaded.revision) == (2, 5)
    assert seen == {writer.ident}
    assert threading.get_ident() not in seen
    # the commits after the first ran no SELECT: the cache was current
    commits = "".join(statements).split("BEGIN IMMEDIATE")[2:5]
    assert commits
    assert not [c for c in commits if "SELECT" in c], commits
    await store.aclose()
    assert not writer.is_alive()
    with pytest.raises(Error) as info:
        await store.load("r")
    assert info.value.error_class is ErrorClass.STORAGE_FAILED


async def test_a_stale_cache_is_caught_by_the_compare_and_set(tmp_path: Path) -> None:
    """Two stores on one file: each one's cache goes stale when the other
    writes.  A stale commit is refused (never applied over the newer record),
    a reloaded one goes through, and event sequences never repeat."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as a, SQLiteStore(path) as b:
        record = await _fresh(a, "r")
        r1 = await _commit(a, record, 1)  # a caches r1
        loaded = await b.load("r")
        assert loaded == r1
        r2 = await _commit(b, loaded, 2)  # b moves the run on
        stale, events = _next(r1, 3)
        with pytest.raises(Error) as info:  # a's cache says r1 is current: it is not
            await a.commit("r", incarnation=1, expected_revision=1, record=stale, events=events)
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert await a.load("r") == r2
        r3 = await _commit(a, r2, 3)
        with pytest.raises(Error) as info:  # now b's cache is stale
            await _commit(b, r2, 4)
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        # b fences from its (stale) cache: the row is read, the fence applies to r3
        receipt = await b.fence("r", incarnation=2)
        assert (receipt.incarnation, receipt.revision) == (2, 4)
        with pytest.raises(Error) as info:  # a's cache still holds incarnation 1
            await _commit(a, r3, 5)
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert "fenced" in info.value.message
        fenced = await a.load("r")
        assert fenced is not None
        await _commit(a, fenced, 6)
        logged = await b.events("r")
        assert [e.sequence for e in logged] == [1, 2, 3, 4, 5]
        assert [e.type for e in logged][3] == "run.fence"
    async with SQLiteStore(path) as again:
        final = await again.load("r")
        assert final is not None
        assert (final.incarnation, final.revision) == (2, 5)


async def test_event_sequence_after_failures_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r")
        record = await _commit(store, record, 1)
        faults.fail_next_commit(store)
        new, events = _next(record, 2)
        with pytest.raises(Error):
            await store.commit("r", incarnation=1, expected_revision=1, record=new, events=events)
        record = await _commit(store, record, 2)
        faults.fail_next_commit(store, after_commit=True)
        with pytest.raises(Error):
            await _commit(store, record, 3)
        reloaded = await store.load("r")
        assert reloaded is not None
        assert reloaded.revision == 3
        await _commit(store, reloaded, 4)
    async with SQLiteStore(path) as again:
        reloaded = await again.load("r")
        assert reloaded is not None
        await _commit(again, reloaded, 5)
        assert [e.sequence for e in await again.events("r")] == [1, 2, 3, 4, 5]


async def test_a_cancelled_leader_waits_its_batch_out(tmp_path: Path, wake: str) -> None:
    """Cancelled while its batch is in the writer thread, the leader waits for
    the outcome: the commit is applied and acknowledged, the cancellation is
    delivered at the caller's next checkpoint; the follower queued behind it,
    not taken yet, is withdrawn."""
    async with SQLiteStore(tmp_path / "runs.db") as store:
        a = await _fresh(store, "a")
        b = await _fresh(store, "b")
        write_batch = store._batch
        started = threading.Event()

        def slow(jobs: Any, *rest: Any) -> None:
            started.set()
            time.sleep(0.2)
            write_batch(jobs, *rest)

        store._batch = slow  # type: ignore[method-assign]
        receipts: dict[str, Any] = {}
        new_a, ev_a = _next(a, 1)
        new_b, ev_b = _next(b, 1)
        with trio.CancelScope() as scope:

            async def lead() -> None:
                receipts["a"] = await store.commit(
                    "a", incarnation=1, expected_revision=0, record=new_a, events=ev_a
                )

            async def follow() -> None:
                receipts["b"] = await store.commit(
                    "b", incarnation=1, expected_revision=0, record=new_b, events=ev_b
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(lead)
                await trio.to_thread.run_sync(started.wait)
                nursery.start_soon(follow)
                await trio.sleep(0.01)
                scope.cancel()
        assert scope.cancelled_caught
        assert receipts["a"].revision == 1
        assert "b" not in receipts
        store._batch = write_batch  # type: ignore[method-assign]
        assert await store.load("a") == new_a
        assert await store.load("b") == b
        # the store goes on: the thread and the wake-up pipe are fine
        assert await _commit(store, new_a, 2) == (await store.load("a"))


async def test_a_follower_cancelled_once_its_batch_is_taken_gets_its_outcome(
    tmp_path: Path, wake: str
) -> None:
    """A queued commit taken into a batch is in flight: its caller, cancelled
    then, still waits for the outcome (the commit is applied and its receipt
    returned) and the cancellation arrives at its next checkpoint; it is
    never both written and reported as withdrawn."""
    async with SQLiteStore(tmp_path / "runs.db") as store:
        a, b, c = [await _fresh(store, name) for name in "abc"]
        write_batch = store._batch
        batches: list[list[str]] = []
        taken = threading.Semaphore(0)

        def slow(jobs: Any, *rest: Any) -> None:
            batches.append(sorted(job.run_id for job in jobs))
            taken.release()
            time.sleep(0.2)
            write_batch(jobs, *rest)

        store._batch = slow  # type: ignore[method-assign]
        receipts: dict[str, Any] = {}
        after_cancel: list[str] = []

        async def commit(record: RunRecord) -> None:
            new, events = _next(record, 1)
            receipts[record.run_id] = await store.commit(
                record.run_id, incarnation=1, expected_revision=0, record=new, events=events
            )
            after_cancel.append("returned")
            await trio.lowlevel.checkpoint()
            after_cancel.append("not cancelled")

        follower = trio.CancelScope()

        async def cancellable_c() -> None:
            with follower:
                await commit(c)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit, a)
            await trio.to_thread.run_sync(taken.acquire)  # a's batch is in the thread
            nursery.start_soon(commit, b)
            nursery.start_soon(cancellable_c)
            await trio.to_thread.run_sync(taken.acquire)  # the next batch is taken
            follower.cancel()
        assert batches == [["a"], ["b", "c"]]
        assert follower.cancelled_caught
        assert all(receipts[name].revision == 1 for name in "abc")
        # a and b carry on; c has its receipt, then its cancellation
        assert sorted(after_cancel) == ["not cancelled"] * 2 + ["returned"] * 3
        for record in (a, b, c):
            stored = await store.load(record.run_id)
            assert stored is not None
            assert stored.revision == 1
        store._batch = write_batch  # type: ignore[method-assign]


async def test_closing_fails_queued_commits_and_new_work(tmp_path: Path, wake: str) -> None:
    store = SQLiteStore(tmp_path / "runs.db")
    records = [await _fresh(store, f"r{i}") for i in range(5)]
    write_batch = store._batch

    def slow(jobs: Any, *rest: Any) -> None:
        time.sleep(0.05)
        write_batch(jobs, *rest)

    store._batch = slow  # type: ignore[method-assign]
    outcomes: dict[str, Any] = {}

    async def commit(record: RunRecord) -> None:
        try:
            outcomes[record.run_id] = await _commit(store, record, 1)
        except Error as exc:
            outcomes[record.run_id] = exc

    async with trio.open_nursery() as nursery:
        for record in records:
            nursery.start_soon(commit, record)
        await trio.sleep(0.01)  # the leader's batch is in the thread, the others queued
        await store.aclose()
    done = [run_id for run_id, o in outcomes.items() if isinstance(o, RunRecord)]
    assert len(done) == 1, outcomes
    for run_id, failure in outcomes.items():
        if run_id not in done:
            assert isinstance(failure, Error)
            assert failure.error_class is ErrorClass.STORAGE_FAILED
    assert not _writers(store)
    with pytest.raises(Error) as info:
        await _commit(store, records[1], 1)
    assert info.value.error_class is ErrorClass.STORAGE_FAILED
    async with SQLiteStore(tmp_path / "runs.db") as again:
        stored = {r.run_id: r.revision for r in await again.list_runs()}
        assert stored == {f"r{i}": int(f"r{i}" in done) for i in range(5)}


def test_the_writer_outlives_a_trio_run_and_a_dropped_store_stops_it(tmp_path: Path) -> None:
    """A store used by one Trio run and then another keeps its thread (nothing
    hangs when the first run ends); a store dropped without ``aclose`` stops
    its thread."""
    store = SQLiteStore(tmp_path / "runs.db")

    async def first() -> RunRecord:
        return await _commit(store, await _fresh(store, "r"), 1)

    record = trio.run(first)
    (writer,) = _writers(store)
    assert writer.is_alive()

    async def second() -> None:
        assert await store.load("r") == record
        await _commit(store, record, 2)

    trio.run(second)
    assert writer.is_alive()
    ref = weakref.ref(store)
    del store
    gc.collect()
    assert ref() is None
    writer.join(timeout=10)
    assert not writer.is_alive()
    store = SQLiteStore(tmp_path / "runs.db")

    async def third() -> None:
        async with store:
            loaded = await store.load("r")
            assert loaded is not None
            assert loaded.revision == 2

    trio.run(third)
    assert not _writers(store)


async def test_group_commit_through_either_wake_up(tmp_path: Path, wake: str) -> None:
    """50 runs x 10 commits at once, a conflict and an injected failure among
    them: batched, every run's record and events exact."""
    async with SQLiteStore(tmp_path / "runs.db") as store:
        records = {f"r{i:02d}": await _fresh(store, f"r{i:02d}") for i in range(50)}
        conflicts: list[tuple[str, ErrorClass]] = []

        async def drive(run_id: str) -> None:
            record = records[run_id]
            for n in range(10):
                record = await _commit(store, record, n)
            stale, events = _next(records[run_id], 0)
            with pytest.raises(Error) as info:  # a replay of its first commit
                await store.commit(
                    run_id, incarnation=1, expected_revision=0, record=stale, events=events
                )
            conflicts.append((run_id, info.value.error_class))
            records[run_id] = record

        async with trio.open_nursery() as nursery:
            for run_id in records:
                nursery.start_soon(drive, run_id)
        assert sorted(conflicts) == [(r, ErrorClass.RESOURCE_CONFLICT) for r in sorted(records)]
        assert store.stats["commits"] == 500
        assert store.stats["batches"] < 500 / 4
        for run_id, record in records.items():
            assert await store.load(run_id) == record
            assert [e.sequence for e in await store.events(run_id)] == list(range(1, 11))
        faults.fail_next_commit(store)
        failures: list[ErrorClass] = []

        async def one(record: RunRecord) -> None:
            try:
                await _commit(store, record, 11)
            except Error as exc:
                failures.append(exc.error_class)

        async with trio.open_nursery() as nursery:
            for record in records.values():
                nursery.start_soon(one, record)
        assert failures
        assert set(failures) == {ErrorClass.STORAGE_FAILED}
        revisions = [r.revision for r in await store.list_runs()]
        assert sorted(revisions) == [10] * len(failures) + [11] * (50 - len(failures))


async def test_a_commit_that_keeps_the_state_leaves_the_state_index_alone(tmp_path: Path) -> None:
    """STO-01: the state column and its index follow every commit: a commit
    that changes the state writes it, one that keeps it does not rewrite the
    index entry (one page fewer in the WAL), and lookups by state stay right."""
    import sqlite3

    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        record = await _fresh(store, "r1")
        record = await _commit(store, record, 1)  # admit: queued -> running
        for n in range(2, 8):  # provider_started / provider_completed: running stays
            record = await _commit(store, record, n)
        assert [s.run_id for s in await store.list_runs(states=["running"])] == ["r1"]
        assert await store.list_runs(states=["queued"]) == []
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT run_id, state, revision FROM runs INDEXED BY runs_state WHERE state = ?",
            ("running",),
        ).fetchall()
    finally:
        conn.close()
    assert rows == [("r1", "running", record.revision)]


async def test_a_commit_of_something_else_than_run_events_writes_nothing(tmp_path: Path) -> None:
    """STO-04/STO-05: events that are not ``RunEvent`` values are refused with
    ``validation`` before anything is written, on the remembered-run path and
    after a reopen (the row read back) alike."""
    for reopen in (False, True):
        path = tmp_path / f"runs-{reopen}.db"
        async with SQLiteStore(path) as store:
            record = await _commit(store, await _fresh(store, "r1"), 1)
        async with SQLiteStore(path) as store:
            if not reopen:
                record = await _commit(store, await store.load("r1") or record, 2)
            new, events = _next(record, 3)
            bad = [*events, {"type": "run.x", "occurred_at": 3.0, "payload": {}}]
            with pytest.raises(Error) as caught:
                await store.commit(
                    "r1",
                    incarnation=1,
                    expected_revision=record.revision,
                    record=new,
                    events=bad,
                )
            assert caught.value.error_class is ErrorClass.VALIDATION
            assert await store.load("r1") == record
            assert [e.sequence for e in await store.events("r1")] == list(
                range(1, record.revision + 1)
            )


async def test_a_batch_written_together_over_a_stale_cache_decides_each_commit_alone(
    tmp_path: Path,
) -> None:
    """A batch is written with one statement per kind of row.  When its
    compare-and-set matches fewer rows than it carries commits (another store
    moved a run on), the whole batch is rolled back and each commit decided
    from the stored rows: the stale one is refused and writes nothing, the
    others commit, every run's events stay numbered in order."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as a, SQLiteStore(path) as b:
        runs = [await _commit(a, await _fresh(a, f"r{i}"), 1) for i in range(5)]
        loaded = await b.load("r2")
        assert loaded is not None
        moved = await _commit(b, loaded, 2)  # a's cache of r2 is stale now
        gate = threading.Event()
        write_batch = a._batch
        sizes: list[int] = []

        def gated(jobs: Any, *rest: Any) -> None:
            gate.wait()
            sizes.append(len(jobs))
            write_batch(jobs, *rest)

        a._batch = gated  # type: ignore[method-assign]
        results: dict[int, Any] = {}

        async def commit(i: int) -> None:
            new, events = _next(runs[i], 5)
            try:
                results[i] = await a.commit(
                    f"r{i}", incarnation=1, expected_revision=1, record=new, events=events
                )
            except Error as exc:
                results[i] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit, 4)  # the leader: its batch of one waits at the gate
            await trio.testing.wait_all_tasks_blocked()
            for i in range(4):
                nursery.start_soon(commit, i)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        assert sizes == [1, 4]
        refused = results.pop(2)
        assert isinstance(refused, Error)
        assert refused.error_class is ErrorClass.RESOURCE_CONFLICT
        assert all(receipt.revision == 2 for receipt in results.values()), results
        assert await b.load("r2") == moved
        for i in (0, 1, 3, 4):
            assert await b.load(f"r{i}") == _next(runs[i], 5)[0]
            assert [e.sequence for e in await b.events(f"r{i}")] == [1, 2]
        logged = await b.events("r2")
        assert [e.sequence for e in logged] == [1, 2]
        assert logged[1].occurred_at == 2.0  # b's commit, not a's stale one
        # a's cache of r2 was dropped: a commit over the stored record goes through
        assert (await _commit(a, moved, 3)).revision == 3
