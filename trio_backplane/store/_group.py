"""Group commit on the Trio side, shared by the SQL stores.

Callers queue their commits; the first one becomes the *leader* and writes
batches (one commit per run: a run's commits stay in order) until its own is
done, then hands the role to the next queued caller.  One batch is in flight
at a time, and a batch taken is always waited out, cancelled or not, so every
caller learns its commit's outcome; a caller cancelled while still queued
withdraws its commit.  A store whose writes need a resource first (a
connection slot) names it as ``slot``: the leader waits for it *before*
taking a batch, so a leader cancelled while waiting withdraws only its own
commit and hands the role on; the commits queued with it never see its
cancellation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Generic, TypeVar

import outcome
import trio

from ..errors import Error, ErrorClass
from ..kernel import RunEvent, RunRecord

__all__ = ["DONE", "IN_FLIGHT", "QUEUED", "GroupCommit", "Job"]

QUEUED: Final = 0
IN_FLIGHT: Final = 1
DONE: Final = 2


class Job:
    """One caller's ``commit``: its arguments, and after its batch its
    receipt or error."""

    __slots__ = (
        "error",
        "events",
        "expected_revision",
        "incarnation",
        "receipt",
        "record",
        "run_id",
        "state",
        "task",
    )

    def __init__(
        self,
        run_id: str,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> None:
        self.run_id = run_id
        self.incarnation = incarnation
        self.expected_revision = expected_revision
        self.record = record
        self.events = events
        self.task: trio.lowlevel.Task | None = None
        self.state = QUEUED
        self.receipt: Any = None
        self.error: BaseException | None = None


J = TypeVar("J", bound=Job)


class GroupCommit(Generic[J]):
    """The queue and the leader role of one store; ``write(batch)`` writes a
    batch (in a worker thread) and sets every job's receipt or error."""

    def __init__(
        self,
        write: Callable[[list[J]], Awaitable[None]],
        slot: AbstractAsyncContextManager[Any] | None = None,
    ) -> None:
        self._write = write
        self._slot = slot
        self.queue: list[J] = []
        self._leading = False

    async def submit(self, job: J) -> Any:
        """Queue ``job`` and wait for its batch: its receipt, or its error raised."""
        job.task = trio.lowlevel.current_task()
        self.queue.append(job)
        if self._leading:

            def abort(_: Any) -> trio.lowlevel.Abort:
                if job.state == QUEUED:  # not taken yet: withdraw it
                    self.queue.remove(job)
                    job.state = DONE
                    return trio.lowlevel.Abort.SUCCEEDED
                return trio.lowlevel.Abort.FAILED  # in flight: wait for the outcome

            role = await trio.lowlevel.wait_task_rescheduled(abort)
            if role == "lead":
                await self._lead(job)
        else:
            self._leading = True
            await self._lead(job)
        if job.error is not None:
            raise job.error
        return job.receipt

    def _take_batch(self) -> list[J]:
        queued = self.queue
        if len(queued) == 1:
            self.queue = []
            queued[0].state = IN_FLIGHT
            return queued
        batch = []
        seen: set[str] = set()
        rest: list[J] = []
        for job in queued:
            if job.run_id in seen:
                rest.append(job)  # a run's commits stay in order: one per batch
            else:
                seen.add(job.run_id)
                job.state = IN_FLIGHT
                batch.append(job)
        self.queue = rest
        return batch

    async def _lead(self, own: J) -> None:
        """Write batches until ``own`` is done, then hand the role on."""
        slot = self._slot
        try:
            while own.state != DONE:
                if slot is not None:
                    try:
                        await slot.__aenter__()
                    except BaseException:
                        # Cancelled before taking anything: withdraw our own
                        # commit (still queued), the others wait for the next
                        # leader.
                        if own.state == QUEUED:
                            self.queue.remove(own)
                            own.state = DONE
                        raise
                batch = self._take_batch()
                try:
                    await self._write(batch)
                except BaseException as exc:  # pragma: no cover - a bug: release the batch
                    for job in batch:
                        if job.receipt is None and job.error is None:
                            job.error = exc
                    raise
                finally:
                    try:
                        self._release(batch, own)
                    finally:
                        if slot is not None:
                            await slot.__aexit__(None, None, None)
        finally:
            if self.queue:
                task = self.queue[0].task
                assert task is not None
                trio.lowlevel.reschedule(task, outcome.Value("lead"))
            else:
                self._leading = False

    @staticmethod
    def _release(batch: list[J], own: J) -> None:
        """Every job of ``batch`` done, its caller woken (``own``'s is running)."""
        for job in batch:
            job.state = DONE
            if job.receipt is None and job.error is None:  # pragma: no cover
                job.error = Error(ErrorClass.STORAGE_FAILED, "commit not attempted")
            if job is not own:
                assert job.task is not None
                trio.lowlevel.reschedule(job.task, outcome.Value("done"))
