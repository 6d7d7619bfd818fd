"""Child agents over real conversations: scripted children, a parent
authority, a store that can fail one agent's commits."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tests.runtime.support import Delegating, RecordingBackend, make_tool
from trio_backplane import Error, ErrorClass
from trio_backplane.agents import AgentManager, AgentRequest, ChildOptions
from trio_backplane.store import MemoryStore
from trio_backplane.testing import ScriptedProvider
from trio_backplane.tools import Authority, ToolDescriptor, ToolRegistry, ToolResult

S = ScriptedProvider
PARENT = "parent-run"


def child_tools() -> list[ToolDescriptor]:
    """What children may use: a read-only search, a mutating write, a
    mutating ``explode`` whose backend raises (the run ends unknown_outcome)."""
    return [
        make_tool("search", RecordingBackend(ToolResult("found")), read_only=True),
        make_tool("write", RecordingBackend(ToolResult("written"))),
        make_tool("explode", RecordingBackend(Error(ErrorClass.EXECUTION_FAILURE, "boom"))),
    ]


def grants(tools: Iterable[ToolDescriptor], *extra: ToolDescriptor) -> Authority:
    return Authority.for_registry([*tools, *extra], caller="host", run_id=PARENT)


class FailingFor(Delegating):
    """A store whose commits of runs named with ``marker`` fail: their
    conversations end ``storage_failed`` and cannot be closed confirmed."""

    def __init__(self, inner: Any, marker: str) -> None:
        super().__init__(inner)
        self.marker = marker

    async def commit(self, run_id: str, *args: Any, **kwargs: Any) -> Any:
        if self.marker in run_id:
            raise Error(ErrorClass.STORAGE_FAILED, "disk gone")
        return await self.inner.commit(run_id, *args, **kwargs)


Scripts = dict[str, list[Any]]


def factory(
    scripts: Scripts,
    *,
    tools: Callable[[AgentRequest], list[ToolDescriptor]] | None = None,
    authority: Callable[[AgentRequest, ToolRegistry], Authority] | None = None,
    work: int = 100,
    run_timeout: float = 300.0,
) -> tuple[Callable[[AgentRequest], ChildOptions], list[AgentRequest]]:
    """Child options from ``scripts``: ``scripts[task]`` lists one provider
    script a run (taken in order); every child gets ``child_tools()``."""
    asked: list[AgentRequest] = []

    def options(request: AgentRequest) -> ChildOptions:
        asked.append(request)
        task = request.agent_name.rsplit("/", 1)[1]
        registry = ToolRegistry(tools(request) if tools else child_tools())
        given = (
            authority(request, registry)
            if authority
            else Authority.for_registry(registry, caller="parent", run_id=request.run_id)
        )
        return ChildOptions(
            provider=S(scripts[task].pop(0)),
            registry=registry,
            authority=given,
            work=work,
            run_timeout=run_timeout,
        )

    return options, asked


def manager(
    options: Callable[[AgentRequest], ChildOptions],
    *,
    store: Any = None,
    parent_authority: Authority | None = None,
    **kwargs: Any,
) -> AgentManager:
    return AgentManager(
        store=MemoryStore() if store is None else store,
        parent_run_id=PARENT,
        parent_authority=grants(child_tools()) if parent_authority is None else parent_authority,
        child_options=options,
        **kwargs,
    )
