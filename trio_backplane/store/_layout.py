"""How SQL stores lay a record out, so a commit writes what changed.

A record is stored as a *head* (every field but the growing ones) and
*parts*: one row per entry of the maps that grow with the run (``intents``,
``tool_results``, ``budget.reservations``) and per item of its growing lists
(``transcript``, ``usage``).  In the head each of those slots holds
``"__parts__"``; :func:`join` fills them in again and returns exactly
``encode_record(record)``.  A head of record schema version 1 kept the lists
inside ``context["conversation"]``; :func:`join` fills those in and
``decode_record`` upgrades it.

:func:`head_fields` encodes only the head fields that are not the very
objects the previous record held (the kernel accelerator, when built, for
exact types; this code decides the rest and stays the definition).  Every
text is ``validation`` when it is not JSON data.  ``_diff`` computes the
part rows a commit writes.

Pure functions: no I/O.
"""

from __future__ import annotations

import json
import json.encoder
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import (
    Budget,
    FrozenDict,
    FrozenList,
    RunEvent,
    RunRecord,
    check_json,
    decode_event,
    decode_record,
    dumps,
)
from ..kernel._frozen import _accelerator

__all__ = [
    "MESSAGES",
    "PLACEHOLDER",
    "RESERVATIONS",
    "USAGE",
    "CorruptRecord",
    "Deletes",
    "Parts",
    "Upserts",
    "blank",
    "decode_stored",
    "decode_stored_event",
    "dumps",
    "encode_part",
    "head_fields",
    "head_text",
    "inline_lists",
    "join",
    "join_head",
    "join_record",
    "message_key",
]

#: Part name of the transcript rows (``record.transcript``).
MESSAGES: Final = "messages"
#: Part name of the provider usage rows (``record.usage``).
USAGE: Final = "usage"
#: The growing lists' part names, as schema version 1 named their slots in
#: ``context["conversation"]``.
_LISTS: Final = (MESSAGES, USAGE)
#: The record's growing list fields, by part name.
_LIST_FIELDS: Final = {"transcript": MESSAGES, "usage": USAGE}
#: Part name of ``budget.reservations`` entries (values are ints).
RESERVATIONS: Final = "budget.reservations"
#: What a head holds in place of a slot stored as parts.
PLACEHOLDER: Final = "__parts__"
#: Top-level record fields stored one row per entry.
_KEYED: Final = ("intents", "tool_results")
_EMPTY: Final = FrozenDict()
_EMPTY_LIST: Final = FrozenList()

#: {(part, key): JSON text}
Parts = dict[tuple[str, str], str]
#: ``[(part, key, JSON text)]`` rows to insert or replace.
Upserts = list[tuple[str, str, str]]
#: ``[(part, key)]`` rows to delete.
Deletes = list[tuple[str, str]]


def encode_part(value: Any) -> str:
    """JSON text of ``value``; ``validation`` for anything that is not JSON data
    (a lone surrogate included: ``freeze`` refuses one, but a ``FrozenDict``
    built by hand skips ``freeze``, and no database could store it)."""
    try:
        text = dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise Error(
            ErrorClass.VALIDATION,
            "committed record contains a runtime handle",
            {"cause": f"{type(exc).__name__}: {exc}"[:300]},
        ) from exc
    if not text.isascii():
        check_json(text, "committed record")
    return text


def message_key(index: int) -> str:
    """Row key of transcript message ``index`` (sorts as the index does)."""
    return f"{index:010d}"


# -- head ------------------------------------------------------------------------


def blank(record: RunRecord) -> RunRecord:
    """``record`` without its growing entries: what the head encodes."""
    changes: dict[str, Any] = {}
    if record.intents:
        changes["intents"] = _EMPTY
    if record.tool_results:
        changes["tool_results"] = _EMPTY
    budget = record.budget
    if budget.reservations:
        changes["budget"] = Budget(quota=budget.quota, used=budget.used)
    for name in _LIST_FIELDS:
        if getattr(record, name):
            changes[name] = _EMPTY_LIST
    return attrs.evolve(record, **changes) if changes else record


_FIELDS: Final = tuple(field.name for field in attrs.fields(RunRecord))
_field_values: Final = operator.attrgetter(*_FIELDS)
#: Record fields a head holds as placeholders.
_SLOTTED: Final = (*_KEYED, *_LIST_FIELDS)


def head_text(record: RunRecord) -> str:
    """The head row of ``record``: its encoding with every parts slot holding
    the placeholder.  Costs the head, never the growing fields.

    Byte for byte ``encode_part`` of ``encode_record(blank(record))`` with the
    slots replaced, built without copying the record or walking it through
    cattrs: a record's fields are JSON data already (frozen mappings are
    ``dict`` subclasses, tuples encode as arrays), so encoding them as they are
    gives the text ``encode_record``'s plain copies give.
    """
    data = dict(zip(_FIELDS, _field_values(record), strict=True))
    budget = record.budget
    data["budget"] = {"quota": budget.quota, "used": budget.used, "reservations": PLACEHOLDER}
    for field in _SLOTTED:
        data[field] = PLACEHOLDER
    return encode_part(data)


#: ``"name":`` of every field, as the encoder writes a key.
_HEAD_KEYS: Final = tuple(f"{dumps(name)}:" for name in _FIELDS)
#: How :func:`head_fields` encodes each field.
_PLAIN, _SLOT, _BUDGET = range(3)
_HEAD_KINDS: Final = tuple(
    _SLOT if name in _SLOTTED else _BUDGET if name == "budget" else _PLAIN for name in _FIELDS
)
_SLOT_FIELDS: Final = tuple(f"{key}{dumps(PLACEHOLDER)}" for key in _HEAD_KEYS)
_NULL_FIELDS: Final = tuple(f"{key}null" for key in _HEAD_KEYS)
_INDICES: Final = range(len(_FIELDS))
#: How the encoder writes a ``str`` (the same C function).
_encode_str: Final[Callable[[str], str]] = json.encoder.encode_basestring


def _field_text(i: int, value: Any) -> str:
    """Head field ``i``'s text, ``"name":value``, for ``value``."""
    kind = _HEAD_KINDS[i]
    if kind == _SLOT:
        return _SLOT_FIELDS[i]
    if kind == _BUDGET:
        budget = {"quota": value.quota, "used": value.used, "reservations": PLACEHOLDER}
        return _HEAD_KEYS[i] + encode_part(budget)
    if value is None:
        return _NULL_FIELDS[i]
    if type(value) is int:
        return _HEAD_KEYS[i] + int.__repr__(value)
    if type(value) is str:
        return _HEAD_KEYS[i] + _encode_str(value)
    return _HEAD_KEYS[i] + encode_part(value)


def _head_fields(
    record: RunRecord, previous: RunRecord | None = None, fields: Sequence[str] = ()
) -> list[str]:
    values = _field_values(record)
    out: list[str]
    indices: Iterable[int]
    if previous is not None and fields:
        out = list(fields)
        indices = compress(_INDICES, map(operator.is_not, values, _field_values(previous)))
    else:
        out = list(_HEAD_KEYS)
        indices = _INDICES
    for i in indices:
        out[i] = _field_text(i, values[i])
    return out


#: The kernel accelerator's ``_head_fields`` (for exact ``RunRecord`` values;
#: a field it cannot write is ``_field_text``'s), or ``None``.
_fast_head: Final[Callable[[Any, Any, Any], Any] | None] = getattr(
    _accelerator, "head_fields", None
)
if _fast_head is not None:
    _accelerator.configure_head(
        RunRecord,
        Budget,
        _FIELDS,
        _HEAD_KINDS,
        _HEAD_KEYS,
        tuple(_SLOT_FIELDS[i] if kind == _SLOT else None for i, kind in enumerate(_HEAD_KINDS)),
        (
            f"{{{dumps('quota')}:",
            f",{dumps('used')}:",
            f",{dumps('reservations')}:{dumps(PLACEHOLDER)}}}",
        ),
        _field_text,
    )


def head_fields(
    record: RunRecord, previous: RunRecord | None = None, fields: Sequence[str] = ()
) -> list[str]:
    """The head of ``record`` field by field (``"name":value``; joined with
    :func:`join_head` they are :func:`head_text`).  ``fields`` are
    ``previous``'s: a field holding the very object ``previous`` held is not
    encoded again (a record's values are frozen), so a commit encodes only
    the fields it changed."""
    if _fast_head is not None:
        out = _fast_head(record, previous, fields)
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    return _head_fields(record, previous, fields)


def join_head(fields: Sequence[str]) -> str:
    """The head text of :func:`head_fields`."""
    return "{" + ",".join(fields) + "}"


def join(head: str, parts: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """The encoded record (``encode_record`` output) from a head row and its
    part rows: the inverse of :func:`split`."""
    data: dict[str, Any] = json.loads(head)
    grouped: dict[str, dict[str, Any]] = {}
    for (part, key), text in parts.items():
        grouped.setdefault(part, {})[key] = json.loads(text)
    for field in _KEYED:
        if data.get(field) == PLACEHOLDER:
            data[field] = grouped.get(field, {})
    budget = data.get("budget")
    if isinstance(budget, dict) and budget.get("reservations") == PLACEHOLDER:
        budget["reservations"] = grouped.get(RESERVATIONS, {})
    for field, name in _LIST_FIELDS.items():
        if data.get(field) == PLACEHOLDER:
            items = grouped.get(name, {})
            data[field] = [items[k] for k in sorted(items)]
    if data.get("schema_version") != 1:
        return data
    context = data.get("context")
    if isinstance(context, dict):
        conversation = context.get("conversation")
        if isinstance(conversation, dict):
            for name in _LISTS:
                if conversation.get(name) == PLACEHOLDER:
                    items = grouped.get(name, {})
                    conversation[name] = [items[k] for k in sorted(items)]
    return data


def inline_lists(head: str) -> frozenset[str]:
    """The conversation lists a stored head holds inline (not as rows): a
    head written before they were stored as rows (layout 1 kept ``usage``
    inline).  A record read from such a head must be diffed as if those rows
    were missing, so its next commit writes them all."""
    data = json.loads(head)
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        return frozenset()  # later heads hold every list as rows
    context = data.get("context") if isinstance(data, dict) else None
    conversation = context.get("conversation") if isinstance(context, dict) else None
    if not isinstance(conversation, dict):
        return frozenset()
    return frozenset(
        name for name in _LISTS if isinstance(conversation.get(name), list) and conversation[name]
    )


#: The former name of :func:`join`.
join_record = join


class CorruptRecord(Error):
    """``storage_failed``: one run's stored rows cannot be decoded (edited or
    damaged outside the store).  It concerns that run alone: a group commit
    fails only the commit that read it."""

    def __init__(self, run_id: str, cause: BaseException, path: str | None = None) -> None:
        details = {"run_id": run_id, "cause": f"{type(cause).__name__}: {cause}"[:500]}
        if path is not None:
            details["path"] = path
        super().__init__(ErrorClass.STORAGE_FAILED, "stored run cannot be decoded", details)
        self.__cause__ = cause


def decode_stored(
    run_id: str, head: str, parts: Mapping[tuple[str, str], str], path: str | None = None
) -> tuple[RunRecord, frozenset[str]]:
    """The record stored as ``head`` and ``parts``, and the lists its head holds
    inline (:func:`inline_lists`); :class:`CorruptRecord` when they do not
    decode (never a raw ``JSONDecodeError`` or ``AttributeError``), and
    ``unsupported_capability`` (naming the run) for a record a newer
    trio_backplane wrote."""
    try:
        return decode_record(join(head, parts)), inline_lists(head)
    except Error as exc:
        if exc.error_class is ErrorClass.UNSUPPORTED_CAPABILITY:
            # written by a newer trio_backplane: sound, and not this one's to read
            where = {"run_id": run_id} if path is None else {"run_id": run_id, "path": path}
            raise Error(exc.error_class, exc.message, {**exc.details, **where}) from exc
        raise CorruptRecord(run_id, exc, path) from exc
    except Exception as exc:  # any damage: JSON, shape, or a record the kernel refuses
        raise CorruptRecord(run_id, exc, path) from exc


def decode_stored_event(
    run_id: str, row: tuple[int, Any, Any, str], path: str | None = None
) -> RunEvent:
    """One stored event row ``(sequence, type, occurred_at, payload text)``;
    :class:`CorruptRecord` when it does not decode."""
    sequence, kind, occurred_at, payload = row
    try:
        return decode_event(
            {
                "sequence": sequence,
                "type": kind,
                "occurred_at": occurred_at,
                "payload": json.loads(payload),
            }
        )
    except Exception as exc:
        raise CorruptRecord(run_id, exc, path) from exc
