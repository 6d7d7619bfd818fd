"""The resource registries a run owns, closed on every terminal path."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, final

import trio

from ..errors import Error, ErrorClass
from ._types import ResourceCleanup

__all__ = ["OwnedRegistries", "OwnedResources", "check_resources", "close_resources"]


class OwnedResources(Protocol):
    """What the runtime needs of a resource registry
    (:class:`trio_backplane.resources.ResourceRegistry` is one): release
    every entry of an owner, each result with ``confirmed``."""

    async def close_owner(self, owner: str) -> Sequence[Any]: ...


def check_resources(explicit: Iterable[Any], descriptors: Iterable[Any]) -> tuple[Any, ...]:
    """The registries given, then those the tools' trusted backend contexts
    hold (``backend_context["resource_registry"]``), each once."""
    found: list[Any] = []
    for registry in explicit:
        if not inspect.iscoroutinefunction(getattr(registry, "close_owner", None)):
            raise Error(
                ErrorClass.VALIDATION,
                "resources must have an async close_owner(owner)",
                {"option": "resources", "type": type(registry).__name__},
            )
        found.append(registry)
    for descriptor in descriptors:
        context = getattr(descriptor, "backend_context", None)
        if isinstance(context, Mapping):
            registry = context.get("resource_registry")
            if inspect.iscoroutinefunction(getattr(registry, "close_owner", None)):
                found.append(registry)
    unique: dict[int, Any] = {id(r): r for r in found}
    return tuple(unique.values())


def _evidence(index: int, result: Any) -> dict[str, Any] | None:
    if getattr(result, "confirmed", False) is True:
        return None
    entry_id = getattr(result, "id", None)
    return {
        "resource": f"registry:{index}:{entry_id}",
        "kind": str(getattr(result, "kind", "unknown"))[:100],
        "status": str(getattr(result, "status", "unknown"))[:100],
        "reason": str(getattr(result, "reason", None) or "cleanup not confirmed")[:300],
    }


async def close_resources(registries: Sequence[Any], owner: str, timeout: float) -> ResourceCleanup:
    """Close ``owner`` in every registry concurrently, shielded, within
    ``timeout``: ``confirmed`` only if every entry of every registry is;
    else ``uncertain`` with one evidence mapping per entry not confirmed."""
    if not registries:
        return ResourceCleanup(status="confirmed")
    results: dict[int, Any] = {}

    async def close(index: int, registry: Any) -> None:
        try:
            results[index] = list(await registry.close_owner(owner))
        except Exception as exc:  # a registry's failure is evidence, not ours
            results[index] = exc

    with trio.CancelScope(shield=True), trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            for index, registry in enumerate(registries):
                nursery.start_soon(close, index, registry)
    evidence: list[dict[str, Any]] = []
    for index in range(len(registries)):
        found = results.get(index)
        if found is None:
            reason = f"the registry did not close within {timeout} s"
        elif isinstance(found, Exception):
            reason = f"close_owner raised {type(found).__name__}"
        else:
            evidence.extend(e for e in (_evidence(index, r) for r in found) if e is not None)
            continue
        evidence.append({"resource": f"registry:{index}", "reason": reason})
    if evidence:
        return ResourceCleanup(status="uncertain", evidence=tuple(evidence))
    return ResourceCleanup(status="confirmed")


@final
class OwnedRegistries:
    """The registries of one run, closed together within ``cleanup_timeout``."""

    def __init__(self, registries: Sequence[Any], owner: str, timeout: float) -> None:
        self.registries = tuple(registries)
        self._owner = owner
        self._timeout = timeout

    def adopt(self, descriptors: Iterable[Any]) -> None:
        """Add the registries a newly published catalog's tools name."""
        found = check_resources((), descriptors)
        self.registries += tuple(r for r in found if all(r is not s for s in self.registries))

    def suspend(self) -> None:
        """A human wait began: registries with clocks of their own (command
        deadlines) stop them for this run."""
        for registry in self.registries:
            if hasattr(registry, "suspend_owner"):
                registry.suspend_owner(self._owner)

    def resume(self, at: float | None) -> None:
        """The wait ended (at Trio time ``at``; default now)."""
        for registry in self.registries:
            if hasattr(registry, "resume_owner"):
                registry.resume_owner(self._owner, at)

    async def close(self) -> ResourceCleanup:
        """:func:`close_resources` of this run (repeatable: a kept entry is
        reported again, never cleaned again)."""
        return await close_resources(self.registries, self._owner, self._timeout)
