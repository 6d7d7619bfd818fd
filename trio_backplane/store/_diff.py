"""The part rows a commit writes: :func:`diff` turns a remembered
:class:`Entry` into the rows a new record needs (``_layout`` lays them out).

Only what changed is encoded: frozen values that evolve by sharing are
compared by identity first (an unchanged map or transcript costs nothing),
then as aligned key/value lists.  Keys are always compared, so a map whose
keys moved is diffed key by key.  Caveat: an entry replaced by an *equal*
value of another JSON type (``1`` vs ``1.0`` vs ``true``) inside an
otherwise unchanged range is not rewritten.  The kernel accelerator, when
built, diffs the common commit (kernel-derived maps, lists appended to) and
declines the rest to the Python code here, which stays the definition.

Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import Budget, FrozenDict, RunRecord, changed_keys
from ..kernel._construct import fast_constructor
from ..kernel._frozen import _accelerator
from ._layout import (
    MESSAGES,
    RESERVATIONS,
    USAGE,
    Deletes,
    Parts,
    Upserts,
    encode_part,
    head_text,
    message_key,
)

__all__ = ["NOTHING", "Entry", "diff", "entry_of", "split"]

#: Below this many entries a range is compared entry by entry.
_LEAF: Final = 16


class _Keyed:
    """One keyed part of a committed record, and (built when first needed) its
    aligned key/value lists (lists: they compare identical items without a
    call, faster than tuples; never mutated once built)."""

    __slots__ = ("_keys", "_values", "source")

    def __init__(
        self,
        source: Mapping[str, Any],
        keys: list[str] | None = None,
        values: list[Any] | None = None,
    ) -> None:
        self.source = source
        self._keys = keys
        self._values = values

    @classmethod
    def of(cls, mapping: Mapping[str, Any]) -> _Keyed:
        return cls(mapping)

    @property
    def keys(self) -> list[str]:
        if self._keys is None:
            self._keys = list(self.source)
        return self._keys

    @property
    def values(self) -> list[Any]:
        if self._values is None:
            self._values = list(self.source.values())
        return self._values


_NO_KEYS: Final = _Keyed(FrozenDict(), [], [])


@attrs.frozen(eq=False)
class Entry:
    """What a store remembers of a run's last committed record."""

    record: RunRecord
    intents: _Keyed
    tool_results: _Keyed
    reservations: _Keyed
    #: The record's transcript itself (frozen): an unchanged transcript is the
    #: same object, so diffing it costs nothing.
    messages: Sequence[Any] | None
    #: The record's usage list itself, likewise.
    usage: Sequence[Any] | None = None


#: ``Entry(...)``, made for every commit: without attrs' ``__init__``
_entry: Final = fast_constructor(Entry)

#: The entry of "nothing stored yet": diffing against it writes every part.
NOTHING: Final = Entry(RunRecord(run_id="-"), _NO_KEYS, _NO_KEYS, _NO_KEYS, None, None)


def entry_of(record: RunRecord, inline: Iterable[str] = ()) -> Entry:
    """The entry of a record read back from storage (nothing encoded);
    ``inline``: the lists its head held inline (:func:`inline_lists`), whose
    rows do not exist yet."""
    missing = frozenset(inline)
    return Entry(
        record,
        _Keyed.of(record.intents),
        _Keyed.of(record.tool_results),
        _Keyed.of(record.budget.reservations),
        None if MESSAGES in missing else record.transcript,
        None if USAGE in missing else record.usage,
    )


#: A changed range is first checked without its last ``_TAIL`` items, which
#: are then compared one by one: commits change recent entries.
_TAIL: Final = 32


def _changed(old: Sequence[Any], new: Sequence[Any], n: int, *, own: bool = False) -> list[int]:
    """Indices ``i < n`` where ``new[i]`` is not ``old[i]`` (ranges that compare
    equal as a whole are skipped; a list compares identical items at C speed).
    ``old`` and ``new`` are both lists or both tuples; ``own``: ``new`` is a
    plain list the caller lets this function shorten and restore."""
    a = old if len(old) == n else old[:n]
    b = new if len(new) == n else new[:n]
    if n == 0 or a == b:
        return []
    split = n - _TAIL
    if split > _LEAF:
        if type(b) is list and (own or b is not new):  # ours: compare its head in place
            tail = b[split:]
            del b[split:]
            same = b == a[:split]
            b += tail
        else:
            same = a[:split] == b[:split]
        if same:
            return [i for i in range(split, n) if a[i] is not b[i]]
    out: list[int] = []
    stack = [(0, n)]
    while stack:
        lo, hi = stack.pop()
        if hi - lo <= _LEAF:
            out.extend(i for i in range(lo, hi) if a[i] is not b[i])
            continue
        mid = (lo + hi) // 2
        if a[mid:hi] != b[mid:hi]:
            stack.append((mid, hi))
        if a[lo:mid] != b[lo:mid]:
            stack.append((lo, mid))
    out.sort()
    return out


def _diff_keyed(
    part: str, old: _Keyed, new: Mapping[str, Any], upserts: Upserts, deletes: Deletes
) -> _Keyed:
    if new is old.source:
        return old
    moved = changed_keys(old.source, new)
    if moved is not None:
        # ``new`` was derived from ``old`` by the kernel: only these keys moved.
        previous = old.source
        missing = object()
        for key in dict.fromkeys(moved):
            value = new.get(key, missing)
            if value is missing:
                if key in previous:
                    deletes.append((part, key))
            elif previous.get(key, missing) is not value:
                upserts.append((part, key, encode_part(value)))
        return _Keyed(new)
    keys = list(new)
    values = list(new.values())
    m = len(old.keys)
    n = len(keys)
    if n >= m:
        # Same keys in the same order, maybe some appended (``assoc``)?  The
        # lists are ours: compare their first m items without copying them.
        added_keys, added_values = keys[m:], values[m:]
        del keys[m:], values[m:]
        same = keys == old.keys
        changed = _changed(old.values, values, m, own=True) if same else []
        keys += added_keys
        values += added_values
        if same:
            for i in changed:
                upserts.append((part, keys[i], encode_part(values[i])))
            for i in range(m, n):
                upserts.append((part, keys[i], encode_part(values[i])))
            return _Keyed(new, keys, values)
    previous = old.source
    missing = object()
    for key, value in new.items():
        was = previous.get(key, missing)
        if was is not value and (was is missing or was != value):
            upserts.append((part, key, encode_part(value)))
    deletes.extend((part, key) for key in previous if key not in new)
    return _Keyed(new, keys, values)


def _diff_messages(
    old: Sequence[Any] | None,
    new: Sequence[Any] | None,
    upserts: Upserts,
    deletes: Deletes,
    part: str = MESSAGES,
) -> None:
    if new is old:
        return
    before: Sequence[Any] = old or ()
    after: Sequence[Any] = new or ()
    if isinstance(before, tuple) is not isinstance(after, tuple):
        before, after = tuple(before), tuple(after)  # a tuple never equals a list
    common = min(len(before), len(after))
    for i in _changed(before, after, common):
        upserts.append((part, message_key(i), encode_part(after[i])))
    for i in range(common, len(after)):
        upserts.append((part, message_key(i), encode_part(after[i])))
    deletes.extend((part, message_key(i)) for i in range(common, len(before)))


def diff(old: Entry, record: RunRecord) -> tuple[Entry, Upserts, Deletes]:
    """``(entry of record, upserts, deletes)``: the part rows turning the
    stored ``old`` record into ``record``.  Encodes only what changed."""
    if _fast_diff is not None:
        out = _fast_diff(old, record)
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
    return _diff(old, record)


def _diff(old: Entry, record: RunRecord) -> tuple[Entry, Upserts, Deletes]:
    upserts: Upserts = []
    deletes: Deletes = []
    messages = record.transcript
    usage = record.usage
    entry = _entry(
        record,
        _diff_keyed("intents", old.intents, record.intents, upserts, deletes),
        _diff_keyed("tool_results", old.tool_results, record.tool_results, upserts, deletes),
        _diff_keyed(RESERVATIONS, old.reservations, record.budget.reservations, upserts, deletes),
        messages,
        usage,
    )
    _diff_messages(old.messages, messages, upserts, deletes)
    _diff_messages(old.usage, usage, upserts, deletes, USAGE)
    for part, key, _ in upserts:
        if "\x00" in key:
            # A key is a column of its row, and PostgreSQL text holds no NUL:
            # refused as the caller's mistake on every SQL store, never
            # storage_failed on one of them.
            raise Error(
                ErrorClass.VALIDATION,
                "a key of the record's intents, tool results or reservations holds NUL",
                {"part": part, "key": key.replace("\x00", "\\x00")[:200]},
            )
    return entry, upserts, deletes


#: The kernel accelerator's ``_diff`` of the common commit (kernel-derived
#: maps, lists appended to), declining anything else to ``_diff``; or ``None``.
_fast_diff: Final[Callable[[Entry, RunRecord], Any] | None] = getattr(_accelerator, "diff", None)
if _fast_diff is not None:
    _accelerator.configure_diff(
        Entry,
        _Keyed,
        RunRecord,
        Budget,
        ("intents", "tool_results", RESERVATIONS),
        (MESSAGES, USAGE),
        _entry,
        encode_part,
    )


def split(record: RunRecord) -> tuple[str, Parts]:
    """``(head text, parts)`` of ``record`` as the SQL stores lay it out."""
    _, upserts, _ = diff(NOTHING, record)
    return head_text(record), {(part, key): value for part, key, value in upserts}
