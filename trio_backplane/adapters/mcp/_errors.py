"""What the SDK and the transport raise, as classed errors."""

from __future__ import annotations

from typing import Any, Final

from ...errors import Error, ErrorClass
from ._sdk import MCPError, mcp_types

__all__ = [
    "MAX_CAUSE",
    "NOT_SENT",
    "Unparsed",
    "initialize_error",
    "mcp_error",
    "not_sent",
    "transport_error",
]

#: The most of a cause or a server's message an error's details keep.
MAX_CAUSE: Final = 500
#: What the SDK itself says (code -32000, no data) when a connection is lost,
#: over stdio or streamable HTTP (a request whose response can never arrive).
_SDK_CONNECTION_CLOSED: Final = frozenset(
    {
        "Connection closed",
        "SSE stream ended without a response",
        "SSE stream ended and reconnection attempts were exhausted",
    }
)
_SDK_STREAM_FAILED: Final = "SSE stream failed: "
#: What the SDK's HTTP client makes of an answer that is no JSON-RPC at all
#: (an HTTP error status with another body): ``(code, message)``.
_SDK_HTTP_STAND_INS: Final = frozenset(
    {
        (mcp_types.INTERNAL_ERROR, "Server returned an error response"),
        (mcp_types.METHOD_NOT_FOUND, "Not Found"),
    }
)


class Unparsed:
    """The ``data`` of the error a request fails with when its response
    arrived but could not be parsed: no server can send this object."""

    __slots__ = ("cause",)

    def __init__(self, cause: str) -> None:
        self.cause = cause


class _NotSent:
    """The ``data`` of a "Connection closed" for a request never written."""

    __slots__ = ()


NOT_SENT: Final = _NotSent()


def not_sent(error: Error) -> bool:
    """Whether ``error`` is a call the adapter knows it never sent."""
    return error.details.get("certainty") == "not_sent"


def mcp_error(method: str, exc: MCPError, *, tool: str | None) -> Error:
    """The classed error of a JSON-RPC error; uncertain for a ``tool`` call
    unless it was never sent."""
    if exc.data is NOT_SENT:
        unsent = {"method": method, "reason": "connection_closed", "certainty": "not_sent"}
        if tool is not None:
            unsent["tool"] = tool
        return Error(
            ErrorClass.TRANSIENT_TRANSPORT,
            f"MCP connection is closed: {method} was not sent",
            unsent,
        )
    details: dict[str, Any] = {
        "method": method,
        "code": exc.code,
        "server_message": str(exc.message)[:MAX_CAUSE],
    }
    if tool is not None:
        details["tool"] = tool
        details["certainty"] = "uncertain"
    if isinstance(exc.data, Unparsed):
        del details["code"], details["server_message"]
        details["reason"] = "unparseable_response"
        details["cause"] = exc.data.cause
        return Error(
            ErrorClass.MALFORMED_RESULT,
            f"MCP server sent a {method} response that is not valid JSON-RPC",
            details,
        )
    if exc.code == mcp_types.REQUEST_TIMEOUT:
        return Error(ErrorClass.TIMEOUT, f"MCP {method} timed out", details)
    if _connection_closed(exc):
        return Error(ErrorClass.TRANSIENT_TRANSPORT, "MCP connection closed", details)
    return Error(ErrorClass.EXECUTION_FAILURE, f"MCP server refused {method}", details)


def initialize_error(exc: MCPError, server: str) -> Error:
    """The classed error of a failed ``initialize`` at ``server``: an
    endpoint that answered with no JSON-RPC at all (a wrong URL, a web
    server that is no MCP server) is ``transient_transport`` naming it; a
    server's own refusal stays one, with the server named too."""
    if exc.data is None and (exc.code, exc.message) in _SDK_HTTP_STAND_INS:
        return Error(
            ErrorClass.TRANSIENT_TRANSPORT,
            f"{server[:MAX_CAUSE]} did not answer initialize as an MCP server",
            {
                "method": "initialize",
                "server": server[:MAX_CAUSE],
                "reason": "not_an_mcp_endpoint",
                "cause": f"HTTP answer without JSON-RPC ({exc.message})",
            },
        )
    error = mcp_error("initialize", exc, tool=None)
    return Error(error.error_class, error.message, {**error.details, "server": server[:MAX_CAUSE]})


def _connection_closed(exc: MCPError) -> bool:
    """Whether the SDK itself reports the connection lost.

    Its code, -32000, is also JSON-RPC's generic server error, which a
    server on a healthy connection sends to refuse a request: only the
    SDK's own errors (exactly their messages, no data) are a lost
    connection.  A server sending one of those very messages would be
    misread: a known limit.
    """
    if exc.code != mcp_types.CONNECTION_CLOSED or exc.data is not None:
        return False
    message = exc.message
    return message in _SDK_CONNECTION_CLOSED or message.startswith(_SDK_STREAM_FAILED)


def transport_error(method: str, exc: BaseException, *, tool: str | None) -> Error:
    """``transient_transport`` for a stream that closed or broke under a request."""
    details: dict[str, Any] = {"method": method, "cause": f"{type(exc).__name__}"}
    if tool is not None:
        details["tool"] = tool
        details["certainty"] = "uncertain"
    return Error(ErrorClass.TRANSIENT_TRANSPORT, "MCP connection failed", details)
