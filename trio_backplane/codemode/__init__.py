"""Code Mode: model-written JavaScript in a permissionless Deno worker."""

from .._public import fixup_module_metadata
from ._tool import code_mode_tools
from ._worker import CellResult, CodeWorker

__all__ = ["CellResult", "CodeWorker", "code_mode_tools"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
