"""``MemoryStore`` keeps the record itself: a commit encodes no record (issue 4 item 8)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import Command, FrozenList, RunRecord, freeze, transition
from trio_backplane.store import MemoryStore, prepare_commit, prepare_create


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a MemoryStore commit encoded a record")


@pytest.fixture
def no_record_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``encode_record`` binding in the package and the SQL layout
    encoder raise."""
    from trio_backplane.kernel import _codec
    from trio_backplane.store import _layout

    assert hasattr(_codec, "encode_record")

    for name, module in list(sys.modules.items()):
        # (vars: the top level resolves moved names only through __getattr__)
        if name.startswith("trio_backplane") and "encode_record" in vars(module):
            monkeypatch.setattr(module, "encode_record", _refuse)
    monkeypatch.setattr(_layout, "dumps", _refuse)


async def test_a_conversation_of_commits_encodes_no_record(no_record_encoding: None) -> None:
    store = MemoryStore()
    record = RunRecord.new("r1", work=10_000, context={"conversation": {"messages": []}})
    await store.create(record)
    record, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    await store.commit("r1", incarnation=1, expected_revision=0, record=record, events=events)
    for n in range(200):
        messages = FrozenList((freeze({"role": "assistant", "content": f"r{n}"}),))
        for command in (
            Command("provider_started", float(n)),
            Command(
                "provider_completed",
                float(n),
                {"result": {"n": n}, "messages": messages},
            ),
        ):
            new, events = transition(record, command)
            receipt = await store.commit(
                "r1",
                incarnation=1,
                expected_revision=record.revision,
                record=new,
                events=events,
            )
            assert receipt.revision == record.revision + 1
            record = new
    assert await store.load("r1") is record  # the record itself, not a copy
    assert len(await store.events("r1")) == 401
    # the decision still refuses stale writers
    with pytest.raises(Error) as info:
        await store.commit("r1", incarnation=1, expected_revision=1, record=record, events=[])
    assert info.value.error_class is ErrorClass.VALIDATION  # revision != expected + 1


def test_prepare_encodes_no_record(no_record_encoding: None) -> None:
    record = RunRecord.new("r1")
    prepared = prepare_create(record)
    assert prepared.record is record
    assert prepared.events == []
    new, events = transition(record, Command("admit", 1.0))
    prepared = prepare_commit(
        record, "r1", incarnation=1, expected_revision=0, record=new, events=events
    )
    assert prepared.record is new
    assert [e["type"] for e in prepared.events] == ["run.admit"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("admitted", print),
        ("admitted", "false"),
        ("deadline", object()),
        ("deadline", float("inf")),
        ("step_id", object()),
        ("stop_reason", 3),
        ("dependencies", (lambda: None,)),
        ("schema_version", 1.0),
        ("budget", object()),
    ],
)
def test_ker11_scalar_fields_refuse_non_json(field: str, value: Any) -> None:
    """KER-11: every scalar field of a record is JSON data of its type, so a
    record holding a runtime handle can never be built (nor committed)."""
    with pytest.raises(Error) as info:
        RunRecord(run_id="r1", **{field: value})
    assert info.value.error_class is ErrorClass.VALIDATION


async def test_commit_nowait_is_the_same_compare_and_set_as_commit() -> None:
    """STO-02: ``commit_nowait`` (what the runtime calls on a store that never
    waits) refuses a stale revision and a foreign incarnation exactly as
    ``commit`` does, and numbers the events on from the log."""
    store = MemoryStore()
    record = RunRecord.new("r1", work=10)
    await store.create(record)
    admitted, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    receipt = store.commit_nowait(
        "r1", incarnation=1, expected_revision=0, record=admitted, events=events
    )
    assert (receipt.revision, receipt.incarnation) == (1, 1)
    for incarnation, expected in ((1, 0), (2, 1)):  # stale revision, foreign incarnation
        kwargs: dict[str, Any] = {
            "incarnation": incarnation,
            "expected_revision": expected,
            "record": admitted,
            "events": events,
        }
        with pytest.raises(Error) as nowait:
            store.commit_nowait("r1", **kwargs)
        with pytest.raises(Error) as awaited:
            await store.commit("r1", **kwargs)
        refusals = [(e.value.error_class, e.value.message) for e in (nowait, awaited)]
        assert refusals[0] == refusals[1]
        assert refusals[0][0] in (ErrorClass.RESOURCE_CONFLICT, ErrorClass.VALIDATION)
    started, more = transition(admitted, Command("provider_started", 2.0))
    await store.commit("r1", incarnation=1, expected_revision=1, record=started, events=more)
    assert [e.sequence for e in await store.events("r1")] == [1, 2]
    assert await store.load("r1") is started


async def test_a_commit_of_something_else_than_run_events_stores_nothing() -> None:
    """STO-02: events that are not ``RunEvent`` values are refused with
    ``validation`` before anything is stored: no record, no event."""
    store = MemoryStore()
    record = RunRecord.new("r1", work=10)
    await store.create(record)
    admitted, events = transition(record, Command("admit", 1.0, {"state": "running"}))
    bad: list[Any] = [*events, {"type": "run.admit", "occurred_at": 1.0, "payload": {}}]
    with pytest.raises(Error) as caught:
        store.commit_nowait("r1", incarnation=1, expected_revision=0, record=admitted, events=bad)
    assert caught.value.error_class is ErrorClass.VALIDATION
    assert await store.load("r1") is record
    assert await store.events("r1") == []
