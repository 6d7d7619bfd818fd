"""Merged commits: several decided kernel commands in one store commit.

The turn loop commits a provider response with the first intent of its tool
batch, and a batch's last tool message with the next attempt's intent (TOOL-08,
TOOL-25 and rule 3 still hold: a result's commit and its transcript
projection stay apart).  These tests pin the promises of that mechanism:
one revision per store commit, every command's kernel event in the log, a
step the kernel refuses leaving the earlier ones committed alone, and events
published only after the commit that holds their command.
"""

from __future__ import annotations

from typing import Any

from trio.testing import MockClock

from trio_backplane.kernel import RunRecord, thaw
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import ToolResult

from .support import Delegating, RecordingBackend, make_tool, run_to_settled


class Recording(Delegating):
    """A store wrapper keeping each commit's kernel commands and record."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.commits: list[tuple[list[str], RunRecord, int]] = []

    async def commit(self, run_id: str, **kwargs: Any) -> Any:
        kinds = [e.type.removeprefix("run.") for e in kwargs["events"]]
        receipt = await self.inner.commit(run_id, **kwargs)
        self.commits.append((kinds, kwargs["record"], kwargs["expected_revision"]))
        return receipt

    def kinds(self) -> list[list[str]]:
        return [kinds for kinds, _record, _expected in self.commits]


def steps(n: int) -> ScriptedProvider:
    return ScriptedProvider(
        [
            *(ScriptedProvider.tool_calls((f"c{i}", "t", {})) for i in range(n)),
            ScriptedProvider.text("done"),
        ]
    )


async def test_a_tool_step_is_two_store_commits(autojump_clock: MockClock) -> None:
    """TOOL-08/TOOL-25 with merging: per tool step, the response rides with the
    intent, and the result (whose command carries its tool message: durable
    no later than the message showing it) rides with the next attempt; each
    store commit raises the revision by exactly one."""
    counts = []
    for n in (2, 3):
        store = Recording()
        finished = await run_to_settled(
            steps(n), [make_tool("t", RecordingBackend(ToolResult("ok")))], store=store
        )
        assert finished.record.state == "completed"
        counts.append(len(store.commits))
        for _kinds, record, expected in store.commits:
            assert record.revision == expected + 1
    assert counts[1] - counts[0] == 2
    kinds = store.kinds()
    assert ["provider_completed", "tool_invoked"] in kinds
    assert ["tool_completed", "provider_started"] in kinds
    # the stored log holds every command's event, one sequence each
    log = await store.events("run-1")
    assert [e.type.removeprefix("run.") for e in log] == [k for ks in kinds for k in ks]
    assert [e.sequence for e in log] == list(range(1, len(log) + 1))


async def test_a_refused_attempt_leaves_the_carried_tool_message_committed(
    autojump_clock: MockClock,
) -> None:
    """KER-13 through the engine: with work=2 the step's tool runs, then the next
    attempt's reservation is refused; the tool message carried with that attempt
    is committed on its own first (its tool_completed event published), and
    the turn fails budget_exceeded."""
    store = Recording()
    backend = RecordingBackend(ToolResult("ok"))
    finished = await run_to_settled(steps(2), [make_tool("t", backend)], store=store, work=2)

    assert backend.calls == 1
    assert finished.record.state == "failed"
    assert finished.record.outcome is not None
    assert finished.record.outcome["error"]["class"] == "budget_exceeded"
    kinds = store.kinds()
    assert ["conversation_updated"] in kinds
    assert ["conversation_updated", "provider_started"] not in kinds
    roles = [m["role"] for m in finished.messages]
    assert roles == ["user", "assistant", "tool"]
    [completed] = finished.of("tool_completed")
    assert thaw(completed.payload["message"])["tool_call_id"] == "c0"
    # the refused reservation left no trace: one provider reservation, one tool
    assert finished.record.budget.used == 2


async def test_a_refused_tool_is_answered_in_the_response_commit(
    autojump_clock: MockClock,
) -> None:
    """TOOL-01 with merging: an unknown tool's error message is committed with
    the response that asked for it, and response_completed precedes
    tool_completed, each after that commit."""
    store = Recording()
    provider = ScriptedProvider(
        [ScriptedProvider.tool_calls(("c1", "missing", {})), ScriptedProvider.text("done")]
    )
    finished = await run_to_settled(provider, [], store=store)
    assert finished.record.state == "completed"
    merged = [
        (kinds, record)
        for kinds, record, _e in store.commits
        if kinds[:1] == ["provider_completed"] and len(kinds) > 1
    ]
    assert merged
    kinds, record = merged[0]
    assert kinds == ["provider_completed", "conversation_updated"]
    last = thaw(record.transcript)[-1]
    assert last["role"] == "tool"
    assert last["result"]["is_error"] is True
    types = finished.types()
    assert types.index("response_completed") < types.index("tool_completed")
