"""Credentials a host hands the runtime (``provider_context``, a tool's
``backend_context``) never reach a store, an event or a request: what a
failure quotes of them is replaced by ``[redacted]`` before it is committed or published.

The texts looked for are every ``str`` (and ``bytes``, as UTF-8) value inside
the context (not the keys, which name secrets: "api_key" is no secret),
nested in mappings, lists, tuples and sets: a
credential held inside another object (an SDK client's attribute) is not
found; hand it over as text.  Texts shorter than six characters are not
looked for (they would blank out ordinary words).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..errors import Error

__all__ = ["REDACTED", "redacted", "scrub", "secrets_of"]

REDACTED: Final = "[redacted]"
#: The shortest text of a context looked for.
_MIN: Final = 6
#: How deep a context is walked (contexts are small; a cycle stops here).
_DEPTH: Final = 100


def secrets_of(context: Any) -> tuple[str, ...]:
    """The texts of ``context`` to look for, longest first (a secret that
    holds another is replaced whole)."""
    found: set[str] = set()
    stack: list[tuple[Any, int]] = [(context, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, bytes | bytearray):
            value = bytes(value).decode("utf-8", "replace")
        if isinstance(value, str):
            if len(value) >= _MIN:
                found.add(value)
        elif depth < _DEPTH and isinstance(value, Mapping):
            # the values: a key names a secret ("api_key"), it is none itself
            stack.extend((item, depth + 1) for item in value.values())
        elif depth < _DEPTH and isinstance(value, list | tuple | set | frozenset):
            stack.extend((item, depth + 1) for item in value)
    return tuple(sorted(found, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every one of ``secrets`` replaced."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redacted(error: Error, secrets: tuple[str, ...]) -> Error:
    """``error`` with ``secrets`` replaced in its message and details (the
    error itself when it quotes none)."""
    if not secrets:
        return error
    plain = error.to_dict()
    changed = False

    def walk(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, str):
            cleaned = scrub(value, secrets)
            changed = changed or cleaned is not value
            return cleaned
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    message, details = walk(plain["message"]), walk(plain["details"])
    return Error(error.error_class, message, details) if changed else error
