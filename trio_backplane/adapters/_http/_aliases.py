"""Tool names an OpenAI-compatible API can carry, and back."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Final, final

from ...errors import Error, ErrorClass

__all__ = ["OPENAI_NAME", "ToolAliases"]

#: The function names an OpenAI-compatible API accepts.
OPENAI_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_UNSAFE_CHARS: Final = re.compile(r"[^a-zA-Z0-9_-]")


@final
class ToolAliases:
    """A reversible map between real tool names and provider-safe aliases.

    A name OpenAI accepts is its own alias; any other becomes its safe
    characters (truncated) plus a hash of the real name, never colliding with
    another real name or alias of the same set.
    """

    __slots__ = ("_to_alias", "_to_name")

    def __init__(self, names: Iterable[str]) -> None:
        self._to_alias: dict[str, str] = {}
        self._to_name: dict[str, str] = {}
        if isinstance(names, str | bytes | Mapping) or not isinstance(names, Iterable):
            raise Error(
                ErrorClass.VALIDATION,
                "tool names must be an iterable of str",
                {"type": type(names).__name__},
            )
        names = list(dict.fromkeys(names))
        if not all(type(name) is str for name in names):
            raise Error(ErrorClass.VALIDATION, "tool names must be an iterable of str")
        for name in names:
            if OPENAI_NAME.fullmatch(name):
                self._bind(name, name)
        for name in names:
            if name in self._to_alias:
                continue
            digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
            stem = _UNSAFE_CHARS.sub("_", name)
            for size in (8, 16, 32, 64):
                alias = f"{stem[: 63 - size]}_{digest[:size]}"
                if alias not in self._to_name:
                    self._bind(name, alias)
                    break
            else:  # pragma: no cover - a SHA-256 collision
                raise Error(ErrorClass.VALIDATION, "cannot alias tool name", {"tool": name})

    def _bind(self, name: str, alias: str) -> None:
        self._to_alias[name] = alias
        self._to_name[alias] = name

    def alias(self, name: str) -> str:
        """The alias of ``name`` (a name outside the set is sanitized the same way)."""
        known = self._to_alias.get(name)
        if known is not None:
            return known
        return ToolAliases([name]).alias(name)

    def name(self, alias: str) -> str:
        """The real name of ``alias``; an unknown alias comes back unchanged."""
        return self._to_name.get(alias, alias)
