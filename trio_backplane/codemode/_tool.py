"""The Code Mode tool: the model's JavaScript, run as a cell whose
``tools.<name>(args)`` calls are nested invocations of this tool."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ..tools import ToolDescriptor, ToolResult
from ._typescript import declarations
from ._worker import HEAP_MIB, CellResult, CodeWorker

__all__ = ["code_mode_tool"]

_SCHEMA: Final = {
    "type": "object",
    "properties": {"code": {"type": "string", "minLength": 1, "maxLength": 262_144}},
    "required": ["code"],
    "additionalProperties": False,
}
_DESCRIPTION: Final = (
    "Run JavaScript (the body of an async function; top-level await works) in a sandbox "
    "with no file, network, environment or process access. Call the other tools as "
    "`await tools.<name>(args)`; a refused call throws an Error whose name is its class. "
    "`console.log` output is returned; `return` a JSON value as the result."
)


@final
@attrs.frozen
class _CodeMode:
    heap_mib: int
    cell_timeout: float

    async def execute(self, operation: Any) -> ToolResult:
        """One cell in a fresh worker, stopped (its group confirmed gone)
        when the cell ends, fails or is cancelled."""
        context = operation.context

        async def call(name: str, args: Any) -> Any:
            result: ToolResult = await context.nested_dispatch(name, args)
            if result.is_error:
                raise Error(ErrorClass.EXECUTION_FAILURE, str(result.content)[:2000])
            return (
                result.content if result.structured_content is None else result.structured_content
            )

        async with CodeWorker(heap_mib=self.heap_mib) as worker:
            cell = await worker.run(
                operation.arguments["code"], timeout=self.cell_timeout, call=call
            )
        return _result(cell)


def _result(cell: CellResult) -> ToolResult:
    shown = "\n".join(cell.output)
    if not cell.ok:
        text = f"{cell.error}: {cell.message}" + (f"\n{shown}" if shown else "")
        failed: dict[str, Any] = {
            "error": cell.error,
            "message": cell.message,
            "output": list(cell.output),
        }
        return ToolResult(text, structured_content=failed, is_error=True)
    value = json.dumps(cell.value)
    text = f"{shown}\n{value}" if shown else value
    structured: dict[str, Any] = {
        "value": cell.value,
        "output": list(cell.output),
        "truncated": cell.truncated,
    }
    return ToolResult(text, structured_content=structured)


def code_mode_tool(
    *,
    name: str = "code",
    tools: Iterable[ToolDescriptor] = (),
    heap_mib: int = HEAP_MIB,
    cell_timeout: float = 60.0,
) -> ToolDescriptor:
    """The Code Mode tool: runs ``code`` as a cell in a permissionless Deno
    worker; each ``tools.<name>(args)`` is a nested invocation (validated,
    authorized, durable, one at a time, never this tool itself).  Its
    description declares ``tools`` (the catalog's others) in TypeScript,
    typed from their input schemas."""
    described = [t for t in tools if t.name != name]
    description = _DESCRIPTION
    if described:
        description += "\n\n```typescript\n" + declarations(described) + "\n```"
    return ToolDescriptor(
        name=name,
        schema=_SCHEMA,
        backend=_CodeMode(heap_mib, cell_timeout),
        description=description,
    )
