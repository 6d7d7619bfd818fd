"""ECMA-262 matching on the engine's backtracking path (SCH-25, SCH-26).

A pattern holding a lookaround or a backreference runs on the engine's
backtracking path, where ``\\d``, ``\\w``, ``\\s``, ``\\b`` and ``.`` are
Unicode-aware.  The boundary gives the engine such a pattern with each of
them spelled out as the class ECMA-262 means (``_ecma.engine_pattern``), in a
copy of the schema; errors still name the pattern as the schema writes it.

The oracle of the property test is the engine's linear path, which follows
ECMA-262 for these escapes (the official suite's optional ``ecmascript-regex``
cases pass through it): a pattern ``P`` without lookaround must decide every
string as ``(?=)P`` does, the same pattern made to take the other path.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_backplane import Error, ErrorClass
from trio_backplane.schema import compile, validate, validate_schema
from trio_backplane.schema._ecma import engine_pattern, pattern_syntax_error


def verdict(schema: dict[str, Any], instance: Any) -> bool:
    """Whether ``instance`` is valid; an invalid one must be refused as
    ``validation`` (never an engine failure)."""
    try:
        validate(schema, instance)
    except Error as exc:
        error = exc
    else:
        return True
    assert error.error_class is ErrorClass.VALIDATION, error
    return False


def matches(pattern: str, text: str) -> bool:
    return verdict({"properties": {"s": {"pattern": pattern}}}, {"s": text})


# (pattern, string, ECMA-262's verdict): each pattern takes the backtracking path
BACKTRACKING_CASES = [
    ("(?=.)^\\d$", "7", True),
    ("(?=.)^\\d$", "\u0663", False),  # ARABIC-INDIC DIGIT THREE
    ("^(a)\\1\\d$", "aa\u0663", False),
    ("(?=.)^\\D$", "\u0663", True),
    ("(?=.)^\\w+$", "abc_9", True),
    ("(?=.)^\\w+$", "ab\u00e9", False),
    ("(?=.)\\W", "\u00e9x", True),
    ("(?=.)^\\s$", "\u00a0", True),
    ("(?=.)^\\s$", "\ufeff", True),  # ZWNBSP is WhiteSpace in ECMA-262
    ("(?=.)^\\s$", "\x85", False),  # NEL is not
    ("(?=.)^\\S$", "\x85", True),
    ("(?=.)^.$", "x", True),
    ("(?=.)^.$", "\r", False),
    ("(?=.)^.$", "\u2028", False),
    ("(?=.)^.$", "\u2029", False),
    ("(?=.)^.$", "\n", False),
    ("(?<=.)x", "\rx", False),
    ("(?=.)^[\\d]$", "\u0663", False),
    ("(?=.)^[^\\D]$", "\u0663", False),
    ("(?=.)^[^\\D]$", "4", True),
    ("(?=.*[\\W_])", "ab\u00e9", True),  # \W: é is not an ASCII word character
    ("(?=.*[\\W_])", "abc", False),
    ("(?=.*[\\W_])", "a_c", True),
    ("(?=.)^[^\\W_]+$", "abc9", True),
    ("(?=.)^[^\\W_]+$", "a_c", False),
    ("(?=.)^[^\\W\\d]+$", "abc", True),
    ("(?=.)^[^\\W\\d]+$", "ab3", False),
    ("(?=.)^[a\\d-]+$", "a-3", True),
    ("(?=.)^[\\s\\d]+$", "3\u3000", True),
    ("(?=.)\\b\u00e9", "\u00e9", False),  # no word character on either side
    ("(?=.)\\ba", " a", True),
    ("(?=.)\\ba", "ba", False),
    ("(?=.)a\\B", "ab", True),
    ("(?=.)a\\B", "a\u00e9", False),  # é is no word character: a boundary
    ("(?=.)a\\b", "a\u00e9", True),
    ("(?=.)a\\B", "a!", False),
    ("(?=.)^abc$", "abc\n", False),  # SCH-25 on this path too
    ("(?=b)b", "abc", True),
    # a literal "^" left first once the class escapes are spelled out
    ("(?=)^[\\W^a]$", "b", False),
    ("(?=)^[\\W^a]$", "a", True),
    ("(?=)^[\\W^a]$", "^", True),
    ("(?=)^[^\\W^a]$", "b", True),
    ("(?=)^[^\\W^a]$", "a", False),
    ("(?<=[\\D^1])x", "2x", False),
    ("(?<=[\\D^1])x", "^x", True),
    ("(?=)^[\\D^]$", "^", True),
    ("(?=)^[\\D^]$", "5", False),
    # \cX, which the engine refuses after a lookaround, given as \xHH
    ("\\b\\cJ(?=a)", "\na", False),
    ("(?=\\n)[\\cJ\\d]", "\n", True),
    ("(?=.)[^\\cJ\\W]", "\n", False),
    # backreferences the engine matches as ECMA-262 does
    ("(a)\\1", "aa", True),
    ("(?:x(a)y)\\1", "xaya", True),
    ("((a)b)\\2", "aba", True),
    ("(a)(?:\\1|b)", "ab", True),
]


@pytest.mark.parametrize(("pattern", "text", "expected"), BACKTRACKING_CASES)
def test_sch_26_backtracking_path_matches_as_ecma(pattern: str, text: str, expected: bool) -> None:
    """SCH-26 (and SCH-25): a pattern with a lookaround or a backreference
    matches as ECMA-262 says: ASCII \\d \\w \\b, ECMA whitespace, . without
    line terminators."""
    assert matches(pattern, text) is expected
    # the same in patternProperties
    schema = {"patternProperties": {pattern: {"type": "integer"}}}
    assert verdict(schema, {text: "not an integer"}) is not expected


def test_sch_26_linear_path_is_given_as_written() -> None:
    """SCH-26: a pattern without lookaround or backreference is the engine's
    linear path, which follows ECMA-262 itself: it is given as written."""
    for pattern in ("^\\d+$", "\\w\\s.", "[\\W_]", "\\bword\\b", "(a)|b"):
        assert pattern_syntax_error(pattern) is None
        assert engine_pattern(pattern) is None
    assert engine_pattern("(?=a)abc") is None  # nothing to spell out
    assert engine_pattern("(?=x)\\d.") == "(?=x)[0-9][^\\n\\r\\u2028\\u2029]"
    assert engine_pattern("(?=x)[\\W_]") == "(?=x)(?:[_]|[^A-Za-z0-9_])"


def test_sch_26_errors_name_the_pattern_as_written() -> None:
    """SCH-26: the engine matches a spelled-out copy; the schema is not
    changed and every error names the pattern as the schema writes it."""
    pattern = "(?=.*\\d)^\\w+$"
    schema = {
        "type": "object",
        "properties": {"p": {"type": "string", "pattern": pattern}},
        "patternProperties": {"(?=x)^x\\d$": {"type": "integer"}},
    }
    before = copy.deepcopy(schema)
    compiled = compile(schema)
    assert compiled.schema is schema
    assert schema == before
    errors = compiled.errors({"p": "ab\u0663", "x7": "s", "x\u0663": "s"})
    assert schema == before
    by_path = {e["instance_path"]: e for e in errors}
    assert set(by_path) == {"/p", "/x7"}  # "x٣" does not match: \d is ASCII
    assert by_path["/p"]["schema_path"] == "/properties/p/pattern"
    assert pattern in by_path["/p"]["message"]
    assert "[0-9]" not in by_path["/p"]["message"]
    assert by_path["/x7"]["schema_path"] == "/patternProperties/(?=x)^x\\d$/type"
    assert compiled.validate({"p": "ab3"}) == {"p": "ab3"}


def test_sch_26_referenced_resources_are_spelled_out_too() -> None:
    """SCH-26: a pattern in a registry resource reached by ``$ref``, and one
    in a ``contentSchema`` reached through a reference, match as ECMA-262."""
    registry = {
        "https://example.test/code": {"type": "string", "pattern": "(?=.)^\\d+$"},
    }
    schema = {"properties": {"c": {"$ref": "https://example.test/code"}}}
    assert validate(schema, {"c": "42"}, schema_registry=registry) == {"c": "42"}
    with pytest.raises(Error) as exc:
        validate(schema, {"c": "4\u0663"}, schema_registry=registry)
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert exc.value.details["errors"][0]["message"].endswith('"(?=.)^\\d+$"')

    content = {
        "$defs": {"code": {"type": "string", "pattern": "(?=.)^\\d$"}},
        "properties": {
            "doc": {
                "contentMediaType": "application/json",
                "contentSchema": {
                    "patternProperties": {"(?=.)^k\\d$": {"$ref": "#/$defs/code"}},
                },
            }
        },
    }
    ok = {"doc": '{"k1": "7"}'}
    assert validate(content, ok, content_assertion=True) == ok
    for bad in ('{"k1": "\u0663"}', '{"k1": "\\r"}'):
        with pytest.raises(Error) as exc:
            validate(content, {"doc": bad}, content_assertion=True)
        assert exc.value.error_class is ErrorClass.VALIDATION
    # "k٣" is no key the pattern matches, so its value is not checked
    odd = {"doc": '{"k\u0663": "x"}'}
    assert validate(content, odd, content_assertion=True) == odd


@pytest.mark.parametrize(
    "pattern",
    [
        "^(?:(a)|b)*\\1$",  # ECMA-262 resets a repeated group at each iteration
        "^(a*)*\\1$",  # and ends a repetition on an empty iteration
        "(a)+\\1",
        "(?<=(a)\\1)b",  # a lookbehind matches right to left
        "\\1(a)",  # a group not closed yet matches the empty string
        "(a\\1)",
        "(a)|\\1",  # as does one in another alternative
        "(?:(a)|b)c\\1",
        "(?!(a))\\1",
    ],
)
def test_sch_26_backreferences_read_otherwise_are_refused(pattern: str) -> None:
    """SCH-26: a backreference the engine would match otherwise than
    ECMA-262 (to a repeated group, a group in another alternative or not
    closed yet, or inside a lookbehind) is refused as unsupported_pattern,
    never evaluated differently."""
    assert pattern_syntax_error(pattern) is None
    for schema in ({"pattern": pattern}, {"patternProperties": {pattern: {}}}):
        with pytest.raises(Error) as exc:
            validate_schema(schema)
        assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert exc.value.details["reason"] == "unsupported_pattern"
        assert exc.value.details["pattern"] == pattern
        assert exc.value.details["detail"].startswith("backreference \\")


def test_sch_26_spelled_out_patterns_are_never_data() -> None:
    """SCH-26: a pattern to spell out in a schema reached only by a
    reference into a ``const`` or ``enum`` value (the object is data too),
    and a pointer through a spelled-out ``patternProperties`` key, are
    refused as unsupported_pattern rather than evaluated differently."""
    for keyword, value in (("const", {"pattern": "(?=a)\\d"}), ("enum", [{"pattern": "(?=a)\\d"}])):
        target = f"#/properties/c/{keyword}" + ("/0" if keyword == "enum" else "")
        schema = {"properties": {"c": {keyword: value}, "r": {"$ref": target}}}
        with pytest.raises(Error) as exc:
            validate_schema(schema)
        assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        assert exc.value.details["pattern"] == "(?=a)\\d"
    # the same data without a pattern to spell out stays usable
    plain = {
        "properties": {"c": {"const": {"pattern": "^a"}}, "r": {"$ref": "#/properties/c/const"}}
    }
    assert validate(plain, {"c": {"pattern": "^a"}, "r": "abc"}) is not None
    pointer = {
        "properties": {"a": {"$ref": "#/patternProperties/(%3F=x)%5Cd"}},
        "patternProperties": {"(?=x)\\d": {"type": "integer"}},
    }
    with pytest.raises(Error) as exc:
        validate_schema(pointer)
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert exc.value.details["pattern"] == "(?=x)\\d"


def test_sch_26_patterns_spelled_out_alike_are_named_apart() -> None:
    """SCH-26: two patterns that spell out to the same text are each named
    as written in their own errors; a long nested contentSchema message
    names its pattern as written too."""
    schema = {
        "properties": {
            "p": {"type": "string", "pattern": "(?=1)[\\d]"},
            "q": {"pattern": "(?=1)\\d"},
        },
        "patternProperties": {"(?=1)[\\d]": {"type": "integer"}},
    }
    errors = compile(schema).errors({"p": "x", "q": "y", "1": "s"})
    by_path = {e["schema_path"]: e["message"] for e in errors}
    assert by_path == {
        "/properties/p/pattern": '"x" does not match "(?=1)[\\d]"',
        "/properties/q/pattern": '"y" does not match "(?=1)\\d"',
        "/patternProperties/(?=1)[\\d]/type": '"s" is not of type "integer"',
    }
    long_pattern = "(?=a)" + "\\s" * 8
    content = {
        "properties": {
            "doc": {
                "contentMediaType": "application/json",
                "contentSchema": {"type": "string", "pattern": long_pattern},
            }
        }
    }
    with pytest.raises(Error) as exc:
        validate(content, {"doc": '"' + "a" * 40 + '"'}, content_assertion=True)
    [entry] = exc.value.details["errors"]
    assert long_pattern in entry["message"]
    assert "\\u1680" not in entry["message"]


def test_sch_26_pattern_written_both_ways_is_refused() -> None:
    """SCH-26: patternProperties holding a pattern both as written and as
    its spelled-out form cannot be given to the engine: refused, not merged."""
    with pytest.raises(Error) as exc:
        validate_schema({"patternProperties": {"(?=x)\\d": {}, "(?=x)[0-9]": {"type": "string"}}})
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert exc.value.details["reason"] == "unsupported_pattern"


# -- the linear path as the oracle ---------------------------------------------------

_ESCAPES = ["\\d", "\\D", "\\w", "\\W", "\\s", "\\S"]
_CLASS_ITEMS = st.sampled_from(["a", "_", "0-9", "\u00e9", "-", "\\-", "^", "\\cJ", *_ESCAPES])
_CLASSES = st.builds(
    lambda negated, items: "[" + ("^" if negated else "") + "".join(items) + "]",
    st.booleans(),
    st.lists(_CLASS_ITEMS, min_size=1, max_size=4),
)
_ATOMS = st.one_of(
    st.sampled_from(["a", "_", "7", "\u00e9", " ", ".", "\\.", "\\cJ", "\\^", *_ESCAPES]),
    _CLASSES,
)


def _quantified(atom: str, quantifier: str) -> str:
    return atom + quantifier


_PIECES = st.builds(_quantified, _ATOMS, st.sampled_from(["", "", "?", "*", "+", "{1,2}"]))
_PATTERNS = st.recursive(
    st.lists(_PIECES, min_size=1, max_size=4).map("".join),
    lambda inner: st.one_of(
        st.builds(lambda a, b: f"(?:{a}|{b})", inner, inner),
        st.builds(lambda a, b: f"{a}({b})", inner, inner),
    ),
    max_leaves=4,
).map(lambda body: "^" + body + "$")
_TEXT = st.text(
    alphabet=st.sampled_from(
        [*"a_7z-. !", "\u00e9", "\u0663", "\r", "\n", "\u2028", "\x85", "\ufeff", "\u00a0"]
    ),
    max_size=5,
)


@settings(deadline=None)
@given(pattern=_PATTERNS, texts=st.lists(_TEXT, min_size=1, max_size=8))
def test_sch_26_both_paths_agree(pattern: str, texts: list[str]) -> None:
    """SCH-26: any pattern of class escapes, classes, ``.`` and quantifiers
    decides every string alike on the linear path (``P``) and on the
    backtracking path (``(?=)P``)."""
    # a class escape in a range ([\d-a]) is no ECMA-262, and the engine
    # refuses some valid patterns ([^] for one): such draws are skipped
    if pattern_syntax_error(pattern) is not None:
        return
    try:
        validate_schema({"pattern": pattern})
    except Error as exc:
        refusal = exc
    else:
        refusal = None
    if refusal is not None:
        assert refusal.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
        return
    fancy = "(?=)" + pattern
    assert pattern_syntax_error(fancy) is None
    for text in texts:
        assert matches(fancy, text) == matches(pattern, text), (pattern, text, json.dumps(text))


def test_sch_26_nested_spelled_out_patterns() -> None:
    """SCH-26: patterns nested under spelled-out ``patternProperties`` keys,
    in arrays of subschemas and in ``$defs``, all match as ECMA-262."""
    schema = {
        "allOf": [
            {
                "patternProperties": {
                    "(?=.)^\\w+$": {
                        "patternProperties": {"(?=.)^\\d$": {"pattern": "(?=.)^.$"}},
                    }
                }
            },
            {"$ref": "#/$defs/inner"},
        ],
        "$defs": {"inner": {"properties": {"z": {"pattern": "(?<=.)\\s"}}}},
    }
    before = copy.deepcopy(schema)
    compiled = compile(schema)
    assert compiled.validate({"ab": {"1": "x"}, "z": "a b"}) == {"ab": {"1": "x"}, "z": "a b"}
    # "é" is not \w, "٣" not \d: those keys are not constrained at all
    assert compiled.validate({"\u00e9": {"1": "\r"}, "ab": {"\u0663": "\r"}}) is not None
    errors = compiled.errors({"ab": {"1": "\r"}, "z": "a\x85"})
    assert {e["schema_path"] for e in errors} == {
        "/allOf/0/patternProperties/(?=.)^\\w+$/patternProperties/(?=.)^\\d$/pattern",
        "/$defs/inner/properties/z/pattern",
    }
    assert schema == before
