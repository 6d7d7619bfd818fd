"""``tools/list`` and ``tools/call`` results as the server sent them, and
their shapes checked before the catalog sees them."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Final

from ...errors import Error, ErrorClass
from ._errors import MAX_CAUSE, NOT_SENT, Unparsed
from ._sdk import (
    CallOptions,
    ClientSession,
    JSONRPCDispatcher,
    MCPError,
    anyio,
    mcp_types,
    pydantic,
)

__all__ = [
    "RawDispatcher",
    "call_result",
    "check_paging",
    "listing_page",
    "raw_result",
    "send_raw",
    "session_streams",
]

#: Pages one tool listing may span, and tools it may hold in all, before it
#: is refused as ``malformed_result``: a server that pages forever must fail
#: ``connect``/``refresh``, not hang it.
_MAX_LIST_PAGES: Final = 1000
_MAX_LISTED_TOOLS: Final = 10_000
#: Inside :func:`send_raw`: where :class:`RawDispatcher` puts the raw result.
_CAPTURE: ContextVar[list[dict[str, Any]] | None] = ContextVar("_mcp_capture", default=None)
#: Inside :class:`RawDispatcher`'s ``send_raw_request``: marked when the
#: request's own write failed (the transport was gone: nothing was sent).
_UNSENT: ContextVar[list[bool] | None] = ContextVar("_mcp_unsent", default=None)
#: What the SDK is handed instead of a captured result: the least its models accept.
_PLACEHOLDERS: Final[Mapping[str, Mapping[str, Any]]] = {
    "tools/list": {"tools": []},
    "tools/call": {"content": []},
}


class RawDispatcher(JSONRPCDispatcher):
    """The SDK's own dispatcher, which can hand the adapter a result as the
    server sent it.

    Inside :func:`send_raw`, the raw result of a ``tools/list`` or
    ``tools/call`` goes to the capture and the SDK gets a placeholder it
    always accepts, so the SDK's whole-result models never refuse a page for
    one tool or a call for its ``structuredContent``.  Every other request,
    and every request outside :func:`send_raw`, is the SDK's as before.
    """

    async def send_raw_request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        opts: CallOptions | None = None,
        *,
        _related_request_id: Any = None,
    ) -> dict[str, Any]:
        """The SDK's request; a "Connection closed" for a request never
        written (the connection was known closed, or the write itself
        failed) carries :data:`NOT_SENT`: the SDK says the same for a
        request lost in flight, whose outcome is unknown."""
        unsent = [True] if getattr(self, "_closed", False) else []
        token = _UNSENT.set(unsent)
        try:
            raw = await super().send_raw_request(
                method, params, opts, _related_request_id=_related_request_id
            )
        except MCPError as exc:
            closed = exc.code == mcp_types.CONNECTION_CLOSED and exc.data is None
            if closed and unsent:
                raise MCPError(exc.code, exc.message, NOT_SENT) from None
            raise
        finally:
            _UNSENT.reset(token)
        capture = _CAPTURE.get()
        placeholder = _PLACEHOLDERS.get(method)
        if capture is None or placeholder is None or _related_request_id is not None:
            return raw
        capture.append(raw)
        return dict(placeholder)

    async def _write(self, message: Any, metadata: Any = None) -> None:
        try:
            await super()._write(message, metadata)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            unsent = _UNSENT.get()
            if unsent is not None and isinstance(message, mcp_types.JSONRPCRequest):
                unsent.append(True)  # a memory stream that refused the item never delivered it
            raise

    async def _dispatch(self, item: Any, *args: Any, **kwargs: Any) -> None:
        """The SDK's routing of one inbound item; first, a response the
        transport could not parse fails its request at once.  The SDK only
        logs such a line, and the request would wait for a response that
        already came, forever when no ``call_timeout`` is set."""
        if isinstance(item, pydantic.ValidationError):
            self._fail_unparsed(item)
        await super()._dispatch(item, *args, **kwargs)

    def _fail_unparsed(self, error: pydantic.ValidationError) -> None:
        """A response the SDK's models refuse: the line itself (JSON the SDK
        cannot read) or the message read from it (a ``result`` that is not
        an object, an ``error`` without a code, no ``jsonrpc`` member)."""
        message: Any = None
        found: Any = None
        for entry in error.errors():
            given = entry.get("input")
            if isinstance(given, str | bytes):
                try:  # Python's reader takes what the SDK's refused
                    message = json.loads(given, parse_int=_small_int)
                except (ValueError, RecursionError):
                    continue  # not JSON at all: no response to match
            elif isinstance(given, Mapping):
                message = given
            else:
                continue
            found = entry
            if isinstance(message, Mapping) and ("result" in message or "error" in message):
                break
        if found is None or not isinstance(message, Mapping):
            return
        if not ("result" in message or "error" in message):
            return
        request_id = message.get("id")
        if type(request_id) not in (str, int):
            return
        data = Unparsed(str(found.get("msg", "unparseable"))[:MAX_CAUSE])
        error_data = mcp_types.ErrorData(
            code=mcp_types.PARSE_ERROR, message="unparseable response", data=data
        )
        self._resolve_pending(request_id, error_data)


def _small_int(text: str) -> int:
    """An int of a line the SDK refused, read only to find its id: one past
    Python's digit limit is not the id, and reads as 0."""
    return int(text) if len(text) <= 30 else 0


def _raw_dispatch_supported() -> bool:
    """Whether this SDK's dispatcher has the hook :class:`RawDispatcher`
    overrides (a private keyword of ``send_raw_request``, SDK 2.3): on an SDK
    without it, sessions keep the SDK's own result models."""
    try:
        parameters = inspect.signature(JSONRPCDispatcher.send_raw_request).parameters
        session = inspect.signature(ClientSession).parameters
    except (TypeError, ValueError, AttributeError):  # pragma: no cover - another SDK
        return False
    return "_related_request_id" in parameters and "dispatcher" in session


_RAW_DISPATCH: Final = _raw_dispatch_supported()


def session_streams(read_stream: Any, write_stream: Any) -> dict[str, Any]:
    """How a ``ClientSession`` gets its streams: through a
    :class:`RawDispatcher` where the SDK allows it."""
    if _RAW_DISPATCH:
        return {"dispatcher": RawDispatcher(read_stream, write_stream)}
    return {"read_stream": read_stream, "write_stream": write_stream}


async def send_raw(
    session: ClientSession,
    request: Any,
    result_type: type[pydantic.BaseModel],
    timeout: float | None = None,
) -> Any:
    """Send ``request`` through ``session``; its result as the server sent it
    (JSON data) when the session runs on a :class:`RawDispatcher`, else the
    SDK's parsed ``result_type`` (a session the host built itself)."""
    capture: list[dict[str, Any]] = []
    token = _CAPTURE.set(capture)
    try:
        result = await session.send_request(
            request, result_type, request_read_timeout_seconds=timeout
        )
    finally:
        _CAPTURE.reset(token)
    return capture[0] if capture else result


def listing_page(raw: Any) -> tuple[list[Any], str | None]:
    """A raw ``tools/list`` result's tools (each as sent, for the catalog to
    admit or refuse) and next cursor (``None`` on the last page)."""
    tools = raw.get("tools") if isinstance(raw, Mapping) else None
    cursor = raw.get("nextCursor") if isinstance(raw, Mapping) else None
    if not isinstance(tools, list) or not (cursor is None or isinstance(cursor, str)):
        raise Error(
            ErrorClass.MALFORMED_RESULT,
            "MCP server sent a tool listing that is not a list of tools",
            {
                "reason": "invalid_listing",
                "cause": "tools must be a list and nextCursor a string",
            },
        )
    return tools, cursor or None


def check_paging(cursor: str | None, seen: set[str], pages: int, tools: int) -> None:
    """Refuse a listing of ``pages`` pages holding ``tools`` tools so far
    whose next cursor is ``cursor`` (``None``: the last page)."""
    if tools > _MAX_LISTED_TOOLS:
        reason = "too_many_tools"
        message = f"MCP server lists more than {_MAX_LISTED_TOOLS} tools"
    elif cursor is None:
        return
    elif cursor in seen:
        reason, message = "repeated_cursor", "MCP server sent a tools/list cursor twice"
    elif pages >= _MAX_LIST_PAGES:
        reason = "too_many_pages"
        message = f"MCP server's tool listing spans more than {_MAX_LIST_PAGES} pages"
    else:
        return
    raise Error(
        ErrorClass.MALFORMED_RESULT,
        message,
        {"reason": reason, "method": "tools/list", "pages": pages, "tools": tools},
    )


_CONTENT: Final = pydantic.TypeAdapter(list[mcp_types.ContentBlock])


def call_result(name: str, raw: Any) -> dict[str, Any]:
    """Tool ``name``'s raw ``tools/call`` result as the catalog takes it.

    ``content`` must be a list of content blocks the SDK models (dumped back
    to JSON data) and ``isError`` a boolean if sent; ``structuredContent``
    is kept as it was sent, any JSON value, and only when it was sent.
    Anything else is ``malformed_result`` ``invalid_result``, uncertain.
    """
    cause = None
    if not isinstance(raw, Mapping):
        cause = "the result is not a JSON object"
    elif raw.get("isError") is not None and type(raw.get("isError")) is not bool:
        cause = "isError is not a boolean"
    else:
        try:
            blocks = _CONTENT.validate_python(raw.get("content"), by_name=False)
        except pydantic.ValidationError as exc:
            cause = f"content: {exc}"
    if cause is not None:
        raise Error(
            ErrorClass.MALFORMED_RESULT,
            f"MCP tool {name!r} returned a malformed result",
            {
                "reason": "invalid_result",
                "tool": name,
                "certainty": "uncertain",
                "cause": cause[:MAX_CAUSE],
            },
        )
    result: dict[str, Any] = {
        "content": [
            block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in blocks
        ],
        "isError": raw.get("isError") is True,
    }
    if "structuredContent" in raw:
        result["structuredContent"] = raw["structuredContent"]
    return result


def raw_result(result: mcp_types.CallToolResult) -> dict[str, Any]:
    """The SDK's parsed result (a session the host built) as raw JSON data."""
    raw: dict[str, Any] = {
        "content": [
            block.model_dump(by_alias=True, mode="json", exclude_none=True)
            for block in result.content
        ],
        "isError": result.is_error is True,
    }
    if "structured_content" in result.model_fields_set:
        raw["structuredContent"] = result.structured_content
    return raw
