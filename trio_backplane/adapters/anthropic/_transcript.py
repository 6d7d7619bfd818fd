"""Our transcript as Messages API messages: the system prompt apart, tool
results as ``tool_result`` blocks of a user turn, thinking sent back as the
API gave it, consecutive turns of one role joined."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...kernel import thaw
from .._http._aliases import ToolAliases
from .._http._content import image_of, left_out, unsendable

__all__ = ["messages_of"]


def messages_of(
    transcript: Iterable[Any], aliases: ToolAliases
) -> tuple[list[str], list[dict[str, Any]]]:
    """``(system texts, messages)`` of ``transcript`` (tool names aliased).

    An assistant message with nothing to send (an empty answer) is left
    out: the API refuses empty content, and the user turns around it join.
    A thinking block without its signature (another provider's reasoning)
    is not sent: the API would refuse it.
    """
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in transcript:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "system":
            text = _text_of(message.get("content"))
            if text:
                system.append(text)
            continue
        if role == "user":
            blocks = _user_blocks(message.get("content"))
        elif role == "tool":
            blocks = [_tool_result(message)]
        elif role == "assistant":
            blocks = _assistant_blocks(message.get("content"), aliases)
        else:
            continue
        if not blocks:
            continue
        turn = "assistant" if role == "assistant" else "user"
        if out and out[-1]["role"] == turn:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": turn, "content": blocks})
    return system, out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return "".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        )
    return ""


def _mappings(content: Any) -> Iterator[Mapping[str, Any]]:
    """The blocks of a message's content list (a str has none)."""
    for block in content if isinstance(content, list | tuple) else ():
        if isinstance(block, Mapping):
            yield block


def _image(media: str, data: str) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    """Text and image blocks; ``unsupported_capability`` for any other."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for block in _mappings(content):
        image = image_of(block)
        if block.get("type") == "text":
            if block.get("text"):
                blocks.append({"type": "text", "text": str(block["text"])})
        elif image is not None:
            blocks.append(_image(*image))
        else:
            raise unsendable(block, "the Anthropic Messages API")
    return blocks


def _assistant_blocks(content: Any, aliases: ToolAliases) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for block in _mappings(content):
        kind = block.get("type")
        if kind == "tool_call":
            arguments = block.get("arguments")
            blocks.append(
                {
                    "type": "tool_use",
                    "id": str(block.get("id")),
                    "name": aliases.alias(str(block.get("name"))),
                    # the API takes an object only: arguments that were not
                    # one were refused, and the refusal says what was sent
                    "input": dict(arguments) if isinstance(arguments, Mapping) else {},
                }
            )
        elif kind == "text":
            if block.get("text"):
                blocks.append({"type": "text", "text": str(block["text"])})
        elif kind == "thinking":
            if block.get("signature"):
                blocks.append(_plain(block))
        elif kind is not None:
            # redacted thinking and the API's own blocks, back as they came
            blocks.append(_plain(block))
    return blocks


def _plain(block: Mapping[str, Any]) -> dict[str, Any]:
    """A block as the API gave it (the runtime keeps it frozen)."""
    return dict(thaw(block))


def _tool_result(message: Mapping[str, Any]) -> dict[str, Any]:
    """A tool message as a ``tool_result`` block: its text and image blocks,
    or its ``structured_content`` as JSON when it has no text."""
    result = message.get("result")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id"))}
    if not isinstance(result, Mapping):
        block["content"] = json.dumps(thaw(result), ensure_ascii=False)
        return block
    parts: list[dict[str, Any]] = []
    content = result.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    unsent = 0
    for item in _mappings(content):
        image = image_of(item)
        if item.get("type") == "text" and item.get("text"):
            parts.append({"type": "text", "text": str(item["text"])})
        elif image is not None:
            parts.append(_image(*image))
        elif item.get("type") == "image":
            unsent += 1
    if unsent:
        parts.append(left_out(unsent, "only PNG, JPEG, GIF and WebP images are sent"))
    if not parts and result.get("structured_content") is not None:
        text = json.dumps(thaw(result["structured_content"]), ensure_ascii=False)
        parts.append({"type": "text", "text": text})
    if result.get("is_error"):
        block["is_error"] = True
        if not parts:  # the API refuses an error result without content
            failure = result.get("error")
            said = failure.get("message") if isinstance(failure, Mapping) else None
            parts.append({"type": "text", "text": str(said or "the tool failed")})
    block["content"] = parts
    return block
