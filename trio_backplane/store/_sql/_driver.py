"""The seam between the SQL engine and one database connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ...errors import Error
from ._rows import RunRow, Writes

__all__ = ["Driver", "EventTuple"]

#: ``(sequence, type, occurred_at, payload text)`` of a stored event.
EventTuple = tuple[int, str, float, str]


class Driver(Protocol):
    """One connection to one database, used by one worker thread at a time
    (``interrupt`` excepted).  Synchronous: the engine runs it in its worker
    threads.  Methods raise the database's own exceptions; :meth:`classify`
    turns them into ``Error``.  Every write happens between :meth:`begin`
    and :meth:`commit` (or :meth:`rollback`)."""

    def open(self, deadline: float) -> None:
        """Connect if not connected (again, after a failure) and make sure the
        tables are laid out: ``Error`` when they cannot be.  Connecting gives
        up by ``deadline`` (``time.monotonic``; ``inf``: its own timeout)."""

    def begin(self, deadline: float) -> None:
        """Start a write transaction; waiting for another writer's lock ends
        by ``deadline`` (``time.monotonic``), failing."""

    def begin_read(self) -> None:
        """Start a read-only transaction that sees one snapshot."""

    def commit(self) -> None: ...

    def rollback(self) -> None:
        """End the transaction, if any, writing nothing; never raises."""

    def read_run(self, run_id: str, *, lock: bool) -> RunRow | None:
        """The run's row; ``lock``: held until the transaction ends."""

    def read_parts(self, run_id: str) -> dict[tuple[str, str], str]: ...

    def last_sequence(self, run_id: str) -> int:
        """The run's last event sequence (0: none)."""

    def insert_run(self, row: RunRow) -> bool:
        """Insert a new run row; ``False`` (nothing written) when it exists."""

    def write(self, writes: Writes) -> bool:
        """Write ``writes``.  ``False`` when a compare-and-set matched no row or
        an event sequence was taken: the run is not as the engine remembered
        it, and the caller rolls back."""

    def list_runs(
        self, states: Sequence[str] | None
    ) -> list[tuple[str, int, int, str, float | None]]:
        """``(run_id, incarnation, revision, state, first event's time)`` by
        run id."""

    def read_events(self, run_id: str, after: int) -> list[EventTuple]: ...

    def interrupt(self) -> None:
        """From another thread: make the call in flight fail now."""

    def close(self) -> None:
        """Close the connection; never raises."""

    def classify(self, exc: BaseException) -> Error | None:
        """``exc`` as an ``Error`` when it is the database's (``None``: not)."""
