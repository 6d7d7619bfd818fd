"""A chat-completions stream's events decoded: JSON chunks to ``[DONE]``,
an ``error`` event (or a chunk holding ``error``) the server's report."""

from __future__ import annotations

from collections.abc import Iterator

from ...runtime import ProviderEvent
from .._http._errors import Reported, stream_error
from ._response import ResponseBuilder, finishes, parse_chunk

__all__ = ["ChunkDecoder"]


class ChunkDecoder:
    """The :class:`~.._http._reader.Decoder` of chat-completions chunks."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self._finishes = False

    def ends(self, kind: str, data: str) -> bool:
        return data == "[DONE]"

    def decode(self, kind: str, data: str) -> list[ProviderEvent]:
        self._finishes = False
        if kind == "error":  # an SSE error event, whatever its data
            raise Reported(stream_error(data))
        if not data:
            return []
        chunk = parse_chunk(data)
        events = self.builder.events(chunk)
        self._finishes = finishes(chunk)
        return events

    def finishes(self) -> bool:
        return self._finishes

    def finish(self) -> Iterator[ProviderEvent]:
        return self.builder.finish()
