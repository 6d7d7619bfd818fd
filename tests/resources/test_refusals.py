"""Refusals a command backend proves: only a refusal ``start`` raised for
that exact invocation, which ran nothing, lets a reservation be withdrawn
without cleanup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LINUX_ONLY
from tests.resources.test_local_command import _sleepers
from tests.runtime.support import run_to_settled
from trio_backplane import Error, ErrorClass
from trio_backplane.resources import (
    CommandInvocation,
    LocalCommand,
    ResourceRegistry,
    command_tools,
)
from trio_backplane.testing import ScriptedProvider as S

pytestmark = LINUX_ONLY


def inv(session_id: int = 1, owner: str = "run-1", incarnation: int = 1) -> CommandInvocation:
    return CommandInvocation(owner=owner, session_id=session_id, incarnation=incarnation)


async def _refused(command: LocalCommand, invocation: CommandInvocation, tmp_path: Path) -> Error:
    async def store_down(evidence: Any) -> None:
        raise Error(ErrorClass.STORAGE_FAILED, "store is down")

    with pytest.raises(Error) as exc:
        await command.start(invocation, "true", workspace=tmp_path, before_run=store_down)
    return exc.value


def _unverified(command: LocalCommand, invocation: CommandInvocation, error: Any) -> None:
    with pytest.raises(Error) as exc:
        command.validate_refusal(invocation, error)
    assert exc.value.error_class is ErrorClass.UNKNOWN_OUTCOME
    assert exc.value.message == "command refusal is unverified"
    assert exc.value.details["session_id"] == invocation.session_id


async def test_a_refusal_start_raised_validates_for_its_invocation_only(tmp_path: Path) -> None:
    """A refusal from ``start`` (here: the evidence could not be made
    durable) keeps its class and message, says ``never_started`` and
    validates for its own invocation; for any other, or altered, or from
    another backend, or unsigned, it is unverified."""
    async with LocalCommand() as command, LocalCommand() as other:
        refusal = await _refused(command, inv(), tmp_path)
        assert (refusal.error_class, refusal.message) == (
            ErrorClass.STORAGE_FAILED,
            "store is down",
        )
        assert refusal.details["launch_status"] == "never_started"
        command.validate_refusal(inv(), refusal)
        for elsewhere in (inv(2), inv(owner="run-2"), inv(incarnation=2)):
            _unverified(command, elsewhere, refusal)
        _unverified(other, inv(), refusal)
        details = dict(refusal.details)
        altered = [
            Error(ErrorClass.CANCELLED, refusal.message, details),
            Error(refusal.error_class, "something else", details),
            Error(refusal.error_class, refusal.message, {**details, "session_id": 9}),
            Error(refusal.error_class, refusal.message, {**details, "refusal_proof": "0" * 64}),
            Error(ErrorClass.CANCELLED, "cancelled", {"launch_status": "never_started"}),
            RuntimeError("not even an Error"),
        ]
        for error in altered:
            _unverified(command, inv(), error)


async def test_every_refusal_of_start_is_proved(tmp_path: Path) -> None:
    """Refusals before the launch (a busy workspace, capacity, an expired
    session) are proved as well as a refused launch."""
    async with LocalCommand(session_capacity=1, completion_retention=60.0) as command:
        await command.start(inv(1), "sleep 5", workspace=tmp_path)
        refusals = []
        for invocation in (inv(2), inv(3, owner="run-3")):
            with pytest.raises(Error) as exc:
                await command.start(invocation, "true", workspace=tmp_path)
            refusals.append((invocation, exc.value))
        command.cancel("run-1")
    assert [e.error_class for _, e in refusals] == [ErrorClass.OVERLOADED] * 2
    for invocation, error in refusals:
        command.validate_refusal(invocation, error)


async def test_a_refusal_is_unverified_once_its_session_has_launched(tmp_path: Path) -> None:
    """A refusal (the workspace was busy) leaves the session reserved; once
    that session launches after all, the old refusal no longer says that
    nothing ran."""
    async with LocalCommand(completion_retention=60.0) as command:
        await command.start(inv(1), "sleep 300", workspace=tmp_path)
        other = inv(2, owner="run-2")
        with pytest.raises(Error) as exc:
            await command.start(other, "true", workspace=tmp_path)
        refusal = exc.value
        command.validate_refusal(other, refusal)
        command.cancel("run-1")
        await command.wait(inv(1), 10.0)
        await command.start(other, "true", workspace=tmp_path)
        _unverified(command, other, refusal)


async def test_a_refusal_is_unverified_once_its_launched_session_expired(
    tmp_path: Path,
) -> None:
    """Refused, then launched, released and its receipt evicted: the ledger
    no longer holds the session, and the old refusal stays unverified (its
    id expired after the refusal was signed)."""
    async with LocalCommand(receipt_capacity=1, completion_retention=60.0) as command:
        await command.start(inv(1), "sleep 300", workspace=tmp_path)
        other = inv(2, owner="run-2")
        with pytest.raises(Error) as exc:
            await command.start(other, "true", workspace=tmp_path)
        command.cancel("run-1")
        await command.wait(inv(1), 10.0)
        for invocation in (other, inv(3, owner="run-3")):
            await command.start(invocation, "true", workspace=tmp_path)
            await command.wait(invocation, 10.0)
            command.acknowledge_release(invocation)  # the second evicts the first receipt
        _unverified(command, other, exc.value)


async def test_a_retired_refusal_frees_its_capacity(tmp_path: Path) -> None:
    """A session refused before it ran, once retired, no longer counts
    against ``session_capacity``; one that launched cannot be retired."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with LocalCommand(session_capacity=2) as command:
        await command.start(inv(1), "sleep 300", workspace=tmp_path / "a")
        with pytest.raises(Error) as exc:
            await command.start(inv(2), "true", workspace=tmp_path / "a")
        command.validate_refusal(inv(2), exc.value)
        command.retire(inv(2))
        await command.start(inv(3), "sleep 300", workspace=tmp_path / "b")  # not overloaded
        with pytest.raises(Error) as refused:
            command.retire(inv(3))
        assert refused.value.error_class is ErrorClass.RESOURCE_CONFLICT
        command.cancel("run-1")


async def test_an_unverified_refusal_keeps_the_session_for_cleanup(tmp_path: Path) -> None:
    """``exec_command`` withdraws a session without cleanup only for a proved
    refusal: an ``Error`` that is not one (a backend wrapped by the host that
    raises its own after the launch) leaves the call's outcome unknown (the
    run ends ``unknown_outcome``) and the session to the run's cleanup,
    which stops the command and confirms it."""
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        real_start = command.start

        async def wrapped(invocation: CommandInvocation, *args: Any, **kwargs: Any) -> Any:
            await real_start(invocation, *args, **kwargs)
            raise Error(ErrorClass.EXECUTION_FAILURE, "the wrapper failed after the launch")

        command.start = wrapped  # type: ignore[method-assign]
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        provider = S([S.tool_calls(("c1", "exec_command", {"cmd": "sleep 47301"})), S.text("ok")])
        finished = await run_to_settled(provider, tools, wall_clock=None)
    assert finished.record.state == "unknown_outcome"
    assert finished.snapshot.resource_cleanup.status == "confirmed"
    assert registry.owner_status("run-1") == []
    assert _sleepers({47301}) == []


async def test_a_proved_refusal_reaches_the_model_without_its_proof(tmp_path: Path) -> None:
    """A refused launch is a rejection the model reads, without the proof."""
    registry = ResourceRegistry()
    async with LocalCommand() as command:
        tools = command_tools(registry, command, workspace=tmp_path, requires_approval=False)
        outside = {"cmd": "true", "workdir": "."}
        provider = S(
            [
                S.tool_calls(("c1", "exec_command", {"cmd": "sleep 300", "yield_time_ms": 0})),
                S.tool_calls(("c2", "exec_command", outside)),
                S.text("ok"),
            ]
        )
        finished = await run_to_settled(provider, tools, wall_clock=None)
        ledger = command._ledger
        left = [o.session_id for o in ledger.live.values() if not o.launched]
    refused = finished.tool_messages()[1]["result"]["error"]
    assert refused["message"] == "workspace already has an active command"
    assert refused["details"]["launch_status"] == "never_started"
    assert "refusal_proof" not in refused["details"]
    assert left == []  # the refused session is retired: out of session_capacity
