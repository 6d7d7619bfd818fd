"""Builders and strategies shared by the kernel tests."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import attrs
from hypothesis import strategies as st

from trio_backplane.errors import Error
from trio_backplane.kernel import (
    Command,
    RunEvent,
    RunRecord,
    cleanup_requirements,
    fence,
    thaw,
    transition,
)

RUN = "run-1"

#: Every command of API.md's kernel table.
KINDS = (
    "admit",
    "start",
    "conversation_updated",
    "provider_started",
    "provider_completed",
    "tool_invoked",
    "tool_completed",
    "wait_started",
    "wait_resolved",
    "child_settled",
    "finish",
    "cancel",
    "deadline_exceeded",
    "cleanup_settled",
)

#: Commands that still apply after the run deadline (KER-08).
AFTER_DEADLINE = frozenset(
    {"cancel", "deadline_exceeded", "cleanup_settled", "conversation_updated"}
)

ACTIVE = ("queued", "running", "waiting_approval", "waiting_result")
TERMINAL = ("completed", "failed", "cancelled", "timed_out", "unknown_outcome")

#: "allowed from" of API.md's table, by state label.  ``queued_new`` is a
#: queued run not yet admitted; ``queued_admitted`` an admitted one.
ALLOWED_FROM: Mapping[str, frozenset[str]] = {
    "admit": frozenset({"queued_new"}),
    "start": frozenset({"queued_admitted", "running"}),
    "conversation_updated": frozenset({"running"}),
    "provider_started": frozenset({"running"}),
    "provider_completed": frozenset({"running"}),
    "tool_invoked": frozenset({"running"}),
    "tool_completed": frozenset({"running"}),
    "wait_started": frozenset({"running"}),
    "wait_resolved": frozenset({"waiting_result"}),
    "child_settled": frozenset({"running"}),
    "finish": frozenset({"running"}),
    "cancel": frozenset({"queued_new", "queued_admitted", *ACTIVE[1:]}),
    "deadline_exceeded": frozenset({"queued_new", "queued_admitted", *ACTIVE[1:]}),
    "cleanup_settled": frozenset({"cancelling"}),
}

#: An input each command would accept if its state allowed it.
PLAUSIBLE_INPUT: Mapping[str, Mapping[str, Any]] = {
    "admit": {"state": "running", "deadline": 1_000.0},
    "start": {},
    "conversation_updated": {"conversation": {"messages": []}},
    "provider_started": {},
    "provider_completed": {"result": {"text": "hi"}},
    "tool_invoked": {"tool_name": "echo", "tool_call_id": "call-1"},
    "tool_completed": {"invocation_id": "invocation-1-1", "result": {"content": "ok"}},
    "wait_started": {"dependency": "dep-1"},
    "wait_resolved": {"wait_id": "wait-1-1"},
    "child_settled": {"child_id": "child-1"},
    "finish": {"status": "completed"},
    "cancel": {},
    "deadline_exceeded": {},
    "cleanup_settled": {"certainty": "uncertain", "evidence": ["worker lost"]},
}


def outcome_of(step: Any) -> tuple[Any, Error | None]:
    """``step()``'s result, or the ``Error`` it raised."""
    try:
        return step(), None
    except Error as exc:
        return None, exc


def cmd(kind: str, at: float = 0.0, **input: Any) -> Command:
    return Command(kind, at, input or None)


def apply(record: RunRecord, *commands: Command) -> RunRecord:
    """Apply accepted commands in order."""
    for command in commands:
        record, _ = transition(record, command)
    return record


def admitted(*, work: int = 100, deadline: float | None = None, **kw: Any) -> RunRecord:
    return apply(RunRecord.new(RUN, work=work, **kw), cmd("admit", deadline=deadline))


def running(*, work: int = 100, deadline: float | None = None, **kw: Any) -> RunRecord:
    return apply(admitted(work=work, deadline=deadline, **kw), cmd("start"))


def settle_confirmed(record: RunRecord, at: float = 0.0) -> RunRecord:
    return apply(
        record,
        cmd(
            "cleanup_settled", at, certainty="confirmed", settled=thaw(cleanup_requirements(record))
        ),
    )


def records_by_label() -> dict[str, RunRecord]:
    """One record in every run state (two for ``queued``)."""
    run = running()
    with_provider = apply(run, cmd("provider_started"))
    cancelling = apply(run, cmd("cancel"))
    return {
        "queued_new": RunRecord.new(RUN),
        "queued_admitted": admitted(),
        "running": run,
        "waiting_approval": attrs.evolve(run, state="waiting_approval"),
        "waiting_result": apply(run, cmd("wait_started", dependency="dep-1")),
        "cancelling": cancelling,
        "completed": apply(run, cmd("finish", status="completed")),
        "failed": apply(run, cmd("finish", status="failed")),
        "cancelled": settle_confirmed(cancelling),
        "timed_out": settle_confirmed(apply(run, cmd("deadline_exceeded"))),
        "unknown_outcome": apply(
            with_provider,
            cmd("cancel"),
            cmd("cleanup_settled", certainty="uncertain", evidence=["provider stream lost"]),
        ),
    }


# -- strategies -----------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=16,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


@st.composite
def next_command(draw: st.DrawFn, record: RunRecord, at: float) -> Command:
    """A command that is often, not always, acceptable for ``record``."""
    kind = draw(st.sampled_from(KINDS))
    given: dict[str, Any] = {}
    if kind == "admit":
        given["state"] = draw(st.sampled_from(["queued", "running", "running", "completed"]))
        given["deadline"] = draw(st.none() | st.just(at + draw(st.integers(0, 40))))
    elif kind == "conversation_updated":
        given["conversation"] = draw(
            st.fixed_dictionaries({"messages": st.lists(json_objects, max_size=3)})
        )
        if draw(st.booleans()) and record.deadline is not None:
            given["execution_deadline"] = record.deadline + draw(st.integers(-5, 20))
    elif kind == "provider_completed":
        given["result"] = draw(json_values)
        given["final"] = draw(st.booleans())
        if record.active_provider is not None and draw(st.booleans()):
            given["attempt_id"] = record.active_provider["attempt_id"]
    elif kind == "tool_invoked":
        given["tool_name"] = draw(st.sampled_from(["echo", "write"]))
        given["tool_call_id"] = draw(st.sampled_from(["call-1", "call-2", "call-3"]))
        given["effect_class"] = draw(st.sampled_from(["read_only", "mutation"]))
    elif kind == "tool_completed":
        ids = sorted(record.active_tools) or ["invocation-0-0"]
        given["invocation_id"] = draw(st.sampled_from(ids))
        given["result"] = draw(json_values)
    elif kind == "wait_started":
        given["dependency"] = draw(st.sampled_from(["dep-a", "dep-b"]))
    elif kind == "wait_resolved":
        wait = record.active_wait
        given["wait_id"] = wait["wait_id"] if wait is not None else "wait-0-0"
    elif kind == "finish":
        given["status"] = draw(st.sampled_from(["completed", "failed"]))
        given["outcome"] = draw(json_objects)
    elif kind == "cleanup_settled":
        if draw(st.booleans()):
            given["certainty"] = "confirmed"
            given["settled"] = thaw(record.cleanup_required or cleanup_requirements(record))
        else:
            given["certainty"] = "uncertain"
            given["evidence"] = draw(
                st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=2)
            )
    return Command(kind, at, given)


Outcome = tuple[RunRecord, list[RunEvent]] | tuple[str, str, dict[str, Any]]


def replay(record: RunRecord, steps: list[Command | int]) -> list[Outcome]:
    """Apply ``steps`` (commands, or ints meaning ``fence`` to that
    incarnation), keeping accepted records; each outcome is the transition's
    result or the refusal's (class, message, details)."""
    outcomes: list[Outcome] = []
    for step in steps:
        try:
            result = fence(record, step) if isinstance(step, int) else transition(record, step)
        except Error as exc:
            outcomes.append((exc.error_class.value, exc.message, thaw(exc.details)))
            continue
        outcomes.append(result)
        record = result[0]
    return outcomes


@st.composite
def lifecycles(draw: st.DrawFn, max_steps: int = 30) -> tuple[RunRecord, list[Command | int]]:
    """A fresh record and a command sequence (with the occasional fence) that
    drives it through a plausible lifecycle, refusals included."""
    context = draw(st.none() | json_objects)
    initial = RunRecord.new(
        RUN,
        incarnation=draw(st.integers(1, 3)),
        work=draw(st.integers(1, 8)),
        context=context,
    )
    record = initial
    steps: list[Command | int] = []
    now = 0.0
    for _ in range(draw(st.integers(0, max_steps))):
        now += draw(st.sampled_from([0.0, 0.5, 3.0]))
        step: Command | int
        if draw(st.integers(0, 15)) == 0:
            step = record.incarnation + draw(st.integers(0, 1))
        else:
            step = draw(next_command(record, now))
        steps.append(step)
        with contextlib.suppress(Error):
            if isinstance(step, int):
                record, _ = fence(record, step)
            else:
                record, _ = transition(record, step)
    return initial, steps


@st.composite
def lifecycle_records(draw: st.DrawFn, max_steps: int = 30) -> list[RunRecord]:
    """Every record a drawn lifecycle passes through."""
    initial, steps = draw(lifecycles(max_steps))
    return [initial, *(o[0] for o in replay(initial, steps) if isinstance(o[0], RunRecord))]
