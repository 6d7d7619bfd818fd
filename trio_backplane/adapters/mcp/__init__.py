"""MCP servers as tool sources, on the official ``mcp`` SDK.

A :class:`McpToolSource` lists a server's tools, refuses the unsafe ones and
exposes the rest as :class:`~trio_backplane.tools.ToolDescriptor` records whose
backend calls the server::

    async with connect_stdio(sys.executable, ["server.py"]) as source:
        bundle = source.admit(caller="host", run_id="run-1")
        async with open_conversation("run-1", registry=bundle.registry,
                                     authority=bundle.authority, ...) as conversation:
            ...

:class:`McpCatalog` is the checking core on its own, without I/O.  Needs the
``mcp`` extra; the guide is ``docs/guides/mcp.rst``.
"""

from ..._public import fixup_module_metadata
from ._catalog import McpCatalog, McpTool
from ._connect import connect_stdio, connect_streamable_http
from ._source import McpRefreshTool, McpToolBackend, McpToolSource
from ._validators import (
    CACHE_SIZE,
    MCP_SCHEMA_OPTIONS,
    BoundaryValidator,
    SchemaValidator,
    ValidatorCache,
    tool_fingerprint,
)

__all__ = [
    "CACHE_SIZE",
    "MCP_SCHEMA_OPTIONS",
    "BoundaryValidator",
    "McpCatalog",
    "McpRefreshTool",
    "McpTool",
    "McpToolBackend",
    "McpToolSource",
    "SchemaValidator",
    "ValidatorCache",
    "connect_stdio",
    "connect_streamable_http",
    "tool_fingerprint",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
