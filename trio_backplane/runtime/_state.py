"""The conversation's live state, shared by its parts, and its publisher.

A conversation is a handful of parts (the coordinator, the turn loop, the
gateway, the settlement, ...) acting on one run.  What they share lives here,
in the open: ``RunState`` holds the last acknowledged record, the phase, the
stop and the effects executing now; ``Publisher`` turns changes into events.
Each part is handed these at construction; none reads another part's
private attributes.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..kernel import RunRecord, freeze, thaw
from ..kernel._construct import fast_constructor
from ._clock import DurableClock
from ._conversation_state import ConversationState
from ._deadline import DeadlineBudget
from ._resources import OwnedRegistries
from ._resume import ResumePoint
from ._subscribers import Hub
from ._telemetry import RunRecorder
from ._types import Event, Phase, ResourceCleanup

__all__ = ["INACTIVE_PHASES", "Pending", "Publisher", "RunState"]

#: Phases in which the conversation drives nothing any more.
INACTIVE_PHASES: Final = frozenset({Phase.TERMINAL, Phase.RECOVERY_REQUIRED, Phase.STORAGE_FAILED})
#: Events after which a run publishes nothing.
_LAST_WORDS: Final = frozenset({"run_completed", "run_failed", "run_cancelled", "storage_failed"})


#: ``Event(...)``, one a published event: without attrs' ``__init__``
_event: Final = fast_constructor(Event)

#: ``<kind>-<incarnation>-<n>``, numbers as this runtime writes them (an id
#: with longer ones, a host's own, is no id of ours: never converted, so
#: never past Python's int digit limit)
_OUR_ID: Final = re.compile(r"[a-z_]+-([0-9]{1,18})-([0-9]{1,18})")


def _first_id(record: RunRecord) -> int:
    """Where this conversation's ids (``<kind>-<incarnation>-<n>``) start:
    past any the record's transcript already holds for its incarnation (a
    run started from another's committed messages), so ids stay unique in
    the run."""
    highest = 0
    prefix = f"-{record.incarnation}-"
    for message in record.transcript:
        ident = message.get("id") if isinstance(message, Mapping) else None
        if type(ident) is str and prefix in ident:
            found = _OUR_ID.fullmatch(ident)
            if found and int(found[1]) == record.incarnation:
                highest = max(highest, int(found[2]))
    return highest + 1


@final
class Pending:
    """The one interaction a conversation may have open."""

    __slots__ = (
        "announced",
        "answer",
        "answered_at",
        "base_deadline",
        "delivered",
        "ended_at",
        "interaction_id",
        "request",
        "resolving",
        "started",
        "stored",
        "waiter",
    )

    def __init__(self, interaction_id: str, request: Any, started: float) -> None:
        self.interaction_id = interaction_id
        self.request = request
        self.started = started
        self.resolving = False
        #: its pending checkpoint is committed: it must be cleared again
        self.stored = False
        #: ``interaction_requested`` went out (the deadlines are suspended):
        #: a host may answer from then on
        self.announced = False
        #: when ``resolve`` measured the wait it committed: the wait ends
        #: there, for the stored deadline and the resumed budgets alike
        self.answered_at: float | None = None
        self.answer: Any = None
        self.delivered = trio.Event()
        #: the stored run deadline when the wait began: the wait moves it to
        #: ``base_deadline + waited`` (in steps if commits need it meanwhile)
        self.base_deadline: float | None = None
        #: when the waiting effect stopped waiting (answered or not)
        self.ended_at: float | None = None
        #: the scope the effect waits for the answer in: a stop of the run
        #: cancels it, wherever the effect's task runs (a nested call in a
        #: host's task is out of the worker's reach)
        self.waiter: trio.CancelScope | None = None

    def moved_deadline(self, until: float) -> float | None:
        """The stored run deadline once the wait has lasted until ``until``."""
        if self.base_deadline is None:
            return None
        return self.base_deadline + max(0.0, until - self.started)


@final
@attrs.define(kw_only=True, eq=False)
class RunState:
    """What the parts of one conversation read and change.  Only the
    coordinator replaces ``record`` (with an acknowledged commit); the first
    stop's reason stays the run's."""

    run_id: str
    #: the last acknowledged record
    record: RunRecord
    phase: Phase
    #: the run's clock, read without looking the run up each time
    now: Callable[[], float]
    #: Trio's clock to the wall clock of what is stored
    clock: DurableClock
    run_budget: DeadlineBudget
    token: trio.lowlevel.TrioToken = attrs.field(factory=trio.lowlevel.current_trio_token)
    stop_reason: str | None = None  # "cancelled" | "deadline_exceeded" | "uncertain"
    #: when the stop was due (the run deadline for a deadline stop): the
    #: settlement's cleanup and commit budgets count from here
    stop_due: float | None = None
    last_error: Error | None = None
    pending: Pending | None = None
    effects: list[DeadlineBudget] = attrs.Factory(list)  # armed effect budgets, outermost first
    #: a scope per executing effect, cancelled when the run stops
    effect_stops: set[trio.CancelScope] = attrs.Factory(set)
    executing: list[str] = attrs.Factory(list)  # executing invocation ids, outermost first
    #: why each dispatched, unsettled effect may have happened (its evidence)
    unsettled: dict[str, str] = attrs.Factory(dict)
    step_id: str | None = None
    attempt_id: str | None = None
    #: the provider attempt's scope while its stream closes (shielded)
    closing: trio.CancelScope | None = None
    resource_cleanup: ResourceCleanup = attrs.Factory(ResourceCleanup)
    #: the registries the run owns, closed on every terminal path; a human
    #: wait stops their clocks too
    owned: OwnedRegistries
    #: wakes the worker's watchdog: a stop, a deadline moved, the worker done
    watch_poke: trio.Event = attrs.Factory(trio.Event)
    #: set once the run is terminal, recovery_required or storage_failed
    settled: trio.Event = attrs.Factory(trio.Event)
    #: the run's spans and metrics (``None``: no telemetry, nothing recorded)
    telemetry: RunRecorder | None = None
    #: where a resumed run's turn loop starts (taken by its first turn)
    resume: ResumePoint | None = None
    #: the interaction a resumed run re-asks under its stored id (taken by
    #: its first interaction)
    reopened: Mapping[str, Any] | None = None
    _ids: Iterator[int] = attrs.field(init=False)
    #: the conversation state of ``_read_of`` (read once per record)
    _read: ConversationState | None = attrs.field(init=False, default=None)
    _read_of: RunRecord | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._ids = itertools.count(_first_id(self.record))
        if self.phase in INACTIVE_PHASES:
            self.settled.set()

    @property
    def conversation(self) -> ConversationState:
        """The acknowledged record's conversation state."""
        record = self.record
        if record is not self._read_of or self._read is None:
            self._read = ConversationState.of(record, self._read)
            self._read_of = record
        return self._read

    def held(self) -> ConversationState:
        """The conversation state for its fields other than the growing ones
        (queues, catalog revision, pending interaction, ...): the transcript
        and usage it shows may be an earlier record's.  Reading them never
        rebuilds the state for a commit that only grew the transcript."""
        read = self._read
        if read is not None and self.record.context.get("conversation") is read.source:
            return read
        return self.conversation

    @property
    def inactive(self) -> bool:
        return self.phase in INACTIVE_PHASES

    def new_id(self, kind: str) -> str:
        """``<kind>-<incarnation>-<n>``, unique in the run."""
        return f"{kind}-{self.record.incarnation}-{next(self._ids)}"

    def user_message(self, content: Any) -> dict[str, Any]:
        """A user message of checked ``content``, with a new id."""
        return {"role": "user", "content": content, "id": self.new_id("msg")}

    def wall_now(self) -> float:
        """Now, as the instants the run stores read."""
        return self.clock.wall(self.now())

    def require_own_run(self) -> None:
        """Refuse a call from another Trio run or a thread: the conversation's
        tasks, events and scopes belong to the run that opened it."""
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:
            token = None
        if token is not self.token:
            raise Error(
                ErrorClass.VALIDATION,
                "conversation used outside the Trio run that opened it",
                {"reason": "foreign_trio_run"},
            )

    def bound_closing(self, cleanup_timeout: float) -> None:
        """A stream closing when the run stops, or past the run deadline,
        closes within the cleanup budget: its shield keeps the run's
        cancellation out, not the settlement's clock."""
        scope = self.closing
        if scope is not None:
            # the stop when one is due, else the run deadline (a stop then)
            due = self.stop_due if self.stop_due is not None else self.run_budget.deadline
            bound = due + cleanup_timeout
            # assigning a deadline re-registers it with Trio: only when earlier
            if bound < scope.deadline:  # noqa: PLR1730
                scope.deadline = bound

    def suspend_deadlines(self) -> None:
        """A human wait: stop the run and effect clocks (rule 5)."""
        self.run_budget.suspend()
        for budget in self.effects:
            budget.suspend()
        self.owned.suspend()
        self.watch_poke.set()

    def resume_deadlines(self, at: float | None = None) -> None:
        """Resume the budgets a human wait suspended, as of ``at`` (when the
        wait ended; default now)."""
        self.run_budget.resume(at)
        for budget in self.effects:
            budget.resume(at)
        self.owned.resume(at)
        self.watch_poke.set()


@final
class Publisher:
    """The conversation's events: built from the run state at publication,
    never built when nobody listens, and none after the run's last word."""

    __slots__ = ("_state", "hub")

    def __init__(self, state: RunState) -> None:
        self._state = state
        self.hub = Hub(self._dropped)
        if state.inactive:
            self.hub.finish()  # a stored run, only inspected: no event will come

    @property
    def active(self) -> bool:
        """Whether anyone listens (an event is worth building)."""
        return self.hub.active

    def event(self, type_: str, payload: Mapping[str, Any]) -> Event:
        state = self._state
        try:
            # read-only: every subscriber gets this very payload, and none
            # can edit what another receives
            payload = freeze(payload, "event payload")
        except Error:
            # not JSON data (a provider's, refused once the response is
            # committed): a copy, never what the run holds
            payload = thaw(payload)
        return _event(
            type=type_,
            payload=payload,
            run_id=state.run_id,
            incarnation=state.record.incarnation,
            turn_id=state.held().turn_id,  # not a growing field
            step_id=state.step_id,
            attempt_id=state.attempt_id,
        )

    def publish(self, type_: str, payload: Mapping[str, Any]) -> None:
        hub = self.hub
        if hub.active:  # nobody listening: build no event
            hub.publish(self.event(type_, payload))
        if type_ in _LAST_WORDS:
            hub.finish()

    def _dropped(self, count: int) -> Event:
        return self.event("events_dropped", {"count": count})
