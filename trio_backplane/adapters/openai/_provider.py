"""The provider: one streamed ``POST /chat/completions`` per attempt."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, final

import httpx

from ...errors import Error, ErrorClass
from ...runtime import ProviderEvent, ProviderRequest
from .._http._aliases import ToolAliases
from .._http._exchange import Post, api_key_of, attempt, streamed
from .._http._options import check_options
from ._plain import plain_exchange
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
        check_options(
            base_url=base_url,
            model=model,
            timeouts={"timeout": timeout, "tail_timeout": tail_timeout},
            system=system,
            extra_body=extra_body,
            client=client,
        )
        if type(streaming) is not bool:
            raise Error(ErrorClass.VALIDATION, "streaming must be a bool")
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
        api_key = api_key_of(context)
        return attempt(
            self._client,
            self.timeout,
            api_key,
            lambda client: self._events(client, request, api_key),
        )

    async def _events(
        self, client: httpx.AsyncClient, request: ProviderRequest, api_key: str | None
    ) -> AsyncGenerator[ProviderEvent, None]:
        aliases = ToolAliases(tool.name for tool in request.tools)
        headers = {"Content-Type": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        post = Post(
            url=self.url,
            body=self.body(request, aliases),
            headers=headers,
            timeout=self.timeout,
            tail_timeout=self.tail_timeout,
        )
        builder = ResponseBuilder(aliases, request)
        if not self.streaming:
            for event in await plain_exchange(client, post, builder):
                yield event
            return
        async with aclosing(streamed(client, post, ChunkDecoder(builder))) as events:
            async for event in events:
                yield event
