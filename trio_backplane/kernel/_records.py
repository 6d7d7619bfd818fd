"""The run record, its budget, commands and events: frozen JSON-data records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ._derived import assoc
from ._fields import (
    _at,
    _bool,
    _frozen_list,
    _frozen_mapping,
    _input,
    _non_negative,
    _optional_mapping,
    _optional_str,
    _optional_time,
    _positive,
    _quota,
    _run_id,
    _slot_setters,
    _str_tuple,
    _wrong,
)
from ._frozen import _EMPTY, _EMPTY_LIST, FrozenDict, FrozenList, check_json

__all__ = [
    "ACTIVE_STATES",
    "GROWING",
    "INTENT_STATUSES",
    "RUN_STATES",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "Budget",
    "Command",
    "RunEvent",
    "RunRecord",
    "kernel_event",
    "reserve",
]

#: Version of the record layout written by this code (the codec checks it;
#: version 1 kept the transcript and usage inside ``context["conversation"]``).
SCHEMA_VERSION: Final = 2
#: The record's growing sequences: appended to, never rewritten, and stored
#: one row per item by the SQL stores.
GROWING: Final = ("transcript", "usage")

TERMINAL_STATES: Final = frozenset(
    {"completed", "failed", "cancelled", "timed_out", "unknown_outcome"}
)
ACTIVE_STATES: Final = frozenset({"queued", "running", "waiting_approval", "waiting_result"})
RUN_STATES: Final = ACTIVE_STATES | {"cancelling"} | TERMINAL_STATES
INTENT_STATUSES: Final = frozenset({"started", "consumed", "cancelled", "uncertain"})


def _budget(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Budget):
        raise _wrong(attribute, value, "a Budget")


@final
@attrs.frozen
class Budget:
    """A finite work quota; every provider attempt and tool invocation reserves
    one unit under its reservation id (``"provider:<attempt>"``, ``"tool:<id>"``)."""

    quota: int = attrs.field(validator=_quota)
    used: int = attrs.field(default=0, validator=_non_negative)
    reservations: Mapping[str, int] = attrs.field(default=_EMPTY, converter=_frozen_mapping)


_BUDGET_SETTERS: Final = _slot_setters(Budget)
_set_budget_quota: Final = _BUDGET_SETTERS["quota"]
_set_budget_used: Final = _BUDGET_SETTERS["used"]
_set_budget_reservations: Final = _BUDGET_SETTERS["reservations"]


def reserve(budget: Budget, reservation_id: str, amount: int = 1) -> Budget:
    """Reserve ``amount`` under ``reservation_id``; idempotent for the same
    amount, ``budget_exceeded`` beyond the quota."""
    if type(amount) is not int or amount < 1:
        raise Error(ErrorClass.VALIDATION, "reservation amount must be a positive int")
    held = budget.reservations.get(reservation_id)
    if held is not None:
        if held == amount:
            return budget
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "reservation id already used with another amount",
            {"reservation_id": reservation_id, "held": held, "requested": amount},
        )
    if budget.used + amount > budget.quota:
        raise Error(
            ErrorClass.BUDGET_EXCEEDED,
            "work quota exhausted",
            {"used": budget.used, "requested": amount, "quota": budget.quota},
        )
    # Built slot by slot from checked parts (the quota as it was, a larger
    # non-negative int, a frozen mapping): no validator or converter to run.
    grown: Budget = object.__new__(Budget)
    _set_budget_quota(grown, budget.quota)
    _set_budget_used(grown, budget.used + amount)
    _set_budget_reservations(grown, assoc(budget.reservations, reservation_id, amount))
    return grown


def _state(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not str or value not in RUN_STATES:
        raise Error(ErrorClass.VALIDATION, "unknown run state", {"state": repr(value)})


@final
@attrs.frozen
class RunRecord:
    """One run, as committed: JSON data only, frozen all the way down.

    ``intents`` maps ``"provider:<attempt_id>"``/``"tool:<invocation_id>"`` to
    ``{"kind", "status", "effect_class", "dispatch_state", ...}``;
    ``active_tools`` maps invocation ids to their identity; ``tool_results``
    holds each completed invocation's result until its transcript projection.
    ``transcript`` (the conversation's messages) and ``usage`` (one provider
    usage report per response) only grow (:data:`GROWING`): commands append
    to them; ``context`` is the host's and the runtime's other state.

    Mappings are ``FrozenDict`` (a ``dict``), or ``LayeredDict`` once a
    growing one (intents, tool results, reservations) is long: read them as
    ``Mapping``; :func:`thaw` gives plain ``dict``/``list`` data, and
    ``kernel.dumps`` encodes either as is.
    """

    run_id: str = attrs.field(validator=_run_id)
    incarnation: int = attrs.field(default=1, validator=_positive)
    revision: int = attrs.field(default=0, validator=_non_negative)
    state: str = attrs.field(default="queued", validator=_state)
    admitted: bool = attrs.field(default=False, validator=_bool)
    deadline: float | None = attrs.field(default=None, validator=_optional_time)
    budget: Budget = attrs.field(factory=lambda: Budget(quota=100), validator=_budget)
    step_id: str | None = attrs.field(default=None, validator=_optional_str)
    counters: Mapping[str, int] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    active_provider: Mapping[str, Any] | None = attrs.field(
        default=None, converter=_optional_mapping
    )
    active_tools: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    intents: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    tool_results: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    provider_result: Mapping[str, Any] | None = attrs.field(
        default=None, converter=_optional_mapping
    )
    active_wait: Mapping[str, Any] | None = attrs.field(default=None, converter=_optional_mapping)
    dependencies: tuple[str, ...] = attrs.field(default=(), converter=tuple, validator=_str_tuple)
    children: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    stop_reason: str | None = attrs.field(default=None, validator=_optional_str)
    cleanup_required: Mapping[str, Any] | None = attrs.field(
        default=None, converter=_optional_mapping
    )
    outcome: Mapping[str, Any] | None = attrs.field(default=None, converter=_optional_mapping)
    context: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    transcript: FrozenList = attrs.field(default=_EMPTY_LIST, converter=_frozen_list)
    usage: FrozenList = attrs.field(default=_EMPTY_LIST, converter=_frozen_list)
    schema_version: int = attrs.field(default=SCHEMA_VERSION, validator=_positive)

    @classmethod
    def new(
        cls,
        run_id: str,
        *,
        incarnation: int = 1,
        work: int = 100,
        context: Mapping[str, Any] | None = None,
        transcript: Any = None,
    ) -> RunRecord:
        """A fresh ``queued`` run at revision 0 (``transcript``: the messages
        it starts from)."""
        if context is not None:
            if not isinstance(context, Mapping):
                raise Error(
                    ErrorClass.VALIDATION,
                    "run context must be a mapping",
                    {"type": type(context).__name__},
                )
            check_json(dict(context), "run context")
        return cls(
            run_id=run_id,
            incarnation=incarnation,
            budget=Budget(quota=work),
            context=context,
            transcript=transcript,
        )

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def conversation(self) -> Mapping[str, Any] | None:
        """The conversation state checkpointed in ``context["conversation"]``,
        with the record's ``transcript`` as its ``"messages"`` and its
        ``usage`` as ``"usage"``; ``None`` before any checkpoint."""
        value = self.context.get("conversation")
        if type(value) is not FrozenDict and not isinstance(value, Mapping):
            return None
        merged = FrozenDict(value)
        dict.__setitem__(merged, "messages", self.transcript)
        dict.__setitem__(merged, "usage", self.usage)
        return merged


@final
@attrs.frozen
class Command:
    """A request to change a run: ``kind``, the time ``at`` (the caller's clock;
    the kernel never reads one) and JSON ``input``."""

    kind: str
    at: float = attrs.field(validator=_at)
    input: Mapping[str, Any] = attrs.field(default=None, converter=_input)


@final
@attrs.frozen
class RunEvent:
    """``"run.<command>"`` with ``{"state", "input"}``; the store assigns ``sequence``."""

    type: str
    occurred_at: float
    payload: Mapping[str, Any] = attrs.field(converter=_frozen_mapping)
    sequence: int | None = None


_EVENT_SETTERS: Final = _slot_setters(RunEvent)
_set_event_type: Final = _EVENT_SETTERS["type"]
_set_event_at: Final = _EVENT_SETTERS["occurred_at"]
_set_event_payload: Final = _EVENT_SETTERS["payload"]
_set_event_sequence: Final = _EVENT_SETTERS["sequence"]


def kernel_event(type_: str, occurred_at: float, payload: FrozenDict) -> RunEvent:
    """A ``RunEvent`` the kernel built from values it checked (a frozen
    payload, a command's time): set slot by slot, no converter run."""
    event: RunEvent = object.__new__(RunEvent)
    _set_event_type(event, type_)
    _set_event_at(event, occurred_at)
    _set_event_payload(event, payload)
    _set_event_sequence(event, None)
    return event
