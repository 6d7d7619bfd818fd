"""What Code Mode costs: a cold cell, and a nested call against a direct one.

    python benchmarks/bench_codemode.py [--rounds N] [--calls K]

Interleaved rounds in one process:

* cold cell: ``CodeWorker`` started (the launcher, its group verified from
  ``/proc``, Deno with ``_worker.js``), one cell ``return 1``, the worker
  stopped and its group confirmed gone; against the floor ``deno run`` of
  an empty script through ``trio.run_process`` (Deno's own start);
* nested calls: one conversation (``MemoryStore``) whose single cell calls
  a trivial read-only tool K times in a loop, against one whose provider
  asks for the same K calls directly, as one batch: each a committed
  intent with its result either way.  Per call: the conversation's wall
  time divided by K.

Prints medians and ratios.  Linux, with the ``codemode`` extra.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from trio_backplane import Authority, ToolDescriptor, ToolRegistry, open_conversation
from trio_backplane.codemode import CodeWorker, code_mode_tools
from trio_backplane.codemode._worker import deno_binary
from trio_backplane.resources import ResourceRegistry
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider as S
from trio_backplane.tools import ToolResult

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


class _Echo:
    async def execute(self, operation: Any) -> ToolResult:
        return ToolResult("ok", structured_content=operation.arguments)


async def _converse(tools: list[ToolDescriptor], responses: list[Any]) -> None:
    registry = ToolRegistry(tools)
    async with open_conversation(
        "bench",
        store=MemoryStore(),
        provider=S(responses),
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id="bench"),
        work=100_000,
        run_timeout=3600.0,
        effect_timeout=3600.0,
    ) as conversation:
        await conversation.prompt("go")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed", snapshot.run.state


def _contenders(calls: int, empty: Path) -> dict[str, Callable[[], Awaitable[None]]]:
    echo = ToolDescriptor(name="echo", schema=SCHEMA, backend=_Echo(), read_only=True)
    loop = f"for (let n = 0; n < {calls}; n++) await tools.echo({{n}}); return {calls};"
    cell = {"code": loop, "yield_time_ms": 300_000}

    async def floor() -> None:
        await trio.run_process([deno_binary(), "run", "--no-prompt", str(empty)])

    async def cold() -> None:
        async with CodeWorker() as worker:
            assert (await worker.run("return 1")).value == 1
        assert worker.cleanup_error is None

    async def nested() -> None:
        tools = [*code_mode_tools(ResourceRegistry()), echo]
        await _converse(tools, [S.tool_calls(("c", "code", cell)), S.text("done")])

    async def direct() -> None:
        batch = [(f"c{n}", "echo", {"n": n}) for n in range(calls)]
        await _converse([echo], [S.tool_calls(*batch), S.text("done")])

    return {"deno run (floor)": floor, "cold cell": cold, "direct": direct, "nested": nested}


async def main(rounds: int, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-codemode-") as where:
        empty = Path(where) / "empty.js"
        empty.write_text("")
        contenders = _contenders(calls, empty)
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(rounds):
            for name, run in contenders.items():
                start = time.perf_counter()
                await run()
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(samples) for name, samples in times.items()}
    floor, cold = median["deno run (floor)"], median["cold cell"]
    print(f"cold cell        {cold * 1e3:8.1f} ms   floor (deno run) {floor * 1e3:8.1f} ms")
    print(f"                 {cold / floor:8.2f} x floor")
    direct, nested = median["direct"] / calls, median["nested"] / calls
    print(f"direct call      {direct * 1e6:8.0f} us   {1 / direct:8.0f} calls/s")
    print(f"nested call      {nested * 1e6:8.0f} us   {1 / nested:8.0f} calls/s")
    print(f"                 {nested / direct:8.2f} x direct ({calls} calls per run)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    trio.run(main, args.rounds, args.calls)
