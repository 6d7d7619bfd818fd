"""A user message's content blocks as both providers take them: text, and
images as MCP gives them (``{"type": "image", "data": <base64>,
"mimeType": ...}``).  A block of any other kind is refused, never dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...errors import Error, ErrorClass

__all__ = ["IMAGE_TYPES", "image_of", "left_out", "unsendable"]

#: The image types both APIs take (a data URL of any other would be malformed).
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def image_of(block: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(media type, base64 data)`` of an image block of a type both APIs
    take (:data:`IMAGE_TYPES`); ``None`` for any other block."""
    data, media = block.get("data"), block.get("mimeType")
    if block.get("type") != "image" or not isinstance(data, str) or not isinstance(media, str):
        return None
    return (media, data) if data and media in IMAGE_TYPES else None


def left_out(images: int, why: str) -> dict[str, str]:
    """The text block a request carries in place of ``images`` a tool
    returned that the API cannot take: the model knows they were there."""
    return {"type": "text", "text": f"[{images} image(s) of the tool result left out: {why}]"}


def unsendable(block: Mapping[str, Any], provider: str) -> Error:
    """The refusal of a user content block ``provider`` cannot take: the
    attempt fails, classed, rather than send the message without it."""
    return Error(
        ErrorClass.UNSUPPORTED_CAPABILITY,
        f"a user content block {provider} cannot take: only text and PNG, JPEG, GIF or WebP images",
        {"type": repr(block.get("type"))[:100]},
    )
