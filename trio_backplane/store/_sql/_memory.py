"""What a SQL store remembers of its runs, and a commit planned against it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from ...kernel import TERMINAL_STATES, RunEvent, RunRecord
from .._diff import Entry, diff
from .._layout import encode_part, head_fields, join_head
from ._rows import EventRow, PartKey, PartRow, RunRow, RunUpdate, Writes, maker

_run_row: Final = maker(RunRow)
_run_update: Final = maker(RunUpdate)
_part_row: Final = maker(PartRow)
_part_key: Final = maker(PartKey)
_event_row: Final = maker(EventRow)

__all__ = ["CACHE_ITEMS", "Memory", "Plan", "Remembered"]

#: Entries (intents, results, reservations, messages, usage reports) of the
#: remembered records a store keeps at most, by default.
CACHE_ITEMS: Final = 1_000_000


class Remembered:
    """A run as last committed or read: its entry, its last event sequence
    (``None``: not read yet) and its head field by field (``()``: not encoded)."""

    __slots__ = ("entry", "head", "last", "size")

    def __init__(self, entry: Entry, last: int | None, head: Sequence[str]) -> None:
        self.entry = entry
        self.last = last
        self.head = head
        record = entry.record
        self.size = (
            1
            + len(record.intents)
            + len(record.tool_results)
            + len(record.budget.reservations)
            + len(record.transcript)
            + len(record.usage)
        )


class Plan:
    """A commit decided and encoded against ``base``; events not numbered
    until :meth:`stage`."""

    __slots__ = (
        "base",
        "deletes",
        "entry",
        "events",
        "head",
        "rows",
        "staged",
        "update",
        "upserts",
    )

    def __init__(self, base: Remembered, record: RunRecord, events: Sequence[RunEvent]) -> None:
        old = base.entry.record
        self.base = base
        self.entry, self.upserts, self.deletes = diff(base.entry, record)
        #: the part rows it writes (upserts and deletes)
        self.rows = len(self.upserts) + len(self.deletes)
        self.head = head_fields(record, old, base.head)
        state = record.state
        row = (record.run_id, record.incarnation, record.revision, state, join_head(self.head))
        moved = state != old.state
        self.update = _run_update((_run_row(row), old.incarnation, old.revision, moved))
        self.events = [(e.type, e.occurred_at, encode_part(e.payload)) for e in events]
        #: what to remember once the rows are committed (set by :meth:`stage`)
        self.staged: Remembered = base

    def stage(self, writes: Writes, last: int | None) -> None:
        """Add the rows to ``writes``, events numbered after ``last``, and
        set :attr:`staged`."""
        update = self.update
        run_id = update.row.run_id
        writes.updates.append(update)
        upserts = self.upserts
        if upserts:
            writes.parts += [_part_row((run_id, *row)) for row in upserts]
        if self.deletes:
            writes.gone += [_part_key((run_id, *row)) for row in self.deletes]
        events = self.events
        if events:
            assert last is not None
            writes.events += [
                _event_row((run_id, sequence, *event))
                for sequence, event in enumerate(events, last + 1)
            ]
            last += len(events)
        self.staged = Remembered(self.entry, last, self.head)


class Memory:
    """Runs remembered, least recently used first, bounded by the entries
    of their records (``items``), not by a number of runs.  Mutated under a
    lock; ``get`` is a plain dict read any thread may make."""

    def __init__(self, items: int) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, Remembered] = OrderedDict()
        self._budget = items
        self._items = 0
        self.get = self._runs.get

    def __len__(self) -> int:
        return len(self._runs)

    def remember(self, run: Remembered) -> None:
        """Remember ``run`` unless a later revision is remembered; a finished
        run is forgotten (it never commits again)."""
        record = run.entry.record
        run_id = record.run_id
        with self._lock:
            runs = self._runs
            old = runs.get(run_id)
            if old is not None:
                known = old.entry.record
                if (known.incarnation, known.revision) > (record.incarnation, record.revision):
                    return
                del runs[run_id]
                self._items -= old.size
            if record.state in TERMINAL_STATES:
                return
            runs[run_id] = run
            self._items += run.size
            while self._items > self._budget and len(runs) > 1:
                _, evicted = runs.popitem(last=False)
                self._items -= evicted.size

    def forget(self, run_id: str) -> None:
        with self._lock:
            old = self._runs.pop(run_id, None)
            if old is not None:
                self._items -= old.size

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()
            self._items = 0

    def current(self, row: RunRow) -> Remembered | None:
        """The remembered run when it is ``row``'s incarnation and revision."""
        run = self._runs.get(row.run_id)
        if run is None:
            return None
        record = run.entry.record
        if record.incarnation != row.incarnation or record.revision != row.revision:
            return None
        return run
