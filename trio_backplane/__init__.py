"""trio_backplane: LLM agent conversations on Trio whose tool calls cross a
strict, durable boundary.

The top level holds what a host application uses: conversations and their
events, providers' stream events, stores, tools and their descriptors,
catalogs, errors, and the schema options a descriptor takes.  The rest lives
in its sub-namespace: ``trio_backplane.schema`` (``compile``, ``validate``
and the other entry points of the boundary), ``trio_backplane.tools``
(authorization and approval binding), ``trio_backplane.kernel`` (run
records, the state machine, codecs), ``trio_backplane.store`` (the
protocol's receipts and checks), ``trio_backplane.recovery``,
``trio_backplane.runtime``, ``trio_backplane.testing`` (the test kit) and
``trio_backplane.adapters`` (MCP, OpenAI-compatible; optional extras).
"""

import warnings as _warnings
from typing import Any as _Any

from . import errors, kernel, recovery, runtime, schema, store, testing, tools
from ._public import fixup_module_metadata
from ._version import __version__ as __version__
from .errors import Error as Error
from .errors import ErrorClass as ErrorClass
from .runtime import Continue as Continue
from .runtime import Conversation as Conversation
from .runtime import Event as Event
from .runtime import HookContext as HookContext
from .runtime import Hooks as Hooks
from .runtime import Phase as Phase
from .runtime import Provider as Provider
from .runtime import ProviderEvent as ProviderEvent
from .runtime import ProviderRequest as ProviderRequest
from .runtime import ResourceCleanup as ResourceCleanup
from .runtime import ResponseCompleted as ResponseCompleted
from .runtime import ResponseFailed as ResponseFailed
from .runtime import Snapshot as Snapshot
from .runtime import TextDelta as TextDelta
from .runtime import ThinkingDelta as ThinkingDelta
from .runtime import ToolCallArgumentsDelta as ToolCallArgumentsDelta
from .runtime import ToolCallCompleted as ToolCallCompleted
from .runtime import ToolCallStarted as ToolCallStarted
from .runtime import ToolContext as ToolContext
from .runtime import ToolOperation as ToolOperation
from .runtime import Usage as Usage
from .runtime import open_conversation as open_conversation
from .schema import Limits as Limits
from .schema import SchemaOptions as SchemaOptions
from .store import MemoryStore as MemoryStore
from .store import PostgresStore as PostgresStore
from .store import SQLiteStore as SQLiteStore
from .store import Store as Store
from .tools import AdmittedBundle as AdmittedBundle
from .tools import Authority as Authority
from .tools import CatalogUpdate as CatalogUpdate
from .tools import ProviderTool as ProviderTool
from .tools import Publication as Publication
from .tools import PublicationReceipt as PublicationReceipt
from .tools import Rejected as Rejected
from .tools import Rejection as Rejection
from .tools import ToolDescriptor as ToolDescriptor
from .tools import ToolRegistry as ToolRegistry
from .tools import ToolResult as ToolResult
from .tools import admit_batch as admit_batch
from .tools import reject as reject

__all__ = [
    "AdmittedBundle",
    "Authority",
    "CatalogUpdate",
    "Continue",
    "Conversation",
    "Error",
    "ErrorClass",
    "Event",
    "HookContext",
    "Hooks",
    "Limits",
    "MemoryStore",
    "Phase",
    "PostgresStore",
    "Provider",
    "ProviderEvent",
    "ProviderRequest",
    "ProviderTool",
    "Publication",
    "PublicationReceipt",
    "Rejected",
    "Rejection",
    "ResourceCleanup",
    "ResponseCompleted",
    "ResponseFailed",
    "SQLiteStore",
    "SchemaOptions",
    "Snapshot",
    "Store",
    "TextDelta",
    "ThinkingDelta",
    "ToolCallArgumentsDelta",
    "ToolCallCompleted",
    "ToolCallStarted",
    "ToolContext",
    "ToolDescriptor",
    "ToolOperation",
    "ToolRegistry",
    "ToolResult",
    "Usage",
    "admit_batch",
    "open_conversation",
    "reject",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata

# Every public name of the sub-namespaces used to be importable from here too
# (hosts written against that surface exist).  Those names still resolve,
# with a DeprecationWarning naming their home, and are not exported.
_MOVED = {
    name: module
    for module in (errors, schema, tools, kernel, store, recovery, runtime, testing)
    for name in module.__all__
    if name not in __all__
}


def __getattr__(name: str) -> _Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'trio_backplane' has no attribute {name!r}")
    _warnings.warn(
        f"trio_backplane.{name} is deprecated: import it from {module.__name__}",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(module, name)
