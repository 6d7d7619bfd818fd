"""A chat-completions response decoded: a stream's JSON chunks to
``[DONE]`` (an ``error`` event, or a chunk holding ``error``, the server's
report), or a whole completion read as the one chunk it would stream."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ...runtime import ProviderEvent
from .._http._errors import Failed, Reported, malformed, stream_error
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

    def whole(self, text: str) -> list[ProviderEvent]:
        completion = parse_chunk(text)
        choices = completion.get("choices")
        if not isinstance(choices, list):
            raise Failed(malformed("completion choices must be a list", type(choices).__name__))
        chunk = {"usage": completion.get("usage"), "choices": [_as_delta(c) for c in choices]}
        return [*self.builder.events(chunk), *self.builder.finish()]


def _as_delta(choice: Any) -> Any:
    """A completion's choice as the one chunk delta a stream would send:
    its message, each tool call numbered by its place."""
    if not isinstance(choice, Mapping):
        return choice
    message = choice.get("message")
    delta = dict(message) if isinstance(message, Mapping) else {}
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        delta["tool_calls"] = [
            {**call, "index": index} if isinstance(call, Mapping) else call
            for index, call in enumerate(calls)
        ]
    return {
        "index": choice.get("index", 0),
        "delta": delta,
        "finish_reason": choice.get("finish_reason") or "stop",
    }
