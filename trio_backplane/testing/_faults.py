"""``FaultyStore``: store failures injected from outside any store."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import RunEvent, RunRecord
from ..store import Receipt, RunSummary, Store

__all__ = ["FaultyStore"]

_Fault = Literal["fail", "lose", "hang"]


@final
class FaultyStore:
    """A ``Store`` that forwards every call to ``inner``, and fails the next
    commits as told, in order:

    - :meth:`fail_next_commit`: raises ``storage_failed``; ``inner`` is never
      called, so nothing is stored;
    - :meth:`lose_next_ack`: ``inner`` commits, then the acknowledgement is
      lost: ``storage_failed`` although ``load`` shows the new revision;
    - :meth:`hang_next_commit`: waits until cancelled; nothing is stored.

    It offers no ``commit_nowait``: every commit goes through :meth:`commit`.
    """

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self._faults: list[_Fault] = []
        #: commits that reached ``inner`` and were acknowledged
        self.committed = 0

    def __repr__(self) -> str:
        return f"FaultyStore({self.inner!r})"

    @property
    def durable(self) -> bool:
        return bool(getattr(self.inner, "durable", False))

    def fail_next_commit(self) -> None:
        """The next commit fails before it reaches the inner store."""
        self._faults.append("fail")

    def lose_next_ack(self) -> None:
        """The next commit is stored, and its acknowledgement lost."""
        self._faults.append("lose")

    def hang_next_commit(self) -> None:
        """The next commit hangs until its caller is cancelled (nothing stored)."""
        self._faults.append("hang")

    @property
    def pending(self) -> tuple[str, ...]:
        """The faults not yet applied, in order."""
        return tuple(self._faults)

    async def create(self, record: RunRecord) -> Receipt:
        return await self.inner.create(record)

    async def load(self, run_id: str) -> RunRecord | None:
        return await self.inner.load(run_id)

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        fault = self._faults.pop(0) if self._faults else None
        if fault == "fail":
            await trio.lowlevel.checkpoint()
            raise Error(
                ErrorClass.STORAGE_FAILED,
                "injected failure: the commit was not stored",
                {"run_id": run_id, "fault": fault},
            )
        if fault == "hang":
            await trio.sleep_forever()
        receipt = await self.inner.commit(
            run_id,
            incarnation=incarnation,
            expected_revision=expected_revision,
            record=record,
            events=events,
        )
        self.committed += 1
        if fault == "lose":
            raise Error(
                ErrorClass.STORAGE_FAILED,
                "injected failure: the commit was stored, its acknowledgement lost",
                {"run_id": run_id, "fault": fault},
            )
        return receipt

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        return await self.inner.fence(run_id, incarnation=incarnation)

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        return await self.inner.list_runs(states=states)

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        return await self.inner.events(run_id, after=after)

    async def aclose(self) -> None:
        await self.inner.aclose()
