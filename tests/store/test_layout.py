"""``_layout``: the head encodings and the incremental diff against their
reference constructions (issue 4 item 8; the SQLite store's hot path)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.kernel.support import lifecycle_records
from trio_backplane.kernel import (
    Budget,
    Command,
    FrozenList,
    RunRecord,
    encode_record,
    freeze,
    transition,
)
from trio_backplane.store import _layout
from trio_backplane.store._layout import (
    NOTHING,
    PLACEHOLDER,
    blank,
    diff,
    dumps,
    entry_of,
    head_fields,
    head_text,
    join,
    join_head,
    messages_of,
    split,
)


def reference_head(record: RunRecord) -> str:
    """The head as it was first built: ``encode_record`` of the record with its
    growing entries removed, each parts slot then set to the placeholder."""
    data = encode_record(blank(record))
    data["intents"] = PLACEHOLDER
    data["tool_results"] = PLACEHOLDER
    data["budget"]["reservations"] = PLACEHOLDER
    if messages_of(record) is not None:
        data["context"]["conversation"]["messages"] = PLACEHOLDER
    return _layout._encoder.encode(data)


def _records() -> list[RunRecord]:
    """A workload record chain: provider turns growing a frozen transcript."""
    record = RunRecord.new("r", work=1000, context={"conversation": {"messages": []}})
    record, _ = transition(record, Command("admit", 0.0, {"state": "running"}))
    out = [record]
    for n in range(12):
        record, _ = transition(record, Command("provider_started", float(n)))
        out.append(record)
        conversation = record.conversation or {}
        message = freeze({"role": "assistant", "content": f"reply {n} ünï \u2028"})
        record, _ = transition(
            record,
            Command(
                "provider_completed",
                float(n),
                {
                    "result": {"text": f"reply {n}", "score": n / 3},
                    "conversation": {
                        **conversation,
                        "messages": FrozenList((*conversation["messages"], message)),
                    },
                },
            ),
        )
        out.append(record)
    return out


def _check_heads(records: list[RunRecord]) -> None:
    previous: RunRecord | None = None
    fields: list[str] = []
    for record in records:
        expected = reference_head(record)
        assert head_text(record) == expected
        assert join_head(head_fields(record)) == expected
        fields = head_fields(record, previous, fields)
        assert join_head(fields) == expected  # incremental: only changed fields encoded
        previous = record
        head, parts = split(record)
        assert head == expected
        assert join(head, parts) == encode_record(record)


def _check_diffs(records: list[RunRecord]) -> None:
    """Diffing each record against the previous one's entry turns the stored
    part rows of the previous record into those of the next."""
    entry = NOTHING
    rows: dict[tuple[str, str], str] = {}
    for record in records:
        entry, upserts, deletes = diff(entry, record)
        for part, key in deletes:
            del rows[part, key]
        for part, key, value in upserts:
            rows[part, key] = value
        assert rows == split(record)[1]
        assert entry.record is record
        # a reloaded record (nothing shared by identity) diffs to the same rows
        again, upserts, deletes = diff(entry_of(record), record)
        assert (upserts, deletes) == ([], [])
        assert again.record is record


def test_head_equals_reference_on_a_workload_chain() -> None:
    records = _records()
    _check_heads(records)
    _check_diffs(records)


@given(lifecycle_records())
def test_head_equals_reference_on_lifecycles(records: list[RunRecord]) -> None:
    """Every record a kernel lifecycle passes through: ``head_text`` and the
    incremental ``head_fields`` are byte for byte the reference head, and the
    diff chain stores exactly ``split``'s part rows."""
    _check_heads(records)
    _check_diffs(records)


@given(
    context=st.dictionaries(
        st.sampled_from(["conversation", "x", "ünï"]),
        st.none()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=4)
        | st.fixed_dictionaries(
            {"messages": st.lists(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))}
        )
        | st.fixed_dictionaries({"turn": st.integers()}),
        max_size=3,
    )
)
def test_head_of_any_context(context: dict[str, Any]) -> None:
    """The conversation slot is a placeholder exactly when the context holds a
    transcript; other contexts are encoded as they are."""
    record = RunRecord.new("r", context=context)
    _check_heads([record])
    assert json.loads(head_text(record))["context"].get("conversation") == (
        {**context["conversation"], "messages": PLACEHOLDER}
        if isinstance(context.get("conversation"), dict)
        and isinstance(context["conversation"].get("messages"), list)
        else context.get("conversation")
    )


def test_dumps_matches_the_json_encoder() -> None:
    value = {"a": [1, 2.5, True, None, "ünï\u2028\x00"], "b": {"c": -0.0, "d": 1e300}}
    assert dumps(value) == json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":")
    )
    assert dumps("x\ny") == '"x\\ny"'
    for bad in (float("nan"), {"x": float("inf")}, {"x": object()}):
        with pytest.raises((ValueError, TypeError)):
            dumps(bad)


def test_a_middle_edit_and_a_reordered_mapping_are_diffed() -> None:
    """Positions are a shortcut, never trusted: a key renamed with an equal
    value in its place, a reordered mapping and a transcript edited in the
    middle all write exactly the rows that differ."""
    base = RunRecord.new("r", context={"conversation": {"messages": [{"n": i} for i in range(40)]}})
    records = [base]
    record = base
    for reservations in (
        {f"r{i}": 1 for i in range(30)},
        {f"r{i}": 1 for i in range(1, 31)},  # one released, one added: same values
        {f"r{i}": 1 for i in reversed(range(1, 31))},  # reordered
        {**{f"r{i}": 1 for i in range(1, 31)}, "r5": 2},  # a value in the middle
        {f"r{i}": 1 for i in range(2, 30)},  # fewer
    ):
        budget = record.budget
        record = attrs.evolve(
            record,
            budget=Budget(quota=budget.quota, used=budget.used, reservations=reservations),
            revision=record.revision + 1,
        )
        records.append(record)
    messages = list(record.context["conversation"]["messages"])
    messages[17] = {"n": "edited"}
    del messages[-3:]
    records.append(
        attrs.evolve(
            record, context={"conversation": {"messages": messages}}, revision=record.revision + 1
        )
    )
    _check_heads(records)
    _check_diffs(records)
