"""A worker fleet on PostgreSQL: runs submitted from any host, claimed by
workers under leases, taken over without replay when a worker stops."""

from .._public import fixup_module_metadata
from ._app import AgentSpec, FleetApp, load_app
from ._client import pending, resolve, submit, wait, watch
from ._worker import Worker, continue_run

__all__ = [
    "AgentSpec",
    "FleetApp",
    "Worker",
    "continue_run",
    "load_app",
    "pending",
    "resolve",
    "submit",
    "wait",
    "watch",
]

fixup_module_metadata(__name__, globals())
del fixup_module_metadata
