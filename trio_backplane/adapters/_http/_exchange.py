"""One provider attempt over HTTP: the request posted, the response streamed
through a decoder (or read whole), every failure a classed ``ResponseFailed``
with the API key redacted."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from typing import Any, Final

import attrs
import httpx

from ...errors import Error, ErrorClass
from ...runtime import ProviderEvent, ProviderRequest, ResponseFailed
from ._errors import Failed, http_error, malformed, redact, transport
from ._options import HttpOptions
from ._reader import Decoder, StreamReader, check_response
from ._sse import abandon, server_sent_events

__all__ = ["Post", "api_key_of", "provider_stream", "respond"]

#: What an API key may hold: printable ASCII, no spaces at its ends (a pasted
#: curly quote or a newline would fail inside httpx, unclassed).
_HEADER_TEXT: Final = re.compile(r"[!-~](?:[ -~]*[!-~])?")
#: The most of a whole (non-streamed) response body read.
_MAX_BODY: Final = 8 * 1024 * 1024


@attrs.frozen(kw_only=True)
class Post:
    """One request: ``body`` and ``headers`` (the key among them) to the
    provider's endpoint, under its ``options``."""

    options: HttpOptions
    body: dict[str, Any]
    headers: dict[str, str]


#: One attempt's exchange on a client: ``(client, request, api_key) -> events``.
Exchange = Callable[[httpx.AsyncClient, ProviderRequest, str | None], AsyncIterator[ProviderEvent]]


def provider_stream(
    options: HttpOptions,
    request: ProviderRequest,
    context: Mapping[str, Any] | None,
    exchange: Exchange,
) -> AsyncIterator[ProviderEvent]:
    """A provider's ``stream``: arguments of the wrong kind raise
    ``validation`` before any request; then ``exchange`` on the shared
    client (or one of its own), any ``Failed`` it raises its last event."""
    if not isinstance(request, ProviderRequest):
        raise Error(ErrorClass.VALIDATION, "stream needs a ProviderRequest")
    api_key = api_key_of(context)
    return _attempt(
        options.client, options.timeout, api_key, lambda c: exchange(c, request, api_key)
    )


def api_key_of(context: Mapping[str, Any] | None) -> str | None:
    """``provider_context["api_key"]``, checked to be a header value; raises
    ``validation`` (never quoting the key) for anything else."""
    if context is not None and not isinstance(context, Mapping):
        raise Error(ErrorClass.VALIDATION, "provider_context must be a mapping or None")
    api_key = None if context is None else context.get("api_key")
    if api_key is not None and (
        not isinstance(api_key, str) or not _HEADER_TEXT.fullmatch(api_key)
    ):
        raise Error(
            ErrorClass.VALIDATION,
            "provider_context api_key must be a non-empty str of printable ASCII"
            " (an HTTP header value)",
        )
    return api_key


async def _attempt(
    client: httpx.AsyncClient | None,
    timeout: float,
    api_key: str | None,
    events: Callable[[httpx.AsyncClient], AsyncIterator[ProviderEvent]],
) -> AsyncGenerator[ProviderEvent, None]:
    """The ``events`` of one attempt on ``client`` (or on one opened and
    closed for it); a ``Failed`` they raise ends them as ``ResponseFailed``
    with the key redacted from every text."""
    own = client is None
    if client is None:
        client = httpx.AsyncClient(timeout=timeout)
    try:
        try:
            async with aclosing(events(client)) as stream:  # type: ignore[type-var]
                async for event in stream:
                    yield event
        except Failed as failed:
            yield ResponseFailed(redact(failed.error, api_key))
    finally:
        if own:
            await client.aclose()


async def respond(
    client: httpx.AsyncClient, post: Post, decoder: Decoder
) -> AsyncGenerator[ProviderEvent, None]:
    """The response's events, streamed or (``streaming=False``) read whole,
    then its completion; raises ``Failed`` for a response that failed."""
    if not post.options.streaming:
        for event in decoder.whole(await _read_whole(client, post)):
            yield event
        return
    async with aclosing(_streamed(client, post, decoder)) as events:
        async for event in events:
            yield event


async def _streamed(
    client: httpx.AsyncClient, post: Post, decoder: Decoder
) -> AsyncGenerator[ProviderEvent, None]:
    options = post.options
    reader = StreamReader(decoder, options.tail_timeout)
    lost: Error | None = None
    headers = {**post.headers, "Accept": "text/event-stream", "Cache-Control": "no-store"}
    try:
        async with client.stream(
            "POST", options.url, json=post.body, headers=headers, timeout=options.timeout
        ) as response:
            await check_response(response, options.tail_timeout)
            async with aclosing(server_sent_events(response)) as sses:
                while (events := await reader.read(sses)) is not None:
                    for event in events:
                        yield event
                    reader.passed_on()
                if reader.done:
                    await abandon(sses)
    except httpx.TimeoutException as exc:
        lost = transport("provider request timed out", exc, "timeout")
    except httpx.HTTPError as exc:
        lost = transport("provider connection failed", exc, "connection")
    failure = reader.failed(lost)
    if failure is not None:
        raise Failed(failure)
    for event in decoder.finish():
        yield event


async def _read_whole(client: httpx.AsyncClient, post: Post) -> str:
    """The body of a non-streamed 200 response (``_MAX_BODY`` bytes at most);
    raises ``Failed`` for any other status, or a lost connection."""
    headers = {**post.headers, "Accept": "application/json"}
    try:
        options = post.options
        async with client.stream(
            "POST", options.url, json=post.body, headers=headers, timeout=options.timeout
        ) as response:
            data = bytearray()
            async for piece in response.aiter_bytes():
                data += piece
                if len(data) > _MAX_BODY:
                    raise Failed(malformed("response is too large", f"more than {_MAX_BODY} bytes"))
            text = data.decode("utf-8", "replace")
            if response.status_code != 200:
                retry_after = response.headers.get("retry-after")
                raise Failed(http_error(response.status_code, text, retry_after=retry_after))
    except httpx.TimeoutException as exc:
        raise Failed(transport("provider request timed out", exc, "timeout")) from None
    except httpx.HTTPError as exc:
        raise Failed(transport("provider connection failed", exc, "connection")) from None
    return text
