"""RFC 3986 reference resolution for JSON Schema ``$id`` and ``$ref``.

:func:`urllib.parse.urljoin` only joins for a fixed list of schemes, so it
returns ``"#/$defs/bar"`` unchanged against ``urn:uuid:...`` and cannot place
``other.json`` under ``json-schema:///``.  :func:`resolve` implements the
generic algorithm of RFC 3986 section 5.2 for any scheme: the strict parser of
section 5.2.1 (a reference with its own scheme is taken as is, even when it is
the base's), the transform of 5.2.2 with ``merge`` (5.2.3) and
``remove_dot_segments`` (5.2.4), and the recomposition of 5.3.

Nothing is normalized beyond that: percent-encoding, case and the base URI
itself are left as they are (the RFC makes base normalization optional), so an
empty reference gives back the base without its fragment, unchanged.

Two guards keep every result re-parseable as the same URI, which the RFC's
recomposition does not on its own (WHATWG URL does the same):

* a path that starts with ``//`` and has no authority is written ``/.//...``
  (``"a:/b"`` + ``"/.//c"`` is ``"a:/.//c"``, not ``"a://c"`` whose ``c`` would
  read back as an authority);
* a relative result (no scheme, no authority) whose path starts with what reads
  as a scheme (``a:b``) is written ``./a:b``.

The parser is the regular expression of RFC 3986 Appendix B, with one
tightening: a scheme must match ``ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )``
(section 3.1); text before a ``:`` that is not a scheme is part of the path.
Every string parses, so nothing here raises.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = ["is_absolute", "resolve", "split_fragment"]

# RFC 3986 Appendix B, with the scheme syntax of section 3.1.
_URI_REFERENCE: Final = re.compile(
    r"(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*):)?"
    r"(?://(?P<authority>[^/?#]*))?"
    r"(?P<path>[^?#]*)"
    r"(?:\?(?P<query>[^#]*))?"
    r"(?:#(?P<fragment>.*))?",
    re.DOTALL,
)
_SCHEME_PREFIX: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


class _Parts(NamedTuple):
    """The five components; None marks an undefined component (not an empty one)."""

    scheme: str | None
    authority: str | None
    path: str
    query: str | None
    fragment: str | None


def _parse(uri: str) -> _Parts:
    match = _URI_REFERENCE.fullmatch(uri)
    # Every component is optional and the path takes any run without "?" or "#",
    # so the expression matches every string.
    assert match is not None
    return _Parts(
        match["scheme"], match["authority"], match["path"], match["query"], match["fragment"]
    )


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, scanning ``path`` once with an index."""
    if "." not in path:
        return path
    output: list[str] = []  # segments, each with its leading "/" if it had one
    i = 0
    n = len(path)
    while i < n:
        if path.startswith("../", i):  # A
            i += 3
        elif path.startswith("./", i) or path.startswith("/./", i):  # A, B: "/./" -> "/"
            i += 2
        elif path.startswith("/.", i) and i + 2 == n:  # B: "/." at the end -> "/"
            output.append("/")
            i = n
        elif path.startswith("/../", i):  # C: "/../" -> "/" and drop the last segment
            i += 3
            if output:
                output.pop()
        elif path.startswith("/..", i) and i + 3 == n:  # C: "/.." at the end
            if output:
                output.pop()
            output.append("/")
            i = n
        elif (path.startswith(".", i) and i + 1 == n) or (
            path.startswith("..", i) and i + 2 == n
        ):  # D
            i = n
        else:  # E: move the first segment, with its leading "/" if any
            end = path.find("/", i + 1)
            if end < 0:
                end = n
            output.append(path[i:end])
            i = end
    return "".join(output)


def _merge(base: _Parts, reference_path: str) -> str:
    """RFC 3986 section 5.2.3."""
    if base.authority is not None and base.path == "":
        return "/" + reference_path
    slash = base.path.rfind("/")
    return base.path[: slash + 1] + reference_path


def _recompose(parts: _Parts) -> str:
    """RFC 3986 section 5.3, plus the two re-parse guards of the module docstring."""
    scheme, authority, path, query, fragment = parts
    pieces: list[str] = []
    if scheme is not None:
        pieces += [scheme, ":"]
    if authority is not None:
        pieces += ["//", authority]
    elif path.startswith("//"):
        pieces.append("/.")
    elif scheme is None and _SCHEME_PREFIX.match(path):
        pieces.append("./")
    pieces.append(path)
    if query is not None:
        pieces += ["?", query]
    if fragment is not None:
        pieces += ["#", fragment]
    return "".join(pieces)


def resolve(base: str, reference: str) -> str:
    """Resolve ``reference`` against ``base`` (RFC 3986 section 5.2, strict parser).

    Works for every scheme (``urn:``, ``tag:``, ``json-schema:///``, ...).  An
    empty reference yields ``base`` without its fragment.
    """
    r = _parse(reference)
    if r.scheme is not None:
        target = _Parts(r.scheme, r.authority, _remove_dot_segments(r.path), r.query, r.fragment)
        return _recompose(target)
    b = _parse(base)
    authority: str | None
    query: str | None
    if r.authority is not None:
        authority, path, query = r.authority, _remove_dot_segments(r.path), r.query
    else:
        authority = b.authority
        if r.path == "":
            path = b.path
            query = r.query if r.query is not None else b.query
        else:
            if r.path.startswith("/"):
                path = _remove_dot_segments(r.path)
            else:
                path = _remove_dot_segments(_merge(b, r.path))
            query = r.query
    return _recompose(_Parts(b.scheme, authority, path, query, r.fragment))


def split_fragment(uri: str) -> tuple[str, str]:
    """``uri`` without its fragment, and the fragment without ``#`` (``""`` if none)."""
    without, _, fragment = uri.partition("#")
    return without, fragment


def is_absolute(uri: str) -> bool:
    """Whether ``uri`` has a scheme (a fragment is allowed)."""
    return _parse(uri).scheme is not None
