"""ResourceRegistry: fenced entries, one bounded cleanup, honest receipts."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_backplane import Error, ErrorClass
from trio_backplane.resources import CleanupResult, ResourceRegistry


class Callback:
    """A cleanup callback that counts its calls and answers as told."""

    def __init__(self, answer: Any = "confirmed", *, wait: trio.Event | None = None) -> None:
        self.answer = answer
        self.wait = wait
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.wait is not None:
            await self.wait.wait()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


async def test_a_confirmed_release_removes_the_entry_and_its_receipt_answers_again() -> None:
    registry = ResourceRegistry()
    cleanup = Callback("released")
    handle = registry.register("run-1", "file", {"path": "/tmp/x"}, cleanup=cleanup)
    assert handle.resource_id.startswith("res_")
    assert registry.fetch(handle, "run-1") == {"path": "/tmp/x"}
    first = await registry.release(handle, "run-1")
    assert (first.status, first.confirmed) == ("confirmed", True)
    assert await registry.release(handle, "run-1") == first
    assert cleanup.calls == 1
    assert registry.owner_status("run-1") == []
    with pytest.raises(Error) as exc:
        registry.fetch(handle, "run-1")
    assert exc.value.error_class is ErrorClass.NOT_FOUND


async def test_an_entry_without_cleanup_is_confirmed_as_not_requested() -> None:
    registry = ResourceRegistry()
    handle = registry.register("run-1", "note", 1)
    result = await registry.release(handle, "run-1")
    assert (result.status, result.confirmed) == ("not_requested", True)


@pytest.mark.parametrize("answer", ["confirmed", "released", "done"])
async def test_res_10_only_three_answers_confirm(answer: str) -> None:
    """RES-10: ``"confirmed"``, ``"released"`` and ``"done"`` confirm."""
    registry = ResourceRegistry()
    handle = registry.register("run-1", "file", 1, cleanup=Callback(answer))
    assert (await registry.release(handle, "run-1")).status == "confirmed"


@pytest.mark.parametrize("answer", [None, "ok", "pending", "CONFIRMED", 0, True, ("confirmed",)])
async def test_res_10_any_other_answer_is_uncertain(answer: Any) -> None:
    """RES-10: any other value, ``None`` included, leaves the entry uncertain."""
    registry = ResourceRegistry()
    handle = registry.register("run-1", "file", 1, cleanup=Callback(answer))
    with pytest.raises(Error) as exc:
        await registry.release(handle, "run-1")
    assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
    assert exc.value.message == "resource cleanup is unconfirmed"
    assert registry.cleanup_status(handle, "run-1").status == "uncertain"


async def test_res_10_raising_fails_and_a_sync_callback_is_judged_alike() -> None:
    """RES-10: a callback that raises marks the entry failed; a plain
    function is called the same way as a coroutine function."""
    registry = ResourceRegistry()
    handle = registry.register("run-1", "file", 1, cleanup=Callback(OSError("disk gone")))
    with pytest.raises(Error) as exc:
        await registry.release(handle, "run-1")
    assert exc.value.message == "resource cleanup failed"
    assert "OSError: disk gone" in exc.value.details["reason"]
    status = registry.cleanup_status(handle, "run-1")
    assert (status.status, status.confirmed) == ("failed", False)
    plain = registry.register("run-1", "file", 2, cleanup=lambda: "done")
    assert (await registry.release(plain, "run-1")).status == "confirmed"


async def test_res_10_overrunning_the_cleanup_timeout_is_uncertain(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """RES-10: a callback still running at ``cleanup_timeout`` is cut and the
    entry is uncertain; the release returns at the bound, not later."""
    registry = ResourceRegistry(cleanup_timeout=2.0)
    hang = Callback(wait=trio.Event())
    handle = registry.register("run-1", "file", 1, cleanup=hang)
    start = trio.current_time()
    with pytest.raises(Error) as exc:
        await registry.release(handle, "run-1")
    assert trio.current_time() - start == pytest.approx(2.0)
    assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
    assert "within 2.0 s" in exc.value.details["reason"]


@pytest.mark.parametrize("answer", [OSError("boom"), "pending", None])
async def test_res_07_res_09_a_kept_entry_is_never_cleaned_again(answer: Any) -> None:
    """RES-07, RES-09: after a failed or uncertain cleanup (``"pending"``
    included) every release raises ``unknown_outcome`` and the callback is
    never called again."""
    registry = ResourceRegistry()
    cleanup = Callback(answer)
    handle = registry.register("run-1", "file", 1, cleanup=cleanup)
    with pytest.raises(Error):
        await registry.release(handle, "run-1")
    for _ in range(3):
        with pytest.raises(Error) as exc:
            await registry.release(handle, "run-1")
        assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
        assert exc.value.message == "resource cleanup needs reconciliation"
    assert [r.status for r in await registry.cancel_owner("run-1")] == [
        "failed" if isinstance(answer, OSError) else "uncertain"
    ]
    assert cleanup.calls == 1
    with pytest.raises(Error) as exc:
        registry.fetch(handle, "run-1")
    assert exc.value.error_class is ErrorClass.RESOURCE_CONFLICT


async def test_res_08_a_release_racing_close_owner_runs_the_callback_once() -> None:
    """RES-08: a release and the owner's close, concurrent, join one
    cleanup; both see its confirmed result."""
    registry = ResourceRegistry()
    gate = trio.Event()
    cleanup = Callback("done", wait=gate)
    handle = registry.register("run-1", "proc", 1, cleanup=cleanup)
    seen: list[Any] = []

    async def release() -> None:
        seen.append(await registry.release(handle, "run-1"))

    async def close() -> None:
        seen.append(await registry.close_owner("run-1"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(release)
        nursery.start_soon(close)
        await trio.testing.wait_all_tasks_blocked()
        assert registry.cleanup_status(handle, "run-1").status == "pending"
        gate.set()
    assert cleanup.calls == 1
    single = next(s for s in seen if isinstance(s, CleanupResult))
    [listed] = next(s for s in seen if isinstance(s, list))
    assert single == listed
    assert single.status == "confirmed"


async def test_a_cancelled_releaser_does_not_abandon_the_cleanup() -> None:
    """The cleanup is shielded: cancelling the task that started it still
    lets it finish and record its result for everyone else."""
    registry = ResourceRegistry()
    gate = trio.Event()
    cleanup = Callback("confirmed", wait=gate)
    handle = registry.register("run-1", "proc", 1, cleanup=cleanup)
    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def release() -> None:
            with scope:
                await registry.release(handle, "run-1")

        nursery.start_soon(release)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert registry.cleanup_status(handle, "run-1").status == "pending"
        gate.set()
    assert (await registry.release(handle, "run-1")).status == "confirmed"
    assert cleanup.calls == 1


async def test_a_blocked_cleanup_does_not_block_other_entries() -> None:
    registry = ResourceRegistry()
    gate = trio.Event()
    slow = registry.register("run-1", "proc", 1, cleanup=Callback(wait=gate))
    quick = registry.register("run-1", "proc", 2, cleanup=Callback())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(registry.release, slow, "run-1")
        await trio.testing.wait_all_tasks_blocked()
        assert (await registry.release(quick, "run-1")).status == "confirmed"
        gate.set()


async def test_owners_and_incarnations_are_fenced() -> None:
    registry = ResourceRegistry()
    handle = registry.register("run-1", "file", 1, incarnation=2)
    with pytest.raises(Error) as exc:
        registry.fetch(handle, "run-2")
    assert exc.value.error_class is ErrorClass.FORBIDDEN
    stale = type(handle)(resource_id=handle.resource_id, owner="run-1", incarnation=1, kind="file")
    with pytest.raises(Error) as exc:
        await registry.release(stale, "run-1")
    assert (exc.value.error_class, exc.value.message) == (
        ErrorClass.RESOURCE_CONFLICT,
        "stale resource incarnation",
    )
    await registry.release(handle, "run-1")
    with pytest.raises(Error) as exc:
        await registry.release(handle, "run-2")  # the receipt keeps the owner
    assert exc.value.error_class is ErrorClass.FORBIDDEN


async def test_close_owner_refuses_new_entries_and_fence_owner_releases_nothing() -> None:
    registry = ResourceRegistry()
    cleanup = Callback()
    registry.register("run-1", "file", 1, cleanup=cleanup)
    registry.register("run-2", "file", 2, cleanup=cleanup)
    results = await registry.close_owner("run-1")
    assert [r.status for r in results] == ["confirmed"]
    with pytest.raises(Error) as exc:
        registry.register("run-1", "file", 3)
    assert (exc.value.error_class, exc.value.message) == (
        ErrorClass.RESOURCE_CONFLICT,
        "resource owner is closed",
    )
    registry.fence_owner("run-2")
    assert cleanup.calls == 1
    assert [r.status for r in registry.owner_status("run-2")] == ["active"]
    assert await registry.cancel_owner("nobody") == []


async def test_receipts_are_bounded_to_the_last_256() -> None:
    registry = ResourceRegistry()
    handles = [registry.register("run-1", "file", n) for n in range(257)]
    for handle in handles:
        await registry.release(handle, "run-1")
    with pytest.raises(Error) as exc:
        await registry.release(handles[0], "run-1")
    assert exc.value.error_class is ErrorClass.NOT_FOUND
    assert (await registry.release(handles[1], "run-1")).status == "not_requested"


async def test_continuations_are_limited() -> None:
    registry = ResourceRegistry(max_continuations=2)
    cells = [registry.register("run-1", "continuation", n) for n in range(2)]
    with pytest.raises(Error) as exc:
        registry.register("run-2", "continuation", 3)
    assert exc.value.error_class is ErrorClass.OVERLOADED
    await registry.release(cells[0], "run-1")
    registry.register("run-2", "continuation", 3)


async def test_sessions_are_positive_monotonic_and_fenced() -> None:
    registry = ResourceRegistry()
    acknowledged: list[CleanupResult] = []

    def acknowledge(result: CleanupResult) -> str:
        acknowledged.append(result)
        return "ok"

    first = registry.register_session("run-1", incarnation=1)
    second = registry.register_session("run-1", "job", cleanup=Callback(), acknowledge=acknowledge)
    assert 0 < first < second
    registry.withdraw_session(first, "run-1", 1)
    with pytest.raises(Error) as exc:
        registry.withdraw_session(second, "run-1", 1)
    assert exc.value.error_class is ErrorClass.RESOURCE_CONFLICT
    registry.update_session(second, "run-1", "job 2")
    assert registry.fetch_session(second, "run-1", 1) == "job 2"
    with pytest.raises(Error) as exc:
        registry.fetch_session(second, "run-1", 2)
    assert exc.value.message == "stale resource incarnation"
    assert (await registry.release_session(second, "run-1")).status == "confirmed"
    assert [r.id for r in acknowledged] == [second]
    assert registry.register_session("run-1") > second


@pytest.mark.parametrize(
    ("answer", "error_class"),
    [("nope", ErrorClass.UNKNOWN_OUTCOME), (RuntimeError("x"), ErrorClass.UNKNOWN_OUTCOME)],
)
async def test_an_unconfirmed_acknowledgement_is_reported(
    answer: Any, error_class: ErrorClass
) -> None:
    registry = ResourceRegistry()

    def acknowledge(result: CleanupResult) -> Any:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    session = registry.register_session("run-1", "job", acknowledge=acknowledge)
    for _ in range(2):
        with pytest.raises(Error) as exc:
            await registry.release_session(session, "run-1")
        assert exc.value.error_class is error_class
        assert exc.value.message == "session lifecycle acknowledgement is unconfirmed"


async def test_an_acknowledgement_overrunning_the_bound_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = ResourceRegistry(cleanup_timeout=1.0)

    async def acknowledge(result: CleanupResult) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    session = registry.register_session("run-1", "job", acknowledge=acknowledge)
    with pytest.raises(Error) as exc:
        await registry.release_session(session, "run-1")
    assert exc.value.error_class is ErrorClass.TIMEOUT
    assert exc.value.details["reason"] == "acknowledgement_timeout"


@pytest.mark.parametrize(
    "options",
    [
        {"cleanup_timeout": 0},
        {"cleanup_timeout": 61.0},
        {"cleanup_timeout": float("nan")},
        {"cleanup_timeout": True},
        {"max_continuations": 0},
        {"max_continuations": 257},
        {"max_continuations": 2.0},
    ],
)
def test_invalid_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(Error) as exc:
        ResourceRegistry(**options)
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert set(exc.value.details) == set(options)
