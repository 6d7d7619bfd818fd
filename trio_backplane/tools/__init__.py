"""Tool descriptors, registries, authority, batch admission and approval binding.

Pure: no I/O, no Trio, no clock reads.  Imports only ``trio_backplane.schema``
and ``trio_backplane.errors``.
"""

from .._public import fixup_module_metadata
from ._admission import MODES, AdmittedBundle, admit_batch, has_awaitable_execute
from ._approval import (
    DECISIONS,
    Approval,
    ApprovalDecision,
    arguments_digest,
    decide_approval,
)
from ._authority import Authority, Invocation, InvocationLike, authorize
from ._descriptor import DUPLICATE_NAMES, ProviderTool, ToolDescriptor, ToolRegistry
from ._names import MAX_NAME_LENGTH, check_name, is_mcp_name
from ._publication import RECEIPT_STATUSES, CatalogUpdate, Publication, PublicationReceipt
from ._rejected import Rejected
from ._results import (
    IDENTITY_FIELDS,
    Rejection,
    ToolResult,
    reject,
    settlement,
    verify_rejection,
)

__all__ = [
    "DECISIONS",
    "DUPLICATE_NAMES",
    "IDENTITY_FIELDS",
    "MAX_NAME_LENGTH",
    "MODES",
    "RECEIPT_STATUSES",
    "AdmittedBundle",
    "Approval",
    "ApprovalDecision",
    "Authority",
    "CatalogUpdate",
    "Invocation",
    "InvocationLike",
    "ProviderTool",
    "Publication",
    "PublicationReceipt",
    "Rejected",
    "Rejection",
    "ToolDescriptor",
    "ToolRegistry",
    "ToolResult",
    "admit_batch",
    "arguments_digest",
    "authorize",
    "check_name",
    "decide_approval",
    "has_awaitable_execute",
    "is_mcp_name",
    "reject",
    "settlement",
    "verify_rejection",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
