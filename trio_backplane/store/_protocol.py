"""The ``Store`` protocol and the checks every store shares.

A store does atomic compare-and-set on ``(run_id, incarnation, revision)``
and nothing else: the kernel decides what a record may become, the store
decides only whether this writer may still write it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any, Final, Protocol, final, runtime_checkable

import attrs

from ..errors import Error, ErrorClass
from ..kernel import (
    MAX_INT,
    MAX_RUN_ID,
    RUN_STATES,
    RunEvent,
    RunRecord,
    check_json,
    check_run_id,
    encode_event,
    encode_record,
    is_time,
)
from ..kernel._construct import fast_constructor
from ..kernel._fields import _EXACT_INT
from ..kernel._frozen import _accelerator

__all__ = [
    "PreparedCommit",
    "Receipt",
    "RunSummary",
    "Store",
    "check_arguments",
    "check_commit",
    "check_states",
    "commit_checked",
    "prepare_commit",
    "prepare_create",
    "verify_receipt",
]


@final
@attrs.frozen
class Receipt:
    """What a store acknowledges: the run, its incarnation and the revision now stored."""

    run_id: str
    incarnation: int
    revision: int


#: ``Receipt(run_id, incarnation, revision)``, built without attrs' ``__init__``
#: (a store makes one a commit)
make_receipt: Final = fast_constructor(Receipt)


@final
@attrs.frozen
class RunSummary:
    """A run as ``list_runs`` lists it: no record read.  ``admitted_at``:
    the time of its first event (its admission), ``None`` before."""

    run_id: str
    incarnation: int
    revision: int
    state: str
    admitted_at: float | None = None


@runtime_checkable
class Store(Protocol):
    """Durable (or not) storage of run records and their event log.

    Every method here is one the runtime calls.  One more is optional: a
    store whose commit never waits (``MemoryStore``) may define
    ``commit_nowait`` in its class, a plain method with ``commit``'s
    arguments and result; the runtime then calls it instead of ``commit``,
    without the shielded commit-deadline scope an awaited commit needs.  Only
    a method the store's class defines counts: a wrapper that forwards
    unknown attributes to another store (``__getattr__``) still has its own
    ``commit`` called.  A store that may wait for I/O must not define it."""

    async def create(self, record: RunRecord) -> Receipt: ...

    async def load(self, run_id: str) -> RunRecord | None: ...

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt: ...

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt: ...

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]: ...

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]: ...

    async def aclose(self) -> None:
        """Release what the store holds (threads, connections); idempotent."""


def check_arguments(
    run_id: Any,
    *,
    incarnation: Any = 1,
    expected_revision: Any = 0,
    after: Any = 0,
    events: Any = (),
) -> None:
    """The arguments of a store call, checked before the store touches
    anything: a caller's mistake is ``validation`` naming the argument, never
    a raw ``TypeError`` nor ``storage_failed`` (which would tell the runtime
    the store itself failed).  ``run_id`` is a run's id (``check_run_id``,
    as ``RunRecord`` requires), ``incarnation`` a
    positive int, ``expected_revision`` and ``after`` non-negative ints,
    ``events`` a sequence (a generator would be read once by the checks and
    then found empty: its events silently lost)."""
    if (
        type(run_id) is str
        and 0 < len(run_id) <= MAX_RUN_ID
        and run_id.isascii()
        and "\x00" not in run_id
        and (type(events) is tuple or type(events) is list)
        and type(incarnation) is int
        and 1 <= incarnation < MAX_INT
        and type(expected_revision) is int
        and 0 <= expected_revision < MAX_INT
        and type(after) is int
        and 0 <= after < MAX_INT
    ):
        return
    check_run_id(run_id)
    if isinstance(events, str | bytes) or not isinstance(events, Sequence):
        raise Error(
            ErrorClass.VALIDATION,
            "events must be a sequence of RunEvent values",
            {"argument": "events", "type": type(events).__name__},
        )
    for name, value, least in (
        ("incarnation", incarnation, 1),
        ("expected_revision", expected_revision, 0),
        ("after", after, 0),
    ):
        if type(value) is not int or not least <= value < MAX_INT:
            raise Error(
                ErrorClass.VALIDATION,
                f"{name} must be an int of at least {least}, below 2**63",
                {"argument": name, "type": type(value).__name__},
            )


def check_states(states: Any) -> None:
    """``list_runs``' filter: ``None`` or a collection of run state names
    (``RUN_STATES``): a misspelt one would silently match nothing."""
    if states is None:
        return
    if (
        isinstance(states, str | bytes)
        or not isinstance(states, Collection)
        or not all(type(state) is str for state in states)
    ):
        raise Error(
            ErrorClass.VALIDATION,
            "states must be None or a collection of state names",
            {"argument": "states", "type": type(states).__name__},
        )
    unknown = sorted(set(states) - RUN_STATES)
    if unknown:
        raise Error(
            ErrorClass.VALIDATION,
            "unknown run state",
            {"argument": "states", "unknown": unknown[:10], "states": sorted(RUN_STATES)},
        )


def verify_receipt(receipt: Receipt, *, run_id: str, expected_revision: int) -> Receipt:
    """The runtime's check of an acknowledgement."""
    if receipt.run_id != run_id or receipt.revision != expected_revision + 1:
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "store acknowledged another revision",
            {"expected": expected_revision + 1, "received": receipt.revision},
        )
    return receipt


@final
@attrs.frozen
class PreparedCommit:
    """A decided commit: the record to store and its events, encoded.

    Encoding the record is the store's business (and costs what changed, see
    ``_layout``): a ``RunRecord`` is JSON data by construction (every field is
    frozen and validated), so the decision never re-encodes it.
    """

    record: RunRecord
    events: list[dict[str, Any]]

    @property
    def encoded(self) -> dict[str, Any]:
        """The whole record encoded, computed on each access: O(run length),
        for simple stores and tests only, never on a store's hot path."""
        return encode_record(self.record)


def _prepare(record: RunRecord, events: Sequence[RunEvent]) -> PreparedCommit:
    if not isinstance(record, RunRecord):
        raise Error(ErrorClass.VALIDATION, "a store commits RunRecord values")
    # The events are checked (check_commit); JSON by construction: a
    # RunEvent's payload is frozen.
    return PreparedCommit(record=record, events=[encode_event(event) for event in events])


def _unchecked(
    run_id: str, incarnation: int, expected_revision: int, record: RunRecord, events: Any
) -> bool:
    return False


#: ``commit_checked(run_id, incarnation, expected_revision, record, events)``:
#: ``True`` when :func:`check_arguments` and every check of
#: :func:`check_commit` but those against the stored record certainly pass
#: (the kernel accelerator's, for exact types); ``False``: run them, they
#: decide (always, without the accelerator).
commit_checked: Final[Callable[[str, int, int, RunRecord, Sequence[RunEvent]], bool]] = (
    _unchecked
    if _accelerator is None
    else partial(_accelerator.commit_checked, RunRecord, RunEvent, MAX_RUN_ID, MAX_INT, _EXACT_INT)
)


def prepare_create(record: RunRecord) -> PreparedCommit:
    """Validate a new record (revision 0).  O(1): the record is not encoded."""
    if isinstance(record, RunRecord) and record.revision != 0:
        raise Error(ErrorClass.VALIDATION, "a new run starts at revision 0")
    return _prepare(record, ())


def check_commit(
    stored: RunRecord | None,
    run_id: str,
    *,
    incarnation: int,
    expected_revision: int,
    record: RunRecord,
    events: Sequence[RunEvent] = (),
) -> None:
    """The compare-and-set decision, against the ``stored`` record:
    raises ``validation`` or ``resource_conflict``, else returns.  ``events``
    must be ``RunEvent`` values with finite times (their payloads are JSON
    data by construction).

    Only the identity and revision of ``stored`` are read: a store may pass
    a stand-in ``RunRecord(run_id=..., incarnation=..., revision=...)`` built
    from its locked row.  Costs two checks per event, nothing per field."""
    if not isinstance(record, RunRecord):
        raise Error(ErrorClass.VALIDATION, "a store commits RunRecord values")
    if record.run_id != run_id or record.incarnation != incarnation:
        raise Error(
            ErrorClass.VALIDATION,
            "record identity does not match the commit",
            {"run_id": run_id, "incarnation": incarnation},
        )
    if record.revision != expected_revision + 1:
        raise Error(
            ErrorClass.VALIDATION,
            "record revision must be expected_revision + 1",
            {"expected": expected_revision + 1, "received": record.revision},
        )
    if stored is None:
        raise Error(ErrorClass.RESOURCE_CONFLICT, "run does not exist", {"run_id": run_id})
    if stored.incarnation != incarnation:
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "incarnation is fenced",
            {"stored": stored.incarnation, "received": incarnation},
        )
    if stored.revision != expected_revision:
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "stale revision",
            {"stored": stored.revision, "expected": expected_revision},
        )
    for event in events:
        if type(event) is not RunEvent:
            raise Error(ErrorClass.VALIDATION, "a store commits RunEvent values")
        if not is_time(event.occurred_at):
            raise Error(
                ErrorClass.VALIDATION,
                "event time must be a finite number (an int of at most 2**53 in magnitude)",
            )
        kind = event.type
        if type(kind) is not str or not kind.isascii() or not kind or "\x00" in kind:
            if type(kind) is not str or not kind or "\x00" in kind:
                # (what every store reads back: PostgreSQL text holds no NUL)
                raise Error(ErrorClass.VALIDATION, "event type must be a non-empty str without NUL")
            check_json(kind, "event type")  # Unicode text only (no lone surrogate)


def prepare_commit(
    stored: RunRecord | None,
    run_id: str,
    *,
    incarnation: int,
    expected_revision: int,
    record: RunRecord,
    events: Sequence[RunEvent],
) -> PreparedCommit:
    """:func:`check_commit`, then the commit prepared: its events encoded.
    Costs the events, never the record."""
    check_commit(
        stored,
        run_id,
        incarnation=incarnation,
        expected_revision=expected_revision,
        record=record,
        events=events,
    )
    return _prepare(record, events)
