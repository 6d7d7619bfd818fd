"""The tool-input schema boundary: JSON Schema Draft 2020-12 on jsonschema-rs.

One boundary, called everywhere (catalog preflight, execution, the MCP
client): exact dialect and vocabulary policy, ECMA-262 patterns, explicit
registries and loaders (never an implicit fetch), fail-closed limits,
classed errors and a fingerprint-keyed compiled cache.
"""

from .._public import fixup_module_metadata
from ._cache import CACHE_SIZE, cache_clear, cache_info
from ._compile import (
    check_bounds,
    compile,
    compile_output,
    compile_with,
    validate,
    validate_output,
    validate_schema,
)
from ._compiled import MAX_ERROR_ENTRIES, REGEX_BACKTRACK_LIMIT, CompiledSchema
from ._options import DIALECTS, Limits, SchemaLoader, SchemaOptions

__all__ = [
    "CACHE_SIZE",
    "DIALECTS",
    "MAX_ERROR_ENTRIES",
    "REGEX_BACKTRACK_LIMIT",
    "CompiledSchema",
    "Limits",
    "SchemaLoader",
    "SchemaOptions",
    "cache_clear",
    "cache_info",
    "check_bounds",
    "compile",
    "compile_output",
    "compile_with",
    "validate",
    "validate_output",
    "validate_schema",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
