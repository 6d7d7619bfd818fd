"""What the ``refresh_tools`` discovery tool stages: the host's other tools
it keeps, and the next catalog revision when the server's tools changed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from ...errors import Error, ErrorClass
from ...tools import (
    Authority,
    CatalogUpdate,
    Publication,
    ToolDescriptor,
    ToolRegistry,
    ToolResult,
)

__all__ = ["REFRESH_DESCRIPTION", "active_registry", "is_descriptors", "stage_refresh"]

REFRESH_DESCRIPTION: Final = (
    "Reload the tools of an MCP server that announced its tool list changed; "
    "the new tools are offered from the next response on."
)


def active_registry(operation: Any) -> ToolRegistry | None:
    """The executing call's active catalog (``ToolContext.catalog_registry``),
    or ``None`` outside a conversation."""
    registry = getattr(getattr(operation, "context", None), "catalog_registry", None)
    return registry if isinstance(registry, ToolRegistry) else None


def is_descriptors(value: Any) -> bool:
    """Whether ``value`` is a registry or a re-iterable collection of descriptors."""
    if isinstance(value, ToolRegistry):
        return True
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        return False
    if isinstance(value, Iterator):
        return False  # would be consumed by the check
    return all(isinstance(d, ToolDescriptor) for d in value)


def stage_refresh(operation: Any, registry: ToolRegistry, was_stale: bool) -> ToolResult:
    """Stage ``registry`` as the executing call's next catalog revision,
    unless it offers the same tools at the same revisions as the operation's
    authority; the result says which it was and what changed."""
    current: Authority = operation.effective_authority
    old = {tool: current.revision_for(tool) for tool in current.grants}
    new = {d.name: d.revision for d in registry}
    added = sorted(new.keys() - old.keys())
    removed = sorted(old.keys() - new.keys())
    changed = sorted(t for t in new.keys() & old.keys() if new[t] != old[t])
    revision: int = operation.catalog_revision
    summary = {"added": added, "removed": removed, "changed": changed, "was_stale": was_stale}
    if not (added or removed or changed):
        return ToolResult(
            f"no change: the tools are the same (catalog revision {revision})",
            {"status": "no_change", "catalog_revision": revision, **summary},
        )
    context = getattr(operation, "context", None)
    if context is None:
        raise Error(ErrorClass.RESOURCE_CONFLICT, "staging requires an executing tool")
    authority = Authority(
        grants=frozenset(new),
        caller=current.caller,
        run_id=current.run_id,
        tool_revisions=new,
    )
    receipt = context.stage_catalog(
        Publication(
            publication_id=f"mcp-refresh-{operation.invocation_id}",
            run_id=operation.run_id,
            incarnation=operation.incarnation,
            expected_revision=revision,
            catalog=CatalogUpdate(revision + 1, registry, authority),
        )
    )
    staged = receipt.catalog_revision
    return ToolResult(
        f"staged catalog revision {staged}, offered from the next response: "
        f"added {_names(added)}; removed {_names(removed)}; changed {_names(changed)}",
        {"status": "staged", "catalog_revision": staged, **summary},
    )


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"
