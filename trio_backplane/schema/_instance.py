"""The JSON data check every instance passes before the engine sees it:
exact JSON types, nesting and encoded size, in one pre-order walk without
Python recursion.  The C accelerator (``_speedups.check``) implements the
same walk; this one is the reference, and reports where a violation is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

__all__ = [
    "INT_DIGITS_LIMIT",
    "Violation",
    "check_python",
    "encoded_size",
    "fast_check",
    "first_violation",
    "json_pointer",
]

#: The engine cannot compare an integer with more decimal digits than this.
INT_DIGITS_LIMIT: Final = 4300
_TEN_POW: Final = 10**INT_DIGITS_LIMIT  # the smallest integer with 4301 digits

# Bytes that ``json.dumps(ensure_ascii=False)`` writes for one code point
# below 0x80: the two-character escapes, ``\u00XX`` for other controls.
_ASCII_COST: Final = tuple(
    2 if c in '"\\\b\f\n\r\t' else 6 if ord(c) < 0x20 else 1 for c in map(chr, range(128))
)

#: (reason, JSON pointer path, human-readable detail)
Violation = tuple[str, str, str]


def _string_size(s: str) -> int:
    """Bytes of ``s`` as a compact UTF-8 JSON string, quotes included.

    Raises ``UnicodeEncodeError`` for a lone surrogate.
    """
    if s.isascii():
        n = len(s)
        if s.isprintable() and '"' not in s and "\\" not in s:
            return n + 2
        return sum(_ASCII_COST[ord(c)] for c in s) + 2
    data = s.encode("utf-8")  # raises for lone surrogates
    extra = sum(_ASCII_COST[ord(c)] - 1 for c in s if ord(c) < 128)
    return len(data) + extra + 2


def json_pointer(path: Sequence[str | int]) -> str:
    """An RFC 6901 JSON Pointer for ``path`` (``""`` for the root)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


_pointer = json_pointer


def _scalar_size(value: Any, t: type) -> int | tuple[str, str]:
    """Bytes of the JSON scalar ``value`` (of type ``t``), or why it is none:
    ``(reason, detail)``."""
    if t is str:
        try:
            return _string_size(value)
        except UnicodeEncodeError:
            return ("not_json", "string holds a lone surrogate")
    if t is int:
        if value >= _TEN_POW or value <= -_TEN_POW:
            return ("integer_too_large", f"integer has more than {INT_DIGITS_LIMIT} digits")
        return len(str(value))
    if t is float:
        if value - value != 0.0:
            return ("not_json", f"{value!r} is not a JSON number")
        return len(repr(value))
    if value is True or value is None:
        return 4
    if value is False:
        return 5
    return ("not_json", f"{t.__name__} is not a JSON type")


def check_python(obj: Any, max_depth: int, max_bytes: int) -> Violation | None:
    """Walk ``obj``; return the first violation, or ``None`` if it is JSON data
    within ``max_depth`` nesting and ``max_bytes`` encoded bytes.

    Reasons: ``"not_json"`` (a type, key, lone surrogate or non-finite float
    outside the JSON data model), ``"integer_too_large"``,
    ``"input_too_deep"``, ``"input_too_large"``.
    """
    size = 0
    path: list[str | int] = []
    # One frame per open container: [iterator over (key, value), is_dict, index].
    stack: list[list[Any]] = []
    value: Any = obj
    while True:
        t = type(value)
        if t is dict or t is list:
            if len(stack) >= max_depth:
                return ("input_too_deep", _pointer(path), f"nesting exceeds {max_depth}")
            size += 2
            if t is dict:
                stack.append([iter(value.items()), True, 0])
            else:
                stack.append([enumerate(value), False, 0])
        else:
            cost = _scalar_size(value, t)
            if isinstance(cost, tuple):
                return (cost[0], _pointer(path), cost[1])
            size += cost
        if size > max_bytes:
            return ("input_too_large", _pointer(path), f"encoding exceeds {max_bytes} bytes")
        # Advance to the next value in pre-order.
        while stack:
            frame = stack[-1]
            nxt = next(frame[0], None)
            if nxt is None:
                stack.pop()
                continue
            key, value = nxt
            del path[len(stack) - 1 :]
            path.append(key)
            if frame[2]:
                size += 1  # the comma before every member but the first
            frame[2] += 1
            if frame[1]:
                if type(key) is not str:
                    return (
                        "not_json",
                        _pointer(path[:-1]),
                        f"object key {key!r} is a {type(key).__name__}, not a str",
                    )
                try:
                    size += _string_size(key) + 1  # the key and its colon
                except UnicodeEncodeError:
                    return ("not_json", _pointer(path), "object key holds a lone surrogate")
            break
        else:
            return None


def encoded_size(obj: Any) -> int:
    """Bytes of the compact UTF-8 JSON encoding of JSON data ``obj``."""
    import json

    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode())


fast_check: Callable[[Any, int, int], str | None] | None
try:  # the C accelerator; the Python walk is the reference and the fallback
    from ._speedups import check as fast_check
except ImportError:  # pragma: no cover - exercised where no compiler was available
    fast_check = None


def first_violation(obj: Any, max_depth: int, max_bytes: int) -> Violation | None:
    """The first violation of ``obj`` (see :func:`check_python`), fast when it has none."""
    if fast_check is not None and fast_check(obj, max_depth, max_bytes) is None:
        return None
    return check_python(obj, max_depth, max_bytes)
