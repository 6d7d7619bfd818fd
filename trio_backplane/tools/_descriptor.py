"""``ToolDescriptor``, ``ProviderTool`` and the immutable ``ToolRegistry``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, final

import attrs

from ..errors import Error, ErrorClass
from ..schema import SchemaOptions
from ._names import check_name_validator

__all__ = ["DUPLICATE_NAMES", "ProviderTool", "ToolDescriptor", "ToolRegistry"]

#: The message of the duplicate-name refusal.
DUPLICATE_NAMES = "admission batch contains duplicate tool names"


def _invalid(message: str, **details: Any) -> Error:
    return Error(ErrorClass.VALIDATION, message, details)


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise _invalid(
            f"tool {getattr(instance, 'name', '?')!r}: {attribute.name} must be a positive int",
            reason="invalid_descriptor",
            field=attribute.name,
        )


def _exact_bool(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not bool:
        raise _invalid(
            f"tool {getattr(instance, 'name', '?')!r}: {attribute.name} must be a bool",
            reason="invalid_descriptor",
            field=attribute.name,
        )


def _str(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str:
        raise _invalid(
            f"tool {getattr(instance, 'name', '?')!r}: {attribute.name} must be a str",
            reason="invalid_descriptor",
            field=attribute.name,
        )


def _options(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, SchemaOptions):
        raise _invalid(
            f"tool {getattr(instance, 'name', '?')!r}: schema_options must be a "
            "SchemaOptions or None",
            reason="invalid_descriptor",
            field=attribute.name,
        )


@final
@attrs.frozen
class ProviderTool:
    """What a provider sees of a tool; ``parameters`` is the schema object itself."""

    name: str = attrs.field(validator=check_name_validator)
    description: str = attrs.field(default="", validator=_str)
    parameters: Any = attrs.field(default=None, hash=False)


@final
@attrs.frozen
class ToolDescriptor:
    """One executable tool (API.md, Tools).

    The ``schema`` and ``output_schema`` objects are kept as given (identity,
    never copied or rewritten), so what the provider sees and what the
    gateway validates are byte for byte the host's schema.
    ``schema_options`` (``None`` = ``SchemaOptions()``) is used wherever the
    descriptor's schemas are compiled.  Construction checks only the
    metadata; the schemas and the backend are checked by :func:`admit_batch`.
    """

    name: str = attrs.field(validator=check_name_validator)
    schema: Any = attrs.field(hash=False)
    backend: Any = attrs.field(hash=False)
    backend_context: Any = attrs.field(default=None, hash=False)
    revision: int = attrs.field(default=1, validator=_positive_int)
    description: str = attrs.field(default="", validator=_str)
    requires_approval: bool = attrs.field(default=False, validator=_exact_bool)
    read_only: bool = attrs.field(default=False, validator=_exact_bool)
    output_schema: Any = attrs.field(default=None, hash=False)
    schema_options: SchemaOptions | None = attrs.field(default=None, validator=_options)

    @property
    def options(self) -> SchemaOptions:
        """The effective schema options (``SchemaOptions()`` when none were given)."""
        return self.schema_options if self.schema_options is not None else SchemaOptions()

    def provider_tool(self) -> ProviderTool:
        """The provider projection: name, description and the schema unchanged."""
        return ProviderTool(self.name, self.description, self.schema)


@final
class ToolRegistry:
    """An immutable, name-indexed set of descriptors; iterates in name order.

    Duplicate names raise ``validation`` "admission batch contains duplicate
    tool names".
    """

    __slots__ = ("_by_name",)

    _by_name: Mapping[str, ToolDescriptor]

    def __init__(self, descriptors: Iterable[ToolDescriptor] = ()) -> None:
        if isinstance(descriptors, ToolRegistry):
            by_name = dict(descriptors._by_name)
        else:
            if isinstance(descriptors, str | bytes | Mapping) or not isinstance(
                descriptors, Iterable
            ):
                raise _invalid(
                    "a ToolRegistry takes an iterable of ToolDescriptor records",
                    reason="invalid_registry",
                    type=type(descriptors).__name__,
                )
            items = list(descriptors)
            for item in items:
                if not isinstance(item, ToolDescriptor):
                    raise _invalid(
                        "a ToolRegistry holds ToolDescriptor records only",
                        reason="invalid_registry",
                        type=type(item).__name__,
                    )
            check_unique(d.name for d in items)
            by_name = {d.name: d for d in sorted(items, key=lambda d: d.name)}
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ToolRegistry is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("ToolRegistry is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (tuple(self._by_name.values()),))

    def get(self, name: str) -> ToolDescriptor | None:
        """The descriptor named ``name``, or ``None`` (a name that is not a
        str names no tool)."""
        return self._by_name.get(name) if type(name) is str else None

    def __getitem__(self, name: str) -> ToolDescriptor:
        return self._by_name[name]

    def __iter__(self) -> Iterator[ToolDescriptor]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        """The tool names, sorted."""
        return tuple(self._by_name)

    def provider_tools(self) -> tuple[ProviderTool, ...]:
        """Every descriptor's provider projection, in name order."""
        return tuple(d.provider_tool() for d in self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolRegistry):
            return NotImplemented
        return dict(self._by_name) == dict(other._by_name)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._by_name)!r})"


def check_unique(names: Iterable[str]) -> None:
    """Raise ``validation`` if ``names`` repeats a name."""
    seen: set[str] = set()
    duplicates: set[str] = set()
    for name in names:
        (duplicates if name in seen else seen).add(name)
    if duplicates:
        raise _invalid(DUPLICATE_NAMES, reason="duplicate_tool_names", names=sorted(duplicates))
