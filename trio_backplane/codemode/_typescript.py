"""TypeScript declarations of a catalog's tools, from their input schemas,
for the model that writes cells.  A schema with no faithful TypeScript form
becomes ``unknown``, with the schema beside it in a comment."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["declarations"]

_IDENTIFIER: Final = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_PRIMITIVES: Final = {
    "string": "string",
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
}
#: keywords a declaration can show faithfully; any other makes it unknown
_SHOWN: Final = frozenset(
    {
        "type",
        "properties",
        "required",
        "items",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "description",
        "title",
        "additionalProperties",
        "$schema",
    }
)


def _literal(value: Any) -> str:
    return json.dumps(value)


def _union(parts: Iterable[str]) -> str:
    unique = list(dict.fromkeys(parts))
    return unique[0] if len(unique) == 1 else " | ".join(unique)


def _type(schema: Any, depth: int = 0) -> str | None:
    """The TypeScript type of ``schema``, or ``None`` without a faithful one."""
    if schema is True or schema == {}:
        return "unknown"
    if not isinstance(schema, Mapping) or depth > 8 or set(schema) - _SHOWN:
        return None
    if "const" in schema:
        return _literal(schema["const"])
    if "enum" in schema and isinstance(schema["enum"], list):
        return _union(_literal(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [_type(s, depth + 1) for s in schema[key]]
            return None if None in options else _union(o for o in options if o)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    shown = [_of_kind(k, schema, depth) for k in kinds]
    return None if None in shown else _union(s for s in shown if s)


def _of_kind(kind: Any, schema: Mapping[str, Any], depth: int) -> str | None:
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "array":
        inner = _type(schema.get("items", True), depth + 1)
        return None if inner is None else f"Array<{inner}>"
    if kind == "object" or (kind is None and "properties" in schema):
        return _object(schema, depth)
    return None


def _object(schema: Mapping[str, Any], depth: int) -> str | None:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    if not isinstance(properties, Mapping):
        return None
    fields = []
    for name, sub in properties.items():
        shown = _type(sub, depth + 1)
        if shown is None:
            return None
        key = name if _IDENTIFIER.match(name) else json.dumps(name)
        fields.append(f"{key}{'' if name in required else '?'}: {shown}")
    if schema.get("additionalProperties", True) is not False:
        fields.append("[key: string]: unknown")
    return "{ " + "; ".join(fields) + " }" if fields else "Record<string, never>"


def declarations(tools: Iterable[Any]) -> str:
    """``declare const tools: { name(args: Type): Promise<unknown>; ... }``
    for each descriptor of ``tools`` (its name and input schema)."""
    lines = ["declare const tools: {"]
    for tool in tools:
        schema = getattr(tool, "schema", None)
        shown = _type(schema)
        key = tool.name if _IDENTIFIER.match(tool.name) else json.dumps(tool.name)
        note = "" if shown is not None else f"  // schema: {json.dumps(schema)[:500]}"
        lines.append(f"  {key}(args: {shown or 'unknown'}): Promise<unknown>;{note}")
    lines.append("};")
    return "\n".join(lines)
