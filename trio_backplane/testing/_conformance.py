"""``StoreConformance``: the checks every durable store must pass.

Subclass it in a test module and provide the factory hooks::

    class TestMyStore(trio_backplane.testing.StoreConformance):
        async def make_store(self) -> Store: ...          # a fresh, empty store
        async def reopen(self, store: Store) -> Store: ...  # a new instance, same data
        async def fail_next_commit(self, store: Store) -> None: ...

pytest (with pytest-trio) collects every ``test_*`` check of the subclass.
Each check drives real kernel transitions, commits them, reopens the store
and asserts what ``load``, ``events`` and ``list_runs`` return.  Each check
first requires a durable store: one whose ``fence`` raises
``unsupported_capability`` (``MemoryStore``) makes every check fail with
``Error(unsupported_capability, "durable store required")`` (STO-12).

The module imports neither pytest nor any store: hosts ship it with their
own stores.  A check is a plain coroutine method, so it can also be run
directly (``trio.run(TestMyStore().test_atomic_commit)``).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import unicodedata
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import trio

from ..errors import Error, ErrorClass
from ..kernel import (
    MAX_RUN_ID,
    Command,
    RunEvent,
    RunRecord,
    dumps,
    encode_event,
    encode_record,
    evolve_record,
    thaw,
    transition,
)
from ..recovery import recover
from ..store import Receipt, Store, verify_receipt
from ._faults import FaultyStore

__all__ = ["StoreConformance"]

#: The checks of STO-11, by name (each is ``test_<name>``).
STO_11_CHECKS = (
    "atomic_commit",
    "direct_execution_commit",
    "failed_commit",
    "incarnation_fence",
    "outstanding_effect_reconstruction",
    "restart_reconstruction",
    "stale_revision",
    "terminal_reconstruction",
    "uncertain_effect_fencing",
)


def _mark_trio(cls: type) -> None:
    """Mark the checks ``pytest.mark.trio`` when pytest-trio is installed, so
    they run without ``trio_mode``; a no-op outside pytest."""
    pytest = sys.modules.get("pytest")
    if pytest is None or importlib.util.find_spec("pytest_trio") is None:
        return
    marks = list(getattr(cls, "pytestmark", []))
    if not any(getattr(m, "name", None) == "trio" for m in marks):
        cls.pytestmark = [*marks, pytest.mark.trio]  # type: ignore[attr-defined]


def _expect_error(error_class: ErrorClass) -> _Raises:
    return _Raises(error_class)


class _Raises:
    """``with _Raises(cls): ...``: the block must raise ``Error`` of ``cls``.

    (A tiny ``pytest.raises`` so this module does not import pytest.)"""

    def __init__(self, error_class: ErrorClass | None) -> None:
        self.error_class = error_class  # None: any class
        self.error: Error | None = None

    def __enter__(self) -> _Raises:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        wanted = "any class" if self.error_class is None else self.error_class.value
        if exc is None:
            raise AssertionError(f"expected Error({wanted}), nothing was raised")
        if not isinstance(exc, Error):
            return False
        if self.error_class is not None and exc.error_class is not self.error_class:
            raise AssertionError(f"expected Error({wanted}), got {exc!r}") from exc
        self.error = exc
        return True


async def _commit_onto(
    store: Store,
    base: RunRecord,
    record: RunRecord,
    events: Sequence[RunEvent],
    *,
    expected_revision: int | None = None,
) -> Receipt:
    """``store.commit`` of ``record`` as a writer holding ``base`` would make
    it: ``base``'s incarnation, and its revision unless another is given."""
    return await store.commit(
        base.run_id,
        incarnation=base.incarnation,
        expected_revision=base.revision if expected_revision is None else expected_revision,
        record=record,
        events=events,
    )


class _Run:
    """One run driven through the kernel and committed to a store."""

    def __init__(self, store: Store, record: RunRecord, clock: itertools.count[int]) -> None:
        self.store = store
        self.record = record
        self._clock = clock
        self.events: list[RunEvent] = []

    @property
    def run_id(self) -> str:
        return self.record.run_id

    def next(self, kind: str, **data: Any) -> tuple[RunRecord, list[RunEvent]]:
        """The transition of ``kind`` from the current record (not committed),
        at a time with a fraction (a store keeping whole seconds fails)."""
        at = next(self._clock) + 0.375
        return transition(self.record, Command(kind, at=at, input=data))

    async def commit_prepared(self, new: RunRecord, events: Sequence[RunEvent]) -> Receipt:
        expected = self.record.revision
        receipt = await self.store.commit(
            self.run_id,
            incarnation=self.record.incarnation,
            expected_revision=expected,
            record=new,
            events=events,
        )
        assert isinstance(receipt, Receipt), f"commit returned {receipt!r}, not a Receipt"
        verify_receipt(receipt, run_id=self.run_id, expected_revision=expected)  # STO-03
        assert receipt.incarnation == new.incarnation, receipt
        self.record = new
        self.events.extend(events)
        return receipt

    async def apply(self, kind: str, **data: Any) -> Receipt:
        new, events = self.next(kind, **data)
        return await self.commit_prepared(new, events)


class StoreConformance:
    """The durable store conformance suite (STO-11, STO-12).

    Subclasses provide :meth:`make_store`, :meth:`reopen` and
    :meth:`fail_next_commit`; they may override :meth:`close_store` (the
    default awaits ``store.aclose()`` when the store has one).  Every store a
    check obtains from the hooks is closed when the check ends.
    """

    __test__: ClassVar[bool] = False
    STO_11_CHECKS: ClassVar[tuple[str, ...]] = STO_11_CHECKS

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The base is not collected; its subclasses are, unless private
        # (``_Name``) or explicitly ``__test__ = False`` themselves.
        if "__test__" not in cls.__dict__:
            cls.__test__ = not cls.__name__.startswith("_")
        _mark_trio(cls)

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
        run = await StoreConformance._new_run(store, name, **kwargs)
        await run.apply("admit", state="running", deadline=1_000_000.0)
        return run

    # -- the checks of STO-11 -----------------------------------------------

    async def test_atomic_commit(self) -> None:
        """STO-01, STO-04: a commit writes the record and its event together,
        acknowledges ``expected_revision + 1`` and survives a restart; a record
        whose revision is not ``expected + 1`` is refused and writes nothing."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "atomic")
            receipt = await run.apply("provider_started", turn_id="t1")
            assert receipt.revision == 2 == run.record.revision
            await self._assert_stored(store, run)
            new, events = run.next("provider_completed", final=False, result={"text": "hi"})
            with _expect_error(ErrorClass.VALIDATION):  # STO-04
                await store.commit(
                    run.run_id,
                    incarnation=run.record.incarnation,
                    expected_revision=run.record.revision,
                    record=attrs.evolve(new, revision=new.revision + 1),
                    events=events,
                )
            await self._assert_stored(store, run)
            await run.commit_prepared(new, events)
            latest = await store.events(
                run.run_id, after=(await store.events(run.run_id))[-2].sequence or 0
            )
            assert [e.type for e in latest] == ["run.provider_completed"], latest
            reopened = await self._reopen(store)
            await self._assert_stored(reopened, run)

        await self._check(body)

    async def test_direct_execution_commit(self) -> None:
        """A direct tool execution: the intent is durable before dispatch, the
        result is stored (``tool_results``, intent ``consumed``) before its
        transcript projection, and a replayed completion is refused."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "direct")
            await run.apply("provider_started")
            await run.apply("provider_completed", final=False, result={"tool_calls": 1})
            await run.apply(
                "tool_invoked",
                tool_name="write_file",
                tool_call_id="call-1",
                effect_class="mutation",
                dispatch_state="not_dispatched",
            )
            (invocation_id,) = run.record.active_tools
            published = await self._reopen(store)
            loaded = await published.load(run.run_id)
            assert loaded is not None
            intent = loaded.intents.get(f"tool:{invocation_id}")
            assert intent is not None, f"the intent was not durable before dispatch: {loaded!r}"
            assert intent["status"] == "started", loaded.intents
            assert invocation_id in loaded.active_tools
            before = run.record
            await run.apply("tool_completed", invocation_id=invocation_id, result={"bytes": 3})
            reopened = await self._reopen(store)
            await self._assert_stored(reopened, run)
            stored = await reopened.load(run.run_id)
            assert stored is not None
            assert stored.tool_results[invocation_id] == {"bytes": 3}
            assert stored.intents[f"tool:{invocation_id}"]["status"] == "consumed"
            assert not stored.active_tools
            # The same completion again (an executor replaying it) is refused.
            replay, replay_events = transition(
                before,
                Command("tool_completed", at=99.0, input={"invocation_id": invocation_id}),
            )
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await _commit_onto(reopened, before, replay, replay_events)
            await run.apply("conversation_updated", conversation={"messages": [{"n": 1}]})
            await self._assert_stored(reopened, run)
            await self._assert_stored(await self._reopen(reopened), run)

        await self._check(body)

    async def test_failed_commit(self) -> None:
        """STO-05, STO-06: a commit that fails before acknowledgement raises
        ``storage_failed``; ``load`` returns exactly the previous record with
        no partial events, before and after a restart; a retry then works."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "failed")
            await run.apply("provider_started")
            new, events = run.next("provider_completed", final=False, result={"r": 1})
            await self.fail_next_commit(store)
            with _expect_error(ErrorClass.STORAGE_FAILED):
                await _commit_onto(store, run.record, new, events)
            await self._assert_stored(store, run)
            reopened = await self._reopen(store)
            await self._assert_stored(reopened, run)
            run.store = reopened
            await run.commit_prepared(new, events)
            await self._assert_stored(await self._reopen(reopened), run)

        await self._check(body)

    async def test_incarnation_fence(self) -> None:
        """STO-08: ``fence`` advances incarnation and revision atomically; the
        old incarnation can never commit again (even at the current revision),
        and a fence that does not raise the incarnation is refused."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "fence")
            await run.apply("provider_started")
            old = run.record
            receipt = await store.fence(run.run_id, incarnation=old.incarnation + 1)
            assert receipt.incarnation == old.incarnation + 1, receipt
            assert receipt.revision == old.revision + 1, receipt
            fenced = await store.load(run.run_id)
            assert fenced is not None
            assert fenced.incarnation == old.incarnation + 1
            assert fenced.revision == old.revision + 1
            [summary] = [s for s in await store.list_runs() if s.run_id == run.run_id]
            assert (summary.incarnation, summary.revision) == (
                fenced.incarnation,
                fenced.revision,
            ), f"list_runs after a fence says {summary}"
            # The old executor, at its own revision ...
            stale, stale_events = transition(old, Command("provider_completed", at=50.0))
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await _commit_onto(store, old, stale, stale_events)
            # ... and at the current revision: still fenced.
            current = attrs.evolve(fenced, incarnation=old.incarnation)
            late, late_events = transition(current, Command("provider_completed", at=51.0))
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await _commit_onto(store, old, late, late_events, expected_revision=fenced.revision)
            for incarnation in (old.incarnation, old.incarnation + 1):
                with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                    await store.fence(run.run_id, incarnation=incarnation)
            reopened = await self._reopen(store)
            assert await reopened.load(run.run_id) == fenced
            events = await reopened.events(run.run_id)
            assert len(events) == fenced.revision, events
            assert events[-1].type == "run.fence", events
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await _commit_onto(
                    reopened, old, late, late_events, expected_revision=fenced.revision
                )
            # The new incarnation commits.
            new_run = _Run(reopened, fenced, itertools.count(100))
            new_run.events = list(events)
            await new_run.apply("cancel")
            assert await reopened.load(run.run_id) == new_run.record

        await self._check(body)

    async def test_outstanding_effect_reconstruction(self) -> None:
        """STO-09: outstanding effects (active tools, started intents, budget
        reservations, dispatch states) are reconstructed after a restart and
        classify the same way."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "outstanding", work=10)
            await run.apply("provider_started")
            await run.apply("provider_completed", final=False, result={"tool_calls": 2})
            await run.apply(
                "tool_invoked",
                tool_name="lookup",
                effect_class="read_only",
                dispatch_state="not_dispatched",
            )
            await run.apply(
                "tool_invoked",
                tool_name="send_mail",
                effect_class="mutation",
                dispatch_state="dispatched",
            )
            reopened = await self._reopen(store)
            await self._assert_stored(reopened, run)
            loaded = await reopened.load(run.run_id)
            assert loaded is not None
            assert loaded.budget == run.record.budget
            assert loaded.budget.used == 3
            assert set(loaded.active_tools) == set(run.record.active_tools)
            report = recover(loaded, incarnation=loaded.incarnation + 1)
            assert report == recover(run.record, incarnation=loaded.incarnation + 1)
            by_tool = {
                loaded.intents[e.effect_id]["tool_name"]: e
                for e in report.effects
                if e.kind == "tool"
            }
            assert by_tool["lookup"].safe_to_resume
            assert by_tool["lookup"].safe_to_withdraw
            assert not by_tool["send_mail"].safe_to_withdraw
            assert report.uncertain_effects == (by_tool["send_mail"].effect_id,)

        await self._check(body)

    async def test_restart_reconstruction(self) -> None:
        """STO-09: a new instance on the same data loads a record equal to the
        last committed one (conversation state, budget, intents, active work,
        deadline, context) and its event log, and continues from it."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "restart", work=7)
            hello = {"role": "user", "content": "hi"}
            await run.apply("conversation_updated", conversation={"turns": 1}, messages=[hello])
            await run.apply("provider_started", turn_id="turn-1")
            conversation = {"turns": 1, "cost": {"input": 3, "output": 1.5}}
            answer = {"role": "assistant", "content": "x"}
            await run.apply(
                "provider_completed",
                final=False,
                result={"text": "x"},
                conversation=conversation,
                messages=[answer],
                usage=[{"input": 3, "output": 1.5}],
            )
            await run.apply("tool_invoked", tool_name="t", effect_class="idempotent")
            await run.apply("conversation_updated", execution_deadline=2_000_000.0)
            reopened = await self._reopen(store)
            await self._assert_stored(reopened, run)
            loaded = await reopened.load(run.run_id)
            assert loaded is not None
            assert thaw(loaded.context["conversation"]) == conversation
            assert thaw(loaded.transcript) == [hello, answer]
            assert thaw(loaded.usage) == [{"input": 3, "output": 1.5}]
            assert loaded.deadline == 2_000_000.0
            assert loaded.budget.used == 2
            summaries = {s.run_id: s for s in await reopened.list_runs()}
            summary = summaries[run.run_id]
            assert (summary.incarnation, summary.revision, summary.state) == (
                loaded.incarnation,
                loaded.revision,
                loaded.state,
            )
            run.store = reopened
            (invocation_id,) = loaded.active_tools
            await run.apply("tool_completed", invocation_id=invocation_id, result=[1, 2])
            await self._assert_stored(await self._reopen(reopened), run)

        await self._check(body)

    async def test_stale_revision(self) -> None:
        """STO-02: a stale ``expected_revision`` (a replay of an accepted commit
        included, or one ahead of the store) raises ``resource_conflict`` and
        never overwrites the newer record or its events."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "stale")
            base = run.record
            accepted, accepted_events = run.next("provider_started")
            await run.commit_prepared(accepted, accepted_events)
            await run.apply("provider_completed", final=False)
            attempts = [
                (base.revision, accepted, accepted_events),  # replay of the accepted commit
                (base.revision, *transition(base, Command("cancel", at=70.0))),  # stale fork
                (run.record.revision + 1, *_ahead(run.record)),  # from the future
            ]
            for expected, record, events in attempts:
                with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                    await store.commit(
                        run.run_id,
                        incarnation=record.incarnation,
                        expected_revision=expected,
                        record=record,
                        events=events,
                    )
                await self._assert_stored(store, run)
            await self._assert_stored(await self._reopen(store), run)

        await self._check(body)

    async def test_terminal_reconstruction(self) -> None:
        """Terminal runs (completed, cancelled after confirmed cleanup) are
        reconstructed with their outcome and stay terminal after a restart."""

        async def body() -> None:
            store = await self._durable_store()
            done = await self._running(store, "terminal-done")
            await done.apply("provider_started")
            await done.apply("provider_completed", final=False)
            await done.apply("tool_invoked", tool_name="t", dispatch_state="dispatched")
            (invocation_id,) = done.record.active_tools
            await done.apply("tool_completed", invocation_id=invocation_id, result="ok")
            await done.apply("finish", status="completed", outcome={"answer": 42})
            stopped = await self._running(store, "terminal-cancelled")
            await stopped.apply("provider_started")
            await stopped.apply("cancel")
            required = stopped.record.cleanup_required
            assert required is not None
            await stopped.apply("cleanup_settled", certainty="confirmed", settled=dict(required))
            reopened = await self._reopen(store)
            for run, state in ((done, "completed"), (stopped, "cancelled")):
                await self._assert_stored(reopened, run)
                loaded = await reopened.load(run.run_id)
                assert loaded is not None
                assert loaded.state == state
                assert loaded.terminal
                assert loaded.outcome is not None
                assert loaded.outcome["status"] == state
                report = recover(loaded, incarnation=loaded.incarnation + 1)
                assert report.effects == (), report
                assert report.uncertain_effects == (), report
                with _expect_error(ErrorClass.VALIDATION):
                    transition(loaded, Command("start", at=1e9))
            done_loaded = await reopened.load(done.run_id)
            assert done_loaded is not None
            assert done_loaded.outcome is not None
            assert done_loaded.outcome["answer"] == 42
            ids = {s.run_id for s in await reopened.list_runs(states={"completed"})}
            assert done.run_id in ids
            assert stopped.run_id not in ids
            ids = {s.run_id for s in await reopened.list_runs(states={"cancelled"})}
            assert stopped.run_id in ids
            assert done.run_id not in ids

        await self._check(body)

    async def test_uncertain_effect_fencing(self) -> None:
        """A crashed executor with a dispatched mutation: recovery classifies it
        uncertain, the fence stops the old executor's late result, and the
        uncertain settlement survives a restart, never safe to resume."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "uncertain")
            await run.apply("provider_started")
            await run.apply("provider_completed", final=False)
            await run.apply(
                "tool_invoked",
                tool_name="charge_card",
                effect_class="mutation",
                dispatch_state="dispatched",
            )
            (invocation_id,) = run.record.active_tools
            old = run.record
            # The executor "crashes": a new host reopens and recovers.
            host = await self._reopen(store)
            loaded = await host.load(run.run_id)
            assert loaded == old
            report = recover(loaded, incarnation=old.incarnation + 1)
            assert report.uncertain_effects == (f"tool:{invocation_id}",), report
            assert not any(e.safe_to_resume or e.safe_to_withdraw for e in report.effects)
            await host.fence(run.run_id, incarnation=report.incarnation)
            # The old executor's late result, on either instance, is refused.
            late, late_events = transition(
                old, Command("tool_completed", at=80.0, input={"invocation_id": invocation_id})
            )
            for instance in (store, host):
                with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                    await _commit_onto(instance, old, late, late_events)
            fenced = await host.load(run.run_id)
            assert fenced is not None
            # Even an old executor that reloaded the fenced record cannot commit.
            reloaded = attrs.evolve(fenced, incarnation=old.incarnation)
            late, late_events = transition(
                reloaded,
                Command("tool_completed", at=81.0, input={"invocation_id": invocation_id}),
            )
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await _commit_onto(host, old, late, late_events, expected_revision=fenced.revision)
            assert await host.load(run.run_id) == fenced
            assert fenced.incarnation == report.incarnation
            assert fenced.intents[f"tool:{invocation_id}"]["status"] == "started"
            assert invocation_id not in fenced.tool_results
            successor = _Run(host, fenced, itertools.count(200))
            await successor.apply("cancel")
            await successor.apply(
                "cleanup_settled", certainty="uncertain", evidence={"worker": "lost"}
            )
            reopened = await self._reopen(host)
            final = await reopened.load(run.run_id)
            assert final == successor.record
            assert final.state == "unknown_outcome"
            assert final.intents[f"tool:{invocation_id}"]["status"] == "uncertain"
            again = recover(final, incarnation=final.incarnation + 1)
            assert again.uncertain_effects == (f"tool:{invocation_id}",)
            assert not any(e.safe_to_resume for e in again.effects)

        await self._check(body)

    # -- further checks ------------------------------------------------------

    async def test_stale_stage_acknowledgement(self) -> None:
        """STO-03: a late acknowledgement for an earlier stage is refused: a
        commit prepared from an older stage raises ``resource_conflict``, the
        kernel refuses a stale attempt, and a receipt for another revision is
        rejected by ``verify_receipt``."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "stage")
            await run.apply("provider_started")
            first_attempt = run.record.active_provider
            assert first_attempt is not None
            stage_a = run.record
            stage_a_next, stage_a_events = run.next("provider_completed", final=False)
            await run.commit_prepared(stage_a_next, stage_a_events)
            receipt_b = await run.apply("provider_started")
            # The stage-A completion, acknowledged late, again:
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await _commit_onto(store, stage_a, stage_a_next, stage_a_events)
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):  # kernel: stale attempt
                run.next("provider_completed", attempt_id=first_attempt["attempt_id"])
            with _expect_error(ErrorClass.RESOURCE_CONFLICT) as raised:
                verify_receipt(receipt_b, run_id=run.run_id, expected_revision=stage_a.revision)
            assert raised.error is not None
            assert dict(raised.error.details) == {
                "expected": stage_a.revision + 1,
                "received": receipt_b.revision,
            }
            await self._assert_stored(store, run)
            await self._assert_stored(await self._reopen(store), run)

        await self._check(body)

    async def test_event_ordering(self) -> None:
        """``events`` returns each run's log in commit order (increasing
        sequence), ``after`` returns exactly the suffix, and interleaved runs'
        logs never mix, before and after a restart."""

        async def body() -> None:
            store = await self._durable_store()
            a = await self._running(store, "order-a")
            b = await self._running(store, "order-b")
            for i in range(6):
                for run in (a, b) if i % 2 else (b, a):
                    await run.apply(
                        "conversation_updated", conversation={"i": i, "run": run.run_id}
                    )
            await a.apply("provider_started")
            await b.apply("cancel")
            for instance in (store, await self._reopen(store)):
                for run in (a, b):
                    await self._assert_stored(instance, run)
                    log = await instance.events(run.run_id)
                    assert len(log) == run.record.revision
                    for k in range(len(log) + 1):
                        after = 0 if k == 0 else log[k - 1].sequence
                        assert after is not None
                        suffix = await instance.events(run.run_id, after=after)
                        assert suffix == log[k:], (k, suffix)
            assert await store.events(f"missing-{uuid.uuid4().hex}") == []

        await self._check(body)

    async def test_concurrent_writers(self) -> None:
        """Two writers racing commits on one revision (one instance, and two
        instances on the same data): exactly one wins, the other raises
        ``resource_conflict``; the stored record is the winner's."""

        async def body() -> None:
            store = await self._durable_store()
            other = await self._reopen(store)
            run = await self._running(store, "race")
            for round_ in range(8):
                instances = (store, store) if round_ % 2 else (store, other)
                base = run.record
                candidates = [
                    transition(
                        base,
                        Command(
                            "conversation_updated",
                            at=1000.0 + round_,
                            input={"conversation": {"writer": w, "round": round_}},
                        ),
                    )
                    for w in range(2)
                ]
                outcomes: list[Any] = [None, None]

                async def write(
                    w: int,
                    instance: Store,
                    base: RunRecord = base,
                    candidates: list[Any] = candidates,
                    outcomes: list[Any] = outcomes,
                ) -> None:
                    record, events = candidates[w]
                    try:
                        outcomes[w] = await _commit_onto(instance, base, record, events)
                    except Error as exc:
                        outcomes[w] = exc

                async with trio.open_nursery() as nursery:
                    for w in range(2):
                        nursery.start_soon(write, w, instances[w])
                winners = [w for w in range(2) if isinstance(outcomes[w], Receipt)]
                assert len(winners) == 1, f"round {round_}: {outcomes!r}"
                loser = outcomes[1 - winners[0]]
                assert isinstance(loser, Error), loser
                assert loser.error_class is ErrorClass.RESOURCE_CONFLICT, loser
                record, events = candidates[winners[0]]
                run.record = record
                run.events.extend(events)
                await self._assert_stored(store, run)
                await self._assert_stored(other, run)

        await self._check(body)

    async def test_durability_across_reopen(self) -> None:
        """Every acknowledged commit survives closing the store and opening
        it again, repeatedly; runs created on one instance are visible to the
        next."""

        async def body() -> None:
            store = await self._durable_store()
            runs = [await self._running(store, f"durable-{i}") for i in range(3)]
            for cycle in range(3):
                for i, run in enumerate(runs):
                    run.store = store
                    await run.apply("conversation_updated", conversation={"cycle": cycle, "run": i})
                reopened = await self._reopen(store)
                opened = self._opened()
                opened.remove(store)
                await self.close_store(store)
                store = reopened
                for run in runs:
                    await self._assert_stored(store, run)
                listed = {s.run_id: s.revision for s in await store.list_runs()}
                for run in runs:
                    assert listed.get(run.run_id) == run.record.revision, listed

        await self._check(body)

    async def test_multi_event_commit(self) -> None:
        """STO-01: one commit may carry several events (the runtime merges
        kernel commands into one durable write): every one is stored, in
        order, each with its own increasing sequence."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "merged")
            record, events = run.record, []
            for i in range(3):
                record, produced = transition(
                    record, Command("conversation_updated", at=100.0 + i, input={"i": i})
                )
                events += produced
            merged = evolve_record(record, revision=run.record.revision + 1)
            await run.commit_prepared(merged, events)
            for instance in (store, await self._reopen(store)):
                await self._assert_stored(instance, run)

        await self._check(body)

    async def test_identity_and_existence(self) -> None:
        """STO-01, STO-02, STO-08: a record of another run or incarnation is
        refused (``validation``); a commit from a newer incarnation that
        never fenced is refused (``resource_conflict``), as is creating a run
        twice; a run that does not exist loads as ``None``, and a commit or
        fence naming it is refused without creating it.  Nothing refused
        changes the stored run."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._running(store, "identity")
            other = await self._running(store, "other")
            new, events = run.next("conversation_updated", conversation={"x": 1})
            for record, error_class in (
                (attrs.evolve(new, run_id=other.run_id), ErrorClass.VALIDATION),
                (attrs.evolve(new, incarnation=new.incarnation + 1), ErrorClass.VALIDATION),
            ):
                with _expect_error(error_class):
                    await _commit_onto(store, run.record, record, events)
            newer = attrs.evolve(new, incarnation=run.record.incarnation + 4)
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):  # never fenced
                await store.commit(
                    run.run_id,
                    incarnation=newer.incarnation,
                    expected_revision=run.record.revision,
                    record=newer,
                    events=events,
                )
            with _expect_error(ErrorClass.RESOURCE_CONFLICT):
                await store.create(RunRecord.new(run.run_id))
            await self._assert_stored(store, run)
            await self._assert_stored(store, other)
            missing = f"missing-{uuid.uuid4().hex}"
            assert await store.load(missing) is None
            ghost = RunRecord(run_id=missing, revision=1)
            with _expect_any_error():
                await store.commit(
                    missing, incarnation=1, expected_revision=0, record=ghost, events=[]
                )
            with _expect_any_error():
                await store.fence(missing, incarnation=2)
            assert await store.load(missing) is None
            assert missing not in {s.run_id for s in await store.list_runs()}
            # Run ids are told apart exactly: by case, by Unicode form, by a
            # trailing space, and by every one of their MAX_RUN_ID characters.
            named = f"Identity-{uuid.uuid4().hex[:8]}-caf\u00e9"
            await store.create(RunRecord.new(named))
            for twin in (
                named.lower(),
                named.upper(),
                named + " ",
                unicodedata.normalize("NFD", named),
            ):
                assert await store.load(twin) is None, f"{twin!r} loads {named!r}'s run"
            prefix = f"long-{uuid.uuid4().hex}-" + "p" * 200
            long_ids = [prefix + c * (MAX_RUN_ID - len(prefix)) for c in "ab"]
            for run_id in long_ids:
                await store.create(RunRecord.new(run_id))
            for run_id in long_ids:
                loaded = await store.load(run_id)
                assert loaded is not None, f"a run id of {MAX_RUN_ID} characters is missing"
                assert loaded.run_id == run_id, (
                    f"a run id of {MAX_RUN_ID} characters loads {loaded.run_id!r}"
                )
            listed = {s.run_id for s in await store.list_runs()}
            assert {named, *long_ids} <= listed

        await self._check(body)

    async def test_list_runs_filters(self) -> None:
        """``list_runs`` lists every run unfiltered (terminal ones included,
        and more runs than a page of a paginated backend), none for an empty
        filter, and exactly the runs in any of the states of a filter."""

        async def body() -> None:
            store = await self._durable_store()
            running = await self._running(store, "listed-running")
            done = await self._running(store, "listed-done")
            await done.apply("finish", status="completed")
            failed = await self._running(store, "listed-failed")
            await failed.apply("finish", status="failed")
            created = [await self._new_run(store, f"listed-{n}") for n in range(_MANY_RUNS)]
            ids = {r.run_id: r.record.state for r in (running, done, failed, *created)}

            def mine(summaries: Sequence[Any]) -> dict[str, str]:
                return {s.run_id: s.state for s in summaries if s.run_id in ids}

            assert mine(await store.list_runs()) == ids
            assert mine(await store.list_runs(states=set())) == {}
            assert mine(await store.list_runs(states={"completed", "failed"})) == {
                done.run_id: "completed",
                failed.run_id: "failed",
            }
            assert mine(await store.list_runs(states={"running"})) == {running.run_id: "running"}
            assert len(mine(await store.list_runs(states={"queued"}))) == _MANY_RUNS

        await self._check(body)

    async def test_data_round_trips_exactly(self) -> None:
        """A store gives back exactly the JSON it was given: ``true`` stays
        a boolean and ``1.0`` a float (``==`` alone would not tell), integers
        past a double's 53 bits and past 64 bits stay exact, floats keep
        every digit, fractional times keep their fraction, and non-ASCII
        text, NUL characters and text longer than 64 KiB survive, in the
        record and in the events, before and after a restart."""

        async def body() -> None:
            store = await self._durable_store()
            run = await self._new_run(store, "exact")
            await run.apply("admit", state="running", deadline=1_712_345_999.5)
            value = {
                "flags": [True, False, 1, 1.0, 0.5, -0.0, 2**53],
                "numbers": [2**53 + 1, -(2**63) - 1, 2**64 + 1, 0.1, 1e300, -2.5e-8, 5e-324],
                "text": "héllo ✓ 🦀 " + "long " * 200,
                "nul": "a\x00b\x00",
                "long": "é" * 40_000 + "✓" * 30_000,  # 70,000 characters, 170,000 bytes
                "nested": {"ü": [None, {"k": "v"}]},
            }
            await run.apply("conversation_updated", conversation=value)
            for instance in (store, await self._reopen(store)):
                loaded = await instance.load(run.run_id)
                assert loaded is not None
                assert dumps(encode_record(loaded)) == dumps(encode_record(run.record)), (
                    "the stored record's JSON differs from the committed one's"
                )
                stored = await instance.events(run.run_id)
                assert [dumps(encode_event(attrs.evolve(e, sequence=None))) for e in stored] == [
                    dumps(encode_event(e)) for e in run.events
                ], "the stored events' JSON differs from the committed ones'"

        await self._check(body)


#: Runs ``test_list_runs_filters`` creates beyond its three: more than a page.
_MANY_RUNS = 30


def _expect_any_error() -> _Raises:
    return _Raises(None)


def _ahead(record: RunRecord) -> tuple[RunRecord, list[RunEvent]]:
    """A record two revisions ahead of ``record`` (committed as if the store
    were one revision further than it is)."""
    first, _ = transition(record, Command("conversation_updated", at=90.0))
    return transition(first, Command("conversation_updated", at=91.0))
