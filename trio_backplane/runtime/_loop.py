"""The turn loop: provider attempts, sequential tool batches, the boundary
after each batch (publication, steering, the stop hook), and the end of a
turn and of the run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import Cancel, CleanupSettled, Finish, KernelCommand, RunRecord, freeze, thaw
from ._catalog import CatalogState
from ._conversation_state import ConversationState, QueueName
from ._coordinator import Coordinator
from ._gateway import ToolGateway
from ._hooks import HookRunner
from ._responses import Responses
from ._resume import ResumePoint
from ._signals import _InputArrived, _Rejected, _TurnFailed
from ._state import Publisher, RunState
from ._steps import Step, checkpoint_step, command_step
from ._types import Phase
from ._writer import StepWriter

__all__ = ["TurnLoop"]


@final
class TurnLoop:
    """Drives one conversation's turns until none is queued, then finishes
    the run."""

    __slots__ = (
        "_catalog",
        "_coordinator",
        "_gateway",
        "_hooks",
        "_publisher",
        "_responses",
        "_state",
        "_writer",
    )

    def __init__(
        self,
        state: RunState,
        coordinator: Coordinator,
        writer: StepWriter,
        publisher: Publisher,
        catalog: CatalogState,
        *,
        responses: Responses,
        gateway: ToolGateway,
        hooks: HookRunner,
    ) -> None:
        self._state = state
        self._coordinator = coordinator
        self._writer = writer
        self._publisher = publisher
        self._catalog = catalog
        self._responses = responses
        self._gateway = gateway
        self._hooks = hooks

    async def run(self, first_turn: str | None, failed: Error | None) -> None:
        """Turns until none is queued, then ``finish``.  The steps that end a
        turn or the run are decided against the queues as committed (the
        host's input may commit between the worker's last look and them):
        steering that arrived before its turn's outcome is consumed by that
        turn, and any input queued before ``finish`` starts another turn, so
        acknowledged input is never dropped."""
        state = self._state
        resume, state.resume = state.resume, None
        if resume is not None:  # a resumed run: its turn goes on, or its end
            first_turn, failed = resume.turn_id, resume.failed
        turn_id = first_turn or state.new_id("turn")
        error = failed
        steered = False
        ended = resume is not None and resume.turn_ended
        recorder = state.telemetry
        while True:
            if not ended:
                if recorder is not None:
                    recorder.turn_started(turn_id)
                if error is None:
                    error = await self._turn(turn_id, steering_first=steered, resume=resume)
                    resume = None
                try:
                    await self._record_turn(turn_id, error)
                except _InputArrived:
                    steered = True  # steering came as the turn ended: it goes on
                    continue
                if recorder is not None:
                    recorder.turn_ended(turn_id, error)
            steered = ended = False
            # The turn is over: its provider step is not current any more
            state.step_id = state.attempt_id = None
            while (follow := await self._next_follow_up()) is None:
                try:
                    await self._finish(turn_id, error)
                except _InputArrived:
                    continue  # input came as the run was finishing: take it
                return
            turn_id, error = follow

    async def _record_turn(self, turn_id: str, error: Error | None) -> None:
        await self._writer.flush()
        outcome = _outcome(turn_id, error)

        def record(conversation: ConversationState) -> ConversationState:
            if error is None and conversation.steering:
                raise _InputArrived
            # The turn record names its turn: a turn whose prompt was rejected
            # before any checkpoint still reports its own turn_id on its
            # events.
            return attrs.evolve(conversation, last_turn=freeze(outcome), turn_id=turn_id)

        await self._coordinator.checkpoint(record)
        self._publisher.publish(
            "turn_failed" if error else "turn_completed",
            {"turn_id": turn_id, "outcome": outcome, "error": outcome["error"]},
        )

    async def _next_follow_up(self) -> tuple[str, Error | None] | None:
        """The next queued follow-up as a new turn; once none is left, steering
        its turn never consumed (it committed after that turn's outcome)."""
        conversation = self._state.conversation
        queue_name: QueueName = "follow_up" if conversation.follow_up else "steering"
        queue = conversation.follow_up or conversation.steering
        if not queue:
            return None
        message = thaw(queue[0])
        turn_id = self._state.new_id("turn")
        checkpoint = self._coordinator.checkpoint
        try:
            message = await self._hooks.prompt(message, "new", turn_id)
        except _Rejected as rejected:
            await checkpoint(lambda c: attrs.evolve(c.without_first(queue_name), turn_id=turn_id))
            return turn_id, rejected.error
        await checkpoint(
            lambda c: attrs.evolve(
                c.without_first(queue_name).with_message(message), turn_id=turn_id
            )
        )
        self._publisher.publish(
            "prompt_consumed", {"mode": "new", "message": message, "turn_id": turn_id}
        )
        return turn_id, None

    async def _finish(self, turn_id: str, error: Error | None) -> None:
        state = self._state
        outcome = _outcome(turn_id, error)
        frozen = freeze(outcome)

        def finish(record: RunRecord, now: float) -> KernelCommand:
            conversation = ConversationState.of(record)
            if conversation.follow_up or conversation.steering:
                raise _InputArrived
            return Finish(at=now, status=frozen["status"], outcome=frozen)

        cleanup = await state.owned.close()
        state.resource_cleanup = cleanup
        if cleanup.status == "uncertain":
            # what the run owned may still be running: never a confirmed end
            await self._coordinator.commit_steps(_unconfirmed(cleanup.evidence))
            outcome = thaw(state.record.outcome)
            error = error or Error(ErrorClass.UNKNOWN_OUTCOME, "resource cleanup is unconfirmed")
        else:
            await self._coordinator.commit_steps((Step(finish),))
        state.phase = Phase.TERMINAL
        if error is not None:
            state.last_error = error  # a failed run's snapshot says why
        self._publisher.publish("run_failed" if error else "run_completed", {"outcome": outcome})
        state.settled.set()

    async def _turn(
        self, turn_id: str, *, steering_first: bool = False, resume: ResumePoint | None = None
    ) -> Error | None:
        """One turn; ``resume``: a resumed run's turn, going on from its
        committed response (its calls that ran nothing) or a new attempt."""
        try:
            if steering_first:  # the turn goes on with the steering that came at its end
                await self._consume_steering(turn_id)
            after_batch = False
            response: Step | None
            while True:
                try:
                    if resume is not None and resume.message is not None:
                        message, calls, response = resume.message, list(resume.calls), None
                    else:
                        message, calls, response = await self._responses.attempt(
                            turn_id, yield_to_steering=after_batch
                        )
                    resume = None
                except _InputArrived:
                    # steering committed while the batch's results waited to
                    # be: it goes before the next attempt (one per boundary)
                    await self._consume_steering(turn_id)
                    after_batch = False
                    continue
                await self._batch(calls, response, turn_id)
                steered = await self._consume_steering(turn_id)
                # the boundary found no steering: one committed before the
                # next attempt's intent still counts as at this boundary
                after_batch = bool(calls) and not steered
                if calls or steered:
                    continue
                if await self._stop_hook(turn_id, message):
                    return None
        except _TurnFailed as failed:
            # The batch never reached its boundary: a staging it left is
            # never published, and its receipt goes.
            self._catalog.discard()
            return failed.error

    async def _batch(
        self, calls: list[dict[str, Any]], response: Step | None, turn_id: str
    ) -> None:
        """The response's calls, one at a time through the gateway (the
        response committed with the first one's intent), then the boundary's
        publication."""
        ids = [call["id"] for call in calls]
        completion: Step | None = response
        if not calls or len(set(ids)) != len(ids):
            await self._writer.flush(response)
            if calls:
                raise _TurnFailed(Error(ErrorClass.VALIDATION, "duplicate tool call id"))
            completion = None
        last = len(calls) - 1
        for index, call in enumerate(calls):
            await self._gateway.call(call, turn_id, before=completion, carry=index == last)
            completion = None
        await self._publish_catalog()

    async def _publish_catalog(self) -> None:
        """The boundary after a tool batch: an eligible staging takes effect
        before steering, hooks or the next provider attempt."""
        catalog, publisher, writer = self._catalog, self._publisher, self._writer
        if catalog.staged is not None and writer.carry:
            # the staging waits for its producer's result to be committed
            await writer.flush(projection=True)
        revision = catalog.begin_publish()
        if revision is None:
            return

        def published() -> None:
            catalog.publish()
            publisher.publish("catalog_published", {"catalog_revision": revision})

        step = checkpoint_step(
            lambda c: attrs.evolve(c, catalog_revision=revision), after=published
        )
        try:
            await writer.flush(step)
        except BaseException:
            catalog.abort_publish()  # not committed: the staging is discarded
            raise

    async def _consume_steering(self, turn_id: str) -> bool:
        queue = self._state.held().steering
        if not queue:
            return False
        await self._writer.flush()
        message = thaw(queue[0])
        checkpoint = self._coordinator.checkpoint
        try:
            message = await self._hooks.prompt(message, "steering", turn_id)
        except _Rejected as rejected:
            await checkpoint(lambda c: c.without_first("steering"))
            raise _TurnFailed(rejected.error) from None
        await checkpoint(lambda c: c.without_first("steering").with_message(message))
        self._publisher.publish(
            "prompt_consumed", {"mode": "steering", "message": message, "turn_id": turn_id}
        )
        return True

    async def _stop_hook(self, turn_id: str, message: Mapping[str, Any]) -> bool:
        """Whether the turn ends: the stop hook's verdict; a ``Continue``
        appends its message to the transcript and the turn goes on."""
        try:
            content = await self._hooks.stop(turn_id, message)
        except Error as error:
            raise _TurnFailed(error) from None
        if content is None:
            return True
        user = self._state.user_message(content)
        await self._coordinator.checkpoint(lambda c: c.with_message(user))
        return False


def _outcome(turn_id: Any, error: Error | None) -> dict[str, Any]:
    return {
        "turn_id": turn_id,
        "status": "failed" if error else "completed",
        "error": None if error is None else error.to_dict(),
    }


def _unconfirmed(evidence: tuple[Any, ...]) -> tuple[Step, ...]:
    """A finished turn whose resources are not confirmed released: the run
    stops (``resource_cleanup_uncertain``) and settles ``unknown_outcome``."""
    frozen = freeze(list(evidence))
    return (
        command_step(Cancel, {"reason": "resource_cleanup_uncertain"}),
        Step(lambda record, now: CleanupSettled(at=now, certainty="uncertain", evidence=frozen)),
    )
