"""Human interactions: commit, suspend the waiting effect's deadlines, resume.

While a person answers, the run deadline and every armed effect deadline
(outer tool, nested tool) are suspended; commit and cleanup deadlines keep
running (rule 5).  The answer reaches the waiting effect only after the
resolution checkpoint commits, and that checkpoint moves the stored run
deadline later by exactly the time waited.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..kernel import freeze, thaw
from ._conversation_state import ConversationState
from ._coordinator import Coordinator
from ._resume import same_call
from ._signals import _Stop, _StorageFailed
from ._state import Pending, Publisher, RunState
from ._types import Phase

__all__ = ["Interactions"]


def _not_found(interaction_id: Any) -> Error:
    return Error(
        ErrorClass.NOT_FOUND, "no such pending interaction", {"interaction_id": interaction_id}
    )


def _asks_again(stored: Mapping[str, Any], request: Any) -> bool:
    """Whether ``request`` is the permission a resumed run's stored
    interaction asked for: the same tool call, with the same arguments."""
    old = stored.get("request")
    if not isinstance(old, Mapping) or type(stored.get("id")) is not str:
        return False
    operation = request.get("operation")
    if not isinstance(operation, Mapping) or not same_call(old, operation.get("tool_call_id")):
        return False
    return bool(old["operation"].get("arguments_digest") == operation.get("arguments_digest"))


def _overlap() -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, "stale or overlapping interaction")


@final
class Interactions:
    """The conversation's human interactions: at most one open at a time."""

    __slots__ = ("_coordinator", "_publisher", "_state")

    def __init__(self, state: RunState, coordinator: Coordinator, publisher: Publisher) -> None:
        self._state = state
        self._coordinator = coordinator
        self._publisher = publisher

    async def wait(self, request: Any) -> tuple[Any, float]:
        """Open an interaction and wait for its answer: ``(answer, seconds waited)``.

        Raises ``trio.Cancelled`` when the run is cancelled meanwhile.
        """
        state = self._state
        if not isinstance(request, Mapping):
            raise Error(ErrorClass.VALIDATION, "an interaction request must be a mapping")
        if state.pending is not None:
            raise _overlap()
        if state.stop_reason is not None:
            # The run is stopping: nobody will answer (and resolve() refuses).
            raise _Stop
        request = freeze(request, "interaction request")
        reopened, state.reopened = state.reopened, None
        if reopened is not None and _asks_again(reopened, request):
            if "answer" in reopened:
                # answered and committed before its host stopped: the call
                # it approves never started
                return thaw(reopened["answer"]), 0.0
            interaction_id = str(reopened["id"])
        else:
            interaction_id = state.new_id("interaction")
        pending = Pending(interaction_id, request, state.now())
        state.pending = pending
        if state.phase == Phase.RUNNING:
            state.phase = Phase.WAITING_INTERACTION
        try:
            await self._announce(pending)
            return await self._answer(pending)
        finally:
            await self._wait_ended(pending)

    async def _announce(self, pending: Pending) -> None:
        """Commit the pending interaction, then suspend the deadlines and tell
        the host: never after a stop that won while it committed (``_Stop``)."""
        state = self._state
        # The run's remaining budget, which the wait freezes, stored with the
        # wall-clock instant it was read at: another process inspecting the
        # waiting run knows how much of the run is left.
        deadline = state.record.deadline
        requested_at = state.wall_now()
        remaining = None if deadline is None else max(0.0, deadline - requested_at)
        entry = {
            "id": pending.interaction_id,
            "request": pending.request,
            "requested_at": requested_at,
            "remaining": remaining,
        }
        await self._coordinator.checkpoint(
            lambda conversation: attrs.evolve(conversation, pending_interaction=freeze(entry))
        )
        pending.stored = True
        # The deadlines keep running while the pending checkpoint commits: an
        # acknowledgement cannot revive an interaction after a cancellation or a
        # deadline won meanwhile.
        await trio.lowlevel.checkpoint_if_cancelled()
        if state.stop_reason is not None or state.pending is not pending:
            # A stop won while the request committed: never announced, never
            # answered (the wait's end withdraws it).
            raise _Stop
        state.suspend_deadlines()
        pending.started = state.now()
        pending.base_deadline = state.record.deadline
        pending.announced = True
        recorder = state.telemetry
        if recorder is not None:
            caller = state.executing[-1] if state.executing else None
            turn_id = state.held().turn_id
            recorder.wait_started(pending.interaction_id, pending.request, caller, turn_id)
        self._publisher.publish(
            "interaction_requested",
            {"interaction_id": pending.interaction_id, "request": pending.request},
        )

    async def _answer(self, pending: Pending) -> tuple[Any, float]:
        """Wait for the committed answer: ``(answer, seconds waited)``."""
        state = self._state
        with trio.CancelScope() as pending.waiter:
            await pending.delivered.wait()
        if pending.waiter.cancelled_caught:
            # The run stopped: nobody will answer.  In the worker, its own
            # cancellation is what the effect sees.
            await trio.lowlevel.checkpoint_if_cancelled()
            raise _Stop
        # A cancellation accepted after the answer was committed but before this
        # task ran again wins: the answer never reaches the effect.
        await trio.lowlevel.checkpoint_if_cancelled()
        answered_at = pending.answered_at if pending.answered_at is not None else state.now()
        return pending.answer, max(0.0, answered_at - pending.started)

    async def _wait_ended(self, pending: Pending) -> None:
        """The effect stopped waiting, answered or not: resume the deadlines, and
        withdraw an interaction given up without an answer."""
        state = self._state
        if state.pending is pending:
            state.pending = None
        if state.phase == Phase.WAITING_INTERACTION:
            state.phase = Phase.RUNNING
        pending.ended_at = state.now()
        suspended = pending.announced
        if suspended and state.telemetry is not None:
            state.telemetry.wait_ended(pending.interaction_id, pending.delivered.is_set())
        if suspended:
            # The wait ended when ``resolve`` measured it (the stored deadline
            # moved by exactly that); the resolution commit after it counts
            # against the budgets, as commits do (rule 5).
            ended = pending.answered_at
            if ended is not None:  # never before the wait began
                ended = max(ended, pending.started)
                pending.ended_at = ended
            state.resume_deadlines(at=ended)
        if pending.stored and not pending.resolving and state.stop_reason is None:
            # Given up without an answer (the waiting effect was cut, or ended):
            # the stored record must not keep it pending, and the stored
            # deadline moves by the time waited, as the resumed budget did.
            await self._withdraw(pending, suspended)

    async def _withdraw(self, pending: Pending, suspended: bool) -> None:
        """Commit that ``pending`` is no longer open; a commit failure is the
        coordinator's to report (storage_failed), never the effect'state."""
        state = self._state

        extra: dict[str, Any] = {}
        moved = pending.moved_deadline(pending.ended_at or state.now()) if suspended else None
        if moved is not None:
            extra["execution_deadline"] = moved

        def cleared(state: ConversationState) -> ConversationState:
            current = state.pending_interaction
            if current is not None and current.get("id") == pending.interaction_id:
                return attrs.evolve(state, pending_interaction=None)
            return state

        # A failed commit leaves the conversation storage_failed, and a settled
        # run cleared it already: nothing else to do either way.
        with trio.CancelScope(shield=True), contextlib.suppress(_StorageFailed, _Stop, Error):
            await self._coordinator.checkpoint(cleared, extra)

    async def resolve(self, interaction_id: Any, answer: Any) -> None:
        """The host's answer: committed, then delivered."""
        state = self._state
        pending = self._answerable(interaction_id)
        answered = freeze(answer, "interaction answer")  # JSON data only: it is committed
        pending.resolving = True
        pending.answered_at = state.now()
        extra: dict[str, Any] = {}
        moved = pending.moved_deadline(pending.answered_at)
        if moved is not None:
            extra["execution_deadline"] = moved

        try:
            # The answer is durable before the worker goes on (spec 002): after a
            # crash the record says which interaction was answered, and how.
            # With its request: a run resumed before the call it approves
            # started goes on with this answer.
            resolved = freeze(
                {
                    "interaction_id": pending.interaction_id,
                    "answer": answered,
                    "request": pending.request,
                }
            )
            await self._coordinator.checkpoint(
                lambda conversation: attrs.evolve(
                    conversation, pending_interaction=None, resolved_interaction=resolved
                ),
                extra,
            )
        except _StorageFailed as failed:
            raise failed.error from None
        except _Stop:
            # The run settled meanwhile: the interaction went with it.
            pending.resolving = False
            pending.answered_at = None
            raise _not_found(interaction_id) from None
        except BaseException:
            # Not committed (the caller was cancelled before the commit, or the
            # kernel refused it): the interaction is still open, and a retry of
            # this resolve must find it -- unless its effect stopped
            # waiting meanwhile (it left the withdrawal to this answer): then it
            # is withdrawn here, its deadline moved by the wait it had.
            pending.resolving = False
            pending.answered_at = None
            if pending.ended_at is not None and state.stop_reason is None:
                await self._withdraw(pending, pending.announced)
            raise
        if state.stop_reason is not None:
            raise Error(ErrorClass.CANCELLED, "the run was cancelled")
        pending.answer = thaw(answered)  # the committed answer, the effect's own copy
        pending.delivered.set()
        self._publisher.publish("interaction_resolved", {"interaction_id": pending.interaction_id})

    def _answerable(self, interaction_id: Any) -> Pending:
        """The announced interaction ``interaction_id`` names, not being
        answered already, in a run not stopping."""
        state = self._state
        pending = state.pending
        if (
            pending is None
            or pending.interaction_id != interaction_id
            or pending.resolving
            or not pending.announced  # not requested yet: its checkpoint still commits
        ):
            raise _not_found(interaction_id)
        if state.stop_reason is not None:
            raise Error(ErrorClass.CANCELLED, "the run was cancelled")
        return pending
