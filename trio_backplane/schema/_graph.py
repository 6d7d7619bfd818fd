"""The walked schema documents as a graph: locations, identifiers and edges."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from . import _uri
from ._errors import invalid
from ._instance import json_pointer

__all__ = ["IN_PLACE", "ITEM_WILDCARDS", "STORAGE", "Location", "Path", "SchemaGraph"]

Path = tuple[str | int, ...]
#: (document number, path from the document root)
Location = tuple[int, Path]

#: Keywords that only hold subschemas: nothing evaluates them but a reference.
STORAGE: Final = frozenset({"$defs", "definitions"})
#: Keywords whose subschemas apply to the same instance location.
IN_PLACE: Final = frozenset(
    {"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies"}
)
#: Keywords whose subschemas apply to any item of an array.
ITEM_WILDCARDS: Final = frozenset({"items", "additionalItems", "contains", "unevaluatedItems"})


class SchemaGraph:
    """Every schema position walked, by location, and what links them.

    Identifiers are keyed by :func:`_uri.identity_key`: a reference finds the
    resource the engine finds, never another.
    """

    __slots__ = (
        "_declared",
        "anchors",
        "annotating",
        "bases",
        "children",
        "docs",
        "dynamic_anchors",
        "edges",
        "ref_groups",
        "refs",
        "resources",
        "subschemas",
        "targets",
        "walked",
    )

    def __init__(self) -> None:
        self.docs: list[Any] = []
        #: every subschema position walked: its (dialect, subschema depth)
        self.walked: dict[Location, tuple[str, int]] = {}
        self.subschemas = 0
        #: the base URI of each schema walked that is a mapping
        self.bases: dict[Location, str] = {}
        #: a schema's subschema positions
        self.children: dict[Location, tuple[Path, ...]] = {}
        #: in-place subschemas and reference targets: a cycle consumes no input
        self.edges: dict[Location, list[Location]] = {}
        #: what each schema's references resolve to
        self.targets: dict[Location, list[Location]] = {}
        #: each reference's targets, by the schema holding it: a ``$dynamicRef``
        #: has alternatives (its dynamic anchors), of which the engine takes one
        self.ref_groups: dict[Location, list[list[Location]]] = {}
        #: (where, keyword, reference), in the order met
        self.refs: list[tuple[Location, str, str]] = []
        #: schemas holding ``unevaluatedProperties`` or ``unevaluatedItems``
        self.annotating: set[Location] = set()
        #: resource roots, by the identity key of their URI
        self.resources: dict[str, Location] = {}
        #: anchors, by the identity key of ``<resource URI>#<name>``
        self.anchors: dict[str, Location] = {}
        self.dynamic_anchors: dict[str, list[Location]] = {}
        #: every resource URI and anchor declared, by identity key
        self._declared: dict[str, Location] = {}

    def declare(self, identifier: str, loc: Location, path: Path) -> None:
        """Refuse an identifier (a resource's ``$id``, an anchor) that two
        schemas declare: preflight would check one and the engine evaluate
        the other."""
        first = self._declared.setdefault(_uri.identity_key(identifier), loc)
        if first != loc:
            raise invalid(
                "schema declares the same identifier twice",
                reason="duplicate_identifier",
                identifier=identifier,
                path=json_pointer(path),
            )

    def add_resource(self, uri: str, loc: Location, path: Path) -> None:
        """Declare ``uri`` (no fragment) as the resource rooted at ``loc``."""
        self.declare(uri, loc, path)
        self.resources.setdefault(_uri.identity_key(uri), loc)

    def add_anchor(self, identifier: str, loc: Location, path: Path) -> None:
        """Declare ``identifier`` (``<resource URI>#<name>``) as an anchor at ``loc``."""
        self.declare(identifier, loc, path)
        self.anchors.setdefault(_uri.identity_key(identifier), loc)

    def resource(self, uri: str) -> Location | None:
        """The resource root the engine finds at ``uri`` (no fragment)."""
        return self.resources.get(_uri.identity_key(uri))

    def node(self, loc: Location) -> Any:
        """The value at ``loc``."""
        node = self.docs[loc[0]]
        for step in loc[1]:
            node = node[step]
        return node

    def successors(self, loc: Location) -> Iterator[Location]:
        """What evaluating ``loc`` evaluates: its applied subschemas (not
        ``$defs``) and its reference targets."""
        number, path = loc
        key = len(path)  # a child's path is its parent's plus (keyword, ...)
        for child in self.children.get(loc, ()):
            if child[key] not in STORAGE:
                yield (number, child)
        yield from self.targets.get(loc, ())
