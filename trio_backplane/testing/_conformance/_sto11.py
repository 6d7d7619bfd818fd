"""The checks of STO-11: commits, restarts, fencing and recovery."""

from __future__ import annotations

import itertools

import attrs

from ...errors import ErrorClass
from ...kernel import Command, RunRecord, thaw, transition
from ...recovery import recover
from ...store import Store
from ._base import _Suite
from ._support import _ahead, _commit_onto, _expect_error, _Run

__all__ = ["STO_11_CHECKS"]

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


class _Sto11Checks(_Suite):
    """The checks of STO-11 (``test_<name>`` for each name of ``STO_11_CHECKS``)."""

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
            fenced = await _late_result_refused(store, host, old, invocation_id)
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


async def _late_result_refused(
    store: Store, host: Store, old: RunRecord, invocation_id: str
) -> RunRecord:
    """The fenced executor's late result is refused on either instance (``host``
    fenced it), even from the fenced record reloaded; returns that record."""
    late, late_events = transition(
        old, Command("tool_completed", at=80.0, input={"invocation_id": invocation_id})
    )
    for instance in (store, host):
        with _expect_error(ErrorClass.RESOURCE_CONFLICT):
            await _commit_onto(instance, old, late, late_events)
    fenced = await host.load(old.run_id)
    assert fenced is not None
    # Even an old executor that reloaded the fenced record cannot commit.
    reloaded = attrs.evolve(fenced, incarnation=old.incarnation)
    late, late_events = transition(
        reloaded,
        Command("tool_completed", at=81.0, input={"invocation_id": invocation_id}),
    )
    with _expect_error(ErrorClass.RESOURCE_CONFLICT):
        await _commit_onto(host, old, late, late_events, expected_revision=fenced.revision)
    assert await host.load(old.run_id) == fenced
    return fenced
