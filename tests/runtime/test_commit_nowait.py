"""A store that never waits (``commit_nowait``, as ``MemoryStore`` offers) is
committed to directly, with no commit-deadline scope: the same compare-and-set,
the same failure handling as ``commit`` (CAN-11, EVT-18)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.runtime import open_conversation
from trio_backplane.store import MemoryStore, Receipt
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import ToolRegistry, ToolResult

from .support import Delegating, RecordingBackend, granted, make_tool, run_to_settled


class Nowait(Delegating):
    """Offers only ``commit_nowait``; ``commit`` is a test failure.  ``fail``:
    ``(kind, exception)`` raised instead of committing that kind."""

    def __init__(self, fail: tuple[str, BaseException] | None = None) -> None:
        super().__init__(MemoryStore())
        self.kinds: list[str] = []
        self.fail = fail

    async def commit(self, run_id: str, **kwargs: Any) -> Receipt:
        raise AssertionError("the engine awaited commit on a store that never waits")

    def commit_nowait(self, run_id: str, **kwargs: Any) -> Receipt:
        kinds = [e.type.removeprefix("run.") for e in kwargs["events"]]
        if self.fail is not None and self.fail[0] in kinds:
            raise self.fail[1]
        receipt = self.inner.commit_nowait(run_id, **kwargs)
        self.kinds.extend(kinds)
        return receipt  # type: ignore[no-any-return]


def one_tool_step() -> ScriptedProvider:
    return ScriptedProvider(
        [ScriptedProvider.tool_calls(("c1", "t", {})), ScriptedProvider.text("done")]
    )


async def test_a_store_that_never_waits_is_committed_to_directly(autojump_clock: Any) -> None:
    """Every commit of a run goes through ``commit_nowait``; the run completes
    with the same commands in the log as on an awaited store."""
    store = Nowait()
    finished = await run_to_settled(
        one_tool_step(), [make_tool("t", RecordingBackend(ToolResult("ok")))], store=store
    )
    assert finished.snapshot.run.state == "completed"
    assert store.kinds[0] == "admit"
    assert {"provider_started", "tool_invoked", "tool_completed", "finish"} <= set(store.kinds)
    assert [e.type for e in finished.log] == [f"run.{k}" for k in store.kinds]


@pytest.mark.parametrize(
    "failure",
    [
        Error(ErrorClass.STORAGE_FAILED, "disk gone"),
        RuntimeError("a bug in the store"),
    ],
    ids=["storage_failed", "crash"],
)
async def test_a_failing_nowait_commit_is_storage_failed(
    autojump_clock: Any, failure: BaseException
) -> None:
    """CAN-11/EVT-18 on the nowait path: a refused or crashing ``commit_nowait``
    of the tool result moves the run to ``storage_failed`` with
    ``recovery_required``, and nothing terminal follows."""
    backend = RecordingBackend(ToolResult("ok"))
    store = Nowait(fail=("tool_completed", failure))
    finished = await run_to_settled(one_tool_step(), [make_tool("t", backend)], store=store)
    assert finished.snapshot.phase == "storage_failed"
    [event] = finished.of("storage_failed")
    assert event.payload["recovery_required"] is True
    assert event.payload["error"]["class"] == "storage_failed"
    assert not {"run_completed", "run_failed", "run_cancelled"} & set(finished.types())
    assert len(backend.operations) == 1  # dispatched once, never again
    assert "tool_completed" not in store.kinds


class AsyncNowait(Delegating):
    """Names a coroutine function ``commit_nowait``: not a store that never waits."""

    def __init__(self) -> None:
        super().__init__(MemoryStore())
        self.awaited = 0

    async def commit_nowait(self, run_id: str, **kwargs: Any) -> Receipt:
        raise AssertionError("a coroutine commit_nowait was called as one that never waits")

    async def commit(self, run_id: str, **kwargs: Any) -> Receipt:
        self.awaited += 1
        return await self.inner.commit(run_id, **kwargs)  # type: ignore[no-any-return]


async def test_a_coroutine_commit_nowait_is_not_taken_for_one(autojump_clock: Any) -> None:
    """A store whose ``commit_nowait`` is a coroutine function is committed to
    the awaited way, with its commit deadline."""
    store = AsyncNowait()
    finished = await run_to_settled(
        one_tool_step(), [make_tool("t", RecordingBackend(ToolResult("ok")))], store=store
    )
    assert finished.snapshot.run.state == "completed"
    assert store.awaited >= 4


class Forwarding:
    """A store wrapper as hosts write them: ``commit`` overridden, every other
    attribute forwarded to ``inner`` by ``__getattr__`` (so the inner store's
    ``commit_nowait`` shows through an instance lookup)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.commits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, run_id: str, **kwargs: Any) -> Receipt:
        self.commits += 1
        return await self.inner.commit(run_id, **kwargs)  # type: ignore[no-any-return]


async def test_a_forwarding_wrapper_is_never_bypassed(autojump_clock: Any) -> None:
    """Only a ``commit_nowait`` the store's class defines is taken: a wrapper
    that forwards unknown attributes to a ``MemoryStore`` has its own
    ``commit`` called for every commit of the run (issue 21, item 4)."""
    inner = MemoryStore()
    store = Forwarding(inner)
    registry = ToolRegistry([make_tool("t", RecordingBackend(ToolResult("ok")))])
    async with open_conversation(
        "fwd",
        store=store,  # type: ignore[arg-type]
        provider=one_tool_step(),
        registry=registry,
        authority=granted(registry, "fwd"),
        wall_clock=trio.current_time,
    ) as conversation:
        await conversation.prompt("go")
        snapshot = await conversation.wait_settled()
    assert snapshot.run.state == "completed"
    stored = await inner.load("fwd")
    assert stored is not None
    # every commit after ``create`` (revision 0) went through the wrapper
    assert store.commits == stored.revision
    assert store.commits >= 4
