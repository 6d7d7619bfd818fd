"""Records to JSON data and back (cattrs), stable across versions.

Every encoded record carries ``schema_version``.  A record written by a newer
layout is refused (``unsupported_capability``) instead of being misread; an
older layout would be migrated here, step by step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import cattrs

from ..errors import Error, ErrorClass
from ._records import SCHEMA_VERSION, Budget, RunEvent, RunRecord, thaw

__all__ = ["decode_event", "decode_record", "encode_event", "encode_record"]

_JSON_MAPPING = Mapping[str, Any]
_OPTIONAL_JSON_MAPPING = Mapping[str, Any] | None

_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_unstructure_hook_func(
    lambda t: t in (_JSON_MAPPING, _OPTIONAL_JSON_MAPPING), thaw
)
_converter.register_unstructure_hook_func(lambda t: t == tuple[str, ...], list)
_converter.register_structure_hook_func(
    lambda t: t in (_JSON_MAPPING, _OPTIONAL_JSON_MAPPING), lambda v, _: v
)
_converter.register_structure_hook_func(lambda t: t == float | None, lambda v, _: v)
_converter.register_structure_hook(Budget, lambda v, _: Budget(**v))


def encode_record(record: RunRecord) -> dict[str, Any]:
    """``record`` as plain JSON data (``dict``/``list``)."""
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
    try:
        return _converter.structure(dict(data), RunRecord)
    except Error:
        raise
    except Exception as exc:  # cattrs raises class groups; say what is wrong
        raise Error(
            ErrorClass.VALIDATION,
            "stored record does not decode",
            {"cause": f"{type(exc).__name__}: {exc}"[:500]},
        ) from exc


def encode_event(event: RunEvent) -> dict[str, Any]:
    return {
        "type": event.type,
        "occurred_at": event.occurred_at,
        "payload": thaw(event.payload),
        "sequence": event.sequence,
    }


def decode_event(data: Mapping[str, Any]) -> RunEvent:
    return RunEvent(
        type=data["type"],
        occurred_at=data["occurred_at"],
        payload=data["payload"],
        sequence=data.get("sequence"),
    )
