"""Text a server sends, made Unicode: a lone UTF-16 surrogate, which JSON
can escape and a piece of a stream can end in, becomes U+FFFD."""

from __future__ import annotations

import re
from typing import Any, Final

from ...kernel import loads

__all__ = ["StreamedText", "parse_arguments", "replace_surrogates", "strict_loads", "unicode"]

#: A ``\\uD800``..``\\uDFFF`` escape in JSON text: the only way to a lone surrogate.
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class StreamedText:
    """Text streamed in pieces.  A server slicing text by UTF-16 units may
    split a surrogate pair across two chunks: each piece then decodes to a
    lone surrogate.  A trailing high surrogate waits for the next piece, a
    pair is joined into its character, and a surrogate left alone becomes
    U+FFFD, so every piece (a delta) and the whole text are Unicode text."""

    __slots__ = ("_high", "_parts")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._high = ""

    def __bool__(self) -> bool:
        return bool(self._parts or self._high)

    def add(self, piece: str) -> str:
        """Take ``piece``; returns the text it completes (maybe empty)."""
        piece = self._high + piece
        self._high = ""
        if "\ud800" <= piece[-1] <= "\udbff":
            self._high, piece = piece[-1], piece[:-1]
        piece = unicode(piece)
        if piece:
            self._parts.append(piece)
        return piece

    def so_far(self) -> str:
        """The text completed so far (a trailing high surrogate still waits)."""
        return "".join(self._parts)

    def text(self) -> str:
        if self._high:
            self._parts.append("\ufffd")
            self._high = ""
        return "".join(self._parts)


def unicode(text: str) -> str:
    """``text`` with each surrogate pair joined into its character and each
    lone surrogate replaced by U+FFFD (ASCII: a flag read)."""
    if text.isascii() or not _LONE_SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def strict_loads(text: str) -> Any:
    """Strict JSON (``kernel.loads``) holding no lone UTF-16 surrogate: an
    escape that is not half of a pair decodes to U+FFFD, as invalid UTF-8
    bytes already do, so what a server sends can always be stored."""
    value = loads(text)
    if _SURROGATE_ESCAPE.search(text):  # rare: only then walk the value
        value = replace_surrogates(value)
    return value


def replace_surrogates(value: Any) -> Any:
    """``value`` (JSON data) with every string made Unicode."""
    if isinstance(value, str):
        return unicode(value)
    if isinstance(value, list):
        return [replace_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    return value


def parse_arguments(text: str) -> Any:
    """A tool call's arguments: ``{}`` for none, the JSON value, or the text
    itself when it is not JSON (the gateway refuses it as a tool result)."""
    text = unicode(text)  # fragments may split a surrogate pair
    if not text.strip():
        return {}
    try:
        return strict_loads(text)  # strict: NaN and Infinity stay text
    except (ValueError, RecursionError):
        return text
