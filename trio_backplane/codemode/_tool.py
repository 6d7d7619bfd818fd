"""``code`` and ``code_wait``: the model's JavaScript, run as cells owned by
the run, whose ``tools.<name>(args)`` calls are nested invocations."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, Final, final

import trio

from ..errors import Error, ErrorClass
from ..resources import ResourceHandle, ResourceRegistry
from ..resources._orphans import group_evidence
from ..resources._registry import CONTINUATION
from ..tools import Rejection, ToolDescriptor, ToolResult, reject
from ..tools._backend import FunctionBackend
from ._cell import Cell, answer_for, finished, running
from ._typescript import declarations
from ._worker import HEAP_MIB, CodeWorker, check_heap

__all__ = ["code_mode_tools"]

_YIELD_MS: Final = {"type": "integer", "minimum": 0, "maximum": 300_000}
_CODE_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "minLength": 1, "maxLength": 262_144},
        "yield_time_ms": _YIELD_MS,
        "state": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    },
    "required": ["code"],
    "additionalProperties": False,
}
_WAIT_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "cell_id": {"type": "string", "pattern": "^res_[0-9]{1,19}$"},
        "yield_time_ms": _YIELD_MS,
        "terminate": {"type": "boolean"},
    },
    "required": ["cell_id"],
    "additionalProperties": False,
}
_DESCRIPTION: Final = (
    "Run JavaScript (the body of an async function; top-level await works) in a sandbox "
    "with no file, network, environment or process access. Call the other tools as "
    "`await tools.<name>(args)`, one at a time; a refused call throws an Error whose name "
    "is its class. `console.log(...)` and `text(value)` add output; `await store(key, "
    "value)` and `await load(key)` keep JSON values between cells (same `state`). "
    "`return` a JSON value as the result. A cell still running after yield_time_ms "
    "returns its cell_id: call {wait} to go on."
)
_PRELUDE: Final = """declare function text(value: unknown): void;
declare function store(key: string, value: unknown): Promise<null>;
declare function load(key: string): Promise<unknown>;
"""


@final
class _CodeMode:
    """The backend of both tools: one registry, the cells' options."""

    def __init__(
        self, registry: ResourceRegistry, own: frozenset[str], heap_mib: int, default_yield: float
    ) -> None:
        self.registry = registry
        self.own = own
        self.heap_mib = heap_mib
        self.default_yield = default_yield
        #: per owner: when its current human wait began
        self._suspended: dict[str, float] = {}
        #: cells being driven now, each with its owner and when it yields
        self._driving: dict[Cell, tuple[str, float]] = {}

    def suspend_owner(self, owner: str) -> None:
        """A human wait began in ``owner``'s run (the registry's clock hook)."""
        self._suspended.setdefault(owner, trio.current_time())

    def resume_owner(self, owner: str, at: float | None = None) -> None:
        """It ended: the yields of its cells being driven move later by its length."""
        began = self._suspended.pop(owner, None)
        if began is None:
            return
        waited = max(0.0, (trio.current_time() if at is None else at) - began)
        for cell, (of, until) in self._driving.items():
            if of == owner:
                self._driving[cell] = (of, until + waited)

    async def code(self, operation: Any) -> ToolResult | Rejection:
        """A new cell; refusals before it runs (capacity, launch) are
        rejections: nothing happened."""
        args = operation.arguments
        cell = Cell(worker=CodeWorker(heap_mib=self.heap_mib), identity=args.get("state", "main"))
        try:
            handle = self.registry.register(
                operation.run_id,
                CONTINUATION,
                cell,
                incarnation=operation.incarnation,
                cleanup=cell.stop,
            )
        except Error as error:
            return reject(operation, error)
        cell.cell_id = handle.resource_id

        async def admit(pgid: int, start_time: int) -> None:
            # durable before any cell code runs: a crashed host's worker is found
            evidence = group_evidence(pgid, start_time, cell_id=cell.cell_id)
            await operation.context.record_resource(evidence)

        try:
            await cell.worker.start(admit=admit)
        except Error as error:
            await self.registry.release(handle, operation.run_id)  # nothing ran
            return reject(operation, error)
        except BaseException:
            await self._end(handle, operation)
            raise
        return await self._drive(cell, handle, operation, args["code"])

    async def wait(self, operation: Any) -> ToolResult | Rejection:
        """Go on with a live cell of this run and incarnation: its identity
        and counter kept, this invocation's dispatch, authority and catalog."""
        args = operation.arguments
        handle = ResourceHandle(
            resource_id=args["cell_id"],
            owner=operation.run_id,
            incarnation=operation.incarnation,
            kind=CONTINUATION,
        )
        try:
            cell = self._cell(handle, operation.run_id)
        except Error as error:
            return reject(operation, error)
        if args.get("terminate"):
            output = cell.new_output()
            await self.registry.release(handle, operation.run_id)
            structured = {"cell_id": cell.cell_id, "status": "terminated", "output": output}
            return ToolResult("\n".join([*output, "[terminated]"]), structured_content=structured)
        return await self._drive(cell, handle, operation, None)

    def _cell(self, handle: ResourceHandle, owner: str) -> Cell:
        """The live cell ``handle`` names, fenced by owner and incarnation."""
        cell = self.registry.fetch(handle, owner)
        if not isinstance(cell, Cell):
            raise Error(ErrorClass.NOT_FOUND, "cell not found", {"cell_id": handle.resource_id})
        if cell in self._driving:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "the cell is being waited on already")
        return cell

    async def _drive(
        self, cell: Cell, handle: ResourceHandle, operation: Any, code: str | None
    ) -> ToolResult:
        """Answer the cell's requests through ``operation`` for up to
        ``yield_time_ms``; an ended cell is released (its worker confirmed
        gone) before its result.  Interrupted, the cell ends with it."""
        wait = operation.arguments.get("yield_time_ms")
        seconds = self.default_yield if wait is None else wait / 1000
        answer = answer_for(cell, operation, self.own, self.registry)
        # a human wait during one of its tool calls does not count against the yield
        self._driving[cell] = (operation.run_id, trio.current_time() + seconds)
        try:
            if code is not None:
                await cell.worker.begin(code)
            result = await cell.worker.drive(answer, until=lambda: self._driving[cell][1])
        except Error as error:  # the worker ended: the cell failed, it did not hang
            await self.registry.release(handle, operation.run_id)
            output = cell.new_output()
            structured = {"cell_id": cell.cell_id, "status": "failed", "output": output}
            failed = {**structured, "error": error.error_class.value, "message": error.message}
            text = f"{error.error_class.value}: {error.message}"
            return ToolResult(text, structured_content=failed, is_error=True)
        except BaseException:
            await self._end(handle, operation)
            raise
        finally:
            del self._driving[cell]
        output = cell.new_output()
        if result is None:
            return running(cell, output)
        await self.registry.release(handle, operation.run_id)
        return finished(cell, result, output)

    async def _end(self, handle: ResourceHandle, operation: Any) -> None:
        """Stop an interrupted cell; unconfirmed, the registry keeps it as
        evidence and the run's settlement reports it."""
        with trio.CancelScope(shield=True), contextlib.suppress(Error):
            await self.registry.release(handle, operation.run_id)


def code_mode_tools(
    registry: ResourceRegistry,
    *,
    tools: Iterable[ToolDescriptor] = (),
    name: str = "code",
    wait_name: str = "code_wait",
    heap_mib: int = HEAP_MIB,
    default_yield: float = 10.0,
) -> list[ToolDescriptor]:
    """``code`` runs its argument as a cell in a permissionless Deno worker
    (its own process group, registered with ``registry`` as a
    continuation, at most ``max_continuations`` live); ``code_wait`` goes on
    with a cell that outlived its call.  Each ``tools.<name>(args)`` is a
    nested invocation of the executing tool (validated, authorized, durable,
    one at a time, never Code Mode itself).  ``code``'s description declares
    ``tools`` (the catalog's others) in TypeScript, from their schemas."""
    check_heap(heap_mib)  # now, not at the first cell
    backend = _CodeMode(registry, frozenset({name, wait_name}), heap_mib, default_yield)
    registry.attach_clock(backend)  # a human wait does not count against a yield
    described = [t for t in tools if t.name not in backend.own]
    description = _DESCRIPTION.replace("{wait}", wait_name)
    typed = _PRELUDE + (declarations(described) if described else "")
    description += "\n\n```typescript\n" + typed + "\n```"
    context = {"resource_registry": registry}
    return [
        ToolDescriptor(
            name=name,
            schema=_CODE_SCHEMA,
            backend=FunctionBackend(backend.code),
            backend_context=context,
            description=description,
        ),
        ToolDescriptor(
            name=wait_name,
            schema=_WAIT_SCHEMA,
            backend=FunctionBackend(backend.wait),
            backend_context=context,
            description=(
                f"Wait for a cell {name} left running (cell_id) and return its new output, "
                "or its result once it ends; terminate: true stops it."
            ),
        ),
    ]
