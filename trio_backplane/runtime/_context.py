"""What a tool backend holds while it executes: its operation and
the context bound to that one effect."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..kernel import appended, freeze
from ..tools import PublicationReceipt, ToolRegistry, ToolResult
from ._catalog import CatalogState
from ._interactions import Interactions
from ._signals import _Stop, _StorageFailed
from ._state import Publisher, RunState
from ._steps import Step, checkpoint_step

__all__ = ["ContextHost", "Effect", "ToolContext", "ToolOperation", "stage"]

#: a nested call: ``(calling context, tool name, arguments) -> result``
Nested: TypeAlias = "Callable[[Effect, str, Any], Awaitable[ToolResult]]"


@final
@attrs.frozen(kw_only=True)
class ContextHost:
    """What a tool's context calls into: one per conversation."""

    state: RunState
    publisher: Publisher
    catalog: CatalogState
    interactions: Interactions
    nested: Nested
    #: commits steps now, with whatever a step carries (``StepWriter.flush``)
    record: Callable[[Step], Awaitable[None]]


def stage(
    state: RunState, catalog: CatalogState, publication: Any, producer: str | None = None
) -> PublicationReceipt:
    """Stage for ``producer`` (a tool's own context) and the tools that
    enclose it, or for every executing invocation (innermost last).  A
    nested call the producer made is not among them: its failure is the
    producer's to handle, not a reason to discard."""
    if (
        not state.executing
        or state.stop_reason is not None
        or state.inactive  # storage_failed: nothing can publish
    ):
        raise Error(ErrorClass.RESOURCE_CONFLICT, "staging requires an executing tool")
    producers = list(state.executing)
    if producer in producers:
        del producers[producers.index(producer) + 1 :]
    if state.pending is not None:
        raise Error(
            ErrorClass.RESOURCE_CONFLICT, "staging is not allowed during an interaction wait"
        )
    return catalog.stage(
        publication,
        run_id=state.run_id,
        incarnation=state.record.incarnation,
        producers=producers,
    )


@final
class Effect:
    """The runtime's side of one executing effect, shared by its
    ``ToolContext`` and the runtime: whether it still executes, what it
    left running (an interaction, a nested call) and who called it."""

    __slots__ = (
        "caller",
        "invocation_id",
        "live",
        "nested_busy",
        "nested_ended",
        "nested_stop",
        "tool",
        "waiting",
        "waits",
    )

    def __init__(self, tool: str, invocation_id: str, caller: Effect | None = None) -> None:
        self.tool = tool
        self.invocation_id = invocation_id
        #: the effect of the tool that made this nested call, if any
        self.caller = caller
        self.live = True
        self.nested_busy = False
        #: the scope of an ``interact`` waiting now: the effect's end cuts it
        self.waiting: trio.CancelScope | None = None
        #: the stop scope of the nested call executing now, and when the
        #: nested call (started from here) ended
        self.nested_stop: trio.CancelScope | None = None
        self.nested_ended: trio.Event | None = None
        #: one event per ``interact`` still running, set when it has ended
        #: (its withdrawal included): calls may end in any order
        self.waits: set[trio.Event] | None = None

    def executing(self) -> bool:
        """Whether this effect and every one enclosing it still execute."""
        effect: Effect | None = self
        while effect is not None:
            if not effect.live:
                return False
            effect = effect.caller
        return True

    def end(self) -> None:
        """Execution ended: every call through its context is refused now."""
        self.live = False
        if self.waiting is not None:
            # An interaction the effect left waiting (in a task that outlived
            # it) is bound to the effect: it ends with it, and is withdrawn.
            self.waiting.cancel()
        if self.nested_stop is not None:
            self.nested_stop.cancel()  # so is a nested call it left running


@final
class ToolContext:
    """Callables bound to one executing effect; each raises ``resource_conflict``
    once that effect has ended."""

    __slots__ = ("_effect", "_host")

    def __init__(self, host: ContextHost, effect: Effect) -> None:
        self._host = host
        self._effect = effect

    def emit(self, update: Mapping[str, Any]) -> None:
        """Forward ``update`` to subscribers as a transient ``tool_update``."""
        self._host.state.require_own_run()  # never from a worker thread
        if not self._effect.live:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "stale stream")
        if not isinstance(update, Mapping):
            raise Error(ErrorClass.VALIDATION, "a tool update must be a mapping")
        self._host.publisher.publish("tool_update", freeze(update, "tool update"))

    async def interact(self, request: Mapping[str, Any]) -> Any:
        """Ask a person; returns the committed answer. While waiting, the
        run and every armed effect deadline are suspended."""
        self._host.state.require_own_run()
        effect = self._effect
        if not isinstance(request, Mapping):
            raise Error(ErrorClass.VALIDATION, "an interaction request must be a mapping")
        if not effect.live:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "stale or overlapping interaction")

        with trio.CancelScope() as scope:
            # (an overlapping call, refused below, must not unbind the one
            # already waiting: it restores it)
            previous, effect.waiting = effect.waiting, scope
            ended = trio.Event()
            if effect.waits is None:
                effect.waits = set()
            effect.waits.add(ended)
            try:
                answer, _ = await self._host.interactions.wait(request)
            except _StorageFailed as failed:
                raise failed.error from None  # the backend sees storage_failed
            except _Stop:
                raise _stopping() from None  # settled meanwhile: classed for the backend
            finally:
                effect.waiting = previous
                ended.set()
                effect.waits.discard(ended)
            return answer
        # the effect ended while this waited
        raise Error(ErrorClass.RESOURCE_CONFLICT, "stale or overlapping interaction")

    async def record_resource(self, evidence: Mapping[str, Any]) -> None:
        """Commit ``evidence`` of a resource this tool started and that may
        outlive the host (a process group, say) into the run's record, with
        this invocation's id: recovery reports it after a crash."""
        self._host.state.require_own_run()
        if not isinstance(evidence, Mapping):
            raise Error(ErrorClass.VALIDATION, "resource evidence must be a mapping")
        if not self._effect.live:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "the effect has ended")
        entry = freeze({**evidence, "invocation_id": self._effect.invocation_id}, "evidence")
        step = checkpoint_step(lambda c: attrs.evolve(c, resources=appended(c.resources, entry)))
        try:
            await self._host.record(step)
        except _StorageFailed as failed:
            raise failed.error from None
        except _Stop:
            raise _stopping() from None

    @property
    def catalog_registry(self) -> ToolRegistry:
        """The registry of the catalog in force (read-only), for discovery tools
        that build the next catalog from it; never model-visible."""
        return self._host.catalog.bundle.registry

    def stage_catalog(self, publication: Any) -> PublicationReceipt:
        """Stage a catalog produced by this tool (synchronous)."""
        self._host.state.require_own_run()
        if not self._effect.executing():  # (a nested call whose caller ended stages nothing)
            raise Error(ErrorClass.RESOURCE_CONFLICT, "staging requires an executing tool")
        host = self._host
        return stage(host.state, host.catalog, publication, self._effect.invocation_id)

    async def nested_dispatch(self, tool_name: str, arguments: Any) -> ToolResult:
        """Run another tool from this one: one at a time, never itself, never an
        approval-gated tool; its own intent, work unit and deadline."""
        self._host.state.require_own_run()
        effect = self._effect
        if not effect.live or effect.nested_busy:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "nested dispatch is not available now")
        if tool_name == effect.tool:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "a tool cannot invoke itself")
        effect.nested_busy = True
        effect.nested_ended = trio.Event()
        try:
            return await self._host.nested(effect, tool_name, arguments)
        except _StorageFailed as failed:  # the nested intent or result commit failed
            raise failed.error from None
        except _Stop:
            raise _stopping() from None  # settled meanwhile: classed for the backend
        finally:
            effect.nested_busy = False
            effect.nested_ended.set()


def _stopping() -> Error:
    """What a backend sees from a call into a run that is stopping or settled."""
    return Error(ErrorClass.CANCELLED, "the run is stopping")


@final
@attrs.frozen
class ToolOperation:
    """What a backend's ``execute`` receives."""

    run_id: str
    incarnation: int
    step_id: str
    attempt_id: str
    invocation_id: str
    tool_call_id: str
    turn_id: str
    tool_name: str
    tool_revision: int
    catalog_revision: int
    arguments: Any
    caller: Any
    effective_authority: Any
    backend_context: Any
    context: ToolContext
