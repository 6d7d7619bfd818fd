"""Reading a chat-completions response: its status and type checked, then
its events to ``[DONE]``, or for ``tail_timeout`` at most once it finished
or failed."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Final

import trio

from ...errors import Error, ErrorClass
from ...runtime import ProviderEvent
from ._errors import Failed, http_error, malformed, stream_error
from ._httpx import httpx
from ._response import ResponseBuilder, finishes, parse_chunk
from ._sse import error_body

__all__ = ["StreamReader", "check_response"]

#: Events read (and ignored) after a failure before giving up.
_DRAIN_LIMIT: Final = 1000


async def check_response(response: httpx.Response, patience: float) -> None:
    """Raise ``Failed`` unless ``response`` is a 200 event stream (an error
    body is read for ``patience`` seconds at most), and read it as UTF-8."""
    if response.status_code != 200:
        said = await error_body(response, patience)
        retry_after = response.headers.get("retry-after")
        raise Failed(http_error(response.status_code, said, retry_after=retry_after))
    media_type = response.headers.get("content-type", "").partition(";")[0]
    if media_type.strip().lower() != "text/event-stream":
        raise Failed(malformed("response is not an event stream", media_type[:100]))
    # Event streams are UTF-8; one leading byte order mark is not part of
    # the first field's name (the SSE specification).
    response.encoding = "utf-8-sig"


class StreamReader:
    """A response's server-sent events, read into a :class:`ResponseBuilder`.

    ``[DONE]`` ends the reading at once: what a server does after it cannot
    change the response, nor its failure.  After a finish reason the rest
    (usage, ``[DONE]``) has ``tail_timeout`` seconds; after a failure the
    body is read on for as long (and ``_DRAIN_LIMIT`` events at most) only
    to close the stream cleanly.
    """

    def __init__(self, builder: ResponseBuilder, tail_timeout: float) -> None:
        self.builder = builder
        self.tail_timeout = tail_timeout
        self.tail_by = math.inf  # after a finish reason or a failure: when reading stops
        self.finished = False
        self.done = False
        self.failure: Error | None = None
        self._drained = 0
        self._finishing = False  # the events read last finish the response

    async def read(self, sses: AsyncIterator[tuple[str, str]]) -> list[ProviderEvent] | None:
        """The events of the next server-sent event (maybe none); ``None``
        once reading stops."""
        with trio.CancelScope(deadline=self.tail_by) as tail:
            try:
                kind, data = await anext(sses)
            except StopAsyncIteration:
                return None
            except Failed as failed:  # an event past the bound
                self.failure = self.failure or failed.error  # a reported one wins
                return None
        if tail.cancelled_caught:  # silent since the finish or the failure
            return None
        return self._take(kind, data.strip())

    def _take(self, kind: str, data: str) -> list[ProviderEvent] | None:
        if data == "[DONE]":
            self.done = True
            return None
        if self.failure is not None:
            self._drained += 1
            return None if self._drained > _DRAIN_LIMIT else []
        events: list[ProviderEvent] = []
        if kind == "error":  # an SSE error event, whatever its data
            self.failure = stream_error(data)
        elif data:
            try:
                chunk = parse_chunk(data)
                events = self.builder.events(chunk)
            except Failed as failed:
                if self.finished:
                    # garbage after the finish reason ("[DO" for "[DONE]"):
                    # what arrived is the response, as when the connection
                    # is cut there; the rest is abandoned as after [DONE]
                    self.done = True
                    return None
                self.failure = failed.error
            else:
                self._finishing = finishes(chunk)
        if self.failure is not None:
            self.tail_by = min(self.tail_by, trio.current_time() + self.tail_timeout)
        return events

    def passed_on(self) -> None:
        """The events read last were passed on: if they finished the
        response, the tail starts now."""
        if self._finishing:
            if not self.finished:
                self.tail_by = trio.current_time() + self.tail_timeout
            self.finished = True
            self._finishing = False

    def failed(self, lost: Error | None) -> Error | None:
        """Why the response failed, given how the connection was ``lost``:
        what the server said wins; after a finish reason, what arrived is
        the response; a stream that ended early is ``stream_truncated``."""
        if self.failure is not None:
            return self.failure
        if lost is not None and not self.finished:
            return lost
        if not (self.done or self.finished):
            return Error(
                ErrorClass.TRANSIENT_TRANSPORT,
                "provider stream ended before the response finished",
                {"reason": "stream_truncated"},
            )
        return None
