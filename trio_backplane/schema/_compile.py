"""The entry points: compile a schema (cached), validate against it, check bounds."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

from ..errors import Error
from . import _cache, _instance
from ._compiled import CompiledSchema, Root
from ._engine import build
from ._errors import cause, invalid, unsupported
from ._options import Limits, SchemaLoader, SchemaOptions
from ._preflight import bounds

__all__ = [
    "check_bounds",
    "compile",
    "compile_output",
    "compile_with",
    "validate",
    "validate_output",
    "validate_schema",
]

_DEFAULT_OPTIONS: Final = SchemaOptions()


def _options(  # noqa: PLR0917 - mirrors compile()'s keywords
    dialects: Collection[str] | None,
    schema_registry: Mapping[str, Any] | None,
    schema_loader: SchemaLoader | None,
    format_assertion: bool,
    content_assertion: bool,
    limits: Limits | None,
    allow_external_refs: bool,
) -> SchemaOptions:
    if (
        dialects is None
        and schema_registry is None
        and schema_loader is None
        and format_assertion is False
        and content_assertion is False
        and limits is None
        and allow_external_refs is True
    ):
        return _DEFAULT_OPTIONS
    return SchemaOptions(
        dialects=dialects,
        schema_registry=schema_registry,
        schema_loader=schema_loader,
        format_assertion=format_assertion,
        content_assertion=content_assertion,
        limits=limits,
        allow_external_refs=allow_external_refs,
    )


def _compile_cached(schema: Any, options: SchemaOptions, root: Root) -> CompiledSchema:
    limits = options.limits or Limits.host()
    _check_root(schema, root)
    if _instance.first_violation(
        schema, limits.max_json_depth, limits.max_schema_bytes
    ) or not _registry_is_json(options.schema_registry, limits):
        # Not JSON data (a tuple, a subclass, nan...): its canonical JSON could
        # equal a real schema's or registry's, so it never touches the cache.
        # Preflight refuses it with the exact reason (a registry entry only
        # when referenced).
        return build(schema, options, limits, root, "")
    key = _cache.fingerprint(schema, options, limits, root)
    hit = _cache.lookup(key)
    if hit is not None:
        if isinstance(hit, Error):
            raise Error(hit.error_class, hit.message, hit.details)
        return hit
    try:
        compiled = build(schema, options, limits, root, key)
    except Error as error:
        if options.schema_loader is None:  # a loader's refusals may be transient
            _cache.store(key, error)
        raise
    _cache.store(key, compiled)
    return compiled


def _registry_is_json(registry: Mapping[str, Any] | None, limits: Limits) -> bool:
    """Whether the fingerprint's JSON text says exactly what ``registry`` holds."""
    if registry is None:
        return True
    for uri, entry in registry.items():
        if type(uri) is not str or _instance.first_violation(
            entry, limits.max_json_depth, limits.max_schema_bytes
        ):
            return False
    return True


def _check_root(schema: Any, root: Root) -> None:
    if root == "any":
        if type(schema) is bool or isinstance(schema, Mapping):
            return
        raise invalid(
            "a schema must be a mapping or a boolean",
            reason="invalid_schema",
            type=type(schema).__name__,
        )
    if type(schema) is bool:
        raise unsupported("tool schema root must be an object schema", reason="root_not_object")
    if not isinstance(schema, Mapping):
        raise invalid(
            "tool schema must be a mapping", reason="invalid_schema", type=type(schema).__name__
        )
    try:
        declared = schema.get("type", "object")
    except Exception as exc:  # a mapping that fails when read
        raise invalid(
            "schema could not be read as JSON data", reason="not_json", cause=cause(exc)
        ) from exc
    # (compared only as plain data: a value of another type is not "object",
    # whatever its own __eq__ says)
    listed = isinstance(declared, list | tuple) and len(declared) == 1
    if not (
        (type(declared) is str and declared == "object")
        or (listed and type(declared[0]) is str and declared[0] == "object")
    ):
        raise unsupported(
            "tool schema root type must be object",
            reason="root_not_object",
            type=declared if isinstance(declared, str | list) else None,
        )


def compile(
    schema: Any,
    *,
    schema_registry: Mapping[str, Any] | None = None,
    schema_loader: SchemaLoader | None = None,
    format_assertion: bool = False,
    content_assertion: bool = False,
    dialects: Collection[str] | None = None,
    limits: Limits | None = None,
    allow_external_refs: bool = True,
) -> CompiledSchema:
    """Preflight and build a tool (input) schema: an object root.

    Cached by fingerprint; raises ``Error`` for any refusal.
    """
    options = _options(
        dialects,
        schema_registry,
        schema_loader,
        format_assertion,
        content_assertion,
        limits,
        allow_external_refs,
    )
    return _compile_cached(schema, options, "tool")


def compile_output(
    schema: Any,
    *,
    schema_registry: Mapping[str, Any] | None = None,
    schema_loader: SchemaLoader | None = None,
    format_assertion: bool = False,
    content_assertion: bool = False,
    dialects: Collection[str] | None = None,
    limits: Limits | None = None,
    allow_external_refs: bool = True,
) -> CompiledSchema:
    """Like :func:`compile` for an output schema: any root, any JSON value."""
    options = _options(
        dialects,
        schema_registry,
        schema_loader,
        format_assertion,
        content_assertion,
        limits,
        allow_external_refs,
    )
    return _compile_cached(schema, options, "any")


def compile_with(
    schema: Any, options: SchemaOptions | None, *, output: bool = False
) -> CompiledSchema:
    """Compile with a descriptor's ``SchemaOptions`` (``None`` = defaults)."""
    return _compile_cached(schema, options or SchemaOptions(), "any" if output else "tool")


def validate_schema(schema: Any, **options: Any) -> None:
    """Preflight a tool schema without arguments."""
    compile(schema, **options)


def validate(schema: Any, arguments: Any, **options: Any) -> Any:
    """Compile ``schema`` (cached) and validate ``arguments``; returns ``arguments``."""
    return compile(schema, **options).validate(arguments)


def validate_output(output_schema: Any, structured_content: Any, **options: Any) -> Any:
    """Validate ``structured_content`` against an output schema (no root rule)."""
    return compile_output(output_schema, **options).validate(structured_content)


def check_bounds(
    schema: Any, limits: Limits | None = None, allow_external_refs: bool = False
) -> None:
    """The bounds of a server-supplied schema (``limits``: ``Limits.mcp()`` by
    default); raises with ``details["reason"]``.

    Returns ``None`` for a schema within bounds.  Nothing is compiled or fetched.
    """
    if limits is None:
        limits = Limits.mcp()
    elif not isinstance(limits, Limits):
        raise invalid("limits must be a Limits or None", type=type(limits).__name__)
    if type(schema) is not bool and not isinstance(schema, Mapping):
        raise invalid(
            "schema must be a mapping or a boolean",
            reason="invalid_schema",
            type=type(schema).__name__,
        )
    bounds(schema, limits, allow_external_refs)
