"""The commit coordinator: everything durable a conversation does goes
through it, in order.

A FIFO lock keeps one commit in flight; each transition is computed from
the last acknowledged record (a checkpoint is rebased on whatever committed
before it); the store call is shielded from the caller's cancellation (a
commit's outcome is always known) and bounded by ``commit_timeout``.  Only
an acknowledged commit becomes the conversation's record (rule 2).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import TERMINAL_STATES, KernelCommand, RunEvent, RunRecord, transition
from ..store import Receipt, Store, verify_receipt
from ._signals import _InputArrived, _Stop, _StorageFailed, storage_error
from ._state import RunState
from ._steps import Step, checkpoint_step, command_step
from ._types import Phase

__all__ = ["Coordinator"]


@final
class Coordinator:
    """Commits ``Step`` s for one conversation: FIFO, one in flight."""

    __slots__ = ("_commit_nowait", "_commit_timeout", "_failed", "_state", "_store", "lock")

    def __init__(
        self,
        state: RunState,
        store: Store,
        *,
        commit_timeout: float,
        failed: Callable[[Error], None],
    ) -> None:
        """``failed``: what a storage failure does to the rest of the
        conversation (called once per failed commit, before it is raised)."""
        self._state = state
        self._store = store
        self._commit_timeout = commit_timeout
        self._failed = failed
        #: held by the commit in flight (and by the settlement while it decides)
        self.lock = trio.Lock()
        #: ``store.commit_nowait`` when the store's class defines it (it
        #: never waits); a wrapper forwarding attributes keeps its ``commit``
        nowait = getattr(type(store), "commit_nowait", None)
        self._commit_nowait: Callable[..., Receipt] | None = (
            None
            if not callable(nowait) or inspect.iscoroutinefunction(nowait)
            else getattr(store, "commit_nowait", None)
        )

    async def commit(
        self, command: type[KernelCommand], fields: Mapping[str, Any] | None = None
    ) -> RunRecord:
        """Apply ``command(at=now, **fields)`` to the last acknowledged record
        and commit it."""
        return await self.commit_steps((command_step(command, fields),))

    async def checkpoint(
        self, update: Any, extra: Mapping[str, Any] | None = None, *, as_input: bool = False
    ) -> RunRecord:
        """Commit a new conversation state computed from the acknowledged one."""
        return await self.commit_steps((checkpoint_step(update, extra),), as_input=as_input)

    async def commit_steps(self, steps: Sequence[Step], *, as_input: bool = False) -> RunRecord:
        """Commit ``steps`` in order as one store commit (one revision; a
        kernel event per step), each command built from the record the
        previous step left.  When the kernel refuses a step, the steps before
        it are committed alone and the refusal raised: exactly what committing
        them one by one would do, with fewer durable writes.  Each step's
        ``after`` runs once its commit is acknowledged (events go out only
        after their commit, rule 2).  ``as_input``: the steps take host input,
        refused with ``resource_conflict`` when, by the time the coordinator
        is free, the run stopped (a cancellation settled meanwhile)."""
        # The FIFO lock, without a scheduler round trip when it is free (the
        # common case: one worker commits at a time); a cancelled caller still
        # stops here before anything is decided.
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self.lock
        if self._commit_nowait is not None and not lock.locked():
            # A store that never waits: the whole commit runs without a
            # checkpoint, so nothing can come between; the lock is free and
            # nobody queues behind it (a queued waiter would hold it).
            return await self.commit_locked(steps, as_input=as_input)
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            return await self.commit_locked(steps, as_input=as_input)
        finally:
            lock.release()

    async def commit_locked(
        self, steps: Sequence[Step], *, as_input: bool = False, commit_by: float = math.inf
    ) -> RunRecord:
        """``commit_steps`` for a caller that holds the lock; ``commit_by``
        bounds the store call too (a settlement's end)."""
        state = self._state
        record = state.record
        if as_input and (state.stop_reason is not None or record.state in TERMINAL_STATES):
            # cancelled meanwhile: whatever became of the settlement, input is refused
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")
        if state.phase in (Phase.STORAGE_FAILED, Phase.RECOVERY_REQUIRED):
            raise _StorageFailed(state.last_error or storage_error("store is unavailable"))
        if record.state in TERMINAL_STATES:
            raise _Stop  # settled without a worker that ignored its cancellation
        now = state.now()
        wall = state.clock.wall(now)
        steps = self._with_moved_deadline(steps, record, now, wall)
        new, events, done = record, [], 0
        refusal: Error | _InputArrived | None = None
        revision = record.revision + 1  # one store commit: one revision
        for step in steps:
            try:
                new, produced = transition(new, step.build(new, wall), revision=revision)
            except (Error, _InputArrived) as exc:
                refusal = exc
                break
            events.extend(produced)
            done += 1
        if done:
            await self._write(record, new, events, commit_by)
            for step in steps[:done]:
                if step.after is not None:
                    step.after()
        if refusal is not None:
            raise refusal
        return new

    def _with_moved_deadline(
        self, steps: Sequence[Step], record: RunRecord, now: float, wall: float
    ) -> Sequence[Step]:
        """``steps``, after a checkpoint moving the stored run deadline when a
        commit comes during a human wait (a nested call's, say) past it: the
        wait has moved it in memory but not yet in the store."""
        pending = self._state.pending
        if (
            pending is None
            or not pending.announced
            or record.deadline is None
            or wall <= record.deadline
        ):
            return steps
        # (a wait an answer ended is measured up to that answer)
        ended = now if pending.answered_at is None else min(now, pending.answered_at)
        moved = pending.moved_deadline(ended)
        if moved is not None and moved > record.deadline:
            return (checkpoint_step(None, {"execution_deadline": moved}), *steps)
        return steps

    async def _write(
        self, record: RunRecord, new: RunRecord, events: list[RunEvent], commit_by: float
    ) -> None:
        """Store ``new`` over ``record``; a failure, however it comes, is the
        conversation's storage failure (``_StorageFailed``), and only an
        acknowledged commit becomes the conversation's record."""
        error: Error | None = None
        recorder = self._state.telemetry
        if recorder is not None:
            recorder.commit_started(new.revision, [event.type for event in events])
        try:
            nowait = self._commit_nowait
            if nowait is not None:  # nothing to wait for: no scope to bound the wait
                receipt = nowait(
                    record.run_id,
                    incarnation=record.incarnation,
                    expected_revision=record.revision,
                    record=new,
                    events=events,
                )
            else:
                receipt = await self._commit_waiting(record, new, events, commit_by)
            verify_receipt(receipt, run_id=record.run_id, expected_revision=record.revision)
        except Error as exc:
            error = exc
        except Exception as exc:
            error = storage_error(f"store failed: {type(exc).__name__}: {exc}"[:500])
        finally:
            if recorder is not None:
                recorder.commit_ended(new.revision, error)
        if error is not None:
            self._failed(error)
            raise _StorageFailed(self._state.last_error or error)
        self._state.record = new

    async def _commit_waiting(
        self, record: RunRecord, new: RunRecord, events: list[RunEvent], commit_by: float
    ) -> Receipt:
        """``store.commit`` in one scope: shielded from the caller's
        cancellation (a commit's outcome is always known), bounded by its own
        commit deadline (rule 5), and by ``commit_by`` (a settlement's end)."""
        deadline = min(self._state.now() + self._commit_timeout, commit_by)
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            receipt = await self._store.commit(
                record.run_id,
                incarnation=record.incarnation,
                expected_revision=record.revision,
                record=new,
                events=events,
            )
            if not scope.cancel_called:
                return receipt
            # A store that waits its write out acknowledged it after the
            # deadline: not within commit_timeout, whatever it says.
        raise storage_error("commit was not acknowledged within commit_timeout")
