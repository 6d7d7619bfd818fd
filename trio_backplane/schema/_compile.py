"""Compiled schemas, the fingerprint-keyed cache and the validation entry points."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Final, Literal, final
from urllib.parse import quote

import attrs
import jsonschema_rs

from ..errors import Error
from . import _instance
from ._content import clear_content_failure, content_keywords, take_content_failure
from ._ecma import engine_pattern
from ._errors import failure, invalid, limit_error, regex_failure, unsupported
from ._instance import json_pointer as _pointer
from ._options import Limits, SchemaLoader, SchemaOptions, normalize_dialects
from ._preflight import DEFAULT_BASE, Location, Path, Preflight, preflight

__all__ = [
    "CACHE_SIZE",
    "CompiledSchema",
    "MAX_ERROR_ENTRIES",
    "REGEX_BACKTRACK_LIMIT",
    "cache_clear",
    "cache_info",
    "check_bounds",
    "compile",
    "compile_output",
    "compile_with",
    "validate",
    "validate_output",
    "validate_schema",
]

#: Entries the compiled-validator cache keeps (spec 003).
CACHE_SIZE: Final = 4096
#: The fixed regex work limit: backtracking steps per match (SCH-29).
REGEX_BACKTRACK_LIMIT: Final = 100_000
#: At most this many error entries are reported per failure (SCH-23).
MAX_ERROR_ENTRIES: Final = 16
_MAX_MESSAGE: Final = 500
_PATTERN_OPTIONS: Final = jsonschema_rs.FancyRegexOptions(backtrack_limit=REGEX_BACKTRACK_LIMIT)
#: The base URI of a ``contentSchema`` validator's own (one-reference) root.
_CONTENT_BASE: Final = "urn:trio-backplane:content-schema"
_FRAGMENT_SAFE: Final = "/~!$&'()*+,;=:@"

Root = Literal["tool", "any"]
_DEFAULT_OPTIONS: Final = SchemaOptions()


def _raise_input(violation: _instance.Violation, limits: Limits, role: str) -> None:
    reason, path, detail = violation
    if reason == "input_too_deep":
        raise limit_error("input_too_deep", "max_input_depth", limits.max_input_depth, path=path)
    if reason == "input_too_large":
        raise limit_error("input_too_large", "max_input_bytes", limits.max_input_bytes, path=path)
    if reason == "integer_too_large":
        raise failure(
            "integer is too large to compare faithfully",
            reason="integer_too_large",
            maximum=_instance.INT_DIGITS_LIMIT,
            path=path,
        )
    raise invalid(f"{role} are not JSON data: {detail}", reason="not_json", path=path)


def _content_failure(noted: str | Error, written: _AsWritten | None = None) -> Error:
    """What a content keyword noted beside the engine's verdict: a limit's
    ``Error`` as it is, a regex failure's message as the work limit."""
    if isinstance(noted, Error):
        return noted
    return _regex_work_limit(noted if written is None else written.message(noted))


def _regex_work_limit(message: str) -> Error:
    return failure(
        "pattern matching exceeded the regex work limit",
        reason="regex_work_limit",
        limit=REGEX_BACKTRACK_LIMIT,
        cause=message[:_MAX_MESSAGE],
    )


@final
@attrs.frozen(eq=False)
class CompiledSchema:
    """A schema that passed preflight, built once for repeated validation.

    ``validate`` returns its argument itself, unchanged (SCH-09): no default
    is inserted, nothing is coerced, nothing is removed.  ``schema`` is the
    object first compiled under this fingerprint (equal as JSON to any later
    one); a tool descriptor keeps its own schema object.
    """

    schema: Any
    fingerprint: str
    options: SchemaOptions
    root: Root
    _is_valid: Callable[[Any], bool] = attrs.field(repr=False, alias="_is_valid")
    _iter_errors: Callable[[Any], Iterator[jsonschema_rs.ValidationError]] = attrs.field(
        repr=False, alias="_iter_errors"
    )
    _limits: Limits = attrs.field(repr=False, alias="_limits")
    #: the first error only (the engine stops there), for a recursive schema:
    #: collecting every error of one can grow exponentially with the nesting
    #: of the instance (each level re-entering several branches)
    _first_error: Callable[[Any], None] | None = attrs.field(
        default=None, repr=False, alias="_first_error"
    )
    #: a recursion multiplies evaluations per instance level (preflight's
    #: ``multiplies``): collecting even the first error can take exponential
    #: time, so a refusal reports the verdict alone and where it multiplies
    _multiplies: tuple[str, str, str] | None = attrs.field(
        default=None, repr=False, alias="_multiplies"
    )
    #: ``contentSchema`` is asserted: its regex failures arrive on the side
    #: (``_content``), since the engine's verdict may have hidden them
    _content: bool = attrs.field(default=False, repr=False, alias="_content")
    #: patterns the engine was given spelled out: an error names them as
    #: the schema writes them
    _written: _AsWritten | None = attrs.field(default=None, repr=False, alias="_written")

    def validate(self, arguments: Any) -> Any:
        """Return ``arguments`` if they satisfy the schema; raise ``Error`` otherwise."""
        if self.root == "tool" and type(arguments) is not dict:
            raise invalid(
                "tool arguments must be a JSON object",
                reason="not_json",
                type=type(arguments).__name__,
            )
        limits = self._limits
        check = _instance.fast_check
        if check is None or check(arguments, limits.max_input_depth, limits.max_input_bytes):
            violation = _instance.check_python(
                arguments, limits.max_input_depth, limits.max_input_bytes
            )
            if violation is not None:
                _raise_input(violation, limits, self._role)
        try:
            if self._content:
                clear_content_failure()
            valid = self._is_valid(arguments)
        except Exception as exc:  # the engine must never fail open or escape unclassed
            raise failure(
                "schema validator failed", reason="engine_failure", cause=_cause(exc)
            ) from exc
        if self._content:
            noted = take_content_failure()
            if noted is not None:
                raise _content_failure(noted)
        if valid:
            return arguments
        self._raise_mismatch(arguments)
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def _role(self) -> str:
        return "arguments" if self.root == "tool" else "structured content"

    def errors(self, instance: Any) -> list[dict[str, str]]:
        """Up to ``MAX_ERROR_ENTRIES`` error entries for ``instance`` (empty if valid)."""
        try:
            self.validate(instance)
        except Error as error:
            entries = error.details.get("errors")
            if entries is not None:
                return [dict(e) for e in entries]
            raise
        return []

    def _raise_mismatch(self, instance: Any) -> None:
        what = "tool arguments" if self.root == "tool" else "structured content"
        if self._multiplies is not None:
            if self._content:
                noted = take_content_failure()
                if noted is not None:
                    raise _content_failure(noted)
            where, step, reason = self._multiplies
            raise invalid(
                f"{what} do not match the schema",
                errors=[],
                error_count=0,
                errors_withheld={"reason": reason, "path": where, "step": step},
            )
        try:
            if self._first_error is None:
                collected = list(self._iter_errors(instance))
            else:
                collected = _first_of(self._first_error, instance)
        except Exception as exc:
            raise failure(
                "schema validator failed", reason="engine_failure", cause=_cause(exc)
            ) from exc
        noted = regex_failure(collected)
        if noted is None and self._content:
            noted = take_content_failure()
        written = self._written
        if noted is not None:
            raise _content_failure(noted, written)
        entries = [
            {
                "instance_path": _pointer(e.instance_path),
                "schema_path": _pointer(e.schema_path),
                "keyword": e.kind.name,
                "message": e.message[:_MAX_MESSAGE],
            }
            if written is None
            else written.entry(e)
            for e in collected[:MAX_ERROR_ENTRIES]
        ]
        details: dict[str, Any] = {"errors": entries, "error_count": len(collected)}
        if self._first_error is not None:
            details["first_error_only"] = True  # a recursive schema: see _first_error
        raise invalid(f"{what} do not match the schema", **details)


class _AsWritten:
    """What the engine names (a schema path, a message), with the patterns
    it was given spelled out named as the schema writes them.

    Preflight noted where each spelled-out pattern sits in the schema: a
    ``patternProperties`` step is the key written at that place, and a
    ``pattern`` error quotes the pattern written there.  Elsewhere (a
    referenced resource), a spelled-out text is named by the one pattern
    that gives it; a text two patterns give is left as the engine wrote it.
    """

    __slots__ = ("_keys", "_patterns", "_texts")

    def __init__(self, result: Preflight) -> None:
        #: in the schema itself (document 0), by the place of the node:
        #: ``(node path, spelled-out key) -> key as written``, and
        #: ``node path -> (spelled-out pattern, pattern as written)``
        self._keys: dict[tuple[Path, str], str] = {}
        self._patterns: dict[Path, tuple[str, str]] = {}
        texts: dict[str, str | None] = {}
        for number, path, key, text, written in result.spelled_out():
            texts[text] = written if texts.get(text, written) == written else None
            if number == 0:
                if key is None:
                    self._patterns[path] = (text, written)
                else:
                    self._keys[(path, text)] = written
        self._texts = {text: pattern for text, pattern in texts.items() if pattern is not None}

    def entry(self, error: jsonschema_rs.ValidationError) -> dict[str, Any]:
        steps = list(error.schema_path)
        for i in range(1, len(steps)):
            step = steps[i]
            if steps[i - 1] == "patternProperties" and type(step) is str:
                written = self._keys.get((tuple(steps[: i - 1]), step))
                steps[i] = written if written is not None else self._texts.get(step, step)
        message = error.message
        spelled = self._patterns.get(tuple(steps[:-1])) if steps[-1:] == ["pattern"] else None
        message = message.replace(*spelled) if spelled is not None else self.message(message)
        return {
            "instance_path": _pointer(error.instance_path),
            "schema_path": _pointer(steps),
            "keyword": error.kind.name,
            "message": message[:_MAX_MESSAGE],
        }

    def message(self, message: str) -> str:
        """``message`` with every spelled-out text one pattern gives named as written."""
        for text, pattern in self._texts.items():
            if text in message:
                message = message.replace(text, pattern)
        return message


def _first_of(
    validate: Callable[[Any], None], instance: Any
) -> list[jsonschema_rs.ValidationError]:
    """The engine's first error for an instance it found invalid."""
    try:
        validate(instance)
    except jsonschema_rs.ValidationError as error:
        return [error]
    raise AssertionError("the engine judged the instance both invalid and valid")


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE]


# -- the cache -----------------------------------------------------------

_cache: OrderedDict[str, CompiledSchema | Error] = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def cache_clear() -> None:
    """Empty the compiled-validator cache."""
    with _cache_lock:
        _cache.clear()
        _stats["hits"] = _stats["misses"] = 0


def cache_info() -> dict[str, int]:
    """``{"hits", "misses", "size", "maxsize"}`` of the compiled-validator cache."""
    with _cache_lock:
        return {**_stats, "size": len(_cache), "maxsize": CACHE_SIZE}


_canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode


def _fingerprint(schema: Any, options: SchemaOptions, limits: Limits, root: Root) -> str:
    """SHA-256 of the schema as canonical JSON and every option that changes
    its meaning (SCH-46).  ``true`` and ``1`` encode differently, so they never
    share an entry; key order does not matter."""
    meta = _meta_text(options, limits, root)
    text = _canonical(schema)  # JSON data: checked by the caller
    digest = hashlib.sha256(meta.encode("utf-8", "surrogatepass"))
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


_meta_texts: dict[tuple[SchemaOptions, Limits, Root], str] = {}


def _meta_text(options: SchemaOptions, limits: Limits, root: Root) -> str:
    """The options part of a fingerprint, memoized when no registry or loader
    (whose contents may change under an equal record) takes part."""
    registry = options.schema_registry
    loader = options.schema_loader
    plain = registry is None and loader is None
    if plain:
        known = _meta_texts.get((options, limits, root))
        if known is not None:
            return known
    meta = {
        "root": root,
        "dialects": sorted(options.dialects or ("2020-12",)),
        "format_assertion": options.format_assertion,
        "content_assertion": options.content_assertion,
        "allow_external_refs": options.allow_external_refs,
        "limits": list(attrs.astuple(limits)),
        "registry": None if registry is None else dict(registry),
        "loader": None if loader is None else f"{type(loader).__qualname__}@{id(loader):x}",
    }
    try:
        text = _canonical(meta) + "\n"
    except (TypeError, ValueError, RecursionError) as exc:
        raise invalid(
            "schema_registry is not JSON data", reason="not_json", cause=_cause(exc)
        ) from exc
    if plain and len(_meta_texts) < 1024:
        _meta_texts[(options, limits, root)] = text
    return text


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
        # when referenced, SCH-03).
        return _build(schema, options, limits, root, "")
    key = _fingerprint(schema, options, limits, root)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
    if hit is not None:
        if isinstance(hit, Error):
            raise Error(hit.error_class, hit.message, hit.details)
        return hit
    try:
        compiled = _build(schema, options, limits, root, key)
    except Error as error:
        if options.schema_loader is None:  # a loader's refusals may be transient
            _store(key, error)
        raise
    _store(key, compiled)
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


def _store(key: str, value: CompiledSchema | Error) -> None:
    with _cache_lock:
        _stats["misses"] += 1
        _cache[key] = value
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)


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
            "schema could not be read as JSON data", reason="not_json", cause=_cause(exc)
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


def _build(
    schema: Any, options: SchemaOptions, limits: Limits, root: Root, key: str
) -> CompiledSchema:
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
    written = _AsWritten(result) if result.patterns else None
    validator = _engine(schema, options, limits, result, written)
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


def _engine(
    schema: Any,
    options: SchemaOptions,
    limits: Limits,
    result: Preflight,
    written: _AsWritten | None = None,
) -> jsonschema_rs.Validator:
    kwargs: dict[str, Any] = {
        "offline": True,  # never fetch (SCH-20): every resource is in the registry
        "base_uri": DEFAULT_BASE,
        "pattern_options": _PATTERN_OPTIONS,
        "validate_formats": options.format_assertion or result.format_assertion_vocabulary,
    }
    # Patterns the engine would match otherwise than ECMA-262 are given
    # spelled out (SCH-26): in copies, the schema itself is never changed.
    schema = result.engine_document(schema)
    external = {uri: result.engine_document(doc) for uri, doc in result.external.items()}
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
                path=_pointer(exc.instance_path),
                cause=exc.message[:_MAX_MESSAGE],
            ) from exc
        raise invalid(
            "schema is not a valid JSON Schema",
            reason="invalid_schema",
            errors=[
                {
                    "instance_path": _pointer(exc.instance_path),
                    "schema_path": _pointer(exc.schema_path),
                    "keyword": exc.kind.name,
                    "message": exc.message[:_MAX_MESSAGE],
                }
            ],
        ) from exc
    except (jsonschema_rs.ReferencingError, ValueError) as exc:
        raise invalid(
            "schema could not be built", reason="invalid_schema", cause=_cause(exc)
        ) from exc
    except Exception as exc:
        raise failure("schema engine failed", reason="engine_failure", cause=_cause(exc)) from exc


class _ContentSchemas:
    """The ``contentSchema`` validators of one compilation (SCH-14).

    Each is ``{"$ref": <its location>}`` over a registry holding the schema
    itself and its external resources, built with the main validator's
    options: its references resolve in the enclosing document, and patterns,
    formats and nested content keywords behave as everywhere else.  The
    engine names a keyword by its path from the root of the document or of
    the resource it entered through, so the location is found among the
    preflight's resources; a path that fits several, with a reference inside,
    is refused rather than guessed.
    """

    def __init__(
        self,
        schema: Any,
        external: dict[str, Any],
        result: Preflight,
        kwargs: dict[str, Any],
        written: _AsWritten | None,
    ) -> None:
        #: a nested error message names patterns as written (before it is cut)
        self.written = None if written is None else written.message
        self._schema = schema
        self._external = external
        self._result = result
        self._kwargs = kwargs
        #: the engine is given some patterns spelled out (``engine_document``):
        #: its paths hold them as ``patternProperties`` keys
        self._spelled = bool(result.patterns)
        self._built: dict[str, jsonschema_rs.Validator] = {}
        self._building: set[str] = set()
        self.error: Error | None = None
        self._candidates: dict[tuple[str | int, ...], list[tuple[Location, Path]]] | None = None

    def resolve(
        self, schema_path: list[str | int], value: Any
    ) -> Callable[[], jsonschema_rs.Validator]:
        try:
            text = _canonical(value)
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
            raise ValueError(error.message) from error  # the engine wraps it; _engine re-raises
        built = self._built
        return lambda: built[ref]

    def _content_kwargs(self) -> dict[str, Any]:
        if self._kwargs.get("base_uri") != _CONTENT_BASE:
            resources = [(DEFAULT_BASE, self._schema), *self._external.items()]
            self._kwargs = {
                **self._kwargs,
                "base_uri": _CONTENT_BASE,
                "registry": jsonschema_rs.Registry(resources),
            }  # the same content keywords: ``kwargs["keywords"]`` of _engine
        return self._kwargs

    def _index(self) -> dict[tuple[str | int, ...], list[tuple[Location, Path]]]:
        """For each path a ``contentSchema`` may be named by (its path from a
        resource's root, as the engine names it: with patterns spelled out),
        the resource roots it fits, in resource order, each with the path of
        the ``contentSchema`` in the schema as written: built once, so
        finding a location costs what fits it, not every resource (a schema
        of thousands of resources and contentSchemas compiled in quadratic
        time)."""
        result = self._result
        order = {loc: i for i, loc in enumerate(dict.fromkeys(result.resources.values()))}
        index: dict[tuple[str | int, ...], list[tuple[Location, Path]]] = {}
        for number, path in result.walked:
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
            doc = result.docs[number]
            node_path = written
            if self._spelled:  # compared, and pointed to, in what the engine was given
                doc = result.engine_document(doc)
                node_path = _renamed(written, engine_pattern)
            if location not in result.walked or _node(doc, node_path) != value:
                continue
            base = result.bases[(number, location[1][:-1])]
            root = result.resource(base)
            assert root is not None  # every base walked is a resource's
            start = root[1]
            pointer = _pointer(node_path[len(start) :])
            ref = f"{base}#{quote(pointer, safe=_FRAGMENT_SAFE)}"
            if ref not in found:
                found.append(ref)
        if not found:
            raise failure("contentSchema location not found", reason="engine_failure")
        if len(found) > 1 and any(k in _canonical(value) for k in ('"$ref"', '"$dynamicRef"')):
            raise unsupported(
                "contentSchema with a reference has an ambiguous location",
                reason="ambiguous_content_schema",
                path=_pointer(path),
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


# -- public entry points ---------------------------------------------------


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
    """Preflight and build a tool (input) schema: an object root (SCH-06/07).

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
    """Like :func:`compile` for an output schema: any root, any JSON value (SCH-47)."""
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
    """Preflight a tool schema without arguments (SCH-24)."""
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
    """Spec 003 bounds for a server-supplied schema; raises with ``details["reason"]``.

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
    result = Preflight(
        limits,
        frozenset({"2020-12", "draft-07"}),
        None,
        None,
        allow_external_refs,
        bounds_only=True,
    )
    result.add_document(schema, DEFAULT_BASE, role="schema")
    result.resolve_references()  # local targets outside subschema positions
    result.check_fanout()
    result.check_annotation_fanout()
