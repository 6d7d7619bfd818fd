"""Every behaviour of ../shared/BEHAVIOURS.md has a test that cites its ID.

Withdrawn items and groups marked *deferred* (a later issue implements them)
are exempt; everything else must be cited in a test name or docstring under
tests/ or conformance/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED

BEHAVIOURS = SHARED / "BEHAVIOURS.md"


def _required_ids() -> list[str]:
    text = BEHAVIOURS.read_text(encoding="utf-8")
    ids: list[str] = []
    deferred = False
    for line in text.splitlines():
        if line.startswith("## "):
            deferred = "deferred" in line
            continue
        match = re.match(r"^- \*\*([A-Z]+-\d+)\*\*(.*)$", line)
        if match and not deferred and "*withdrawn*" not in match.group(2)[:20]:
            ids.append(match.group(1))
    return ids


def _cited(identifier: str, corpus: str) -> bool:
    snake = identifier.lower().replace("-", "_")
    return bool(
        re.search(re.escape(identifier) + r"(?!\d)", corpus)
        or re.search(re.escape(snake) + r"(?!\d)", corpus)
    )


def test_every_behaviour_is_cited_by_a_test() -> None:
    if not BEHAVIOURS.exists():
        pytest.fail(f"{BEHAVIOURS} is missing: the shared folder must sit beside the checkout")
    corpus = "\n".join(
        path.read_text(encoding="utf-8")
        for folder in (REPO / "tests", REPO / "conformance")
        for path in Path(folder).rglob("*.py")
        if path.name != Path(__file__).name
    )
    ids = _required_ids()
    assert len(ids) > 250
    missing = [i for i in ids if not _cited(i, corpus)]
    assert missing == []
