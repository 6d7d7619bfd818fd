"""A process that commits a scripted run to a ``SQLiteStore``, to be SIGKILLed.

``python tests/store/crash_worker.py DB_PATH N``
    opens ``SQLiteStore(DB_PATH)``, creates the run ``crash`` if it is not
    stored yet, and commits the next ``N`` steps of the script from the
    stored revision on, writing ``ACK <revision>`` to stdout (unbuffered,
    ``os.write``) after each acknowledged commit, then ``END <revision>``.

``python tests/store/crash_worker.py --serve``
    a fork server, so a kill point costs a fork instead of an interpreter
    start: for each stdin line ``RUN <DB_PATH> <N>`` it forks a child that
    writes ``PID <pid>`` and then does exactly what the direct mode does; the
    server waits for the child (the test SIGKILLs it) and writes
    ``DONE <wait status>``.  The server itself never opens a database or runs
    Trio, so the child starts clean.

The script is a pure function of the stored record (:func:`next_command`),
with the time taken from the revision, so the test can replay it and know
the exact record every revision must hold.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import trio

from trio_backplane.kernel import Command, RunRecord, transition
from trio_backplane.store import SQLiteStore

RUN_ID = "crash"


def initial() -> RunRecord:
    return RunRecord.new(RUN_ID, work=10**9)


def next_command(record: RunRecord) -> Command:
    """The script's next step after ``record`` (deterministic)."""
    r = record.revision
    at = float(r + 1)
    if record.state == "queued":
        return Command("admit", at=at, input={"state": "running"})
    if record.active_provider is not None:
        messages = [{"role": "assistant", "n": i} for i in range(r % 24)]
        return Command(
            "provider_completed",
            at=at,
            input={
                "final": False,
                "result": {"r": r},
                "conversation": {"messages": messages},
                "messages": [{"role": "assistant", "r": r}],
            },
        )
    if record.active_tools:
        (invocation_id,) = sorted(record.active_tools)[:1]
        return Command(
            "tool_completed", at=at, input={"invocation_id": invocation_id, "result": {"r": r}}
        )
    if record.step_id is None or r % 5 == 0:
        return Command("provider_started", at=at)
    if r % 5 in (1, 3):
        return Command(
            "tool_invoked",
            at=at,
            input={"tool_name": "w", "effect_class": "mutation", "dispatch_state": "dispatched"},
        )
    return Command("conversation_updated", at=at, input={"conversation": {"r": r, "x": "y" * r}})


def step(record: RunRecord) -> tuple[RunRecord, list[Any]]:
    return transition(record, next_command(record))


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def run(db_path: str, n: int) -> None:
    store = SQLiteStore(db_path)
    try:
        record = await store.load(RUN_ID)
        if record is None:
            record = initial()
            await store.create(record)
        for _ in range(n):
            new, events = step(record)
            receipt = await store.commit(
                RUN_ID,
                incarnation=record.incarnation,
                expected_revision=record.revision,
                record=new,
                events=events,
            )
            _say(f"ACK {receipt.revision}")
            record = new
        _say(f"END {record.revision}")
    finally:
        await store.aclose()


def serve() -> None:
    for line in sys.stdin:
        command, db_path, n = line.split()
        assert command == "RUN", line
        pid = os.fork()
        if pid == 0:  # the child: commit until done or killed
            code = 0
            try:
                _say(f"PID {os.getpid()}")
                trio.run(run, db_path, int(n))
            except BaseException as exc:
                _say(f"ERROR {type(exc).__name__}: {exc}")
                code = 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        _say(f"DONE {status}")


def main(argv: list[str]) -> None:
    if argv == ["--serve"]:
        serve()
        return
    db_path, n = argv
    trio.run(run, db_path, int(n))


if __name__ == "__main__":
    main(sys.argv[1:])
