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


# -- the accelerator's verdict on a commit's arguments --------------------------

_RUN_IDS = ["r", "run-1", "x" * 256, "x" * 257, "", "r\x00", "rün", "\ud800", 5, None, b"r"]
_INTS = [0, 1, 2, 7, 2**53, 2**63 - 1, 2**63, -1, True, False, 1.0, "1", None, 10**30]
_TIMES = [0.0, 1.5, -2.0, 0, 2**53, -(2**53), 2**53 + 1, math.nan, math.inf, -math.inf, True, "0"]
_KINDS = ["run.admit", "x", "", "run\x00x", "rün", "\ud800", 5, None]


class _Str(str):
    pass


class _List(list):  # type: ignore[type-arg]
    pass


def _event(kind: Any, at: Any) -> RunEvent:
    event = RunEvent("run.admit", 0.0, {})
    object.__setattr__(event, "type", kind)
    object.__setattr__(event, "occurred_at", at)
    return event


def _record(run_id: Any, incarnation: Any, revision: Any) -> RunRecord:
    record = RunRecord(run_id="r", incarnation=1, revision=1)
    object.__setattr__(record, "run_id", run_id)
    object.__setattr__(record, "incarnation", incarnation)
    object.__setattr__(record, "revision", revision)
    return record


def _python_passes(run_id: Any, incarnation: Any, expected: Any, record: Any, events: Any) -> bool:
    """The Python checks' verdict, the stored record at the commit's identity."""
    from trio_backplane.store._protocol import check_arguments, check_commit

    try:
        check_arguments(run_id, incarnation=incarnation, expected_revision=expected, events=events)
        stored = RunRecord(run_id="r", incarnation=1, revision=0)
        object.__setattr__(stored, "run_id", run_id)
        object.__setattr__(stored, "incarnation", incarnation)
        object.__setattr__(stored, "revision", expected)
        check_commit(
            stored,
            run_id,
            incarnation=incarnation,
            expected_revision=expected,
            record=record,
            events=events,
        )
    except Error:
        return False
    return True


def _checked() -> Any:
    from trio_backplane.store._protocol import _unchecked, commit_checked

    assert commit_checked is not _unchecked, "the kernel accelerator is built with the package"
    return commit_checked


def test_commit_checked_passes_only_what_the_python_checks_pass() -> None:
    """The accelerator's ``commit_checked`` is a shortcut, never a second
    definition: whatever it passes, ``check_arguments`` and ``check_commit``
    pass too, on hostile values of every argument (str subclasses, bools,
    ints at and past the limits, NUL, non-ASCII, lone surrogates, NaN,
    record and event fields of the wrong type, list subclasses)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    checked = _checked()
    pick = st.sampled_from

    @settings(max_examples=2000, deadline=None)
    @given(
        run_id=pick([*_RUN_IDS, _Str("r")]),
        incarnation=pick(_INTS),
        expected=pick(_INTS),
        record_id=pick([*_RUN_IDS, _Str("r"), "same", "same"]),
        record_incarnation=pick([*_INTS, "same", "same"]),
        record_revision=pick([*_INTS, "next", "next"]),
        shape=pick(["record", "record", "record", "subclass", "dict", "none"]),
        kinds=st.lists(pick(_KINDS), max_size=3),
        times=st.lists(pick(_TIMES), min_size=3, max_size=3),
        shapes=st.lists(pick(["event", "subclass", "dict"]), min_size=3, max_size=3),
        container=pick([tuple, list, _List, iter]),
    )
    def check(**given: Any) -> None:
        record_id, incarnation, revision = (
            given["record_id"],
            given["record_incarnation"],
            given["record_revision"],
        )
        record_id = given["run_id"] if record_id == "same" else record_id
        incarnation = given["incarnation"] if incarnation == "same" else incarnation
        if revision == "next":
            revision = given["expected"] + 1 if type(given["expected"]) is int else 1
        record: Any = _record(record_id, incarnation, revision)
        made = zip(given["kinds"], given["times"], given["shapes"], strict=False)
        events = given["container"](_shaped(kind, at, shape) for kind, at, shape in made)
        if given["shape"] == "subclass":
            record = _Subrecord(run_id="r", incarnation=1, revision=1)
        elif given["shape"] == "dict":
            record = {"run_id": record_id, "incarnation": incarnation, "revision": revision}
        elif given["shape"] == "none":
            record = None
        args = (given["run_id"], given["incarnation"], given["expected"], record, events)
        verdict = checked(*args)
        assert type(verdict) is bool
        if verdict:
            assert _python_passes(*args), args

    check()


class _Subrecord(RunRecord):  # type: ignore[misc]
    __slots__ = ()


class _Subevent(RunEvent):  # type: ignore[misc]
    __slots__ = ()


def _shaped(kind: Any, at: Any, shape: str) -> Any:
    if shape == "dict":
        return {"type": kind, "occurred_at": at, "payload": {}}
    event = _event(kind, at)
    if shape == "subclass":
        return _Subevent(event.type, event.occurred_at, {})
    return event


def test_commit_checked_passes_every_commit_of_a_kernel_lifecycle() -> None:
    """The shortcut is taken: every commit of a run the kernel made passes
    it (and the Python checks, which agree)."""
    checked = _checked()
    from tests.store.workload import next_turn

    record = RunRecord.new("lifecycle", work=100)
    for n in range(30):
        new, events = transition(record, next_turn(record, n, f"reply {n}"))
        args = (record.run_id, record.incarnation, record.revision, new, events)
        assert checked(*args) is True
        assert _python_passes(*args)
        assert checked(*args[:4], list(events)) is True
        record = new


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"run_id": _Str("r")}, "a str subclass"),
        ({"run_id": "rün"}, "non-ASCII (the Python checks decide)"),
        ({"run_id": "r\x00"}, "NUL"),
        ({"run_id": "x" * 257}, "too long"),
        ({"incarnation": True}, "a bool"),
        ({"incarnation": 0}, "not positive"),
        ({"expected": 2**63 - 1}, "no revision follows"),
        ({"expected": -1, "revision": 0}, "a negative expected revision"),
        ({"expected": True, "revision": 2}, "a bool expected revision"),
        ({"expected": 2**63}, "out of range"),
        ({"revision": 3}, "not expected + 1"),
        ({"record_id": "s"}, "another run's record"),
        ({"record": None}, "no record"),
        ({"record": {"run_id": "r", "incarnation": 1, "revision": 5}}, "a dict, not a record"),
        ({"record": _Subrecord(run_id="r", incarnation=1, revision=5)}, "a record subclass"),
        ({"record_incarnation": 2}, "another incarnation's record"),
        ({"events": _List()}, "a list subclass"),
        ({"events": ({"type": "run.admit", "occurred_at": 1.0, "payload": {}},)}, "a dict event"),
        ({"events": (_Subevent("run.admit", 1.0, {}),)}, "an event subclass"),
        ({"kind": "rün"}, "a non-ASCII event type"),
        ({"kind": ""}, "an empty event type"),
        ({"at": math.nan}, "a time that is not finite"),
        ({"at": 2**53 + 1}, "an int time past 2**53"),
        ({"at": True}, "a bool time"),
    ],
)
def test_commit_checked_declines(change: dict[str, Any], why: str) -> None:
    """Each departure from a plain valid commit is declined (``False``), so
    the Python checks run: ``{why}``."""
    checked = _checked()
    fields = {
        "run_id": "r",
        "incarnation": 1,
        "expected": 4,
        "record_id": "r",
        "record_incarnation": 1,
        "revision": 5,
        "kind": "run.admit",
        "at": 1.0,
        "events": None,
    }
    assert checked("r", 1, 4, _record("r", 1, 5), (_event("run.admit", 1.0),)) is True
    fields.update(change)
    events = (
        (_event(fields["kind"], fields["at"]),) if fields["events"] is None else fields["events"]
    )
    record: Any = _record(fields["record_id"], fields["record_incarnation"], fields["revision"])
    if "record" in change:
        record = change["record"]
    assert checked(fields["run_id"], fields["incarnation"], fields["expected"], record, events) is (
        False
    ), why


def test_commit_checked_refuses_limits_that_are_not_exact_ints() -> None:
    """Its limits are exact ints (``TypeError`` otherwise): an int-like
    limit's ``__index__`` is never called (no Python code runs in it)."""
    from trio_backplane.kernel._frozen import _accelerator

    called: list[str] = []

    class Index:
        def __index__(self) -> int:
            called.append("index")
            return 256

    record = _record("r", 1, 5)
    for limits in ((Index(), 2**63, 2**53), (256, 2**63, Index()), (256, True, 2**53)):
        with pytest.raises(TypeError):
            _accelerator.commit_checked(RunRecord, RunEvent, *limits, "r", 1, 4, record, ())
    assert called == []
