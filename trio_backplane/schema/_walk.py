"""The document walk: every subschema position of a schema document, every
branch included, checked and recorded without Python recursion."""

from __future__ import annotations

from typing import Any, Final

from . import _uri
from ._content import check_content_keywords
from ._dialect import Dialects
from ._errors import failure, invalid, limit_error
from ._graph import IN_PLACE, Location, Path, SchemaGraph
from ._instance import first_violation, json_pointer
from ._options import Limits
from ._patterns import Patterns

__all__ = ["Walker"]

# Schema-valued keywords.  The engine applies the legacy ``dependencies`` and
# finds resources in ``definitions`` in a 2020-12 schema too, so every
# dialect's positions are walked: what the engine uses is never unchecked.
_MAPS: Final = (
    "$defs",
    "properties",
    "patternProperties",
    "dependentSchemas",
    "definitions",
    "dependencies",
)
_LISTS: Final = ("prefixItems", "allOf", "anyOf", "oneOf")
_ONES: Final = (
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
    "additionalItems",
)
#: Each keyword's place in the walk's order.
_RANK: Final = {key: rank for rank, key in enumerate((*_MAPS, *_LISTS, *_ONES))}
_FIRST_LIST: Final = len(_MAPS)
_FIRST_ONE: Final = len(_MAPS) + len(_LISTS)
#: (node, path, base URI, dialect, subschema depth)
_Entry = tuple[Any, Path, str, str, int]


class Walker:
    """Walks schema documents into a :class:`SchemaGraph`, refusing with a
    class what the limits, the dialects or the patterns do not allow.

    ``dialects`` is set once built (it adds the meta-schemas it loads
    through :meth:`add_document`).  ``bounds_only`` (``check_bounds``)
    checks sizes and counts, not syntax.
    """

    __slots__ = (
        "_allow_external_refs",
        "_bounds_only",
        "_content_assertion",
        "_limits",
        "dialects",
        "graph",
        "patterns",
    )

    dialects: Dialects

    def __init__(
        self,
        graph: SchemaGraph,
        limits: Limits,
        patterns: Patterns,
        *,
        allow_external_refs: bool,
        content_assertion: bool,
        bounds_only: bool,
    ) -> None:
        self.graph = graph
        self.patterns = patterns
        self._limits = limits
        self._allow_external_refs = allow_external_refs
        self._content_assertion = content_assertion
        self._bounds_only = bounds_only

    def add_document(self, doc: Any, base: str, role: str) -> int:
        """Check ``doc`` as JSON data within the limits and walk it as the
        resource at ``base``; its document number."""
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
        graph = self.graph
        number = len(graph.docs)
        graph.docs.append(doc)
        # The document is the resource at ``base`` whatever ``$id`` it
        # declares: a decoy ``"$id": ""`` inside may not claim it too.
        graph.add_resource(base, (number, ()), ())
        self._walk(number, doc, base)
        return number

    def walk_hidden(self, target: Location, ref: str) -> None:
        """Walk a reference target that no subschema position reaches, in the
        scope of the nearest walked schema that holds it."""
        graph = self.graph
        number, path = target
        node = graph.node(target)
        if type(node) is not bool and type(node) is not dict:
            if self._bounds_only:
                return  # not a schema: nothing to bound
            raise invalid(
                "schema reference does not point to a schema",
                reason="invalid_schema",
                reference=ref,
                path=json_pointer(path),
            )
        for length in range(len(path) - 1, -1, -1):
            owner = (number, path[:length])
            if owner in graph.bases:  # walked, and a mapping
                dialect, depth = graph.walked[owner]
                self._walk(number, node, graph.bases[owner], path, dialect, depth + 1)
                return
        raise invalid("schema reference does not resolve", reference=ref, reason="unresolved")

    def _walk(  # noqa: PLR0917 - one walk for documents and hidden reference targets
        self,
        number: int,
        doc: Any,
        base: str,
        start: Path = (),
        dialect: str = "2020-12",
        depth: int = 1,
    ) -> None:
        graph = self.graph
        limits = self._limits
        walked = graph.walked
        hidden = start != ()  # a reference target outside subschema positions
        stack: list[_Entry] = [(doc, start, base, dialect, depth)]
        # only the schema's own root names the engine dialect, never a referenced document's
        first = not hidden and number == 0
        while stack:
            node, path, base, dialect, depth = stack.pop()
            loc = (number, path)
            if hidden and loc in walked:
                continue  # an earlier hidden target holds this one
            walked[loc] = (dialect, depth)
            graph.subschemas += 1
            if graph.subschemas > limits.max_subschemas:
                raise limit_error("too_many_subschemas", "max_subschemas", limits.max_subschemas)
            if depth > limits.max_subschema_depth:
                raise limit_error(
                    "too_deep",
                    "max_subschema_depth",
                    limits.max_subschema_depth,
                    path=json_pointer(path),
                )
            if type(node) is not dict:
                continue  # booleans; anything else is the meta-schema's to refuse
            if "unevaluatedProperties" in node or "unevaluatedItems" in node:
                graph.annotating.add(loc)
            if hidden and not self._bounds_only:
                _refuse_hidden_resource(node, path)
            declared = node.get("$schema")
            if type(declared) is str:  # applied wherever it appears, as the engine does
                dialect = self.dialects.declared(declared, path, root=first)
            first = False
            if "$id" in node or "$anchor" in node or "$dynamicAnchor" in node:
                base = self._identify(node, loc, base, dialect)
            graph.bases[loc] = base
            for key in ("$ref", "$dynamicRef"):
                ref = node.get(key)
                if type(ref) is str:
                    self._note_ref(loc, key, ref)
            if self._content_assertion:
                check_content_keywords(node, json_pointer(path))
            if "pattern" in node or "patternProperties" in node:
                self._check_patterns(node, loc, hidden)
            children = self._children(node, loc, base, dialect, depth + 1)
            if children:
                stack.extend(reversed(children))  # walked in document order

    def _check_patterns(self, node: dict[str, Any], loc: Location, hidden: bool) -> None:
        number, path = loc
        pattern = node.get("pattern")
        if type(pattern) is str:
            self.patterns.check(number, path, None, pattern, hidden)
        pattern_props = node.get("patternProperties")
        if type(pattern_props) is dict:
            for key in pattern_props:
                self.patterns.check(number, path, key, key, hidden)

    def _identify(self, node: dict[str, Any], loc: Location, base: str, dialect: str) -> str:
        """Declare the resource and anchors ``node`` names; its base URI."""
        graph = self.graph
        path = loc[1]
        ident = node.get("$id")
        if type(ident) is str:
            if dialect == "draft-07" and ident.startswith("#"):
                graph.add_anchor(base + ident, loc, path)  # kept beside ``$ref`` too
            elif not (dialect == "draft-07" and "$ref" in node):
                # draft-07 ignores a base-changing ``$id`` beside ``$ref``
                base = _uri.split_fragment(_uri.resolve(base, ident))[0]
                graph.add_resource(base, loc, path)
        for key in ("$anchor", "$dynamicAnchor"):
            name = node.get(key)
            if type(name) is str:
                graph.add_anchor(f"{base}#{name}", loc, path)
                if key == "$dynamicAnchor":
                    graph.dynamic_anchors.setdefault(name, []).append(loc)
        return base

    def _note_ref(self, loc: Location, keyword: str, ref: str) -> None:
        refs = self.graph.refs
        if len(refs) >= self._limits.max_refs:
            raise limit_error("too_many_refs", "max_refs", self._limits.max_refs)
        if not self._allow_external_refs and not ref.startswith("#"):
            raise invalid(
                "schema reference is not local",
                reason="remote_ref",
                reference=ref,
                path=json_pointer((*loc[1], keyword)),
            )
        refs.append((loc, keyword, ref))

    def _children(
        self, node: dict[str, Any], loc: Location, base: str, dialect: str, depth: int
    ) -> list[_Entry]:
        """The subschemas of ``node``, in keyword order, recorded as its
        children (and its in-place ones as edges).  Every dialect's
        positions: one the engine does not evaluate is only counted, one it
        does is never missed."""
        keys = [key for key in node if key in _RANK]
        if not keys:
            return []
        if len(keys) > 1:
            keys.sort(key=_RANK.__getitem__)
        number, path = loc
        children: list[_Entry] = []
        edges: list[Location] = []
        for key in keys:
            value = node[key]
            rank = _RANK[key]
            if rank >= _FIRST_ONE and not (key == "items" and type(value) is list):
                child = (*path, key)  # one subschema
                children.append((value, child, base, dialect, depth))
                if key in IN_PLACE:
                    edges.append((number, child))
                continue
            subs: Any
            if rank < _FIRST_LIST:
                if type(value) is not dict:
                    continue
                subs = value.items()
            elif type(value) is list:
                subs = enumerate(value)
            else:
                continue
            in_place = key in IN_PLACE
            for name, sub in subs:
                if key == "dependencies" and type(sub) is list:
                    continue
                child = (*path, key, name)
                children.append((sub, child, base, dialect, depth))
                if in_place:
                    edges.append((number, child))
        if edges:
            self.graph.edges[loc] = edges
        if children:
            self.graph.children[loc] = tuple([child[1] for child in children])
        return children


def _refuse_hidden_resource(node: dict[str, Any], path: Path) -> None:
    """The engine does not treat ``$id`` and anchors consistently outside
    subschema positions: refused rather than its base URI guessed."""
    for key in ("$id", "$anchor", "$dynamicAnchor"):
        if key in node:
            raise invalid(
                f"a schema reached only by reference may not declare {key}",
                reason="hidden_resource",
                path=json_pointer((*path, key)),
            )
