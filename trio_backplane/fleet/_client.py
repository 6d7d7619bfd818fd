"""Submitting runs to the fleet and waiting for them, from any host."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from typing import Any

import trio

from ..errors import Error, ErrorClass
from ..kernel import RunEvent
from ..store import PostgresStore
from ._queue import Queue

__all__ = ["pending", "resolve", "submit", "wait", "watch"]


def _unknown_run(run_id: str) -> Error:
    return Error(ErrorClass.NOT_FOUND, "no such run in the fleet", {"run_id": run_id})


async def submit(
    dsn: str, *, agent: str, prompt: Any, run_id: str | None = None, schema: str = "public"
) -> str:
    """Queue a run of ``agent`` on ``prompt`` (one commit); its run id."""
    run_id = run_id or f"{agent}-{uuid.uuid4().hex[:12]}"
    with Queue(dsn, schema=schema) as queue:
        await trio.to_thread.run_sync(queue.ensure)
        await trio.to_thread.run_sync(queue.submit, run_id, agent, prompt)
    return run_id


async def wait(
    dsn: str,
    run_id: str,
    *,
    schema: str = "public",
    timeout: float = math.inf,
    poll_interval: float = 0.2,
) -> dict[str, Any]:
    """The run's row once a worker finished it (``done`` or ``parked``):
    ``state``, ``outcome`` (the run's state), ``current_run``, ``claims``.
    ``timeout`` when it does not finish in time; ``not_found`` if it was
    never submitted."""
    with Queue(dsn, schema=schema) as queue, trio.move_on_after(timeout):
        while True:
            status = await trio.to_thread.run_sync(queue.status, run_id)
            if status is None:
                raise _unknown_run(run_id)
            if status["state"] in ("done", "parked"):
                return status
            # woken by a notification (a row finished), at the latest by the poll
            await trio.to_thread.run_sync(queue.listen, poll_interval, abandon_on_cancel=True)
    raise Error(ErrorClass.TIMEOUT, "the run did not finish in time", {"run_id": run_id})


async def resolve(
    dsn: str, run_id: str, interaction_id: str, answer: Any, *, schema: str = "public"
) -> None:
    """Commit a person's ``answer`` to the run's pending interaction, from
    any host: the worker holding the run hands it over (a stale or
    duplicate id is refused there, and marked so)."""
    with Queue(dsn, schema=schema) as queue:
        await trio.to_thread.run_sync(queue.answer, run_id, interaction_id, answer)


async def pending(dsn: str, run_id: str, *, schema: str = "public") -> Any:
    """The interaction the run waits on (its stored ``pending_interaction``:
    ``id``, the ``request`` with its ``kind``, ``requested_at``), or ``None``."""
    with Queue(dsn, schema=schema) as queue:
        status = await trio.to_thread.run_sync(queue.status, run_id)
    if status is None:
        raise _unknown_run(run_id)
    async with PostgresStore(dsn, schema=schema) as store:
        record = await store.load(status["current_run"])
    if record is None:
        return None
    conversation = (record.context or {}).get("conversation") or {}
    return conversation.get("pending_interaction")


async def watch(
    dsn: str, run_id: str, *, schema: str = "public", poll_interval: float = 5.0
) -> AsyncIterator[RunEvent]:
    """The stored events of a submitted run, replacement runs included, in
    order, until a worker has finished it.  ``LISTEN`` wakes it early; the
    events table is the truth, so a dropped notification loses nothing."""
    seen: dict[str, int] = {}
    with Queue(dsn, schema=schema) as queue:
        async with PostgresStore(dsn, schema=schema) as store:
            while True:
                status = await trio.to_thread.run_sync(queue.status, run_id)
                if status is None:
                    raise _unknown_run(run_id)
                for run in _chain(run_id, status["current_run"]):
                    events = await store.events(run, after=seen.get(run, 0))
                    seen[run] = seen.get(run, 0) + len(events)
                    for event in events:
                        yield event
                if status["state"] in ("done", "parked"):
                    return
                await trio.to_thread.run_sync(queue.listen, poll_interval, abandon_on_cancel=True)


def _chain(run_id: str, current: str) -> list[str]:
    """The run ids that carried ``run_id``, oldest first: each replacement
    is named ``<the run it replaced>#<fencing incarnation>``."""
    chain = [run_id]
    for suffix in current[len(run_id) :].split("#")[1:]:
        chain.append(f"{chain[-1]}#{suffix}")
    return chain
