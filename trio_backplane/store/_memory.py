"""``MemoryStore``: ephemeral, for tests and demos; it cannot fence."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import final

from ..errors import Error, ErrorClass
from ..kernel import RunEvent, RunRecord
from ._protocol import (
    Receipt,
    RunSummary,
    check_arguments,
    check_commit,
    check_states,
    make_receipt,
    prepare_create,
)

__all__ = ["MemoryStore"]


@final
class MemoryStore:
    """Runs in a dict.  Same compare-and-set as the durable stores; ``fence``
    raises ``unsupported_capability`` "durable store required".

    It keeps the committed ``RunRecord`` itself (frozen, JSON data by
    construction): a commit encodes nothing but its events."""

    durable = False

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}
        #: each run's log: the committed events as given (frozen), numbered
        #: by their position (sequence = index + 1) when read
        self._events: dict[str, list[RunEvent]] = {}

    async def create(self, record: RunRecord) -> Receipt:
        prepare_create(record)
        if record.run_id in self._records:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT, "run already exists", {"run_id": record.run_id}
            )
        self._records[record.run_id] = record
        self._events[record.run_id] = []
        return Receipt(record.run_id, record.incarnation, record.revision)

    async def load(self, run_id: str) -> RunRecord | None:
        check_arguments(run_id)
        return self._records.get(run_id)

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        return self.commit_nowait(
            run_id,
            incarnation=incarnation,
            expected_revision=expected_revision,
            record=record,
            events=events,
        )

    def commit_nowait(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        """:meth:`commit` without waiting (there is nothing to wait for): the
        runtime calls it directly, with no commit-deadline scope around it,
        as ``trio``'s ``send_nowait`` spares a channel send its scheduling."""
        check_arguments(
            run_id, incarnation=incarnation, expected_revision=expected_revision, events=events
        )
        check_commit(
            self._records.get(run_id),
            run_id,
            incarnation=incarnation,
            expected_revision=expected_revision,
            record=record,
            events=events,
        )
        # Decided.  MemoryStore keeps the frozen values themselves: nothing is
        # encoded, and a RunEvent's payload is frozen already.
        self._events[run_id].extend(events)
        self._records[run_id] = record
        return make_receipt(run_id, incarnation, record.revision)

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        check_arguments(run_id, incarnation=incarnation)
        raise Error(ErrorClass.UNSUPPORTED_CAPABILITY, "durable store required")

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        check_states(states)
        return [
            RunSummary(r.run_id, r.incarnation, r.revision, r.state, self._admitted_at(r.run_id))
            for r in sorted(self._records.values(), key=lambda r: r.run_id)
            if states is None or r.state in states
        ]

    def _admitted_at(self, run_id: str) -> float | None:
        log = self._events.get(run_id)
        return log[0].occurred_at if log else None

    async def aclose(self) -> None:
        """Nothing to release: the runs stay readable."""

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        check_arguments(run_id, after=after)
        log = self._events.get(run_id, [])
        return [
            RunEvent(e.type, e.occurred_at, e.payload, sequence)
            for sequence, e in enumerate(log[after:], after + 1)
        ]
