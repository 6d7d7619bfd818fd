"""Digest-bound approvals: ``arguments_digest``, ``Approval``, ``decide_approval``."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any, Final, final

import attrs
import rfc8785

from .._numbers import is_finite
from ..errors import Error, ErrorClass
from ._names import check_name_validator

__all__ = ["DECISIONS", "Approval", "ApprovalDecision", "arguments_digest", "decide_approval"]

#: The answers a decision may carry.
DECISIONS: Final = frozenset({"approved", "denied"})

_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_MAX_SAFE_INTEGER: Final = 2**53 - 1


def _invalid(message: str, **details: Any) -> Error:
    return Error(ErrorClass.VALIDATION, message, details)


#: Deeper arguments are refused (the schema boundary refuses them first).
_MAX_DEPTH: Final = 256


def _text(value: str, path: str) -> str:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise _invalid(
                "arguments hold text that is not valid Unicode (a lone surrogate)",
                reason="not_json",
                path=path,
            ) from None
    return value


def _json(value: Any, path: str, depth: int = 0) -> Any:
    """A plain copy of JSON data, refusing what RFC 8785 cannot encode exactly."""
    if value is None or type(value) is bool:
        return value
    if type(value) is str:
        return _text(value, path)
    if type(value) is int:
        if abs(value) > _MAX_SAFE_INTEGER:
            raise _invalid(
                "arguments hold an integer RFC 8785 cannot encode exactly",
                reason="integer_out_of_range",
                path=path,
            )
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise _invalid("arguments hold a non-finite number", reason="not_json", path=path)
        return value
    if depth >= _MAX_DEPTH and isinstance(value, Mapping | list | tuple):
        raise _invalid("arguments nest too deeply", reason="nesting", path=path[:200])
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _invalid("arguments hold a non-str key", reason="not_json", path=path)
            out[_text(key, path)] = _json(item, f"{path}/{key}", depth + 1)
        return out
    if isinstance(value, list | tuple):  # a tuple as the array it stands for
        return [_json(item, f"{path}/{i}", depth + 1) for i, item in enumerate(value)]
    raise _invalid(
        f"arguments are not JSON data ({type(value).__name__})", reason="not_json", path=path
    )


def arguments_digest(arguments: Any) -> str:
    """Lower-case hex SHA-256 of the RFC 8785 (JCS) encoding of ``arguments``.

    Raises ``validation`` for anything that is not JSON data or that RFC 8785
    cannot encode exactly (an integer beyond +/-(2**53 - 1), a non-finite float).
    """
    plain = _json(arguments, "")
    try:
        encoded = rfc8785.dumps(plain)
    except rfc8785.CanonicalizationError as exc:
        raise _invalid("arguments cannot be canonicalized", reason="not_json") from exc
    return hashlib.sha256(encoded).hexdigest()


def _str(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value:
        raise _invalid(f"{attribute.name} must be a non-empty str", field=attribute.name)


def _any_str(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str:  # which strs: decide_approval's call
        raise _invalid(f"{attribute.name} must be a str", field=attribute.name)


def _non_negative_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 0:
        raise _invalid(f"{attribute.name} must be a non-negative int", field=attribute.name)


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise _invalid(f"{attribute.name} must be a positive int", field=attribute.name)


def _digest(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or _DIGEST.fullmatch(value) is None:
        raise _invalid("arguments_digest must be 64 lower-case hex digits", field=attribute.name)


def _number(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not is_finite(value):
        raise _invalid(f"{attribute.name} must be a finite number", field=attribute.name)


@final
@attrs.frozen
class Approval:
    """An approval request bound, field by field, to one exact invocation."""

    approval_id: str = attrs.field(validator=_str)
    run_id: str = attrs.field(validator=_str)
    incarnation: int = attrs.field(validator=_non_negative_int)
    tool_name: str = attrs.field(validator=check_name_validator)
    tool_revision: int = attrs.field(validator=_positive_int)
    arguments_digest: str = attrs.field(validator=_digest)
    expires_at: float = attrs.field(validator=_number)


@final
@attrs.frozen
class ApprovalDecision:
    """An answer to an :class:`Approval`; ``decision`` is checked by :func:`decide_approval`."""

    approval_id: str = attrs.field(validator=_str)
    run_id: str = attrs.field(validator=_str)
    incarnation: int = attrs.field(validator=_non_negative_int)
    tool_name: str = attrs.field(validator=check_name_validator)
    tool_revision: int = attrs.field(validator=_positive_int)
    arguments_digest: str = attrs.field(validator=_digest)
    decision: str = attrs.field(validator=_any_str)
    resolver_id: str = attrs.field(validator=_str)


_BOUND: Final = (
    "approval_id",
    "run_id",
    "incarnation",
    "tool_name",
    "tool_revision",
    "arguments_digest",
)


def decide_approval(approval: Approval, decision: ApprovalDecision, *, now: float) -> str:
    """Check ``decision`` against ``approval`` at ``now`` (the run clock); pure.

    Raises ``validation`` for a decision other than ``"approved"``/``"denied"``,
    ``forbidden`` for any differing bound field or ``approval_id``,
    ``forbidden`` "model cannot self-approve" when ``resolver_id`` is the
    approval's ``run_id``, and ``validation`` "approval is expired" when
    ``now`` is later than ``expires_at``; otherwise returns the decision.
    """
    if not isinstance(approval, Approval) or not isinstance(decision, ApprovalDecision):
        raise _invalid("decide_approval needs an Approval and an ApprovalDecision")
    if not is_finite(now):
        raise _invalid("now must be a finite number")
    if decision.decision not in DECISIONS:
        raise _invalid('decision must be "approved" or "denied"', reason="invalid_decision")
    mismatched = [f for f in _BOUND if getattr(approval, f) != getattr(decision, f)]
    if mismatched:
        raise Error(
            ErrorClass.FORBIDDEN,
            "decision does not match the approval",
            {"reason": "approval_mismatch", "fields": mismatched},
        )
    if decision.resolver_id == approval.run_id:
        raise Error(ErrorClass.FORBIDDEN, "model cannot self-approve", {"reason": "self_approval"})
    if now > approval.expires_at:
        raise _invalid("approval is expired", reason="approval_expired")
    return decision.decision
