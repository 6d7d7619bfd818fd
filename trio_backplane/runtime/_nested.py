"""Nested calls: a tool running another tool through its context.
Each has its own intent, work unit and deadline inside its
caller's; none outlives its caller's execution, and none is dispatched once
the run stops."""

from __future__ import annotations

from typing import Any, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import RunRecord, ToolInvoked, thaw
from ..tools import ToolDescriptor, ToolResult, authorize, settlement
from ._catalog import CatalogState
from ._context import ContextHost, Effect, ToolContext, ToolOperation
from ._execution import (
    CallerEnded,
    Executor,
    error_result,
    intent,
    invocation_number,
    new_invocation,
    plain,
    started,
)
from ._interactions import Interactions
from ._signals import _Stop, _TurnFailed
from ._state import Publisher, RunState
from ._writer import StepWriter

__all__ = ["NestedCalls"]


def _require_time_left(state: RunState, descriptor: ToolDescriptor) -> None:
    """Raise ``timeout`` when the innermost executing effect (the nested
    call's caller) has no time left."""
    if state.effects and state.effects[-1].remaining() <= 0:
        raise Error(
            ErrorClass.TIMEOUT,
            "the calling tool's deadline has passed",
            {"tool": descriptor.name, "certainty": "not_dispatched"},
        )


def _caller_ended(descriptor: ToolDescriptor) -> Error:
    """What a nested call's host task gets once its caller's execution ended."""
    return Error(
        ErrorClass.RESOURCE_CONFLICT,
        "the calling tool's execution ended",
        {"tool": descriptor.name},
    )


@final
class NestedCalls:
    """Runs the nested calls of one conversation's tools; ``host`` is what
    every tool context of the conversation calls into."""

    __slots__ = ("_catalog", "_executor", "_publisher", "_state", "_writer", "host")

    def __init__(  # noqa: PLR0917 - the parts it calls on
        self,
        state: RunState,
        executor: Executor,
        writer: StepWriter,
        publisher: Publisher,
        catalog: CatalogState,
        interactions: Interactions,
    ) -> None:
        self._state = state
        self._executor = executor
        self._writer = writer
        self._publisher = publisher
        self._catalog = catalog
        self.host = ContextHost(
            state=state,
            publisher=publisher,
            catalog=catalog,
            interactions=interactions,
            nested=self.dispatch,
            record=writer.flush,
        )

    async def dispatch(self, outer: Effect, tool_name: str, arguments: Any) -> ToolResult:
        """A nested invocation on behalf of ``outer``."""
        state = self._state
        descriptor, arguments = self._admission(tool_name, arguments)
        outer_call = state.record.active_tools.get(outer.invocation_id, {})
        call_id = f"{outer_call.get('tool_call_id', outer.invocation_id)}/nested"
        turn_id = str(outer_call.get("turn_id", ""))
        record, invocation_id = await self._intent(outer, descriptor, turn_id)
        effect = Effect(descriptor.name, invocation_id, caller=outer)
        operation = self._executor.operation(
            descriptor,
            record,
            invocation_id,
            call_id,
            turn_id,
            arguments,
            ToolContext(self.host, effect),
        )
        if self._publisher.active:
            self._publisher.publish("tool_started", {"invocation": started(operation)})
        try:
            result, timed_out = await self._executor.execute(descriptor, operation, effect)
        except (trio.Cancelled, CallerEnded) as interrupted:
            if state.stop_reason is None:
                await self._cut(descriptor, invocation_id)
            if isinstance(interrupted, CallerEnded):
                raise _caller_ended(descriptor) from None
            raise
        return await self._result(descriptor, operation, result, timed_out)

    def _admission(self, tool_name: str, arguments: Any) -> tuple[ToolDescriptor, Any]:
        """The descriptor and plain arguments of a nested call the gateway
        admits: registered, not approval-gated, valid, authorized."""
        bundle = self._catalog.bundle
        descriptor = bundle.registry.get(tool_name) if isinstance(tool_name, str) else None
        if descriptor is None:
            raise Error(ErrorClass.NOT_FOUND, "tool is not registered", {"tool": tool_name})
        if descriptor.requires_approval:
            raise Error(
                ErrorClass.APPROVAL_REQUIRED,
                "a nested call cannot run an approval-gated tool",
                {"tool": descriptor.name},
            )
        arguments = plain(arguments, "nested tool arguments")
        self._executor.validator(descriptor).validate(arguments)
        authorize(
            bundle.authority,
            descriptor,
            new_invocation(self._state.run_id, descriptor.name, descriptor.revision),
        )
        return descriptor, arguments

    async def _intent(
        self, outer: Effect, descriptor: ToolDescriptor, turn_id: str
    ) -> tuple[RunRecord, str]:
        """Commit a nested call's intent: the record and its invocation id.
        None is dispatched once its caller's deadline has passed or its
        caller's execution ended (withdrawn then)."""
        state = self._state
        outer_record = state.record
        # No effect starts once its caller's deadline has passed: a
        # caller shielding itself past it gets a timeout, no intent, no work.
        _require_time_left(self._state, descriptor)
        try:
            record = await self._writer.effect_commit(
                ToolInvoked,
                intent(descriptor, None, turn_id, self._catalog.bundle.authority),
                unless_stopped=True,  # its task may be a host's, never cancelled by a stop
            )
        except _TurnFailed as failed:
            raise failed.error from None  # (a _Stop: classed by nested_dispatch)
        except trio.Cancelled:
            # Cut by the calling tool's own scope once its intent may have
            # committed: never dispatched, so withdrawn (a stop of the run
            # settles its intents itself).
            added = [i for i in state.record.active_tools if i not in outer_record.active_tools]
            for invocation_id in added:
                await self._withdraw(invocation_id, descriptor, "cancelled by its caller")
            raise
        invocation_id = max(record.active_tools, key=invocation_number)
        if not outer.live:  # its caller's execution ended while the intent committed
            await self._withdraw(invocation_id, descriptor, "its caller's execution ended")
            raise _caller_ended(descriptor)
        try:
            _require_time_left(self._state, descriptor)  # the intent's commit took the rest
        except Error as late:
            await self._withdraw(invocation_id, descriptor, late.message)
            raise
        return record, invocation_id

    async def _cut(self, descriptor: ToolDescriptor, invocation_id: str) -> None:
        """Cut by the calling tool's own scope, not by a stop of the run, after
        dispatch: a read-only call did nothing lasting (settled as an error);
        a mutating one stays unresolved and stops the run, whatever the
        caller does next."""
        if descriptor.read_only:
            cut = Error(
                ErrorClass.CANCELLED,
                "nested tool cancelled by its caller",
                {"tool": descriptor.name, "certainty": "no_effect"},
            )
            await self._complete_cut(invocation_id, error_result(cut))
            return
        self._state.unsettled[invocation_id] = "nested tool cancelled by its caller"
        self._writer.stop_uncertain(
            Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "nested tool cancelled by its caller after dispatch; its effect is unknown",
                {"tool": descriptor.name},
            )
        )

    async def _result(
        self, descriptor: ToolDescriptor, operation: ToolOperation, result: Any, timed_out: bool
    ) -> ToolResult:
        """Settle a nested call's result and hand it to the calling tool."""
        invocation_id = operation.invocation_id
        if timed_out and descriptor.read_only:
            # A read-only nested timeout did nothing lasting: settle it as an
            # error and let the outer tool decide.
            error = Error(
                ErrorClass.TIMEOUT,
                "nested tool outlived its deadline",
                {"tool": descriptor.name, "certainty": "no_effect"},
            )
            await self._complete(invocation_id, error_result(error))
            raise error
        if timed_out:
            result = Error(ErrorClass.TIMEOUT, "nested tool outlived its deadline")
        if settlement(result, descriptor, operation) == "uncertain":
            # A mutating nested failure stays unresolved whatever the outer
            # tool does with the error.
            try:
                self._executor.uncertain_result(result, descriptor, invocation_id)
            except _Stop:
                raise Error(
                    ErrorClass.UNKNOWN_OUTCOME,
                    "nested tool outcome is unknown",
                    {"tool": descriptor.name},
                ) from None
        normalized = self._executor.normalize(result, descriptor)
        await self._complete(invocation_id, normalized)
        return ToolResult(  # plain data for the outer tool, as a backend returns it
            content=thaw(normalized["content"]),
            structured_content=thaw(normalized.get("structured_content")),
            is_error=bool(normalized.get("is_error")),
        )

    async def _withdraw(self, invocation_id: str, descriptor: ToolDescriptor, reason: str) -> None:
        """Settle a nested intent that was committed and never dispatched as
        an error result (its caller may be cancelled): the work unit stays
        spent, the backend never ran."""
        error = Error(
            ErrorClass.CANCELLED,
            f"nested tool not dispatched: {reason}",
            {"tool": descriptor.name, "certainty": "not_dispatched"},
        )
        await self._complete_cut(invocation_id, error_result(error))

    async def _complete(self, invocation_id: str, normalized: Any) -> None:
        """Commit a nested call's settled result, never once the run stops
        (its task may be a host's, which a stop does not cancel);
        its caller's own scope cutting the commit does not leave a known
        result unsettled."""
        try:
            await self._executor.complete(invocation_id, normalized, unless_stopped=True)
        except trio.Cancelled:
            await self._complete_cut(invocation_id, normalized)
            raise

    async def _complete_cut(self, invocation_id: str, normalized: Any) -> None:
        """Commit a nested call's result while its caller's scope is cut:
        shielded, and never once the run stops (a result after cancel() is
        never committed: the run's settlement then holds the call
        unsettled, or withdraws one never dispatched)."""
        if self._state.stop_reason is not None:
            return
        with trio.CancelScope(shield=True):
            await self._executor.complete(invocation_id, normalized, unless_stopped=True)
