"""The Conversation engine on Trio: the only layer that knows about Trio."""

from .._public import fixup_module_metadata
from ._context import ToolContext, ToolOperation
from ._conversation import Conversation, open_conversation
from ._deadline import DeadlineBudget
from ._provider import (
    Provider,
    ProviderEvent,
    ProviderRequest,
    ResponseCompleted,
    ResponseFailed,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
)
from ._telemetry import Telemetry
from ._types import Continue, Event, HookContext, Hooks, Phase, ResourceCleanup, Snapshot

__all__ = [
    "Continue",
    "Conversation",
    "DeadlineBudget",
    "Event",
    "HookContext",
    "Hooks",
    "Phase",
    "Provider",
    "ProviderEvent",
    "ProviderRequest",
    "ResourceCleanup",
    "ResponseCompleted",
    "ResponseFailed",
    "Snapshot",
    "Telemetry",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallCompleted",
    "ToolCallStarted",
    "ToolContext",
    "ToolOperation",
    "Usage",
    "open_conversation",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
