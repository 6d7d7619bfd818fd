"""``open_conversation`` and ``Conversation``: the turn loop on Trio.

One conversation owns one nursery.  Everything durable goes through one
commit coordinator (a FIFO lock: one commit in flight, each transition
computed from the last acknowledged record, shielded and bounded by
``commit_timeout``).  The turn loop runs in one worker task under the run
deadline; each provider attempt and tool call runs under its own effect
deadline.  Cancellation is accepted at once, then the worker is cancelled and
a shielded cleanup settles the run.
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, final

import attrs
import trio

from .._numbers import is_seconds
from .._public import NoPublicConstructor
from ..errors import Error, ErrorClass, exception_leaves, require_methods
from ..kernel import (
    TERMINAL_STATES,
    Command,
    RunEvent,
    RunRecord,
    appended,
    evolve_record,
    freeze,
    thaw,
    transition,
)
from ..store import Receipt, Store, verify_receipt
from ..tools import (
    AdmittedBundle,
    Authority,
    ProviderTool,
    PublicationReceipt,
    ToolRegistry,
    admit_batch,
)
from ._catalog import CatalogState
from ._clock import DurableClock, check_wall_clock
from ._deadline import DeadlineBudget
from ._input import check_content, check_user_message
from ._interactions import HOST_RESOLVER, Pending
from ._interactions import resolve as resolve_interaction
from ._loop import TurnLoop
from ._redact import secrets_of
from ._signals import _InputArrived, _Rejected, _Stop, _StorageFailed
from ._steps import EMPTY_CONVERSATION, Step, checkpoint_step, command_step
from ._subscribers import Hub
from ._types import Event, HookContext, Phase, ResourceCleanup, Snapshot

__all__ = ["Conversation", "open_conversation"]

MAX_TIMEOUT: Final = 3600.0
_INACTIVE_PHASES: Final = frozenset({Phase.TERMINAL, Phase.RECOVERY_REQUIRED, Phase.STORAGE_FAILED})
#: Events after which a run publishes nothing (EVT-17, EVT-18).
_LAST_WORDS: Final = frozenset({"run_completed", "run_failed", "run_cancelled", "storage_failed"})


def _check_timeout(name: str, value: Any) -> float:
    if not is_seconds(value, MAX_TIMEOUT):
        raise Error(
            ErrorClass.VALIDATION,
            f"{name} must be a finite positive timeout",
            {"option": name, "maximum": MAX_TIMEOUT},
        )
    return float(value)


#: ``<kind>-<incarnation>-<n>``, numbers as this runtime writes them (an id
#: with longer ones, a host's own, is no id of ours: never converted, so
#: never past Python's int digit limit)
_OUR_ID: Final = re.compile(r"[a-z_]+-([0-9]{1,18})-([0-9]{1,18})")


def _first_id(record: RunRecord) -> int:
    """Where this conversation's ids (``<kind>-<incarnation>-<n>``) start:
    past any the record's transcript already holds for its incarnation (a
    run started from another's committed messages), so ids stay unique in
    the run."""
    state = record.conversation or {}
    highest = 0
    prefix = f"-{record.incarnation}-"
    for message in _listed(state, "messages"):
        ident = message.get("id") if isinstance(message, Mapping) else None
        if type(ident) is str and prefix in ident:
            found = _OUR_ID.fullmatch(ident)
            if found and int(found[1]) == record.incarnation:
                highest = max(highest, int(found[2]))
    return highest + 1


def _listed(state: Mapping[str, Any], key: str) -> tuple[Any, ...]:
    """The list ``state`` holds at ``key``: a stored conversation state is
    any mapping the kernel took, so a restored one may hold something else
    there, read as no items (the record itself is shown as stored)."""
    items = state.get(key)
    return tuple(items) if isinstance(items, list | tuple) else ()


def _check_inputs(
    store: Any,
    provider: Any,
    *,
    hooks: Any,
    context: Any,
    provider_context: Any,
    run: Any,
    messages: Any,
) -> list[Any] | None:
    """What ``open_conversation`` is given to work with, checked before it
    calls anything: a store with ``create`` and ``commit``, a provider with
    ``stream``, hooks whose ``prompt``/``stop`` (when present) are callables,
    a mapping (or ``None``) as context without the reserved ``conversation``
    key, a mapping (or ``None``) as the provider context, a ``RunRecord``
    (or ``None``) as the stored run, and ``run`` or ``messages``, not both.
    Returns the checked messages."""
    require_methods(store, "store", ("create", "commit"))
    require_methods(provider, "provider", ("stream",))
    for name in ("prompt", "stop"):
        hook = getattr(hooks, name, None)
        if hook is not None and not callable(hook):
            raise Error(
                ErrorClass.VALIDATION,
                f"hooks.{name} must be an async callable",
                {"argument": "hooks", "hook": name, "type": type(hook).__name__},
            )
    for name, value in (("context", context), ("provider_context", provider_context)):
        if value is not None and not isinstance(value, Mapping):
            raise Error(
                ErrorClass.VALIDATION,
                f"{name} must be a mapping or None",
                {"argument": name, "type": type(value).__name__},
            )
    if context is not None and "conversation" in context:
        raise Error(ErrorClass.VALIDATION, "context key 'conversation' is reserved")
    if run is not None and not isinstance(run, RunRecord):
        raise Error(
            ErrorClass.VALIDATION,
            "run must be a stored RunRecord or None",
            {"argument": "run", "type": type(run).__name__},
        )
    if run is not None and messages is not None:
        raise Error(ErrorClass.VALIDATION, "give run (a stored run) or messages (a new one)")
    return _check_messages(messages)


def _check_messages(messages: Any) -> list[Any] | None:
    """The transcript a new run starts from (a replacement run receives the
    committed messages of the one it continues): a list or tuple of message
    objects, each with a ``role``.  Whether they are JSON data is checked with
    the rest of the run's context, before the store is called."""
    if messages is None:
        return None
    if not isinstance(messages, list | tuple):
        raise Error(
            ErrorClass.VALIDATION,
            "messages must be a list of transcript messages",
            {"type": type(messages).__name__},
        )
    # frozen first: a message that fails when read is classed, as the
    # context is (the context then takes these frozen copies as they are)
    messages = freeze(list(messages), "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or type(message.get("role")) is not str:
            raise Error(
                ErrorClass.VALIDATION,
                "each message must be an object with a role",
                {"index": index},
            )
    return list(messages)


@attrs.define
class _Options:
    run_timeout: float
    effect_timeout: float
    commit_timeout: float
    cleanup_timeout: float
    output_limit: int
    provider_output_limit: float
    schema_admission: str
    work: int
    wall_clock: Callable[[], float]


def _options(
    *,
    work: Any,
    run_timeout: Any,
    effect_timeout: Any,
    commit_timeout: Any,
    cleanup_timeout: Any,
    output_limit: Any,
    provider_output_limit: Any,
    schema_admission: Any,
    wall_clock: Any,
) -> _Options:
    timeouts = {
        "run_timeout": _check_timeout("run_timeout", run_timeout),
        "effect_timeout": _check_timeout("effect_timeout", effect_timeout),
        "commit_timeout": _check_timeout("commit_timeout", commit_timeout),
        "cleanup_timeout": _check_timeout("cleanup_timeout", cleanup_timeout),
    }
    if type(work) is not int or work < 1:
        raise Error(ErrorClass.VALIDATION, "work must be an int of at least 1", {"option": "work"})
    if type(output_limit) is not int or output_limit < 0:
        raise Error(
            ErrorClass.VALIDATION,
            "output_limit must be a non-negative int",
            {"option": "output_limit"},
        )
    if provider_output_limit is None:
        provider_limit: float = output_limit
    elif provider_output_limit == math.inf and type(provider_output_limit) is float:
        provider_limit = math.inf
    elif type(provider_output_limit) is int and provider_output_limit >= 0:
        provider_limit = provider_output_limit
    else:
        raise Error(
            ErrorClass.VALIDATION,
            "provider_output_limit must be a non-negative int or math.inf",
            {"option": "provider_output_limit"},
        )
    if schema_admission not in ("strict", "quarantine"):
        raise Error(ErrorClass.VALIDATION, "admission mode must be strict or quarantine")
    return _Options(
        output_limit=output_limit,
        provider_output_limit=provider_limit,
        schema_admission=schema_admission,
        work=work,
        wall_clock=check_wall_clock(wall_clock),
        **timeouts,
    )


@final
class Conversation(metaclass=NoPublicConstructor):
    """A live conversation: ``open_conversation`` makes one, and it is valid
    only inside that block."""

    def __init__(
        self,
        *,
        run_id: str,
        store: Store,
        provider: Any,
        bundle: AdmittedBundle,
        provider_context: Mapping[str, Any] | None,
        hooks: Any,
        options: _Options,
        record: RunRecord,
        phase: Phase,
        nursery: trio.Nursery,
        clock: DurableClock,
    ) -> None:
        self.run_id = run_id
        self._store = store
        #: ``store.commit_nowait`` when the store offers it (it never waits)
        nowait = getattr(store, "commit_nowait", None)
        self._commit_nowait: Callable[..., Receipt] | None = (
            None if not callable(nowait) or inspect.iscoroutinefunction(nowait) else nowait
        )
        self._provider = provider
        self._catalog = CatalogState(bundle, options.schema_admission)
        self._pending: Pending | None = None
        self._effects: list[DeadlineBudget] = []  # armed effect budgets, outermost first
        #: a scope per executing effect, cancelled when the run stops
        self._effect_stops: set[trio.CancelScope] = set()
        self._executing: list[str] = []  # executing invocation ids, outermost first
        self._provider_context = provider_context
        #: what a provider failure must never quote of it (PRV-18)
        self._provider_secrets = secrets_of(provider_context)
        self._hooks = hooks
        self._options = options
        self._record = record
        self._phase = phase
        self._nursery = nursery
        self._hub = Hub(self._dropped_event)
        if phase in _INACTIVE_PHASES:
            self._hub.finish()  # a stored run, only inspected: no event will come
        self._commit_lock = trio.Lock()
        self._last_error: Error | None = None
        self._resource_cleanup = ResourceCleanup()
        self._ids = itertools.count(_first_id(record))
        self._worker: trio.CancelScope | None = None
        self._worker_running = False
        self._stop_reason: str | None = None  # "cancelled" | "deadline_exceeded" | "uncertain"
        self._stop_requested = trio.Event()
        #: when the stop was due (the run deadline for a deadline stop): the
        #: settlement's cleanup and commit budgets count from here (CAN-18)
        self._stop_due: float | None = None
        #: the provider attempt's scope while its stream closes (shielded)
        self._closing: trio.CancelScope | None = None
        self._settled = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._settling = False  # one settlement at a time (CAN-06)
        #: wakes the worker's watchdog: a stop, a deadline moved, the worker done
        self._watch_poke = trio.Event()
        self._turn_wakeup = trio.Event()
        self._step_id: str | None = None
        self._attempt_id: str | None = None
        #: the run's clock, read without looking the run up each time
        self._now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        #: Trio's clock to the wall clock of what is stored
        self._clock = clock
        self._run_budget = DeadlineBudget("run", options.run_timeout, self._now)
        self._unsettled_dispatch: dict[str, Any] = {}  # keys of dispatched, unsettled effects
        if phase in _INACTIVE_PHASES:
            self._settled.set()

    # -- public surface ------------------------------------------------------

    def status(self) -> Snapshot:
        """The last committed state (CONV-23)."""
        conversation = self._conversation_state()
        return Snapshot(
            phase=self._phase,
            run=self._record,
            messages=_listed(conversation, "messages"),
            steering=_listed(conversation, "steering"),
            follow_up=_listed(conversation, "follow_up"),
            queue_status=conversation.get("queue_status", "active"),
            usage=_listed(conversation, "usage"),
            turn_id=conversation.get("turn_id"),
            pending_interaction=conversation.get("pending_interaction"),
            last_error=self._last_error,
            catalog_revision=conversation.get("catalog_revision", self._catalog.revision),
            receipts=self._catalog.receipts,
            resource_cleanup=self._resource_cleanup,
        )

    def subscribe(self, *, buffer: int = 1024) -> trio.MemoryReceiveChannel[Event]:
        """A channel of this conversation's events (EVT); see CONV-29 for loss."""
        self._require_own_run()
        if type(buffer) is not int or buffer < 1:
            raise Error(ErrorClass.VALIDATION, "buffer must be a positive int")
        return self._hub.subscribe(buffer)

    async def wait_settled(self) -> Snapshot:
        """Once the run is terminal, recovery_required or storage_failed."""
        self._require_own_run()
        await self._settled.wait()
        return self.status()

    async def prompt(self, content: Any) -> str:
        """Admit the first message, or queue a follow-up while a turn runs."""
        self._require_own_run()
        content = check_content(content)
        self._require_input()
        if self._phase != Phase.IDLE:
            return await self._enqueue("follow_up", content)
        self._phase = Phase.RUNNING
        turn_id: str | None = None
        try:
            await self._commit(
                "admit",
                {"state": "running", "deadline": self._wall_now() + self._options.run_timeout},
            )
            message = self._user_message(content)
            turn_id = self._new_id("turn")
            message = await self._prompt_hook(message, "new", turn_id)
            await self._checkpoint(
                lambda c: {
                    **c,
                    "messages": appended(c["messages"], message),
                    "turn_id": turn_id,
                },
                as_input=True,
            )
        except _Rejected as rejected:
            if self._phase in (Phase.STORAGE_FAILED, Phase.RECOVERY_REQUIRED):
                # the store failed while the hook ran: what every waiting
                # caller learns (CAN-17), not the hook's verdict
                raise (self._last_error or _storage_error("store is unavailable")) from None
            if self._stop_reason is not None:  # cancelled while the hook ran (CONV-12)
                raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input") from None
            await self._start_worker(first_turn=turn_id, failed=rejected.error)
            raise rejected.error from None
        except _StorageFailed as failed:
            raise failed.error from None
        except Error as error:
            # Refused by the kernel: before the admission nothing changed;
            # after it the turn fails and the run finishes, never left running
            # with no worker to settle it.
            if self._record.state == "queued":
                self._phase = Phase.IDLE
            elif self._stop_reason is None:  # a stop settles the run itself
                await self._start_worker(first_turn=turn_id, failed=error)
            raise
        except BaseException:
            # The caller was cancelled (or interrupted) before the message was
            # committed.  Before the admission nothing changed; after it the
            # turn fails ``cancelled`` and the run finishes: never left
            # admitted with no worker (CONV-27).  Starting the worker does not
            # checkpoint, so it happens even while the caller is cancelled.
            if self._record.state == "queued":
                self._phase = Phase.IDLE
            elif self._stop_reason is None and not self._worker_running:
                interrupted = Error(
                    ErrorClass.CANCELLED, "prompt was cancelled before its message was committed"
                )
                await self._start_worker(first_turn=turn_id, failed=interrupted)
            raise
        self._publish("prompt_consumed", {"mode": "new", "message": message, "turn_id": turn_id})
        await self._start_worker(first_turn=turn_id, failed=None)
        return str(message["id"])

    async def steer(self, content: Any) -> str:
        self._require_own_run()
        content = check_content(content)
        self._require_input()
        if self._phase == Phase.IDLE:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")
        return await self._enqueue("steering", content)

    async def follow_up(self, content: Any) -> str:
        self._require_own_run()
        content = check_content(content)
        self._require_input()
        if self._phase == Phase.IDLE:
            return await self.prompt(content)
        return await self._enqueue("follow_up", content)

    async def resolve(self, interaction_id: str, answer: Any) -> None:
        """Answer the pending interaction after authenticating the responder;
        returns once the answer is committed (INT-04, INT-05, INT-12)."""
        self._require_own_run()
        await resolve_interaction(self, interaction_id, answer)

    def stage_catalog(self, publication: Any) -> PublicationReceipt:
        """Stage a catalog on behalf of the tool executing now (PUB-02, PUB-19)."""
        self._require_own_run()
        return self._stage(publication)

    def _stage(self, publication: Any, producer: str | None = None) -> PublicationReceipt:
        """Stage for ``producer`` (a tool's own context) and the tools that
        enclose it, or for every executing invocation (innermost last).  A
        nested call the producer made is not among them: its failure is the
        producer's to handle (NEST-05), not a reason to discard (PUB-18)."""
        if (
            not self._executing
            or self._stop_reason is not None
            or self._phase in _INACTIVE_PHASES  # storage_failed: nothing can publish
        ):
            raise Error(ErrorClass.RESOURCE_CONFLICT, "staging requires an executing tool")
        producers = list(self._executing)
        if producer in producers:
            del producers[producers.index(producer) + 1 :]
        if self._pending is not None:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT, "staging is not allowed during an interaction wait"
            )
        return self._catalog.stage(
            publication,
            run_id=self.run_id,
            incarnation=self._record.incarnation,
            producers=producers,
        )

    def _suspend_deadlines(self) -> None:
        """A human wait: stop the run and effect clocks (rule 5, INT-06, INT-18)."""
        self._run_budget.suspend()
        for budget in self._effects:
            budget.suspend()
        self._watch_poke.set()

    def _resume_deadlines(self, at: float | None = None) -> None:
        """Resume the budgets a human wait suspended, as of ``at`` (when the
        wait ended; default now)."""
        self._run_budget.resume(at)
        for budget in self._effects:
            budget.resume(at)
        self._watch_poke.set()

    async def cancel(self) -> None:
        """Accept cancellation and return at once (CAN-01); settlement follows."""
        self._require_own_run()
        if self._phase in _INACTIVE_PHASES or self._record.state in TERMINAL_STATES:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not active")
        self._request_stop("cancelled")

    # -- input helpers ---------------------------------------------------------

    def _require_own_run(self) -> None:
        """Refuse a call from another Trio run or a thread: the conversation's
        tasks, events and scopes belong to the run that opened it."""
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            token = None
        if token is not self._token:
            raise Error(
                ErrorClass.VALIDATION,
                "conversation used outside the Trio run that opened it",
                {"reason": "foreign_trio_run"},
            )

    def _require_input(self) -> None:
        if self._phase in (Phase.CANCELLING, *_INACTIVE_PHASES) or self._stop_reason is not None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")

    def _user_message(self, content: Any) -> dict[str, Any]:
        return {"role": "user", "content": content, "id": self._new_id("msg")}

    def _wall_now(self) -> float:
        """Now, as the instants the run stores read."""
        return self._clock.wall(self._now())

    def _new_id(self, kind: str) -> str:
        return f"{kind}-{self._record.incarnation}-{next(self._ids)}"

    async def _enqueue(self, queue: str, content: Any) -> str:
        message = self._user_message(content)
        try:
            await self._checkpoint(
                lambda c: {**c, queue: appended(c[queue], message)}, as_input=True
            )
        except _StorageFailed as failed:
            raise failed.error from None
        self._turn_wakeup.set()
        return str(message["id"])

    # -- events ------------------------------------------------------------------

    def _event(self, type_: str, payload: Mapping[str, Any]) -> Event:
        try:
            # read-only: every subscriber gets this very payload, and none
            # can edit what another receives
            payload = freeze(payload, "event payload")
        except Error:
            # not JSON data (a provider's, refused once the response is
            # committed): a copy, never what the run holds
            payload = thaw(payload)
        return Event(
            type=type_,
            payload=payload,
            run_id=self.run_id,
            incarnation=self._record.incarnation,
            turn_id=self._conversation_state().get("turn_id"),
            step_id=self._step_id,
            attempt_id=self._attempt_id,
        )

    def _dropped_event(self, count: int) -> Event:
        return self._event("events_dropped", {"count": count})

    def _publish(self, type_: str, payload: Mapping[str, Any]) -> None:
        hub = self._hub
        if hub.active:  # nobody listening: build no event
            hub.publish(self._event(type_, payload))
        if type_ in _LAST_WORDS:
            hub.finish()

    # -- the commit coordinator ------------------------------------------------

    def _conversation_state(self) -> Mapping[str, Any]:
        state = self._record.conversation  # conversation_of, one call fewer: a hot path
        return EMPTY_CONVERSATION if state is None else state

    async def _commit(self, kind: str, data: Mapping[str, Any] | None = None) -> RunRecord:
        """Apply ``kind`` to the last acknowledged record and commit it: FIFO,
        one in flight, shielded, within ``commit_timeout`` (rule 2)."""
        return await self._commit_steps((command_step(kind, data),))

    async def _commit_steps(self, steps: Sequence[Step], *, as_input: bool = False) -> RunRecord:
        """Commit ``steps`` in order as one store commit (one revision; a
        kernel event per step), each command built from the record the
        previous step left.  When the kernel refuses a step, the steps before
        it are committed alone and the refusal raised: exactly what committing
        them one by one would do, with fewer durable writes.  Each step's
        ``after`` runs once its commit is acknowledged (events go out only
        after their commit, rule 2).  ``as_input``: the steps take host input,
        refused with ``resource_conflict`` when, by the time the coordinator
        is free, the run stopped (a cancellation settled meanwhile)."""
        # The FIFO lock, without a scheduler round trip when it is free (the
        # common case: one worker commits at a time); a cancelled caller still
        # stops here before anything is decided.
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self._commit_lock
        if self._commit_nowait is not None and not lock.locked():
            # A store that never waits: the whole commit runs without a
            # checkpoint, so nothing can come between; the lock is free and
            # nobody queues behind it (a queued waiter would hold it).
            return await self._commit_locked(steps, as_input=as_input)
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            return await self._commit_locked(steps, as_input=as_input)
        finally:
            lock.release()

    async def _commit_locked(
        self, steps: Sequence[Step], *, as_input: bool = False, commit_by: float = math.inf
    ) -> RunRecord:
        if as_input and (self._stop_reason is not None or self._record.state in TERMINAL_STATES):
            # cancelled meanwhile: whatever became of the settlement, input is refused
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run is not accepting input")
        if self._phase in (Phase.STORAGE_FAILED, Phase.RECOVERY_REQUIRED):
            raise _StorageFailed(self._last_error or _storage_error("store is unavailable"))
        if self._record.state in TERMINAL_STATES:
            raise _Stop  # settled without a worker that ignored its cancellation
        record = self._record
        now = self._now()
        wall = self._clock.wall(now)
        steps = self._with_moved_deadline(steps, record, now, wall)
        new, events, done = record, [], 0
        refusal: Error | _InputArrived | None = None
        for step in steps:
            try:
                new, produced = transition(new, step.build(new, wall))
            except (Error, _InputArrived) as exc:
                refusal = exc
                break
            events.extend(produced)
            done += 1
        if done:
            if done > 1:
                new = evolve_record(new, revision=record.revision + 1)
            await self._write(record, new, events, commit_by)
            for step in steps[:done]:
                if step.after is not None:
                    step.after()
        if refusal is not None:
            raise refusal
        return new

    def _with_moved_deadline(
        self, steps: Sequence[Step], record: RunRecord, now: float, wall: float
    ) -> Sequence[Step]:
        """``steps``, after a checkpoint moving the stored run deadline when a
        commit comes during a human wait (a nested call's, say) past it: the
        wait has moved it in memory but not yet in the store (INT-06, INT-18)."""
        pending = self._pending
        if (
            pending is None
            or not pending.announced
            or record.deadline is None
            or wall <= record.deadline
        ):
            return steps
        # (a wait an answer ended is measured up to that answer)
        ended = now if pending.answered_at is None else min(now, pending.answered_at)
        moved = pending.moved_deadline(ended)
        if moved is not None and moved > record.deadline:
            return (checkpoint_step(dict, {"execution_deadline": moved}), *steps)
        return steps

    async def _write(
        self, record: RunRecord, new: RunRecord, events: list[RunEvent], commit_by: float
    ) -> None:
        """Store ``new`` over ``record``; a failure, however it comes, is the
        conversation's storage failure (``_StorageFailed``), and only an
        acknowledged commit becomes the conversation's record."""
        error: Error | None = None
        try:
            nowait = self._commit_nowait
            if nowait is not None:  # nothing to wait for: no scope to bound the wait
                receipt = nowait(
                    record.run_id,
                    incarnation=record.incarnation,
                    expected_revision=record.revision,
                    record=new,
                    events=events,
                )
            else:
                receipt = await self._commit_waiting(record, new, events, commit_by)
            verify_receipt(receipt, run_id=record.run_id, expected_revision=record.revision)
        except Error as exc:
            error = exc
        except Exception as exc:
            error = _storage_error(f"store failed: {type(exc).__name__}: {exc}"[:500])
        if error is not None:
            self._storage_failure(error)
            raise _StorageFailed(self._last_error or error)
        self._record = new

    async def _commit_waiting(
        self, record: RunRecord, new: RunRecord, events: list[RunEvent], commit_by: float
    ) -> Receipt:
        """``store.commit`` in one scope: shielded from the caller's
        cancellation (a commit's outcome is always known), bounded by its own
        commit deadline (rule 5), and by ``commit_by`` (a settlement's end)."""
        deadline = min(self._now() + self._options.commit_timeout, commit_by)
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            receipt = await self._store.commit(
                record.run_id,
                incarnation=record.incarnation,
                expected_revision=record.revision,
                record=new,
                events=events,
            )
            if not scope.cancel_called:
                return receipt
            # A store that waits its write out acknowledged it after the
            # deadline: not within commit_timeout (CAN-11), whatever it says.
        raise _storage_error("commit was not acknowledged within commit_timeout")

    def _storage_failure(self, error: Error) -> None:
        if self._phase in (Phase.STORAGE_FAILED, Phase.RECOVERY_REQUIRED):
            return
        if error.error_class is ErrorClass.RESOURCE_CONFLICT:
            self._phase = Phase.RECOVERY_REQUIRED  # a newer incarnation owns the run (CAN-19)
            self._last_error = error
            self._hub.finish()  # no event will come: nothing is ours to say any more
        else:
            if error.error_class is not ErrorClass.STORAGE_FAILED:
                error = Error(ErrorClass.STORAGE_FAILED, error.message, error.details)
            self._phase = Phase.STORAGE_FAILED
            self._last_error = error
            self._publish("storage_failed", {"error": error.to_dict(), "recovery_required": True})
        self._catalog.discard()
        if self._worker is not None:
            self._worker.cancel()
        self._settled.set()

    async def _checkpoint(
        self, update: Any, extra: Mapping[str, Any] | None = None, *, as_input: bool = False
    ) -> RunRecord:
        """Commit a new conversation state computed from the acknowledged one."""
        return await self._commit_steps((checkpoint_step(update, extra),), as_input=as_input)

    # -- hooks ---------------------------------------------------------------------

    async def _prompt_hook(self, message: dict[str, Any], mode: str, turn_id: str) -> Any:
        hook = getattr(self._hooks, "prompt", None)
        if hook is None:
            return message
        context = HookContext(self.run_id, self._record.incarnation, turn_id, mode)  # type: ignore[arg-type]
        message_id = message["id"]  # the message's id, whatever the hook does to it
        refusal: Error | None = None
        result: Any = None
        try:
            # (cancel_called, not a TooSlowError: a hook that ignores its
            # cancellation and returns late has timed out too, API.md)
            with trio.move_on_after(self._options.effect_timeout) as bound:
                result = await hook(dict(message), context)
            if bound.cancel_called:
                refusal = Error(ErrorClass.TIMEOUT, "prompt hook timed out")
        except Error as exc:
            refusal = exc
        except Exception as exc:  # a bug in the host's hook: reported, classed, contained
            refusal = Error(
                ErrorClass.EXECUTION_FAILURE,
                "prompt hook failed",
                {"cause": f"{type(exc).__name__}: {exc}"[:500]},
            )
        if refusal is None:
            try:
                # committed as the message: JSON data, a user message whose
                # content is what a prompt may hold (CONV-09)
                result = check_user_message(freeze(result, "prompt hook result"))
            except Error as exc:
                refusal = Error(
                    ErrorClass.VALIDATION,
                    "prompt hook must return a user message",
                    {"cause": exc.message},
                )
        if refusal is not None:
            event = self._event(
                "prompt_rejected", {"message_id": message_id, "error": refusal.to_dict()}
            )
            # The rejected message belongs to ``turn_id`` (CONV-26), even before
            # any checkpoint names that turn.
            self._hub.publish(attrs.evolve(event, turn_id=turn_id))
            raise _Rejected(refusal)
        return {**result, "id": message_id}

    # -- stop and settlement ------------------------------------------------------

    def _request_stop(self, reason: str) -> None:
        self._stopping(reason)
        self._bound_closing()
        self._stop_requested.set()
        self._watch_poke.set()
        if self._worker is not None:
            self._worker.cancel()
        if not self._worker_running and not self._settled.is_set():
            self._nursery.start_soon(self._settle)

    def _stopping(self, reason: str) -> None:
        """What a stop does to the conversation's state, whoever notices it
        (``_request_stop``, or the worker unwinding past the run deadline):
        no interaction is answered any more, every executing effect ends,
        the staging is discarded, and the first reason is the run's."""
        pending = self._pending
        if pending is not None:
            if not pending.resolving:
                self._pending = None  # a resolve after cancel() returned is not_found (INT-13)
            if pending.waiter is not None:
                pending.waiter.cancel()  # no answer comes now, wherever the effect waits
        for scope in self._effect_stops:
            scope.cancel()  # every executing effect ends, wherever its task runs
        self._catalog.discard()  # a cancelled or uncertain producer discards (PUB-09)
        if self._stop_reason is None:
            self._stop_reason = reason
            self._note_stop_due(reason)
            if self._phase not in _INACTIVE_PHASES:
                self._phase = Phase.CANCELLING

    def _bound_closing(self) -> None:
        """A stream closing when the run stops, or past the run deadline,
        closes within the cleanup budget (CAN-18): its shield keeps the run's
        cancellation out, not the settlement's clock."""
        scope = self._closing
        if scope is not None:
            # the stop when one is due, else the run deadline (a stop then)
            due = self._stop_due if self._stop_due is not None else self._run_budget.deadline
            bound = due + self._options.cleanup_timeout
            # assigning a deadline re-registers it with Trio: only when earlier
            if bound < scope.deadline:  # noqa: PLR1730
                scope.deadline = bound

    def _note_stop_due(self, reason: str) -> None:
        if self._stop_due is None:
            now = self._now()
            # A deadline noticed late (after a shielded commit) was due at the deadline.
            self._stop_due = (
                min(now, self._run_budget.deadline) if reason == "deadline_exceeded" else now
            )

    async def _start_worker(self, first_turn: str | None, failed: Error | None) -> None:
        self._worker_running = True
        self._nursery.start_soon(self._run_worker, first_turn, failed)

    async def _watch_worker(self) -> None:
        """A worker that ignores its cancellation (a tool shielding itself, a
        blocking call in a thread that cannot be interrupted) never holds the
        settlement back: once the cleanup budget after a stop (or after the
        run deadline) is spent with the worker still running, the run
        settles without it, its effects reported uncertain (CAN-18).  Trio
        cannot stop such a task: the block waits for it to return, and
        whatever it commits after the settlement is refused."""
        while self._worker_running:
            self._watch_poke = poke = trio.Event()
            if self._stop_requested.is_set():
                due = self._stop_due if self._stop_due is not None else self._now()
            else:
                due = self._run_budget.deadline  # inf during a human wait
            with trio.move_on_at(due + self._options.cleanup_timeout) as timer:
                await poke.wait()
            if not timer.cancelled_caught:
                continue  # a stop, a deadline moved, or the worker done
            if self._commit_lock.locked():
                # A commit in flight (bounded by commit_timeout, and shielded)
                # may be what holds the worker: wait for it to end, no longer
                # (the settlement then has what is left of its window), and
                # let the worker run once before judging it.
                with trio.move_on_after(self._options.commit_timeout):
                    await self._commit_lock.acquire()
                    self._commit_lock.release()
                await trio.lowlevel.checkpoint()
                if poke.is_set():
                    continue
            if self._settled.is_set() or self._settling or not self._worker_running:
                return
            if self._stop_reason is None:
                self._request_stop("deadline_exceeded")
            with trio.CancelScope(shield=True):
                await self._settle()
            return

    async def _run_worker(self, first_turn: str | None, failed: Error | None) -> None:

        loop = TurnLoop(self)
        now = self._wall_now()
        deadline = self._record.deadline
        self._run_budget = DeadlineBudget(
            "run", max(0.0, (deadline if deadline is not None else now) - now), self._now
        )
        # Started once the run budget is the record's: it reads that deadline.
        self._nursery.start_soon(self._watch_worker)
        past_deadline = False
        try:
            with self._run_budget.arm() as scope:
                self._worker = scope
                if self._stop_reason is None:
                    try:
                        await loop.run(first_turn, failed)
                    except _StorageFailed:
                        pass
                    except _Stop:
                        pass
                    except Error as error:
                        if error.error_class is ErrorClass.RESOURCE_CONFLICT and (
                            "unsettled" in error.details
                        ):
                            # The kernel refused to finish: an effect a tool
                            # left running (a nested call in a task of its
                            # own) is unsettled.  The settlement below stops
                            # the run with that effect uncertain, never a
                            # refusal escaping the host's ``async with``.
                            self._last_error = error
                        elif (
                            error.error_class is not ErrorClass.TIMEOUT
                            or error.details.get("boundary") != "before_store"
                        ):
                            raise
                        else:
                            # The kernel refused a commit as past the run
                            # deadline (time passed in synchronous code, no
                            # checkpoint for the deadline to cancel at): a
                            # deadline stop too.
                            past_deadline = True
            if (
                (past_deadline or self._run_budget.timed_out())
                and self._stop_reason is None
                and self._phase not in _INACTIVE_PHASES
            ):
                # (a storage failure or a takeover while the worker unwound
                # past the deadline stays what the run is: CAN-11, CAN-19)
                self._stopping("deadline_exceeded")
        finally:
            self._worker = None
            self._worker_running = False
            self._watch_poke.set()
            if not self._settled.is_set():
                with trio.CancelScope(shield=True):
                    await self._settle()

    async def _settle(self) -> None:
        """Shielded cleanup: commit cancel/deadline and a cleanup settlement,
        publish exactly one terminal event (EVT-17)."""
        if self._settled.is_set() or self._settling:
            return  # a repeated cancel() must not start a second settlement (CAN-06)
        self._settling = True
        try:
            if self._record.state in TERMINAL_STATES or self._phase in _INACTIVE_PHASES:
                return
            # No resource registry: resource cleanup counts as confirmed (CAN-20).
            self._resource_cleanup = ResourceCleanup(status="confirmed")
            # The whole settlement fits in cleanup_timeout + commit_timeout
            # from when the stop was due, even if the worker noticed it late
            # (its own shielded commit was in flight at the deadline).
            due = self._stop_due if self._stop_due is not None else self._now()
            commit_by = due + self._options.cleanup_timeout + self._options.commit_timeout
            with trio.CancelScope(shield=True):
                if not await self._settlement_coordinator(commit_by):
                    await self._settlement_missed()
                    return
                try:
                    committed = await self._commit_settlement(commit_by)
                finally:
                    self._commit_lock.release()
            if committed and self._record.state in TERMINAL_STATES:
                self._phase = Phase.TERMINAL
                self._publish(
                    "run_cancelled",
                    {"outcome": self._record.outcome, "state": self._record.state},
                )
        finally:
            self._settled.set()
            self._turn_wakeup.set()

    async def _settlement_coordinator(self, commit_by: float) -> bool:
        """Take the commit coordinator for the settlement, by ``commit_by``:
        a commit in flight ends within its own commit_timeout, and the
        settlement then commits in what is left of its window."""
        try:
            self._commit_lock.acquire_nowait()
            return True
        except trio.WouldBlock:
            pass
        with trio.move_on_at(commit_by):
            await self._commit_lock.acquire()
            return True
        return False

    async def _commit_settlement(self, commit_by: float) -> bool:
        """Commit the settlement, holding the coordinator; whether it was
        committed (a commit in flight may have ended the run meanwhile, or
        the store failed: the conversation's state says which)."""
        if self._record.state in TERMINAL_STATES or self._phase in _INACTIVE_PHASES:
            return False  # the commit in flight ended the run
        # Decided from the record as the commit in flight left it (an
        # admission landing after cancel() was accepted).
        steps = self._settlement_steps(self._stop_reason or "cancelled")
        if commit_by <= self._now():
            # Noticed after its whole window (time passed in synchronous
            # code, no checkpoint for the deadline): the store still gets its
            # commit_timeout.  A commit given no time is no storage failure
            # (CAN-11).
            commit_by = self._now() + self._options.commit_timeout
        try:
            await self._commit_locked(steps, commit_by=commit_by)
        except _StorageFailed:
            return False
        return True

    async def _settlement_missed(self) -> None:
        """A commit in flight held the coordinator past the settlement's whole
        window.  Its outcome comes within its own commit_timeout: a failure is
        the conversation's state (storage_failed); otherwise the window for
        the settlement is gone, the stored run is not terminal and nobody
        drives it any more."""
        async with self._commit_lock:
            pass
        if self._phase not in _INACTIVE_PHASES:
            self._phase = Phase.RECOVERY_REQUIRED
            self._last_error = Error(
                ErrorClass.TIMEOUT,
                "the run did not settle within cleanup_timeout",
                {"recovery_required": True},
            )
            self._hub.finish()  # no event will come

    def _settlement_steps(self, reason: str) -> list[Step]:
        """The stop, the suspended queues and the cleanup settlement as one
        commit: a slow store spends commit_timeout once, and a settlement is
        never cut between its stop and its cleanup (it would leave the run
        cancelling with no terminal event).  The queues are suspended by a
        checkpoint while the run is still running (a conversation checkpoint
        applies in ``running`` only, KER-02); a run never admitted has no
        queue to suspend."""
        steps: list[Step] = []
        if self._record.state == "running":
            steps.append(
                checkpoint_step(
                    lambda c: {**c, "queue_status": "suspended", "pending_interaction": None}
                )
            )
        if self._record.state != "cancelling":
            kind = "deadline_exceeded" if reason == "deadline_exceeded" else "cancel"
            steps.append(command_step(kind, {"reason": reason}))
        uncertain = self._uncertain_work()

        def settlement(record: RunRecord, now: float) -> Command:
            if uncertain:
                data = {"certainty": "uncertain", "evidence": uncertain}
            else:
                requirements = thaw(record.cleanup_required or {})
                data = {"certainty": "confirmed", "settled": requirements}
            return Command("cleanup_settled", now, data)

        steps.append(Step(settlement))
        return steps

    async def _close(self) -> None:
        """Leaving the block: cancel an active run and wait for its settlement,
        bounded by ``cleanup_timeout`` + ``commit_timeout`` (CAN-18)."""
        if not self._settled.is_set() and self._record.state not in TERMINAL_STATES:
            if self._phase not in _INACTIVE_PHASES:
                self._request_stop(self._stop_reason or "cancelled")
            with trio.move_on_after(
                self._options.cleanup_timeout + 2 * self._options.commit_timeout
            ):
                await self._settled.wait()
        self._hub.close()

    def _uncertain_work(self) -> list[dict[str, Any]]:
        """Evidence for every effect that may have happened (rule 4)."""
        evidence: list[dict[str, Any]] = []
        active = self._record.active_provider
        # an attempt whose intent committed as the stop came was never
        # dispatched (``_attempt_id`` is set only once it is): nothing happened
        if active is not None and active["attempt_id"] == self._attempt_id:
            evidence.append(
                {
                    "effect": f"provider:{active['attempt_id']}",
                    "reason": "provider attempt interrupted",
                }
            )
        for invocation_id in sorted(self._record.active_tools):
            if invocation_id in self._unsettled_dispatch or self._stop_reason == "uncertain":
                evidence.append(
                    {
                        "effect": f"tool:{invocation_id}",
                        "reason": self._unsettled_dispatch.get(
                            invocation_id, "tool outcome unknown"
                        ),
                    }
                )
        return evidence


def _storage_error(message: str) -> Error:
    return Error(ErrorClass.STORAGE_FAILED, message, {"recovery_required": True})


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
) -> AsyncIterator[Conversation]:
    """Open a conversation that owns a nursery; leaving the block cancels and
    settles an active run (CAN-18).  What the run stores (its deadline, an
    approval's expiry, each command's time) is wall-clock seconds since the
    epoch read from ``wall_clock`` (``time.time``) once at opening and
    advanced by Trio's clock after (tests with ``MockClock`` inject one)."""
    options = _options(
        work=work,
        run_timeout=run_timeout,
        effect_timeout=effect_timeout,
        commit_timeout=commit_timeout,
        cleanup_timeout=cleanup_timeout,
        output_limit=output_limit,
        provider_output_limit=provider_output_limit,
        schema_admission=schema_admission,
        wall_clock=wall_clock,
    )
    clock = DurableClock.anchored(options.wall_clock)
    if run_id == HOST_RESOLVER:
        # The host answers approvals as resolver "host" (INT-02), and a
        # resolver named like the run is the model approving itself (KER-15).
        raise Error(
            ErrorClass.VALIDATION,
            f"run id {HOST_RESOLVER!r} is reserved: it names the host resolving approvals",
            {"reason": "reserved_run_id"},
        )
    prior = _check_inputs(
        store,
        provider,
        hooks=hooks,
        context=context,
        provider_context=provider_context,
        run=run,
        messages=messages,
    )
    bundle = admit_batch(
        registry if registry is not None else ToolRegistry(()),
        authority if authority is not None else Authority(run_id=run_id),
        tools,
        mode=options.schema_admission,
        run_id=run_id,
    )
    if run is not None:
        if run.run_id != run_id:
            raise Error(ErrorClass.VALIDATION, "run record belongs to another run_id")
        record = run
        phase = Phase.TERMINAL if run.state in TERMINAL_STATES else Phase.RECOVERY_REQUIRED
    else:
        state = dict(EMPTY_CONVERSATION)
        if prior is not None:
            state["messages"] = prior
        record = RunRecord.new(
            run_id,
            incarnation=incarnation,
            work=options.work,
            context={**(context or {}), "conversation": state},
        )
        receipt = await store.create(record)
        if receipt.revision != 0:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "store created another revision")
        phase = Phase.IDLE
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            conversation = Conversation._create(
                run_id=run_id,
                store=store,
                provider=provider,
                bundle=bundle,
                provider_context=provider_context,
                hooks=hooks,
                options=options,
                record=record,
                phase=phase,
                nursery=nursery,
                clock=clock,
            )
            try:
                yield conversation
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await conversation._close()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaves = exception_leaves(group)
        if body_error is not None:
            # The body's own exception (a group of the host's included), alone:
            # it propagates unchanged, not wrapped by this nursery.
            mine = {id(leaf) for leaf in exception_leaves(body_error)}
            if all(id(leaf) in mine for leaf in leaves):
                raise body_error from None
        error = _surface(leaves)
        if isinstance(error, Error):
            raise error from group
        raise error from None


def _surface(flat: list[BaseException]) -> BaseException:
    """Cancelled, KeyboardInterrupt and SystemExit propagate unchanged (CAN-18);
    anything else surfaces as one ``Error`` chained from the group."""
    for kind in (KeyboardInterrupt, SystemExit, trio.Cancelled):
        for item in flat:
            if isinstance(item, kind):
                return item
    errors = [e for e in flat if isinstance(e, Error)]
    if len(errors) == 1 and len(flat) == 1:
        return errors[0]
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        "conversation failed",
        {"errors": [f"{type(e).__name__}: {e}"[:300] for e in flat][:10]},
    )
