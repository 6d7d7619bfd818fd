"""Records to JSON and back: round trips, versions, garbage."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import (
    SCHEMA_VERSION,
    RunEvent,
    RunRecord,
    decode_event,
    decode_record,
    encode_event,
    encode_record,
    transition,
)

from .support import RUN, cmd, json_objects, json_values, lifecycle_records, outcome_of, running


def through_json(record: RunRecord) -> RunRecord:
    text = json.dumps(encode_record(record), allow_nan=False)
    return decode_record(json.loads(text))


@given(lifecycle_records())
def test_records_of_any_lifecycle_round_trip(records: list[RunRecord]) -> None:
    for record in records:
        decoded = through_json(record)
        assert decoded == record
        assert encode_record(decoded) == encode_record(record)


@given(
    context=json_objects,
    incarnation=st.integers(1, 2**31),
    work=st.integers(1, 10**9),
    deadline=st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(10**12), 10**12),
    result=json_values,
)
def test_records_with_any_json_context_round_trip(
    context: dict[str, Any], incarnation: int, work: int, deadline: float | None, result: Any
) -> None:
    record = RunRecord.new(RUN, incarnation=incarnation, work=work, context=context)
    assert through_json(record) == record
    record, _ = transition(record, cmd("admit", state="running", deadline=deadline))
    record, _ = transition(record, cmd("conversation_updated", conversation={"any": result}))
    decoded = through_json(record)
    assert decoded == record
    assert decoded.context["conversation"] == record.context["conversation"]


def test_decoded_records_are_frozen() -> None:
    record = through_json(running())
    with pytest.raises(TypeError):
        record.budget.reservations["x"] = 1  # type: ignore[index]
    assert record.schema_version == SCHEMA_VERSION
    assert encode_record(record)["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, SCHEMA_VERSION + 100])
def test_a_newer_schema_version_is_unsupported(version: int) -> None:
    data = encode_record(running())
    data["schema_version"] = version
    with pytest.raises(Error) as info:
        decode_record(data)
    assert info.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert info.value.details["schema_version"] == version


@pytest.mark.parametrize("version", [None, 0, -1, "1", 1.0, True, [1]])
def test_a_missing_or_malformed_schema_version_is_invalid(version: object) -> None:
    data = encode_record(running())
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    with pytest.raises(Error) as info:
        decode_record(data)
    assert info.value.error_class is ErrorClass.VALIDATION


def refused_as_invalid(data: Any) -> None:
    with pytest.raises(Error) as info:
        decode_record(data)
    assert info.value.error_class is ErrorClass.VALIDATION, info.value


@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_garbage_dicts_are_refused_with_validation(data: dict[str, Any]) -> None:
    data.pop("schema_version", None)
    refused_as_invalid(data)
    refused_as_invalid({**data, "schema_version": SCHEMA_VERSION})


@given(json_values.filter(lambda v: not isinstance(v, dict)))
def test_non_mappings_are_refused_with_validation(data: Any) -> None:
    refused_as_invalid(data)


FIELDS = sorted(encode_record(running()))


@given(
    base=lifecycle_records(max_steps=12).map(lambda rs: rs[-1]),
    field=st.sampled_from(FIELDS),
    value=json_values,
)
def test_a_field_replaced_by_any_json_is_refused_or_read_exactly(
    base: RunRecord, field: str, value: Any
) -> None:
    """A stored record with one field replaced is either refused with
    validation (or unsupported_capability, for a newer version) or decodes to
    a record that encodes back to exactly that data: never another exception,
    never a silent misreading (``"false"`` read as ``True``, ``5`` as ``"5"``)."""
    data = json.loads(json.dumps(encode_record(base)))
    data[field] = value
    decoded, exc = outcome_of(lambda: decode_record(data))
    if exc is not None:
        allowed = {ErrorClass.VALIDATION}
        if field == "schema_version":
            allowed.add(ErrorClass.UNSUPPORTED_CAPABILITY)
        assert exc.error_class in allowed, exc
        return
    assert json.loads(json.dumps(encode_record(decoded))) == data


@given(
    base=lifecycle_records(max_steps=12).map(lambda rs: rs[-1]),
    data=st.data(),
)
def test_a_budget_replaced_by_any_json_is_refused_or_read_exactly(
    base: RunRecord, data: st.DataObject
) -> None:
    encoded = json.loads(json.dumps(encode_record(base)))
    key = data.draw(st.sampled_from(["quota", "used", "reservations", "extra"]))
    encoded["budget"][key] = data.draw(json_values)
    decoded, exc = outcome_of(lambda: decode_record(encoded))
    if exc is not None:
        assert exc.error_class is ErrorClass.VALIDATION, exc
        return
    assert json.loads(json.dumps(encode_record(decoded))) == encoded


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("admitted", "false"),
        ("run_id", 5),
        ("state", "finished"),
        ("deadline", "soon"),
        ("step_id", {"id": 1}),
        ("dependencies", "dep-1"),
        ("incarnation", 0),
        ("revision", -1),
        ("counters", {"attempt": "1"}),
        ("unexpected", 1),
    ],
)
def test_wrong_types_are_refused(field: str, value: Any) -> None:
    data = encode_record(running())
    data[field] = value
    refused_as_invalid(data)


@pytest.mark.parametrize(
    "budget",
    [
        {"quota": 5},
        {"quota": 5, "used": "1", "reservations": {}},
        {"quota": 5, "used": -1, "reservations": {}},
        [],
    ],
)
def test_malformed_budgets_are_refused(budget: Any) -> None:
    data = encode_record(running())
    data["budget"] = budget
    refused_as_invalid(data)


@given(
    payload=json_objects,
    occurred_at=st.floats(allow_nan=False, allow_infinity=False),
    sequence=st.none() | st.integers(1, 2**62),
)
def test_events_round_trip(
    payload: dict[str, Any], occurred_at: float, sequence: int | None
) -> None:
    event = RunEvent("run.start", occurred_at, payload, sequence)
    assert decode_event(json.loads(json.dumps(encode_event(event)))) == event


@pytest.mark.parametrize(
    "field", ["incarnation", "revision", "state", "intents", "budget", "active_provider"]
)
def test_sto_09_a_stored_record_missing_a_field_is_refused(field: str) -> None:
    """STO-09: every field is written, so a stored record lacking one is
    damaged: ``validation``, never a default filled in (a missing
    incarnation read as 1 would undo a fence; a missing budget, reset it)."""
    record, _ = transition(running(), cmd("provider_started"))
    data = json.loads(json.dumps(encode_record(record)))
    del data[field]
    with pytest.raises(Error) as info:
        decode_record(data)
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.details["missing"] == [field]


def test_sto_09_stored_active_work_must_be_what_the_kernel_reads() -> None:
    """STO-09: an active provider without its ids, or an active tool without
    its intent, is refused at decode (the kernel would fail on it later
    with a raw KeyError)."""
    record, _ = transition(running(), cmd("provider_started"))
    data = json.loads(json.dumps(encode_record(record)))
    broken = {**data, "active_provider": {"turn": "x"}}
    with pytest.raises(Error, match="active provider"):
        decode_record(broken)
    orphan = {**data, "active_provider": None, "active_tools": {"invocation-9": {}}}
    with pytest.raises(Error, match="no intent"):
        decode_record(orphan)


@pytest.mark.parametrize(
    "change",
    [
        {"type": 5},
        {"type": ""},
        {"occurred_at": "yesterday"},
        {"occurred_at": float("nan")},
        {"occurred_at": True},
        {"sequence": "7"},
        {"sequence": 0},
        {"sequence": True},
        {"payload": None},
        {"payload": [1]},
        {"run_id": "other"},
    ],
    ids=repr,
)
def test_sto_09_a_stored_event_is_checked_as_strictly_as_a_record(
    change: dict[str, Any],
) -> None:
    """STO-09: a stored event of the wrong shape (types, a NaN time, a
    missing payload, an extra key) is ``validation``, never read as
    something else."""
    good = encode_event(RunEvent("run.start", 1.0, {"state": "running"}, 3))
    with pytest.raises(Error) as info:
        decode_event({**good, **change})
    assert info.value.error_class is ErrorClass.VALIDATION
