"""Development sessions: ``nox -s tests`` is the README test command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

PYTHON = "3.11"
ROOT = Path(__file__).resolve().parent
PG_DSN = "TRIO_BACKPLANE_PG_DSN"


def _start_postgres(session: nox.Session, base: str) -> str | None:
    """Start the throwaway PostgreSQL server (scripts/postgres.sh): its DSN, or
    None when it cannot start outside CI (the PostgreSQL tests then skip)."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"],
        capture_output=True,
        text=True,
        env={**os.environ, "TRIO_BACKPLANE_PG_DIR": base},
        check=False,
    )
    for line in result.stderr.splitlines():
        session.log(line)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode == 0 and lines and lines[-1].startswith("postgresql://"):
        session.log(f"PostgreSQL for the tests: {lines[-1]}")
        return lines[-1]
    message = f"scripts/postgres.sh start failed (exit status {result.returncode})"
    if os.environ.get("CI"):
        session.error(f"{message}: CI requires the PostgreSQL tests to run")
    session.warn(f"{message}: the PostgreSQL tests will skip")
    return None


def _stop_postgres(session: nox.Session, base: str) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "postgres.sh"), "stop"],
        capture_output=True,
        env={**os.environ, "TRIO_BACKPLANE_PG_DIR": base},
        check=False,
    )
    session.log("PostgreSQL stopped")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Every test: the official JSON Schema suite, then pytest (unit, property,
    CLI, and the PostgreSQL store against a throwaway server)."""
    session.install("-e", ".[test,cli,postgres]")
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}
    session.run("python", "conformance/run.py", env=env)
    # One server per session (its own directory and port), so concurrent
    # sessions on one machine never stop each other's server.  A DSN already
    # in the environment is used as it is.
    base = f"/tmp/trio_backplane_pg.nox-{os.getpid()}"
    started = not os.environ.get(PG_DSN)
    try:
        dsn = _start_postgres(session, base) if started else os.environ[PG_DSN]
        if dsn:
            env[PG_DSN] = dsn
        session.run("python", "-m", "pytest", *session.posargs, env=env)
    finally:
        if started:
            _stop_postgres(session, base)


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """The official JSON-Schema-Test-Suite (Draft 2020-12) through our boundary."""
    session.install("-e", ".[test]")
    session.run("python", "conformance/run.py", *session.posargs)
    session.run("python", "-m", "pytest", "conformance", "-q")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy --strict."""
    session.install("-e", ".[lint,mcp,openai,postgres]")
    session.run(
        "ruff", "check", "trio_backplane", "tests", "conformance", "benchmarks", "noxfile.py"
    )
    session.run("ruff", "format", "--check", "trio_backplane", "tests", "conformance", "benchmarks")
    session.run("mypy", "trio_backplane")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The benchmarks: each prints its ratios (record them in benchmarks/RESULTS.md).
    The store benchmark measures PostgreSQL too when TRIO_BACKPLANE_PG_DSN is set."""
    session.install("-e", ".[bench,postgres]")
    for script in ("bench_schema.py", "bench_store.py", "bench_engine.py"):
        session.run("python", f"benchmarks/{script}", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """The long property-test run: hypothesis with thousands of examples."""
    session.install("-e", ".[test,cli]")
    session.run(
        "python", "-m", "pytest", "-q", *session.posargs, env={"HYPOTHESIS_PROFILE": "soak"}
    )
