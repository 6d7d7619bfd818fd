"""A small durable store on files, and deliberately broken variants of it.

``FileStore`` keeps every run in one JSON file, rewritten atomically (write,
fsync, rename) on every change: slow, but durable and correct, so the
conformance suite must pass on it.  Each broken variant breaks exactly one
promise, and the suite must fail on each:

* ``AckWithoutPersistStore``: acknowledges commits it keeps only in memory.
* ``NoFenceStore``: an old incarnation can still commit (it checks only the
  revision).
* ``StaleRevisionWinsStore``: the last writer wins; a stale
  ``expected_revision`` overwrites the newer record.
* ``TornFailureStore``: a failed commit leaves the record written without
  its events (a torn write).

and subtler ones: a create that overwrites, sequences, identities (run
ids matched ignoring case or cut short), filters, pages and stale
incarnations of ``list_runs``, and data that does not come back exactly
(text, numbers, times).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import (
    RunEvent,
    RunRecord,
    decode_event,
    decode_record,
    encode_event,
    encode_record,
    fence,
)
from trio_backplane.store import Receipt, RunSummary, prepare_commit, prepare_create

__all__ = [
    "BROKEN_STORES",
    "AckWithoutPersistStore",
    "FileStore",
    "NoFenceStore",
    "StaleRevisionWinsStore",
    "TornFailureStore",
]


class FileStore:
    """Durable, correct and slow: one JSON file per store directory."""

    durable = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._file = self.path / "store.json"
        self._fail_next = False

    # -- file ----------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self._file.read_text("utf-8"))
        except FileNotFoundError:
            return {"runs": {}, "events": {}, "sequence": 0}
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self._file.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._file)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _stored(self, data: dict[str, Any], run_id: str) -> RunRecord | None:
        encoded = data["runs"].get(run_id)
        return None if encoded is None else decode_record(encoded)

    def _append(self, data: dict[str, Any], run_id: str, events: Sequence[dict[str, Any]]) -> None:
        log = data["events"].setdefault(run_id, [])
        for event in events:
            data["sequence"] += 1
            log.append({**event, "sequence": data["sequence"]})

    def _fail_next_commit(self) -> None:
        self._fail_next = True

    def _take_failure(self) -> bool:
        fail, self._fail_next = self._fail_next, False
        return fail

    # -- Store ---------------------------------------------------------------

    async def create(self, record: RunRecord) -> Receipt:
        await trio.lowlevel.checkpoint()
        prepared = prepare_create(record)
        data = self._read()
        if record.run_id in data["runs"]:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run already exists")
        data["runs"][record.run_id] = prepared.encoded
        data["events"][record.run_id] = []
        self._write(data)
        return Receipt(record.run_id, record.incarnation, record.revision)

    async def load(self, run_id: str) -> RunRecord | None:
        await trio.lowlevel.checkpoint()
        return self._stored(self._read(), run_id)

    def _check(
        self,
        stored: RunRecord | None,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Any:
        return prepare_commit(
            stored,
            run_id,
            incarnation=incarnation,
            expected_revision=expected_revision,
            record=record,
            events=events,
        )

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        await trio.lowlevel.checkpoint()
        data = self._read()
        prepared = self._check(
            self._stored(data, run_id),
            run_id,
            incarnation=incarnation,
            expected_revision=expected_revision,
            record=record,
            events=events,
        )
        if self._take_failure():
            self._failed_write(data, run_id, prepared)
            raise Error(ErrorClass.STORAGE_FAILED, "injected commit failure")
        data["runs"][run_id] = prepared.encoded
        self._append(data, run_id, prepared.events)
        self._write(data)
        return Receipt(run_id, incarnation, record.revision)

    def _failed_write(self, data: dict[str, Any], run_id: str, prepared: Any) -> None:
        """What reaches the disk when a commit fails: nothing."""

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        await trio.lowlevel.checkpoint()
        data = self._read()
        stored = self._stored(data, run_id)
        if stored is None:
            raise Error(ErrorClass.NOT_FOUND, "unknown run")
        new, events = fence(stored, incarnation)
        data["runs"][run_id] = encode_record(new)
        self._append(data, run_id, [encode_event(e) for e in events])
        self._write(data)
        return Receipt(run_id, new.incarnation, new.revision)

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        await trio.lowlevel.checkpoint()
        data = self._read()
        records = [decode_record(v) for _, v in sorted(data["runs"].items())]
        firsts = {
            run_id: decode_event(log[0]).occurred_at
            for run_id, log in data["events"].items()
            if log
        }
        return [
            RunSummary(r.run_id, r.incarnation, r.revision, r.state, firsts.get(r.run_id))
            for r in records
            if states is None or r.state in states
        ]

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        await trio.lowlevel.checkpoint()
        log = self._read()["events"].get(run_id, [])
        return [decode_event(e) for e in log if e["sequence"] > after]

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class AckWithoutPersistStore(FileStore):
    """Broken: commits are acknowledged but kept only in this instance's memory."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._overlay: dict[str, Any] | None = None

    def _read(self) -> dict[str, Any]:
        if self._overlay is not None:
            return json.loads(json.dumps(self._overlay))  # type: ignore[no-any-return]
        return super()._read()

    async def commit(self, run_id: str, **kwargs: Any) -> Receipt:
        real_write = self._write
        self._write = self._remember  # type: ignore[method-assign]
        try:
            return await super().commit(run_id, **kwargs)
        finally:
            self._write = real_write  # type: ignore[method-assign]

    def _remember(self, data: dict[str, Any]) -> None:
        self._overlay = json.loads(json.dumps(data))


class NoFenceStore(FileStore):
    """Broken: a commit checks the revision but not the incarnation."""

    def _check(self, stored: RunRecord | None, run_id: str, **kwargs: Any) -> Any:
        if stored is not None:
            stored = attrs.evolve(stored, incarnation=kwargs["incarnation"])
        return super()._check(stored, run_id, **kwargs)


class StaleRevisionWinsStore(FileStore):
    """Broken: the last writer wins, whatever revision it expected."""

    def _check(self, stored: RunRecord | None, run_id: str, **kwargs: Any) -> Any:
        if stored is not None:
            stored = attrs.evolve(stored, revision=kwargs["expected_revision"])
        return super()._check(stored, run_id, **kwargs)


class TornFailureStore(FileStore):
    """Broken: a failed commit writes the record but not its events."""

    def _failed_write(self, data: dict[str, Any], run_id: str, prepared: Any) -> None:
        data["runs"][run_id] = prepared.encoded
        self._write(data)


class FirstEventOnlyStore(FileStore):
    """Broken: a commit's events after the first are dropped."""

    def _append(self, data: dict[str, Any], run_id: str, events: Any) -> None:
        super()._append(data, run_id, list(events)[:1])


class SameSequencePerCommitStore(FileStore):
    """Broken: all events of one commit get the same sequence."""

    def _append(self, data: dict[str, Any], run_id: str, events: Any) -> None:
        log = data["events"].setdefault(run_id, [])
        data["sequence"] += 1
        for event in events:
            log.append({**event, "sequence": data["sequence"]})


class NoIdentityCheckStore(FileStore):
    """Broken: the record handed in is stored under ``run_id`` whatever run
    or incarnation it belongs to."""

    def _check(self, stored: RunRecord | None, run_id: str, **kwargs: Any) -> Any:
        record = kwargs["record"]
        own = attrs.evolve(record, run_id=run_id, incarnation=kwargs["incarnation"])
        prepared = super()._check(stored, run_id, **{**kwargs, "record": own})
        return attrs.evolve(prepared, record=record)


class CreateOverwritesStore(FileStore):
    """Broken: creating an existing run silently resets it."""

    async def create(self, record: RunRecord) -> Receipt:
        await trio.lowlevel.checkpoint()
        data = self._read()
        data["runs"][record.run_id] = encode_record(record)
        data["events"][record.run_id] = []
        self._write(data)
        return Receipt(record.run_id, record.incarnation, record.revision)


class EmptyFilterMeansAllStore(FileStore):
    """Broken: ``list_runs(states=set())`` lists every run."""

    async def list_runs(self, *, states: Any = None) -> Any:
        return await super().list_runs(states=states or None)


class HigherIncarnationCommitsStore(FileStore):
    """Broken: only older incarnations are refused; a newer one that never
    fenced commits (an implicit fence without its event)."""

    def _check(self, stored: RunRecord | None, run_id: str, **kwargs: Any) -> Any:
        if stored is not None and kwargs["incarnation"] > stored.incarnation:
            stored = attrs.evolve(stored, incarnation=kwargs["incarnation"])
        return super()._check(stored, run_id, **kwargs)


class LoadMissingReturnsFreshStore(FileStore):
    """Broken: loading a run that does not exist gives a fresh record."""

    async def load(self, run_id: str) -> RunRecord | None:
        loaded = await super().load(run_id)
        return RunRecord.new(run_id) if loaded is None else loaded


def _leaves(value: Any, change: Any) -> Any:
    """``value`` with ``change`` applied to every leaf (and every key)."""
    if isinstance(value, dict):
        return {_leaves(k, change): _leaves(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_leaves(v, change) for v in value]
    return change(value)


class _LossyStore(FileStore):
    """Broken: what it writes loses something: each subclass names what
    ``_lose`` does to a leaf (it has no default: a lossless one is FileStore)."""

    _lose: Callable[[Any], Any]

    def _write(self, data: dict[str, Any]) -> None:
        super()._write(_leaves(data, self._lose))


class AsciiOnlyStore(_LossyStore):
    """Broken: every non-ASCII character of the stored data becomes '?'."""

    @staticmethod
    def _lose(value: Any) -> Any:
        return value.encode("ascii", "replace").decode() if isinstance(value, str) else value


class NulDroppingStore(_LossyStore):
    """Broken: NUL characters vanish from stored text (a C-string backend)."""

    @staticmethod
    def _lose(value: Any) -> Any:
        return value.replace("\x00", "") if isinstance(value, str) else value


class ShortTextStore(_LossyStore):
    """Broken: text is cut to 65,535 bytes of UTF-8 (a ``TEXT`` column of MySQL)."""

    @staticmethod
    def _lose(value: Any) -> Any:
        if isinstance(value, str):
            return value.encode()[:65_535].decode(errors="ignore")
        return value


class DoubleNumbersStore(_LossyStore):
    """Broken: every number goes through a double (as JavaScript's JSON
    does): integers past 2**53 round, huge ones become floats."""

    @staticmethod
    def _lose(value: Any) -> Any:
        if type(value) is int:
            double = float(value)
            return int(double) if abs(double) < 2**63 else double
        return value


class SingleFloatsStore(_LossyStore):
    """Broken: floats are kept in single precision (``0.1`` comes back
    ``0.10000000149011612``)."""

    @staticmethod
    def _lose(value: Any) -> Any:
        if type(value) is float and value != 0 and abs(value) < 3e38:
            return struct.unpack("f", struct.pack("f", value))[0]
        return value


class WholeSecondEventsStore(FileStore):
    """Broken: event times are kept in whole seconds."""

    def _append(self, data: dict[str, Any], run_id: str, events: Any) -> None:
        whole = [{**e, "occurred_at": float(int(e["occurred_at"]))} for e in events]
        super()._append(data, run_id, whole)


def _lossy(value: Any) -> Any:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class BoolAsIntContextStore(FileStore):
    """Broken: the run's context loses the bool/int and float/int
    distinctions (``true`` comes back ``1``, ``1.0`` comes back ``1``)."""

    def _write(self, data: dict[str, Any]) -> None:
        runs = {k: {**v, "context": _leaves(v["context"], _lossy)} for k, v in data["runs"].items()}
        super()._write({**data, "runs": runs})


class FirstPageStore(FileStore):
    """Broken: ``list_runs`` returns the first 20 runs only (one page)."""

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        return (await super().list_runs(states=states))[:20]


class CaseInsensitiveIdsStore(FileStore):
    """Broken: run ids are matched ignoring case (a ``NOCASE`` collation, a
    case-insensitive file system): a run never created loads another's."""

    async def load(self, run_id: str) -> RunRecord | None:
        for stored in self._read()["runs"]:
            if stored.casefold() == run_id.casefold():
                return await super().load(stored)
        return await super().load(run_id)


class TruncatedIdsStore(FileStore):
    """Broken: run ids are kept to their first 64 characters (a
    ``VARCHAR(64)`` key): two long ids sharing them are one run."""

    async def create(self, record: RunRecord) -> Receipt:
        if any(stored[:64] == record.run_id[:64] for stored in self._read()["runs"]):
            raise Error(ErrorClass.RESOURCE_CONFLICT, "run already exists")
        return await super().create(record)


class CreationIncarnationListedStore(FileStore):
    """Broken: ``list_runs`` reports the incarnation a run was created with,
    never a fence's."""

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        listed = await super().list_runs(states=states)
        return [attrs.evolve(summary, incarnation=1) for summary in listed]


class NoAdmissionTimeStore(FileStore):
    """Broken: ``list_runs`` leaves every run's ``admitted_at`` out."""

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        listed = await super().list_runs(states=states)
        return [attrs.evolve(summary, admitted_at=None) for summary in listed]


class OneAdmissionTimeStore(FileStore):
    """Broken: ``list_runs`` gives every admitted run the earliest admission time."""

    async def list_runs(self, *, states: Collection[str] | None = None) -> list[RunSummary]:
        listed = await super().list_runs(states=states)
        first = min((s.admitted_at for s in listed if s.admitted_at is not None), default=None)
        return [
            summary if summary.admitted_at is None else attrs.evolve(summary, admitted_at=first)
            for summary in listed
        ]


BROKEN_STORES: tuple[type[FileStore], ...] = (
    AckWithoutPersistStore,
    NoFenceStore,
    StaleRevisionWinsStore,
    TornFailureStore,
    FirstEventOnlyStore,
    SameSequencePerCommitStore,
    NoIdentityCheckStore,
    CreateOverwritesStore,
    EmptyFilterMeansAllStore,
    HigherIncarnationCommitsStore,
    LoadMissingReturnsFreshStore,
    AsciiOnlyStore,
    BoolAsIntContextStore,
    NulDroppingStore,
    ShortTextStore,
    DoubleNumbersStore,
    SingleFloatsStore,
    WholeSecondEventsStore,
    FirstPageStore,
    CaseInsensitiveIdsStore,
    TruncatedIdsStore,
    CreationIncarnationListedStore,
    NoAdmissionTimeStore,
    OneAdmissionTimeStore,
)
