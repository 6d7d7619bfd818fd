"""What a host hands a conversation as a message, checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Error, ErrorClass
from ..kernel import freeze

__all__ = ["check_content", "check_user_message"]


def check_user_message(message: Any) -> Any:
    """``message`` if it is a user message whose content a prompt may hold."""
    if not isinstance(message, Mapping) or message.get("role") != "user":
        raise Error(ErrorClass.VALIDATION, "not a user message")
    check_content(message.get("content"))
    return message


def check_content(content: Any) -> Any:
    if isinstance(content, str):
        if not content:
            raise Error(ErrorClass.VALIDATION, "prompt must not be empty")
        return freeze(content, "message content")  # Unicode text: no lone surrogate
    if isinstance(content, list | tuple):
        if not content:
            raise Error(ErrorClass.VALIDATION, "prompt must not be empty")
        if not all(isinstance(block, Mapping) for block in content):
            raise Error(ErrorClass.VALIDATION, "content must be text or content blocks")
        return freeze(list(content), "message content")
    raise Error(ErrorClass.VALIDATION, "content must be text or content blocks")
