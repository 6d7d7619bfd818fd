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

__version__ = "0.1.0"

__all__ = [
    "CompiledSchema",
    "Error",
    "ErrorClass",
    "Limits",
    "SchemaOptions",
    "__version__",
    "check_bounds",
    "compile",
    "compile_output",
    "validate",
    "validate_output",
    "validate_schema",
]
