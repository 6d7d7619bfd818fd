"""The store protocol's shared checks (STO-03, STO-07)."""

from __future__ import annotations

import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import Command, RunRecord, transition
from trio_backplane.store import MemoryStore, Receipt, verify_receipt


def test_sto_03_runtime_rejects_a_receipt_for_another_revision() -> None:
    """STO-03: a Receipt whose revision is not expected_revision + 1 is a
    resource_conflict with details expected and received."""
    assert verify_receipt(Receipt("r", 1, 5), run_id="r", expected_revision=4).revision == 5
    for wrong in (4, 6, 7):
        with pytest.raises(Error) as exc:
            verify_receipt(Receipt("r", 1, wrong), run_id="r", expected_revision=4)
        assert exc.value.error_class is ErrorClass.RESOURCE_CONFLICT
        assert dict(exc.value.details) == {"expected": 5, "received": wrong}
    with pytest.raises(Error):
        verify_receipt(Receipt("other", 1, 5), run_id="r", expected_revision=4)


async def test_sto_07_memory_store_cannot_fence() -> None:
    """STO-07: MemoryStore.fence raises unsupported_capability "durable store
    required", and the stored record is untouched."""
    store = MemoryStore()
    record = RunRecord.new("r")
    await store.create(record)
    admitted, events = transition(record, Command("admit", 0, {"state": "running"}))
    await store.commit("r", incarnation=1, expected_revision=0, record=admitted, events=events)
    with pytest.raises(Error) as exc:
        await store.fence("r", incarnation=2)
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert exc.value.message == "durable store required"
    assert await store.load("r") == admitted
