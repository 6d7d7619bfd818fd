"""Reading a tools file: a JSON array of ``{name, inputSchema}`` records or an
MCP ``tools/list`` result."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from importlib import resources
from typing import Any

from ..errors import Error, ErrorClass


def example_text() -> str:
    """The example catalog shipped in the package."""
    return resources.files("trio_backplane").joinpath("examples/tools.json").read_text("utf-8")


def read_text(path: str) -> str:
    """The text of ``path``, or of standard input for ``-``."""
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_tools(data: Any) -> list[dict[str, Any]]:
    """The tool records of a catalog file: an array, ``{"tools": [...]}`` or a
    JSON-RPC response whose ``result`` is one."""
    if isinstance(data, dict) and isinstance(data.get("result"), dict):
        data = data["result"]
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise Error(
            ErrorClass.VALIDATION,
            "a tools file is a JSON array of {name, inputSchema} objects "
            "or an MCP tools/list result",
        )
    return data


def tools_from(read: Callable[[], str]) -> list[Any] | None:
    """The tool definitions of the text ``read`` gives, or ``None`` once
    the reason they cannot be read is on stderr (exit status 2)."""
    try:
        tools: list[Any] = load_tools(json.loads(read()))
    except RecursionError:
        why = "JSON nested too deeply"
    except (OSError, ValueError, Error) as exc:
        why = str(exc)
    else:
        return tools
    print(f"backplane: cannot read tools: {why}", file=sys.stderr)
    return None
