"""Provider events: what a provider adapter's ``stream`` yields."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol, final

import attrs

from ..errors import Error

__all__ = [
    "PROVIDER_EVENTS",
    "Provider",
    "ProviderEvent",
    "ProviderRequest",
    "ResponseCompleted",
    "ResponseFailed",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallCompleted",
    "ToolCallStarted",
    "Usage",
]


@final
@attrs.frozen
class TextDelta:
    text: str
    index: int = 0


@final
@attrs.frozen
class ThinkingDelta:
    text: str
    index: int = 0


@final
@attrs.frozen
class ToolCallStarted:
    tool_call_id: str
    name: str
    index: int = 0


@final
@attrs.frozen
class ToolCallArgumentsDelta:
    tool_call_id: str
    delta: str
    index: int = 0


@final
@attrs.frozen
class ToolCallCompleted:
    tool_call_id: str
    name: str
    arguments: Any


@final
@attrs.frozen
class Usage:
    """Provider usage, a mapping kept verbatim."""

    usage: Mapping[str, Any]


@final
@attrs.frozen
class ResponseCompleted:
    """The terminal event: ``message`` is ``{"role": "assistant", "content": ...}``;
    tool calls are content blocks ``{"type": "tool_call", "id", "name", "arguments"}``."""

    message: Mapping[str, Any]
    usage: Mapping[str, Any] | None = None


@final
@attrs.frozen
class ResponseFailed:
    error: Error


ProviderEvent = (
    TextDelta
    | ThinkingDelta
    | ToolCallStarted
    | ToolCallArgumentsDelta
    | ToolCallCompleted
    | Usage
    | ResponseCompleted
    | ResponseFailed
)
PROVIDER_EVENTS = (
    TextDelta,
    ThinkingDelta,
    ToolCallStarted,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    Usage,
    ResponseCompleted,
    ResponseFailed,
)


@final
@attrs.frozen
class ProviderRequest:
    """What a provider attempt is asked; no trusted context inside."""

    run_id: str
    incarnation: int
    turn_id: str
    step_id: str
    attempt_id: str
    #: the transcript, frozen (a ``list`` subclass of frozen mappings)
    messages: Sequence[Any]
    catalog_revision: int
    tools: tuple[Any, ...]


class Provider(Protocol):
    """A model provider: ``stream(request, context)`` gives an async iterator
    of the normalized events of one attempt (``ResponseCompleted`` or
    ``ResponseFailed`` last).  ``context`` is the host's trusted
    ``provider_context`` (credentials); it never reaches the store."""

    def stream(
        self, request: ProviderRequest, context: Mapping[str, Any] | None
    ) -> AsyncIterator[ProviderEvent]: ...
