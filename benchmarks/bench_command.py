"""What a confirmed command costs: ``LocalCommand`` against ``trio.run_process``.

    python benchmarks/bench_command.py [--rounds N] [--per-round K]

Interleaved rounds in one process, each K runs of each contender:

* ``trio.run_process``: ``trio.run_process(["true"])``, the bare floor;
* ``trio.run_process sh -c``: the same command through ``/bin/sh -c true``
  (what a shell tool runs);
* ``LocalCommand``: ``start`` of ``true`` (the launcher, its handshake and
  the group verified from ``/proc``), its exit, the group's absence
  confirmed, then ``cancel_confirmed`` and ``acknowledge_release``: the
  whole life of one ``exec_command`` session, without a conversation.

Prints the median milliseconds per run and each ratio to the bare floor.
Linux only.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import trio

from trio_backplane.resources import CommandInvocation, LocalCommand


async def main(rounds: int, per_round: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-command-") as workspace:
        async with LocalCommand(completion_retention=0.0) as command:
            ids = iter(range(1, 10**9))

            async def local() -> None:
                invocation = CommandInvocation(owner="bench", session_id=next(ids))
                await command.start(invocation, "true", workspace=workspace)
                done = await command.wait(invocation, 30.0)
                assert done.cleanup_status == "confirmed", done
                await command.cancel_confirmed(invocation, 5.0)
                command.acknowledge_release(invocation)

            async def bare() -> None:
                await trio.run_process(["true"])

            async def shell() -> None:
                await trio.run_process(["/bin/sh", "-c", "true"])

            contenders: dict[str, Callable[[], Awaitable[None]]] = {
                "trio.run_process": bare,
                "trio.run_process sh -c": shell,
                "LocalCommand": local,
            }
            times: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(rounds):
                for name, run in contenders.items():
                    start = time.perf_counter()
                    for _ in range(per_round):
                        await run()
                    times[name].append((time.perf_counter() - start) / per_round)
    floor = statistics.median(times["trio.run_process"])
    print(f"{'contender':<24} {'ms/run':>8} {'x floor':>8}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<24} {median * 1e3:8.2f} {median / floor:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=20)
    args = parser.parse_args()
    trio.run(main, args.rounds, args.per_round)
