"""Issue 6 properties under random interleavings (INT, PUB, NEST; EVT-11, EVT-14).

Hypothesis draws provider batches of calls to a tool that asks a person
(``ask``), an approval-gated tool (``gated``), a catalog-discovering tool
(``discover``, which stages the next revision and may fail) and tools that a
publication adds (``found_<revision>``); a host answering each interaction
after a random delay with a random answer (or never); an optional
cancellation time; and run/effect timeouts.  Each scenario runs under
``trio.run(..., clock=MockClock(autojump_threshold=0))`` on ``MemoryStore``
and checks that:

* the stored run deadline moved by exactly the time spent waiting (INT-07);
* no answer is delivered after ``cancel()`` (INT-11, INT-12);
* no approval dispatches arguments whose digest differs from the approved
  one, and only the exact answer ``"approved"`` dispatches (INT-02, INT-15);
* a publication is visible to the next provider request and to no call of
  its own batch (PUB-03, PUB-04, PUB-05, EVT-14);
* receipts are idempotent (PUB-06).
"""

from __future__ import annotations

import itertools
from typing import Any

import trio
from hypothesis import given, note
from hypothesis import strategies as st
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.runtime import Event
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import ToolRegistry, ToolResult, arguments_digest

from .support import RUN_ID, Host, RecordingBackend, make_tool, publication, run_with_host

S = ScriptedProvider
DELAYS = (0.5, 1.0, 3.0, 7.0, 20.0, 45.0)
ANSWERS = ("approved", "approved", "no", True, "Approved")


class World:
    """The tools of one scenario and what they observed."""

    def __init__(self) -> None:
        self.cancel_called = False
        self.violations: list[str] = []
        self.receipts: list[tuple[Any, Any]] = []
        self.operations: list[Any] = []
        self.gated_operations: list[Any] = []
        self.answers: list[Any] = []
        self.base = [
            make_tool("ask", RecordingBackend(self.ask), read_only=True),
            make_tool("gated", RecordingBackend(self.gated), requires_approval=True),
            make_tool("discover", RecordingBackend(self.discover), read_only=True),
        ]
        self.found = {
            revision: make_tool(
                f"found_{revision}", RecordingBackend(self.found_tool), read_only=True
            )
            for revision in range(2, 8)
        }

    def catalog(self, revision: int) -> list[Any]:
        return [*self.base, *(self.found[r] for r in range(2, revision + 1))]

    async def ask(self, operation: Any) -> ToolResult:
        self.operations.append(operation)
        answer = await operation.context.interact({"kind": "question"})
        if self.cancel_called:
            self.violations.append(f"answer {answer!r} delivered after cancel()")
        self.answers.append(answer)
        await trio.sleep(float(operation.arguments.get("sleep", 0.0)))
        return ToolResult(f"answer {answer!r}")

    async def gated(self, operation: Any) -> ToolResult:
        self.operations.append(operation)
        self.gated_operations.append(operation)
        return ToolResult("gated ran")

    async def found_tool(self, operation: Any) -> ToolResult:
        self.operations.append(operation)
        return ToolResult("found ran")

    async def discover(self, operation: Any) -> ToolResult:
        self.operations.append(operation)
        revision = operation.catalog_revision
        if revision + 1 in self.found:
            pub = publication(
                f"pub-{operation.invocation_id}",
                self.catalog(revision + 1),
                expected_revision=revision,
            )
            try:
                first = operation.context.stage_catalog(pub)
                second = operation.context.stage_catalog(pub)
            except Error:
                pass  # another publication is pending in this batch (PUB-08)
            else:
                self.receipts.append((first, second))
        if operation.arguments.get("fail"):
            return ToolResult("discovery failed", is_error=True)
        return ToolResult("discovered")


@st.composite
def call(draw: st.DrawFn, index: int) -> tuple[str, str, Any]:
    kind = draw(st.sampled_from(("ask", "ask", "gated", "gated", "discover", "discover", "found")))
    if kind == "ask":
        return f"c{index}", "ask", {"sleep": draw(st.sampled_from((0.0, 2.0, 6.0)))}
    if kind == "gated":
        return (
            f"c{index}",
            "gated",
            {"n": draw(st.integers(0, 3)), "tag": draw(st.text(max_size=3))},
        )
    if kind == "discover":
        return f"c{index}", "discover", {"fail": draw(st.booleans())}
    return f"c{index}", f"found_{draw(st.integers(2, 4))}", {}


@st.composite
def scenario(draw: st.DrawFn) -> dict[str, Any]:
    batches = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    responses = []
    index = 0
    for size in batches:
        calls = []
        for _ in range(size):
            calls.append(draw(call(index)))
            index += 1
        responses.append(S.tool_calls(*calls))
    responses.append(S.text("done"))
    answers = draw(
        st.lists(
            st.one_of(st.none(), st.tuples(st.sampled_from(DELAYS), st.sampled_from(ANSWERS))),
            min_size=12,
            max_size=12,
        )
    )
    cancel_at = draw(st.one_of(st.none(), st.sampled_from((1.0, 5.0, 15.0, 40.0))))
    if cancel_at is None:  # an unanswered interaction without a cancel waits forever
        answers = [a if a is not None else (60.0, "no") for a in answers]
    return {
        "responses": responses,
        "answers": answers,
        "cancel_at": cancel_at,
        "run_timeout": draw(st.sampled_from((10.0, 30.0, 120.0))),
        "effect_timeout": draw(st.sampled_from((5.0, 30.0))),
    }


async def play(s: dict[str, Any]) -> None:
    world = World()
    provider = S(s["responses"])
    answers = list(s["answers"])
    answered: list[tuple[str, float, Any]] = []  # (interaction id, delay, answer)

    def policy(event: Event) -> tuple[float, Any] | None:
        choice = answers.pop(0) if answers else (1.0, "approved")
        if choice is not None:
            answered.append((event.payload["interaction_id"], *choice))
        return choice

    async def during(conversation: Any, host: Host) -> None:
        if s["cancel_at"] is None:
            return
        await trio.sleep(s["cancel_at"])
        world.cancel_called = True
        try:
            await conversation.cancel()
        except Error:
            world.cancel_called = False  # the run had already ended

    with trio.fail_after(100_000):  # mock time: a hang fails instead of blocking
        finished, host = await run_with_host(
            provider,
            world.base,
            policy,
            during=during,
            run_timeout=s["run_timeout"],
            effect_timeout=s["effect_timeout"],
            work=1000,
        )
    note(f"events: {finished.types()}")
    note(f"host errors: {host.errors}")
    assert world.violations == []

    # the run deadline moved by exactly the time spent waiting (INT-07)
    delays = {interaction_id: delay for interaction_id, delay, _ in answered}
    resolved = [interaction_id for _, interaction_id in host.resolved]
    records = finished.store.records
    increases = [
        b.deadline - a.deadline
        for a, b in itertools.pairwise(records)
        if a.deadline is not None and b.deadline is not None and b.deadline != a.deadline
    ]
    assert all(increase > 0 for increase in increases)
    extra = list(increases)
    for interaction_id in resolved:
        extra.remove(delays[interaction_id])  # each wait moved the deadline by itself
    # only a resolve that lost its race with cancel() after committing adds more
    lost = [e for e in host.errors if e.error_class is ErrorClass.CANCELLED]
    assert len(extra) <= len(lost)
    assert all(increase in delays.values() for increase in extra)
    admitted = next(r for r in records if r.deadline is not None)
    assert finished.record.deadline == admitted.deadline + sum(increases)

    # no approval dispatches arguments other than the approved ones (INT-02, INT-15)
    requests = {
        e.payload["interaction_id"]: e.payload["request"] for e in host.of("interaction_requested")
    }
    approvals = {
        request["operation"]["tool_call_id"]: (interaction_id, request["operation"])
        for interaction_id, request in requests.items()
        if request.get("kind") == "permission"
    }
    answer_of = {interaction_id: answer for interaction_id, _, answer in answered}
    for operation in world.gated_operations:
        interaction_id, approved = approvals[operation.tool_call_id]
        assert interaction_id in resolved
        assert answer_of[interaction_id] == "approved"
        assert arguments_digest(operation.arguments) == approved["arguments_digest"]

    # a publication is visible to the next request and to no call of its batch
    revision_of_attempt = {r.attempt_id: r.catalog_revision for r in provider.requests}
    for operation in world.operations:
        assert operation.catalog_revision == revision_of_attempt[operation.attempt_id]
        if operation.tool_name.startswith("found_"):
            assert int(operation.tool_name.removeprefix("found_")) <= operation.catalog_revision
    published = [e.payload["catalog_revision"] for e in finished.of("catalog_published")]
    for request in provider.requests:
        expected = ToolRegistry(world.catalog(request.catalog_revision))
        assert [t.name for t in request.tools] == [d.name for d in expected]
    later = [r.catalog_revision for r in provider.requests]
    for revision in published:
        assert revision in later  # the next request carries it, if there is one
    assert later == sorted(later)
    position = 0
    for event in finished.events:
        if event.type == "response_started":
            position += 1
        if event.type == "catalog_published" and position < len(provider.requests):
            assert provider.requests[position].catalog_revision == event.payload["catalog_revision"]

    # receipts are idempotent (PUB-06)
    for first, second in world.receipts:
        assert first == second
    for receipt in finished.snapshot.receipts:
        assert receipt.status in ("staged", "published")
    assert [r.catalog_revision for r in finished.snapshot.receipts] == sorted(
        (r.catalog_revision for r in finished.snapshot.receipts), reverse=True
    )
    assert finished.snapshot.catalog_revision == (published[-1] if published else 1)
    assert finished.record.run_id == RUN_ID


@given(scenario())
def test_issue6_interleavings(s: dict[str, Any]) -> None:
    """INT-02, INT-07, INT-11, INT-12, INT-15, PUB-03..06, EVT-14: random
    interleavings of interactions, approvals, resolutions, cancellations,
    deadlines and publications keep the issue 6 properties."""
    trio.run(play, s, clock=MockClock(autojump_threshold=0))
