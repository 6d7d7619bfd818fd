"""The collaboration manager's behaviours (AGT-01..08) over real child
conversations, driven through its API."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.agents.support import PARENT, FailingFor, S, child_tools, factory, grants, manager
from trio_backplane import Error, ErrorClass
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Hang


def hang() -> list[Any]:
    """A run script whose provider never answers."""
    return [[Hang()]]


def done(text: str = "done") -> list[Any]:
    """A run script: one text answer."""
    return [S.text(text)]


def searching(then: str = "found") -> list[Any]:
    """A run script: one search, then a text answer."""
    return [S.tool_calls(("c1", "search", {})), S.text(then)]


async def settled(agents: Any, *names: str) -> None:
    """Wait (mock time) until each named agent's run has settled."""
    with trio.fail_after(600):
        while any(agents.resolve("/root", n).status in ("pending_init", "running") for n in names):
            await trio.sleep(0.01)


async def test_agt_01_closing_twice_is_idempotent_and_peers_keep_running(
    autojump_clock: MockClock,
) -> None:
    """AGT-01: closing the same agent twice is idempotent; an unrelated
    peer keeps running."""
    options, _ = factory({"a": [hang()], "b": [hang()]})
    agents = manager(options)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "work")
        b = await agents.spawn(PARENT, "b", "work")
        first = await agents.close(a)
        second = await agents.close(a)
        assert [c.status for c in first] == [c.status for c in second] == ["confirmed"]
        assert a.status == "shutdown"
        assert b.status == "running"
        assert a.snapshot is not None
        assert a.snapshot[2].run.terminal  # cancelled mid-attempt: unknown_outcome
    assert b.status == "shutdown"  # the block closed it


async def test_agt_02_a_spawn_whose_first_commit_fails_keeps_nothing(
    autojump_clock: MockClock,
) -> None:
    """AGT-02: a child whose store fails before its first prompt is admitted
    never ran: the spawn raises ``storage_failed`` and no agent is kept."""
    options, _ = factory({"doomed": [done()]})
    agents = manager(options, store=FailingFor(MemoryStore(), "doomed"))
    async with agents.open():
        with pytest.raises(Error) as started:
            await agents.spawn(PARENT, "doomed", "work")
        assert started.value.error_class is ErrorClass.STORAGE_FAILED
        assert agents.agents() == []


async def test_agt_02_closing_a_dead_conversation_is_unknown_outcome_every_time(
    autojump_clock: MockClock,
) -> None:
    """AGT-02: an agent whose conversation died (its store failed) cannot be
    closed confirmed: ``unknown_outcome``, and again on retry, without a
    fabricated closure; the block that owns it ends ``unknown_outcome`` too."""
    options, _ = factory({"doomed": [searching()]})
    store = FailingFor(MemoryStore(), "never")
    agents = manager(options, store=store)
    errors: list[Error] = []

    async def body() -> None:
        async with agents.open():
            doomed = await agents.spawn(PARENT, "doomed", "work")
            store.marker = "doomed"  # its next commit fails: storage_failed
            await settled(agents, "doomed")
            for _ in range(2):
                try:
                    await agents.close(doomed)
                except Error as error:
                    errors.append(error)
                assert doomed.closure not in (None, "confirmed")
                assert doomed.public_status() == {"unknown_outcome": doomed.closure}

    with pytest.raises(Error) as exc:
        await body()
    assert [e.error_class for e in errors] == [ErrorClass.UNKNOWN_OUTCOME] * 2
    assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME


async def test_agt_03_an_unresolved_mutation_is_never_continued(
    autojump_clock: MockClock,
) -> None:
    """AGT-03: an agent whose run ended ``unknown_outcome`` (a mutating tool
    raised) is not continued or replaced, and no new run starts."""
    options, asked = factory({"a": [[S.tool_calls(("c1", "explode", {}))], done()]})
    store = MemoryStore()
    agents = manager(options, store=store)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "work")
        await settled(agents, "a")
        assert a.snapshot is not None
        assert a.snapshot[2].run.state == "unknown_outcome"
        with pytest.raises(Error) as exc:
            await agents.replace(PARENT, a, "again")
        assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
        assert a.run_id == "/root/a:1"
        assert await store.load("/root/a:2") is None
        assert len(asked) == 1


async def test_agt_04_a_replacement_is_a_fresh_run_fed_the_transcript(
    autojump_clock: MockClock,
) -> None:
    """AGT-04: following up a completed agent keeps its name, uses a fresh
    run id, and that run starts from the committed messages (tool results
    included) without the original prompt sent again."""
    options, _ = factory({"a": [searching(), done("more")]})
    store = MemoryStore()
    agents = manager(options, store=store)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "find it")
        await settled(agents, "a")
        before = a.snapshot
        assert before is not None
        await agents.replace(PARENT, a, "and more")
        assert (a.name, a.run_id) == ("/root/a", "/root/a:2")
        await settled(agents, "a")
    second = await store.load("/root/a:2")
    assert second is not None
    messages = list(second.conversation["messages"])
    earlier = list(before[2].messages)
    assert messages[: len(earlier)] == earlier
    prompts = [m for m in messages if m.get("role") == "user"]
    assert [p["content"] for p in prompts] == ["find it", "and more"]
    assert any(m.get("role") == "tool" for m in messages)


async def test_agt_05_quota_and_time_carry_forward_never_granted_again(
    autojump_clock: MockClock,
) -> None:
    """AGT-05: a replacement gets only the work and time left; an agent with
    none left raises ``budget_exceeded`` (or ``timeout``), and closing or
    following up grants nothing new."""
    options, asked = factory({"a": [searching(), done()]}, work=3)
    store = MemoryStore()
    agents = manager(options, store=store)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "work")
        await settled(agents, "a")
        assert a.used == 3  # two provider attempts and one tool
        for _ in range(2):
            with pytest.raises(Error) as exc:
                await agents.replace(PARENT, a, "more")
            assert exc.value.error_class is ErrorClass.BUDGET_EXCEEDED
            await agents.close(a)
        assert len(asked) == 1

    options, _ = factory({"b": [done(), done()]}, work=10, run_timeout=50.0)
    store = MemoryStore()
    agents = manager(options, store=store)
    async with agents.open():
        b = await agents.spawn(PARENT, "b", "work")
        await settled(agents, "b")
        await agents.replace(PARENT, b, "more")
        second = await store.load("/root/b:2")
        assert second is not None
        assert second.budget.quota == 10 - 1
        await settled(agents, "b")
        await trio.sleep(60)
        with pytest.raises(Error) as late:
            await agents.replace(PARENT, b, "again")
        assert late.value.error_class in (ErrorClass.TIMEOUT, ErrorClass.UNKNOWN_OUTCOME)


async def test_agt_06_authority_never_widens(autojump_clock: MockClock) -> None:
    """AGT-06: a child asking for a grant its parent lacks is refused with
    ``forbidden`` and nothing starts; a replacement may not exceed the
    prior child's grants either."""
    tools = child_tools()
    narrow = grants(tools[:1])  # the parent may only search

    options, _ = factory({"a": [done()]})
    agents = manager(options, parent_authority=narrow)
    async with agents.open():
        with pytest.raises(Error) as exc:
            await agents.spawn(PARENT, "a", "work")
        assert exc.value.error_class is ErrorClass.FORBIDDEN
        assert agents.agents() == []

    def only_search_first(request: Any) -> list[Any]:
        return child_tools()[:1] if request.kind == "spawn" else child_tools()

    options, _ = factory({"b": [done(), done()]}, tools=only_search_first)
    agents = manager(options)
    async with agents.open():
        b = await agents.spawn(PARENT, "b", "work")
        await settled(agents, "b")
        with pytest.raises(Error) as wider:
            await agents.replace(PARENT, b, "more")
        assert wider.value.error_class is ErrorClass.FORBIDDEN
        assert b.authority.grants == {"search"}
        assert b.run_id == "/root/b:1"


async def test_agt_07_snapshots_are_tagged_and_a_stale_one_is_refused(
    autojump_clock: MockClock,
) -> None:
    """AGT-07: the settled snapshot is tagged with its run and incarnation;
    a replacement that fails once its new run id is taken keeps it, and
    reusing it for the agent's newer run raises ``unknown_outcome``; a
    successful replacement clears it."""
    store = MemoryStore()
    options, _ = factory({"a": [done(), done()], "b": [done(), done()]})
    agents = manager(options, store=store)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "work")
        b = await agents.spawn(PARENT, "b", "work")
        await settled(agents, "a", "b")
        assert a.snapshot is not None
        assert a.snapshot[:2] == ("/root/a:1", 1)
        # another writer took a's next run id: its replacement fails to start
        from trio_backplane.kernel import RunRecord

        await store.create(RunRecord.new("/root/a:2", work=1))
        with pytest.raises(Error):
            await agents.replace(PARENT, a, "more")
        assert a.run_id == "/root/a:2"
        assert a.snapshot is not None
        assert a.snapshot[0] == "/root/a:1"  # kept as evidence
        with pytest.raises(Error) as stale:
            await agents.replace(PARENT, a, "more")
        assert stale.value.error_class is ErrorClass.UNKNOWN_OUTCOME

        await agents.replace(PARENT, b, "more")
        assert b.snapshot is None or b.snapshot[0] == "/root/b:2"


async def test_agt_08_spawning_past_max_agents_is_refused(autojump_clock: MockClock) -> None:
    """AGT-08: past ``max_agents`` live agents, ``resource_conflict`` "agent
    limit reached"; a closed agent no longer counts."""
    options, _ = factory({"a": [hang()], "b": [hang()], "c": [hang()], "d": [hang()]})
    agents = manager(options, max_agents=2)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "work")
        await agents.spawn(PARENT, "b", "work")
        with pytest.raises(Error) as exc:
            await agents.spawn(PARENT, "c", "work")
        assert (exc.value.error_class, exc.value.message) == (
            ErrorClass.RESOURCE_CONFLICT,
            "agent limit reached",
        )
        await agents.close(a)
        await agents.spawn(PARENT, "d", "work")


async def test_callers_are_authenticated_and_names_checked(autojump_clock: MockClock) -> None:
    options, _ = factory({"a": [hang()]})
    agents = manager(options)
    async with agents.open():
        with pytest.raises(Error) as exc:
            await agents.spawn("somebody-else", "a", "work")
        assert exc.value.error_class is ErrorClass.FORBIDDEN
        with pytest.raises(Error) as bad:
            await agents.spawn(PARENT, "Bad-Name", "work")
        assert bad.value.error_class is ErrorClass.VALIDATION
        a = await agents.spawn(PARENT, "a", "work")
        with pytest.raises(Error) as twice:
            await agents.spawn(PARENT, "a", "work")
        assert twice.value.error_class is ErrorClass.VALIDATION
        # the child's own run is a caller: its agents are named under it
        assert agents.caller(a.run_id)[0] == "/root/a"


async def test_agt_01_closure_and_interruption_act_on_the_tree(autojump_clock: MockClock) -> None:
    """AGT-01: an agent's own children are named under it; interrupting or
    closing it reaches them (deepest first) and never its peers."""
    options, _ = factory({"a": [hang()], "helper": [hang()], "peer": [hang()]})
    agents = manager(options)
    async with agents.open():
        a = await agents.spawn(PARENT, "a", "work")
        helper = await agents.spawn(a.run_id, "helper", "help a")
        peer = await agents.spawn(PARENT, "peer", "work")
        assert helper.name == "/root/a/helper"
        assert agents.resolve(a.name, "helper") is helper
        for target in ("/root/peer", "/root"):
            with pytest.raises(Error) as outside:
                agents.resolve(helper.name, target)
            assert outside.value.error_class is ErrorClass.FORBIDDEN
        with pytest.raises(Error) as unknown:
            agents.resolve(helper.name, "../peer")
        assert unknown.value.error_class is ErrorClass.NOT_FOUND
        assert [x.name for x in agents.agents("/root/a/")] == ["/root/a/helper"]
        await agents.interrupt(a)
        assert (a.status, helper.status, peer.status) == ("interrupted", "interrupted", "running")
        closed = await agents.close(a)
        assert [c.id for c in closed] == ["/root/a/helper", "/root/a"]
        assert peer.status == "running"
        # a child's run that has ended can no longer call the manager
        with pytest.raises(Error) as exc:
            await agents.spawn(a.run_id, "late", "work")
        assert exc.value.error_class is ErrorClass.FORBIDDEN
