"""The C accelerator ``kernel._speedups.freeze`` against the Python walk.

The extension is imported unconditionally: CI builds it, so a missing build is
a failure here, never a skip.  The accelerator either builds exactly what the
Python walk builds (same values, same frozen types all the way down) or
declines (``NotImplemented``), and it declines everything the walk refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error
from trio_backplane.kernel import FrozenDict, FrozenList, LayeredDict, _records, _speedups


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
    return _records._freeze(value, "committed intent", 0, limit)


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
        _records.freeze(deep)


def test_freeze_uses_the_accelerator_and_keeps_the_walks_errors() -> None:
    """``kernel.freeze`` goes through the accelerator (this build has it) and
    still raises the walk's classed errors for what it declines."""
    assert _records._fast_freeze is _speedups.freeze
    with pytest.raises(Error, match="lone surrogate"):
        _records.freeze({"k": "\ud800"})
    with pytest.raises(Error, match="non-finite"):
        _records.freeze([math.inf])
    with pytest.raises(Error, match="runtime handle"):
        _records.freeze({"k": object()})
    with pytest.raises(Error, match="runtime handle"):
        _records.freeze({"k": _Int(3)})  # an int subclass is not JSON data


def test_bad_calls_are_refused() -> None:
    with pytest.raises(TypeError):
        _speedups.freeze({})  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="limit"):
        _speedups.freeze({}, -1)
    with pytest.raises(TypeError):
        _speedups.configure(dict, list)  # type: ignore[call-arg]
