"""Run-owned resources: a registry whose cleanup is confirmed, not assumed."""

from .._public import fixup_module_metadata
from ._cleanup import CleanupResult
from ._command import CommandInvocation, LocalCommand
from ._jobs import CommandOutput
from ._launch import CommandLimits
from ._orphans import kill_orphans
from ._registry import ResourceHandle, ResourceRegistry
from ._tools import command_tools

__all__ = [
    "CleanupResult",
    "CommandInvocation",
    "CommandLimits",
    "CommandOutput",
    "LocalCommand",
    "ResourceHandle",
    "ResourceRegistry",
    "command_tools",
    "kill_orphans",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
