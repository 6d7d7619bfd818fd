"""ECMA-262 patterns in Unicode mode: a syntax check against the ES2024
grammar (``Pattern[+UnicodeMode, +NamedCaptureGroups]``, no Annex B), and the
text the engine is to be given where it would match otherwise.

One left-to-right pass without Python recursion, linear in the pattern's
length.  Where it departs from a full ECMA-262 engine, and why: the schema
design page of the docs.
"""

from __future__ import annotations

from typing import Any, Final

from ._ecma_chars import (
    ASCII_LETTERS,
    BOUNDARIES,
    CLASS_ESCAPES,
    CLASS_SETS,
    CONTROL_ESCAPES,
    DIGITS,
    DOT,
    HEX_DIGITS,
    IDENTITY_ESCAPES,
    LEAD_SURROGATES,
    MAX_CODE_POINT,
    PROPERTY_NAME_CHARS,
    PROPERTY_VALUE_CHARS,
    TRAIL_SURROGATES,
    class_text,
    digits_greater,
    is_id_part,
    is_id_start,
    join_surrogate_pairs,
    plain_class_text,
)

__all__ = ["engine_pattern", "pattern_syntax_error", "scan_pattern"]

# Group kinds on the open-group stack.
_GROUP: Final = 0  # ( (?: (?<name> : quantifiable once closed
_LOOKAHEAD: Final = 1  # (?= (?! : not quantifiable in Unicode mode
_LOOKBEHIND: Final = 2  # (?<= (?<! : never quantifiable

#: Where a scan is: ``(group's '(' position, alternative, enclosing node)``.
_Where = tuple[int, int, Any]


class _PatternError(Exception):
    """Internal: carries the reason out of the scanner."""


def _show(text: str) -> str:
    return repr(text)


class _Scanner:
    """One left-to-right pass over the pattern; raises :class:`_PatternError`."""

    __slots__ = (
        "alternatives",
        "backrefs",
        "capture_count",
        "captures",
        "edits",
        "fancy",
        "group_names",
        "lookarounds",
        "lookbehinds",
        "n",
        "named_refs",
        "pos",
        "references",
        "repeats",
        "src",
        "tick",
        "where",
    )

    def __init__(self, pattern: str) -> None:
        self.src = join_surrogate_pairs(pattern)
        self.n = len(self.src)
        self.pos = 0
        self.capture_count = 0
        self.group_names: set[str] = set()
        self.backrefs: list[tuple[str, int]] = []  # (digits, position of the backslash)
        self.named_refs: list[tuple[str, int]] = []  # (name, position of the backslash)
        #: a lookaround or a backreference: the engine's backtracking path
        self.fancy = False
        #: ``(start, end, text)``: what the backtracking path is given for
        #: ``src[start:end]`` (see :func:`engine_pattern`), in order
        self.edits: list[tuple[int, int, str]] = []
        # Where each capture group and each backreference sits, at O(1) each
        # (a pattern may nest 50,000 groups): see unsupported_reference.
        #: the alternative taken in each open group, innermost first, as a
        #: linked list: ``(group's '(' position (-1: the pattern), its
        #: alternative number, the enclosing group's node)``
        self.where: _Where = (-1, 0, None)
        #: per capture group: ``[where it opened, tick it closed at or None,
        #: inside a lookaround?]``
        self.captures: dict[int, list[Any]] = {}
        #: per backreference: ``(group number, where, tick, in a lookbehind?)``
        self.references: list[tuple[int, _Where, int, bool]] = []
        self.tick = 0  # counts group closings, to order them against references
        self.lookarounds = 0  # lookarounds open
        self.lookbehinds = 0  # lookbehinds open
        #: the capture groups each quantifier repeats: ``range(first, last + 1)``
        self.repeats: list[range] = []
        #: per closed group (by its '(' position): how many alternatives it has
        self.alternatives: dict[int, int] = {}

    def _peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.src[i] if i < self.n else ""

    def _fail(self, reason: str, at: int) -> _PatternError:
        return _PatternError(f"{reason} at {at}")

    def _hex_run(self, start: int, count: int) -> int | None:
        """The value of exactly ``count`` hex digits at ``start``, or None."""
        end = start + count
        if end > self.n:
            return None
        text = self.src[start:end]
        if not all(ch in HEX_DIGITS for ch in text):
            return None
        return int(text, 16)

    def run(self) -> None:
        """Scan the whole pattern; raise at the first syntax error."""
        src = self.src
        n = self.n
        # (group kind, position of '(', the capture count before it)
        stack: list[tuple[int, int, int]] = []
        quantifiable = False  # may the next token be a quantifier?
        repeated: range = range(0)  # the capture groups a quantifier here repeats
        while self.pos < n:
            ch = src[self.pos]
            start = self.pos
            if ch not in "*+?{":
                repeated = range(0)
            if ch == "|":
                self.pos += 1
                group, branch, outer = self.where
                self.where = (group, branch + 1, outer)
                quantifiable = False
            elif ch == "(":
                self._open(start, stack)
                quantifiable = False
            elif ch == ")":
                if not stack:
                    raise self._fail("unmatched ')'", start)
                kind, before = self._close(stack)
                repeated = range(before + 1, self.capture_count + 1)
                quantifiable = kind == _GROUP
            elif ch in "*+?{":
                if not quantifiable:
                    lone = "or lone '{'" if ch == "{" else _show(ch)
                    raise self._fail(f"nothing to repeat {lone}", start)
                self._repeat(repeated)
                if ch == "{":
                    self._braced_quantifier()
                else:
                    self.pos += 1
                self._lazy_suffix()
                quantifiable = False
            elif ch in "}]":
                raise self._fail(f"lone {_show(ch)}", start)
            elif ch in "^$":
                self.pos += 1
                quantifiable = False
            elif ch == "[":
                self._character_class()
                quantifiable = True
            elif ch == "\\":
                quantifiable = self._atom_escape()
            else:  # "." or a PatternCharacter
                if ch == ".":
                    self.edits.append((start, start + 1, DOT))
                self.pos += 1
                quantifiable = True
        if stack:
            raise self._fail("unterminated group", stack[-1][1])
        self._check_references()

    def _open(self, start: int, stack: list[tuple[int, int, int]]) -> None:
        """A group opens at ``start``: pushed on ``stack`` as ``(kind,
        start, capture count before it)``."""
        before = self.capture_count
        kind = self._open_group()
        stack.append((kind, start, before))
        if self.capture_count > before:  # a capture group: where it sits
            self.captures[self.capture_count] = [self.where, None, self.lookarounds > 0]
        self.where = (start, 0, self.where)
        if kind != _GROUP:
            self.lookarounds += 1
            self.lookbehinds += kind == _LOOKBEHIND

    def _close(self, stack: list[tuple[int, int, int]]) -> tuple[int, int]:
        """The innermost group closes; its kind and the capture count before it."""
        kind, _, before = stack.pop()
        group, branch, outer = self.where
        self.alternatives[group] = branch + 1
        assert outer is not None
        self.where = outer
        if kind != _GROUP:
            self.lookarounds -= 1
            self.lookbehinds -= kind == _LOOKBEHIND
        own = self.captures.get(before + 1)
        if own is not None and own[1] is None and own[0] is outer:  # this group
            own[1] = self.tick
        self.tick += 1
        self.pos += 1
        return kind, before

    def _repeat(self, groups: range) -> None:
        """A quantifier repeats ``groups``, the capture groups of the group just closed."""
        if groups:
            self.repeats.append(groups)

    def _lazy_suffix(self) -> None:
        if self._peek() == "?":
            self.pos += 1

    def _braced_quantifier(self) -> None:
        """``{n}``, ``{n,}`` or ``{n,m}`` with n <= m; ``pos`` is at the ``{``."""
        start = self.pos
        i = start + 1
        src, n = self.src, self.n
        while i < n and src[i] in DIGITS:
            i += 1
        low = src[start + 1 : i]
        high: str | None = None
        if low and i < n and src[i] == ",":
            i += 1
            j = i
            while i < n and src[i] in DIGITS:
                i += 1
            high = src[j:i]
        if not low or i >= n or src[i] != "}":
            raise self._fail("incomplete quantifier or lone '{'", start)
        if high and digits_greater(low, high):
            raise self._fail(f"numbers out of order in quantifier {src[start : i + 1]!r}", start)
        self.pos = i + 1

    def _open_group(self) -> int:
        """Consume a group opener; ``pos`` is at the ``(``.  Returns the group kind."""
        start = self.pos
        if self._peek(1) != "?":
            self.pos += 1
            self.capture_count += 1
            return _GROUP
        nxt = self._peek(2)
        if nxt == ":":
            self.pos += 3
            return _GROUP
        if nxt in {"=", "!"}:
            self.pos += 3
            self.fancy = True
            return _LOOKAHEAD
        if nxt == "<":
            after = self._peek(3)
            if after in {"=", "!"}:
                self.pos += 4
                self.fancy = True
                return _LOOKBEHIND
            self.pos += 2
            name = self._group_name()
            if name in self.group_names:
                raise self._fail(f"duplicate capture group name {name!r}", start)
            self.group_names.add(name)
            self.capture_count += 1
            return _GROUP
        # (?P<n>, (?P=n), (?i), (?i:...) (ES2025 modifiers), (?>, (?#, (?| ...
        raise self._fail(f"invalid group {self.src[start : start + 3]!r}", start)

    def _group_name(self) -> str:
        """``<RegExpIdentifierName>``; ``pos`` is at the ``<``.  Returns the name's value."""
        start = self.pos
        self.pos += 1
        chars: list[str] = []
        while True:
            ch = self._peek()
            if ch == ">":
                break
            at = self.pos
            if ch == "\\":
                # RegExpIdentifierStart/Part also allow \uHHHH, \u{...} and a pair
                # \uLEAD\uTRAIL; the escaped code point must itself be a valid name char.
                if self._peek(1) != "u":
                    raise self._fail("invalid escape in capture group name", at)
                self.pos += 2
                value = self._unicode_escape_value(at)
                if value in LEAD_SURROGATES or value in TRAIL_SURROGATES:
                    raise self._fail("invalid capture group name", at)
                ch = chr(value)
            elif ch == "":
                raise self._fail("unterminated capture group name", start)
            else:
                self.pos += 1
            valid = is_id_part(ch) if chars else is_id_start(ch)
            if not valid:
                raise self._fail("invalid capture group name", at)
            chars.append(ch)
        if not chars:
            raise self._fail("empty capture group name", start)
        self.pos += 1  # the '>'
        return "".join(chars)

    def _unicode_escape_value(self, backslash: int) -> int:
        """RegExpUnicodeEscapeSequence[+UnicodeMode] after ``\\u``; returns the code point."""
        if self._peek() == "{":
            i = self.pos + 1
            value = 0
            while i < self.n and self.src[i] in HEX_DIGITS:
                value = value * 16 + int(self.src[i], 16)
                if value > MAX_CODE_POINT:
                    raise self._fail("invalid unicode escape: code point above 10FFFF", backslash)
                i += 1
            if i == self.pos + 1 or i >= self.n or self.src[i] != "}":
                raise self._fail("invalid unicode escape", backslash)
            self.pos = i + 1
            return value
        value_or_none = self._hex_run(self.pos, 4)
        if value_or_none is None:
            raise self._fail("invalid unicode escape", backslash)
        value = value_or_none
        self.pos += 4
        if value in LEAD_SURROGATES and self._peek() == "\\" and self._peek(1) == "u":
            trail = self._hex_run(self.pos + 2, 4)
            if trail is not None and trail in TRAIL_SURROGATES:
                self.pos += 6
                value = 0x10000 + ((value - 0xD800) << 10) + (trail - 0xDC00)
        return value

    def _property_escape(self, backslash: int) -> None:
        """``\\p{...}`` / ``\\P{...}``; ``pos`` is after the ``p``.  Syntax only."""
        if self._peek() != "{":
            raise self._fail("invalid property name", backslash)
        i = self.pos + 1
        src, n = self.src, self.n
        j = i
        while j < n and src[j] in PROPERTY_VALUE_CHARS:
            j += 1
        if j < n and src[j] == "=":
            name = src[i:j]
            if not name or not all(ch in PROPERTY_NAME_CHARS for ch in name):
                raise self._fail("invalid property name", backslash)
            k = j + 1
            while k < n and src[k] in PROPERTY_VALUE_CHARS:
                k += 1
            if k == j + 1:
                raise self._fail("invalid property name", backslash)
            j = k
        elif j == i:
            raise self._fail("invalid property name", backslash)
        if j >= n or src[j] != "}":
            raise self._fail("invalid property name", backslash)
        self.pos = j + 1

    def _character_escape(self, ch: str, backslash: int, *, in_class: bool) -> int:
        """CharacterEscape[+UnicodeMode] whose first char ``ch`` is at ``pos``.

        Returns the character value.  Everything not listed is refused:
        identity escapes exist only for SyntaxCharacter and ``/`` (and ``-``
        in a class, handled by the caller).
        """
        if ch in CONTROL_ESCAPES:
            self.pos += 1
            return {"f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B}[ch]
        if ch == "c":
            letter = self._peek(1)
            if letter not in ASCII_LETTERS or letter == "":
                raise self._fail("invalid control escape '\\c'", backslash)
            self.pos += 2
            if not in_class:  # (a class's items are spelled out by the class)
                self.edits.append((backslash, self.pos, f"\\x{ord(letter) % 32:02x}"))
            return ord(letter) % 32
        if ch == "0":
            if self._peek(1) in DIGITS and self._peek(1) != "":
                raise self._fail("invalid decimal escape", backslash)
            self.pos += 1
            return 0
        if ch == "x":
            value = self._hex_run(self.pos + 1, 2)
            if value is None:
                raise self._fail("invalid escape '\\x'", backslash)
            self.pos += 3
            return value
        if ch == "u":
            self.pos += 1
            return self._unicode_escape_value(backslash)
        if ch in IDENTITY_ESCAPES:
            self.pos += 1
            return ord(ch)
        where = " in character class" if in_class else ""
        raise self._fail(f"invalid escape {_show(chr(92) + ch)}{where}", backslash)

    def _atom_escape(self) -> bool:
        """An escape outside a class; ``pos`` is at the backslash.  Returns quantifiability."""
        backslash = self.pos
        ch = self._peek(1)
        if ch == "":
            raise self._fail("'\\' at end of pattern", backslash)
        self.pos += 1
        if ch in {"b", "B"}:
            self.pos += 1
            self.edits.append((backslash, self.pos, BOUNDARIES[ch]))
            return False
        if ch in CLASS_ESCAPES:
            self.pos += 1
            items, negated = CLASS_SETS[ch]
            self.edits.append((backslash, self.pos, f"[^{items}]" if negated else f"[{items}]"))
        elif ch in {"p", "P"}:
            self.pos += 1
            self._property_escape(backslash)
        elif ch == "k":
            self.pos += 1
            if self._peek() != "<":
                raise self._fail("invalid named reference '\\k'", backslash)
            self.named_refs.append((self._group_name(), backslash))
            self.fancy = True
        elif ch in DIGITS and ch != "0":
            i = self.pos
            while i < self.n and self.src[i] in DIGITS:
                i += 1
            digits = self.src[self.pos : i]
            self.backrefs.append((digits, backslash))
            if len(digits) <= 6:  # a larger one exceeds the groups: refused as syntax
                self.references.append((int(digits), self.where, self.tick, self.lookbehinds > 0))
            self.pos = i
            self.fancy = True
        else:
            self._character_escape(ch, backslash, in_class=False)
        return True

    def _class_atom(self) -> int | None:
        """One ClassAtom; returns its character value, or None for a class escape."""
        ch = self._peek()
        if ch != "\\":
            self.pos += 1
            return ord(ch)
        backslash = self.pos
        ch = self._peek(1)
        if ch == "":
            raise self._fail("'\\' at end of pattern", backslash)
        self.pos += 1
        if ch == "b":
            self.pos += 1
            return 0x08
        if ch == "-":
            self.pos += 1
            return 0x2D
        if ch in CLASS_ESCAPES:
            self.pos += 1
            return None
        if ch in {"p", "P"}:
            self.pos += 1
            self._property_escape(backslash)
            return None
        return self._character_escape(ch, backslash, in_class=True)

    def _character_class(self) -> None:
        """``[...]`` / ``[^...]``; ``pos`` is at the ``[``."""
        start = self.pos
        src = self.src
        self.pos += 1
        negated = self._peek() == "^"
        if negated:
            self.pos += 1
        items: list[str] = []  # the class's items as the backtracking path gets them
        complements: list[str] = []  # the sets of its \D \W \S, as class items
        escapes = False
        while True:
            ch = self._peek()
            if ch == "":
                raise self._fail("unterminated character class", start)
            if ch == "]":
                self.pos += 1
                break
            atom_start = self.pos
            low = self._class_atom()
            if self._peek() == "-" and self._peek(1) not in {"]", ""}:
                self.pos += 1
                high = self._class_atom()
                if low is None or high is None:
                    raise self._fail("invalid character class range", atom_start)
                if low > high:
                    raise self._fail("character class range out of order", atom_start)
            elif low is None and src[atom_start + 1] in CLASS_ESCAPES:
                escapes = True
                escaped, complement = CLASS_SETS[src[atom_start + 1]]
                (complements if complement else items).append(escaped)
                continue
            # as written, but a "^" escaped (it may come first once the class
            # escapes are gone) and \cX as \xHH (refused after a lookaround)
            text = src[atom_start : self.pos]
            plain = plain_class_text(text)
            escapes = escapes or plain != text
            items.append(plain)
        if escapes:
            self.edits.append((start, self.pos, class_text(negated, "".join(items), complements)))

    def unsupported_reference(self) -> str | None:
        """Why the engine would match a backreference otherwise than ECMA-262
        says, if it would: one is supported when its group has closed before
        it on its way through the pattern, and it is in no lookbehind."""
        for number, where, tick, behind in self.references:
            info = self.captures.get(number)
            if info is None:
                continue  # more than the groups: a syntax error
            group_where, closed_at, inside = info
            reason = None
            if behind:
                reason = "inside a lookbehind"
            elif closed_at is None or closed_at >= tick:
                reason = "before its group has closed"
            elif inside or any(number in groups for groups in self.repeats):
                reason = "to a group under a quantifier or inside a lookaround"
            else:
                taken: dict[int, int] = {}
                node: _Where | None = where
                while node is not None:
                    taken[node[0]] = node[1]
                    node = node[2]
                node = group_where
                while node is not None and reason is None:
                    group, branch, node = node
                    if group in taken:
                        if taken[group] != branch:
                            reason = "to a group in another alternative"
                    elif self.alternatives.get(group, 1) > 1:
                        reason = "to a group in an alternative it may not take"
            if reason is not None:
                return f"backreference \\{number} {reason}"
        return None

    def _check_references(self) -> None:
        count = self.capture_count
        for digits, at in self.backrefs:
            if digits_greater(digits, str(count)):
                raise self._fail(
                    f"backreference \\{digits} exceeds the {count} capturing group(s)", at
                )
        for name, at in self.named_refs:
            if name not in self.group_names:
                raise self._fail(f"reference to undefined group name {name!r}", at)


def scan_pattern(pattern: str) -> tuple[str | None, str | None, str | None]:
    """In one pass: ``(pattern_syntax_error(pattern), why the engine cannot
    match it as ECMA-262 says (a backreference it reads otherwise), or None,
    engine_pattern(pattern))``."""
    scanner = _Scanner(pattern)
    try:
        scanner.run()
    except _PatternError as exc:
        return str(exc), None, None
    return None, scanner.unsupported_reference(), _engine_text(scanner)


def engine_pattern(pattern: str) -> str | None:
    """The text to give the engine for the valid ``pattern``, or ``None`` to
    give it as it is: on the engine's backtracking path (a lookaround or a
    backreference), ``\\d``, ``\\w``, ``\\s``, ``\\b`` and ``.`` spelled out as
    the explicit classes ECMA-262 means."""
    return scan_pattern(pattern)[2]


def _engine_text(scanner: _Scanner) -> str | None:
    if not scanner.fancy or not scanner.edits:
        return None
    src = scanner.src
    out: list[str] = []
    at = 0
    for start, end, text in scanner.edits:
        out.append(src[at:start])
        out.append(text)
        at = end
    out.append(src[at:])
    return "".join(out)


def pattern_syntax_error(pattern: str) -> str | None:
    """Why ``pattern`` is not an ECMA-262 (ES2024) regular expression in Unicode mode.

    Returns None for a valid pattern, else a short reason ending with the
    offending position (a code point index into ``pattern``), for example
    ``"invalid group '(?P' at 0"``.
    """
    scanner = _Scanner(pattern)
    try:
        scanner.run()
    except _PatternError as exc:
        return str(exc)
    return None
