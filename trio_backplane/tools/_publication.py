"""Catalog publication records (spec 002): pure data and checks.

Staging and publishing (stale revisions, receipts in the store) belong to
the runtime; these records only refuse what is invalid on its face.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ._admission import check_mode
from ._authority import Authority
from ._descriptor import ProviderTool, ToolRegistry

__all__ = ["RECEIPT_STATUSES", "CatalogUpdate", "Publication", "PublicationReceipt"]

#: The states a publication receipt reports.
RECEIPT_STATUSES: Final = frozenset({"staged", "published"})


def _invalid(message: str, **details: Any) -> Error:
    return Error(ErrorClass.VALIDATION, message, details)


def _positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise _invalid(f"{attribute.name} must be a positive int", field=attribute.name)


def _non_negative_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 0:
        raise _invalid(f"{attribute.name} must be a non-negative int", field=attribute.name)


def _str(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value:
        raise _invalid(f"{attribute.name} must be a non-empty str", field=attribute.name)


def _to_registry(value: Any) -> ToolRegistry:
    if isinstance(value, ToolRegistry):
        return value
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        return ToolRegistry(value)
    raise _invalid("registry must be a ToolRegistry or descriptors", field="registry")


def _to_tools(value: Any) -> tuple[ProviderTool, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise _invalid("tools must be a sequence of ProviderTool or None", field="tools")
    tools = tuple(value)
    if not all(isinstance(t, ProviderTool) for t in tools):
        raise _invalid("tools must be ProviderTool records", field="tools")
    return tools


def _authority(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Authority):
        raise _invalid("authority must be an Authority", field="authority")


def _mode(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        check_mode(value)


def _known_keys(data: Mapping[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise _invalid("unknown admission option", reason="unknown_option", keys=unknown)
    return dict(data)


@final
@attrs.frozen
class CatalogUpdate:
    """A new catalog: registry, authority and optionally the provider tools
    (``tools=None``: projected from the registry)."""

    revision: int = attrs.field(validator=_positive_int)
    registry: ToolRegistry = attrs.field(converter=_to_registry)
    authority: Authority = attrs.field(validator=_authority)
    tools: tuple[ProviderTool, ...] | None = attrs.field(default=None, converter=_to_tools)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CatalogUpdate:
        """Spec 002's mapping form; an unknown key raises ``validation``."""
        if not isinstance(data, Mapping):
            raise _invalid("a catalog update must be a mapping")
        fields = _known_keys(data, ("revision", "registry", "authority", "tools"))
        try:
            return cls(**fields)
        except TypeError as exc:
            raise _invalid("a catalog update needs revision, registry and authority") from exc


def _to_catalog(value: Any) -> CatalogUpdate:
    if isinstance(value, CatalogUpdate):
        return value
    if isinstance(value, Mapping):
        return CatalogUpdate.from_mapping(value)
    raise _invalid("catalog must be a CatalogUpdate or a mapping", field="catalog")


@final
@attrs.frozen
class Publication:
    """A request to publish ``catalog`` at ``expected_revision + 1``.

    ``schema_admission`` is ``"strict"``, ``"quarantine"`` or ``None`` (the
    conversation's own mode); anything else raises ``validation``.
    """

    publication_id: str = attrs.field(validator=_str)
    run_id: str = attrs.field(validator=_str)
    incarnation: int = attrs.field(validator=_non_negative_int)
    expected_revision: int = attrs.field(validator=_positive_int)
    catalog: CatalogUpdate = attrs.field(converter=_to_catalog)
    schema_admission: str | None = attrs.field(default=None, validator=_mode)

    def __attrs_post_init__(self) -> None:
        if self.catalog.revision != self.expected_revision + 1:
            raise _invalid(
                "catalog revision must be expected_revision + 1",
                reason="revision_not_next",
                expected_revision=self.expected_revision,
                revision=self.catalog.revision,
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Publication:
        """Spec 002's mapping form; an unknown key raises ``validation``
        "unknown admission option"."""
        if not isinstance(data, Mapping):
            raise _invalid("a publication must be a mapping")
        fields = _known_keys(data, tuple(a.name for a in attrs.fields(cls)))
        try:
            return cls(**fields)
        except TypeError as exc:
            raise _invalid(
                "a publication needs publication_id, run_id, incarnation, "
                "expected_revision and catalog"
            ) from exc


def _status(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or value not in RECEIPT_STATUSES:
        raise _invalid('status must be "staged" or "published"', field="status")


@final
@attrs.frozen
class PublicationReceipt:
    """What staging or publishing a :class:`Publication` reports."""

    publication_id: str = attrs.field(validator=_str)
    status: str = attrs.field(validator=_status)
    catalog_revision: int = attrs.field(validator=_positive_int)
