"""What a test does when something it needs is missing: skip on a
developer's machine, fail in CI (``CI`` set), where nothing an issue
requires may be skipped."""

from __future__ import annotations

import os

import pytest


def unavailable(reason: str, *, tests: str = "PostgreSQL") -> None:
    """Skip for ``reason``; in CI, fail (``tests``: which tests must run)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: {tests} tests must run)", pytrace=False)
    pytest.skip(reason)
