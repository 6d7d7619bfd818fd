"""Code Mode cell state in the registry: per identity and per owner budgets."""

from __future__ import annotations

import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.resources import ResourceRegistry
from trio_backplane.resources._codestate import (
    MAX_BYTES,
    MAX_IDENTITIES,
    MAX_KEYS,
    MAX_OWNER_BYTES,
)


def refused(registry: ResourceRegistry, identity: str, key: str, value: object) -> Error:
    with pytest.raises(Error) as exc:
        registry.store_code_state("run-1", identity, key, value)
    return exc.value


def test_values_are_kept_per_owner_and_identity_and_none_removes() -> None:
    registry = ResourceRegistry()
    registry.store_code_state("run-1", "main", "a", {"n": 1})
    registry.store_code_state("run-1", "other", "a", [2])
    registry.store_code_state("run-2", "main", "a", "three")
    assert registry.code_state("run-1", "main") == {"a": {"n": 1}}
    assert registry.code_state("run-1", "other") == {"a": [2]}
    assert registry.code_state("run-2", "main") == {"a": "three"}
    registry.store_code_state("run-1", "main", "a", None)
    assert registry.code_state("run-1", "main") == {}


def test_an_identity_holds_at_most_256_keys_and_1_mib() -> None:
    registry = ResourceRegistry()
    for n in range(MAX_KEYS):
        registry.store_code_state("run-1", "main", f"k{n}", n)
    error = refused(registry, "main", "one-more", 1)
    assert error.error_class is ErrorClass.BUDGET_EXCEEDED
    assert error.details["limit"] == MAX_KEYS
    registry.store_code_state("run-1", "main", "k0", "replaced")  # an existing key is fine
    big = "x" * (MAX_BYTES // 2)
    registry.store_code_state("run-1", "big", "a", big)
    error = refused(registry, "big", "b", big)
    assert (error.error_class, error.details["limit"]) == (ErrorClass.BUDGET_EXCEEDED, MAX_BYTES)
    assert set(registry.code_state("run-1", "big")) == {"a"}  # nothing changed
    registry.store_code_state("run-1", "big", "a", "small")  # replacing frees its bytes
    registry.store_code_state("run-1", "big", "b", big)


def test_an_owner_holds_at_most_64_identities_and_16_mib() -> None:
    registry = ResourceRegistry()
    for n in range(MAX_IDENTITIES):
        registry.store_code_state("run-1", f"id{n}", "k", n)
    error = refused(registry, "id-new", "k", 1)
    assert (error.error_class, error.details["limit"]) == (
        ErrorClass.BUDGET_EXCEEDED,
        MAX_IDENTITIES,
    )
    registry.store_code_state("run-1", "id0", "k", None)  # an identity emptied is gone
    registry.store_code_state("run-1", "id-new", "k", 1)

    fresh = ResourceRegistry()
    chunk = "x" * (MAX_BYTES - 100)
    for n in range(MAX_OWNER_BYTES // MAX_BYTES):
        fresh.store_code_state("run-1", f"id{n}", "k", chunk)
    with pytest.raises(Error) as exc:
        fresh.store_code_state("run-1", "last", "k", chunk)
    assert (exc.value.error_class, exc.value.details["limit"]) == (
        ErrorClass.BUDGET_EXCEEDED,
        MAX_OWNER_BYTES,
    )
    fresh.store_code_state("run-2", "main", "k", chunk)  # another owner has its own budget


def test_bad_values_are_refused_and_closed_owners_forget() -> None:
    registry = ResourceRegistry()
    assert refused(registry, "main", "k", float("nan")).error_class is ErrorClass.VALIDATION
    assert refused(registry, "main", "", 1).error_class is ErrorClass.VALIDATION
    registry.store_code_state("run-1", "main", "k", 1)
    registry.fence_owner("run-1")
    assert registry.code_state("run-1", "main") == {}
    assert refused(registry, "main", "k", 1).error_class is ErrorClass.RESOURCE_CONFLICT
