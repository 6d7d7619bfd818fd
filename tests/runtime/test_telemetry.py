"""OpenTelemetry spans and metrics of conversations, read back from the
SDK's in-memory exporter and reader: the span tree, its statuses and key
attributes, the metrics, a resumed run's link, and no secret anywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.runtime.support import RecordingBackend, make_tool
from trio_backplane import Authority, Error, ErrorClass, ToolRegistry, open_conversation
from trio_backplane.runtime import Telemetry, Usage
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import ToolResult

S = ScriptedProvider
RUN = "run-1"
CANARY = "canary-7f3a9c-do-not-leak"


class Exported:
    """An SDK tracer and meter provider writing to memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def telemetry(self, **options: Any) -> Telemetry:
        return Telemetry(
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            agent_name="tester",
            **options,
        )


@pytest.fixture
def exported() -> Iterator[Exported]:
    found = Exported()
    yield found
    found.tracer_provider.shutdown()
    found.meter_provider.shutdown()


class _Outer:
    """A tool that calls another (``inner``) through its context."""

    async def execute(self, operation: Any) -> ToolResult:
        inner = await operation.context.nested_dispatch("inner", {})
        return ToolResult(f"outer saw {inner.content}")


def _tools() -> list[Any]:
    return [
        make_tool("lookup", RecordingBackend(ToolResult("42")), read_only=True),
        make_tool("deploy", RecordingBackend(ToolResult("deployed")), requires_approval=True),
        make_tool("outer", _Outer()),
        make_tool("inner", RecordingBackend(ToolResult("in")), read_only=True),
    ]


async def _converse(provider: Any, tools: list[Any], telemetry: Telemetry, **more: Any) -> Any:
    """Run one prompt to its end, approving whatever is asked."""
    registry = ToolRegistry(tools)
    async with open_conversation(
        RUN,
        store=MemoryStore(),
        provider=provider,
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id=RUN),
        telemetry=telemetry,
        **more,
    ) as conversation:
        await conversation.prompt("go")
        while conversation.status().phase.value != "terminal":
            asked = conversation.status().pending_interaction
            if asked is not None:
                await conversation.resolve(asked["id"], "approved")
            await trio.sleep(0.01)
        return await conversation.wait_settled()


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


async def test_the_span_tree_of_two_calls_an_approval_and_a_nested_call(
    autojump_clock: Any, exported: Exported
) -> None:
    """One run: ``invoke_agent`` > ``turn`` > ``chat`` (three attempts),
    ``execute_tool`` for each call (``inner`` under ``outer``), the
    approval's ``await_human``; every ``commit`` under the run; all OK,
    with the ids and the GenAI names as attributes."""
    spans, reader, telemetry = exported.spans, exported.reader, exported.telemetry()
    provider = S(
        [
            S.tool_calls(("c1", "lookup", {}), ("c2", "deploy", {})),
            S.tool_calls(("c3", "outer", {})),
            S.text("done"),
        ]
    )
    snapshot = await _converse(provider, _tools(), telemetry)
    assert snapshot.run.state == "completed"
    named = _by_name(spans.get_finished_spans())
    [run] = named["invoke_agent tester"]
    [turn] = named["turn"]
    assert run.parent is None
    assert _parent(turn) == _id(run)
    assert len(named["chat"]) == 3
    assert {_parent(chat) for chat in named["chat"]} == {_id(turn)}
    tools = {span.attributes["gen_ai.tool.name"]: span for name, found in named.items()
             if name.startswith("execute_tool") for span in found}  # fmt: skip
    assert set(tools) == {"lookup", "deploy", "outer", "inner"}
    for name in ("lookup", "deploy", "outer"):
        assert _parent(tools[name]) == _id(turn), name
    assert _parent(tools["inner"]) == _id(tools["outer"])
    assert (
        tools["inner"].attributes["backplane.invocation.caller"]
        == (tools["outer"].attributes["backplane.invocation.id"])
    )
    assert tools["lookup"].attributes["gen_ai.tool.call.id"] == "c1"
    assert tools["lookup"].attributes["gen_ai.operation.name"] == "execute_tool"
    [wait] = named["await_human"]
    assert _parent(wait) == _id(turn)
    assert wait.attributes["backplane.interaction.answered"] is True
    assert wait.attributes["backplane.interaction.kind"] == "permission"
    assert named["commit"]
    assert {_parent(commit) for commit in named["commit"]} == {_id(run)}
    every = spans.get_finished_spans()
    assert all(span.status.status_code is not StatusCode.ERROR for span in every)
    assert {span.attributes["backplane.run.id"] for span in every} == {RUN}
    assert run.attributes["backplane.run.state"] == "completed"
    metrics = _metrics(reader)
    assert metrics["backplane.runs"] == [({"backplane.run.state": "completed"}, 1)]
    assert metrics["backplane.cleanups"] == [({"backplane.cleanup": "confirmed"}, 1)]
    assert len(metrics["gen_ai.execute_tool.duration"]) == 4  # one series a tool
    assert metrics["backplane.interactions.waiting"] == [({}, 0)]  # asked once, answered


async def test_a_cancelled_run_ends_its_open_spans(autojump_clock: Any, exported: Exported) -> None:
    """Cancelled while its tool runs: the tool's span ends failed
    (``cancelled``), the run's records the state, every span is ended."""
    spans, telemetry = exported.spans, exported.telemetry()
    hang = RecordingBackend(lambda _op: trio.sleep_forever())
    registry = ToolRegistry([make_tool("hang", hang)])
    async with open_conversation(
        RUN,
        store=MemoryStore(),
        provider=S([S.tool_calls(("c1", "hang", {}))]),
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id=RUN),
        telemetry=telemetry,
    ) as conversation:
        await conversation.prompt("go")
        while hang.calls == 0:
            await trio.sleep(0.01)
        await conversation.cancel()
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"  # a mutation cut mid-flight
    named = _by_name(spans.get_finished_spans())
    [tool] = named["execute_tool hang"]
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes["error.type"] == "cancelled"
    [run] = named["invoke_agent tester"]
    assert run.attributes["backplane.run.state"] == "unknown_outcome"
    assert run.status.status_code is StatusCode.ERROR
    assert named["turn"][0].end_time is not None


@pytest.mark.parametrize("how", ["cancelled", "released"])
async def test_a_run_that_stops_waiting_is_no_longer_counted_waiting(
    exported: Exported, how: str
) -> None:
    """Cancelled while it waits for an approval, or released (its
    incarnation fenced, the block left: a fleet worker handing the wait to
    another host): its ``await_human`` span ends and the waiting gauge
    comes back to zero.  (SQLite, to be fenced; on Trio's own clock: its
    commits run in a thread, and no deadline here is near.)"""
    telemetry = exported.telemetry()
    registry = ToolRegistry([make_tool("deploy", RecordingBackend(), requires_approval=True)])
    async with (
        SQLiteStore(":memory:") as store,
        open_conversation(
            RUN,
            store=store,
            provider=S([S.tool_calls(("c1", "deploy", {}))]),
            registry=registry,
            authority=Authority.for_registry(registry, caller="host", run_id=RUN),
            telemetry=telemetry,
        ) as conversation,
    ):
        await conversation.prompt("go")
        while conversation.status().pending_interaction is None:
            await trio.sleep(0.01)
        if how == "cancelled":
            await conversation.cancel()
            await conversation.wait_settled()
        else:
            await store.fence(RUN, incarnation=2)
    [wait] = _by_name(exported.spans.get_finished_spans())["await_human"]
    assert wait.end_time is not None
    assert _metrics(exported.reader)["backplane.interactions.waiting"] == [({}, 0)]


async def test_a_refused_call_has_a_failed_span_and_usage_is_recorded(
    autojump_clock: Any, exported: Exported
) -> None:
    """A call of an unknown tool gets a failed ``execute_tool`` span; each
    attempt's token usage is on its ``chat`` span and in the metrics."""
    spans, reader, telemetry = exported.spans, exported.reader, exported.telemetry()
    usage = {"input_tokens": 11, "output_tokens": 7}
    first = [Usage(usage), *S.tool_calls(("c1", "missing", {}))]
    provider = S([first, S.text("ok", usage=usage)])
    await _converse(provider, [], telemetry)
    named = _by_name(spans.get_finished_spans())
    [refused] = named["execute_tool missing"]
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.attributes["error.type"] == "not_found"
    chats = named["chat"]
    assert [chat.attributes["gen_ai.usage.input_tokens"] for chat in chats] == [11, 11]
    tokens = _metrics(reader)["gen_ai.client.token.usage"]
    assert {labels["gen_ai.token.type"] for labels, _ in tokens} == {"input", "output"}


async def test_no_secret_reaches_a_span_an_event_or_a_metric(
    autojump_clock: Any, exported: Exported
) -> None:
    """A canary in ``provider_context``, in a tool's ``backend_context`` (and
    quoted by the error that tool fails with) and in a quarantined tool's
    schema: in no attribute, event, status or metric, even with content
    captured."""
    spans, reader = exported.spans, exported.reader
    telemetry = exported.telemetry(capture_content=True)
    secret_tool = make_tool(
        "lookup", RecordingBackend(ToolResult("42")), backend_context={"token": CANARY}
    )
    hostile = make_tool(
        "hostile",
        RecordingBackend(ToolResult("never")),
        # another dialect: quarantined, its schema kept out of the catalog
        schema={
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "description": CANARY,
        },
    )
    failing = make_tool(
        "fails",
        RecordingBackend(Error(ErrorClass.EXECUTION_FAILURE, f"token {CANARY} was refused")),
        backend_context={"token": CANARY},
    )
    provider = S([S.tool_calls(("c1", "lookup", {"q": "x"}), ("c2", "fails", {})), S.text("done")])
    await _converse(
        provider,
        [secret_tool, hostile, failing],
        telemetry,
        provider_context={"api_key": CANARY},
        schema_admission="quarantine",
    )
    finished = spans.get_finished_spans()
    [failed] = [span for span in finished if span.name == "execute_tool fails"]
    assert failed.status.status_code is StatusCode.ERROR
    assert "[redacted]" in (failed.status.description or "")
    dumped = json.dumps(
        [
            {
                "name": span.name,
                "attributes": dict(span.attributes or {}),
                "events": [(e.name, dict(e.attributes or {})) for e in span.events],
                "status": span.status.description,
            }
            for span in finished
        ],
        default=str,
    )
    assert CANARY not in dumped
    assert CANARY not in json.dumps(_metrics(reader), default=str)


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Each metric's points: ``(attributes, value or count)``."""
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # a histogram: how many recorded
                    found.setdefault(metric.name, []).append((dict(point.attributes), value))
    return found


def test_without_telemetry_nothing_of_opentelemetry_is_imported() -> None:
    """A conversation opened without ``telemetry=`` and no SDK configured
    records nothing and imports nothing of OpenTelemetry."""
    code = """
import sys, trio
from trio_backplane import open_conversation
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.testing import ScriptedProvider as S

async def main():
    async with open_conversation("r", store=MemoryStore(), provider=S([S.text("hi")])) as c:
        await c.prompt("go")
        assert (await c.wait_settled()).run.state == "completed"

trio.run(main)
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


async def test_a_resumed_run_links_to_the_incarnation_before(
    exported: Exported, tmp_path: Any
) -> None:
    """A run whose host died waiting for approval, resumed on incarnation 2:
    its ``invoke_agent`` span links to incarnation 1's, whose trace the run
    kept."""
    from tests.runtime.test_resume import _crash, _pending, _resumed
    from trio_backplane.store import SQLiteStore

    telemetry = exported.telemetry()
    tools = [make_tool("deploy", RecordingBackend(ToolResult("ok")), requires_approval=True)]
    first = S([S.tool_calls(("c1", "deploy", {}))])
    async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        await _crash(store, first, tools, lambda r: bool(_pending(r)), telemetry=telemetry)
        async with await _resumed(store, S([S.text("done")]), tools, telemetry=telemetry) as c:
            while (question := c.status().pending_interaction) is None:
                await trio.sleep(0.01)
            await c.resolve(question["id"], "approved")
            assert (await c.wait_settled()).run.state == "completed"
    runs = _by_name(exported.spans.get_finished_spans())["invoke_agent tester"]
    one, two = sorted(runs, key=lambda span: span.attributes["backplane.run.incarnation"])
    assert two.attributes["backplane.run.incarnation"] == 2
    [link] = two.links
    assert link.context.trace_id == one.context.trace_id
    assert link.context.span_id == one.context.span_id


def test_a_globally_configured_sdk_is_used_without_telemetry_given() -> None:
    """With SDK providers set globally, a conversation opened without
    ``telemetry=`` records its spans there, through one ``Telemetry``
    shared by the conversations (one set of instruments)."""
    code = """
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from trio_backplane import open_conversation
from trio_backplane.runtime import Telemetry
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.testing import ScriptedProvider as S

spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)

async def main():
    for run in ("a", "b"):
        async with open_conversation(run, store=MemoryStore(), provider=S([S.text("hi")])) as c:
            await c.prompt("go")
            await c.wait_settled()

trio.run(main)
print(Telemetry.configured() is Telemetry.configured())
print(sorted({s.attributes["backplane.run.id"] for s in spans.get_finished_spans()}))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split("\n")[:2] == ["True", "['a', 'b']"]


def test_a_turn_started_again_is_one_span(exported: Exported) -> None:
    """Steering that arrives as a turn ends goes on in the same turn: its
    span is started once and ended once."""
    recorder = exported.telemetry().recorder(RUN, 1)
    recorder.run_started(None)
    recorder.turn_started("turn-1")
    recorder.chat_started("turn-1", "attempt-1", [])
    recorder.chat_ended("attempt-1", None, None)
    recorder.turn_started("turn-1")
    recorder.turn_ended("turn-1", None)
    recorder.run_ended("completed", None, work_used=1, cleanup="confirmed")
    named = _by_name(exported.spans.get_finished_spans())
    [turn], [chat] = named["turn"], named["chat"]
    assert _parent(chat) == _id(turn)  # the span its attempt nests in is the one exported
