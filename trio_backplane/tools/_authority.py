"""``Authority`` and ``authorize``: what may run, for whom, at which revision."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Protocol, final, runtime_checkable

import attrs

from ..errors import Error, ErrorClass
from ._descriptor import ToolDescriptor, ToolRegistry

__all__ = ["Authority", "Invocation", "InvocationLike", "authorize"]


def _invalid(message: str, **details: Any) -> Error:
    return Error(ErrorClass.VALIDATION, message, details)


def _forbidden(message: str, **details: Any) -> Error:
    return Error(ErrorClass.FORBIDDEN, message, details)


def _to_grants(value: Any) -> frozenset[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise _invalid("grants must be a collection of tool names", field="grants")
    names = list(value)
    if not all(type(name) is str for name in names):
        raise _invalid("grants must be tool names (str)", field="grants")
    return frozenset(names)


def _to_revisions(value: Any) -> Mapping[str, int]:
    if not isinstance(value, Mapping):
        raise _invalid("tool_revisions must be a mapping of tool name to revision")
    copy = dict(value)
    for name, revision in copy.items():
        if type(name) is not str or type(revision) is not int or revision < 1:
            raise _invalid(
                "tool_revisions maps tool names (str) to positive int revisions",
                field="tool_revisions",
            )
    return MappingProxyType(copy)


def _optional_str(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not str:
        raise _invalid(f"{attribute.name} must be a str or None", field=attribute.name)


def _optional_revision(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise _invalid(f"{attribute.name} must be a positive int or None", field=attribute.name)


@final
@attrs.frozen
class Authority:
    """What a run may execute (API.md, Tools).

    ``Authority()`` authorizes nothing.  ``tool_revisions`` is stored as a
    read-only mapping; the legacy single ``tool_revision`` is the fallback
    for a tool without an entry.
    """

    grants: frozenset[str] = attrs.field(default=frozenset(), converter=_to_grants)
    caller: str | None = attrs.field(default=None, validator=_optional_str)
    run_id: str | None = attrs.field(default=None, validator=_optional_str)
    tool_revision: int | None = attrs.field(default=None, validator=_optional_revision)
    tool_revisions: Mapping[str, int] = attrs.field(
        default=MappingProxyType({}), converter=_to_revisions, hash=False
    )

    @classmethod
    def for_registry(
        cls, registry: ToolRegistry | Iterable[ToolDescriptor], *, caller: str, run_id: str
    ) -> Authority:
        """Grant every tool of ``registry`` at its descriptor revision."""
        descriptors = list(
            registry if isinstance(registry, ToolRegistry) else ToolRegistry(registry)
        )
        return cls(
            grants=frozenset(d.name for d in descriptors),
            caller=caller,
            run_id=run_id,
            tool_revisions={d.name: d.revision for d in descriptors},
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (
                self.grants,
                self.caller,
                self.run_id,
                self.tool_revision,
                dict(self.tool_revisions),
            ),
        )

    def revision_for(self, name: str) -> int | None:
        """The authorized revision of tool ``name``: its entry first, then the legacy one."""
        return self.tool_revisions.get(name, self.tool_revision)


@runtime_checkable
class InvocationLike(Protocol):
    """What :func:`authorize` reads of an invocation."""

    @property
    def run_id(self) -> str | None: ...

    @property
    def tool_name(self) -> str: ...

    @property
    def tool_revision(self) -> int | None: ...


@final
@attrs.frozen
class Invocation:
    """A minimal invocation record: the run, the tool and its pinned revision."""

    run_id: str | None
    tool_name: str
    tool_revision: int | None = None


_FIELDS = ("run_id", "tool_name", "tool_revision")


def _read(invocation: Any) -> tuple[Any, Any, Any]:
    if type(invocation) is Invocation:  # the engine's own: every field is there
        return invocation.run_id, invocation.tool_name, invocation.tool_revision
    if isinstance(invocation, Mapping):
        missing = [f for f in _FIELDS if f not in invocation]
        values = tuple(invocation.get(f) for f in _FIELDS)
    else:
        missing = [f for f in _FIELDS if not hasattr(invocation, f)]
        values = tuple(getattr(invocation, f, None) for f in _FIELDS)
    if missing:
        raise _invalid("an invocation needs run_id, tool_name and tool_revision", missing=missing)
    return values[0], values[1], values[2]


def authorize(authority: Authority, descriptor: ToolDescriptor, invocation: Any) -> None:
    """Raise ``forbidden`` unless ``authority`` lets ``invocation`` run ``descriptor``.

    Refused: no ``caller``, an invocation of another run, a tool outside the
    grants or not the descriptor's, and a revision (the descriptor's or the
    invocation's) other than the authorized one (the ``tool_revisions`` entry
    first, the legacy ``tool_revision`` as fallback; neither is a refusal).
    """
    if not isinstance(authority, Authority):
        raise _invalid("authority must be an Authority")
    if not isinstance(descriptor, ToolDescriptor):
        raise _invalid("descriptor must be a ToolDescriptor")
    run_id, tool_name, tool_revision = _read(invocation)
    name = descriptor.name
    if not authority.caller:
        raise _forbidden("authority has no caller", tool=name)
    if authority.run_id is None or run_id != authority.run_id:
        raise _forbidden("invocation belongs to another run", tool=name)
    if tool_name != name:
        raise _forbidden("invocation names another tool", tool=name)
    if name not in authority.grants:
        raise _forbidden(f"tool {name!r} is not granted", tool=name)
    authorized = authority.revision_for(name)
    if authorized is None:
        raise _forbidden(f"tool {name!r} has no authorized revision", tool=name)
    if (
        descriptor.revision != authorized
        or type(tool_revision) is not int
        or tool_revision != authorized
    ):
        raise _forbidden(
            f"tool {name!r} revision is not the authorized one",
            tool=name,
            authorized_revision=authorized,
            revision=descriptor.revision
            if descriptor.revision != authorized
            else (tool_revision if type(tool_revision) is int else None),
        )
