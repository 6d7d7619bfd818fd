"""The C accelerator ``_speedups.check`` against the reference ``check_python``.

The extension is imported unconditionally: CI builds it, so a missing build is
a failure here, never a skip.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import WORKLOADS
from trio_backplane.schema import _speedups
from trio_backplane.schema._instance import check_python, encoded_size

_SCHEMAS = WORKLOADS / "schemas.json"

_LIMIT = 10**4300


def _reference(obj: Any, max_depth: int, max_bytes: int) -> str | None:
    violation = check_python(obj, max_depth, max_bytes)
    return None if violation is None else violation[0]


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


_TEXT = st.one_of(
    st.text(max_size=12),
    # escapes, controls, DEL, latin-1, BMP, astral and lone surrogates
    st.text(
        st.one_of(
            st.sampled_from('"\\\b\f\n\r\t\x00\x01\x1f\x7f \x80\xe9\xff\u07ff\u0800\u20ac\uffff'),
            st.characters(min_codepoint=0x10000, max_codepoint=0x1F64F),
            st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]),
        ),
        max_size=8,
    ),
    # long ASCII runs (the C side skips those 8 bytes at a time)
    st.text(st.sampled_from('abcdefgh ~"\\\n\x00\x1f\x7f'), min_size=16, max_size=40),
)

_INTS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    # around +-10**4300 (mapped: hypothesis cannot repr such ints in a strategy)
    st.integers(min_value=-2, max_value=2).map(lambda d: _LIMIT + d),
    st.integers(min_value=-2, max_value=2).map(lambda d: d - _LIMIT),
    st.integers(min_value=0, max_value=4300).map(lambda k: 10**k - 1),
    st.integers(min_value=0, max_value=4300).map(lambda k: -(10**k)),
    st.integers(min_value=0, max_value=14300).map(lambda k: 2**k),
)

_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    _INTS,
    st.floats(),  # nan and +-inf included
    st.floats(min_value=-1e6, max_value=1e6).map(lambda f: round(f, 3)),
    _TEXT,
)

_FOREIGN_LEAVES = st.one_of(
    st.binary(max_size=4),
    st.frozensets(st.integers(), max_size=3),
    st.sets(st.integers(), max_size=3),
    st.builds(_Str, _TEXT),
    st.builds(_Int, st.integers()),
    st.builds(_Float, st.floats()),
    st.just(object()),
    st.just(()),
)

_KEYS = st.one_of(
    _TEXT,
    _TEXT,
    _TEXT,
    st.builds(_Str, _TEXT),
    st.integers(),
    st.booleans(),
    st.none(),
    st.tuples(st.integers()),
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5),
        st.dictionaries(_TEXT, children, max_size=5),
        st.dictionaries(_TEXT, children, max_size=5),
        st.dictionaries(_KEYS, children, max_size=4),
        st.lists(children, max_size=3).map(tuple),
        st.lists(children, max_size=3).map(_List),
        st.dictionaries(_TEXT, children, max_size=3).map(_Dict),
    )


_VALUES = st.recursive(
    st.one_of(_JSON_LEAVES, _JSON_LEAVES, _JSON_LEAVES, _FOREIGN_LEAVES), _extend, max_leaves=24
)


@settings(max_examples=300, deadline=None)
@given(
    value=_VALUES,
    max_depth=st.integers(min_value=1, max_value=12),
    max_bytes=st.integers(min_value=0, max_value=400),
)
def test_same_first_violation_as_check_python(value: Any, max_depth: int, max_bytes: int) -> None:
    """SCH-11, SCH-32, SCH-33, SCH-35, SCH-49: the accelerator and the
    reference walk report the same first violation (type, key, surrogate,
    non-finite float, integer digits, depth, encoded size) for any input."""
    assert _speedups.check(value, max_depth, max_bytes) == _reference(value, max_depth, max_bytes)


@settings(max_examples=300, deadline=None)
@given(value=st.recursive(_JSON_LEAVES, _extend, max_leaves=24))
def test_size_limit_is_the_exact_encoded_size(value: Any) -> None:
    """SCH-35: for JSON data within the other limits, the size limit admits
    exactly the compact ``ensure_ascii=False`` UTF-8 encoding."""
    reason = _speedups.check(value, 100, 1 << 40)
    assert reason == _reference(value, 100, 1 << 40)
    if reason is None:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        assert _speedups.check(value, 100, size) is None
        if size:
            assert _speedups.check(value, 100, size - 1) == "input_too_large"


def test_strings_cost_their_escaped_utf8() -> None:
    """SCH-35, SCH-11: a string costs its compact UTF-8 JSON encoding wherever
    an escape sits in it; a lone surrogate anywhere is not JSON."""
    for length in (1, 7, 8, 9, 16, 17, 24, 33):
        for pos in range(length):
            for char in map(chr, [*range(0x80), 0xE9, 0x7FF, 0x800, 0xFFFF, 0x10000]):
                for text in ("a" * pos + char + "~" * (length - pos - 1), "x" * length + char):
                    n = len(json.dumps(text, ensure_ascii=False).encode())
                    assert _speedups.check(text, 1, n) is None, text
                    assert _speedups.check(text, 1, n - 1) == "input_too_large", text
                    assert _speedups.check({text: 0}, 1, n + 4) is None, text
            for code in (0xD800, 0xDBFF, 0xDC00, 0xDFFF):
                text = "a" * pos + chr(code) + "\U0001f600" * (length - pos - 1)
                assert _speedups.check(text, 1, 1000) == "not_json"
                assert _speedups.check({"k": 0, text: 0}, 1, 1000) == "not_json"


def test_numbers_cost_their_repr() -> None:
    """SCH-35, SCH-49: ints cost len(str(v)) up to 4300 digits, 10**4300 and
    beyond in either sign are refused, floats cost len(repr(v))."""
    ints = [0, 1, -1, 2**63, -(2**63), 2**64, _LIMIT - 1, 1 - _LIMIT]
    for k in range(70):
        ints += [s * (b + d) for b in (2**k, 10**k) for d in (-1, 0, 1) for s in (1, -1)]
    for i in ints:
        n = len(str(i))
        assert _speedups.check(i, 1, n) is None, i
        assert _speedups.check(i, 1, n - 1) == "input_too_large", i
    for i in (_LIMIT, -_LIMIT, _LIMIT + 1, 2**14285, -(2**20000)):
        assert _speedups.check(i, 1, 1 << 40) == "integer_too_large"
    floats = [0.0, -0.0, 0.1, 0.1 + 0.2, 1e-4, 9.999999999999999e-05, 1e15 + 0.5, 1e16, 1e16 - 2]
    floats += [5e-324, 1.7976931348623157e308, 123456.789, 1 / 3, -2 / 3, 2.0**50 + 0.5]
    for v in floats:
        n = len(repr(v))
        assert _speedups.check(v, 1, n) is None, v
        assert _speedups.check(v, 1, n - 1) == "input_too_large", v
    for v in (math.nan, math.inf, -math.inf):
        assert _speedups.check(v, 1, 100) == "not_json"


def test_self_containing_containers_hit_the_depth_limit() -> None:
    """SCH-33: a dict or list that contains itself is refused as too deep."""
    d: dict[str, Any] = {}
    d["self"] = d
    lst: list[Any] = []
    lst.append(lst)
    for value in (d, lst, [d], {"a": lst}):
        assert _speedups.check(value, 128, 1 << 20) == "input_too_deep"
        assert _reference(value, 128, 1 << 20) == "input_too_deep"


def test_very_deep_nesting_uses_no_c_recursion() -> None:
    """SCH-33: 100 000 nested lists are refused at max_depth without a stack
    overflow, and exactly max_depth levels pass at the largest limit."""
    deep: list[Any] = []
    for _ in range(99_999):
        deep = [deep]  # 100 000 levels, the root counting as one
    assert _speedups.check(deep, 128, 1 << 30) == "input_too_deep"
    assert _reference(deep, 128, 1 << 30) == "input_too_deep"
    assert _speedups.check(deep, 100_000, 1 << 30) is None
    assert _speedups.check(deep, 99_999, 1 << 30) == "input_too_deep"
    assert _speedups.check([deep], 100_000, 1 << 30) == "input_too_deep"


def test_shared_dag_is_refused_after_max_bytes() -> None:
    """SCH-35: a 10**61-leaf tree built from one shared list is refused as too
    large after about max_bytes steps, not walked (walking it would never end,
    so this test finishing is the proof; no timing is asserted)."""
    dag: list[Any] = [0] * 10
    for _ in range(60):
        dag = [dag] * 10
    assert _speedups.check(dag, 128, 10**6) == "input_too_large"
    assert _speedups.check(dag, 128, 10**4) == _reference(dag, 128, 10**4) == "input_too_large"


def _bench_instances() -> list[tuple[str, Any]]:
    workloads = json.loads(_SCHEMAS.read_text(encoding="utf-8"))
    return [
        (f"{name}/{kind}", workloads[name][kind])
        for name in ("tool", "big_defs")
        for kind in ("valid", "invalid")
    ]


def test_bench_instances_size_boundary() -> None:
    """SCH-35: on the bench instances a limit equal to the encoded size passes
    and one byte less is refused, in both implementations."""
    for label, instance in _bench_instances():
        size = encoded_size(instance)
        assert size == len(json.dumps(instance, ensure_ascii=False, separators=(",", ":")).encode())
        for check in (_speedups.check, _reference):
            assert check(instance, 128, size) is None, label
            assert check(instance, 128, size - 1) == "input_too_large", label
            assert check(instance, 1, size) == "input_too_deep", label


def test_bad_arguments() -> None:
    """Out-of-range limits raise ValueError, wrong types and arity TypeError."""
    for depth, size in ((0, 10), (-1, 10), (100_001, 10), (10**30, 10), (5, -1), (5, -(10**30))):
        with pytest.raises(ValueError, match="max_"):
            _speedups.check([], depth, size)
    assert _speedups.check([], 100_000, 10**30) is None  # a huge max_bytes is no limit
    bad_args: tuple[tuple[Any, ...], ...] = (
        (),
        ([],),
        ([], 5),
        ([], 5, 10, 1),
        ([], "5", 10),
        ([], 5, 1.5),
        ([], None, 10),
    )
    for args in bad_args:
        with pytest.raises(TypeError):
            _speedups.check(*args)
    with pytest.raises(TypeError):
        _speedups.check([], 5, max_bytes=10)  # type: ignore[call-arg]
