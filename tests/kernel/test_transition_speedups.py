"""The C accelerator's ``transition`` (a tool step's four commands) commits
what the Python kernel commits, or declines.

Two chains of records start equal and take the same typed commands, one
through the accelerated ``transition`` and one with the accelerator off:
every outcome (the record field by field with exact types, the lineage of
every derived mapping, the event, or the refusal) is the same.  The
commands carry hostile values (lone surrogates, huge integers, non-finite
floats, foreign types, stale ids, duplicate calls) and the run a deadline,
so the accelerator's declines are driven as well as its fast path.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_backplane.errors import Error
from trio_backplane.kernel import (
    COMMANDS,
    FrozenDict,
    FrozenList,
    LayeredDict,
    ProviderCompleted,
    ProviderStarted,
    RunEvent,
    RunRecord,
    ToolCompleted,
    ToolInvoked,
    _commands,
    _speedups,
    _transition,
    build_command,
    thaw,
    transition,
)
from trio_backplane.kernel._commands import UNSET, Admit, Cancel, ConversationUpdated, Start
from trio_backplane.kernel._records import kernel_event

RUN = "run-c"


@contextmanager
def _python_only() -> Iterator[None]:
    fast = _transition._fast_transition
    _transition._fast_transition = None  # type: ignore[misc]
    try:
        yield
    finally:
        _transition._fast_transition = fast  # type: ignore[misc]


class _Str(str):
    pass


_TEXT = st.one_of(
    st.sampled_from(["echo", "call-1", "call-2", "é", "\u20ac", "\ud800", _Str("sub")]),
    st.text(max_size=4),
)
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.builds(lambda: 10**4300),
    st.floats(allow_nan=True, allow_infinity=True),
    _TEXT,
    st.sampled_from([object(), b"b", FrozenDict({"f": 1}), FrozenList([1])]),
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(_TEXT, inner, max_size=3),
        st.dictionaries(st.integers(), inner, max_size=1),
    ),
    max_leaves=8,
)
#: Mostly the values a runtime sends; sometimes anything.
_FIELD = st.one_of(st.just(UNSET), st.just(UNSET), _TEXT, _VALUES)
_MESSAGES = st.one_of(
    st.just(UNSET),
    st.lists(st.fixed_dictionaries({"role": st.just("tool"), "content": _TEXT}), max_size=2),
    _VALUES,
)
_CONVERSATION = st.one_of(
    st.just(UNSET),
    st.just(FrozenDict({"steering": FrozenList(), "turn": 1})),
    st.just(FrozenDict({"messages": FrozenList()})),
    st.dictionaries(_TEXT, _VALUES, max_size=2),
    _VALUES,
)


def _step(draw: st.DrawFn, record: RunRecord, at: Any) -> Any:
    """A typed command, often acceptable for ``record``."""
    if draw(st.integers(0, 3)):  # mostly what a runtime would send next
        if record.active_provider is not None:
            kind = "pc"
        elif record.active_tools:
            kind = draw(st.sampled_from(["tc", "tc", "ti"]))
        else:
            kind = draw(st.sampled_from(["ps", "ti"]))
    else:
        kind = draw(st.sampled_from(["ps", "pc", "ti", "tc", "other"]))
    base: dict[str, Any] = {"at": at}
    if draw(st.integers(0, 9)) == 0:
        base["run_id"] = draw(st.sampled_from([RUN, "other", 3]))
    if draw(st.integers(0, 9)) == 0:
        base["incarnation"] = draw(st.sampled_from([record.incarnation, 7, True, 1.0]))
    if kind == "ps":
        return ProviderStarted(**base, turn_id=draw(_FIELD))
    if kind == "pc":
        active = record.active_provider
        attempt = active["attempt_id"] if active is not None else "attempt-1-9"
        return ProviderCompleted(
            **base,
            attempt_id=draw(st.sampled_from([UNSET, None, attempt, "attempt-1-99", 5])),
            result=draw(_FIELD),
            final=draw(st.sampled_from([UNSET, UNSET, False, True])),
            conversation=draw(_CONVERSATION),
            messages=draw(_MESSAGES) if draw(st.booleans()) else UNSET,
            usage=draw(_MESSAGES) if draw(st.booleans()) else UNSET,
        )
    if kind == "ti":
        return ToolInvoked(
            **base,
            step_id=draw(st.sampled_from([UNSET, UNSET, record.step_id, "step-1-99", 4])),
            tool_name=draw(_FIELD),
            tool_revision=draw(st.sampled_from([UNSET, 1, "r1"])),
            tool_call_id=draw(st.sampled_from([UNSET, None, "call-1", "call-2", "call-3", 9])),
            turn_id=draw(_FIELD),
            arguments_digest=draw(st.sampled_from([UNSET, "sha256:ab"])),
            effective_authority=draw(st.sampled_from([UNSET, {"caller": "c"}])),
            effect_class=draw(st.sampled_from([UNSET, "read_only", "mutation"])),
            dispatch_state=draw(st.sampled_from([UNSET, "unknown", "not_sent"])),
        )
    if kind == "tc":
        ids = sorted(record.active_tools) or ["invocation-1-1"]
        return ToolCompleted(
            **base,
            invocation_id=draw(st.sampled_from([*ids, "invocation-1-999", 3])),
            result=draw(_FIELD),
            conversation=draw(_CONVERSATION),
            messages=draw(_MESSAGES),
            usage=draw(_MESSAGES) if draw(st.booleans()) else UNSET,
        )
    return draw(
        st.sampled_from(
            [
                ConversationUpdated(at=at, conversation=FrozenDict({"turn": 2})),
                ConversationUpdated(at=at, execution_deadline=at + 50),
                Cancel(at=at),
            ]
        )
    )


def _lineage(value: Any) -> Any:
    lineage = getattr(value, "_lineage", None) if isinstance(value, Mapping) else None
    return None if lineage is None else (list(lineage[0]), lineage[1])


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same exact types at every level and the same lineage."""
    if type(a) is not type(b) or _lineage(a) != _lineage(b):
        return False
    if isinstance(a, RunRecord | RunEvent) or type(a).__name__ == "Budget":
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in attrs.fields(type(a)))
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _outcome(step: Callable[[], Any]) -> Any:
    try:
        return step()
    except Error as exc:
        return (exc.error_class, exc.message, thaw(exc.details))


def _start(incarnation: int, work: int, deadline: float | None) -> RunRecord:
    """A running record, built by the Python kernel (each call a new chain)."""
    with _python_only():
        record = RunRecord.new(RUN, incarnation=incarnation, work=work)
        record, _ = transition(record, Admit(at=0.0, deadline=deadline))
        record, _ = transition(record, Start(at=0.0))
    return record


@st.composite
def _chains(draw: st.DrawFn) -> tuple[tuple[int, int, float | None], list[Any]]:
    incarnation = draw(st.integers(1, 3))
    work = draw(st.integers(1, 40))
    deadline = draw(st.none() | st.just(30.0))
    record = _start(incarnation, work, deadline)
    commands: list[Any] = []
    at: Any = 0.0
    for _ in range(draw(st.integers(1, 40))):
        at = at + draw(st.sampled_from([0.0, 0.5, 2, 3.0]))
        if draw(st.integers(0, 19)) == 0:
            at = draw(st.sampled_from([float(at), int(at)]))
        try:
            command = _step(draw, record, at)
        except Error:
            continue  # a value the command's own converter refuses
        commands.append(command)
        with _python_only():
            outcome = _outcome(functools.partial(transition, record, command))
        if isinstance(outcome, tuple) and type(outcome[0]) is RunRecord:
            record = outcome[0]
    return (incarnation, work, deadline), commands


#: How often the accelerator built an outcome, and how often it declined.
taken: list[int] = [0, 0]


@contextmanager
def _counted() -> Iterator[None]:
    fast = _transition._fast_transition
    assert fast is not None

    def counting(*args: Any) -> Any:
        done = fast(*args)
        taken[done is NotImplemented] += 1
        return done

    _transition._fast_transition = counting  # type: ignore[misc]
    try:
        yield
    finally:
        _transition._fast_transition = fast  # type: ignore[misc]


@settings(max_examples=200)
@given(_chains(), st.sampled_from([None, "same", "raise"]))
def test_the_c_transition_commits_what_the_python_kernel_commits(
    chain: tuple[tuple[int, int, float | None], list[Any]], revision: str | None
) -> None:
    (incarnation, work, deadline), commands = chain
    fast_record = _start(incarnation, work, deadline)
    slow_record = _start(incarnation, work, deadline)
    for command in commands:
        rev = {None: None, "same": fast_record.revision, "raise": fast_record.revision + 1}
        chosen = rev[revision]
        with _counted():
            fast = _outcome(functools.partial(transition, fast_record, command, revision=chosen))
        with _python_only():
            slow = _outcome(functools.partial(transition, slow_record, command, revision=chosen))
        assert _same(fast, slow), (command, fast, slow)
        if type(fast[0]) is RunRecord:
            fast_record, slow_record = fast[0], slow[0]


def test_the_differential_test_drove_the_c_path() -> None:
    """The property above took the C path, and declined, many times (run
    after it: pytest keeps a module's order)."""
    assert taken[0] > 300
    assert taken[1] > 300


def test_a_tool_step_takes_the_c_path() -> None:
    """The four commands of a steady tool step are the accelerator's."""
    record = _start(1, 10, None)
    steps = [
        ProviderStarted(at=1.0, turn_id="turn-1"),
        ProviderCompleted(at=2.0, result={"calls": 1}, conversation=FrozenDict({"t": 1})),
        ToolInvoked(at=3.0, tool_name="echo", tool_call_id="call-1"),
        ToolCompleted(
            at=4.0,
            invocation_id="invocation-1-1",
            result={"ok": True},
            messages=[{"role": "tool", "content": "x"}],
        ),
        ProviderStarted(at=5.0, turn_id="turn-1"),
        ProviderCompleted(at=6.0, result=None),
        ToolInvoked(at=7.0, tool_name="echo", tool_call_id="call-2"),
    ]
    declined = []
    for command in steps:
        done = _speedups.transition(record, command, None, 64, 32)
        if done is NotImplemented:
            declined.append(type(command).__name__)
            with _python_only():
                done = transition(record, command)
        record = done[0]
    # the run's first tool walks every intent for a duplicate call: Python's
    assert declined == ["ToolInvoked"]
    assert record.revision == len(steps) + 2
    assert record.intents["tool:invocation-1-2"]["tool_call_id"] == "call-2"


@pytest.mark.parametrize(
    "bad",
    [
        "not a record",
        lambda r: attrs.evolve(r, state="cancelling"),
        lambda r: attrs.evolve(r, deadline=0.5),
        lambda r: attrs.evolve(r, budget=attrs.evolve(r.budget, used=r.budget.quota)),
        lambda r: attrs.evolve(r, counters={"attempt": -1}),
        lambda r: attrs.evolve(r, active_tools=LayeredDict(FrozenDict(), {}, 0)),
    ],
)
def test_what_the_c_transition_does_not_build_it_declines(bad: Any) -> None:
    record = _start(1, 10, None)
    subject = bad if isinstance(bad, str) else bad(record)
    assert _speedups.transition(subject, ProviderStarted(at=1.0), None, 64, 32) is NotImplemented


class _Hostile(str):
    """A key whose comparison raises, as a record's own data may."""

    def __eq__(self, other: object) -> bool:
        raise TypeError("boom")

    __hash__ = str.__hash__


def test_a_record_with_an_unset_slot_declines_and_python_classes_it() -> None:
    """A record whose slot was deleted is not read by C (no crash): the
    Python kernel refuses it as malformed."""
    record = _start(1, 10, None)
    object.__delattr__(record, "intents")
    assert _speedups.transition(record, ProviderStarted(at=1.0), None, 64, 32) is NotImplemented
    with pytest.raises(Error, match="malformed"):
        transition(record, ProviderStarted(at=1.0))


def test_a_command_with_an_unset_slot_declines() -> None:
    record = _start(1, 10, None)
    command = ProviderStarted(at=1.0)
    object.__delattr__(command, "turn_id")
    assert _speedups.transition(record, command, None, 64, 32) is NotImplemented


def test_a_failure_while_reading_the_record_is_classed_as_the_python_kernel_does() -> None:
    """An exception raised by the record's own data as C reads it (before it
    derives anything) is left to the Python code, which classes it."""
    record = _start(1, 10, None)
    for command in (
        ProviderStarted(at=1.0),
        ProviderCompleted(at=2.0),
        ToolInvoked(at=3.0, tool_name="echo"),
    ):
        with _python_only():
            record, _ = transition(record, command)
    identity = record.active_tools["invocation-1-1"]
    hostile = attrs.evolve(record, active_tools=FrozenDict({_Hostile("invocation-1-1"): identity}))
    completed = ToolCompleted(at=4.0, invocation_id="invocation-1-1", result=None)
    assert _speedups.transition(hostile, completed, None, 64, 32) is NotImplemented
    with pytest.raises(Error, match="malformed"):
        transition(hostile, completed)


def test_configuration_checks_the_command_order() -> None:
    """The handler is chosen by position: a misordered layout is refused."""
    commands = ((ToolInvoked, "run.tool_invoked", ()),) * 4
    with pytest.raises(TypeError, match=r"run\.provider_started"):
        _speedups.configure_transition(
            RunRecord,
            type(_start(1, 1, None).budget),
            kernel_event("run.probe", 0.0, FrozenDict()),
            UNSET,
            {},
            (),
            256,
            320,
            commands,
        )
    # the configured layout is still the one in use
    assert _speedups.transition(_start(1, 10, None), ProviderStarted(at=1.0), None, 64, 32)


# -- build_command: a command built without attrs' __init__ ----------------------


def _built(build: Callable[[], Any]) -> Any:
    try:
        return build()
    except (Error, TypeError) as exc:
        return exc


def _slots(command: Any) -> list[tuple[type, Any]]:
    return [
        (type(getattr(command, name)), getattr(command, name))
        for name in [*(f.name for f in attrs.fields(type(command))), "_source"]
    ]


_COMMAND_CLASSES = sorted(COMMANDS.values(), key=lambda cls: cls.kind)


@settings(max_examples=300)
@given(
    st.sampled_from(_COMMAND_CLASSES),
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(2**60), 2**60),
        st.sampled_from([True, "1.0", None, 2**53, 2**53 + 1]),
    ),
    st.data(),
)
def test_build_command_builds_what_the_classes_init_builds(
    cls: Any, at: Any, data: st.DataObject
) -> None:
    """For any class, time and fields (unknown ones, unfrozen values, UNSET
    given explicitly), ``build_command`` gives the instance or the error
    ``cls(at=at, **fields)`` gives."""
    names = [f.name for f in attrs.fields(cls) if f.init and f.name != "at"]
    keys = data.draw(st.lists(st.sampled_from([*names, "bogus"]), unique=True, max_size=5))
    values = st.one_of(
        st.just(UNSET),
        _VALUES,
        st.sampled_from([FrozenList([1]), FrozenDict({"a": 1}), [1, 2], {"a": [1]}]),
    )
    fields = {key: data.draw(values) for key in keys}
    if data.draw(st.booleans()):
        fields = FrozenDict(fields)  # type: ignore[assignment]
    built = _built(functools.partial(build_command, cls, at, fields))
    made = _built(functools.partial(cls, at=at, **fields))
    if isinstance(made, TypeError | Error):
        assert type(built) is type(made)
        assert str(built) == str(made)
    else:
        assert type(built) is cls
        assert _same(_slots(built), _slots(made))


def test_build_command_takes_the_c_path_for_a_steps_commands() -> None:
    """The commands a step builds are the accelerator's (its blank copied)."""
    assert _commands._fast_make is not None
    fields = {"invocation_id": "invocation-1-1", "messages": FrozenList([FrozenDict()])}
    assert _commands._fast_make(ToolCompleted, 1.0, fields) is not NotImplemented
    assert _commands._fast_make(ToolCompleted, 1.0, {"bogus": 1}) is NotImplemented
    assert _commands._fast_make(ToolCompleted, math.nan, {}) is NotImplemented
    assert _commands._fast_make(ToolCompleted, 1.0, {"messages": [1]}) is NotImplemented
