"""Recursion that multiplies evaluations per level of the instance.

Collecting a failed instance's errors under such a schema grows
exponentially with the instance's depth while the verdict stays fast: the
schema is kept, and a refusal under it reports the verdict alone.
"""

from __future__ import annotations

from typing import Any

from ._graph import IN_PLACE, ITEM_WILDCARDS, STORAGE, Location, SchemaGraph
from ._instance import json_pointer

__all__ = ["Multiplies", "clash", "components", "find_multiplying", "local_steps", "sources"]

#: The instance steps a schema recurses through into its component.
Steps = set[tuple[Any, ...]] | frozenset[tuple[Any, ...]]


class Multiplies(Exception):
    """A recursion evaluates one instance location more than once per level
    of the instance, or (``reason`` ``"recursion_not_analysed"``) the check
    gave up and assumes it does."""

    def __init__(self, where: str, step: str, reason: str = "recursive_fanout") -> None:
        super().__init__(where)
        self.where = where
        self.step = step
        self.reason = reason


class _Summaries:
    """By schema, the instance steps it recurses through into its component.
    A summary is grown in place by the one schema that reads it
    (``readers``) unless it is borrowed: the very set of the schema it
    applies (``{"$ref": ...}``)."""

    __slots__ = ("borrowed", "readers", "steps", "work")

    def __init__(self, readers: dict[Location, int], work: int) -> None:
        self.steps: dict[Location, Steps] = {}
        self.readers = readers
        self.borrowed: set[Location] = set()
        #: steps the copies of shared summaries may still take
        self.work = work

    def owns(self, source: Location) -> bool:
        """Whether the schema reading ``source``'s summary may grow it: the
        only reader of ``source``'s own set (a frozen one is the empty
        placeholder of a schema still being summarised)."""
        return (
            type(self.steps[source]) is set
            and self.readers.get(source) == 1
            and source not in self.borrowed
        )


def find_multiplying(graph: SchemaGraph, work: int) -> None:
    """Raise :class:`Multiplies` where, within a cycle of the schema graph,
    two in-place paths from one schema reach child applicators that may take
    the same instance step back into the cycle.  Copying shared summaries
    past ``work`` steps gives up (assumes the worst)."""
    component = components(graph)
    if not component:
        return
    readers: dict[Location, int] = {}
    for loc in component:
        for group in sources(graph, loc, component):
            for source in group:
                readers[source] = readers.get(source, 0) + 1
    summaries = _Summaries(readers, work)
    summary = summaries.steps
    for start in component:
        if start in summary:
            continue
        summary[start] = frozenset()  # grey: an in-place cycle adds nothing
        stack = [(start, sources(graph, start, component))]
        while stack:
            loc, pending_sources = stack[-1]
            pending = next(
                (s for group in pending_sources for s in group if s not in summary), None
            )
            if pending is not None:
                summary[pending] = frozenset()
                stack.append((pending, sources(graph, pending, component)))
                continue
            stack.pop()
            summary[loc] = _join(graph, loc, pending_sources, summaries, component)


def components(graph: SchemaGraph) -> dict[Location, int]:
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
    work = [(root, graph.successors(root))]
    while work:
        loc, successors = work[-1]
        nxt = next(successors, None)
        if nxt is not None:
            if nxt not in index:
                index[nxt] = low[nxt] = len(index)
                members.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, graph.successors(nxt)))
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
        if len(scc) > 1 or loc in set(graph.successors(loc)):
            number = len(component)
            for member in scc:
                component[member] = number
    return component


def sources(
    graph: SchemaGraph, loc: Location, component: dict[Location, int]
) -> list[list[Location]]:
    """The in-place subschemas of ``loc`` in its component: each a list of
    alternatives (a ``$dynamicRef``'s), of which one is evaluated."""
    number, path = loc
    key = len(path)
    mine = component[loc]
    found = [
        [(number, child)]
        for child in graph.children.get(loc, ())
        if child[key] in IN_PLACE and component.get((number, child)) == mine
    ]
    for group in graph.ref_groups.get(loc, ()):
        inside = [t for t in group if component.get(t) == mine]
        if inside:
            found.append(inside)
    return found


def _join(
    graph: SchemaGraph,
    loc: Location,
    groups: list[list[Location]],
    summaries: _Summaries,
    component: dict[Location, int],
) -> Steps:
    """The instance steps by which ``loc`` recurses into its component;
    raise :class:`Multiplies` when two of its in-place paths may take the
    same one."""
    summary = summaries.steps
    local = local_steps(graph, loc, component)
    if not local and len(groups) == 1 and len(groups[0]) == 1:
        # ``{"$ref": ...}`` and the like: the summary of what it applies
        source = groups[0][0]
        if not summaries.owns(source):
            summaries.borrowed.add(loc)
        return summary[source]
    joined: set[tuple[Any, ...]] = set(local)
    for group in groups:
        steps: Steps
        owned = True
        if len(group) == 1:
            steps = summary[group[0]]
            owned = summaries.owns(group[0])
        else:
            steps = set().union(*(summary[alternative] for alternative in group))
        found = clash(joined, steps)
        if found is not None:
            raise _multiplies_at(loc, found)
        if owned and len(steps) > len(joined):
            joined, steps = steps, joined  # type: ignore[assignment]  # owned: a set
        elif not owned:
            summaries.work -= len(steps)
            if summaries.work < 0:
                raise Multiplies(json_pointer(loc[1]), "", "recursion_not_analysed")
        joined |= steps
    return joined


def local_steps(
    graph: SchemaGraph, loc: Location, component: dict[Location, int]
) -> frozenset[tuple[Any, ...]]:
    """The instance steps of ``loc``'s own child applicators that lead back
    into its component; raise :class:`Multiplies` when two of them may
    take the same instance child."""
    number, path = loc
    key = len(path)
    mine = component[loc]
    named: list[tuple[Any, ...]] = []
    kinds: list[str] = []
    for child in graph.children.get(loc, ()):
        keyword = child[key]
        if keyword in IN_PLACE or keyword in STORAGE:
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
    # additionalProperties, items after prefixItems, additionalItems and the
    # unevaluated keywords never share an instance child with their
    # siblings; patternProperties and contains may
    if kinds.count("patternProperties") > 1 or (
        "patternProperties" in kinds and any(step[0] == "p" for step in named)
    ):
        raise _multiplies_at(loc, ("p*",))
    if "contains" in kinds and (
        len([k for k in kinds if k in ITEM_WILDCARDS]) > 1 or any(step[0] == "i" for step in named)
    ):
        raise _multiplies_at(loc, ("i*",))
    steps = set(named)
    for kind in kinds:
        steps.add(("i*",) if kind in ITEM_WILDCARDS else ("p*",))
    return frozenset(steps)


def clash(ours: Steps, theirs: Steps) -> tuple[Any, ...] | None:
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


def _multiplies_at(loc: Location, step: tuple[Any, ...]) -> Multiplies:
    return Multiplies(json_pointer(loc[1]), _describe_step(step))


def _describe_step(step: tuple[Any, ...]) -> str:
    kind = step[0]
    if kind == "p":
        return "/" + str(step[1]).replace("~", "~0").replace("/", "~1")
    if kind == "i":
        return f"/{step[1]}"
    return {"p*": "any property", "i*": "any item", "n": "property names"}.get(
        kind, "decoded content"
    )
