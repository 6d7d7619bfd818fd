"""``DeadlineBudget`` on its own (issue 5, item 5): generations, suspend and
resume before, during and after arming, and stale verdicts ignored.  Every
deadline here runs under ``MockClock`` (autojump)."""

from __future__ import annotations

import math

import pytest
import trio
from trio.testing import MockClock

from trio_backplane.runtime._deadline import DeadlineBudget


async def test_unarmed_budget_reports_its_seconds_and_never_times_out(
    autojump_clock: MockClock,
) -> None:
    budget = DeadlineBudget("run", 5.0)
    assert budget.generation == 0
    assert not budget.suspended
    assert budget.remaining() == 5.0
    await trio.sleep(3.0)
    assert budget.remaining() == 5.0  # not armed: not spent
    assert budget.deadline == trio.current_time() + 5.0
    assert not budget.timed_out()


async def test_suspended_before_arming_then_armed_spends_all_of_it(
    autojump_clock: MockClock,
) -> None:
    """A budget suspended before it is armed keeps every second; arming it
    (a new generation) clears the suspension."""
    budget = DeadlineBudget("effect", 4.0)
    first = budget.suspend()
    assert budget.suspended
    assert first == 1
    assert budget.remaining() == 4.0
    start = trio.current_time()
    with budget.arm() as scope:
        assert budget.generation == first + 1
        assert not budget.suspended
        await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() - start == 4.0
    assert budget.timed_out()
    assert budget.remaining() == 0.0


async def test_resume_without_suspend_changes_nothing(autojump_clock: MockClock) -> None:
    """Resuming a budget that was not suspended (armed while a wait was in
    progress) keeps its generation and its deadline."""
    budget = DeadlineBudget("effect", 3.0)
    with budget.arm():
        armed = budget.generation
        deadline = budget.deadline
        await trio.sleep(1.0)
        assert budget.resume() == armed
        assert budget.deadline == deadline
        assert budget.remaining() == pytest.approx(2.0)


@pytest.mark.parametrize("suspended", [False, True], ids=["armed", "suspended"])
async def test_a_foreign_cancel_is_never_a_timeout(
    autojump_clock: MockClock, suspended: bool
) -> None:
    """A scope cancelled by someone else before its deadline is not timed
    out; while suspended the deadline reads infinite and the remaining time
    stays frozen however long the wait."""
    budget = DeadlineBudget("effect", 3.0)
    with budget.arm() as scope:
        await trio.sleep(1.0)
        if suspended:
            budget.suspend()
            assert budget.deadline == math.inf
            await trio.sleep(100.0)
            assert budget.remaining() == pytest.approx(2.0)
        scope.cancel()
        await trio.sleep(1.0)
    assert scope.cancelled_caught
    assert not budget.timed_out()


async def test_rearming_starts_a_new_generation_with_only_what_is_left(
    autojump_clock: MockClock,
) -> None:
    """Each arming is a generation and spends the same budget: a second
    arming gets only what the first left, and the first arming's verdict
    stays with its generation."""
    budget = DeadlineBudget("effect", 3.0)
    with budget.arm():
        first = budget.generation
        await trio.sleep(1.0)
    assert not budget.timed_out(first)
    start = trio.current_time()
    with budget.arm() as scope:
        second = budget.generation
        await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() - start == 2.0
    assert second == first + 1
    assert budget.timed_out(second)
    assert not budget.timed_out(first)
    with budget.arm() as spent:  # nothing left: cancelled at once
        await trio.sleep(1.0)
    assert spent.cancelled_caught
    assert trio.current_time() - start == 2.0
