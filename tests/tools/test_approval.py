"""Digest-bound approvals: ``arguments_digest`` and ``decide_approval`` (API.md)."""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.tools import Approval, ApprovalDecision, arguments_digest, decide_approval

DIGEST = arguments_digest({"path": "/tmp/x", "mode": 1})
APPROVAL = Approval(
    approval_id="ap-1",
    run_id="run-1",
    incarnation=2,
    tool_name="github::delete_repo",
    tool_revision=3,
    arguments_digest=DIGEST,
    expires_at=100.0,
)


def decision(**changes: Any) -> ApprovalDecision:
    fields = {
        "approval_id": "ap-1",
        "run_id": "run-1",
        "incarnation": 2,
        "tool_name": "github::delete_repo",
        "tool_revision": 3,
        "arguments_digest": DIGEST,
        "decision": "approved",
        "resolver_id": "host",
    }
    fields.update(changes)
    return ApprovalDecision(**fields)


def test_digest_is_sha256_of_rfc8785() -> None:
    """The digest is lower-case hex SHA-256 of the JCS encoding (key order irrelevant)."""
    canonical = b'{"a":[1,2.5,"\xc3\xa9",true,null],"b":{"c":1e+21}}'
    expected = hashlib.sha256(canonical).hexdigest()
    assert arguments_digest({"b": {"c": 1e21}, "a": [1, 2.5, "é", True, None]}) == expected
    assert arguments_digest({"a": (1, 2.5, "é", True, None), "b": {"c": 1e21}}) == expected
    assert expected == expected.lower()
    assert len(expected) == 64
    assert arguments_digest({"x": 1}) != arguments_digest({"x": 2})
    assert arguments_digest({}) == hashlib.sha256(b"{}").hexdigest()


def _nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"k": value}
    return value


def _looping() -> Any:
    value: list[Any] = []
    value.append(value)
    return {"x": value}


@pytest.mark.parametrize(
    "arguments",
    [
        {"n": 2**53},
        {"n": -(2**53)},
        {"n": [10**400]},
        {"f": float("nan")},
        {"f": float("inf")},
        {1: "int key"},
        {"s": {1, 2}},
        {"b": b"bytes"},
        object(),
        {"\udc00": 1},  # a lone surrogate, as a key
        {"s": "x\ud800"},  # and as a value
        _nested(5_000),  # past any recursion limit
        _looping(),  # a list holding itself
    ],
    ids=[
        "2**53",
        "-(2**53)",
        "10**400",
        "nan",
        "inf",
        "int-key",
        "set",
        "bytes",
        "object",
        "surrogate-key",
        "surrogate-value",
        "nested-5000",
        "self-holding-list",
    ],
)
def test_digest_refuses_what_rfc8785_cannot_encode(arguments: Any) -> None:
    """KER-15: what is not JSON data, or cannot be encoded exactly, is
    refused with ``validation``, never a raw RecursionError or
    UnicodeEncodeError."""
    with pytest.raises(Error) as info:
        arguments_digest(arguments)
    assert info.value.error_class is ErrorClass.VALIDATION


def test_digest_accepts_the_safe_integer_bounds() -> None:
    assert (
        arguments_digest({"n": 2**53 - 1}) == hashlib.sha256(b'{"n":9007199254740991}').hexdigest()
    )
    arguments_digest({"n": -(2**53 - 1)})


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53 - 1), 2**53 - 1) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )
)
def test_digest_is_stable_for_json_data(value: Any) -> None:
    digest = arguments_digest(value)
    assert digest == arguments_digest(value)
    assert len(digest) == 64


def test_decide_returns_the_decision() -> None:
    assert decide_approval(APPROVAL, decision(), now=50.0) == "approved"
    assert decide_approval(APPROVAL, decision(decision="denied"), now=100.0) == "denied"


@pytest.mark.parametrize("answer", ["yes", "APPROVED", "", "approve"])
def test_decision_other_than_approved_or_denied_is_validation(answer: str) -> None:
    with pytest.raises(Error) as info:
        decide_approval(APPROVAL, decision(decision=answer), now=0)
    assert info.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize(
    "change",
    [
        {"approval_id": "ap-2"},
        {"run_id": "run-2"},
        {"incarnation": 3},
        {"tool_name": "other"},
        {"tool_revision": 4},
        {"arguments_digest": arguments_digest({"path": "/tmp/y", "mode": 1})},
    ],
)
def test_any_mismatching_bound_field_is_forbidden(change: dict[str, Any]) -> None:
    with pytest.raises(Error) as info:
        decide_approval(APPROVAL, decision(**change), now=0)
    assert info.value.error_class is ErrorClass.FORBIDDEN
    assert info.value.details["fields"] == list(change)


def test_model_cannot_self_approve() -> None:
    with pytest.raises(Error) as info:
        decide_approval(APPROVAL, decision(resolver_id="run-1"), now=0)
    assert info.value.error_class is ErrorClass.FORBIDDEN
    assert info.value.message == "model cannot self-approve"


def test_expired_approval_is_validation() -> None:
    with pytest.raises(Error) as info:
        decide_approval(APPROVAL, decision(), now=100.5)
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.message == "approval is expired"


@pytest.mark.parametrize(
    "change",
    [
        {"approval_id": ""},
        {"incarnation": -1},
        {"incarnation": True},
        {"tool_name": "has space"},
        {"tool_revision": 0},
        {"arguments_digest": DIGEST.upper()},
        {"arguments_digest": "abc"},
        {"expires_at": "soon"},
        {"expires_at": float("nan")},
    ],
)
def test_approval_fields_are_validated(change: dict[str, Any]) -> None:
    with pytest.raises(Error) as info:
        attrs.evolve(APPROVAL, **change)
    assert info.value.error_class is ErrorClass.VALIDATION


@pytest.mark.parametrize("value", [True, 1, None, ["approved"]], ids=repr)
def test_a_decision_that_is_not_a_str_is_validation(value: Any) -> None:
    """KER-15: ``ApprovalDecision(decision=...)`` holding no str is a classed
    ``validation``, not attrs' raw TypeError."""
    with pytest.raises(Error) as info:
        attrs.evolve(decision(), decision=value)
    assert info.value.error_class is ErrorClass.VALIDATION


def test_decide_approval_checks_its_arguments() -> None:
    for args in ((APPROVAL, "approved"), ("x", decision())):
        with pytest.raises(Error):
            decide_approval(*args, now=0)  # type: ignore[arg-type]
    with pytest.raises(Error):
        decide_approval(APPROVAL, decision(), now=float("nan"))
