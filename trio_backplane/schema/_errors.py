"""Constructors for the schema boundary's classed errors."""

from __future__ import annotations

from typing import Any, Final

from ..errors import Error, ErrorClass

LIMIT_MESSAGE: Final = "JSON Schema resource limit exceeded"


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
