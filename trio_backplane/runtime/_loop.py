"""The turn loop: provider attempts and sequential tool batches."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import Error, ErrorClass, exception_leaves
from ..kernel import (
    Command,
    FrozenList,
    RunRecord,
    appended,
    freeze,
    loads,
    thaw,
    utf8_size,
)
from ..schema import CompiledSchema, compile_with
from ..tools import (
    Approval,
    ApprovalDecision,
    Invocation,
    Rejection,
    ToolDescriptor,
    ToolResult,
    arguments_digest,
    authorize,
    decide_approval,
    settlement,
)
from ._attempt import AttemptOutcome, ResponseAssembler
from ._context import ToolContext, ToolOperation
from ._deadline import DeadlineBudget
from ._input import check_content
from ._interactions import HOST_RESOLVER, wait_for_human
from ._provider import (
    ProviderRequest,
    ResponseCompleted,
    ResponseFailed,
)
from ._redact import redacted, scrub, secrets_of
from ._signals import _InputArrived, _Rejected, _Stop
from ._steps import Step, checkpoint_step, command_step, conversation_of
from ._types import Continue, HookContext, Phase

if TYPE_CHECKING:
    from ._conversation import Conversation

__all__ = ["TurnLoop"]


def _require_time_left(c: Conversation, descriptor: ToolDescriptor) -> None:
    """Raise ``timeout`` when the innermost executing effect (a nested call's
    caller) has no time left."""
    if c._effects and c._effects[-1].remaining() <= 0:
        raise Error(
            ErrorClass.TIMEOUT,
            "the calling tool's deadline has passed",
            {"tool": descriptor.name, "certainty": "not_dispatched"},
        )


class _CallerEnded(Exception):
    """Internal: a nested call was cut because its caller's execution ended."""


def _caller_ended(descriptor: ToolDescriptor) -> Error:
    """What a nested call's host task gets once its caller's execution ended."""
    return Error(
        ErrorClass.RESOURCE_CONFLICT,
        "the calling tool's execution ended",
        {"tool": descriptor.name},
    )


class _TurnFailed(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


def _plain(value: Any, what: str) -> Any:
    """``value`` as plain JSON data (``thaw``) for the schema boundary;
    ``validation`` when it cannot even be walked: nested past Python's
    recursion limit, or a mapping that fails when read."""
    try:
        return thaw(value)
    except RecursionError:
        raise Error(
            ErrorClass.VALIDATION, f"{what} nest too deeply", {"reason": "nesting"}
        ) from None
    except Exception as exc:
        raise Error(
            ErrorClass.VALIDATION,
            f"{what} could not be read as JSON data",
            {"cause": f"{type(exc).__name__}: {exc}"[:300]},
        ) from exc


def _error_result(error: Error) -> Mapping[str, Any]:
    """The normalized (frozen) result of a refused or failed call: JSON data
    whatever the error quotes (``Error.to_dict`` makes its text Unicode)."""
    plain = error.to_dict()
    result: Mapping[str, Any] = freeze(
        {
            "content": plain["message"],
            "structured_content": None,
            "is_error": True,
            "error": plain,
        }
    )
    return result


class TurnLoop:
    """Drives turns.  Commits that may share one durable write do: a provider
    response with the first tool intent of its batch; a tool's result with
    its transcript message; and the last result and message of a batch with
    the next provider attempt (``_carry``).  Nothing is observable in
    between (no await, no event), and a step the kernel refuses leaves the
    ones before it committed alone, so the stored history is what committing
    them one by one would give: a result is durable no later than the
    message showing it, and both before the next effect starts."""

    def __init__(self, conversation: Conversation) -> None:
        self.c = conversation
        #: The batch's last result and tool message, decided but not yet written.
        self._carry: tuple[Step, ...] = ()
        self._validators: dict[int, tuple[ToolDescriptor, CompiledSchema]] = {}

    def _validator(self, descriptor: ToolDescriptor) -> CompiledSchema:
        """The descriptor's compiled input schema, compiled once per descriptor
        object for this run (the schema object is the one admitted, CAT-08),
        so a call does not pay for fingerprinting its schema."""
        held = self._validators.get(id(descriptor))
        if held is not None and held[0] is descriptor:
            return held[1]
        compiled = compile_with(descriptor.schema, descriptor.schema_options)
        if len(self._validators) >= 1024:
            self._validators.clear()
        self._validators[id(descriptor)] = (descriptor, compiled)
        return compiled

    def _pending(self, *steps: Step | None) -> list[Step]:
        """The carried step and ``steps``, in commit order; the carry is taken."""
        pending = [*self._carry, *(step for step in steps if step is not None)]
        self._carry = ()
        return pending

    async def _flush(self, *steps: Step | None, projection: bool = False) -> None:
        """Commit the decided ``steps`` (and the carried one) now;
        ``projection``: they are all projections of committed results."""
        pending = self._pending(*steps)
        if pending:
            if projection:
                await self._commit_projection(pending)
            else:
                await self.c._commit_steps(pending)

    async def _commit_projection(self, pending: list[Step]) -> None:
        """Commit tool messages, the projections of results already
        committed: a stop of the run does not undo a result, so when it cuts
        their commit before it starts, they are committed shielded (bounded
        by commit_timeout all the same): the transcript answers every call
        whose result is stored (TOOL-25), and a run continued from it never
        sees a completed call as unanswered."""
        c = self.c
        try:
            await c._commit_steps(pending)
        except trio.Cancelled:
            if c._stop_reason is not None:
                with trio.CancelScope(shield=True):
                    await c._commit_steps(pending)
            raise

    # -- turns ----------------------------------------------------------------

    async def run(self, first_turn: str | None, failed: Error | None) -> None:
        """Turns until none is queued, then ``finish``.  The steps that end a
        turn or the run are decided against the queues as committed (the
        host's input may commit between the worker's last look and them):
        steering that arrived before its turn's outcome is consumed by that
        turn, and any input queued before ``finish`` starts another turn, so
        acknowledged input is never dropped (CONV-27)."""
        c = self.c
        turn_id = first_turn or c._new_id("turn")
        error = failed
        steered = False
        while True:
            if error is None:
                error = await self._turn(turn_id, steering_first=steered)
            try:
                await self._record_turn(turn_id, error)
            except _InputArrived:
                steered = True  # steering came as the turn ended: it goes on
                continue
            steered = False
            # The turn is over: its provider step is not current any more (CONV-26)
            c._step_id = c._attempt_id = None
            while (follow := await self._next_follow_up()) is None:
                try:
                    await self._finish(turn_id, error)
                except _InputArrived:
                    continue  # input came as the run was finishing: take it
                return
            turn_id, error = follow

    async def _record_turn(self, turn_id: str, error: Error | None) -> None:
        await self._flush()
        outcome = {
            "turn_id": turn_id,
            "status": "failed" if error else "completed",
            "error": None if error is None else error.to_dict(),
        }

        def record(state: dict[str, Any]) -> dict[str, Any]:
            if error is None and state.get("steering"):
                raise _InputArrived
            # The turn record names its turn: a turn whose prompt was rejected
            # before any checkpoint still reports its own turn_id on its
            # events (CONV-26).
            return {**state, "last_turn": outcome, "turn_id": turn_id}

        await self.c._checkpoint(record)
        self.c._publish(
            "turn_failed" if error else "turn_completed",
            {"turn_id": turn_id, "outcome": outcome, "error": outcome["error"]},
        )

    async def _next_follow_up(self) -> tuple[str, Error | None] | None:
        """The next queued follow-up as a new turn; once none is left, steering
        its turn never consumed (it committed after that turn's outcome)."""
        c = self.c
        state = c._conversation_state()
        queue_name = "follow_up" if state.get("follow_up") else "steering"
        queue = state.get(queue_name, ())
        if not queue:
            return None
        message = thaw(queue[0])
        turn_id = c._new_id("turn")
        try:
            message = await c._prompt_hook(message, "new", turn_id)
        except _Rejected as rejected:
            await c._checkpoint(
                lambda s: {**s, queue_name: FrozenList(s[queue_name][1:]), "turn_id": turn_id}
            )
            return turn_id, rejected.error
        await c._checkpoint(
            lambda s: {
                **s,
                queue_name: FrozenList(s[queue_name][1:]),
                "messages": appended(s["messages"], message),
                "turn_id": turn_id,
            }
        )
        c._publish("prompt_consumed", {"mode": "new", "message": message, "turn_id": turn_id})
        return turn_id, None

    async def _finish(self, turn_id: str, error: Error | None) -> None:
        c = self.c
        status = "failed" if error else "completed"
        outcome = {
            "turn_id": turn_id,
            "status": status,
            "error": None if error is None else error.to_dict(),
        }
        data = freeze({"status": status, "outcome": outcome})

        def finish(record: RunRecord, now: float) -> Command:
            state = conversation_of(record)
            if state.get("follow_up") or state.get("steering"):
                raise _InputArrived
            return Command("finish", now, data)

        await c._commit_steps((Step(finish),))
        c._phase = Phase.TERMINAL
        c._resource_cleanup = attrs.evolve(c._resource_cleanup, status="confirmed")
        c._publish("run_failed" if error else "run_completed", {"outcome": outcome})
        c._settled.set()

    async def _turn(self, turn_id: str, *, steering_first: bool = False) -> Error | None:
        try:
            if steering_first:  # the turn goes on with the steering that came at its end
                await self._consume_steering(turn_id)
            after_batch = False
            while True:
                try:
                    message, calls, response = await self._provider_attempt(
                        turn_id, yield_to_steering=after_batch
                    )
                except _InputArrived:
                    # steering committed while the batch's results waited to
                    # be: it goes before the next attempt (one per boundary)
                    await self._consume_steering(turn_id)
                    after_batch = False
                    continue
                completion = await self._batch_start(calls, response)
                last = len(calls) - 1
                for index, call in enumerate(calls):
                    await self._gateway(call, turn_id, before=completion, carry=index == last)
                    completion = None
                await self._publish_catalog()
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
            # never published, and its receipt goes (PUB-09).
            self.c._catalog.discard()
            return failed.error

    async def _batch_start(self, calls: list[dict[str, Any]], response: Step) -> Step | None:
        """The response step, to commit with the first intent of ``calls``; it
        is committed at once when there is no batch to run."""
        ids = [call["id"] for call in calls]
        if calls and len(set(ids)) == len(ids):
            return response
        await self._flush(response)
        if calls:
            raise _TurnFailed(Error(ErrorClass.VALIDATION, "duplicate tool call id"))
        return None

    async def _publish_catalog(self) -> None:
        """The boundary after a tool batch: an eligible staging takes effect
        before steering, hooks or the next provider attempt (PUB-03, EVT-14)."""
        c = self.c
        if c._catalog.staged is not None and self._carry:
            # the staging waits for its producer's result to be committed
            await self._flush(projection=True)
        revision = c._catalog.begin_publish()
        if revision is None:
            return

        def published() -> None:
            c._catalog.publish()
            c._publish("catalog_published", {"catalog_revision": revision})

        step = checkpoint_step(lambda s: {**s, "catalog_revision": revision}, after=published)
        try:
            await self._flush(step)
        except BaseException:
            c._catalog.abort_publish()  # not committed: the staging is discarded (PUB-09)
            raise

    async def _consume_steering(self, turn_id: str) -> bool:
        c = self.c
        queue = c._conversation_state().get("steering", ())
        if not queue:
            return False
        await self._flush()
        message = thaw(queue[0])
        try:
            message = await c._prompt_hook(message, "steering", turn_id)
        except _Rejected as rejected:
            await c._checkpoint(lambda s: {**s, "steering": FrozenList(s["steering"][1:])})
            raise _TurnFailed(rejected.error) from None
        await c._checkpoint(
            lambda s: {
                **s,
                "steering": FrozenList(s["steering"][1:]),
                "messages": appended(s["messages"], message),
            }
        )
        c._publish("prompt_consumed", {"mode": "steering", "message": message, "turn_id": turn_id})
        return True

    async def _stop_hook(self, turn_id: str, message: Mapping[str, Any]) -> bool:
        c = self.c
        hook = getattr(c._hooks, "stop", None)
        if hook is None:
            return True
        context = HookContext(c.run_id, c._record.incarnation, turn_id, "stop")
        try:
            # (a hook that ignores its cancellation and returns late has
            # timed out too, API.md)
            with trio.move_on_after(c._options.effect_timeout) as bound:
                result = await hook({"turn_id": turn_id, "message": thaw(message)}, context)
        except Error as error:
            raise _TurnFailed(error) from None
        except Exception as exc:  # a bug in the host's hook: the turn fails, classed
            raise _TurnFailed(
                Error(
                    ErrorClass.EXECUTION_FAILURE,
                    "stop hook failed",
                    {"cause": f"{type(exc).__name__}: {exc}"[:500]},
                )
            ) from None
        if bound.cancel_called:
            raise _TurnFailed(Error(ErrorClass.TIMEOUT, "stop hook timed out"))
        if type(result) is str and result == "stop":  # never a host object's __eq__
            return True
        if isinstance(result, Continue):
            try:
                content = check_content(result.message)
            except Error as error:
                raise _TurnFailed(error) from None
            user = c._user_message(content)
            await c._checkpoint(lambda s: {**s, "messages": appended(s["messages"], user)})
            return False
        raise _TurnFailed(
            Error(
                ErrorClass.VALIDATION, "invalid stop hook result", {"type": type(result).__name__}
            )
        )

    # -- effects: commits that start them ---------------------------------------

    async def _effect_commit(
        self,
        kind: str,
        data: Mapping[str, Any],
        before: Step | None = None,
        *,
        unless_stopped: bool = False,
        yield_to_steering: bool = False,
    ) -> RunRecord:
        """Commit the intent of an effect, in one write with the decided steps
        (``before``, the carried one) that precede it; a kernel refusal fails
        the turn, an expired deadline stops the run (KER-08).
        ``unless_stopped``: never once the run stops, however long the commit
        waits for the coordinator (NEST-07; ``_Stop`` then).
        ``yield_to_steering``: see :meth:`_provider_attempt`."""
        c = self.c
        pending = self._pending(before)
        if c._stop_reason is not None:
            if pending and before is None:  # the carried projection
                await self._commit_projection(pending)
            elif pending:
                await c._commit_steps(pending)
            raise _Stop
        intent = command_step(kind, data)
        if yield_to_steering:
            intent = Step(_unless_steered(intent.build))
        try:
            record = await c._commit_steps((*pending, intent), as_input=unless_stopped)
        except Error as error:
            if unless_stopped and c._stop_reason is not None:
                raise _Stop from None  # refused: the run stopped meanwhile
            if error.error_class is ErrorClass.TIMEOUT:
                _late_results(c, pending)
                c._request_stop("deadline_exceeded")
                raise _Stop from None
            raise _TurnFailed(error) from None
        if c._stop_reason is not None:
            raise _Stop  # a cancellation raced the intent commit: never dispatch (CAN-04)
        # The run deadline may have expired while the (shielded) commit was in
        # flight: never start the effect after it (CAN-10).
        await trio.lowlevel.checkpoint_if_cancelled()
        return record

    async def _uncertain(self, error: Error) -> None:
        self._stop_uncertain(error)
        raise _Stop

    def _stop_uncertain(self, error: Error) -> None:
        if self.c._phase not in (Phase.RECOVERY_REQUIRED, Phase.STORAGE_FAILED):
            # A takeover or a storage failure that caused this keeps its own
            # error: it is what the host must act on (CAN-17, CAN-19).
            self.c._last_error = error
        self.c._request_stop("uncertain")

    # -- the provider -------------------------------------------------------------

    async def _provider_attempt(
        self, turn_id: str, *, yield_to_steering: bool = False
    ) -> tuple[Mapping[str, Any], list[dict[str, Any]], Step]:
        """One attempt, from its intent to its terminal event.  A failed
        attempt is committed here; a response comes back with its tool calls
        and the ``provider_completed`` step, still to commit (before the
        batch's first intent, or alone).  ``yield_to_steering``: steering
        committed by the time the intent would be refuses it (``_InputArrived``,
        the steps before it committed)."""
        c = self.c
        record = await self._effect_commit(
            "provider_started", {"turn_id": turn_id}, yield_to_steering=yield_to_steering
        )
        active = record.active_provider
        assert active is not None
        attempt_id, step_id = active["attempt_id"], active["step_id"]
        c._step_id, c._attempt_id = step_id, attempt_id
        c._publish("response_started", {})
        state = c._conversation_state()
        request = ProviderRequest(
            run_id=c.run_id,
            incarnation=record.incarnation,
            turn_id=turn_id,
            step_id=step_id,
            attempt_id=attempt_id,
            # The frozen transcript itself: FrozenDict/FrozenList are dict and
            # tuple subclasses, so providers read (and JSON-encode) them as is,
            # and a request costs nothing per past message.
            messages=state.get("messages", FrozenList()),
            catalog_revision=state.get("catalog_revision", 1),
            tools=c._catalog.provider_tools,
        )
        assembler = ResponseAssembler(c._options.provider_output_limit)
        budget = DeadlineBudget("effect", c._options.effect_timeout, c._now)
        late = await self._stream(request, assembler, budget)
        if assembler.failure is not None:
            # what the provider said of its failure is committed and
            # published: never a credential it was given (PRV-18)
            assembler.fail(redacted(assembler.failure, c._provider_secrets))
        await self._judge_cut(budget, assembler.terminal, late, attempt_id)
        outcome = assembler.outcome()
        if outcome.failure is not None:
            await self._attempt_failed(attempt_id, outcome.failure, outcome.usage)
        assert outcome.message is not None
        return outcome.message, outcome.calls, self._response(attempt_id, outcome)

    async def _stream(
        self, request: ProviderRequest, assembler: ResponseAssembler, budget: DeadlineBudget
    ) -> bool:
        """Feed the provider's stream to ``assembler`` within the attempt's
        budget, then close it; whether its terminal event came after
        effect_timeout (a stream that ignored its cut).  What the stream
        itself raises fails the attempt, classed."""
        c = self.c
        late = False
        with budget.arm() as scope:
            source: Any = None
            stream: Any = None
            try:
                source = c._provider.stream(request, c._provider_context)
                interrupted = False
                try:
                    stream = _async_iterator(source)
                    async for event in stream:
                        if isinstance(event, ResponseCompleted | ResponseFailed):
                            late = c._now() >= scope.deadline
                        publication = assembler.feed(event)
                        if publication is not None:
                            c._publish(*publication)
                        if assembler.done:
                            break
                except BaseException:
                    interrupted = True  # by a cut or the stream's failure: that is the outcome
                    raise
                finally:
                    await self._close_stream(scope, source, stream, assembler, interrupted)
            except Error as error:
                assembler.fail(error)
            except trio.Cancelled:
                raise
            except Exception as exc:
                cause = scrub(f"{type(exc).__name__}: {exc}", c._provider_secrets)
                details = {"cause": cause[:500]}
                assembler.fail(
                    Error(ErrorClass.EXECUTION_FAILURE, "provider stream failed", details)
                )
            except BaseExceptionGroup as group:  # the stream's own nursery, cut
                cut = _only_the_cut(group)
                if cut is group:
                    raise
                raise cut from None
        return late

    async def _close_stream(
        self,
        scope: trio.CancelScope,
        source: Any,
        stream: Any,
        assembler: ResponseAssembler,
        interrupted: bool,
    ) -> None:
        """Close the iterator, then the iterable it came from (one object when
        the stream is its own iterator)."""
        c = self.c
        closers = [getattr(stream, "aclose", None)]
        if source is not stream:
            closers.append(getattr(source, "aclose", None))
        closers = [close for close in closers if close is not None]
        if not closers:
            return
        # Closing is shielded from the run's cancellation and still bounded by
        # the attempt's own deadline: the budget's scope shields, no scope of
        # its own.  Once the run stops, the cleanup budget bounds it too.
        scope.shield = True
        c._closing = scope
        c._bound_closing()
        try:
            await _close_all(closers)
        except Exception:
            # After the terminal event the response is what it said; closing
            # the stream cannot change it (an error, or a generator that
            # yields again).  Nor can it hide what interrupted the stream: a
            # cut by effect_timeout stays uncertain (CAN-08).
            if not assembler.terminal and not interrupted:
                raise
        finally:
            c._closing = None

    async def _judge_cut(
        self, budget: DeadlineBudget, terminal: bool, late: bool, attempt_id: str
    ) -> None:
        """A close cut by effect_timeout after the terminal event leaves the
        response as it arrived; a stop still interrupts it.  A terminal event
        arriving past effect_timeout (the stream ignored its cut) is a timeout
        all the same (KER-10)."""
        c = self.c
        stopping = c._stop_reason is not None or c._now() >= c._run_budget.deadline
        if not ((budget.timed_out() and (stopping or not terminal)) or late):
            return
        if stopping:
            # Cut while closing by the cleanup budget of a stop (a cancel, or
            # the run deadline that passed meanwhile), not by effect_timeout:
            # the settlement reports the attempt.
            if c._stop_reason is None:
                c._request_stop("deadline_exceeded")
            raise _Stop
        await self._uncertain(
            Error(
                ErrorClass.TIMEOUT,
                "provider attempt outlived effect_timeout",
                {"certainty": "uncertain", "effect": f"provider:{attempt_id}"},
            )
        )

    async def _attempt_failed(self, attempt_id: str, failure: Error, usage: list[Any]) -> None:
        """Commit a failed attempt, publish it, and fail the turn."""
        c = self.c
        result = freeze({"error": failure.to_dict()})

        def build_failed(record: RunRecord, now: float) -> Command:
            # From the record it lands on, not from the attempt's start: host
            # input acknowledged during the attempt (steering, follow-ups) is
            # in it, and stays queued (NEST-08).
            return Command(
                "provider_completed",
                now,
                {
                    "attempt_id": attempt_id,
                    "result": result,
                    "conversation": _append(conversation_of(record), usage=usage),
                },
            )

        await c._commit_steps((Step(build_failed),))
        c._publish("response_failed", {"error": failure.to_dict()})
        c._attempt_id = None
        raise _TurnFailed(failure)

    def _response(self, attempt_id: str, outcome: AttemptOutcome) -> Step:
        """The ``provider_completed`` step of a response, still to commit; its
        ``response_completed`` event once it is."""
        c = self.c
        response, usage = outcome.message, outcome.usage

        def build(record: RunRecord, now: float) -> Command:
            frozen = freeze(response)
            return Command(
                "provider_completed",
                now,
                freeze(
                    {
                        "attempt_id": attempt_id,
                        "result": freeze({"message": frozen}),
                        "conversation": _append(
                            conversation_of(record), message=frozen, usage=usage
                        ),
                    }
                ),
            )

        def completed_event() -> None:
            if c._hub.active:
                c._publish(
                    "response_completed",
                    {"message": response, "usage": usage[-1] if usage else None},
                )
            c._attempt_id = None

        return Step(build, completed_event)

    # -- the tool gateway --------------------------------------------------------

    async def _gateway(
        self,
        call: Mapping[str, Any],
        turn_id: str,
        *,
        before: Step | None = None,
        carry: bool = False,
    ) -> None:
        """One call, in this order: validate, authorize, approve, reserve + intent,
        dispatch, commit the result, then the transcript projection (rules 1, 3).

        ``before`` (the response's ``provider_completed``) is committed with the
        first durable step of this call; with ``carry`` the tool message waits
        for the next commit (see :class:`TurnLoop`)."""
        c = self.c
        bundle = c._catalog.bundle  # pinned for the batch: publication waits for its end
        name = call.get("name")
        call_id = str(call.get("id"))
        arguments = call.get("arguments")
        descriptor = bundle.registry.get(name) if isinstance(name, str) else None
        if descriptor is None:
            error = Error(ErrorClass.NOT_FOUND, "tool is not registered", {"tool": name})
            await self._tool_message(call_id, name, _error_result(error), before, carry)
            return
        if isinstance(arguments, str):
            try:
                arguments = loads(arguments)  # plain data already
            except (ValueError, RecursionError) as exc:
                error = Error(
                    ErrorClass.VALIDATION,
                    "tool arguments are not JSON",
                    {"reason": "nesting" if isinstance(exc, RecursionError) else "syntax"},
                )
                await self._tool_message(call_id, name, _error_result(error), before, carry)
                return
        else:
            arguments = thaw(arguments)  # frozen with the response: bounded depth
        authority = bundle.authority
        try:
            self._validator(descriptor).validate(arguments)
            authorize(
                authority, descriptor, Invocation(c.run_id, descriptor.name, descriptor.revision)
            )
            if descriptor.requires_approval:
                await self._flush(before)  # the response is durable before a human sees it
                before = None
                await self._approve(descriptor, call_id, turn_id, arguments)
        except Error as error:
            await self._tool_message(call_id, descriptor.name, _error_result(error), before, carry)
            return
        record = await self._effect_commit(
            "tool_invoked", _intent(descriptor, call_id, turn_id, authority), before
        )
        invocation_id = max(record.active_tools, key=_invocation_number)
        await self._dispatch(
            descriptor, record, invocation_id, call_id, turn_id, arguments, carry=carry
        )

    async def _approve(
        self, descriptor: ToolDescriptor, call_id: str, turn_id: str, arguments: Any
    ) -> None:
        """A permission interaction before any intent (INT-01); only the exact
        answer "approved" passes, checked by ``decide_approval`` against the
        invocation about to dispatch (INT-02, INT-15)."""
        c = self.c
        digest = arguments_digest(arguments)
        approval = Approval(
            approval_id=c._new_id("approval"),
            run_id=c.run_id,
            incarnation=c._record.incarnation,
            tool_name=descriptor.name,
            tool_revision=descriptor.revision,
            arguments_digest=digest,
            expires_at=c._record.deadline if c._record.deadline is not None else float("inf"),
        )
        operation = {
            "approval_id": approval.approval_id,
            "run_id": c.run_id,
            "incarnation": c._record.incarnation,
            "turn_id": turn_id,
            "tool_call_id": call_id,
            "tool_name": descriptor.name,
            "tool_revision": descriptor.revision,
            "arguments": arguments,
            "arguments_digest": digest,
            # wall-clock seconds, UTC: any process reads the same instant
            "expires_at": c._record.deadline,
        }
        answer, waited = await wait_for_human(c, {"kind": "permission", "operation": operation})
        if not (type(answer) is str and answer == "approved"):
            raise Error(ErrorClass.FORBIDDEN, "approval denied", {"tool": descriptor.name})
        decision = ApprovalDecision(
            approval_id=approval.approval_id,
            run_id=c.run_id,
            incarnation=c._record.incarnation,
            tool_name=descriptor.name,
            tool_revision=descriptor.revision,
            arguments_digest=arguments_digest(arguments),
            decision="approved",
            resolver_id=HOST_RESOLVER,
        )
        # The approval expires with the run deadline it was asked under; the
        # human wait itself does not count (the deadline moved by it).
        decide_approval(approval, decision, now=c._wall_now() - waited)

    def _operation(  # noqa: PLR0917 - one call's whole identity
        self,
        descriptor: ToolDescriptor,
        record: RunRecord,
        invocation_id: str,
        call_id: str,
        turn_id: str,
        arguments: Any,
    ) -> ToolOperation:
        c = self.c
        authority = c._catalog.bundle.authority
        return ToolOperation(
            run_id=c.run_id,
            incarnation=record.incarnation,
            step_id=str(record.step_id),
            attempt_id=str(record.intents[_last_provider(record)]["attempt_id"]),
            invocation_id=invocation_id,
            tool_call_id=call_id,
            turn_id=turn_id,
            tool_name=descriptor.name,
            tool_revision=descriptor.revision,
            catalog_revision=c._conversation_state().get("catalog_revision", 1),
            arguments=arguments,
            caller=authority.caller,
            effective_authority=authority,
            backend_context=descriptor.backend_context,
            context=ToolContext(c, self, descriptor.name, invocation_id),
        )

    async def _execute(
        self,
        descriptor: ToolDescriptor,
        operation: ToolOperation,
        caller: ToolContext | None = None,
    ) -> tuple[Any, bool]:
        """Run the backend under its own effect budget: ``(outcome, timed out)``.
        Its context expires when execution ends, before settlement (NEST-01).

        A nested invocation's deadline lies inside the outer one: at most half
        of what the outer tool has left, so a nested timeout always leaves the
        outer tool time to react (NEST-05)."""
        c = self.c
        invocation_id = operation.invocation_id
        c._unsettled_dispatch[invocation_id] = "tool dispatched; outcome unknown"
        seconds = c._options.effect_timeout
        if c._effects:
            seconds = min(seconds, c._effects[-1].remaining() / 2)
        budget = DeadlineBudget("effect", seconds, c._now)
        c._effects.append(budget)
        c._executing.append(invocation_id)
        result: Any = None
        try:
            with budget.arm() as scope:
                # A stop of the run cancels the effect's scope, wherever its
                # task runs (a nested call in a host's task is out of the
                # worker's reach; in the worker, the worker's own
                # cancellation goes on past it).
                c._effect_stops.add(scope)
                if c._stop_reason is not None:
                    scope.cancel()
                if caller is not None:  # (live: checked after the intent committed)
                    caller._nested_stop = scope  # the caller's end ends it too
                try:
                    result = await descriptor.backend.execute(operation)
                except Error as error:
                    result = error
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    result = exc
                except BaseExceptionGroup as group:
                    cut = _only_the_cut(group)
                    if cut is group:
                        raise
                    raise cut from None
        finally:
            operation.context._end()
            c._effect_stops.discard(scope)
            c._effects.remove(budget)
            c._executing.remove(invocation_id)
            if caller is not None:
                caller._nested_stop = None
        if c._stop_reason is not None:
            # The run stopped while it executed: its outcome stays unsettled,
            # whatever it returned or however long it took (TOOL-22).
            raise _Stop
        if scope.cancelled_caught and caller is not None and not caller._live:
            raise _CallerEnded  # a nested call its caller left running
        context = operation.context
        if context._nested_busy or context._waits:
            await self._nested_left_running(context)
        return result, budget.timed_out()

    async def _nested_left_running(self, context: ToolContext) -> None:
        """A nested call or an interaction the tool left running (in a
        host's task) ended with it (``_end``): each is over before this call
        is settled, and before the batch goes on (TOOL-01; an interaction
        left pending would refuse the next call's approval).  A nested call
        that outlives its cancellation too is out of reach: the run stops
        ``unknown_outcome``."""
        c = self.c
        running = list(context._waits or ())
        if context._nested_busy and context._nested_ended is not None:
            running.append(context._nested_ended)
        with trio.CancelScope(shield=True) as bound:  # one bound for them all
            bound.deadline = trio.current_time() + c._options.cleanup_timeout
            for ended in running:
                await ended.wait()
        if context._nested_busy:
            self._stop_uncertain(
                Error(
                    ErrorClass.UNKNOWN_OUTCOME,
                    "a nested call outlived its caller and its cancellation",
                    {"tool": context._tool},
                )
            )
            raise _Stop

    async def _dispatch(  # noqa: PLR0917 - one call's whole identity
        self,
        descriptor: ToolDescriptor,
        record: RunRecord,
        invocation_id: str,
        call_id: str,
        turn_id: str,
        arguments: Any,
        *,
        carry: bool = False,
    ) -> None:
        c = self.c
        operation = self._operation(descriptor, record, invocation_id, call_id, turn_id, arguments)
        if c._hub.active:
            c._publish("tool_started", {"invocation": _started(operation)})
        result, timed_out = await self._execute(descriptor, operation)
        if timed_out:
            await self._uncertain(
                Error(
                    ErrorClass.TIMEOUT,
                    "tool outlived effect_timeout",
                    {"certainty": "uncertain", "effect": f"tool:{invocation_id}"},
                )
            )
        verdict = settlement(result, descriptor, operation)
        if verdict == "uncertain":
            await self._uncertain_result(result, descriptor, invocation_id)
        normalized = self._normalize(result, descriptor)
        # A result returned after cancel() is never committed: the effect
        # stays unsettled evidence and the run ends unknown_outcome (TOOL-22).
        await trio.lowlevel.checkpoint_if_cancelled()
        step = self._completion(invocation_id, call_id, descriptor.name, normalized)
        if carry:
            self._carry = (step,)
            return
        try:
            await self._flush(step, projection=True)
        except Error as error:
            if error.error_class is not ErrorClass.TIMEOUT:
                raise
            _late_results(c, (step,))
            c._request_stop("deadline_exceeded")
            raise _Stop from None

    def _completion(
        self, invocation_id: str, call_id: str, name: str, normalized: Mapping[str, Any]
    ) -> Step:
        """The ``tool_completed`` step of a settled result, its transcript
        message in the same command: a result is durable no later than the
        message showing it (TOOL-08, TOOL-25).  Settled, and the message
        published, only once it is committed: until then the effect is
        unsettled evidence."""
        c = self.c
        message = freeze(
            {"role": "tool", "tool_call_id": call_id, "name": name, "result": normalized}
        )

        def build(record: RunRecord, now: float) -> Command:
            data = {
                "invocation_id": invocation_id,
                "result": normalized,
                "conversation": _append(conversation_of(record), message=message),
            }
            return Command("tool_completed", now, freeze(data))

        def settled() -> None:
            c._unsettled_dispatch.pop(invocation_id, None)
            c._catalog.producer_settled(invocation_id, success=not normalized.get("is_error"))
            c._publish("tool_completed", {"message": message})

        return Step(build, settled, settles=invocation_id)

    async def _complete(
        self, invocation_id: str, normalized: Mapping[str, Any], *, unless_stopped: bool = False
    ) -> None:
        """Commit a settled result (before any transcript projection, TOOL-08);
        ``unless_stopped``: not once the run stops, however long the commit
        waits for the coordinator (``_Stop`` then)."""
        c = self.c
        step = command_step(
            "tool_completed", freeze({"invocation_id": invocation_id, "result": normalized})
        )
        try:
            await c._commit_steps((step,), as_input=unless_stopped)
        except Error as error:
            if unless_stopped and c._stop_reason is not None:
                raise _Stop from None  # refused: the run stopped meanwhile
            if error.error_class is ErrorClass.TIMEOUT:
                c._unsettled_dispatch[invocation_id] = "result not committed before the deadline"
                c._request_stop("deadline_exceeded")
                raise _Stop from None
            raise
        # Settled only once its result is committed: a result (a rejection
        # included) returned after cancel() never commits, so the effect stays
        # unsettled evidence and the run ends unknown_outcome (TOOL-22).
        c._unsettled_dispatch.pop(invocation_id, None)  # (a nested call withdrawn: never in it)
        c._catalog.producer_settled(invocation_id, success=not normalized.get("is_error"))

    async def _nested(self, outer: ToolContext, tool_name: str, arguments: Any) -> ToolResult:
        """A nested invocation on behalf of ``outer`` (NEST-01..09)."""
        c = self.c
        descriptor, arguments = self._nested_admission(tool_name, arguments)
        outer_call = c._record.active_tools.get(outer._invocation_id, {})
        call_id = f"{outer_call.get('tool_call_id', outer._invocation_id)}/nested"
        turn_id = str(outer_call.get("turn_id", ""))
        record, invocation_id = await self._nested_intent(outer, descriptor, turn_id)
        operation = self._operation(descriptor, record, invocation_id, call_id, turn_id, arguments)
        operation.context._caller = outer
        if c._hub.active:
            c._publish("tool_started", {"invocation": _started(operation)})
        try:
            result, timed_out = await self._execute(descriptor, operation, caller=outer)
        except (trio.Cancelled, _CallerEnded) as interrupted:
            if c._stop_reason is None:
                await self._nested_cut(descriptor, invocation_id)
            if isinstance(interrupted, _CallerEnded):
                raise _caller_ended(descriptor) from None
            raise
        return await self._nested_result(descriptor, operation, result, timed_out)

    def _nested_admission(self, tool_name: str, arguments: Any) -> tuple[ToolDescriptor, Any]:
        """The descriptor and plain arguments of a nested call the gateway
        admits: registered, not approval-gated, valid, authorized."""
        c = self.c
        bundle = c._catalog.bundle
        descriptor = bundle.registry.get(tool_name) if isinstance(tool_name, str) else None
        if descriptor is None:
            raise Error(ErrorClass.NOT_FOUND, "tool is not registered", {"tool": tool_name})
        if descriptor.requires_approval:
            raise Error(
                ErrorClass.APPROVAL_REQUIRED,
                "a nested call cannot run an approval-gated tool",
                {"tool": descriptor.name},
            )
        arguments = _plain(arguments, "nested tool arguments")
        self._validator(descriptor).validate(arguments)
        authorize(
            bundle.authority, descriptor, Invocation(c.run_id, descriptor.name, descriptor.revision)
        )
        return descriptor, arguments

    async def _nested_intent(
        self, outer: ToolContext, descriptor: ToolDescriptor, turn_id: str
    ) -> tuple[RunRecord, str]:
        """Commit a nested call's intent: the record and its invocation id.
        None is dispatched once its caller's deadline has passed or its
        caller's execution ended (withdrawn then, CAN-10)."""
        c = self.c
        outer_record = c._record
        # No effect starts once its caller's deadline has passed (CAN-10): a
        # caller shielding itself past it gets a timeout, no intent, no work.
        _require_time_left(c, descriptor)
        try:
            record = await self._effect_commit(
                "tool_invoked",
                _intent(descriptor, None, turn_id, c._catalog.bundle.authority),
                unless_stopped=True,  # its task may be a host's, never cancelled by a stop
            )
        except _TurnFailed as failed:
            raise failed.error from None  # (a _Stop: classed by nested_dispatch)
        except trio.Cancelled:
            # Cut by the calling tool's own scope once its intent may have
            # committed: never dispatched, so withdrawn (a stop of the run
            # settles its intents itself).
            added = [i for i in c._record.active_tools if i not in outer_record.active_tools]
            for invocation_id in added:
                await self._withdraw_nested(invocation_id, descriptor, "cancelled by its caller")
            raise
        invocation_id = max(record.active_tools, key=_invocation_number)
        if not outer._live:  # its caller's execution ended while the intent committed
            await self._withdraw_nested(invocation_id, descriptor, "its caller's execution ended")
            raise _caller_ended(descriptor)
        try:
            _require_time_left(c, descriptor)  # the intent's commit took the rest
        except Error as late:
            await self._withdraw_nested(invocation_id, descriptor, late.message)
            raise
        return record, invocation_id

    async def _nested_cut(self, descriptor: ToolDescriptor, invocation_id: str) -> None:
        """Cut by the calling tool's own scope, not by a stop of the run, after
        dispatch: a read-only call did nothing lasting (settled as an error,
        NEST-05); a mutating one stays unresolved and stops the run, whatever
        the caller does next (NEST-09)."""
        c = self.c
        if descriptor.read_only:
            cut = Error(
                ErrorClass.CANCELLED,
                "nested tool cancelled by its caller",
                {"tool": descriptor.name, "certainty": "no_effect"},
            )
            await self._complete_cut(invocation_id, _error_result(cut))
            return
        c._unsettled_dispatch[invocation_id] = "nested tool cancelled by its caller"
        self._stop_uncertain(
            Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "nested tool cancelled by its caller after dispatch; its effect is unknown",
                {"tool": descriptor.name},
            )
        )

    async def _nested_result(
        self, descriptor: ToolDescriptor, operation: ToolOperation, result: Any, timed_out: bool
    ) -> ToolResult:
        """Settle a nested call's result and hand it to the calling tool."""
        invocation_id = operation.invocation_id
        if timed_out and descriptor.read_only:
            # A read-only nested timeout did nothing lasting: settle it as an
            # error and let the outer tool decide (NEST-05).
            error = Error(
                ErrorClass.TIMEOUT,
                "nested tool outlived its deadline",
                {"tool": descriptor.name, "certainty": "no_effect"},
            )
            await self._complete_nested(invocation_id, _error_result(error))
            raise error
        if timed_out:
            result = Error(ErrorClass.TIMEOUT, "nested tool outlived its deadline")
        if settlement(result, descriptor, operation) == "uncertain":
            # A mutating nested failure stays unresolved whatever the outer
            # tool does with the error (NEST-09).
            try:
                await self._uncertain_result(result, descriptor, invocation_id)
            except _Stop:
                raise Error(
                    ErrorClass.UNKNOWN_OUTCOME,
                    "nested tool outcome is unknown",
                    {"tool": descriptor.name},
                ) from None
        normalized = self._normalize(result, descriptor)
        await self._complete_nested(invocation_id, normalized)
        return ToolResult(  # plain data for the outer tool, as a backend returns it
            content=thaw(normalized["content"]),
            structured_content=thaw(normalized.get("structured_content")),
            is_error=bool(normalized.get("is_error")),
        )

    async def _withdraw_nested(
        self, invocation_id: str, descriptor: ToolDescriptor, reason: str
    ) -> None:
        """Settle a nested intent that was committed and never dispatched as
        an error result (its caller may be cancelled): the work unit stays
        spent, the backend never ran."""
        error = Error(
            ErrorClass.CANCELLED,
            f"nested tool not dispatched: {reason}",
            {"tool": descriptor.name, "certainty": "not_dispatched"},
        )
        await self._complete_cut(invocation_id, _error_result(error))

    async def _complete_nested(self, invocation_id: str, normalized: Mapping[str, Any]) -> None:
        """Commit a nested call's settled result, never once the run stops
        (its task may be a host's, which a stop does not cancel: TOOL-22);
        its caller's own scope cutting the commit does not leave a known
        result unsettled."""
        try:
            await self._complete(invocation_id, normalized, unless_stopped=True)
        except trio.Cancelled:
            await self._complete_cut(invocation_id, normalized)
            raise

    async def _complete_cut(self, invocation_id: str, normalized: Mapping[str, Any]) -> None:
        """Commit a nested call's result while its caller's scope is cut:
        shielded, and never once the run stops (a result after cancel() is
        never committed, TOOL-22: the run's settlement then holds the call
        unsettled, or withdraws one never dispatched)."""
        if self.c._stop_reason is not None:
            return
        with trio.CancelScope(shield=True):
            await self._complete(invocation_id, normalized, unless_stopped=True)

    async def _uncertain_result(
        self, result: Any, descriptor: ToolDescriptor, invocation_id: str
    ) -> None:
        """Stop the run as unknown_outcome for an uncertain tool outcome (rule 4);
        what it quotes of the tool's ``backend_context`` is redacted (TOOL-10)."""
        secrets = secrets_of(descriptor.backend_context)
        if isinstance(result, Rejection):
            reason = Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "tool rejection does not prove exact non-dispatch",
                {"tool": descriptor.name},
            )
        elif isinstance(result, Error):
            reason = Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "tool failed after dispatch; its effect is unknown",
                {"tool": descriptor.name, "cause": redacted(result, secrets).to_dict()},
            )
        elif isinstance(result, BaseException):
            cause = scrub(f"{type(result).__name__}: {result}", secrets)
            reason = Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "tool crashed after dispatch",
                {"tool": descriptor.name, "cause": cause[:500]},
            )
        else:
            reason = Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "tool returned neither a ToolResult nor a rejection",
                {"tool": descriptor.name, "type": type(result).__name__},
            )
        self.c._unsettled_dispatch[invocation_id] = reason.message
        await self._uncertain(reason)

    def _normalize(self, result: Any, descriptor: ToolDescriptor) -> Mapping[str, Any]:
        """The result as committed and projected: frozen once, here, so the
        result command, the tool message and its event share it unwalked.
        A refusal quoting the tool's ``backend_context`` has it redacted
        (TOOL-10); what a result says is the backend's own output."""
        if isinstance(result, ToolResult):
            try:
                normalized: Mapping[str, Any] = freeze(result.to_dict(), "tool result")
                size = utf8_size(normalized)
            except Exception as exc:  # the result's own parts may fail when read
                cause = exc.message if isinstance(exc, Error) else f"{type(exc).__name__}: {exc}"
                return _error_result(
                    Error(
                        ErrorClass.VALIDATION,
                        "tool result is not JSON data",
                        {"cause": cause[:300]},
                    )
                )
            if size > self.c._options.output_limit:
                return self._oversized(size)
            return normalized
        error = result.error if isinstance(result, Rejection) else result
        assert isinstance(error, Error)
        error = redacted(error, secrets_of(descriptor.backend_context))
        # A refusal's message and details are the backend's output too (TOOL-12).
        refused = _error_result(error)
        size = utf8_size(refused)
        if size > self.c._options.output_limit:
            return self._oversized(size)
        return refused

    def _oversized(self, size: int) -> Mapping[str, Any]:
        return _error_result(
            Error(
                ErrorClass.RESOURCE_CONFLICT,
                "tool output exceeds the configured bound",
                {"scope": "tool_result", "size": size, "limit": self.c._options.output_limit},
            )
        )

    async def _tool_message(
        self,
        call_id: str,
        name: Any,
        result: Mapping[str, Any],
        before: Step | None = None,
        carry: bool = False,
    ) -> None:
        """The transcript message of a call that ran nothing (a refusal), its
        ``tool_completed`` event once committed (EVT-13); with ``carry`` (and
        nothing ``before`` it) committed with the next provider attempt's
        intent."""
        c = self.c
        message = {"role": "tool", "tool_call_id": call_id, "name": name, "result": result}
        step = checkpoint_step(
            lambda s: {**s, "messages": appended(s["messages"], message)},
            after=lambda: c._publish("tool_completed", {"message": message}),
        )
        if carry and before is None:
            self._carry = (step,)
            return
        await self._flush(before, step, projection=before is None)


def _unless_steered(
    build: Callable[[RunRecord, float], Command],
) -> Callable[[RunRecord, float], Command]:
    """``build``, refused with ``_InputArrived`` when the record it lands on
    has steering queued."""

    def guarded(record: RunRecord, now: float) -> Command:
        if conversation_of(record).get("steering"):
            raise _InputArrived
        return build(record, now)

    return guarded


def _late_results(c: Conversation, steps: Sequence[Step]) -> None:
    """The kernel refused a commit as past the run deadline: a result among
    ``steps`` it did not commit stays unsettled evidence, saying why."""
    for step in steps:
        if step.settles is not None and step.settles in c._unsettled_dispatch:
            c._unsettled_dispatch[step.settles] = "result not committed before the deadline"


def _only_the_cut(group: BaseExceptionGroup[Any]) -> BaseException:
    """What a backend's or a provider stream's own nursery raised when the
    effect was cut: its cancellation alone, which its scope takes (the
    effect's other errors are moot, it was interrupted: uncertain); the
    group itself when it holds a ``KeyboardInterrupt``, ``SystemExit`` or
    another ``BaseException``, which propagate as they are."""
    if any(not isinstance(leaf, Exception | trio.Cancelled) for leaf in exception_leaves(group)):
        return group
    cancelled, _ = group.split(trio.Cancelled)
    assert cancelled is not None  # else it is an ExceptionGroup, an Exception
    return cancelled


def _async_iterator(stream: Any) -> Any:
    """The iterator of what ``provider.stream`` returned (an async iterator
    is its own; an async iterable, an SDK's response object say, gives one):
    what is iterated is what is closed."""
    iterator = stream.__aiter__() if hasattr(stream, "__aiter__") else stream
    if not hasattr(iterator, "__anext__"):
        if inspect.iscoroutine(iterator):
            iterator.close()  # an ``async def`` (stream or __aiter__): never awaited
        raise Error(
            ErrorClass.EXECUTION_FAILURE,
            "provider stream must be an async iterator",
            {"type": type(stream).__name__},
        )
    return iterator


async def _close_all(closers: list[Any]) -> None:
    """Await every one of ``closers``, each even when one before failed;
    then raise the first failure."""
    if len(closers) == 1:  # a stream that is its own iterator: the common case
        await closers[0]()
        return
    failure: Exception | None = None
    for aclose in closers:
        try:
            await aclose()
        except Exception as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def _intent(
    descriptor: ToolDescriptor, call_id: str | None, turn_id: str, authority: Any
) -> Mapping[str, Any]:
    """The durable intent of one invocation: no grants, no credentials (TOOL-10).
    Frozen as built (the command takes it unwalked)."""
    intent: dict[str, Any] = {
        "tool_name": descriptor.name,
        "tool_revision": descriptor.revision,
        "turn_id": turn_id,
        "effect_class": "read_only" if descriptor.read_only else "mutation",
        "effective_authority": freeze(
            {
                "caller": authority.caller,
                "run_id": authority.run_id,
                "tool_revision": descriptor.revision,
            }
        ),
    }
    if call_id is not None:
        intent["tool_call_id"] = call_id
    frozen: Mapping[str, Any] = freeze(intent)
    return frozen


def _started(operation: ToolOperation) -> dict[str, Any]:
    return {
        "invocation_id": operation.invocation_id,
        "tool_call_id": operation.tool_call_id,
        "step_id": operation.step_id,
        "tool_name": operation.tool_name,
        "tool_revision": operation.tool_revision,
        # a read-only copy: no subscriber can edit what the backend runs
        # with (TOOL-04), nor what another subscriber receives
        "arguments": freeze(operation.arguments, "tool arguments"),
    }


def _invocation_number(invocation_id: str) -> int:
    return int(invocation_id.rsplit("-", 1)[-1])


def _last_provider(record: RunRecord) -> str:
    return f"provider:attempt-{record.incarnation}-{record.counters.get('attempt', 0)}"


def _append(
    state: Mapping[str, Any], *, message: Any = None, usage: list[Any] | None = None
) -> Mapping[str, Any]:
    """``state`` (frozen) with ``message`` and ``usage`` appended, frozen (a
    command takes it unwalked)."""
    new = dict(state)
    if message is not None:
        new["messages"] = appended(state.get("messages", ()), message)
    if usage:
        new["usage"] = appended(state.get("usage", ()), *usage)
    frozen: Mapping[str, Any] = freeze(new)
    return frozen
