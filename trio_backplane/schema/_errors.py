"""Constructors for the schema boundary's classed errors."""

from __future__ import annotations

from typing import Any, Final

import jsonschema_rs

from ..errors import Error, ErrorClass

LIMIT_MESSAGE: Final = "JSON Schema resource limit exceeded"
_REGEX_FAILURE_KINDS: Final = (
    jsonschema_rs.ValidationErrorKind.BacktrackLimitExceeded,
    jsonschema_rs.ValidationErrorKind.RegexEngineFailure,
)
_CONTEXT_KINDS: Final = (
    jsonschema_rs.ValidationErrorKind.AnyOf,
    jsonschema_rs.ValidationErrorKind.OneOfNotValid,
    jsonschema_rs.ValidationErrorKind.OneOfMultipleValid,
)


def limit_error(reason: str, limit: str, maximum: int, **extra: Any) -> Error:
    """A refusal under a ``Limits`` field (SCH-31..SCH-39)."""
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        LIMIT_MESSAGE,
        {"reason": reason, "limit": limit, "maximum": maximum, **extra},
    )


def invalid(message: str, **details: Any) -> Error:
    return Error(ErrorClass.VALIDATION, message, details)


def unsupported(message: str, **details: Any) -> Error:
    return Error(ErrorClass.UNSUPPORTED_CAPABILITY, message, details)


def failure(message: str, **details: Any) -> Error:
    return Error(ErrorClass.EXECUTION_FAILURE, message, details)


def regex_failure(errors: list[jsonschema_rs.ValidationError]) -> str | None:
    """The message of a regex engine failure anywhere in ``errors`` (contexts included)."""
    stack = list(errors)
    while stack:
        error = stack.pop()
        kind = error.kind
        if isinstance(kind, _REGEX_FAILURE_KINDS):
            return error.message
        if isinstance(kind, _CONTEXT_KINDS):
            for branch in kind.context:
                stack.extend(branch)
    return None
