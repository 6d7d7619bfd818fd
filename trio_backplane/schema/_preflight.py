"""Preflight: everything checked about a schema before the engine builds it.

A short pipeline over the parts: the document walk (``_walk``), dialects
(``_dialect``), references (``_references``), cycles and fan-out
(``_fanout``) and multiplying recursion (``_recursion``).  Any refusal is a
classed ``Error``; the result names what the engine needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from . import _recursion
from ._dialect import Dialects
from ._fanout import check_annotation_fanout, check_cycles, check_fanout
from ._graph import SchemaGraph
from ._options import Limits
from ._patterns import Patterns
from ._recursion import Multiplies
from ._references import References, Sources
from ._walk import Walker

__all__ = ["ANNOTATION_FANOUT", "DEFAULT_BASE", "FANOUT_FACTOR", "Preflight", "bounds", "preflight"]

#: The base URI of a document without ``$id`` (the engine uses the same one).
DEFAULT_BASE: Final = "json-schema:///"
#: A schema's expanded size (the subschemas an evaluation can visit, each
#: reference replaced by its target's, recursion counted once) may be at most
#: this many times ``Limits.max_subschemas``: about 10 ms per instance
#: location at the engine's measured 7 ns a visit, under the host preset.
FANOUT_FACTOR: Final = 10
#: At most this weight (and ``FANOUT_FACTOR`` times ``max_subschemas``) when
#: the branches under ``unevaluated*`` count twice: about 0.05 s a call.
ANNOTATION_FANOUT: Final = 65_536
#: Steps copied from summaries several schemas share before the recursion
#: check gives up and assumes the worst (about 0.1 s of set copying).
_FANOUT_WORK: Final = 2_000_000


class Preflight:
    """What preflight learnt: the walked documents, the engine's inputs
    (its registry, the patterns it is given spelled out, the root dialect)
    and where evaluation may recurse or multiply."""

    __slots__ = (
        "external",
        "format_assertion_vocabulary",
        "graph",
        "metaschemas",
        "multiplies",
        "patterns",
        "recursive",
        "root_dialect",
    )

    def __init__(self, graph: SchemaGraph, patterns: Patterns, dialects: Dialects) -> None:
        self.graph = graph
        self.patterns = patterns
        #: external resources the engine needs, by URI
        self.external = dialects.external
        #: custom meta-schemas in use, by URI
        self.metaschemas = dialects.metaschemas
        self.format_assertion_vocabulary = dialects.format_assertion_vocabulary
        self.root_dialect = dialects.root
        #: a reference leads back to a schema it came from: evaluation grows
        #: with the instance, and errors are collected up to the first only
        self.recursive = False
        #: where a recursion multiplies evaluations per instance level
        #: ``(schema path, instance step, reason)``: errors are withheld
        self.multiplies: tuple[str, str, str] | None = None


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
    walker, references = _parts(
        limits,
        dialects,
        Sources(registry, loader),
        allow_external_refs=allow_external_refs,
        content_assertion=content_assertion,
        bounds_only=False,
    )
    walker.add_document(schema, DEFAULT_BASE, "schema")
    references.resolve()
    graph = walker.graph
    check_cycles(graph.edges)
    maximum = FANOUT_FACTOR * limits.max_subschemas
    recursive = check_fanout(graph, maximum)
    check_annotation_fanout(graph, min(ANNOTATION_FANOUT, maximum))
    result = Preflight(graph, walker.patterns, walker.dialects)
    result.recursive = recursive
    if graph.targets:  # else no recursion
        try:
            _recursion.find_multiplying(graph, _FANOUT_WORK)
        except Multiplies as found:
            result.multiplies = (found.where, found.step, found.reason)
    return result


def bounds(schema: Any, limits: Limits, allow_external_refs: bool) -> None:
    """Refuse ``schema`` past the limits, its fan-out included, without
    checking syntax or dialects and without resolving anything external."""
    walker, references = _parts(
        limits,
        frozenset({"2020-12", "draft-07"}),
        Sources(None, None),
        allow_external_refs=allow_external_refs,
        content_assertion=False,
        bounds_only=True,
    )
    walker.add_document(schema, DEFAULT_BASE, "schema")
    references.resolve()  # local targets outside subschema positions
    maximum = FANOUT_FACTOR * limits.max_subschemas
    check_fanout(walker.graph, maximum)
    check_annotation_fanout(walker.graph, min(ANNOTATION_FANOUT, maximum))


def _parts(
    limits: Limits,
    accepted: frozenset[str],
    sources: Sources,
    *,
    allow_external_refs: bool,
    content_assertion: bool,
    bounds_only: bool,
) -> tuple[Walker, References]:
    graph = SchemaGraph()
    patterns = Patterns(graph.docs, limits.max_pattern_bytes, bounds_only=bounds_only)
    walker = Walker(
        graph,
        limits,
        patterns,
        allow_external_refs=allow_external_refs,
        content_assertion=content_assertion,
        bounds_only=bounds_only,
    )
    external: dict[str, Any] = {}
    walker.dialects = Dialects(
        accepted, graph, sources.fetch, walker.add_document, external, bounds_only=bounds_only
    )
    references = References(walker, sources, walker.dialects, external, bounds_only=bounds_only)
    return walker, references
