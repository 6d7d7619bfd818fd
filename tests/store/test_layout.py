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
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import (
    Budget,
    Command,
    FrozenList,
    RunRecord,
    _speedups,
    decode_record,
    encode_record,
    evolve_record,
    freeze,
    transition,
)
from trio_backplane.kernel._derived import put
from trio_backplane.store import _diff, _layout
from trio_backplane.store._diff import NOTHING, diff, entry_of, split
from trio_backplane.store._layout import (
    PLACEHOLDER,
    blank,
    dumps,
    head_fields,
    head_text,
    join,
    join_head,
)


def reference_head(record: RunRecord) -> str:
    """The head as it was first built: ``encode_record`` of the record with its
    growing entries removed, each parts slot then set to the placeholder."""
    data = encode_record(blank(record))
    data["intents"] = PLACEHOLDER
    data["tool_results"] = PLACEHOLDER
    data["budget"]["reservations"] = PLACEHOLDER
    data["transcript"] = PLACEHOLDER
    data["usage"] = PLACEHOLDER
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _records() -> list[RunRecord]:
    """A workload record chain: provider turns growing a frozen transcript."""
    record = RunRecord.new("r", work=1000, context={"conversation": {"turns": 0}})
    record, _ = transition(record, Command("admit", 0.0, {"state": "running"}))
    out = [record]
    for n in range(12):
        record, _ = transition(record, Command("provider_started", float(n)))
        out.append(record)
        message = freeze({"role": "assistant", "content": f"reply {n} ünï \u2028"})
        record, _ = transition(
            record,
            Command(
                "provider_completed",
                float(n),
                {
                    "result": {"text": f"reply {n}", "score": n / 3},
                    "conversation": {"turns": n + 1},
                    "messages": FrozenList((message,)),
                    "usage": FrozenList((freeze({"output_tokens": n}),)),
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
    ),
    transcript=st.lists(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
)
def test_head_of_any_context(context: dict[str, Any], transcript: list[Any]) -> None:
    """The transcript and usage slots are placeholders whatever they hold;
    the context is encoded as it is (a list in it is the host's data)."""
    record = RunRecord.new("r", context=context, transcript=transcript)
    _check_heads([record])
    head = json.loads(head_text(record))
    assert head["context"] == context
    assert (head["transcript"], head["usage"]) == (PLACEHOLDER, PLACEHOLDER)


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
    base = RunRecord.new("r", transcript=[{"n": i} for i in range(40)])
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
    messages = list(record.transcript)
    messages[17] = {"n": "edited"}
    del messages[-3:]
    records.append(attrs.evolve(record, transcript=messages, revision=record.revision + 1))
    _check_heads(records)
    _check_diffs(records)


def test_usage_is_stored_as_rows_so_a_commit_does_not_rewrite_it() -> None:
    """Issue 4 item 8: the provider usage reports grow with the run like the
    transcript; a commit writes the new report only, and the head holds a
    placeholder whatever the run's length."""
    records = _records()
    last = records[-1]
    assert len(last.usage) == 12
    assert "output_tokens" not in head_text(last)
    assert "output_tokens" not in join_head(head_fields(last))
    entry = entry_of(records[-2])
    _, upserts, deletes = diff(entry, last)
    usage_rows = [row for row in upserts if row[0] == "usage"]
    assert [json.loads(value) for _part, _key, value in usage_rows] == [{"output_tokens": 11}]
    assert deletes == []
    assert json.loads(head_text(last))["usage"] == PLACEHOLDER


def legacy_head(head: str, usage: list[Any]) -> str:
    """``head`` as record schema version 1 wrote it: the transcript a
    placeholder inside ``context["conversation"]`` and the usage reports
    there inline (layout 1)."""
    data = json.loads(head)
    del data["transcript"], data["usage"]
    data["schema_version"] = 1
    data["context"]["conversation"] = {
        **data["context"]["conversation"],
        "messages": PLACEHOLDER,
        "usage": usage,
    }
    return dumps(data)


def test_a_layout_1_head_with_inline_usage_is_upgraded_by_the_next_commit() -> None:
    """A head written by layout 1 held ``usage`` inline (and record schema
    version 1 the lists inside the conversation): read back, the record is
    whole, and diffing from it writes every usage row (nothing is lost when
    the next head holds the placeholder)."""
    records = _records()
    old, new = records[-2], records[-1]
    head, parts = split(old)
    legacy = legacy_head(head, encode_record(old)["usage"])
    legacy_parts = {k: v for k, v in parts.items() if k[0] != "usage"}
    assert decode_record(join(legacy, legacy_parts)) == old
    assert _layout.inline_lists(legacy) == {"usage"}
    assert _layout.inline_lists(head) == frozenset()
    entry = entry_of(old, _layout.inline_lists(legacy))
    rows = dict(legacy_parts)
    _, upserts, deletes = diff(entry, new)
    for part, key in deletes:
        del rows[part, key]
    for part, key, value in upserts:
        rows[part, key] = value
    assert join(head_text(new), rows) == encode_record(new)


def test_kernel_derived_maps_are_diffed_by_their_changed_keys() -> None:
    """A map the kernel derived from the stored one names the keys it changed
    (``changed_keys``): the diff encodes those and reads no other entry; a map
    of another lineage (a reload, a branch) is compared entry by entry, with
    the same rows either way."""
    from trio_backplane.kernel import changed_keys

    records = _records()
    old, new = records[-3], records[-1]
    assert changed_keys(old.intents, new.intents) is not None
    assert changed_keys(entry_of(old).intents.source, new.intents) is not None
    fast_entry, fast_up, fast_del = diff(entry_of(old), new)
    reloaded = RunRecord(**{f.name: getattr(old, f.name) for f in attrs.fields(RunRecord)})
    reloaded = attrs.evolve(reloaded, intents=dict(old.intents))  # a fresh mapping
    assert changed_keys(reloaded.intents, new.intents) is None
    slow_entry, slow_up, slow_del = diff(entry_of(reloaded), new)
    assert sorted(fast_up) == sorted(slow_up)
    assert fast_del == slow_del
    assert fast_entry.intents.keys == slow_entry.intents.keys
    assert fast_entry.intents.values == slow_entry.intents.values


def test_incremental_head_keeps_the_context_text_only_when_it_is_the_same() -> None:
    """STO-09: a commit that only grows the transcript encodes no context
    text; one that changes a conversation field or adds a context key encodes
    it again: the incremental head is the reference head every time."""
    record = RunRecord.new("r", work=100, context={"conversation": {"queue_status": "active"}})
    record, _ = transition(record, Command("admit", 0.0, {"state": "running"}))
    chain = [record]

    def update(data: dict[str, Any], **context: Any) -> None:
        current = chain[-1]
        new, _ = transition(current, Command("conversation_updated", 1.0, data))
        if context:
            new = evolve_record(new, context={**new.context, **context})
        chain.append(new)

    update({"messages": [{"role": "user", "content": "a"}]})  # the transcript only
    assert chain[-1].context is chain[-2].context
    update({"messages": [{"role": "user", "content": "b"}], "conversation": {"queue_status": "x"}})
    update({"conversation": {"queue_status": "x"}}, tenant="t1")  # a new context key
    _check_heads(chain)


# -- the accelerator's head_fields ------------------------------------------------

_BASE = _records()[-1]
#: Head fields encoded as they are (not slots, not the budget).
_PLAIN = [
    name
    for name in ("step_id", "context", "provider_result", "counters", "active_provider", "error")
    if hasattr(_BASE, name)
]


def freeze_or_same(value: Any) -> Any:
    try:
        return freeze(value)
    except Exception:
        return value


_hostile = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([-(2**63), 2**64])
    | st.integers(0, 3).map(lambda k: 10**5000 + k)  # past the digit limit
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["\ud800", "ünï", 'a\x00"\\\n\u2028', object()]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(freeze_or_same)
    ),
    max_leaves=8,
)


def _with(record: RunRecord, **values: Any) -> RunRecord:
    """``record`` holding ``values`` as they are: no converter, no validator."""
    out = _speedups.copy_slots(record)
    for name, value in values.items():
        object.__setattr__(out, name, value)
    return out


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as exc:
        return ("raised", type(exc), str(exc))


@given(
    values=st.dictionaries(st.sampled_from(_PLAIN), _hostile, min_size=1, max_size=3),
    quota=_hostile,
    used=_hostile,
    budget=st.booleans(),
)
def test_c_head_fields_are_the_python_head_fields(
    values: dict[str, Any], quota: Any, used: Any, budget: bool
) -> None:
    """KER-11: the accelerator's ``head_fields`` gives the Python code's
    fields, whole or incremental, or its very error, on any values a record
    may be made to hold (non-ASCII and lone surrogates, ints past the digit
    limit, non-finite floats, runtime objects, deep and frozen containers)."""
    if budget:
        values["budget"] = _with_budget(_BASE.budget, quota, used)
    record = _with(_BASE, **values)
    base_fields = _layout._head_fields(_BASE)
    for args in (
        (record, None, ()),
        (record, _BASE, base_fields),
        (record, _BASE, tuple(base_fields)),
    ):
        assert _outcome(_layout.head_fields, *args) == _outcome(_layout._head_fields, *args)


def _with_budget(budget: Budget, quota: Any, used: Any) -> Budget:
    out = _speedups.copy_slots(budget)
    object.__setattr__(out, "quota", quota)
    object.__setattr__(out, "used", used)
    return out


def test_c_head_fields_write_only_changed_fields_and_decline_what_is_not_theirs() -> None:
    """The accelerator encodes a field only when the record holds another
    object there, and declines (the Python code then decides) a record
    subclass, fields of another length and an unset slot."""
    fast = _speedups.head_fields
    fields = _layout._head_fields(_BASE)
    marked = [f"<{i}>" for i in range(len(fields))]
    changed = _with(_BASE, step_id="step-x")
    out = fast(changed, _BASE, marked)
    index = _layout._FIELDS.index("step_id")
    assert out[index] == '"step_id":"step-x"'
    assert [t for i, t in enumerate(out) if i != index] == [
        t for i, t in enumerate(marked) if i != index
    ]
    assert fast(_BASE, None, ()) == fields
    assert fast(_BASE, _BASE, fields[:-1]) is NotImplemented
    assert fast(_BASE, _BASE, iter(fields)) is NotImplemented

    @attrs.frozen
    class Sub(RunRecord):
        pass

    sub = Sub(run_id="r")
    assert fast(sub, None, ()) is NotImplemented
    assert _layout.head_fields(sub) == _layout._head_fields(sub)
    unset = object.__new__(RunRecord)
    assert fast(unset, None, ()) is NotImplemented
    with pytest.raises(AttributeError):
        _layout.head_fields(unset)


# -- the accelerator's diff --------------------------------------------------------


def _same_diff(fast: Any, ref: tuple[Any, Any, Any]) -> None:
    entry, upserts, deletes = fast
    assert (upserts, deletes) == (ref[1], ref[2])
    want = ref[0]
    assert entry.record is want.record
    assert entry.messages is want.messages
    assert entry.usage is want.usage
    for name in ("intents", "tool_results", "reservations"):
        assert getattr(entry, name).source is getattr(want, name).source


def _chain_diffs(records: list[RunRecord]) -> int:
    """Each record diffed by the accelerator and by the Python code against
    the previous entry: the same rows and entry, or declined; how many were not."""
    taken = 0
    entry = entry_of(records[0])
    for record in records[1:]:
        ref = _diff._diff(entry, record)
        fast = _speedups.diff(entry, record)
        if fast is not NotImplemented:
            _same_diff(fast, ref)
            taken += 1
        entry = ref[0]
    return taken


def test_c_diff_takes_the_common_commit() -> None:
    """KER-11: on a workload chain every commit is the accelerator's, with
    the Python code's rows and entry, but the first two: a map derived from
    an empty one starts a lineage of its own (nothing to name the moved keys)."""
    records = _records()
    assert _chain_diffs(records) == len(records) - 3


@given(lifecycle_records())
def test_c_diff_is_the_python_diff_on_lifecycles(records: list[RunRecord]) -> None:
    """KER-11: on any kernel lifecycle the accelerator's diff is the Python
    code's, or declined."""
    _chain_diffs(records)


def test_c_diff_declines_what_the_kernel_did_not_derive() -> None:
    """A reloaded map (no lineage), an edited or shortened transcript, a NUL
    in a moved key and a record subclass go to the Python code; a value the
    store refuses raises the Python code's error either way."""
    records = _records()
    old, new = records[-2], records[-1]
    entry = _diff.diff(entry_of(records[-3]), old)[0]
    assert _speedups.diff(entry, new) is not NotImplemented
    reloaded = attrs.evolve(new, intents=dict(new.intents))
    edited = attrs.evolve(new, transcript=[{"role": "user", "content": "x"}, *new.transcript[1:]])
    shorter = attrs.evolve(new, transcript=new.transcript[:-2])
    for record in (reloaded, edited, shorter):
        assert _speedups.diff(entry, record) is NotImplemented
    # derived from the remembered map, as the kernel derives: only the key decides
    for key, value in (("a\x00b", freeze({"x": 1})), ("k", freeze({"x": 1})), ("k", object())):
        records = _records()
        entry = _diff.diff(entry_of(records[-2]), records[-1])[0]
        record = _with(records[-1], intents=_put(records[-1].intents, key, value))
        if "\x00" in key:
            assert _speedups.diff(entry, record) is NotImplemented
            with pytest.raises(Error) as raised:
                _diff.diff(entry, record)
            assert raised.value.error_class is ErrorClass.VALIDATION
        elif isinstance(value, dict):
            _same_diff(_speedups.diff(entry, record), _diff._diff(entry, record))
        else:
            for diff_of in (_speedups.diff, _diff._diff):
                with pytest.raises(Error, match="runtime handle"):
                    diff_of(entry, record)


def _put(mapping: Any, key: str, value: Any) -> Any:
    """``mapping`` with ``key`` set to ``value`` as it is (no freeze), as the
    kernel derives it."""
    return put(mapping, key, value)


class _Meddling(dict):  # type: ignore[type-arg]
    """A value whose encoding runs ``meddle`` (the stdlib encoder reads a
    dict subclass through ``items``): Python code in the middle of a call."""

    meddle: Any = None

    def items(self) -> Any:
        if self.meddle is not None:
            self.meddle()
        return super().items()


def _configure_head_again() -> None:
    layout = _layout
    _speedups.configure_head(
        RunRecord,
        Budget,
        layout._FIELDS,
        layout._HEAD_KINDS,
        layout._HEAD_KEYS,
        tuple(
            layout._SLOT_FIELDS[i] if kind == layout._SLOT else None
            for i, kind in enumerate(layout._HEAD_KINDS)
        ),
        ('{"quota":', ',"used":', ',"reservations":"__parts__"}'),
        layout._field_text,
    )


def test_c_head_fields_hold_what_they_read_while_python_code_runs() -> None:
    """KER-11: a field's fallback is Python code that may delete a later slot,
    clear the caller's fields or configure the accelerator again: the fields
    are those read when the call began (as the Python code reads them all
    first), never a crash."""
    base_fields = _layout._head_fields(_BASE)
    for meddle in ("slot", "fields", "configure"):
        value = _Meddling(a=1)
        record = _with(_BASE, context=value)
        fields = list(base_fields)
        expected = _layout._head_fields(record, _BASE, fields)
        value.meddle = {
            "slot": lambda record=record: object.__delattr__(record, "schema_version"),
            "fields": fields.clear,
            "configure": _configure_head_again,
        }[meddle]
        assert _speedups.head_fields(record, _BASE, fields) == expected


def test_c_diff_holds_what_it_reads_and_declines_before_running_python_code() -> None:
    """KER-11: an encode that replaces the record's transcript leaves the
    rows of the transcript the call began with; a list subclass (whose
    methods the Python code would call) is declined; a decline comes before
    any value's Python code runs (the Python code then encodes it once)."""
    records = _records()
    entry = _diff.diff(entry_of(records[-2]), records[-1])[0]
    holder: dict[str, RunRecord] = {}
    value = _Meddling(a=1)
    grown = FrozenList([*records[-1].transcript, value, freeze({"b": 2})])
    holder["record"] = _with(records[-1], transcript=grown)
    expected = _diff._diff(entry, holder["record"])
    value.meddle = lambda: object.__setattr__(holder["record"], "transcript", FrozenList())
    _same_diff(_speedups.diff(entry, holder["record"]), expected)

    class Shorter(list):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 0

    sub = _with(records[-1], transcript=Shorter(grown))
    assert _speedups.diff(entry, sub) is NotImplemented

    calls: list[int] = []
    counted = _Meddling(a=1)
    counted.meddle = lambda: calls.append(1)
    edited = FrozenList([freeze({"edited": 1}), *records[-1].transcript[1:]])
    record = _with(
        records[-1],
        intents=_put(records[-1].intents, "k", counted),
        transcript=edited,
    )
    _diff.diff(entry, record)
    assert calls == [1]
