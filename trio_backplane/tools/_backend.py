"""A backend made of one coroutine function."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, final

import attrs

from ._results import Rejection, ToolResult

__all__ = ["FunctionBackend"]


@final
@attrs.frozen
class FunctionBackend:
    """A tool backend whose ``execute`` is the given coroutine function."""

    execute: Callable[[Any], Awaitable[ToolResult | Rejection]]
