"""Our transcript as chat-completions messages."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .._http._aliases import ToolAliases
from .._http._content import image_of, left_out, unsendable

__all__ = ["transcript_messages"]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        parts = [
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        ]
        return "".join(parts)
    return ""


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return [_user_part(block) for block in content if isinstance(block, Mapping)]
    return str(content)


def _user_part(block: Mapping[str, Any]) -> dict[str, Any]:
    """A text part, or an image as a data URL; ``unsupported_capability``
    for any other block."""
    if block.get("type") == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    image = image_of(block)
    if image is None:
        raise unsendable(block, "an OpenAI-compatible chat API")
    return {"type": "image_url", "image_url": {"url": f"data:{image[0]};base64,{image[1]}"}}


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def _tool_content(result: Any) -> str:
    """The result's text (its structured content as JSON when it has none),
    and a note of the images it held: a ``tool`` message carries text only."""
    if not isinstance(result, Mapping):
        return json.dumps(result, ensure_ascii=False)
    content = result.get("content")
    text = _text_of(content)
    if not text and result.get("structured_content") is not None:
        text = json.dumps(result["structured_content"], ensure_ascii=False)
    images = sum(
        1
        for block in (content if isinstance(content, list | tuple) else ())
        if isinstance(block, Mapping) and block.get("type") == "image"
    )
    if images:
        note = left_out(images, "a tool message of this API carries text only")["text"]
        text = f"{text}\n{note}" if text else note
    return text


def _assistant_message(content: Any, aliases: ToolAliases) -> dict[str, Any]:
    """An assistant message: its text, and its ``tool_call`` blocks as ``tool_calls``."""
    calls = []
    if isinstance(content, list | tuple):
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_call":
                calls.append(
                    {
                        "id": str(block.get("id")),
                        "type": "function",
                        "function": {
                            "name": aliases.alias(str(block.get("name"))),
                            "arguments": _arguments_text(block.get("arguments")),
                        },
                    }
                )
    # no text and no calls: "" (a null content needs tool_calls beside it)
    text = _text_of(content)
    entry: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        entry["tool_calls"] = calls
    return entry


def transcript_messages(messages: Iterable[Any], aliases: ToolAliases) -> list[dict[str, Any]]:
    """Our transcript as chat-completions messages (tool names aliased).

    A tool message's content is its result's text, or its
    ``structured_content`` as JSON when it has no text.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "user":
            out.append({"role": "user", "content": _user_content(message.get("content"))})
        elif role == "system":
            out.append({"role": "system", "content": _text_of(message.get("content"))})
        elif role == "assistant":
            out.append(_assistant_message(message.get("content"), aliases))
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(message.get("tool_call_id")),
                    "content": _tool_content(message.get("result")),
                }
            )
    return out
