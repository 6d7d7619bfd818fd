"""How many of a tool-call step's instructions are the kernel's, and Trio's?

    python benchmarks/step_parts.py [--steps N] [--replays R]

Two measurements under ``valgrind --tool=callgrind`` with
``PYTHONHASHSEED=0``, each the difference of two runs of one program (the
start-up and the imports cancel), so they compare with the figure of
``instructions.py`` (this checkout, the C extensions it has built):

- **kernel**: a run of ``bench_engine.one_run`` (MemoryStore, N steps)
  records every ``transition`` the coordinator makes; the program then
  replays them R times, or 0.  The difference over R x N is what the four
  kernel transitions of a step cost, the same commands on the same records.
- **trio**: the Trio skeleton of a step alone: two cancel scopes with a
  deadline (the provider attempt's and the tool's effect budgets), one
  checkpoint that yields, five ``checkpoint_if_cancelled``; N steps, or 0;
  and, for scale, one ``CancelScope`` with a deadline entered and left, and
  one checkpoint that yields (1,000 of each, or 0).

What neither counts (the runtime's parts, the store, the provider and the
tool of the benchmark) is the step's figure minus both.  Needs valgrind on
PATH.  About a minute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def kernel(steps: int, replays: int) -> None:
    """Record a run's transitions, then replay them ``replays`` times."""
    import trio
    from bench_engine import one_run

    from trio_backplane.kernel import transition
    from trio_backplane.runtime import _coordinator
    from trio_backplane.store import MemoryStore

    calls: list[tuple[object, object, dict[str, object]]] = []

    def recording(record: object, command: object, **kw: object) -> object:
        calls.append((record, command, kw))
        return transition(record, command, **kw)  # type: ignore[arg-type]

    _coordinator.transition = recording  # type: ignore[assignment]
    trio.run(one_run, MemoryStore(), "parts", steps)
    _coordinator.transition = transition
    for _ in range(replays):
        for record, command, kw in calls:
            transition(record, command, **kw)  # type: ignore[arg-type]


def skeleton(steps: int) -> None:
    """``steps`` times: the cancel scopes, checkpoints and yield of a step."""
    import trio

    async def main() -> None:
        now = trio.current_time
        for _ in range(steps):
            with trio.CancelScope(deadline=now() + 3600):
                await trio.lowlevel.checkpoint()
            with trio.CancelScope(deadline=now() + 3600):
                pass
            for _ in range(5):
                await trio.lowlevel.checkpoint_if_cancelled()

    trio.run(main)


def primitive(kind: str, count: int) -> None:
    """``count`` cancel scopes with a deadline, or yielding checkpoints."""
    import trio

    async def main() -> None:
        now = trio.current_time
        for _ in range(count):
            if kind == "scope":
                with trio.CancelScope(deadline=now() + 3600):
                    pass
            else:
                await trio.lowlevel.checkpoint()

    trio.run(main)


def counted(valgrind: str, args: list[str], scratch: Path) -> int:
    out = scratch / "callgrind.out"
    command = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}"]
    command += [sys.executable, str(Path(__file__).resolve()), *args]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{ROOT}{os.pathsep}{HERE}"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"step_parts.py: {' '.join(args)} failed:\n{result.stderr[-2000:]}")
    for line in out.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    sys.exit(f"step_parts.py: no totals in {out}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, metavar="N")
    parser.add_argument("--replays", type=int, default=5, metavar="R")
    parser.add_argument("--kernel", type=int, metavar="R", help=argparse.SUPPRESS)
    parser.add_argument("--skeleton", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--primitive", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kernel is not None:
        kernel(args.steps, args.kernel)
        return 0
    if args.skeleton is not None:
        skeleton(args.skeleton)
        return 0
    if args.primitive is not None:
        primitive(args.primitive[0], int(args.primitive[1]))
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("step_parts.py: valgrind is not on PATH")
    n, r = args.steps, args.replays
    with tempfile.TemporaryDirectory(prefix="trio_backplane-parts-") as name:
        scratch = Path(name)
        base = counted(valgrind, ["--steps", str(n), "--kernel", "0"], scratch)
        replayed = counted(valgrind, ["--steps", str(n), "--kernel", str(r)], scratch)
        idle = counted(valgrind, ["--skeleton", "0"], scratch)
        busy = counted(valgrind, ["--skeleton", str(n)], scratch)
        each = {
            kind: (
                counted(valgrind, ["--primitive", kind, "1000"], scratch)
                - counted(valgrind, ["--primitive", kind, "0"], scratch)
            )
            / 1000
            for kind in ("scope", "yield")
        }
    kernel_step = (replayed - base) / (r * n)
    trio_step = (busy - idle) / n
    print(f"callgrind, PYTHONHASHSEED=0, {n} steps, {r} replays")
    print(f"kernel: {kernel_step / 1e3:8.1f} k instructions a step (four transitions)")
    print(f"trio:   {trio_step / 1e3:8.1f} k instructions a step (two scopes, six checkpoints)")
    print(f"        {each['scope'] / 1e3:8.1f} k a CancelScope with a deadline, entered and left")
    print(f"        {each['yield'] / 1e3:8.1f} k a checkpoint that yields")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
