"""One MCP server's tools over one SDK session, and the tool backends that
call them: :class:`McpToolBackend` per listed tool, :class:`McpRefreshTool`
to relist."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, final

import attrs
import trio

from ..._numbers import is_seconds
from ...errors import Error, ErrorClass, require_methods
from ...tools import (
    AdmittedBundle,
    Authority,
    Rejected,
    Rejection,
    ToolDescriptor,
    ToolRegistry,
    ToolResult,
    admit_batch,
    reject,
)
from ._catalog import McpCatalog, McpTool, json_arguments
from ._errors import MAX_CAUSE, mcp_error, not_sent, transport_error
from ._refresh import REFRESH_DESCRIPTION, active_registry, is_descriptors, stage_refresh
from ._sdk import ClientSession, MCPError, anyio, mcp_types, pydantic
from ._tasks import call_as_task, server_runs_tasks
from ._validators import MCP_SCHEMA_OPTIONS, SchemaValidator, ValidatorCache
from ._wire import call_result, check_paging, listing_page, raw_result, send_raw

__all__ = ["McpRefreshTool", "McpToolBackend", "McpToolSource", "check_seconds"]


def check_seconds(name: str, value: Any) -> None:
    """``validation`` unless ``value`` is ``None`` or a positive finite number
    of seconds: checked before anything starts, never a transport failure."""
    if value is not None and not is_seconds(value):
        raise Error(
            ErrorClass.VALIDATION, f"{name} must be a positive number or None", {"argument": name}
        )


@final
class McpToolSource:
    """One MCP server's tools over one SDK ``ClientSession``.

    Build it with :func:`connect_stdio` or :func:`connect_streamable_http`
    (or wrap a session you entered and initialized yourself, then
    ``await source.refresh()``).  ``call_timeout`` (seconds, ``None`` = no
    limit) bounds each ``tools/call``; a call that runs out is a ``timeout``
    whose outcome is uncertain.  A tool whose ``execution.taskSupport``
    is ``"required"`` (with ``task_calls="optional"``, ``"optional"`` too)
    is called as an MCP task (``tools/call`` with ``task``, then
    ``tasks/get`` until it ends and ``tasks/result``); a task-only tool of a
    server that offers no tasks is refused at listing.
    """

    def __init__(
        self,
        session: ClientSession | None = None,
        *,
        validate_arguments: bool = False,
        validate_structured_content: bool = False,
        validator: SchemaValidator | None = None,
        cache: ValidatorCache | None = None,
        call_timeout: float | None = None,
        task_calls: str = "required",
    ) -> None:
        check_seconds("call_timeout", call_timeout)
        if task_calls not in ("required", "optional"):
            raise Error(
                ErrorClass.VALIDATION,
                "task_calls must be 'required' or 'optional'",
                {"argument": "task_calls"},
            )
        if session is not None:
            require_methods(session, "session", ("list_tools", "call_tool"))
        self.catalog = McpCatalog(
            validate_arguments=validate_arguments,
            validate_structured_content=validate_structured_content,
            validator=validator,
            cache=cache,
        )
        self.session = session
        #: the adapter's raw JSON-RPC dispatcher under ``session`` (``None``
        #: for a session the host built): task calls go through it
        self.dispatcher: Any = None
        self.call_timeout = call_timeout
        self.task_calls = task_calls
        self._stale = False
        self._stale_event = trio.Event()
        self._descriptors: tuple[ToolDescriptor, ...] = ()

    # -- the catalog -----------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the source has no session: never connected, its block
        left, or its connection found closed by a call it could not send."""
        return self.session is None

    @property
    def stale(self) -> bool:
        """Whether the server announced ``tools/list_changed`` since the last refresh."""
        return self._stale

    async def wait_stale(self) -> None:
        """Return once the source is stale."""
        await self._stale_event.wait()

    def mark_stale(self) -> None:
        self._stale = True
        self._stale_event.set()

    @property
    def descriptors(self) -> tuple[ToolDescriptor, ...]:
        """One descriptor per listed tool, in name order (as of the last refresh)."""
        return self._descriptors

    @property
    def rejected(self) -> tuple[Rejected, ...]:
        """The tools left out, with why (trusted-host data)."""
        return self.catalog.rejected

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self._descriptors)

    def admit(self, *, caller: str, run_id: str, mode: str = "strict") -> AdmittedBundle:
        """The listed tools through ``admit_batch``, every one granted to ``caller``."""
        registry = self.registry()
        authority = Authority.for_registry(registry, caller=caller, run_id=run_id)
        return admit_batch(registry, authority, mode=mode, run_id=run_id)

    async def refresh(self) -> tuple[ToolDescriptor, ...]:
        """List the server's tools again (every page) and rebuild the descriptors.

        Clears :attr:`stale` (a ``tools/list_changed`` arriving meanwhile
        marks it again; a failed listing leaves it stale).  Unchanged tools
        reuse their cached validators and refusals; changed ones get a new
        fingerprint and revision.  To stage the new catalog into a running
        conversation, offer the model :meth:`refresh_tool`.
        """
        session = self._session()
        was_stale = self._stale
        self._stale = False
        if self._stale_event.is_set():
            self._stale_event = trio.Event()
        try:
            definitions = await self._list(session)
        except BaseException:
            if was_stale:
                self.mark_stale()
            raise
        capabilities = getattr(session, "server_capabilities", None)
        self.catalog.tasks_supported = self.dispatcher is not None and server_runs_tasks(
            capabilities
        )
        self.catalog.admit(definitions)
        self._descriptors = tuple(
            ToolDescriptor(
                name=tool.name,
                schema=tool.input_schema,
                backend=McpToolBackend(self, tool.name, tool.fingerprint),
                revision=tool.revision,
                description=tool.description,
                read_only=False,  # annotations are hints, never authority
                output_schema=tool.output_schema,
                schema_options=MCP_SCHEMA_OPTIONS,
            )
            for tool in self.catalog.tools.values()
        )
        return self._descriptors

    def refresh_tool(
        self,
        *,
        base: Callable[[], Iterable[ToolDescriptor]] | Iterable[ToolDescriptor] | None = None,
        name: str = "refresh_tools",
        description: str | None = None,
    ) -> ToolDescriptor:
        """The ``refresh_tools`` discovery tool: a read-only descriptor to put
        in the conversation's registry next to :attr:`descriptors`.

        When the model calls it, it relists the server and, if the tools the
        model may call changed, stages the next catalog revision: the host's
        other tools, the refreshed server tools and itself, each granted at
        its revision.  The next provider request carries them.

        ``base`` is the host's other tools: a registry or descriptors, or a
        callable returning them at call time; ``None`` takes them from the
        conversation's active catalog.  Tools of this source and a tool named
        ``name`` are never taken from ``base``.  The result's
        ``structured_content`` is ``{"status": "staged" | "no_change",
        "catalog_revision", "added", "removed", "changed", "was_stale"}``.
        """
        return McpRefreshTool(self, base=base, name=name, description=description).descriptor

    async def _list(self, session: ClientSession) -> list[Any]:
        """Every page of ``tools/list``, each tool as the server sent it.

        A cursor the server already sent, or a listing past the page or tool
        bounds, is ``malformed_result``: following it would never end.
        """
        definitions: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        pages = 0
        try:
            while True:
                params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
                raw = await send_raw(
                    session, mcp_types.ListToolsRequest(params=params), mcp_types.ListToolsResult
                )
                pages += 1
                if isinstance(raw, pydantic.BaseModel):  # a session the host built
                    raw = raw.model_dump(by_alias=True, mode="json", exclude_none=True)
                tools, cursor = listing_page(raw)
                definitions.extend(tools)
                check_paging(cursor, seen, pages, len(definitions))
                if cursor is None:
                    break
                seen.add(cursor)
        except MCPError as exc:
            raise mcp_error("tools/list", exc, tool=None) from None
        except pydantic.ValidationError as exc:
            raise Error(
                ErrorClass.MALFORMED_RESULT,
                "MCP server sent a tool listing the SDK cannot parse",
                {"reason": "invalid_listing", "cause": str(exc)[:MAX_CAUSE]},
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            raise transport_error("tools/list", exc, tool=None) from None
        return definitions

    # -- calls -------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:
        """Check, send and check again one ``tools/call``.

        Raises before anything is sent for a refused tool or, with
        ``validate_arguments``, invalid arguments; raises after for a result
        that fails its output schema or a failed exchange.
        """
        tool = self.catalog.prepare(name, arguments)
        return await self.send(tool, arguments)

    async def send(self, tool: McpTool, arguments: Any, *, record: Any = None) -> ToolResult:
        """Send a prepared call (as a task where it must be one; ``record``
        is handed its task id) and check its result; every failure is
        classed and, for the runtime, uncertain (the request may have
        reached the server) unless it was never sent."""
        session = self._session()
        try:
            if self._as_task(tool):
                raw = await self._task(tool, arguments, record)
            else:
                raw = await self._call(session, tool, arguments)
        except MCPError as exc:
            error = mcp_error("tools/call", exc, tool=tool.name)
            if not_sent(error):
                self.session = None  # the connection is gone: the source says so
            raise error from None
        except pydantic.ValidationError as exc:
            raise Error(
                ErrorClass.MALFORMED_RESULT,
                f"MCP tool {tool.name!r} returned a result the SDK cannot parse",
                {
                    "reason": "invalid_result",
                    "tool": tool.name,
                    "certainty": "uncertain",
                    "cause": str(exc)[:MAX_CAUSE],
                },
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            raise transport_error("tools/call", exc, tool=tool.name) from None
        return self.catalog.result(tool, call_result(tool.name, raw))

    async def _call(self, session: ClientSession, tool: McpTool, arguments: Any) -> Any:
        """One plain ``tools/call``: its result as the server sent it."""
        request = mcp_types.CallToolRequest(
            params=mcp_types.CallToolRequestParams(
                name=tool.name, arguments=json_arguments(tool.name, arguments)
            ),
        )
        # send_request, not ClientSession.call_tool: the SDK's own output
        # validation must not replace the adapter's opt-in one.  Without a
        # call_timeout there is no limit, never the session's read_timeout,
        # which the SDK applies to a request given none.
        limit = self.call_timeout if self.call_timeout is not None else math.inf
        raw = await send_raw(session, request, mcp_types.CallToolResult, limit)
        if isinstance(raw, mcp_types.CallToolResult):  # a session the host built
            raw = raw_result(raw)
        return raw

    def _as_task(self, tool: McpTool) -> bool:
        if tool.task_support == "required":
            return True
        optional = tool.task_support == "optional" and self.task_calls == "optional"
        return optional and self.catalog.tasks_supported

    async def _task(self, tool: McpTool, arguments: Any, record: Any) -> Any:
        """``tools/call`` of ``tool`` as a task, within ``call_timeout``."""
        plain = json_arguments(tool.name, arguments)
        send = self.dispatcher.send_raw_request
        limit = self.call_timeout if self.call_timeout is not None else math.inf
        with trio.move_on_after(limit) as bound:
            return await call_as_task(send, tool.name, plain, record=record)
        assert bound.cancelled_caught
        raise Error(
            ErrorClass.TIMEOUT,
            f"MCP tool {tool.name!r} task outlived call_timeout (it was cancelled)",
            {"tool": tool.name, "certainty": "uncertain"},
        )

    def _session(self) -> ClientSession:
        if self.session is None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "MCP tool source is not connected")
        return self.session

    async def _on_message(self, message: Any) -> None:
        """The session's message handler: notices ``tools/list_changed``."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.mark_stale()
        await trio.lowlevel.checkpoint()


@final
@attrs.frozen(eq=False)
class McpToolBackend:
    """The tool backend of one listed MCP tool (``async execute(operation)``).

    ``fingerprint`` pins the definition the descriptor was built from: after a
    refresh that changed or refused the tool, a call through an old descriptor
    is rejected before sending instead of reaching a tool the model never saw.
    """

    source: McpToolSource
    name: str
    fingerprint: str | None = None

    async def execute(self, operation: Any) -> ToolResult | Rejection:
        try:
            tool = self.source.catalog.prepare(self.name, operation.arguments)
        except Error as error:
            return reject(operation, error)  # nothing was sent
        if self.source.session is None:  # closed (or never connected): nothing is sent
            return reject(
                operation,
                Error(
                    ErrorClass.RESOURCE_CONFLICT,
                    "MCP tool source is not connected",
                    {"tool": self.name},
                ),
            )
        if tool.fingerprint is None or tool.fingerprint != self.fingerprint:
            # a definition with no fingerprint cannot be shown unchanged
            changed = Error(
                ErrorClass.RESOURCE_CONFLICT,
                f"MCP tool {self.name!r} changed since this catalog was built",
                {"reason": "stale_tool", "tool": self.name},
            )
            return reject(operation, changed)
        record = getattr(getattr(operation, "context", None), "record_resource", None)
        try:
            return await self.source.send(tool, operation.arguments, record=record)
        except Error as error:
            if not_sent(error):
                return reject(operation, error)  # nothing reached the server
            raise


@final
class McpRefreshTool:
    """The backend of :meth:`McpToolSource.refresh_tool`; :attr:`descriptor` is its tool.

    ``async execute(operation)`` relists the server and stages the next
    catalog revision when the tools the model may call changed.
    """

    def __init__(
        self,
        source: McpToolSource,
        *,
        base: Callable[[], Iterable[ToolDescriptor]] | Iterable[ToolDescriptor] | None = None,
        name: str = "refresh_tools",
        description: str | None = None,
    ) -> None:
        if base is not None and not callable(base) and not is_descriptors(base):
            raise Error(
                ErrorClass.VALIDATION,
                "base must be a ToolRegistry, descriptors, a callable returning them, or None",
            )
        self.source = source
        self.base = base
        self.descriptor = ToolDescriptor(
            name=name,
            schema={"type": "object", "properties": {}, "additionalProperties": False},
            backend=self,
            description=REFRESH_DESCRIPTION if description is None else description,
            read_only=True,
        )

    def _own(self, descriptor: ToolDescriptor) -> bool:
        """Whether ``descriptor`` comes from this source (or is this tool)."""
        backend = descriptor.backend
        return descriptor.name == self.descriptor.name or (
            isinstance(backend, McpToolBackend | McpRefreshTool) and backend.source is self.source
        )

    def _base(self, operation: Any) -> list[ToolDescriptor]:
        base: Any = self.base
        if base is None:
            base = active_registry(operation)
            if base is None:
                raise Error(
                    ErrorClass.VALIDATION,
                    f"{self.descriptor.name} needs base= outside a conversation",
                    {"reason": "no_active_catalog", "tool": self.descriptor.name},
                )
        elif callable(base):
            base = base()
        if not is_descriptors(base):
            raise Error(
                ErrorClass.VALIDATION,
                "base returned something other than a ToolRegistry or descriptors",
                {"reason": "invalid_base", "tool": self.descriptor.name},
            )
        return [d for d in base if not self._own(d)]

    async def execute(self, operation: Any) -> ToolResult | Rejection:
        try:
            base = self._base(operation)
        except Error as error:
            return reject(operation, error)  # nothing was sent
        was_stale = self.source.stale
        refreshed = await self.source.refresh()
        clash = sorted({d.name for d in base} & {d.name for d in refreshed})
        if clash:
            raise Error(
                ErrorClass.VALIDATION,
                "MCP server lists tools whose names the host already uses",
                {"reason": "duplicate_tool_names", "tool": self.descriptor.name, "tools": clash},
            )
        registry = ToolRegistry([*base, *refreshed, self.descriptor])
        return stage_refresh(operation, registry, was_stale)
