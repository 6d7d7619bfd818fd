"""How much an evaluation can cost: cycles that consume no input, and the
expanded size of a schema through its references and annotations."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from ._errors import invalid, limit_error
from ._graph import Location, SchemaGraph
from ._instance import json_pointer

__all__ = ["check_annotation_fanout", "check_cycles", "check_fanout"]

#: Branching in-place keywords: evaluated again to collect annotations.
_BRANCHING: Final = frozenset({"anyOf", "oneOf", "if", "then", "else"})
_WHITE, _GREY, _BLACK = 0, 1, 2


def check_cycles(edges: dict[Location, list[Location]]) -> None:
    """Refuse a cycle of in-place applicators and references: it consumes
    no input, and the engine would accept every instance."""
    colour: dict[Location, int] = {}
    for start in list(edges):
        if colour.get(start, _WHITE) != _WHITE:
            continue
        colour[start] = _GREY
        stack: list[tuple[Location, int]] = [(start, 0)]
        while stack:
            node, i = stack[-1]
            successors = edges.get(node, ())
            if i < len(successors):
                stack[-1] = (node, i + 1)
                nxt = successors[i]
                state = colour.get(nxt, _WHITE)
                if state == _GREY:
                    raise invalid(
                        "schema references form a cycle that consumes no input",
                        reason="ref_cycle",
                        path=json_pointer(node[1]),
                    )
                if state == _WHITE:
                    colour[nxt] = _GREY
                    stack.append((nxt, 0))
            else:
                colour[node] = _BLACK
                stack.pop()


def check_fanout(graph: SchemaGraph, maximum: int) -> bool:
    """Refuse a schema whose expanded size (each reference replaced by its
    target's, recursion counted once) exceeds ``maximum``; whether a
    reference leads back to a schema it came from (recursion)."""
    if not graph.targets:
        return False  # no reference: at most max_subschemas are visited

    def once(loc: Location) -> Iterator[tuple[Location, int]]:
        for nxt in graph.successors(loc):
            yield nxt, 1

    return _weigh(once, maximum, "ref_fanout")


def check_annotation_fanout(graph: SchemaGraph, maximum: int) -> None:
    """Refuse a schema whose ``unevaluated*`` keywords make the engine
    evaluate nested branches exponentially often: weighed as by
    :func:`check_fanout`, a branching child of a schema collecting
    annotations counted twice."""
    if not graph.annotating:
        return
    collecting = _collecting(graph)

    def weighted(loc: Location) -> Iterator[tuple[Location, int]]:
        doubled = loc in collecting
        key = len(loc[1])
        for child in graph.successors(loc):
            branching = child[0] == loc[0] and len(child[1]) > key and child[1][key] in _BRANCHING
            yield child, 2 if doubled and branching and child[1][:key] == loc[1] else 1

    _weigh(weighted, maximum, "annotation_fanout")


def _collecting(graph: SchemaGraph) -> set[Location]:
    """The schemas holding ``unevaluated*``, and the subschemas they hold in
    place without branching, and so on down: each is evaluated again at the
    holder's instance location as it collects annotations.  References are
    not followed: their targets are weighed where they are."""
    seen = set(graph.annotating)
    stack = list(seen)
    while stack:
        loc = stack.pop()
        key = len(loc[1])
        for edge in graph.edges.get(loc, ()):
            child = edge[0] == loc[0] and len(edge[1]) > key and edge[1][:key] == loc[1]
            if child and edge[1][key] not in _BRANCHING and edge not in seen:
                seen.add(edge)
                stack.append(edge)
    return seen


def _weigh(
    successors: Callable[[Location], Iterator[tuple[Location, int]]],
    maximum: int,
    reason: str,
) -> bool:
    """Weigh the schemas from the root: 1 plus what each applies, times its
    factor, each memoized; refuse past ``maximum`` with ``reason``.  A
    reference back to a schema being weighed adds nothing; the result says
    whether there was one."""
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
            raise limit_error(reason, "max_subschemas", maximum, path=json_pointer(loc[1]))
    return recursive
