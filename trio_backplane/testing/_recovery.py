"""``RecoveryHarness``: crash an executor against a real store, then recover.

A test aid: it commits what an executor had made durable when it crashed,
forgets the executor, reloads the run, classifies it with
:func:`trio_backplane.recovery.recover` and fences the old incarnation.
"""

from __future__ import annotations

from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass, require_methods
from ..kernel import Command, RunRecord, is_time, transition
from ..recovery import RecoveryReport, recover

__all__ = ["CRASH_WINDOWS", "CrashReport", "RecoveryHarness"]

#: Crash windows :meth:`RecoveryHarness.crash` simulates.
CRASH_WINDOWS: Final = ("before_dispatch", "after_mutation", "before_result", "after_terminal")

#: The dispatch state of the tool intent durable when the crash comes.
_DISPATCH: Final = {
    "before_dispatch": "not_dispatched",
    "after_mutation": "dispatched",
    "before_result": "unknown",
    "after_terminal": "dispatched",
}


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
        it with :func:`~trio_backplane.recovery.recover` for the next
        incarnation and (``fence=True``) fences the old one with
        ``store.fence``, which a store without fencing refuses with
        ``unsupported_capability``.  ``at`` is the time of the harness's first
        command (each next one a second later).
        """
        _check_crash(store, record, window, at)
        executor = _Executor(store, at)
        await executor.crash_in(await executor.to_tool_step(record), window)
        # The crash: the executor and its memory are gone; only the store remains.
        del executor
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


def _check_crash(store: Any, record: Any, window: Any, at: Any) -> None:
    """Refuse bad arguments as ``validation`` before anything is stored."""
    if window not in CRASH_WINDOWS:
        raise Error(ErrorClass.VALIDATION, "invalid crash window", {"window": repr(window)})
    if not isinstance(record, RunRecord):
        raise Error(ErrorClass.VALIDATION, "the crash harness needs a RunRecord")
    require_methods(store, "store", ("create", "load", "commit", "fence"))
    if not is_time(at):
        raise Error(
            ErrorClass.VALIDATION,
            "at must be a finite number: the time of the harness's first command",
            {"type": type(at).__name__},
        )


class _Executor:
    """The executor that crashes: it commits each transition as it makes it."""

    def __init__(self, store: Any, at: float) -> None:
        self.store = store
        self.clock = float(at)

    async def apply(self, current: RunRecord, kind: str, **data: Any) -> RunRecord:
        self.clock += 1.0
        new, events = transition(current, Command(kind, at=self.clock, input=data))
        await self.store.commit(
            current.run_id,
            incarnation=current.incarnation,
            expected_revision=current.revision,
            record=new,
            events=events,
        )
        return new

    async def to_tool_step(self, record: RunRecord) -> RunRecord:
        """``record`` (created first when the store lacks it) brought to a
        running step where a tool may be invoked."""
        current = record
        if await self.store.load(record.run_id) is None:
            await self.store.create(record)
        if current.state == "queued":
            if current.admitted:
                current = await self.apply(current, "start")
            else:
                current = await self.apply(current, "admit", state="running")
        if current.state != "running":
            raise Error(
                ErrorClass.VALIDATION,
                "the crash harness needs a running run",
                {"state": current.state},
            )
        if current.active_provider is not None:
            current = await self.apply(current, "provider_completed", final=False)
        if current.step_id is None:
            current = await self.apply(current, "provider_started")
            current = await self.apply(current, "provider_completed", final=False)
        return current

    async def crash_in(self, current: RunRecord, window: str) -> None:
        """Commit what the executor made durable before crashing in ``window``."""
        before = set(current.active_tools)
        current = await self.apply(
            current,
            "tool_invoked",
            tool_name="crash_harness.mutation",
            effect_class="mutation",
            dispatch_state=_DISPATCH[window],
        )
        if window == "after_terminal":
            (invocation_id,) = set(current.active_tools) - before
            current = await self.apply(
                current, "tool_completed", invocation_id=invocation_id, result={"ok": True}
            )
            await self.apply(current, "finish", status="completed")
