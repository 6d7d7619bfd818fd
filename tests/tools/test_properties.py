"""Hypothesis properties of batch admission (CAT-03, CAT-04, CAT-05, CAT-11, CAT-12)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.schema import SchemaOptions
from trio_backplane.tools import Authority, ToolDescriptor, ToolRegistry, admit_batch

from .support import DRAFT_07, draft_07_schema, good_schema, tool, unsupported_schema

DRAFTS = SchemaOptions(dialects={"2020-12", "draft-07"})
QUARANTINABLE = {"unsupported", "draft_07", "bad_output", "bool_root"}
FATAL = {"unresolved", "invalid"}


def build(name: str, kind: str, revision: int) -> ToolDescriptor:
    if kind == "good":
        return tool(name, good_schema(name), revision=revision)
    if kind == "draft_07_opted":
        return tool(name, draft_07_schema(), revision=revision, schema_options=DRAFTS)
    if kind == "unsupported":
        return tool(name, unsupported_schema(f"https://example.com/{name}"), revision=revision)
    if kind == "draft_07":
        return tool(name, draft_07_schema(), revision=revision)
    if kind == "bad_output":
        return tool(name, revision=revision, output_schema={"$schema": DRAFT_07})
    if kind == "bool_root":
        return tool(name, True, revision=revision)
    if kind == "unresolved":
        return tool(name, {"$ref": "#/$defs/nowhere"}, revision=revision)
    return tool(name, {"type": "object", "minProperties": "two"}, revision=revision)


KINDS = st.sampled_from(["good", "draft_07_opted", *sorted(QUARANTINABLE)])
NAMES = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "S"]), min_size=1, max_size=12
)
BATCHES = st.dictionaries(NAMES, st.tuples(KINDS, st.integers(1, 5)), max_size=8)


def admit_all(batch: dict[str, tuple[str, int]], legacy: int | None, mode: str) -> Any:
    registry = ToolRegistry(build(n, k, r) for n, (k, r) in batch.items())
    authority = attrs.evolve(
        Authority.for_registry(registry, caller="host", run_id="run-1"), tool_revision=legacy
    )
    return registry, authority, admit_batch(registry, authority, mode=mode, run_id="run-1")


@given(BATCHES, st.none() | st.integers(1, 5))
def test_quarantine_partitions_narrows_and_readmits(
    batch: dict[str, tuple[str, int]], legacy: int | None
) -> None:
    """CAT-04, CAT-11, CAT-12: accepted and rejected partition the names, grants never
    grow, and admitting the accepted set again in strict mode succeeds."""
    registry, authority, bundle = admit_all(batch, legacy, "quarantine")
    accepted = set(bundle.accepted)
    rejected = [r.name for r in bundle.rejected]
    assert accepted.isdisjoint(rejected)
    assert accepted | set(rejected) == set(batch)
    assert rejected == sorted(rejected)
    assert list(bundle.accepted) == sorted(bundle.accepted)
    assert set(rejected) == {n for n, (k, _) in batch.items() if k in QUARANTINABLE}
    assert bundle.authority.grants <= authority.grants
    assert bundle.authority.grants == accepted
    assert set(bundle.authority.tool_revisions) <= set(authority.tool_revisions)
    assert attrs.evolve(bundle.authority, grants=authority.grants, tool_revisions={}) == (
        attrs.evolve(authority, tool_revisions={})
    )
    for item in bundle.rejected:
        assert item.descriptor_revision == batch[item.name][1]
        assert item.error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    for provider in bundle.tools:
        assert provider.parameters is registry[provider.name].schema
    again = admit_batch(bundle.registry, bundle.authority, bundle.tools, run_id="run-1")
    assert again.accepted == bundle.accepted
    assert again.rejected == ()
    assert again.authority == bundle.authority


@given(BATCHES, st.none() | st.integers(1, 5))
def test_strict_admits_all_or_raises_unsupported(
    batch: dict[str, tuple[str, int]], legacy: int | None
) -> None:
    """CAT-03: strict mode admits every tool or fails the batch with unsupported_capability."""
    if any(k in QUARANTINABLE for k, _ in batch.values()):
        with pytest.raises(Error) as info:
            admit_all(batch, legacy, "strict")
        assert info.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    else:
        _, authority, bundle = admit_all(batch, legacy, "strict")
        assert set(bundle.accepted) == set(batch)
        assert bundle.authority == authority


@given(BATCHES, st.sampled_from(sorted(FATAL)), st.sampled_from(["strict", "quarantine"]))
def test_fatal_tool_fails_every_mode(
    batch: dict[str, tuple[str, int]], fatal: str, mode: str
) -> None:
    """CAT-05: one tool whose schema fails with validation fails the batch in either mode,
    unless strict mode met an unsupported schema first."""
    batch = {**batch, "\u2603fatal": (fatal, 1)}
    with pytest.raises(Error) as info:
        admit_all(batch, None, mode)
    if mode == "quarantine":
        assert info.value.error_class is ErrorClass.VALIDATION
    else:
        assert info.value.error_class in {ErrorClass.VALIDATION, ErrorClass.UNSUPPORTED_CAPABILITY}
