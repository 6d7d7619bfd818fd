"""Preflight: everything we check about a schema before the engine builds it.

The engine (jsonschema-rs) evaluates Draft 2020-12 faithfully, but it builds
lazily and trusts what it is given.  This pass walks the whole document, every
branch included, without Python recursion, and refuses with a class:

* JSON data, nesting, size (``Limits``), subschema depth and count, the
  number of references and the length and ECMA-262 syntax of patterns;
* the dialect of every ``$schema`` (2020-12, draft-07 when opted in, or a
  custom meta-schema from the registry/loader whose vocabularies we know);
* every ``$ref``/``$dynamicRef``: local ones must resolve, external ones come
  only from ``schema_registry``/``schema_loader`` (never fetched), and a cycle
  of references that consumes no input is refused;
* a reference target that no subschema position reaches (an unknown keyword,
  an ``enum`` value): the engine evaluates it, so it is walked as a subschema
  with every check above, or refused;
* the evaluation fan-out through references (``FANOUT_FACTOR``).

The result names the external resources the engine needs, and nothing else.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

from ..errors import Error, ErrorClass
from . import _ecma, _uri
from ._content import check_content_keywords
from ._errors import failure, invalid, limit_error, unsupported
from ._instance import first_violation
from ._instance import json_pointer as _pointer
from ._options import Limits

__all__ = ["ANNOTATION_FANOUT", "DEFAULT_BASE", "FANOUT_FACTOR", "Preflight", "preflight"]

#: The base URI of a document without ``$id`` (the engine uses the same one).
DEFAULT_BASE: Final = "json-schema:///"
#: A schema's expanded size (the subschemas an evaluation can visit: the root,
#: its applied subschemas, ``$defs``/``definitions`` left out, and each
#: reference replaced by its target's expanded size, recursion counted once)
#: may be at most this many times ``Limits.max_subschemas``: 1 000 000 under
#: the host preset, 10 000 under the MCP one.  The engine holds the GIL for a
#: whole validation and spent about 7 ns per visit when measured, so this keeps
#: the worst case near 10 ms per instance location, where levels of ``allOf``
#: of two references double it per level (40 levels never finish).
FANOUT_FACTOR: Final = 10
#: A schema with ``unevaluatedProperties``/``unevaluatedItems`` makes the
#: engine evaluate its branching in-place subschemas (``anyOf``, ``oneOf``,
#: ``if``/``then``/``else``) again to collect their annotations, and levels of
#: them nested double the work per level (measured: 22 levels of ``anyOf``
#: under ``unevaluatedProperties``, a 1.5 KB schema, took 10 s per call).
#: Counting each such branch twice, a schema's weight may be at most this
#: (and at most ``FANOUT_FACTOR`` times ``max_subschemas``): about 0.05 s.
ANNOTATION_FANOUT: Final = 65_536
_BRANCHING: Final = frozenset({"anyOf", "oneOf", "if", "then", "else"})
_ANNOTATING: Final = ("unevaluatedProperties", "unevaluatedItems")

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
DRAFT_07: Final = "http://json-schema.org/draft-07/schema"
_VOCAB: Final = "https://json-schema.org/draft/2020-12/vocab/"
KNOWN_VOCABULARIES: Final = frozenset(
    _VOCAB + v
    for v in (
        "core",
        "applicator",
        "unevaluated",
        "validation",
        "meta-data",
        "format-annotation",
        "format-assertion",
        "content",
    )
)
FORMAT_ASSERTION_VOCABULARY: Final = _VOCAB + "format-assertion"
_META: Final = "https://json-schema.org/draft/2020-12/meta/"
#: Meta-schemas the engine bundles: a reference to one is never external.
BUNDLED_2020_12: Final = frozenset(
    {DRAFT_2020_12}
    | {
        _META + m
        for m in (
            "core",
            "applicator",
            "unevaluated",
            "validation",
            "meta-data",
            "format-annotation",
            "format-assertion",
            "content",
        )
    }
)


class _Multiplies(Exception):
    """Internal: a recursion evaluates one instance location more than once
    per level of the instance (``check_recursive_fanout``), or (``reason``
    ``"recursion_not_analysed"``) the check gave up and assumes it does."""

    def __init__(self, where: str, step: str, reason: str = "recursive_fanout") -> None:
        super().__init__(where)
        self.where = where
        self.step = step
        self.reason = reason


#: An array index in a JSON pointer (RFC 6901): ASCII digits, no leading zero
#: (``str.isdigit`` also takes "²" or "٣", which ``int`` then refuses or reads).
_ARRAY_INDEX: Final = re.compile(r"0|[1-9][0-9]*")

#: The instance steps a schema recurses through (``check_recursive_fanout``).
_Steps = set[tuple[Any, ...]] | frozenset[tuple[Any, ...]]
#: Steps copied from summaries several schemas share before
#: ``check_recursive_fanout`` gives up (about 0.1 s of set copying here).
_FANOUT_WORK: Final = 2_000_000


class _Summaries:
    """The summaries of ``check_recursive_fanout``: by schema, the instance
    steps it recurses through into its component.  A summary is grown in
    place by the one schema that reads it (``readers``) unless it is
    borrowed: the very set of the schema it applies (``{"$ref": ...}``)."""

    __slots__ = ("borrowed", "readers", "steps", "work")

    def __init__(self, readers: dict[Location, int]) -> None:
        self.steps: dict[Location, _Steps] = {}
        self.readers = readers
        self.borrowed: set[Location] = set()
        #: steps the copies of shared summaries may still take
        self.work = _FANOUT_WORK

    def owns(self, source: Location) -> bool:
        """Whether the schema reading ``source``'s summary may grow it: it is
        the only reader, and the set is ``source``'s own (a frozen one is
        the empty placeholder of a schema still being summarised)."""
        return (
            type(self.steps[source]) is set
            and self.readers.get(source) == 1
            and source not in self.borrowed
        )


# Schema-valued keywords (API.md, "Subschema positions").  In a 2020-12 schema
# the engine still applies the legacy ``dependencies`` (the suite's optional
# dependencies-compatibility) and finds resources in ``definitions``, so both
# are walked in every dialect: what the engine uses is never unchecked.
_MAP_2020: Final = (
    "$defs",
    "properties",
    "patternProperties",
    "dependentSchemas",
    "definitions",
    "dependencies",
)
_LIST_2020: Final = ("prefixItems", "allOf", "anyOf", "oneOf")
_ONE_2020: Final = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_ONE_07: Final = (*_ONE_2020, "additionalItems")
#: Keywords that only hold subschemas: nothing evaluates them but a reference.
_STORAGE: Final = frozenset({"$defs", "definitions"})
#: Keywords whose subschemas apply to the same instance location.
_ITEM_WILDCARDS: Final = frozenset({"items", "additionalItems", "contains", "unevaluatedItems"})
_IN_PLACE: Final = frozenset(
    {"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies"}
)

Path = tuple[str | int, ...]
Location = tuple[int, Path]  # (document number, path from the document root)


def _dialect_uri(uri: str) -> str:
    return uri[:-1] if uri.endswith("#") else uri


def _bounds_dialect(declared: str) -> str:
    """The positions ``check_bounds`` walks under ``declared``: it refuses no
    dialect, so any URI but 2020-12 gets draft-07's, a superset of 2020-12's."""
    return "2020-12" if _dialect_uri(declared) == DRAFT_2020_12 else "draft-07"


class Preflight:
    """What preflight learnt: the engine's inputs and the analysis behind them."""

    __slots__ = (
        "_declared",
        "_dialects",
        "_engine_docs",
        "_limits",
        "_loader",
        "_registry",
        "allow_external_refs",
        "anchors",
        "annotating",
        "bases",
        "bounds_only",
        "children",
        "collecting",
        "content_assertion",
        "docs",
        "dynamic_anchors",
        "edges",
        "external",
        "format_assertion_vocabulary",
        "loader_used",
        "metaschemas",
        "multiplies",
        "patterns",
        "recursive",
        "ref_groups",
        "refs",
        "resources",
        "root_dialect",
        "subschemas",
        "targets",
        "walked",
    )

    def __init__(
        self,
        limits: Limits,
        dialects: frozenset[str],
        registry: Mapping[str, Any] | None,
        loader: Callable[[str], Any] | None,
        allow_external_refs: bool,
        *,
        content_assertion: bool = False,
        bounds_only: bool = False,
    ) -> None:
        self.content_assertion = content_assertion
        self.bounds_only = bounds_only
        self._limits = limits
        self._dialects = dialects
        self._registry = None if registry is None else _registry_by_identity(registry)
        self._loader = loader
        self.allow_external_refs = allow_external_refs
        self.docs: list[Any] = []
        #: resource roots, by the ``_identity_key`` of their URI: references
        #: are looked up the way the engine looks them up (a differently
        #: spelled URI finds the resource the engine finds, never another)
        self.resources: dict[str, Location] = {}
        #: anchors, by the ``_identity_key`` of ``<resource URI>#<name>``
        self.anchors: dict[str, Location] = {}
        #: every resource URI and anchor declared, by ``_identity_key``
        self._declared: dict[str, Location] = {}
        self.dynamic_anchors: dict[str, list[Location]] = {}
        self.bases: dict[Location, str] = {}
        self.edges: dict[Location, list[Location]] = {}
        #: every subschema position walked: its (dialect, subschema depth)
        self.walked: dict[Location, tuple[str, int]] = {}
        #: a schema's subschema positions, and what its references resolve to
        self.children: dict[Location, tuple[Path, ...]] = {}
        #: schemas holding ``unevaluated*`` (``check_annotation_fanout``)
        self.annotating: set[Location] = set()
        #: ... and those they hold in place without branching (``_collecting``)
        self.collecting: set[Location] = set()
        self.targets: dict[Location, list[Location]] = {}
        self.refs: list[tuple[Location, str, str]] = []  # (where, keyword, reference)
        #: each reference's targets, by the schema holding it: a ``$dynamicRef``
        #: has alternatives (its dynamic anchors), of which the engine takes one
        self.ref_groups: dict[Location, list[list[Location]]] = {}
        #: external resources the engine needs, by URI (registry/loader entries)
        self.external: dict[str, Any] = {}
        #: custom meta-schemas in use, by URI
        self.metaschemas: dict[str, Any] = {}
        #: a reference leads back to a schema it came from (``check_fanout``):
        #: evaluation then grows with the instance, not only with the schema
        self.recursive = False
        #: where a recursion multiplies evaluations per instance level
        #: (``check_recursive_fanout``): error collection is unbounded there
        #: ``(schema path, instance step, reason)``
        self.multiplies: tuple[str, str, str] | None = None
        #: patterns the engine is given spelled out (``_ecma.engine_pattern``),
        #: by document number: ``(schema path, patternProperties key or None
        #: for ``pattern``, the engine's text)``
        self.patterns: dict[int, list[tuple[Path, str | None, str]]] = {}
        self._engine_docs: dict[int, Any] | None = None  # id(doc) -> engine_document(doc)
        self.format_assertion_vocabulary = False
        self.loader_used = False
        self.subschemas = 0
        self.root_dialect = "2020-12"

    # -- documents -------------------------------------------------------

    def add_document(self, doc: Any, base: str, *, role: str) -> int:
        """Check ``doc`` as JSON data within the limits and walk it."""
        limits = self._limits
        violation = first_violation(doc, limits.max_json_depth, limits.max_schema_bytes)
        if violation is not None:
            reason, pointer, detail = violation
            where = {"role": role, "path": pointer}
            if reason == "input_too_deep":
                raise limit_error("too_deep", "max_json_depth", limits.max_json_depth, **where)
            if reason == "input_too_large":
                raise limit_error("too_large", "max_schema_bytes", limits.max_schema_bytes, **where)
            if reason == "integer_too_large":
                raise failure(
                    "schema integer is too large to compare faithfully",
                    reason="integer_too_large",
                    maximum=4300,
                    **where,
                )
            raise invalid(f"schema is not JSON data: {detail}", reason="not_json", **where)
        number = len(self.docs)
        self.docs.append(doc)
        # The document is the resource at ``base`` whatever ``$id`` it
        # declares: no schema inside it may claim that URI too (a decoy
        # ``"$id": ""`` would take the root's references for itself).
        self._add_resource(base, (number, ()), ())
        self._walk(number, doc, base)
        return number

    def _add_resource(self, uri: str, loc: Location, path: Path) -> None:
        """Declare ``uri`` (no fragment) as the resource rooted at ``loc``."""
        self._declare(uri, loc, path)
        self.resources.setdefault(_identity_key(uri), loc)

    def resource(self, uri: str) -> Location | None:
        """The resource root the engine finds at ``uri`` (no fragment)."""
        return self.resources.get(_identity_key(uri))

    def _walk(  # noqa: PLR0917 - one walk for documents and hidden reference targets
        self,
        number: int,
        doc: Any,
        base: str,
        start: Path = (),
        dialect: str = "2020-12",
        depth: int = 1,
    ) -> None:
        limits = self._limits
        hidden = start != ()  # a reference target outside subschema positions
        # (node, path, base URI, dialect, subschema depth)
        stack: list[tuple[Any, Path, str, str, int]] = [(doc, start, base, dialect, depth)]
        first = not hidden
        while stack:
            node, path, base, dialect, depth = stack.pop()
            loc = (number, path)
            if hidden and loc in self.walked:
                continue  # an earlier hidden target holds this one
            self.walked[loc] = (dialect, depth)
            self.subschemas += 1
            if self.subschemas > limits.max_subschemas:
                raise limit_error("too_many_subschemas", "max_subschemas", limits.max_subschemas)
            if depth > limits.max_subschema_depth:
                raise limit_error(
                    "too_deep",
                    "max_subschema_depth",
                    limits.max_subschema_depth,
                    path=_pointer(path),
                )
            if type(node) is not dict:
                continue  # booleans; anything else is the meta-schema's to refuse
            if _ANNOTATING[0] in node or _ANNOTATING[1] in node:
                self.annotating.add(loc)
            if hidden and not self.bounds_only:
                self._refuse_hidden_resource(node, path)
            declared = node.get("$schema")
            if type(declared) is str:
                if self.bounds_only:
                    named = _bounds_dialect(declared)
                else:
                    named = self._dialect(declared, path)  # refused unless supported
                # The engine applies ``$schema`` wherever it appears (a
                # resource's root or not), so the checks do: the keyword
                # positions of both dialects are walked anyway (below).
                dialect = named
                if first and not self.bounds_only:
                    self.root_dialect = dialect
            first = False
            ident = node.get("$id")
            if type(ident) is str:
                if dialect == "draft-07" and ident.startswith("#"):
                    # an anchor: the engine keeps it beside ``$ref`` too
                    self._declare(base + ident, loc, path)
                    self.anchors[_identity_key(base + ident)] = loc
                elif not (dialect == "draft-07" and "$ref" in node):
                    # (draft-07 ignores a base-changing ``$id`` beside
                    # ``$ref``: that reference resolves against the
                    # enclosing base)
                    base = _uri.split_fragment(_uri.resolve(base, ident))[0]
                    self._add_resource(base, loc, path)
            for key in ("$anchor", "$dynamicAnchor"):
                name = node.get(key)
                if type(name) is str:
                    self._declare(f"{base}#{name}", loc, path)
                    self.anchors.setdefault(_identity_key(f"{base}#{name}"), loc)
                    if key == "$dynamicAnchor":
                        self.dynamic_anchors.setdefault(name, []).append(loc)
            self.bases[loc] = base
            for key in ("$ref", "$dynamicRef"):
                ref = node.get(key)
                if type(ref) is str:
                    self._note_ref(loc, key, ref)
            if self.content_assertion:
                check_content_keywords(node, _pointer(path))
            pattern = node.get("pattern")
            if type(pattern) is str:
                text = self._check_pattern(pattern, (*path, "pattern"))
                if text is not None:
                    self._spell_out(number, path, None, text, hidden, pattern)
            pattern_props = node.get("patternProperties")
            if type(pattern_props) is dict:
                for pat in pattern_props:
                    text = self._check_pattern(pat, (*path, "patternProperties", pat))
                    if text is not None:
                        self._spell_out(number, path, pat, text, hidden, pat)
            # children, pushed in reverse so the walk is in document order
            children: list[tuple[Any, Path, str, str, int]] = []
            edges: list[Location] = []
            for key in _MAP_2020:
                value = node.get(key)
                if type(value) is dict:
                    for name, sub in value.items():
                        if key == "dependencies" and type(sub) is list:
                            continue
                        child = (*path, key, name)
                        children.append((sub, child, base, dialect, depth + 1))
                        if key in _IN_PLACE:
                            edges.append((number, child))
            for key in _LIST_2020:
                value = node.get(key)
                if type(value) is list:
                    for i, sub in enumerate(value):
                        child = (*path, key, i)
                        children.append((sub, child, base, dialect, depth + 1))
                        if key in _IN_PLACE:
                            edges.append((number, child))
            # Both dialects' positions, whichever this node is in: one the
            # engine does not evaluate is only counted (fail closed), one it
            # does is never missed.
            for key in _ONE_07:
                if key in node:
                    value = node[key]
                    if key == "items" and type(value) is list:
                        for i, sub in enumerate(value):
                            children.append((sub, (*path, key, i), base, dialect, depth + 1))
                        continue
                    child = (*path, key)
                    children.append((value, child, base, dialect, depth + 1))
                    if key in _IN_PLACE:
                        edges.append((number, child))
            if edges:
                self.edges[loc] = edges
            if children:
                self.children[loc] = tuple([child[1] for child in children])
            stack.extend(reversed(children))

    def _refuse_hidden_resource(self, node: dict[str, Any], path: Path) -> None:
        """The engine does not treat ``$id`` and anchors consistently outside
        subschema positions, so we refuse rather than guess its base URI."""
        for key in ("$id", "$anchor", "$dynamicAnchor"):
            if key in node:
                raise invalid(
                    f"a schema reached only by reference may not declare {key}",
                    reason="hidden_resource",
                    path=_pointer((*path, key)),
                )

    def _walk_hidden(self, target: Location, ref: str) -> None:
        """Walk a reference target that no subschema position reaches, in the
        scope of the nearest walked schema that holds it (SCH-24)."""
        number, path = target
        node = self.docs[number]
        for part in path:
            node = node[part]
        if type(node) is not bool and type(node) is not dict:
            if self.bounds_only:
                return  # not a schema: nothing to bound
            raise invalid(
                "schema reference does not point to a schema",
                reason="invalid_schema",
                reference=ref,
                path=_pointer(path),
            )
        for length in range(len(path) - 1, -1, -1):
            owner = (number, path[:length])
            if owner in self.bases:  # walked, and a mapping
                dialect, depth = self.walked[owner]
                self._walk(number, node, self.bases[owner], path, dialect, depth + 1)
                return
        raise invalid("schema reference does not resolve", reference=ref, reason="unresolved")

    # -- dialects ----------------------------------------------------------

    def _dialect(self, declared: str, path: Path) -> str:
        uri = _dialect_uri(declared)
        if uri == DRAFT_2020_12:
            return "2020-12"
        if uri == DRAFT_07:
            if "draft-07" in self._dialects:
                return "draft-07"
            raise unsupported(
                "draft-07 schemas need dialects={'2020-12', 'draft-07'}",
                schema=declared,
                path=_pointer(path),
            )
        if _identity_key(uri).startswith(_SPEC_HOSTS):
            # Any other json-schema.org URI names a draft the engine knows
            # (draft-04, 2019-09, ...) or a misspelt one: a registry entry
            # under it would be evaluated as that draft, never as the
            # 2020-12 meta-schema it declares (SCH-02).
            raise unsupported(
                "unsupported JSON Schema dialect", schema=declared, path=_pointer(path)
            )
        meta = self._custom_metaschema(declared)
        if meta is None:
            raise unsupported(
                "unsupported JSON Schema dialect", schema=declared, path=_pointer(path)
            )
        return "2020-12"

    def _custom_metaschema(self, declared: str) -> Any:
        """A meta-schema from the registry or loader whose own dialect is
        2020-12, with only vocabularies we support required (SCH-02, SCH-04)."""
        uri = _uri.split_fragment(declared)[0]
        if uri in self.metaschemas:
            return self.metaschemas[uri]
        if self._registry is None and self._loader is None:
            return None
        try:
            meta = self._fetch(uri, declared)
        except Error as error:
            if error.error_class is ErrorClass.EXECUTION_FAILURE:
                raise  # the loader failed: SCH-19, not an unknown dialect
            return None
        own = meta.get("$schema") if type(meta) is dict else None
        if type(own) is not str or _dialect_uri(own) != DRAFT_2020_12:
            raise unsupported(
                "custom meta-schema is not a Draft 2020-12 meta-schema", schema=declared
            )
        vocabulary = meta.get("$vocabulary")
        if type(vocabulary) is dict:
            for vocab, required in vocabulary.items():
                if required is True and vocab not in KNOWN_VOCABULARIES:
                    raise unsupported(
                        "meta-schema requires an unsupported vocabulary",
                        schema=declared,
                        vocabulary=vocab,
                    )
                if vocab == FORMAT_ASSERTION_VOCABULARY:
                    # We support this vocabulary, so an optional (false) listing
                    # asserts format too, as a supporting implementation must.
                    self.format_assertion_vocabulary = True
        self.metaschemas[uri] = meta
        if self.resource(uri) is None:
            self.add_document(meta, uri, role="metaschema")
        if type(vocabulary) is dict and any(
            vocabulary.get(vocab) is False for vocab in KNOWN_VOCABULARIES
        ):
            # A vocabulary we support listed as optional (false) is applied
            # all the same (2020-12 core 8.1.2): the engine, which would
            # switch it off, is given the meta-schema with it required.
            meta = {
                **meta,
                "$vocabulary": {
                    vocab: True if vocab in KNOWN_VOCABULARIES else required
                    for vocab, required in vocabulary.items()
                },
            }
        self.external[uri] = meta
        return meta

    # -- references ------------------------------------------------------

    def _note_ref(self, loc: Location, keyword: str, ref: str) -> None:
        if len(self.refs) >= self._limits.max_refs:
            raise limit_error("too_many_refs", "max_refs", self._limits.max_refs)
        if not self.allow_external_refs and not ref.startswith("#"):
            raise invalid(
                "schema reference is not local",
                reason="remote_ref",
                reference=ref,
                path=_pointer(loc[1] + (keyword,)),
            )
        self.refs.append((loc, keyword, ref))

    def _fetch(self, uri: str, reference: str) -> Any:
        """An external resource from the registry or the loader, never the network."""
        if self._registry is not None:
            key = _identity_key(uri)
            if key not in self._registry:
                raise invalid(
                    "external schema reference is not in schema_registry", reference=reference
                )
            return self._registry[key]
        if self._loader is None:
            raise invalid(
                "external schema reference requires an explicit loader", reference=reference
            )
        self.loader_used = True
        try:
            loaded = self._loader(uri)
        except Exception as exc:
            raise failure(
                "external schema reference could not be loaded",
                reference=reference,
                cause=f"{type(exc).__name__}: {exc}"[:500],
            ) from exc
        if type(loaded) is not bool and not isinstance(loaded, Mapping):
            raise failure(
                "external schema reference could not be loaded",
                reference=reference,
                cause=f"loader returned {type(loaded).__name__}, not a schema",
            )
        return loaded

    def resolve_references(self) -> None:
        """Resolve every reference (loading external resources as needed,
        which may add references) and build the in-place reference edges."""
        done = 0
        while done < len(self.refs):
            loc, keyword, ref = self.refs[done]
            done += 1
            try:
                target = self._resolve(loc, ref)
            except Error:
                if self.bounds_only:  # check_bounds resolves nothing external
                    continue
                raise
            if target is None:
                continue
            if target not in self.walked:
                self._walk_hidden(target, ref)
            targets = [target]
            if keyword == "$dynamicRef":
                fragment = _uri.split_fragment(ref)[1]
                if fragment and not fragment.startswith("/"):
                    targets.extend(self.dynamic_anchors.get(fragment, ()))
            self.edges.setdefault(loc, []).extend(targets)
            self.targets.setdefault(loc, []).extend(targets)
            self.ref_groups.setdefault(loc, []).append(list(dict.fromkeys(targets)))

    def _resolve(self, loc: Location, ref: str) -> Location | None:
        absolute = _uri.resolve(self.bases[loc], ref)
        resource, fragment = _uri.split_fragment(absolute)
        root = self.resource(resource)
        if root is None:
            if resource in BUNDLED_2020_12 or (
                "draft-07" in self._dialects and resource == DRAFT_07
            ):
                return None
            if resource in self.metaschemas:
                return None
            loaded = self._fetch(resource, ref)
            number = self.add_document(loaded, resource, role="reference")
            root = (number, ())
            self.external[resource] = loaded
        if fragment == "":
            return root
        if fragment.startswith("/"):
            return self._follow_pointer(root, fragment, ref)
        target = self.anchors.get(_identity_key(f"{resource}#{fragment}"))
        if target is None:
            raise invalid("schema reference does not resolve", reference=ref, reason="unresolved")
        return target

    def _follow_pointer(self, root: Location, fragment: str, ref: str) -> Location:
        number, path = root
        node = self.docs[number]
        for part in path:
            node = node[part]
        steps: list[str | int] = []
        for raw in unquote(fragment).split("/")[1:]:
            token = raw.replace("~1", "/").replace("~0", "~")
            if type(node) is dict and token in node:
                node = node[token]
                steps.append(token)
            elif type(node) is list and _ARRAY_INDEX.fullmatch(token) and int(token) < len(node):
                node = node[int(token)]
                steps.append(int(token))
            else:
                raise invalid(
                    "schema reference does not resolve", reference=ref, reason="unresolved"
                )
        for before, step in itertools.pairwise(steps):
            if before == "patternProperties" and _ecma.engine_pattern(str(step)) is not None:
                # The engine is given that key spelled out: the pointer would
                # name a key its copy of the schema does not have.
                raise unsupported(
                    "schema reference points through a patternProperties pattern"
                    " the engine must be given spelled out",
                    reason="unsupported_pattern",
                    reference=ref,
                    pattern=step,
                )
        return (number, path + tuple(steps))

    def check_cycles(self) -> None:
        """Refuse a cycle of in-place applicators and references: it consumes
        no input, and the engine would accept every instance (SCH-50)."""
        WHITE, GREY, BLACK = 0, 1, 2
        colour: dict[Location, int] = {}
        for start in list(self.edges):
            if colour.get(start, WHITE) != WHITE:
                continue
            colour[start] = GREY
            stack: list[tuple[Location, int]] = [(start, 0)]
            while stack:
                node, i = stack[-1]
                successors = self.edges.get(node, ())
                if i < len(successors):
                    stack[-1] = (node, i + 1)
                    nxt = successors[i]
                    state = colour.get(nxt, WHITE)
                    if state == GREY:
                        raise invalid(
                            "schema references form a cycle that consumes no input",
                            reason="ref_cycle",
                            path=_pointer(node[1]),
                        )
                    if state == WHITE:
                        colour[nxt] = GREY
                        stack.append((nxt, 0))
                else:
                    colour[node] = BLACK
                    stack.pop()

    def check_fanout(self) -> None:
        """Refuse a schema whose expanded size exceeds ``FANOUT_FACTOR`` times
        ``max_subschemas`` (SCH-33; see ``FANOUT_FACTOR``).  Each schema's weight is
        memoized, so this is linear in the walk; a reference back to a schema
        being weighed is recursion, bounded by the instance, and adds nothing."""
        if not self.targets:
            return  # no reference: at most max_subschemas are visited
        maximum = FANOUT_FACTOR * self._limits.max_subschemas
        if self._weigh(self._once, maximum, "ref_fanout"):
            self.recursive = True

    def check_annotation_fanout(self) -> None:
        """Refuse a schema whose ``unevaluated*`` keywords make the engine
        evaluate nested branches exponentially often (SCH-33; see
        ``ANNOTATION_FANOUT``): from the root, each schema weighs 1 plus what
        it applies (children, and reference targets in their place), a
        branching child of a schema holding ``unevaluated*`` counted twice."""
        if not self.annotating:
            return
        self.collecting = self._collecting()
        maximum = min(ANNOTATION_FANOUT, FANOUT_FACTOR * self._limits.max_subschemas)
        self._weigh(self._weighted, maximum, "annotation_fanout")

    def _collecting(self) -> set[Location]:
        """The schemas holding ``unevaluated*``, and the subschemas they hold
        in place without branching (``allOf``, ``not``, ``dependentSchemas``,
        and so on down): each is evaluated at the holder's instance location
        as it collects annotations, so a branch under one is evaluated twice
        as well.  (A branch wrapped in ``allOf`` escaped the doubling: 3x a
        level.)  References are not followed: their targets are weighed
        where they are."""
        seen = set(self.annotating)
        stack = list(seen)
        while stack:
            loc = stack.pop()
            key = len(loc[1])
            for edge in self.edges.get(loc, ()):
                child = edge[0] == loc[0] and len(edge[1]) > key and edge[1][:key] == loc[1]
                if child and edge[1][key] not in _BRANCHING and edge not in seen:
                    seen.add(edge)
                    stack.append(edge)
        return seen

    def _weigh(
        self,
        successors: Callable[[Location], Iterator[tuple[Location, int]]],
        maximum: int,
        reason: str,
    ) -> bool:
        """Weigh the schemas from the root: 1 plus what each applies
        (``successors``: with a factor), each memoized, so linear in the
        walk; refuse past ``maximum`` (``reason``).  A reference back to a
        schema being weighed is recursion, bounded by the instance: it adds
        nothing, and the result says whether there was any."""
        recursive = False
        weight: dict[Location, int] = {}
        root: Location = (0, ())
        total = {root: 1}  # the schemas being weighed: their weight so far
        # (schema, its successors with their factors, its factor in its parent)
        stack = [(root, successors(root), 1)]
        while stack:
            loc, pending, factor = stack[-1]
            nxt = next(pending, None)
            if nxt is None:
                stack.pop()
                weight[loc] = done = total.pop(loc)
                if not stack:
                    break
                loc = stack[-1][0]
                added = factor * done
            else:
                child, child_factor = nxt
                if child in total:
                    recursive = True
                    continue
                if child not in weight:
                    total[child] = 1
                    stack.append((child, successors(child), child_factor))
                    continue
                added = child_factor * weight[child]
            total[loc] += added
            if total[loc] > maximum:
                raise limit_error(reason, "max_subschemas", maximum, path=_pointer(loc[1]))
        return recursive

    def _once(self, loc: Location) -> Iterator[tuple[Location, int]]:
        """What ``loc`` applies, each counted once."""
        for nxt in self._successors(loc):
            yield nxt, 1

    def _weighted(self, loc: Location) -> Iterator[tuple[Location, int]]:
        """What ``loc`` applies, each with its weight factor: 2 for a
        branching child of a schema holding ``unevaluated*``, else 1."""
        doubled = loc in self.collecting
        key = len(loc[1])
        for child in self._successors(loc):
            branching = child[0] == loc[0] and len(child[1]) > key and child[1][key] in _BRANCHING
            yield child, 2 if doubled and branching and child[1][:key] == loc[1] else 1

    def check_recursive_fanout(self) -> None:
        """Find recursion that evaluates one instance location exponentially
        often in the instance's depth (SCH-33), and note where in
        ``multiplies`` (``(schema path, instance step)``).  Collecting a failed
        instance's errors then grows exponentially with its depth, while the
        verdict stays fast (the engine's ``is_valid`` short-circuits): such a
        schema is kept, and a refusal under it reports the verdict alone.

        Within each cycle of the schema graph (references, in-place applicators
        and child applicators), a schema from which two distinct in-place
        paths reach child applicators that may take the same instance step and
        both lead back into the cycle doubles its evaluations per level.  This
        is checked pairwise where in-place paths join, each schema's summary
        (the instance steps it recurses through) memoized.  A summary only
        one schema reads is taken over by it rather than copied, the smaller
        set merged into the larger, so a chain or a tree of in-place
        applicators costs about its size; a summary several schemas share is
        copied by each, and once the copies pass ``_FANOUT_WORK`` steps the
        pass stops and assumes the worst (a refusal under the schema then
        reports its verdict alone, never a wrong one)."""
        if not self.targets:
            return  # no reference: no recursion
        try:
            self._find_multiplying()
        except _Multiplies as found:
            self.multiplies = (found.where, found.step, found.reason)

    def _find_multiplying(self) -> None:
        component = self._components()
        if not component:
            return
        readers: dict[Location, int] = {}
        for loc in component:
            for group in self._sources(loc, component):
                for source in group:
                    readers[source] = readers.get(source, 0) + 1
        summaries = _Summaries(readers)
        summary = summaries.steps
        for start in component:
            if start in summary:
                continue
            summary[start] = frozenset()  # grey: an in-place cycle adds nothing
            stack = [(start, self._sources(start, component))]
            while stack:
                loc, sources = stack[-1]
                pending = next((s for group in sources for s in group if s not in summary), None)
                if pending is not None:
                    summary[pending] = frozenset()
                    stack.append((pending, self._sources(pending, component)))
                    continue
                stack.pop()
                summary[loc] = self._join(loc, sources, summaries, component)

    def _components(self) -> dict[Location, int]:
        """The strongly connected components reachable from the root with a
        cycle (Tarjan's, without recursion), by member."""
        index: dict[Location, int] = {}
        low: dict[Location, int] = {}
        on_stack: set[Location] = set()
        members: list[Location] = []
        component: dict[Location, int] = {}
        root: Location = (0, ())
        index[root] = low[root] = 0
        members.append(root)
        on_stack.add(root)
        work = [(root, self._successors(root))]
        while work:
            loc, successors = work[-1]
            nxt = next(successors, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    members.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, self._successors(nxt)))
                elif nxt in on_stack:
                    low[loc] = min(low[loc], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[loc])
            if low[loc] != index[loc]:
                continue
            cut = len(members) - 1
            while members[cut] != loc:
                cut -= 1
            scc = members[cut:]
            del members[cut:]
            on_stack.difference_update(scc)
            if len(scc) > 1 or loc in self._successors_set(loc):
                number = len(component)
                for member in scc:
                    component[member] = number
        return component

    def _successors_set(self, loc: Location) -> set[Location]:
        return set(self._successors(loc))

    def _sources(self, loc: Location, component: dict[Location, int]) -> list[list[Location]]:
        """The in-place subschemas of ``loc`` in its component: each a list
        of alternatives (a ``$dynamicRef``'s), of which one is evaluated."""
        number, path = loc
        key = len(path)
        mine = component[loc]
        sources = [
            [(number, child)]
            for child in self.children.get(loc, ())
            if child[key] in _IN_PLACE and component.get((number, child)) == mine
        ]
        for group in self.ref_groups.get(loc, ()):
            inside = [t for t in group if component.get(t) == mine]
            if inside:
                sources.append(inside)
        return sources

    def _join(
        self,
        loc: Location,
        sources: list[list[Location]],
        summaries: _Summaries,
        component: dict[Location, int],
    ) -> _Steps:
        """The instance steps by which ``loc`` recurses into its component;
        refuse when two of its in-place paths may take the same one."""
        summary = summaries.steps
        local = self._local_steps(loc, component)
        if not local and len(sources) == 1 and len(sources[0]) == 1:
            # ``{"$ref": ...}`` and the like: the summary of what it applies
            source = sources[0][0]
            if not summaries.owns(source):
                summaries.borrowed.add(loc)
            return summary[source]
        joined: set[tuple[Any, ...]] = set(local)
        for group in sources:
            steps: _Steps
            owned = True
            if len(group) == 1:
                steps = summary[group[0]]
                owned = summaries.owns(group[0])
            else:
                steps = set().union(*(summary[alternative] for alternative in group))
            clash = _clash(joined, steps)
            if clash is not None:
                self._multiplies_at(loc, clash)
            if owned and len(steps) > len(joined):
                joined, steps = steps, joined  # type: ignore[assignment]  # owned: a set
            elif not owned:
                summaries.work -= len(steps)
                if summaries.work < 0:
                    raise _Multiplies(_pointer(loc[1]), "", "recursion_not_analysed")
            joined |= steps
        return joined

    def _local_steps(
        self, loc: Location, component: dict[Location, int]
    ) -> frozenset[tuple[Any, ...]]:
        """The instance steps of ``loc``'s own child applicators that lead back
        into its component.  Within one schema ``additionalProperties``,
        ``items`` after ``prefixItems``, ``additionalItems`` after an ``items``
        array and the ``unevaluated*`` keywords never share an instance child
        with their siblings; ``patternProperties`` and ``contains`` may."""
        number, path = loc
        key = len(path)
        mine = component[loc]
        named: list[tuple[Any, ...]] = []
        kinds: list[str] = []
        for child in self.children.get(loc, ()):
            keyword = child[key]
            if keyword in _IN_PLACE or keyword in _STORAGE:
                continue
            if component.get((number, child)) != mine:
                continue
            if keyword == "properties":
                named.append(("p", child[key + 1]))
            elif keyword in {"prefixItems", "items"} and len(child) > key + 1:
                named.append(("i", child[key + 1]))
            elif keyword == "propertyNames":
                named.append(("n",))
            elif keyword == "contentSchema":
                named.append(("c",))
            else:
                kinds.append(str(keyword))
        steps = set(named)
        if kinds.count("patternProperties") > 1 or (
            "patternProperties" in kinds and any(step[0] == "p" for step in named)
        ):
            self._multiplies_at(loc, ("p*",))
        if "contains" in kinds and (
            len([k for k in kinds if k in _ITEM_WILDCARDS]) > 1
            or any(step[0] == "i" for step in named)
        ):
            self._multiplies_at(loc, ("i*",))
        for kind in kinds:
            steps.add(("i*",) if kind in _ITEM_WILDCARDS else ("p*",))
        return frozenset(steps)

    def _multiplies_at(self, loc: Location, step: tuple[Any, ...]) -> None:
        raise _Multiplies(_pointer(loc[1]), _describe_step(step))

    def _successors(self, loc: Location) -> Iterator[Location]:
        number, path = loc
        key = len(path)  # a child's path is its parent's plus (keyword, ...)
        for child in self.children.get(loc, ()):
            if child[key] not in _STORAGE:
                yield (number, child)
        yield from self.targets.get(loc, ())

    # -- patterns --------------------------------------------------------

    def _declare(self, identifier: str, loc: Location, path: Path) -> None:
        """Refuse an identifier (a resource's ``$id``, an anchor) that two
        schemas declare: preflight would check one of them and the engine
        evaluate the other (a decoy beside a reference cycle, or beside a
        fan-out, hid either from every bound).  URIs are compared as the
        engine compares them: scheme and host in any case, default port or
        none.  The 2020-12 core says such a schema SHOULD be refused."""
        key = _identity_key(identifier)
        first = self._declared.setdefault(key, loc)
        if first != loc:
            raise invalid(
                "schema declares the same identifier twice",
                reason="duplicate_identifier",
                identifier=identifier,
                path=_pointer(path),
            )

    def _check_pattern(self, pattern: str, path: Path) -> str | None:
        """Refuse a pattern too long or not ECMA-262; the text the engine is
        to be given instead of it, if any (``_ecma.engine_pattern``)."""
        maximum = self._limits.max_pattern_bytes
        if len(pattern) * 4 > maximum and len(pattern.encode("utf-8", "surrogatepass")) > maximum:
            raise limit_error("pattern_too_long", "max_pattern_bytes", maximum, path=_pointer(path))
        if self.bounds_only:
            return None
        syntax, unmatched, text = _ecma.scan_pattern(pattern)
        for refuse, message, reason, detail in (
            (invalid, "pattern is not an ECMA-262 regular expression", "invalid_pattern", syntax),
            (
                unsupported,
                "pattern uses ECMA-262 syntax the regex engine does not match as ECMA-262",
                "unsupported_pattern",
                unmatched,
            ),
        ):
            if detail is not None:
                raise refuse(
                    message, reason=reason, pattern=pattern, detail=detail, path=_pointer(path)
                )
        return text

    def _spell_out(  # noqa: PLR0917 - where the pattern is, and what it is
        self, number: int, path: Path, key: str | None, text: str, hidden: bool, written: str
    ) -> None:
        """Note a pattern the engine is to be given spelled out.  Not in a
        schema reached only by a reference into a position that is no
        subschema (a ``const`` value, say): there the same object is data
        too, and a copy with the pattern spelled out would change it."""
        if hidden:
            raise unsupported(
                "a pattern the engine must be given spelled out is in a schema"
                " reached only by a reference into a non-schema location",
                reason="unsupported_pattern",
                pattern=written,
                path=_pointer(path),
            )
        self.patterns.setdefault(number, []).append((path, key, text))

    def engine_document(self, doc: Any) -> Any:
        """``doc`` (one walked here) as the engine is to be given it: a copy
        with its patterns spelled out where they must be (:attr:`patterns`),
        else ``doc`` itself."""
        if not self.patterns:
            return doc
        if self._engine_docs is None:
            self._engine_docs = {
                id(self.docs[number]): _with_patterns(self.docs[number], edits)
                for number, edits in self.patterns.items()
            }
        return self._engine_docs.get(id(doc), doc)

    def spelled_out(self) -> Iterator[tuple[int, Path, str | None, str, str]]:
        """Every pattern the engine is given spelled out: ``(document number,
        path of its node, its patternProperties key or None, the engine's
        text, the pattern as written)`` (two patterns may give one text)."""
        for number, edits in self.patterns.items():
            for path, key, text in edits:
                written = _at(self.docs[number], path)["pattern"] if key is None else key
                yield number, path, key, text, written


_DEFAULT_PORTS: Final = {"http": ":80", "https": ":443", "ws": ":80", "wss": ":443"}


_SPEC_HOSTS: Final = ("http://json-schema.org/", "https://json-schema.org/")
_PERCENT: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _percent(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else f"%{match.group(1).upper()}"


def _identity_key(identifier: str) -> str:
    """``identifier`` as the engine tells identifiers apart, or coarser (two
    identifiers the engine tells apart may share a key: then they are
    refused as one declared twice, never confused): the scheme and host
    lower-cased, a default port dropped, an empty path made ``/``, and
    percent-encoding normalized (RFC 3986 6.2.2: unreserved characters
    decoded, hexadecimal digits upper-cased)."""
    if "%" in identifier:
        identifier = _PERCENT.sub(_percent, identifier)
    scheme, sep, rest = identifier.partition("://")
    if not sep:
        scheme, colon, rest = identifier.partition(":")
        return f"{scheme.lower()}{colon}{rest}" if colon else identifier
    scheme = scheme.lower()
    authority, slash, tail = rest.partition("/")
    if not slash:  # "https://a.test#x": the authority ends at the fragment
        authority, hash_, fragment = authority.partition("#")
        tail = f"{hash_}{fragment}"
    authority = authority.lower()
    port = _DEFAULT_PORTS.get(scheme)
    if port is not None and authority.endswith(port):
        authority = authority[: -len(port)]
    return f"{scheme}://{authority}/{tail}"


def _registry_by_identity(registry: Mapping[str, Any]) -> dict[str, Any]:
    """``schema_registry`` keyed as the engine looks its URIs up (fragment
    dropped, ``_identity_key``); two URIs that become one are ambiguous (the
    engine would take one, preflight perhaps the other, and the cache key
    tell them apart by spelling): refused."""
    keyed: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for uri, schema in registry.items():
        key = _identity_key(_uri.split_fragment(str(uri))[0])
        if key in keyed:
            raise invalid(
                "schema_registry lists one resource under two URIs",
                reason="duplicate_identifier",
                identifier=str(uri),
                other=spelled[key],
            )
        keyed[key] = schema
        spelled[key] = str(uri)
    return keyed


def _at(doc: Any, path: Path) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _with_patterns(doc: Any, edits: list[tuple[Path, str | None, str]]) -> Any:
    """A copy of ``doc`` with each edit's pattern replaced by the engine's
    text; only the containers on the edits' paths are copied."""
    tree: dict[Any, Any] = {}  # path step -> subtree; None -> the node's edits
    for path, key, text in edits:
        branch = tree
        for step in path:
            branch = branch.setdefault(step, {})
        branch.setdefault(None, []).append((key, text))

    def copy(node: Any, branch: dict[Any, Any]) -> Any:
        changed: dict[Any, Any] = {}
        for step, sub in branch.items():
            if step is not None:
                changed[step] = copy(node[step], sub)
        if isinstance(node, list | tuple):
            items = list(node)
            for index, value in changed.items():
                items[index] = value
            return items
        out = dict(node)
        out.update(changed)
        renamed: dict[str, str] = {}
        for key, text in branch.get(None, ()):
            if key is None:
                out["pattern"] = text
            else:
                renamed[key] = text
        if renamed:  # patternProperties keys, in their order
            props = out["patternProperties"]
            out["patternProperties"] = {renamed.get(k, k): v for k, v in props.items()}
            if len(out["patternProperties"]) != len(props):
                raise unsupported(
                    "patternProperties holds a pattern both as written and spelled out",
                    reason="unsupported_pattern",
                    patterns=sorted(renamed),
                )
        return out

    return copy(doc, tree)


def _clash(ours: _Steps, theirs: _Steps) -> tuple[Any, ...] | None:
    """A step two in-place paths may both take: equal steps, or a wildcard
    (``("p*",)``, ``("i*",)``) beside any step of its kind."""
    if not ours or not theirs:
        return None
    small, large = (ours, theirs) if len(ours) <= len(theirs) else (theirs, ours)
    for step in small:
        if step in large:
            return step
    for one, other in ((ours, theirs), (theirs, ours)):
        for wildcard, kind in ((("p*",), "p"), (("i*",), "i")):
            if wildcard in one and any(step[0] == kind for step in other):
                return wildcard
    return None


def _describe_step(step: tuple[Any, ...]) -> str:
    kind = step[0]
    if kind == "p":
        return "/" + str(step[1]).replace("~", "~0").replace("/", "~1")
    if kind == "i":
        return f"/{step[1]}"
    return {"p*": "any property", "i*": "any item", "n": "property names"}.get(
        kind, "decoded content"
    )


def preflight(
    schema: Any,
    *,
    limits: Limits,
    dialects: frozenset[str],
    registry: Mapping[str, Any] | None,
    loader: Callable[[str], Any] | None,
    allow_external_refs: bool,
    content_assertion: bool = False,
) -> Preflight:
    """Analyse ``schema`` fully; raise a classed ``Error`` for any refusal."""
    result = Preflight(
        limits,
        dialects,
        registry,
        loader,
        allow_external_refs,
        content_assertion=content_assertion,
    )
    result.add_document(schema, DEFAULT_BASE, role="schema")
    result.resolve_references()
    result.check_cycles()
    result.check_fanout()
    result.check_annotation_fanout()
    result.check_recursive_fanout()
    return result
