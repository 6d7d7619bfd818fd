"""The collaboration manager: child agents as real conversations in its
nursery, on the parent's store, with carried quota and bounded authority."""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, final

import attrs
import trio

from .._numbers import is_seconds
from ..errors import Error, ErrorClass
from ..runtime import Conversation, Snapshot, open_conversation
from ..runtime._nursery import owning_nursery
from ..tools import Authority
from ._agent import FINAL, LIVE, Agent, final_text, status_of
from ._options import AgentRequest, ChildOptions, ChildOptionsFactory, check_within

__all__ = ["AgentManager", "Closure"]

_TASK_NAME: Final = re.compile(r"[a-z0-9_]{1,64}")


@final
@attrs.frozen(kw_only=True)
class Closure:
    """The closure of one agent, as the parent's terminal path reads it."""

    id: str
    kind: str = "agent"
    status: str
    reason: str | None = None

    @property
    def confirmed(self) -> bool:
        return self.status == "confirmed"


def _unknown(message: str, agent: Agent) -> Error:
    details = {"agent_name": agent.name, "run_id": agent.run_id, "reason": agent.closure}
    return Error(ErrorClass.UNKNOWN_OUTCOME, message, details)


@final
class AgentManager:
    """Child agents of one parent run.

    Build it, put :func:`agent_tools` of it in the parent's registry, then
    ``async with manager.open(parent):`` inside the parent's conversation: children run
    in that block's nursery and none outlives it.  The parent run's
    terminal path closes every child tree (the tools name the manager as
    their ``resource_registry``); a closure that cannot be confirmed is
    ``unknown_outcome``, and so is the parent's terminal.
    """

    def __init__(
        self,
        *,
        store: Any,
        parent_run_id: str,
        child_options: ChildOptionsFactory,
        parent_authority: Authority | None = None,
        parent_name: str = "root",
        max_agents: int = 16,
        min_wait_timeout: float = 10.0,
        max_wait_timeout: float = 3600.0,
        default_wait_timeout: float = 30.0,
        close_timeout: float = 5.0,
    ) -> None:
        if type(max_agents) is not int or not 1 <= max_agents <= 256:
            raise Error(ErrorClass.VALIDATION, "max_agents must be an int in 1..256")
        if not (0 < min_wait_timeout <= default_wait_timeout <= max_wait_timeout):
            raise Error(
                ErrorClass.VALIDATION, "wait timeouts must be ordered min <= default <= max"
            )
        if not is_seconds(close_timeout, 600.0):
            raise Error(ErrorClass.VALIDATION, "close_timeout must be seconds in (0, 600]")
        if parent_authority is not None and not isinstance(parent_authority, Authority):
            raise Error(ErrorClass.VALIDATION, "parent_authority must be an Authority")
        self.store = store
        self.parent_run_id = parent_run_id
        self.parent_name = "/" + parent_name.strip("/")
        self.parent_authority = parent_authority or Authority()
        self.max_agents = max_agents
        self.wait_bounds = (min_wait_timeout, default_wait_timeout, max_wait_timeout)
        self.close_timeout = float(close_timeout)
        self._child_options = child_options
        self._agents: dict[str, Agent] = {}
        self._nursery: trio.Nursery | None = None
        self._parent: Conversation | None = None
        #: agents with an update nobody waited for yet, and a wake-up for waiters
        self._updates: dict[str, None] = {}
        self._changed = trio.Event()

    # -- the block ----------------------------------------------------------------

    @asynccontextmanager
    async def open(
        self, parent: Conversation | None = None, *, authority: Authority | None = None
    ) -> AsyncIterator[AgentManager]:
        """Run children in this block; leaving it closes every tree (an
        unconfirmed closure raises ``unknown_outcome`` here).  ``parent``
        hears ``agent_updated``; ``authority`` (the parent run's, which
        bounds every child's) replaces the one given at construction."""
        if self._nursery is not None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "the agent manager is already open")
        if authority is not None:
            if not isinstance(authority, Authority):
                raise Error(ErrorClass.VALIDATION, "authority must be an Authority")
            self.parent_authority = authority
        async with owning_nursery("a child agent's task failed") as nursery:
            self._nursery, self._parent = nursery, parent
            try:
                yield self
            finally:
                with trio.CancelScope(shield=True):
                    closures = await self.close_owner(self.parent_run_id)
                self._nursery, self._parent = None, None  # open again later, if need be
                nursery.cancel_scope.cancel()  # a child task left behind cannot outlive us
        failed = [c for c in closures if not c.confirmed]
        if failed:
            raise Error(
                ErrorClass.UNKNOWN_OUTCOME,
                "child agent closure is unconfirmed",
                {"agents": [c.id for c in failed][:20]},
            )

    # -- who calls ----------------------------------------------------------------

    def caller(self, run_id: str) -> tuple[str, Authority]:
        """The calling agent's name and authority: the parent run, or an
        agent's current running run; anything else is ``forbidden``."""
        if run_id == self.parent_run_id:
            return self.parent_name, self.parent_authority
        for agent in self._agents.values():
            if agent.run_id == run_id and agent.status == "running":
                return agent.name, agent.authority
        raise Error(ErrorClass.FORBIDDEN, "the caller is not this manager's parent or agent")

    def resolve(self, caller: str, target: str) -> Agent:
        """``target`` as a full name, or a name relative to ``caller``: one
        of the caller's descendants (``forbidden`` otherwise: an agent never
        acts on its parent or its peers)."""
        name = target if target.startswith("/") else f"{caller}/{target}"
        if not name.startswith(caller + "/"):
            raise Error(
                ErrorClass.FORBIDDEN,
                "an agent can only act on its own agents",
                {"agent_name": name[:300], "caller": caller},
            )
        agent = self._agents.get(name)
        if agent is None:
            raise Error(ErrorClass.NOT_FOUND, "agent not found", {"agent_name": name[:300]})
        return agent

    def _tree(self, agent: Agent) -> list[Agent]:
        """``agent`` and its descendants, deepest first."""
        prefix = agent.name + "/"
        below = [a for name, a in self._agents.items() if name.startswith(prefix)]
        return [*sorted(below, key=lambda a: -a.name.count("/")), agent]

    def agents(self, prefix: str = "/") -> list[Agent]:
        return [a for name, a in sorted(self._agents.items()) if name.startswith(prefix)]

    # -- spawn and replacement -------------------------------------------------------

    async def spawn(self, run_id: str, task_name: str, message: str) -> Agent:
        """A new agent under the caller, started and prompted."""
        caller, authority = self.caller(run_id)
        if type(task_name) is not str or not _TASK_NAME.fullmatch(task_name):
            raise Error(ErrorClass.VALIDATION, "task_name must match [a-z0-9_]+")
        name = f"{caller}/{task_name}"
        if name in self._agents:
            raise Error(ErrorClass.VALIDATION, "an agent of that name exists", {"agent_name": name})
        if sum(1 for a in self._agents.values() if a.status in LIVE) >= self.max_agents:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "agent limit reached",
                {"max_agents": self.max_agents},
            )
        request = AgentRequest(
            kind="spawn", agent_name=name, run_id=f"{name}:1", caller=caller, message=message
        )
        options = await self._options(request)
        check_within(options.authority, authority)
        agent = Agent(
            name=name,
            parent=caller,
            quota=options.work,
            deadline=trio.current_time() + options.run_timeout,
            authority=options.authority,
        )
        self._agents[name] = agent
        try:
            await self._start(agent, options, message, None)
        except BaseException:
            # its first prompt was never admitted (the task has left its
            # conversation): no effect ran, so as if never asked
            del self._agents[name]
            raise
        return agent

    async def replace(self, run_id: str, agent: Agent, message: str) -> None:
        """A fresh run of a settled agent, fed its committed transcript, with
        the work and time it has left and no wider authority (AGT-03..07)."""
        caller, _ = self.caller(run_id)
        snapshot = self._continuable(agent)
        left = agent.deadline - trio.current_time()
        if agent.remaining_work() <= 0:
            raise Error(ErrorClass.BUDGET_EXCEEDED, "the agent has no work left", _quota(agent))
        if left <= 0:
            raise Error(ErrorClass.TIMEOUT, "the agent has no time left", {"agent": agent.name})
        request = AgentRequest(
            kind="replacement",
            agent_name=agent.name,
            run_id=f"{agent.name}:{agent.sequence + 1}",
            caller=caller,
            message=message,
        )
        options = await self._options(request)
        check_within(options.authority, self._parent_authority(agent), agent.authority)
        carried = attrs.evolve(options, work=agent.remaining_work(), run_timeout=left)
        try:
            await self._start(agent, carried, message, tuple(snapshot.messages))
        except Error as error:
            # the run id has moved on: the snapshot stays, as evidence only
            self._set(agent, agent.run_id, "errored", f"{error.error_class.value}: {error.message}")
            raise
        agent.authority = options.authority
        agent.snapshot = None  # a successful replacement clears it

    def _continuable(self, agent: Agent) -> Snapshot:
        """The settled snapshot of the agent's current run, if it may go on:
        never an older run's (a failed replacement moved the run id on)."""
        if agent.closure not in (None, "confirmed"):
            raise _unknown("the agent's closure is unconfirmed", agent)
        tagged = agent.snapshot
        if tagged is None or tagged[:2] != (agent.run_id, agent.incarnation):
            if agent.status in ("pending_init", "running"):
                raise Error(ErrorClass.RESOURCE_CONFLICT, "the agent's run has not settled")
            raise _unknown("the agent's snapshot is not of its current run", agent)
        if agent.status not in ("completed", "interrupted", "shutdown"):
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "only a completed or interrupted agent can go on",
                {"agent_name": agent.name, "status": agent.status},
            )
        snapshot = tagged[2]
        if snapshot.run.state == "unknown_outcome" or snapshot.run.active_tools:
            raise _unknown("the agent's last run left an unresolved mutation", agent)
        if snapshot.resource_cleanup.status != "confirmed":
            raise _unknown("the agent's last run did not confirm its cleanup", agent)
        return snapshot

    def _parent_authority(self, agent: Agent) -> Authority:
        parent = self._agents.get(agent.parent)
        return self.parent_authority if parent is None else parent.authority

    async def _options(self, request: AgentRequest) -> ChildOptions:
        options = self._child_options(request)
        if inspect.isawaitable(options):
            options = await options
        if not isinstance(options, ChildOptions):
            raise Error(ErrorClass.VALIDATION, "child_options must return ChildOptions")
        return options

    async def _start(
        self, agent: Agent, options: ChildOptions, message: str, messages: Any
    ) -> None:
        """Open the agent's next run in the nursery and prompt it; the
        agent's run id moves on first (a failed start leaves it there)."""
        if self._nursery is None:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "the agent manager is not open")
        agent.sequence += 1
        agent.run_id = f"{agent.name}:{agent.sequence}"
        agent.release, agent.done, agent.died = trio.Event(), trio.Event(), None
        agent.conversation = None
        agent.status, agent.final, agent.reason, agent.closure = "pending_init", None, None, None
        await self._nursery.start(self._run, agent, options, message, messages)

    async def _run(
        self,
        agent: Agent,
        options: ChildOptions,
        message: str,
        messages: Any,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One run of ``agent``: open, prompt, settle, stay open until released."""
        run_id, started = agent.run_id, False
        try:
            async with open_conversation(
                run_id,
                store=self.store,
                provider=options.provider,
                registry=options.registry,
                authority=attrs.evolve(options.authority, run_id=run_id),
                work=options.work,
                run_timeout=options.run_timeout,
                effect_timeout=options.effect_timeout,
                messages=messages,
            ) as conversation:
                agent.conversation = conversation
                await conversation.prompt(message)
                self._set(agent, run_id, "running")
                started = True
                task_status.started()
                snapshot = await conversation.wait_settled()
                self._settled(agent, run_id, snapshot)
                await agent.release.wait()
            self._settled(agent, run_id, conversation.status())
        except Exception as exc:
            if not started:
                raise
            agent.died = f"{type(exc).__name__}: {exc}"[:300]
            self._set(agent, run_id, "errored", agent.died)
        finally:
            agent.done.set()

    def _settled(self, agent: Agent, run_id: str, snapshot: Snapshot) -> None:
        if agent.run_id != run_id:
            return  # a late word from an earlier run
        if agent.used_run != run_id:
            agent.used += snapshot.run.budget.used
            agent.used_run = run_id
        agent.snapshot = (run_id, snapshot.run.incarnation, snapshot)
        status, reason = status_of(snapshot)
        if agent.status in ("running", "pending_init"):
            agent.final = final_text(snapshot)
            self._set(agent, run_id, status, reason)

    def _set(self, agent: Agent, run_id: str, status: str, reason: str | None = None) -> None:
        if agent.run_id != run_id or agent.status == status:
            return
        agent.status, agent.reason = status, reason
        if status in FINAL or status == "shutdown":  # what wait_agent reports
            self._updates[agent.name] = None
            self._changed.set()
            self._changed = trio.Event()
        parent = self._parent
        if parent is not None:
            # (once the parent's run has had its last word, nobody is told)
            with contextlib.suppress(Error):
                parent.agent_updated(agent.name, status)

    # -- input, interruption and closure ----------------------------------------------

    def running(self, agent: Agent) -> Conversation:
        """The agent's conversation, if its run accepts input now."""
        if agent.status != "running" or agent.conversation is None:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "the agent is not running",
                {"agent_name": agent.name, "status": agent.status},
            )
        return agent.conversation

    async def interrupt(self, agent: Agent) -> None:
        """Cancel the running runs of ``agent``'s tree; idempotent."""
        for member in self._tree(agent):
            conversation = member.conversation
            if member.status == "running" and conversation is not None:
                await self._stop(member)
                self._settled(member, member.run_id, await conversation.wait_settled())

    async def _stop(self, agent: Agent) -> None:
        """Ask the agent's run to stop if it still runs (it may have ended
        meanwhile: then there is nothing to ask)."""
        conversation = agent.conversation
        if conversation is not None and agent.status == "running":
            with trio.move_on_after(self.close_timeout), contextlib.suppress(Error):
                await conversation.cancel()

    async def close(self, agent: Agent) -> list[Closure]:
        """Close ``agent``'s tree, deepest first; idempotent.  Raises
        ``unknown_outcome`` (again on every retry) if a closure cannot be
        confirmed; unrelated agents are never touched."""
        closures = [await self._close_one(member) for member in self._tree(agent)]
        failed = [c for c in closures if not c.confirmed]
        if failed:
            raise _unknown("child agent closure is unconfirmed", self._agents[failed[0].id])
        return closures

    async def _close_one(self, agent: Agent) -> Closure:
        if agent.closure is None and agent.status != "shutdown":
            await self._stop(agent)
            agent.release.set()
            with trio.move_on_after(self.close_timeout):
                await agent.done.wait()
            agent.closure = self._judge(agent)
            if agent.closure == "confirmed":
                self._set(agent, agent.run_id, "shutdown")
            elif agent.status in ("running", "pending_init"):
                self._set(agent, agent.run_id, "interrupted")
        status = "confirmed" if agent.closure in (None, "confirmed") else "uncertain"
        reason = None if status == "confirmed" else agent.closure
        return Closure(id=agent.name, status=status, reason=reason)

    def _judge(self, agent: Agent) -> str:
        """``"confirmed"``, or why the agent's run is not known to be over."""
        if not agent.done.is_set():
            return f"its conversation did not close within {self.close_timeout} s"
        if agent.died is not None:
            return f"its conversation died: {agent.died}"
        if agent.conversation is None:
            return "confirmed"  # its run never opened: nothing ran
        final = agent.conversation.status()
        if final.phase != "terminal":
            return f"its run ended {final.phase}"
        if final.resource_cleanup.status != "confirmed":
            return "its run's resource cleanup is unconfirmed"
        return "confirmed"

    async def close_owner(self, owner: str) -> list[Closure]:
        """Close every tree ``owner`` (the parent run, or an agent's run)
        spawned: what a run's terminal path calls, one result an agent."""
        if owner == self.parent_run_id:
            name = self.parent_name
        else:
            found = [a for a in self._agents.values() if a.run_id == owner]
            if not found:
                return []
            name = found[0].name
        roots = [a for a in self._agents.values() if a.parent == name]
        results: list[Closure] = []
        for root in roots:
            results.extend([await self._close_one(member) for member in self._tree(root)])
        return results

    # -- waiting ------------------------------------------------------------------------

    def wait_timeout(self, timeout_ms: Any) -> float:
        low, default, high = self.wait_bounds
        if timeout_ms is None:
            return default
        seconds = timeout_ms / 1000 if type(timeout_ms) is int else -1.0
        if not low <= seconds <= high:
            raise Error(
                ErrorClass.VALIDATION,
                "timeout_ms is out of bounds",
                {"min": int(low * 1000), "max": int(high * 1000)},
            )
        return seconds

    async def wait(self, caller: str, seconds: float) -> list[str]:
        """Agents under ``caller`` with an update not reported before,
        waiting up to ``seconds`` for one; each is reported once."""
        prefix = caller + "/"
        with trio.move_on_after(seconds):
            while True:
                ready = [name for name in self._updates if name.startswith(prefix)]
                if ready:
                    for name in ready:
                        del self._updates[name]
                    return ready
                await self._changed.wait()
        return []


def _quota(agent: Agent) -> Mapping[str, Any]:
    return {"agent_name": agent.name, "quota": agent.quota, "used": agent.used}
