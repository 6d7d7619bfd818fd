"""Records to JSON data and back (cattrs), stable across versions.

Every encoded record carries ``schema_version``.  A record written by a newer
layout is refused (``unsupported_capability``) instead of being misread; an
older layout is migrated here, step by step (:func:`upgrade`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from ..errors import Error, ErrorClass
from ._fields import MAX_INT, is_time
from ._frozen import RECORD_DEPTH, FrozenDict, FrozenList, freeze, thaw
from ._records import SCHEMA_VERSION, Budget, RunEvent, RunRecord

__all__ = ["decode_event", "decode_record", "encode_event", "encode_record", "upgrade"]

_JSON_MAPPING = Mapping[str, Any]
_OPTIONAL_JSON_MAPPING = Mapping[str, Any] | None

_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_unstructure_hook_func(
    lambda t: t in (_JSON_MAPPING, _OPTIONAL_JSON_MAPPING), thaw
)
_converter.register_unstructure_hook_func(lambda t: t == tuple[str, ...], list)
_converter.register_unstructure_hook(FrozenList, thaw)


# Structuring is strict: a stored value of the wrong type is refused, never
# coerced (cattrs' defaults would read "false" as True and 5 as "5").
def _wrong(value: Any, expected: str) -> Error:
    return Error(
        ErrorClass.VALIDATION,
        f"stored record holds a {type(value).__name__} where {expected} belongs",
    )


def _exact(kind: type) -> Any:
    def structure(value: Any, _: Any) -> Any:
        if type(value) is not kind:
            raise _wrong(value, kind.__name__)
        return value

    return structure


def _mapping(value: Any, _: Any) -> Any:
    if not isinstance(value, Mapping):
        raise _wrong(value, "a mapping")
    return value


def _optional_mapping(value: Any, _: Any) -> Any:
    return None if value is None else _mapping(value, _)


def _time(value: Any, _: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or value - value != 0:
        raise _wrong(value, "a finite number")
    return value  # type: ignore[no-any-return]


def _ids(value: Any, _: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or any(type(v) is not str for v in value):
        raise _wrong(value, "a list of str")
    return tuple(value)


def _items(value: Any, _: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise _wrong(value, "a list")
    return value


def _counts(value: Any, _: Any) -> Mapping[str, int]:
    if not isinstance(value, Mapping) or any(type(v) is not int for v in value.values()):
        raise _wrong(value, "a mapping of ints")
    return value


def _budget(value: Any, _: Any) -> Budget:
    if not isinstance(value, Mapping) or set(value) != {"quota", "used", "reservations"}:
        raise _wrong(value, "a budget {quota, used, reservations}")
    used, reservations = value["used"], value["reservations"]
    if type(used) is not int or used < 0:
        raise _wrong(used, "a non-negative int")
    if not isinstance(reservations, Mapping) or any(
        type(v) is not int or v < 1 for v in reservations.values()
    ):
        raise _wrong(reservations, "a mapping of positive ints")
    return Budget(quota=value["quota"], used=used, reservations=reservations)


for _kind in (str, int, bool):
    _converter.register_structure_hook(_kind, _exact(_kind))
_converter.register_structure_hook_func(lambda t: t == _JSON_MAPPING, _mapping)
_converter.register_structure_hook_func(lambda t: t == _OPTIONAL_JSON_MAPPING, _optional_mapping)
_converter.register_structure_hook_func(lambda t: t == float | None, _time)
_converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _ids)
_converter.register_structure_hook_func(lambda t: t == Mapping[str, int], _counts)
_converter.register_structure_hook(Budget, _budget)
_converter.register_structure_hook(FrozenList, _items)


def encode_record(record: RunRecord) -> dict[str, Any]:
    """``record`` as plain JSON data (``dict``/``list``)."""
    if not isinstance(record, RunRecord):
        raise Error(ErrorClass.VALIDATION, "encode_record needs a RunRecord")
    data: dict[str, Any] = _converter.unstructure(record)
    data["budget"] = {
        "quota": record.budget.quota,
        "used": record.budget.used,
        "reservations": dict(record.budget.reservations),
    }
    return data


def decode_record(data: Mapping[str, Any]) -> RunRecord:
    """A ``RunRecord`` from :func:`encode_record` output (any known version)."""
    if not isinstance(data, Mapping):
        raise Error(ErrorClass.VALIDATION, "a stored record must be a mapping")
    version = data.get("schema_version")
    if type(version) is not int or version < 1:
        raise Error(ErrorClass.VALIDATION, "stored record has no schema_version")
    if version > SCHEMA_VERSION:
        raise Error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "stored record was written by a newer trio_backplane",
            {"schema_version": version, "supported": SCHEMA_VERSION},
        )
    data = upgrade(data)
    missing = _RECORD_FIELDS.difference(data)
    if missing:  # every field is written: a default would undo a fence, say
        raise Error(
            ErrorClass.VALIDATION,
            "stored record lacks fields",
            {"missing": sorted(missing)[:20]},
        )
    try:
        record: RunRecord = _converter.structure(dict(data), RunRecord)
    except Error:
        raise
    except Exception as exc:  # cattrs raises class groups; say what is wrong
        raise Error(
            ErrorClass.VALIDATION,
            "stored record does not decode",
            {"cause": f"{type(exc).__name__}: {exc}"[:500]},
        ) from exc
    _check_active_work(record)
    return record


def upgrade(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Encoded record ``data`` of any known ``schema_version`` in the current
    one (``data`` itself when it is current).

    Version 1 kept the transcript and the usage reports inside
    ``context["conversation"]`` (as ``"messages"`` and ``"usage"``); version 2
    holds them in the record's ``transcript`` and ``usage`` fields.
    """
    if data.get("schema_version") != 1:
        return data
    upgraded = {**data, "schema_version": 2, "transcript": [], "usage": []}
    context = data.get("context")
    conversation = context.get("conversation") if isinstance(context, Mapping) else None
    if isinstance(conversation, Mapping):
        rest = {k: v for k, v in conversation.items() if k not in ("messages", "usage")}
        for name, field in (("messages", "transcript"), ("usage", "usage")):
            items = conversation.get(name)
            if isinstance(items, list | tuple):
                upgraded[field] = items
            elif name in conversation:  # not a list: kept where it was, as it was
                rest[name] = items
        upgraded["context"] = {**context, "conversation": rest}  # type: ignore[dict-item]
    return upgraded


_RECORD_FIELDS: frozenset[str] = frozenset(field.name for field in attrs.fields(RunRecord))


def _check_active_work(record: RunRecord) -> None:
    """What the kernel reads of a decoded record's active work is there: the
    active provider attempt's ids, an intent for every active tool."""
    provider = record.active_provider
    if provider is not None and not (
        type(provider.get("attempt_id")) is str and type(provider.get("step_id")) is str
    ):
        raise Error(ErrorClass.VALIDATION, "stored active provider lacks its ids")
    for invocation_id in record.active_tools:
        if f"tool:{invocation_id}" not in record.intents:
            raise Error(
                ErrorClass.VALIDATION,
                "stored active tool has no intent",
                {"invocation_id": invocation_id[:100]},
            )


def encode_event(event: RunEvent) -> dict[str, Any]:
    """``event`` as JSON data; the payload stays the frozen mapping (a ``dict``
    subclass JSON encoders write as is), so encoding costs nothing per field."""
    return {
        "type": event.type,
        "occurred_at": event.occurred_at,
        "payload": event.payload,
        "sequence": event.sequence,
    }


def decode_event(data: Mapping[str, Any]) -> RunEvent:
    """A ``RunEvent`` from :func:`encode_event` output."""
    if (
        not isinstance(data, Mapping)
        or not {"type", "occurred_at", "payload"} <= data.keys()
        or not data.keys() <= _EVENT_FIELDS
    ):
        raise Error(
            ErrorClass.VALIDATION,
            "a stored event must be a mapping with type, occurred_at, payload (and sequence) only",
        )
    kind, at, payload = data["type"], data["occurred_at"], data["payload"]
    sequence = data.get("sequence")
    if type(kind) is not str or not kind:
        raise Error(ErrorClass.VALIDATION, "stored event type must be a non-empty str")
    if not is_time(at):
        raise Error(ErrorClass.VALIDATION, "stored event time must be a finite number")
    if not isinstance(payload, Mapping):
        raise Error(ErrorClass.VALIDATION, "stored event payload must be a mapping")
    if sequence is not None and (type(sequence) is not int or not 0 < sequence < MAX_INT):
        raise Error(ErrorClass.VALIDATION, "stored event sequence must be a positive int")
    freeze(kind, "stored event type")  # Unicode text
    # As deep as a RunEvent's payload may be (RECORD_DEPTH): a kernel event
    # wraps its command's input in two more levels.
    frozen = (
        payload
        if type(payload) is FrozenDict
        else freeze(payload, "stored event payload", RECORD_DEPTH)
    )
    return RunEvent(type=kind, occurred_at=at, payload=frozen, sequence=sequence)


_EVENT_FIELDS: frozenset[str] = frozenset({"type", "occurred_at", "payload", "sequence"})
