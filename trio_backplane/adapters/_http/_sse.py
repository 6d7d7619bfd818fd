"""Reading a response body: its server-sent events, or the head of an error
body, each bounded."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, Final

import httpx
import trio

from ._errors import Failed, malformed

__all__ = ["abandon", "error_body", "server_sent_events"]

#: The most one server-sent event may hold (characters of its data lines and
#: of the line being read, each part counted with what a str costs beside
#: its text): a line that never ends cannot grow without bound.
_MAX_EVENT: Final = 8 * 1024 * 1024
_PART_COST: Final = 64
#: The most of an error response's body read (the rest is not waited for).
_MAX_ERROR_BODY: Final = 64 * 1024
#: Where a line of an event stream ends: CRLF, LF or CR.
_LINE_END: Final = re.compile(r"\r\n|\r|\n")


async def abandon(sses: AsyncIterator[Any]) -> None:
    """Stop reading ``sses`` without waiting on the network.

    Events already buffered are discarded and the first read that would wait
    is cancelled: the cancellation unwinds httpx's own generators beneath
    (breaking out would leave them unexhausted), and closes the connection.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        async for _ in sses:
            pass


async def server_sent_events(response: httpx.Response) -> AsyncGenerator[tuple[str, str], None]:
    """``(event type, data)`` of each event of ``response``'s event stream, as
    the SSE specification reads one: lines end at CRLF, LF or CR; a blank
    line dispatches the event; ``:`` starts a comment; ``data`` lines join
    with newlines; an event the stream ends in the middle of is dropped.
    An event (or a line) past :data:`_MAX_EVENT` characters is a malformed
    stream, refused as it grows: never held whole."""
    event, size = "", 0
    data: list[str] = []
    line: list[str] = []
    pending = 0  # characters of the line being read
    after_cr = False  # the last piece ended in CR: a leading LF belongs to it
    pieces = response.aiter_text()
    async with aclosing(pieces):  # type: ignore[type-var]  # an async generator
        async for received in pieces:
            piece = received[1:] if after_cr and received.startswith("\n") else received
            after_cr = piece.endswith("\r")
            start = 0
            for end in _LINE_END.finditer(piece):
                line.append(piece[start : end.start()])
                start = end.end()
                text = "".join(line)
                line, pending = [], 0
                if not text:
                    if data:
                        yield event or "message", "\n".join(data)
                    event, data, size = "", [], 0
                    continue
                field, colon, value = text.partition(":")
                if not field:
                    continue  # a comment
                if colon and value.startswith(" "):
                    value = value[1:]
                if field == "data":
                    data.append(value)
                    size += len(value) + _PART_COST
                elif field == "event":
                    event = value
            if start < len(piece):
                line.append(piece[start:])
                pending += len(piece) - start + _PART_COST
            if size + pending > _MAX_EVENT:
                await abandon(pieces)  # unwinds httpx's generators beneath, closes
                raise Failed(
                    malformed("stream event is too large", f"more than {_MAX_EVENT} characters")
                )


async def error_body(response: httpx.Response, patience: float) -> str:
    """The first :data:`_MAX_ERROR_BODY` bytes of ``response``'s body as
    text, read for ``patience`` seconds at most: an endless body is not
    held, one that stalls or breaks off is not waited for (the status
    classes the response whatever its body does)."""
    parts: list[bytes] = []
    size = 0
    pieces = response.aiter_bytes()
    with trio.move_on_after(patience):
        try:
            async for piece in pieces:
                parts.append(piece)
                size += len(piece)
                if size >= _MAX_ERROR_BODY:
                    await abandon(pieces)
                    break
        except httpx.HTTPError:
            pass  # what arrived is the body
    return b"".join(parts)[:_MAX_ERROR_BODY].decode("utf-8", "replace")
