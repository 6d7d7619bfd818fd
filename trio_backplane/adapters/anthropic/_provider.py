"""The provider: one streamed ``POST /v1/messages`` per attempt."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, Final, final

import httpx

from ...errors import Error, ErrorClass
from ...runtime import ProviderEvent, ProviderRequest
from .._http._aliases import ToolAliases
from .._http._errors import Failed, malformed
from .._http._exchange import Post, api_key_of, attempt, read_whole, streamed
from .._http._options import check_options
from .._http._text import strict_loads
from ._stream import MessageDecoder
from ._transcript import messages_of

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider"]

#: The ``anthropic-version`` header sent unless another is given.
ANTHROPIC_VERSION: Final = "2023-06-01"


@final
class AnthropicProvider:
    """A streaming provider for Anthropic's Messages API.

    ``model`` names the model; ``max_tokens`` bounds each response (the API
    requires it; a response that reaches it fails as ``budget_exceeded``);
    ``base_url`` is the API root; ``client`` an ``httpx.AsyncClient`` to
    share (otherwise one is opened and closed per attempt); ``timeout``
    bounds connecting and each read, in seconds; ``tail_timeout`` how long,
    after the stop reason, the rest may take; ``system`` the system prompt
    (system messages of the transcript are joined after it);
    ``extra_body`` fields merged into every request body (``thinking``,
    ``temperature``, ``tool_choice``, ...); ``version`` the
    ``anthropic-version`` header; ``streaming=False`` asks for one JSON
    message instead of a stream (the same events come of it).  The API key is read from
    ``provider_context["api_key"]`` and sent only as the ``x-api-key``
    header.
    """

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int = 4096,
        base_url: str = "https://api.anthropic.com",
        client: httpx.AsyncClient | None = None,
        timeout: float = 60.0,
        tail_timeout: float = 2.0,
        system: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
        version: str = ANTHROPIC_VERSION,
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
        if type(max_tokens) is not int or max_tokens < 1:
            raise Error(ErrorClass.VALIDATION, "max_tokens must be a positive int")
        if not isinstance(version, str) or not version.isascii() or not version:
            raise Error(ErrorClass.VALIDATION, "version must be a non-empty ASCII str")
        if type(streaming) is not bool:
            raise Error(ErrorClass.VALIDATION, "streaming must be a bool")
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.model = model
        self.max_tokens = max_tokens
        self.timeout = float(timeout)
        self.tail_timeout = float(tail_timeout)
        self.system = system
        self.extra_body = dict(extra_body or {})
        self.version = version
        self.streaming = streaming
        self._client = client

    def __repr__(self) -> str:
        return f"AnthropicProvider({self.model!r}, base_url={self.url!r})"

    def body(self, request: ProviderRequest, aliases: ToolAliases) -> dict[str, Any]:
        """The Messages request body for ``request`` (no credentials inside)."""
        system, messages = messages_of(request.messages, aliases)
        if self.system:
            system.insert(0, self.system)
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            **self.extra_body,
            "model": self.model,
            "messages": messages,
            "stream": self.streaming,
        }
        if system:
            body["system"] = "\n\n".join(system)
        ours = [
            {
                "name": aliases.alias(tool.name),
                "description": tool.description,
                "input_schema": tool.parameters,
            }
            for tool in request.tools
        ]
        # the API's own server tools, given in extra_body, go beside ours
        tools = [*self.extra_body.get("tools", ()), *ours]
        if tools:
            body["tools"] = tools
        else:
            body.pop("tool_choice", None)  # the API refuses a choice among no tools
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
        events = lambda client: self._events(client, request, api_key)  # noqa: E731
        return attempt(self._client, self.timeout, api_key, events)

    async def _events(
        self, client: httpx.AsyncClient, request: ProviderRequest, api_key: str | None
    ) -> AsyncGenerator[ProviderEvent, None]:
        aliases = ToolAliases(tool.name for tool in request.tools)
        headers = {"Content-Type": "application/json", "anthropic-version": self.version}
        if api_key is not None:
            headers["x-api-key"] = api_key
        post = Post(
            url=self.url,
            body=self.body(request, aliases),
            headers=headers,
            timeout=self.timeout,
            tail_timeout=self.tail_timeout,
        )
        decoder = MessageDecoder(aliases, request)
        if not self.streaming:
            text = await read_whole(client, post)
            try:
                message = strict_loads(text)
            except (ValueError, RecursionError):
                raise Failed(malformed("response is not JSON", text[:200])) from None
            for event in decoder.whole(message):
                yield event
            return
        async with aclosing(streamed(client, post, decoder)) as events:
            async for event in events:
                yield event
