"""The collaboration tools a model calls: spawn, message, follow up,
interrupt, close, list and wait."""

from __future__ import annotations

from typing import Any, Final

from ..errors import Error
from ..tools import Rejection, ToolDescriptor, ToolResult, reject
from ..tools._backend import FunctionBackend
from ._agent import Agent
from ._manager import AgentManager

__all__ = ["agent_tools"]

_TEXT: Final = {"type": "string", "minLength": 1, "maxLength": 65_536}
_TASK: Final = {"type": "string", "pattern": "^[a-z0-9_]{1,64}$"}
_TARGET: Final = {"type": "string", "minLength": 1, "maxLength": 1024}


def _schema(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _view(agent: Agent) -> dict[str, Any]:
    return {"agent_name": agent.name, "run_id": agent.run_id, "status": agent.public_status()}


def _result(structured: dict[str, Any], text: str) -> ToolResult:
    return ToolResult(text, structured_content=structured)


class _Tools:
    """The tools' backends, over one manager."""

    def __init__(self, manager: AgentManager) -> None:
        self.manager = manager

    async def spawn(self, operation: Any) -> ToolResult | Rejection:
        args = operation.arguments
        try:
            agent = await self.manager.spawn(operation.run_id, args["task_name"], args["message"])
        except Error as error:
            return reject(operation, error)  # nothing started
        return _result({"task_name": agent.name, "nickname": None}, f"spawned {agent.name}")

    def _target(self, operation: Any) -> Agent:
        caller, _ = self.manager.caller(operation.run_id)
        return self.manager.resolve(caller, operation.arguments["target"])

    async def send_message(self, operation: Any) -> ToolResult | Rejection:
        try:
            agent = self._target(operation)
            await self.manager.running(agent).steer(operation.arguments["message"])
        except Error as error:
            return reject(operation, error)
        return _result(_view(agent), f"sent to {agent.name}")

    async def followup(self, operation: Any) -> ToolResult | Rejection:
        """A follow-up for a running agent; a fresh run (its transcript, the
        quota and time left) for one that completed or was interrupted."""
        message = operation.arguments["message"]
        try:
            agent = self._target(operation)
            if agent.status == "running":
                await self.manager.running(agent).follow_up(message)
            else:
                await self.manager.replace(operation.run_id, agent, message)
        except Error as error:
            return reject(operation, error)
        return _result(_view(agent), f"{agent.name} is working ({agent.run_id})")

    async def interrupt(self, operation: Any) -> ToolResult:
        agent = self._target(operation)
        await self.manager.interrupt(agent)
        return _result(_view(agent), f"{agent.name} interrupted")

    async def close(self, operation: Any) -> ToolResult:
        agent = self._target(operation)
        closures = await self.manager.close(agent)
        return _result({**_view(agent), "closed": [c.id for c in closures]}, f"closed {agent.name}")

    async def listing(self, operation: Any) -> ToolResult:
        caller, _ = self.manager.caller(operation.run_id)
        prefix = operation.arguments.get("path_prefix") or caller + "/"
        agents = [_view(a) for a in self.manager.agents(prefix)]
        return _result(
            {"agents": agents},
            "\n".join(f"{a['agent_name']}: {a['status']}" for a in agents) or "no agents",
        )

    async def wait(self, operation: Any) -> ToolResult | Rejection:
        try:
            caller, _ = self.manager.caller(operation.run_id)
            seconds = self.manager.wait_timeout(operation.arguments.get("timeout_ms"))
        except Error as error:
            return reject(operation, error)
        ready = await self.manager.wait(caller, seconds)
        if not ready:
            message = "Timed out waiting for agent updates."
        else:
            message = "Agent updates are available for: " + ", ".join(ready)
        return _result({"message": message, "timed_out": not ready}, message)


_Row = tuple[str, Any, dict[str, Any], bool, str]


def _table(tools: _Tools, wait_ms: dict[str, Any]) -> list[_Row]:
    """Each tool's name, backend, schema, whether read-only, description."""
    message = _schema({"target": _TARGET, "message": _TEXT}, "target", "message")
    target = _schema({"target": _TARGET}, "target")
    return [
        (
            "spawn_agent",
            tools.spawn,
            _schema({"task_name": _TASK, "message": _TEXT}, "task_name", "message"),
            False,
            "Start a child agent named task_name on message; it works on its own.",
        ),
        (
            "send_message",
            tools.send_message,
            message,
            False,
            "Steer a running agent (target: its name) with message.",
        ),
        (
            "followup_task",
            tools.followup,
            message,
            False,
            "Give an agent a follow-up task; one that finished starts again with its history.",
        ),
        (
            "interrupt_agent",
            tools.interrupt,
            target,
            False,
            "Stop an agent's current work (and its own agents').",
        ),
        ("close_agent", tools.close, target, False, "Close an agent and its own agents for good."),
        (
            "list_agents",
            tools.listing,
            _schema({"path_prefix": {"type": "string", "maxLength": 1024}}),
            True,
            "List your agents (or those under path_prefix) and their status.",
        ),
        (
            "wait_agent",
            tools.wait,
            _schema({"timeout_ms": wait_ms}),
            True,
            "Wait until one of your agents finishes or changes, up to timeout_ms.",
        ),
    ]


def agent_tools(manager: AgentManager) -> list[ToolDescriptor]:
    """``spawn_agent``, ``send_message``, ``followup_task``,
    ``interrupt_agent``, ``close_agent``, ``list_agents`` (read-only) and
    ``wait_agent`` (read-only) over ``manager``, which each names as its
    ``resource_registry``: a run using them closes the trees it spawned on
    every terminal path."""
    tools = _Tools(manager)
    low, default, high = (int(s * 1000) for s in manager.wait_bounds)
    wait_ms = {"type": "integer", "minimum": low, "maximum": high, "default": default}
    context = {"resource_registry": manager}
    table = _table(tools, wait_ms)
    return [
        ToolDescriptor(
            name=name,
            schema=schema,
            backend=FunctionBackend(run),
            backend_context=context,
            description=description,
            read_only=read_only,
        )
        for name, run, schema, read_only, description in table
    ]
