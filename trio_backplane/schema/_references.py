"""References: external resources from the registry or loader (never the
network), and every ``$ref``/``$dynamicRef`` resolved to the schema it names."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import unquote

from ..errors import Error
from . import _uri
from ._dialect import Dialects
from ._ecma import engine_pattern
from ._errors import failure, invalid, unsupported
from ._graph import Location, SchemaGraph
from ._walk import Walker

__all__ = ["References", "Sources"]

#: An array index in a JSON pointer (RFC 6901): ASCII digits, no leading
#: zero (``str.isdigit`` also takes "²", which ``int`` then refuses).
_ARRAY_INDEX: Final = re.compile(r"0|[1-9][0-9]*")


class Sources:
    """Where external resources come from: ``schema_registry`` or
    ``schema_loader`` (at most one of them), never the network."""

    __slots__ = ("_loader", "_registry")

    def __init__(
        self, registry: Mapping[str, Any] | None, loader: Callable[[str], Any] | None
    ) -> None:
        self._registry = None if registry is None else _by_identity(registry)
        self._loader = loader

    def fetch(self, uri: str, reference: str) -> Any:
        """The resource at ``uri`` (no fragment), which ``reference`` names."""
        if self._registry is not None:
            key = _uri.identity_key(uri)
            if key not in self._registry:
                raise invalid(
                    "external schema reference is not in schema_registry", reference=reference
                )
            return self._registry[key]
        if self._loader is None:
            raise invalid(
                "external schema reference requires an explicit loader", reference=reference
            )
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


def _by_identity(registry: Mapping[str, Any]) -> dict[str, Any]:
    """``schema_registry`` keyed as the engine looks its URIs up; two URIs
    that become one are refused as ambiguous."""
    keyed: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for uri, schema in registry.items():
        key = _uri.identity_key(_uri.split_fragment(str(uri))[0])
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


class References:
    """Resolves every reference of the walked documents to the schema it names."""

    __slots__ = ("_bounds_only", "_dialects", "_graph", "_sources", "_walker", "external")

    def __init__(
        self,
        walker: Walker,
        sources: Sources,
        dialects: Dialects,
        external: dict[str, Any],
        *,
        bounds_only: bool = False,
    ) -> None:
        self._walker = walker
        self._graph = walker.graph
        self._sources = sources
        self._dialects = dialects
        #: the engine's registry: resources loaded are added to it, by URI
        self.external = external
        self._bounds_only = bounds_only

    def resolve(self) -> None:
        """Resolve every reference, loading external resources (which may add
        references) and walking targets no subschema position reaches; record
        each schema's targets.  ``bounds_only`` skips what does not resolve."""
        graph = self._graph
        done = 0
        while done < len(graph.refs):
            loc, keyword, ref = graph.refs[done]
            done += 1
            try:
                target = self._target(loc, ref)
            except Error:
                if self._bounds_only:  # check_bounds resolves nothing external
                    continue
                raise
            if target is None:
                continue
            if target not in graph.walked:
                self._walker.walk_hidden(target, ref)
            targets = [target]
            if keyword == "$dynamicRef":
                fragment = _uri.split_fragment(ref)[1]
                if fragment and not fragment.startswith("/"):
                    targets.extend(graph.dynamic_anchors.get(fragment, ()))
            graph.edges.setdefault(loc, []).extend(targets)
            graph.targets.setdefault(loc, []).extend(targets)
            graph.ref_groups.setdefault(loc, []).append(list(dict.fromkeys(targets)))

    def _target(self, loc: Location, ref: str) -> Location | None:
        """The schema ``ref`` at ``loc`` names; None for a bundled meta-schema."""
        graph = self._graph
        absolute = _uri.resolve(graph.bases[loc], ref)
        resource, fragment = _uri.split_fragment(absolute)
        root = graph.resource(resource)
        if root is None:
            if self._dialects.is_bundled(resource):
                return None
            loaded = self._sources.fetch(resource, ref)
            root = (self._walker.add_document(loaded, resource, "reference"), ())
            self.external[resource] = loaded
        if fragment == "":
            return root
        if fragment.startswith("/"):
            return _follow_pointer(graph, root, fragment, ref)
        target = graph.anchors.get(_uri.identity_key(f"{resource}#{fragment}"))
        if target is None:
            raise invalid("schema reference does not resolve", reference=ref, reason="unresolved")
        return target


def _follow_pointer(graph: SchemaGraph, root: Location, fragment: str, ref: str) -> Location:
    number, path = root
    node = graph.node(root)
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
            raise invalid("schema reference does not resolve", reference=ref, reason="unresolved")
    for before, step in itertools.pairwise(steps):
        if before == "patternProperties" and engine_pattern(str(step)) is not None:
            # the engine's copy of the schema does not have that key
            raise unsupported(
                "schema reference points through a patternProperties pattern"
                " the engine must be given spelled out",
                reason="unsupported_pattern",
                reference=ref,
                pattern=step,
            )
    return (number, path + tuple(steps))
