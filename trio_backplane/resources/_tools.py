"""``exec_command`` and ``write_stdin``: a shell for the model, its sessions
owned by the run that executes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ..tools import Rejection, ToolDescriptor, ToolResult, reject
from ..tools._backend import FunctionBackend
from ._command import CommandInvocation, LocalCommand
from ._jobs import CommandOutput
from ._launch import CommandLimits
from ._refusals import without_proof
from ._registry import ResourceRegistry

__all__ = ["command_tools"]

#: What a token of output is taken to be, for ``max_output_tokens``.
CHARS_PER_TOKEN: Final = 4
_YIELD_MS: Final = {"type": "integer", "minimum": 0, "maximum": 300_000}
_EXEC_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string", "minLength": 1, "maxLength": 65_536},
        "workdir": {"type": "string", "maxLength": 4096},
        "yield_time_ms": _YIELD_MS,
        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
    },
    "required": ["cmd"],
    "additionalProperties": False,
}
_WRITE_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "session_id": {"type": "integer", "minimum": 1},
        "chars": {"type": "string", "maxLength": 65_536},
        "yield_time_ms": _YIELD_MS,
        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
    },
    "required": ["session_id"],
    "additionalProperties": False,
}


@attrs.define(kw_only=True)
class _Session:
    invocation: CommandInvocation | None = None
    #: lines reported so far
    cursor: int = 0


@final
class _Shell:
    """The backend of both tools: one registry, one command backend, one
    workspace."""

    def __init__(
        self,
        registry: ResourceRegistry,
        command: LocalCommand,
        *,
        workspace: Path,
        timeout: float | None,
        limits: CommandLimits | None,
        default_yield: float,
        confirm_timeout: float,
    ) -> None:
        self.registry = registry
        self.command = command
        self.workspace = workspace
        self.timeout = timeout
        self.limits = limits
        self.default_yield = default_yield
        self.confirm_timeout = confirm_timeout

    def _workdir(self, given: Any) -> Path:
        where = (self.workspace / (given or ".")).resolve()
        if not where.is_relative_to(self.workspace) or not where.is_dir():
            raise Error(
                ErrorClass.VALIDATION,
                "workdir must be a directory inside the workspace",
                {"workdir": str(given)[:300]},
            )
        return where

    async def exec_command(self, operation: Any) -> ToolResult | Rejection:
        """Refusals before the command runs are rejections (nothing happened)."""
        args = operation.arguments
        try:
            workdir = self._workdir(args.get("workdir"))
        except Error as error:
            return reject(operation, error)
        owner, incarnation = operation.run_id, operation.incarnation
        session = _Session()
        session_id = self.registry.register_session(
            owner,
            incarnation=incarnation,
            cleanup=lambda: self._confirm(session),
            acknowledge=lambda _result: self._acknowledge(session),
        )
        session.invocation = CommandInvocation(
            owner=owner, session_id=session_id, incarnation=incarnation
        )
        try:
            await self.command.start(
                session.invocation,
                args["cmd"],
                workspace=workdir,
                timeout=self.timeout,
                limits=self.limits,
                # durable before the command runs: a crashed host's group is found
                before_run=operation.context.record_resource,
            )
        except Error as error:
            # Withdrawn without cleanup only when the backend proves it ran
            # nothing; else the session stays, for the run's cleanup to confirm.
            self.command.validate_refusal(session.invocation, error)
            self.command.retire(session.invocation)  # out of session_capacity
            self.registry.withdraw_session(session_id, owner, incarnation)
            return reject(operation, without_proof(error))
        self.registry.update_session(session_id, owner, session, incarnation)
        return await self._report(session, args, operation)

    async def _confirm(self, session: _Session) -> str:
        """The registry's cleanup of a session: its command confirmed gone."""
        assert session.invocation is not None
        await self.command.cancel_confirmed(session.invocation, self.confirm_timeout)
        return "confirmed"

    def _acknowledge(self, session: _Session) -> str:
        assert session.invocation is not None
        self.command.acknowledge_release(session.invocation)
        return "ok"

    async def write_stdin(self, operation: Any) -> ToolResult | Rejection:
        """A session of another run or incarnation, or one no longer
        running, is rejected before anything is written."""
        args = operation.arguments
        try:
            session = self._session(args["session_id"], operation)
            assert session.invocation is not None  # _session checks it
            if args.get("chars"):
                await self.command.write(session.invocation, args["chars"])
        except Error as error:
            return reject(operation, error)
        return await self._report(session, args, operation)

    def _session(self, session_id: int, operation: Any) -> _Session:
        """The executing run's own command session (fenced by the registry)."""
        session = self.registry.fetch_session(session_id, operation.run_id, operation.incarnation)
        if not isinstance(session, _Session) or session.invocation is None:
            raise Error(ErrorClass.NOT_FOUND, "command session not found", {"id": session_id})
        return session

    async def _report(self, session: _Session, args: Any, operation: Any) -> ToolResult:
        """Wait up to ``yield_time_ms`` for the command, then say what it
        printed since the last report; a finished command's session is
        released (its group confirmed gone) before the result."""
        assert session.invocation is not None
        wait = args.get("yield_time_ms")
        seconds = self.default_yield if wait is None else wait / 1000
        done = await self.command.wait(session.invocation, seconds)
        output = self.command.read(session.invocation, session.cursor)
        session.cursor = output.cursor
        limit = args.get("max_output_tokens")
        text = _clip("\n".join(output.output), limit)
        if done.status == "running":
            structured = {"session_id": session.invocation.session_id, "output": text}
            return ToolResult(text, structured_content=structured)
        await self.registry.release_session(
            session.invocation.session_id, operation.run_id, operation.incarnation
        )
        return _finished(output, text)


def _clip(text: str, tokens: Any) -> str:
    if tokens is None or len(text) <= tokens * CHARS_PER_TOKEN:
        return text
    keep = tokens * CHARS_PER_TOKEN
    return f"[{len(text) - keep} characters of earlier output omitted]\n" + text[-keep:]


def _finished(output: CommandOutput, text: str) -> ToolResult:
    structured = {
        "exit_code": output.exit_status,
        "status": output.status,
        "output": text,
    }
    failed = output.status != "completed"
    return ToolResult(text, structured_content=structured, is_error=failed)


def command_tools(
    registry: ResourceRegistry,
    command: LocalCommand,
    *,
    workspace: str | Path,
    requires_approval: bool = True,
    timeout: float | None = None,
    limits: CommandLimits | None = None,
    default_yield: float = 10.0,
) -> list[ToolDescriptor]:
    """``exec_command`` and ``write_stdin`` over ``command``, running in
    ``workspace``.  Sessions belong to the run and incarnation executing
    the tool (never to an argument); the registry, named in each tool's
    trusted ``backend_context``, is closed with the run.  Both tools are
    mutating and, by default, need approval."""
    root = Path(workspace).resolve()
    if not root.is_dir():
        raise Error(
            ErrorClass.VALIDATION, "workspace must be a directory", {"workspace": str(root)}
        )
    shell = _Shell(
        registry,
        command,
        workspace=root,
        timeout=timeout,
        limits=limits,
        default_yield=default_yield,
        confirm_timeout=command.cleanup_timeout + command.shutdown_timeout,
    )
    registry.attach_clock(command)  # a human wait of the run stops its commands' deadlines
    context = {"resource_registry": registry}
    return [
        ToolDescriptor(
            name="exec_command",
            schema=_EXEC_SCHEMA,
            backend=FunctionBackend(shell.exec_command),
            backend_context=context,
            description=(
                "Run a shell command in the workspace. Returns its output and exit code, or a "
                "session_id when it still runs after yield_time_ms (then use write_stdin)."
            ),
            requires_approval=requires_approval,
        ),
        ToolDescriptor(
            name="write_stdin",
            schema=_WRITE_SCHEMA,
            backend=FunctionBackend(shell.write_stdin),
            backend_context=context,
            description=(
                "Write chars to a running command's input (session_id from exec_command) "
                "and return its new output; empty chars just polls."
            ),
            requires_approval=requires_approval,
        ),
    ]
