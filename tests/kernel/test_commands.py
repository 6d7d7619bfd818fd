"""The typed commands: one class per kind, the same transitions as the
generic ``Command`` they stand for (KER-01..08, KER-11)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given

from trio_backplane.errors import Error, ErrorClass
from trio_backplane.kernel import (
    COMMANDS,
    UNSET,
    Admit,
    Command,
    FrozenDict,
    ProviderCompleted,
    ProviderStarted,
    RunRecord,
    ToolInvoked,
    encode_record,
    transition,
)

from .support import KINDS, RUN, cmd, lifecycles, replay, running


def as_typed(command: Command | int) -> Any:
    """The typed command standing for a generic one (a fence stays a fence)."""
    if isinstance(command, int):
        return command
    cls = COMMANDS.get(command.kind)
    if cls is None:
        return command  # an unknown kind stays generic: refused the same
    names = {f.name for f in attrs.fields(cls) if f.init}
    if set(command.input) - names:
        return command  # a key no field holds: only the generic form carries it
    return cls(at=command.at, **dict(command.input))


def test_ker01_every_kind_has_its_class() -> None:
    """``COMMANDS`` names every kind the kernel takes, each with its class."""
    assert sorted(COMMANDS) == sorted(KINDS)
    for kind, cls in COMMANDS.items():
        assert cls.kind == kind
        assert attrs.has(cls)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            cls(at=0.0).at = 1.0  # type: ignore[misc]


@given(lifecycles())
def test_ker01_a_typed_command_transitions_as_its_generic_form(
    lifecycle: tuple[RunRecord, list[Command | int]],
) -> None:
    """Records, events and refusals are the same whichever form says it."""
    initial, steps = lifecycle
    assert replay(initial, [as_typed(step) for step in steps]) == replay(initial, steps)


def test_ker03_a_field_given_as_none_is_not_a_field_left_out() -> None:
    """``None`` is a value (JSON null): ``Admit(state=None)`` is refused as
    ``{"state": None}`` is, where a missing state means ``queued``."""
    record = RunRecord.new(RUN)
    queued, events = transition(record, Admit(at=0.0))
    assert queued.state == "queued"
    assert events[0].payload["input"] == {}
    assert Admit(at=0.0).state is UNSET
    with pytest.raises(Error) as info:
        transition(record, Admit(at=0.0, state=None))
    assert info.value.error_class is ErrorClass.VALIDATION
    assert info.value.details == {"state": "None"}


def test_ker11_a_typed_command_holding_a_runtime_handle_is_refused() -> None:
    """A typed command is checked as JSON data before anything holds it: a
    handle in a field is refused, at construction for the fields the kernel
    keeps as given, at the transition for the others, and the record is
    unchanged."""
    record = running()
    with pytest.raises(Error) as built:
        ProviderCompleted(at=0.0, messages=[{"role": "assistant", "x": object()}])
    assert built.value.error_class is ErrorClass.VALIDATION
    started, _ = transition(record, ProviderStarted(at=0.0))
    before = encode_record(started)
    for command in (
        ProviderCompleted(at=1.0, attempt_id=object()),
        ProviderCompleted(at=1.0, result={"handle": object()}),
        ProviderCompleted(at=1.0, attempt_id="\ud800"),
    ):
        with pytest.raises(Error) as info:
            transition(started, command)
        assert info.value.error_class is ErrorClass.VALIDATION, command
        assert encode_record(started) == before


def test_ker01_a_typed_event_shows_the_set_fields_large_ones_summarised() -> None:
    """The event of a typed command shows what was given, as the generic
    command's does: the transcript appended as a count, never its text."""
    record, _ = transition(running(), ProviderStarted(at=0.0, turn_id="t1"))
    attempt_id = record.active_provider["attempt_id"]  # type: ignore[index]
    message = {"role": "assistant", "content": "secret-free text"}
    typed_new, typed_events = transition(
        record, ProviderCompleted(at=1.0, attempt_id=attempt_id, messages=[message])
    )
    generic_new, generic_events = transition(
        record, cmd("provider_completed", 1.0, attempt_id=attempt_id, messages=[message])
    )
    assert typed_new == generic_new
    assert typed_events == generic_events
    shown = typed_events[0].payload["input"]
    assert shown == {"attempt_id": attempt_id, "messages": {"items": 1}}
    assert type(shown) is FrozenDict


def test_ker04_a_typed_command_for_another_run_or_incarnation_conflicts() -> None:
    """``run_id``/``incarnation`` on a typed command are checked as on a
    generic one (KER-04)."""
    record = running()
    for command in (
        ToolInvoked(at=0.0, run_id="another"),
        ToolInvoked(at=0.0, incarnation=record.incarnation + 1),
    ):
        with pytest.raises(Error) as info:
            transition(record, command)
        assert info.value.error_class is ErrorClass.RESOURCE_CONFLICT


def test_ker01_transition_refuses_what_is_not_a_command() -> None:
    """Anything but a ``Command`` or a typed command is a classed refusal."""
    for thing in ({"kind": "start"}, "start", None):
        with pytest.raises(Error) as info:
            transition(running(), thing)  # type: ignore[arg-type]
        assert info.value.error_class is ErrorClass.VALIDATION
