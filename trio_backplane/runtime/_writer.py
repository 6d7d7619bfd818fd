"""The worker's commits: decided steps that wait for the next write (the
carry), and the commits that start an effect.

Commits that may share one durable write do: a provider response with the
first tool intent of its batch; a tool's result with its transcript
message; and the last result and message of a batch with the next provider
attempt.  Nothing is observable in between (no await, no event), and a step
the kernel refuses leaves the ones before it committed alone, so the stored
history is what committing them one by one would give: a result is durable
no later than the message showing it, and both before the next effect
starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import KernelCommand, RunRecord
from ._conversation_state import ConversationState
from ._coordinator import Coordinator
from ._signals import _InputArrived, _Stop, _TurnFailed
from ._state import RunState
from ._steps import Step, command_step
from ._types import Phase

__all__ = ["StepWriter"]


@final
class StepWriter:
    """Commits the worker's steps through the coordinator."""

    __slots__ = ("_coordinator", "_state", "_stop", "carry")

    def __init__(
        self, state: RunState, coordinator: Coordinator, stop: Callable[[str], None]
    ) -> None:
        """``stop``: request a stop of the run with a reason."""
        self._state = state
        self._coordinator = coordinator
        self._stop = stop
        #: the batch's last result and tool message, decided but not yet written
        self.carry: tuple[Step, ...] = ()

    def pending(self, *steps: Step | None) -> list[Step]:
        """The carried step and ``steps``, in commit order; the carry is taken."""
        pending = [*self.carry, *(step for step in steps if step is not None)]
        self.carry = ()
        return pending

    async def flush(self, *steps: Step | None, projection: bool = False) -> None:
        """Commit the decided ``steps`` (and the carried one) now;
        ``projection``: they are all projections of committed results."""
        pending = self.pending(*steps)
        if pending:
            if projection:
                await self.commit_projection(pending)
            else:
                await self._coordinator.commit_steps(pending)

    async def commit_projection(self, pending: list[Step]) -> None:
        """Commit tool messages, the projections of results already
        committed: a stop of the run does not undo a result, so when it cuts
        their commit before it starts, they are committed shielded (bounded
        by commit_timeout all the same): the transcript answers every call
        whose result is stored, and a run continued from it never
        sees a completed call as unanswered."""
        try:
            await self._coordinator.commit_steps(pending)
        except trio.Cancelled:
            if self._state.stop_reason is not None:
                with trio.CancelScope(shield=True):
                    await self._coordinator.commit_steps(pending)
            raise

    async def effect_commit(
        self,
        command: type[KernelCommand],
        fields: Mapping[str, Any],
        before: Step | None = None,
        *,
        unless_stopped: bool = False,
        yield_to_steering: bool = False,
    ) -> RunRecord:
        """Commit the intent of an effect, in one write with the decided steps
        (``before``, the carried one) that precede it; a kernel refusal fails
        the turn, an expired deadline stops the run.
        ``unless_stopped``: never once the run stops, however long the commit
        waits for the coordinator (``_Stop`` then).
        ``yield_to_steering``: refused with ``_InputArrived`` (the steps
        before it committed) when steering is queued by the time it lands."""
        state = self._state
        pending = self.pending(before)
        if state.stop_reason is not None:
            if pending and before is None:  # the carried projection
                await self.commit_projection(pending)
            elif pending:
                await self._coordinator.commit_steps(pending)
            raise _Stop
        intent = command_step(command, fields)
        if yield_to_steering:
            intent = Step(_unless_steered(intent.build, state))
        try:
            record = await self._coordinator.commit_steps(
                (*pending, intent), as_input=unless_stopped
            )
        except Error as error:
            if unless_stopped and state.stop_reason is not None:
                raise _Stop from None  # refused: the run stopped meanwhile
            if error.error_class is ErrorClass.TIMEOUT:
                self.missed_deadline(pending)
                raise _Stop from None
            raise _TurnFailed(error) from None
        if state.stop_reason is not None:
            raise _Stop  # a cancellation raced the intent commit: never dispatch
        # The run deadline may have expired while the (shielded) commit was in
        # flight: never start the effect after it.
        await trio.lowlevel.checkpoint_if_cancelled()
        return record

    def missed_deadline(self, steps: Sequence[Step]) -> None:
        """The kernel refused to commit ``steps`` as past the run deadline: the
        run stops, and a result among them stays unsettled evidence, saying
        why."""
        unsettled = self._state.unsettled
        for step in steps:
            if step.settles is not None and step.settles in unsettled:
                unsettled[step.settles] = "result not committed before the deadline"
        self._stop("deadline_exceeded")

    def stop(self, reason: str) -> None:
        """Request a stop of the run (``"deadline_exceeded"``, ...)."""
        self._stop(reason)

    def stop_uncertain(self, error: Error) -> None:
        """An effect's outcome is unknown: the run stops ``unknown_outcome``
        with ``error`` as its last error."""
        state = self._state
        if state.phase not in (Phase.RECOVERY_REQUIRED, Phase.STORAGE_FAILED):
            # A takeover or a storage failure that caused this keeps its own
            # error: it is what the host must act on.
            state.last_error = error
        self._stop("uncertain")

    def uncertain(self, error: Error) -> NoReturn:
        """``stop_uncertain``, then end the worker's turn (``_Stop``)."""
        self.stop_uncertain(error)
        raise _Stop


def _unless_steered(
    build: Callable[[RunRecord, float], KernelCommand], state: RunState
) -> Callable[[RunRecord, float], KernelCommand]:
    """``build``, refused with ``_InputArrived`` when the record it lands on
    has steering queued (read from ``state``'s conversation when it holds the
    same conversation mapping)."""

    def guarded(record: RunRecord, now: float) -> KernelCommand:
        held = state.held()
        if record.context.get("conversation") is not held.source:
            held = ConversationState.of(record)
        if held.steering:
            raise _InputArrived
        return build(record, now)

    return guarded
