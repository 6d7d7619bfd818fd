"""The suite's hooks, which a store's subclass provides, and the plumbing
every check shares: durable stores from the hooks, closed when the check ends."""

from __future__ import annotations

import itertools
import uuid
from typing import Any, ClassVar

import trio

from ...errors import Error, ErrorClass
from ...kernel import RunRecord
from ...store import Store
from .._faults import FaultyStore
from ._support import _Run

__all__: list[str] = []


class _Suite:
    """The hooks and plumbing of :class:`StoreConformance`, which its checks use."""

    __test__: ClassVar[bool] = False

    # -- hooks ---------------------------------------------------------------

    async def make_store(self) -> Store:
        """A fresh, empty store."""
        raise TypeError(f"{type(self).__name__} must define make_store()")

    async def reopen(self, store: Store) -> Store:
        """A new store instance on ``store``'s data (a restart).  The old
        instance is not used for writing afterwards, but it may still be open."""
        raise TypeError(f"{type(self).__name__} must define reopen()")

    async def fail_next_commit(self, store: Store) -> None:
        """Make ``store``'s next commit fail before it is acknowledged.  The
        default serves a :class:`FaultyStore` (wrap the store in one in
        :meth:`make_store` and :meth:`reopen`)."""
        if isinstance(store, FaultyStore):
            store.fail_next_commit()
            return
        raise TypeError(
            f"{type(self).__name__} must define fail_next_commit(), or make FaultyStore stores"
        )

    async def close_store(self, store: Store) -> None:
        """Release ``store`` (default: ``await store.aclose()`` if it exists)."""
        aclose = getattr(store, "aclose", None)
        if aclose is not None:
            await aclose()

    # -- plumbing ------------------------------------------------------------

    def _opened(self) -> list[Store]:
        opened: list[Store] | None = getattr(self, "_conformance_opened", None)
        if opened is None:
            opened = []
            self._conformance_opened = opened
        return opened

    async def _close_all(self) -> None:
        opened = self._opened()
        while opened:
            store = opened.pop()
            await self.close_store(store)

    async def _reopen(self, store: Store) -> Store:
        new = await self.reopen(store)
        self._opened().append(new)
        return new

    async def _durable_store(self) -> Store:
        """A fresh store from ``make_store``, refused unless it can fence (STO-12)."""
        store = await self.make_store()
        self._opened().append(store)
        if getattr(store, "durable", True) is False:
            raise Error(
                ErrorClass.UNSUPPORTED_CAPABILITY,
                "durable store required",
                {"store": type(store).__name__},
            )
        probe = RunRecord.new(f"conformance-probe-{uuid.uuid4().hex}")
        await store.create(probe)
        try:
            receipt = await store.fence(probe.run_id, incarnation=probe.incarnation + 1)
        except Error as exc:
            if exc.error_class is ErrorClass.UNSUPPORTED_CAPABILITY:
                raise Error(
                    ErrorClass.UNSUPPORTED_CAPABILITY,
                    "durable store required",
                    {"store": type(store).__name__},
                ) from exc
            raise
        assert receipt.incarnation == probe.incarnation + 1, receipt
        return store

    async def _check(self, body: Any) -> None:
        try:
            await body()
        finally:
            with trio.CancelScope(shield=True):
                await self._close_all()

    @staticmethod
    async def _new_run(store: Store, name: str, **kwargs: Any) -> _Run:
        record = RunRecord.new(f"{name}-{uuid.uuid4().hex[:12]}", **kwargs)
        receipt = await store.create(record)
        assert receipt.run_id == record.run_id, receipt
        assert receipt.revision == 0, receipt
        assert receipt.incarnation == record.incarnation, receipt
        return _Run(store, record, itertools.count(1))

    @staticmethod
    async def _assert_stored(store: Store, run: _Run) -> None:
        """``store`` holds exactly ``run``'s record and event log."""
        loaded = await store.load(run.run_id)
        assert loaded is not None, f"{run.run_id} is missing"
        assert loaded == run.record, (
            f"stored record differs:\nstored  {loaded!r}\nexpected {run.record!r}"
        )
        events = await store.events(run.run_id)
        assert [(e.type, e.occurred_at, dict(e.payload)) for e in events] == [
            (e.type, e.occurred_at, dict(e.payload)) for e in run.events
        ], f"stored events differ: {events!r}"
        sequences = [e.sequence if isinstance(e.sequence, int) else -1 for e in events]
        assert all(s >= 0 for s in sequences), f"events without a sequence: {events!r}"
        assert sequences == sorted(set(sequences)), f"sequences not increasing: {sequences}"

    @staticmethod
    async def _running(store: Store, name: str, **kwargs: Any) -> _Run:
        run = await _Suite._new_run(store, name, **kwargs)
        await run.apply("admit", state="running", deadline=1_000_000.0)
        return run
