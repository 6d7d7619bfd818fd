"""Shared helpers for the runtime (Conversation engine) tests."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from trio_backplane.kernel import RunEvent, RunRecord
from trio_backplane.runtime import Conversation, Event, open_conversation
from trio_backplane.store import Receipt
from trio_backplane.tools import Authority, ToolDescriptor, ToolRegistry, ToolResult

RUN_ID = "run-1"

OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


class Unreadable(Mapping[str, Any]):
    """A mapping that fails when read (a host's broken object)."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(["type"])

    def __len__(self) -> int:
        return 1


def string_schema(name: str = "x") -> dict[str, Any]:
    """An object schema requiring one string property ``name``."""
    return {
        "type": "object",
        "properties": {name: {"type": "string"}},
        "required": [name],
    }


class Delegating:
    """A store wrapper's base: everything but ``commit`` goes to ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.durable = getattr(inner, "durable", False)

    async def create(self, record: RunRecord) -> Receipt:
        return await self.inner.create(record)  # type: ignore[no-any-return]

    async def load(self, run_id: str) -> RunRecord | None:
        return await self.inner.load(run_id)  # type: ignore[no-any-return]

    async def fence(self, run_id: str, *, incarnation: int) -> Receipt:
        return await self.inner.fence(run_id, incarnation=incarnation)  # type: ignore[no-any-return]

    async def list_runs(self, **kwargs: Any) -> Any:
        return await self.inner.list_runs(**kwargs)

    async def events(self, run_id: str, *, after: int = 0) -> list[RunEvent]:
        return await self.inner.events(run_id, after=after)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        await self.inner.aclose()


class TimelineStore(Delegating):
    """Wraps a store; ``timeline`` interleaves ``("commit", "run.<kind>")`` with
    ``("event", Event)`` for the subscriber channels attached with ``attach``:
    they are drained at the start of every commit, so an event listed before a
    commit was published before that commit was attempted."""

    def __new__(cls, inner: Any) -> TimelineStore:
        # The engine commits without waiting when ``inner``'s class offers it:
        # so does the wrapper, through a class that defines ``commit_nowait``.
        nowait = getattr(type(inner), "commit_nowait", None)
        chosen: type[TimelineStore] = cls
        if cls is TimelineStore and callable(nowait) and not inspect.iscoroutinefunction(nowait):
            chosen = _NowaitTimelineStore
        return super().__new__(chosen)

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.timeline: list[tuple[str, Any]] = []
        self._channels: list[trio.MemoryReceiveChannel[Event]] = []
        #: every record handed to ``commit`` and acknowledged, in order
        self.records: list[RunRecord] = []
        #: ``fail(kind, commits_so_far)`` may return an exception to raise
        #: instead of committing (nothing is stored then)
        self.fail: Callable[[str, list[str]], BaseException | None] | None = None

    def attach(self, channel: trio.MemoryReceiveChannel[Event]) -> None:
        self._channels.append(channel)

    def drain(self) -> None:
        for channel in self._channels:
            self.timeline.extend(("event", event) for event in drained(channel))

    def commits(self) -> list[str]:
        return [kind for tag, kind in self.timeline if tag == "commit"]

    def published(self) -> list[Event]:
        return [event for tag, event in self.timeline if tag == "event"]

    def index(self, tag: str, match: Callable[[Any], bool], *, start: int = 0) -> int:
        """Position of the first ``tag`` entry at or after ``start`` satisfying ``match``."""
        for i, (t, value) in enumerate(self.timeline[start:], start):
            if t == tag and match(value):
                return i
        raise AssertionError(f"no {tag} entry matches in {self.describe()}")

    def describe(self) -> list[str]:
        return [f"{t}:{v}" if t != "event" else f"event:{v.type}" for t, v in self.timeline]

    def _before_commit(self, events: Sequence[RunEvent]) -> list[str]:
        self.drain()
        # A commit may carry several kernel commands (the engine merges a
        # response with its first intent, a tool message with the next
        # attempt): the timeline lists each, in order, as its own entry.
        kinds = [event.type for event in events] or ["?"]
        if self.fail is not None:
            for i, kind in enumerate(kinds):
                failure = self.fail(kind, self.commits() + kinds[:i])
                if failure is not None:
                    self.timeline.append(("failed", kind))
                    raise failure
        self.timeline.extend(("commit", kind) for kind in kinds)
        return kinds

    async def commit(self, run_id: str, **kwargs: Any) -> Receipt:
        kinds = self._before_commit(kwargs["events"])
        receipt = await self.inner.commit(run_id, **kwargs)
        self.records.extend(kwargs["record"] for _ in kinds)  # aligned with commits()
        return receipt  # type: ignore[no-any-return]


class _NowaitTimelineStore(TimelineStore):
    """A ``TimelineStore`` around a store that never waits."""

    def commit_nowait(self, run_id: str, **kwargs: Any) -> Receipt:
        kinds = self._before_commit(kwargs["events"])
        receipt = self.inner.commit_nowait(run_id, **kwargs)
        self.records.extend(kwargs["record"] for _ in kinds)
        return receipt  # type: ignore[no-any-return]


Outcome = Any  # a ToolResult, a Rejection, an Error/Exception (raised), or a callable


class RecordingBackend:
    """A tool backend that records every operation it receives and returns (or
    raises) the scripted outcomes in order; the last one repeats.

    An outcome may be a callable ``(operation) -> outcome`` (sync or async),
    an exception (raised), or anything else (returned as is).
    ``commits_at_call`` holds, per call, the stored record's revision when the
    backend was entered (with ``store`` set)."""

    def __init__(self, *outcomes: Outcome, store: Any = None, run_id: str = RUN_ID) -> None:
        self.outcomes = list(outcomes) or [ToolResult("ok")]
        self.operations: list[Any] = []
        self.store = store
        self.run_id = run_id
        self.records_at_call: list[RunRecord | None] = []

    @property
    def calls(self) -> int:
        return len(self.operations)

    async def execute(self, operation: Any) -> Any:
        self.operations.append(operation)
        if self.store is not None:
            self.records_at_call.append(await self.store.load(self.run_id))
        index = min(len(self.operations), len(self.outcomes)) - 1
        outcome = self.outcomes[index]
        if callable(outcome) and not isinstance(outcome, type):
            outcome = outcome(operation)
            if hasattr(outcome, "__await__"):
                outcome = await outcome
        if isinstance(outcome, BaseException):
            raise outcome
        await trio.lowlevel.checkpoint()
        return outcome


def make_tool(
    name: str,
    backend: Any,
    *,
    schema: Any = None,
    revision: int = 1,
    read_only: bool = False,
    requires_approval: bool = False,
    backend_context: Any = None,
) -> ToolDescriptor:
    return ToolDescriptor(
        name=name,
        schema=OBJECT_SCHEMA if schema is None else schema,
        backend=backend,
        backend_context=backend_context,
        revision=revision,
        description=f"the {name} tool",
        read_only=read_only,
        requires_approval=requires_approval,
    )


def granted(registry: ToolRegistry, run_id: str = RUN_ID) -> Authority:
    return Authority.for_registry(registry, caller="host", run_id=run_id)


@attrs.define
class Finished:
    """What a conversation left behind: its last snapshot, every subscriber
    event, the stored record and the stored event log."""

    snapshot: Any
    events: list[Event]
    record: RunRecord
    log: list[RunEvent]
    store: TimelineStore

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, type_: str) -> list[Event]:
        return [e for e in self.events if e.type == type_]

    @property
    def conversation_state(self) -> Mapping[str, Any]:
        state = self.record.conversation
        assert isinstance(state, Mapping)
        return state

    @property
    def messages(self) -> list[Any]:
        return list(self.conversation_state["messages"])

    def tool_messages(self) -> list[Any]:
        return [m for m in self.messages if m.get("role") == "tool"]


@asynccontextmanager
async def conversation_with(
    provider: Any,
    tools: Sequence[ToolDescriptor] = (),
    *,
    store: Any = None,
    authority: Authority | None = None,
    run_id: str = RUN_ID,
    buffer: int = 100_000,
    **options: Any,
) -> AsyncIterator[tuple[Conversation, TimelineStore]]:
    """Open a conversation over a ``TimelineStore`` with one subscriber attached.
    Its wall clock is Trio's own (``MockClock`` time in most tests), so the
    instants it stores read as the times the tests reason in."""
    from trio_backplane.store import MemoryStore

    timeline = TimelineStore(MemoryStore() if store is None else store)
    registry = ToolRegistry(tools)
    options.setdefault("wall_clock", trio.current_time)
    async with open_conversation(
        run_id,
        store=timeline,
        provider=provider,
        registry=registry,
        authority=granted(registry, run_id) if authority is None else authority,
        **options,
    ) as conversation:
        timeline.attach(conversation.subscribe(buffer=buffer))
        yield conversation, timeline
    timeline.drain()


async def run_to_settled(
    provider: Any,
    tools: Sequence[ToolDescriptor] = (),
    prompt: Any = "hello",
    **kwargs: Any,
) -> Finished:
    """Prompt once, wait for the run to settle, and collect what it left."""
    run_id = kwargs.get("run_id", RUN_ID)
    async with conversation_with(provider, tools, **kwargs) as (conversation, timeline):
        await conversation.prompt(prompt)
        snapshot = await conversation.wait_settled()
    record = await timeline.load(run_id)
    assert record is not None
    log = await timeline.events(run_id)
    return Finished(snapshot, timeline.published(), record, log, timeline)


def _contains(haystack: str, canaries: Sequence[str]) -> list[str]:
    return [c for c in canaries if c in haystack]


def _dump(value: Any) -> str:
    def default(obj: Any) -> Any:
        if attrs.has(type(obj)):
            return attrs.asdict(obj, recurse=True, value_serializer=lambda _i, _a, v: _plain(v))
        return repr(obj)

    return json.dumps(_plain(value), default=default, sort_keys=True)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if attrs.has(type(value)):
        return {a.name: _plain(getattr(value, a.name)) for a in attrs.fields(type(value))}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return repr(value)


async def assert_no_canary(
    store: Any,
    run_id: str,
    canaries: Sequence[str],
    *,
    events: Sequence[Event] = (),
    requests: Sequence[Any] = (),
) -> None:
    """PRV-18 / TOOL-10: none of ``canaries`` appears in the stored record
    (``store.load``), the stored event log (``store.events``), the given
    subscriber ``events`` or provider ``requests``.  Store-agnostic: pass any
    ``Store``.  Also checks the canaries are absent from every nested repr."""
    record = await store.load(run_id)
    assert record is not None, "the run was not stored"
    places = {
        "stored record": _dump(record) + repr(record),
        "stored event log": _dump(list(await store.events(run_id))),
        "subscriber events": _dump(list(events)) + repr(list(events)),
        "provider requests": _dump(list(requests)) + repr(list(requests)),
    }
    leaks = {where: _contains(text, canaries) for where, text in places.items()}
    assert not any(leaks.values()), f"canary leaked: {leaks}"


# -- fault injection (test_cancellation, test_invariants) ----------------------


@attrs.define
class Fault:
    """One injected store fault.

    ``action``:

    * ``"fail"``: raise ``storage_failed`` without writing;
    * ``"crash"``: raise a bare ``OSError`` without writing;
    * ``"hang"``: never answer, without writing (``commit_timeout`` decides);
    * ``"lose_ack"``: write the record, then never answer (the acknowledgement
      is lost: the store holds a record the runtime never learns of);
    * ``"lose_ack_raise"``: write the record, then raise ``OSError``;
    * ``"conflict"``: a newer incarnation fenced the run: the stored record is
      fenced (on a ``MemoryStore``) and the commit raises ``resource_conflict``
      exactly as the store would;
    * ``"delay"``: sleep ``delay`` seconds, then commit normally (a slow store,
      to race a cancellation against an in-flight commit).

    It fires on the ``nth`` commit through the wrapper (1-based), or on the
    ``occurrence``-th commit of kernel command ``kind`` (``"tool_invoked"``,
    ``"finish"``, ...), or on the first commit for which ``when(kind, record)``
    is true; ``times`` commits in a row at most (then it is spent).
    """

    action: str
    nth: int | None = None
    kind: str | None = None
    occurrence: int = 1
    when: Callable[[str, RunRecord], bool] | None = None
    delay: float = 0.0
    times: int = 1
    fired: int = 0

    def matches(self, number: int, kind: str, seen: int, record: RunRecord) -> bool:
        if self.fired >= self.times:
            return False
        if self.nth is not None and number < self.nth:
            return False
        if self.kind is not None and (kind != self.kind or seen < self.occurrence):
            return False
        if self.when is not None and not self.when(kind, record):
            return False
        return self.nth is not None or self.kind is not None or self.when is not None


def commit_kinds(events: Sequence[RunEvent]) -> list[str]:
    """The kernel commands a commit carries, in order (``["tool_invoked"]``,
    or ``["provider_completed", "tool_invoked"]`` for a merged one)."""
    return [event.type.removeprefix("run.") for event in events] or ["?"]


def commit_kind(events: Sequence[RunEvent]) -> str:
    """The command that names a commit: its last (the effect a merged commit
    starts, e.g. ``tool_invoked`` after ``provider_completed``)."""
    return commit_kinds(events)[-1]


class FaultyStore(Delegating):
    """A store wrapper that injects :class:`Fault` s into commits and records
    what happened, for invariant checks:

    * ``attempts``: ``(number, kind, at)`` of every commit tried (``kind``
      names it: its last command; ``carried`` lists them all);
    * ``acknowledged``: ``(kind, record, at)`` of every commit acknowledged to
      the runtime (a receipt returned), in order;
    * ``written``: records the inner store holds because of this wrapper
      (acknowledged or not);
    * ``max_in_flight``: the most commits in flight at once (NEST-06);
    * ``reached(kind)``: a ``trio.Event`` set when a commit of ``kind`` starts.
    """

    def __init__(self, inner: Any = None, *faults: Fault) -> None:
        from trio_backplane.store import MemoryStore

        super().__init__(MemoryStore() if inner is None else inner)
        self.faults = list(faults)
        self.attempts: list[tuple[int, str, float]] = []
        self.acknowledged: list[tuple[str, RunRecord, float]] = []
        self.written: list[RunRecord] = []
        self.fired: list[tuple[str, str, int]] = []  # (action, kind, number)
        #: every command each attempted commit carried, aligned with ``attempts``
        self.carried: list[tuple[str, ...]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._kinds: dict[str, int] = {}
        self._reached: dict[str, trio.Event] = {}

    def add(self, fault: Fault) -> None:
        self.faults.append(fault)

    def reached(self, kind: str) -> trio.Event:
        return self._reached.setdefault(kind, trio.Event())

    def attempt_with(self, kind: str) -> tuple[int, float]:
        """``(number, at)`` of the first commit tried that carried ``kind``."""
        for (number, _named, at), kinds in zip(self.attempts, self.carried, strict=True):
            if kind in kinds:
                return number, at
        raise AssertionError(f"no commit carried {kind}: {self.carried}")

    def acknowledged_kinds(self) -> list[str]:
        return [kind for kind, _record, _at in self.acknowledged]

    def last_acknowledged(self) -> RunRecord | None:
        return self.acknowledged[-1][1] if self.acknowledged else None

    def intent_acknowledged(self, invocation_id: str) -> bool:
        """Whether an acknowledged commit published ``tool:<invocation_id>``."""
        key = f"tool:{invocation_id}"
        return any(
            kind == "tool_invoked" and key in record.intents
            for kind, record, _at in self.acknowledged
        )

    async def commit(
        self,
        run_id: str,
        *,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        kinds = commit_kinds(events)
        kind = kinds[-1]
        number = len(self.attempts) + 1
        seen: dict[str, int] = {}
        for each in kinds:
            self._kinds[each] = seen[each] = self._kinds.get(each, 0) + 1
            self.reached(each).set()
        self.attempts.append((number, kind, trio.current_time()))
        self.carried.append(tuple(kinds))
        # A fault aimed at any command of a merged commit fires on that commit.
        fault = next(
            (
                f
                for f in self.faults
                if any(f.matches(number, each, seen[each], record) for each in kinds)
            ),
            None,
        )
        if fault is not None:
            fault.fired += 1
            self.fired.append((fault.action, kind, number))
        action = fault.action if fault is not None else None
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._commit(
                action, fault, run_id, incarnation, expected_revision, record, events
            )
        finally:
            self.in_flight -= 1

    async def _commit(  # noqa: PLR0917 - the commit's arguments, passed through
        self,
        action: str | None,
        fault: Fault | None,
        run_id: str,
        incarnation: int,
        expected_revision: int,
        record: RunRecord,
        events: Sequence[RunEvent],
    ) -> Receipt:
        from trio_backplane import Error, ErrorClass

        await trio.lowlevel.checkpoint()
        if action == "fail":
            raise Error(ErrorClass.STORAGE_FAILED, "injected commit failure")
        if action == "crash":
            raise OSError("injected store crash")
        if action == "hang":
            await trio.sleep_forever()
        if action == "conflict":
            await self._fence_newer(run_id, incarnation)
        if action == "delay" and fault is not None:
            await trio.sleep(fault.delay)
        receipt: Receipt = await self.inner.commit(
            run_id,
            incarnation=incarnation,
            expected_revision=expected_revision,
            record=record,
            events=events,
        )
        self.written.append(record)
        if action == "lose_ack":
            await trio.sleep_forever()
        if action == "lose_ack_raise":
            raise OSError("injected: connection lost after commit")
        now = trio.current_time()
        self.acknowledged.extend((each, record, now) for each in commit_kinds(events))
        return receipt

    async def _fence_newer(self, run_id: str, incarnation: int) -> None:
        """Make a newer incarnation own the run, as another host would."""
        from trio_backplane import Error, ErrorClass
        from trio_backplane.kernel import fence

        records = getattr(self.inner, "_records", None)
        if isinstance(records, dict) and run_id in records:
            new, events = fence(records[run_id], incarnation + 1)
            records[run_id] = new
            log = self.inner._events[run_id]
            for event in events:
                log.append(attrs.evolve(event, sequence=len(log) + 1))
            return
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "incarnation is fenced",
            {"stored": incarnation + 1, "received": incarnation},
        )


class ProbeBackend:
    """A tool backend whose behaviour is chosen by its arguments and that checks
    the gateway's promises at every dispatch (KER-09, CAN-04, the invariants).

    Arguments: ``{"outcome": "ok" | "is_error" | "error" | "unknown" | "crash" |
    "hang" | "sleep" | "garbage", "seconds": float}``.  ``violations`` lists
    every broken promise: a dispatch without an acknowledged ``tool_invoked``
    intent in ``store`` (a :class:`FaultyStore`), an invocation dispatched
    twice, a dispatch after ``cancel_returned`` was set.  ``running`` counts
    executions still inside ``execute`` (0 once the conversation is closed),
    ``cancelled`` those that saw ``trio.Cancelled``."""

    def __init__(
        self, store: FaultyStore | None = None, shared: ProbeBackend | None = None
    ) -> None:
        self.store = store
        root = shared if shared is not None else self
        self._root = root
        if shared is None:
            self.operations: list[Any] = []
            self.dispatch_times: list[float] = []
            self.violations: list[str] = []
            self.running = 0
            self.cancelled = 0
            self.finished = 0
            self.cancel_returned = False

    def sibling(self) -> ProbeBackend:
        """Another backend object sharing this one's records (for a second tool)."""
        return ProbeBackend(self.store, shared=self._root)

    async def execute(self, operation: Any) -> Any:
        from trio_backplane import Error, ErrorClass

        root = self._root
        invocation_id = operation.invocation_id
        if root.cancel_returned:
            root.violations.append(f"{invocation_id} dispatched after cancel() returned")
        if any(op.invocation_id == invocation_id for op in root.operations):
            root.violations.append(f"{invocation_id} dispatched twice")
        if root.store is not None and not root.store.intent_acknowledged(invocation_id):
            root.violations.append(f"{invocation_id} dispatched without an acknowledged intent")
        root.operations.append(operation)
        root.dispatch_times.append(trio.current_time())
        root.running += 1
        arguments = operation.arguments
        outcome = arguments.get("outcome", "ok") if isinstance(arguments, Mapping) else "ok"
        try:
            await trio.lowlevel.checkpoint()
            if outcome == "is_error":
                return ToolResult("it did not work", is_error=True)
            if outcome == "error":
                raise Error(ErrorClass.EXECUTION_FAILURE, "backend refused")
            if outcome == "unknown":
                raise Error(ErrorClass.UNKNOWN_OUTCOME, "backend lost track")
            if outcome == "crash":
                raise RuntimeError("backend crashed")
            if outcome == "hang":
                await trio.sleep_forever()
            if outcome == "sleep":
                await trio.sleep(float(arguments.get("seconds", 1.0)))
            if outcome == "garbage":
                return {"not": "a ToolResult"}
            return ToolResult(f"done {invocation_id}")
        except trio.Cancelled:
            root.cancelled += 1
            raise
        finally:
            root.running -= 1
            root.finished += 1

    @property
    def calls(self) -> int:
        return len(self._root.operations)


#: The schema of a :class:`ProbeBackend` tool.
PROBE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "outcome": {
            "enum": ["ok", "is_error", "error", "unknown", "crash", "hang", "sleep", "garbage"]
        },
        "seconds": {"type": "number", "minimum": 0},
    },
    "required": ["outcome"],
}


def probe_tools(
    backend: ProbeBackend,
    *,
    read_only: Sequence[str] = ("look",),
    mutating: Sequence[str] = ("act",),
) -> list[ToolDescriptor]:
    """Read-only and mutating tools over one :class:`ProbeBackend`'s records."""
    tools = [
        make_tool(n, backend.sibling(), schema=PROBE_SCHEMA, read_only=True) for n in read_only
    ]
    tools += [make_tool(n, backend.sibling(), schema=PROBE_SCHEMA) for n in mutating]
    return tools


def task_tree_size(task: Any = None) -> int:
    """How many tasks run below ``task`` (default: the current task)."""
    root = trio.lowlevel.current_task() if task is None else task
    count = 0
    stack = [root]
    while stack:
        for nursery in stack.pop().child_nurseries:
            for child in nursery.child_tasks:
                count += 1
                stack.append(child)
    return count


TERMINAL_EVENTS = frozenset({"run_completed", "run_failed", "run_cancelled"})


# -- probes (test_conversation, test_events) ----------------------------------


def observed_provider(responses: Any = (), observe: Callable[[Any], None] | None = None) -> Any:
    """A ``ScriptedProvider`` that calls ``observe(request)`` synchronously when
    each ``stream`` call starts (before any event is produced)."""
    from trio_backplane.testing import ScriptedProvider

    class _Observed(ScriptedProvider):
        def stream(self, request: Any, context: Any) -> Any:
            if observe is not None:
                observe(request)
            return super().stream(request, context)

    return _Observed(responses)


def mark(timeline: TimelineStore, tag: str, value: Any = None) -> None:
    """Drain the attached subscriber channels into ``timeline`` and append
    ``(tag, value)``: everything listed before it was published before now."""
    timeline.drain()
    timeline.timeline.append((tag, value))


async def stored_kinds(store: Any, run_id: str = RUN_ID) -> list[str]:
    """The kernel command of every stored event (``"run.<command>"`` minus ``run.``)."""
    return [e.type.removeprefix("run.") for e in await store.events(run_id)]


async def collect_timed(
    channel: trio.MemoryReceiveChannel[Event], out: list[tuple[float, Event]]
) -> None:
    """Read ``channel`` until it closes, appending ``(trio.current_time(), event)``:
    a prompt reader's timestamps are publication times (run it in a nursery)."""
    async with channel:
        async for event in channel:
            out.append((trio.current_time(), event))


# -- interactions and publications (issue 6) -----------------------------------


class Host:
    """A host that answers ``interaction_requested`` events.

    ``policy(event)`` returns ``(delay, answer)`` to answer after ``delay``
    seconds of (mock) time, or ``None`` to leave the interaction pending.
    ``events`` holds every event read, ``requested``/``resolved`` the
    ``(time, interaction_id)`` of each request seen and each ``resolve`` that
    returned, ``errors`` every ``Error`` a ``resolve`` raised, and
    ``on_request(event, record)`` (optional) is called with the stored record
    when a request arrives."""

    def __init__(
        self,
        conversation: Conversation,
        policy: Callable[[Event], tuple[float, Any] | None] | None = None,
        *,
        store: Any = None,
        run_id: str = RUN_ID,
    ) -> None:
        self.conversation = conversation
        self.policy = policy if policy is not None else (lambda _e: (0.0, "approved"))
        self.store = store
        self.run_id = run_id
        self.events: list[Event] = []
        self.requested: list[tuple[float, str]] = []
        self.resolved: list[tuple[float, str]] = []
        self.errors: list[Any] = []
        self.records_at_request: list[RunRecord | None] = []
        self.records_at_resolved_event: list[RunRecord | None] = []

    def of(self, type_: str) -> list[Event]:
        return [e for e in self.events if e.type == type_]

    async def run(self, channel: trio.MemoryReceiveChannel[Event]) -> None:
        async with trio.open_nursery() as nursery, channel:
            async for event in channel:
                self.events.append(event)
                if event.type == "interaction_resolved" and self.store is not None:
                    self.records_at_resolved_event.append(await self.store.load(self.run_id))
                if event.type != "interaction_requested":
                    continue
                interaction_id = event.payload["interaction_id"]
                self.requested.append((trio.current_time(), interaction_id))
                if self.store is not None:
                    self.records_at_request.append(await self.store.load(self.run_id))
                decision = self.policy(event)
                if decision is not None:
                    nursery.start_soon(self._answer, interaction_id, *decision)

    async def _answer(self, interaction_id: str, delay: float, answer: Any) -> None:
        from trio_backplane import Error

        await trio.sleep(delay)
        try:
            await self.conversation.resolve(interaction_id, answer)
        except Error as error:
            self.errors.append(error)
            return
        self.resolved.append((trio.current_time(), interaction_id))


async def run_with_host(
    provider: Any,
    tools: Sequence[ToolDescriptor] = (),
    policy: Callable[[Event], tuple[float, Any] | None] | None = None,
    *,
    prompt: Any = "hello",
    during: Callable[[Conversation, Host], Any] | None = None,
    **kwargs: Any,
) -> tuple[Finished, Host]:
    """``run_to_settled`` with a :class:`Host` answering interactions; ``during``
    (an async callable) runs beside the run once the prompt is admitted."""
    run_id = kwargs.get("run_id", RUN_ID)
    async with conversation_with(provider, tools, **kwargs) as (conversation, timeline):
        host = Host(conversation, policy, store=timeline, run_id=run_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.run, conversation.subscribe(buffer=100_000))
            await trio.lowlevel.checkpoint()
            await conversation.prompt(prompt)
            if during is not None:
                nursery.start_soon(during, conversation, host)
            snapshot = await conversation.wait_settled()
            nursery.cancel_scope.cancel()
    record = await timeline.load(run_id)
    assert record is not None
    log = await timeline.events(run_id)
    return Finished(snapshot, timeline.published(), record, log, timeline), host


def pending_of(record: RunRecord | None) -> Any:
    """The stored ``pending_interaction`` of ``record``'s conversation state."""
    assert record is not None
    return record.context["conversation"]["pending_interaction"]


def publication(
    publication_id: str,
    tools: Sequence[ToolDescriptor],
    *,
    expected_revision: int = 1,
    run_id: str = RUN_ID,
    incarnation: int = 1,
    authority: Authority | None = None,
    schema_admission: str | None = None,
) -> Any:
    """A :class:`Publication` of ``tools`` as the next catalog revision."""
    from trio_backplane.tools import CatalogUpdate, Publication

    registry = ToolRegistry(tools)
    return Publication(
        publication_id,
        run_id,
        incarnation,
        expected_revision,
        CatalogUpdate(
            expected_revision + 1,
            registry,
            granted(registry, run_id) if authority is None else authority,
        ),
        schema_admission=schema_admission,
    )


def drained(channel: trio.MemoryReceiveChannel[Event]) -> list[Event]:
    """The events waiting in ``channel`` now, without blocking."""
    events: list[Event] = []
    while True:
        try:
            events.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return events
