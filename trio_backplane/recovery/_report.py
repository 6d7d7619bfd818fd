"""Classifying a stored run's outstanding work (see the package docstring)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import RunRecord, cleanup_requirements, thaw

__all__ = [
    "DISPATCH_STATES",
    "EFFECT_CLASSES",
    "EffectReport",
    "RecoveryReport",
    "recover",
]

#: Effect classes a recorded intent may carry; anything else reads ``"unknown"``.
EFFECT_CLASSES: Final = frozenset({"read_only", "idempotent", "mutation"})
#: Dispatch states a recorded intent may carry; anything else reads ``"unknown"``.
DISPATCH_STATES: Final = frozenset({"not_dispatched", "dispatched", "unknown"})

_RESUMABLE: Final = frozenset({"read_only", "idempotent"})
_OUTSTANDING: Final = frozenset({"started", "uncertain"})


@final
@attrs.frozen
class EffectReport:
    """One outstanding effect (execution intent) and what may be done with it."""

    effect_id: str
    effect_class: str
    dispatch_state: str
    safe_to_withdraw: bool
    safe_to_resume: bool
    kind: str = "unknown"
    status: str = "started"
    #: An interrupted provider attempt: read-only, may be discarded after a
    #: confirmed cleanup (never replayed).
    discardable: bool = False


@final
@attrs.frozen
class RecoveryReport:
    """``recover``'s classification of one run.

    ``incarnation`` is the recovering executor's, ``fenced_incarnation`` the
    one it must fence (the record's).  ``effects`` lists every outstanding
    effect, ordered by effect id; ``uncertain_effects`` the ids of those that
    may have changed the world (dispatched or unknown mutations, or effects
    of unknown class): never safe, they need host reconciliation.
    """

    run_id: str
    incarnation: int
    fenced_incarnation: int
    effects: tuple[EffectReport, ...]
    uncertain_effects: tuple[str, ...]
    state: str = "running"
    terminal: bool = False
    #: the record's outstanding work by kind (``provider``, ``tools``,
    #: ``children``, ``dependencies``: sorted ids), effects included
    unsettled: Mapping[str, Any] = attrs.field(factory=dict)
    #: what the run's tools recorded of resources that may outlive a host
    #: (``kind: "process_group"`` with ``pgid``, ``start_time``, ``boot_id``
    #: and ``host``): after a crash they may still run, see
    #: :func:`trio_backplane.resources.kill_orphans`
    resources: tuple[Mapping[str, Any], ...] = ()

    @property
    def safe_to_withdraw(self) -> bool:
        """Every outstanding effect may be withdrawn (and there is at least one)."""
        return bool(self.effects) and all(e.safe_to_withdraw for e in self.effects)


def _classify(effect_id: str, intent: Mapping[str, Any]) -> EffectReport:
    effect_class = intent.get("effect_class")
    if not isinstance(effect_class, str) or effect_class not in EFFECT_CLASSES:
        effect_class = "unknown"
    dispatch_state = intent.get("dispatch_state")
    if (
        not isinstance(dispatch_state, str)
        or dispatch_state not in DISPATCH_STATES
        or intent.get("status") == "uncertain"  # a cleanup could not confirm it stopped
    ):
        dispatch_state = "unknown"
    kind = intent.get("kind")
    if not isinstance(kind, str):
        kind = effect_id.split(":", 1)[0] if ":" in effect_id else "unknown"
    not_dispatched = dispatch_state == "not_dispatched"
    return EffectReport(
        effect_id=effect_id,
        effect_class=effect_class,
        dispatch_state=dispatch_state,
        safe_to_withdraw=not_dispatched,
        safe_to_resume=not_dispatched and effect_class in _RESUMABLE,
        kind=kind,
        status=str(intent.get("status")),
        discardable=kind == "provider" and effect_class == "read_only",
    )


def recover(record: RunRecord, *, incarnation: int) -> RecoveryReport:
    """Classify ``record``'s outstanding work for a recovering ``incarnation``.

    Pure.  Raises ``forbidden`` "recovery incarnation must fence an older
    executor" unless ``incarnation`` exceeds ``record.incarnation``; the host
    then fences the old incarnation with ``Store.fence`` before acting.
    """
    if not isinstance(record, RunRecord):
        raise Error(ErrorClass.VALIDATION, "recover needs a RunRecord")
    if type(incarnation) is not int or incarnation <= record.incarnation:
        raise Error(
            ErrorClass.FORBIDDEN,
            "recovery incarnation must fence an older executor",
            {"stored": record.incarnation, "requested": repr(incarnation)},
        )
    effects = []
    for effect_id in sorted(record.intents):
        intent = record.intents[effect_id]
        if not isinstance(intent, Mapping):
            intent = {}
        if intent.get("status") in ("consumed", "cancelled"):
            continue  # settled
        effects.append(_classify(effect_id, intent))
    uncertain = tuple(
        e.effect_id
        for e in effects
        if e.dispatch_state != "not_dispatched" and e.effect_class in ("mutation", "unknown")
    )
    return RecoveryReport(
        run_id=record.run_id,
        incarnation=incarnation,
        fenced_incarnation=record.incarnation,
        effects=tuple(effects),
        uncertain_effects=uncertain,
        state=record.state,
        terminal=record.terminal,
        unsettled=thaw(cleanup_requirements(record)),
        resources=_resources(record),
    )


#: Resources that live only as long as the invocation that recorded them
#: (an MCP task, which the server runs for that one call): once it is
#: settled, they are history, not something that may outlive a host.
_CALL_SCOPED: Final = frozenset({"mcp_task"})


def _resources(record: RunRecord) -> tuple[Mapping[str, Any], ...]:
    """The resources the run's tools recorded (``context["conversation"]``)
    that may still exist: all but those of a call that has settled."""
    conversation = (record.context or {}).get("conversation")
    listed = conversation.get("resources") if isinstance(conversation, Mapping) else None
    if not isinstance(listed, list | tuple):
        return ()
    active = record.active_tools
    return tuple(
        thaw(item)
        for item in listed
        if isinstance(item, Mapping)
        and (item.get("kind") not in _CALL_SCOPED or item.get("invocation_id") in active)
    )
