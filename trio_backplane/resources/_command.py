"""``LocalCommand``: shell commands in their own process groups on Linux,
with cleanup confirmed from ``/proc``."""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, Final, final

import attrs
import trio

from .._numbers import is_seconds
from ..errors import Error, ErrorClass
from ._jobs import LINE_COST, CommandOutput, Job, Signaler, clean_group, default_signaler
from ._launch import DEFAULT_ENV, CommandLimits, environment, launch
from ._ledger import CAPACITY, Ledger, Obligation, check_capacity
from ._orphans import group_evidence
from ._proc import supported
from ._refusals import RefusalSigner, unverified

__all__ = ["BeforeRun", "CommandInvocation", "LocalCommand"]

#: Told a launched group's evidence before its command runs.
BeforeRun = Callable[[dict[str, Any]], Awaitable[None]]

#: The default output limit of a command, in bytes (each line costs 8 more).
OUTPUT_LIMIT: Final = 1 << 20


@final
@attrs.frozen(kw_only=True)
class CommandInvocation:
    """Who asks: the owning run, its incarnation and the numeric session.
    The runtime supplies it from trusted context, never from a model."""

    owner: str
    session_id: int
    incarnation: int = 1


def _seconds(name: str, value: Any, maximum: float) -> float:
    if not is_seconds(value, maximum):
        raise Error(
            ErrorClass.VALIDATION,
            f"{name} must be seconds in (0, {maximum}]",
            {name: repr(value)[:100]},
        )
    return float(value)


@final
class LocalCommand:
    """Commands in their own session and process group, each confirmed gone.

    Use as ``async with LocalCommand() as command:``; leaving it kills every
    group it still owns.  Linux only (``unsupported_capability`` elsewhere).
    Every command's environment holds ``TRIO_BACKPLANE_GROUP``, its group's
    mark: a descendant that starts a session or group of its own carries it
    and is stopped with the group (not one whose environment this user
    cannot read, nor one that cleared or rewrote it).  ``signaler`` stops
    groups; such descendants are signalled directly.
    """

    def __init__(
        self,
        *,
        cleanup_timeout: float = 0.75,
        shutdown_timeout: float = 0.75,
        startup_timeout: float = 1.0,
        completion_retention: float = 5.0,
        receipt_capacity: int = CAPACITY,
        session_capacity: int = CAPACITY,
        env_allow: Collection[str] = DEFAULT_ENV,
        signaler: Signaler | None = None,
    ) -> None:
        self.cleanup_timeout = _seconds("cleanup_timeout", cleanup_timeout, 4.0)
        self.shutdown_timeout = _seconds("shutdown_timeout", shutdown_timeout, 2.0)
        self.startup_timeout = _seconds("startup_timeout", startup_timeout, 60.0)
        if not (type(completion_retention) in (int, float) and 0 <= completion_retention < 1e9):
            raise Error(ErrorClass.VALIDATION, "completion_retention must be seconds >= 0")
        self.completion_retention = float(completion_retention)
        self._ledger = Ledger(
            receipt_capacity=check_capacity("receipt_capacity", receipt_capacity),
            session_capacity=check_capacity("session_capacity", session_capacity),
        )
        self._env = environment(tuple(env_allow))
        self._signaler = signaler or default_signaler
        self._jobs: dict[int, Job] = {}  # readable output, until retention ends
        self._evidence: dict[int, Job] = {}  # cleanup not confirmed: kept for good
        self._workspaces: dict[str, int] = {}
        self._stack = contextlib.AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._refusals = RefusalSigner()
        self._closing = False
        #: sessions being launched: set once each is registered (and stopped
        #: if cancelled meanwhile) or refused
        self._launching: dict[int, trio.Event] = {}

    async def __aenter__(self) -> LocalCommand:
        if not supported():
            raise Error(ErrorClass.UNSUPPORTED_CAPABILITY, "local command backend is not supported")
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._closing = True
        try:
            with trio.CancelScope(shield=True):
                await self._shutdown()
        finally:
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()
            await self._stack.aclose()

    @property
    def receipt_capacity(self) -> int:
        return self._ledger.receipt_capacity

    @property
    def session_capacity(self) -> int:
        return self._ledger.session_capacity

    # -- sessions ---------------------------------------------------------------

    def reserve(self, invocation: CommandInvocation) -> None:
        """Reserve the invocation's session before launch (reusable)."""
        self._ledger.reserve(
            invocation.session_id, invocation.owner, invocation.incarnation, self._retained()
        )

    def acknowledge_release(self, invocation: CommandInvocation) -> None:
        """Retire a confirmed session into the receipts."""
        self._ledger.acknowledge(invocation.session_id, invocation.owner, invocation.incarnation)

    def _retained(self) -> int:
        live = self._ledger.live
        kept = {**self._jobs, **self._evidence}
        return sum(1 for session_id in kept if session_id not in live)

    # -- launch -----------------------------------------------------------------

    async def start(
        self,
        invocation: CommandInvocation,
        command: str,
        *,
        workspace: str | Path,
        timeout: float | None = None,
        output_limit: int = OUTPUT_LIMIT,
        limits: CommandLimits | None = None,
        before_run: BeforeRun | None = None,
    ) -> CommandOutput:
        """Launch ``command`` (``/bin/sh -c``) in ``workspace``, verified;
        returns at once with the running command's first record.
        ``before_run``: awaited with the verified group's evidence (see
        :func:`kill_orphans`) before the command runs; raising refuses the
        launch, and nothing ran (record it durably there).

        Every ``Error`` it raises is a refusal that ran nothing, with
        ``launch_status: "never_started"`` and a proof
        :meth:`validate_refusal` checks."""
        try:
            job = await self._started(
                invocation,
                command,
                workspace=workspace,
                timeout=timeout,
                output_limit=output_limit,
                how=(limits, before_run),
            )
        except Error as error:
            if type(invocation) is not CommandInvocation:
                raise
            raise self._refusals.sign(invocation, error, self._ledger.floor) from error
        try:
            self._jobs[job.session_id] = job
            assert self._nursery is not None
            if self._closing:  # closed while it launched: nobody would supervise it
                await self._abandon(job)
                raise _unknown(
                    "local command backend closed while the command launched; it was stopped",
                    invocation,
                )
            self._nursery.start_soon(self._supervise, job)
            if job.obligation.fenced:
                # A cancel came after the launch was admitted, while the
                # launcher was acknowledged: it found no job to stop then.
                self._stop(job)
        finally:
            self._launching.pop(job.session_id).set()
        return job.output(0)

    def validate_refusal(self, invocation: CommandInvocation, error: BaseException) -> None:
        """Return only when ``error`` is a refusal :meth:`start` raised for
        ``invocation`` on this backend and the session has not launched
        since (nothing ran: its reservation may be withdrawn without
        cleanup); ``unknown_outcome`` "command refusal is unverified" for
        anything else."""
        floor = self._refusals.verify(invocation, error)
        if self._ledger.launched(invocation.session_id, since=floor):
            raise unverified(invocation, error)

    def retire(self, invocation: CommandInvocation) -> None:
        """After a validated refusal: the session, which never launched, is
        fenced and receipted, so it no longer counts against
        ``session_capacity``.  ``resource_conflict`` for one that launched."""
        self._ledger.retire(invocation.session_id, invocation.owner, invocation.incarnation)

    async def _started(
        self,
        invocation: CommandInvocation,
        command: str,
        *,
        workspace: str | Path,
        timeout: float | None,
        output_limit: int,
        how: tuple[CommandLimits | None, BeforeRun | None],
    ) -> Job:
        if self._nursery is None or self._closing:
            raise Error(ErrorClass.RESOURCE_CONFLICT, "LocalCommand is not open")
        if type(command) is not str or not command or "\0" in command:
            raise Error(ErrorClass.VALIDATION, "command must be a non-empty str without NUL")
        if type(output_limit) is not int or output_limit < 1:
            raise Error(ErrorClass.VALIDATION, "output_limit must be a positive int")
        where = str(Path(workspace).resolve())
        obligation = self._ledger.reserve(
            invocation.session_id, invocation.owner, invocation.incarnation, self._retained()
        )
        if where in self._workspaces:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "workspace already has an active command",
                {"workspace": where, "launch_status": "never_started"},
            )
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        self._ledger.launching(obligation)
        settled = self._launching[obligation.session_id] = trio.Event()
        self._workspaces[where] = obligation.session_id
        try:
            job = await self._launch(obligation, command, where, deadline, how)
        except BaseException:
            # nothing ran: the launcher is killed before it execs the command
            del self._workspaces[where]
            obligation.state, obligation.fenced = "confirmed", True
            del self._launching[obligation.session_id]
            settled.set()
            raise
        job.output_limit = output_limit
        return job

    async def _launch(
        self,
        obligation: Obligation,
        command: str,
        where: str,
        deadline: float,
        how: tuple[CommandLimits | None, BeforeRun | None],
    ) -> Job:
        limits, before_run = how
        startup = min(self.startup_timeout, deadline - trio.current_time())
        if startup <= 0:
            raise Error(ErrorClass.TIMEOUT, "local command deadline elapsed during startup")

        async def admit(pgid: int, start_time: int) -> None:
            if before_run is not None:
                await before_run(group_evidence(pgid, start_time, session_id=obligation.session_id))
            if obligation.fenced:
                raise Error(
                    ErrorClass.CANCELLED,
                    "local command was cancelled during startup",
                    {"session_id": obligation.session_id, "launch_status": "never_started"},
                )
            if trio.current_time() >= deadline:
                raise Error(ErrorClass.TIMEOUT, "local command deadline elapsed during startup")

        launched = await launch(
            command,
            workspace=where,
            env=self._env,
            limits=limits or CommandLimits(),
            startup_timeout=startup,
            admit=admit,
        )
        obligation.state, obligation.launched = "active", True
        return Job(
            obligation=obligation,
            launched=launched,
            workspace=where,
            deadline=deadline,
            output_limit=OUTPUT_LIMIT,
        )

    # -- a running command ------------------------------------------------------

    async def _supervise(self, job: Job) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, job)
            job.waiting.deadline = job.deadline
            with job.waiting:
                code = await job.launched.process.wait()
                job.exit_status = code
                job.end("completed" if code == 0 else "failed")
            if job.status == "running":
                job.end("deadline_exceeded")
            job.exited.set()
            await self._clean(job)
            with trio.move_on_after(self.cleanup_timeout):
                await job.drained.wait()  # the last lines, once no writer is left
            nursery.cancel_scope.cancel()
        if job.exit_status is None and job.launched.process.returncode is not None:
            job.exit_status = job.launched.process.returncode
        job.finished_at = trio.current_time()
        job.settled.set()
        assert self._nursery is not None
        self._nursery.start_soon(self._expire, job)

    async def _pump(self, job: Job) -> None:
        """Read the command's lines; past the output limit, end it."""
        while (line := await job.launched.reader.line()) is not None:
            job.used += len(line) + LINE_COST
            if job.used > job.output_limit:
                job.end("output_limit_exceeded")
                job.waiting.cancel()
                break
            job.lines.append(line.decode("utf-8", "replace"))
        job.drained.set()

    async def _clean(self, job: Job) -> None:
        """Stop the group within ``cleanup_timeout``; confirmed releases the
        workspace, anything else keeps it reserved with evidence."""
        job.cleanup_status = "pending"
        error: str | None = "cleanup did not finish within cleanup_timeout"
        with trio.CancelScope(shield=True), trio.move_on_after(self.cleanup_timeout):
            error = await clean_group(job.launched.pgid, job.launched.start_time, self._signaler)
        with trio.CancelScope(shield=True), trio.move_on_after(0.5):
            await job.launched.process.wait()  # reap the leader
        if error is None:
            job.cleanup_status = "confirmed"
            job.obligation.state = "confirmed"
            self._workspaces.pop(job.workspace, None)
            self._evidence.pop(job.session_id, None)
        else:
            job.status = "cleanup_failed"
            job.cleanup_status = "uncertain"
            job.cleanup_error = error
            job.obligation.state = "uncertain"
            self._evidence[job.session_id] = job

    async def _expire(self, job: Job) -> None:
        await trio.sleep(self.completion_retention)
        if self._jobs.get(job.session_id) is job:
            del self._jobs[job.session_id]

    # -- human waits ------------------------------------------------------------

    def suspend_owner(self, owner: str) -> None:
        """Stop the deadlines of ``owner``'s running commands (a human wait)."""
        now = trio.current_time()
        for job in self._jobs.values():
            mine = job.obligation.owner == owner and job.status == "running"
            if mine and job.suspended_at is None:
                job.suspended_at = now
                job.waiting.deadline = math.inf

    def resume_owner(self, owner: str, at: float | None = None) -> None:
        """Start them again, each later by the time the wait took."""
        end = trio.current_time() if at is None else at
        for job in self._jobs.values():
            if job.obligation.owner == owner and job.suspended_at is not None:
                job.deadline += max(0.0, end - job.suspended_at)
                job.suspended_at = None
                if job.status == "running":
                    job.waiting.deadline = job.deadline

    # -- reading and writing ----------------------------------------------------

    def _job(self, invocation: CommandInvocation) -> Job:
        self._ledger.find(invocation.session_id, invocation.owner, invocation.incarnation)
        job = self._jobs.get(invocation.session_id)
        if job is None:
            raise Error(
                ErrorClass.NOT_FOUND, "job not found", {"session_id": invocation.session_id}
            )
        return job

    def read(self, invocation: CommandInvocation, cursor: int = 0) -> CommandOutput:
        """The command's lines from ``cursor`` and its state."""
        return self._job(invocation).output(cursor)

    async def wait(self, invocation: CommandInvocation, timeout: float) -> CommandOutput:
        """The command's record once it has settled, or after ``timeout``."""
        job = self._job(invocation)
        with trio.move_on_after(timeout):
            await job.settled.wait()
        return job.output(0)

    async def write(self, invocation: CommandInvocation, chars: str) -> None:
        """Send ``chars`` to the running command's standard input."""
        job = self._job(invocation)
        stdin = job.launched.process.stdin
        if job.status != "running" or stdin is None:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "command is not running",
                {"session_id": job.session_id, "status": job.status},
            )
        try:
            await stdin.send_all(chars.encode("utf-8", "surrogateescape"))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "command no longer reads its input",
                {"session_id": job.session_id},
            ) from exc

    # -- cancellation -----------------------------------------------------------

    def cancel(self, owner: str) -> None:
        """Owner-wide: fence the owner's never-launched reservations and
        launches in progress, end its commands and retry kept cleanups.
        Returns before the cleanups finish (see :meth:`owner_status`)."""
        self._ledger.fence_owner(owner)
        for obligation in self._ledger.live.values():
            if obligation.owner == owner and obligation.state == "launching":
                obligation.fenced = True
        for job in list(self._jobs.values()) + list(self._evidence.values()):
            if job.obligation.owner == owner:
                self._stop(job)

    async def _abandon(self, job: Job) -> None:
        """Stop the group of a job nobody can supervise (its backend closed
        while it launched), its cleanup verified as any other's."""
        job.end("cancelled")
        await self._clean(job)
        process = job.launched.process
        with trio.CancelScope(shield=True):
            for stream in (process.stdin, process.stdout):  # nobody reads them now
                if stream is not None:
                    await stream.aclose()
        job.settled.set()

    def _stop(self, job: Job) -> None:
        if job.status == "running":
            job.end("cancelled")
            job.waiting.cancel()
        elif job.cleanup_status == "uncertain" and not job.cleaning and not self._closing:
            assert self._nursery is not None
            job.cleaning, job.settled = True, trio.Event()  # waiters wait for the retry
            self._nursery.start_soon(self._retry, job)

    async def _retry(self, job: Job) -> None:
        """A verified retry of a kept cleanup: confirmed marks the record
        (its status, exit and recorded error unchanged)."""
        status, error = job.status, job.cleanup_error
        try:
            await self._clean(job)
            job.status, job.cleanup_error = status, error
        finally:
            job.cleaning = False
            job.settled.set()

    async def cancel_confirmed(self, invocation: CommandInvocation, timeout: float) -> None:
        """Cancel one session and return once its cleanup is confirmed;
        ``unknown_outcome`` when it is uncertain, unconfirmed in ``timeout``
        or of an identity never seen (which is then fenced)."""
        try:
            obligation = self._ledger.find(
                invocation.session_id, invocation.owner, invocation.incarnation
            )
        except Error as exc:
            if exc.error_class is not ErrorClass.NOT_FOUND:
                raise
            self._ledger.fence_unknown(
                invocation.session_id, invocation.owner, invocation.incarnation
            )
            raise _unknown("local command cleanup identity is unknown", invocation) from None
        deadline = trio.current_time() + timeout
        if obligation.state == "reserved":
            self._ledger.fence(obligation)
        elif obligation.state == "launching":
            # refused at its admission, or stopped as soon as it is registered
            obligation.fenced = True
            launching = self._launching.get(obligation.session_id)
            if launching is not None:
                with trio.move_on_at(deadline):
                    await launching.wait()
        job = self._jobs.get(obligation.session_id) or self._evidence.get(obligation.session_id)
        if job is not None:
            self._stop(job)
            with trio.move_on_at(deadline):
                await job.settled.wait()
        if obligation.state == "uncertain":
            raise _unknown("local command cleanup is uncertain", invocation)
        if obligation.state != "confirmed" or (job is not None and job.cleaning):
            raise _unknown("local command cleanup confirmation timed out", invocation)

    # -- status -----------------------------------------------------------------

    def session_status(self, invocation: CommandInvocation) -> str:
        """``"pending"``, ``"uncertain"``, ``"confirmed"`` or ``"unknown"``."""
        try:
            obligation = self._ledger.find(
                invocation.session_id, invocation.owner, invocation.incarnation
            )
        except Error:
            return "unknown"
        job = self._evidence.get(obligation.session_id) or self._jobs.get(obligation.session_id)
        if job is not None and job.cleaning:
            return "pending"
        if obligation.state in ("confirmed", "uncertain"):
            return obligation.state
        return "pending" if obligation.state in ("launching", "active") else "confirmed"

    def owner_status(self, owner: str) -> str:
        """``"uncertain"`` if any of the owner's cleanups is, ``"pending"``
        while any command of it runs or is cleaned, else ``"confirmed"``."""
        states = {o.state for o in self._ledger.live.values() if o.owner == owner}
        if "uncertain" in states:
            return "uncertain"
        return "pending" if states & {"launching", "active"} else "confirmed"

    async def _shutdown(self) -> None:
        """KILL every group still owned (kept ones too), then wait a bound."""
        owned = [*self._jobs.values(), *self._evidence.values()]
        for job in owned:
            if job.cleanup_status != "confirmed":
                with contextlib.suppress(OSError):
                    self._signaler(job.launched.pgid, signal.SIGKILL)
        with trio.move_on_after(self.shutdown_timeout):
            for job in owned:
                await job.launched.process.wait()


def _unknown(message: str, invocation: CommandInvocation) -> Error:
    return Error(
        ErrorClass.UNKNOWN_OUTCOME,
        message,
        {"session_id": invocation.session_id, "owner": invocation.owner},
    )
