"""Stores named by URL: ``sqlite:///relative``, ``sqlite:////absolute``, a bare
path, or a ``postgresql://`` DSN, and a DSN's password kept out of what is printed."""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from typing import Any, Final

from ..errors import Error
from ..store import PostgresStore, SQLiteStore

#: A password fragment this long is hidden wherever it appears.
_ANYWHERE: Final = 8


class UsageError(Exception):
    """A command-line mistake: reported on stderr, exit status 2."""


def redact_dsn(url: str) -> str:
    """A DSN for display: the password (up to the last ``@``, which may be a
    raw ``@`` in the password) is never printed."""
    return re.sub(r"(://[^:/@\s]*:)\S*@", r"\1***@", url)


def _dsn_secret_fragments(url: str) -> list[str]:
    """What of a DSN's password may reach an error text, longest first.

    A raw ``@``, ``:`` or ``/`` in the password makes a driver take part of
    it for the host, port or database and print that part: every run of its
    pieces between such delimiters (three characters or more), as written
    and percent-decoded, is a fragment.
    """
    _, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return []
    _, colon, secret = rest[: rest.rindex("@")].partition(":")
    if not colon or not secret:
        return []
    bounds = [0, *(m.end() for m in re.finditer(r"[@:/?#]", secret))]
    ends = [*(m.start() for m in re.finditer(r"[@:/?#]", secret)), len(secret)]
    fragments = {secret}
    for i, start in enumerate(bounds):
        for end in ends[i:]:
            if end - start >= 3:
                fragments.add(secret[start:end])
    fragments |= {urllib.parse.unquote(f) for f in fragments}
    return sorted(fragments, key=len, reverse=True)


def hide_dsn_secret(text: str, url: str) -> str:
    """``text`` with every fragment of ``url``'s password replaced by ``***``.

    A short fragment is replaced only where it stands alone (not inside a
    word), so it neither mangles the message nor shows itself by the holes
    it leaves.
    """
    for fragment in _dsn_secret_fragments(url):
        if len(fragment) >= _ANYWHERE:
            text = text.replace(fragment, "***")
        else:
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(fragment)}(?![A-Za-z0-9])", "***", text)
    return redact_dsn(text)


def store_path(url: str) -> str:
    """The SQLite file of a store URL: ``sqlite:///relative``, ``sqlite:////absolute``
    (SQLAlchemy's convention) or a bare path."""
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise UsageError(
                "a SQLite store URL is sqlite:///relative/path or sqlite:////absolute/path"
            )
        return url[len("sqlite:///") :]
    return url


def store_url(path: str) -> str:
    """The URL ``open_store`` maps back to ``path`` (an absolute path gets four slashes)."""
    return "sqlite:///" + path


def open_store(url: str, *, must_exist: bool = True, writing: bool = False) -> Any:
    """The store a URL names (not yet connected): ``SQLiteStore`` or
    ``PostgresStore``.  One that must exist, opened only to read, changes
    nothing where it is (no tables, no layout upgrade, no journal switch)."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            # A read would create tables in a database that holds none, then report "0 runs".
            return PostgresStore(url, create_tables=not must_exist)
        except Error as error:
            raise UsageError(f"cannot use PostgreSQL: {error.message}") from None
    if "://" in url and not url.startswith("sqlite:"):
        scheme = url.split("://", 1)[0]
        raise UsageError(
            f"unsupported store URL scheme {scheme!r}: use sqlite:///path or postgresql://..."
        )
    path = store_path(url)
    if must_exist and not os.path.isfile(path):
        hint = ""
        if url.startswith("sqlite:///") and not path.startswith("/"):
            hint = f" (sqlite:/// takes a relative path; for /{path} write sqlite:////{path})"
        raise UsageError(f"no SQLite store at {path!r}{hint}")
    if must_exist:
        _check_store_file(path)
    return SQLiteStore(path, create_tables=writing or not must_exist)


def _check_store_file(path: str) -> None:
    """Refuse a file that is not a trio_backplane store, reading it with ``mode=ro``.

    ``SQLiteStore`` would add its tables to another application's database
    (and switch it to WAL), or make an empty file a store.
    """
    uri = "file:" + urllib.parse.quote(os.fsencode(os.path.abspath(path))) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=10.0)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
            version = None
            if {"meta", "runs", "run_events"} <= tables:
                version = conn.execute(
                    "SELECT value FROM meta WHERE key = 'layout_version'"
                ).fetchone()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        if "not a database" not in str(exc):
            raise UsageError(f"cannot read {path!r}: {exc}") from None
        version = None
    except UnicodeDecodeError as exc:  # a damaged file: its schema text is not UTF-8
        raise UsageError(f"cannot read {path!r}: damaged ({exc.reason})") from None
    if version is None or not (str(version[0]).isascii() and str(version[0]).isdigit()):
        raise UsageError(f"{path!r} is not a trio_backplane store (no layout version)")
