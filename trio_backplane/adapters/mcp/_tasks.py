"""``tools/call`` as an MCP task: created, recorded, polled to its end,
its result fetched; cancelled with the call that waits for it.

The requests go through the adapter's own dispatcher as JSON data (the
SDK's models do not know the task requests of this protocol revision).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from ...errors import Error, ErrorClass
from ._errors import MAX_CAUSE, NOT_SENT
from ._sdk import MCPError

__all__ = ["TERMINAL", "call_as_task", "server_runs_tasks"]

#: How long a created task is kept by the server (ms) when asked.
_TTL_MS: Final = 3_600_000
#: The poll interval's bounds (s), whatever the server suggests.
_POLL_MIN, _POLL_MAX = 0.05, 5.0
#: How long a cancelled call waits for ``tasks/cancel`` to be acknowledged.
_CANCEL_BOUND: Final = 5.0
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})

Send = Callable[[str, Mapping[str, Any] | None], Awaitable[Any]]
Record = Callable[[Mapping[str, Any]], Awaitable[None]]


def server_runs_tasks(capabilities: Any) -> bool:
    """Whether a server's capabilities offer ``tools/call`` as a task."""
    tasks = getattr(capabilities, "tasks", None)
    requests = getattr(tasks, "requests", None)
    tools = getattr(requests, "tools", None)
    return getattr(tools, "call", None) is not None


def _task_error(tool: str, message: str, **details: Any) -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        f"MCP tool {tool!r} {message}",
        {"tool": tool, "certainty": "uncertain", **details},
    )


async def call_as_task(
    send: Send, tool: str, arguments: Any, *, record: Record | None = None
) -> Any:
    """Run ``tools/call`` of ``tool`` as a task: its raw ``CallToolResult``.

    ``record`` is given the task's id once the server created it (before
    any wait), so a host or a recovery can look the task up.  While the
    call waits, a cancellation of the caller (a stop, a deadline) cancels
    the task, bounded, then goes on.
    """
    created = await send(
        "tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": _TTL_MS}}
    )
    task = created.get("task") if isinstance(created, Mapping) else None
    task_id = task.get("taskId") if isinstance(task, Mapping) else None
    if not isinstance(task, Mapping) or not isinstance(task_id, str) or not task_id:
        raise _task_error(tool, "was not created as a task", cause=str(created)[:MAX_CAUSE])
    try:
        return await _run(send, tool, task, record)
    except MCPError as exc:
        # the task exists: a request about it that was never sent leaves
        # its outcome unknown, never "not sent"
        data = None if exc.data is NOT_SENT else exc.data
        raise MCPError(exc.code, exc.message, data) from None


async def _run(send: Send, tool: str, task: Mapping[str, Any], record: Record | None) -> Any:
    """Record the created ``task``, wait for its end and fetch its result;
    cancel it, bounded, when anything stops that."""
    task_id = str(task["taskId"])
    try:
        if record is not None:
            await record({"kind": "mcp_task", "task_id": task_id, "tool": tool})
        status = await _until_done(send, tool, task)
    except BaseException:
        with trio.move_on_after(_CANCEL_BOUND) as bound:
            bound.shield = True
            await _cancel(send, task_id)
        raise
    if status == "cancelled":
        raise _task_error(tool, "task was cancelled by the server", task_id=task_id)
    return await send("tasks/result", {"taskId": task_id})


async def _until_done(send: Send, tool: str, task: Mapping[str, Any]) -> str:
    """Poll ``tasks/get`` until the task ends: its final status."""
    while True:
        status = task.get("status")
        if status in TERMINAL:
            return str(status)
        if status == "input_required":
            # the adapter answers no server request (elicitation, sampling)
            raise _task_error(
                tool, "task asks for input the adapter cannot give", task_id=task.get("taskId")
            )
        interval = task.get("pollInterval")
        seconds = interval / 1000 if isinstance(interval, int | float) else 1.0
        await trio.sleep(min(max(seconds, _POLL_MIN), _POLL_MAX))
        task = await send("tasks/get", {"taskId": task.get("taskId")})
        if not isinstance(task, Mapping):
            raise _task_error(tool, "task status is not an object", cause=str(task)[:MAX_CAUSE])


async def _cancel(send: Send, task_id: str) -> None:
    """Ask the server to cancel ``task_id``; a refusal (it ended meanwhile,
    or the connection is gone) changes nothing for the caller."""
    try:
        await send("tasks/cancel", {"taskId": task_id})
    except Exception:
        return
