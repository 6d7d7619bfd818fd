"""Child agents: a collaboration manager whose children are real conversations."""

from .._public import fixup_module_metadata
from ._manager import AgentManager, Closure
from ._options import AgentRequest, ChildOptions
from ._tools import agent_tools

__all__ = ["AgentManager", "AgentRequest", "ChildOptions", "Closure", "agent_tools"]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
