"""Bad input gets a classed ``Error``: every public entry point given an
argument of the wrong kind raises ``validation`` (or another class that says
what is wrong), never a raw ``TypeError``/``AttributeError``, and a store
never answers a caller's mistake with ``storage_failed`` (which tells the
runtime the store itself failed and the run needs recovery)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import trio_backplane as tb
from trio_backplane import Error, ErrorClass, kernel, schema, testing
from trio_backplane.kernel import FrozenDict

if TYPE_CHECKING:
    from tests.store.postgres_fixture import StoreFactory

pytest_plugins = ["tests.store.postgres_fixture"]

WRONG: list[Any] = [None, 5, -1, 1.5, math.nan, "", b"x", [], {}, object(), True, ("a",)]
SCHEMA = {"type": "object"}


class Backend:
    async def execute(self, operation: Any) -> tb.ToolResult:
        return tb.ToolResult("ok")  # pragma: no cover - never called


SYNC_ENTRY_POINTS: dict[str, Callable[[Any], Any]] = {
    "ToolRegistry(descriptors)": tb.ToolRegistry,
    "RunRecord.new(context=)": lambda w: kernel.RunRecord.new("r", context=w),
    "transition(record)": lambda w: kernel.transition(w, kernel.Command("admit", 0.0)),
    "transition(Command(kind))": lambda w: kernel.transition(
        kernel.RunRecord.new("r"), kernel.Command(w, 0.0)
    ),
    "SQLiteStore(path)": tb.SQLiteStore,
    "ScriptedProvider(responses)": testing.ScriptedProvider,
    "ScriptedProvider([response])": lambda w: testing.ScriptedProvider([w]),
    "compile(schema)": schema.compile,
    "ToolDescriptor(name)": lambda w: tb.ToolDescriptor(w, SCHEMA, Backend()),
    "Authority(grants)": lambda w: tb.Authority(grants=w),
    "Command(at)": lambda w: kernel.Command("admit", w),
    "Authority.for_registry(registry)": lambda w: tb.Authority.for_registry(
        w, caller="c", run_id="r"
    ),
    "check_bounds(limits=)": lambda w: schema.check_bounds(SCHEMA, limits=w),
    "encode_record(record)": kernel.encode_record,
    "decode_event(data)": kernel.decode_event,
}
#: Values of the wrong kind an entry point takes on purpose.
ACCEPTED: dict[str, tuple[Any, ...]] = {
    "ToolRegistry(descriptors)": ([],),
    "RunRecord.new(context=)": (None, {}),
    "ScriptedProvider(responses)": ([],),
    "compile(schema)": ({},),
    "Authority.for_registry(registry)": ([],),
    "check_bounds(limits=)": (None,),
    "ScriptedProvider([response])": ([], ("a",)),
    "Authority(grants)": ([], {}, ("a",)),
    "Command(at)": (5, -1, 1.5),
}


def _outcome(call: Callable[[Any], Any], wrong: Any) -> Error | None:
    try:
        call(wrong)
    except Error as error:
        return error
    return None


@pytest.mark.parametrize("entry", sorted(SYNC_ENTRY_POINTS))
def test_entry_points_class_arguments_of_the_wrong_kind(entry: str) -> None:
    """Each argument of the wrong kind is refused with a classed Error;
    nothing escapes unclassed (a raw exception fails the test)."""
    call = SYNC_ENTRY_POINTS[entry]
    accepted = ACCEPTED.get(entry, ())
    for wrong in WRONG:
        error = _outcome(call, wrong)
        if error is None:
            assert any(
                wrong is ok or (type(wrong) is type(ok) and wrong == ok) for ok in accepted
            ), (
                entry,
                wrong,
            )
        else:
            assert error.error_class is not ErrorClass.STORAGE_FAILED


#: Per store argument: values of the wrong kind (each must be ``validation``).
STORE_WRONG: dict[str, list[Any]] = {
    # A lone surrogate is no Unicode text: no store could encode it as UTF-8.
    "run_id": [None, 5, "", b"x", [], {}, object(), True, "x" * 257, "caf\udce9"],
    # A generator would be read once by the checks and found empty by the write.
    "events": [
        None,
        "run.admit",
        (event for event in ()),
        iter(()),
        [kernel.RunEvent(type="run.x\ud800", occurred_at=0.0, payload={})],
        [kernel.RunEvent(type=5, occurred_at=0.0, payload={})],  # type: ignore[arg-type]
    ],
    "after": [None, -1, 1.5, math.nan, "1", [], True],
    "incarnation": [None, 0, -1, 1.5, "1", [], True],
    "expected_revision": [None, -1, 1.5, "0", [], True],
    "record": [None, 5, "r", {}, object()],
    "states": ["running", b"x", 5, object(), [5], {"running": 1.5, 5: 1}],
}


async def _store_calls(store: Any) -> None:
    """Every store method with each wrong argument: ``validation`` (or, for
    ``MemoryStore.fence``, its ``unsupported_capability``), nothing changed,
    and the store still works afterwards."""
    record = kernel.RunRecord.new("good-run")
    await store.create(record)
    admitted, events = kernel.transition(record, kernel.Command("admit", 0.0, {"state": "running"}))

    def commit(**given: Any) -> Awaitable[Any]:
        arguments: dict[str, Any] = {
            "run_id": "good-run",
            "incarnation": 1,
            "expected_revision": 0,
            "record": admitted,
            "events": events,
        }
        arguments.update(given)
        run_id = arguments.pop("run_id")
        return store.commit(run_id, **arguments)  # type: ignore[no-any-return]

    calls: list[tuple[str, Callable[[Any], Awaitable[Any]]]] = [
        ("run_id", store.load),
        ("run_id", store.events),
        ("after", lambda w: store.events("good-run", after=w)),
        ("states", lambda w: store.list_runs(states=w)),
        ("run_id", lambda w: commit(run_id=w)),
        ("incarnation", lambda w: commit(incarnation=w)),
        ("expected_revision", lambda w: commit(expected_revision=w)),
        ("record", lambda w: commit(record=w)),
        ("events", lambda w: commit(events=w)),
        ("run_id", lambda w: store.fence(w, incarnation=2)),
        ("incarnation", lambda w: store.fence("good-run", incarnation=w)),
    ]
    expected = {ErrorClass.VALIDATION}
    if not store.durable:
        expected.add(ErrorClass.UNSUPPORTED_CAPABILITY)  # MemoryStore cannot fence at all
    for argument, call in calls:
        for wrong in STORE_WRONG[argument]:
            with pytest.raises(Error) as raised:
                await call(wrong)
            assert raised.value.error_class in expected, (argument, wrong, raised.value)
    assert await store.load("good-run") == record
    assert await store.events("good-run") == []
    await store.commit(
        "good-run", incarnation=1, expected_revision=0, record=admitted, events=events
    )
    assert await store.load("good-run") == admitted


async def test_memory_and_sqlite_stores_refuse_wrong_arguments(tmp_path: Path) -> None:
    await _store_calls(tb.MemoryStore())
    async with tb.SQLiteStore(tmp_path / "s.db") as store:
        await _store_calls(store)


async def test_postgres_store_refuses_wrong_arguments(pg_store_factory: StoreFactory) -> None:
    await _store_calls(pg_store_factory())


async def test_wrong_arguments_are_refused_before_any_io(tmp_path: Path) -> None:
    """The refusals come before any I/O: a SQLite store never used stays
    unopened (no file is created)."""
    path = tmp_path / "never.db"
    store = tb.SQLiteStore(path)
    with pytest.raises(Error):
        await store.load([])  # type: ignore[arg-type]
    with pytest.raises(Error):
        await store.events("r", after=-1)
    with pytest.raises(Error):
        await store.list_runs(states="running")
    with pytest.raises(Error) as info:  # misspelt: it would match nothing, silently
        await store.list_runs(states={"running", "complete"})
    assert info.value.details["unknown"] == ["complete"]
    assert "completed" in info.value.details["states"]
    assert not path.exists()


@pytest.mark.parametrize("argument", ["store", "provider", "context", "provider_context", "run"])
async def test_open_conversation_checks_what_it_is_given(argument: str) -> None:
    """``open_conversation`` refuses a store without create/commit, a provider
    without stream, a context or provider context that is not a mapping and
    a run that is not a RunRecord with ``validation`` naming the argument,
    before calling the store or the provider."""
    for wrong in [5, "x", object(), [], ("a",)]:
        store = tb.MemoryStore()
        provider = testing.ScriptedProvider([testing.ScriptedProvider.text("never")])
        given: dict[str, Any] = {"store": store, "provider": provider, argument: wrong}
        with pytest.raises(Error) as raised:
            async with tb.open_conversation("run-1", **given):
                pytest.fail("opened")  # pragma: no cover
        assert raised.value.error_class is ErrorClass.VALIDATION
        assert raised.value.details["argument"] == argument
        assert await store.load("run-1") is None
        assert provider.requests == []


def _mcp_entry_points() -> dict[str, Callable[[Any], Any]]:
    from trio_backplane.adapters import mcp

    async def enter(manager: Any) -> None:
        async with manager:
            pytest.fail("connected")  # pragma: no cover

    return {
        "McpCatalog.admit(definitions)": lambda w: mcp.McpCatalog().admit(w),
        "tool_fingerprint(definition)": mcp.tool_fingerprint,
        "McpToolSource(session)": mcp.McpToolSource,
        "connect_stdio(command)": lambda w: enter(mcp.connect_stdio(w)),
        "connect_stdio(args)": lambda w: enter(mcp.connect_stdio("true", w)),
        "connect_stdio(env)": lambda w: enter(mcp.connect_stdio("true", env=w)),
        "connect_streamable_http(url)": lambda w: enter(mcp.connect_streamable_http(w)),
    }


MCP_ACCEPTED: dict[str, tuple[Any, ...]] = {
    "McpCatalog.admit(definitions)": ([], ("a",)),  # "a" is a listed tool refused, kept aside
    "tool_fingerprint(definition)": ({},),
    "McpToolSource(session)": (None,),
    "connect_stdio(args)": ([], ("a",)),  # valid argument lists (the server then fails)
    "connect_stdio(env)": (None, {}),
}


def _is_accepted(wrong: Any, accepted: tuple[Any, ...]) -> bool:
    return any(wrong is ok or (type(wrong) is type(ok) and wrong == ok) for ok in accepted)


@pytest.mark.parametrize(
    "entry",
    [
        "McpCatalog.admit(definitions)",
        "tool_fingerprint(definition)",
        "McpToolSource(session)",
        "connect_stdio(command)",
        "connect_stdio(args)",
        "connect_stdio(env)",
        "connect_streamable_http(url)",
    ],
)
async def test_mcp_entry_points_class_arguments_of_the_wrong_kind(entry: str) -> None:
    """The MCP adapter refuses arguments of the wrong kind with
    ``validation`` before it starts a process or opens a connection."""
    call = _mcp_entry_points()[entry]
    accepted = MCP_ACCEPTED.get(entry, ())
    for wrong in [w for w in WRONG if not _is_accepted(w, accepted)]:
        with pytest.raises(Error) as raised:
            await _maybe_await(call, wrong)
        assert raised.value.error_class is ErrorClass.VALIDATION, (entry, wrong)


async def _maybe_await(call: Callable[[Any], Any], argument: Any) -> Any:
    result = call(argument)
    if hasattr(result, "__await__"):
        return await result
    return result


@pytest.mark.parametrize(
    "option", ["system", "extra_body", "client", "aliases", "request", "provider_context"]
)
def test_openai_provider_classes_arguments_of_the_wrong_kind(option: str) -> None:
    """The OpenAI-compatible provider refuses options and stream arguments of
    the wrong kind with ``validation``, before any request."""
    from trio_backplane.adapters.openai import OpenAIProvider, ToolAliases

    url = "http://127.0.0.1:1/v1"
    calls: dict[str, Callable[[Any], Any]] = {
        "system": lambda w: OpenAIProvider(url, "m", system=w),
        "extra_body": lambda w: OpenAIProvider(url, "m", extra_body=w),
        "client": lambda w: OpenAIProvider(url, "m", client=w),
        "aliases": ToolAliases,
        "request": lambda w: OpenAIProvider(url, "m").stream(w, None),
        "provider_context": lambda w: OpenAIProvider(url, "m").stream(_request(), w),
    }
    accepted: dict[str, tuple[Any, ...]] = {
        "system": (None, ""),
        "extra_body": (None, {}),
        "client": (None,),
        "aliases": ([], ("a",)),
        "provider_context": (None, {}),
    }
    extra = [{"x": math.nan}] if option == "extra_body" else []  # not JSON data
    for wrong in [w for w in [*WRONG, *extra] if not _is_accepted(w, accepted.get(option, ()))]:
        with pytest.raises(Error) as raised:
            calls[option](wrong)
        assert raised.value.error_class is ErrorClass.VALIDATION, (option, wrong)


def _request() -> Any:
    return tb.ProviderRequest(
        run_id="r",
        incarnation=1,
        turn_id="t",
        step_id="s",
        attempt_id="a",
        messages=(),
        catalog_revision=1,
        tools=(),
    )


def test_error_to_dict_is_always_json_data() -> None:
    """``Error.to_dict`` is JSON data whatever a raiser put in the details: a
    value that is not JSON data is written as its type name (never its repr,
    which could carry what a backend holds), a non-finite number as its
    name, a str or int subclass as its plain value."""
    import json

    class Secret:
        def __repr__(self) -> str:  # pragma: no cover - must never be called
            return "sk-secret"

    error = Error(
        ErrorClass.FORBIDDEN,
        "no",
        {
            "handle": Secret(),
            "nan": math.nan,
            "class": ErrorClass.VALIDATION,
            "nested": [1, {2: (3, {4})}],
            "ok": {"a": [True, None, 1.5, "x"]},
        },
    )
    data = error.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["details"] == {
        "handle": "<Secret>",
        "nan": "nan",
        "class": "validation",
        "nested": [1, {"2": [3, "<set>"]}],
        "ok": {"a": [True, None, 1.5, "x"]},
    }
    assert "sk-secret" not in json.dumps(data)


def test_error_to_dict_text_is_always_unicode() -> None:
    """``Error.to_dict`` quotes text as Unicode: a lone surrogate (from a
    model's arguments, say) in the message, a detail or a detail's key is
    U+FFFD, so the error can be encoded as UTF-8 and committed."""
    error = Error(
        ErrorClass.VALIDATION, "bad \udc00", {"path": "/\udc00", "\ud800k": ["x\udfff", "é"]}
    )
    data = error.to_dict()
    assert data["message"] == "bad \ufffd"
    assert data["details"] == {"path": "/\ufffd", "\ufffdk": ["x\ufffd", "é"]}
    import json

    json.dumps(data, ensure_ascii=False).encode("utf-8")


async def test_a_backend_error_with_unencodable_details_is_committed() -> None:
    """A tool backend that refuses with an ``Error`` holding an object in its
    details: the run goes on (a read-only tool's rejection is an ordinary
    error result), the result is committed with the detail as its type
    name, and nothing escapes the conversation."""
    import trio

    class Refuses:
        async def execute(self, operation: Any) -> Any:
            return tb.reject(operation, Error(ErrorClass.FORBIDDEN, "no", {"client": object()}))

    registry = tb.ToolRegistry([tb.ToolDescriptor("t", SCHEMA, Refuses(), read_only=True)])
    provider = testing.ScriptedProvider(
        [
            testing.ScriptedProvider.tool_calls(("c1", "t", {})),
            testing.ScriptedProvider.text("done"),
        ]
    )
    with trio.fail_after(30):
        async with tb.open_conversation(
            "run-r",
            store=tb.MemoryStore(),
            provider=provider,
            registry=registry,
            authority=tb.Authority.for_registry(registry, caller="h", run_id="run-r"),
        ) as conversation:
            await conversation.prompt("hi")
            snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    [tool_message] = [m for m in snapshot.messages if m["role"] == "tool"]
    assert tool_message["result"]["error"]["details"] == {"client": "<object>"}


async def _refuses_hand_built_frozen_text(store: Any) -> None:
    record = kernel.RunRecord.new("hand-built", context={"x": FrozenDict({"name": "caf\udce9"})})
    with pytest.raises(Error) as raised:
        await store.create(record)
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert raised.value.details["reason"] == "lone_surrogate"
    assert await store.load("hand-built") is None


async def test_ker_11_durable_stores_refuse_a_lone_surrogate_freeze_never_saw(
    tmp_path: Path,
) -> None:
    """KER-11: a ``FrozenDict`` built by hand skips ``freeze``; a lone
    surrogate in it still never reaches a database as a raw
    ``UnicodeEncodeError``: the store's encoder refuses it with
    ``validation``, before anything is written."""
    async with tb.SQLiteStore(tmp_path / "s.db") as store:
        await _refuses_hand_built_frozen_text(store)


async def test_ker_11_postgres_refuses_a_lone_surrogate_freeze_never_saw(
    pg_store_factory: StoreFactory,
) -> None:
    await _refuses_hand_built_frozen_text(pg_store_factory())


async def test_numbers_too_large_for_a_float_are_classed() -> None:
    """Every timeout option refuses an int too large for a float
    (``10**400``) with ``validation``, and an approval takes it as the
    finite time it is: each raised a raw ``OverflowError`` (``math.isfinite``
    of it)."""
    from trio_backplane.adapters.mcp import McpToolSource
    from trio_backplane.adapters.openai import OpenAIProvider
    from trio_backplane.tools import Approval, ApprovalDecision, decide_approval

    huge = 10**400
    store = tb.MemoryStore()
    provider = testing.ScriptedProvider([testing.ScriptedProvider.text("never")])
    for option in ("run_timeout", "effect_timeout", "commit_timeout", "cleanup_timeout"):
        with pytest.raises(Error) as raised:
            async with tb.open_conversation("r", store=store, provider=provider, **{option: huge}):
                pytest.fail("opened")  # pragma: no cover
        assert raised.value.error_class is ErrorClass.VALIDATION, option
    for option in ("timeout", "tail_timeout"):
        with pytest.raises(Error) as raised:
            OpenAIProvider("http://127.0.0.1:1/v1", "m", **{option: huge})
        assert raised.value.error_class is ErrorClass.VALIDATION, option
    with pytest.raises(Error) as raised:
        McpToolSource(call_timeout=huge)
    assert raised.value.error_class is ErrorClass.VALIDATION
    with pytest.raises(Error) as raised:
        tb.PostgresStore("postgresql://127.0.0.1:1/x", operation_timeout=huge)
    assert raised.value.error_class is ErrorClass.VALIDATION
    bound = {
        "approval_id": "a",
        "run_id": "r",
        "incarnation": 1,
        "tool_name": "t",
        "tool_revision": 1,
        "arguments_digest": "0" * 64,
    }
    assert Approval(**bound, expires_at=huge).expires_at == huge
    approval = Approval(**bound, expires_at=2**60)
    decision = ApprovalDecision(**bound, decision="approved", resolver_id="host")
    with pytest.raises(Error) as raised:
        decide_approval(approval, decision, now=huge)
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert decide_approval(approval, decision, now=2**59) == "approved"
