"""Taking over a run whose host is gone: fence it, classify it with the
recovery rules, commit the outcome with its evidence, and say what a
replacement may carry.  Nothing is ever replayed."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import ACTIVE_STATES, Cancel, CleanupSettled, RunRecord, thaw, transition
from ._report import RecoveryReport, recover

__all__ = ["Replacement", "Settled", "replacement_for", "settle_run"]

#: The stop reason of a run settled by a takeover.
RECOVERED = "recovered"


@final
@attrs.frozen(kw_only=True)
class Settled:
    """What :func:`settle_run` did: the run's record now, its
    classification, and whether this call committed the outcome."""

    record: RunRecord
    report: RecoveryReport
    committed: bool
    #: the incarnation that can no longer commit (``None``: nothing fenced)
    fenced: int | None = None
    #: left running for ``open_conversation(resume=record)`` (``resume=True``
    #: and nothing in flight): nothing committed beyond the fence
    resumable: bool = False


@final
@attrs.frozen(kw_only=True)
class Replacement:
    """What a replacement of a settled run may carry: its committed
    transcript (for ``open_conversation(messages=)``), the work and the
    seconds of run time it has left."""

    messages: tuple[Any, ...]
    work: int
    run_timeout: float


def _evidence(report: RecoveryReport) -> list[dict[str, Any]]:
    uncertain = set(report.uncertain_effects)
    items: list[dict[str, Any]] = [
        {
            "effect_id": e.effect_id,
            "effect_class": e.effect_class,
            "dispatch_state": e.dispatch_state,
            "status": e.status,
            "reason": "its host stopped while it was in flight",
        }
        for e in report.effects
        if e.effect_id in uncertain
    ]
    items += [{"resource": thaw(r), "reason": "may outlive its host"} for r in report.resources]
    children = report.unsettled.get("children") or ()
    items += [{"child": str(c), "reason": "a child run may still run"} for c in children]
    return items


async def settle_run(
    store: Any,
    run_id: str,
    *,
    incarnation: int | None = None,
    park_uncertain: bool = False,
    resume: bool = False,
    wall_clock: Callable[[], float] = time.time,
) -> Settled:
    """Fence ``run_id``'s stored incarnation (it can never commit again),
    classify what the fenced record holds
    (:func:`trio_backplane.recovery.recover`) and commit its outcome at
    ``incarnation`` (default: the stored one + 1): ``cancelled`` (stop
    reason ``recovered``) when nothing in flight may have changed the world,
    else ``unknown_outcome`` with one evidence item per uncertain effect,
    recorded resource and child run, or, with ``park_uncertain``, nothing
    beyond the fence (the run left for a reconciler, ``committed`` false).
    With ``resume``, a run in a turn with nothing in flight (an interrupted
    provider attempt aside: it is read-only) is only fenced and comes back
    ``resumable``, for ``open_conversation(resume=settled.record)``.
    A terminal run is left as it is."""
    record = await store.load(run_id)
    if record is None:
        raise Error(ErrorClass.NOT_FOUND, "no such run", {"run_id": run_id})
    newer = record.incarnation + 1 if incarnation is None else incarnation
    report = recover(record, incarnation=newer)  # refuses an incarnation not newer
    if record.terminal:
        return Settled(record=record, report=report, committed=False)
    await store.fence(run_id, incarnation=newer)
    fenced = await store.load(run_id)
    if fenced is None or fenced.incarnation != newer:
        raise Error(ErrorClass.RESOURCE_CONFLICT, "the run was fenced by another recoverer")
    report = recover(fenced, incarnation=newer + 1)  # what the fenced record holds
    evidence = _evidence(report)
    if resume and not evidence and _resumable(fenced, report):
        return Settled(
            record=fenced, report=report, committed=False, fenced=record.incarnation, resumable=True
        )
    if evidence and park_uncertain:
        return Settled(record=fenced, report=report, committed=False, fenced=record.incarnation)
    final, events = _outcome(fenced, evidence, wall_clock())
    await store.commit(
        run_id,
        incarnation=newer,
        expected_revision=fenced.revision,
        record=final,
        events=events,
    )
    return Settled(record=final, report=report, committed=True, fenced=record.incarnation)


def _resumable(record: RunRecord, report: RecoveryReport) -> bool:
    """Running a turn with nothing but a read-only provider attempt in flight."""
    unsettled = report.unsettled
    conversation = record.context.get("conversation")
    return (
        record.state == "running"
        and isinstance(conversation, Mapping)
        and isinstance(conversation.get("turn_id"), str)
        and record.active_wait is None
        and not any(unsettled.get(kind) for kind in ("tools", "children", "dependencies"))
        and all(effect.discardable for effect in report.effects)
    )


def _outcome(
    record: RunRecord, evidence: list[dict[str, Any]], at: float
) -> tuple[RunRecord, list[Any]]:
    """The kernel commands that settle ``record``, as one commit."""
    events: list[Any] = []
    revision = record.revision + 1
    if record.state in ACTIVE_STATES:
        record, stopped = transition(record, Cancel(at=at, reason=RECOVERED), revision=revision)
        events += stopped
    if evidence:
        settle = CleanupSettled(at=at, certainty="uncertain", evidence=evidence)
    else:
        required = thaw(record.cleanup_required or {})
        settle = CleanupSettled(at=at, certainty="confirmed", settled=_ids(required))
    record, settled = transition(record, settle, revision=revision)
    return record, events + settled


def _ids(required: Mapping[str, Any]) -> dict[str, list[str]]:
    return {key: sorted(str(i) for i in ids) for key, ids in required.items()}


def replacement_for(
    settled: Settled, *, wall_clock: Callable[[], float] = time.time
) -> Replacement:
    """What a replacement of a run settled ``cancelled`` carries; a run that
    ended ``unknown_outcome`` (or any other way) is refused: it needs a
    reconciler, not a continuation.  ``budget_exceeded`` or ``timeout``
    when nothing is left."""
    record = settled.record
    if record.state != "cancelled":
        raise Error(
            ErrorClass.UNKNOWN_OUTCOME
            if record.state == "unknown_outcome"
            else ErrorClass.RESOURCE_CONFLICT,
            "only a run settled with nothing in flight can be continued",
            {"run_id": record.run_id, "state": record.state},
        )
    work = record.budget.quota - record.budget.used
    if work <= 0:
        raise Error(
            ErrorClass.BUDGET_EXCEEDED, "the run has no work left", {"run_id": record.run_id}
        )
    left = (record.deadline - wall_clock()) if record.deadline is not None else 300.0
    if left <= 0:
        raise Error(ErrorClass.TIMEOUT, "the run has no time left", {"run_id": record.run_id})
    return Replacement(messages=tuple(thaw(record.transcript)), work=work, run_timeout=left)
