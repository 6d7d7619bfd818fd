"""How SQL stores lay a record out so a commit costs what changed, not the run.

A record is stored as a small *head* (every field but the growing ones) and
*parts*: one row per entry of the maps that grow with the run (``intents``,
``tool_results``, ``budget.reservations``) and one row per message of the
transcript (``context["conversation"]["messages"]``).  In the head, each of
those slots holds the placeholder ``"__parts__"``; :func:`join` fills them in
again and returns exactly ``encode_record(record)``, ready for
``decode_record``.

**Incremental commits.**  A store remembers, per run, an :class:`Entry` for
the last committed record (keyed by incarnation and revision, which the store
checks against the row it read inside its transaction; on a mismatch it
reloads the record and builds the entry with :func:`entry_of`).  Committed
records are frozen values that evolve by sharing unchanged entries, so
:func:`diff` compares the new record with the remembered one by object
identity (C-speed tuple comparisons, bisected down to the changed entries)
and encodes only the entries that changed: commit 5 000 of a run costs what
commit 10 did.  The head is encoded on every commit; it holds no growing
field.

Records are JSON data by construction (``RunRecord`` freezes and validates
every field, KER-11), and everything written is encoded here by a strict
encoder that turns any non-JSON value into ``validation`` anyway.

Caveat of the equality shortcut: an entry replaced by an *equal* value of
another JSON type (``1`` vs ``1.0`` vs ``true``) inside an otherwise unchanged
range is not rewritten.

Pure functions: no I/O.  ``SQLiteStore`` and ``PostgresStore`` both use them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import Budget, FrozenDict, FrozenList, RunRecord, encode_record

__all__ = [
    "MESSAGES",
    "NOTHING",
    "PLACEHOLDER",
    "RESERVATIONS",
    "Deletes",
    "Entry",
    "Parts",
    "Upserts",
    "blank",
    "diff",
    "dumps",
    "encode_part",
    "entry_of",
    "head_text",
    "join",
    "join_record",
    "message_key",
    "messages_of",
    "split",
]

#: Part name of the transcript rows (``context["conversation"]["messages"]``).
MESSAGES: Final = "messages"
#: Part name of ``budget.reservations`` entries (values are ints).
RESERVATIONS: Final = "budget.reservations"
#: What a head holds in place of a slot stored as parts.
PLACEHOLDER: Final = "__parts__"
#: Top-level record fields stored one row per entry.
_KEYED: Final = ("intents", "tool_results")
_EMPTY: Final = FrozenDict()
_EMPTY_LIST: Final = FrozenList()
#: Below this many entries a range is compared entry by entry.
_LEAF: Final = 16

#: {(part, key): JSON text}
Parts = dict[tuple[str, str], str]
#: ``[(part, key, JSON text)]`` rows to insert or replace.
Upserts = list[tuple[str, str, str]]
#: ``[(part, key)]`` rows to delete.
Deletes = list[tuple[str, str]]

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
dumps = _encoder.encode


def encode_part(value: Any) -> str:
    """JSON text of ``value``; ``validation`` for anything that is not JSON data."""
    try:
        return dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:  # KER-11
        raise Error(
            ErrorClass.VALIDATION,
            "committed record contains a runtime handle",
            {"cause": f"{type(exc).__name__}: {exc}"[:300]},
        ) from exc


def message_key(index: int) -> str:
    """Row key of transcript message ``index`` (sorts as the index does)."""
    return f"{index:010d}"


# -- head ------------------------------------------------------------------------


def messages_of(record: RunRecord) -> tuple[Any, ...] | None:
    """The transcript when it is stored as rows, else ``None``."""
    conversation = record.context.get("conversation")
    if isinstance(conversation, Mapping):
        messages = conversation.get(MESSAGES)
        if isinstance(messages, tuple | list):
            return tuple(messages)
    return None


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
    conversation = record.context.get("conversation")
    if isinstance(conversation, Mapping):
        messages = conversation.get(MESSAGES)
        if isinstance(messages, tuple | list) and messages:
            changes["context"] = {
                **record.context,
                "conversation": {**conversation, MESSAGES: _EMPTY_LIST},
            }
    return attrs.evolve(record, **changes) if changes else record


def head_text(record: RunRecord) -> str:
    """The head row of ``record``: its encoding with every parts slot holding
    the placeholder.  Costs the head, never the growing fields."""
    data = encode_record(blank(record))
    for field in _KEYED:
        data[field] = PLACEHOLDER
    data["budget"]["reservations"] = PLACEHOLDER
    if messages_of(record) is not None:
        data["context"]["conversation"][MESSAGES] = PLACEHOLDER
    return encode_part(data)


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
    context = data.get("context")
    if isinstance(context, dict):
        conversation = context.get("conversation")
        if isinstance(conversation, dict) and conversation.get(MESSAGES) == PLACEHOLDER:
            messages = grouped.get(MESSAGES, {})
            conversation[MESSAGES] = [messages[k] for k in sorted(messages)]
    return data


#: The former name of :func:`join`.
join_record = join


# -- incremental diff --------------------------------------------------------------


@attrs.frozen
class _Keyed:
    """One keyed part of a committed record, as aligned key/value tuples."""

    source: Mapping[str, Any]
    keys: tuple[str, ...]
    values: tuple[Any, ...]

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> _Keyed:
        return cls(mapping, tuple(mapping), tuple(mapping.values()))


_NO_KEYS: Final = _Keyed(_EMPTY, (), ())


@attrs.frozen
class Entry:
    """What a store remembers of a run's last committed record."""

    record: RunRecord
    intents: _Keyed
    tool_results: _Keyed
    reservations: _Keyed
    messages: tuple[Any, ...] | None


#: The entry of "nothing stored yet": diffing against it writes every part.
NOTHING: Final = Entry(RunRecord(run_id="-"), _NO_KEYS, _NO_KEYS, _NO_KEYS, None)


def entry_of(record: RunRecord) -> Entry:
    """The entry of a record read back from storage (nothing encoded)."""
    return Entry(
        record,
        _Keyed.of(record.intents),
        _Keyed.of(record.tool_results),
        _Keyed.of(record.budget.reservations),
        messages_of(record),
    )


def _changed(old: tuple[Any, ...], new: tuple[Any, ...], n: int) -> list[int]:
    """Indices ``i < n`` where ``new[i]`` is not ``old[i]`` (ranges that compare
    equal as a whole are skipped; a tuple compares identical items at C speed)."""
    out: list[int] = []
    if n == 0:
        return out
    if (old if len(old) == n else old[:n]) == (new if len(new) == n else new[:n]):
        return out
    stack = [(0, n)]
    while stack:
        lo, hi = stack.pop()
        if hi - lo <= _LEAF:
            out.extend(i for i in range(lo, hi) if old[i] is not new[i])
            continue
        mid = (lo + hi) // 2
        if old[mid:hi] != new[mid:hi]:
            stack.append((mid, hi))
        if old[lo:mid] != new[lo:mid]:
            stack.append((lo, mid))
    out.sort()
    return out


def _diff_keyed(
    part: str, old: _Keyed, new: Mapping[str, Any], upserts: Upserts, deletes: Deletes
) -> _Keyed:
    if new is old.source:
        return old
    now = _Keyed.of(new)
    m = len(old.keys)
    if len(now.keys) >= m and (now.keys if len(now.keys) == m else now.keys[:m]) == old.keys:
        # Same keys in the same order, maybe some appended (``assoc``).
        for i in _changed(old.values, now.values, m):
            upserts.append((part, now.keys[i], encode_part(now.values[i])))
        for i in range(m, len(now.keys)):
            upserts.append((part, now.keys[i], encode_part(now.values[i])))
        return now
    previous = old.source
    missing = object()
    for key, value in new.items():
        was = previous.get(key, missing)
        if was is not value and (was is missing or was != value):
            upserts.append((part, key, encode_part(value)))
    deletes.extend((part, key) for key in previous if key not in new)
    return now


def _diff_messages(
    old: tuple[Any, ...] | None,
    new: tuple[Any, ...] | None,
    upserts: Upserts,
    deletes: Deletes,
) -> None:
    if new is old:
        return
    before = old or ()
    after = new or ()
    common = min(len(before), len(after))
    for i in _changed(before, after, common):
        upserts.append((MESSAGES, message_key(i), encode_part(after[i])))
    for i in range(common, len(after)):
        upserts.append((MESSAGES, message_key(i), encode_part(after[i])))
    deletes.extend((MESSAGES, message_key(i)) for i in range(common, len(before)))


def diff(old: Entry, record: RunRecord) -> tuple[Entry, Upserts, Deletes]:
    """``(entry of record, upserts, deletes)``: the part rows turning the
    stored ``old`` record into ``record``.  Encodes only what changed."""
    upserts: Upserts = []
    deletes: Deletes = []
    messages = messages_of(record)
    entry = Entry(
        record,
        _diff_keyed("intents", old.intents, record.intents, upserts, deletes),
        _diff_keyed("tool_results", old.tool_results, record.tool_results, upserts, deletes),
        _diff_keyed(RESERVATIONS, old.reservations, record.budget.reservations, upserts, deletes),
        messages,
    )
    _diff_messages(old.messages, messages, upserts, deletes)
    return entry, upserts, deletes


def split(record: RunRecord) -> tuple[str, Parts]:
    """``(head text, parts)`` of ``record`` as the SQL stores lay it out."""
    _, upserts, _ = diff(NOTHING, record)
    return head_text(record), {(part, key): value for part, key, value in upserts}
