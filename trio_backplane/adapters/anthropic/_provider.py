"""The provider: one streamed ``POST /v1/messages`` per attempt."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any, Final, final

import httpx

from ...errors import Error, ErrorClass
from ...runtime import ProviderEvent, ProviderRequest
from .._http._aliases import ToolAliases
from .._http._errors import Failed
from .._http._exchange import Post, provider_stream, respond
from .._http._options import http_options
from ._stream import MessageDecoder
from ._transcript import messages_of

__all__ = ["ANTHROPIC_VERSION", "AnthropicProvider"]

#: The ``anthropic-version`` header sent unless another is given.
ANTHROPIC_VERSION: Final = "2023-06-01"
#: How many times one response may be paused (``pause_turn``) and continued.
PAUSES: Final = 8


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
        self.options = http_options(
            base_url=base_url,
            path="/v1/messages",
            model=model,
            client=client,
            timeout=timeout,
            tail_timeout=tail_timeout,
            system=system,
            extra_body=extra_body,
            streaming=streaming,
        )
        if type(max_tokens) is not int or max_tokens < 1:
            raise Error(ErrorClass.VALIDATION, "max_tokens must be a positive int")
        if not isinstance(version, str) or not version.isascii() or not version:
            raise Error(ErrorClass.VALIDATION, "version must be a non-empty ASCII str")
        self.max_tokens = max_tokens
        self.version = version

    def __repr__(self) -> str:
        return f"AnthropicProvider({self.options.model!r}, url={self.options.url!r})"

    def body(self, request: ProviderRequest, aliases: ToolAliases) -> dict[str, Any]:
        """The Messages request body for ``request`` (no credentials inside)."""
        options = self.options
        system, messages = messages_of(request.messages, aliases)
        if options.system:
            system.insert(0, options.system)
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            **options.extra_body,
            "model": options.model,
            "messages": messages,
            "stream": options.streaming,
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
        tools = [*options.extra_body.get("tools", ()), *ours]
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
        return provider_stream(self.options, request, context, self._exchange)

    async def _exchange(
        self, client: httpx.AsyncClient, request: ProviderRequest, api_key: str | None
    ) -> AsyncGenerator[ProviderEvent, None]:
        aliases = ToolAliases(tool.name for tool in request.tools)
        headers = {"Content-Type": "application/json", "anthropic-version": self.version}
        if api_key is not None:
            headers["x-api-key"] = api_key
        body = self.body(request, aliases)
        sent = body["messages"]
        decoder = MessageDecoder(aliases, request)
        for _ in range(PAUSES + 1):
            post = Post(options=self.options, body=body, headers=headers)
            async with aclosing(respond(client, post, decoder)) as events:
                async for event in events:
                    yield event
            if not decoder.paused:
                return
            # A long turn the API paused (``pause_turn``) goes on when it is
            # sent back: one response, its blocks and usage joined.
            # (the turn so far, every message of it: never one message a pause)
            body = {**body, "messages": [*sent, decoder.paused_turn()]}
            decoder.resume()
        raise Failed(
            Error(
                ErrorClass.BUDGET_EXCEEDED,
                f"provider paused its turn more than {PAUSES} times",
                {"reason": "finish_pause_turn", "finish_reason": "pause_turn"},
            )
        )
