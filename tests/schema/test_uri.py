"""RFC 3986 reference resolution for ``$id`` / ``$ref``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_backplane.schema._uri import is_absolute, resolve, split_fragment

RFC_BASE = "http://a/b/c/d;p?q"

# RFC 3986 section 5.4.1.
RFC_NORMAL = [
    ("g:h", "g:h"),
    ("g", "http://a/b/c/g"),
    ("./g", "http://a/b/c/g"),
    ("g/", "http://a/b/c/g/"),
    ("/g", "http://a/g"),
    ("//g", "http://g"),
    ("?y", "http://a/b/c/d;p?y"),
    ("g?y", "http://a/b/c/g?y"),
    ("#s", "http://a/b/c/d;p?q#s"),
    ("g#s", "http://a/b/c/g#s"),
    ("g?y#s", "http://a/b/c/g?y#s"),
    (";x", "http://a/b/c/;x"),
    ("g;x", "http://a/b/c/g;x"),
    ("g;x?y#s", "http://a/b/c/g;x?y#s"),
    ("", "http://a/b/c/d;p?q"),
    (".", "http://a/b/c/"),
    ("./", "http://a/b/c/"),
    ("..", "http://a/b/"),
    ("../", "http://a/b/"),
    ("../g", "http://a/b/g"),
    ("../..", "http://a/"),
    ("../../", "http://a/"),
    ("../../g", "http://a/g"),
]

# RFC 3986 section 5.4.2 (with a strict parser for "http:g").
RFC_ABNORMAL = [
    ("../../../g", "http://a/g"),
    ("../../../../g", "http://a/g"),
    ("/./g", "http://a/g"),
    ("/../g", "http://a/g"),
    ("g.", "http://a/b/c/g."),
    (".g", "http://a/b/c/.g"),
    ("g..", "http://a/b/c/g.."),
    ("..g", "http://a/b/c/..g"),
    ("./../g", "http://a/b/g"),
    ("./g/.", "http://a/b/c/g/"),
    ("g/./h", "http://a/b/c/g/h"),
    ("g/../h", "http://a/b/c/h"),
    ("g;x=1/./y", "http://a/b/c/g;x=1/y"),
    ("g;x=1/../y", "http://a/b/c/y"),
    ("g?y/./x", "http://a/b/c/g?y/./x"),
    ("g?y/../x", "http://a/b/c/g?y/../x"),
    ("g#s/./x", "http://a/b/c/g#s/./x"),
    ("g#s/../x", "http://a/b/c/g#s/../x"),
    ("http:g", "http:g"),
]


@pytest.mark.parametrize(("reference", "expected"), RFC_NORMAL)
def test_rfc3986_normal_examples(reference: str, expected: str) -> None:
    assert resolve(RFC_BASE, reference) == expected


@pytest.mark.parametrize(("reference", "expected"), RFC_ABNORMAL)
def test_rfc3986_abnormal_examples(reference: str, expected: str) -> None:
    assert resolve(RFC_BASE, reference) == expected


@pytest.mark.parametrize(
    ("base", "reference", "expected"),
    [
        # urn: has no authority and an opaque path; urljoin gives up on it.
        (
            "urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed",
            "#/$defs/bar",
            "urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed#/$defs/bar",
        ),
        (
            "urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed#old",
            "#/$defs/bar",
            "urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed#/$defs/bar",
        ),
        (
            "urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed#frag",
            "",
            "urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed",
        ),
        ("urn:example:foo", "urn:example:bar#x", "urn:example:bar#x"),
        ("urn:example:foo", "#", "urn:example:foo#"),
        ("urn:example:foo", "?q", "urn:example:foo?q"),
        ("urn:example:foo", "bar", "urn:bar"),
        ("urn:example:foo#x", "urn:example:foo", "urn:example:foo"),
        # tag: (RFC 4151), also opaque.
        ("tag:example.com,2024:schemas/a", "#/$defs/x", "tag:example.com,2024:schemas/a#/$defs/x"),
        ("tag:example.com,2024:schemas/a", "b", "tag:example.com,2024:schemas/b"),
        ("tag:example.com,2024:schemas/a/b", "../c", "tag:example.com,2024:schemas/c"),
        # json-schema:/// has an empty authority.
        ("json-schema:///", "other.json", "json-schema:///other.json"),
        ("json-schema:///", "#/$defs/a", "json-schema:///#/$defs/a"),
        ("json-schema:///a/b.json", "c.json#/x", "json-schema:///a/c.json#/x"),
        ("json-schema:///a/b.json", "../../../c.json", "json-schema:///c.json"),
        ("json-schema:///a/b.json", "/c.json", "json-schema:///c.json"),
        ("json-schema:///a/b.json", "//host/c.json", "json-schema://host/c.json"),
        # Empty authority, empty path: merge puts a "/" in front (RFC 3986 5.2.3).
        ("http://example.com", "schema.json", "http://example.com/schema.json"),
        ("https://example.com/root.json", "item.json", "https://example.com/item.json"),
        ("https://example.com/a/root.json", "./b/../item.json", "https://example.com/a/item.json"),
        ("https://example.com/root.json#", "", "https://example.com/root.json"),
        ("https://example.com/root.json", "#/$defs/x", "https://example.com/root.json#/$defs/x"),
        ("https://example.com/root.json", "#foo", "https://example.com/root.json#foo"),
        # A reference with its own scheme is taken as is, after dot-segment removal.
        ("https://example.com/a", "file:///x/./y/../z", "file:///x/z"),
        ("https://example.com/a", "urn:a/./b/../c", "urn:a/c"),
        ("https://example.com/a", "HTTPS://EXAMPLE.com/%7Ea", "HTTPS://EXAMPLE.com/%7Ea"),
        # Percent-encoding and case are left alone.
        ("http://a/b%2Fc/d", "e%20f", "http://a/b%2Fc/e%20f"),
        ("http://a/b", "%2E%2E/c", "http://a/%2E%2E/c"),
        # A path that would read back as an authority or a scheme is guarded.
        ("a:/b", "/.//c", "a:/.//c"),
        ("", "./a:b", "./a:b"),
        # RFC 3986 needs an absolute base; a relative one still runs the algorithm
        # verbatim, where remove_dot_segments keeps the "/" after a removed segment.
        ("", "a/b", "a/b"),
        ("dir/base.json", "other.json", "dir/other.json"),
        ("dir/base.json", "../x", "/x"),
        ("", "", ""),
    ],
)
def test_resolve_any_scheme(base: str, reference: str, expected: str) -> None:
    assert resolve(base, reference) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("http://a/b#c", ("http://a/b", "c")),
        ("http://a/b#", ("http://a/b", "")),
        ("http://a/b", ("http://a/b", "")),
        ("#/$defs/a", ("", "/$defs/a")),
        ("#", ("", "")),
        ("", ("", "")),
        ("urn:x#a#b", ("urn:x", "a#b")),
        ("a?b#c?d", ("a?b", "c?d")),
    ],
)
def test_split_fragment(uri: str, expected: tuple[str, str]) -> None:
    assert split_fragment(uri) == expected


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("http://a/b", True),
        ("urn:uuid:deadbeef-1234-00ff-ff00-4321feebdaed", True),
        ("tag:example.com,2024:x", True),
        ("json-schema:///", True),
        ("a+b-c.d:x", True),
        ("g:h#frag", True),
        ("x:", True),
        ("", False),
        ("#/$defs/a", False),
        ("/a/b", False),
        ("//host/a", False),
        ("a/b:c", False),
        ("./a:b", False),
        ("1a:b", False),
        ("$defs:x", False),
        (":a", False),
        ("?a:b", False),
    ],
)
def test_is_absolute(uri: str, expected: bool) -> None:
    assert is_absolute(uri) is expected


_PRINTABLE = st.text(st.characters(exclude_categories=("Cs", "Cc")))
_URI_LIKE = st.lists(
    st.sampled_from(
        ["a", "b", "g", ":", "/", "//", ".", "..", "./", "../", "?", "#", "@", "%2E", ";", "=",
         "http:", "urn:", "json-schema:///", "x+y:", "1:", " "]
    ),
    max_size=12,
).map("".join)  # fmt: skip
_STRINGS = st.one_of(_PRINTABLE, _URI_LIKE)


@settings(deadline=None, database=None)
@given(_STRINGS, _STRINGS)
def test_resolve_never_raises_and_absolute_results_are_stable(base: str, reference: str) -> None:
    resolved = resolve(base, reference)
    assert isinstance(resolved, str)
    if is_absolute(resolved):
        without_fragment = split_fragment(resolved)[0]
        assert resolve(resolved, "") == without_fragment
        assert resolve(without_fragment, "") == without_fragment
        assert resolve(resolved, "#f") == without_fragment + "#f"
        # An absolute reference does not depend on the base.
        assert resolve(base + "x", resolved) == resolve(reference, resolved)


@settings(deadline=None, database=None)
@given(_STRINGS, _STRINGS)
def test_reference_with_scheme_ignores_base(base: str, reference: str) -> None:
    if is_absolute(reference):
        assert resolve(base, reference) == resolve("", reference)
