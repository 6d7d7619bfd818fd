"""The tool gateway: every model-requested call crosses it in one order:
validate, authorize, approve, intent, dispatch, result, transcript
projection (rules 1 and 3).  A call refused before its intent ran nothing
and is answered in the transcript all the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

import trio

from ..errors import Error, ErrorClass
from ..kernel import (
    FrozenList,
    KernelCommand,
    RunRecord,
    ToolCompleted,
    ToolInvoked,
    build_command,
    freeze,
    loads,
    thaw,
)
from ..tools import (
    Approval,
    ApprovalDecision,
    ToolDescriptor,
    arguments_digest,
    authorize,
    decide_approval,
    settlement,
)
from ._catalog import CatalogState
from ._context import ContextHost, Effect, ToolContext
from ._execution import (
    Executor,
    error_result,
    intent,
    invocation_number,
    new_invocation,
    started,
)
from ._interactions import Interactions
from ._options import HOST_RESOLVER
from ._signals import _Stop
from ._state import Publisher, RunState
from ._steps import Step, checkpoint_step
from ._writer import StepWriter

__all__ = ["ToolGateway"]


@final
class ToolGateway:
    """Takes one conversation's model-requested calls through the gateway."""

    __slots__ = (
        "_catalog",
        "_executor",
        "_host",
        "_interactions",
        "_publisher",
        "_state",
        "_writer",
    )

    def __init__(  # noqa: PLR0917 - the parts it calls on
        self,
        state: RunState,
        executor: Executor,
        writer: StepWriter,
        publisher: Publisher,
        catalog: CatalogState,
        interactions: Interactions,
        host: ContextHost,
    ) -> None:
        self._state = state
        self._executor = executor
        self._writer = writer
        self._publisher = publisher
        self._catalog = catalog
        self._interactions = interactions
        self._host = host

    async def call(
        self,
        call: Mapping[str, Any],
        turn_id: str,
        *,
        before: Step | None = None,
        carry: bool = False,
    ) -> None:
        """One call, in the gateway's order.  ``before`` (the response's
        ``provider_completed``) is committed with the first durable step of
        this call; with ``carry`` the tool message waits for the next commit
        (the writer's carry)."""
        name = call.get("name")
        call_id = str(call.get("id"))
        bundle = self._catalog.bundle  # pinned for the batch: publication waits for its end
        descriptor = bundle.registry.get(name) if isinstance(name, str) else None
        if descriptor is None:
            error = Error(ErrorClass.NOT_FOUND, "tool is not registered", {"tool": name})
            await self._refused(call_id, name, turn_id, error, (before, carry))
            return
        try:
            arguments = _arguments(call.get("arguments"))
            self._executor.validator(descriptor).validate(arguments)
            authorize(
                bundle.authority,
                descriptor,
                new_invocation(self._state.run_id, descriptor.name, descriptor.revision),
            )
            if descriptor.requires_approval:
                await self._writer.flush(before)  # the response is durable before a human sees it
                before = None
                await self._approve(descriptor, call_id, turn_id, arguments)
        except Error as error:
            await self._refused(call_id, name, turn_id, error, (before, carry))
            return
        record = await self._writer.effect_commit(
            ToolInvoked, intent(descriptor, call_id, turn_id, bundle.authority), before
        )
        invocation_id = max(record.active_tools, key=invocation_number)
        await self._dispatch(
            descriptor, record, (invocation_id, call_id, turn_id), arguments, carry
        )

    async def _refused(
        self,
        call_id: str,
        name: Any,
        turn_id: str,
        error: Error,
        where: tuple[Step | None, bool],
    ) -> None:
        """A call refused before it ran: its error as its tool message."""
        recorder = self._state.telemetry
        if recorder is not None:
            recorder.tool_refused(call_id, name, turn_id, error)
        await self._tool_message(call_id, name, error_result(error), *where)

    async def _approve(
        self, descriptor: ToolDescriptor, call_id: str, turn_id: str, arguments: Any
    ) -> None:
        """A permission interaction before any intent; only the exact
        answer "approved" passes, checked by ``decide_approval`` against the
        invocation about to dispatch."""
        state = self._state
        record = state.record
        digest = arguments_digest(arguments)
        approval = Approval(
            approval_id=state.new_id("approval"),
            run_id=state.run_id,
            incarnation=record.incarnation,
            tool_name=descriptor.name,
            tool_revision=descriptor.revision,
            arguments_digest=digest,
            expires_at=record.deadline if record.deadline is not None else float("inf"),
        )
        operation = {
            "approval_id": approval.approval_id,
            "run_id": state.run_id,
            "incarnation": record.incarnation,
            "turn_id": turn_id,
            "tool_call_id": call_id,
            "tool_name": descriptor.name,
            "tool_revision": descriptor.revision,
            "arguments": arguments,
            "arguments_digest": digest,
            # wall-clock seconds, UTC: any process reads the same instant
            "expires_at": record.deadline,
        }
        answer, waited = await self._interactions.wait(
            {"kind": "permission", "operation": operation}
        )
        if not (type(answer) is str and answer == "approved"):
            raise Error(ErrorClass.FORBIDDEN, "approval denied", {"tool": descriptor.name})
        decision = ApprovalDecision(
            approval_id=approval.approval_id,
            run_id=state.run_id,
            incarnation=state.record.incarnation,
            tool_name=descriptor.name,
            tool_revision=descriptor.revision,
            arguments_digest=arguments_digest(arguments),
            decision="approved",
            resolver_id=HOST_RESOLVER,
        )
        # The approval expires with the run deadline it was asked under; the
        # human wait itself does not count (the deadline moved by it).
        decide_approval(approval, decision, now=state.wall_now() - waited)

    async def _dispatch(
        self,
        descriptor: ToolDescriptor,
        record: RunRecord,
        ids: tuple[str, str, str],
        arguments: Any,
        carry: bool,
    ) -> None:
        """Execute the call whose intent ``record`` holds and commit its
        result with its transcript message (or carry them)."""
        invocation_id, call_id, turn_id = ids
        executor = self._executor
        effect = Effect(descriptor.name, invocation_id)
        operation = executor.operation(
            descriptor,
            record,
            invocation_id,
            call_id,
            turn_id,
            arguments,
            ToolContext(self._host, effect),
        )
        if self._publisher.active:
            self._publisher.publish("tool_started", {"invocation": started(operation)})
        result, timed_out = await executor.execute(descriptor, operation, effect)
        if timed_out:
            self._writer.uncertain(
                Error(
                    ErrorClass.TIMEOUT,
                    "tool outlived effect_timeout",
                    {"certainty": "uncertain", "effect": f"tool:{invocation_id}"},
                )
            )
        if settlement(result, descriptor, operation) == "uncertain":
            executor.uncertain_result(result, descriptor, invocation_id)
        normalized = executor.normalize(result, descriptor)
        # A result returned after cancel() is never committed: the effect
        # stays unsettled evidence and the run ends unknown_outcome.
        await trio.lowlevel.checkpoint_if_cancelled()
        step = self._completion(invocation_id, call_id, descriptor.name, normalized)
        if carry:
            self._writer.carry = (step,)
            return
        try:
            await self._writer.flush(step, projection=True)
        except Error as error:
            if error.error_class is not ErrorClass.TIMEOUT:
                raise
            self._writer.missed_deadline((step,))
            raise _Stop from None

    def _completion(
        self, invocation_id: str, call_id: str, name: str, normalized: Mapping[str, Any]
    ) -> Step:
        """The ``tool_completed`` step of a settled result, its transcript
        message in the same command: a result is durable no later than the
        message showing it.  Settled, and the message
        published, only once it is committed: until then the effect is
        unsettled evidence."""
        state, catalog, publisher = self._state, self._catalog, self._publisher
        message = freeze(
            {"role": "tool", "tool_call_id": call_id, "name": name, "result": normalized}
        )

        def build(record: RunRecord, now: float) -> KernelCommand:
            fields = {
                "invocation_id": invocation_id,
                "result": normalized,
                "messages": FrozenList((message,)),
            }
            return build_command(ToolCompleted, now, fields)

        def settled() -> None:
            state.unsettled.pop(invocation_id, None)
            catalog.producer_settled(invocation_id, success=not normalized.get("is_error"))
            publisher.publish("tool_completed", {"message": message})

        return Step(build, settled, settles=invocation_id)

    async def _tool_message(
        self,
        call_id: str,
        name: Any,
        result: Mapping[str, Any],
        before: Step | None = None,
        carry: bool = False,
    ) -> None:
        """The transcript message of a call that ran nothing (a refusal), its
        ``tool_completed`` event once committed; with ``carry`` (and
        nothing ``before`` it) committed with the next provider attempt's
        intent."""
        publisher = self._publisher
        message = {"role": "tool", "tool_call_id": call_id, "name": name, "result": result}
        step = checkpoint_step(
            lambda c: c.with_message(message),
            after=lambda: publisher.publish("tool_completed", {"message": message}),
        )
        if carry and before is None:
            self._writer.carry = (step,)
            return
        await self._writer.flush(before, step, projection=before is None)


def _arguments(arguments: Any) -> Any:
    """A call's arguments as plain data: JSON text decoded (``validation``
    when it is not JSON), a frozen value (bounded depth: frozen with the
    response) thawed."""
    if not isinstance(arguments, str):
        return thaw(arguments)
    try:
        return loads(arguments)  # plain data already
    except (ValueError, RecursionError) as exc:
        raise Error(
            ErrorClass.VALIDATION,
            "tool arguments are not JSON",
            {"reason": "nesting" if isinstance(exc, RecursionError) else "syntax"},
        ) from None
