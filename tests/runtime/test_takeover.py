"""Taking over a run whose host died: fence, classify, settle with
evidence, and continue only what nothing in flight could have changed.

On SQLite (fencing needs a durable store), on Trio's own clock: its
commits run in a thread, and no deadline here is near."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.runtime.support import Delegating, RecordingBackend, make_tool
from trio_backplane import Authority, Error, ErrorClass, ToolRegistry, open_conversation
from trio_backplane.kernel import Cancel, transition
from trio_backplane.recovery import replacement_for, settle_run
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.testing import Hang, ScriptedProvider
from trio_backplane.tools import ToolResult

S = ScriptedProvider
RUN = "run-1"


class Dying(Delegating):
    """A store whose host 'dies' once ``dead`` is set: no commit lands any
    more, and what is stored is what a crashed host left."""

    dead = False

    async def commit(self, run_id: str, **kwargs: Any) -> Any:
        if self.dead:
            raise Error(ErrorClass.STORAGE_FAILED, "the host is gone")
        return await self.inner.commit(run_id, **kwargs)


async def crash_while(
    inner: Any,
    provider: Any,
    tools: list[Any],
    until: Any,
    *,
    work: int = 20,
    wall_clock: Any = trio.current_time,
) -> None:
    """Run until ``until(record)`` holds for the stored record, then let no
    commit land: ``inner`` holds what a crashed host left."""
    store = Dying(inner)
    registry = ToolRegistry(tools)
    async with open_conversation(
        RUN,
        store=store,
        provider=provider,
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id=RUN),
        work=work,
        run_timeout=600.0,
        wall_clock=wall_clock,
    ) as conversation:
        await conversation.prompt("go")
        while not until(await inner.load(RUN)):
            await trio.sleep(0.01)
        store.dead = True
        await conversation.cancel()
        await conversation.wait_settled()


async def crash_in_second_attempt(store: Any, wall_clock: Any = trio.current_time) -> Any:
    """A run that completed its read-only ``lookup`` (its backend, returned)
    and whose host died in the provider attempt after it."""
    lookup = RecordingBackend(ToolResult("42"))
    provider = S([S.tool_calls(("c1", "lookup", {})), [Hang()]])

    def second_attempt(record: Any) -> bool:
        return record.active_provider is not None and bool(record.transcript[1:])

    tools = [make_tool("lookup", lookup, read_only=True)]
    await crash_while(store, provider, tools, second_attempt, work=10, wall_clock=wall_clock)
    return lookup


async def test_a_mutation_in_flight_settles_unknown_outcome_with_evidence(tmp_path: Path) -> None:
    """A dispatched mutating tool: ``settle_run`` fences the old
    incarnation, commits ``unknown_outcome`` naming the effect, and a
    continuation is refused; the old incarnation can commit nothing."""
    hang = RecordingBackend(lambda _op: trio.sleep_forever())
    tools = [make_tool("transfer", hang)]
    provider = S([S.tool_calls(("c1", "transfer", {})), S.text("never")])

    def dispatched(record: Any) -> bool:
        return any(i.get("tool_name") == "transfer" for i in record.intents.values())

    async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        await _mutation_in_flight(store, provider, tools, dispatched, hang)


async def _mutation_in_flight(
    store: Any, provider: Any, tools: Any, dispatched: Any, hang: Any
) -> None:
    await crash_while(store, provider, tools, dispatched)
    before = await store.load(RUN)
    assert before is not None
    assert before.state == "running"
    settled = await settle_run(store, RUN, wall_clock=trio.current_time)
    assert settled.committed
    assert settled.record.state == "unknown_outcome"
    assert settled.record.incarnation == before.incarnation + 1
    evidence = settled.record.outcome["evidence"]
    [effect] = [e for e in evidence if "effect_id" in e]
    assert effect["effect_class"] == "mutation"
    assert before.intents[effect["effect_id"]]["tool_name"] == "transfer"
    with pytest.raises(Error) as exc:
        replacement_for(settled, wall_clock=trio.current_time)
    assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
    # the partitioned old host, at its next commit (a valid one of its own)
    late, events = transition(before, Cancel(at=trio.current_time()))
    with pytest.raises(Error) as fenced:
        await store.commit(
            RUN,
            incarnation=before.incarnation,
            expected_revision=before.revision,
            record=late,
            events=events,
        )
    assert fenced.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert hang.calls == 1
    again = await settle_run(store, RUN, wall_clock=trio.current_time)
    assert not again.committed
    assert again.record == settled.record


async def test_park_uncertain_fences_and_leaves_the_run_for_a_reconciler(
    tmp_path: Path,
) -> None:
    """With ``park_uncertain``, a run with a mutation in flight is fenced
    and classified after the fence, and nothing else is committed: it stays
    for a reconciler, and the old host can commit nothing more."""
    hang = RecordingBackend(lambda _op: trio.sleep_forever())
    provider = S([S.tool_calls(("c1", "transfer", {})), S.text("never")])

    def dispatched(record: Any) -> bool:
        return any(i.get("tool_name") == "transfer" for i in record.intents.values())

    async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        await crash_while(store, provider, [make_tool("transfer", hang)], dispatched)
        before = await store.load(RUN)
        assert before is not None
        parked = await settle_run(store, RUN, park_uncertain=True, wall_clock=trio.current_time)
        assert not parked.committed
        assert parked.fenced == before.incarnation
        assert parked.report.uncertain_effects
        stored = await store.load(RUN)
        assert stored is not None
        assert (stored.state, stored.incarnation) == ("running", before.incarnation + 1)
        assert stored.intents == before.intents


async def test_nothing_in_flight_settles_cancelled_and_continues_from_the_transcript(
    tmp_path: Path,
) -> None:
    """A run whose host died during a (read-only) provider attempt after a
    completed tool: settled ``cancelled`` (stop reason ``recovered``), and
    its replacement carries the committed transcript, the work left and the
    time left; it runs to completion without calling the tool again."""
    async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        lookup = await crash_in_second_attempt(store)
        await _continued(store, [make_tool("lookup", lookup, read_only=True)], lookup)


async def _continued(store: Any, tools: Any, lookup: Any) -> None:
    settled = await settle_run(store, RUN, wall_clock=trio.current_time)
    assert (settled.record.state, settled.record.stop_reason) == ("cancelled", "recovered")
    replacement = replacement_for(settled, wall_clock=trio.current_time)
    assert replacement.work == 10 - settled.record.budget.used
    assert 0 < replacement.run_timeout <= 600.0
    assert any(m.get("role") == "tool" for m in replacement.messages)
    registry = ToolRegistry(tools)
    async with open_conversation(
        "run-1:2",
        store=store,
        provider=S([S.text("the answer is 42")]),
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id="run-1:2"),
        messages=replacement.messages,
        work=replacement.work,
        run_timeout=replacement.run_timeout,
    ) as conversation:
        await conversation.prompt("go on")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    assert lookup.calls == 1  # never replayed


async def test_settle_refuses_what_it_cannot_settle(autojump_clock: MockClock) -> None:
    store = MemoryStore()
    with pytest.raises(Error) as missing:
        await settle_run(store, "nobody")
    assert missing.value.error_class is ErrorClass.NOT_FOUND


def test_runs_recover_continue_resumes_the_run(tmp_path: Path) -> None:
    """``backplane runs recover --continue``: the crashed run (its host
    died in a provider attempt) is fenced and resumed where it stopped
    with an app's agent, to completion; the tool the crashed run completed
    is not run again."""
    import subprocess
    import sys

    db = tmp_path / "runs.sqlite3"

    async def crash() -> Any:
        async with SQLiteStore(db) as store:
            # the real wall clock: the command line reads the deadline with it
            return await crash_in_second_attempt(store, wall_clock=time.time)

    lookup = trio.run(crash)
    result = subprocess.run(
        [sys.executable, "-m", "trio_backplane.cli", "runs", "recover", f"sqlite:///{db}",
         RUN, "--continue", "--app", "tests.fleet.app", "--agent", "resumable"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"continued: {RUN} resumed where it stopped, completed" in result.stdout

    async def stored() -> Any:
        async with SQLiteStore(db) as store:
            return await store.load(RUN)

    resumed = trio.run(stored)
    assert (resumed.state, resumed.incarnation) == ("completed", 2)
    assert resumed.transcript[-1]["content"] == "finished after takeover"
    assert [m["role"] for m in resumed.transcript] == ["user", "assistant", "tool", "assistant"]
    assert lookup.calls == 1


class Overtaken(Delegating):
    """A store where a rival recoverer fences the run again right after ours
    did, before our resumed incarnation commits anything."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.ours: int | None = None

    async def fence(self, run_id: str, *, incarnation: int) -> Any:
        self.ours = incarnation
        return await self.inner.fence(run_id, incarnation=incarnation)

    async def commit(self, run_id: str, **kwargs: Any) -> Any:
        if self.ours is not None:
            rival, self.ours = self.ours + 1, None
            await self.inner.fence(run_id, incarnation=rival)
        return await self.inner.commit(run_id, **kwargs)


async def test_continue_run_leaves_a_run_a_newer_owner_fenced(tmp_path: Path) -> None:
    """A resume refused because a newer owner fenced the run in between is
    not a run that cannot be resumed: ``continue_run`` raises the conflict
    and neither settles the run over the owner's fence nor replaces it."""
    from tests.fleet.app import resumable
    from trio_backplane.fleet import continue_run

    async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        await crash_in_second_attempt(store, wall_clock=time.time)
        with pytest.raises(Error) as refused:
            await continue_run(Overtaken(store), RUN, resumable(RUN))
        assert refused.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert refused.value.details.get("reason") != "not_resumable"
        record = await store.load(RUN)
        assert record is not None
        assert (record.state, record.incarnation) == ("running", 3)  # the rival's fence
        assert [r.run_id for r in await store.list_runs()] == [RUN]  # no replacement


async def test_a_run_that_cannot_resume_is_refused_as_not_resumable() -> None:
    """The runtime's own refusal to resume names itself (``not_resumable``):
    the one refusal a takeover answers by settling and replacing."""
    store = MemoryStore()
    record = await _completed_run(store)
    registry = ToolRegistry([])
    with pytest.raises(Error) as refused:
        async with open_conversation(
            RUN,
            store=store,
            provider=S([S.text("x")]),
            registry=registry,
            authority=Authority.for_registry(registry, caller="host", run_id=RUN),
            resume=record,
        ):
            pass
    assert refused.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert refused.value.details["reason"] == "not_resumable"


async def _completed_run(store: Any) -> Any:
    registry = ToolRegistry([])
    async with open_conversation(
        RUN,
        store=store,
        provider=S([S.text("done")]),
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id=RUN),
    ) as conversation:
        await conversation.prompt("go")
        await conversation.wait_settled()
    return await store.load(RUN)
