"""Building the engine's validator from a preflighted schema."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote

import jsonschema_rs

from ..errors import Error
from ._cache import canonical
from ._compiled import REGEX_BACKTRACK_LIMIT, CompiledSchema, Root
from ._content import content_keywords
from ._ecma import engine_pattern
from ._errors import MAX_MESSAGE, cause, failure, invalid, unsupported
from ._graph import Location, Path
from ._instance import json_pointer
from ._options import Limits, SchemaOptions, normalize_dialects
from ._patterns import AsWritten
from ._preflight import DEFAULT_BASE, Preflight, preflight

__all__ = ["build"]

_PATTERN_OPTIONS: Final = jsonschema_rs.FancyRegexOptions(backtrack_limit=REGEX_BACKTRACK_LIMIT)
#: The base URI of a ``contentSchema`` validator's own (one-reference) root.
_CONTENT_BASE: Final = "urn:trio-backplane:content-schema"
_FRAGMENT_SAFE: Final = "/~!$&'()*+,;=:@"


def build(
    schema: Any, options: SchemaOptions, limits: Limits, root: Root, key: str
) -> CompiledSchema:
    """Preflight ``schema`` and build its validator (``key``: its fingerprint);
    raise a classed ``Error`` for any refusal."""
    dialects = normalize_dialects(options.dialects)
    result = preflight(
        schema,
        limits=limits,
        dialects=dialects,
        registry=options.schema_registry,
        loader=options.schema_loader,
        allow_external_refs=options.allow_external_refs,
        content_assertion=options.content_assertion,
    )
    written = AsWritten(result.patterns) if result.patterns.edits else None
    validator = _validator(schema, options, limits, result, written)
    return CompiledSchema(
        schema=schema,
        fingerprint=key,
        options=options,
        root=root,
        _is_valid=validator.is_valid,
        _iter_errors=validator.iter_errors,
        _limits=limits,
        _first_error=validator.validate if result.recursive else None,
        _multiplies=result.multiplies,
        _content=options.content_assertion,
        _written=written,
    )


def _validator(
    schema: Any,
    options: SchemaOptions,
    limits: Limits,
    result: Preflight,
    written: AsWritten | None = None,
) -> jsonschema_rs.Validator:
    """The engine's validator for the preflighted ``schema``."""
    kwargs: dict[str, Any] = {
        "offline": True,  # never fetch: every resource is in the registry
        "base_uri": DEFAULT_BASE,
        "pattern_options": _PATTERN_OPTIONS,
        "validate_formats": options.format_assertion or result.format_assertion_vocabulary,
    }
    # Patterns the engine would match otherwise than ECMA-262 are given
    # spelled out, in copies: the schema itself is never changed.
    engine_document = result.patterns.engine_document
    schema = engine_document(schema)
    external = {uri: engine_document(doc) for uri, doc in result.external.items()}
    if type(schema) is not bool and not isinstance(schema, dict):
        schema = dict(schema)
    content = None
    if options.content_assertion:
        content = _ContentSchemas(schema, external, result, kwargs, written)
        # decoded content is held to the instance limits (its own nesting and size)
        kwargs["keywords"] = content_keywords(
            content.resolve, content.written, limits.max_input_depth, limits.max_input_bytes
        )
    if external:
        kwargs["registry"] = jsonschema_rs.Registry(list(external.items()))
    if result.root_dialect == "draft-07":
        factory: Callable[..., jsonschema_rs.Validator] = jsonschema_rs.Draft7Validator
    elif result.metaschemas and type(schema) is dict and "$schema" in schema:
        factory = jsonschema_rs.validator_for
    else:
        factory = jsonschema_rs.Draft202012Validator
    try:
        return _new_validator(factory, schema, kwargs)
    except Error:
        if content is not None and content.error is not None:
            raise content.error from None  # refused while building a contentSchema
        raise


def _new_validator(
    factory: Callable[..., jsonschema_rs.Validator], schema: Any, kwargs: dict[str, Any]
) -> jsonschema_rs.Validator:
    """``factory(schema, **kwargs)``, every engine refusal mapped to a classed ``Error``."""
    try:
        return factory(schema, **kwargs)
    except jsonschema_rs.ValidationError as exc:
        if 'is not a "regex"' in exc.message:
            raise unsupported(
                "pattern uses ECMA-262 syntax the regex engine does not support",
                reason="unsupported_pattern",
                path=json_pointer(exc.instance_path),
                cause=exc.message[:MAX_MESSAGE],
            ) from exc
        raise invalid(
            "schema is not a valid JSON Schema",
            reason="invalid_schema",
            errors=[
                {
                    "instance_path": json_pointer(exc.instance_path),
                    "schema_path": json_pointer(exc.schema_path),
                    "keyword": exc.kind.name,
                    "message": exc.message[:MAX_MESSAGE],
                }
            ],
        ) from exc
    except (jsonschema_rs.ReferencingError, ValueError) as exc:
        raise invalid(
            "schema could not be built", reason="invalid_schema", cause=cause(exc)
        ) from exc
    except Exception as exc:
        raise failure("schema engine failed", reason="engine_failure", cause=cause(exc)) from exc


class _ContentSchemas:
    """The ``contentSchema`` validators of one compilation.

    Built with the main validator's options; one holding a reference is
    ``{"$ref": <its location>}`` over the schema and its resources, so that
    it resolves in the enclosing document.  A location several resources
    fit is refused rather than guessed.
    """

    def __init__(
        self,
        schema: Any,
        external: dict[str, Any],
        result: Preflight,
        kwargs: dict[str, Any],
        written: AsWritten | None,
    ) -> None:
        #: a nested error message names patterns as written (before it is cut)
        self.written = None if written is None else written.message
        self._schema = schema
        self._external = external
        self._result = result
        self._kwargs = kwargs
        #: the engine is given some patterns spelled out (``engine_document``):
        #: its paths hold them as ``patternProperties`` keys
        self._spelled = bool(result.patterns.edits)
        self._built: dict[str, jsonschema_rs.Validator] = {}
        self._building: set[str] = set()
        self.error: Error | None = None
        self._candidates: dict[tuple[str | int, ...], list[tuple[Location, Path]]] | None = None

    def resolve(
        self, schema_path: list[str | int], value: Any
    ) -> Callable[[], jsonschema_rs.Validator]:
        try:
            text = canonical(value)
            if '"$ref"' in text or '"$dynamicRef"' in text:
                ref = self._reference(tuple(schema_path), value)
                schema: Any = {"$ref": ref}
            else:
                # Nothing in it refers elsewhere: compiled by itself (same
                # options), and shared by every equal contentSchema.  Building
                # one over the whole document costs the document each time.
                ref = "value:" + text
                schema = value
            if ref not in self._built and ref not in self._building:
                self._building.add(ref)  # a recursive one: asked for again while built
                try:
                    self._built[ref] = _new_validator(
                        jsonschema_rs.Draft202012Validator, schema, self._content_kwargs()
                    )
                finally:
                    self._building.discard(ref)
        except Error as error:
            if self.error is None:
                self.error = error
            raise ValueError(error.message) from error  # the engine wraps it; _validator re-raises
        built = self._built
        return lambda: built[ref]

    def _content_kwargs(self) -> dict[str, Any]:
        if self._kwargs.get("base_uri") != _CONTENT_BASE:
            resources = [(DEFAULT_BASE, self._schema), *self._external.items()]
            self._kwargs = {
                **self._kwargs,
                "base_uri": _CONTENT_BASE,
                "registry": jsonschema_rs.Registry(resources),
            }  # the same content keywords: ``kwargs["keywords"]`` of _validator
        return self._kwargs

    def _index(self) -> dict[tuple[str | int, ...], list[tuple[Location, Path]]]:
        """By each path the engine may name a ``contentSchema`` by (from a
        resource's root, patterns spelled out): the resource roots it fits,
        in resource order, each with the ``contentSchema``'s path as written.
        Built once, so that a lookup costs what fits, not every resource."""
        result = self._result
        order = {loc: i for i, loc in enumerate(dict.fromkeys(result.graph.resources.values()))}
        index: dict[tuple[str | int, ...], list[tuple[Location, Path]]] = {}
        for number, path in result.graph.walked:
            if not path or path[-1] != "contentSchema":
                continue
            named = _renamed(path, engine_pattern) if self._spelled else path
            for cut in range(len(path) + 1):
                root = (number, path[:cut])
                if root in order:
                    index.setdefault(named[cut:], []).append((root, path))
        for roots in index.values():
            roots.sort(key=lambda found: order[found[0]])
        return index

    def _reference(self, path: tuple[str | int, ...], value: Any) -> str:
        """The reference to the ``contentSchema`` the engine names by ``path``
        (from the root of the document or resource it entered through)."""
        result = self._result
        if self._candidates is None:
            self._candidates = self._index()
        found: list[str] = []
        for (number, _), written in self._candidates.get(path, ()):
            location = (number, written)
            doc = result.graph.docs[number]
            node_path = written
            if self._spelled:  # compared, and pointed to, in what the engine was given
                doc = result.patterns.engine_document(doc)
                node_path = _renamed(written, engine_pattern)
            if location not in result.graph.walked or _node(doc, node_path) != value:
                continue
            base = result.graph.bases[(number, location[1][:-1])]
            root = result.graph.resource(base)
            assert root is not None  # every base walked is a resource's
            start = root[1]
            pointer = json_pointer(node_path[len(start) :])
            ref = f"{base}#{quote(pointer, safe=_FRAGMENT_SAFE)}"
            if ref not in found:
                found.append(ref)
        if not found:
            raise failure("contentSchema location not found", reason="engine_failure")
        if len(found) > 1 and any(k in canonical(value) for k in ('"$ref"', '"$dynamicRef"')):
            raise unsupported(
                "contentSchema with a reference has an ambiguous location",
                reason="ambiguous_content_schema",
                path=json_pointer(path),
            )
        return found[0]


def _renamed(
    path: tuple[str | int, ...], rename: Callable[[str], str | None]
) -> tuple[str | int, ...]:
    """``path`` with each ``patternProperties`` key renamed (when ``rename``
    gives a name)."""
    out = list(path)
    for i in range(1, len(out)):
        step = out[i]
        if out[i - 1] == "patternProperties" and type(step) is str:
            out[i] = rename(step) or step
    return tuple(out)


def _node(doc: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc
