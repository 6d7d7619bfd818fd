"""Numeric command sessions as obligations: reservations, launches,
confirmations and the receipts of acknowledged releases.

A pure state machine (no I/O, no clock): :class:`LocalCommand` asks it
what an invocation may do and tells it what happened.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final, Literal, final

import attrs

from ..errors import Error, ErrorClass

__all__ = ["CAPACITY", "Ledger", "Obligation", "check_capacity"]

#: The default ``receipt_capacity`` and ``session_capacity``.
CAPACITY: Final = 256

State = Literal["reserved", "launching", "active", "confirmed", "uncertain"]


@attrs.define(kw_only=True)
class Obligation:
    """One session's obligation, from its reservation to its receipt."""

    session_id: int
    owner: str
    incarnation: int
    state: State = "reserved"
    #: refused for launch for good (cancelled before it launched, or a
    #: cancellation reserved an identity never seen)
    fenced: bool = False
    #: its command ran (its launch was acknowledged): no refusal of it
    #: means "nothing ran" any more
    launched: bool = False


def check_capacity(name: str, value: Any) -> int:
    """``value`` as a capacity: a positive ``int``, else ``validation``."""
    if type(value) is not int or value < 1:
        raise Error(
            ErrorClass.VALIDATION,
            f"{name} must be a positive int",
            {name: repr(value)[:100]},
        )
    return value


def _check_id(session_id: Any) -> int:
    if type(session_id) is not int or session_id < 1:
        raise Error(
            ErrorClass.VALIDATION,
            "command session id must be a positive int",
            {"session_id": repr(session_id)[:100]},
        )
    return session_id


def _cancelled(message: str, session_id: int) -> Error:
    return Error(
        ErrorClass.CANCELLED,
        message,
        {"session_id": session_id, "launch_status": "never_started"},
    )


@final
class Ledger:
    """Obligations by session id, the receipts of acknowledged releases
    (FIFO, ``receipt_capacity``) and the expired floor: an id at or below it
    that is not live is gone for good (no tombstone set)."""

    def __init__(self, *, receipt_capacity: int, session_capacity: int) -> None:
        self.receipt_capacity = receipt_capacity
        self.session_capacity = session_capacity
        self.live: dict[int, Obligation] = {}
        self.receipts: OrderedDict[int, Obligation] = OrderedDict()
        self.floor = 0

    def check(self, obligation: Obligation, owner: str, incarnation: int) -> Obligation:
        """``obligation`` if ``owner`` and ``incarnation`` hold it."""
        if owner != obligation.owner:
            raise Error(
                ErrorClass.FORBIDDEN,
                "command session owner does not match",
                {"session_id": obligation.session_id},
            )
        if incarnation != obligation.incarnation:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "stale command session incarnation",
                {"session_id": obligation.session_id, "incarnation": incarnation},
            )
        return obligation

    def find(self, session_id: Any, owner: str, incarnation: int) -> Obligation:
        """The live or receipted obligation of ``session_id``."""
        session_id = _check_id(session_id)
        found = self.live.get(session_id) or self.receipts.get(session_id)
        if found is not None:
            return self.check(found, owner, incarnation)
        if session_id <= self.floor:
            raise Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "command release receipt is unavailable or expired",
                {"session_id": session_id, "receipt": "expired"},
            )
        raise Error(ErrorClass.NOT_FOUND, "command session not found", {"session_id": session_id})

    def reserve(self, session_id: Any, owner: str, incarnation: int, retained: int) -> Obligation:
        """Reserve ``session_id`` for a launch by ``owner``; an existing
        reservation is reused.  ``retained``: resources the backend keeps
        besides live obligations (finished output, cleanup evidence)."""
        session_id = _check_id(session_id)
        found = self.live.get(session_id) or self.receipts.get(session_id)
        if found is not None:
            self.check(found, owner, incarnation)
            if found.state != "reserved" or found.fenced:
                raise _cancelled("command session no longer accepts launch", session_id)
            return found
        if session_id <= self.floor:
            raise _cancelled("command session identity has expired", session_id)
        if len(self.live) + retained >= self.session_capacity:
            self.floor = max(self.floor, session_id)  # the id can never launch later
            raise Error(
                ErrorClass.OVERLOADED,
                "local command retained resource capacity reached",
                {
                    "session_id": session_id,
                    "session_capacity": self.session_capacity,
                    "launch_status": "never_started",
                    "reservation": "not_created",
                },
            )
        obligation = Obligation(session_id=session_id, owner=owner, incarnation=incarnation)
        self.live[session_id] = obligation
        return obligation

    def launching(self, obligation: Obligation) -> None:
        """The launch of a reserved session begins."""
        if obligation.state != "reserved" or obligation.fenced:
            raise _cancelled("command session no longer accepts launch", obligation.session_id)
        obligation.state = "launching"

    def fence_unknown(self, session_id: int, owner: str, incarnation: int) -> Obligation:
        """Reserve an identity never seen, fenced, as settled: a later
        launch of it is refused."""
        obligation = Obligation(
            session_id=session_id,
            owner=owner,
            incarnation=incarnation,
            state="confirmed",
            fenced=True,
        )
        self.live[session_id] = obligation
        return obligation

    def fence(self, obligation: Obligation) -> None:
        """Confirm and fence a never-launched reservation."""
        if obligation.state == "reserved":
            obligation.state = "confirmed"
            obligation.fenced = True

    def fence_owner(self, owner: str) -> None:
        """Confirm and fence every never-launched reservation of ``owner``."""
        for obligation in self.live.values():
            if obligation.owner == owner:
                self.fence(obligation)

    def retire(self, session_id: int, owner: str, incarnation: int) -> None:
        """Fence a session that never launched and move it to the receipts
        (out of ``session_capacity``); one never seen is receipted fenced."""
        found = self.live.get(session_id)
        if found is None:
            if session_id in self.receipts or session_id <= self.floor:
                return  # retired already, or expired
            found = self.fence_unknown(session_id, owner, incarnation)
        self.check(found, owner, incarnation)
        if found.launched or found.state not in ("reserved", "confirmed"):
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "only a command session that never launched can be retired",
                {"session_id": session_id, "state": found.state},
            )
        self.fence(found)
        self.acknowledge(session_id, owner, incarnation)

    def launched(self, session_id: int, *, since: int) -> bool:
        """Whether the session's command may have run: it did, or its id
        expired after the floor was ``since`` (a receipt evicted since, of
        a session that may have launched)."""
        found = self.live.get(session_id) or self.receipts.get(session_id)
        if found is not None:
            return found.launched
        return since < session_id <= self.floor

    def acknowledge(self, session_id: Any, owner: str, incarnation: int) -> None:
        """Move a confirmed obligation to the receipts; evicting the oldest
        receipt raises the floor to its id."""
        obligation = self.find(session_id, owner, incarnation)
        if obligation.session_id in self.receipts:
            return
        if obligation.state != "confirmed":
            raise Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "session release is not confirmed",
                {"session_id": obligation.session_id, "state": obligation.state},
            )
        del self.live[obligation.session_id]
        self.receipts[obligation.session_id] = obligation
        while len(self.receipts) > self.receipt_capacity:
            evicted, _ = self.receipts.popitem(last=False)
            self.floor = max(self.floor, evicted)
