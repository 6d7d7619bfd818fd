"""URI references for ``$id`` and ``$ref``: RFC 3986 resolution for every
scheme, and the identity the engine compares URIs by."""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = ["identity_key", "is_absolute", "resolve", "split_fragment"]

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
_DEFAULT_PORTS: Final = {"http": ":80", "https": ":443", "ws": ":80", "wss": ":443"}
_PERCENT: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


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
    """RFC 3986 section 5.3, guarded so that the result parses back the same:
    a path starting ``//`` without authority is written ``/.//``, and a
    relative path that reads as a scheme (``a:b``) is written ``./a:b``."""
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

    Works for every scheme (``urn:``, ``tag:``, ``json-schema:///``, ...), unlike
    :func:`urllib.parse.urljoin`.  Nothing is normalized: an empty reference
    yields ``base`` without its fragment, unchanged.  Never raises.
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


def _percent(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else f"%{match.group(1).upper()}"


def identity_key(identifier: str) -> str:
    """``identifier`` as the engine tells identifiers apart, or coarser: two
    identifiers with one key are refused as one declared twice, never confused.

    Scheme and host lower-cased, a default port dropped, an empty path made
    ``/``, percent-encoding normalized (RFC 3986 6.2.2).
    """
    if "%" in identifier:
        identifier = _PERCENT.sub(_percent, identifier)
    scheme, sep, rest = identifier.partition("://")
    if not sep:
        scheme, colon, rest = identifier.partition(":")
        return f"{scheme.lower()}{colon}{rest}" if colon else identifier
    scheme = scheme.lower()
    authority, slash, tail = rest.partition("/")
    if not slash:  # "https://a.test#x": the authority ends at the fragment
        authority, hash_, fragment = authority.partition("#")
        tail = f"{hash_}{fragment}"
    authority = authority.lower()
    port = _DEFAULT_PORTS.get(scheme)
    if port is not None and authority.endswith(port):
        authority = authority[: -len(port)]
    return f"{scheme}://{authority}/{tail}"
