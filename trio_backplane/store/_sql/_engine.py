"""The SQL store engine: one algorithm over a :class:`Driver`.

Guarantees, for every driver:

- A commit is a compare-and-set on ``(run_id, incarnation, revision)``:
  decided against the stored run, never a remembered one
  alone.  The engine remembers each live run's last record it committed or
  read (:class:`Remembered`); a commit at that incarnation and revision is
  decided and encoded against it by its caller, on Trio, and the worker
  only writes, starting with the compare-and-set ``UPDATE``.  Every write
  raises the revision, so an ``UPDATE`` that matched proves the memory
  current (events continue from the remembered sequence, no read); one
  that did not rolls back, and the commit is decided from the stored row.
- A commit writes what changed (``_diff.diff``): commit 5,000 of a run
  costs what commit 10 did.
- Concurrent commits are written together (``GroupCommit``), at most one
  per run, in one transaction; a refused commit changes no row, so it fails
  alone.  Every caller is acknowledged only after the ``COMMIT`` returned; a
  failed ``COMMIT`` fails its whole batch with ``storage_failed`` and the
  memory is dropped, so ``load`` reads what is really stored.
- Memory is bounded by the entries of the remembered records
  (``cache_items``), not by a number of runs; a finished run is forgotten
  (it never commits again).
- Work submitted to a worker is waited out; a driver's call is cut at its
  deadline when the store cuts calls (``cut_after``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any, TypeVar

import trio

from ...errors import Error, ErrorClass
from ...kernel import RunEvent, RunRecord
from ...kernel import fence as kernel_fence
from .._diff import NOTHING, diff, entry_of
from .._group import GroupCommit, Job
from .._layout import (
    CorruptRecord,
    decode_stored,
    decode_stored_event,
    head_fields,
    join_head,
)
from .._protocol import (
    Receipt,
    RunSummary,
    check_arguments,
    check_commit,
    check_states,
    commit_checked,
    make_receipt,
    prepare_create,
)
from ._driver import Driver
from ._memory import CACHE_ITEMS, Memory, Plan, Remembered
from ._rows import PartRow, RunRow, Writes
from ._workers import Workers, current_cut

__all__ = ["CACHE_ITEMS", "Remembered", "SQLStore"]

T = TypeVar("T")


class _Job(Job):
    __slots__ = ("checked", "deadline", "plan")
    #: whether ``commit_checked`` passed its arguments (then only the stored
    #: record's checks are left)
    checked: bool
    #: its caller's effective deadline (Trio time; ``inf``: none)
    deadline: float
    #: decided and encoded by its caller against the run remembered then
    plan: Plan | None


def _by_run(job: _Job) -> str:
    return job.run_id


def _conflict(message: str, run_id: str) -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, message, {"run_id": run_id})


def _monotonic(deadline: float) -> float:
    """A Trio deadline as ``time.monotonic`` (what worker threads read)."""
    if deadline == math.inf:
        return deadline
    return time.monotonic() + (deadline - trio.current_time())


class SQLStore:
    """A ``Store`` over ``workers`` threads, each with a driver from
    ``make_driver``.  ``cut_after``: every call is cut at its caller's
    deadline and at most this many seconds (``None``: never cut)."""

    durable = True

    def __init__(
        self,
        make_driver: Callable[[], Driver],
        *,
        name: str,
        workers: int = 1,
        limited: bool = False,
        cut_after: float | None = None,
        cache_items: int = CACHE_ITEMS,
        where: dict[str, Any] | None = None,
    ) -> None:
        if type(cache_items) is not int or cache_items < 1:
            raise Error(ErrorClass.VALIDATION, "cache_items must be a positive int")
        # ``limited``: a call waits for a free worker before it is queued (and
        # a batch before it is taken), cancellable while it waits.
        self._workers = Workers(make_driver, workers, name, limited=limited)
        self._name = name
        self._cut_after = cut_after
        self._where = dict(where or {})
        self._group: GroupCommit[_Job] = GroupCommit(self._write_batch, self._workers.slot)
        self._memory = Memory(cache_items)
        self._lock = threading.Lock()  # guards the counts (several workers make commits)
        self._closed = False
        self._commits = self._batches = self._fast_commits = self._part_rows = 0
        #: the last commit's part rows, head length and part upserts
        self._last: tuple[int, int, Sequence[tuple[str, str, str]]] = (0, 0, ())

    # -- memory ---------------------------------------------------------------

    def remembered(self, run_id: str) -> Remembered | None:
        """What the store remembers of ``run_id`` (diagnostics and tests)."""
        return self._memory.get(run_id)

    def _read(self, driver: Driver, row: RunRow) -> Remembered:
        """The run stored as ``row``: remembered, or read back and remembered."""
        current = self._memory.current(row)
        if current is not None:
            return current
        parts = driver.read_parts(row.run_id)
        record, inline = decode_stored(row.run_id, row.head, parts, self._where.get("path"))
        run = Remembered(entry_of(record, inline), None, ())
        self._memory.remember(run)
        return run

    # -- calls ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise Error(ErrorClass.STORAGE_FAILED, "store is closed", {**self._where})

    async def _call(
        self,
        fn: Callable[[Driver], T],
        *,
        deadline: float | None = None,
        withdrawable: bool = True,
        wake: bool = False,
        slot_held: bool = False,
    ) -> T:
        """``fn(driver)`` in a worker, its failures classed."""
        self._check_open()
        if deadline is None:
            deadline = trio.current_effective_deadline()
        result, _ = await self._workers.run(
            partial(self._guarded, fn),
            cut_at=self._cut_at(deadline),
            withdrawable=withdrawable,
            wake=wake,
            slot_held=slot_held,
        )
        return result.unwrap()

    def _cut_at(self, deadline: float) -> float:
        """When a call whose caller waits until ``deadline`` is cut (Trio time)."""
        if self._cut_after is None:
            return math.inf
        return min(deadline, trio.current_time() + self._cut_after)

    def _guarded(self, fn: Callable[[Driver], T], driver: Driver) -> T:
        """In a worker: ``fn(driver)``; any failure rolls back, and one of the
        database is classed (``storage_failed`` drops the memory)."""
        try:
            driver.open(current_cut()[0])
            return fn(driver)
        except BaseException as exc:
            driver.rollback()
            error = self._classed(driver, exc)
            if error is exc:
                raise
            raise error from exc

    def _classed(self, driver: Driver, exc: BaseException) -> BaseException:
        error = exc if isinstance(exc, Error) else driver.classify(exc)
        if error is None:
            return exc
        if error is not exc and error.error_class is ErrorClass.STORAGE_FAILED and current_cut()[1]:
            error = Error(
                ErrorClass.STORAGE_FAILED,
                f"{self._name} call cut at its deadline",
                {**error.details, "operation_timeout": self._cut_after},
            )
        if error is not exc:
            error.__cause__ = exc
        if isinstance(error, CorruptRecord):
            self._memory.forget(str(error.details.get("run_id")))  # that run's rows only
        elif error.error_class is ErrorClass.STORAGE_FAILED:
            self._memory.clear()
        return error

    # -- the protocol ---------------------------------------------------------

    async def create(self, record: RunRecord) -> Receipt:
        """Store a new run at revision 0; ``resource_conflict`` if it exists."""
        prepare_create(record)
        entry, upserts, _ = diff(NOTHING, record)
        head = head_fields(record)
        deadline = _monotonic(trio.current_effective_deadline())
        run_id = record.run_id

        def write(driver: Driver) -> Receipt:
            driver.begin(deadline)
            row = RunRow(run_id, record.incarnation, record.revision, record.state, join_head(head))
            if not driver.insert_run(row):
                raise _conflict("run already exists", run_id)
            writes = Writes()
            writes.parts = [PartRow(run_id, *part) for part in upserts]
            driver.write(writes)
            driver.commit()
            self._memory.remember(Remembered(entry, None, head))
            return Receipt(run_id, record.incarnation, record.revision)

        return await self._call(write)

    async def load(self, run_id: str) -> RunRecord | None:
        check_arguments(run_id)

        def read(driver: Driver) -> RunRecord | None:
            driver.begin_read()  # one snapshot: never a torn record
            row = driver.read_run(run_id, lock=False)
            if row is None:
                driver.rollback()
                self._memory.forget(run_id)
                return None
            run = self._read(driver, row)
            driver.rollback()
            return run.entry.record

        return await self._call(read)

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        """Atomic compare-and-set on ``(run_id, incarnation, expected_revision)``,
        group-committed with concurrent callers."""
        checked = commit_checked(run_id, incarnation, expected_revision, record, events)
        if not checked:
            check_arguments(
                run_id, incarnation=incarnation, expected_revision=expected_revision, events=events
            )
        job = _Job(run_id, incarnation, expected_revision, record, tuple(events))
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        job.checked = checked
        job.deadline = trio.current_effective_deadline()
        job.plan = self._planned(job)
        receipt: Receipt = await self._group.submit(job)
        return receipt

    def _planned(self, job: _Job) -> Plan | None:
        """``job`` decided and encoded against the remembered run when it is
        at the job's incarnation and expected revision (``None``: the stored
        row decides).  Raises the decision's ``validation``."""
        run = self._memory.get(job.run_id)
        if run is None:
            return None
        stored = run.entry.record
        if stored.incarnation != job.incarnation or stored.revision != job.expected_revision:
            return None
        if job.checked:  # all that is left to check is the stored record's, just done
            return Plan(run, job.record, job.events)
        check_commit(
            stored,
            job.run_id,
            incarnation=job.incarnation,
            expected_revision=job.expected_revision,
            record=job.record,
            events=job.events,
        )
        return Plan(run, job.record, job.events)

    async def _write_batch(self, batch: list[_Job]) -> None:
        """Write ``batch`` in a worker and wait it out, cancelled or not;
        afterwards every job has its receipt or error."""
        # cut once every caller stopped waiting
        deadline = batch[0].deadline if len(batch) == 1 else max(job.deadline for job in batch)
        try:
            self._check_open()
            cut_at = self._cut_at(deadline)
            await self._workers.write(
                partial(self._batch, batch, _monotonic(deadline), _monotonic(cut_at)), cut_at
            )
        except BaseException as exc:  # the worker never got it
            for job in batch:
                if job.receipt is None and job.error is None:
                    job.error = exc

    def _batch(self, jobs: list[_Job], deadline: float, cut: float, driver: Driver) -> None:
        """In a worker: the jobs planned against remembered runs in one
        transaction; the others, and all of them when a compare-and-set
        found a run moved on, one by one from their stored rows.  ``cut``:
        when the call is cut (``time.monotonic``)."""
        if len(jobs) > 1:
            jobs.sort(key=_by_run)  # one row-lock order across hosts
        alone: list[_Job] = []
        staged: list[_Job] = []
        writes = Writes()
        try:
            driver.open(cut)
            driver.begin(deadline)
            self._stage(jobs, driver, writes, staged, alone)
            if not staged:
                driver.rollback()
            elif driver.write(writes):
                driver.commit()
                self._acknowledge(staged, fast=True)
                staged = []
            else:  # a run moved on: nothing of the group is written
                driver.rollback()
                alone = sorted(alone + staged, key=_by_run)
        except BaseException as exc:
            driver.rollback()
            failure = self._classed(driver, exc)
            if not (
                staged
                and isinstance(failure, Error)
                and failure.error_class is ErrorClass.RESOURCE_CONFLICT
            ):
                for job in jobs:
                    if job.receipt is None and job.error is None:
                        job.error = failure
                if not isinstance(exc, Exception):
                    raise
                return
            # A deadlock or serialization failure with another host's group:
            # nothing was written, each commit not yet refused is made alone.
            alone = [job for job in jobs if job.receipt is None and job.error is None]
        for job in alone:
            try:
                self._alone(job, deadline, driver)
            except BaseException as exc:
                driver.rollback()
                job.error = self._classed(driver, exc)
                if not isinstance(exc, Exception):
                    raise

    def _stage(
        self,
        jobs: list[_Job],
        driver: Driver,
        writes: Writes,
        staged: list[_Job],
        alone: list[_Job],
    ) -> None:
        """Add to ``writes`` the rows of every job planned against the run
        remembered now (to ``staged``, its plan staged); the others go to
        ``alone``, and a job the decision refuses gets its error."""
        remembered = self._memory.get
        for job in jobs:
            plan = job.plan
            if plan is None or plan.base is not remembered(job.run_id):
                try:
                    job.plan = plan = self._planned(job)
                except Error as exc:
                    job.error = exc
                    continue
                if plan is None:
                    alone.append(job)
                    continue
            self._staged(driver, plan, writes)
            staged.append(job)

    def _alone(self, job: _Job, deadline: float, driver: Driver) -> None:
        """One commit in its own transaction: written at once when it is at
        the run's remembered revision and the compare-and-set agrees, else
        decided from its locked row."""
        run_id = job.run_id
        plan = self._planned(job)
        if plan is not None:
            driver.begin(deadline)
            if self._written(driver, plan):
                driver.commit()
                job.receipt = self._acknowledged(job.record, plan, fast=True)
                return
            driver.rollback()
            self._memory.forget(run_id)  # another writer moved the run on
        driver.begin(deadline)
        row = driver.read_run(run_id, lock=True)
        stand_in: RunRecord | None = None
        if row is not None:
            # the decision needs only the row's identity and revision
            stand_in = RunRecord(run_id=run_id, incarnation=row.incarnation, revision=row.revision)
        check_commit(
            stand_in,
            run_id,
            incarnation=job.incarnation,
            expected_revision=job.expected_revision,
            record=job.record,
            events=job.events,
        )
        assert row is not None
        plan = self._replace(driver, self._read(driver, row), job.record, job.events)
        driver.commit()
        job.receipt = self._acknowledged(job.record, plan, fast=False)

    def _replace(
        self, driver: Driver, base: Remembered, record: RunRecord, events: Sequence[RunEvent]
    ) -> Plan:
        """Write ``base`` -> ``record`` under the row lock; the plan, staged."""
        plan = Plan(base, record, events)
        if not self._written(driver, plan):  # pragma: no cover - the row is locked
            raise _conflict("stale revision", record.run_id)
        return plan

    @staticmethod
    def _staged(driver: Driver, plan: Plan, writes: Writes) -> None:
        """``plan`` staged into ``writes``, its events numbered after the
        run's last (read inside the transaction when not remembered)."""
        last = plan.base.last
        if last is None and plan.events:
            last = driver.last_sequence(plan.update.row.run_id)
        plan.stage(writes, last)

    def _written(self, driver: Driver, plan: Plan) -> bool:
        """``plan`` staged and written alone; ``False`` when the
        compare-and-set did not match (the caller rolls back)."""
        writes = Writes()
        self._staged(driver, plan, writes)
        return driver.write(writes)

    def _acknowledge(self, jobs: list[_Job], *, fast: bool) -> None:
        """``jobs`` committed: each one's run remembered and its receipt made."""
        remember = self._memory.remember
        rows = 0
        plan: Plan | None = None
        for job in jobs:
            plan = job.plan
            assert plan is not None
            remember(plan.staged)
            rows += plan.rows
            record = job.record
            job.receipt = make_receipt(record.run_id, record.incarnation, record.revision)
        assert plan is not None
        self._count(len(jobs), rows, plan, fast)

    def _acknowledged(self, record: RunRecord, plan: Plan, *, fast: bool) -> Receipt:
        self._memory.remember(plan.staged)
        self._count(1, plan.rows, plan, fast)
        return make_receipt(record.run_id, record.incarnation, record.revision)

    def _count(self, commits: int, rows: int, last: Plan, fast: bool) -> None:
        with self._lock:
            self._commits += commits
            self._batches += commits > 1
            if fast:
                self._fast_commits += commits
            self._part_rows += rows
            # its rows' text, not the plan: that holds two whole records
            self._last = (last.rows, len(last.update.row.head), last.upserts)

    @property
    def stats(self) -> dict[str, int]:
        """Diagnostics and tests: ``commits`` (acknowledged), ``batches``
        (transactions that committed several runs' commits), ``fast_commits``
        (written without reading the run), ``part_rows`` (part rows upserted
        or deleted), ``last_part_rows`` and ``last_bytes`` (head and part
        text written) of the last commit."""
        with self._lock:
            return {
                "commits": self._commits,
                "batches": self._batches,
                "fast_commits": self._fast_commits,
                "part_rows": self._part_rows,
                "last_part_rows": self._last[0],
                "last_bytes": self._last[1] + sum(len(row[2]) for row in self._last[2]),
            }

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        """Advance the run to ``incarnation`` atomically: afterwards the
        old incarnation can never commit; ``resource_conflict`` unless it rises."""
        check_arguments(run_id, incarnation=incarnation)
        at = time.time()
        deadline = _monotonic(trio.current_effective_deadline())

        def write(driver: Driver) -> Receipt:
            driver.begin(deadline)
            row = driver.read_run(run_id, lock=True)
            if row is None:
                raise _conflict("run does not exist", run_id)
            base = self._read(driver, row)
            new, events = kernel_fence(base.entry.record, incarnation, at=at)
            plan = self._replace(driver, base, new, events)
            driver.commit()
            return self._acknowledged(new, plan, fast=False)

        return await self._call(write)

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        check_states(states)
        wanted = None if states is None else sorted(set(states))
        if wanted == []:
            await trio.lowlevel.checkpoint()
            return []

        def read(driver: Driver) -> list[tuple[str, int, int, str, float | None]]:
            driver.begin_read()
            rows = driver.list_runs(wanted)
            driver.rollback()
            return rows

        return [RunSummary(*row) for row in await self._call(read)]

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        check_arguments(run_id, after=after)

        def read(driver: Driver) -> list[RunEvent]:
            driver.begin_read()
            rows = driver.read_events(run_id, after)
            driver.rollback()
            path = self._where.get("path")
            return [decode_stored_event(run_id, row, path) for row in rows]

        return await self._call(read)

    # -- lifetime -------------------------------------------------------------

    async def aclose(self) -> None:
        """Let the work already submitted finish, then close every connection
        and stop the workers; afterwards every call fails ``storage_failed``."""
        self._closed = True
        await self._workers.aclose()
        self._memory.clear()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
