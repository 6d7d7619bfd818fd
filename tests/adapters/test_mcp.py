"""The MCP tool source against a real SDK server subprocess (``mcp_server.py``).

Each test starts its own server over stdio; leaving ``connect_stdio`` stops
it.  A few cases the SDK's server refuses to send (a boolean or
non-object ``inputSchema``, a non-object ``structuredContent``, an explicit
``null``) are checked on :class:`McpCatalog`, the adapter's pure core that
every listing and result goes through, or sent by ``raw_mcp_server.py``,
a hand-written JSON-RPC server.
"""

from __future__ import annotations

import json
import sys
import types as pytypes
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_backplane.adapters import mcp as mcp_adapter
from trio_backplane.adapters.mcp import (
    CACHE_SIZE,
    MCP_SCHEMA_OPTIONS,
    BoundaryValidator,
    McpCatalog,
    McpToolSource,
    ValidatorCache,
    _catalog,
    _connect,
    _wire,
    connect_stdio,
)
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import thaw
from trio_backplane.runtime import open_conversation
from trio_backplane.schema import SchemaOptions, compile_with
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import Rejection, ToolResult

SERVER = str(Path(__file__).with_name("mcp_server.py"))
RAW_SERVER = str(Path(__file__).with_name("raw_mcp_server.py"))
ALWAYS_REFUSED = {"ancient", "broken_pattern", "deep", "remote_ref"}
BAD_NAMES = {"", "has space", "x" * 129, "ctl\u0007bell"}
LISTED = {
    "calls",
    "change_tools",
    "fail",
    "github::get_me",
    "legacy",
    "lookup",
    "plain",
    "slow",
    "untyped_root",
}


@asynccontextmanager
async def server(**options: Any) -> AsyncIterator[McpToolSource]:
    env = options.pop("env", None)
    with trio.fail_after(30):
        async with connect_stdio(sys.executable, [SERVER], env=env, **options) as source:
            yield source


@asynccontextmanager
async def raw_server(env: dict[str, str], **options: Any) -> AsyncIterator[McpToolSource]:
    """``raw_mcp_server.py``, which sends what the SDK's own server would not."""
    with trio.fail_after(30):
        async with connect_stdio(sys.executable, [RAW_SERVER], env=env, **options) as source:
            yield source


async def server_calls(source: McpToolSource) -> list[str]:
    result = await source.call_tool("calls", {})
    return list(result.structured_content["calls"])


async def converse(source: McpToolSource, provider: ScriptedProvider, run_id: str) -> Any:
    """Run one prompt of a conversation over ``source``'s tools (all granted)
    to its settled snapshot."""
    bundle = source.admit(caller="host", run_id=run_id)
    async with open_conversation(
        run_id,
        store=MemoryStore(),
        provider=provider,
        registry=bundle.registry,
        authority=bundle.authority,
    ) as conversation:
        await conversation.prompt("go")
        with trio.fail_after(20):
            return await conversation.wait_settled()


def refusal(source: McpToolSource, name: str) -> Error:
    for rejected in source.rejected:
        if rejected.name == name:
            return rejected.error
    raise AssertionError(f"{name!r} was not refused")


def operation(name: str, arguments: Any) -> Any:
    return pytypes.SimpleNamespace(
        run_id="run-1",
        incarnation=1,
        step_id="step-1",
        attempt_id="attempt-1",
        invocation_id="invocation-1",
        tool_call_id="call-1",
        turn_id="turn-1",
        tool_name=name,
        tool_revision=1,
        catalog_revision=1,
        arguments=arguments,
    )


class CountingValidator:
    """The default validator, counting what it builds (and in what order)."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.inner = BoundaryValidator()
        self.log = log

    @property
    def key(self) -> str:
        return "counting:" + self.inner.key

    def build(self, schema: Any, *, output: bool) -> Any:
        self.log.append(("build", schema))
        return self.inner.build(schema, output=output)

    def validate(self, compiled: Any, data: Any) -> None:
        self.inner.validate(compiled, data)


@pytest.fixture
def bounds_log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    log: list[tuple[str, Any]] = []
    real = _catalog.check_bounds

    def counting(schema: Any, limits: Any = None, allow_external_refs: bool = False) -> None:
        log.append(("bounds", schema))
        assert limits == _catalog.Limits.mcp()
        assert allow_external_refs is False
        real(schema, limits, allow_external_refs)

    monkeypatch.setattr(_catalog, "check_bounds", counting)
    return log


# -- MCP-01 ------------------------------------------------------------------------


async def test_mcp_01_validation_is_opt_in_per_client() -> None:
    """MCP-01: without the flags nothing is validated by the adapter: invalid
    arguments are sent and a bad structuredContent comes back as is."""
    async with server() as source:
        bad = {"user": {"id": "not an int"}, "mode": "bad"}
        result = await source.call_tool("lookup", bad)
        assert result.structured_content == {"id": "one"}
        assert await server_calls(source) == ["lookup"]
    async with server(validate_arguments=True, validate_structured_content=True) as source:
        with pytest.raises(Error) as info:
            await source.call_tool("lookup", bad)
        assert info.value.details["reason"] == "invalid_arguments"
        with pytest.raises(Error) as info:
            await source.call_tool("lookup", {"user": {"id": 1}, "mode": "bad"})
        assert info.value.error_class is ErrorClass.MALFORMED_RESULT


async def test_mcp_01_an_sdk_without_the_raw_dispatch_hook_keeps_its_own_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MCP-01: on an SDK whose dispatcher lacks the hook the adapter uses to
    read results as sent, sessions fall back to the SDK's own result models:
    listing and calling still work (only MCP-03/06/10's per-item handling
    is then the SDK's)."""
    monkeypatch.setattr(_wire, "_RAW_DISPATCH", False)
    async with server() as source:
        assert "lookup" in source.catalog.tools
        result = await source.call_tool("lookup", {"user": {"id": 1}, "mode": "fast"})
        assert result.structured_content == {"id": 1, "name": "user-1"}


# -- MCP-02 ------------------------------------------------------------------------


async def test_mcp_02_bounds_checked_before_every_build(bounds_log: list[tuple[str, Any]]) -> None:
    """MCP-02: every schema used passes check_bounds (Limits.mcp(), no external
    refs) before the validator builds it, and is built with MCP options."""
    async with server(
        validate_structured_content=True, validator=CountingValidator(bounds_log)
    ) as source:
        builds = [i for i, (kind, _) in enumerate(bounds_log) if kind == "build"]
        assert builds
        for i in builds:
            assert bounds_log[i - 1] == ("bounds", bounds_log[i][1])
        deep = refusal(source, "deep")
        assert deep.error_class is ErrorClass.EXECUTION_FAILURE
        assert deep.details["reason"] == "too_deep"
        # the host preset would have accepted it: Limits.mcp() decided
        deep_schema = next(
            s
            for k, s in bounds_log
            if k == "bounds"
            and "properties" in s
            and s["properties"].get("n", {}).get("type") == "object"
        )
        compile_with(deep_schema, SchemaOptions())
        for descriptor in source.descriptors:
            assert descriptor.schema_options == MCP_SCHEMA_OPTIONS
        assert MCP_SCHEMA_OPTIONS.schema_registry is None
        assert MCP_SCHEMA_OPTIONS.schema_loader is None
        assert MCP_SCHEMA_OPTIONS.allow_external_refs is False


# -- MCP-03 ------------------------------------------------------------------------


def test_mcp_03_input_roots_and_any_output_root() -> None:
    """MCP-03: a boolean or non-object inputSchema root is refused with
    root_not_object, a missing root type is an object, any output root is fine."""
    catalog = McpCatalog(validate_arguments=True, validate_structured_content=True)
    catalog.admit(
        [
            {"name": "bool_root", "inputSchema": True},
            {"name": "string_root", "inputSchema": {"type": "string"}},
            {"name": "nullable_root", "inputSchema": {"type": ["object", "null"]}},
            {"name": "no_type", "inputSchema": {"properties": {"a": {"type": "integer"}}}},
            {
                "name": "array_out",
                "inputSchema": {"type": "object"},
                "outputSchema": {"type": "array", "items": {"type": "integer"}},
            },
            {"name": "bool_out", "inputSchema": {"type": "object"}, "outputSchema": True},
        ]
    )
    assert set(catalog.tools) == {"no_type", "array_out", "bool_out"}
    for rejected in catalog.rejected:
        assert rejected.error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert rejected.error.details["reason"] == "root_not_object"
        assert rejected.error.details["unsafe_schema"] == "input"
    with pytest.raises(Error) as info:
        catalog.prepare("no_type", {"a": "x"})
    assert info.value.details["reason"] == "invalid_arguments"
    tool = catalog.prepare("array_out", {})
    assert catalog.result(
        tool, {"content": [], "structuredContent": [1, 2]}
    ).structured_content == [1, 2]


# -- MCP-04 ------------------------------------------------------------------------


async def test_mcp_04_draft_07_validated_under_its_own_draft() -> None:
    """MCP-04: a draft-07 tool is listed and validated as draft-07 (array-form
    items, additionalItems); draft-04 is refused with unsupported_capability."""
    async with server(validate_arguments=True) as source:
        legacy = next(d for d in source.descriptors if d.name == "legacy")
        with pytest.raises(Error) as info:
            compile_with(legacy.schema, SchemaOptions())  # 2020-12 only: refused
        assert info.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        result = await source.call_tool("legacy", {"tags": ["a"]})
        assert result.is_error is False
        for tags in (["a", 1], [1]):
            with pytest.raises(Error) as info:
                await source.call_tool("legacy", {"tags": tags})
            assert info.value.details["reason"] == "invalid_arguments"
        ancient = refusal(source, "ancient")
        assert ancient.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert await server_calls(source) == ["legacy"]


# -- MCP-05 ------------------------------------------------------------------------


async def test_mcp_05_remote_ref_never_connects() -> None:
    """MCP-05: a $ref at a loopback HTTP server is refused with remote_ref and
    that server sees no connection, at listing or at a call."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    connections = 0

    async def accept() -> None:
        nonlocal connections
        async with listeners[0] as listener:
            while True:
                stream = await listener.accept()
                connections += 1
                await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        env = {"MCP_TEST_REF_PORT": str(port)}
        async with server(env=env, validate_structured_content=True) as source:
            for name in ("remote_ref", "remote_output"):
                error = refusal(source, name)
                assert error.details["reason"] == "remote_ref"
                assert str(port) in json.dumps(error.details["cause"])
            with pytest.raises(Error) as info:
                await source.call_tool("remote_ref", {"x": 1})
            assert info.value.details == {
                "tool": "remote_ref",
                "unsafe_schema": "input",
                "reason": "remote_ref",
            }
            await trio.sleep(0.2)
        assert connections == 0
        nursery.cancel_scope.cancel()


# -- MCP-06 ------------------------------------------------------------------------


async def test_mcp_06_which_refusals_leave_a_tool_out() -> None:
    """MCP-06: a refused or unbuildable inputSchema always leaves the tool out;
    a refused or unbuildable outputSchema only with validate_structured_content."""
    async with server() as source:
        names = {d.name for d in source.descriptors}
        assert names == LISTED | {"remote_output", "unbuildable_output"}
        assert {r.name for r in source.rejected} == ALWAYS_REFUSED | BAD_NAMES
        ignored = next(d for d in source.descriptors if d.name == "unbuildable_output")
        assert ignored.output_schema is None
    async with server(validate_structured_content=True) as source:
        assert {d.name for d in source.descriptors} == LISTED
        assert {r.name for r in source.rejected} == (
            ALWAYS_REFUSED | BAD_NAMES | {"remote_output", "unbuildable_output"}
        )
        assert refusal(source, "unbuildable_output").details["reason"] == "build_failed"
        lookup = next(d for d in source.descriptors if d.name == "lookup")
        assert lookup.output_schema is not None


# -- MCP-07 ------------------------------------------------------------------------


async def test_mcp_07_calling_a_refused_tool_raises_before_sending() -> None:
    """MCP-07: unsafe_schema input/output with the refusal reason and class
    (build_failed for a compile failure); nothing reaches the server."""
    expected = {
        "remote_ref": (ErrorClass.VALIDATION, "input", "remote_ref"),
        "broken_pattern": (ErrorClass.VALIDATION, "input", "build_failed"),
        "ancient": (ErrorClass.UNSUPPORTED_CAPABILITY, "input", "build_failed"),
        "deep": (ErrorClass.EXECUTION_FAILURE, "input", "too_deep"),
        "unbuildable_output": (ErrorClass.VALIDATION, "output", "build_failed"),
    }
    async with server(validate_structured_content=True) as source:
        for name, (error_class, role, reason) in expected.items():
            with pytest.raises(Error) as info:
                await source.call_tool(name, {})
            assert info.value.error_class is error_class, name
            assert info.value.details["unsafe_schema"] == role
            assert info.value.details["reason"] == reason
            assert "cause" not in info.value.details  # diagnostics stay with Rejected
        assert await server_calls(source) == []


async def test_mcp_07_backend_refusal_is_a_rejection() -> None:
    """MCP-07/TOOL-19: the backend turns a refusal before sending into
    reject(operation, error): an ordinary error result, not an uncertain one."""
    async with server(validate_arguments=True) as source:
        lookup = next(d for d in source.descriptors if d.name == "lookup")
        outcome = await lookup.backend.execute(operation("lookup", {"user": {"id": -1}}))
        assert isinstance(outcome, Rejection)
        assert outcome.error.details["reason"] == "invalid_arguments"
        fail = next(d for d in source.descriptors if d.name == "fail")
        result = await fail.backend.execute(operation("fail", {}))
        assert isinstance(result, ToolResult)
        assert result.is_error is True
        assert await server_calls(source) == ["fail"]


# -- MCP-08 ------------------------------------------------------------------------


async def test_mcp_08_invalid_arguments_are_never_sent() -> None:
    """MCP-08: validation / invalid_arguments with the validator's errors."""
    async with server(validate_arguments=True) as source:
        with pytest.raises(Error) as info:
            await source.call_tool("lookup", {"user": {"id": 0}})
        error = info.value
        assert error.error_class is ErrorClass.VALIDATION
        assert error.details["reason"] == "invalid_arguments"
        assert error.details["errors"][0]["instance_path"] == "/user/id"
        assert await server_calls(source) == []
        ok = await source.call_tool("lookup", {"user": {"id": 7}})
        assert ok.structured_content == {"id": 7, "name": "user-7"}


# -- MCP-09 ------------------------------------------------------------------------


async def test_mcp_09_structured_content_checked_against_output_schema() -> None:
    """MCP-09: a mismatch or an absent structuredContent is malformed_result /
    invalid_structured_content."""
    async with server(validate_structured_content=True) as source:
        for mode in ("bad", "missing"):
            with pytest.raises(Error) as info:
                await source.call_tool("lookup", {"user": {"id": 1}, "mode": mode})
            assert info.value.error_class is ErrorClass.MALFORMED_RESULT
            assert info.value.details["reason"] == "invalid_structured_content"
        assert info.value.details["errors"] == []
        ok = await source.call_tool("lookup", {"user": {"id": 2}})
        assert ok.structured_content == {"id": 2, "name": "user-2"}


def test_mcp_09_explicit_null_is_validated_as_a_value() -> None:
    """MCP-09: an explicit null is a value: it fails an object schema and
    passes a schema that allows null (the SDK's server never sends one)."""
    catalog = McpCatalog(validate_structured_content=True)
    catalog.admit(
        [
            {"name": "obj", "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"}},
            {"name": "nul", "inputSchema": {"type": "object"}, "outputSchema": {"type": "null"}},
        ]
    )
    with pytest.raises(Error) as info:
        catalog.result(catalog.prepare("obj", {}), {"content": [], "structuredContent": None})
    assert info.value.details["errors"]
    result = catalog.result(catalog.prepare("nul", {}), {"content": [], "structuredContent": None})
    assert result.structured_content is None
    with pytest.raises(Error):
        catalog.result(catalog.prepare("nul", {}), {"content": []})  # absent is not null


# -- MCP-10 ------------------------------------------------------------------------


async def test_mcp_10_is_error_and_schemaless_results_unchecked() -> None:
    """MCP-10: an isError result is never checked (even with an outputSchema),
    nor is a tool without outputSchema; structuredContent may be any JSON."""
    async with server(validate_structured_content=True) as source:
        failed = await source.call_tool("fail", {})
        assert failed.is_error is True
        plain = await source.call_tool("plain", {"k": [1]})
        assert plain.structured_content == {"tool": "plain", "arguments": {"k": [1]}}
    catalog = McpCatalog(validate_structured_content=True)
    catalog.admit([{"name": "free", "inputSchema": {"type": "object"}}])
    tool = catalog.prepare("free", {})
    for value in ({"a": 1}, [1, "b"], "text", 3.5, True, None):
        raw = {"content": [], "structuredContent": value}
        assert catalog.result(tool, raw).structured_content == value


# -- MCP-11, MCP-12, MCP-13 -----------------------------------------------------------


async def test_mcp_11_relisting_reuses_validators_and_refusals(
    bounds_log: list[tuple[str, Any]],
) -> None:
    """MCP-11: relisting unchanged tools runs neither check_bounds nor a build."""
    async with server(
        validate_structured_content=True, validator=CountingValidator(bounds_log)
    ) as source:
        first = len(bounds_log)
        assert first > 0
        builds = source.catalog.cache.builds
        await source.refresh()
        await source.refresh()
        assert len(bounds_log) == first
        assert source.catalog.cache.builds == builds
        assert {r.name for r in source.rejected} >= ALWAYS_REFUSED  # refusals cached too


async def test_mcp_12_a_definition_holding_nan_keeps_one_fingerprint() -> None:
    """MCP-11, MCP-12: a tool whose (ignored) outputSchema holds NaN, which
    the SDK's parser accepts, still has a fingerprint: relisting it leaves
    its revision alone (it used to rise at every refresh, the tool having
    no identity), and a descriptor of it stays current."""
    tools = '[{"name": "odd", "inputSchema": {"type": "object"}, "outputSchema": {"maximum": NaN}}]'
    async with raw_server({"RAW_TOOLS": tools}) as source:
        [first] = source.descriptors
        fingerprint = source.catalog.tools["odd"].fingerprint
        assert isinstance(fingerprint, str)
        await source.refresh()
        await source.refresh()
        [again] = source.descriptors
        assert again.revision == first.revision == 1
        assert source.catalog.tools["odd"].fingerprint == fingerprint
        result = await first.backend.execute(operation("odd", {"n": 1}))
        assert isinstance(result, ToolResult)
        assert result.is_error is False


async def test_a_closed_source_refuses_a_call_before_sending(tmp_path: Path) -> None:
    """TOOL-19: a descriptor whose source was closed (a server being
    restarted) gives a rejection, certain nothing was sent: the model sees
    an is_error result and the run goes on, never unknown_outcome."""
    async with server() as source:
        pass  # closed: its descriptors stay
    provider = ScriptedProvider(
        [ScriptedProvider.tool_calls(("c1", "plain", {})), ScriptedProvider.text("done")]
    )
    snapshot = await converse(source, provider, "closed-1")
    assert snapshot.run.state == "completed"
    [message] = [m for m in snapshot.messages if m.get("role") == "tool"]
    assert message["result"]["is_error"] is True
    assert message["result"]["error"]["class"] == "resource_conflict"


async def test_mcp_12_changed_definition_gets_new_fingerprint(
    bounds_log: list[tuple[str, Any]],
) -> None:
    """MCP-12: after tools/list_changed the source is stale; a refresh rebuilds
    only changed tools, under new fingerprints and revisions."""
    async with server(validate_arguments=True, validator=CountingValidator(bounds_log)) as source:
        before = {d.name: d for d in source.descriptors}
        old_lookup = source.catalog.tools["lookup"]
        with pytest.raises(Error):
            await source.call_tool("legacy", {"tags": ["a", 1]})
        assert not source.stale
        await source.call_tool("change_tools", {})
        with trio.fail_after(10):
            await source.wait_stale()
        assert source.stale
        mark = len(bounds_log)
        after = {d.name: d for d in await source.refresh()}
        assert not source.stale
        rebuilt = [s for kind, s in bounds_log[mark:] if kind == "build"]
        assert len(rebuilt) == 3  # lookup (description), legacy (schema), added_later
        new_lookup = source.catalog.tools["lookup"]
        assert new_lookup.fingerprint != old_lookup.fingerprint
        assert (after["lookup"].revision, after["legacy"].revision) == (2, 2)
        assert after["plain"].revision == before["plain"].revision == 1
        assert "added_later" in after
        result = await source.call_tool("legacy", {"tags": ["a", 1]})  # new schema applies
        assert result.is_error is False
        stale_call = await before["lookup"].backend.execute(
            operation("lookup", {"user": {"id": 1}})
        )
        assert isinstance(stale_call, Rejection)
        assert stale_call.error.details["reason"] == "stale_tool"


def test_mcp_13_full_cache_is_emptied_on_insertion() -> None:
    """MCP-13: never more than 4 096 entries; inserting into a full cache empties it."""
    assert CACHE_SIZE == 4096
    cache = ValidatorCache()
    assert cache.maxsize == 4096
    for i in range(CACHE_SIZE):
        cache.put(f"k{i}", i)
    assert len(cache) == CACHE_SIZE
    cache.put("k0", "again")  # an existing key is no insertion
    assert len(cache) == CACHE_SIZE
    cache.put("new", 1)
    assert len(cache) == 1
    assert "new" in cache
    assert "k1" not in cache
    catalog = McpCatalog(cache=ValidatorCache(maxsize=2))
    catalog.admit([{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(3)])
    assert len(catalog.cache) == 1
    assert set(catalog.tools) == {"t0", "t1", "t2"}


# -- MCP-14 ------------------------------------------------------------------------


async def test_mcp_14_conversation_sees_error_results_and_continues() -> None:
    """MCP-14 (and MCP-01): in a Conversation, arguments failing the inputSchema
    give an is_error validation result and the server is not called, even with
    the adapter's flags off; a server isError result is an is_error result;
    the provider continues and the run completes."""
    async with server() as source:
        provider = ScriptedProvider(
            [
                ScriptedProvider.tool_calls(
                    ("c1", "lookup", {"user": {"id": "seven"}}),
                    ("c2", "fail", {}),
                    ("c3", "github::get_me", {}),
                ),
                ScriptedProvider.text("done"),
            ]
        )
        snapshot = await converse(source, provider, "run-mcp")
        assert snapshot.run.state == "completed"
        tools = {m["tool_call_id"]: m for m in map(thaw, snapshot.messages) if m["role"] == "tool"}
        assert tools["c1"]["result"]["is_error"] is True
        assert tools["c1"]["result"]["error"]["class"] == "validation"
        assert tools["c2"]["result"]["is_error"] is True
        assert tools["c2"]["result"]["content"][0]["text"] == "the tool failed"
        assert tools["c3"]["name"] == "github::get_me"
        assert tools["c3"]["result"]["is_error"] is False
        assert len(provider.requests) == 2
        assert await server_calls(source) == ["fail", "github::get_me"]


# -- MCP-15 ------------------------------------------------------------------------


async def test_mcp_15_names_rule_and_annotations_are_hints() -> None:
    """MCP-15: bad names are left out without affecting others; github::get_me is
    kept; readOnlyHint never makes a descriptor read_only."""
    async with server() as source:
        names = {d.name for d in source.descriptors}
        assert "github::get_me" in names
        assert not names & BAD_NAMES
        for name in BAD_NAMES:
            assert refusal(source, name).details["reason"] == "invalid_tool_name"
        get_me = next(d for d in source.descriptors if d.name == "github::get_me")
        assert source.catalog.tools["github::get_me"].annotations["readOnlyHint"] is True
        assert get_me.read_only is False
        assert all(d.read_only is False for d in source.descriptors)
        result = await source.call_tool("github::get_me", {})
        assert result.structured_content["tool"] == "github::get_me"


# -- the rest: slow tools, diagnostics, teardown ---------------------------------------


async def test_slow_tool_timeout_is_classed_and_uncertain() -> None:
    """A call that outlives call_timeout is a timeout whose outcome is uncertain;
    cancelling a call leaves the source usable."""
    async with server(call_timeout=0.5) as source:
        with pytest.raises(Error) as info:
            await source.call_tool("slow", {"seconds": 5})
        assert info.value.error_class is ErrorClass.TIMEOUT
        assert info.value.details["certainty"] == "uncertain"
        with trio.move_on_after(0.2) as scope:
            await source.call_tool("slow", {"seconds": 5})
        assert scope.cancelled_caught
        assert await server_calls(source) == ["slow", "slow"]


@pytest.mark.parametrize("code", [-32000, -32603])
async def test_server_error_on_a_healthy_connection_is_a_refusal(code: int) -> None:
    """A JSON-RPC error the server sends (-32000 is a generic server error,
    the same number as the SDK's own "connection closed") is
    ``execution_failure`` "MCP server refused ...", uncertain for a call,
    and the connection goes on working."""
    async with server(env={"MCP_TEST_REFUSE_CODE": str(code)}) as source:
        with pytest.raises(Error) as exc:
            await source.call_tool("plain", {})
        assert await server_calls(source) == ["plain"]
    error = exc.value
    assert error.error_class is ErrorClass.EXECUTION_FAILURE
    assert error.message == "MCP server refused tools/call"
    assert error.details["code"] == code
    assert error.details["server_message"] == "database is locked, refusing"
    assert error.details["certainty"] == "uncertain"


_REFUSE_EVERYTHING = """
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" in message:
        error = {"code": -32000, "message": "database is locked, refusing"}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}), flush=True)
"""


async def test_server_refusing_initialize_is_a_refusal() -> None:
    """A server that answers ``initialize`` with a -32000 error refused it:
    ``execution_failure``, not a closed connection."""
    with trio.fail_after(30), pytest.raises(Error) as exc:
        async with connect_stdio(sys.executable, ["-c", _REFUSE_EVERYTHING], read_timeout=5):
            pass
    assert exc.value.error_class is ErrorClass.EXECUTION_FAILURE
    assert exc.value.message == "MCP server refused initialize"
    assert exc.value.details["code"] == -32000


_EXIT_ON_CALL = """
import json, os, sys
for line in sys.stdin:
    message = json.loads(line)
    method, key = message.get("method"), message.get("id")
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {},
                  "serverInfo": {"name": "exits", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        os._exit(3)
    else:
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": key, "result": result}), flush=True)
"""


async def test_connection_closed_by_the_sdk_stays_transient() -> None:
    """The SDK's own "connection closed" (a server that exits mid-call) is
    still ``transient_transport`` "MCP connection closed", uncertain."""
    with trio.fail_after(30), pytest.raises(Error) as exc:
        async with connect_stdio(sys.executable, ["-c", _EXIT_ON_CALL], read_timeout=5) as source:
            await source.call_tool("echo", {})
    assert exc.value.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert exc.value.message == "MCP connection closed"
    assert exc.value.details["certainty"] == "uncertain"


async def test_rejected_diagnostics_are_trusted_host_data() -> None:
    """Refusals are kept as Rejected: unserializable, repr without details."""
    async with server(env={"MCP_TEST_REF_PORT": "4242"}) as source:
        rejected = next(r for r in source.rejected if r.name == "remote_ref")
        assert "4242" not in repr(rejected)
        with pytest.raises(TypeError):
            json.dumps(rejected)
    with pytest.raises(Error) as info:
        await source.call_tool("plain", {})  # the block is left: disconnected
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT


def test_validator_must_follow_the_protocol() -> None:
    with pytest.raises(Error):
        McpCatalog(validator=object())  # type: ignore[arg-type]
    with pytest.raises(Error):
        McpCatalog(validate_arguments=1)  # type: ignore[arg-type]


async def test_stdio_server_that_cannot_start_is_a_classed_error(tmp_path: Path) -> None:
    """A server command that does not exist, or exits before initializing,
    raises a classed Error naming the command, never a raw OSError or the
    SDK's exception group."""
    missing = str(tmp_path / "no-such-server")
    with trio.fail_after(30), pytest.raises(Error) as info:
        async with connect_stdio(missing):
            raise AssertionError("connected to a missing command")
    assert info.value.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert info.value.details["server"] == missing
    with trio.fail_after(30), pytest.raises(Error) as info:
        async with connect_stdio(sys.executable, ["-c", "pass"], read_timeout=5):
            raise AssertionError("connected to a server that exited")
    assert info.value.error_class is ErrorClass.TRANSIENT_TRANSPORT
    assert info.value.details["method"] == "initialize"


@pytest.mark.parametrize(
    ("message", "data", "closed"),
    [
        ("Connection closed", None, True),  # stdio
        ("SSE stream ended without a response", None, True),  # streamable HTTP
        ("SSE stream ended and reconnection attempts were exhausted", None, True),
        ("SSE stream failed: ReadError()", None, True),
        ("database is locked, refusing", None, False),  # a server's own -32000
        ("Connection closed", {"from": "the server"}, False),
    ],
)
def test_the_sdks_own_connection_losses_are_transient(
    message: str, data: Any, closed: bool
) -> None:
    """A -32000 the SDK synthesizes for a lost connection (stdio, or a
    streamable-HTTP request whose response can never arrive) is
    ``transient_transport``, uncertain for a call; the same code sent by a
    server on a healthy connection is a refusal (``execution_failure``)."""
    from mcp.shared.exceptions import MCPError

    from trio_backplane.adapters.mcp._errors import mcp_error as _mcp_error

    error = _mcp_error("tools/call", MCPError(code=-32000, message=message, data=data), tool="t")
    expected = ErrorClass.TRANSIENT_TRANSPORT if closed else ErrorClass.EXECUTION_FAILURE
    assert error.error_class is expected
    assert error.details["certainty"] == "uncertain"


# -- hostile listings ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("paging", "reason"), [("repeat", "repeated_cursor"), ("endless", "too_many_pages")]
)
async def test_mcp_06_a_listing_that_never_ends_is_refused(
    paging: str, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MCP-06 (a listing must end): a server repeating a tools/list cursor,
    or sending new ones forever, fails connect with a classed
    ``malformed_result`` instead of hanging (and growing) forever."""
    monkeypatch.setattr(_wire, "_MAX_LIST_PAGES", 20)
    with trio.fail_after(20), pytest.raises(Error) as info:
        async with raw_server({"RAW_PAGING": paging}):
            raise AssertionError("connected to a listing that never ends")
    assert info.value.error_class is ErrorClass.MALFORMED_RESULT
    assert info.value.details["reason"] == reason
    assert info.value.details["pages"] == (2 if paging == "repeat" else 20)


async def test_mcp_06_a_listing_of_too_many_tools_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MCP-06: the tools of one listing are bounded too, last page included."""
    monkeypatch.setattr(_wire, "_MAX_LISTED_TOOLS", 3)
    tools = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(4)]
    with trio.fail_after(20), pytest.raises(Error) as info:
        async with raw_server({"RAW_TOOLS": json.dumps(tools)}):
            raise AssertionError("connected to a listing of too many tools")
    assert info.value.error_class is ErrorClass.MALFORMED_RESULT
    assert info.value.details["reason"] == "too_many_tools"


@pytest.mark.parametrize("validate", [False, True])
async def test_mcp_03_06_one_tool_the_sdk_cannot_model_loses_no_other(validate: bool) -> None:
    """MCP-03, MCP-06: the listing is admitted tool by tool, not through the
    SDK's whole-page model, so a tool it rejects (an inputSchema typed
    ``["object"]`` or without root type, an array outputSchema: all
    accepted; an array inputSchema or junk: refused) costs no other tool."""
    tools = [
        {"name": "good", "inputSchema": {"type": "object"}},
        {"name": "list_typed", "inputSchema": {"type": ["object"]}},
        {"name": "untyped", "inputSchema": {"properties": {"a": {"type": "string"}}}},
        {
            "name": "array_out",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "array", "items": {"type": "integer"}},
        },
        {"name": "array_in", "inputSchema": {"type": "array"}},
        {"name": "schemaless"},
        "not a tool",
    ]
    env = {"RAW_TOOLS": json.dumps(tools)}
    async with raw_server(env, validate_structured_content=validate) as source:
        assert {d.name for d in source.descriptors} == {
            "good",
            "list_typed",
            "untyped",
            "array_out",
        }
        assert {r.name for r in source.rejected} == {"array_in", "schemaless", ""}
        root = refusal(source, "array_in")
        assert root.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert root.details["reason"] == "root_not_object"
        bundle = source.admit(caller="host", run_id="run-1")
        assert {d.name for d in bundle.registry} == {d.name for d in source.descriptors}
        assert (await source.call_tool("list_typed", {})).is_error is False


@pytest.mark.parametrize("validate", [False, True])
async def test_mcp_10_structured_content_of_any_json_type_is_taken(validate: bool) -> None:
    """MCP-10: a result's structuredContent may be any JSON value, and an
    isError result is never checked, even for a tool with an outputSchema:
    the SDK's result model (an object or nothing) does not decide.  A result
    that is not one (bad content, a non-boolean isError) is still
    ``malformed_result`` ``invalid_result``, uncertain."""
    tools = [
        {"name": "plain", "inputSchema": {"type": "object"}},
        {
            "name": "typed",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object", "required": ["x"]},
        },
    ]
    env = {"RAW_TOOLS": json.dumps(tools)}
    async with raw_server(env, validate_structured_content=validate) as source:
        for value in ([1, 2], "text", 5, 2.5, True, None, {"k": 1}):
            for is_error in (False, True):
                sent = {"content": [], "structuredContent": value, "isError": is_error}
                result = await source.call_tool("plain", {"result": sent})
                assert (result.structured_content, result.is_error) == (value, is_error)
                if is_error or not validate:
                    result = await source.call_tool("typed", {"result": sent})
                    assert (result.structured_content, result.is_error) == (value, is_error)
        absent = await source.call_tool("plain", {"result": {"content": []}})
        assert absent.structured_content is None
        for malformed in (
            {"content": [{"type": "hologram"}]},
            {"content": "text"},
            {"content": [], "isError": "yes"},
            {"structuredContent": {}},
        ):
            with pytest.raises(Error) as info:
                await source.call_tool("plain", {"result": malformed})
            assert info.value.error_class is ErrorClass.MALFORMED_RESULT
            assert info.value.details["reason"] == "invalid_result"
            assert info.value.details["certainty"] == "uncertain"


class _Opaque:
    pass


@pytest.mark.parametrize("validate", [False, True])
async def test_mcp_08_arguments_that_are_not_json_are_never_sent(validate: bool) -> None:
    """MCP-08, whatever ``validate_arguments`` says: arguments that are not a
    JSON object of JSON data are refused with ``validation``
    ``invalid_arguments`` before a request is built, never a raw pydantic or
    Unicode error; NaN is not sent as null, and a lone surrogate does not
    kill the session (the backend makes each a Rejection, TOOL-19)."""
    bad: list[Any] = [
        [1, 2],
        "text",
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": b"\xff"},
        {"x": {1, 2}},
        {"x": _Opaque()},
        {1: "a"},
        {"x": "\ud800"},
    ]
    async with raw_server({}, validate_arguments=validate) as source:
        plain = next(d for d in source.descriptors if d.name == "plain")
        for arguments in bad:
            with pytest.raises(Error) as info:
                await source.call_tool("plain", arguments)
            assert info.value.error_class is ErrorClass.VALIDATION
            assert info.value.details["reason"] == "invalid_arguments"
            outcome = await plain.backend.execute(operation("plain", arguments))
            assert isinstance(outcome, Rejection)
            assert outcome.error.details["reason"] == "invalid_arguments"
        calls = await source.call_tool("calls", {})
        assert calls.structured_content == {"calls": []}
        sent = await source.call_tool("plain", {"x": [1, 2.5, "é"]})
        assert sent.structured_content == {"arguments": {"x": [1, 2.5, "é"]}}


# -- a broken stdio transport ----------------------------------------------------------


async def test_non_utf8_server_output_does_not_hang_a_call() -> None:
    """A line of non-UTF-8 bytes on the server's stdout is one unparsable
    message, not a dead reader that leaves every call waiting forever: the
    response after it arrives."""
    async with raw_server({"RAW_GARBAGE": "1"}) as source:
        with trio.fail_after(5):
            result = await source.call_tool("plain", {"n": 1})
        assert result.structured_content == {"arguments": {"n": 1}}


async def test_unparseable_response_fails_its_call_at_once() -> None:
    """A response the SDK cannot parse (here a result escaping a lone
    surrogate, which JSON text may hold but the SDK's models refuse) fails
    its call with ``malformed_result`` at once, uncertain (the server ran
    it), instead of leaving it waiting for ever with no ``call_timeout``; the
    connection goes on serving calls.  A listing the SDK cannot parse fails
    ``refresh`` the same way."""
    result = json.dumps({"content": [{"type": "text", "text": "a\ud800b"}]})
    async with raw_server({"RAW_RESULT": result}, call_timeout=None) as source:
        assert source.call_timeout is None
        with trio.fail_after(10), pytest.raises(Error) as exc:
            await source.call_tool("plain", {"n": 1})
        error = exc.value
        assert error.error_class is ErrorClass.MALFORMED_RESULT
        assert error.details["reason"] == "unparseable_response"
        assert error.details["certainty"] == "uncertain"
        assert error.details["tool"] == "plain"
        assert "Invalid JSON" in error.details["cause"]
        with trio.fail_after(10):
            assert await server_calls(source) == [["plain", {"n": 1}]]

    tools = json.dumps([{"name": "plain", "description": "\udc00", "inputSchema": {}}])
    with trio.fail_after(30), pytest.raises(Error) as exc:
        async with connect_stdio(sys.executable, [RAW_SERVER], env={"RAW_TOOLS": tools}):
            pass  # pragma: no cover - the first listing fails
    assert exc.value.error_class is ErrorClass.MALFORMED_RESULT
    assert exc.value.details["reason"] == "unparseable_response"
    assert exc.value.details["method"] == "tools/list"


async def test_no_call_timeout_means_no_limit_whatever_the_read_timeout() -> None:
    """``call_timeout=None`` is no limit on a call: a call longer than the
    connection's ``read_timeout`` (which bounds every request but calls)
    completes, never cut as a timeout."""
    async with raw_server({"RAW_CALL_DELAY": "1.5"}, call_timeout=None, read_timeout=0.5) as source:
        with trio.fail_after(10):
            result = await source.call_tool("plain", {"n": 1})
        assert result.structured_content == {"arguments": {"n": 1}}


@pytest.mark.parametrize(
    "line",
    [
        '{"jsonrpc": "2.0", "id": "__ID__", "result": null}',
        '{"jsonrpc": "2.0", "id": "__ID__", "result": []}',
        '{"jsonrpc": "2.0", "id": "__ID__", "result": "done"}',
        '{"jsonrpc": "2.0", "id": "__ID__", "error": "boom"}',
        '{"jsonrpc": "2.0", "id": "__ID__", "error": {"message": "no code"}}',
        '{"id": "__ID__", "result": {"content": []}}',
        '{"jsonrpc": "2.0", "id": "__ID__", "result": {"n": ' + "9" * 5000 + "}}",
    ],
    ids=["null", "array", "str", "str-error", "no-code", "no-jsonrpc", "huge-int"],
)
async def test_a_response_the_sdk_refuses_fails_its_call_at_once(line: str) -> None:
    """A response with the call's id that the SDK's JSON-RPC models refuse
    (a result that is not an object, an error without a code, no
    ``jsonrpc`` member, a number past Python's digit limit) fails the call
    at once, ``malformed_result`` uncertain, never a wait for a response
    that already came (nor, with a read timeout, a misclassified timeout)."""
    async with raw_server({"RAW_CALL_LINE": line}, call_timeout=None) as source:
        with trio.fail_after(10), pytest.raises(Error) as exc:
            await source.call_tool("plain", {"n": 1})
        assert exc.value.error_class is ErrorClass.MALFORMED_RESULT, exc.value
        assert exc.value.details["reason"] == "unparseable_response"
        assert exc.value.details["certainty"] == "uncertain"
        with trio.fail_after(10):
            assert await server_calls(source) == [["plain", {"n": 1}]]


@pytest.mark.parametrize("read_timeout", ["5", float("nan"), 0, -1.0, True])
async def test_a_bad_read_timeout_is_validation_before_anything_starts(read_timeout: Any) -> None:
    """``read_timeout`` is checked like ``call_timeout``: ``validation``
    before the server is started, never a transport failure to retry."""
    for connect in (
        lambda: connect_stdio(
            sys.executable, ["-c", "raise SystemExit(3)"], read_timeout=read_timeout
        ),
        lambda: mcp_adapter.connect_streamable_http(
            "http://127.0.0.1:9/mcp", read_timeout=read_timeout
        ),
    ):
        with pytest.raises(Error) as exc:
            async with connect():
                pass  # pragma: no cover
        assert exc.value.error_class is ErrorClass.VALIDATION
        assert exc.value.details["argument"] == "read_timeout"


async def test_host_timeout_on_a_failed_connection_is_too_slow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's own ``fail_after`` firing while the connection has failed
    (here a strict decoder dies on non-UTF-8 output, which the SDK's reader
    never reports) is TooSlowError: a cancellation from outside propagates
    as it is, not as a raw ExceptionGroup of the transport's errors (the
    rule ``_open`` documents; no MCP- behaviour covers the transport)."""
    real = _connect.StdioServerParameters

    def strict(**options: Any) -> Any:
        return real(**{**options, "encoding_error_handler": "strict"})

    async def call_until(scope: trio.CancelScope) -> None:
        async with connect_stdio(sys.executable, [RAW_SERVER], env={"RAW_GARBAGE": "1"}) as source:
            scope.deadline = trio.current_time() + 0.5  # connected: the host waits no more
            await source.call_tool("plain", {})

    monkeypatch.setattr(_connect, "StdioServerParameters", strict)
    with pytest.raises(trio.TooSlowError), trio.fail_after(30) as scope:
        await call_until(scope)


async def test_every_argument_refusal_names_its_cause_the_tool_and_the_reason() -> None:
    """Refused before sending, whatever the cause (a non-string key, a
    value past the boundary's size limit, a schema mismatch): ``validation``
    with the cause in the message, ``reason`` ``invalid_arguments`` and the
    tool in the details; nothing reaches the server."""
    async with server(validate_arguments=True) as source:
        causes = {
            "non-string key": ({"user_id": "u1", 3: 4}, "has a key that is not a string (int)"),
            "too large": ({"user_id": "x" * 2_000_000}, "input_too_large"),
            "mismatch": ({"user_id": 7}, "do not match its inputSchema"),
        }
        for label, (arguments, cause) in causes.items():
            with pytest.raises(Error) as refused:
                await source.call_tool("lookup", arguments)
            error = refused.value
            assert error.error_class is ErrorClass.VALIDATION, label
            assert error.message.startswith("arguments of MCP tool 'lookup' refused: "), label
            assert cause in error.message, label
            assert error.details["reason"] == "invalid_arguments", label
            assert error.details["tool"] == "lookup", label
            assert cause in error.details["cause"], label
        assert await server_calls(source) == []


def _server_pids() -> list[int]:
    """The pids of this process's ``mcp_server.py`` children."""
    import os

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(status.split("PPid:")[1].split()[0])
        if parent == os.getpid() and b"mcp_server.py" in command:
            found.append(int(entry))
    return found


async def test_a_call_to_a_server_known_dead_is_not_sent_and_the_run_goes_on() -> None:
    """A stdio server killed while idle: the call that finds its connection
    closed was never written, so it is refused as ``not_sent`` (the tool
    message an error, the run completing, not ``unknown_outcome``) and the
    source says it is closed; a direct call is refused the same way."""
    import os
    import signal

    async with server() as source:
        [pid] = _server_pids()
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(10):  # until the session has seen its end
            while not source.session._dispatcher._closed:  # type: ignore[union-attr]
                await trio.sleep(0.01)
        provider = ScriptedProvider(
            [ScriptedProvider.tool_calls(("c1", "plain", {})), ScriptedProvider.text("done")]
        )
        snapshot = await converse(source, provider, "run-dead")
        assert snapshot.run.state == "completed"
        [message] = [m for m in snapshot.messages if m["role"] == "tool"]
        error = message["result"]["error"]
        assert error["details"]["certainty"] == "not_sent"
        assert error["details"]["tool"] == "plain"
        assert source.closed
        with pytest.raises(Error) as refused:
            await source.call_tool("plain", {})
        assert refused.value.error_class is ErrorClass.RESOURCE_CONFLICT  # not connected


async def test_a_task_only_tool_of_a_server_without_tasks_is_refused_at_listing() -> None:
    """A tool whose ``execution.taskSupport`` is ``required``, listed by a
    server whose capabilities offer no tasks, is left out with why
    (``tasks_unsupported``), not admitted as a tool that always fails; an
    ``optional`` one is admitted and called plainly."""
    tools = json.dumps(
        [
            {"name": "only_task", "inputSchema": {"type": "object"},
             "execution": {"taskSupport": "required"}},
            {"name": "maybe_task", "inputSchema": {"type": "object"},
             "execution": {"taskSupport": "optional"}},
        ]
    )  # fmt: skip
    async with raw_server({"RAW_TOOLS": tools}, task_calls="optional") as source:
        assert [d.name for d in source.descriptors] == ["maybe_task"]
        error = refusal(source, "only_task")
        assert error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert error.details["reason"] == "tasks_unsupported"
        result = await source.call_tool("maybe_task", {"n": 1})
        assert result.structured_content == {"arguments": {"n": 1}}


async def test_a_created_task_whose_id_cannot_be_recorded_is_cancelled() -> None:
    """The run stops (or its store fails) as the task's id is recorded: the
    task the server created is cancelled, never left running unknown."""
    from trio_backplane.adapters.mcp._tasks import call_as_task

    sent: list[str] = []

    async def send(method: str, params: Any) -> Any:
        sent.append(method)
        return {"task": {"taskId": "t-1", "status": "working"}}

    async def record(evidence: Any) -> None:
        raise Error(ErrorClass.STORAGE_FAILED, "store is unavailable")

    with pytest.raises(Error):
        await call_as_task(send, "research", {}, record=record)
    assert sent == ["tools/call", "tasks/cancel"]


async def test_a_task_poll_never_sent_leaves_the_task_uncertain() -> None:
    """The connection closes after the task was created: the poll that
    could not be written is no "not sent" refusal (the task exists and may
    run), so the call's outcome stays unknown."""
    from trio_backplane.adapters.mcp._errors import NOT_SENT, mcp_error
    from trio_backplane.adapters.mcp._sdk import MCPError
    from trio_backplane.adapters.mcp._tasks import call_as_task

    async def send(method: str, params: Any) -> Any:
        if method == "tools/call":
            return {"task": {"taskId": "t-1", "status": "working", "pollInterval": 50}}
        raise MCPError(-32000, "Connection closed", NOT_SENT)

    with pytest.raises(MCPError) as lost:
        await call_as_task(send, "research", {})
    error = mcp_error("tools/call", lost.value, tool="research")
    assert error.details["certainty"] == "uncertain"
