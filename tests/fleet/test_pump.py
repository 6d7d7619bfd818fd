"""A worker's answer pump on its own (no database): what it does when the
queue's database is away for a moment."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
from trio.testing import MockClock

from tests.fleet.app import app
from trio_backplane import Error, ErrorClass
from trio_backplane.fleet import Worker


class FlakyQueue:
    """A queue whose database is away for the first ``failures`` reads."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.marks: list[tuple[int, str | None]] = []

    def answers(self, run_id: str) -> list[tuple[int, str, Any]]:
        if self.failures:
            self.failures -= 1
            raise Error(ErrorClass.STORAGE_FAILED, "fleet queue: connection refused")
        return [(7, "i-1", "approved")]

    def applied(self, answer_id: int, error: str | None) -> None:
        self.marks.append((answer_id, error))


class Waiting:
    """A conversation asking ``i-1`` until it is answered."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, Any]] = []
        self.answered = trio.Event()

    def status(self) -> Any:
        asked = None if self.answers else {"id": "i-1"}
        phase = "running" if self.answers else "waiting_interaction"
        run = SimpleNamespace(active_tools=(), active_provider=None)
        return SimpleNamespace(pending_interaction=asked, phase=phase, run=run)

    async def resolve(self, interaction_id: str, answer: Any) -> None:
        self.answers.append((interaction_id, answer))
        self.answered.set()


async def test_a_queue_away_for_a_moment_leaves_the_run_waiting(autojump_clock: MockClock) -> None:
    """Reading the answers fails ``storage_failed`` twice: the pump does not
    end the live run (an exception there would cancel it) but reads again
    at the next polls, then applies the answer once."""
    worker = Worker("postgresql://nowhere.invalid/x", app, poll_interval=0.5, idle_bound=600.0)
    queue = FlakyQueue(failures=2)
    worker.queue = queue  # type: ignore[assignment]
    conversation = Waiting()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: worker.apply_answers(conversation, run_id="run-1"))
        # no deadline here: with the pump in a worker thread, the autojump
        # clock would jump straight to it
        await conversation.answered.wait()
        nursery.cancel_scope.cancel()
    assert conversation.answers == [("i-1", "approved")]
    assert queue.marks == [(7, None)]
    assert queue.failures == 0
    assert trio.current_time() >= 1.0  # two polls passed without the answer
