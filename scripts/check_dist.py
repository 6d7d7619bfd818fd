"""Check a built sdist and wheel hold what users need (``nox -s build``).

    python scripts/check_dist.py DIST_DIR

``DIST_DIR`` holds exactly one sdist and one wheel, both of the version in
``trio_backplane/_version.py``.  The wheel holds every module and every
package-data file of the source tree (``py.typed``, ``examples/*.json``,
``schema/*.pyi``) and nothing outside the package; the sdist holds the same
plus what a build from it needs, and nothing compiled.  Prints the version
on success; exits 1 naming what is wrong.
"""

from __future__ import annotations

import ast
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trio_backplane"


def version() -> str:
    """``__version__`` of ``trio_backplane/_version.py``, read without importing."""
    tree = ast.parse((PACKAGE / "_version.py").read_text("utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise SystemExit("trio_backplane/_version.py sets no __version__ string")


def wanted() -> list[str]:
    """Every module and package-data file of the source tree, repo-relative."""
    data = [
        PACKAGE / "py.typed",
        *PACKAGE.glob("examples/*.json"),
        *PACKAGE.glob("schema/*.pyi"),
        *PACKAGE.glob("kernel/*.pyi"),
        *PACKAGE.glob("codemode/*.js"),
        *PACKAGE.glob("console/templates/*.html"),
    ]
    if not any(p.suffix == ".json" for p in data) or not any(p.suffix == ".pyi" for p in data):
        raise SystemExit("the source tree has no examples/*.json or schema/*.pyi to ship")
    modules = [p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(p.relative_to(ROOT).as_posix() for p in [*data, *modules])


def problems(dist: Path, release: str) -> list[str]:
    sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        return [f"expected one sdist and one wheel in {dist}, found {sorted(dist.iterdir())}"]
    found = [
        f"{a.name} does not carry the version {release}"
        for a in (*sdists, *wheels)
        if not a.name.startswith(f"trio_backplane-{release}")
    ]
    files = wanted()
    with zipfile.ZipFile(wheels[0]) as zipped:
        in_wheel = set(zipped.namelist())
    found += [f"missing from the wheel: {n}" for n in files if n not in in_wheel]
    found += [
        f"the wheel holds a file outside the package: {n}"
        for n in sorted(in_wheel)
        if not n.startswith(("trio_backplane/", "trio_backplane-"))
    ]
    with tarfile.open(sdists[0]) as tarred:
        prefix = f"trio_backplane-{release}/"
        in_sdist = {name.removeprefix(prefix) for name in tarred.getnames()}
    needed = [*files, "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"]
    needed += ["trio_backplane/schema/_speedups.c", "trio_backplane/kernel/_speedups.c"]
    found += [f"missing from the sdist: {n}" for n in needed if n not in in_sdist]
    found += [
        f"the sdist holds a compiled file: {n}"
        for n in sorted(in_sdist)
        if n.endswith((".so", ".pyd", ".pyc"))
    ]
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/check_dist.py DIST_DIR", file=sys.stderr)
        return 2
    release = version()
    found = problems(Path(argv[0]), release)
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(release)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
