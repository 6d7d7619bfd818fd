"""``transition(record, command) -> (record, events)``: the pure run state machine.

In the spirit of h11: explicit states, one function per command, no I/O, no
clock (time comes inside the command).  A command the state does not allow
raises ``validation``; a stale or foreign identity or a duplicate raises
``resource_conflict``; an accepted command raises the revision by exactly one
and yields one ``"run.<command>"`` event.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from . import _derived
from ._checks import _conflict, _invalid, _malformed
from ._commands import (
    _ITEMS,
    _KEY_SUMMARIES,
    _ORDER,
    DIGESTED,
    UNSET,
    Cancel,
    CleanupSettled,
    ConversationUpdated,
    DeadlineExceeded,
    KernelCommand,
    ProviderCompleted,
    ProviderStarted,
    ToolCompleted,
    ToolInvoked,
    event_input,
    typed,
)
from ._evolve import evolved
from ._frozen import MAX_DEPTH, RECORD_DEPTH, FrozenDict, _accelerator
from ._handlers import _EVENT_TYPES, _HANDLERS, _Handler
from ._records import TERMINAL_STATES, Budget, Command, RunEvent, RunRecord, kernel_event

__all__ = ["fence", "transition"]

#: Commands that still apply after the run deadline.
_AFTER_DEADLINE: Final = frozenset({Cancel, DeadlineExceeded, CleanupSettled, ConversationUpdated})


def _check_identity(record: RunRecord, command: KernelCommand) -> None:
    """A command naming another run or incarnation is foreign."""
    run_id, incarnation = command.run_id, command.incarnation
    if run_id is not UNSET and run_id != record.run_id:
        raise _conflict("command belongs to another run", run_id=run_id)
    if incarnation is not UNSET and incarnation != record.incarnation:
        raise _conflict(
            "command belongs to another incarnation",
            expected=record.incarnation,
            received=incarnation,
        )


def _configured() -> Any:
    """The C accelerator's ``transition`` of the four commands of a tool
    step, configured with the kernel's types and layouts, or ``None``."""
    fast = getattr(_accelerator, "transition", None)
    if fast is None:  # pragma: no cover - exercised where no compiler was available
        return None
    kinds = (ProviderStarted, ProviderCompleted, ToolInvoked, ToolCompleted)  # its order
    try:
        _accelerator.configure_transition(
            RunRecord,
            Budget,
            kernel_event("run.probe", 0.0, FrozenDict()),
            UNSET,
            _KEY_SUMMARIES,
            _ITEMS,
            MAX_DEPTH,
            RECORD_DEPTH,
            tuple(
                (cls, _EVENT_TYPES[cls], tuple((name, name in DIGESTED) for name in _ORDER[cls]))
                for cls in kinds
            ),
        )
    except (TypeError, ValueError):  # pragma: no cover - a layout it does not know
        return None
    return fast


#: ``transition`` of a tool step's commands in C (the same records and events,
#: lineage included), declining to the Python code below on any doubt.
_fast_transition: Final = _configured()


def transition(
    record: RunRecord, command: Command | KernelCommand, *, revision: int | None = None
) -> tuple[RunRecord, list[RunEvent]]:
    """Apply ``command`` to ``record``: a new record (revision + 1) and one event.

    ``revision``: the new record's revision when several commands go into one
    store commit, which raises the stored revision once: each command after
    the first keeps its record's (``revision == record.revision``)."""
    if type(record) is not RunRecord:
        raise Error(ErrorClass.VALIDATION, "transition needs a RunRecord")
    if _fast_transition is not None:
        done = _fast_transition(
            record, command, revision, _derived._LAYER_FROM, _derived._OVERLAY_MAX
        )
        if done is not NotImplemented:
            return done  # type: ignore[no-any-return]
    if type(command) is Command:
        command = typed(command)
    handler = _HANDLERS.get(type(command))
    if handler is None:
        raise Error(ErrorClass.VALIDATION, "transition needs a Command")
    return _apply(record, command, handler, revision)


def _apply(
    record: RunRecord, command: KernelCommand, handler: _Handler, revision: int | None
) -> tuple[RunRecord, list[RunEvent]]:
    given = event_input(command)  # checks a typed command's values as JSON data
    if record.state in TERMINAL_STATES:
        raise _invalid(record, command)
    _check_identity(record, command)
    if (
        record.deadline is not None
        and command.at > record.deadline
        and type(command) not in _AFTER_DEADLINE
    ):
        raise Error(
            ErrorClass.TIMEOUT,
            "run deadline has expired",
            {"boundary": "before_store", "deadline": record.deadline, "at": command.at},
        )
    try:
        changes = handler(record, command)
    except (KeyError, TypeError, AttributeError) as exc:
        # A record built or decoded with active work the kernel cannot read
        # (an intent that is not a mapping, an active provider without its
        # intent, ...): the caller's data, classed, never a raw exception.
        raise _malformed(exc) from None
    if revision is None:
        revision = record.revision + 1
    elif type(revision) is not int or not record.revision <= revision <= record.revision + 1:
        raise Error(
            ErrorClass.VALIDATION,
            "a transition keeps its record's revision or raises it by one",
            {"revision": repr(revision)[:100], "record_revision": record.revision},
        )
    changes["revision"] = revision  # the handler's own dict
    new = evolved(record, changes)
    payload = FrozenDict({"state": new.state, "input": given})
    # A float, as every store gives event times back (SQL columns are doubles)
    at = command.at
    return new, [
        kernel_event(_EVENT_TYPES[type(command)], at if type(at) is float else float(at), payload)
    ]


def fence(
    record: RunRecord, incarnation: int, *, at: float = 0.0
) -> tuple[RunRecord, list[RunEvent]]:
    """Advance ``record`` to a newer ``incarnation``: the old one can
    never commit again.  ``resource_conflict`` unless it is strictly newer."""
    if type(incarnation) is not int or incarnation <= record.incarnation:
        raise _conflict(
            "fence must raise the incarnation",
            stored=record.incarnation,
            requested=incarnation,
        )
    new = attrs.evolve(record, incarnation=incarnation, revision=record.revision + 1)
    event = RunEvent(
        type="run.fence",
        occurred_at=at,
        payload={"state": new.state, "input": {"incarnation": incarnation}},
    )
    return new, [event]
