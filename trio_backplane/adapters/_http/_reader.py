"""Reading a streamed response: its status and type checked, then its
events decoded to the stream's end, or for ``tail_timeout`` at most once it
finished or failed."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Iterator
from typing import Final, Protocol

import httpx
import trio

from ...errors import Error, ErrorClass
from ...runtime import ProviderEvent
from ._errors import Failed, Reported, http_error, malformed
from ._sse import error_body

__all__ = ["Decoder", "StreamReader", "check_response"]

#: Events read (and ignored) after a failure before giving up.
_DRAIN_LIMIT: Final = 1000


class Decoder(Protocol):
    """A protocol's side of a stream: what its events mean."""

    def ends(self, kind: str, data: str) -> bool:
        """Whether this event ends the stream (``[DONE]``, ``message_stop``)."""
        ...

    def decode(self, kind: str, data: str) -> list[ProviderEvent]:
        """The provider events of one server-sent event; raises ``Failed``
        for a malformed one, ``Reported`` for an error the server sent."""
        ...

    def finishes(self) -> bool:
        """Whether the event decoded last finished the response (its
        finish or stop reason): only its tail may follow."""
        ...

    def finish(self) -> Iterator[ProviderEvent]:
        """The events that end the response, ``ResponseCompleted`` last;
        raises ``Failed`` for a response that must not complete."""
        ...

    def whole(self, text: str) -> list[ProviderEvent]:
        """The events of a response asked for without streaming (its body's
        text), the completion last: those its stream would have given."""
        ...


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
    """A response's server-sent events, read through a :class:`Decoder`.

    The stream's end event ends the reading at once: what a server does
    after it cannot change the response, nor its failure.  After a finish
    reason the rest (usage, the end event) has ``tail_timeout`` seconds, and
    what cannot be decoded there is a cut tail, not a failure; after a
    failure the body is read on for as long (and ``_DRAIN_LIMIT`` events at
    most) only to close the stream cleanly.
    """

    def __init__(self, decoder: Decoder, tail_timeout: float) -> None:
        self.decoder = decoder
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
        decoder = self.decoder
        if decoder.ends(kind, data):
            self.done = True
            return None
        if self.failure is not None:
            self._drained += 1
            return None if self._drained > _DRAIN_LIMIT else []
        try:
            events = decoder.decode(kind, data)
        except Failed as failed:
            if self.finished and not isinstance(failed, Reported):
                # garbage after the finish reason ("[DO" for "[DONE]"): what
                # arrived is the response, as when the connection is cut
                # there; the rest is abandoned as after the end event
                self.done = True
                return None
            self.failure = failed.error
            self.tail_by = min(self.tail_by, trio.current_time() + self.tail_timeout)
            return []
        self._finishing = decoder.finishes()
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
