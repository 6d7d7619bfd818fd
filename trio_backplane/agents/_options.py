"""What the host decides for a child agent, and the authority rule."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, final

import attrs

from ..errors import Error, ErrorClass
from ..tools import Authority, ToolRegistry

__all__ = ["AgentRequest", "ChildOptions", "ChildOptionsFactory", "check_within"]


@final
@attrs.frozen(kw_only=True)
class AgentRequest:
    """What the host's ``child_options`` callback is asked about: a new
    agent (``kind="spawn"``) or a fresh run of one (``"replacement"``)."""

    kind: Literal["spawn", "replacement"]
    agent_name: str
    run_id: str
    #: the name of the agent (or ``/root``) that asked
    caller: str
    message: str


@final
@attrs.frozen(kw_only=True)
class ChildOptions:
    """A child's conversation, chosen by the host, never by the model.
    ``work`` and ``run_timeout`` are the agent's quota and time for all its
    runs together."""

    provider: Any
    registry: ToolRegistry
    authority: Authority
    work: int = 100
    run_timeout: float = 300.0
    effect_timeout: float = 30.0


#: The host's callback: the options of the child ``AgentRequest`` names.
ChildOptionsFactory = Callable[[AgentRequest], "ChildOptions | Awaitable[ChildOptions]"]


def check_within(child: Authority, *limits: Authority) -> None:
    """Raise ``forbidden`` unless every grant of ``child`` (at its revision)
    is granted by each of ``limits``."""
    for limit in limits:
        wider = sorted(child.grants - limit.grants)
        if wider:
            raise Error(
                ErrorClass.FORBIDDEN,
                "a child agent's authority cannot exceed its parent's",
                {"grants": wider[:20]},
            )
        for name in child.grants:
            pinned = limit.revision_for(name)
            if pinned is not None and child.revision_for(name) != pinned:
                raise Error(
                    ErrorClass.FORBIDDEN,
                    "a child agent's tool revision differs from its parent's",
                    {"tool": name, "revision": child.revision_for(name), "parent": pinned},
                )
