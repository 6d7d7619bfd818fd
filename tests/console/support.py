"""A console over a SQLite store the test fills, served on a free loopback
port, and conversations the test runs beside it (their questions answered
through the console)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from trio_backplane import Authority, ToolRegistry, open_conversation
from trio_backplane.console import Console, LocalAnswers, serve
from trio_backplane.testing import ScriptedProvider as S
from trio_backplane.tools import ToolDescriptor, ToolResult

CANARY = "sk-console-canary-7c41e0b9"
HOSTILE = "<script>window.pwned = 1</script><b>bold</b>"


class Deploy:
    """A tool needing approval whose result holds markup."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def execute(self, operation: Any) -> ToolResult:
        self.calls.append(operation.arguments)
        return ToolResult(HOSTILE)


def tools(deploy: Deploy) -> ToolRegistry:
    return ToolRegistry(
        [ToolDescriptor("deploy", {"type": "object"}, deploy, requires_approval=True)]
    )


@attrs.define
class Served:
    console: Console
    url: str
    answers: LocalAnswers
    store: Any

    def login(self) -> str:
        return self.url + self.console.login_path()


@asynccontextmanager
async def served(store: Any, **options: Any) -> AsyncIterator[Served]:
    answers = LocalAnswers()
    console = Console(store, answer=answers, poll_interval=0.05, **options)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            lambda task_status: serve(console, port=0, task_status=task_status)
        )
        yield Served(console, url, answers, store)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def waiting_run(
    served: Served, run_id: str, deploy: Deploy, *, arguments: Any = None
) -> AsyncIterator[Any]:
    """A conversation that asks to run ``deploy`` (then answers), held by
    the console's answers while open."""
    registry = tools(deploy)
    provider = S([S.tool_calls(("c1", "deploy", arguments or {"target": "prod"})), S.text("done")])
    async with open_conversation(
        run_id,
        store=served.store,
        provider=provider,
        registry=registry,
        authority=Authority.for_registry(registry, caller="host", run_id=run_id),
        provider_context={"api_key": CANARY},
    ) as conversation:
        served.answers.hold(run_id, conversation)
        await conversation.prompt("deploy it")
        while conversation.status().pending_interaction is None:
            await trio.sleep(0.01)
        yield conversation
        served.answers.release(run_id)
