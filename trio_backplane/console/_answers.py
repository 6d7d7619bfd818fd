"""Where an answer goes: the host holding the run resolves it (committed,
then the waiting turn woken), in this process or through the fleet."""

from __future__ import annotations

from typing import Any, Protocol, final

from ..errors import Error, ErrorClass

__all__ = ["Answerer", "FleetAnswers", "LocalAnswers"]


class Answerer(Protocol):
    """``await answerer(run_id, interaction_id, answer)``: commit the answer
    to the run's pending interaction through its holding host; raises a
    classed ``Error`` when it is refused."""

    async def __call__(self, run_id: str, interaction_id: str, answer: Any) -> None: ...


@final
class LocalAnswers:
    """Answers for the conversations this process holds open: each resolved
    through its own ``Conversation.resolve`` (committed, then delivered)."""

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}

    def hold(self, run_id: str, conversation: Any) -> None:
        """Answer ``run_id``'s questions through ``conversation``."""
        self._held[run_id] = conversation

    def release(self, run_id: str) -> None:
        self._held.pop(run_id, None)

    async def __call__(self, run_id: str, interaction_id: str, answer: Any) -> None:
        conversation = self._held.get(run_id)
        if conversation is None:
            raise Error(
                ErrorClass.NOT_FOUND,
                "no conversation in this process holds the run",
                {"run_id": run_id},
            )
        await conversation.resolve(interaction_id, answer)


@final
class FleetAnswers:
    """Answers for runs of a worker fleet on PostgreSQL: committed to the
    queue, the worker holding the run woken (``fleet.resolve``)."""

    def __init__(self, dsn: str, *, schema: str = "public") -> None:
        self.dsn, self.schema = dsn, schema

    def __repr__(self) -> str:
        return f"FleetAnswers(schema={self.schema!r})"  # never the DSN: it may hold a password

    async def __call__(self, run_id: str, interaction_id: str, answer: Any) -> None:
        from ..fleet import resolve

        await resolve(self.dsn, await self._row(run_id), interaction_id, answer, schema=self.schema)

    async def _row(self, run_id: str) -> str:
        """The queue row whose current run is ``run_id``: its own row, or
        for a replacement (``<row>#<incarnation>``) that row, checked."""
        import trio

        from ..fleet._queue import Queue

        with Queue(self.dsn, schema=self.schema) as queue:
            for row in dict.fromkeys((run_id, run_id.rpartition("#")[0])):
                status = await trio.to_thread.run_sync(queue.status, row) if row else None
                if status is not None and status["current_run"] == run_id:
                    return row
        raise Error(
            ErrorClass.NOT_FOUND,
            "no fleet row runs this run now",
            {"run_id": run_id},
        )
