"""Shared builders for the tool-catalog tests."""

from __future__ import annotations

from typing import Any

from trio_backplane.schema import SchemaOptions
from trio_backplane.tools import Authority, ToolDescriptor, ToolRegistry

DRAFT_07 = "http://json-schema.org/draft-07/schema#"


class Backend:
    """A backend with an awaitable ``execute``."""

    async def execute(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover
        return None


class SyncBackend:
    """A backend whose ``execute`` is not awaitable."""

    def execute(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover
        return None


BACKEND = Backend()


def good_schema(name: str = "x") -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "minLength": 1}},
        "required": [name],
        "additionalProperties": False,
    }


def unsupported_schema(uri: str = "https://example.com/unknown-dialect") -> dict[str, Any]:
    """An unsupported ``$schema`` in a branch no argument reaches (CAT-04)."""
    return {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "$defs": {"unused": {"$schema": uri, "type": "string"}},
    }


def draft_07_schema() -> dict[str, Any]:
    return {
        "$schema": DRAFT_07,
        "type": "object",
        "definitions": {"n": {"type": "integer"}},
        "properties": {"n": {"$ref": "#/definitions/n"}},
    }


def tool(
    name: str,
    schema: Any = None,
    *,
    revision: int = 1,
    backend: Any = BACKEND,
    output_schema: Any = None,
    schema_options: SchemaOptions | None = None,
) -> ToolDescriptor:
    return ToolDescriptor(
        name=name,
        schema=good_schema() if schema is None else schema,
        backend=backend,
        revision=revision,
        description=f"the {name} tool",
        output_schema=output_schema,
        schema_options=schema_options,
    )


def authority_for(registry: ToolRegistry, **extra: Any) -> Authority:
    base = Authority.for_registry(registry, caller="host", run_id="run-1")
    if not extra:
        return base
    import attrs

    return attrs.evolve(base, **extra)
