"""How an attempt fails, classed, and how its error leaves: never with the
API key in it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...errors import Error, ErrorClass
from ._text import strict_loads, unicode

__all__ = [
    "Failed",
    "Reported",
    "http_error",
    "malformed",
    "redact",
    "stream_error",
    "transport",
]

_MAX_TEXT: Final = 500
#: The shortest prefix of the key redacted where a text ends (a cut through an echo).
_MIN_KEY_FRAGMENT: Final = 6
_REDACTED: Final = "[redacted]"


class Failed(Exception):
    """The attempt's failure, raised from deep in the stream to end it."""

    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


class Reported(Failed):
    """A failure the server reported in the stream: it stands even after the
    response's finish reason (where a malformed event is a cut tail)."""


def malformed(message: str, detail: str) -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        message,
        {"reason": "malformed_stream", "detail": detail},
    )


def transport(message: str, exc: BaseException, reason: str) -> Error:
    return Error(
        ErrorClass.TRANSIENT_TRANSPORT,
        message,
        {"reason": reason, "cause": type(exc).__name__},
    )


def stream_error(message: Any, code: Any = None) -> Error:
    """An error the server reported mid-stream (``code``: its type or code,
    kept when it is a string)."""
    details = {"reason": "stream_error", "provider_message": unicode(str(message))[:500]}
    if isinstance(code, str) and code:
        details["provider_code"] = unicode(code)[:100]
    return Error(ErrorClass.TRANSIENT_TRANSPORT, "provider reported an error mid-stream", details)


#: Provider error codes (``error.code`` or ``error.type``) that no retry
#: fixes: the account's quota or billing, not a passing rate limit.
_QUOTA_CODES: Final = frozenset(
    {"insufficient_quota", "billing_hard_limit_reached", "billing_error"}
)


def http_error(status: int, text: str, *, retry_after: str | None = None) -> Error:
    """The error an HTTP status and its body's text make; the server's own
    message from the JSON shapes servers use (``{"error": {"message"}}``,
    ``{"error": "..."}``, ``{"message"}``, ``{"detail"}``), else the text;
    the provider's error ``code`` and the ``retry-after`` it asked for (the
    host owns retries) in the details.  An exhausted quota or a billing
    refusal is ``budget_exceeded``, whatever the status: retrying never
    helps."""
    provider_message, code = text, None
    try:
        payload = strict_loads(text)
    except (ValueError, RecursionError):
        payload = None
    if isinstance(payload, Mapping):
        error = payload.get("error")
        if isinstance(error, Mapping):
            found = error.get("code") or error.get("type")
            code = found if isinstance(found, str) else None
            error = error.get("message")
        for candidate in (error, payload.get("message"), payload.get("detail")):
            if isinstance(candidate, str) and candidate:
                provider_message = candidate
                break
    details: dict[str, Any] = {"status": status, "provider_message": provider_message}
    if code is not None:
        details["provider_code"] = code[:100]
    seconds = _seconds(retry_after)
    if seconds is not None:
        details["retry_after"] = seconds
    if code in _QUOTA_CODES:
        return Error(ErrorClass.BUDGET_EXCEEDED, "provider quota is exhausted", details)
    if status == 429 or status >= 500:
        return Error(ErrorClass.TRANSIENT_TRANSPORT, f"provider answered HTTP {status}", details)
    if status in (401, 403):
        return Error(ErrorClass.FORBIDDEN, f"provider refused the request (HTTP {status})", details)
    return Error(ErrorClass.VALIDATION, f"provider rejected the request (HTTP {status})", details)


def _seconds(retry_after: str | None) -> float | None:
    """A ``retry-after`` header's delay in seconds (its delta-seconds form;
    an HTTP date is not read), ``None`` when absent or unreadable."""
    if retry_after is None:
        return None
    try:
        seconds = float(retry_after.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86_400 else None


def _excerpt(text: str, api_key: str | None, limit: int | None = None) -> str:
    """``text`` with the key redacted, then cut to ``limit``.

    Redacting first means a key across the cut never survives as a prefix;
    a prefix of the key still ending the text (a server that cut its own
    echo) is redacted too.
    """
    if api_key:
        text = text.replace(api_key, _REDACTED)
    if limit is not None:
        text = text[:limit]
    if api_key:
        for size in range(min(len(api_key), len(text)), _MIN_KEY_FRAGMENT - 1, -1):
            if text.endswith(api_key[:size]):
                return text[:-size] + _REDACTED
    return text


def redact(error: Error, api_key: str | None) -> Error:
    """The error as it may leave: the key never back in through text a server
    echoed, and server text (left whole until now) cut to ``_MAX_TEXT``."""
    details = {
        key: _excerpt(value, api_key, _MAX_TEXT) if isinstance(value, str) else value
        for key, value in error.details.items()
    }
    return Error(error.error_class, _excerpt(error.message, api_key), details)
