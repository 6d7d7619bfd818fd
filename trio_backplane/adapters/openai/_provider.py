"""The provider: one streamed ``POST /chat/completions`` per attempt."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, final

import httpx

from ...runtime import ProviderEvent, ProviderRequest
from .._http._aliases import ToolAliases
from .._http._exchange import Post, provider_stream, respond
from .._http._options import http_options
from ._response import ResponseBuilder
from ._stream import ChunkDecoder
from ._transcript import transcript_messages

__all__ = ["OpenAIProvider"]


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
        self.options = http_options(
            base_url=base_url,
            path="/chat/completions",
            model=model,
            client=client,
            timeout=timeout,
            tail_timeout=tail_timeout,
            system=system,
            extra_body=extra_body,
            streaming=streaming,
        )

    def __repr__(self) -> str:
        return f"OpenAIProvider({self.options.url!r}, {self.options.model!r})"

    def body(self, request: ProviderRequest, aliases: ToolAliases) -> dict[str, Any]:
        """The chat-completions request body for ``request`` (no credentials inside)."""
        options = self.options
        messages = transcript_messages(request.messages, aliases)
        if options.system:
            messages.insert(0, {"role": "system", "content": options.system})
        body: dict[str, Any] = {
            **options.extra_body,
            "model": options.model,
            "messages": messages,
            "stream": options.streaming,
        }
        if options.streaming:
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
        return provider_stream(self.options, request, context, self._exchange)

    async def _exchange(
        self, client: httpx.AsyncClient, request: ProviderRequest, api_key: str | None
    ) -> AsyncGenerator[ProviderEvent, None]:
        aliases = ToolAliases(tool.name for tool in request.tools)
        headers = {"Content-Type": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        post = Post(options=self.options, body=self.body(request, aliases), headers=headers)
        decoder = ChunkDecoder(ResponseBuilder(aliases, request))
        async with aclosing(respond(client, post, decoder)) as events:
            async for event in events:
                yield event
