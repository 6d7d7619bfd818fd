"""``Limits`` and ``SchemaOptions``: the knobs of the schema boundary."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, ClassVar, Final, final

import attrs

from ..errors import Error, ErrorClass

__all__ = ["DIALECTS", "Limits", "SchemaLoader", "SchemaOptions", "normalize_dialects"]

#: Dialect names ``dialects=`` accepts.
DIALECTS: Final = frozenset({"2020-12", "draft-07"})
_DEFAULT_DIALECTS: Final = frozenset({"2020-12"})

#: A loader maps a URI without fragment to a schema (a mapping or a bool).
SchemaLoader = Callable[[str], Any]

# Deeper, a limit protects nothing: the engine recurses on the native stack,
# where an instance 512 levels deep crashed the process under a recursive
# schema, and the fingerprint's encoder recurses in Python.
_MAX_DEPTH_SETTING: Final = 256


def _positive_int(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise Error(
            ErrorClass.VALIDATION,
            f"{attribute.name} must be a positive int",
            {"option": attribute.name},
        )
    if attribute.name in {"max_json_depth", "max_subschema_depth", "max_input_depth"} and (
        value > _MAX_DEPTH_SETTING
    ):
        raise Error(
            ErrorClass.VALIDATION,
            f"{attribute.name} must be at most {_MAX_DEPTH_SETTING}",
            {"option": attribute.name, "maximum": _MAX_DEPTH_SETTING},
        )


@final
@attrs.frozen
class Limits:
    """Fail-closed bounds on schemas and instances.

    ``Limits()`` is :meth:`host`, the preset for host-authored tool schemas;
    :meth:`mcp` is the preset for schemas a server supplies.
    Change one bound with ``attrs.evolve(Limits.mcp(), max_schema_bytes=...)``.
    """

    max_json_depth: int = attrs.field(default=128, validator=_positive_int)
    max_subschema_depth: int = attrs.field(default=128, validator=_positive_int)
    max_subschemas: int = attrs.field(default=100_000, validator=_positive_int)
    max_schema_bytes: int = attrs.field(default=1_048_576, validator=_positive_int)
    max_refs: int = attrs.field(default=10_000, validator=_positive_int)
    max_pattern_bytes: int = attrs.field(default=1_024, validator=_positive_int)
    max_input_depth: int = attrs.field(default=128, validator=_positive_int)
    max_input_bytes: int = attrs.field(default=1_048_576, validator=_positive_int)

    _HOST: ClassVar[Limits]
    _MCP: ClassVar[Limits]

    @classmethod
    def host(cls) -> Limits:
        """The defaults for host-authored tool schemas (``== Limits()``)."""
        return cls._HOST

    @classmethod
    def mcp(cls) -> Limits:
        """The defaults for server-supplied schemas: 64 JSON levels,
        32 subschema levels, 1 000 subschemas, 256 KiB."""
        return cls._MCP


Limits._HOST = Limits()
Limits._MCP = Limits(
    max_json_depth=64, max_subschema_depth=32, max_subschemas=1_000, max_schema_bytes=262_144
)


def normalize_dialects(dialects: Collection[str] | None) -> frozenset[str]:
    """Check ``dialects=`` and return it as a frozenset (default: 2020-12)."""
    if dialects is None:
        return _DEFAULT_DIALECTS
    if isinstance(dialects, str | bytes) or not isinstance(dialects, Collection):
        raise Error(
            ErrorClass.VALIDATION,
            "dialects must be a collection of dialect names",
            {"option": "dialects", "allowed": sorted(DIALECTS)},
        )
    names = frozenset(dialects)
    unknown = sorted(str(n) for n in names - DIALECTS)
    if unknown or "2020-12" not in names:
        raise Error(
            ErrorClass.VALIDATION,
            "dialects must include 2020-12 and may add only draft-07",
            {"option": "dialects", "unknown": unknown, "allowed": sorted(DIALECTS)},
        )
    return names


def _check_dialects(instance: Any, attribute: Any, value: Any) -> None:
    normalize_dialects(value)


def _check_registry(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise Error(ErrorClass.VALIDATION, "schema_registry must be a mapping of URI to schema")


def _check_loader(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not callable(value):
        raise Error(ErrorClass.VALIDATION, "schema_loader must be callable")


def _check_bool(instance: Any, attribute: attrs.Attribute[bool], value: Any) -> None:
    if type(value) is not bool:
        raise Error(ErrorClass.VALIDATION, f"{attribute.name} must be a bool")


def _check_limits(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, Limits):
        raise Error(ErrorClass.VALIDATION, "limits must be a Limits or None")


@final
@attrs.frozen
class SchemaOptions:
    """``compile()``'s keywords as one frozen record (``SchemaOptions()`` = defaults).

    A tool descriptor carries one; admission, publication and the execution
    gateway compile the descriptor's schemas with it, and it is part of the
    compiled schema's fingerprint.
    """

    dialects: frozenset[str] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(normalize_dialects),
        validator=_check_dialects,
    )
    schema_registry: Mapping[str, Any] | None = attrs.field(
        default=None, validator=_check_registry, hash=False
    )
    schema_loader: SchemaLoader | None = attrs.field(
        default=None, validator=_check_loader, hash=False
    )
    format_assertion: bool = attrs.field(default=False, validator=_check_bool)
    content_assertion: bool = attrs.field(default=False, validator=_check_bool)
    limits: Limits | None = attrs.field(default=None, validator=_check_limits)
    allow_external_refs: bool = attrs.field(default=True, validator=_check_bool)

    def __attrs_post_init__(self) -> None:
        if self.schema_registry is not None and self.schema_loader is not None:
            raise Error(
                ErrorClass.VALIDATION,
                "pass either schema_registry or schema_loader, not both",
            )

    def as_kwargs(self) -> dict[str, Any]:
        """The options as ``compile()`` keywords."""
        return {
            "dialects": self.dialects,
            "schema_registry": self.schema_registry,
            "schema_loader": self.schema_loader,
            "format_assertion": self.format_assertion,
            "content_assertion": self.content_assertion,
            "limits": self.limits,
            "allow_external_refs": self.allow_external_refs,
        }
