"""A fleet worker: claims queued runs, holds each with a renewed lease,
runs it on ``PostgresStore``, and takes over runs whose worker stopped
without ever replaying an effect."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, final

import attrs
import trio

from .._numbers import is_seconds
from ..errors import Error, ErrorClass
from ..kernel import RunRecord
from ..recovery import replacement_for, settle_run
from ..runtime import open_conversation
from ..store import PostgresStore
from ..tools import Authority
from ._app import AgentSpec, FleetApp
from ._queue import Claim, Queue

__all__ = ["Worker", "continue_run", "converse"]

#: The message a replacement run starts with (its transcript holds the rest).
CONTINUE: Final = "(Your previous host stopped; the transcript above is all that happened. Go on.)"


@final
@attrs.frozen(kw_only=True)
class _Start:
    """How a claimed run goes on: its run id and what it carries."""

    run_id: str
    messages: tuple[Any, ...] | None = None
    work: int | None = None
    run_timeout: float | None = None
    #: a stored run fenced for this worker, going on where it stopped
    resume: RunRecord | None = None


@final
class Worker:
    """Claims and runs queued runs of ``app``'s agents, ``concurrency`` at
    a time (``agent_limits``: at most that many of one agent).

    A claim is a lease of ``lease`` seconds renewed every third of it; a
    worker that loses its lease stops the run (another worker has it, and
    fencing refuses whatever it would still commit).  Taking over a run
    whose lease lapsed: its stored incarnation is fenced and the run
    classified; with nothing in flight it is resumed on this worker's
    incarnation from its last committed boundary, with the run time it had
    left (``open_conversation(resume=)``; a run the runtime cannot resume
    goes on as a replacement run fed its committed transcript); with an
    uncertain effect it is settled ``unknown_outcome`` with its evidence
    (``on_uncertain="settle"``) or left fenced for a reconciler
    (``"park"``).  Never a replay.  A run claimed more than ``max_claims``
    times (its hosts keep failing) is fenced and parked.

    A run waiting for a person's approval longer than ``idle_bound``
    seconds (at once when draining) is released: the worker fences its own
    incarnation, so what it held can commit nothing, and the row waits,
    held by no worker, until an answer is given; the next worker to claim
    it resumes it with its remaining pre-wait budget.  A run whose tool is
    the one waiting (an effect in flight) keeps its slot: releasing it would
    leave the effect's outcome unknown.
    """

    def __init__(
        self,
        dsn: str,
        app: FleetApp,
        *,
        schema: str = "public",
        concurrency: int = 4,
        agent_limits: dict[str, int] | None = None,
        lease: float = 10.0,
        poll_interval: float = 0.2,
        drain_timeout: float = 30.0,
        on_uncertain: Literal["settle", "park"] = "settle",
        worker_id: str | None = None,
        max_claims: int = 5,
        idle_bound: float = 60.0,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise Error(ErrorClass.VALIDATION, "concurrency must be a positive int")
        for name, value in (("lease", lease), ("poll_interval", poll_interval)):
            if not is_seconds(value, 3600.0):
                raise Error(ErrorClass.VALIDATION, f"{name} must be seconds in (0, 3600]")
        if on_uncertain not in ("settle", "park"):
            raise Error(ErrorClass.VALIDATION, "on_uncertain must be 'settle' or 'park'")
        self.app = app
        self.queue = Queue(dsn, schema=schema)
        self._dsn, self._schema = dsn, schema
        self.concurrency = concurrency
        self.agent_limits = dict(agent_limits or {})
        self.lease, self.poll_interval = float(lease), float(poll_interval)
        self.drain_timeout = float(drain_timeout)
        self.on_uncertain = on_uncertain
        self.max_claims = max_claims
        self.idle_bound = float(idle_bound)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self._held: dict[str, str] = {}  # run_id -> agent
        self._draining = trio.Event()
        self._changed = trio.Event()

    def drain(self) -> None:
        """Stop claiming; :meth:`run` returns once what it holds is finished
        (or, past ``drain_timeout``, stopped and settled)."""
        self._draining.set()
        self._changed.set()

    def _free_agents(self) -> list[str]:
        """The app's agents this worker may claim a run of now (never one
        it does not define)."""
        if len(self._held) >= self.concurrency:
            return []
        held = list(self._held.values())
        return [a for a in self.app.names if held.count(a) < self.agent_limits.get(a, 10**9)]

    async def run(self) -> None:
        """Serve until :meth:`drain`."""
        await trio.to_thread.run_sync(self.queue.ensure)
        store = PostgresStore(self._dsn, schema=self._schema)
        async with store, trio.open_nursery() as nursery:
            nursery.start_soon(self._wake_on_notify)
            await self._claim_loop(store, nursery)
            with trio.move_on_after(self.drain_timeout):
                while self._held:
                    await self._wait_change(self.drain_timeout)
            nursery.cancel_scope.cancel()  # past the bound: stop (each run settles)
        self.queue.close()

    async def _wake_on_notify(self) -> None:
        """Wake the claim loop when the queue's channel is notified (a run
        submitted, an answer given): sooner than the poll, which stays for
        a notification lost between two listens."""
        listener = Queue(self._dsn, schema=self._schema)
        while True:
            try:
                await trio.to_thread.run_sync(listener.listen, 5.0, abandon_on_cancel=True)
            except Error:
                await trio.sleep(self.poll_interval)  # the database away: poll meanwhile
                continue
            self._changed.set()

    async def _claim_loop(self, store: Any, nursery: trio.Nursery) -> None:
        while not self._draining.is_set():
            agents = self._free_agents()
            claim = None
            if agents:
                # (the database away: try again after the poll interval)
                with contextlib.suppress(Error):
                    claim = await trio.to_thread.run_sync(
                        self.queue.claim, self.worker_id, self.lease, agents
                    )
            if claim is None:
                await self._wait_change()
                continue
            self._held[claim.run_id] = claim.agent
            nursery.start_soon(self._serve, store, claim)

    async def _wait_change(self, timeout: float | None = None) -> None:
        """Until a run ends or the poll interval passes (a claimable row
        may have appeared)."""
        with trio.move_on_after(self.poll_interval if timeout is None else timeout):
            await self._changed.wait()
        self._changed = trio.Event()

    async def _serve(self, store: Any, claim: Claim) -> None:
        """Run one claim under its lease; finish its row unless lost."""
        try:
            async with trio.open_nursery() as nursery:
                lost = trio.Event()
                nursery.start_soon(self._heartbeat, claim, lost, nursery.cancel_scope)
                state, outcome = await self._drive(store, claim)
                nursery.cancel_scope.cancel()
            if lost.is_set():
                pass  # another worker holds it now
            elif state == "requeue":
                await trio.to_thread.run_sync(self.queue.hand_back, claim.run_id, self.worker_id)
            elif state == "waiting":
                await trio.to_thread.run_sync(self.queue.release, claim.run_id, self.worker_id)
            else:
                await trio.to_thread.run_sync(
                    self.queue.finish, claim.run_id, self.worker_id, state, outcome
                )
        except Exception as exc:  # a failing run must not end the worker
            # its row stays claimed (the failure noted on it): the lease
            # lapses, a worker takes it over, past max_claims it is parked
            text = f"{type(exc).__name__}: {exc}"[:300]
            with contextlib.suppress(Error):
                await trio.to_thread.run_sync(self.queue.note, claim.run_id, self.worker_id, text)
        finally:
            self._held.pop(claim.run_id, None)
            self._changed.set()

    async def _heartbeat(self, claim: Claim, lost: trio.Event, scope: trio.CancelScope) -> None:
        """Renew the lease every third of it; once it is another's, or could
        not be renewed for a whole lease (it may be), stop the run."""
        renewed = trio.current_time()
        while True:
            await trio.sleep(self.lease / 3)
            try:
                ours = await trio.to_thread.run_sync(
                    self.queue.renew, claim.run_id, self.worker_id, self.lease
                )
            except Error:
                ours = trio.current_time() - renewed < self.lease
            else:
                renewed = trio.current_time() if ours else renewed
            if not ours:  # taken over: whatever we would commit is fenced anyway
                lost.set()
                scope.cancel()
                return

    async def apply_answers(self, conversation: Any, *, run_id: str) -> None:
        """Hand the run the answers people committed on any host, in order,
        each once the run asks the question it answers (one for another
        question is marked stale, one the run refuses with why); return
        when the run should be released (:class:`Worker`)."""
        waiting_since: float | None = None
        while True:
            snapshot = conversation.status()
            asked = snapshot.pending_interaction
            if asked is not None:
                try:
                    await self._answer(conversation, asked["id"], run_id)
                except Error as error:
                    if error.error_class is not ErrorClass.STORAGE_FAILED:
                        raise
                    # the queue's database away for a moment: the run goes
                    # on, and its answers are read again at the next poll
                snapshot = conversation.status()
            if _releasable(snapshot):
                waiting_since = waiting_since or trio.current_time()
                idle = trio.current_time() - waiting_since >= self.idle_bound
                if idle or self._draining.is_set():
                    return
            else:
                waiting_since = None
            if self._draining.is_set():
                await trio.sleep(self.poll_interval)
            else:
                with trio.move_on_after(self.poll_interval):
                    await self._draining.wait()  # a drain releases at once

    async def _answer(self, conversation: Any, asked: str, run_id: str) -> None:
        """Apply the first committed answer to the question ``asked``;
        mark each one it passes over with why."""
        for answer_id, interaction_id, answer in await trio.to_thread.run_sync(
            self.queue.answers, run_id
        ):
            error = await _answered(conversation, asked, interaction_id, answer)
            await trio.to_thread.run_sync(self.queue.applied, answer_id, error)
            if error is None:
                return  # answered: the next answer waits for the next question

    async def _drive(self, store: Any, claim: Claim) -> tuple[str, str]:
        """The row's next state (``done``, ``parked``, ``requeue``,
        ``waiting``) and the run's outcome."""
        if claim.claims > self.max_claims:
            # claimed again and again (a run whose host keeps failing): stop
            try:
                record = await store.load(claim.current_run)
            except Error as error:
                if error.details.get("run_id") != claim.current_run:  # the store, not the run
                    raise
                # its record cannot be read (damaged, or a newer version's): parked as it is
                why = f"{error.error_class.value}: {error.message}"
                return "parked", f"claimed {claim.claims} times; the run cannot be read: {why}"
            if record is not None:
                await settle_run(store, claim.current_run, park_uncertain=True)
            return "parked", f"claimed {claim.claims} times"
        start = await self._start(store, claim)
        try:
            return await self._converse(store, claim, start)
        except Error as refused:
            if not isinstance(start, _Start) or start.resume is None:
                raise
            if not _not_resumable(refused):
                raise
        # a run the runtime cannot resume (fenced, nothing in flight: it
        # never started a turn, say): settled, and replaced
        return await self._converse(store, claim, await self._start(store, claim, resume=False))

    async def _converse(
        self, store: Any, claim: Claim, start: _Start | tuple[str, str]
    ) -> tuple[str, str]:
        if isinstance(start, tuple):
            return start
        spec = await self.app.spec(claim.agent, start.run_id)
        if start.run_id != claim.current_run:
            await trio.to_thread.run_sync(
                self.queue.move, claim.run_id, self.worker_id, start.run_id
            )
        pump = functools.partial(self.apply_answers, run_id=claim.run_id)
        # a replacement goes on from its transcript; one of a run that never
        # committed its first message starts from the prompt
        prompt = CONTINUE if start.messages else claim.prompt
        return await converse(store, spec, start, prompt, pump)

    async def _start(
        self, store: Any, claim: Claim, *, resume: bool = True
    ) -> _Start | tuple[str, str]:
        """A fresh start, a resumed run, a replacement, or the row's end (a
        terminal run, or one with an uncertain effect: settled, or parked)."""
        record = await store.load(claim.current_run)
        if record is None:
            return _Start(run_id=claim.current_run)
        park = self.on_uncertain == "park"
        settled = await settle_run(store, claim.current_run, park_uncertain=park, resume=resume)
        if settled.resumable:
            return _Start(run_id=claim.current_run, resume=settled.record)
        if not settled.record.terminal:
            return "parked", "recovery_required"  # fenced, for a reconciler
        if not settled.committed or settled.record.state != "cancelled":
            return "done", settled.record.state
        try:
            left = replacement_for(settled)
        except Error as error:
            return "done", f"{settled.record.state}: {error.error_class.value}"
        return _Start(
            # the replaced run's id and its fencing incarnation: unique
            run_id=f"{claim.current_run}#{settled.record.incarnation}",
            messages=left.messages,
            work=left.work,
            run_timeout=left.run_timeout,
        )


async def _answered(conversation: Any, asked: Any, interaction_id: str, answer: Any) -> str | None:
    """Give ``conversation`` an answer; why it was refused, if it was."""
    if interaction_id != asked:
        return "stale: the run does not wait on this interaction"
    try:
        await conversation.resolve(interaction_id, answer)
    except Error as refused:
        if refused.error_class is ErrorClass.STORAGE_FAILED:
            raise  # the run's store away for a moment: read again, not refused
        return f"{refused.error_class.value}: {refused.message}"
    return None


def _releasable(snapshot: Any) -> bool:
    """Waiting for a person with nothing in flight: the gateway's approval
    of a call that has not started."""
    run = snapshot.run
    return bool(
        snapshot.phase == "waiting_interaction"
        and not run.active_tools
        and run.active_provider is None
    )


async def converse(
    store: Any,
    spec: AgentSpec,
    start: _Start,
    prompt: Any,
    pump: Callable[[Any], Awaitable[None]] | None = None,
) -> tuple[str, str]:
    """Run ``start`` to its end (a resumed run takes no prompt);
    ``pump(conversation)`` runs beside it (a worker's answers from any
    host): once it returns, the run is released to wait for a person
    (``("waiting", ...)``): this incarnation is fenced first, so the
    conversation, leaving its block, commits nothing."""
    authority = spec.authority or Authority.for_registry(
        spec.registry, caller="fleet", run_id=start.run_id
    )
    async with open_conversation(
        start.run_id,
        store=store,
        provider=spec.provider,
        registry=spec.registry,
        authority=attrs.evolve(authority, run_id=start.run_id),
        work=spec.work if start.work is None else min(spec.work, start.work),
        run_timeout=spec.run_timeout if start.run_timeout is None else start.run_timeout,
        effect_timeout=spec.effect_timeout,
        messages=start.messages,
        resume=start.resume,
    ) as conversation:
        if start.resume is None:
            await conversation.prompt(prompt)
        released = await _until_settled_or_released(conversation, pump)
        if released:
            run = conversation.status().run
            await store.fence(run.run_id, incarnation=run.incarnation + 1)
            return "waiting", "waiting_interaction"
        snapshot = conversation.status()
    if snapshot.phase != "terminal":
        # its storage failed: not known how it ended; a takeover will settle it
        return "requeue", str(snapshot.phase)
    return "done", snapshot.run.state


async def _until_settled_or_released(
    conversation: Any, pump: Callable[[Any], Awaitable[None]] | None
) -> bool:
    """Whether ``pump`` returned (release the run) before it settled."""
    released = False
    async with trio.open_nursery() as nursery:

        async def pumped() -> None:
            nonlocal released
            assert pump is not None
            await pump(conversation)
            released = True
            nursery.cancel_scope.cancel()

        if pump is not None:
            nursery.start_soon(pumped)
        await conversation.wait_settled()
        nursery.cancel_scope.cancel()
    return released


async def continue_run(
    store: Any, run_id: str, spec: AgentSpec, *, new_run_id: str | None = None
) -> tuple[str, str]:
    """A single host's takeover: fence ``run_id``
    (:func:`~trio_backplane.recovery.settle_run`) and go on with ``spec``
    where nothing in flight may have changed the world: resumed on the
    fencing incarnation from its last committed boundary, or, when the
    runtime cannot resume it, settled and replaced by ``new_run_id``
    (default ``<run_id>#<the fencing incarnation>``) fed its committed
    transcript with the work and time left.  The run id that went on (the
    same one when resumed) and its final state; ``unknown_outcome`` if the
    run cannot be continued (it needs a reconciler)."""
    settled = await settle_run(store, run_id, resume=True)
    if settled.resumable:
        try:
            _, state = await converse(
                store, spec, _Start(run_id=run_id, resume=settled.record), None
            )
        except Error as refused:
            if not _not_resumable(refused):
                raise
        else:
            return run_id, state
        settled = await settle_run(store, run_id)
    left = replacement_for(settled)
    start = _Start(
        run_id=new_run_id or f"{run_id}#{settled.record.incarnation}",
        messages=left.messages,
        work=left.work,
        run_timeout=left.run_timeout,
    )
    _, state = await converse(store, spec, start, CONTINUE)
    return start.run_id, state


def _not_resumable(error: Error) -> bool:
    """Whether ``open_conversation(resume=...)`` refused the record itself
    (a run that never started a turn, say): then it is settled and
    replaced.  Any other conflict (a newer owner's fence) is not ours to
    override."""
    return (
        error.error_class is ErrorClass.RESOURCE_CONFLICT
        and error.details.get("reason") == "not_resumable"
    )
