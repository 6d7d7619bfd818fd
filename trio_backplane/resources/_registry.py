"""Run-owned resources and numeric command sessions, fenced by owner and
incarnation, each cleaned up once within a bound."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, final

import attrs
import trio

from .._numbers import is_seconds
from ..errors import Error, ErrorClass
from ._cleanup import Cleanup, CleanupResult, Status, call_bounded, run_cleanup
from ._codestate import CodeState

__all__ = ["RECEIPTS", "ResourceHandle", "ResourceRegistry"]

#: Settled receipts a registry keeps to answer repeated releases.
RECEIPTS: Final = 256
#: The kind of a Code Mode cell, limited to ``max_continuations`` live at once
#: (per conversation when, as usual, each conversation has its own registry).
CONTINUATION: Final = "continuation"
#: A session acknowledgement callback: given the confirmed result, answers ``"ok"``.
Acknowledge = Callable[[CleanupResult], Any]


@final
@attrs.frozen(kw_only=True)
class ResourceHandle:
    """What :meth:`ResourceRegistry.register` returns; names one entry."""

    resource_id: str
    owner: str
    incarnation: int
    kind: str


@attrs.define(kw_only=True)
class _Entry:
    id: str | int
    kind: str
    owner: str
    incarnation: int
    value: Any
    cleanup: Cleanup | None
    acknowledge: Acknowledge | None = None
    #: "active", then "pending" while cleaning, then gone (confirmed) or
    #: "failed" / "uncertain", kept for good
    status: Status = "active"
    reason: str | None = None
    done: trio.Event | None = None

    def result(self) -> CleanupResult:
        return CleanupResult(
            id=self.id,
            kind=self.kind,
            owner=self.owner,
            incarnation=self.incarnation,
            status=self.status,
            reason=self.reason,
        )


def _unknown(message: str, entry: _Entry | CleanupResult, **more: Any) -> Error:
    details = {"id": entry.id, "kind": entry.kind, "owner": entry.owner, "reason": entry.reason}
    return Error(ErrorClass.UNKNOWN_OUTCOME, message, {**details, **more})


@final
class ResourceRegistry:
    """Resources and command sessions owned by runs.

    Every entry belongs to an owner (a run id) and its incarnation; another
    owner is ``forbidden``, another incarnation ``resource_conflict``.  A
    cleanup callback runs at most once, shielded and bounded by
    ``cleanup_timeout``; concurrent releases join it.  A confirmed release
    removes the entry (the last 256 receipts answer repeated releases); a
    failed or uncertain one keeps it as evidence, and every later release
    raises ``unknown_outcome`` without running the callback again.
    """

    def __init__(self, *, cleanup_timeout: float = 5.0, max_continuations: int = 16) -> None:
        if not is_seconds(cleanup_timeout, 60.0):
            raise Error(
                ErrorClass.VALIDATION,
                "cleanup_timeout must be seconds in (0, 60]",
                {"cleanup_timeout": repr(cleanup_timeout)[:100]},
            )
        if type(max_continuations) is not int or not 1 <= max_continuations <= 256:
            raise Error(
                ErrorClass.VALIDATION,
                "max_continuations must be an int in 1..256",
                {"max_continuations": repr(max_continuations)[:100]},
            )
        self.cleanup_timeout = float(cleanup_timeout)
        self.max_continuations = max_continuations
        self._entries: dict[str | int, _Entry] = {}
        self._receipts: OrderedDict[str | int, tuple[CleanupResult, str | None]] = OrderedDict()
        self._closed: set[str] = set()
        self._clocks: list[Any] = []
        self._resource_ids = itertools.count(1)
        self._session_ids = itertools.count(1)
        self._code_state = CodeState()

    # -- registration ---------------------------------------------------------

    def register(
        self,
        owner: str,
        kind: str,
        value: Any,
        *,
        incarnation: int = 1,
        cleanup: Cleanup | None = None,
    ) -> ResourceHandle:
        """Register ``value`` for ``owner``; ``cleanup`` releases it."""
        self._admit(owner, kind, incarnation)
        entry = _Entry(
            id=f"res_{next(self._resource_ids)}",
            kind=kind,
            owner=owner,
            incarnation=incarnation,
            value=value,
            cleanup=cleanup,
        )
        self._entries[entry.id] = entry
        return ResourceHandle(
            resource_id=str(entry.id), owner=owner, incarnation=incarnation, kind=kind
        )

    def register_session(
        self,
        owner: str,
        value: Any = None,
        *,
        incarnation: int = 1,
        cleanup: Cleanup | None = None,
        acknowledge: Acknowledge | None = None,
    ) -> int:
        """A new numeric session for ``owner``: positive and above every id
        given before.  ``value`` ``None`` is a reservation nothing uses yet
        (:meth:`withdraw_session` may drop it); ``acknowledge`` runs after a
        confirmed release."""
        self._admit(owner, "session", incarnation)
        session_id = next(self._session_ids)
        self._entries[session_id] = _Entry(
            id=session_id,
            kind="session",
            owner=owner,
            incarnation=incarnation,
            value=value,
            cleanup=cleanup,
            acknowledge=acknowledge,
        )
        return session_id

    def _admit(self, owner: str, kind: str, incarnation: int) -> None:
        if type(owner) is not str or not owner:
            raise Error(ErrorClass.VALIDATION, "owner must be a non-empty str")
        if type(kind) is not str or not kind:
            raise Error(ErrorClass.VALIDATION, "kind must be a non-empty str")
        if type(incarnation) is not int or incarnation < 1:
            raise Error(ErrorClass.VALIDATION, "incarnation must be a positive int")
        if owner in self._closed:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "resource owner is closed", {"owner": owner})
        if kind == CONTINUATION:
            live = sum(1 for e in self._entries.values() if e.kind == CONTINUATION)
            if live >= self.max_continuations:
                raise Error(
                    ErrorClass.OVERLOADED,
                    "Code Mode cell capacity reached",
                    {"max_continuations": self.max_continuations},
                )

    # -- lookup -----------------------------------------------------------------

    def fetch(self, handle: ResourceHandle, owner: str) -> Any:
        """The value of a live, active entry."""
        return self._active(handle.resource_id, owner, handle.incarnation).value

    def fetch_session(self, session_id: int, owner: str, incarnation: int | None = None) -> Any:
        """The value of a live, active session."""
        return self._active(session_id, owner, incarnation).value

    def update_session(
        self, session_id: int, owner: str, value: Any, incarnation: int | None = None
    ) -> None:
        """Bind ``value`` to an active session (a launched command, say)."""
        self._active(session_id, owner, incarnation).value = value

    def _live(self, key: str | int, owner: str, incarnation: int | None) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise Error(ErrorClass.NOT_FOUND, "resource not found", {"id": key})
        _check_identity(entry.owner, entry.incarnation, owner, incarnation)
        return entry

    def _active(self, key: str | int, owner: str, incarnation: int | None) -> _Entry:
        entry = self._live(key, owner, incarnation)
        if entry.status != "active":
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "resource cleanup is in progress or needs reconciliation",
                {"id": key, "status": entry.status},
            )
        return entry

    # -- release ----------------------------------------------------------------

    async def release(self, handle: ResourceHandle, owner: str) -> CleanupResult:
        """Release an entry: its confirmed result, or ``unknown_outcome``."""
        return await self._release(handle.resource_id, owner, handle.incarnation)

    async def release_session(
        self, session_id: int, owner: str, incarnation: int | None = None
    ) -> CleanupResult:
        """:meth:`release` for a session; a confirmed release then runs its
        ``acknowledge`` callback (``"ok"`` or ``unknown_outcome``)."""
        return await self._release(session_id, owner, incarnation)

    def forget_session(self, session_id: int, owner: str, incarnation: int | None = None) -> None:
        """Drop an active session as confirmed without running its cleanup
        (its backend has confirmed the release itself)."""
        entry = self._active(session_id, owner, incarnation)
        entry.status = "confirmed"
        self._settle(entry, None)

    def withdraw_session(self, session_id: int, owner: str, incarnation: int) -> None:
        """Drop a reservation nothing ever used (its value still ``None``)."""
        entry = self._active(session_id, owner, incarnation)
        if entry.value is not None:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "only an unused session reservation can be withdrawn",
                {"id": session_id},
            )
        del self._entries[session_id]

    async def _release(self, key: str | int, owner: str, incarnation: int | None) -> CleanupResult:
        entry = self._entries.get(key)
        if entry is None:
            return self._receipt(key, owner, incarnation)
        _check_identity(entry.owner, entry.incarnation, owner, incarnation)
        if entry.status == "active":
            await self._clean(entry)
        elif entry.status == "pending":
            assert entry.done is not None
            await entry.done.wait()
        else:
            raise _unknown("resource cleanup needs reconciliation", entry)
        return self._answer(key, entry)

    async def _clean(self, entry: _Entry) -> None:
        """Run the entry's cleanup once, shielded: its outcome is recorded
        whatever happens to the task that started it."""
        entry.status = "pending"
        entry.done = trio.Event()
        try:
            with trio.CancelScope(shield=True):
                entry.status, entry.reason = await run_cleanup(entry.cleanup, self.cleanup_timeout)
                acknowledgement = None
                if entry.status in ("confirmed", "not_requested") and entry.acknowledge:
                    acknowledgement = await self._acknowledge(entry)
        finally:
            if entry.status == "pending":  # only a BaseException gets here
                entry.status, entry.reason = "uncertain", "cleanup was interrupted"
            elif entry.status in ("confirmed", "not_requested"):
                self._settle(entry, acknowledgement)
            entry.done.set()

    async def _acknowledge(self, entry: _Entry) -> str:
        """Run a session's acknowledgement once, bounded: ``"ok"``, or what
        it answered instead (``"timeout"``, ``"failed: ..."``, ``repr``)."""
        acknowledge = entry.acknowledge
        assert acknowledge is not None
        result = entry.result()
        how, answer = await call_bounded(lambda: acknowledge(result), self.cleanup_timeout)
        if how == "raised":
            return f"failed: {answer}"
        if how == "timeout":
            return "timeout"
        return "ok" if type(answer) is str and answer == "ok" else repr(answer)[:300]

    def _settle(self, entry: _Entry, acknowledgement: str | None) -> None:
        self._entries.pop(entry.id, None)
        self._receipts[entry.id] = (entry.result(), acknowledgement)
        while len(self._receipts) > RECEIPTS:
            self._receipts.popitem(last=False)

    def _answer(self, key: str | int, entry: _Entry) -> CleanupResult:
        if entry.status == "failed":
            raise _unknown("resource cleanup failed", entry)
        if entry.status == "uncertain":
            raise _unknown("resource cleanup is unconfirmed", entry)
        return self._receipt(key, entry.owner, entry.incarnation)

    def _receipt(self, key: str | int, owner: str, incarnation: int | None) -> CleanupResult:
        found = self._receipts.get(key)
        if found is None:
            raise Error(ErrorClass.NOT_FOUND, "resource not found", {"id": key})
        result, acknowledgement = found
        _check_identity(result.owner, result.incarnation, owner, incarnation)
        if acknowledgement == "timeout":
            raise Error(
                ErrorClass.TIMEOUT,
                "session lifecycle acknowledgement timed out",
                {"id": key, "reason": "acknowledgement_timeout"},
            )
        if acknowledgement not in (None, "ok"):
            raise _unknown(
                "session lifecycle acknowledgement is unconfirmed", result, answer=acknowledgement
            )
        return result

    # -- owners -----------------------------------------------------------------

    async def cancel_owner(self, owner: str) -> list[CleanupResult]:
        """Release every entry of ``owner`` concurrently; each entry's result
        (failed and uncertain ones included, never retried), by id."""
        entries = [e for e in self._entries.values() if e.owner == owner]
        results: dict[str | int, CleanupResult] = {}

        async def one(entry: _Entry) -> None:
            try:
                results[entry.id] = await self._release(entry.id, owner, None)
            except Error:
                results[entry.id] = entry.result()

        async with trio.open_nursery() as nursery:
            for entry in entries:
                nursery.start_soon(one, entry)
        return [results[e.id] for e in entries]

    async def close_owner(self, owner: str) -> list[CleanupResult]:
        """Refuse new entries of ``owner``, forget its Code Mode state, then
        :meth:`cancel_owner`."""
        self.fence_owner(owner)
        return await self.cancel_owner(owner)

    def fence_owner(self, owner: str) -> None:
        """Refuse new entries of ``owner`` and forget its Code Mode state,
        without releasing anything."""
        self._closed.add(owner)
        self._code_state.clear(owner)

    # -- Code Mode state ----------------------------------------------------------

    def code_state(self, owner: str, identity: str) -> Mapping[str, Any]:
        """The values ``owner``'s cells stored under ``identity``, by key."""
        return self._code_state.get(owner, identity)

    def store_code_state(self, owner: str, identity: str, key: str, value: Any) -> None:
        """Store a JSON ``value`` (``None`` removes ``key``): at most 256 keys
        and 1 MiB per identity, 64 identities and 16 MiB per owner, else
        ``budget_exceeded`` and nothing changes.  A closed owner is refused."""
        if owner in self._closed:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "resource owner is closed", {"owner": owner})
        self._code_state.store(owner, identity, key, value)

    def owner_status(self, owner: str) -> list[CleanupResult]:
        """Every live entry of ``owner``: active, pending, failed or uncertain."""
        return [e.result() for e in self._entries.values() if e.owner == owner]

    def owner_transfer_ready(self, owner: str) -> bool:
        """Whether every entry of ``owner`` is active (none cleaning or kept)."""
        return all(e.status == "active" for e in self._entries.values() if e.owner == owner)

    def cleanup_status(self, handle: ResourceHandle, owner: str) -> CleanupResult:
        """The entry's cleanup, live or settled."""
        return self._status(handle.resource_id, owner, handle.incarnation)

    def session_cleanup_status(
        self, session_id: int, owner: str, incarnation: int | None = None
    ) -> CleanupResult:
        """A session's cleanup, live or settled."""
        return self._status(session_id, owner, incarnation)

    def _status(self, key: str | int, owner: str, incarnation: int | None) -> CleanupResult:
        entry = self._entries.get(key)
        if entry is not None:
            _check_identity(entry.owner, entry.incarnation, owner, incarnation)
            return entry.result()
        found = self._receipts.get(key)
        if found is None:
            raise Error(ErrorClass.NOT_FOUND, "resource not found", {"id": key})
        _check_identity(found[0].owner, found[0].incarnation, owner, incarnation)
        return found[0]

    def attach_clock(self, backend: Any) -> None:
        """Let ``backend`` (a :class:`LocalCommand`) hear when an owner's
        clocks stop for a human wait and start again."""
        if backend not in self._clocks:
            self._clocks.append(backend)

    def suspend_owner(self, owner: str) -> None:
        """A human wait began in ``owner``'s run: its commands' deadlines stop."""
        for backend in self._clocks:
            backend.suspend_owner(owner)

    def resume_owner(self, owner: str, at: float | None = None) -> None:
        """The wait ended (at Trio time ``at``, default now): the deadlines
        go on, later by the time waited."""
        for backend in self._clocks:
            backend.resume_owner(owner, at)

    def owners(self) -> Collection[str]:
        """Owners with live entries."""
        return {e.owner for e in self._entries.values()}


def _check_identity(
    entry_owner: str, entry_incarnation: int, owner: str, incarnation: int | None
) -> None:
    if owner != entry_owner:
        raise Error(ErrorClass.FORBIDDEN, "resource owner does not match", {"owner": owner})
    if incarnation is not None and incarnation != entry_incarnation:
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "stale resource incarnation",
            {"incarnation": incarnation, "current": entry_incarnation},
        )
