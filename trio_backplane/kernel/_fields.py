"""The checks and conversions of record fields: what a run id, a time, a
counter or a JSON field may hold, each refused as ``validation``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ._frozen import (
    _EMPTY,
    _EMPTY_LIST,
    RECORD_DEPTH,
    FrozenDict,
    FrozenList,
    LayeredDict,
    _text,
    freeze,
)

__all__ = ["MAX_INT", "MAX_RUN_ID", "check_run_id", "is_time"]

#: Identities and counters are below this: what every store's integer
#: columns hold (SQLite's are 64-bit).
MAX_INT: Final = 2**63
#: The longest run id.
MAX_RUN_ID: Final = 256
#: The largest magnitude of an int a double holds exactly.
_EXACT_INT: Final = 2**53
#: The types of JSON data (a field's other types are runtime handles).
_JSON_TYPES: Final = frozenset(
    {str, int, float, bool, type(None), list, dict, FrozenDict, FrozenList, LayeredDict}
)


def check_run_id(value: Any) -> None:
    """``validation`` unless ``value`` is a run id: a non-empty str of at most
    :data:`MAX_RUN_ID` characters, no NUL (PostgreSQL text holds none: one
    store would refuse it as failed storage), valid Unicode (a record's, and
    every store call's)."""
    if type(value) is not str or not value or len(value) > MAX_RUN_ID or "\x00" in value:
        raise Error(
            ErrorClass.VALIDATION,
            f"run_id must be a non-empty str of at most {MAX_RUN_ID} chars, without NUL",
            {"argument": "run_id", "type": type(value).__name__},
        )
    _text(value, "run_id")


def is_time(value: Any) -> bool:
    """Whether ``value`` is a time a command or an event may carry: a finite
    ``float``, or an ``int`` of magnitude at most 2**53 (a double holds it
    exactly: SQL stores keep event times as doubles)."""
    if type(value) is float:
        return value - value == 0.0
    return type(value) is int and -_EXACT_INT <= value <= _EXACT_INT


def _frozen_mapping(value: Any) -> Mapping[str, Any]:
    if type(value) is FrozenDict or type(value) is LayeredDict:
        return value
    if value is None:
        return _EMPTY
    frozen = freeze(value, limit=RECORD_DEPTH)
    if type(frozen) is not FrozenDict and not isinstance(frozen, Mapping):
        raise Error(ErrorClass.VALIDATION, "expected a mapping")
    return frozen


def _optional_mapping(value: Any) -> Mapping[str, Any] | None:
    return None if value is None else _frozen_mapping(value)


def _frozen_list(value: Any) -> FrozenList:
    if type(value) is FrozenList:
        return value
    if value is None:
        return _EMPTY_LIST
    frozen = freeze(value, limit=RECORD_DEPTH)
    if type(frozen) is not FrozenList:
        raise Error(ErrorClass.VALIDATION, "expected a list")
    return frozen


def _input(value: Any) -> Mapping[str, Any]:
    t = type(value)  # exact types first: an ABC isinstance check costs ~0.4 us
    if t is FrozenDict:  # frozen already (the engine builds its inputs so)
        return value  # type: ignore[no-any-return]
    if value is None:
        return _EMPTY
    if t is not dict and not isinstance(value, Mapping):
        raise Error(ErrorClass.VALIDATION, "command input must be a mapping")
    return freeze(value)  # type: ignore[no-any-return]


def _wrong(attribute: Any, value: Any, expected: str) -> Error:
    """``validation`` for a field holding ``value``: "runtime handle" for a
    value that is not JSON data at all, else what was expected."""
    details = {"field": attribute.name, "type": type(value).__name__}
    if type(value) not in _JSON_TYPES:
        return Error(ErrorClass.VALIDATION, "committed intent contains a runtime handle", details)
    return Error(ErrorClass.VALIDATION, f"{attribute.name} must be {expected}", details)


def _positive(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if type(value) is not int or not 0 < value < MAX_INT:
        raise Error(ErrorClass.VALIDATION, f"{attribute.name} must be a positive int below 2**63")


def _non_negative(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if type(value) is not int or not 0 <= value < MAX_INT:
        raise Error(
            ErrorClass.VALIDATION, f"{attribute.name} must be a non-negative int below 2**63"
        )


def _bool(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not bool:
        raise _wrong(attribute, value, "a bool")


def _optional_str(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and type(value) is not str:
        raise _wrong(attribute, value, "a str or None")


def _optional_time(instance: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if type(value) not in (int, float):
        raise _wrong(attribute, value, "a finite number or None")
    if value - value != 0:
        raise Error(ErrorClass.VALIDATION, f"{attribute.name} must be a finite number or None")


def _str_tuple(instance: Any, attribute: Any, value: tuple[Any, ...]) -> None:
    for item in value:
        if type(item) is not str:
            raise _wrong(attribute, item, "a tuple of str")


def _quota(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise Error(
            ErrorClass.VALIDATION, "work must be an int of at least 1", {"work": repr(value)}
        )


def _run_id(instance: Any, attribute: Any, value: Any) -> None:
    check_run_id(value)


def _at(instance: Any, attribute: Any, value: Any) -> None:
    if not is_time(value):
        raise Error(
            ErrorClass.VALIDATION,
            "command time must be a finite number (an int of at most 2**53 in magnitude)",
        )


def _slot_setters(cls: type) -> dict[str, Any]:
    """Each slot's setter of the attrs class ``cls`` (the member descriptor's
    ``__set__``): setting through it skips the frozen ``__setattr__`` and the
    attribute lookup by name.  For instances the kernel builds from values
    it has checked."""
    return {field.name: getattr(cls, field.name).__set__ for field in attrs.fields(cls)}
