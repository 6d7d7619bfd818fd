"""Opening a server connection, an SDK session and a source over it, and
classing how that connection fails."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TextIO

import trio

from ...errors import Error, ErrorClass, exception_leaves
from ._errors import MAX_CAUSE, initialize_error
from ._sdk import ClientSession, MCPError, StdioServerParameters, stdio_client
from ._source import McpToolSource, check_seconds
from ._validators import SchemaValidator, ValidatorCache
from ._wire import session_streams

__all__ = ["connect_stdio", "connect_streamable_http"]


@asynccontextmanager
async def _open(
    streams: Any, source: McpToolSource, read_timeout: float | None, server: str
) -> AsyncIterator[McpToolSource]:
    """Open the transport and the session, initialize and list.

    Failures come out classed, never as the transport's raw exception or the
    SDK's task-group wrapper: a failure before the source is handed out is
    an ``Error`` naming ``server`` (``method`` ``"connect"``); a connection
    that fails while the caller's block runs or as it closes is
    ``Error(transient_transport)`` with ``method`` ``"session"``.  What the
    caller's block raises passes through as it was raised; cancellations,
    ``KeyboardInterrupt`` and ``SystemExit`` propagate unchanged, and a
    cancellation from outside wins over a connection that failed meanwhile
    (so ``fail_after`` raises ``TooSlowError``).
    """
    opened = False
    from_block: BaseException | None = None
    unwrapped: BaseException | None = None
    try:
        async with streams as (read_stream, write_stream):
            channels = session_streams(read_stream, write_stream)
            async with ClientSession(
                read_timeout_seconds=read_timeout,
                message_handler=source._on_message,
                **channels,
            ) as session:
                source.session = session
                source.dispatcher = channels.get("dispatcher")
                try:
                    try:
                        await session.initialize()
                    except MCPError as exc:
                        raise initialize_error(exc, server) from None
                    await source.refresh()
                    opened = True
                    try:
                        yield source
                    except BaseException as exc:
                        from_block = exc
                        raise
                finally:
                    source.session = source.dispatcher = None
    except BaseException as exc:
        failure = _exit_failure(exception_leaves(exc), from_block, opened, server)
        if failure is None or failure is exc:
            raise
        if failure is not from_block and not isinstance(failure, trio.Cancelled):
            raise failure from exc  # classed here
        # The block's own exception, wrapped by the SDK's task group: raised
        # again below, outside this handler, as it was.
        unwrapped = failure
    if unwrapped is not None:
        raise unwrapped


def _exit_failure(
    leaves: list[BaseException], from_block: BaseException | None, opened: bool, server: str
) -> BaseException | None:
    """What leaving a connection raises, given the exceptions it ended with
    (``leaves``) and the one the caller's block raised: a classed ``Error``,
    the block's own exception, a plain ``Cancelled``, or ``None`` for what
    came as it is."""
    if any(not isinstance(leaf, Exception | trio.Cancelled) for leaf in leaves):
        return None  # KeyboardInterrupt, SystemExit
    cancelled = [leaf for leaf in leaves if isinstance(leaf, trio.Cancelled)]
    if cancelled:
        # Someone else's cancellation: the SDK's own scopes absorb the ones
        # they deliver.  It wins over a connection that failed meanwhile and
        # propagates alone, so the scope that cancelled takes it, never a raw
        # group of the transport's errors.  The block's own exception, if it
        # raised one, passes through.
        return from_block if from_block is not None else cancelled[0]
    if not opened:
        return _connect_failure(leaves, server, "connect")
    # What the connection itself raised, beside the block's own exception.
    lost = [leaf for leaf in leaves if leaf is not from_block]
    if not lost:
        return from_block
    if from_block is None or isinstance(from_block, trio.Cancelled):
        return _connect_failure(lost, server, "session")
    if isinstance(from_block, Error) and all(isinstance(leaf, Exception) for leaf in lost):
        # a classed failure of the block (a call that lost the connection,
        # say) beside the connection's own: the block's is the one to see
        return from_block
    return None


def _connect_failure(leaves: list[BaseException], server: str, method: str) -> Error | None:
    """The classed ``Error`` for a connection that failed (``method``
    ``"connect"``: connecting, initializing or listing; ``"session"``:
    later); ``None`` when it must propagate as it is (a cancellation,
    ``KeyboardInterrupt``, ``SystemExit``)."""
    if any(not isinstance(leaf, Exception) for leaf in leaves):
        return None
    ours = [leaf for leaf in leaves if isinstance(leaf, Error)]
    if ours:
        return ours[0]  # already classed: a refused initialize, a malformed listing
    first = leaves[0]
    return Error(
        ErrorClass.TRANSIENT_TRANSPORT,
        "MCP server could not be reached" if method == "connect" else "MCP connection failed",
        {
            "method": method,
            "server": server[:MAX_CAUSE],
            "cause": f"{type(first).__name__}: {first}"[:MAX_CAUSE],
        },
    )


def _check_text(argument: str, value: Any, *, empty: bool = False) -> None:
    if type(value) is not str or (not value and not empty) or "\0" in value:
        raise Error(
            ErrorClass.VALIDATION,
            f"{argument} must be a {'' if empty else 'non-empty '}str",
            {"argument": argument, "type": type(value).__name__},
        )


def _check_stdio(
    command: str, args: Sequence[str], env: Mapping[str, str] | None, cwd: str | None
) -> None:
    """``validation`` for a server command line the subprocess cannot take."""
    _check_text("command", command)
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise Error(ErrorClass.VALIDATION, "args must be a list of str", {"argument": "args"})
    for arg in args:
        _check_text("args", arg, empty=True)
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(type(k) is str and type(v) is str for k, v in env.items())
    ):
        raise Error(
            ErrorClass.VALIDATION, "env must be a mapping of str to str", {"argument": "env"}
        )
    if cwd is not None:
        _check_text("cwd", cwd)


@asynccontextmanager
async def connect_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    errlog: TextIO | None = None,
    validate_arguments: bool = False,
    validate_structured_content: bool = False,
    validator: SchemaValidator | None = None,
    cache: ValidatorCache | None = None,
    call_timeout: float | None = None,
    read_timeout: float | None = 30.0,
    task_calls: str = "required",
) -> AsyncIterator[McpToolSource]:
    """Start ``command`` as an MCP server subprocess, initialize and list its tools.

    The subprocess gets the SDK's minimal environment (on POSIX ``HOME``,
    ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``) with ``env``
    merged over it, never the host's whole environment.
    The subprocess is stopped when the block ends, however it ends.
    ``read_timeout`` bounds every request but calls (see ``call_timeout``).
    The SDK stops the server's process group only when the server outlives
    its grace period after its standard input closes: a server that starts
    helper processes must stop them itself.
    """
    _check_stdio(command, args, env, cwd)
    check_seconds("read_timeout", read_timeout)
    source = McpToolSource(
        validate_arguments=validate_arguments,
        validate_structured_content=validate_structured_content,
        validator=validator,
        cache=cache,
        call_timeout=call_timeout,
        task_calls=task_calls,
    )
    # "replace": one undecodable byte on the server's stdout must not kill
    # the SDK's reader, which would then drain stdout without reporting it
    # and leave a call waiting forever; the line fails to parse instead.
    params = StdioServerParameters(
        command=command,
        args=list(args),
        env=None if env is None else dict(env),
        cwd=cwd,
        encoding_error_handler="replace",
    )
    streams = stdio_client(params) if errlog is None else stdio_client(params, errlog=errlog)
    async with _open(streams, source, read_timeout, command) as opened:
        yield opened


@asynccontextmanager
async def connect_streamable_http(
    url: str,
    *,
    validate_arguments: bool = False,
    validate_structured_content: bool = False,
    validator: SchemaValidator | None = None,
    cache: ValidatorCache | None = None,
    call_timeout: float | None = None,
    read_timeout: float | None = 30.0,
    task_calls: str = "required",
) -> AsyncIterator[McpToolSource]:
    """Connect to an MCP server over streamable HTTP, initialize and list its tools.

    A server that cannot be reached, or fails to initialize or list, raises
    a classed ``Error`` (``transient_transport`` for the connection itself).
    """
    from mcp.client.streamable_http import streamable_http_client

    _check_text("url", url)
    if not url.startswith(("http://", "https://")):
        raise Error(ErrorClass.VALIDATION, "url must be an http(s) URL", {"argument": "url"})
    check_seconds("read_timeout", read_timeout)

    source = McpToolSource(
        validate_arguments=validate_arguments,
        validate_structured_content=validate_structured_content,
        validator=validator,
        cache=cache,
        call_timeout=call_timeout,
        task_calls=task_calls,
    )
    async with _open(streamable_http_client(url), source, read_timeout, url) as opened:
        yield opened
