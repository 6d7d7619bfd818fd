"""Tool descriptors, names, provider projections and registries (CAT-01, CAT-06)."""

from __future__ import annotations

from typing import Any

import pytest

from trio_backplane import tools as public_tools
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.schema import SchemaOptions
from trio_backplane.tools import ProviderTool, ToolDescriptor, ToolRegistry, is_mcp_name

from .support import BACKEND, good_schema, tool


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a b",
        " lead",
        "tab\tname",
        "new\nline",
        "nul\x00",
        "bell\x07",
        "nbsp\u00a0x",
        "zero\u200bwidth",
        "lookup\ud800",  # a lone surrogate: no provider could be sent it
        "x" * 129,
        None,
        42,
        b"bytes",
    ],
)
def test_cat_01_bad_names_are_validation(name: Any) -> None:
    """CAT-01: names must be a non-empty str of <= 128 chars without whitespace/control."""
    with pytest.raises(Error) as info:
        ToolDescriptor(name=name, schema={}, backend=BACKEND)
    assert info.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize("name", ["github::get_me", "a", "x" * 128, "ümlaut", "a/b", "dot.ted-x_1"])
def test_cat_01_names_outside_mcp_set_are_accepted(name: str) -> None:
    """CAT-01: the MCP character set is advisory; ``github::get_me`` is a valid name."""
    assert ToolDescriptor(name=name, schema={}, backend=BACKEND).name == name


def test_cat_01_mcp_name_check_is_advisory() -> None:
    """CAT-01: ``is_mcp_name`` only reports; it never refuses."""
    assert is_mcp_name("get_me.v2-x")
    assert not is_mcp_name("github::get_me")


@pytest.mark.parametrize("revision", [0, -1, True, False, 1.0, "1", None])
def test_cat_01_revision_must_be_a_positive_int(revision: Any) -> None:
    """CAT-01: a revision that is not a positive int (``True`` included) is validation."""
    with pytest.raises(Error) as info:
        ToolDescriptor(name="t", schema={}, backend=BACKEND, revision=revision)
    assert info.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize("field", ["requires_approval", "read_only"])
@pytest.mark.parametrize("value", [0, 1, "yes", None])
def test_cat_01_safety_flags_must_be_bools(field: str, value: Any) -> None:
    """CAT-01: ``requires_approval`` and ``read_only`` must be exact bools."""
    with pytest.raises(Error) as info:
        ToolDescriptor(name="t", schema={}, backend=BACKEND, **{field: value})
    assert info.value.error_class is ErrorClass.VALIDATION


def test_cat_01_other_metadata_is_checked() -> None:
    """CAT-01: a non-str description or non-SchemaOptions options are refused."""
    for extra in ({"description": 3}, {"schema_options": {"dialects": ["2020-12"]}}):
        with pytest.raises(Error) as info:
            ToolDescriptor(name="t", schema={}, backend=BACKEND, **extra)
        assert info.value.error_class is ErrorClass.VALIDATION


def test_descriptor_keeps_schema_identity_and_defaults() -> None:
    """CAT-08: the descriptor and its provider projection carry the schema object itself."""
    schema = good_schema()
    output = {"type": "string"}
    descriptor = tool("t", schema, output_schema=output)
    assert descriptor.schema is schema
    assert descriptor.output_schema is output
    assert descriptor.options == SchemaOptions()
    assert descriptor.revision == 1
    assert descriptor.requires_approval is False
    assert descriptor.read_only is False
    projected = descriptor.provider_tool()
    assert projected == ProviderTool("t", "the t tool", schema)
    assert projected.parameters is schema
    assert hash(descriptor) == hash(tool("t", good_schema(), output_schema=output))


def test_registry_is_immutable_name_indexed_and_ordered() -> None:
    """A registry iterates in name order and supports get/in/len; it cannot change."""
    registry = ToolRegistry([tool("b"), tool("a"), tool("c")])
    assert [d.name for d in registry] == ["a", "b", "c"]
    assert registry.names == ("a", "b", "c")
    assert len(registry) == 3
    assert "a" in registry
    assert "z" not in registry
    assert registry.get("z") is None
    assert registry.get(["b"]) is None  # type: ignore[arg-type]  # names no tool, no TypeError
    b = registry.get("b")
    assert b is not None
    assert b.name == "b"
    assert registry["b"] is b
    assert ToolRegistry(registry) == registry
    assert [t.name for t in registry.provider_tools()] == ["a", "b", "c"]
    assert "ToolRegistry" in repr(registry)
    with pytest.raises(AttributeError):
        registry._by_name = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        registry._by_name["x"] = tool("x")  # type: ignore[index]
    assert len(ToolRegistry()) == 0


def test_cat_06_registry_refuses_duplicate_names() -> None:
    """CAT-06: duplicate names raise validation with the fixed message."""
    with pytest.raises(Error) as info:
        ToolRegistry([tool("a"), tool("b"), tool("a", revision=2)])
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.message == "admission batch contains duplicate tool names"
    assert info.value.details["names"] == ["a"]


def test_registry_refuses_non_descriptors() -> None:
    with pytest.raises(Error) as info:
        ToolRegistry([{"name": "a"}])  # type: ignore[list-item]
    assert info.value.error_class is ErrorClass.VALIDATION


def test_host_names_are_reexported_at_the_top_level() -> None:
    """The tool names a host uses are the top level's too; approval binding
    and authorization stay in ``trio_backplane.tools``."""
    import trio_backplane

    for name in (
        "ToolDescriptor",
        "ToolRegistry",
        "Authority",
        "ProviderTool",
        "admit_batch",
        "AdmittedBundle",
        "Rejected",
    ):
        assert getattr(trio_backplane, name) is getattr(public_tools, name)
    for name in ("authorize", "arguments_digest", "decide_approval", "Approval"):
        assert name not in trio_backplane.__all__
        assert name in public_tools.__all__
