"""``open_conversation`` and ``Conversation``: the facade a host holds.

One conversation owns one nursery and is a handful of parts built here and
handed to each other: the run state and its publisher (``_state``), the
commit coordinator (``_coordinator``), the turn loop (``_loop``) with the
provider attempts (``_responses``) and the tool gateway (``_gateway``,
``_execution``, ``_nested``), human interactions (``_interactions``) and the
settlement (``_settlement``).  Everything durable goes through the
coordinator; the turn loop runs in one worker task under the run deadline;
cancellation is accepted at once, then the worker is cancelled and a
shielded cleanup settles the run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, final

import attrs
import trio

from .._public import NoPublicConstructor
from ..errors import Error, ErrorClass
from ..kernel import TERMINAL_STATES, Admit, ProviderCompleted, RunRecord, freeze
from ..store import Store
from ..tools import (
    AdmittedBundle,
    Authority,
    ProviderTool,
    PublicationReceipt,
    ToolRegistry,
    admit_batch,
)
from ._catalog import CatalogState
from ._context import stage
from ._conversation_state import QueueName, initial_context
from ._coordinator import Coordinator
from ._deadline import DeadlineBudget
from ._execution import Executor
from ._gateway import ToolGateway
from ._hooks import HookRunner
from ._input import check_content
from ._interactions import Interactions
from ._loop import TurnLoop
from ._nested import NestedCalls
from ._nursery import owning_nursery
from ._options import Options, check_inputs, check_options
from ._resources import OwnedRegistries, check_resources
from ._responses import Responses
from ._resume import ABANDONED, ResumePoint, resume_point
from ._settlement import Settlement
from ._signals import _Rejected, _StorageFailed, storage_error
from ._state import Publisher, RunState
from ._steps import Step, checkpoint_step, command_step
from ._telemetry import TRACE_KEY, Telemetry, traced
from ._types import Event, Phase, Snapshot
from ._writer import StepWriter

__all__ = ["Conversation", "open_conversation"]


@final
@attrs.frozen(kw_only=True)
class _Parts:
    """One conversation's parts, wired."""

    state: RunState
    publisher: Publisher
    coordinator: Coordinator
    catalog: CatalogState
    hooks: HookRunner
    interactions: Interactions
    settlement: Settlement


def _assemble(
    state: RunState,
    store: Store,
    options: Options,
    nursery: trio.Nursery,
    *,
    bundle: AdmittedBundle,
    host: tuple[Any, Mapping[str, Any] | None, Any],
) -> _Parts:
    """Build the parts and hand each the ones it calls on; ``host``: the
    provider, its context and the hooks."""
    publisher = Publisher(state)
    catalog = CatalogState(bundle, options.schema_admission)
    # The coordinator reports a storage failure to the settlement, which
    # stops the worker that commits through the coordinator: one of them
    # learns of the other after both exist.
    settlement: Settlement | None = None

    def storage_failed(error: Error) -> None:
        assert settlement is not None
        settlement.storage_failed(error)

    coordinator = Coordinator(
        state, store, commit_timeout=options.commit_timeout, failed=storage_failed
    )
    catalog.on_publish = lambda bundle: state.owned.adopt(bundle.registry)
    settlement = Settlement(state, coordinator, publisher, catalog, options, nursery)
    parts = _Parts(
        state=state,
        publisher=publisher,
        coordinator=coordinator,
        catalog=catalog,
        hooks=HookRunner(state, publisher, host[2], options.effect_timeout),
        interactions=Interactions(state, coordinator, publisher),
        settlement=settlement,
    )
    settlement.runs(_turn_loop(parts, options, provider=host[0], provider_context=host[1]).run)
    return parts


def _turn_loop(
    parts: _Parts, options: Options, *, provider: Any, provider_context: Mapping[str, Any] | None
) -> TurnLoop:
    """The worker's parts: the turn loop, its provider attempts and its gateway."""
    state, coordinator, publisher, catalog = (
        parts.state,
        parts.coordinator,
        parts.publisher,
        parts.catalog,
    )
    writer = StepWriter(state, coordinator, parts.settlement.request_stop)
    executor = Executor(
        state,
        coordinator,
        writer,
        catalog,
        effect_timeout=options.effect_timeout,
        cleanup_timeout=options.cleanup_timeout,
        output_limit=options.output_limit,
    )
    nested = NestedCalls(state, executor, writer, publisher, catalog, parts.interactions)
    responses = Responses(
        state,
        coordinator,
        writer,
        publisher,
        catalog,
        options,
        provider=provider,
        provider_context=provider_context,
    )
    gateway = ToolGateway(
        state, executor, writer, publisher, catalog, parts.interactions, nested.host
    )
    return TurnLoop(
        state,
        coordinator,
        writer,
        publisher,
        catalog,
        responses=responses,
        gateway=gateway,
        hooks=parts.hooks,
    )


@final
class Conversation(metaclass=NoPublicConstructor):
    """A live conversation: ``open_conversation`` makes one, and it is valid
    only inside that block."""

    def __init__(self, *, parts: _Parts, options: Options) -> None:
        self.run_id = parts.state.run_id
        self._state = parts.state
        self._publisher = parts.publisher
        self._coordinator = parts.coordinator
        self._catalog = parts.catalog
        self._hooks = parts.hooks
        self._interactions = parts.interactions
        self._settlement = parts.settlement
        self._options = options

    def status(self) -> Snapshot:
        """The last committed state."""
        state = self._state
        conversation = state.conversation
        return Snapshot(
            phase=state.phase,
            run=state.record,
            messages=tuple(conversation.messages),
            steering=tuple(conversation.steering),
            follow_up=tuple(conversation.follow_up),
            queue_status=conversation.queue_status,
            usage=tuple(conversation.usage),
            turn_id=conversation.turn_id,
            pending_interaction=conversation.pending_interaction,
            last_error=state.last_error,
            catalog_revision=(
                self._catalog.revision
                if conversation.catalog_revision is None
                else conversation.catalog_revision
            ),
            receipts=self._catalog.receipts,
            resource_cleanup=state.resource_cleanup,
        )

    def subscribe(self, *, buffer: int = 1024) -> trio.MemoryReceiveChannel[Event]:
        """A channel of this conversation's events; a slow subscriber may lose transient ones."""
        self._state.require_own_run()
        if type(buffer) is not int or buffer < 1:
            raise Error(ErrorClass.VALIDATION, "buffer must be a positive int")
        return self._publisher.hub.subscribe(buffer)

    def agent_updated(self, agent_name: str, status: str) -> None:
        """Tell this conversation's subscribers that a child agent changed
        (``agent_updated``: its name and status); transient, never stored.
        The collaboration manager (:mod:`trio_backplane.agents`) calls it."""
        self._state.require_own_run()
        if type(agent_name) is not str or type(status) is not str:
            raise Error(ErrorClass.VALIDATION, "agent_name and status must be str")
        self._publisher.publish("agent_updated", {"agent_name": agent_name, "status": status})

    async def wait_settled(self) -> Snapshot:
        """Once the run is terminal, recovery_required or storage_failed."""
        self._state.require_own_run()
        await self._state.settled.wait()
        return self.status()

    async def prompt(self, content: Any) -> str:
        """Admit the first message, or queue a follow-up while a turn runs."""
        state = self._state
        state.require_own_run()
        content = check_content(content)
        self._require_input()
        if state.phase != Phase.IDLE:
            return await self._enqueue("follow_up", content)
        state.phase = Phase.RUNNING
        turn_id: str | None = None
        try:
            await self._coordinator.commit(
                Admit,
                {"state": "running", "deadline": state.wall_now() + self._options.run_timeout},
            )
            message = self._state.user_message(content)
            turn_id = state.new_id("turn")
            message = await self._first_message(message, turn_id)
        except _Rejected as rejected:
            raise self._rejected(turn_id, rejected.error) from None
        except _StorageFailed as failed:
            raise failed.error from None
        except BaseException as exc:
            self._admission_failed(turn_id, exc)
            raise
        self._publisher.publish(
            "prompt_consumed", {"mode": "new", "message": message, "turn_id": turn_id}
        )
        self._settlement.start_worker(turn_id, None)
        return str(message["id"])

    async def _first_message(self, message: dict[str, Any], turn_id: str) -> Any:
        """Commit the run's first message, as the prompt hook made it."""
        message = await self._hooks.prompt(message, "new", turn_id)
        await self._coordinator.checkpoint(
            lambda c: traced(attrs.evolve(c.with_message(message), turn_id=turn_id), self._state),
            as_input=True,
        )
        return message

    def _rejected(self, turn_id: str | None, error: Error) -> Error:
        """What ``prompt`` raises when the prompt hook refused the first
        message; the turn fails and the run finishes."""
        state = self._state
        if state.phase in (Phase.STORAGE_FAILED, Phase.RECOVERY_REQUIRED):
            # the store failed while the hook ran: what every waiting
            # caller learns, not the hook's verdict
            return state.last_error or storage_error("store is unavailable")
        if state.stop_reason is not None:  # cancelled while the hook ran
            return Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")
        self._settlement.start_worker(turn_id, error)
        return error

    def _admission_failed(self, turn_id: str | None, exc: BaseException) -> None:
        """The prompt failed: refused by the kernel, or its caller cancelled
        (interrupted) before the message was committed.  Before the admission
        nothing changed; after it the turn fails and the run finishes, never
        left admitted with no worker to settle it.  Starting the
        worker does not checkpoint, so it happens even while the caller is
        cancelled."""
        state = self._state
        if state.record.state == "queued":
            state.phase = Phase.IDLE
        elif isinstance(exc, Error):
            if state.stop_reason is None:  # a stop settles the run itself
                self._settlement.start_worker(turn_id, exc)
        elif state.stop_reason is None and not self._settlement.worker_running:
            interrupted = Error(
                ErrorClass.CANCELLED, "prompt was cancelled before its message was committed"
            )
            self._settlement.start_worker(turn_id, interrupted)

    async def steer(self, content: Any) -> str:
        self._state.require_own_run()
        content = check_content(content)
        self._require_input()
        if self._state.phase == Phase.IDLE:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")
        return await self._enqueue("steering", content)

    async def follow_up(self, content: Any) -> str:
        self._state.require_own_run()
        content = check_content(content)
        self._require_input()
        if self._state.phase == Phase.IDLE:
            return await self.prompt(content)
        return await self._enqueue("follow_up", content)

    async def resolve(self, interaction_id: str, answer: Any) -> None:
        """Answer the pending interaction after authenticating the responder;
        returns once the answer is committed."""
        self._state.require_own_run()
        await self._interactions.resolve(interaction_id, answer)

    def stage_catalog(self, publication: Any) -> PublicationReceipt:
        """Stage a catalog on behalf of the tool executing now."""
        self._state.require_own_run()
        return stage(self._state, self._catalog, publication)

    async def cancel(self) -> None:
        """Accept cancellation and return at once; settlement follows."""
        state = self._state
        state.require_own_run()
        if state.inactive or state.record.state in TERMINAL_STATES:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not active")
        self._settlement.request_stop("cancelled")

    def _require_input(self) -> None:
        state = self._state
        if state.phase == Phase.CANCELLING or state.inactive or state.stop_reason is not None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")

    async def _enqueue(self, queue: QueueName, content: Any) -> str:
        message = self._state.user_message(content)
        try:
            await self._coordinator.checkpoint(lambda c: c.queued(queue, message), as_input=True)
        except _StorageFailed as failed:
            raise failed.error from None
        return str(message["id"])


@asynccontextmanager
async def open_conversation(
    run_id: str,
    *,
    store: Store,
    provider: Any,
    registry: ToolRegistry | None = None,
    authority: Authority | None = None,
    tools: Sequence[ProviderTool] | None = None,
    provider_context: Mapping[str, Any] | None = None,
    hooks: Any = None,
    context: Mapping[str, Any] | None = None,
    incarnation: int = 1,
    work: int = 100,
    run_timeout: float = 300.0,
    effect_timeout: float = 30.0,
    commit_timeout: float = 5.0,
    cleanup_timeout: float = 5.0,
    output_limit: int = 1_048_576,
    provider_output_limit: float | None = None,
    schema_admission: str = "strict",
    run: RunRecord | None = None,
    messages: Sequence[Any] | None = None,
    wall_clock: Callable[[], float] | None = None,
    resources: Sequence[Any] = (),
    resume: RunRecord | None = None,
    telemetry: Telemetry | None = None,
) -> AsyncIterator[Conversation]:
    """Open a conversation that owns a nursery; leaving the block cancels and
    settles an active run.  Every terminal path closes ``resources`` and the
    tools' registries within ``cleanup_timeout``: unconfirmed, never completed."""
    options = check_options(
        work=work,
        run_timeout=run_timeout,
        effect_timeout=effect_timeout,
        commit_timeout=commit_timeout,
        cleanup_timeout=cleanup_timeout,
        output_limit=output_limit,
        provider_output_limit=provider_output_limit,
        schema_admission=schema_admission,
        wall_clock=wall_clock,
        telemetry=telemetry,
    )
    prior = check_inputs(
        run_id,
        store,
        provider,
        hooks=hooks,
        context=context,
        provider_context=provider_context,
        run=run,
        messages=messages,
        resume=resume,
    )
    bundle, options = _admitted(run_id, registry, authority, tools, resources, options)
    state = await _opened(run_id, store, run, prior, context, incarnation, options, resume)
    host = (provider, provider_context, hooks)
    async with _live(state, store, options, bundle, host, resume) as conversation:
        yield conversation


@asynccontextmanager
async def _live(  # noqa: PLR0917 - what the parts are built from
    state: RunState,
    store: Store,
    options: Options,
    bundle: AdmittedBundle,
    host: tuple[Any, Mapping[str, Any] | None, Any],
    resume: RunRecord | None,
) -> AsyncIterator[Conversation]:
    """The conversation on a nursery of its own; a resumed run goes on at once."""
    point = None if resume is None else resume_point(resume, state.wall_now())
    async with owning_nursery("conversation failed") as nursery:
        parts = _assemble(state, store, options, nursery, bundle=bundle, host=host)
        _record(state, options, provider=host[0])
        async with _settling(parts.settlement, nursery, state):
            if point is not None:
                await _resumed(parts, point)
            yield Conversation._create(parts=parts, options=options)


async def _resumed(parts: _Parts, point: ResumePoint) -> None:
    """Commit where a resumed run goes on from (an interrupted attempt
    abandoned, the deadline the time left gives, the stored interaction
    withdrawn: it is asked again) and start its worker there."""
    state = parts.state
    state.resume, state.reopened = point, point.reopened
    if point.run_timeout <= 0:
        # out of time: nothing may commit before the stop the worker meets
        parts.settlement.start_worker(point.turn_id, None)
        return
    steps: list[Step] = []
    if point.abandoned is not None:
        steps.append(
            command_step(
                ProviderCompleted, {"attempt_id": point.abandoned, "result": freeze(ABANDONED)}
            )
        )
    deadline = state.wall_now() + point.run_timeout
    steps.append(
        checkpoint_step(
            lambda c: traced(attrs.evolve(c, pending_interaction=None), state),
            {"execution_deadline": deadline},
        )
    )
    try:
        await parts.coordinator.commit_steps(steps)
    except _StorageFailed as failed:
        raise failed.error from None
    except Error as refused:
        if refused.details.get("boundary") != "before_store":
            raise
        # the deadline passed as it committed: the worker meets the stop
    parts.settlement.start_worker(point.turn_id, None)


def _admitted(  # noqa: PLR0917 - open_conversation's, in its order
    run_id: str,
    registry: ToolRegistry | None,
    authority: Authority | None,
    tools: Sequence[ProviderTool] | None,
    resources: Sequence[Any],
    options: Options,
) -> tuple[AdmittedBundle, Options]:
    """The catalog the run starts with, admitted, and the options with the
    registries the run owns."""
    bundle = admit_batch(
        registry if registry is not None else ToolRegistry(()),
        authority if authority is not None else Authority(run_id=run_id),
        tools,
        mode=options.schema_admission,
        run_id=run_id,
    )
    owned = check_resources(resources, registry if registry is not None else ())
    return bundle, attrs.evolve(options, resources=owned)


def _run_state(record: RunRecord, phase: Phase, options: Options) -> RunState:
    """The run state a conversation opens with."""
    clock = options.clock
    # the run's clock, read without looking the run up each time
    now = trio.lowlevel.current_clock().current_time
    return RunState(
        run_id=record.run_id,
        record=record,
        phase=phase,
        now=now,
        clock=clock,
        run_budget=DeadlineBudget("run", options.run_timeout, now),
        owned=OwnedRegistries(options.resources, record.run_id, options.cleanup_timeout),
    )


@asynccontextmanager
async def _settling(
    settlement: Settlement, nursery: trio.Nursery, state: RunState
) -> AsyncIterator[None]:
    """Leaving the block, however: the run settles (shielded), its spans
    end, then the conversation's tasks end."""
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            await settlement.close()
        if state.telemetry is not None:
            state.telemetry.run_ended(
                state.record.state if state.settled.is_set() else state.phase.value,
                state.record.outcome,
                work_used=state.record.budget.used,
                cleanup=state.resource_cleanup.status,
            )
        nursery.cancel_scope.cancel()


def _record(state: RunState, options: Options, *, provider: Any) -> None:
    """Start the run's telemetry, if any (a resumed run links to the
    incarnation it goes on from); a stored run only inspected has none."""
    telemetry = options.telemetry
    if telemetry is None or state.inactive:
        return
    model = getattr(provider, "model", None)
    recorder = telemetry.recorder(state.run_id, state.record.incarnation, model=model)
    previous = state.conversation.other.get(TRACE_KEY) if state.phase is Phase.RUNNING else None
    recorder.run_started(previous)
    state.telemetry = recorder


async def _opened(  # noqa: PLR0917 - what a run starts from
    run_id: str,
    store: Store,
    run: RunRecord | None,
    prior: list[Any] | None,
    context: Mapping[str, Any] | None,
    incarnation: int,
    options: Options,
    resume: RunRecord | None = None,
) -> RunState:
    """The state the conversation opens with: of a stored run (only
    inspected; its run id checked with the inputs), of one taken over
    (going on), or of a new one the store created."""
    if resume is not None:
        return _run_state(resume, Phase.RUNNING, options)
    if run is not None:
        settled = run.state in TERMINAL_STATES
        return _run_state(run, Phase.TERMINAL if settled else Phase.RECOVERY_REQUIRED, options)
    record = RunRecord.new(
        run_id,
        incarnation=incarnation,
        work=options.work,
        context=initial_context(context),
        transcript=prior,
    )
    receipt = await store.create(record)
    if receipt.revision != 0:
        raise Error(ErrorClass.RESOURCE_CONFLICT, "store created another revision")
    return _run_state(record, Phase.IDLE, options)
