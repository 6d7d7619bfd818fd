"""``freeze``: read-only deep copies of JSON data (KER-11), up to
``MAX_DEPTH`` levels of nesting.

Values nested deeper than the recursive fast path (``_RECURSION`` levels)
continue on an explicit stack; these tests go past it, and far past Python's
recursion limit, and check the iterative path refuses what the recursive
one refuses, and that deeper than ``MAX_DEPTH`` is refused without recursion.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from hypothesis import given

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import FrozenDict, FrozenList, freeze, thaw
from trio_backplane.kernel._frozen import _RECURSION, MAX_DEPTH

from .support import json_values

DEEP = max(20_000, 4 * sys.getrecursionlimit())


def nested(depth: int, leaf: Any) -> Any:
    """``depth`` levels of alternating objects and arrays around ``leaf``."""
    value = leaf
    for level in range(depth):
        value = {"k": value, "n": level} if level % 2 else [value, level, "s"]
    return value


@pytest.mark.parametrize("depth", [_RECURSION - 1, _RECURSION, _RECURSION + 1, MAX_DEPTH])
def test_ker_11_any_depth_is_frozen_without_recursion(depth: int) -> None:
    """KER-11: a value of any depth up to MAX_DEPTH freezes (no
    RecursionError), every level read-only, equal to its source and thawed
    back to it."""
    value = nested(depth, 1.5)
    frozen = freeze(value)
    assert type(frozen) in (FrozenDict, FrozenList)
    level = frozen
    levels = 0
    while isinstance(level, FrozenDict | FrozenList):
        assert type(level) is (FrozenDict if isinstance(level, dict) else FrozenList)
        with pytest.raises(TypeError):
            level["k" if isinstance(level, dict) else 0] = None  # type: ignore[index]
        level = level["k"] if isinstance(level, dict) else level[0]
        levels += 1
    assert levels == depth
    assert level == 1.5
    if depth < 500:  # equality and thaw recurse in CPython itself
        assert frozen == value
        assert thaw(frozen) == value


@pytest.mark.parametrize(
    ("leaf", "message"),
    [
        (math.nan, "non-finite number"),
        (math.inf, "non-finite number"),
        (object(), "runtime handle"),
        ({1: "not a str key"}, "has a key that is not a string (int)"),
        ({"s": {1, 2}}, "runtime handle"),
        (10**4300, "more than 4300 digits"),
        ([-(10**4300)], "more than 4300 digits"),
        ({"n": 10**5000}, "more than 4300 digits"),
    ],
    ids=["nan", "inf", "object", "int-key", "set", "huge-int", "huge-int-list", "huge-int-dict"],
)
@pytest.mark.parametrize("depth", [3, MAX_DEPTH - 1])
def test_ker_11_deep_non_json_is_refused(leaf: Any, message: str, depth: int) -> None:
    """KER-11: NaN, infinities, runtime handles and non-str keys are refused at
    any depth with ``validation`` naming what was found."""
    with pytest.raises(Error) as info:
        freeze(nested(depth, leaf), "committed intent")
    assert info.value.error_class is ErrorClass.VALIDATION
    assert message in info.value.message


def test_ker_11_frozen_parts_are_reused_at_depth() -> None:
    """A frozen value met again deep inside a new one is kept, not copied."""
    shared = freeze({"big": list(range(100))})
    frozen = freeze(nested(MAX_DEPTH - 1, shared))
    assert innermost_frozen(frozen) is shared


def innermost_frozen(value: Any) -> Any:
    while True:
        inner = value["k"] if isinstance(value, dict) else value[0]
        if isinstance(inner, dict) and "big" in inner:
            return inner
        value = inner


@given(json_values)
def test_ker_11_iterative_path_equals_recursive_path(value: Any) -> None:
    """The explicit-stack path gives exactly what the recursive one gives."""
    from trio_backplane.kernel._frozen import _freeze, _freeze_iterative

    assert _freeze_iterative(value, "x") == _freeze(value, "x", 0)
    assert type(_freeze_iterative(value, "x")) is type(_freeze(value, "x", 0))


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, DEEP])
def test_ker_11_deeper_than_max_depth_is_refused_without_recursion(depth: int) -> None:
    """Nesting deeper than ``MAX_DEPTH`` is refused with ``validation`` (no
    RecursionError however deep): a durable store could not encode or
    decode it, so no store takes it."""
    with pytest.raises(Error) as info:
        freeze(nested(depth, 1), "message content")
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.message == f"message content nests deeper than {MAX_DEPTH} levels"
    assert info.value.details == {"limit": MAX_DEPTH}


def _nested(leaf: Any, depth: int) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": [value]}
    return value


@pytest.mark.parametrize("depth", [0, 1, _RECURSION + 3])
@pytest.mark.parametrize(
    "make",
    [
        lambda text: text,
        lambda text: {"content": text},
        lambda text: {text: 1},
        lambda text: [text],
        lambda text: {"a": "é", "b": [{"c": text}]},
    ],
)
def test_ker_11_text_holding_a_lone_surrogate_is_refused(make: Any, depth: int) -> None:
    """KER-11: a str holding a lone UTF-16 surrogate (``os.fsdecode`` of a
    non-UTF-8 file name, a ``\\ud800`` JSON escape) is no Unicode text, so no
    store could encode it: refused with ``validation`` wherever it sits (a
    value, a key, at any depth), the same on every store."""
    for text in ("caf\udce9", "\ud800", "a\udfffb"):
        with pytest.raises(Error) as raised:
            freeze(_nested(make(text), depth))
        assert raised.value.error_class is ErrorClass.VALIDATION
        assert raised.value.details == {"reason": "lone_surrogate"}


def test_ker_11_unicode_text_is_kept() -> None:
    """KER-11: text outside ASCII, astral characters included, is JSON data."""
    value = {
        "é": "日本語",
        "emoji": ["😀", "\U0010ffff"],
        "pair": "\ud83d\ude00".encode("utf-16", "surrogatepass").decode("utf-16"),
    }
    assert thaw(freeze(value)) == value
    assert freeze(_nested("日本", _RECURSION + 3)) == _nested("日本", _RECURSION + 3)


class _Unreadable(dict[str, Any]):
    """A dict subclass whose items fail when read (a host's broken object)."""

    def items(self) -> Any:
        raise KeyError("gone")


def test_ker_11_a_mapping_failing_when_read_is_validation() -> None:
    """KER-11: a mapping that raises while being walked is refused with
    ``validation`` naming the cause, never the raw exception."""
    for value in (_Unreadable(a=1), {"x": [_Unreadable(a=1)]}):
        with pytest.raises(Error) as info:
            freeze(value, "tool result")
        assert info.value.error_class is ErrorClass.VALIDATION
        assert info.value.message == "tool result could not be read as JSON data"
        assert info.value.details["cause"].startswith("KeyError")


@pytest.mark.parametrize(
    "shape",
    [lambda n: n, lambda n: [n], lambda n: {"n": n}, lambda n: ({"k": [n]},)],
    ids=["leaf", "list", "dict", "nested"],
)
def test_ker_11_integers_every_store_can_encode(shape: Any) -> None:
    """KER-11: an integer of up to 4,300 digits is JSON data every store
    encodes and every process reads back; one more digit is refused with
    ``validation`` ``integer_too_large`` before anything is stored, wherever
    it sits (a leaf, a list item, a dict value: the fast paths too)."""
    from trio_backplane.kernel import dumps, loads

    largest = 10**4300 - 1
    for n in (largest, -largest):
        frozen = freeze(shape(n))
        assert loads(dumps(frozen)) == thaw(frozen)
    for n in (10**4300, -(10**4300)):
        with pytest.raises(Error) as info:
            freeze(shape(n), "interaction answer")
        assert info.value.error_class is ErrorClass.VALIDATION
        assert info.value.details["reason"] == "integer_too_large"
        assert info.value.message.startswith("interaction answer contains an integer")


@pytest.mark.parametrize(
    "text",
    [
        "1e999",
        "-1e999",
        "1" + "0" * 210 + "e99",  # 1e309: a short exponent on a long number
        "[" + "9" * 300 + "e9]",
        '{"a": ' + "1" * 250 + ".5e60}",
        "1" + "0" * 400 + ".5",
    ],
    ids=["1e999", "-1e999", "long-e99", "nines-e9", "fraction-e60", "400-digits"],
)
def test_ker_11_loads_refuses_numbers_no_double_holds(text: str) -> None:
    """KER-11: ``kernel.loads`` refuses a number that overflows a double
    (valid JSON that Python reads as ``inf``), however it is written, as it
    refuses ``NaN``: a value it parses can always be committed.  The largest
    doubles still parse."""
    from trio_backplane.kernel import loads

    with pytest.raises(ValueError, match="too large for a double"):
        loads(text)
    with pytest.raises(ValueError, match="too large for a double"):
        loads(text.encode())
    assert loads("1e308") == 1e308
    assert loads("[1.7976931348623157e308]") == [1.7976931348623157e308]
