"""Further checks: late acknowledgements, event order, racing writers,
reopening, run identity, listing and exact data."""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from ...errors import Error, ErrorClass
from ...kernel import (
    MAX_RUN_ID,
    Command,
    RunRecord,
    dumps,
    encode_event,
    encode_record,
    evolve_record,
    transition,
)
from ...store import Receipt, Store, verify_receipt
from ._base import _Suite
from ._support import _commit_onto, _expect_any_error, _expect_error

__all__: list[str] = []

#: Runs ``test_list_runs_filters`` creates beyond its three: more than a page.
_MANY_RUNS = 30


class _FurtherChecks(_Suite):
    """The checks beyond STO-11."""

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
            await _run_ids_told_apart(store)

        await self._check(body)

    async def test_list_runs_filters(self) -> None:
        """``list_runs`` lists every run unfiltered (terminal ones included,
        and more runs than a page of a paginated backend), none for an empty
        filter, and exactly the runs in any of the states of a filter, each
        with its first event's time as ``admitted_at`` (``None``: none yet)."""

        async def body() -> None:
            store = await self._durable_store()
            running = await self._running(store, "listed-running")
            done = await self._running(store, "listed-done")
            await done.apply("finish", status="completed")
            failed = await self._running(store, "listed-failed")
            await failed.apply("finish", status="failed")
            created = [await self._new_run(store, f"listed-{n}") for n in range(_MANY_RUNS)]
            late = await self._new_run(store, "listed-late")  # admitted at another time
            for _ in range(5):
                next(late._clock)
            await late.apply("admit", state="running", deadline=1_000_000.0)
            ids = {r.run_id: r.record.state for r in (running, done, failed, late, *created)}

            def mine(summaries: Sequence[Any]) -> dict[str, str]:
                return {s.run_id: s.state for s in summaries if s.run_id in ids}

            assert mine(await store.list_runs()) == ids
            assert mine(await store.list_runs(states=set())) == {}
            assert mine(await store.list_runs(states={"completed", "failed"})) == {
                done.run_id: "completed",
                failed.run_id: "failed",
            }
            assert mine(await store.list_runs(states={"running"})) == {
                running.run_id: "running",
                late.run_id: "running",
            }
            assert len(mine(await store.list_runs(states={"queued"}))) == _MANY_RUNS
            for summary in await store.list_runs():  # admitted: the first event's time
                if summary.run_id in ids:
                    events = await store.events(summary.run_id)
                    first = events[0].occurred_at if events else None
                    assert summary.admitted_at == first, (summary, first)

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


async def _run_ids_told_apart(store: Store) -> None:
    """Run ids are told apart exactly: by case, by Unicode form, by a
    trailing space, and by every one of their ``MAX_RUN_ID`` characters."""
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
