"""Crash consistency of ``SQLiteStore`` under SIGKILL (issue 4, item 6; STO-01, STO-09).

A worker process commits a scripted run and writes ``ACK <revision>`` after
each acknowledged commit; the test SIGKILLs it at points hypothesis chooses
(after ``k`` acknowledgements plus 0..5 ms), reopens the database with a
fresh ``SQLiteStore`` and checks the stored revision is the last
acknowledged one or the one right after it (the commit in flight), never
older, and never torn: the record decodes, equals the script's record at
that revision, and its event log has exactly ``revision`` events.

Speed: an interpreter start costs ~0.5 s, so the worker runs as a fork
server (``crash_worker.py --serve``): each kill point forks a child that
opens the database itself and is killed; every kill point of an example
continues on the same database from the stored revision.  Real time is
used on purpose: this crosses a process boundary.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store import crash_worker
from trio_backplane.kernel import RunRecord
from trio_backplane.store import SQLiteStore

WORKER = Path(crash_worker.__file__)

#: hypothesis examples x kill points per example >= 200 in every run.
EXAMPLES = 25
KILLS_PER_EXAMPLE = 10

#: The script's record at each revision, replayed once.
_SCRIPT: list[RunRecord] = [crash_worker.initial()]


def scripted(revision: int) -> RunRecord:
    while len(_SCRIPT) <= revision:
        _SCRIPT.append(crash_worker.step(_SCRIPT[-1])[0])
    return _SCRIPT[revision]


class ForkServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.kills = 0

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the fork server died"
        return line.strip()

    def crash(self, db: Path, acks_before_kill: int, extra_sleep: float) -> list[int]:
        """Run a worker on ``db``; SIGKILL it after ``acks_before_kill`` ACKs
        plus ``extra_sleep`` seconds.  The revisions it acknowledged."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"RUN {db} 1000000\n")
        self.proc.stdin.flush()
        first = self._line()
        assert first.startswith("PID "), first
        pid = int(first.split()[1])
        acks: list[int] = []
        while len(acks) < acks_before_kill:
            line = self._line()
            assert line.startswith("ACK "), line
            acks.append(int(line.split()[1]))
        if extra_sleep:
            time.sleep(extra_sleep)
        os.kill(pid, signal.SIGKILL)
        self.kills += 1
        while True:
            line = self._line()
            if line.startswith("DONE "):
                status = int(line.split()[1])
                assert os.WIFSIGNALED(status), line
                assert os.WTERMSIG(status) == signal.SIGKILL, line
                return acks
            assert line.startswith("ACK "), line  # printed before the kill landed
            acks.append(int(line.split()[1]))

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def fork_server() -> Iterator[ForkServer]:
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()


async def _inspect(db: Path) -> tuple[RunRecord | None, int]:
    store = SQLiteStore(db)
    try:
        record = await store.load(crash_worker.RUN_ID)
        events = await store.events(crash_worker.RUN_ID)
        return record, len(events)
    finally:
        await store.aclose()


def _check(db: Path, known: int, acks: list[int]) -> int:
    """The stored revision after a crash; asserts it is consistent."""
    record, n_events = trio.run(_inspect, db)
    if record is None:  # killed before the run was created
        assert not acks, acks
        assert known == -1, known
        return -1
    acked = max(acks, default=known)
    assert acks == list(range(max(known, 0) + 1, acked + 1)), (known, acks)  # in order
    assert record.revision in (acked, acked + 1), (record.revision, acked)  # never older
    assert record.revision >= known
    assert n_events == record.revision, (n_events, record.revision)  # never torn
    assert record == scripted(record.revision), record.revision
    return record.revision


def test_sigkill_never_loses_an_acknowledged_commit(
    fork_server: ForkServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Hypothesis chooses the kill points: ``EXAMPLES`` databases, each killed
    ``KILLS_PER_EXAMPLE`` times (after 0..4 ACKs plus 0..5 ms); at least 200
    SIGKILLs in every run, whatever the hypothesis profile."""
    started = time.monotonic()
    before = fork_server.kills

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        kill_points=st.lists(
            st.tuples(st.integers(min_value=0, max_value=4), st.integers(0, 5)),
            min_size=KILLS_PER_EXAMPLE,
            max_size=KILLS_PER_EXAMPLE,
        )
    )
    def crash_repeatedly(kill_points: list[tuple[int, int]]) -> None:
        db = tmp_path_factory.mktemp("crash") / "runs.db"
        known = -1
        for acks_before_kill, extra_ms in kill_points:
            acks = fork_server.crash(db, acks_before_kill, extra_ms / 1000)
            known = _check(db, known, acks)

    crash_repeatedly()
    kills = fork_server.kills - before
    print(f"\ncrash test: {kills} SIGKILL kill points in {time.monotonic() - started:.1f} s")
    assert kills >= EXAMPLES * KILLS_PER_EXAMPLE >= 200, kills


def test_direct_worker_survives_sigkill(tmp_path: Path) -> None:
    """The plain ``crash_worker.py DB_PATH N`` interface, killed for real
    after its third acknowledgement (an interpreter start, so only once)."""
    db = tmp_path / "direct.db"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(db), "100000"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    acks = [int(proc.stdout.readline().split()[1]) for _ in range(3)]
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=10)
    acks += [int(line.split()[1]) for line in rest.splitlines() if line.startswith("ACK ")]
    assert proc.returncode == -signal.SIGKILL
    _check(db, 0, acks)
