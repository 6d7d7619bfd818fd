"""trio_backplane: LLM agent conversations on Trio whose tool calls cross a
strict, durable boundary.

Everything public is importable from here; the subpackages hold the code.
"""

from .errors import Error, ErrorClass
from .schema import (
    CompiledSchema,
    Limits,
    SchemaOptions,
    check_bounds,
    compile,
    compile_output,
    validate,
    validate_output,
    validate_schema,
)
from .tools import (
    AdmittedBundle,
    Approval,
    ApprovalDecision,
    Authority,
    CatalogUpdate,
    Invocation,
    ProviderTool,
    Publication,
    PublicationReceipt,
    Rejected,
    ToolDescriptor,
    ToolRegistry,
    admit_batch,
    arguments_digest,
    authorize,
    decide_approval,
)

__version__ = "0.1.0"

__all__ = [
    "AdmittedBundle",
    "Approval",
    "ApprovalDecision",
    "Authority",
    "CatalogUpdate",
    "CompiledSchema",
    "Error",
    "ErrorClass",
    "Invocation",
    "Limits",
    "ProviderTool",
    "Publication",
    "PublicationReceipt",
    "Rejected",
    "SchemaOptions",
    "ToolDescriptor",
    "ToolRegistry",
    "__version__",
    "admit_batch",
    "arguments_digest",
    "authorize",
    "check_bounds",
    "compile",
    "compile_output",
    "decide_approval",
    "validate",
    "validate_output",
    "validate_schema",
]
