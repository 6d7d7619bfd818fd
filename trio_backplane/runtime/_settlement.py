"""Stop, watch, settle: the worker that runs the turns, the stop that
cancels it, the watchdog that settles without a worker ignoring its
cancellation, and the one shielded settlement that ends a stopped run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..kernel import (
    TERMINAL_STATES,
    Cancel,
    CleanupSettled,
    DeadlineExceeded,
    KernelCommand,
    RunRecord,
    thaw,
)
from ._catalog import CatalogState
from ._coordinator import Coordinator
from ._deadline import DeadlineBudget
from ._options import Options
from ._signals import _Stop, _StorageFailed
from ._state import Publisher, RunState
from ._steps import Step, checkpoint_step, command_step
from ._types import Phase

__all__ = ["Settlement"]

#: the turns a worker runs: ``(first turn id, the first turn's failure)``
Turns = Callable[[str | None, Error | None], Awaitable[None]]


@final
class Settlement:
    """Runs the worker and settles the run once it stops."""

    __slots__ = (
        "_catalog",
        "_coordinator",
        "_nursery",
        "_options",
        "_publisher",
        "_settling",
        "_state",
        "_stop_requested",
        "_turns",
        "_worker",
        "worker_running",
    )

    def __init__(  # noqa: PLR0917 - the parts it stops and settles
        self,
        state: RunState,
        coordinator: Coordinator,
        publisher: Publisher,
        catalog: CatalogState,
        options: Options,
        nursery: trio.Nursery,
    ) -> None:
        self._state = state
        self._coordinator = coordinator
        self._publisher = publisher
        self._catalog = catalog
        self._options = options
        self._nursery = nursery
        self._turns: Turns | None = None
        self._worker: trio.CancelScope | None = None
        self.worker_running = False
        self._stop_requested = trio.Event()
        self._settling = False  # one settlement at a time

    def runs(self, turns: Turns) -> None:
        """What the worker runs (given once the turn loop is built)."""
        self._turns = turns

    # -- the stop ----------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop the run (``cancelled``, ``deadline_exceeded``, ``uncertain``):
        the worker is cancelled and the settlement follows it."""
        state = self._state
        self.stopping(reason)
        state.bound_closing(self._options.cleanup_timeout)
        self._stop_requested.set()
        state.watch_poke.set()
        if self._worker is not None:
            self._worker.cancel()
        if not self.worker_running and not state.settled.is_set():
            self._nursery.start_soon(self._settle)

    def stopping(self, reason: str) -> None:
        """What a stop does to the conversation's state, whoever notices it
        (``request_stop``, or the worker unwinding past the run deadline):
        no interaction is answered any more, every executing effect ends,
        the staging is discarded, and the first reason is the run's."""
        state = self._state
        pending = state.pending
        if pending is not None:
            if not pending.resolving:
                state.pending = None  # a resolve after cancel() returned is not_found
            if pending.waiter is not None:
                pending.waiter.cancel()  # no answer comes now, wherever the effect waits
        for scope in state.effect_stops:
            scope.cancel()  # every executing effect ends, wherever its task runs
        self._catalog.discard()  # a cancelled or uncertain producer discards
        if state.stop_reason is None:
            state.stop_reason = reason
            if state.stop_due is None:
                now = state.now()
                # A deadline noticed late (after a shielded commit) was due at the deadline.
                state.stop_due = (
                    min(now, state.run_budget.deadline) if reason == "deadline_exceeded" else now
                )
            if not state.inactive:
                state.phase = Phase.CANCELLING

    def storage_failed(self, error: Error) -> None:
        """A commit failed (or a newer incarnation owns the run): the
        conversation ends there, storage_failed or recovery_required."""
        state = self._state
        if state.phase in (Phase.STORAGE_FAILED, Phase.RECOVERY_REQUIRED):
            return
        if error.error_class is ErrorClass.RESOURCE_CONFLICT:
            state.phase = Phase.RECOVERY_REQUIRED  # a newer incarnation owns the run
            state.last_error = error
            self._publisher.hub.finish()  # no event will come: nothing is ours to say any more
        else:
            if error.error_class is not ErrorClass.STORAGE_FAILED:
                error = Error(ErrorClass.STORAGE_FAILED, error.message, error.details)
            state.phase = Phase.STORAGE_FAILED
            state.last_error = error
            self._publisher.publish(
                "storage_failed", {"error": error.to_dict(), "recovery_required": True}
            )
        self._catalog.discard()
        if self._worker is not None:
            self._worker.cancel()
        if self._state.owned.registries:
            # the processes still stop; the run stays what the store says
            self._nursery.start_soon(self._close_then_settle)
        else:
            state.settled.set()

    async def _close_then_settle(self) -> None:
        try:
            self._state.resource_cleanup = await self._state.owned.close()
        finally:
            self._state.settled.set()

    # -- the worker ---------------------------------------------------------------

    def start_worker(self, first_turn: str | None, failed: Error | None) -> None:
        self.worker_running = True
        self._nursery.start_soon(self._run_worker, first_turn, failed)

    async def _run_worker(self, first_turn: str | None, failed: Error | None) -> None:
        state = self._state
        now = state.wall_now()
        deadline = state.record.deadline
        state.run_budget = DeadlineBudget(
            "run", max(0.0, (deadline if deadline is not None else now) - now), state.now
        )
        # Started once the run budget is the record's: it reads that deadline.
        self._nursery.start_soon(self._watch_worker)
        past_deadline = False
        try:
            with state.run_budget.arm() as scope:
                self._worker = scope
                past_deadline = state.stop_reason is None and await self._turns_until_stop(
                    first_turn, failed
                )
            if (
                (past_deadline or state.run_budget.timed_out())
                and state.stop_reason is None
                and not state.inactive
            ):
                # (a storage failure or a takeover while the worker unwound
                # past the deadline stays what the run is)
                self.stopping("deadline_exceeded")
        finally:
            self._worker = None
            self.worker_running = False
            state.watch_poke.set()
            if not state.settled.is_set():
                with trio.CancelScope(shield=True):
                    await self._settle()

    async def _turns_until_stop(self, first_turn: str | None, failed: Error | None) -> bool:
        """Run the turns; whether the kernel refused a commit as past the run
        deadline (a deadline stop too)."""
        assert self._turns is not None
        try:
            await self._turns(first_turn, failed)
        except (_StorageFailed, _Stop):
            pass
        except Error as error:
            if error.error_class is ErrorClass.RESOURCE_CONFLICT and "unsettled" in error.details:
                # The kernel refused to finish: an effect a tool left running
                # (a nested call in a task of its own) is unsettled.  The
                # settlement stops the run with that effect uncertain, never
                # a refusal escaping the host's ``async with``.
                self._state.last_error = error
            elif (
                error.error_class is not ErrorClass.TIMEOUT
                or error.details.get("boundary") != "before_store"
            ):
                raise
            else:
                # The kernel refused a commit as past the run deadline (time
                # passed in synchronous code, no checkpoint for the deadline
                # to cancel at).
                return True
        return False

    async def _watch_worker(self) -> None:
        """A worker that ignores its cancellation (a tool shielding itself, a
        blocking call in a thread that cannot be interrupted) never holds the
        settlement back: once the cleanup budget after a stop (or after the
        run deadline) is spent with the worker still running, the run
        settles without it, its effects reported uncertain.  Trio
        cannot stop such a task: the block waits for it to return, and
        whatever it commits after the settlement is refused."""
        state, lock = self._state, self._coordinator.lock
        while self.worker_running:
            state.watch_poke = poke = trio.Event()
            if self._stop_requested.is_set():
                due = state.stop_due if state.stop_due is not None else state.now()
            else:
                due = state.run_budget.deadline  # inf during a human wait
            with trio.move_on_at(due + self._options.cleanup_timeout) as timer:
                await poke.wait()
            if not timer.cancelled_caught:
                continue  # a stop, a deadline moved, or the worker done
            if lock.locked():
                # A commit in flight (bounded by commit_timeout, and shielded)
                # may be what holds the worker: wait for it to end, no longer
                # (the settlement then has what is left of its window), and
                # let the worker run once before judging it.
                with trio.move_on_after(self._options.commit_timeout):
                    await lock.acquire()
                    lock.release()
                await trio.lowlevel.checkpoint()
                if poke.is_set():
                    continue
            if state.settled.is_set() or self._settling or not self.worker_running:
                return
            if state.stop_reason is None:
                self.request_stop("deadline_exceeded")
            with trio.CancelScope(shield=True):
                await self._settle()
            return

    # -- the settlement ---------------------------------------------------------

    async def _settle(self) -> None:
        """Shielded cleanup: commit cancel/deadline and a cleanup settlement,
        publish exactly one terminal event."""
        state = self._state
        if state.settled.is_set() or self._settling:
            return  # a repeated cancel() must not start a second settlement
        self._settling = True
        try:
            if state.record.state in TERMINAL_STATES or state.inactive:
                return
            # The whole settlement fits in cleanup_timeout + commit_timeout
            # from when the stop was due, even if the worker noticed it late
            # (its own shielded commit was in flight at the deadline).
            due = state.stop_due if state.stop_due is not None else state.now()
            commit_by = due + self._options.cleanup_timeout + self._options.commit_timeout
            with trio.CancelScope(shield=True):
                state.resource_cleanup = await self._state.owned.close()
                if not await self._take_coordinator(commit_by):
                    await self._missed()
                    return
                try:
                    committed = await self._commit(commit_by)
                finally:
                    self._coordinator.lock.release()
            if committed and state.record.state in TERMINAL_STATES:
                state.phase = Phase.TERMINAL
                self._publisher.publish(
                    "run_cancelled",
                    {"outcome": state.record.outcome, "state": state.record.state},
                )
        finally:
            state.settled.set()

    async def _take_coordinator(self, commit_by: float) -> bool:
        """Take the commit coordinator for the settlement, by ``commit_by``:
        a commit in flight ends within its own commit_timeout, and the
        settlement then commits in what is left of its window."""
        lock = self._coordinator.lock
        try:
            lock.acquire_nowait()
            return True
        except trio.WouldBlock:
            pass
        with trio.move_on_at(commit_by):
            await lock.acquire()
            return True
        return False

    async def _commit(self, commit_by: float) -> bool:
        """Commit the settlement, holding the coordinator; whether it was
        committed (a commit in flight may have ended the run meanwhile, or
        the store failed: the conversation's state says which)."""
        state = self._state
        if state.record.state in TERMINAL_STATES or state.inactive:
            return False  # the commit in flight ended the run
        # Decided from the record as the commit in flight left it (an
        # admission landing after cancel() was accepted).
        steps = self._steps(state.stop_reason or "cancelled")
        if commit_by <= state.now():
            # Noticed after its whole window (time passed in synchronous
            # code, no checkpoint for the deadline): the store still gets its
            # commit_timeout.  A commit given no time is no storage failure.
            commit_by = state.now() + self._options.commit_timeout
        try:
            await self._coordinator.commit_locked(steps, commit_by=commit_by)
        except _StorageFailed:
            return False
        return True

    async def _missed(self) -> None:
        """A commit in flight held the coordinator past the settlement's whole
        window.  Its outcome comes within its own commit_timeout: a failure is
        the conversation's state (storage_failed); otherwise the window for
        the settlement is gone, the stored run is not terminal and nobody
        drives it any more."""
        state = self._state
        async with self._coordinator.lock:
            pass
        if not state.inactive:
            state.phase = Phase.RECOVERY_REQUIRED
            state.last_error = Error(
                ErrorClass.TIMEOUT,
                "the run did not settle within cleanup_timeout",
                {"recovery_required": True},
            )
            self._publisher.hub.finish()  # no event will come

    def _steps(self, reason: str) -> list[Step]:
        """The stop, the suspended queues and the cleanup settlement as one
        commit: a slow store spends commit_timeout once, and a settlement is
        never cut between its stop and its cleanup (it would leave the run
        cancelling with no terminal event).  The queues are suspended by a
        checkpoint while the run is still running (a conversation checkpoint
        applies in ``running`` only); a run never admitted has no
        queue to suspend."""
        record = self._state.record
        steps: list[Step] = []
        if record.state == "running":
            steps.append(
                checkpoint_step(
                    lambda c: attrs.evolve(c, queue_status="suspended", pending_interaction=None)
                )
            )
        if record.state != "cancelling":
            stop = DeadlineExceeded if reason == "deadline_exceeded" else Cancel
            steps.append(command_step(stop, {"reason": reason}))
        uncertain = self._uncertain_work() + list(self._state.resource_cleanup.evidence)

        def settlement(record: RunRecord, now: float) -> KernelCommand:
            if uncertain:
                return CleanupSettled(at=now, certainty="uncertain", evidence=uncertain)
            requirements = thaw(record.cleanup_required or {})
            return CleanupSettled(at=now, certainty="confirmed", settled=requirements)

        steps.append(Step(settlement))
        return steps

    def _uncertain_work(self) -> list[dict[str, Any]]:
        """Evidence for every effect that may have happened (rule 4)."""
        state = self._state
        evidence: list[dict[str, Any]] = []
        active = state.record.active_provider
        # an attempt whose intent committed as the stop came was never
        # dispatched (``attempt_id`` is set only once it is): nothing happened
        if active is not None and active["attempt_id"] == state.attempt_id:
            evidence.append(
                {
                    "effect": f"provider:{active['attempt_id']}",
                    "reason": "provider attempt interrupted",
                }
            )
        for invocation_id in sorted(state.record.active_tools):
            if invocation_id in state.unsettled or state.stop_reason == "uncertain":
                evidence.append(
                    {
                        "effect": f"tool:{invocation_id}",
                        "reason": state.unsettled.get(invocation_id, "tool outcome unknown"),
                    }
                )
        return evidence

    async def close(self) -> None:
        """Leaving the block: cancel an active run and wait for its settlement,
        bounded by ``cleanup_timeout`` + ``commit_timeout``."""
        state = self._state
        if not state.settled.is_set() and state.record.state not in TERMINAL_STATES:
            if not state.inactive:
                self.request_stop(state.stop_reason or "cancelled")
            with trio.move_on_after(
                self._options.cleanup_timeout + 2 * self._options.commit_timeout
            ):
                await state.settled.wait()
        self._publisher.hub.close()
