"""The official JSON-Schema-Test-Suite Draft 2020-12 through ``validate_output`` (SCH-42, SCH-13).

The suite is fetched once per session, at collection, by ``fetch.py`` (pinned
``jsonschema`` 4.26.0 sdist, checked by SHA-256, cached outside the repo).
When it cannot be fetched the tests fail if ``CI`` is set and are skipped
otherwise.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import fetch
import pytest
import suite

_HERE = pathlib.Path(__file__).resolve().parent

FETCH_ERROR: str | None
try:
    ROOT: pathlib.Path | None = fetch.suite_dir()
except fetch.FetchError as exc:
    ROOT, FETCH_ERROR = None, str(exc)
    REQUIRED: list[suite.Case] = []
    FORMAT: list[suite.Case] = []
    REGISTRY: dict[str, Any] = {}
else:
    FETCH_ERROR = None
    REQUIRED = suite.required_cases(ROOT)
    FORMAT = suite.format_cases(ROOT)
    REGISTRY = suite.remotes(ROOT)  # one dict for the whole session

_UNAVAILABLE = "suite-unavailable"


def _params(cases: list[suite.Case]) -> list[Any]:
    if FETCH_ERROR is not None:
        return [pytest.param(None, id=_UNAVAILABLE)]
    return [pytest.param(case, id=case.id) for case in cases]


def _require_suite() -> pathlib.Path:
    if FETCH_ERROR is not None or ROOT is None:
        reason = f"JSON-Schema-Test-Suite could not be fetched: {FETCH_ERROR}"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason + " (set CI to make this a failure)")
    return ROOT


def _check(case: suite.Case | None) -> None:
    _require_suite()
    assert case is not None
    passed, outcome = suite.judge(case, REGISTRY)
    message = f"{case.id} ({case.path}): expected {case.expected}, got {outcome.verdict}"
    if outcome.detail:
        message += f": {outcome.detail}"
    assert passed, message


@pytest.mark.parametrize("case", _params(REQUIRED))
def test_required(case: suite.Case | None) -> None:
    """SCH-42: every required Draft 2020-12 case gets the suite's verdict from
    ``validate_output`` with the suite's remotes as ``schema_registry`` (the
    OTHER_DIALECT groups raise ``unsupported_capability`` instead)."""
    _check(case)


@pytest.mark.parametrize("case", _params(FORMAT))
def test_format(case: suite.Case | None) -> None:
    """SCH-13 (with SCH-42's harness): with ``format_assertion=True`` every
    ``optional/format`` case gets the suite's verdict."""
    assert case is None or case.format_assertion
    _check(case)


def test_case_counts() -> None:
    """SCH-42, SCH-13: the pinned suite has at least 1200 required cases and
    exactly 491 format cases, so a broken fetch or loader cannot pass by
    running nothing."""
    _require_suite()
    assert len(REQUIRED) >= 1200, len(REQUIRED)
    assert len(FORMAT) == 491, len(FORMAT)


def test_other_dialect_list_matches_the_suite() -> None:
    """SCH-42: ``OTHER_DIALECT`` names exactly the required groups whose schema
    declares (or references a remote that declares) another dialect."""
    _require_suite()
    assert suite.other_dialect_groups(REQUIRED, REGISTRY) == suite.OTHER_DIALECT
    groups = {(c.group, c.group_description) for c in REQUIRED}
    assert groups >= suite.OTHER_DIALECT


def test_pinned_commit_is_recorded() -> None:
    """SCH-42: the pinned suite commit is recorded in ``conformance/COMMIT``."""
    root = _require_suite()
    commit = (_HERE / "COMMIT").read_text(encoding="utf-8").strip()
    assert commit == fetch.COMMIT
    assert (root / "COMMIT").read_text(encoding="utf-8").strip() == commit
