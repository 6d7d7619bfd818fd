"""MCP servers as tool sources, on the official ``mcp`` SDK (spec 003, ``MCP-`` behaviours).

A :class:`McpToolSource` lists a server's tools, refuses the unsafe ones and
exposes the rest as :class:`~trio_backplane.tools.ToolDescriptor` records whose
backend calls the server::

    async with connect_stdio(sys.executable, ["server.py"]) as source:
        bundle = source.admit(caller="host", run_id="run-1")
        async with open_conversation("run-1", registry=bundle.registry,
                                     authority=bundle.authority, ...) as conversation:
            ...

The pieces, from the pure core outwards:

* every server-supplied schema passes :func:`~trio_backplane.schema.check_bounds`
  under ``Limits.mcp()`` with ``allow_external_refs=False`` before any
  validator sees it (MCP-02, MCP-05), and is then built by a
  :class:`SchemaValidator` (default :class:`BoundaryValidator`: our schema
  boundary with :data:`MCP_SCHEMA_OPTIONS`, 2020-12 and draft-07, MCP-04);
* built validators and refusals live in a :class:`ValidatorCache` keyed by the
  tool's fingerprint and the validator's key (4 096 entries; an insertion into
  a full cache empties it, MCP-11..13);
* :class:`McpCatalog` turns raw tool definitions into listed tools and
  refusals (MCP-03, MCP-06, MCP-15), checks a call's arguments before it is
  sent (MCP-07, MCP-08) and a result's ``structuredContent`` after
  (MCP-09, MCP-10); it does no I/O and is usable on its own;
* :class:`McpToolSource` holds one SDK ``ClientSession``: it lists, calls,
  marks itself stale on ``notifications/tools/list_changed`` and refreshes;
  the sessions :func:`connect_stdio` and :func:`connect_streamable_http`
  open hand it ``tools/list`` and ``tools/call`` results as the server sent
  them (:class:`_RawDispatcher`), so the SDK's whole-result models never
  refuse a page for one tool (MCP-03, MCP-06) or a result for its
  ``structuredContent`` (MCP-10): the catalog decides, item by item;
* :meth:`McpToolSource.refresh_tool` is the ``refresh_tools`` discovery tool
  (:class:`McpRefreshTool`): called by the model after ``tools/list_changed``,
  it relists the server and stages the next catalog revision from inside the
  executing call (PUB-19), published after the tool batch;
* :class:`McpToolBackend` is the tool backend: a refusal made before anything
  is sent becomes ``reject(operation, error)`` (TOOL-19), a server
  ``isError`` result an ``is_error`` :class:`~trio_backplane.tools.ToolResult`,
  and a failure after the request may have reached the server is raised as a
  classed :class:`~trio_backplane.errors.Error` (uncertain for a mutating tool).

Validation is opt-in per source (``validate_arguments``,
``validate_structured_content``), as in spec 003; tools admitted into a
``ToolRegistry`` are still validated by the runtime's execution gateway
whatever those flags say (MCP-01).  Server annotations such as
``readOnlyHint`` are hints: they never make a descriptor ``read_only``
(MCP-15).  Refusal diagnostics are trusted-host data, kept as
:class:`~trio_backplane.tools.Rejected`, which cannot be serialized.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Final, Literal, Protocol, TextIO, final, runtime_checkable

import attrs
import trio

from .._numbers import is_seconds
from . import _missing_extra

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

from ..errors import Error, ErrorClass, exception_leaves, require_methods
from ..kernel import freeze, thaw
from ..schema import CompiledSchema, Limits, SchemaOptions, check_bounds, compile_with
from ..tools import (
    AdmittedBundle,
    Authority,
    CatalogUpdate,
    Publication,
    Rejected,
    Rejection,
    ToolDescriptor,
    ToolRegistry,
    ToolResult,
    admit_batch,
    check_name,
    reject,
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

#: The options every server-supplied schema is built with (MCP-02, MCP-04, SCH-48).
MCP_SCHEMA_OPTIONS: Final = SchemaOptions(
    dialects={"2020-12", "draft-07"}, limits=Limits.mcp(), allow_external_refs=False
)
#: Entries a :class:`ValidatorCache` holds before an insertion empties it (MCP-13).
CACHE_SIZE: Final = 4096

Role = Literal["input", "output"]
#: Refusal reasons a build failure keeps instead of ``"build_failed"`` (MCP-03).
_KEPT_BUILD_REASONS: Final = frozenset({"root_not_object"})
_MAX_CAUSE: Final = 500
#: The message of the SDK's own CONNECTION_CLOSED error (mcp.shared.jsonrpc_dispatcher).
#: What the SDK itself says (code -32000, no data) when a connection is lost:
#: over stdio, and over streamable HTTP (a request whose response can never
#: arrive: ``streamable_http._resolve_abandoned_request``).
_SDK_CONNECTION_CLOSED: Final = frozenset(
    {
        "Connection closed",
        "SSE stream ended without a response",
        "SSE stream ended and reconnection attempts were exhausted",
    }
)
_SDK_STREAM_FAILED: Final = "SSE stream failed: "
#: Pages one tool listing may span, and tools it may hold in all, before it
#: is refused as ``malformed_result``: a server that pages forever (a new
#: cursor every time) must fail ``connect``/``refresh``, not hang it.
_MAX_LIST_PAGES: Final = 1000
_MAX_LISTED_TOOLS: Final = 10_000


# -- the swappable validator ---------------------------------------------------


@runtime_checkable
class SchemaValidator(Protocol):
    """Builds a bounds-checked server schema once and validates data against it.

    ``key`` names the validator and its options: it is part of every cache
    key, so two validators never share an entry.  ``build`` raises
    :class:`~trio_backplane.errors.Error` for a schema it refuses; ``validate``
    returns ``None`` or raises ``Error`` with the failures in
    ``details["errors"]``.  ``output=True`` builds an output schema (any root).
    """

    @property
    def key(self) -> str: ...

    def build(self, schema: Any, *, output: bool) -> Any: ...

    def validate(self, compiled: Any, data: Any) -> None: ...


@final
@attrs.frozen
class BoundaryValidator:
    """The default validator: trio_backplane's own schema boundary."""

    options: SchemaOptions = MCP_SCHEMA_OPTIONS

    @property
    def key(self) -> str:
        o = self.options
        limits = o.limits or Limits.host()
        return _canonical(
            {
                "validator": "trio_backplane.schema",
                "dialects": sorted(o.dialects or ("2020-12",)),
                "format_assertion": o.format_assertion,
                "content_assertion": o.content_assertion,
                "allow_external_refs": o.allow_external_refs,
                "limits": list(attrs.astuple(limits)),
                "registry": None if o.schema_registry is None else dict(o.schema_registry),
                "loader": None if o.schema_loader is None else id(o.schema_loader),
            }
        )

    def build(self, schema: Any, *, output: bool) -> CompiledSchema:
        return compile_with(schema, self.options, output=output)

    def validate(self, compiled: Any, data: Any) -> None:
        compiled.validate(data)


# -- the validator cache ---------------------------------------------------------


@attrs.frozen
class _Built:
    """One cached build: the compiled schema, or the refusal and where it happened."""

    compiled: Any = None
    refusal: Error | None = None
    stage: Literal["bounds", "build"] | None = None


@final
class ValidatorCache:
    """Built validators and refusals by ``(tool fingerprint, validator key, role)``.

    Holds at most :data:`CACHE_SIZE` entries: an insertion of a new key into a
    full cache empties it first (MCP-13).  ``builds`` counts the entries ever
    computed (a miss), ``hits`` the lookups served.
    """

    __slots__ = ("_entries", "builds", "hits", "maxsize")

    def __init__(self, maxsize: int = CACHE_SIZE) -> None:
        if type(maxsize) is not int or maxsize < 1:
            raise Error(ErrorClass.VALIDATION, "cache maxsize must be a positive int")
        self.maxsize = maxsize
        self._entries: dict[str, Any] = {}
        self.builds = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Any:
        value = self._entries.get(key)
        if value is not None:
            self.hits += 1
        return value

    def put(self, key: str, value: Any) -> None:
        if key not in self._entries and len(self._entries) >= self.maxsize:
            self._entries.clear()
        self._entries[key] = value
        self.builds += 1

    def clear(self) -> None:
        self._entries.clear()


_canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode
#: For a fingerprint only: a definition holding NaN (which the SDK's parser
#: accepts) still gets one, so an ignored outputSchema holding NaN neither
#: leaves the tool without an identity nor changes its revision each listing.
_canonical_lenient = json.JSONEncoder(
    ensure_ascii=False, allow_nan=True, sort_keys=True, separators=(",", ":")
).encode


def tool_fingerprint(definition: Mapping[str, Any]) -> str | None:
    """SHA-256 of the tool's name, description, input and output schema as
    canonical JSON; ``None`` when they are not JSON data (never cached)."""
    if not isinstance(definition, Mapping):
        raise Error(
            ErrorClass.VALIDATION,
            "a tool definition must be a mapping",
            {"type": type(definition).__name__},
        )
    parts = {
        "name": definition.get("name"),
        "description": definition.get("description"),
        "inputSchema": definition.get("inputSchema"),
        "outputSchema": definition.get("outputSchema"),
    }
    try:
        text = _canonical(parts)
    except ValueError:
        try:
            text = _canonical_lenient(parts)  # NaN or an infinity
        except (TypeError, ValueError, RecursionError):
            return None
    except (TypeError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- the catalog: the pure core --------------------------------------------------


@final
@attrs.frozen(eq=False)
class McpTool:
    """A listed server tool: its definition as the server gave it and what was built."""

    name: str
    description: str
    input_schema: Any
    output_schema: Any  # None unless validate_structured_content (then validated)
    annotations: Mapping[str, Any]
    fingerprint: str | None
    revision: int
    compiled_input: Any = attrs.field(repr=False)
    compiled_output: Any = attrs.field(repr=False)


def _unsafe(name: str, role: Role, built: _Built) -> tuple[Error, Error]:
    """The error a call raises (MCP-07) and the full diagnostics kept as ``Rejected``."""
    original = built.refusal
    assert original is not None
    reason: Any = original.details.get("reason")
    if built.stage == "build" and reason not in _KEPT_BUILD_REASONS:
        reason = "build_failed"
    message = f"MCP tool {name!r} has an unsafe {role} schema"
    details = {"tool": name, "unsafe_schema": role, "reason": reason}
    raised = Error(original.error_class, message, details)
    kept = Error(original.error_class, message, {**details, "cause": original.to_dict()})
    return raised, kept


@final
class McpCatalog:
    """The tools one MCP server listed, checked: no I/O, no Trio.

    ``admit(definitions)`` replaces the catalog with the raw tool
    definitions (JSON data as the server sent them).  A tool is left out,
    with its diagnostics kept in :attr:`rejected`, when its name breaks the
    tool-name rule (MCP-15), its ``inputSchema`` is refused or fails to build,
    or, only with ``validate_structured_content``, its ``outputSchema`` is
    (MCP-06).  Every schema used passes ``check_bounds`` first (MCP-02).
    """

    def __init__(
        self,
        *,
        validate_arguments: bool = False,
        validate_structured_content: bool = False,
        validator: SchemaValidator | None = None,
        cache: ValidatorCache | None = None,
    ) -> None:
        for option, value in (
            ("validate_arguments", validate_arguments),
            ("validate_structured_content", validate_structured_content),
        ):
            if type(value) is not bool:
                raise Error(ErrorClass.VALIDATION, f"{option} must be a bool", {"option": option})
        if validator is None:
            validator = BoundaryValidator()
        elif not isinstance(validator, SchemaValidator):
            raise Error(ErrorClass.VALIDATION, "validator must implement key, build and validate")
        self.validate_arguments = validate_arguments
        self.validate_structured_content = validate_structured_content
        self.validator: SchemaValidator = validator
        self.cache = cache if cache is not None else ValidatorCache()
        self._tools: dict[str, McpTool] = {}
        self._refused: dict[str, tuple[Error, Rejected]] = {}
        self._revisions: dict[str, tuple[str | None, int]] = {}

    # -- listing -----------------------------------------------------------

    @property
    def tools(self) -> Mapping[str, McpTool]:
        """The listed tools by name, in name order."""
        return dict(sorted(self._tools.items()))

    @property
    def rejected(self) -> tuple[Rejected, ...]:
        """Diagnostics of the tools left out (trusted-host data), in name order."""
        return tuple(kept for _, (_, kept) in sorted(self._refused.items()))

    def admit(self, definitions: Iterable[Mapping[str, Any]]) -> None:
        """Replace the catalog with ``definitions`` (MCP-03, MCP-06, MCP-15)."""
        if isinstance(definitions, str | bytes | Mapping) or not isinstance(definitions, Iterable):
            raise Error(
                ErrorClass.VALIDATION,
                "definitions must be a list of tool definitions",
                {"type": type(definitions).__name__},
            )
        tools: dict[str, McpTool] = {}
        refused: dict[str, tuple[Error, Rejected]] = {}
        for definition in definitions:
            raw_name = definition.get("name") if isinstance(definition, Mapping) else None
            name = raw_name if isinstance(raw_name, str) else ""
            if name in tools or name in refused:
                error = Error(
                    ErrorClass.VALIDATION,
                    "MCP server listed a tool name twice",
                    {"reason": "duplicate_tool_names", "tool": name},
                )
                tools.pop(name, None)
                refused[name] = (error, Rejected(name, 1, error))
                continue
            try:
                check_name(raw_name)
            except Error as error:
                refused[name] = (error, Rejected(name, 1, error))
                continue
            outcome = self._admit_one(name, definition)
            if isinstance(outcome, McpTool):
                tools[name] = outcome
            else:
                refused[name] = outcome
        self._tools = tools
        self._refused = refused

    def _revision(self, name: str, fingerprint: str | None) -> int:
        known = self._revisions.get(name)
        if known is None:
            revision = 1
        elif known[0] is not None and known[0] == fingerprint:
            revision = known[1]
        else:
            revision = known[1] + 1
        self._revisions[name] = (fingerprint, revision)
        return revision

    def _admit_one(
        self, name: str, definition: Mapping[str, Any]
    ) -> McpTool | tuple[Error, Rejected]:
        fingerprint = tool_fingerprint(definition)
        revision = self._revision(name, fingerprint)
        input_schema = definition.get("inputSchema")
        built_input = self._built(fingerprint, "input", input_schema)
        if built_input.refusal is not None:
            raised, kept = _unsafe(name, "input", built_input)
            return raised, Rejected(name, revision, kept)
        output_schema = definition.get("outputSchema")
        built_output: _Built | None = None
        if self.validate_structured_content and output_schema is not None:
            built_output = self._built(fingerprint, "output", output_schema)
            if built_output.refusal is not None:
                raised, kept = _unsafe(name, "output", built_output)
                return raised, Rejected(name, revision, kept)
        else:
            output_schema = None  # ignored: never used, never built (MCP-06)
        description = definition.get("description")
        annotations = definition.get("annotations")
        return McpTool(
            name=name,
            description=description if isinstance(description, str) else "",
            input_schema=input_schema,
            output_schema=output_schema,
            annotations=dict(annotations) if isinstance(annotations, Mapping) else {},
            fingerprint=fingerprint,
            revision=revision,
            compiled_input=built_input.compiled,
            compiled_output=None if built_output is None else built_output.compiled,
        )

    def _built(self, fingerprint: str | None, role: Role, schema: Any) -> _Built:
        key = None
        if fingerprint is not None:
            key = f"{fingerprint}\n{self.validator.key}\n{role}"
            hit = self.cache.get(key)
            if hit is not None:
                return hit  # type: ignore[no-any-return]
        built = self._build(role, schema)
        if key is not None:
            self.cache.put(key, built)
        return built

    def _build(self, role: Role, schema: Any) -> _Built:
        try:
            check_bounds(schema, Limits.mcp(), allow_external_refs=False)
        except Error as error:
            return _Built(refusal=error, stage="bounds")
        try:
            return _Built(compiled=self.validator.build(schema, output=role == "output"))
        except Error as error:
            return _Built(refusal=error, stage="build")
        except Exception as exc:  # a swapped validator must still fail closed, classed
            crash = Error(
                ErrorClass.EXECUTION_FAILURE,
                "schema validator failed to build the schema",
                {"cause": f"{type(exc).__name__}: {exc}"[:_MAX_CAUSE]},
            )
            return _Built(refusal=crash, stage="build")

    # -- calls ---------------------------------------------------------------

    def prepare(self, name: str, arguments: Any) -> McpTool:
        """Everything checked before a call is sent; raises ``Error`` (MCP-07, MCP-08)."""
        refused = self._refused.get(name)
        if refused is not None:
            raise refused[0]
        tool = self._tools.get(name)
        if tool is None:
            raise Error(ErrorClass.NOT_FOUND, "MCP server lists no such tool", {"tool": name})
        _json_arguments(name, arguments)
        if self.validate_arguments:
            self._check(
                tool.compiled_input,
                arguments,
                ErrorClass.VALIDATION,
                f"arguments of MCP tool {name!r} do not match its inputSchema",
                {"reason": "invalid_arguments", "tool": name},
            )
        return tool

    def _check(
        self,
        compiled: Any,
        value: Any,
        error_class: ErrorClass,
        message: str,
        details: dict[str, Any],
    ) -> None:
        """Validate ``value``; a mismatch becomes ``error_class`` with the
        validator's errors, any other failure a classed validator crash."""
        try:
            self.validator.validate(compiled, value)
        except Error as error:
            if error.error_class is not ErrorClass.VALIDATION:
                raise
            errors = list(error.details.get("errors", ()))
            raise Error(error_class, message, {**details, "errors": errors}) from None
        except Exception as exc:
            raise _validator_crash(exc) from exc

    def result(self, tool: McpTool, raw: Mapping[str, Any]) -> ToolResult:
        """A server result (its JSON data) as a ``ToolResult`` (MCP-09, MCP-10).

        ``raw`` keeps ``structuredContent`` only when the server sent it, so an
        explicit ``null`` and an absent value differ.
        """
        content = raw.get("content", [])
        structured = raw.get("structuredContent")
        if raw.get("isError") is True:
            return ToolResult(content, structured, is_error=True)
        if tool.compiled_output is not None:
            if "structuredContent" not in raw:
                raise Error(
                    ErrorClass.MALFORMED_RESULT,
                    f"MCP tool {tool.name!r} returned no structuredContent",
                    {"reason": "invalid_structured_content", "tool": tool.name, "errors": []},
                )
            self._check(
                tool.compiled_output,
                structured,
                ErrorClass.MALFORMED_RESULT,
                f"structuredContent of MCP tool {tool.name!r} does not match its outputSchema",
                {"reason": "invalid_structured_content", "tool": tool.name},
            )
        return ToolResult(content, structured, is_error=False)


def _json_arguments(name: str, arguments: Any) -> dict[str, Any] | None:
    """Tool ``name``'s call ``arguments`` as the plain JSON object sent
    (``None``: none), whatever ``validate_arguments`` says.

    Anything else is refused with ``validation`` ``invalid_arguments``
    before a request is built: a root that is not an object, a non-str key,
    NaN or infinity (which the SDK's encoder would send as ``null``), a lone
    surrogate (which kills the SDK's writer, and the session with it),
    bytes or any other non-JSON object (MCP-08: invalid arguments are never
    sent).
    """
    if arguments is None:
        return None
    problem = None
    if isinstance(arguments, Mapping):
        try:
            return thaw(freeze(arguments, "arguments"))  # type: ignore[no-any-return]
        except Error as error:
            problem = error.message
    else:
        problem = f"arguments must be a JSON object, not {type(arguments).__name__}"
    raise Error(
        ErrorClass.VALIDATION,
        f"arguments of MCP tool {name!r} are not a JSON object of JSON data",
        {"reason": "invalid_arguments", "tool": name, "errors": [], "cause": problem},
    )


def _validator_crash(exc: BaseException) -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        "schema validator failed",
        {"cause": f"{type(exc).__name__}: {exc}"[:_MAX_CAUSE]},
    )


# -- the source: one SDK session -------------------------------------------------


@final
class McpToolSource:
    """One MCP server's tools over one SDK ``ClientSession``.

    Build it with :func:`connect_stdio` or :func:`connect_streamable_http`
    (or wrap a session you entered and initialized yourself, then
    ``await source.refresh()``).  ``call_timeout`` (seconds, ``None`` = no
    limit) bounds each ``tools/call``; a call that runs out is a ``timeout``
    whose outcome is uncertain.
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
    ) -> None:
        _check_seconds("call_timeout", call_timeout)
        if session is not None:
            require_methods(session, "session", ("list_tools", "call_tool"))
        self.catalog = McpCatalog(
            validate_arguments=validate_arguments,
            validate_structured_content=validate_structured_content,
            validator=validator,
            cache=cache,
        )
        self.session = session
        self.call_timeout = call_timeout
        self._stale = False
        self._stale_event = trio.Event()
        self._descriptors: tuple[ToolDescriptor, ...] = ()

    # -- the catalog -----------------------------------------------------------

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
        reuse their cached validators and refusals (MCP-11); changed ones get
        a new fingerprint and revision (MCP-12).  To stage the new catalog
        into a running conversation, offer the model :meth:`refresh_tool`.
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
        self.catalog.admit(definitions)
        self._descriptors = tuple(
            ToolDescriptor(
                name=tool.name,
                schema=tool.input_schema,
                backend=McpToolBackend(self, tool.name, tool.fingerprint),
                revision=tool.revision,
                description=tool.description,
                read_only=False,  # annotations are hints, never authority (MCP-15)
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

        When the model calls it, it relists the server (:meth:`refresh`) and,
        if the tools the model may call changed, stages the next catalog
        revision from inside the executing call (``stage_catalog``, PUB-19):
        the host's other tools + the refreshed server tools + itself, with an
        authority granting exactly those at their revisions (caller and run
        from the operation's ``effective_authority``).  The runtime publishes
        it after the tool batch once this call's success is committed, so the
        next provider request carries the new revision and tools.

        ``base`` is the host's other tools: a registry or descriptors, or a
        callable returning them at call time; ``None`` takes them from the
        conversation's active catalog (every tool not from this source).
        Tools of this source and a tool named ``name`` are never taken from
        ``base``.  The result's ``structured_content`` is ``{"status":
        "staged" | "no_change", "catalog_revision", "added", "removed",
        "changed", "was_stale"}``; nothing is staged on ``"no_change"``.
        """
        return McpRefreshTool(self, base=base, name=name, description=description).descriptor

    async def _list(self, session: ClientSession) -> list[Any]:
        """Every page of ``tools/list``, each tool as the server sent it.

        The page is taken as raw JSON (:func:`_send_raw`), not through the
        SDK's ``ListToolsResult``, which refuses the whole page for one tool
        it cannot model; the catalog then admits or refuses tool by tool
        (MCP-03, MCP-06).  A cursor the server already sent, or a listing
        past :data:`_MAX_LIST_PAGES` pages or :data:`_MAX_LISTED_TOOLS`
        tools, is ``malformed_result``: following it would never end (or
        grow without bound).
        """
        definitions: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        pages = 0
        try:
            while True:
                params = None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor)
                raw = await _send_raw(
                    session, mcp_types.ListToolsRequest(params=params), mcp_types.ListToolsResult
                )
                pages += 1
                if isinstance(raw, pydantic.BaseModel):  # a session the host built
                    raw = raw.model_dump(by_alias=True, mode="json", exclude_none=True)
                tools, cursor = _listing_page(raw)
                definitions.extend(tools)
                _check_paging(cursor, seen, pages, len(definitions))
                if cursor is None:
                    break
                seen.add(cursor)
        except MCPError as exc:
            raise _mcp_error("tools/list", exc, tool=None) from None
        except pydantic.ValidationError as exc:
            raise Error(
                ErrorClass.MALFORMED_RESULT,
                "MCP server sent a tool listing the SDK cannot parse",
                {"reason": "invalid_listing", "cause": str(exc)[:_MAX_CAUSE]},
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            raise _transport_error("tools/list", exc, tool=None) from None
        return definitions

    # -- calls -------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: Any) -> ToolResult:
        """Check, send and check again one ``tools/call``.

        Raises before anything is sent for a refused tool (MCP-07) or, with
        ``validate_arguments``, invalid arguments (MCP-08); raises after for a
        result that fails its output schema (MCP-09) or a failed exchange.
        """
        tool = self.catalog.prepare(name, arguments)
        return await self.send(tool, arguments)

    async def send(self, tool: McpTool, arguments: Any) -> ToolResult:
        """Send a prepared call and check its result; every failure is classed and,
        for the runtime, uncertain (the request may have reached the server)."""
        session = self._session()
        request = mcp_types.CallToolRequest(
            params=mcp_types.CallToolRequestParams(
                name=tool.name, arguments=_json_arguments(tool.name, arguments)
            ),
        )
        try:
            # send_request, not ClientSession.call_tool: the SDK's own output
            # validation must not replace the opt-in one of spec 003 (MCP-09/10).
            # (no call_timeout: no limit, never the session's read_timeout,
            # which the SDK applies to a request given none)
            limit = self.call_timeout if self.call_timeout is not None else math.inf
            raw = await _send_raw(session, request, mcp_types.CallToolResult, limit)
        except MCPError as exc:
            raise _mcp_error("tools/call", exc, tool=tool.name) from None
        except pydantic.ValidationError as exc:
            raise Error(
                ErrorClass.MALFORMED_RESULT,
                f"MCP tool {tool.name!r} returned a result the SDK cannot parse",
                {
                    "reason": "invalid_result",
                    "tool": tool.name,
                    "certainty": "uncertain",
                    "cause": str(exc)[:_MAX_CAUSE],
                },
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            raise _transport_error("tools/call", exc, tool=tool.name) from None
        if isinstance(raw, mcp_types.CallToolResult):  # a session the host built
            raw = _raw_result(raw)
        return self.catalog.result(tool, _call_result(tool.name, raw))

    def _session(self) -> ClientSession:
        if self.session is None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "MCP tool source is not connected")
        return self.session

    async def _on_message(self, message: Any) -> None:
        """The session's message handler: notices ``tools/list_changed``."""
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self.mark_stale()
        await trio.lowlevel.checkpoint()


#: Inside :func:`_send_raw`: where :class:`_RawDispatcher` puts the raw result.
_CAPTURE: ContextVar[list[dict[str, Any]] | None] = ContextVar("_mcp_capture", default=None)
#: What the SDK is handed instead of a captured result: the least its models accept.
_PLACEHOLDERS: Final[Mapping[str, Mapping[str, Any]]] = {
    "tools/list": {"tools": []},
    "tools/call": {"content": []},
}


class _Unparsed:
    """The ``data`` of the error a request is failed with when its response
    arrived but could not be parsed (:meth:`_RawDispatcher._dispatch`): no
    server can send this object."""

    __slots__ = ("cause",)

    def __init__(self, cause: str) -> None:
        self.cause = cause


class _RawDispatcher(JSONRPCDispatcher):
    """The SDK's own dispatcher, which can hand the adapter a result as the
    server sent it.

    The SDK validates a whole result against its protocol models, so one
    tool it cannot model (``inputSchema: {"type": ["object"]}``, an
    ``outputSchema`` with an array root) loses every tool of the page, and a
    ``structuredContent`` that is not an object fails the call, where the
    adapter must decide tool by tool (MCP-03, MCP-06) and take any JSON
    value (MCP-10).  Inside :func:`_send_raw`, the raw result of a
    ``tools/list`` or ``tools/call`` goes to the capture and the SDK gets a
    placeholder it always accepts; every other request, and every request
    outside :func:`_send_raw`, is the SDK's as before.
    """

    async def send_raw_request(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        opts: CallOptions | None = None,
        *,
        _related_request_id: Any = None,
    ) -> dict[str, Any]:
        raw = await super().send_raw_request(
            method, params, opts, _related_request_id=_related_request_id
        )
        capture = _CAPTURE.get()
        placeholder = _PLACEHOLDERS.get(method)
        if capture is None or placeholder is None or _related_request_id is not None:
            return raw
        capture.append(raw)
        return dict(placeholder)

    async def _dispatch(self, item: Any, *args: Any, **kwargs: Any) -> None:
        """The SDK's routing of one inbound item; first, a response the
        transport could not parse (a line the SDK's models refuse, such as
        one escaping a lone surrogate) fails its request at once.  The SDK
        only logs such a line, and the request would wait for a response
        that already came, forever when no ``call_timeout`` is set."""
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
        data = _Unparsed(str(found.get("msg", "unparseable"))[:_MAX_CAUSE])
        error_data = mcp_types.ErrorData(
            code=mcp_types.PARSE_ERROR, message="unparseable response", data=data
        )
        self._resolve_pending(request_id, error_data)


def _check_seconds(name: str, value: Any) -> None:
    """``validation`` unless ``value`` is ``None`` or a positive finite number
    of seconds: checked before anything starts, never a transport failure."""
    if value is not None and not is_seconds(value):
        raise Error(
            ErrorClass.VALIDATION, f"{name} must be a positive number or None", {"argument": name}
        )


def _small_int(text: str) -> int:
    """An int of a line the SDK refused, read only to find its id: one past
    Python's digit limit is not the id, and reads as 0."""
    return int(text) if len(text) <= 30 else 0


def _raw_dispatch_supported() -> bool:
    """Whether this SDK's dispatcher has the hook :class:`_RawDispatcher`
    overrides (a private keyword of ``send_raw_request``, SDK 2.3): on an SDK
    without it, sessions keep the SDK's own result models (each
    ``tools/list`` page and ``tools/call`` result validated whole)."""
    try:
        parameters = inspect.signature(JSONRPCDispatcher.send_raw_request).parameters
        session = inspect.signature(ClientSession).parameters
    except (TypeError, ValueError, AttributeError):  # pragma: no cover - another SDK
        return False
    return "_related_request_id" in parameters and "dispatcher" in session


_RAW_DISPATCH: Final = _raw_dispatch_supported()


def _streams(read_stream: Any, write_stream: Any) -> dict[str, Any]:
    """How a ``ClientSession`` gets its streams: through a
    :class:`_RawDispatcher` where the SDK allows it."""
    if _RAW_DISPATCH:
        return {"dispatcher": _RawDispatcher(read_stream, write_stream)}
    return {"read_stream": read_stream, "write_stream": write_stream}


async def _send_raw(
    session: ClientSession,
    request: Any,
    result_type: type[pydantic.BaseModel],
    timeout: float | None = None,
) -> Any:
    """Send ``request`` through ``session``; its result as the server sent it
    (JSON data) when the session runs on a :class:`_RawDispatcher`, else the
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


def _listing_page(raw: Any) -> tuple[list[Any], str | None]:
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


def _check_paging(cursor: str | None, seen: set[str], pages: int, tools: int) -> None:
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


def _call_result(name: str, raw: Any) -> dict[str, Any]:
    """Tool ``name``'s raw ``tools/call`` result as the catalog takes it
    (MCP-09, MCP-10).

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
                "cause": cause[:_MAX_CAUSE],
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


def _raw_result(result: mcp_types.CallToolResult) -> dict[str, Any]:
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


def _mcp_error(method: str, exc: MCPError, *, tool: str | None) -> Error:
    details: dict[str, Any] = {
        "method": method,
        "code": exc.code,
        "server_message": str(exc.message)[:_MAX_CAUSE],
    }
    if tool is not None:
        details["tool"] = tool
        details["certainty"] = "uncertain"
    if isinstance(exc.data, _Unparsed):
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


def _transport_error(method: str, exc: BaseException, *, tool: str | None) -> Error:
    details: dict[str, Any] = {"method": method, "cause": f"{type(exc).__name__}"}
    if tool is not None:
        details["tool"] = tool
        details["certainty"] = "uncertain"
    return Error(ErrorClass.TRANSIENT_TRANSPORT, "MCP connection failed", details)


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
            return reject(operation, error)  # nothing was sent (TOOL-19)
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
            # (a definition with no fingerprint cannot be shown unchanged)
            changed = Error(
                ErrorClass.RESOURCE_CONFLICT,
                f"MCP tool {self.name!r} changed since this catalog was built",
                {"reason": "stale_tool", "tool": self.name},
            )
            return reject(operation, changed)
        return await self.source.send(tool, operation.arguments)


# -- the refresh_tools discovery tool ------------------------------------------------


_REFRESH_DESCRIPTION: Final = (
    "Reload the tools of an MCP server that announced its tool list changed; "
    "the new tools are offered from the next response on."
)


def _active_registry(operation: Any) -> ToolRegistry | None:
    """The executing call's active catalog (``ToolContext.catalog_registry``),
    or ``None`` outside a conversation."""
    registry = getattr(getattr(operation, "context", None), "catalog_registry", None)
    return registry if isinstance(registry, ToolRegistry) else None


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


@final
class McpRefreshTool:
    """The backend of :meth:`McpToolSource.refresh_tool`; :attr:`descriptor` is its tool.

    ``async execute(operation)`` relists the server and stages the next
    catalog revision when the tools the model may call changed (PUB-19).
    """

    def __init__(
        self,
        source: McpToolSource,
        *,
        base: Callable[[], Iterable[ToolDescriptor]] | Iterable[ToolDescriptor] | None = None,
        name: str = "refresh_tools",
        description: str | None = None,
    ) -> None:
        if base is not None and not callable(base) and not _is_descriptors(base):
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
            description=_REFRESH_DESCRIPTION if description is None else description,
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
            base = _active_registry(operation)
            if base is None:
                raise Error(
                    ErrorClass.VALIDATION,
                    f"{self.descriptor.name} needs base= outside a conversation",
                    {"reason": "no_active_catalog", "tool": self.descriptor.name},
                )
        elif callable(base):
            base = base()
        if not _is_descriptors(base):
            raise Error(
                ErrorClass.VALIDATION,
                "base returned something other than a ToolRegistry or descriptors",
                {"reason": "invalid_base", "tool": self.descriptor.name},
            )
        return [d for d in base if not self._own(d)]

    async def execute(self, operation: Any) -> ToolResult | Rejection:
        name = self.descriptor.name
        try:
            base = self._base(operation)
        except Error as error:
            return reject(operation, error)  # nothing was sent (TOOL-19)
        was_stale = self.source.stale
        refreshed = await self.source.refresh()
        clash = sorted({d.name for d in base} & {d.name for d in refreshed})
        if clash:
            raise Error(
                ErrorClass.VALIDATION,
                "MCP server lists tools whose names the host already uses",
                {"reason": "duplicate_tool_names", "tool": name, "tools": clash},
            )
        registry = ToolRegistry([*base, *refreshed, self.descriptor])
        current: Authority = operation.effective_authority
        old = {tool: current.revision_for(tool) for tool in current.grants}
        new = {d.name: d.revision for d in registry}
        added = sorted(new.keys() - old.keys())
        removed = sorted(old.keys() - new.keys())
        changed = sorted(t for t in new.keys() & old.keys() if new[t] != old[t])
        revision: int = operation.catalog_revision
        summary = {"added": added, "removed": removed, "changed": changed, "was_stale": was_stale}
        if not (added or removed or changed):
            return ToolResult(
                f"no change: the tools are the same (catalog revision {revision})",
                {"status": "no_change", "catalog_revision": revision, **summary},
            )
        context = getattr(operation, "context", None)
        if context is None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "staging requires an executing tool")
        authority = Authority(
            grants=frozenset(new),
            caller=current.caller,
            run_id=current.run_id,
            tool_revisions=new,
        )
        receipt = context.stage_catalog(
            Publication(
                publication_id=f"mcp-refresh-{operation.invocation_id}",
                run_id=operation.run_id,
                incarnation=operation.incarnation,
                expected_revision=revision,
                catalog=CatalogUpdate(revision + 1, registry, authority),
            )
        )
        staged = receipt.catalog_revision
        return ToolResult(
            f"staged catalog revision {staged}, offered from the next response: "
            f"added {_names(added)}; removed {_names(removed)}; changed {_names(changed)}",
            {"status": "staged", "catalog_revision": staged, **summary},
        )


def _is_descriptors(value: Any) -> bool:
    if isinstance(value, ToolRegistry):
        return True
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        return False
    if isinstance(value, Iterator):
        return False  # would be consumed by the check
    return all(isinstance(d, ToolDescriptor) for d in value)


# -- connecting ----------------------------------------------------------------------


@asynccontextmanager
async def _open(
    streams: Any, source: McpToolSource, read_timeout: float | None, server: str
) -> AsyncIterator[McpToolSource]:
    """Open the transport and the session, initialize and list.

    Failures come out classed, never as the transport's raw exception or the
    SDK's task-group wrapper: a failure before the source is handed out is
    an ``Error`` naming ``server`` (``method`` ``"connect"``); a connection
    that fails while the caller's block runs (the SDK then cancels the
    block) or as it closes is ``Error(transient_transport)`` with ``method``
    ``"session"``.  What the caller's block itself raises passes through as
    it was raised; cancellations, ``KeyboardInterrupt`` and ``SystemExit``
    propagate unchanged.  A cancellation from outside wins over a
    connection that failed meanwhile: it propagates as a plain
    ``Cancelled`` (so ``fail_after`` raises ``TooSlowError``), not grouped
    with the transport's raw errors.
    """
    opened = False
    from_block: BaseException | None = None
    unwrapped: BaseException | None = None
    try:
        async with (
            streams as (read_stream, write_stream),
            ClientSession(
                read_timeout_seconds=read_timeout,
                message_handler=source._on_message,
                **_streams(read_stream, write_stream),
            ) as session,
        ):
            source.session = session
            try:
                try:
                    await session.initialize()
                except MCPError as exc:
                    raise _mcp_error("initialize", exc, tool=None) from None
                await source.refresh()
                opened = True
                try:
                    yield source
                except BaseException as exc:
                    from_block = exc
                    raise
            finally:
                source.session = None
    except BaseException as exc:
        failure = _exit_failure(exception_leaves(exc), from_block, opened, server)
        if failure is None or failure is exc:
            raise
        if failure is not from_block and not isinstance(failure, trio.Cancelled):
            raise failure from exc  # classed here
        # The block's own exception, wrapped by the SDK's task group: raised
        # again below, outside this handler, as it was.
        unwrapped = failure
    if unwrapped is not None:
        raise unwrapped


def _exit_failure(
    leaves: list[BaseException], from_block: BaseException | None, opened: bool, server: str
) -> BaseException | None:
    """What leaving a connection raises, given the exceptions it ended with
    (``leaves``) and the one the caller's block raised: a classed ``Error``,
    the block's own exception, a plain ``Cancelled``, or ``None`` for what
    came as it is."""
    if any(not isinstance(leaf, Exception | trio.Cancelled) for leaf in leaves):
        return None  # KeyboardInterrupt, SystemExit
    cancelled = [leaf for leaf in leaves if isinstance(leaf, trio.Cancelled)]
    if cancelled:
        # Someone else's cancellation (the SDK's own scopes absorb the ones
        # they deliver, to the block when the connection fails): it wins over
        # a connection that failed meanwhile and propagates alone, as a plain
        # Cancelled, so the scope that cancelled takes it (``fail_after``
        # raises TooSlowError), never a raw group of the transport's errors.
        # The block's own exception, if it raised one, passes through.
        return from_block if from_block is not None else cancelled[0]
    if not opened:
        return _connect_failure(leaves, server, "connect")
    # What the connection itself raised, beside the block's own exception.
    lost = [leaf for leaf in leaves if leaf is not from_block]
    if not lost:
        return from_block
    if from_block is None or isinstance(from_block, trio.Cancelled):
        return _connect_failure(lost, server, "session")
    if isinstance(from_block, Error) and all(isinstance(leaf, Exception) for leaf in lost):
        # a classed failure of the block (a call that lost the connection,
        # say) beside the connection's own: the block's is the one to see
        return from_block
    return None


def _connect_failure(leaves: list[BaseException], server: str, method: str) -> Error | None:
    """The classed ``Error`` for a connection that failed (``method``
    ``"connect"``: connecting, initializing or listing; ``"session"``:
    later); ``None`` when it must propagate as it is (a cancellation,
    ``KeyboardInterrupt``, ``SystemExit``)."""
    if any(not isinstance(leaf, Exception) for leaf in leaves):
        return None
    ours = [leaf for leaf in leaves if isinstance(leaf, Error)]
    if ours:
        return ours[0]  # already classed (a refused initialize, a malformed listing)
    first = leaves[0]
    return Error(
        ErrorClass.TRANSIENT_TRANSPORT,
        "MCP server could not be reached" if method == "connect" else "MCP connection failed",
        {
            "method": method,
            "server": server[:_MAX_CAUSE],
            "cause": f"{type(first).__name__}: {first}"[:_MAX_CAUSE],
        },
    )


def _check_text(argument: str, value: Any, *, empty: bool = False) -> None:
    if type(value) is not str or (not value and not empty) or "\0" in value:
        raise Error(
            ErrorClass.VALIDATION,
            f"{argument} must be a {'' if empty else 'non-empty '}str",
            {"argument": argument, "type": type(value).__name__},
        )


@asynccontextmanager
async def connect_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    errlog: TextIO | None = None,
    validate_arguments: bool = False,
    validate_structured_content: bool = False,
    validator: SchemaValidator | None = None,
    cache: ValidatorCache | None = None,
    call_timeout: float | None = None,
    read_timeout: float | None = 30.0,
) -> AsyncIterator[McpToolSource]:
    """Start ``command`` as an MCP server subprocess, initialize and list its tools.

    The subprocess is stopped when the block ends, however it ends.
    ``read_timeout`` bounds every request but calls (see ``call_timeout``).

    Known limitation (the ``mcp`` SDK's): the server runs in its own process
    group, but the SDK kills that group only when the server outlives the
    grace period after its standard input is closed.  A server that exits
    promptly on end of input leaves the processes it started (its children)
    running; a server that starts helpers must stop them itself.  The SDK
    does not expose the process, so the adapter cannot kill the group
    without re-implementing ``stdio_client``.
    """
    _check_text("command", command)
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise Error(ErrorClass.VALIDATION, "args must be a list of str", {"argument": "args"})
    for arg in args:
        _check_text("args", arg, empty=True)
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(type(k) is str and type(v) is str for k, v in env.items())
    ):
        raise Error(
            ErrorClass.VALIDATION, "env must be a mapping of str to str", {"argument": "env"}
        )
    if cwd is not None:
        _check_text("cwd", cwd)
    _check_seconds("read_timeout", read_timeout)
    source = McpToolSource(
        validate_arguments=validate_arguments,
        validate_structured_content=validate_structured_content,
        validator=validator,
        cache=cache,
        call_timeout=call_timeout,
    )
    # "replace": one undecodable byte on the server's stdout must not kill
    # the SDK's reader (which then drains stdout and never reports it, so a
    # call would wait forever); the line fails to parse as JSON-RPC instead.
    params = StdioServerParameters(
        command=command,
        args=list(args),
        env=None if env is None else dict(env),
        cwd=cwd,
        encoding_error_handler="replace",
    )
    streams = stdio_client(params) if errlog is None else stdio_client(params, errlog=errlog)
    async with _open(streams, source, read_timeout, command) as opened:
        yield opened


@asynccontextmanager
async def connect_streamable_http(
    url: str,
    *,
    validate_arguments: bool = False,
    validate_structured_content: bool = False,
    validator: SchemaValidator | None = None,
    cache: ValidatorCache | None = None,
    call_timeout: float | None = None,
    read_timeout: float | None = 30.0,
) -> AsyncIterator[McpToolSource]:
    """Connect to an MCP server over streamable HTTP, initialize and list its tools.

    A server that cannot be reached, or fails to initialize or list, raises
    a classed ``Error`` (``transient_transport`` for the connection itself).
    """
    from mcp.client.streamable_http import streamable_http_client

    _check_text("url", url)
    if not url.startswith(("http://", "https://")):
        raise Error(ErrorClass.VALIDATION, "url must be an http(s) URL", {"argument": "url"})
    _check_seconds("read_timeout", read_timeout)

    source = McpToolSource(
        validate_arguments=validate_arguments,
        validate_structured_content=validate_structured_content,
        validator=validator,
        cache=cache,
        call_timeout=call_timeout,
    )
    async with _open(streamable_http_client(url), source, read_timeout, url) as opened:
        yield opened
