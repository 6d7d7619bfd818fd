"""The store protocol's shared checks (STO-03, STO-07)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import Command, RunEvent, RunRecord, transition
from trio_backplane.store import MemoryStore, Receipt, SQLiteStore, verify_receipt

if TYPE_CHECKING:  # imported by pytest_plugins, so pytest rewrites its asserts
    from tests.store.postgres_fixture import StoreFactory

pytest_plugins = ["tests.store.postgres_fixture"]


def test_sto_03_runtime_rejects_a_receipt_for_another_revision() -> None:
    """STO-03: a Receipt whose revision is not expected_revision + 1 is a
    resource_conflict with details expected and received."""
    assert verify_receipt(Receipt("r", 1, 5), run_id="r", expected_revision=4).revision == 5
    for wrong in (4, 6, 7):
        with pytest.raises(Error) as exc:
            verify_receipt(Receipt("r", 1, wrong), run_id="r", expected_revision=4)
        assert exc.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert dict(exc.value.details) == {"expected": 5, "received": wrong}
    with pytest.raises(Error):
        verify_receipt(Receipt("other", 1, 5), run_id="r", expected_revision=4)


async def test_sto_07_memory_store_cannot_fence() -> None:
    """STO-07: MemoryStore.fence raises unsupported_capability "durable store
    required", and the stored record is untouched."""
    store = MemoryStore()
    record = RunRecord.new("r")
    await store.create(record)
    admitted, events = transition(record, Command("admit", 0, {"state": "running"}))
    await store.commit("r", incarnation=1, expected_revision=0, record=admitted, events=events)
    with pytest.raises(Error) as exc:
        await store.fence("r", incarnation=2)
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert exc.value.message == "durable store required"
    assert await store.load("r") == admitted


BAD_EVENTS = [
    ([{"type": "run.admit", "occurred_at": 0.0, "payload": {}}], "commits RunEvent values"),
    ([RunEvent("run.admit", math.nan, {"state": "running", "input": {}})], "finite number"),
    ([RunEvent("run.admit", math.inf, {"state": "running", "input": {}})], "finite number"),
]


async def _refuses_bad_events(store: Any) -> None:
    """Events that are not ``RunEvent`` values, or whose time is not finite,
    are refused with ``validation`` and nothing of the commit is stored."""
    for n, (bad_events, message) in enumerate(BAD_EVENTS):
        record = RunRecord.new(f"bad-events-{n}")
        await store.create(record)
        admitted, _ = transition(record, Command("admit", 0, {"state": "running"}))
        with pytest.raises(Error) as exc:
            await store.commit(
                record.run_id,
                incarnation=1,
                expected_revision=0,
                record=admitted,
                events=bad_events,
            )
        assert exc.value.error_class is ErrorClass.VALIDATION
        assert message in exc.value.message
        assert await store.load(record.run_id) == record
        assert await store.events(record.run_id) == []


async def test_memory_and_sqlite_stores_refuse_bad_events(tmp_path: Path) -> None:
    """One decision for every store (``check_commit``), events included."""
    await _refuses_bad_events(MemoryStore())
    async with SQLiteStore(tmp_path / "s.db") as store:
        await _refuses_bad_events(store)


async def test_postgres_store_refuses_bad_events(pg_store_factory: StoreFactory) -> None:
    """The same decision on PostgreSQL."""
    await _refuses_bad_events(pg_store_factory())


async def _created_with_parts(store: Any) -> None:
    """A run created with a transcript already in it (``open_conversation(...,
    messages=...)`` does that) is stored whole, its transcript as part rows:
    ``load`` returns it, and commits on top of it keep every message."""
    messages = [{"role": "user", "content": f"earlier {i}"} for i in range(5)]
    record = RunRecord.new("with-parts", context={"conversation": {}}, transcript=messages)
    await store.create(record)
    assert await store.load(record.run_id) == record
    admitted, events = transition(record, Command("admit", 0.0, {"state": "running"}))
    await store.commit(
        record.run_id, incarnation=1, expected_revision=0, record=admitted, events=events
    )
    now = {"role": "user", "content": "now"}
    updated, events = transition(
        admitted, Command("conversation_updated", 1.0, {"messages": [now]})
    )
    await store.commit(
        record.run_id, incarnation=1, expected_revision=1, record=updated, events=events
    )
    loaded = await store.load(record.run_id)
    assert loaded == updated
    assert [m["content"] for m in loaded.conversation["messages"]] == [
        *(f"earlier {i}" for i in range(5)),
        "now",
    ]


async def test_memory_and_sqlite_stores_create_runs_with_parts(tmp_path: Path) -> None:
    await _created_with_parts(MemoryStore())
    async with SQLiteStore(tmp_path / "s.db") as store:
        await _created_with_parts(store)
    async with SQLiteStore(tmp_path / "s.db") as reopened:
        loaded = await reopened.load("with-parts")
    assert loaded is not None
    assert len(loaded.conversation["messages"]) == 6


async def test_postgres_store_creates_runs_with_parts(pg_store_factory: StoreFactory) -> None:
    await _created_with_parts(pg_store_factory())
    loaded = await pg_store_factory().load("with-parts")
    assert loaded is not None
    assert len(loaded.conversation["messages"]) == 6
