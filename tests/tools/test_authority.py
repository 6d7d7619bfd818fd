"""``Authority`` and ``authorize`` (API.md Tools; KER-14, TOOL-06, TOOL-07, CAT-11)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import attrs
import pytest

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.tools import Authority, Invocation, ToolRegistry, authorize

from .support import tool

A = tool("a", revision=1)
C = tool("c", revision=3)
REGISTRY = ToolRegistry([A, C])
AUTH = Authority.for_registry(REGISTRY, caller="host", run_id="run-1")


def forbidden(authority: Authority, descriptor: Any, invocation: Any) -> Error:
    with pytest.raises(Error) as info:
        authorize(authority, descriptor, invocation)
    assert info.value.error_class is ErrorClass.FORBIDDEN
    return info.value


def test_for_registry_grants_every_tool_at_its_revision() -> None:
    """CAT-10, TOOL-07: for_registry grants exactly the names at their revisions."""
    assert AUTH.grants == {"a", "c"}
    assert dict(AUTH.tool_revisions) == {"a": 1, "c": 3}
    assert isinstance(AUTH.tool_revisions, MappingProxyType)
    assert AUTH.caller == "host"
    assert AUTH.run_id == "run-1"


def test_tool_07_mixed_revisions_each_authorized() -> None:
    """TOOL-07: with tool_revisions a catalog mixing revisions 1 and 3 authorizes both."""
    authorize(AUTH, A, Invocation("run-1", "a", 1))
    authorize(AUTH, C, {"run_id": "run-1", "tool_name": "c", "tool_revision": 3})


def test_ker_14_missing_caller_or_other_run_is_forbidden() -> None:
    """KER-14: an empty caller or an invocation of another run is forbidden."""
    forbidden(attrs.evolve(AUTH, caller=None), A, Invocation("run-1", "a", 1))
    forbidden(attrs.evolve(AUTH, caller=""), A, Invocation("run-1", "a", 1))
    forbidden(AUTH, A, Invocation("run-2", "a", 1))
    forbidden(attrs.evolve(AUTH, run_id=None), A, Invocation("run-1", "a", 1))


def test_tool_06_ungranted_or_no_revision_is_forbidden() -> None:
    """TOOL-06: a tool outside the grants or with no authorized revision is forbidden."""
    forbidden(attrs.evolve(AUTH, grants={"c"}), A, Invocation("run-1", "a", 1))
    no_revision = Authority(grants={"a"}, caller="host", run_id="run-1")
    error = forbidden(no_revision, A, Invocation("run-1", "a", 1))
    assert "no authorized revision" in error.message
    forbidden(Authority(), A, Invocation(None, "a", 1))


def test_revision_other_than_authorized_is_forbidden() -> None:
    """The tool_revisions entry wins over the legacy revision, which is the fallback."""
    forbidden(AUTH, C, Invocation("run-1", "c", 1))
    forbidden(AUTH, tool("c", revision=4), Invocation("run-1", "c", 4))
    legacy = Authority(grants={"a", "c"}, caller="h", run_id="run-1", tool_revision=3)
    authorize(legacy, C, Invocation("run-1", "c", 3))
    forbidden(legacy, A, Invocation("run-1", "a", 1))
    mixed = attrs.evolve(legacy, tool_revisions={"a": 1})
    authorize(mixed, A, Invocation("run-1", "a", 1))
    authorize(mixed, C, Invocation("run-1", "c", 3))


def test_a_revision_that_is_not_an_int_is_forbidden() -> None:
    """An invocation revision equal to the authorized one only as a number
    (``True``, ``1.0``) is not that revision: ``forbidden``."""
    for revision in (True, 1.0):
        forbidden(AUTH, A, Invocation("run-1", "a", revision))


def test_invocation_of_another_tool_is_forbidden() -> None:
    forbidden(AUTH, A, Invocation("run-1", "c", 1))


def test_invocation_shapes() -> None:
    """Any object with run_id/tool_name/tool_revision, or a mapping, is an invocation."""

    class Call:
        run_id = "run-1"
        tool_name = "a"
        tool_revision = 1

    authorize(AUTH, A, Call())
    for bad in ({"run_id": "run-1", "tool_name": "a"}, object()):
        with pytest.raises(Error) as info:
            authorize(AUTH, A, bad)
        assert info.value.error_class is ErrorClass.VALIDATION
    with pytest.raises(Error):
        authorize("nope", A, Call())  # type: ignore[arg-type]
    with pytest.raises(Error):
        authorize(AUTH, "nope", Call())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"grants": "ab"},
        {"grants": 3},
        {"grants": {1}},
        {"grants": [["x"]]},  # unhashable: never a raw TypeError
        {"caller": 3},
        {"run_id": b"r"},
        {"tool_revision": 0},
        {"tool_revision": True},
        {"tool_revisions": {"a": 0}},
        {"tool_revisions": {"a": True}},
        {"tool_revisions": [("a", 1)]},
    ],
)
def test_authority_fields_are_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(Error) as info:
        Authority(**kwargs)
    assert info.value.error_class is ErrorClass.VALIDATION


def test_authority_is_frozen_and_copies_revisions() -> None:
    """CAT-11: the revisions mapping is stored read-only, detached from the caller's dict."""
    source = {"a": 1}
    authority = Authority(grants=["a"], tool_revisions=source)
    source["a"] = 2
    assert authority.tool_revisions["a"] == 1
    with pytest.raises(TypeError):
        authority.tool_revisions["a"] = 5  # type: ignore[index]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        authority.caller = "x"  # type: ignore[misc]
    assert Authority() == Authority(grants=frozenset(), tool_revisions={})
    assert hash(Authority()) == hash(Authority())
