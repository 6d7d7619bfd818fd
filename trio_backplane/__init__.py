"""trio_backplane: LLM agent conversations on Trio whose tool calls cross a
strict, durable boundary.

Everything public is importable from here; the subpackages hold the code.
"""

from .errors import Error, ErrorClass
from .recovery import CrashReport, EffectReport, RecoveryHarness, RecoveryReport, recover
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
from .store import PostgresStore
from .testing import StoreConformance
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
    "CrashReport",
    "EffectReport",
    "Error",
    "ErrorClass",
    "Invocation",
    "Limits",
    "PostgresStore",
    "ProviderTool",
    "Publication",
    "PublicationReceipt",
    "RecoveryHarness",
    "RecoveryReport",
    "Rejected",
    "SchemaOptions",
    "StoreConformance",
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
    "recover",
    "validate",
    "validate_output",
    "validate_schema",
]
