"""The SQL store engine's own paths, driven through a ``SQLiteDriver``:
cuts of work no worker took, and a group refused part-way through."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import Command, RunRecord, transition
from trio_backplane.store import SQLiteStore
from trio_backplane.store._sql import _workers
from trio_backplane.store._sql._driver import EventTuple
from trio_backplane.store._sql._engine import SQLStore
from trio_backplane.store._sql._rows import RunRow, Writes
from trio_backplane.store._sql._sqlite import SQLiteDriver


def _admitted(run_id: str) -> tuple[RunRecord, RunRecord, list[Any]]:
    record = RunRecord.new(run_id)
    new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    return record, new, events


async def _commit(store: Any, old: RunRecord, new: RunRecord, events: list[Any]) -> Any:
    return await store.commit(
        old.run_id,
        incarnation=old.incarnation,
        expected_revision=old.revision,
        record=new,
        events=events,
    )


async def _occupy(store: SQLStore, started: threading.Event, release: threading.Event) -> None:
    """Keep the store's one worker busy until ``release``."""

    def busy(driver: Any) -> None:
        started.set()
        release.wait(10)

    await store._call(busy)


@pytest.mark.parametrize("pipe", [True, False], ids=["pipe", "token"])
async def test_a_batch_no_worker_took_by_its_cut_fails_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: MockClock, pipe: bool
) -> None:
    """A store that cuts its calls (``cut_after``, as ``PostgresStore``
    does): a commit batch still queued behind a busy worker at its cut time
    is withdrawn and fails ``storage_failed`` "cut at its deadline", through
    either wake-up (the token path once waited for ever), and writes
    nothing."""
    monkeypatch.setattr(_workers, "_PIPES", pipe)
    path = str(tmp_path / "runs.db")
    store = SQLStore(lambda: SQLiteDriver(path, create_tables=True), name="cutting", cut_after=5.0)
    record, new, events = _admitted("r")
    await store.create(record)
    started, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    async def commit() -> None:
        try:
            await _commit(store, record, new, events)
        except Error as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_occupy, store, started, release)
        await trio.to_thread.run_sync(started.wait)
        nursery.start_soon(commit)
        shared = store._workers._shared
        assert shared is not None
        while shared.requests.qsize() < 1:  # the batch waits behind the busy worker
            await trio.lowlevel.checkpoint()
        mock_clock.jump(6.0)  # past the batch's cut time
        while not failures:
            await trio.lowlevel.checkpoint()
        release.set()
    (failure,) = failures
    assert isinstance(failure, Error)
    assert failure.error_class is ErrorClass.STORAGE_FAILED
    assert "cut at its deadline" in failure.message
    stored = await store.load("r")
    assert stored is not None
    assert stored.revision == 0
    await store.aclose()


class _Conflicted(Exception):
    """A conflict-classed database error (a deadlock with another host)."""


class _ConflictOnce:
    """A ``SQLiteDriver`` whose second ``last_sequence`` read raises a
    conflict-classed error once."""

    def __init__(self, path: str) -> None:
        self.inner = SQLiteDriver(path, create_tables=True)
        self.reads = 0

    def last_sequence(self, run_id: str) -> int:
        self.reads += 1
        if self.reads == 2:
            raise _Conflicted("deadlock detected")
        return self.inner.last_sequence(run_id)

    def classify(self, exc: BaseException) -> Error | None:
        if isinstance(exc, _Conflicted):
            return Error(ErrorClass.RESOURCE_CONFLICT, "a concurrent writer won")
        return self.inner.classify(exc)

    def open(self, deadline: float) -> None:
        self.inner.open(deadline)

    def begin(self, deadline: float) -> None:
        self.inner.begin(deadline)

    def begin_read(self) -> None:
        self.inner.begin_read()

    def commit(self) -> None:
        self.inner.commit()

    def rollback(self) -> None:
        self.inner.rollback()

    def read_run(self, run_id: str, *, lock: bool) -> RunRow | None:
        return self.inner.read_run(run_id, lock=lock)

    def read_parts(self, run_id: str) -> dict[tuple[str, str], str]:
        return self.inner.read_parts(run_id)

    def insert_run(self, row: RunRow) -> bool:
        return self.inner.insert_run(row)

    def write(self, writes: Writes) -> bool:
        return self.inner.write(writes)

    def list_runs(self, states: Sequence[str] | None) -> list[tuple[str, int, int, str]]:
        return self.inner.list_runs(states)

    def read_events(self, run_id: str, after: int) -> list[EventTuple]:
        return self.inner.read_events(run_id, after)

    def interrupt(self) -> None:
        self.inner.interrupt()

    def close(self) -> None:
        self.inner.close()


async def test_a_group_refused_part_way_through_planning_commits_every_job_alone(
    tmp_path: Path,
) -> None:
    """A conflict-classed failure while a group is being planned (its second
    run's event sequence read) writes nothing of the group, and every one of
    its commits, the ones not planned yet included, is then made alone:
    both land, none is reported "not attempted"."""
    path = str(tmp_path / "runs.db")
    store = SQLStore(lambda: _ConflictOnce(path), name="conflicted", limited=True)
    runs = [_admitted(name) for name in ("a", "b")]
    for record, _, _ in runs:
        await store.create(record)
    started, release = threading.Event(), threading.Event()
    receipts: dict[str, Any] = {}

    async def commit(record: RunRecord, new: RunRecord, events: list[Any]) -> None:
        receipts[record.run_id] = await _commit(store, record, new, events)

    async with trio.open_nursery() as nursery:
        # The one worker slot is taken: both commits queue, then go as one group.
        nursery.start_soon(_occupy, store, started, release)
        await trio.to_thread.run_sync(started.wait)
        for record, new, events in runs:
            nursery.start_soon(commit, record, new, events)
        with trio.fail_after(10):
            while len(store._group.queue) < 2:
                await trio.sleep(0.001)
        release.set()
    assert sorted(receipts) == ["a", "b"]
    assert all(receipt.revision == 1 for receipt in receipts.values())
    for record, new, _ in runs:
        assert await store.load(record.run_id) == new
        assert [e.sequence for e in await store.events(record.run_id)] == [1]
    await store.aclose()


def test_a_path_holding_nul_is_refused_when_the_store_is_made() -> None:
    with pytest.raises(Error) as raised:
        SQLiteStore("runs\x00.db")
    assert raised.value.error_class is ErrorClass.VALIDATION


async def test_worker_threads_that_cannot_start_are_storage_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    store = SQLiteStore(tmp_path / "runs.db")
    with pytest.raises(Error) as raised:
        await store.load("r")
    assert raised.value.error_class is ErrorClass.STORAGE_FAILED
    assert "worker threads" in raised.value.message
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert sqlite3.sqlite_version  # the database itself was never touched


@pytest.mark.parametrize("items", [0, -1, True, 1.5])
def test_a_memory_bound_that_is_not_a_positive_int_is_refused(tmp_path: Path, items: Any) -> None:
    with pytest.raises(Error) as raised:
        SQLiteStore(tmp_path / "runs.db", cache_items=items)
    assert raised.value.error_class is ErrorClass.VALIDATION


async def test_a_finished_run_is_not_kept_alive_by_the_store(tmp_path: Path) -> None:
    """Once a run finishes the store holds none of its records: not in its
    memory, and not through its counts (the last commit's figures are
    numbers, not the commit's plan, which held two records)."""
    import gc
    import weakref

    from tests.store.workload import next_turn

    async with SQLiteStore(tmp_path / "runs.db", cache_items=10) as store:
        record = RunRecord.new("kept", work=100)
        await store.create(record)
        refs = []
        for n in range(5):
            new, events = transition(record, next_turn(record, n, "x" * 10_000))
            await store.commit(
                "kept", incarnation=1, expected_revision=n, record=new, events=events
            )
            refs.append(weakref.ref(new))
            record = new
        finished, events = transition(
            record, Command("finish", 9.0, {"status": "completed", "outcome": {}})
        )
        await store.commit(
            "kept", incarnation=1, expected_revision=5, record=finished, events=events
        )
        refs.append(weakref.ref(finished))
        stats = store.stats
        del record, new, finished, events
        gc.collect()
        assert store.remembered("kept") is None
        alive = [ref() is not None for ref in refs]
        assert not any(alive), alive
        assert stats["commits"] == 6
        assert store.stats == stats
