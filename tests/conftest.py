"""Test configuration: hypothesis profiles and the paths of the data the tests read
(all inside the repository)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "soak", max_examples=5_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

REPO = Path(__file__).resolve().parent.parent

#: Process groups, /proc and the Deno worker are Linux's.  Elsewhere the
#: tests skip, except under CI (``nox -s tests`` sets it), where a missing
#: prerequisite must fail: they run and fail there instead of hiding.
LINUX_ONLY = pytest.mark.skipif(
    not sys.platform.startswith("linux") and not os.environ.get("CI"),
    reason="process groups and /proc are Linux's",
)
FIXTURES = REPO / "tests" / "fixtures"
WORKLOADS = REPO / "benchmarks" / "workloads"

# Growing record maps are derived as ``LayeredDict`` from 64 entries on, in
# production.  The suite lowers the thresholds so every test with more than a
# few intents, results or reservations runs on the layered representation
# (stores, codec, recovery and engine alike); tests/kernel/test_layered.py
# checks the production thresholds themselves.
from trio_backplane.kernel import _derived  # noqa: E402

_derived._LAYER_FROM = 4
_derived._OVERLAY_MAX = 3
