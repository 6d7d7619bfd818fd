"""Code Mode cell state: JSON values by key, per owner and identity, in
bounded memory (process-local, never durable)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass

__all__ = ["MAX_BYTES", "MAX_IDENTITIES", "MAX_KEYS", "MAX_OWNER_BYTES", "CodeState"]

#: Per identity: keys, and bytes of keys and JSON values.
MAX_KEYS: Final = 256
MAX_BYTES: Final = 1 << 20
#: Per owner: identities, and bytes across them.
MAX_IDENTITIES: Final = 64
MAX_OWNER_BYTES: Final = 16 << 20


def _size(key: str, value: Any) -> int:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise Error(ErrorClass.VALIDATION, "a stored value must be JSON data") from None
    return len(key.encode()) + len(text.encode())


def _over(message: str, **details: Any) -> Error:
    return Error(ErrorClass.BUDGET_EXCEEDED, message, details)


@attrs.define
class _Values:
    """One identity's values, and the bytes they use."""

    by_key: dict[str, tuple[Any, int]] = attrs.Factory(dict)
    used: int = 0


@final
class CodeState:
    """Every owner's cell state.  A store that would pass a budget is
    refused with ``budget_exceeded`` and changes nothing."""

    def __init__(self) -> None:
        self._owners: dict[str, dict[str, _Values]] = {}
        self._used: dict[str, int] = {}

    def get(self, owner: str, identity: str) -> Mapping[str, Any]:
        """The identity's values by key (a copy)."""
        found = self._owners.get(owner, {}).get(identity)
        return {} if found is None else {k: v for k, (v, _) in found.by_key.items()}

    def store(self, owner: str, identity: str, key: str, value: Any) -> None:
        """Set ``key`` to ``value`` (``None`` removes it)."""
        if type(key) is not str or not key:
            raise Error(ErrorClass.VALIDATION, "a state key must be a non-empty str")
        identities = self._owners.setdefault(owner, {})
        values = identities.get(identity) or _Values()
        old = values.by_key.get(key, (None, 0))[1]
        size = 0 if value is None else _size(key, value)
        if value is not None:
            self._admit(owner, identity, key, values, size - old)
            values.by_key[key] = (value, size)
            identities[identity] = values
        elif values.by_key.pop(key, None) is not None and not values.by_key:
            del identities[identity]
        values.used += size - old
        self._used[owner] = self._used.get(owner, 0) + size - old

    def _admit(self, owner: str, identity: str, key: str, values: _Values, grow: int) -> None:
        identities = self._owners[owner]
        if identity not in identities and len(identities) >= MAX_IDENTITIES:
            raise _over("too many Code Mode state identities", limit=MAX_IDENTITIES)
        if key not in values.by_key and len(values.by_key) >= MAX_KEYS:
            raise _over("too many Code Mode state keys", limit=MAX_KEYS, identity=identity)
        if values.used + grow > MAX_BYTES:
            raise _over("Code Mode state is over 1 MiB", limit=MAX_BYTES, identity=identity)
        if self._used.get(owner, 0) + grow > MAX_OWNER_BYTES:
            raise _over("the run's Code Mode state is over 16 MiB", limit=MAX_OWNER_BYTES)

    def clear(self, owner: str) -> None:
        """Forget ``owner``'s state."""
        self._owners.pop(owner, None)
        self._used.pop(owner, None)
