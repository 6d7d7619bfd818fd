"""Provider attempts on Trio: the intent, the stream fed to a sans-I/O
``ResponseAssembler`` under the attempt's deadline, the shielded close, and
the verdict on a cut.  What the assembler decides (accounting, calls, usage)
is in ``_attempt``; this module owns only scopes, closing and commits."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Final, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import (
    UNSET,
    FrozenDict,
    FrozenList,
    KernelCommand,
    ProviderCompleted,
    ProviderStarted,
    RunRecord,
    build_command,
    freeze,
)
from ..kernel._construct import fast_constructor
from ._attempt import AttemptOutcome, ResponseAssembler
from ._catalog import CatalogState
from ._coordinator import Coordinator
from ._deadline import DeadlineBudget
from ._options import Options
from ._provider import ProviderRequest, ResponseCompleted, ResponseFailed
from ._redact import redacted, scrub, secrets_of
from ._signals import _Stop, _TurnFailed, only_the_cut
from ._state import Publisher, RunState
from ._steps import Step
from ._writer import StepWriter

__all__ = ["Attempt", "Responses"]

# One a provider attempt: without attrs' __init__ (see fast_constructor).
_new_request: Final = fast_constructor(ProviderRequest)

#: what an attempt gives the turn: the response message, its tool calls and
#: its ``provider_completed`` step, still to commit
Attempt = tuple[Mapping[str, Any], list[dict[str, Any]], Step]


@final
class Responses:
    """Runs one conversation's provider attempts."""

    __slots__ = (
        "_catalog",
        "_context",
        "_coordinator",
        "_options",
        "_provider",
        "_publisher",
        "_secrets",
        "_state",
        "_writer",
    )

    def __init__(  # noqa: PLR0917 - the parts it calls on
        self,
        state: RunState,
        coordinator: Coordinator,
        writer: StepWriter,
        publisher: Publisher,
        catalog: CatalogState,
        options: Options,
        *,
        provider: Any,
        provider_context: Mapping[str, Any] | None,
    ) -> None:
        self._state = state
        self._coordinator = coordinator
        self._writer = writer
        self._publisher = publisher
        self._catalog = catalog
        self._options = options
        self._provider = provider
        self._context = provider_context
        #: what a provider failure must never quote of its context
        self._secrets = secrets_of(provider_context)

    async def attempt(self, turn_id: str, *, yield_to_steering: bool = False) -> Attempt:
        """One attempt, from its intent to its terminal event.  A failed
        attempt is committed here (the turn fails); a response comes back with
        its tool calls and the ``provider_completed`` step, still to commit
        (before the batch's first intent, or alone).  ``yield_to_steering``:
        steering committed by the time the intent would be refuses it
        (``_InputArrived``, the steps before it committed)."""
        state = self._state
        record = await self._writer.effect_commit(
            ProviderStarted, {"turn_id": turn_id}, yield_to_steering=yield_to_steering
        )
        active = record.active_provider
        assert active is not None
        attempt_id, step_id = active["attempt_id"], active["step_id"]
        state.step_id, state.attempt_id = step_id, attempt_id
        self._publisher.publish("response_started", {})
        assembler = ResponseAssembler(self._options.provider_output_limit)
        budget = DeadlineBudget("effect", self._options.effect_timeout, state.now)
        request = self._request(record, turn_id, step_id, attempt_id)
        recorder = state.telemetry
        if recorder is None:
            late = await self._stream(request, assembler, budget)
        else:
            recorder.chat_started(turn_id, attempt_id, request.messages)
            with recorder.current(f"chat:{attempt_id}"):  # the provider's spans nest in it
                late = await self._stream(request, assembler, budget)
        if assembler.failure is not None:
            # what the provider said of its failure is committed and
            # published: never a credential it was given
            assembler.fail(redacted(assembler.failure, self._secrets))
        self._judge_cut(budget, assembler.terminal, late, attempt_id)
        outcome = assembler.outcome()
        if recorder is not None:
            failure = None if outcome.failure is None else outcome.failure.to_dict()
            recorder.chat_ended(attempt_id, outcome.usage, failure, outcome.message)
        if outcome.failure is not None:
            await self._failed(attempt_id, outcome.failure, outcome.usage)
        assert outcome.message is not None
        return outcome.message, outcome.calls, self._response(attempt_id, outcome)

    def _request(
        self, record: RunRecord, turn_id: str, step_id: str, attempt_id: str
    ) -> ProviderRequest:
        # held(): the catalog revision is not a growing field, and the
        # transcript is the record's own (no state rebuilt for a grown one)
        revision = self._state.held().catalog_revision
        return _new_request(
            run_id=self._state.run_id,
            incarnation=record.incarnation,
            turn_id=turn_id,
            step_id=step_id,
            attempt_id=attempt_id,
            # The frozen transcript itself: FrozenDict/FrozenList are dict and
            # tuple subclasses, so providers read (and JSON-encode) them as is,
            # and a request costs nothing per past message.
            messages=record.transcript,
            catalog_revision=revision or 1,
            tools=self._catalog.provider_tools,
        )

    async def _stream(
        self, request: ProviderRequest, assembler: ResponseAssembler, budget: DeadlineBudget
    ) -> bool:
        """Feed the provider's stream to ``assembler`` within the attempt's
        budget, then close it; whether its terminal event came after
        effect_timeout (a stream that ignored its cut).  What the stream
        itself raises fails the attempt, classed."""
        late = False
        with budget.arm() as scope:
            source: Any = None
            stream: Any = None
            try:
                source = self._provider.stream(request, self._context)
                interrupted = False
                try:
                    stream = _async_iterator(source)
                    async for event in stream:
                        if isinstance(event, ResponseCompleted | ResponseFailed):
                            late = self._state.now() >= scope.deadline
                        publication = assembler.feed(event)
                        if publication is not None:
                            self._publisher.publish(*publication)
                        if assembler.done:
                            break
                except BaseException:
                    interrupted = True  # by a cut or the stream's failure: that is the outcome
                    raise
                finally:
                    await self._close(scope, source, stream, assembler, interrupted)
            except Error as error:
                assembler.fail(error)
            except trio.Cancelled:
                raise
            except Exception as exc:
                cause = scrub(f"{type(exc).__name__}: {exc}", self._secrets)
                details = {"cause": cause[:500]}
                assembler.fail(
                    Error(ErrorClass.EXECUTION_FAILURE, "provider stream failed", details)
                )
            except BaseExceptionGroup as group:  # the stream's own nursery, cut
                cut = only_the_cut(group)
                if cut is group:
                    raise
                raise cut from None
        return late

    async def _close(
        self,
        scope: trio.CancelScope,
        source: Any,
        stream: Any,
        assembler: ResponseAssembler,
        interrupted: bool,
    ) -> None:
        """Close the iterator, then the iterable it came from (one object when
        the stream is its own iterator)."""
        state = self._state
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
        state.closing = scope
        state.bound_closing(self._options.cleanup_timeout)
        try:
            await _close_all(closers)
        except Exception:
            # After the terminal event the response is what it said; closing
            # the stream cannot change it (an error, or a generator that
            # yields again).  Nor can it hide what interrupted the stream: a
            # cut by effect_timeout stays uncertain.
            if not assembler.terminal and not interrupted:
                raise
        finally:
            state.closing = None

    def _judge_cut(
        self, budget: DeadlineBudget, terminal: bool, late: bool, attempt_id: str
    ) -> None:
        """A close cut by effect_timeout after the terminal event leaves the
        response as it arrived; a stop still interrupts it.  A terminal event
        arriving past effect_timeout (the stream ignored its cut) is a timeout
        all the same."""
        state = self._state
        stopping = state.stop_reason is not None or state.now() >= state.run_budget.deadline
        if not ((budget.timed_out() and (stopping or not terminal)) or late):
            return
        if stopping:
            # Cut while closing by the cleanup budget of a stop (a cancel, or
            # the run deadline that passed meanwhile), not by effect_timeout:
            # the settlement reports the attempt.
            if state.stop_reason is None:
                self._writer.stop("deadline_exceeded")
            raise _Stop
        self._writer.uncertain(
            Error(
                ErrorClass.TIMEOUT,
                "provider attempt outlived effect_timeout",
                {"certainty": "uncertain", "effect": f"provider:{attempt_id}"},
            )
        )

    async def _failed(self, attempt_id: str, failure: Error, usage: list[Any]) -> None:
        """Commit a failed attempt, publish it, and fail the turn."""
        result = freeze({"error": failure.to_dict()})

        def build_failed(record: RunRecord, now: float) -> KernelCommand:
            # From the record it lands on, not from the attempt's start: host
            # input acknowledged during the attempt (steering, follow-ups) is
            # in it, and stays queued.
            return ProviderCompleted(
                at=now, attempt_id=attempt_id, result=result, usage=_reports(usage)
            )

        await self._coordinator.commit_steps((Step(build_failed),))
        self._publisher.publish("response_failed", {"error": failure.to_dict()})
        self._state.attempt_id = None
        raise _TurnFailed(failure)

    def _response(self, attempt_id: str, outcome: AttemptOutcome) -> Step:
        """The ``provider_completed`` step of a response, still to commit; its
        ``response_completed`` event once it is."""
        state, publisher = self._state, self._publisher
        response, usage = outcome.message, outcome.usage

        streamed = freeze(outcome.calls) if outcome.streamed_calls else None

        def build(record: RunRecord, now: float) -> KernelCommand:
            frozen = freeze(response)
            result = (
                {"message": frozen} if streamed is None else {"message": frozen, "calls": streamed}
            )
            fields = {
                "attempt_id": attempt_id,
                "result": FrozenDict(result),  # frozen: stored as it is
                "messages": FrozenList((frozen,)),
                "usage": _reports(usage),
            }
            return build_command(ProviderCompleted, now, fields)

        def completed_event() -> None:
            if publisher.active:
                publisher.publish(
                    "response_completed",
                    {"message": response, "usage": usage[-1] if usage else None},
                )
            state.attempt_id = None

        return Step(build, completed_event)


def _reports(usage: list[Any] | None) -> Any:
    """The usage reports a response appends, frozen (``UNSET``: none)."""
    return FrozenList(freeze(report) for report in usage) if usage else UNSET


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
