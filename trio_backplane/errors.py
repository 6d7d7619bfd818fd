"""The one exception type of trio_backplane, and the classes that say why.

Every refusal the library makes is an :class:`Error` whose
:attr:`~Error.error_class` names the reason and whose :attr:`~Error.details`
are JSON data a person (or a program) can act on.  ``trio.Cancelled``,
``KeyboardInterrupt`` and ``SystemExit`` are never wrapped.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["Error", "ErrorClass"]


class ErrorClass(enum.StrEnum):
    """Why an operation was refused."""

    VALIDATION = "validation"
    FORBIDDEN = "forbidden"
    APPROVAL_REQUIRED = "approval_required"
    NOT_FOUND = "not_found"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    TRANSIENT_TRANSPORT = "transient_transport"
    RESOURCE_CONFLICT = "resource_conflict"
    EXECUTION_FAILURE = "execution_failure"
    MALFORMED_RESULT = "malformed_result"
    BUDGET_EXCEEDED = "budget_exceeded"
    UNSUPPORTED_CAPABILITY = "unsupported_capability"
    UNKNOWN_OUTCOME = "unknown_outcome"
    OVERLOADED = "overloaded"
    STORAGE_FAILED = "storage_failed"


class Error(Exception):
    """A classed refusal.

    ``details`` is a read-only mapping of JSON data (``str`` keys; ``dict``,
    ``list``, ``str``, ``int``, ``float``, ``bool`` and ``None`` values).
    """

    __slots__ = ("details", "error_class", "message")

    error_class: ErrorClass
    message: str
    details: Mapping[str, Any]

    def __init__(
        self,
        error_class: ErrorClass | str,
        message: str,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        cls = ErrorClass(error_class)
        super().__init__(message)
        self.error_class = cls
        self.message = message
        self.details = MappingProxyType(dict(details) if details else {})

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message}"

    def __repr__(self) -> str:
        return f"Error({self.error_class.value!r}, {self.message!r}, {dict(self.details)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.error_class.value, self.message, dict(self.details)))

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON data: ``{"class", "message", "details"}``, always
        (a detail that is not JSON data is written as ``"<type name>"``, never
        its ``repr``, which could carry what a backend holds; a non-finite
        number as ``"nan"``/``"inf"``, text holding a lone UTF-16
        surrogate with U+FFFD in its place), so an error can be committed and
        published whoever raised it, whatever text it quotes."""
        return {
            "class": self.error_class.value,
            "message": _text(self.message) if type(self.message) is str else _opaque(self.message),
            "details": _plain(self.details),
        }


_JSON_LEAVES: tuple[type, ...] = (str, int, bool, type(None))


def _plain(value: Any, depth: int = 0) -> Any:
    """``details`` as plain JSON data: mappings and sequences copied into
    ``dict``/``list``, anything else that is not JSON data as its type name."""
    if depth > 64:
        return _opaque(value)
    if isinstance(value, Mapping):
        return {_text(str(k)): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    if type(value) is str:
        return _text(value)
    if type(value) in _JSON_LEAVES:
        return value
    for kind in (bool, str, int):  # subclasses (a StrEnum, say) as their plain value
        if isinstance(value, kind):
            return _text(str(value)) if kind is str else kind(value)
    if isinstance(value, float):
        return float(value) if value - value == 0 else repr(float(value))
    return _opaque(value)


def _text(value: str) -> str:
    """``value`` as Unicode text: a lone UTF-16 surrogate (quoted from a
    model's arguments, say) becomes U+FFFD.  ASCII costs a flag read."""
    if value.isascii():
        return value
    return _SURROGATE.sub("\ufffd", value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _opaque(value: Any) -> str:
    return f"<{type(value).__name__}>"


def require_methods(value: Any, argument: str, methods: tuple[str, ...]) -> None:
    """``validation`` unless ``value`` (what the caller gave as ``argument``)
    has every one of ``methods`` as a callable: the one check of a
    collaborator's shape (a store, a provider, an MCP session)."""
    missing = [name for name in methods if not callable(getattr(value, name, None))]
    if missing:
        raise Error(
            ErrorClass.VALIDATION,
            f"{argument} must provide {', '.join(methods)}",
            {"argument": argument, "type": type(value).__name__, "missing": missing},
        )


def exception_leaves(exc: BaseException) -> list[BaseException]:
    """``exc`` itself, or every exception inside it when it is an exception
    group (nested groups flattened): what a nursery's group actually holds."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    flat: list[BaseException] = []
    stack: list[BaseException] = [exc]
    while stack:
        item = stack.pop()
        if isinstance(item, BaseExceptionGroup):
            stack.extend(item.exceptions)
        else:
            flat.append(item)
    return flat
