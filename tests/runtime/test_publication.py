"""Catalog staging and publication: the PUB behaviours (and EVT-14) of
BEHAVIOURS.md, on ``MemoryStore`` under ``MockClock(autojump_threshold=0)``.

A producing tool stages ``Publication(publication_id, run_id, incarnation,
expected_revision, CatalogUpdate(revision, registry, authority))`` through
``operation.context.stage_catalog`` (or ``conversation.stage_catalog``), and
the next ``ScriptedProvider.requests[i]`` shows what was published.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass
from trio_backplane.runtime import Conversation
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import Authority, ProviderTool, ToolRegistry, ToolResult

from .support import (
    RUN_ID,
    Fault,
    FaultyStore,
    Host,
    RecordingBackend,
    _dump,
    assert_no_canary,
    granted,
    make_tool,
    publication,
    run_with_host,
    string_schema,
)

SP = ScriptedProvider


def names(request: Any) -> list[str]:
    return [tool.name for tool in request.tools]


def base_tools(discover: Any, **kwargs: Any) -> list[Any]:
    return [make_tool("discover", RecordingBackend(discover), read_only=True, **kwargs)]


def new_catalog(extra: str = "found", backend: Any = None) -> list[Any]:
    """The discovered catalog: the old ``discover`` tool plus ``extra``."""
    return [
        make_tool("discover", RecordingBackend(), read_only=True),
        make_tool(extra, backend or RecordingBackend(ToolResult(f"{extra} ran")), read_only=True),
    ]


def staging(pub: Any, log: dict[str, Any], result: Any = None) -> Any:
    async def run(operation: Any) -> Any:
        log["at"] = trio.current_time()
        log["receipt"] = operation.context.stage_catalog(pub)
        log["returned_at"] = trio.current_time()
        log["revision"] = operation.catalog_revision
        return result if result is not None else ToolResult("discovered")

    return run


async def test_pub_01_initial_revision_and_projection(autojump_clock: MockClock) -> None:
    """PUB-01: the first request has catalog revision 1 and tools projected from
    the registry as ``ProviderTool(name, description, parameters)``, by name."""
    tools = [
        make_tool("zeta", RecordingBackend(), schema=string_schema("z")),
        make_tool("alpha", RecordingBackend()),
    ]
    provider = SP([SP.text("hi")])
    finished, _ = await run_with_host(provider, tools)
    [request] = provider.requests
    assert request.catalog_revision == 1
    assert list(request.tools) == [
        ProviderTool("alpha", "the alpha tool", {"type": "object"}),
        ProviderTool("zeta", "the zeta tool", string_schema("z")),
    ]
    assert finished.snapshot.catalog_revision == 1


async def test_pub_02_pub_03_pub_05_evt_14_stage_then_publish_at_boundary(
    autojump_clock: MockClock,
) -> None:
    """PUB-02, PUB-03, PUB-05, EVT-14: staging returns a ``"staged"`` receipt
    for revision 2 at once, with no commit; the catalog is published after
    the whole batch (the producer's result and the next call's are
    committed), before the steering message is consumed and before the next
    provider request, which carries revision 2 and the new tools."""
    log: dict[str, Any] = {}
    faulty = FaultyStore()
    pub = publication("pub-2", new_catalog())
    commits_at: list[int] = []

    async def discover(operation: Any) -> ToolResult:
        before = len(faulty.attempts)
        result = await staging(pub, log)(operation)
        commits_at.append(len(faulty.attempts) - before)
        return result  # type: ignore[no-any-return]

    async def during(conversation: Conversation, host: Host) -> None:
        while not log:
            await trio.sleep(0.01)
        await conversation.steer("after discovery")

    async def slow(operation: Any) -> ToolResult:
        await trio.sleep(1.0)
        return ToolResult("slow")

    tools = [*base_tools(discover), make_tool("slow", RecordingBackend(slow), read_only=True)]
    provider = SP(
        [
            SP.tool_calls(("c1", "discover", {}), ("c2", "slow", {})),
            SP.text("done"),
        ]
    )
    finished, _ = await run_with_host(provider, tools, store=faulty, during=during)
    receipt = log["receipt"]
    assert (receipt.publication_id, receipt.status, receipt.catalog_revision) == (
        "pub-2",
        "staged",
        2,
    )
    assert log["returned_at"] == log["at"]
    assert commits_at == [0]
    assert log["revision"] == 1
    types = finished.types()
    published = types.index("catalog_published")
    [event] = finished.of("catalog_published")
    assert event.payload == {"catalog_revision": 2}
    completed = [i for i, t in enumerate(types) if t == "tool_completed"]
    assert len(completed) == 2
    assert completed[-1] < published
    steering = [
        i
        for i, e in enumerate(finished.events)
        if e.type == "prompt_consumed" and e.payload["mode"] == "steering"
    ]
    assert steering
    assert steering[0] > published
    started = [i for i, t in enumerate(types) if t == "response_started"]
    assert started[0] < completed[0]
    assert started[1] > published
    assert [r.catalog_revision for r in provider.requests] == [1, 2]
    assert names(provider.requests[1]) == ["discover", "found"]
    assert finished.snapshot.catalog_revision == 2
    assert finished.record.context["conversation"]["catalog_revision"] == 2


async def test_pub_04_discovery_batch_pinned_to_old_catalog(autojump_clock: MockClock) -> None:
    """PUB-04: a call to a newly discovered tool in the discovery batch is judged
    against the old catalog ("tool is not registered") and not dispatched; the
    next batch may call it."""
    log: dict[str, Any] = {}
    found = RecordingBackend(ToolResult("found ran"))
    pub = publication("pub-2", new_catalog(backend=found))
    provider = SP(
        [
            SP.tool_calls(("c1", "discover", {}), ("c2", "found", {})),
            SP.tool_calls(("c3", "found", {})),
            SP.text("done"),
        ]
    )
    finished, _ = await run_with_host(provider, base_tools(staging(pub, log)))
    first, second, third = finished.tool_messages()
    assert first["result"]["is_error"] is False
    assert second["result"]["is_error"] is True
    assert second["result"]["content"] == "tool is not registered"
    assert third["result"]["content"] == "found ran"
    assert found.calls == 1
    assert found.operations[0].catalog_revision == 2


async def test_pub_06_identical_restaging_returns_existing_receipt(
    autojump_clock: MockClock,
) -> None:
    """PUB-06: re-staging an identical publication returns the existing receipt:
    ``"staged"`` before publication, ``"published"`` after."""
    pub = publication("pub-2", new_catalog())
    receipts: list[Any] = []

    async def discover(operation: Any) -> ToolResult:
        receipts.append(operation.context.stage_catalog(pub))
        receipts.append(operation.context.stage_catalog(pub))
        return ToolResult("discovered")

    async def again(operation: Any) -> ToolResult:
        receipts.append(operation.context.stage_catalog(pub))
        return ToolResult("again")

    tools = [*base_tools(discover), make_tool("again", RecordingBackend(again), read_only=True)]
    pub = publication("pub-2", [*new_catalog(), tools[1]])
    provider = SP(
        [SP.tool_calls(("c1", "discover", {})), SP.tool_calls(("c2", "again", {})), SP.text("done")]
    )
    finished, _ = await run_with_host(provider, tools)
    assert [(r.status, r.catalog_revision) for r in receipts] == [
        ("staged", 2),
        ("staged", 2),
        ("published", 2),
    ]
    assert finished.snapshot.catalog_revision == 2
    assert finished.of("catalog_published")
    assert len(finished.of("catalog_published")) == 1


async def test_pub_07_pub_08_conflicting_publications(autojump_clock: MockClock) -> None:
    """PUB-07: a reused id with different content raises ``resource_conflict``
    "publication id was already used for another catalog"; PUB-08: a second,
    different publication while one is pending raises ``resource_conflict``
    and the first stays pending (and is published)."""
    seen: list[Error] = []
    pub = publication("pub-2", new_catalog("found"))

    async def discover(operation: Any) -> ToolResult:
        operation.context.stage_catalog(pub)
        for other in (
            publication("pub-2", new_catalog("other")),
            publication("pub-3", new_catalog("other")),
        ):
            try:
                operation.context.stage_catalog(other)
            except Error as error:
                seen.append(error)
        return ToolResult("discovered")

    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, base_tools(discover))
    assert [e.error_class for e in seen] == [ErrorClass.RESOURCE_CONFLICT] * 2
    assert seen[0].message == "publication id was already used for another catalog"
    assert names(provider.requests[1]) == ["discover", "found"]
    assert [r.publication_id for r in finished.snapshot.receipts] == ["pub-2"]


def _const(value: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": {"const": value}}, "required": ["x"]}


async def test_pub_07_a_reused_id_differing_only_as_json_conflicts(
    autojump_clock: MockClock,
) -> None:
    """PUB-07: a publication id reused for a catalog that differs only where
    Python's ``==`` sees no difference (``const: 1`` vs ``const: true``) is
    another catalog: ``resource_conflict``, never the first one's receipt."""
    seen: list[Any] = []
    backends = (RecordingBackend(), RecordingBackend(ToolResult("ran")))  # the same objects

    def catalog(value: Any) -> list[Any]:
        return [
            make_tool("discover", backends[0], read_only=True),
            make_tool("found", backends[1], schema=_const(value)),
        ]

    async def discover(operation: Any) -> ToolResult:
        operation.context.stage_catalog(publication("pub-2", catalog(1)))
        try:
            seen.append(operation.context.stage_catalog(publication("pub-2", catalog(True))))
        except Error as error:
            seen.append(error)
        return ToolResult("discovered")

    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    await run_with_host(provider, base_tools(discover))
    [error] = seen
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert error.message == "publication id was already used for another catalog"


async def test_pub_tool_contract_differing_only_as_json_needs_a_new_revision(
    autojump_clock: MockClock,
) -> None:
    """Catalog continuity: a tool kept at its revision whose schema changes only where
    Python's ``==`` sees no difference (``const: 1`` to ``const: true``) has
    changed: the publication is refused ``forbidden``, and a call the old
    contract refuses is never dispatched under the old revision's grant."""
    staged: list[Any] = []
    kept = RecordingBackend(ToolResult("t ran"))

    async def discover(operation: Any) -> ToolResult:
        catalog = [
            make_tool("discover", RecordingBackend(), read_only=True),
            make_tool("t", kept, schema=_const(True), read_only=True),
        ]
        try:
            staged.append(operation.context.stage_catalog(publication("pub-2", catalog)))
        except Error as error:
            staged.append(error)
        return ToolResult("discovered")

    provider = SP(
        [
            SP.tool_calls(("c1", "discover", {})),
            SP.tool_calls(("c2", "t", {"x": True})),
            SP.text(""),
        ]
    )
    tools = [*base_tools(discover), make_tool("t", kept, schema=_const(1), read_only=True)]
    finished, _ = await run_with_host(provider, tools)
    [error] = staged
    assert isinstance(error, Error)
    assert error.error_class is ErrorClass.FORBIDDEN
    assert finished.snapshot.catalog_revision == 1
    assert kept.operations == []


async def test_cat_08_a_provider_cannot_edit_the_schema_it_is_sent(
    autojump_clock: MockClock,
) -> None:
    """CAT-08: the provider gets each tool's schema as a read-only copy (as
    it gets the transcript): a provider that "sanitizes" it in place fails
    its own attempt, and can never loosen what the gateway validates."""
    schema = {
        "type": "object",
        "properties": {"x": {"type": "string", "maxLength": 3}},
        "required": ["x"],
    }
    edits: list[BaseException] = []

    class Sanitizing(ScriptedProvider):
        def stream(self, request: Any, context: Any) -> Any:
            for tool in request.tools:
                for prop in tool.parameters.get("properties", {}).values():
                    try:
                        prop.pop("maxLength", None)
                    except (TypeError, AttributeError) as exc:
                        edits.append(exc)
            return super().stream(request, context)

    backend = RecordingBackend(ToolResult("ran"))
    provider = Sanitizing([SP.tool_calls(("c1", "t", {"x": "way too long"})), SP.text("done")])
    finished, _ = await run_with_host(provider, [make_tool("t", backend, schema=schema)])
    assert edits
    assert schema["properties"]["x"]["maxLength"] == 3
    assert backend.operations == []
    [message] = finished.tool_messages()
    assert message["result"]["is_error"] is True


async def test_pub_09_a_turn_failing_after_the_producer_discards_its_staging(
    autojump_clock: MockClock,
) -> None:
    """PUB-09: the producer succeeded, but a later call of its batch fails the
    turn (its work quota is spent): the batch never reaches its boundary, so
    the staging is discarded; no receipt says "staged" on the ended run."""
    log: dict[str, Any] = {}
    pub = publication("pub-2", new_catalog())
    provider = SP([SP.tool_calls(("c1", "discover", {}), ("c2", "discover", {})), SP.text("x")])
    finished, _ = await run_with_host(provider, base_tools(staging(pub, log)), work=2)
    assert log["receipt"].status == "staged"
    assert finished.record.state == "failed"
    assert finished.of("catalog_published") == []
    assert finished.snapshot.catalog_revision == 1
    assert finished.snapshot.receipts == ()


async def test_int_02_a_run_cannot_be_named_like_the_approving_host(
    autojump_clock: MockClock,
) -> None:
    """INT-02, KER-15: the host resolves approvals as ``"host"``, and a
    resolver named like the run is the model approving itself: a run named
    ``"host"`` is refused at open (its approvals could never pass)."""
    with pytest.raises(Error) as info:
        await run_with_host(SP([SP.text("hi")]), [], run_id="host")
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.details["reason"] == "reserved_run_id"


@pytest.mark.parametrize("failure", ["error", "is_error", "crash", "cancelled", "storage"])
async def test_pub_09_failed_producer_discards_staging(
    autojump_clock: MockClock, failure: str
) -> None:
    """PUB-09: a producer that fails, returns ``is_error``, crashes, is
    cancelled or meets a storage failure discards its staged catalog, and the
    catalog revision stays 1."""
    log: dict[str, Any] = {}
    pub = publication("pub-2", new_catalog())
    faulty = FaultyStore()
    if failure == "storage":
        faulty.add(Fault("fail", kind="tool_completed"))

    async def discover(operation: Any) -> Any:
        await staging(pub, log)(operation)
        if failure == "error":
            raise Error(ErrorClass.EXECUTION_FAILURE, "discovery failed")
        if failure == "is_error":
            return ToolResult("no luck", is_error=True)
        if failure == "crash":
            raise RuntimeError("discovery crashed")
        if failure == "cancelled":
            await trio.sleep_forever()
        return ToolResult("discovered")

    async def during(conversation: Conversation, host: Host) -> None:
        if failure == "cancelled":
            while not log:
                await trio.sleep(0.5)
            await conversation.cancel()

    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, base_tools(discover), store=faulty, during=during)
    assert log["receipt"].status == "staged"
    assert finished.of("catalog_published") == []
    assert finished.snapshot.catalog_revision == 1
    assert finished.snapshot.receipts == ()
    assert all(r.catalog_revision == 1 for r in provider.requests)
    if failure in ("error", "is_error"):
        assert len(provider.requests) == 2
        assert names(provider.requests[1]) == ["discover"]


async def test_pub_10_staging_during_interaction_or_approval_wait(
    autojump_clock: MockClock,
) -> None:
    """PUB-10: staging while an interaction (from the tool) or an approval is
    awaited raises ``resource_conflict``, in either form."""
    seen: list[Error] = []
    pub = publication("pub-2", new_catalog())
    conversations: list[Conversation] = []

    async def asker(operation: Any) -> ToolResult:
        await operation.context.interact({"kind": "question"})
        return ToolResult("asked")

    def policy(event: Any) -> tuple[float, Any]:
        for stage in (conversations[0].stage_catalog, *contexts):
            try:
                stage(pub)
            except Error as error:
                seen.append(error)
        return 1.0, "approved"

    contexts: list[Any] = []

    async def asker_keep(operation: Any) -> ToolResult:
        contexts[:] = [operation.context.stage_catalog]
        return await asker(operation)

    async def during(conversation: Conversation, host: Host) -> None:
        conversations.append(conversation)

    tools = [
        make_tool("ask", RecordingBackend(asker_keep), read_only=True),
        make_tool("deploy", RecordingBackend(), requires_approval=True),
    ]
    from trio_backplane.testing import Sleep

    provider = SP(
        [[Sleep(1.0), *SP.tool_calls(("c1", "ask", {}), ("c2", "deploy", {}))], SP.text("done")]
    )
    finished, host = await run_with_host(provider, tools, policy, during=during)
    assert len(host.requested) == 2
    # interaction wait: both forms; approval wait: both forms (the kept one is stale)
    assert [e.error_class for e in seen] == [ErrorClass.RESOURCE_CONFLICT] * 4
    assert finished.snapshot.receipts == ()
    assert finished.snapshot.catalog_revision == 1


async def test_pub_11_fence_checked_before_receipt_lookup(autojump_clock: MockClock) -> None:
    """PUB-11: a publication for another run or incarnation raises
    ``resource_conflict``, even under an id whose identical-content receipt
    exists."""
    seen: list[Error] = []
    tools = new_catalog()
    pub = publication("pub-2", tools)

    async def discover(operation: Any) -> ToolResult:
        operation.context.stage_catalog(pub)
        for other in (
            publication("pub-2", tools, run_id="run-2"),
            publication("pub-2", tools, incarnation=2),
        ):
            try:
                operation.context.stage_catalog(other)
            except Error as error:
                seen.append(error)
        return ToolResult("ok")

    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    await run_with_host(provider, base_tools(discover))
    assert [e.error_class for e in seen] == [ErrorClass.RESOURCE_CONFLICT] * 2
    assert all("another run or incarnation" in e.message for e in seen)


async def test_pub_12_pub_19_staging_outside_an_executing_tool(
    autojump_clock: MockClock,
) -> None:
    """PUB-12: a kept ``stage_catalog`` called after its tool's effect ended
    raises ``resource_conflict``; PUB-19: either form while no tool executes
    raises ``resource_conflict`` "staging requires an executing tool" and
    leaves no pending publication."""
    kept: list[Any] = []
    seen: list[Error] = []
    pub = publication("pub-2", new_catalog())

    async def keep(operation: Any) -> ToolResult:
        kept.append(operation.context.stage_catalog)
        return ToolResult("kept")

    async def during(conversation: Conversation, host: Host) -> None:
        try:  # the conversation form, while the provider streams (no tool executes)
            conversation.stage_catalog(pub)
        except Error as error:
            seen.append(error)
        while not kept:
            await trio.sleep(0.5)
        await trio.sleep(0.5)  # the tool's effect has ended, the provider sleeps
        try:
            conversation.stage_catalog(pub)
        except Error as error:
            seen.append(error)
        await trio.sleep(2.0)
        try:
            kept[0](pub)
        except Error as error:
            seen.append(error)

    from trio_backplane.testing import Sleep

    provider = SP([SP.tool_calls(("c1", "discover", {})), [Sleep(5.0), *SP.text("done")]])
    finished, _ = await run_with_host(provider, base_tools(keep), during=during)
    assert len(seen) == 3
    for error in seen:
        assert error.error_class is ErrorClass.RESOURCE_CONFLICT
        assert error.message == "staging requires an executing tool"
    assert finished.snapshot.receipts == ()
    assert finished.of("catalog_published") == []
    assert finished.snapshot.catalog_revision == 1


async def test_pub_13_rejected_publications_leave_nothing_pending(
    autojump_clock: MockClock,
) -> None:
    """PUB-13: a stale ``expected_revision`` (``resource_conflict``), grants that
    do not match the tools (``forbidden``) or a refused schema (its own class)
    is rejected whole and leaves no pending publication: a valid one can be
    staged afterwards."""
    seen: list[ErrorClass] = []
    tools = new_catalog()
    narrow = Authority(
        grants=frozenset({"discover"}),
        caller="host",
        run_id=RUN_ID,
        tool_revisions={"discover": 1},
    )
    bad_schema = [*tools, make_tool("bad", RecordingBackend(), schema={"type": "string"})]
    rejected = [
        publication("pub-a", tools, expected_revision=2),
        publication("pub-b", tools, authority=narrow),
        publication("pub-c", bad_schema),
    ]
    good = publication("pub-d", tools)
    receipts: list[Any] = []

    async def discover(operation: Any) -> ToolResult:
        for pub in rejected:
            try:
                operation.context.stage_catalog(pub)
            except Error as error:
                seen.append(error.error_class)
        receipts.append(operation.context.stage_catalog(good))
        return ToolResult("ok")

    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, base_tools(discover))
    assert seen == [
        ErrorClass.RESOURCE_CONFLICT,
        ErrorClass.FORBIDDEN,
        ErrorClass.UNSUPPORTED_CAPABILITY,
    ]
    assert receipts[0].status == "staged"
    assert [r.publication_id for r in finished.snapshot.receipts] == ["pub-d"]
    assert names(provider.requests[1]) == ["discover", "found"]


async def test_pub_14_sixteen_receipts_newest_first(autojump_clock: MockClock) -> None:
    """PUB-14: after 17 publications only the 16 newest receipts remain, newest
    first, and the evicted id is no longer recognised (its identical content
    is judged afresh, as a stale revision)."""
    seen: list[Error] = []
    pubs: list[Any] = []

    async def discover(operation: Any) -> ToolResult:
        n = operation.catalog_revision
        if n <= 17:
            pub = publication(f"pub-{n}", tools, expected_revision=n)
            pubs.append(pub)
            operation.context.stage_catalog(pub)
        else:
            try:
                operation.context.stage_catalog(pubs[0])
            except Error as error:
                seen.append(error)
        return ToolResult(f"revision {n}")

    tools = base_tools(discover)
    provider = SP([*(SP.tool_calls((f"c{i}", "discover", {})) for i in range(18)), SP.text("done")])
    finished, _ = await run_with_host(provider, tools)
    receipts = finished.snapshot.receipts
    assert len(receipts) == 16
    assert [r.catalog_revision for r in receipts] == list(range(18, 2, -1))
    assert all(r.status == "published" for r in receipts)
    assert "pub-1" not in {r.publication_id for r in receipts}
    [error] = seen
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert error.message == "stale expected_revision"
    assert finished.snapshot.catalog_revision == 18


async def test_pub_15_pub_17_catalog_contents_stay_process_local(
    autojump_clock: MockClock,
) -> None:
    """PUB-15, PUB-17: the published registry's backend context and its
    descriptions never reach a stored record, the stored event log or a
    provider request, and ``status()`` shows the revision and the receipts
    but no catalog contents."""
    log: dict[str, Any] = {}
    secret = "sk-CANARY-credential"
    found = make_tool(
        "found", RecordingBackend(), read_only=True, backend_context={"token": secret}
    )
    pub = publication("pub-2", [found])  # the run's caller: a publication keeps it (PUB-13)
    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, base_tools(staging(pub, log)))
    assert names(provider.requests[1]) == ["found"]
    await assert_no_canary(
        finished.store,
        RUN_ID,
        [secret],
        events=finished.events,
        requests=provider.requests,
    )
    snapshot = finished.snapshot
    assert snapshot.catalog_revision == 2
    assert [(r.publication_id, r.status, r.catalog_revision) for r in snapshot.receipts] == [
        ("pub-2", "published", 2)
    ]
    dumped = _dump(snapshot) + repr(snapshot)
    assert "the found tool" not in dumped
    assert secret not in dumped


@pytest.mark.parametrize("change", ["caller", "schema", "approval"])
async def test_pub_13_a_publication_keeps_the_caller_and_each_kept_tool_revision(
    autojump_clock: MockClock, change: str
) -> None:
    """PUB-13: a publication acting for another caller, or keeping a tool's
    name and revision while changing its schema or approval requirement
    (what the run's grants and approvals were given for), is refused with
    ``forbidden`` and leaves no pending publication; the old catalog stays."""
    log: dict[str, Any] = {}
    kept = {
        "caller": make_tool("discover", RecordingBackend(), read_only=True),
        "schema": make_tool(
            "discover", RecordingBackend(), read_only=True, schema=string_schema("z")
        ),
        "approval": make_tool(
            "discover", RecordingBackend(), read_only=True, requires_approval=True
        ),
    }[change]
    tools = [kept, make_tool("found", RecordingBackend(), read_only=True)]
    registry = ToolRegistry(tools)
    caller = "root" if change == "caller" else "host"
    pub = publication(
        "pub-2", tools, authority=Authority.for_registry(registry, caller=caller, run_id=RUN_ID)
    )
    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])

    async def discover(operation: Any) -> ToolResult:
        try:
            operation.context.stage_catalog(pub)
        except Error as exc:
            log["refused"] = exc
        return ToolResult("discovered")

    finished, _ = await run_with_host(provider, base_tools(discover))
    assert log["refused"].error_class is ErrorClass.FORBIDDEN
    assert finished.snapshot.catalog_revision == 1
    assert finished.snapshot.receipts == ()
    assert names(provider.requests[1]) == ["discover"]


async def test_pub_16_quarantine_keeps_only_accepted_tools(autojump_clock: MockClock) -> None:
    """PUB-16: under ``schema_admission="quarantine"`` a rejected tool never
    reaches the provider, and no diagnostic of it appears in requests,
    events, stored records or ``status()``."""
    log: dict[str, Any] = {}
    bad = make_tool("rejected_CANARY", RecordingBackend(), schema={"type": "array"})
    tools = [*new_catalog(), bad]
    registry = ToolRegistry(tools)
    pub = publication("pub-2", tools, authority=granted(registry), schema_admission="quarantine")
    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, base_tools(staging(pub, log)))
    assert names(provider.requests[1]) == ["discover", "found"]
    await assert_no_canary(
        finished.store,
        RUN_ID,
        ["rejected_CANARY", "root_not_object"],
        events=finished.events,
        requests=provider.requests,
    )
    assert "rejected_CANARY" not in _dump(finished.snapshot) + repr(finished.snapshot)


async def test_pub_18_nested_producer(autojump_clock: MockClock) -> None:
    """PUB-18: staging by a nested producer is published once at the batch
    boundary after the nested and the outer success; the nested callback
    expires when the nested invocation stops executing."""
    seen: list[Error] = []
    kept: list[Any] = []
    pub = publication("pub-2", new_catalog())

    async def inner(operation: Any) -> ToolResult:
        kept.append(operation.context.stage_catalog)
        operation.context.stage_catalog(pub)
        return ToolResult("inner")

    async def outer(operation: Any) -> ToolResult:
        await operation.context.nested_dispatch("inner", {})
        try:
            kept[0](pub)
        except Error as error:
            seen.append(error)
        return ToolResult("outer")

    tools = [
        *base_tools(outer),
        make_tool("inner", RecordingBackend(inner), read_only=True),
    ]
    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, tools)
    [error] = seen
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert [r.catalog_revision for r in provider.requests] == [1, 2]
    assert len(finished.of("catalog_published")) == 1


@pytest.mark.parametrize("failing", ["inner", "outer"])
async def test_pub_18_nested_or_outer_failure_discards(
    autojump_clock: MockClock, failing: str
) -> None:
    """PUB-18: an error-marked nested producer, or a failing enclosing tool,
    discards the nested staging."""
    pub = publication("pub-2", new_catalog())

    async def inner(operation: Any) -> ToolResult:
        operation.context.stage_catalog(pub)
        return ToolResult("inner", is_error=failing == "inner")

    async def outer(operation: Any) -> ToolResult:
        await operation.context.nested_dispatch("inner", {})
        if failing == "outer":
            raise Error(ErrorClass.EXECUTION_FAILURE, "outer failed")
        return ToolResult("outer")

    tools = [*base_tools(outer), make_tool("inner", RecordingBackend(inner), read_only=True)]
    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, tools)
    assert [r.catalog_revision for r in provider.requests] == [1, 1]
    assert finished.of("catalog_published") == []
    assert finished.snapshot.receipts == ()


async def test_pub_18_a_failing_nested_call_keeps_its_callers_staging(
    autojump_clock: MockClock,
) -> None:
    """PUB-18, NEST-05: a tool stages through its own context while a nested
    call it made is running; the nested call fails (an error result the
    outer tool handles) and the outer tool succeeds.  The outer tool is the
    producer: its staging is published; the nested call is not among those
    whose failure discards it."""
    pub = publication("pub-2", new_catalog())
    log: dict[str, Any] = {}

    async def inner(operation: Any) -> ToolResult:
        await trio.sleep(1)
        return ToolResult("inner said no", is_error=True)

    async def outer(operation: Any) -> ToolResult:
        async with trio.open_nursery() as nursery:

            async def stage_meanwhile() -> None:
                await trio.sleep(0.5)  # while the nested call executes
                log["receipt"] = operation.context.stage_catalog(pub)

            nursery.start_soon(stage_meanwhile)
            result = await operation.context.nested_dispatch("inner", {})
        log["inner failed"] = result.is_error
        return ToolResult("outer ok")

    tools = [*base_tools(outer), make_tool("inner", RecordingBackend(inner), read_only=True)]
    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, tools)
    assert log["inner failed"] is True
    assert log["receipt"].status == "staged"
    assert [r.catalog_revision for r in provider.requests] == [1, 2]
    assert [(r.publication_id, r.status) for r in finished.snapshot.receipts] == [
        ("pub-2", "published")
    ]


async def test_pub_14_a_discarded_staging_costs_no_older_receipt(
    autojump_clock: MockClock,
) -> None:
    """PUB-14, PUB-09, PUB-06: after 16 publications a 17th staging whose
    producer fails is discarded; the 16 published receipts are all still
    kept, and re-staging the oldest one returns its receipt."""
    seen: dict[str, Any] = {}

    async def discover(operation: Any) -> ToolResult:
        n = operation.catalog_revision
        if n <= 16:
            operation.context.stage_catalog(publication(f"pub-{n}", tools, expected_revision=n))
            return ToolResult(f"revision {n}")
        if "failed" not in seen:
            seen["failed"] = operation.context.stage_catalog(
                publication("pub-doomed", tools, expected_revision=n)
            )
            seen["while staged"] = len(operation.context._host.catalog.receipts)
            return ToolResult("discovery failed", is_error=True)
        seen["again"] = operation.context.stage_catalog(
            publication("pub-1", tools, expected_revision=1)
        )
        return ToolResult("done")

    tools = base_tools(discover)
    provider = SP([*(SP.tool_calls((f"c{i}", "discover", {})) for i in range(18)), SP.text("done")])
    finished, _ = await run_with_host(provider, tools)
    assert seen["failed"].status == "staged"
    assert seen["while staged"] == 16  # the pending one and the 15 newest, at most 16 shown
    assert (seen["again"].publication_id, seen["again"].status) == ("pub-1", "published")
    receipts = finished.snapshot.receipts
    assert [r.publication_id for r in receipts] == [f"pub-{n}" for n in range(16, 0, -1)]
    assert finished.snapshot.catalog_revision == 17


def _tool_message_commit(kind: str, record: Any) -> bool:
    messages = (record.conversation or {}).get("messages", ())
    return kind == "conversation_updated" and any(m.get("role") == "tool" for m in messages)


@pytest.mark.parametrize("slow", ["tool_completed", "tool_message"])
async def test_pub_06_pub_09_a_cancel_at_the_publication_boundary_never_half_publishes(
    autojump_clock: MockClock, slow: str
) -> None:
    """PUB-06/PUB-09: the producer succeeded; cancel() arrives while a commit
    at the publication boundary is in flight (the result's, or the one
    carrying its tool message).  The staging takes effect only with the
    checkpoint that commits it: the receipt, the status, the stored record
    and ``catalog_published`` always agree: published whole (revision 2),
    or discarded (revision 1, no receipt).  Never a receipt saying
    ``published`` for a catalog the record does not hold."""
    log: dict[str, Any] = {}
    pub = publication("pub-2", new_catalog())
    faulty = FaultyStore()
    if slow == "tool_completed":
        faulty.add(Fault("delay", kind="tool_completed", delay=2.0))
    else:
        faulty.add(Fault("delay", when=_tool_message_commit, delay=2.0))

    async def discover(operation: Any) -> Any:
        await staging(pub, log)(operation)
        return ToolResult("discovered")

    async def during(conversation: Conversation, host: Host) -> None:
        while not faulty.fired:
            await trio.sleep(0.1)
        await conversation.cancel()

    provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
    finished, _ = await run_with_host(provider, base_tools(discover), store=faulty, during=during)
    stored_revision = dict(finished.record.conversation or {}).get("catalog_revision", 1)
    published = finished.of("catalog_published")
    receipts = [(r.status, r.catalog_revision) for r in finished.snapshot.receipts]
    if stored_revision == 2:
        assert len(published) == 1
        assert receipts == [("published", 2)]
        assert finished.snapshot.catalog_revision == 2
    else:
        assert published == []
        assert receipts == []
        assert finished.snapshot.catalog_revision == 1
    assert finished.record.state in ("cancelled", "unknown_outcome")


async def test_pub_09_a_producer_cut_by_the_run_deadline_discards_its_staging(
    autojump_clock: MockClock,
) -> None:
    """PUB-09: a producer still running when the run deadline passes
    discards its staging as a cancelled one does: no receipt says "staged"
    on the ended run (the deadline's own stop left it pending)."""

    async def discover(operation: Any) -> Any:
        operation.context.stage_catalog(publication("p2", new_catalog()))
        await trio.sleep_forever()

    finished, _ = await run_with_host(
        SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")]),
        base_tools(discover),
        run_timeout=10.0,
        effect_timeout=30.0,
    )
    assert finished.record.state in ("timed_out", "unknown_outcome")
    assert all(receipt.status != "staged" for receipt in finished.snapshot.receipts)


async def test_pub_18_a_nested_call_whose_caller_ended_stages_nothing(
    autojump_clock: MockClock,
) -> None:
    """PUB-18: a nested call still running (in a host's task) after its
    caller ended, the caller failing, cannot stage: the caller's failure
    discards dependent staging, and one staged after it would have
    published (the outer call had left the producers)."""
    seen: list[Any] = []

    async def finisher(operation: Any) -> ToolResult:
        with trio.CancelScope(shield=True):  # finishes what it began
            await trio.sleep(2)
        try:
            operation.context.stage_catalog(publication("p2", new_catalog()))
        except Error as error:
            seen.append(error)
        return ToolResult("staged")

    async with trio.open_nursery() as host_tasks:

        async def discover(operation: Any) -> ToolResult:
            async def in_the_background() -> None:
                with contextlib.suppress(Error):
                    await operation.context.nested_dispatch("inner", {})

            host_tasks.start_soon(in_the_background)
            await trio.sleep(1)
            return ToolResult("failed", is_error=True)

        provider = SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")])
        tools = [
            *base_tools(discover),
            make_tool("inner", RecordingBackend(finisher), read_only=True),
        ]
        finished, _ = await run_with_host(provider, tools, effect_timeout=30.0)
    [error] = seen
    assert error.error_class is ErrorClass.RESOURCE_CONFLICT
    assert finished.snapshot.receipts == ()
    assert all("found" not in names(request) for request in provider.requests)


async def test_pub_13_a_publication_of_tools_that_fail_when_read_is_refused_classed(
    autojump_clock: MockClock,
) -> None:
    """PUB-13: a publication whose tool's backend or schema fails when read
    is refused classed, and the producer goes on (a raw exception crashed
    it, and the run ended unknown_outcome)."""

    class UnreadableBackend:
        @property
        def execute(self) -> Any:
            raise RuntimeError("unreadable")

    class UnreadableSchema(dict[str, Any]):
        def __contains__(self, key: object) -> bool:
            raise RuntimeError("unreadable")

        def get(self, key: str, default: Any = None) -> Any:
            raise RuntimeError("unreadable")

    class UnreadableCallable:  # an ``execute`` whose every attribute read fails
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("unreadable")

        def __call__(self, operation: Any) -> Any:
            return None  # pragma: no cover

    class CallableBackend:
        execute = UnreadableCallable()

    class NoEquality:  # a ``type`` value whose comparison fails
        def __eq__(self, other: object) -> bool:
            raise RuntimeError("unreadable")

        __hash__ = object.__hash__

    refused: list[Error] = []

    async def discover(operation: Any) -> ToolResult:
        for extra in (
            make_tool("found", UnreadableBackend(), read_only=True),
            make_tool("found", RecordingBackend(), schema=UnreadableSchema(), read_only=True),
            make_tool("found", CallableBackend(), read_only=True),
            make_tool("found", RecordingBackend(), schema={"type": NoEquality()}, read_only=True),
        ):
            catalog = [make_tool("discover", RecordingBackend(), read_only=True), extra]
            try:
                operation.context.stage_catalog(publication("p2", catalog))
            except Error as error:
                refused.append(error)
        return ToolResult("done")

    finished, _ = await run_with_host(
        SP([SP.tool_calls(("c1", "discover", {})), SP.text("done")]), base_tools(discover)
    )
    assert [e.error_class for e in refused] == [
        ErrorClass.UNSUPPORTED_CAPABILITY,
        ErrorClass.VALIDATION,
        ErrorClass.UNSUPPORTED_CAPABILITY,
        ErrorClass.UNSUPPORTED_CAPABILITY,
    ]
    assert finished.record.state == "completed"
