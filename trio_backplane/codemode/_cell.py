"""One Code Mode cell: a worker owned by the run, driven by whichever
invocation (``code`` or ``code_wait``) is executing now."""

from __future__ import annotations

import json
from typing import Any, final

import attrs

from ..errors import Error, ErrorClass
from ..tools import ToolResult
from ._worker import Answer, CellResult, CodeWorker, fulfilment, refusal

__all__ = ["Cell", "answer_for", "finished", "running"]


@final
@attrs.define(kw_only=True, eq=False)
class Cell:
    """A cell's identity outlives the invocations that drive it: its worker,
    its state identity, its nested-call counter and how much of its output
    was reported."""

    worker: CodeWorker
    #: which ``store``/``load`` values it sees
    identity: str
    #: the registry's id, once registered
    cell_id: str = ""
    #: requests it made (tool calls, ``store``, ``load``)
    calls: int = 0
    cursor: int = 0

    async def stop(self) -> str:
        """The registry's cleanup: the worker's group confirmed gone, or why not."""
        await self.worker.aclose()
        return "confirmed" if self.worker.cleanup_error is None else self.worker.cleanup_error

    def new_output(self) -> list[str]:
        """Output not reported yet."""
        lines = self.worker.output[self.cursor :]
        self.cursor = len(self.worker.output)
        return lines


def answer_for(cell: Cell, operation: Any, own: frozenset[str], registry: Any) -> Answer:
    """The cell's requests answered through ``operation``, the invocation
    executing now: its nested dispatch, its run's state."""
    context, owner = operation.context, operation.run_id

    async def answer(message: dict[str, Any]) -> dict[str, Any]:
        cell.calls += 1
        name = str(message.get("tool"))
        if name in own:
            itself = Error(ErrorClass.RESOURCE_CONFLICT, "a cell cannot call Code Mode itself")
            return refusal(message, itself)
        try:
            if "state" in message:
                return _state(message, registry, owner, cell.identity)
            result: ToolResult = await context.nested_dispatch(name, message.get("args"))
        except Error as error:
            return refusal(message, error)
        if result.is_error:
            failed = Error(ErrorClass.EXECUTION_FAILURE, str(result.content)[:2000])
            return refusal(message, failed)
        content = result.structured_content
        return fulfilment(message, result.content if content is None else content)

    return answer


def _state(message: dict[str, Any], registry: Any, owner: str, identity: str) -> dict[str, Any]:
    key = message.get("key")
    if type(key) is not str:
        raise Error(ErrorClass.VALIDATION, "a state key must be a str")
    if message["state"] == "store":
        registry.store_code_state(owner, identity, key, message.get("value"))
        return fulfilment(message, None)
    return fulfilment(message, registry.code_state(owner, identity).get(key))


def running(cell: Cell, output: list[str]) -> ToolResult:
    """What an invocation returns while its cell goes on."""
    note = f"[cell {cell.cell_id} is still running: call code_wait to go on]"
    structured = {"cell_id": cell.cell_id, "status": "running", "output": output}
    return ToolResult("\n".join([*output, note]), structured_content=structured)


def finished(cell: Cell, result: CellResult, output: list[str]) -> ToolResult:
    """What an invocation returns when its cell has ended."""
    shown = "\n".join(output)
    base = {"cell_id": cell.cell_id, "output": output, "truncated": result.truncated}
    if not result.ok:
        text = f"{result.error}: {result.message}" + (f"\n{shown}" if shown else "")
        failed = {**base, "status": "failed", "error": result.error, "message": result.message}
        return ToolResult(text, structured_content=failed, is_error=True)
    value = json.dumps(result.value, ensure_ascii=False)
    text = f"{shown}\n{value}" if shown else value
    return ToolResult(
        text, structured_content={**base, "status": "completed", "value": result.value}
    )
