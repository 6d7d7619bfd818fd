"""Packaging: one version everywhere, and package data that exists.

``python3 -m nox -s build`` checks the built sdist and wheel themselves; these
are the cheap checks of the source tree that run with every test."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

import trio_backplane
from trio_backplane import _version

REPO = Path(__file__).resolve().parent.parent
# A Keep a Changelog heading: ``## [Unreleased]`` or ``## [1.2.3] - 2026-12-02``.
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")


def _pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def _changelog_headings() -> list[tuple[str, str | None]]:
    headings: list[tuple[str, str | None]] = []
    for line in (REPO / "CHANGELOG.md").read_text("utf-8").splitlines():
        if line.startswith("## "):
            match = HEADING.match(line)
            assert match, f"CHANGELOG.md heading not in the Keep a Changelog shape: {line!r}"
            headings.append((match["name"], match["date"]))
    return headings


def test_version_is_read_from_one_module() -> None:
    project = _pyproject()
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "trio_backplane._version.__version__"
    assert trio_backplane.__version__ == _version.__version__


def test_installed_metadata_has_the_version() -> None:
    """Fails after a version bump until the package is reinstalled
    (``.venv/bin/pip install -e '.[cli]'``)."""
    assert importlib.metadata.version("trio_backplane") == _version.__version__


def test_changelog_tops_with_the_version() -> None:
    headings = _changelog_headings()
    if headings and headings[0][0] == "Unreleased":
        assert headings[0][1] is None
        headings = headings[1:]
    assert headings, "CHANGELOG.md has no release heading"
    name, date = headings[0]
    assert (name, date is not None) == (_version.__version__, True)


def test_package_data_globs_match_files() -> None:
    package_data: dict[str, list[str]] = _pyproject()["tool"]["setuptools"]["package-data"]
    assert package_data
    for package, globs in package_data.items():
        root = REPO.joinpath(*package.split("."))
        assert root.is_dir(), package
        for pattern in globs:
            assert sorted(root.glob(pattern)), f"{package}: {pattern!r} matches no file"
