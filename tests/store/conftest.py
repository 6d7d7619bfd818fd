from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.store import faults


@pytest.fixture(autouse=True)
def _no_fault_left_armed() -> Iterator[None]:
    yield
    faults.disarm()
