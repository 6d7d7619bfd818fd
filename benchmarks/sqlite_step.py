"""Where does a SQLite tool-call step go?

    python benchmarks/sqlite_step.py [--steps N] [--rounds R]

The engine's 200-step run of ``bench_engine.one_run`` on ``SQLiteStore``
(in a temporary directory) and on ``MemoryStore``, alternated R times in
one process; medians.  For the SQLite run it times, per store commit: the
writer thread's pick-up of the call, the call in the thread (the driver's
``begin``, ``write`` and ``commit``, the last one the durable sync), the
wake-up of the waiting Trio task, and the commit's plan (the diff of the
record against the last one and its encoding) on the Trio thread; and,
per step, the CPU time of the Trio thread (``time.thread_time``) beside
the MemoryStore step's.  Instrumentation wraps the store's internals, so
the wall times are a little above ``bench_engine.py``'s; compare the parts
with each other, not with other runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import one_run

from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.store._sql import _memory, _sqlite, _workers

#: per-commit timings of the run being measured, by part (seconds)
PARTS: dict[str, list[float]] = defaultdict(list)


def _timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            PARTS[name].append(time.perf_counter() - start)

    return timed


def instrument() -> None:
    """Wrap the driver's calls, the plan and the worker round trip."""
    driver = _sqlite.SQLiteDriver
    for name in ("begin", "write", "commit"):
        setattr(driver, name, _timed(f"thread: {name}", getattr(driver, name)))
    _memory.Plan.__init__ = _timed("trio: plan (diff, encode)", _memory.Plan.__init__)  # type: ignore[method-assign]
    run = _workers.Workers._run

    async def round_trip(self: Any, fn: Any, *args: Any) -> Any:
        marks: dict[str, float] = {}

        def in_thread(driver: Any) -> Any:
            marks["start"] = time.perf_counter()
            try:
                return fn(driver)
            finally:
                marks["end"] = time.perf_counter()

        submitted = time.perf_counter()
        result = await run(self, in_thread, *args)
        PARTS["pick-up by the thread"].append(marks["start"] - submitted)
        PARTS["call in the thread"].append(marks["end"] - marks["start"])
        PARTS["wake-up of the task"].append(time.perf_counter() - marks["end"])
        return result

    _workers.Workers._run = round_trip  # type: ignore[method-assign, assignment]


async def measured(store: Any, steps: int) -> tuple[float, float]:
    """µs a step (wall) and µs of the Trio thread's CPU a step."""
    cpu = time.thread_time()
    elapsed = await one_run(store, f"parts-{time.monotonic_ns()}", steps)
    return elapsed / steps * 1e6, (time.thread_time() - cpu) / steps * 1e6


async def main(steps: int, rounds: int) -> None:
    sqlite: list[tuple[float, float]] = []
    memory: list[tuple[float, float]] = []
    commits: list[dict[str, float]] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="sqlite_step-") as name:
            async with SQLiteStore(Path(name) / "runs.sqlite3") as store:
                await one_run(store, "warm", 3)
                PARTS.clear()
                sqlite.append(await measured(store, steps))
                commits.append({k: statistics.median(v) * 1e6 for k, v in PARTS.items()})
        memory.append(await measured(MemoryStore(), steps))
    print(
        f"python {sys.version.split()[0]}, trio {trio.__version__}, {steps} steps, {rounds} rounds"
    )
    print(f"{'per step (medians of the rounds)':44s} {'wall us':>9s} {'trio CPU us':>12s}")
    for label, rows in (("SQLiteStore", sqlite), ("MemoryStore", memory)):
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"{label:44s} {wall:9.0f} {cpu:12.0f}")
    print(f"{'per store commit (medians)':44s} {'us':>9s}")
    for part in commits[0]:
        print(f"  {part:42s} {statistics.median(c[part] for c in commits):9.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    instrument()
    trio.run(main, args.steps, args.rounds)
