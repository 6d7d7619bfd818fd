"""What a tool backend produces, and how the runtime judges it.

``settlement(result, descriptor)`` trusts only the *kind* of outcome and the
pinned descriptor's ``read_only``: a ``ToolResult`` or a rejection
verified against the exact operation is settled; an ``Error`` is settled only
for a read-only tool and never when its class is ``unknown_outcome``;
anything else (another exception, a timeout, a malformed value) is uncertain.
Error text, details and flags never turn uncertainty into success.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, final

import attrs

from ..errors import Error, ErrorClass
from ._descriptor import ToolDescriptor

__all__ = ["IDENTITY_FIELDS", "Rejection", "ToolResult", "reject", "settlement", "verify_rejection"]

#: The fields that identify one operation exactly (a rejection binds all of them).
IDENTITY_FIELDS: Final = (
    "run_id",
    "incarnation",
    "step_id",
    "attempt_id",
    "invocation_id",
    "tool_call_id",
    "turn_id",
    "tool_name",
    "tool_revision",
    "catalog_revision",
)
_POSITIVE: Final = frozenset({"incarnation", "tool_revision", "catalog_revision"})


def _bool(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not bool:
        raise Error(ErrorClass.VALIDATION, "is_error must be a bool")


@final
@attrs.frozen
class ToolResult:
    """A backend's result: ``content`` (text or content blocks, JSON data),
    optional ``structured_content`` (any JSON value) and ``is_error``."""

    content: Any
    structured_content: Any = None
    is_error: bool = attrs.field(default=False, validator=_bool)

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "structured_content": self.structured_content,
            "is_error": self.is_error,
        }


@final
@attrs.frozen
class Rejection:
    """A backend's proof that it refused ``identity`` before doing anything."""

    identity: Mapping[str, Any]
    error: Error


def _identity(operation: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in IDENTITY_FIELDS:
        value = (
            operation.get(name)
            if isinstance(operation, Mapping)
            else getattr(operation, name, None)
        )
        values[name] = value
    return values


def _complete(identity: Mapping[str, Any]) -> bool:
    """Every identity field present and well formed (a field missing from a
    hand-built identity makes it incomplete, as an empty one does)."""
    for name in IDENTITY_FIELDS:
        value = identity.get(name)
        if name in _POSITIVE:
            if type(value) is not int or value < 1:
                return False
        elif type(value) is not str or not value:
            return False
    return True


def reject(operation: Any, error: Error) -> Rejection:
    """A rejection bound to ``operation``'s whole identity.

    Raises ``unknown_outcome`` for an ``unknown_outcome`` error (that is not a
    rejection) or an operation whose identity is incomplete.
    """
    if not isinstance(error, Error):
        raise Error(ErrorClass.VALIDATION, "reject needs an Error")
    if error.error_class is ErrorClass.UNKNOWN_OUTCOME:
        raise Error(
            ErrorClass.UNKNOWN_OUTCOME,
            "an unknown outcome cannot be a rejection",
            {"cause": error.message},
        )
    identity = _identity(operation)
    if not _complete(identity):
        raise Error(
            ErrorClass.UNKNOWN_OUTCOME,
            "rejection needs the operation's complete identity",
            {"missing": sorted(k for k, v in identity.items() if v in (None, ""))},
        )
    return Rejection(identity=identity, error=error)


def _proof(rejection: Rejection) -> bool:
    """Whether ``rejection`` is what :func:`reject` builds: a complete
    identity and an ``Error`` that is not an unknown outcome (a
    ``Rejection`` built by hand is held to the same rule)."""
    error = rejection.error
    return (
        isinstance(error, Error)
        and error.error_class is not ErrorClass.UNKNOWN_OUTCOME
        and isinstance(rejection.identity, Mapping)
        and _complete(rejection.identity)
    )


def verify_rejection(rejection: Rejection, operation: Any) -> bool:
    """Whether ``rejection`` names exactly ``operation``, as a
    proof :func:`reject` would build."""
    return _proof(rejection) and dict(rejection.identity) == _identity(operation)


Settlement = Literal["settled", "uncertain"]


def settlement(result: Any, descriptor: ToolDescriptor, operation: Any = None) -> Settlement:
    """Judge a backend's outcome against the pinned descriptor."""
    if isinstance(result, ToolResult):
        return "settled"
    if isinstance(result, Rejection):
        if operation is None:
            return "settled" if _proof(result) else "uncertain"
        if verify_rejection(result, operation):
            return "settled"
        return "uncertain"
    if isinstance(result, Error):
        if descriptor.read_only and result.error_class is not ErrorClass.UNKNOWN_OUTCOME:
            return "settled"
        return "uncertain"
    return "uncertain"
