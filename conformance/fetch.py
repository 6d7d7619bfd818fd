"""Fetch the official JSON-Schema-Test-Suite (Draft 2020-12 part) by pinned checksum.

The suite is not committed to this repository.  It comes from the ``jsonschema``
4.26.0 source distribution on PyPI, which vendors JSON-Schema-Test-Suite under
``json/`` (at the commit recorded in ``conformance/COMMIT``; the sdist itself
carries no record of that commit, see below).  Only ``json/tests/draft2020-12/``
and ``json/remotes/`` are extracted, into a cache directory outside the
repository:

    $TRIO_BACKPLANE_CACHE                       if set, else
    $XDG_CACHE_HOME/trio_backplane              if XDG_CACHE_HOME is set, else
    ~/.cache/trio_backplane

under ``json-schema-test-suite-<first 12 hex digits of the sdist SHA-256>/``,
laid out as ``tests/draft2020-12/...`` and ``remotes/...``.

The extraction is idempotent (a marker file, written last, says it is
complete; a complete directory is reused without any network access) and
atomic (extracted into a temporary sibling directory that is renamed into
place).  Standard library only.

Run it as ``python conformance/fetch.py``: it prints the suite directory, or
a reason on stderr and exits with status 2 when the download fails or the
checksum differs.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Final

__all__ = [
    "COMMIT",
    "SDIST_NAME",
    "SDIST_SHA256",
    "FetchError",
    "cache_root",
    "fetch",
    "main",
    "suite_dir",
]

PACKAGE: Final = "jsonschema"
VERSION: Final = "4.26.0"
SDIST_NAME: Final = f"{PACKAGE}-{VERSION}.tar.gz"

# SHA-256 of jsonschema-4.26.0.tar.gz (366 583 bytes), obtained on 2026-11-30 by
#   python -m pip download --no-deps --no-binary :all: jsonschema==4.26.0 -d /tmp/jsdl
#   sha256sum /tmp/jsdl/jsonschema-4.26.0.tar.gz
# and cross-checked against the hash PyPI publishes for that file in its
# simple index (https://pypi.org/simple/jsonschema/, JSON form:
# files[filename == "jsonschema-4.26.0.tar.gz"].hashes.sha256); both agree.
SDIST_SHA256: Final = "0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326"

# JSON-Schema-Test-Suite commit vendored in jsonschema 4.26.0 (also in
# conformance/COMMIT).  The sdist does not record it (no .git, no subtree
# metadata, no file mentioning it); it is the commit of the upstream subtree
# merge in the jsonschema repository.
COMMIT: Final = "9ad349be933f1e74810cb4fd3ad19780694dc77e"

#: Members of the sdist that are extracted (prefix inside the archive -> prefix in the cache).
_PREFIX: Final = f"{PACKAGE}-{VERSION}/json/"
_WANTED: Final = ("tests/draft2020-12/", "remotes/")
_MARKER: Final = ".complete"
_DOWNLOAD_TIMEOUT: Final = 900  # seconds


class FetchError(Exception):
    """The suite could not be obtained (download failed, checksum differs, bad archive)."""


def cache_root() -> pathlib.Path:
    """The cache directory (not the suite directory itself)."""
    explicit = os.environ.get("TRIO_BACKPLANE_CACHE")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return pathlib.Path(xdg).expanduser() / "trio_backplane"
    return pathlib.Path.home() / ".cache" / "trio_backplane"


def _target() -> pathlib.Path:
    return cache_root() / f"json-schema-test-suite-{SDIST_SHA256[:12]}"


def _is_complete(path: pathlib.Path) -> bool:
    marker = path / _MARKER
    try:
        return marker.is_file() and marker.read_text(encoding="utf-8").strip() == SDIST_SHA256
    except OSError:
        return False


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(dest: pathlib.Path) -> pathlib.Path:
    """Download the pinned sdist into ``dest`` with pip; return its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"{PACKAGE}=={VERSION}",
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_DOWNLOAD_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to download {SDIST_NAME}: {exc}") from exc
    sdist = dest / SDIST_NAME
    if proc.returncode != 0 or not sdist.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise FetchError(
            f"downloading {SDIST_NAME} with pip failed (exit {proc.returncode}):\n{tail}"
        )
    return sdist


def _relative_member(name: str) -> str | None:
    """The path inside the cache for an archive member, or None to skip it."""
    if not name.startswith(_PREFIX):
        return None
    rel = name[len(_PREFIX) :]
    if not rel.startswith(_WANTED):
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in (".", ".."):
        raise FetchError(f"unsafe path in {SDIST_NAME}: {name!r}")
    return rel


def _extract(sdist: pathlib.Path, into: pathlib.Path) -> int:
    """Extract the wanted regular files of ``sdist`` into ``into``; return their count."""
    count = 0
    try:
        with tarfile.open(sdist, mode="r:gz") as tar:
            for member in tar:
                rel = _relative_member(member.name)
                if rel is None or member.isdir():
                    continue
                if not member.isfile():
                    raise FetchError(
                        f"unexpected non-regular member in {SDIST_NAME}: {member.name!r}"
                    )
                out = into.joinpath(*rel.split("/"))
                out.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                if src is None:  # pragma: no cover - isfile() members always have data
                    raise FetchError(f"cannot read {member.name!r} from {SDIST_NAME}")
                with src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                count += 1
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise FetchError(f"cannot extract {SDIST_NAME}: {exc}") from exc
    return count


def fetch(*, quiet: bool = True) -> pathlib.Path:
    """Make sure the suite is extracted; return its directory.

    Reuses a complete extraction without network access.  Raises
    :class:`FetchError` if the download fails or the checksum differs.
    """
    target = _target()
    if _is_complete(target):
        return target
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"cannot create cache directory {root}: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix=".suite-tmp-", dir=root) as tmp:
        tmp_path = pathlib.Path(tmp)
        if not quiet:
            print(f"downloading {SDIST_NAME} with pip ...", file=sys.stderr)
        sdist = _download(tmp_path / "download")
        actual = _sha256(sdist)
        if actual != SDIST_SHA256:
            raise FetchError(
                f"checksum mismatch for {SDIST_NAME}: expected sha256 {SDIST_SHA256}, got {actual}"
            )
        staging = tmp_path / "suite"
        staging.mkdir()
        if _extract(sdist, staging) == 0:
            raise FetchError(f"{SDIST_NAME} holds no json/tests/draft2020-12 or json/remotes files")
        if not (staging / "tests" / "draft2020-12").is_dir() or not (staging / "remotes").is_dir():
            raise FetchError(f"{SDIST_NAME} lacks json/tests/draft2020-12/ or json/remotes/")
        (staging / "COMMIT").write_text(COMMIT + "\n", encoding="utf-8")
        # The marker is written last: a directory without it is incomplete.
        (staging / _MARKER).write_text(SDIST_SHA256 + "\n", encoding="utf-8")
        if target.exists() and not _is_complete(target):
            shutil.rmtree(target, ignore_errors=True)  # a leftover without marker
        try:
            staging.rename(target)
        except OSError as exc:
            if not _is_complete(target):  # not a concurrent fetch that won the race
                raise FetchError(f"cannot move the suite into {target}: {exc}") from exc
    return target


def suite_dir() -> pathlib.Path:
    """The suite directory (``tests/draft2020-12/``, ``remotes/``), fetched if needed."""
    return fetch()


def main(argv: list[str] | None = None) -> int:
    del argv
    try:
        path = fetch(quiet=False)
    except FetchError as exc:
        print(f"error: cannot obtain JSON-Schema-Test-Suite: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
