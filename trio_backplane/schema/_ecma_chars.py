"""The characters of ECMA-262 patterns: the sets the scanner reads by,
identifier characters, and the explicit classes the engine is given."""

from __future__ import annotations

import unicodedata
from typing import Final

# SyntaxCharacter :: one of ^ $ \ . * + ? ( ) [ ] { } |
SYNTAX_CHARS: Final = frozenset("^$\\.*+?()[]{}|")
IDENTITY_ESCAPES: Final = SYNTAX_CHARS | {"/"}
CONTROL_ESCAPES: Final = frozenset("fnrtv")
CLASS_ESCAPES: Final = frozenset("dDsSwW")
DIGITS: Final = frozenset("0123456789")
HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")
ASCII_LETTERS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# UnicodePropertyNameCharacter :: ControlLetter | _
PROPERTY_NAME_CHARS: Final = ASCII_LETTERS | {"_"}
# UnicodePropertyValueCharacter :: UnicodePropertyNameCharacter | DecimalDigit
PROPERTY_VALUE_CHARS: Final = PROPERTY_NAME_CHARS | DIGITS

MAX_CODE_POINT: Final = 0x10FFFF
LEAD_SURROGATES: Final = range(0xD800, 0xDC00)
TRAIL_SURROGATES: Final = range(0xDC00, 0xE000)

# Unicode derived properties (DerivedCoreProperties.txt / PropList.txt):
# ID_Start = L* + Nl + Other_ID_Start - Pattern_Syntax - Pattern_White_Space;
# ID_Continue = ID_Start + Mn + Mc + Nd + Pc + Other_ID_Continue - Pattern_Syntax - ...
ID_START_CATEGORIES: Final = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl"})
ID_CONTINUE_CATEGORIES: Final = ID_START_CATEGORIES | {"Mn", "Mc", "Nd", "Pc"}
OTHER_ID_START: Final = frozenset("\u1885\u1886\u2118\u212e\u309b\u309c")
# (U+30FB and U+FF65 joined Other_ID_Continue in Unicode 15.1; ZWNJ/ZWJ are allowed anyway.)
OTHER_ID_CONTINUE: Final = frozenset(
    "\u00b7\u0387\u1369\u136a\u136b\u136c\u136d\u136e\u136f\u1370\u1371\u19da\u30fb\uff65"
)
# The only letters in Pattern_Syntax (U+2E2F VERTICAL TILDE is Lm).
PATTERN_SYNTAX_LETTERS: Final = frozenset("\u2e2f")
ZWNJ: Final = "\u200c"
ZWJ: Final = "\u200d"

# What the engine is given on its backtracking path (see engine_pattern): the
# ECMA-262 meaning of each class escape, of ``.`` and of ``\b``/``\B``,
# spelled out as explicit classes (no flags: JSON Schema has none).
DIGIT: Final = "0-9"
WORD: Final = "A-Za-z0-9_"
# WhiteSpace and LineTerminator: TAB VT FF SP NBSP ZWNBSP, the Zs category, LF CR LS PS.
SPACE: Final = r"\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
#: a class escape's letter -> (its set as class items, negated?)
CLASS_SETS: Final = {
    "d": (DIGIT, False),
    "D": (DIGIT, True),
    "w": (WORD, False),
    "W": (WORD, True),
    "s": (SPACE, False),
    "S": (SPACE, True),
}
DOT: Final = r"[^\n\r\u2028\u2029]"
WORD_BEFORE: Final = f"(?<=[{WORD}])"
NO_WORD_BEFORE: Final = f"(?<![{WORD}])"
WORD_AFTER: Final = f"(?=[{WORD}])"
NO_WORD_AFTER: Final = f"(?![{WORD}])"
BOUNDARIES: Final = {
    "b": f"(?:{WORD_BEFORE}{NO_WORD_AFTER}|{NO_WORD_BEFORE}{WORD_AFTER})",
    "B": f"(?:{WORD_BEFORE}{WORD_AFTER}|{NO_WORD_BEFORE}{NO_WORD_AFTER})",
}


def is_id_start(ch: str) -> bool:
    if ch in {"$", "_"} or ch in OTHER_ID_START:
        return True
    return ch not in PATTERN_SYNTAX_LETTERS and (unicodedata.category(ch) in ID_START_CATEGORIES)


def is_id_part(ch: str) -> bool:
    if ch in {"$", ZWNJ, ZWJ} or ch in OTHER_ID_START or ch in OTHER_ID_CONTINUE:
        return True
    return ch not in PATTERN_SYNTAX_LETTERS and (unicodedata.category(ch) in ID_CONTINUE_CATEGORIES)


def join_surrogate_pairs(pattern: str) -> str:
    """Read a UTF-16 surrogate pair left in a ``str`` as the one code point it encodes.

    An ECMAScript string holds UTF-16 code units and Unicode mode reads the
    pattern by code points, so a pair is one character there; a lone
    surrogate stays a character of its own, as in the engine.
    """
    if not any("\ud800" <= ch <= "\udfff" for ch in pattern):
        return pattern
    out: list[str] = []
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if "\ud800" <= ch <= "\udbff" and i + 1 < n and "\udc00" <= pattern[i + 1] <= "\udfff":
            out.append(chr(0x10000 + ((ord(ch) - 0xD800) << 10) + (ord(pattern[i + 1]) - 0xDC00)))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def normalized_digits(digits: str) -> str:
    stripped = digits.lstrip("0")
    return stripped or "0"


def digits_greater(a: str, b: str) -> bool:
    """Compare two decimal digit strings as integers, without building huge ints."""
    a, b = normalized_digits(a), normalized_digits(b)
    return (len(a), a) > (len(b), b)


def plain_class_text(text: str) -> str:
    """A class item (or range) as the backtracking path is given it."""
    if text == "^":
        return "\\^"
    if "\\c" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1] == "c":
            out.append(f"\\x{ord(text[i + 2]) % 32:02x}")
            i += 3
        elif text[i] == "\\":
            out.append(text[i : i + 2])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def class_text(negated: bool, items: str, complements: list[str]) -> str:
    """A class whose class escapes are spelled out: ``items`` (the positive
    ones inlined), and the sets whose complements it also holds (``\\D``,
    ``\\W``, ``\\S``, which a class cannot inline)."""
    if not complements:
        return f"[^{items}]" if negated else f"[{items}]"
    if not negated:  # in items, or outside one of the sets
        alternatives = ([f"[{items}]"] if items else []) + [f"[^{c}]" for c in complements]
        return f"(?:{'|'.join(alternatives)})"
    # [^...]: in none of the items, and inside every one of the sets
    *others, last = complements
    parts = ([f"(?![{items}])"] if items else []) + [f"(?=[{c}])" for c in others]
    return f"(?:{''.join(parts)}[{last}])"
