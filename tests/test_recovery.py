"""Recovery: ``recover`` classification and ``RecoveryHarness.crash`` (STO-13, STO-14)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import Command, RunRecord, transition
from trio_backplane.recovery import EffectReport, RecoveryReport, recover
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.testing import CRASH_WINDOWS, CrashReport, RecoveryHarness


def _running() -> RunRecord:
    record = RunRecord.new("run-recovery")
    for kind, data in (
        ("admit", {"state": "running"}),
        ("provider_started", {}),
        ("provider_completed", {"final": False}),
    ):
        record, _ = transition(record, Command(kind, at=1.0, input=data))
    return record


def _with_intents(record: RunRecord, intents: dict[str, Any]) -> RunRecord:
    return attrs.evolve(record, intents={**record.intents, **intents})


# -- recover (STO-14) ---------------------------------------------------------


def test_recover_classifies_withdraw_and_resume_sto_14() -> None:
    """STO-14: every not_dispatched effect may be withdrawn; only read-only or
    idempotent not_dispatched ones may be resumed; dispatched or unknown
    mutations never, and they are listed as uncertain."""
    record = _with_intents(
        _running(),
        {
            f"tool:{cls}-{state}": {
                "kind": "tool",
                "status": "started",
                "effect_class": cls,
                "dispatch_state": state,
            }
            for cls in ("read_only", "idempotent", "mutation", "bogus")
            for state in ("not_dispatched", "dispatched", "unknown")
        },
    )
    report = recover(record, incarnation=2)
    assert isinstance(report, RecoveryReport)
    assert (report.run_id, report.incarnation, report.fenced_incarnation) == (record.run_id, 2, 1)
    effects = {e.effect_id: e for e in report.effects}
    for cls in ("read_only", "idempotent", "mutation", "bogus"):
        read_as = "unknown" if cls == "bogus" else cls
        for state in ("not_dispatched", "dispatched", "unknown"):
            effect = effects[f"tool:{cls}-{state}"]
            assert effect.effect_class == read_as
            assert effect.dispatch_state == state
            assert effect.safe_to_withdraw is (state == "not_dispatched")
            assert effect.safe_to_resume is (
                state == "not_dispatched" and read_as in ("read_only", "idempotent")
            )
    assert set(report.uncertain_effects) == {
        f"tool:{cls}-{state}"
        for cls in ("mutation", "bogus")
        for state in ("dispatched", "unknown")
    }


def test_recover_defaults_and_settled_intents_sto_14() -> None:
    """A missing dispatch state reads "unknown", a missing class "unknown";
    consumed and cancelled intents are settled and not reported."""
    record = _with_intents(
        _running(),
        {
            "tool:bare": {"status": "started"},
            "tool:done": {"status": "consumed", "effect_class": "mutation"},
            "tool:gone": {"status": "cancelled", "effect_class": "mutation"},
            "tool:unsure": {
                "status": "uncertain",
                "effect_class": "mutation",
                "dispatch_state": "dispatched",
            },
        },
    )
    report = recover(record, incarnation=5)
    effects = {e.effect_id: e for e in report.effects}
    assert set(effects) == {"tool:bare", "tool:unsure"}  # the provider intent is consumed
    assert effects["tool:bare"] == EffectReport(
        "tool:bare", "unknown", "unknown", False, False, kind="tool", status="started"
    )
    assert report.uncertain_effects == ("tool:bare", "tool:unsure")


@pytest.mark.parametrize("cls", ["read_only", "idempotent", "mutation"])
def test_an_effect_whose_cleanup_was_uncertain_is_never_safe_sto_14(cls: str) -> None:
    """STO-14: an intent published ``not_dispatched`` whose cleanup then
    settled ``uncertain`` (the run ``unknown_outcome``) reads ``unknown``:
    never safe to withdraw nor to resume, whatever its class; a mutation is
    listed as uncertain.  What the intent recorded at publication is stale
    once the effect was dispatched."""
    record = _running()
    for kind, data in (
        ("tool_invoked", {"effect_class": cls, "dispatch_state": "not_dispatched"}),
        ("cancel", {}),
        ("cleanup_settled", {"certainty": "uncertain", "evidence": ["not confirmed"]}),
    ):
        record, _ = transition(record, Command(kind, at=2.0, input=data))
    assert record.state == "unknown_outcome"
    (effect,) = recover(record, incarnation=2).effects
    assert (effect.status, effect.dispatch_state) == ("uncertain", "unknown")
    assert not effect.safe_to_withdraw
    assert not effect.safe_to_resume
    assert recover(record, incarnation=2).uncertain_effects == (
        (effect.effect_id,) if cls == "mutation" else ()
    )


def test_unsettled_children_and_dependencies_are_reported_sto_14() -> None:
    """STO-14: work that is not an effect (a child run, the wait on it) is
    reported as ``unsettled``; the CLI lists it rather than saying there is
    nothing to reconcile."""
    record, _ = transition(
        _running(), Command("wait_started", at=2.0, input={"dependency": "child-7"})
    )
    record = attrs.evolve(record, children={"child-7": {"settled": False}})
    report = recover(record, incarnation=2)
    assert report.effects == ()
    assert report.unsettled["children"] == ["child-7"]
    assert report.unsettled["dependencies"] == ["child-7"]
    assert recover(_running(), incarnation=2).unsettled == {
        "provider": [],
        "tools": [],
        "children": [],
        "dependencies": [],
    }


def test_interrupted_provider_attempt_is_discardable_not_resumable() -> None:
    record, _ = transition(_running(), Command("provider_started", at=2.0))
    report = recover(record, incarnation=2)
    (effect,) = report.effects
    assert effect.kind == "provider"
    assert effect.discardable
    assert not effect.safe_to_resume
    assert report.uncertain_effects == ()


@pytest.mark.parametrize("incarnation", [0, 1, -3, True, 1.5, "2"])
def test_recover_requires_a_newer_incarnation_sto_14(incarnation: Any) -> None:
    """STO-14: ``forbidden`` for an incarnation that does not exceed the record's."""
    with pytest.raises(Error) as raised:
        recover(_running(), incarnation=incarnation)
    assert raised.value.error_class is ErrorClass.FORBIDDEN
    assert raised.value.message == "recovery incarnation must fence an older executor"


_INTENT = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["started", "consumed", "cancelled", "uncertain", "x"]),
        "effect_class": st.one_of(
            st.sampled_from(["read_only", "idempotent", "mutation", "unknown", "READ_ONLY"]),
            st.none(),
            st.integers(),
        ),
        "dispatch_state": st.one_of(
            st.sampled_from(["not_dispatched", "dispatched", "unknown", "sent"]), st.none()
        ),
        "kind": st.sampled_from(["tool", "provider"]),
    }
).map(lambda d: {k: v for k, v in d.items() if v is not None})


@given(
    intents=st.dictionaries(st.text(min_size=1, max_size=8), _INTENT, max_size=8),
    bump=st.integers(min_value=1, max_value=5),
)
def test_no_dispatched_or_unknown_class_effect_is_safe_to_resume_sto_14(
    intents: dict[str, Any], bump: int
) -> None:
    """STO-14 (property): no dispatched (or unknown-dispatch) effect and no
    effect of unknown class is ever safe to resume; only not_dispatched effects
    whose cleanup was not uncertain may be withdrawn; dispatched or unknown
    mutations are always uncertain."""
    record = attrs.evolve(_running(), intents=intents, incarnation=3)
    report = recover(record, incarnation=3 + bump)
    for effect in report.effects:
        raw = intents[effect.effect_id]
        if raw.get("dispatch_state") != "not_dispatched" or raw.get("effect_class") not in (
            "read_only",
            "idempotent",
        ):
            assert not effect.safe_to_resume, effect
        assert effect.safe_to_withdraw is (
            raw.get("dispatch_state") == "not_dispatched" and raw["status"] != "uncertain"
        )
        if effect.effect_class in ("mutation", "unknown") and not effect.safe_to_withdraw:
            assert effect.effect_id in report.uncertain_effects
        assert not (effect.effect_id in report.uncertain_effects and effect.safe_to_resume)
    reported = {e.effect_id for e in report.effects}
    assert reported == {
        k for k, v in intents.items() if v["status"] not in ("consumed", "cancelled")
    }


# -- RecoveryHarness.crash (STO-13) -------------------------------------------


@pytest.fixture
async def durable_store(tmp_path: Path) -> AsyncIterator[Any]:
    """A durable store: ``SQLiteStore``."""
    store: Any = SQLiteStore(tmp_path / "runs.db")
    try:
        yield store
    finally:
        await store.aclose()


EXPECTED = {
    "before_dispatch": (False, True),
    "after_mutation": (False, False),
    "before_result": (False, False),
    "after_terminal": (True, False),
}


@pytest.mark.parametrize("window", CRASH_WINDOWS)
@pytest.mark.parametrize("start", ["new", "running", "provider_active"])
async def test_crash_windows_sto_13(durable_store: Any, window: str, start: str) -> None:
    """STO-13: before_dispatch is not accepted and safe to withdraw;
    after_mutation and before_result are not accepted and not safe;
    after_terminal is accepted and not safe.  The crash is real: the stored
    record is what recovery classifies, and the old incarnation is fenced."""
    record = RunRecord.new(f"crash-{window}-{start}")
    if start != "new":
        await durable_store.create(record)
        commands: list[tuple[str, dict[str, Any]]] = [("admit", {"state": "running"})]
        if start == "provider_active":
            commands.append(("provider_started", {}))
        for kind, data in commands:
            new, events = transition(record, Command(kind, at=1.0, input=data))
            await durable_store.commit(
                record.run_id,
                incarnation=record.incarnation,
                expected_revision=record.revision,
                record=new,
                events=events,
            )
            record = new
    report = await RecoveryHarness.crash(durable_store, record, window)
    assert isinstance(report, CrashReport)
    assert report.window == window
    assert (report.accepted, report.safe_to_withdraw) == EXPECTED[window]
    stored = await durable_store.load(record.run_id)
    assert stored is not None
    assert stored.incarnation == record.incarnation + 1  # fenced
    assert report.record is not None
    assert report.recovery is not None
    assert report.recovery.fenced_incarnation == record.incarnation
    tools = [e for e in report.recovery.effects if e.kind == "tool"]
    if window == "after_terminal":
        assert stored.state == "completed"
        assert tools == []
    else:
        (tool,) = tools
        assert tool.effect_class == "mutation"
        assert not tool.safe_to_resume
        assert (tool.effect_id in report.recovery.uncertain_effects) is (
            window != "before_dispatch"
        )
    # The old executor can never commit again.
    if not stored.terminal:
        late, events = transition(
            attrs.evolve(stored, incarnation=record.incarnation), Command("cancel", at=9.0)
        )
        with pytest.raises(Error) as raised:
            await durable_store.commit(
                record.run_id,
                incarnation=record.incarnation,
                expected_revision=stored.revision,
                record=late,
                events=events,
            )
        assert raised.value.error_class is ErrorClass.RESOURCE_CONFLICT


@pytest.mark.parametrize("window", ["", "before-dispatch", "after_commit", "BEFORE_DISPATCH"])
async def test_invalid_crash_window_sto_13(window: str) -> None:
    with pytest.raises(Error) as raised:
        await RecoveryHarness.crash(MemoryStore(), RunRecord.new("r"), window)
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert raised.value.message == "invalid crash window"


@pytest.mark.parametrize("at", ["x", True, None, float("nan"), float("inf"), 2**63])
async def test_crash_time_is_checked_before_anything_is_stored(at: Any) -> None:
    """A crash harness time that is no finite number is refused with
    validation before the run is created (it raised a raw TypeError after)."""
    store = MemoryStore()
    with pytest.raises(Error) as raised:
        await RecoveryHarness.crash(store, RunRecord.new("r"), "before_dispatch", at=at)
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert await store.load("r") is None


async def test_crash_on_memory_store_cannot_fence() -> None:
    """MemoryStore cannot fence: the harness says so unless told not to fence."""
    with pytest.raises(Error) as raised:
        await RecoveryHarness.crash(MemoryStore(), RunRecord.new("m1"), "before_dispatch")
    assert raised.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    report = await RecoveryHarness.crash(
        MemoryStore(), RunRecord.new("m2"), "after_mutation", fence=False
    )
    assert (report.accepted, report.safe_to_withdraw) == (False, False)


@pytest.mark.parametrize("store", [None, 5, "runs.db", {}, object()], ids=repr)
async def test_crash_harness_needs_a_store(store: Any) -> None:
    """Something that is not a store is refused with ``validation`` naming
    what it lacks, before anything runs."""
    with pytest.raises(Error) as raised:
        await RecoveryHarness.crash(store, RunRecord.new("r"), "before_dispatch")
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert raised.value.message == "store must provide create, load, commit, fence"
    assert raised.value.details["argument"] == "store"
    assert "load" in raised.value.details["missing"]


def test_an_mcp_task_is_reported_while_its_call_is_in_flight_only() -> None:
    """An MCP task recorded by a call still in flight may run on after a
    crash: reported, with its id; one of a call that settled is history."""
    from trio_backplane.recovery import recover

    tasks = [
        {"kind": "mcp_task", "task_id": "t-live", "invocation_id": "invocation-1-4"},
        {"kind": "mcp_task", "task_id": "t-done", "invocation_id": "invocation-1-2"},
    ]
    record = RunRecord(
        run_id="r",
        state="running",
        active_tools={"invocation-1-4": {"tool_name": "research"}},
        context={"conversation": {"resources": tasks}},
    )
    report = recover(record, incarnation=2)
    assert [r["task_id"] for r in report.resources] == ["t-live"]
