"""Serving a console on Hypercorn's Trio worker."""

from __future__ import annotations

import ipaddress
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from ..errors import Error, ErrorClass
from ._app import Console

__all__ = ["serve"]


async def serve(
    console: Console,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    remote: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``console`` until cancelled; ``task_status.started(url)`` with
    its root URL once it listens (``port=0``: any free port).  A host that
    is not a loopback address is refused unless ``remote``: the console
    shows transcripts and answers approvals."""
    if not remote and not _loopback(host):
        raise Error(
            ErrorClass.FORBIDDEN,
            f"the console serves loopback only unless remote=True (asked for {host!r})",
        )
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None  # a URL may carry the login token
    config.errorlog = None
    config.graceful_timeout = 1.0

    async def serving(task_status: trio.TaskStatus[list[str]]) -> None:
        await hypercorn_serve(console, config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds: Any = await nursery.start(serving)
        task_status.started(str(binds[0]))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
