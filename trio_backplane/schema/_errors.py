"""Constructors for the schema boundary's classed errors."""

from __future__ import annotations

from typing import Any, Final

import jsonschema_rs

from ..errors import Error, ErrorClass

LIMIT_MESSAGE: Final = "JSON Schema resource limit exceeded"
#: The length a message quoted from elsewhere is cut to.
MAX_MESSAGE: Final = 500
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
    """A refusal under a ``Limits`` field."""
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


def cause(exc: BaseException) -> str:
    """``exc`` as a short text for an error's ``cause`` detail."""
    return f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE]
