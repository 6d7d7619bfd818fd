"""The swappable schema validator, the default one, and the cache of what
they built, keyed by a tool's fingerprint."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, Literal, Protocol, final, runtime_checkable

import attrs

from ...errors import Error, ErrorClass
from ...schema import CompiledSchema, Limits, SchemaOptions, compile_with

__all__ = [
    "CACHE_SIZE",
    "MCP_SCHEMA_OPTIONS",
    "BoundaryValidator",
    "Built",
    "SchemaValidator",
    "ValidatorCache",
    "tool_fingerprint",
]

#: The options every server-supplied schema is built with.
MCP_SCHEMA_OPTIONS: Final = SchemaOptions(
    dialects={"2020-12", "draft-07"}, limits=Limits.mcp(), allow_external_refs=False
)
#: Entries a :class:`ValidatorCache` holds before an insertion empties it.
CACHE_SIZE: Final = 4096


@runtime_checkable
class SchemaValidator(Protocol):
    """Builds a bounds-checked server schema once and validates data against it.

    ``key`` names the validator and its options: it is part of every cache
    key, so two validators never share an entry.  ``build`` raises
    :class:`~trio_backplane.errors.Error` for a schema it refuses; ``validate``
    returns ``None`` or raises ``Error`` with the failures in
    ``details["errors"]``.  ``output=True`` builds an output schema (any root).
    """

    @property
    def key(self) -> str: ...

    def build(self, schema: Any, *, output: bool) -> Any: ...

    def validate(self, compiled: Any, data: Any) -> None: ...


@final
@attrs.frozen
class BoundaryValidator:
    """The default validator: trio_backplane's own schema boundary."""

    options: SchemaOptions = MCP_SCHEMA_OPTIONS

    @property
    def key(self) -> str:
        o = self.options
        limits = o.limits or Limits.host()
        return _canonical(
            {
                "validator": "trio_backplane.schema",
                "dialects": sorted(o.dialects or ("2020-12",)),
                "format_assertion": o.format_assertion,
                "content_assertion": o.content_assertion,
                "allow_external_refs": o.allow_external_refs,
                "limits": list(attrs.astuple(limits)),
                "registry": None if o.schema_registry is None else dict(o.schema_registry),
                "loader": None if o.schema_loader is None else id(o.schema_loader),
            }
        )

    def build(self, schema: Any, *, output: bool) -> CompiledSchema:
        return compile_with(schema, self.options, output=output)

    def validate(self, compiled: Any, data: Any) -> None:
        compiled.validate(data)


@attrs.frozen
class Built:
    """One cached build: the compiled schema, or the refusal and where it happened."""

    compiled: Any = None
    refusal: Error | None = None
    stage: Literal["bounds", "build"] | None = None


@final
class ValidatorCache:
    """Built validators and refusals by ``(tool fingerprint, validator key, role)``.

    Holds at most :data:`CACHE_SIZE` entries: an insertion of a new key into a
    full cache empties it first.  ``builds`` counts the entries ever
    computed (a miss), ``hits`` the lookups served.
    """

    __slots__ = ("_entries", "builds", "hits", "maxsize")

    def __init__(self, maxsize: int = CACHE_SIZE) -> None:
        if type(maxsize) is not int or maxsize < 1:
            raise Error(ErrorClass.VALIDATION, "cache maxsize must be a positive int")
        self.maxsize = maxsize
        self._entries: dict[str, Any] = {}
        self.builds = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Any:
        value = self._entries.get(key)
        if value is not None:
            self.hits += 1
        return value

    def put(self, key: str, value: Any) -> None:
        if key not in self._entries and len(self._entries) >= self.maxsize:
            self._entries.clear()
        self._entries[key] = value
        self.builds += 1

    def clear(self) -> None:
        self._entries.clear()


_canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode
#: For a fingerprint only: a definition holding NaN (which the SDK's parser
#: accepts) still gets one, so an ignored outputSchema holding NaN neither
#: leaves the tool without an identity nor changes its revision each listing.
_canonical_lenient = json.JSONEncoder(
    ensure_ascii=False, allow_nan=True, sort_keys=True, separators=(",", ":")
).encode


def tool_fingerprint(definition: Mapping[str, Any]) -> str | None:
    """SHA-256 of the tool's name, description, input and output schema as
    canonical JSON; ``None`` when they are not JSON data (never cached)."""
    if not isinstance(definition, Mapping):
        raise Error(
            ErrorClass.VALIDATION,
            "a tool definition must be a mapping",
            {"type": type(definition).__name__},
        )
    parts = {
        "name": definition.get("name"),
        "description": definition.get("description"),
        "inputSchema": definition.get("inputSchema"),
        "outputSchema": definition.get("outputSchema"),
    }
    try:
        text = _canonical(parts)
    except ValueError:
        try:
            text = _canonical_lenient(parts)  # NaN or an infinity
        except (TypeError, ValueError, RecursionError):
            return None
    except (TypeError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
