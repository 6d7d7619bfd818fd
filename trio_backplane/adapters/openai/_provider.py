"""The provider: one streamed ``POST /chat/completions`` per attempt."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, Final, final

from ..._numbers import is_seconds
from ...errors import Error, ErrorClass
from ...kernel import check_json
from ...runtime import ProviderEvent, ProviderRequest, ResponseFailed
from ._aliases import ToolAliases
from ._errors import Failed, redact, transport
from ._httpx import httpx
from ._plain import plain_exchange
from ._response import ResponseBuilder
from ._sse import abandon, server_sent_events
from ._stream import StreamReader, check_response
from ._transcript import transcript_messages

__all__ = ["OpenAIProvider"]

#: What a bearer token may hold: printable ASCII, no spaces at its ends (a
#: pasted curly quote or a newline would fail inside httpx, unclassed).
_HEADER_TEXT: Final = re.compile(r"[!-~](?:[ -~]*[!-~])?")


@final
class OpenAIProvider:
    """A streaming chat-completions provider for any OpenAI-compatible endpoint.

    ``base_url`` is the API root (``https://api.openai.com/v1``);
    ``client`` an ``httpx.AsyncClient`` to share (otherwise one is opened and
    closed per attempt); ``timeout`` bounds connecting and each read, in
    seconds; ``tail_timeout`` how long, after a finish reason, the rest of
    the response may take (a server that keeps the connection open without
    ``[DONE]`` then costs this, not a read timeout); ``system`` an optional
    system prompt; ``extra_body`` fields merged into every request body
    (``temperature``, ...).  The API key is read from
    ``provider_context["api_key"]`` and sent only as the ``Authorization``
    header.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout: float = 60.0,
        tail_timeout: float = 2.0,
        system: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
        streaming: bool = True,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise Error(ErrorClass.VALIDATION, "base_url must be an http(s) URL")
        if not isinstance(model, str) or not model:
            raise Error(ErrorClass.VALIDATION, "model must be a non-empty str")
        for name, seconds in (("timeout", timeout), ("tail_timeout", tail_timeout)):
            if not is_seconds(seconds):
                raise Error(ErrorClass.VALIDATION, f"{name} must be a positive number")
        if system is not None and type(system) is not str:
            raise Error(ErrorClass.VALIDATION, "system must be a str or None")
        if extra_body is not None:
            if not isinstance(extra_body, Mapping):
                raise Error(ErrorClass.VALIDATION, "extra_body must be a mapping or None")
            check_json(dict(extra_body), "extra_body")
        if type(streaming) is not bool:
            raise Error(ErrorClass.VALIDATION, "streaming must be a bool")
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise Error(ErrorClass.VALIDATION, "client must be an httpx.AsyncClient or None")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout = float(timeout)
        self.tail_timeout = float(tail_timeout)
        self.system = system
        self.extra_body = dict(extra_body or {})
        self.streaming = streaming
        self._client = client

    def __repr__(self) -> str:
        return f"OpenAIProvider({self.url!r}, {self.model!r})"

    def body(self, request: ProviderRequest, aliases: ToolAliases) -> dict[str, Any]:
        """The chat-completions request body for ``request`` (no credentials inside)."""
        messages = transcript_messages(request.messages, aliases)
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        body: dict[str, Any] = {
            **self.extra_body,
            "model": self.model,
            "messages": messages,
            "stream": self.streaming,
        }
        if self.streaming:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": aliases.alias(tool.name),
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        return body

    def stream(
        self, request: ProviderRequest, context: Mapping[str, Any] | None
    ) -> AsyncIterator[ProviderEvent]:
        """The attempt's events, ending in one ``ResponseCompleted`` or
        ``ResponseFailed``; raises ``validation`` before any request for
        arguments of the wrong kind."""
        if not isinstance(request, ProviderRequest):
            raise Error(ErrorClass.VALIDATION, "stream needs a ProviderRequest")
        if context is not None and not isinstance(context, Mapping):
            raise Error(ErrorClass.VALIDATION, "provider_context must be a mapping or None")
        api_key = None if context is None else context.get("api_key")
        if api_key is not None and (
            not isinstance(api_key, str) or not _HEADER_TEXT.fullmatch(api_key)
        ):
            # Never quoted: the key itself stays out of every error text.
            raise Error(
                ErrorClass.VALIDATION,
                "provider_context api_key must be a non-empty str of printable ASCII"
                " (an HTTP header value)",
            )
        return self._events(request, api_key)

    async def _events(
        self, request: ProviderRequest, api_key: str | None
    ) -> AsyncIterator[ProviderEvent]:
        aliases = ToolAliases(tool.name for tool in request.tools)
        body = self.body(request, aliases)
        headers = {"Content-Type": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        client = self._client
        own = client is None
        if client is None:
            client = httpx.AsyncClient(timeout=self.timeout)
        builder = ResponseBuilder(aliases, request)
        try:
            try:
                if not self.streaming:
                    exchange = (body, headers, self.timeout)
                    for event in await plain_exchange(client, self.url, exchange, builder):
                        yield event
                    return
                async with aclosing(self._exchange(client, body, headers, builder)) as events:
                    async for event in events:
                        yield event
            except Failed as failed:
                yield ResponseFailed(redact(failed.error, api_key))
        finally:
            if own:
                await client.aclose()

    async def _exchange(
        self,
        client: httpx.AsyncClient,
        body: dict[str, Any],
        headers: dict[str, str],
        builder: ResponseBuilder,
    ) -> AsyncGenerator[ProviderEvent, None]:
        """The response's events as they stream, then its completion; raises
        ``Failed`` for a response that failed."""
        reader = StreamReader(builder, self.tail_timeout)
        lost: Error | None = None
        stream_headers = {**headers, "Accept": "text/event-stream", "Cache-Control": "no-store"}
        try:
            async with client.stream(
                "POST", self.url, json=body, headers=stream_headers, timeout=self.timeout
            ) as response:
                await check_response(response, self.tail_timeout)
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
        for event in builder.finish():
            yield event
