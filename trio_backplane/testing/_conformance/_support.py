"""The conformance checks' tools: a run driven through the kernel and
committed, an expected error, and pytest-trio marks (without importing pytest)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Sequence
from typing import Any

from ...errors import Error, ErrorClass
from ...kernel import Command, RunEvent, RunRecord, transition
from ...store import Receipt, Store, verify_receipt

__all__: list[str] = []


def _mark_trio(cls: type) -> None:
    """Mark the checks ``pytest.mark.trio`` when pytest-trio is installed, so
    they run without ``trio_mode``; a no-op outside pytest."""
    pytest = sys.modules.get("pytest")
    if pytest is None or importlib.util.find_spec("pytest_trio") is None:
        return
    marks = list(getattr(cls, "pytestmark", []))
    if not any(getattr(m, "name", None) == "trio" for m in marks):
        cls.pytestmark = [*marks, pytest.mark.trio]  # type: ignore[attr-defined]


def _expect_error(error_class: ErrorClass) -> _Raises:
    return _Raises(error_class)


class _Raises:
    """``with _Raises(cls): ...``: the block must raise ``Error`` of ``cls``.

    (A tiny ``pytest.raises`` so this module does not import pytest.)"""

    def __init__(self, error_class: ErrorClass | None) -> None:
        self.error_class = error_class  # None: any class
        self.error: Error | None = None

    def __enter__(self) -> _Raises:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        wanted = "any class" if self.error_class is None else self.error_class.value
        if exc is None:
            raise AssertionError(f"expected Error({wanted}), nothing was raised")
        if not isinstance(exc, Error):
            return False
        if self.error_class is not None and exc.error_class is not self.error_class:
            raise AssertionError(f"expected Error({wanted}), got {exc!r}") from exc
        self.error = exc
        return True


async def _commit_onto(
    store: Store,
    base: RunRecord,
    record: RunRecord,
    events: Sequence[RunEvent],
    *,
    expected_revision: int | None = None,
) -> Receipt:
    """``store.commit`` of ``record`` as a writer holding ``base`` would make
    it: ``base``'s incarnation, and its revision unless another is given."""
    return await store.commit(
        base.run_id,
        incarnation=base.incarnation,
        expected_revision=base.revision if expected_revision is None else expected_revision,
        record=record,
        events=events,
    )


class _Run:
    """One run driven through the kernel and committed to a store."""

    def __init__(self, store: Store, record: RunRecord, clock: itertools.count[int]) -> None:
        self.store = store
        self.record = record
        self._clock = clock
        self.events: list[RunEvent] = []

    @property
    def run_id(self) -> str:
        return self.record.run_id

    def next(self, kind: str, **data: Any) -> tuple[RunRecord, list[RunEvent]]:
        """The transition of ``kind`` from the current record (not committed),
        at a time with a fraction (a store keeping whole seconds fails)."""
        at = next(self._clock) + 0.375
        return transition(self.record, Command(kind, at=at, input=data))

    async def commit_prepared(self, new: RunRecord, events: Sequence[RunEvent]) -> Receipt:
        expected = self.record.revision
        receipt = await self.store.commit(
            self.run_id,
            incarnation=self.record.incarnation,
            expected_revision=expected,
            record=new,
            events=events,
        )
        assert isinstance(receipt, Receipt), f"commit returned {receipt!r}, not a Receipt"
        verify_receipt(receipt, run_id=self.run_id, expected_revision=expected)  # STO-03
        assert receipt.incarnation == new.incarnation, receipt
        self.record = new
        self.events.extend(events)
        return receipt

    async def apply(self, kind: str, **data: Any) -> Receipt:
        new, events = self.next(kind, **data)
        return await self.commit_prepared(new, events)


def _expect_any_error() -> _Raises:
    return _Raises(None)


def _ahead(record: RunRecord) -> tuple[RunRecord, list[RunEvent]]:
    """A record two revisions ahead of ``record`` (committed as if the store
    were one revision further than it is)."""
    first, _ = transition(record, Command("conversation_updated", at=90.0))
    return transition(first, Command("conversation_updated", at=91.0))
