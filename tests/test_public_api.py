"""The public surface, pinned: a change to it is a deliberate act.

The top level exports what a host application uses; everything else public
lives in its sub-namespace.  Each name's ``__module__`` is the path a user
imports it from, classes not meant for subclassing are ``@final``, and the
reference documentation (``docs/reference/``) documents exactly these names.
"""

from __future__ import annotations

import builtins
import enum
import importlib
import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import attrs
import pytest

import trio_backplane

from .conftest import REPO

TOP_LEVEL = [
    "AdmittedBundle", "Authority", "CatalogUpdate", "Continue", "Conversation", "Error",
    "ErrorClass", "Event", "HookContext", "Hooks", "Limits", "MemoryStore", "Phase",
    "PostgresStore", "Provider", "ProviderEvent", "ProviderRequest", "ProviderTool", "Publication",
    "PublicationReceipt", "Rejected", "Rejection", "ResourceCleanup", "ResponseCompleted",
    "ResponseFailed", "SQLiteStore", "SchemaOptions", "Snapshot", "Store", "TextDelta",
    "ThinkingDelta", "ToolCallArgumentsDelta", "ToolCallCompleted", "ToolCallStarted",
    "ToolContext", "ToolDescriptor", "ToolOperation", "ToolRegistry", "ToolResult", "Usage",
    "admit_batch", "open_conversation", "reject",
]  # fmt: skip

#: every public sub-namespace and its ``__all__``
NAMESPACES: dict[str, list[str]] = {
    "trio_backplane.errors": ["Error", "ErrorClass"],
    "trio_backplane.schema": [
        "CACHE_SIZE", "DIALECTS", "MAX_ERROR_ENTRIES", "REGEX_BACKTRACK_LIMIT", "CompiledSchema",
        "Limits", "SchemaLoader", "SchemaOptions", "cache_clear", "cache_info", "check_bounds",
        "compile", "compile_output", "compile_with", "validate", "validate_output",
        "validate_schema",
    ],
    "trio_backplane.tools": [
        "DECISIONS", "DUPLICATE_NAMES", "IDENTITY_FIELDS", "MAX_NAME_LENGTH", "MODES",
        "RECEIPT_STATUSES", "AdmittedBundle", "Approval", "ApprovalDecision", "Authority",
        "CatalogUpdate", "Invocation", "InvocationLike", "ProviderTool", "Publication",
        "PublicationReceipt", "Rejected", "Rejection", "ToolDescriptor", "ToolRegistry",
        "ToolResult", "admit_batch", "arguments_digest", "authorize", "check_name",
        "decide_approval", "has_awaitable_execute", "is_mcp_name", "reject", "settlement",
        "verify_rejection",
    ],
    "trio_backplane.kernel": [
        "ACTIVE_STATES", "COMMANDS", "GROWING", "MAX_INT", "MAX_RUN_ID", "RUN_STATES",
        "SCHEMA_VERSION", "TERMINAL_STATES", "UNSET", "Budget", "Command", "FrozenDict",
        "FrozenList", "LayeredDict",
        # one typed class per command kind, and their base
        "Admit", "Cancel", "ChildSettled", "CleanupSettled", "ConversationUpdated",
        "DeadlineExceeded", "Finish", "KernelCommand", "ProviderCompleted", "ProviderStarted",
        "Start", "ToolCompleted", "ToolInvoked", "WaitResolved", "WaitStarted",
        "RunEvent", "RunRecord", "appended", "assoc", "build_command", "changed_keys",
        "check_json",
        "check_run_id", "cleanup_requirements", "decode_event", "decode_record", "dissoc",
        "dumps", "loads", "encode_event", "encode_record", "evolve_record", "fence", "freeze",
        "is_time", "reserve", "thaw", "transition", "utf8_size",
    ],
    "trio_backplane.store": [
        "MemoryStore", "PostgresStore", "PreparedCommit", "Receipt", "RunSummary",
        "SQLiteStore", "Store", "check_commit", "prepare_commit", "prepare_create",
        "verify_receipt",
    ],
    "trio_backplane.recovery": [
        "DISPATCH_STATES", "EFFECT_CLASSES", "EffectReport", "RecoveryReport", "Replacement",
        "Settled", "recover", "replacement_for", "settle_run",
    ],
    "trio_backplane.codemode": ["CellResult", "CodeWorker", "code_mode_tools"],
    "trio_backplane.fleet": [
        "AgentSpec", "FleetApp", "Worker", "continue_run", "load_app", "pending", "resolve",
        "submit", "wait", "watch",
    ],
    "trio_backplane.agents": [
        "AgentManager", "AgentRequest", "ChildOptions", "Closure", "agent_tools",
    ],
    "trio_backplane.resources": [
        "CleanupResult", "CommandInvocation", "CommandLimits", "CommandOutput", "LocalCommand",
        "ResourceHandle", "ResourceRegistry", "command_tools", "kill_orphans",
    ],
    "trio_backplane.runtime": [
        "Continue", "Conversation", "DeadlineBudget", "Event", "HookContext", "Hooks", "Phase",
        "Provider", "ProviderEvent", "ProviderRequest", "ResourceCleanup", "ResponseCompleted",
        "ResponseFailed", "Snapshot", "Telemetry", "TextDelta", "ThinkingDelta",
        "ToolCallArgumentsDelta", "ToolCallCompleted", "ToolCallStarted", "ToolContext",
        "ToolOperation", "Usage", "open_conversation",
    ],
    "trio_backplane.testing": [
        "CRASH_WINDOWS", "STO_11_CHECKS", "CrashReport", "FaultyStore", "Hang", "Raise",
        "RecoveryHarness", "ScriptedProvider", "Sleep", "StoreConformance",
    ],
    "trio_backplane.adapters.mcp": [
        "CACHE_SIZE", "MCP_SCHEMA_OPTIONS", "BoundaryValidator", "McpCatalog", "McpRefreshTool",
        "McpTool", "McpToolBackend", "McpToolSource", "SchemaValidator", "ValidatorCache",
        "connect_stdio", "connect_streamable_http", "tool_fingerprint",
    ],
    "trio_backplane.adapters.openai": [
        "OPENAI_NAME", "OpenAIProvider", "ToolAliases", "transcript_messages",
    ],
    "trio_backplane.adapters.anthropic": ["ANTHROPIC_VERSION", "AnthropicProvider"],
    "trio_backplane.console": ["Answerer", "Console", "FleetAnswers", "LocalAnswers", "serve"],
}  # fmt: skip

#: the public classes made to be subclassed (besides protocols and enums)
OPEN_CLASSES = {"Error", "ScriptedProvider", "StoreConformance"}


def _public_objects() -> list[tuple[str, Any]]:
    """``(public path, object)`` for every public name: the top level's, then
    each sub-namespace's names the top level does not export."""
    found = [(f"trio_backplane.{name}", getattr(trio_backplane, name)) for name in TOP_LEVEL]
    for module_name, names in NAMESPACES.items():
        module = importlib.import_module(module_name)
        found += [
            (f"{module_name}.{name}", getattr(module, name))
            for name in names
            if name not in TOP_LEVEL
        ]
    return found


def test_top_level_surface_is_pinned() -> None:
    assert sorted(trio_backplane.__all__) == sorted(TOP_LEVEL)
    assert len(trio_backplane.__all__) == len(set(trio_backplane.__all__))
    public = {
        name
        for name, value in vars(trio_backplane).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(TOP_LEVEL)


@pytest.mark.parametrize("module_name", sorted(NAMESPACES))
def test_sub_namespace_surface_is_pinned(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(NAMESPACES[module_name])
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.{name} is missing"


def test_star_import_shadows_no_builtin() -> None:
    namespace: dict[str, Any] = {}
    exec("from trio_backplane import *", namespace)
    exported = {name for name in namespace if name != "__builtins__"}
    assert exported == set(TOP_LEVEL)
    assert exported.isdisjoint(dir(builtins))


@pytest.mark.parametrize(("path", "obj"), _public_objects(), ids=lambda v: str(v)[:60])
def test_module_is_the_public_path(path: str, obj: Any) -> None:
    """A public class or function names the module a user imports it from,
    and that module gives back the same object under its name."""
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return  # a constant or a type alias: it has no module of its own
    assert obj.__module__ == path.rsplit(".", 1)[0], path
    assert getattr(importlib.import_module(obj.__module__), obj.__qualname__) is obj


def test_every_top_level_name_is_its_sub_namespace_s_object() -> None:
    homes = {n: m for m, names in NAMESPACES.items() for n in names if "adapters" not in m}
    for name in TOP_LEVEL:
        home = importlib.import_module(homes[name])
        assert getattr(home, name) is getattr(trio_backplane, name), name


def _public_classes() -> list[tuple[str, type]]:
    return [(path, obj) for path, obj in _public_objects() if inspect.isclass(obj)]


@pytest.mark.parametrize(("path", "cls"), _public_classes(), ids=lambda v: str(v)[:60])
def test_classes_not_made_for_subclassing_are_final(path: str, cls: type) -> None:
    if cls.__name__ in OPEN_CLASSES or getattr(cls, "_is_protocol", False):
        assert not getattr(cls, "__final__", False), path
        return
    if issubclass(cls, enum.Enum):
        return  # an enum with members cannot be subclassed at all
    assert getattr(cls, "__final__", False), f"{path} is not @final"


def test_phases_are_pinned_and_compare_as_their_values() -> None:
    """``Snapshot.phase`` is a ``Phase``: a ``str`` enum whose members equal
    the phase names hosts compared with before it existed."""
    assert [phase.value for phase in trio_backplane.Phase] == [
        "idle", "running", "waiting_interaction", "cancelling", "terminal",
        "recovery_required", "storage_failed",
    ]  # fmt: skip
    assert trio_backplane.Phase.TERMINAL == "terminal"
    assert isinstance(trio_backplane.Phase.IDLE, str)


def test_conversation_cannot_be_constructed_directly() -> None:
    with pytest.raises(TypeError, match="open_conversation"):
        trio_backplane.Conversation()
    with pytest.raises(TypeError, match="no public constructor"):
        trio_backplane.Conversation(run_id="x")


def test_moved_names_still_resolve_with_a_deprecation_warning() -> None:
    """Names that left the top level resolve from it with a DeprecationWarning
    naming their home; a name that never existed is an AttributeError."""
    from trio_backplane import kernel, schema, testing

    with pytest.warns(DeprecationWarning, match=r"trio_backplane\.kernel"):
        assert trio_backplane.RunRecord is kernel.RunRecord
    with pytest.warns(DeprecationWarning, match=r"trio_backplane\.schema"):
        assert trio_backplane.compile is schema.compile
    with pytest.warns(DeprecationWarning, match=r"trio_backplane\.testing"):
        assert trio_backplane.ScriptedProvider is testing.ScriptedProvider
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no_such_name"):
            trio_backplane.no_such_name  # noqa: B018


def test_py_typed_ships() -> None:
    assert (Path(trio_backplane.__file__).parent / "py.typed").is_file()


def test_error_classes_are_pinned() -> None:
    assert {member.name: member.value for member in trio_backplane.ErrorClass} == {
        "VALIDATION": "validation",
        "FORBIDDEN": "forbidden",
        "APPROVAL_REQUIRED": "approval_required",
        "NOT_FOUND": "not_found",
        "TIMEOUT": "timeout",
        "CANCELLED": "cancelled",
        "TRANSIENT_TRANSPORT": "transient_transport",
        "RESOURCE_CONFLICT": "resource_conflict",
        "EXECUTION_FAILURE": "execution_failure",
        "MALFORMED_RESULT": "malformed_result",
        "BUDGET_EXCEEDED": "budget_exceeded",
        "UNSUPPORTED_CAPABILITY": "unsupported_capability",
        "UNKNOWN_OUTCOME": "unknown_outcome",
        "OVERLOADED": "overloaded",
        "STORAGE_FAILED": "storage_failed",
    }


def test_open_conversation_parameters_are_pinned() -> None:
    """Hosts pass every option by name: renaming one breaks them."""
    signature = inspect.signature(trio_backplane.open_conversation)
    assert list(signature.parameters) == [
        "run_id", "store", "provider", "registry", "authority", "tools", "provider_context",
        "hooks", "context", "incarnation", "work", "run_timeout", "effect_timeout",
        "commit_timeout", "cleanup_timeout", "output_limit", "provider_output_limit",
        "schema_admission", "run", "messages", "wall_clock", "resources", "resume", "telemetry",
    ]  # fmt: skip
    kinds = [p.kind for p in signature.parameters.values()]
    assert kinds[0] is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert set(kinds[1:]) == {inspect.Parameter.KEYWORD_ONLY}


STORE_METHODS = {
    "create": ["record"],
    "load": ["run_id"],
    "commit": ["run_id", "incarnation", "expected_revision", "record", "events"],
    "fence": ["run_id", "incarnation"],
    "list_runs": ["states"],
    "events": ["run_id", "after"],
}


@pytest.mark.parametrize("store_class", ["Store", "MemoryStore", "SQLiteStore", "PostgresStore"])
def test_stores_share_the_pinned_protocol(store_class: str) -> None:
    """STO-03: each store has the protocol's coroutine methods, with its
    parameters in its order (hosts pass them by name)."""
    cls = getattr(trio_backplane, store_class)
    for name, params in STORE_METHODS.items():
        method = getattr(cls, name)
        assert inspect.iscoroutinefunction(method), f"{store_class}.{name} is not async"
        assert [p for p in inspect.signature(method).parameters if p != "self"] == params


def test_effect_identities_carry_their_fields() -> None:
    """A tool operation (TOOL-05) and a provider request (PRV-01) carry their
    identity fields; an operation's context and a conversation have their
    methods."""
    operation = {
        "run_id", "incarnation", "step_id", "attempt_id", "invocation_id", "tool_call_id",
        "turn_id", "tool_name", "tool_revision", "catalog_revision", "arguments", "caller",
        "effective_authority", "backend_context", "context",
    }  # fmt: skip
    request = {
        "run_id", "incarnation", "step_id", "attempt_id", "turn_id", "messages",
        "catalog_revision", "tools",
    }  # fmt: skip
    assert operation <= set(attrs.fields_dict(trio_backplane.ToolOperation))
    assert request <= set(attrs.fields_dict(trio_backplane.ProviderRequest))
    for name in ("emit", "interact", "stage_catalog", "nested_dispatch"):
        assert callable(getattr(trio_backplane.ToolContext, name, None)), name
    for name in (
        "prompt", "steer", "follow_up", "cancel", "resolve", "stage_catalog", "status",
        "subscribe", "wait_settled",
    ):  # fmt: skip
        assert callable(getattr(trio_backplane.Conversation, name, None)), name


# -- the project's own reference -------------------------------------------------------

REFERENCE = REPO / "docs" / "reference"
_DIRECTIVE = re.compile(
    r"^[ \t]*\.\. auto(?:class|function|data|exception|attribute)::\s+(\S+)", re.M
)


def _page_module(page: Path) -> str:
    """The public path a reference page documents: ``trio_backplane.rst`` the
    top level, ``adapters_mcp.rst`` ``trio_backplane.adapters.mcp``, any
    other ``trio_backplane.<its name>``."""
    if page.stem == "trio_backplane":
        return "trio_backplane"
    return "trio_backplane." + page.stem.replace("_", ".")


def _documented() -> list[tuple[str, str]]:
    """``(page's module, documented path)`` for every autodoc directive."""
    return [
        (_page_module(page), path)
        for page in sorted(REFERENCE.glob("*.rst"))
        if page.stem != "index"
        for path in _DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    ]


def test_reference_documents_exactly_the_public_surface() -> None:
    """The API reference has one entry per public name, at its public path,
    on the page of its namespace."""
    documented = _documented()
    paths = [path for _module, path in documented]
    assert len(paths) == len(set(paths)), "a name is documented twice"
    assert set(paths) == {path for path, _ in _public_objects()}
    misplaced = [(m, p) for m, p in documented if p.rsplit(".", 1)[0] != m]
    assert misplaced == []
