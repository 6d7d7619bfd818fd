"""Where a resumed run goes on, read from a stored record alone (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import Budget, RunRecord
from trio_backplane.runtime._resume import resume_point

CALLS = [{"id": "c1", "name": "a", "arguments": {}}, {"id": "c2", "name": "b", "arguments": {}}]
RESPONSE = {"role": "assistant", "content": [{"type": "tool_call", **c} for c in CALLS]}
PROMPT = {"role": "user", "content": "go", "id": "msg-1-1"}


def _record(*messages: Any, result: Any = None, **conversation: Any) -> RunRecord:
    state = {"turn_id": "turn-1-2", **conversation}
    return RunRecord(
        run_id="r",
        state="running",
        deadline=1_000.0,
        budget=Budget(quota=10),
        context={"conversation": state},
        transcript=[PROMPT, *messages],
        provider_result=None if result is None else {"attempt_id": "attempt-1-1", "result": result},
    )


def _tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": "a", "result": {"content": "ok"}}


def test_the_calls_of_the_committed_response_that_ran_nothing_go_on() -> None:
    point = resume_point(_record(RESPONSE, _tool("c1"), result={"message": RESPONSE}), 400.0)
    assert point.message == RESPONSE
    assert [c["id"] for c in point.calls] == ["c2"]
    assert point.run_timeout == 600.0  # not waiting: what the deadline leaves now
    assert point.turn_id == "turn-1-2"


def test_streamed_calls_are_read_from_the_committed_result() -> None:
    """Calls completed in the stream, not in the message's blocks, are in
    the committed result."""
    plain = {"role": "assistant", "content": "calling"}
    point = resume_point(_record(plain, result={"message": plain, "calls": CALLS}), 0.0)
    assert [c["id"] for c in point.calls] == ["c1", "c2"]


def test_a_batch_that_ended_or_steering_after_it_asks_the_provider_again() -> None:
    ended = _record(RESPONSE, _tool("c1"), _tool("c2"), result={"message": RESPONSE})
    steered = _record(RESPONSE, {"role": "user", "content": "also"}, result={"message": RESPONSE})
    for record in (ended, steered):
        point = resume_point(record, 0.0)
        assert (point.message, point.calls) == (None, ())


def test_a_run_that_waited_for_a_person_has_what_was_left_when_the_wait_began() -> None:
    pending = {"id": "interaction-1-3", "request": {}, "requested_at": 100.0, "remaining": 250.0}
    record = _record(RESPONSE, result={"message": RESPONSE}, pending_interaction=pending)
    point = resume_point(record, 5_000.0)
    assert point.run_timeout == 250.0
    assert point.reopened == pending


def test_an_ended_turn_goes_on_with_its_committed_failure() -> None:
    error = {"class": "forbidden", "message": "no", "details": {}}
    last = {"turn_id": "turn-1-2", "status": "failed", "error": error}
    point = resume_point(_record(last_turn=last), 0.0)
    assert point.turn_ended
    assert point.failed is not None
    assert point.failed.error_class is ErrorClass.FORBIDDEN


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"state": "queued"}, "it is queued"),
        ({"context": {"conversation": {}}}, "no turn was ever started"),
        ({"active_wait": {"wait_id": "w"}}, "in flight"),
        (
            {"context": {"conversation": {"turn_id": "t", "resources": [{"kind": "pg"}]}}},
            "outlive its host",
        ),
    ],
)
def test_what_cannot_be_resumed_is_refused(changes: dict[str, Any], why: str) -> None:
    import attrs

    record = attrs.evolve(_record(), **changes)
    with pytest.raises(Error) as refused:
        resume_point(record, 0.0)
    assert refused.value.error_class is ErrorClass.RESOURCE_CONFLICT
    assert why in refused.value.message
