"""ECMA-262 (ES2024, Unicode mode) syntax check for JSON Schema patterns."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import deno
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, WORKLOADS
from trio_backplane.schema._ecma import pattern_syntax_error

_FIXTURE_FILES = [*sorted(FIXTURES.glob("*.json")), WORKLOADS / "schemas.json"]

ACCEPTED: list[str] = [
    "",
    "a",
    "abc",
    "a|b|",
    "|",
    "^(none|[A-Z])$",
    "^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$",
    "^[A-Za-z0-9._/-]{1,100}$",
    "^[a-f0-9]{8}-[a-f0-9]{4}$",
    ".",
    "a*",
    "a+",
    "a?",
    "a*?",
    "a+?",
    "a??",
    "a{2}",
    "a{2,}",
    "a{2,3}",
    "a{2,2}",
    "a{0}",
    "a{2}?",
    "a{2,}?",
    "a{2,3}?",
    "a{007,8}",
    "a{99999999999999999999}",
    "(a)*",
    "(?:a)+",
    "(?<name>a){2}",
    "\\b\\B^$",
    "(?=a)",
    "(?!a)",
    "(?<=a)",
    "(?<!a)",
    "(?=(a))\\1",
    "(?<=\\d{3})x",
    "(a)(b)\\2\\1",
    "\\1(a)",
    "(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)\\10",
    "(?<year>\\d{4})-(?<month>\\d{2})",
    "(?<a>x)\\k<a>",
    "\\k<a>(?<a>x)",
    "(?<$>x)",
    "(?<_a1>x)",
    "(?<a$b_c>x)",
    "(?<é>x)",
    "(?<日本>x)",
    "(?<a\u200d>x)",
    "(?<a\u200c>x)",
    "(?<\\u0061>x)\\k<a>",
    "(?<\\u{61}b>x)\\k<ab>",
    "(?<\\uD835\\uDC9C>x)",
    "(?<\U0001d49c>x)",
    "[]",
    "[^]",
    "[abc]",
    "[^abc]",
    "[a-z]",
    "[a-a]",
    "[-a]",
    "[a-]",
    "[-]",
    "[--]",
    "[---]",
    "[a\\-z]",
    "[\\w-]",
    "[-\\w]",
    "[\\w\\d\\s]",
    "[\\b]",
    "[\\]]",
    "[\\[]",
    "[[]",
    "[(){}|.*+?^$/]",
    "[\\^\\$\\\\\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\/]",
    "[\\0]",
    "[\\cA-\\cZ]",
    "[\\x00-\\x7F]",
    "[\\u0000-\\uFFFF]",
    "[\\u{0}-\\u{10FFFF}]",
    "[\\uD83D\\uDE00-\\uD83D\\uDE4F]",
    "[😀-🙏]",
    "[\\p{L}\\P{Lu}]",
    "[%--]",
    "[a-c-e]",
    "\\d\\D\\w\\W\\s\\S",
    "\\p{L}",
    "\\p{Lu}",
    "\\P{Letter}",
    "\\p{Script=Greek}",
    "\\p{General_Category=Decimal_Number}",
    "\\p{ASCII}",
    "\\p{Any}",
    "\\p{L}+",
    "\\f\\n\\r\\t\\v",
    "\\ca\\cZ",
    "\\0",
    "\\0a",
    "\\x41",
    "\\xff",
    "\\u0041",
    "\\u{41}",
    "\\u{0000000041}",
    "\\u{10FFFF}",
    "\\uD83D\\uDE00",
    "\\uD83D",
    "\\uDE00",
    "\\^\\$\\\\\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\/",
    "/",
    "-",
    "a-b",
    ",",
    ":",
    "=",
    "!",
    "<>",
    "#",
    "😀",
    "😀{2}",
    "é+",
    "\n",
    " ",
    "a\\/b",
    "((((((((((a))))))))))",
    "(" * 200 + "a" + ")" * 200,
    "(?:" * 200 + ")" * 200,
    "(?=" * 100 + ")" * 100,
    "(?:a|b)*?c",
    "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@example\\.com$",
    "^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$",
    "^\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}(?:\\.\\d+)?(?:Z|[+-]\\d{2}:\\d{2})$",
    "^https?://",
    "^[\\w.-]+$",
    "^(\\([0-9]{3}\\))?[0-9]{3}-[0-9]{4}$",
]

REJECTED: list[str] = [
    "(",
    ")",
    "a)",
    "(a",
    "((a)",
    "(a))",
    "[",
    "[a",
    "[^",
    "]",
    "a]",
    "{",
    "}",
    "a}",
    "a{",
    "a{1",
    "a{1,",
    "a{1,2",
    "a{,2}",
    "a{a}",
    "a{ 1}",
    "{1}",
    "x{2,1}",
    "*",
    "+a",
    "?",
    "*a",
    "a**",
    "a*??",
    "a{2}{3}",
    "a{2}*",
    "|*",
    "(*)",
    "(?:*)",
    "^*",
    "$+",
    "\\b*",
    "\\B{2}",
    "(?=a)*",
    "(?!a)+",
    "(?=a){1}",
    "(?<=a)?",
    "(?<!a)*",
    "(?",
    "(?)",
    "(?<",
    "(?<>x)",
    "(?<a",
    "(?<a>",
    "(?<1a>x)",
    "(?<a-b>x)",
    "(?<a b>x)",
    "(?<a>x)(?<a>y)",
    "(?<a>x)|(?<a>y)",
    "(?<\\x61>x)",
    "(?<\\u{110000}>x)",
    "(?<\\uD835>x)",
    "(?<a\\u0020>x)",
    "\\k",
    "\\k<a>",
    "\\k<a",
    "\\ka",
    "(?<a>x)\\k<b>",
    "\\1",
    "(a)\\2",
    "\\8",
    "\\9",
    "(a)\\99999999999999999999999",
    "\\01",
    "\\00",
    "\\012",
    "[\\1]",
    "[\\01]",
    "[\\B]",
    "[\\k<a>](?<a>x)",
    "[z-a]",
    "[b-a]",
    "[a--]",
    "[\\w-a]",
    "[a-\\w]",
    "[\\d-\\w]",
    "[\\p{L}-z]",
    "[\\uD83D\\uDE4F-\\uD83D\\uDE00]",
    "[\\u{10FFFF}-\\u{0}]",
    "[😀-a]",
    "\\",
    "a\\",
    "[\\",
    "[a\\",
    "\\c",
    "\\c0",
    "\\c_",
    "[\\c0]",
    "[\\c_]",
    "\\x",
    "\\x4",
    "\\xg0",
    "\\u",
    "\\u12",
    "\\u123g",
    "\\u{",
    "\\u{}",
    "\\u{41",
    "\\u{110000}",
    "\\u{FFFFFFFFFFFFFFFFFFFFFFFF}",
    "\\u{g}",
    "\\p",
    "\\p{",
    "\\p{}",
    "\\p{L",
    "\\pL",
    "\\p{=L}",
    "\\p{Script=}",
    "\\p{Scr1pt=Greek}",
    "\\p{L-u}",
    "\\P",
    "\\-",
    "\\_",
    "\\ ",
    "\\y",
    "\\i",
    "\\M",
    "\\é",
    "\\'",
    '\\"',
    "\\<",
    "\\=",
    "\\,",
    "\\:",
    "\\#",
    "[\\y]",
    "[\\a]",
    "[\\_]",
    "[\\ ]",
]

# Python-, PCRE-, Perl-, .NET-, Oniguruma- and POSIX-only syntax (SCH-27).
NON_ECMA: list[str] = [
    "(?P<name>x)",
    "(?P<name>x)(?P=name)",
    "(?P=name)",
    "(?P>name)",
    "(?i)abc",
    "(?s).",
    "(?x) a b",
    "(?m)^a",
    "(?u)a",
    "(?a)a",
    "(?L)a",
    "(?-i)a",
    "a(?i)b",
    "(?i:a)",
    "(?-i:a)",
    "(?i-s:a)",
    "(?#comment)",
    "(?>atomic)",
    "(?|a|b)",
    "(?R)",
    "(?1)",
    "(?&name)",
    "(?(1)a|b)",
    "(?'name'x)",
    "\\Aabc",
    "abc\\Z",
    "abc\\z",
    "\\G",
    "\\h",
    "\\H",
    "\\R",
    "\\X",
    "\\K",
    "\\N",
    "\\Qa.b\\E",
    "\\E",
    "\\a",
    "\\e",
    "\\o{101}",
    "\\g1",
    "\\g{1}",
    "\\g<1>",
    "(a)\\g{-1}",
    "\\x{41}",
    "\\U0001F600",
    "\\N{LATIN SMALL LETTER A}",
    "\\pL",
    "a*+",
    "a++",
    "a?+",
    "a{2}+",
    "a{1,2}+",
    "[[:alpha:]]",
    "[[:digit:]]+",
    "[^[:space:]]",
    "[[.a.]]",
    "[[=a=]]",
    "[a-z&&[^aeiou]]",
    "\\d{,3}",
    "a{,}",
]

# Accepted here although an engine refuses them: property names and values are
# checked for syntax only, not looked up in the Unicode tables.
UNCHECKED_PROPERTY_NAMES: list[str] = [
    "\\p{Foo}",
    "\\p{0}",
    "\\P{L0}",
    "\\p{Script=Nope}",
    "\\p{General_Category=Lu_2}",
]

# Refused here (numbers out of order) although V8 accepts them: V8 clamps both
# quantifier bounds to 2**31-1 before comparing them.
V8_CLAMPED_QUANTIFIERS: list[str] = [
    "a{3000000000,2147483648}",
    "a{2147483648,2147483647}",
]

_REGEX_CHARS = "^$\\.*+?()[]{}|/-,:=!<>_abkdDwWsSBcuxfnrtv0123456789AFZé"
_REGEX_TOKENS = [
    "(", ")", "(?:", "(?=", "(?!", "(?<=", "(?<!", "(?<a>", "(?<b>", "\\k<a>", "\\k<b>",
    "[", "]", "[^", "-", "\\", "\\u", "\\u{", "}", "{", "{1}", "{2,}", "{1,3}", "{3,1}",
    ",", "\\x4", "\\c", "a", "b", "z", "0", "1", "9", "\\1", "\\2", "\\0", "*", "+", "?",
    "|", "^", "$", ".", "\\d", "\\w", "\\b", "\\B", "D83D", "\\uD83D", "\\uDE00", "\\p{L}",
    "\\P{Lu}", "\\p{Script=Greek}", "(?P<n>", "(?i)", "\\-", "\\/", "😀",
]  # fmt: skip
_GENERATED = st.one_of(
    st.text(alphabet=_REGEX_CHARS, max_size=16),
    st.lists(st.sampled_from(_REGEX_TOKENS), max_size=10).map("".join),
)


@pytest.mark.parametrize("pattern", ACCEPTED)
def test_accepts_valid_ecma_pattern(pattern: str) -> None:
    assert pattern_syntax_error(pattern) is None


@pytest.mark.parametrize("pattern", REJECTED)
def test_rejects_invalid_ecma_pattern(pattern: str) -> None:
    """SCH-27: a pattern ECMA-262 refuses in Unicode mode is refused, with a position."""
    reason = pattern_syntax_error(pattern)
    assert reason is not None
    assert re.search(r" at \d+$", reason), reason


@pytest.mark.parametrize("pattern", NON_ECMA)
def test_rejects_non_ecma_syntax(pattern: str) -> None:
    """SCH-27: Python/PCRE/POSIX-only regex syntax is not ECMA-262 and is refused."""
    reason = pattern_syntax_error(pattern)
    assert reason is not None
    assert re.search(r" at \d+$", reason), reason


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(?P<n>x)", "invalid group '(?P' at 0"),
        ("ab(?i)", "invalid group '(?i' at 2"),
        ("(?>a)", "invalid group '(?>' at 0"),
        ("a*+", "nothing to repeat '+' at 2"),
        ("x(?=a)*", "nothing to repeat '*' at 6"),
        ("\\Aa", "invalid escape '\\\\A' at 0"),
        ("a\\", "'\\' at end of pattern at 1"),
        ("ab)", "unmatched ')' at 2"),
        ("a((b)", "unterminated group at 1"),
        ("x[z-a]", "character class range out of order at 2"),
        ("[\\w-a]", "invalid character class range at 1"),
        ("a{2,1}", "numbers out of order in quantifier '{2,1}' at 1"),
        ("[[:alpha:]]", "lone ']' at 10"),
        ("(a)\\2", "backreference \\2 exceeds the 1 capturing group(s) at 3"),
        ("\\k<x>", "reference to undefined group name 'x' at 0"),
        ("(?<a>.)(?<a>.)", "duplicate capture group name 'a' at 7"),
    ],
)
def test_reason_names_construct_and_position(pattern: str, reason: str) -> None:
    """SCH-27: the refusal says what is wrong and where."""
    assert pattern_syntax_error(pattern) == reason


@pytest.mark.parametrize("pattern", UNCHECKED_PROPERTY_NAMES)
def test_property_names_are_checked_for_syntax_only(pattern: str) -> None:
    assert pattern_syntax_error(pattern) is None


def test_deep_nesting_needs_no_recursion() -> None:
    depth = 50_000
    assert pattern_syntax_error("(" * depth + "a" + ")" * depth) is None
    assert pattern_syntax_error("(?:" * depth + "[a]" + ")" * depth + "*") is None
    assert pattern_syntax_error("(" * depth + ")" * (depth - 1)) == "unterminated group at 0"
    assert pattern_syntax_error("(?=" * depth + ")" * depth + "+") is not None


def test_surrogate_pair_left_in_str_is_one_code_point() -> None:
    # An ECMAScript string is UTF-16: this is "[😀-🙏]" as seen by the engine.
    assert pattern_syntax_error("[\ud83d\ude00-\ud83d\ude4f]") is None
    assert pattern_syntax_error("\ud83d") is None  # a lone surrogate is a PatternCharacter


@settings(max_examples=200, deadline=None, database=None)
@given(_GENERATED)
def test_never_raises(pattern: str) -> None:
    reason = pattern_syntax_error(pattern)
    assert reason is None or reason


# -- fixtures -------------------------------------------------------------------------------

# Keywords whose value maps names (not keywords) to subschemas.
_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# Keywords and record fields whose value is instance data, not schema.
_DATA_KEYS = frozenset({"const", "enum", "default", "examples", "valid", "invalid", "arguments"})


def _walk_patterns(document: Any) -> Iterator[tuple[str, str]]:
    """Yield (JSON pointer, pattern) for every ``pattern`` and ``patternProperties`` key.

    An explicit stack, no recursion; instance data (``examples``, ``const``,
    the bench ``valid``/``invalid`` instances, ...) is skipped, and the keys of
    ``properties`` and friends are names, so a property called ``pattern`` is not one.
    """
    stack: list[tuple[str, Any, bool]] = [("", document, False)]
    while stack:
        pointer, node, names = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{pointer}/{i}", item, False) for i, item in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            here = f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"
            if names:
                stack.append((here, value, False))
                continue
            if key in _DATA_KEYS:
                continue
            if key == "pattern" and isinstance(value, str):
                yield here, value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from ((f"{here} (key)", name) for name in value)
            stack.append((here, value, key in _NAME_MAPS))


def _fixture_patterns() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in _FIXTURE_FILES:
        document = json.loads(path.read_text(encoding="utf-8"))
        found.extend((f"{path.name}#{ptr}", pattern) for ptr, pattern in _walk_patterns(document))
    return found


def test_walk_patterns_skips_names_and_instance_data() -> None:
    schema = {
        "properties": {
            "pattern": {"type": "string", "pattern": "^a$"},
            "patternProperties": {"patternProperties": {"^x-": {}}},
        },
        "examples": [{"pattern": "*.py"}],
        "$defs": {"d": {"items": {"pattern": "b+"}}},
    }
    assert sorted(p for _, p in _walk_patterns(schema)) == ["^a$", "^x-", "b+"]


def test_fixture_patterns_are_accepted() -> None:
    patterns = _fixture_patterns()
    # The bench tool schema has two patterns, big_defs one, issue 46 one.
    assert len(patterns) >= 4, patterns
    refused = {
        where: reason
        for where, pattern in patterns
        if (reason := pattern_syntax_error(pattern)) is not None
    }
    assert refused == {}


# -- cross-check against a real ECMA-262 engine ------------------------------------------------

_ENGINE_SCRIPT = """
const patterns = JSON.parse(await new Response(Deno.stdin.readable).text());
const verdicts = patterns.map((p) => {
  try { new RegExp(p, "u"); return null; } catch (e) { return String(e.message); }
});
await Deno.stdout.write(new TextEncoder().encode(JSON.stringify(verdicts)));
"""


def _run_engine(script: str, payload: Any) -> Any:
    """Run ``script`` in ONE Deno (V8) process with ``payload`` (JSON) on stdin;
    its JSON output.  Deno comes from the PyPI ``deno`` package, which the
    test extra installs, so the engine is always there.  Its V8 has shipped
    two ES2025 additions (group modifiers, duplicate group names across
    alternatives) that this ES2024 check refuses: the flags turn them off so
    both sides judge one grammar."""
    flags = "--no-js-regexp-modifiers,--no-js-regexp-duplicate-named-groups"
    done = subprocess.run(
        [deno.find_deno_bin(), "eval", "--quiet", f"--v8-flags={flags}", script],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def _engine_verdicts(patterns: list[str]) -> list[str | None]:
    """Compile every pattern with ``new RegExp(p, "u")`` in one V8 process:
    None for an accepted pattern, else the engine's message."""
    verdicts: list[str | None] = _run_engine(_ENGINE_SCRIPT, patterns)
    assert len(verdicts) == len(patterns)
    return verdicts


def _generated_patterns() -> list[str]:
    found: list[str] = []

    @settings(max_examples=200, deadline=None, database=None)
    @given(_GENERATED)
    def collect(pattern: str) -> None:
        found.append(pattern)

    collect()
    return found


def test_agrees_with_v8() -> None:
    """SCH-27: accept exactly what a real ECMA-262 engine accepts with the ``u`` flag."""
    known = [pattern for _, pattern in _fixture_patterns()]
    patterns = list(dict.fromkeys(ACCEPTED + REJECTED + NON_ECMA + known + _generated_patterns()))
    # The two documented deviations are checked on their own below.
    patterns = [p for p in patterns if not re.search(r"\{\d{10}|\\[pP]\{", p)]
    assert len(patterns) >= 300
    verdicts = _engine_verdicts(patterns)
    disagreements = {
        pattern: (mine, engine)
        for pattern, engine in zip(patterns, verdicts, strict=True)
        if ((mine := pattern_syntax_error(pattern)) is None) != (engine is None)
    }
    assert disagreements == {}


def test_property_escapes_agree_with_v8() -> None:
    """Well-formed ``\\p{...}`` with real names passes both; malformed fails both."""
    patterns = [p for p in ACCEPTED + REJECTED + NON_ECMA if re.search(r"\\[pP]", p)]
    verdicts = _engine_verdicts(patterns)
    for pattern, engine in zip(patterns, verdicts, strict=True):
        assert (pattern_syntax_error(pattern) is None) == (engine is None), (pattern, engine)


def test_documented_deviations_from_v8() -> None:
    """Pin the two places where this check and V8 knowingly differ."""
    verdicts = _engine_verdicts(UNCHECKED_PROPERTY_NAMES + V8_CLAMPED_QUANTIFIERS)
    unchecked = verdicts[: len(UNCHECKED_PROPERTY_NAMES)]
    clamped = verdicts[len(UNCHECKED_PROPERTY_NAMES) :]
    assert all(v is not None and "property" in v for v in unchecked), unchecked
    assert all(pattern_syntax_error(p) is None for p in UNCHECKED_PROPERTY_NAMES)
    assert clamped == [None] * len(V8_CLAMPED_QUANTIFIERS)
    assert all(pattern_syntax_error(p) is not None for p in V8_CLAMPED_QUANTIFIERS)
