"""A user message's content blocks as both providers take them: text, and
images as MCP gives them (``{"type": "image", "data": <base64>,
"mimeType": ...}``).  A block of any other kind is refused, never dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import Error, ErrorClass

__all__ = ["image_of", "unsendable"]


def image_of(block: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(media type, base64 data)`` of an image block; ``None`` for any other."""
    data, media = block.get("data"), block.get("mimeType")
    if block.get("type") != "image" or not isinstance(data, str) or not isinstance(media, str):
        return None
    return (media, data) if data and media else None


def unsendable(block: Mapping[str, Any], provider: str) -> Error:
    """The refusal of a user content block ``provider`` cannot take: the
    attempt fails, classed, rather than send the message without it."""
    return Error(
        ErrorClass.UNSUPPORTED_CAPABILITY,
        f"a user content block {provider} cannot take: only text and images",
        {"type": repr(block.get("type"))[:100]},
    )
