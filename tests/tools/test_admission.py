"""Batch admission: strict and quarantine modes (CAT-02 .. CAT-13, CAT-15, CAT-16)."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any

import attrs
import pytest

from tests.conftest import FIXTURES
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.schema import Limits, SchemaOptions, compile_with
from trio_backplane.tools import (
    AdmittedBundle,
    Authority,
    ProviderTool,
    Rejected,
    ToolDescriptor,
    ToolRegistry,
    admit_batch,
)

from .support import (
    BACKEND,
    DRAFT_07,
    SyncBackend,
    authority_for,
    draft_07_schema,
    good_schema,
    tool,
    unsupported_schema,
)

DRAFTS = SchemaOptions(dialects={"2020-12", "draft-07"})


def admit(registry: ToolRegistry, **kwargs: Any) -> AdmittedBundle:
    return admit_batch(registry, authority_for(registry), **kwargs)


def test_cat_02_empty_batch_is_empty_everything() -> None:
    """CAT-02: an empty registry gives empty accepted/tools/rejected and no grants."""
    for mode in ("strict", "quarantine"):
        bundle = admit_batch(ToolRegistry(), Authority(caller="host", run_id="r"), mode=mode)
        assert bundle.accepted == ()
        assert bundle.tools == ()
        assert bundle.rejected == ()
        assert len(bundle.registry) == 0
        assert bundle.authority.grants == frozenset()
        assert bundle.authority.caller == "host"
    assert admit_batch([], Authority()).accepted == ()
    # Authority(), bound to no run, authorizes nothing: it admits an empty
    # catalog for any run (open_conversation's documented default) ...
    assert admit_batch(ToolRegistry(()), Authority(), run_id="run-1").accepted == ()
    # ... but an unbound authority granting tools is still refused for a run
    with pytest.raises(Error) as info:
        admit_batch(ToolRegistry([tool("a")]), Authority(grants={"a"}), run_id="run-1")
    assert info.value.error_class is ErrorClass.FORBIDDEN


def test_cat_03_strict_is_default_and_fails_the_whole_batch() -> None:
    """CAT-03: one unsupported schema fails a strict (default) batch with that error."""
    registry = ToolRegistry([tool("a"), tool("bad", unsupported_schema()), tool("c")])
    with pytest.raises(Error) as info:
        admit(registry)
    assert info.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert info.value.details["schema"] == "https://example.com/unknown-dialect"
    with pytest.raises(Error) as again:
        admit(registry, mode="strict")
    assert again.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY


@pytest.mark.parametrize(
    "schema",
    [
        unsupported_schema(),
        {"type": "object", "properties": {"deep": {"$schema": DRAFT_07, "type": "string"}}},
        {"type": "object", "anyOf": [{}, {"$schema": "http://json-schema.org/draft-04/schema#"}]},
        {"$schema": DRAFT_07, "type": "object"},
        True,
        {"type": "array"},
    ],
)
def test_cat_04_quarantine_rejects_unsupported_anywhere(schema: Any) -> None:
    """CAT-04: an unsupported ``$schema`` anywhere (nested, unused branch) is quarantined."""
    registry = ToolRegistry([tool("a"), tool("bad", schema, revision=4), tool("c")])
    bundle = admit(registry, mode="quarantine")
    assert bundle.accepted == ("a", "c")
    assert [r.name for r in bundle.rejected] == ["bad"]
    assert bundle.rejected[0].descriptor_revision == 4
    assert bundle.rejected[0].error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert [t.name for t in bundle.tools] == ["a", "c"]
    assert bundle.registry.names == ("a", "c")


def test_cat_04_unsupported_output_schema_is_quarantined() -> None:
    """CAT-04: the output schema is preflighted too, with the descriptor's options."""
    registry = ToolRegistry([tool("a"), tool("out", output_schema={"$schema": DRAFT_07})])
    bundle = admit(registry, mode="quarantine")
    assert bundle.accepted == ("a",)
    with pytest.raises(Error):
        admit(registry)
    with_opt_in = ToolRegistry(
        [tool("out", output_schema={"$schema": DRAFT_07}, schema_options=DRAFTS)]
    )
    assert admit(with_opt_in).accepted == ("out",)


@pytest.mark.parametrize(
    ("bad", "error_class"),
    [
        (tool("bad", backend=SyncBackend()), ErrorClass.UNSUPPORTED_CAPABILITY),
        (tool("bad", backend=None), ErrorClass.UNSUPPORTED_CAPABILITY),
        (tool("bad", backend=object()), ErrorClass.UNSUPPORTED_CAPABILITY),
        (tool("bad", {"$ref": "#/$defs/missing"}), ErrorClass.VALIDATION),
        (tool("bad", {"properties": {"a": {"type": "nonsense"}}}), ErrorClass.VALIDATION),
        (tool("bad", ["not", "a", "mapping"]), ErrorClass.VALIDATION),
        (
            tool("bad", output_schema={"$ref": "#/$defs/missing"}),
            ErrorClass.VALIDATION,
        ),
        (
            tool(
                "bad",
                {"properties": {"a": {"properties": {"b": {}}}}},
                schema_options=SchemaOptions(limits=Limits(max_subschema_depth=2)),
            ),
            ErrorClass.EXECUTION_FAILURE,
        ),
        (
            tool("bad", unsupported_schema(), backend=SyncBackend()),
            ErrorClass.UNSUPPORTED_CAPABILITY,
        ),
    ],
)
def test_cat_05_quarantine_never_hides_fatal_errors(
    bad: ToolDescriptor, error_class: ErrorClass
) -> None:
    """CAT-05: backend, validation (unresolved refs) and limit refusals fail the batch."""
    registry = ToolRegistry([tool("a"), bad, tool("quarantined", unsupported_schema())])
    with pytest.raises(Error) as info:
        admit(registry, mode="quarantine")
    assert info.value.error_class is error_class


def test_cat_05_bad_metadata_and_authority_mismatch_fail_the_batch() -> None:
    """CAT-05: malformed metadata never reaches quarantine; an authority mismatch fails."""
    with pytest.raises(Error) as info:
        admit_batch([tool("a"), {"name": "b"}], Authority(), mode="quarantine")  # type: ignore[list-item]
    assert info.value.error_class is ErrorClass.VALIDATION
    registry = ToolRegistry([tool("a"), tool("bad", unsupported_schema())])
    wrong = Authority(grants={"a"}, caller="host", run_id="run-1", tool_revision=1)
    with pytest.raises(Error) as forbidden:
        admit_batch(registry, wrong, mode="quarantine")
    assert forbidden.value.error_class is ErrorClass.FORBIDDEN
    stale = authority_for(registry, tool_revisions={"a": 2, "bad": 1})
    with pytest.raises(Error) as revision:
        admit_batch(registry, stale, mode="quarantine")
    assert revision.value.error_class is ErrorClass.FORBIDDEN


def test_cat_05_awaitable_call_objects_count_as_backends() -> None:
    """CAT-05: ``execute`` may be an object whose ``__call__`` is a coroutine function."""

    class Execute:
        async def __call__(self) -> None:  # pragma: no cover
            return None

    class Backend:
        execute = Execute()

    assert admit(ToolRegistry([tool("a", backend=Backend())])).accepted == ("a",)


def test_cat_06_duplicate_names_fail_before_filtering() -> None:
    """CAT-06: duplicates raise validation even when one of them would be quarantined."""
    batch = [tool("a"), tool("a", unsupported_schema())]
    for mode in ("strict", "quarantine"):
        with pytest.raises(Error) as info:
            admit_batch(batch, Authority(grants={"a"}, caller="h", run_id="r"), mode=mode)
        assert info.value.error_class is ErrorClass.VALIDATION
        assert info.value.message == "admission batch contains duplicate tool names"
    registry = ToolRegistry([tool("a")])
    with pytest.raises(Error) as supplied:
        admit(registry, tools=[ProviderTool("a", "", good_schema())] * 2)
    assert supplied.value.message == "admission batch contains duplicate tool names"


@pytest.mark.parametrize("mode", ["Strict", "lenient", "", None, 1])
def test_cat_07_unknown_mode_is_validation(mode: Any) -> None:
    """CAT-07: a mode other than "strict"/"quarantine" raises validation."""
    with pytest.raises(Error) as info:
        admit(ToolRegistry([tool("a")]), mode=mode)
    assert info.value.error_class is ErrorClass.VALIDATION


def test_cat_07_unknown_keyword_is_type_error() -> None:
    """CAT-07: an unknown keyword to admit_batch is a TypeError, never ignored."""
    registry = ToolRegistry([tool("a")])
    with pytest.raises(TypeError):
        admit_batch(registry, authority_for(registry), schema_admission="quarantine")  # type: ignore[call-arg]


def test_cat_08_accepted_schemas_are_kept_byte_for_byte() -> None:
    """CAT-08: admitted descriptor schemas and provider parameters are the input objects."""
    schemas = {"a": good_schema("é"), "b": {"type": "object", "x-order": [3, 1, 2], "z": 1.5}}
    before = {n: json.dumps(s) for n, s in schemas.items()}
    bundle = admit(ToolRegistry([tool(n, s) for n, s in schemas.items()]))
    for provider in bundle.tools:
        descriptor = bundle.registry.get(provider.name)
        assert descriptor is not None
        assert descriptor.schema is schemas[provider.name]
        assert provider.parameters is schemas[provider.name]
        assert json.dumps(provider.parameters) == before[provider.name]
        assert json.dumps(descriptor.schema) == before[provider.name]


def test_cat_09_authority_bound_to_another_run_is_forbidden() -> None:
    """CAT-09: ``run_id=`` must match the authority's run."""
    registry = ToolRegistry([tool("a")])
    authority = authority_for(registry)
    assert admit_batch(registry, authority, run_id="run-1").accepted == ("a",)
    with pytest.raises(Error) as info:
        admit_batch(registry, authority, run_id="run-2")
    assert info.value.error_class is ErrorClass.FORBIDDEN
    with pytest.raises(Error) as unbound:
        admit_batch(registry, attrs.evolve(authority, run_id=None), run_id="run-1")
    assert unbound.value.error_class is ErrorClass.FORBIDDEN


@pytest.mark.parametrize("grants", [set(), {"a"}, {"a", "b", "c"}, {"a", "x"}])
def test_cat_10_grants_must_equal_tool_names(grants: set[str]) -> None:
    """CAT-10: grants different from the tool names raise forbidden."""
    registry = ToolRegistry([tool("a"), tool("b")])
    authority = Authority(grants=grants, caller="host", run_id="run-1", tool_revision=1)
    with pytest.raises(Error) as info:
        admit_batch(registry, authority)
    assert info.value.error_class is ErrorClass.FORBIDDEN
    ok = Authority(grants={"a", "b"}, caller="host", run_id="run-1", tool_revision=1)
    assert admit_batch(registry, ok).accepted == ("a", "b")
    with pytest.raises(Error) as empty:
        admit_batch(ToolRegistry(), Authority(grants={"a"}))
    assert empty.value.error_class is ErrorClass.FORBIDDEN


def test_cat_11_quarantine_narrows_only_rejected_tools() -> None:
    """CAT-11: rejected tools leave grants and tool_revisions; every other field is kept."""
    registry = ToolRegistry(
        [tool("a", revision=3), tool("bad", unsupported_schema(), revision=2), tool("c")]
    )
    authority = authority_for(registry, tool_revision=7)
    bundle = admit_batch(registry, authority, mode="quarantine", run_id="run-1")
    assert bundle.authority == Authority(
        grants={"a", "c"},
        caller="host",
        run_id="run-1",
        tool_revision=7,
        tool_revisions={"a": 3, "c": 1},
    )
    assert isinstance(bundle.authority.tool_revisions, MappingProxyType)
    clean = admit_batch(ToolRegistry([tool("a")]), authority_for(ToolRegistry([tool("a")])))
    assert clean.authority == authority_for(ToolRegistry([tool("a")]))


def test_cat_12_rejected_in_name_order_and_all_rejected_is_empty() -> None:
    """CAT-12: rejected carries name, revision and the original error, in name order."""
    schemas = {n: unsupported_schema(f"https://example.com/{n}") for n in ("z", "m", "b")}
    registry = ToolRegistry(
        [tool(n, s, revision=i + 1) for i, (n, s) in enumerate(schemas.items())]
    )
    bundle = admit(registry, mode="quarantine")
    assert [r.name for r in bundle.rejected] == ["b", "m", "z"]
    assert [r.descriptor_revision for r in bundle.rejected] == [3, 2, 1]
    for rejected in bundle.rejected:
        assert rejected.error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert rejected.error.details["schema"] == f"https://example.com/{rejected.name}"
    assert bundle.accepted == ()
    assert bundle.tools == ()
    assert len(bundle.registry) == 0
    assert bundle.authority.grants == frozenset()
    assert dict(bundle.authority.tool_revisions) == {}
    assert bundle.authority.caller == "host"


def test_cat_13_supplied_provider_tools() -> None:
    """CAT-13: supplied tools must carry their descriptor's schema, else resource_conflict."""
    schema = good_schema()
    registry = ToolRegistry([tool("a", schema), tool("bad", unsupported_schema())])
    supplied = [
        ProviderTool("a", "provider text", schema),
        ProviderTool("bad", "", registry["bad"].schema),
    ]
    bundle = admit(registry, tools=supplied, mode="quarantine")
    assert bundle.tools == (supplied[0],)
    assert bundle.tools[0].parameters is schema
    equal_copy = [ProviderTool("a", "", good_schema()), supplied[1]]
    assert admit(registry, tools=equal_copy, mode="quarantine").accepted == ("a",)
    differing = [ProviderTool("a", "", good_schema("other")), supplied[1]]
    with pytest.raises(Error) as info:
        admit(registry, tools=differing, mode="quarantine")
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    with pytest.raises(Error) as missing:
        admit(registry, tools=supplied[:1], mode="quarantine")
    assert missing.value.error_class is ErrorClass.VALIDATION
    with pytest.raises(Error) as not_tools:
        admit(registry, tools=[{"name": "a"}], mode="quarantine")  # type: ignore[list-item]
    assert not_tools.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize(
    ("declared", "supplied"),
    [(1, True), (True, 1), (1, 1.0), (0.0, -0.0), ([1], [True]), ("1", 1)],
)
def test_cat_13_provider_tool_compares_as_json_not_python(declared: Any, supplied: Any) -> None:
    """CAT-13/CAT-08: parameters that Python's == calls equal but that encode to
    other JSON (true vs 1, 1.0 vs 1) are resource_conflict; key order is not."""

    def schema(value: Any) -> dict[str, Any]:
        return {"type": "object", "properties": {"m": {"const": value}}, "required": ["m"]}

    registry = ToolRegistry([tool("a", schema(declared))])
    with pytest.raises(Error) as info:
        admit(registry, tools=[ProviderTool("a", "", schema(supplied))])
    assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT
    reordered = dict(reversed(list(schema(declared).items())))
    assert admit(registry, tools=[ProviderTool("a", "", reordered)]).accepted == ("a",)


class _Unreadable(dict):  # type: ignore[type-arg]
    """A host's mapping that fails when read."""

    def items(self) -> Any:
        raise RuntimeError("mapping cannot be read")

    def keys(self) -> Any:
        raise RuntimeError("mapping cannot be read")

    def __iter__(self) -> Any:
        raise RuntimeError("mapping cannot be read")


def test_cat_13_a_mapping_failing_when_read_is_classed_with_supplied_tools() -> None:
    """CAT-13, CAT-05: a schema, or supplied parameters, that fail when read
    are a classed error with provider tools supplied too (as without them),
    never a raw exception out of the JSON comparison."""
    broken = ToolRegistry([tool("a", _Unreadable(type="object"))])
    good = ToolRegistry([tool("a", good_schema())])
    for registry, supplied, error_class in (
        (broken, ProviderTool("a", "", good_schema()), ErrorClass.VALIDATION),  # not JSON data
        (good, ProviderTool("a", "", _Unreadable(type="object")), ErrorClass.RESOURCE_CONFLICT),
    ):
        with pytest.raises(Error) as info:
            admit(registry, tools=[supplied])
        assert info.value.error_class is error_class, info.value


def live_catalog() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(
        (FIXTURES / "issue_46_live_catalog.json").read_text("utf-8")
    )
    return records


def test_cat_15_live_catalog_is_admitted_strictly_unchanged() -> None:
    """CAT-15, CAT-08: the 58-tool capture is one strict batch, every schema unchanged."""
    records = live_catalog()
    assert len(records) == 58
    before = {r["name"]: json.dumps(r["inputSchema"]) for r in records}
    registry = ToolRegistry(ToolDescriptor(r["name"], r["inputSchema"], BACKEND) for r in records)
    bundle = admit(registry)
    assert len(bundle.accepted) == 58
    assert bundle.rejected == ()
    assert sorted(before) == list(bundle.accepted)
    by_name = {r["name"]: r["inputSchema"] for r in records}
    for provider in bundle.tools:
        descriptor = bundle.registry[provider.name]
        assert descriptor.schema is by_name[provider.name]
        assert provider.parameters is by_name[provider.name]
        assert json.dumps(provider.parameters) == before[provider.name]
    assert bundle.authority.grants == frozenset(before)


def test_quarantine_mix_of_the_acceptance_list() -> None:
    """CAT-04, CAT-16: a draft-07 tool without opt-in and an unused unknown ``$schema``
    branch are rejected, good tools admitted; with the opt-in the draft-07 tool is admitted."""
    old = draft_07_schema()
    registry = ToolRegistry(
        [
            tool("good_a"),
            tool("legacy", old),
            tool("branchy", unsupported_schema()),
            tool("good_b", {"type": "object"}),
        ]
    )
    bundle = admit(registry, mode="quarantine")
    assert bundle.accepted == ("good_a", "good_b")
    assert [r.name for r in bundle.rejected] == ["branchy", "legacy"]
    assert bundle.authority.grants == {"good_a", "good_b"}
    opted_in = ToolRegistry([tool("good_a"), tool("legacy", old, schema_options=DRAFTS)])
    strict = admit(opted_in)
    assert strict.accepted == ("good_a", "legacy")
    assert strict.registry["legacy"].schema is old


def test_cat_16_descriptor_schema_options_are_used() -> None:
    """CAT-16: each descriptor compiles with its own options (draft-07, schema_registry)."""
    with pytest.raises(Error) as info:
        admit(ToolRegistry([tool("legacy", draft_07_schema())]))
    assert info.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    descriptor = tool("legacy", draft_07_schema(), schema_options=DRAFTS)
    assert admit(ToolRegistry([descriptor])).accepted == ("legacy",)
    compiled = compile_with(descriptor.schema, descriptor.schema_options)
    assert compiled.validate({"n": 1}) == {"n": 1}
    with pytest.raises(Error):
        compiled.validate({"n": "one"})
    uri = "https://example.com/schemas/count"
    registered = tool(
        "counted",
        {"type": "object", "properties": {"count": {"$ref": uri}}},
        schema_options=SchemaOptions(schema_registry={uri: {"type": "integer", "minimum": 0}}),
    )
    bundle = admit(ToolRegistry([registered]))
    assert bundle.accepted == ("counted",)
    checked = compile_with(registered.schema, registered.schema_options)
    assert checked.validate({"count": 2}) == {"count": 2}
    with pytest.raises(Error):
        checked.validate({"count": -1})
    unregistered = tool("counted", {"type": "object", "properties": {"c": {"$ref": uri}}})
    with pytest.raises(Error):
        admit(ToolRegistry([unregistered]), mode="quarantine")


def test_bad_arguments_to_admit_batch() -> None:
    registry = ToolRegistry([tool("a")])
    with pytest.raises(Error) as info:
        admit_batch(registry, {"grants": ["a"]})  # type: ignore[arg-type]
    assert info.value.error_class is ErrorClass.VALIDATION
    with pytest.raises(Error):
        admit_batch("abc", Authority())  # type: ignore[arg-type]
    with pytest.raises(Error):
        admit_batch(registry, authority_for(registry), run_id=3)  # type: ignore[arg-type]
    with pytest.raises(Error):
        admit_batch(registry, authority_for(registry), tools="a")  # type: ignore[arg-type]


def test_rejected_type_checks_its_fields() -> None:
    error = Error("unsupported_capability", "x")
    assert Rejected("a", 1, error) == Rejected("a", 1, error)
    assert Rejected("a", 1, error) != Rejected("b", 1, error)
    assert hash(Rejected("a", 1, error)) == hash(Rejected("a", 1, error))
    with pytest.raises(Error):
        Rejected("a", 1, "oops")  # type: ignore[arg-type]
    with pytest.raises(Error):
        Rejected(1, 1, error)  # type: ignore[arg-type]
