"""``dumps``/``utf8_size``: the kernel's one compact JSON encoder (KER-11)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given

from trio_backplane.kernel import dumps, freeze, utf8_size

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
