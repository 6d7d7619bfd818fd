"""The ``mcp`` extra's imports, in one place: whichever module of the adapter
is imported first, a missing extra is reported by name."""

from __future__ import annotations

from .. import _missing_extra

try:
    import anyio
    import mcp.types as mcp_types
    import pydantic
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.shared.dispatcher import CallOptions
    from mcp.shared.exceptions import MCPError
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
except ModuleNotFoundError as _missing:  # pragma: no cover - depends on the install
    raise _missing_extra("mcp", _missing) from _missing

__all__ = [
    "CallOptions",
    "ClientSession",
    "JSONRPCDispatcher",
    "MCPError",
    "StdioServerParameters",
    "anyio",
    "mcp_types",
    "pydantic",
    "stdio_client",
]
