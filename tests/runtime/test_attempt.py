"""The response assembler on its own: no Trio, no clock, no store (sans-I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.runtime import (
    ResponseCompleted,
    ResponseFailed,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
)
from trio_backplane.runtime._attempt import ResponseAssembler

ASSISTANT = {"role": "assistant", "content": "hello"}


def _feed(assembler: ResponseAssembler, *events: Any) -> list[Any]:
    return [assembler.feed(event) for event in events]


def test_prv_09_deltas_become_publications_and_calls_assemble() -> None:
    """PRV-09, PRV-16: deltas come back as the transient events to publish,
    completed calls are the response's calls when the terminal message has
    no tool-call blocks, and usage reports are kept verbatim, frozen."""
    assembler = ResponseAssembler(1_000)
    published = _feed(
        assembler,
        TextDelta("he"),
        ToolCallStarted("c1", "look"),
        ToolCallArgumentsDelta("c1", '{"q": 1}'),
        ToolCallCompleted("c1", "look", {"q": 1}),
        Usage({"tokens": 3}),
        ResponseCompleted(ASSISTANT),
    )
    assert [p[0] if p else None for p in published] == [
        "content_text_delta",
        "tool_call_started",
        "tool_call_arguments_delta",
        "tool_call_completed",
        "usage_updated",
        None,
    ]
    assert assembler.done
    outcome = assembler.outcome()
    assert outcome.failure is None
    assert outcome.calls == [{"id": "c1", "name": "look", "arguments": {"q": 1}}]
    assert outcome.usage == [{"tokens": 3}]
    assert outcome.message == ASSISTANT


def test_prv_17_terminal_tool_call_blocks_are_authoritative() -> None:
    """PRV-17: the terminal message's tool-call blocks win over streamed calls."""
    assembler = ResponseAssembler(1_000)
    block = {"type": "tool_call", "id": "c2", "name": "act", "arguments": {}}
    _feed(
        assembler,
        ToolCallCompleted("c1", "look", {}),
        ResponseCompleted({"role": "assistant", "content": [block]}),
    )
    assert assembler.outcome().calls == [{"id": "c2", "name": "act", "arguments": {}}]


def test_prv_13_output_over_the_limit_raises_resource_conflict() -> None:
    """PRV-13: a delta that takes the response past its limit raises."""
    assembler = ResponseAssembler(4)
    assembler.feed(TextDelta("abc"))
    with pytest.raises(Error) as raised:
        assembler.feed(TextDelta("de"))
    assert raised.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert raised.value.details["size"] == 5


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([TextDelta("x")], "provider ended without terminal event"),
        ([ResponseCompleted({"role": "user", "content": "x"})], "must be assistant"),
        ([object()], "unsupported normalized provider event"),
    ],
)
def test_prv_03_a_response_that_is_not_one_fails(events: list[Any], message: str) -> None:
    """PRV-03, PRV-07: no terminal event, a message not the assistant's, or an
    event of no known kind fails the attempt, classed validation."""
    assembler = ResponseAssembler(1_000)
    _feed(assembler, *events)
    failure = assembler.outcome().failure
    assert failure is not None
    assert failure.error_class is ErrorClass.VALIDATION
    assert message in failure.message


def test_prv_07_response_failed_carries_its_error() -> None:
    """PRV-07: ``ResponseFailed`` ends the attempt with its own classed error."""
    assembler = ResponseAssembler(1_000)
    error = Error(ErrorClass.TRANSIENT_TRANSPORT, "reset")
    assembler.feed(ResponseFailed(error))
    assert assembler.done
    assert assembler.terminal
    assert assembler.outcome().failure is error
