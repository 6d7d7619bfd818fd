"""Development sessions: ``nox -s tests`` is the README test command."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

PYTHON = "3.11"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Every test: the official JSON Schema suite, then pytest (unit, property, CLI)."""
    session.install("-e", ".[test,cli]")
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}
    session.run("python", "conformance/run.py", env=env)
    session.run("python", "-m", "pytest", *session.posargs, env=env)


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """The official JSON-Schema-Test-Suite (Draft 2020-12) through our boundary."""
    session.install("-e", ".[test]")
    session.run("python", "conformance/run.py", *session.posargs)
    session.run("python", "-m", "pytest", "conformance", "-q")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy --strict."""
    session.install("-e", ".[lint]")
    session.run(
        "ruff", "check", "trio_backplane", "tests", "conformance", "benchmarks", "noxfile.py"
    )
    session.run("ruff", "format", "--check", "trio_backplane", "tests", "conformance", "benchmarks")
    session.run("mypy", "trio_backplane")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The benchmarks: each prints its ratios (record them in benchmarks/RESULTS.md)."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/bench_schema.py", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """The long property-test run: hypothesis with thousands of examples."""
    session.install("-e", ".[test,cli]")
    session.run(
        "python", "-m", "pytest", "-q", *session.posargs, env={"HYPOTHESIS_PROFILE": "soak"}
    )
