"""The C accelerator ``kernel._speedups`` against the Python code it speeds up:
``freeze`` against the Python walk, ``copy_slots`` against the record copy.

The extension is imported unconditionally: CI builds it, so a missing build is
a failure here, never a skip.  The accelerator either builds exactly what the
Python walk builds (same values, same frozen types all the way down) or
declines (``NotImplemented``), and it declines everything the walk refuses.
"""

from __future__ import annotations

import array
import collections
import gc
import math
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error
from trio_backplane.kernel import (
    Admit,
    FrozenDict,
    FrozenList,
    LayeredDict,
    ProviderStarted,
    RunRecord,
    Start,
    _derived,
    _evolve,
    _frozen,
    _speedups,
    transition,
)


class _Int(int):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


def _big(n: int) -> int:
    """Integers around the 4300-digit bound (built lazily: hypothesis cannot
    print them)."""
    return [10**4300 - 1, -(10**4300) + 1, 10**4300, 2**14284, 2**14285][n]


_TEXT = st.one_of(
    st.text(max_size=10),
    st.text(
        st.one_of(
            st.sampled_from("\x00\x7f\x80\xe9\xff\u0800\u20ac\uffff"),
            st.characters(min_codepoint=0x10000, max_codepoint=0x1F64F),
            st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
        ),
        max_size=6,
    ),
)
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from(range(5)).map(_big),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
    st.sampled_from([_Int(3), object(), b"bytes", FrozenDict({"f": 1}), FrozenList([1])]),
)


def _values() -> st.SearchStrategy[Any]:
    return st.recursive(
        _LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=4).map(tuple),
            st.dictionaries(_TEXT, inner, max_size=4),
            st.dictionaries(st.integers(), inner, max_size=2),
            st.dictionaries(_TEXT, inner, max_size=2).map(_Dict),
        ),
        max_leaves=20,
    )


def _python(value: Any, limit: int) -> Any:
    return _frozen._freeze(value, "committed intent", 0, limit)


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same exact types at every level."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@given(_values(), st.sampled_from([1, 2, 3, 256]))
def test_builds_what_the_python_walk_builds_or_declines(value: Any, limit: int) -> None:
    fast = _speedups.freeze(value, limit)
    try:
        expected = _python(value, limit)
    except Error:
        assert fast is NotImplemented  # every refusal is the walk's to word
        return
    if fast is not NotImplemented:
        assert _same(fast, expected)


@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(min_value=-(2**200), max_value=2**200),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(max_size=10),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.text(max_size=6), inner, max_size=4),
        ),
        max_leaves=20,
    )
)
def test_plain_json_data_never_declines(value: Any) -> None:
    """JSON data of exact built-in types is the accelerator's own: it never
    falls back to the walk (the engine's hot path)."""
    fast = _speedups.freeze(value, 256)
    assert fast is not NotImplemented
    assert _same(fast, _python(value, 256))


def test_frozen_containers_are_kept_and_fresh_ones_built() -> None:
    inner = FrozenDict({"a": 1})
    layered = LayeredDict(FrozenDict({"x": 1}), {"y": 2}, 2)
    items = FrozenList([1])
    frozen = _speedups.freeze({"d": inner, "l": layered, "i": items, "t": (1, [2])}, 256)
    assert type(frozen) is FrozenDict
    assert frozen["d"] is inner
    assert frozen["l"] is layered
    assert frozen["i"] is items
    assert type(frozen["t"]) is FrozenList
    assert type(frozen["t"][1]) is FrozenList
    with pytest.raises(TypeError):
        frozen["new"] = 1  # built at C level, refusing mutation all the same


def test_depth_limit_declines_at_the_walks_limit() -> None:
    """A container at depth ``limit`` is declined; one level less is built."""
    assert _speedups.freeze([[[]]], 3) == [[[]]]
    assert _speedups.freeze([[[]]], 2) is NotImplemented
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    assert _speedups.freeze(deep, 256) is NotImplemented
    with pytest.raises(Error, match="nests deeper than 256"):
        _frozen.freeze(deep)


def test_freeze_uses_the_accelerator_and_keeps_the_walks_errors() -> None:
    """``kernel.freeze`` goes through the accelerator (this build has it) and
    still raises the walk's classed errors for what it declines."""
    assert _frozen._fast_freeze is _speedups.freeze
    with pytest.raises(Error, match="lone surrogate"):
        _frozen.freeze({"k": "\ud800"})
    with pytest.raises(Error, match="non-finite"):
        _frozen.freeze([math.inf])
    with pytest.raises(Error, match="runtime handle"):
        _frozen.freeze({"k": object()})
    with pytest.raises(Error, match="runtime handle"):
        _frozen.freeze({"k": _Int(3)})  # an int subclass is not JSON data


def test_bad_calls_are_refused() -> None:
    with pytest.raises(TypeError):
        _speedups.freeze({})  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _speedups.configure(dict, list)  # type: ignore[call-arg]


@pytest.mark.parametrize("limit", [-1, 100_001, 2**70, 3.0, "3"])
def test_a_limit_the_accelerator_does_not_take_goes_to_the_walk(limit: Any) -> None:
    """The walk decides any limit (review of session 15: C raised where the
    walk answered)."""
    assert _speedups.freeze([[1]], limit) is NotImplemented


def test_a_frozen_mapping_past_the_limit_goes_to_the_walk() -> None:
    """A frozen mapping kept as it is deeper than ``limit`` is the walk's to
    refuse (it does, past its recursive levels), not the accelerator's to keep."""
    value: Any = FrozenDict(a=1)
    for _ in range(100):
        value = [value]
    assert _speedups.freeze(value, 100) is NotImplemented
    with pytest.raises(Error, match="nests deeper than 100"):
        _frozen.freeze(value, limit=100)
    assert _speedups.freeze(value, 256) is not NotImplemented


def test_copy_slots_copies_a_record_as_the_python_copy_does() -> None:
    record, _ = transition(RunRecord.new("run-copy"), Admit(at=1.0, state="running"))
    record, _ = transition(record, Start(at=2.0))
    record, _ = transition(record, ProviderStarted(at=3.0, turn_id="turn-1"))
    fast = _speedups.copy_slots(record)
    slow = _evolve._make_copy()(record, object.__new__, RunRecord)
    assert type(fast) is RunRecord
    assert fast is not record
    assert fast == record == slow
    for field in attrs.fields(RunRecord):
        assert getattr(fast, field.name) is getattr(record, field.name)
    assert _evolve._copy_record is _speedups.copy_slots
    # the copy is its own object: a slot set on it leaves the original alone
    _evolve._SETTERS["state"](fast, "completed")
    assert record.state == "running"


def test_copy_slots_refuses_an_object_whose_state_it_cannot_copy() -> None:
    """Only classes with ``__slots__`` over ``object``: a built-in base keeps
    state a blank instance would lack (review of session 15: a copied
    ``FrozenDict`` or ``array`` crashed the interpreter when used)."""

    class Plain:
        pass

    class SlottedSet(set):  # type: ignore[type-arg]
        __slots__ = ("a",)

    class SlottedDeque(collections.deque):  # type: ignore[type-arg]
        __slots__ = ("a",)

    class SlottedStr(str):
        __slots__ = ()

    for value in (
        Plain(),
        3,
        FrozenDict(a=1),
        FrozenList([1]),
        SlottedSet({1}),
        SlottedDeque([1]),
        SlottedStr("text"),
        array.array("i", [1]),
    ):
        with pytest.raises(TypeError, match="__slots__ over object"):
            _speedups.copy_slots(value)


def test_copy_slots_copies_inherited_slots() -> None:
    class Base:
        __slots__ = ("__weakref__", "a")

    class Derived(Base):
        __slots__ = ("b",)

    original = Derived()
    original.a, original.b = [1], "x"
    copied = _speedups.copy_slots(original)
    assert type(copied) is Derived
    assert copied.a is original.a
    assert copied.b == "x"
    half = Derived()
    half.b = 2
    assert not hasattr(_speedups.copy_slots(half), "a")  # unset stays unset


_LIFECYCLE = """
from trio_backplane.kernel import (
    Admit, ProviderCompleted, ProviderStarted, RunRecord, Start, ToolCompleted, ToolInvoked,
    _frozen, freeze, transition,
)

record = RunRecord.new("run-fallback", context={"host": {"k": [1, 2.5, None, "\\u00e9"]}})
events = []
message = {"role": "assistant", "content": [{"type": "text", "text": "hi"}], "id": "m1"}
for command in (
    Admit(at=1.0, state="running"),
    Start(at=1.0),
    ProviderStarted(at=2.0, turn_id="turn-1"),
    ProviderCompleted(at=3.0, attempt_id="attempt-1-1", result={"message": message},
                      messages=[message], usage=[{"input_tokens": 3}]),
    ToolInvoked(at=4.0, tool_name="echo", tool_call_id="call-1", arguments_digest="d"),
    ToolCompleted(at=5.0, invocation_id="invocation-1-1", result={"ok": [1, {"x": (2,)}]},
                  messages=[{"role": "tool", "content": "ok", "id": "m2"}]),
):
    record, produced = transition(record, command)
    events.extend(produced)
print("C" if _frozen._fast_freeze is not None else "python")
print(repr(record))
print(repr([(e.type, e.occurred_at, e.payload) for e in events]))
print(repr(freeze({"a": [1, (2, {"b": None})], "c": 1.5})))
"""


def _run_lifecycle(block: bool) -> list[str]:
    prelude = 'import sys; sys.modules["trio_backplane.kernel._speedups"] = None\n'
    result = subprocess.run(
        [sys.executable, "-c", (prelude if block else "") + _LIFECYCLE],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.splitlines()


def test_the_pure_python_fallback_gives_the_same_records_and_events() -> None:
    """Where no compiler built the extension, the kernel runs its Python code
    and commits byte for byte what the accelerated kernel commits."""
    fast, slow = _run_lifecycle(block=False), _run_lifecycle(block=True)
    assert fast[0] == "C"
    assert slow[0] == "python"
    assert fast[1:] == slow[1:]


@given(
    st.lists(_values(), max_size=5).map(lambda v: _frozen.freeze(v) if _frozen_ok(v) else []),
    st.lists(_LEAVES | st.lists(st.integers(), max_size=2), max_size=4),
    st.booleans(),
)
def test_grown_appends_as_the_python_copy_does(items: Any, more: list[Any], as_tuple: bool) -> None:
    """``grown`` builds the ``FrozenList`` the Python copy builds; it leaves
    the cycle collector out only when every item is (an atom, or a container
    the collector does not track), CPython's rule for a tuple: no cycle can
    pass through it."""
    extra: Any = tuple(more) if as_tuple else more
    fast = _speedups.grown(items, extra)
    slow = _derived._grown_python(items, extra)
    assert type(fast) is FrozenList
    assert _same(fast, slow)
    assert fast is not items
    assert gc.is_tracked(fast) is any(gc.is_tracked(x) for x in [*items, *more])


def _frozen_ok(value: Any) -> bool:
    try:
        _frozen.freeze(value)
    except Error:
        return False
    return True


def test_grown_refuses_what_is_not_a_sequence() -> None:
    with pytest.raises(TypeError, match="lists or tuples"):
        _speedups.grown(FrozenList(), {"a": 1})
    with pytest.raises(TypeError):
        _speedups.grown(FrozenList())  # type: ignore[call-arg]


def test_a_transcript_grown_again_stays_out_of_the_collector_while_frozen() -> None:
    """The kernel grows the transcript from its last copy: messages ``freeze``
    built keep it untracked; a hand-made ``FrozenDict`` holding a mutable
    list (it could take part in a cycle) keeps the copy tracked."""
    first = _speedups.grown(_frozen.freeze([{"role": "user"}]), (_frozen.freeze({"k": 1}),))
    assert not gc.is_tracked(first)
    second = _speedups.grown(first, [_frozen.freeze({"role": "assistant"}), "text", 1.5])
    assert not gc.is_tracked(second)
    assert second == [{"role": "user"}, {"k": 1}, {"role": "assistant"}, "text", 1.5]
    inner: list[Any] = []
    third = _speedups.grown(second, [FrozenDict(m=inner)])
    assert gc.is_tracked(third)
    inner.append(third)  # a cycle through the copy: the collector finds it
    del inner, third
    assert gc.collect() > 0


def test_freeze_leaves_containers_of_atoms_untracked() -> None:
    """A container ``freeze`` built holding only atoms or untracked
    containers is not tracked; one holding a tracked value is; setting a
    mutable value in a frozen dict (``dict.__setitem__``) tracks it again."""
    frozen = _frozen.freeze({"a": [1, {"b": "c"}], "d": 1.5})
    assert not gc.is_tracked(frozen)
    assert not gc.is_tracked(frozen["a"])
    kept = _frozen.freeze({"a": FrozenDict(m=[1])})  # a hand-made frozen value
    assert gc.is_tracked(kept)
    dict.__setitem__(frozen, "x", [])
    assert gc.is_tracked(frozen)


_PUT_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "put", "put", "dissoc", "branch"]),
        st.sampled_from([f"k{i}" for i in range(10)]),
        st.integers(0, 3),
    ),
    max_size=40,
)


@given(
    st.dictionaries(st.sampled_from([f"k{i}" for i in range(10)]), st.integers(), max_size=8),
    _PUT_OPS,
    st.sampled_from([(4, 3), (64, 32), (1, 1), (2, 8)]),
)
def test_put_derives_exactly_as_the_python_code(
    start: dict[str, int], ops: list[tuple[str, str, int]], thresholds: tuple[int, int]
) -> None:
    """The accelerator's ``put`` gives the mapping the Python ``_set`` and
    ``_derive`` give (type, entries, order, length) and the same lineage: the
    keys ``changed_keys`` names between any two versions are the same, along
    a chain with dissociations and branches from older versions."""
    layer_from, overlay_max = thresholds
    saved = _derived._LAYER_FROM, _derived._OVERLAY_MAX
    _derived._LAYER_FROM, _derived._OVERLAY_MAX = layer_from, overlay_max
    try:
        fast: list[Any] = [_frozen.freeze(start)]
        slow: list[Any] = [_frozen.freeze(start)]
        for op, key, n in ops:
            if op == "branch":  # derive from an older version next
                index = n % len(fast)
                fast.append(fast[index])
                slow.append(slow[index])
            elif op == "dissoc":
                fast.append(_derived.dissoc(fast[-1], key))
                slow.append(_derived.dissoc(slow[-1], key))
            else:
                derived = _speedups.put(fast[-1], key, n, layer_from, overlay_max)
                assert derived is not NotImplemented
                fast.append(derived)
                slow.append(_derived._derive(slow[-1], _derived._set(slow[-1], key, n), key))
        for a, b in zip(fast, slow, strict=True):
            assert type(a) is type(b)
            assert list(a.items()) == list(b.items())
            assert len(a) == len(b)
        for i in range(len(fast)):
            for j in range(i, len(fast)):
                assert _derived.changed_keys(fast[i], fast[j]) == _derived.changed_keys(
                    slow[i], slow[j]
                )
    finally:
        _derived._LAYER_FROM, _derived._OVERLAY_MAX = saved


def test_put_declines_what_it_does_not_derive() -> None:
    """A plain dict, a non-str key or a lineage set by hand go to the Python code."""
    assert _speedups.put({"a": 1}, "b", 2, 64, 32) is NotImplemented
    assert _speedups.put(FrozenDict(a=1), 3, 2, 64, 32) is NotImplemented
    odd = FrozenDict(a=1)
    odd._lineage = "not a lineage"  # type: ignore[assignment]
    assert _speedups.put(odd, "b", 2, 64, 32) is NotImplemented
    huge = FrozenDict(a=1)
    huge._lineage = ([], 2**70)  # type: ignore[assignment]
    assert _speedups.put(huge, "b", 2, 64, 32) is NotImplemented
    assert _derived.put(huge, "b", 2)._lineage == (["b"], 1)  # type: ignore[attr-defined]
    long = LayeredDict(FrozenDict(a=1), {}, 2**70)
    assert _speedups.put(long, "b", 2, 64, 32) is NotImplemented
    assert _derived._fast_put is _speedups.put
    assert _derived.put({"a": 1}, "b", 2) == {"a": 1, "b": 2}  # the Python code
