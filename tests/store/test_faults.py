"""``FaultyStore``: failures injected from outside a store (issue 21, item 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import Command, RunRecord, transition
from trio_backplane.store import MemoryStore, SQLiteStore, Store
from trio_backplane.testing import FaultyStore


async def _admitted(store: Store) -> tuple[RunRecord, dict[str, Any]]:
    record = RunRecord.new("r1", work=10)
    await store.create(record)
    new, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    return new, {"incarnation": 1, "expected_revision": 0, "record": new, "events": events}


@pytest.fixture(params=["memory", "sqlite"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "memory":
        return MemoryStore()
    return SQLiteStore(tmp_path / "runs.db")


async def test_a_failed_commit_stores_nothing_and_the_next_one_lands(inner: Store) -> None:
    store = FaultyStore(inner)
    _new, commit = await _admitted(store)
    store.fail_next_commit()
    with pytest.raises(Error) as raised:
        await store.commit("r1", **commit)
    assert raised.value.error_class is ErrorClass.STORAGE_FAILED
    assert raised.value.details["fault"] == "fail"
    stored = await store.load("r1")
    assert stored is not None
    assert stored.revision == 0
    assert await store.events("r1") == []
    receipt = await store.commit("r1", **commit)
    assert receipt.revision == 1
    assert store.committed == 1
    await store.aclose()


async def test_a_lost_acknowledgement_leaves_the_commit_stored(inner: Store) -> None:
    store = FaultyStore(inner)
    new, commit = await _admitted(store)
    store.lose_next_ack()
    with pytest.raises(Error) as raised:
        await store.commit("r1", **commit)
    assert raised.value.error_class is ErrorClass.STORAGE_FAILED
    assert raised.value.details["fault"] == "lose"
    stored = await store.load("r1")
    assert stored == new
    assert [e.type for e in await store.events("r1")] == ["run.admit"]
    await store.aclose()


async def test_a_hung_commit_waits_for_its_cancellation_and_stores_nothing(
    inner: Store,
) -> None:
    store = FaultyStore(inner)
    _, commit = await _admitted(store)
    store.hang_next_commit()
    store.fail_next_commit()
    assert store.pending == ("hang", "fail")
    with trio.move_on_after(0.05) as scope:
        await store.commit("r1", **commit)
    assert scope.cancelled_caught
    assert store.pending == ("fail",)
    stored = await store.load("r1")
    assert stored is not None
    assert stored.revision == 0
    await store.aclose()


def test_it_forwards_durability_and_offers_no_nowait_commit(tmp_path: Path) -> None:
    assert FaultyStore(SQLiteStore(tmp_path / "x.db")).durable is True
    assert FaultyStore(MemoryStore()).durable is False
    assert not hasattr(FaultyStore, "commit_nowait")
    assert isinstance(FaultyStore(MemoryStore()), Store)
