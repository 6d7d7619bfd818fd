"""Catalog publication records (CAT-07, CAT-14; PUB-01 projection)."""

from __future__ import annotations

from typing import Any

import pytest

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.tools import (
    Authority,
    CatalogUpdate,
    ProviderTool,
    Publication,
    PublicationReceipt,
    ToolRegistry,
    admit_batch,
)

from .support import tool

REGISTRY = ToolRegistry([tool("b"), tool("a")])
AUTHORITY = Authority.for_registry(REGISTRY, caller="host", run_id="run-1")


def update(revision: int = 2, **extra: Any) -> CatalogUpdate:
    return CatalogUpdate(revision, REGISTRY, AUTHORITY, **extra)


def publication(**changes: Any) -> Publication:
    fields: dict[str, Any] = {
        "publication_id": "pub-1",
        "run_id": "run-1",
        "incarnation": 0,
        "expected_revision": 1,
        "catalog": update(),
    }
    fields.update(changes)
    return Publication(**fields)


@pytest.mark.parametrize(("expected", "revision"), [(1, 1), (1, 3), (2, 2), (5, 1)])
def test_cat_14_revision_must_be_expected_plus_one(expected: int, revision: int) -> None:
    """CAT-14: a catalog update is valid only at exactly ``expected_revision + 1``."""
    with pytest.raises(Error) as info:
        publication(expected_revision=expected, catalog=update(revision))
    assert info.value.error_class is ErrorClass.VALIDATION
    assert publication(expected_revision=revision, catalog=update(revision + 1)).catalog.revision


@pytest.mark.parametrize("mode", ["lenient", "STRICT", "", 0])
def test_cat_07_publication_mode_is_validated(mode: Any) -> None:
    """CAT-07: a ``schema_admission`` other than strict/quarantine/None is validation."""
    with pytest.raises(Error) as info:
        publication(schema_admission=mode)
    assert info.value.error_class is ErrorClass.VALIDATION
    for ok in (None, "strict", "quarantine"):
        assert publication(schema_admission=ok).schema_admission == ok


def test_cat_07_unknown_key_in_mapping_form_is_refused() -> None:
    """CAT-07: an unknown key in a publication mapping raises "unknown admission option"."""
    data: dict[str, Any] = {
        "publication_id": "pub-1",
        "run_id": "run-1",
        "incarnation": 0,
        "expected_revision": 1,
        "catalog": {"revision": 2, "registry": REGISTRY, "authority": AUTHORITY},
        "schema_admission": "quarantine",
    }
    built = Publication.from_mapping(data)
    assert built.catalog == update()
    assert built.schema_admission == "quarantine"
    for bad in (
        {**data, "quarantine": True},
        {**data, "catalog": {**data["catalog"], "mode": "strict"}},
    ):
        with pytest.raises(Error) as info:
            Publication.from_mapping(bad)
        assert info.value.error_class is ErrorClass.VALIDATION
        assert info.value.message == "unknown admission option"
    missing = dict(data)
    del missing["catalog"]
    with pytest.raises(Error):
        Publication.from_mapping(missing)
    with pytest.raises(Error):
        CatalogUpdate.from_mapping({"revision": 2})
    with pytest.raises(Error):
        Publication.from_mapping([])  # type: ignore[arg-type]


def test_catalog_update_fields_and_projection() -> None:
    """PUB-01: ``tools=None`` projects the provider tools from the registry, by name."""
    catalog = CatalogUpdate(2, [tool("b"), tool("a")], AUTHORITY)
    assert catalog.registry.names == ("a", "b")
    bundle = admit_batch(catalog.registry, catalog.authority, catalog.tools)
    assert [t.name for t in bundle.tools] == ["a", "b"]
    supplied = update(tools=[ProviderTool("a", "", REGISTRY["a"].schema)])
    assert supplied.tools is not None
    for bad in (
        {"revision": 0},
        {"registry": "ab"},
        {"authority": {"grants": []}},
        {"tools": [{"name": "a"}]},
        {"tools": "a"},
    ):
        fields: dict[str, Any] = {"revision": 2, "registry": REGISTRY, "authority": AUTHORITY}
        fields.update(bad)
        with pytest.raises(Error) as info:
            CatalogUpdate(**fields)
        assert info.value.error_class is ErrorClass.VALIDATION
    for change in ({"publication_id": ""}, {"incarnation": -1}, {"catalog": 3}):
        with pytest.raises(Error):
            publication(**change)


def test_receipt_statuses() -> None:
    assert PublicationReceipt("pub-1", "staged", 2).status == "staged"
    assert PublicationReceipt("pub-1", "published", 2).catalog_revision == 2
    with pytest.raises(Error):
        PublicationReceipt("pub-1", "pending", 2)
    with pytest.raises(Error):  # unhashable: classed, never a raw TypeError
        PublicationReceipt("pub-1", ["staged"], 2)  # type: ignore[arg-type]
