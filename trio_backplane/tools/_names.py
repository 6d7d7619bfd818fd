"""The tool-name rule shared by descriptors, provider tools and approvals."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Final

from ..errors import Error, ErrorClass

__all__ = ["MAX_NAME_LENGTH", "is_mcp_name", "check_name"]

#: The longest tool name accepted.
MAX_NAME_LENGTH: Final = 128

#: MCP's advisory character set: a warning, never a refusal.
_MCP_NAME: Final = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def is_mcp_name(name: str) -> bool:
    """Whether ``name`` stays inside MCP's advisory ``[A-Za-z0-9_.-]`` set."""
    return _MCP_NAME.fullmatch(name) is not None


def _bad(name: Any, why: str) -> Error:
    label = name if isinstance(name, str) else f"<{type(name).__name__}>"
    return Error(
        ErrorClass.VALIDATION,
        f"invalid tool name {label!r}: {why}",
        {"reason": "invalid_tool_name", "tool": label},
    )


def check_name(name: Any) -> str:
    """Return ``name`` if it is a valid tool name, else raise ``validation``."""
    if type(name) is not str:
        raise _bad(name, "a tool name must be a str")
    if not name:
        raise _bad(name, "a tool name must not be empty")
    if len(name) > MAX_NAME_LENGTH:
        raise _bad(name[:MAX_NAME_LENGTH] + "...", f"longer than {MAX_NAME_LENGTH} characters")
    for char in name:
        if char.isspace() or unicodedata.category(char) in {"Cc", "Cf", "Cs", "Zl", "Zp", "Zs"}:
            raise _bad(
                name, "a tool name must not contain whitespace, control characters or surrogates"
            )
    return name


def check_name_validator(instance: Any, attribute: Any, value: Any) -> None:
    """An attrs validator form of :func:`check_name`."""
    check_name(value)
