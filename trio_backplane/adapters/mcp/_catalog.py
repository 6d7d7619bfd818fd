"""The tools one MCP server listed, checked: the pure core, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, final

import attrs

from ...errors import Error, ErrorClass
from ...kernel import freeze, thaw
from ...schema import Limits, check_bounds
from ...tools import Rejected, ToolResult, check_name
from ._errors import MAX_CAUSE
from ._validators import BoundaryValidator, Built, SchemaValidator, ValidatorCache, tool_fingerprint

__all__ = ["McpCatalog", "McpTool", "json_arguments"]

Role = Literal["input", "output"]
#: Refusal reasons a build failure keeps instead of ``"build_failed"``.
_KEPT_BUILD_REASONS: Final = frozenset({"root_not_object"})


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
    #: its ``execution.taskSupport``: ``"forbidden"`` (the default),
    #: ``"optional"`` or ``"required"`` (callable only as a task)
    task_support: str = "forbidden"


def _task_support(definition: Mapping[str, Any]) -> str:
    """A definition's ``execution.taskSupport`` (``"forbidden"`` when absent
    or not one of the three values)."""
    execution = definition.get("execution")
    support = execution.get("taskSupport") if isinstance(execution, Mapping) else None
    return support if support in ("optional", "required") else "forbidden"


def _unsafe(name: str, role: Role, built: Built) -> tuple[Error, Error]:
    """The error a call raises and the full diagnostics kept as ``Rejected``."""
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
    tool-name rule, its ``inputSchema`` is refused or fails to build, or,
    only with ``validate_structured_content``, its ``outputSchema`` is.
    Every schema used passes ``check_bounds`` first.
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
        #: the server runs ``tools/call`` as tasks (its capabilities say so,
        #: and the session can send the requests): set before :meth:`admit`
        self.tasks_supported = False
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
        """Replace the catalog with ``definitions``, admitted or refused one by one."""
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
        built_output: Built | None = None
        if self.validate_structured_content and output_schema is not None:
            built_output = self._built(fingerprint, "output", output_schema)
            if built_output.refusal is not None:
                raised, kept = _unsafe(name, "output", built_output)
                return raised, Rejected(name, revision, kept)
        else:
            output_schema = None  # ignored: never used, never built
        description = definition.get("description")
        annotations = definition.get("annotations")
        task_support = _task_support(definition)
        if task_support == "required" and not self.tasks_supported:
            refusal = Error(
                ErrorClass.UNSUPPORTED_CAPABILITY,
                f"MCP tool {name!r} runs only as a task, and the server offers no tasks",
                {"reason": "tasks_unsupported", "tool": name},
            )
            return refusal, Rejected(name, revision, refusal)
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
            task_support=task_support,
        )

    def _built(self, fingerprint: str | None, role: Role, schema: Any) -> Built:
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

    def _build(self, role: Role, schema: Any) -> Built:
        try:
            check_bounds(schema, Limits.mcp(), allow_external_refs=False)
        except Error as error:
            return Built(refusal=error, stage="bounds")
        try:
            return Built(compiled=self.validator.build(schema, output=role == "output"))
        except Error as error:
            return Built(refusal=error, stage="build")
        except Exception as exc:  # a swapped validator must still fail closed, classed
            crash = Error(
                ErrorClass.EXECUTION_FAILURE,
                "schema validator failed to build the schema",
                {"cause": f"{type(exc).__name__}: {exc}"[:MAX_CAUSE]},
            )
            return Built(refusal=crash, stage="build")

    # -- calls ---------------------------------------------------------------

    def prepare(self, name: str, arguments: Any) -> McpTool:
        """Everything checked before a call is sent; raises ``Error``."""
        refused = self._refused.get(name)
        if refused is not None:
            raise refused[0]
        tool = self._tools.get(name)
        if tool is None:
            raise Error(ErrorClass.NOT_FOUND, "MCP server lists no such tool", {"tool": name})
        json_arguments(name, arguments)
        if self.validate_arguments:
            try:
                self.validator.validate(tool.compiled_input, arguments)
            except Error as error:
                raise _boundary_refusal(name, error) from None
            except Exception as exc:
                raise _validator_crash(exc) from exc
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
        """A server result (its JSON data) as a ``ToolResult``.

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


def json_arguments(name: str, arguments: Any) -> dict[str, Any] | None:
    """Tool ``name``'s call ``arguments`` as the plain JSON object sent
    (``None``: none), whatever ``validate_arguments`` says.

    Anything else is refused with ``validation`` ``invalid_arguments``
    before a request is built: a root that is not an object, a non-str key,
    NaN or infinity (which the SDK's encoder would send as ``null``), a lone
    surrogate (which kills the SDK's writer, and the session with it),
    bytes or any other non-JSON object.
    """
    if arguments is None:
        return None
    if isinstance(arguments, Mapping):
        try:
            return thaw(freeze(arguments, "arguments"))  # type: ignore[no-any-return]
        except Error as error:
            raise refused_arguments(name, error.message) from None
    raise refused_arguments(
        name, f"arguments must be a JSON object, not {type(arguments).__name__}"
    )


def refused_arguments(name: str, cause: str, **more: Any) -> Error:
    """The one shape of a call refused for its arguments before anything is
    sent: ``validation``, the cause in the message, ``reason``
    ``invalid_arguments``, the tool and the cause in the details."""
    return Error(
        ErrorClass.VALIDATION,
        f"arguments of MCP tool {name!r} refused: {cause}",
        {"reason": "invalid_arguments", "tool": name, "cause": cause, "errors": [], **more},
    )


def _boundary_refusal(name: str, error: Error) -> Error:
    """The schema boundary's refusal of a call's arguments, in that shape:
    a mismatch with its errors, a resource limit with the limit it hit."""
    details = dict(error.details)
    if error.error_class is ErrorClass.VALIDATION:
        errors = list(details.get("errors", ()))
        return refused_arguments(name, "they do not match its inputSchema", errors=errors)
    reason = details.pop("reason", None)
    cause = error.message if reason is None else f"{error.message} ({reason})"
    details.pop("tool", None)
    return refused_arguments(name, cause, **details)


def _validator_crash(exc: BaseException) -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        "schema validator failed",
        {"cause": f"{type(exc).__name__}: {exc}"[:MAX_CAUSE]},
    )
