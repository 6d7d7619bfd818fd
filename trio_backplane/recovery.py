"""Recovery after a crash: fence the old incarnation, classify what may have happened.

``recover(record, *, incarnation)`` is pure: it reads a stored run and says,
for every outstanding execution intent (effect), whether it is safe to
*withdraw* (cancel without reconciliation) and whether it is safe to
*resume* (run it again).  The two are never confused:

* withdraw is safe for any effect whose ``dispatch_state`` is
  ``"not_dispatched"``;
* resume is safe only for a ``"read_only"`` or ``"idempotent"`` effect that is
  ``"not_dispatched"``;
* a ``"dispatched"`` or ``"unknown"`` mutation (or an effect of unknown
  class) is never safe and is listed in ``uncertain_effects``;
* an effect a cleanup settled as ``"uncertain"`` reads ``"unknown"``,
  whatever its intent recorded when it was published (a ``dispatch_state``
  is what the executor knew then: nothing updates it once the effect is
  dispatched), so it is never safe either.

Outstanding work that is not an effect (unsettled children, dependencies
and the wait on them) is reported as ``unsettled``
(``kernel.cleanup_requirements``): a host must settle it too.

Which intents are reported: only outstanding ones, that is intents whose
status is ``"started"`` (published, never settled) or ``"uncertain"``
(settled as uncertain by a cleanup).  ``"consumed"`` and ``"cancelled"``
intents are settled; they are history, not work, and are not reported.

An interrupted provider attempt (a ``"provider"`` intent still outstanding)
is read-only: nothing in the world depends on it, so the host may discard it
after a confirmed cleanup (``EffectReport.discardable``); it is still never
safe to *resume* unless it is known not to have been dispatched.

``RecoveryHarness.crash`` simulates a crash at a named window against a real
store: it commits what the executor had made durable by then, forgets the
executor, reloads the run, classifies it with ``recover`` and fences the old
incarnation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from .errors import Error, ErrorClass, require_methods
from .kernel import Command, RunRecord, cleanup_requirements, is_time, thaw, transition

__all__ = [
    "CRASH_WINDOWS",
    "DISPATCH_STATES",
    "EFFECT_CLASSES",
    "CrashReport",
    "EffectReport",
    "RecoveryHarness",
    "RecoveryReport",
    "recover",
]

#: Effect classes a recorded intent may carry; anything else reads ``"unknown"``.
EFFECT_CLASSES: Final = frozenset({"read_only", "idempotent", "mutation"})
#: Dispatch states a recorded intent may carry; anything else reads ``"unknown"``.
DISPATCH_STATES: Final = frozenset({"not_dispatched", "dispatched", "unknown"})
#: Crash windows :meth:`RecoveryHarness.crash` simulates.
CRASH_WINDOWS: Final = ("before_dispatch", "after_mutation", "before_result", "after_terminal")

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
    )


@final
@attrs.frozen
class CrashReport:
    """What a crash in ``window`` left behind.

    ``accepted``: the run's outcome was durably accepted before the crash (a
    terminal state is stored).  ``safe_to_withdraw``: every outstanding effect
    may be withdrawn without reconciliation (and there is one to withdraw).
    ``recovery`` is the classification of the reloaded record and ``record``
    the record as reloaded after the crash, before fencing.
    """

    window: str
    accepted: bool
    safe_to_withdraw: bool
    recovery: RecoveryReport | None = None
    record: RunRecord | None = None


@final
class RecoveryHarness:
    """Simulate crashes against a store and classify what they leave behind."""

    @staticmethod
    async def crash(
        store: Any, record: RunRecord, window: str, *, fence: bool = True, at: float = 0.0
    ) -> CrashReport:
        """Crash an executor of ``record`` in ``window`` and recover.

        ``record`` is the run as last committed (it is created first if the
        store does not hold it and it is at revision 0); the harness brings it
        to a step where a tool may be invoked, then commits what the executor
        made durable before the crash:

        * ``"before_dispatch"``: a mutation's intent, ``not_dispatched``;
        * ``"after_mutation"``: the intent, ``dispatched``, and no result;
        * ``"before_result"``: the intent with its dispatch never confirmed
          (``unknown``) and no result;
        * ``"after_terminal"``: the intent, its result and the run's terminal
          ``completed`` state.

        It then drops the executor, reloads the run from ``store``, classifies
        it with :func:`recover` for the next incarnation and (``fence=True``)
        fences the old one with ``store.fence``, which a store without fencing
        refuses with ``unsupported_capability``.
        """
        if window not in CRASH_WINDOWS:
            raise Error(ErrorClass.VALIDATION, "invalid crash window", {"window": repr(window)})
        if not isinstance(record, RunRecord):
            raise Error(ErrorClass.VALIDATION, "the crash harness needs a RunRecord")
        require_methods(store, "store", ("create", "load", "commit", "fence"))
        if not is_time(at):  # checked before anything is stored
            raise Error(
                ErrorClass.VALIDATION,
                "at must be a finite number: the time of the harness's first command",
                {"type": type(at).__name__},
            )
        clock = [float(at)]

        async def apply(current: RunRecord, kind: str, **data: Any) -> RunRecord:
            clock[0] += 1.0
            new, events = transition(current, Command(kind, at=clock[0], input=data))
            await store.commit(
                current.run_id,
                incarnation=current.incarnation,
                expected_revision=current.revision,
                record=new,
                events=events,
            )
            return new

        current = record
        if await store.load(record.run_id) is None:
            await store.create(record)
        if current.state == "queued":
            if current.admitted:
                current = await apply(current, "start")
            else:
                current = await apply(current, "admit", state="running")
        if current.state != "running":
            raise Error(
                ErrorClass.VALIDATION,
                "the crash harness needs a running run",
                {"state": current.state},
            )
        if current.active_provider is not None:
            current = await apply(current, "provider_completed", final=False)
        if current.step_id is None:
            current = await apply(current, "provider_started")
            current = await apply(current, "provider_completed", final=False)
        dispatch = {
            "before_dispatch": "not_dispatched",
            "after_mutation": "dispatched",
            "before_result": "unknown",
            "after_terminal": "dispatched",
        }[window]
        before = set(current.active_tools)
        current = await apply(
            current,
            "tool_invoked",
            tool_name="crash_harness.mutation",
            effect_class="mutation",
            dispatch_state=dispatch,
        )
        if window == "after_terminal":
            (invocation_id,) = set(current.active_tools) - before
            current = await apply(
                current, "tool_completed", invocation_id=invocation_id, result={"ok": True}
            )
            current = await apply(current, "finish", status="completed")
        # The crash: the executor's memory (``current``) is gone; only the
        # store remains.
        del current
        loaded = await store.load(record.run_id)
        if loaded is None:
            raise Error(
                ErrorClass.STORAGE_FAILED,
                "the store lost the run across the crash",
                {"run_id": record.run_id},
            )
        report = recover(loaded, incarnation=loaded.incarnation + 1)
        if fence:
            await store.fence(loaded.run_id, incarnation=report.incarnation)
        return CrashReport(
            window=window,
            accepted=loaded.terminal,
            safe_to_withdraw=not loaded.terminal and report.safe_to_withdraw,
            recovery=report,
            record=loaded,
        )
