"""Running one tool backend, for the gateway and for nested calls alike:
its operation, its effect budget and stop scope, and its outcome as the
run commits it (normalized, redacted, bounded) or as evidence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import RunRecord, ToolCompleted, freeze, thaw, utf8_size
from ..kernel._construct import fast_constructor
from ..schema import CompiledSchema, compile_with
from ..tools import Invocation, Rejection, ToolDescriptor, ToolResult
from ._catalog import CatalogState
from ._context import Effect, ToolContext, ToolOperation
from ._coordinator import Coordinator
from ._deadline import DeadlineBudget
from ._redact import redacted, scrub, secrets_of
from ._signals import _Stop, only_the_cut
from ._state import RunState
from ._steps import command_step
from ._writer import StepWriter

__all__ = [
    "CallerEnded",
    "Executor",
    "error_result",
    "intent",
    "invocation_number",
    "new_invocation",
    "plain",
    "started",
]

# Built for every call: without attrs' __init__ (see fast_constructor).
_operation: Final = fast_constructor(ToolOperation)
#: ``Invocation(run_id, tool_name, tool_revision)``, what ``authorize`` reads
new_invocation: Final = fast_constructor(Invocation)


class CallerEnded(Exception):
    """Internal: a nested call was cut because its caller's execution ended."""


def plain(value: Any, what: str) -> Any:
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


def error_result(error: Error) -> Mapping[str, Any]:
    """The normalized (frozen) result of a refused or failed call: JSON data
    whatever the error quotes (``Error.to_dict`` makes its text Unicode)."""
    plain_error = error.to_dict()
    result: Mapping[str, Any] = freeze(
        {
            "content": plain_error["message"],
            "structured_content": None,
            "is_error": True,
            "error": plain_error,
        }
    )
    return result


@final
class Executor:
    """Runs backends for one conversation."""

    __slots__ = (
        "_catalog",
        "_cleanup_timeout",
        "_coordinator",
        "_effect_timeout",
        "_output_limit",
        "_state",
        "_validators",
        "_writer",
    )

    def __init__(
        self,
        state: RunState,
        coordinator: Coordinator,
        writer: StepWriter,
        catalog: CatalogState,
        *,
        effect_timeout: float,
        cleanup_timeout: float,
        output_limit: int,
    ) -> None:
        self._state = state
        self._coordinator = coordinator
        self._writer = writer
        self._catalog = catalog
        self._effect_timeout = effect_timeout
        self._cleanup_timeout = cleanup_timeout
        self._output_limit = output_limit
        self._validators: dict[int, tuple[ToolDescriptor, CompiledSchema]] = {}

    def validator(self, descriptor: ToolDescriptor) -> CompiledSchema:
        """The descriptor's compiled input schema, compiled once per descriptor
        object for this run (the schema object is the one admitted),
        so a call does not pay for fingerprinting its schema."""
        held = self._validators.get(id(descriptor))
        if held is not None and held[0] is descriptor:
            return held[1]
        compiled = compile_with(descriptor.schema, descriptor.schema_options)
        if len(self._validators) >= 1024:
            self._validators.clear()
        self._validators[id(descriptor)] = (descriptor, compiled)
        return compiled

    def operation(  # noqa: PLR0917 - one call's whole identity
        self,
        descriptor: ToolDescriptor,
        record: RunRecord,
        invocation_id: str,
        call_id: str,
        turn_id: str,
        arguments: Any,
        context: ToolContext,
    ) -> ToolOperation:
        """What the backend's ``execute`` receives for the intent ``record`` holds."""
        state = self._state
        authority = self._catalog.bundle.authority
        return _operation(
            run_id=state.run_id,
            incarnation=record.incarnation,
            step_id=str(record.step_id),
            # the attempt whose response holds the call (the last one: a
            # call runs only after its response committed)
            attempt_id=str(_response_attempt(record)),
            invocation_id=invocation_id,
            tool_call_id=call_id,
            turn_id=turn_id,
            tool_name=descriptor.name,
            tool_revision=descriptor.revision,
            catalog_revision=state.held().catalog_revision or 1,
            arguments=arguments,
            caller=authority.caller,
            effective_authority=authority,
            backend_context=descriptor.backend_context,
            context=context,
        )

    async def execute(
        self, descriptor: ToolDescriptor, operation: ToolOperation, effect: Effect
    ) -> tuple[Any, bool]:
        """Run the backend under its own effect budget: ``(outcome, timed out)``.
        Its context expires when execution ends, before settlement.

        A nested invocation's deadline lies inside the outer one: at most half
        of what the outer tool has left, so a nested timeout always leaves the
        outer tool time to react."""
        state = self._state
        invocation_id, caller = operation.invocation_id, effect.caller
        state.unsettled[invocation_id] = "tool dispatched; outcome unknown"
        seconds = self._effect_timeout
        if state.effects:
            seconds = min(seconds, state.effects[-1].remaining() / 2)
        budget = DeadlineBudget("effect", seconds, state.now)
        recorder = state.telemetry
        if recorder is not None:  # (its caller: the invocation executing now)
            recorder.tool_started(operation, state.executing[-1] if state.executing else None)
        state.effects.append(budget)
        state.executing.append(invocation_id)
        result: Any = None  # (cut before it returned: its budget's scope took the cancellation)
        try:
            with budget.arm() as scope:
                result = await self._run_backend(descriptor, operation, scope, caller)
        finally:
            effect.end()
            state.effect_stops.discard(scope)
            state.effects.remove(budget)
            state.executing.remove(invocation_id)
            if caller is not None:
                caller.nested_stop = None
            if recorder is not None:
                if isinstance(result, Error):  # the backend's text may quote its secrets
                    result = redacted(result, secrets_of(descriptor.backend_context))
                recorder.tool_ended(operation, result, budget.timed_out(), state.stop_reason)
        if state.stop_reason is not None:
            # The run stopped while it executed: its outcome stays unsettled,
            # whatever it returned or however long it took.
            raise _Stop
        if scope.cancelled_caught and caller is not None and not caller.live:
            raise CallerEnded  # a nested call its caller left running
        if effect.nested_busy or effect.waits:
            await self._nested_left_running(effect)
        return result, budget.timed_out()

    async def _run_backend(
        self,
        descriptor: ToolDescriptor,
        operation: ToolOperation,
        scope: trio.CancelScope,
        caller: Effect | None,
    ) -> Any:
        """The backend's outcome (a result, a rejection or what it raised)
        inside its armed ``scope``."""
        # A stop of the run cancels the effect's scope, wherever its task
        # runs (a nested call in a host's task is out of the worker's
        # reach; in the worker, the worker's own cancellation goes on past it).
        self._state.effect_stops.add(scope)
        if self._state.stop_reason is not None:
            scope.cancel()
        if caller is not None:  # (live: checked after the intent committed)
            caller.nested_stop = scope  # the caller's end ends it too
        try:
            recorder = self._state.telemetry
            if recorder is None:
                return await descriptor.backend.execute(operation)
            with recorder.current(f"tool:{operation.invocation_id}"):
                return await descriptor.backend.execute(operation)
        except Error as error:
            return error
        except trio.Cancelled:
            raise
        except Exception as exc:
            return exc
        except BaseExceptionGroup as group:
            cut = only_the_cut(group)
            if cut is group:
                raise
            raise cut from None

    async def _nested_left_running(self, effect: Effect) -> None:
        """A nested call or an interaction the tool left running (in a
        host's task) ended with it (``_end``): each is over before this call
        is settled, and before the batch goes on (an interaction
        left pending would refuse the next call's approval).  A nested call
        that outlives its cancellation too is out of reach: the run stops
        ``unknown_outcome``."""
        running = list(effect.waits or ())
        if effect.nested_busy and effect.nested_ended is not None:
            running.append(effect.nested_ended)
        with trio.CancelScope(shield=True) as bound:  # one bound for them all
            bound.deadline = trio.current_time() + self._cleanup_timeout
            for ended in running:
                await ended.wait()
        if effect.nested_busy:
            self._writer.uncertain(
                Error(
                    ErrorClass.UNKNOWN_OUTCOME,
                    "a nested call outlived its caller and its cancellation",
                    {"tool": effect.tool},
                )
            )

    async def complete(
        self, invocation_id: str, normalized: Mapping[str, Any], *, unless_stopped: bool = False
    ) -> None:
        """Commit a settled result alone (a nested call's: no transcript
        message shows it); ``unless_stopped``: not once the run stops,
        however long the commit waits for the coordinator (``_Stop`` then)."""
        state = self._state
        step = command_step(ToolCompleted, {"invocation_id": invocation_id, "result": normalized})
        try:
            await self._coordinator.commit_steps((step,), as_input=unless_stopped)
        except Error as error:
            if unless_stopped and state.stop_reason is not None:
                raise _Stop from None  # refused: the run stopped meanwhile
            if error.error_class is ErrorClass.TIMEOUT:
                state.unsettled[invocation_id] = "result not committed before the deadline"
                self._writer.stop("deadline_exceeded")
                raise _Stop from None
            raise
        # Settled only once its result is committed: a result (a rejection
        # included) returned after cancel() never commits, so the effect stays
        # unsettled evidence and the run ends unknown_outcome.
        state.unsettled.pop(invocation_id, None)  # (a nested call withdrawn: never in it)
        self._catalog.producer_settled(invocation_id, success=not normalized.get("is_error"))

    def uncertain_result(self, result: Any, descriptor: ToolDescriptor, invocation_id: str) -> None:
        """Stop the run as unknown_outcome for an uncertain tool outcome (rule 4),
        raising ``_Stop``; what it quotes of the tool's ``backend_context`` is
        redacted."""
        reason = _uncertainty(result, descriptor)
        self._state.unsettled[invocation_id] = reason.message
        self._writer.uncertain(reason)

    def normalize(self, result: Any, descriptor: ToolDescriptor) -> Mapping[str, Any]:
        """The result as committed and projected: frozen once, here, so the
        result command, the tool message and its event share it unwalked.
        A refusal quoting the tool's ``backend_context`` has it redacted;
        what a result says is the backend's own output."""
        if isinstance(result, ToolResult):
            try:
                normalized: Mapping[str, Any] = freeze(result.to_dict(), "tool result")
                size = utf8_size(normalized)
            except Exception as exc:  # the result's own parts may fail when read
                cause = exc.message if isinstance(exc, Error) else f"{type(exc).__name__}: {exc}"
                return error_result(
                    Error(
                        ErrorClass.VALIDATION,
                        "tool result is not JSON data",
                        {"cause": cause[:300]},
                    )
                )
            return self._bounded(normalized, size)
        error = result.error if isinstance(result, Rejection) else result
        assert isinstance(error, Error)
        error = redacted(error, secrets_of(descriptor.backend_context))
        # A refusal's message and details are the backend's output too.
        refused = error_result(error)
        return self._bounded(refused, utf8_size(refused))

    def _bounded(self, normalized: Mapping[str, Any], size: int) -> Mapping[str, Any]:
        limit = self._output_limit
        if size <= limit:
            return normalized
        return error_result(
            Error(
                ErrorClass.RESOURCE_CONFLICT,
                "tool output exceeds the configured bound",
                {"scope": "tool_result", "size": size, "limit": limit},
            )
        )


def _uncertainty(result: Any, descriptor: ToolDescriptor) -> Error:
    """Why an outcome leaves the effect unknown, as ``unknown_outcome``."""
    secrets = secrets_of(descriptor.backend_context)
    if isinstance(result, Rejection):
        return Error(
            ErrorClass.UNKNOWN_OUTCOME,
            "tool rejection does not prove exact non-dispatch",
            {"tool": descriptor.name},
        )
    if isinstance(result, Error):
        return Error(
            ErrorClass.UNKNOWN_OUTCOME,
            "tool failed after dispatch; its effect is unknown",
            {"tool": descriptor.name, "cause": redacted(result, secrets).to_dict()},
        )
    if isinstance(result, BaseException):
        cause = scrub(f"{type(result).__name__}: {result}", secrets)
        return Error(
            ErrorClass.UNKNOWN_OUTCOME,
            "tool crashed after dispatch",
            {"tool": descriptor.name, "cause": cause[:500]},
        )
    return Error(
        ErrorClass.UNKNOWN_OUTCOME,
        "tool returned neither a ToolResult nor a rejection",
        {"tool": descriptor.name, "type": type(result).__name__},
    )


def intent(
    descriptor: ToolDescriptor, call_id: str | None, turn_id: str, authority: Any
) -> Mapping[str, Any]:
    """The durable intent of one invocation: no grants, no credentials.
    Frozen as built (the command takes it unwalked)."""
    data: dict[str, Any] = {
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
        data["tool_call_id"] = call_id
    frozen: Mapping[str, Any] = freeze(data)
    return frozen


def started(operation: ToolOperation) -> dict[str, Any]:
    """The ``tool_started`` event's invocation."""
    return {
        "invocation_id": operation.invocation_id,
        "tool_call_id": operation.tool_call_id,
        "step_id": operation.step_id,
        "tool_name": operation.tool_name,
        "tool_revision": operation.tool_revision,
        # a read-only copy: no subscriber can edit what the backend runs
        # with, nor what another subscriber receives
        "arguments": freeze(operation.arguments, "tool arguments"),
    }


def invocation_number(invocation_id: str) -> int:
    return int(invocation_id.rsplit("-", 1)[-1])


def _response_attempt(record: RunRecord) -> Any:
    result = record.provider_result
    return None if result is None else result.get("attempt_id")
