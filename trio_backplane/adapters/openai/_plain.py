"""A chat completion asked for without streaming (``stream=False``): one
JSON response, read (bounded) and turned into the events a stream of one
chunk would give."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import httpx

from ...runtime import ProviderEvent
from ._errors import Failed, http_error, malformed, transport
from ._response import ResponseBuilder, parse_chunk

__all__ = ["plain_exchange"]

#: The most of a response body read, as for one streamed event.
_MAX_BODY: Final = 8 * 1024 * 1024


async def plain_exchange(
    client: httpx.AsyncClient,
    url: str,
    request: tuple[dict[str, Any], dict[str, str], float],
    builder: ResponseBuilder,
) -> list[ProviderEvent]:
    """The events of one non-streamed completion; raises ``Failed``.
    ``request``: the body, the headers and the timeout."""
    body, headers, timeout = request
    try:
        async with client.stream(
            "POST", url, json=body, headers={**headers, "Accept": "application/json"},
            timeout=timeout,
        ) as response:  # fmt: skip
            text = await _bounded_text(response)
            if response.status_code != 200:
                retry_after = response.headers.get("retry-after")
                raise Failed(http_error(response.status_code, text, retry_after=retry_after))
    except httpx.TimeoutException as exc:
        raise Failed(transport("provider request timed out", exc, "timeout")) from None
    except httpx.HTTPError as exc:
        raise Failed(transport("provider connection failed", exc, "connection")) from None
    completion = parse_chunk(text)
    choices = completion.get("choices")
    if not isinstance(choices, list):
        raise Failed(malformed("completion choices must be a list", type(choices).__name__))
    chunk = {"usage": completion.get("usage"), "choices": [_as_delta(c) for c in choices]}
    return [*builder.events(chunk), *builder.finish()]


async def _bounded_text(response: httpx.Response) -> str:
    data = bytearray()
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) > _MAX_BODY:
            raise Failed(malformed("response is too large", f"more than {_MAX_BODY} bytes"))
    return data.decode("utf-8", "replace")


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
