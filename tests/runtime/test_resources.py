"""Run-owned resource registries closed on every terminal path (RES-14, RES-15)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from tests.runtime.support import (
    Fault,
    FaultyStore,
    conversation_with,
    make_tool,
    run_to_settled,
)
from trio_backplane import Error, ErrorClass
from trio_backplane.resources import ResourceRegistry
from trio_backplane.store import MemoryStore
from trio_backplane.testing import Hang, ScriptedProvider
from trio_backplane.tools import ToolResult

S = ScriptedProvider


class Owning:
    """A tool that registers one resource owned by the run it executes in;
    its cleanup answers ``answer`` (or raises it, or hangs on ``None``
    given as ``"hang"``) and counts its calls."""

    def __init__(self, registry: ResourceRegistry, answer: Any = "confirmed") -> None:
        self.registry = registry
        self.answer = answer
        self.cleanups = 0

    async def cleanup(self) -> Any:
        self.cleanups += 1
        if self.answer == "hang":
            await trio.sleep_forever()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def execute(self, operation: Any) -> ToolResult:
        self.registry.register(
            operation.run_id, "process", {"pid": 1}, incarnation=1, cleanup=self.cleanup
        )
        return ToolResult("started")


def tools(owning: Owning, via_context: bool) -> list[Any]:
    context = {"resource_registry": owning.registry} if via_context else None
    return [make_tool("own", owning, backend_context=context)]


def options(owning: Owning, via_context: bool) -> dict[str, Any]:
    return {} if via_context else {"resources": [owning.registry]}


@pytest.mark.parametrize("via_context", [True, False], ids=["backend_context", "resources"])
async def test_res_14_completion_closes_the_registries(
    autojump_clock: trio.testing.MockClock, via_context: bool
) -> None:
    """RES-14, completion: the run's entries are released once and the
    snapshot reports ``confirmed``; the registry refuses the owner after."""
    owning = Owning(ResourceRegistry())
    provider = S([S.tool_calls(("c1", "own", {})), S.text("done")])
    finished = await run_to_settled(
        provider, tools(owning, via_context), **options(owning, via_context)
    )
    assert finished.record.state == "completed"
    assert owning.cleanups == 1
    assert finished.snapshot.resource_cleanup.status == "confirmed"
    assert owning.registry.owner_status("run-1") == []
    with pytest.raises(Error) as exc:
        owning.registry.register("run-1", "late", 1)
    assert exc.value.message == "resource owner is closed"


async def test_res_14_provider_failure_closes_the_registries(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """RES-14, provider failure: the failed run released what it owned."""
    owning = Owning(ResourceRegistry())
    failure = Error(ErrorClass.TRANSIENT_TRANSPORT, "provider down")
    provider = S([S.tool_calls(("c1", "own", {})), S.failure(failure)])
    finished = await run_to_settled(provider, tools(owning, True))
    assert finished.record.state == "failed"
    assert (owning.cleanups, finished.snapshot.resource_cleanup.status) == (1, "confirmed")


@pytest.mark.parametrize("path", ["cancel", "deadline"])
async def test_res_14_cancel_and_deadline_close_the_registries(
    autojump_clock: trio.testing.MockClock, path: str
) -> None:
    """RES-14, cancellation and run deadline: the settlement releases what
    the run owned before it commits, and reports ``confirmed``; the only
    evidence left is the interrupted provider attempt's, none of the
    registry's."""
    owning = Owning(ResourceRegistry())
    provider = S([S.tool_calls(("c1", "own", {})), [Hang()]])
    async with conversation_with(provider, tools(owning, True), run_timeout=100.0) as (
        conversation,
        _,
    ):
        await conversation.prompt("go")
        if path == "cancel":
            await trio.sleep(10)
            await conversation.cancel()
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"
    assert [e["effect"].split(":")[0] for e in snapshot.run.outcome["evidence"]] == ["provider"]
    assert (owning.cleanups, snapshot.resource_cleanup.status) == (1, "confirmed")


async def test_res_14_res_15_storage_failure_closes_but_stays_storage_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """RES-14, RES-15: a store failure still stops what the run owned, and
    the conversation stays ``storage_failed`` even with its processes stopped."""
    owning = Owning(ResourceRegistry())
    provider = S([S.tool_calls(("c1", "own", {})), S.text("done")])
    store = FaultyStore(MemoryStore(), Fault("fail", kind="finish"))
    finished = await run_to_settled(provider, tools(owning, True), store=store)
    assert finished.snapshot.phase == "storage_failed"
    assert (owning.cleanups, finished.snapshot.resource_cleanup.status) == (1, "confirmed")


@pytest.mark.parametrize(
    "answer",
    ["pending", None, OSError("cannot stop"), "hang"],
    ids=["pending", "none", "raises", "hangs"],
)
async def test_res_15_an_unconfirmed_cleanup_forbids_a_completed_run(
    autojump_clock: trio.testing.MockClock, answer: Any
) -> None:
    """RES-15: a run whose last turn succeeded but whose cleanup answered
    ``pending``, nothing, raised or hung past ``cleanup_timeout`` ends
    ``unknown_outcome`` with the evidence, never ``completed``."""
    owning = Owning(ResourceRegistry(cleanup_timeout=2.0), answer)
    provider = S([S.tool_calls(("c1", "own", {})), S.text("done")])
    finished = await run_to_settled(provider, tools(owning, True), cleanup_timeout=5.0)
    assert finished.record.state == "unknown_outcome"
    assert finished.record.outcome["stop_reason"] == "resource_cleanup_uncertain"
    [evidence] = finished.record.outcome["evidence"]
    assert evidence["status"] in ("failed", "uncertain")
    assert finished.snapshot.resource_cleanup.status == "uncertain"
    assert finished.snapshot.resource_cleanup.evidence == (dict(evidence),)
    assert "run_completed" not in finished.types()
    assert owning.cleanups == 1


async def test_res_15_an_unconfirmed_cleanup_makes_a_cancel_uncertain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """RES-15, on the cancel path: the settlement is uncertain, with the
    resource's evidence beside the effects'."""
    owning = Owning(ResourceRegistry(), "pending")
    provider = S([S.tool_calls(("c1", "own", {})), [Hang()]])
    async with conversation_with(provider, tools(owning, True)) as (conversation, _):
        await conversation.prompt("go")
        await trio.sleep(10)
        await conversation.cancel()
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "unknown_outcome"
    assert any(e.get("status") == "uncertain" for e in snapshot.run.outcome["evidence"])


def test_resources_must_be_registries() -> None:
    async def main() -> None:
        with pytest.raises(Error) as exc:
            await run_to_settled(S([S.text("x")]), resources=[object()])
        assert exc.value.error_class is ErrorClass.VALIDATION
        assert exc.value.details["option"] == "resources"

    trio.run(main)


async def test_a_tool_records_resource_evidence_durably(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``record_resource`` commits the evidence with the invocation's id
    before the tool goes on; recovery reports it; a non-mapping is refused."""
    from trio_backplane.recovery import recover

    refused: list[Error] = []

    class Recording:
        async def execute(self, operation: Any) -> ToolResult:
            try:
                await operation.context.record_resource(["not", "a", "mapping"])
            except Error as error:
                refused.append(error)
            await operation.context.record_resource({"kind": "process_group", "pgid": 4242})
            return ToolResult("recorded")

    provider = S([S.tool_calls(("c1", "rec", {})), S.text("done")])
    finished = await run_to_settled(provider, [make_tool("rec", Recording())])
    [entry] = recover(finished.record, incarnation=2).resources
    assert entry["kind"] == "process_group"
    assert entry["pgid"] == 4242
    assert f"tool:{entry['invocation_id']}" in finished.record.intents
    assert [e.error_class for e in refused] == [ErrorClass.VALIDATION]


async def test_res_14_a_published_catalog_s_registries_are_closed_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """RES-14: a registry named by a tool of a catalog published mid-run
    joins the run's registries and is closed with them."""
    from tests.runtime.support import publication

    owning = Owning(ResourceRegistry())
    owned_tool = make_tool("own", owning, backend_context={"resource_registry": owning.registry})

    class Publishing:
        async def execute(self, operation: Any) -> ToolResult:
            operation.context.stage_catalog(publication("pub-2", [owned_tool]))
            return ToolResult("published")

    provider = S(
        [
            S.tool_calls(("c1", "publish", {})),
            S.tool_calls(("c2", "own", {})),
            S.text("done"),
        ]
    )
    finished = await run_to_settled(provider, [make_tool("publish", Publishing())])
    assert finished.record.state == "completed"
    assert owning.cleanups == 1
    assert finished.snapshot.resource_cleanup.status == "confirmed"
