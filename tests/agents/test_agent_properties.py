"""Hypothesis interleaves spawn, message, follow-up, replacement, interrupt,
close, child failures and the parent's cancellation: quota is never
exceeded, no child outlives the block, no authority widens."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st
from trio.testing import MockClock

from tests.agents.support import PARENT, S, child_tools, manager
from trio_backplane import Error, ErrorClass
from trio_backplane.agents import AgentRequest, ChildOptions
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Hang
from trio_backplane.tools import Authority, ToolRegistry

RUNS = {
    "done": lambda: [S.text("done")],
    "search": lambda: [S.tool_calls(("c1", "search", {})), S.text("found")],
    "write": lambda: [S.tool_calls(("c1", "write", {})), S.text("written")],
    "hang": lambda: [[Hang()]],
    "explode": lambda: [S.tool_calls(("c1", "explode", {})), S.text("never")],
    "fail": lambda: S.failure(Error(ErrorClass.EXECUTION_FAILURE, "provider down")),
}
NAMES = ("a", "b", "c")
OPS = ("spawn", "steer", "followup", "interrupt", "close", "replace", "pause")
#: every authority a child may get: prefixes of the child tools
TOOLSETS = (1, 1, 2, 2, 3)

Op = tuple[str, int]


def _fail_script(run: str) -> list[Any]:
    script = RUNS[run]()
    return [script] if run == "fail" else script


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    return {
        "ops": draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 2)), max_size=20)),
        "runs": {n: draw(st.lists(st.sampled_from(sorted(RUNS)), max_size=4)) for n in NAMES},
        "toolsets": draw(st.lists(st.sampled_from(TOOLSETS), min_size=12, max_size=12)),
        "work": draw(st.integers(1, 6)),
        "cancel_at": draw(st.one_of(st.none(), st.integers(0, 20))),
        "max_agents": draw(st.integers(1, 3)),
    }


class World:
    """The host side: child options from the drawn scripts and tool sets,
    and every authority each agent was given, in order."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        self.runs = {n: list(r) for n, r in scenario["runs"].items()}
        self.toolsets = list(scenario["toolsets"])
        self.work = scenario["work"]
        self.given: dict[str, list[frozenset[str]]] = {}

    def options(self, request: AgentRequest) -> ChildOptions:
        task = request.agent_name.rsplit("/", 1)[1]
        run = self.runs[task].pop(0) if self.runs[task] else "done"
        count = self.toolsets.pop(0) if self.toolsets else 1
        registry = ToolRegistry(child_tools()[:count])
        return ChildOptions(
            provider=S(_fail_script(run)),
            registry=registry,
            authority=Authority.for_registry(registry, caller="parent", run_id=request.run_id),
            work=self.work,
            run_timeout=100.0,
        )


async def _apply(agents: Any, op: Op) -> None:
    kind, index = op
    name = NAMES[index]
    if kind == "pause":
        await trio.sleep(1)
        return
    if kind == "spawn":
        await agents.spawn(PARENT, name, "work")
        return
    agent = agents.resolve("/root", name)
    if kind == "steer":
        await agents.running(agent).steer("hurry")
    elif kind == "followup" and agent.status == "running":
        await agents.running(agent).follow_up("then this")
    elif kind in ("followup", "replace"):
        await agents.replace(PARENT, agent, "again")
    elif kind == "interrupt":
        await agents.interrupt(agent)
    else:
        await agents.close(agent)


async def _scenario(scenario: dict[str, Any]) -> None:
    world = World(scenario)
    store = MemoryStore()
    parent = Authority.for_registry(child_tools()[:2], caller="host", run_id=PARENT)
    agents = manager(
        world.options, store=store, parent_authority=parent, max_agents=scenario["max_agents"]
    )
    history: dict[str, list[frozenset[str]]] = {}
    with trio.CancelScope() as block:
        async with agents.open():
            for step, op in enumerate(scenario["ops"]):
                if step == scenario["cancel_at"]:
                    block.cancel()
                    await trio.sleep(0)
                # a refusal is classed; its effects (none) are checked below
                with contextlib.suppress(Error):
                    await _apply(agents, op)
                for agent in agents.agents():
                    history.setdefault(agent.name, []).append(agent.authority.grants)
    for agent in agents.agents():
        # no child outlives the block: every run's task has left its conversation
        assert agent.done.is_set(), agent.name
        used = 0
        for sequence in range(1, agent.sequence + 1):
            record = await store.load(f"{agent.name}:{sequence}")
            if record is not None:
                used += record.budget.used
        assert used <= agent.quota == world.work, (agent.name, used)
        seen = history.get(agent.name, [agent.authority.grants])
        assert all(grants <= parent.grants for grants in seen)
        assert all(later <= earlier for earlier, later in itertools.pairwise(seen))


@given(scenarios())
def test_agt_interleavings_keep_quota_lifetime_and_authority(scenario: dict[str, Any]) -> None:
    """AGT-05, AGT-06, AGT-01: under any interleaving, the work one agent
    uses across all its runs stays within the quota it was spawned with, no
    child outlives the manager's block (cancelled or not), and an agent's
    authority never widens beyond its parent's or its own earlier one."""
    trio.run(_scenario, scenario, clock=MockClock(autojump_threshold=0))
