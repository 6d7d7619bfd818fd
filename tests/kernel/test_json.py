"""``dumps``/``utf8_size``: the kernel's one compact JSON encoder (KER-11)."""

from __future__ import annotations

import json
import math
import signal
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error
from trio_backplane.kernel import LayeredDict, _json, _speedups, dumps, freeze, utf8_size

from .support import json_values


def reference(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@given(json_values)
def test_frozen_and_plain_values_encode_as_the_json_encoder_does(value: Any) -> None:
    """KER-11: a frozen value encodes to the text of its plain twin, without a
    thaw, and its size is that text's UTF-8 length."""
    text = reference(value)
    assert dumps(value) == text
    assert dumps(freeze(value)) == text
    size = len((value if isinstance(value, str) else text).encode("utf-8"))
    assert utf8_size(freeze(value)) == size  # a str is measured as itself


def test_a_str_is_measured_as_itself() -> None:
    assert utf8_size("héllo") == 6
    assert utf8_size(["héllo"]) == len('["héllo"]'.encode())


@pytest.mark.parametrize("bad", [math.nan, math.inf, object(), {"k": {1, 2}}])
def test_non_json_data_is_refused(bad: Any) -> None:
    """KER-11: NaN, infinities and runtime handles are not JSON data."""
    with pytest.raises((TypeError, ValueError)):
        dumps(bad)


_ascii = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)
_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    # past the 4300-digit limit of int -> str: the stdlib refuses it
    st.integers(min_value=4290, max_value=4310).map(lambda digits: 10**digits),
    st.floats(),  # NaN and the infinities among them
    _ascii,
    st.text(max_size=6),  # non-ASCII and lone surrogates too
)
_data = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_ascii, inner, max_size=4),
        st.dictionaries(st.integers(), inner, min_size=1, max_size=2),  # keys json converts
    ),
    max_leaves=20,
)


def _stdlib(value: Any) -> str | None:
    try:
        return "".join(_json._chunks(value, 0))
    except (TypeError, ValueError, RecursionError):
        return None


@given(_data)
def test_the_c_encoder_writes_the_stdlib_text_or_declines(value: Any) -> None:
    """KER-11: the accelerator's ``dumps`` (ASCII text, exact types, frozen
    containers) writes what the stdlib encoder writes, byte for byte, or
    declines: never a text for what the stdlib refuses."""
    for candidate in (value, _frozen_or_same(value)):
        made = _speedups.dumps(candidate)
        expected = _stdlib(candidate)
        if made is not NotImplemented:
            assert made == expected
        if expected is not None:
            assert dumps(candidate) == expected


def _frozen_or_same(value: Any) -> Any:
    try:
        return freeze(value)
    except Error:
        return value


def test_the_c_encoder_takes_ascii_data() -> None:
    """Data of ASCII text, finite numbers and str keys is written in C,
    control characters escaped as the stdlib escapes them."""
    value = freeze({"a": ['\x00\x1f"\\\n\r\t\b\f\x7f', 1.5e-7, -0.0, 10**30, None, True], "b": {}})
    made = _speedups.dumps(value)
    assert made is not NotImplemented
    assert made == reference(value)
    assert _speedups.dumps(LayeredDict.__new__(LayeredDict)) is NotImplemented


def test_the_c_encoder_declines_where_the_stdlib_hits_the_recursion_limit() -> None:
    """Nesting the stdlib encoder refuses under the interpreter's recursion
    limit is declined, never written (review of session 23)."""
    value: Any = 0
    for _ in range(150):
        value = [value]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100)
    try:
        assert _stdlib(value) is None
        assert _speedups.dumps(value) is NotImplemented
    finally:
        sys.setrecursionlimit(limit)


def test_an_interrupt_while_an_int_is_written_is_raised() -> None:
    """An exception from int's repr other than the digit limit's
    ``ValueError`` (a signal handler's ``KeyboardInterrupt``) is raised,
    not swallowed by a decline (review of session 23)."""

    data = [10**4000] * 5000  # about 0.2 s of int reprs: the timer fires inside
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        with pytest.raises(KeyboardInterrupt):
            _speedups.dumps(data)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert seen
