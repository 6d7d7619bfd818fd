"""A chat completion asked for without streaming (``stream=False``): one
JSON response, read (bounded) and turned into the events a stream of one
chunk would give."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ...runtime import ProviderEvent
from .._http._errors import Failed, malformed
from .._http._exchange import Post, read_whole
from ._response import ResponseBuilder, parse_chunk

__all__ = ["plain_exchange"]


async def plain_exchange(
    client: httpx.AsyncClient, post: Post, builder: ResponseBuilder
) -> list[ProviderEvent]:
    """The events of one non-streamed completion; raises ``Failed``."""
    completion = parse_chunk(await read_whole(client, post))
    choices = completion.get("choices")
    if not isinstance(choices, list):
        raise Failed(malformed("completion choices must be a list", type(choices).__name__))
    chunk = {"usage": completion.get("usage"), "choices": [_as_delta(c) for c in choices]}
    return [*builder.events(chunk), *builder.finish()]


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
