"""How much memory does an idle open conversation hold?

    python benchmarks/bench_memory.py [--quick]

Opens N conversations in one process, each on its own run in one shared
``MemoryStore`` with one tool registered and nobody prompting: every one is
open and waiting for input (phase ``idle``), the way a host keeps sessions
open for its users.  Two figures per conversation, each what is held once
all N are open minus what was held before the first opened, divided by N:
what Python allocated (``tracemalloc``, net of everything freed), and the
process's resident set (``/proc/self/statm``, measured in a pass without
tracemalloc, whose own bookkeeping would count).  N is 1,000 and 10,000 (100 and 1,000 with
``--quick``).  Target (issue 20): at most 20 KiB per conversation at N =
10,000.
"""

from __future__ import annotations

import gc
import resource
import sys
import tracemalloc
from typing import Any

import trio

from trio_backplane import (
    Authority,
    MemoryStore,
    ToolDescriptor,
    ToolRegistry,
    ToolResult,
    open_conversation,
)
from trio_backplane.testing import ScriptedProvider

QUICK = "--quick" in sys.argv
COUNTS = (100, 1_000) if QUICK else (1_000, 10_000)
TARGET_KIB = 20.0
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


class Echo:
    async def execute(self, operation: Any) -> ToolResult:
        return ToolResult(operation.arguments.get("text", ""))  # pragma: no cover


async def hold_open(
    store: MemoryStore,
    registry: ToolRegistry,
    run_id: str,
    opened: trio.MemorySendChannel[None],
    release: trio.Event,
) -> None:
    """One conversation, open and idle until ``release``."""
    authority = Authority.for_registry(registry, caller="bench", run_id=run_id)
    async with open_conversation(
        run_id, store=store, provider=ScriptedProvider([]), registry=registry, authority=authority
    ):
        await opened.send(None)
        await release.wait()


def resident() -> int:
    """The process's resident set, in bytes."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def held() -> int:
    """Bytes held now: Python's allocations while tracemalloc traces, else RSS."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else resident()


async def per_conversation(count: int) -> float:
    """Bytes a conversation holds (see :func:`held`)."""
    registry = ToolRegistry([ToolDescriptor(name="echo", schema=SCHEMA, backend=Echo())])
    store = MemoryStore()
    release = trio.Event()
    send, receive = trio.open_memory_channel[None](count)
    before = held()
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(hold_open, store, registry, f"idle-{count}-{i}", send, release)
        for _ in range(count):
            await receive.receive()
        after = held()
        release.set()
    return (after - before) / count


async def main() -> None:
    print(f"python {sys.version.split()[0]}, trio {trio.__version__}, quick={QUICK}")
    print(f"{'open idle conversations':<28}{'KiB each (RSS)':>16}{'KiB each (Python)':>19}")
    results = {}
    for count in COUNTS:
        rss = await per_conversation(count)
        tracemalloc.start()
        python = await per_conversation(count)
        tracemalloc.stop()
        results[count] = max(rss, python)
        print(f"{count:<28,}{rss / 1024:>16.1f}{python / 1024:>19.1f}")
    largest = COUNTS[-1]
    verdict = "ok" if results[largest] / 1024 <= TARGET_KIB else "MISSED"
    print(
        f"at N = {largest:,}: {results[largest] / 1024:.1f} KiB a conversation, the larger"
        f" of the two (<= {TARGET_KIB:.0f} KiB: {verdict})"
    )


if __name__ == "__main__":
    trio.run(main)
