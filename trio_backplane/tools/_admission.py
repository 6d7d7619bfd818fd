"""``admit_batch``: turn a registry, an authority and provider tools into one bundle."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal, final

import attrs

from ..errors import Error, ErrorClass
from ..schema import compile_with
from ._authority import Authority
from ._descriptor import ProviderTool, ToolDescriptor, ToolRegistry, check_unique
from ._rejected import Rejected

__all__ = ["MODES", "AdmittedBundle", "admit_batch", "check_mode", "has_awaitable_execute"]

#: The admission modes.
MODES: Final = frozenset({"strict", "quarantine"})

Mode = Literal["strict", "quarantine"]


def check_mode(mode: Any) -> Mode:
    """Return ``mode`` if it is ``"strict"`` or ``"quarantine"``, else raise ``validation``."""
    if type(mode) is not str or mode not in MODES:
        raise Error(
            ErrorClass.VALIDATION,
            'admission mode must be "strict" or "quarantine"',
            {"reason": "invalid_admission_mode", "mode": mode if type(mode) is str else None},
        )
    return "strict" if mode == "strict" else "quarantine"


def has_awaitable_execute(backend: Any) -> bool:
    """Whether ``backend.execute`` is a coroutine function (awaitable when
    called); a backend whose ``execute`` fails when read has none."""
    try:
        execute = getattr(backend, "execute", None)
        if execute is None or not callable(execute):
            return False
        if inspect.iscoroutinefunction(execute):
            return True
        return inspect.iscoroutinefunction(getattr(execute, "__call__", None))  # noqa: B004
    except Exception:  # its parts fail when read
        return False


def _tools(value: Iterable[ProviderTool]) -> tuple[ProviderTool, ...]:
    return tuple(value)


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _rejected(value: Iterable[Rejected]) -> tuple[Rejected, ...]:
    return tuple(value)


@final
@attrs.frozen
class AdmittedBundle:
    """One executable bundle: what the runtime dispatches from, what the provider
    sees, the narrowed authority, the accepted names and the ``rejected``
    diagnostics (trusted-host data, see :class:`Rejected`)."""

    registry: ToolRegistry
    tools: tuple[ProviderTool, ...] = attrs.field(converter=_tools)
    authority: Authority
    accepted: tuple[str, ...] = attrs.field(converter=_names)
    rejected: tuple[Rejected, ...] = attrs.field(converter=_rejected)


def _preflight(descriptor: ToolDescriptor) -> Error | None:
    """Compile the descriptor's schemas with its own options.

    Returns the ``unsupported_capability`` error that quarantine may act on,
    ``None`` when both schemas compile, and raises any other refusal.
    """
    options = descriptor.options
    quarantinable: Error | None = None
    schemas: list[tuple[Any, bool]] = [(descriptor.schema, False)]
    if descriptor.output_schema is not None:
        schemas.append((descriptor.output_schema, True))
    for schema, output in schemas:
        try:
            compile_with(schema, options, output=output)
        except Error as error:
            if error.error_class is not ErrorClass.UNSUPPORTED_CAPABILITY:
                raise
            if quarantinable is None:
                quarantinable = error
    return quarantinable


def _registry(registry: Any) -> ToolRegistry:
    if isinstance(registry, ToolRegistry):
        return registry
    if isinstance(registry, Iterable) and not isinstance(registry, str | bytes):
        return ToolRegistry(registry)
    raise Error(ErrorClass.VALIDATION, "registry must be a ToolRegistry or descriptors")


_canonical: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode


def _json_text(value: Any) -> str | None:
    """``value`` as canonical JSON (key order aside), ``None`` if it is not JSON.

    Python's ``==`` calls ``true`` and ``1``, or ``1.0`` and ``1``, equal; what
    a provider sees must encode to the descriptor's JSON.
    """
    try:
        return _canonical(value)
    except Exception:  # not JSON data, or a mapping that fails when read
        return None


def _provider_tools(tools: Any, registry: ToolRegistry) -> dict[str, ProviderTool] | None:
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, str | bytes):
        raise Error(ErrorClass.VALIDATION, "tools must be a sequence of ProviderTool or None")
    for tool in tools:
        if not isinstance(tool, ProviderTool):
            raise Error(
                ErrorClass.VALIDATION,
                "tools must be ProviderTool records",
                {"type": type(tool).__name__},
            )
    check_unique(t.name for t in tools)
    by_name = {t.name: t for t in tools}
    if set(by_name) != set(registry.names):
        raise Error(
            ErrorClass.VALIDATION,
            "provider tools must name exactly the registry's tools",
            {
                "missing": sorted(set(registry.names) - set(by_name)),
                "unknown": sorted(set(by_name) - set(registry.names)),
            },
        )
    for name, tool in by_name.items():
        schema = registry[name].schema
        if tool.parameters is schema:
            continue
        expected = _json_text(schema)  # None: not JSON, preflight refuses it
        if expected is not None and _json_text(tool.parameters) != expected:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                f"provider tool {name!r} parameters differ from its descriptor's schema",
                {"tool": name},
            )
    return by_name


def _check_authority(authority: Any, registry: ToolRegistry, run_id: Any) -> Authority:
    if not isinstance(authority, Authority):
        raise Error(ErrorClass.VALIDATION, "authority must be an Authority")
    # ``Authority()``, bound to no run, authorizes nothing: nothing to misuse,
    # so it admits an empty catalog for any run
    unbound_and_empty = authority.run_id is None and not authority.grants and not len(registry)
    if run_id is not None and authority.run_id != run_id and not unbound_and_empty:
        raise Error(ErrorClass.FORBIDDEN, "authority is bound to another run")
    names = frozenset(registry.names)
    if authority.grants != names:
        raise Error(
            ErrorClass.FORBIDDEN,
            "authority grants must equal the tool names",
            {
                "ungranted": sorted(names - authority.grants),
                "unknown": sorted(authority.grants - names),
            },
        )
    for name, revision in authority.tool_revisions.items():
        if name not in names or registry[name].revision != revision:
            raise Error(
                ErrorClass.FORBIDDEN,
                f"authority revision for tool {name!r} does not match its descriptor",
                {"tool": name},
            )
    return authority


def admit_batch(
    registry: ToolRegistry | Iterable[ToolDescriptor],
    authority: Authority,
    tools: Sequence[ProviderTool] | None = None,
    *,
    mode: str = "strict",
    run_id: str | None = None,
) -> AdmittedBundle:
    """Admit a batch of tools as one executable bundle.

    ``strict`` (the default) raises the first refusal.  ``quarantine`` omits
    only tools whose input or output schema preflight (with the descriptor's
    own ``schema_options``) raises ``unsupported_capability``; anything else,
    a backend without an awaitable ``execute`` included, fails the batch.
    Grants and ``tool_revisions`` are narrowed only for the rejected tools.
    ``tools=None`` projects the provider tools from the registry.
    """
    checked_mode = check_mode(mode)
    if run_id is not None and type(run_id) is not str:
        raise Error(ErrorClass.VALIDATION, "run_id must be a str or None")
    batch = _registry(registry)
    supplied = _provider_tools(tools, batch)
    admitted = _check_authority(authority, batch, run_id)
    for descriptor in batch:
        if not has_awaitable_execute(descriptor.backend):
            raise Error(
                ErrorClass.UNSUPPORTED_CAPABILITY,
                f"tool {descriptor.name!r} backend has no awaitable execute",
                {"reason": "backend_not_awaitable", "tool": descriptor.name},
            )
    rejected: list[Rejected] = []
    for descriptor in batch:
        error = _preflight(descriptor)
        if error is None:
            continue
        if checked_mode == "strict":
            raise error
        rejected.append(Rejected(descriptor.name, descriptor.revision, error))
    if not rejected:
        kept = batch
        narrowed = admitted
    else:
        omitted = frozenset(r.name for r in rejected)
        kept = ToolRegistry(d for d in batch if d.name not in omitted)
        narrowed = attrs.evolve(
            admitted,
            grants=admitted.grants - omitted,
            tool_revisions={k: v for k, v in admitted.tool_revisions.items() if k not in omitted},
        )
    projected = (
        kept.provider_tools() if supplied is None else tuple(supplied[name] for name in kept.names)
    )
    return AdmittedBundle(
        registry=kept,
        tools=projected,
        authority=narrowed,
        accepted=kept.names,
        rejected=rejected,
    )
