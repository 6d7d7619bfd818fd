"""What a fleet runs: named agents, each a factory of a run's parts."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, final

import attrs

from ..errors import Error, ErrorClass
from ..tools import Authority, ToolRegistry

__all__ = ["AgentSpec", "FleetApp", "load_app"]


@final
@attrs.frozen(kw_only=True)
class AgentSpec:
    """One run's provider and tools, and its bounds; ``authority`` defaults
    to every tool of ``registry``."""

    provider: Any
    registry: ToolRegistry
    authority: Authority | None = None
    work: int = 100
    run_timeout: float = 300.0
    effect_timeout: float = 30.0


#: ``factory(run_id)`` -> the spec of that run (sync or async).
AgentFactory = Callable[[str], "AgentSpec | Awaitable[AgentSpec]"]


@final
class FleetApp:
    """The agents a host module defines; workers import it (``--app
    package.module``, its ``app`` attribute)."""

    def __init__(self) -> None:
        self._agents: dict[str, AgentFactory] = {}

    def agent(self, name: str) -> Callable[[AgentFactory], AgentFactory]:
        """Register the decorated factory as agent ``name``."""
        if type(name) is not str or not name:
            raise Error(ErrorClass.VALIDATION, "an agent name must be a non-empty str")

        def register(factory: AgentFactory) -> AgentFactory:
            if name in self._agents:
                raise Error(ErrorClass.VALIDATION, "agent already defined", {"agent": name})
            self._agents[name] = factory
            return factory

        return register

    @property
    def names(self) -> list[str]:
        return sorted(self._agents)

    async def spec(self, agent: str, run_id: str) -> AgentSpec:
        factory = self._agents.get(agent)
        if factory is None:
            raise Error(ErrorClass.NOT_FOUND, "no such agent in the app", {"agent": agent})
        spec = factory(run_id)
        if inspect.isawaitable(spec):
            spec = await spec
        if not isinstance(spec, AgentSpec):
            raise Error(ErrorClass.VALIDATION, "an agent factory must return an AgentSpec")
        return spec


def load_app(path: str) -> FleetApp:
    """``package.module`` (its ``app``) or ``package.module:name``."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Error(ErrorClass.NOT_FOUND, f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, FleetApp):
        raise Error(ErrorClass.VALIDATION, f"{path!r} is not a FleetApp")
    return app
