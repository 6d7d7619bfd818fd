"""Runs stored by layout 2 (``tests/fixtures/layout2.sqlite3``, written by
``scripts/make_layout_fixture.py``) still read as they were written, and a
later host can take them over: a layout change must upgrade them, never
lose them."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from trio_backplane import open_conversation
from trio_backplane.kernel import thaw
from trio_backplane.recovery import recover
from trio_backplane.store import SQLiteStore
from trio_backplane.testing import ScriptedProvider

#: The wall clock the fixture was written at (2026-06-01T00:00:00Z), and
#: its runs' deadline (run_timeout 600 s).
WALL = 1_780_272_000.0
DEADLINE = WALL + 600.0


@pytest.fixture
def stored(tmp_path: Path) -> Path:
    path = tmp_path / "runs.sqlite3"
    shutil.copyfile(FIXTURES / "layout2.sqlite3", path)
    return path


def _conversation(record: Any) -> dict[str, Any]:
    state = thaw(record.conversation)
    assert isinstance(state, dict)
    return state


async def test_a_completed_run_reads_as_written(stored: Path) -> None:
    async with SQLiteStore(stored) as store:
        record = await store.load("done")
        events = await store.events("done")
    assert record is not None
    assert (record.state, record.revision, record.deadline) == ("completed", 10, DEADLINE)
    state = _conversation(record)
    assert [m["role"] for m in state["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert state["messages"][0]["content"] == "count to two"
    assert [m["result"]["content"] for m in state["messages"] if m["role"] == "tool"] == [
        "echo 1",
        "echo 2",
    ]
    assert state["messages"][-1]["content"] == "all done"
    assert state["usage"] == [{"input_tokens": 10, "output_tokens": 3}]
    assert sorted(record.tool_results) == ["invocation-1-1", "invocation-1-2"]
    assert record.budget.used == 5
    step = ["run.provider_started", "run.provider_completed", "run.tool_invoked"]
    assert [e.type for e in events] == [
        "run.admit",
        "run.conversation_updated",
        *[*step, "run.tool_completed"] * 2,
        "run.provider_started",
        "run.provider_completed",
        "run.conversation_updated",
        "run.finish",
    ]


async def test_a_run_waiting_for_approval_reads_and_recovers(stored: Path) -> None:
    """The pending permission request, its expiry and the run's remaining
    budget read as stored (wall-clock instants); recovery finds nothing
    dispatched, and a newer incarnation fences the run on this file."""
    async with SQLiteStore(stored) as store:
        record = await store.load("asking")
        assert record is not None
        assert (record.state, record.incarnation, record.deadline) == ("running", 1, DEADLINE)
        pending = _conversation(record)["pending_interaction"]
        operation = pending["request"]["operation"]
        assert pending["request"]["kind"] == "permission"
        assert (operation["tool_name"], operation["arguments"]) == ("gated", {"n": 7})
        assert operation["expires_at"] == DEADLINE
        assert (pending["requested_at"], pending["remaining"]) == (WALL, 600.0)
        report = recover(record, incarnation=2)
        assert report.uncertain_effects == ()
        await store.fence("asking", incarnation=2)
        fenced = await store.load("asking")
    assert fenced is not None
    assert fenced.incarnation == 2
    assert fenced.conversation == record.conversation


async def test_a_cancelled_run_keeps_its_evidence(stored: Path) -> None:
    async with SQLiteStore(stored) as store:
        record = await store.load("stopped")
    assert record is not None
    assert record.state == "unknown_outcome"
    assert record.outcome["evidence"] == [
        {"effect": "tool:invocation-1-1", "reason": "tool dispatched; outcome unknown"}
    ]
    assert [m["role"] for m in _conversation(record)["messages"]] == ["user", "assistant"]


async def test_a_stored_run_opens_as_a_conversation(stored: Path) -> None:
    """``open_conversation(run=...)`` shows a stored run of this layout:
    transcript, usage and the last turn."""
    async with SQLiteStore(stored) as store:
        record = await store.load("done")
        assert record is not None
        async with open_conversation(
            "done", store=store, provider=ScriptedProvider(), run=record
        ) as conversation:
            snapshot = conversation.status()
    assert snapshot.phase == "terminal"
    assert len(snapshot.messages) == 6
    assert snapshot.usage == ({"input_tokens": 10, "output_tokens": 3},)
    assert snapshot.turn_id == "turn-1-2"


def test_the_fixture_is_layout_2() -> None:
    """The file is what its name says (a regenerated fixture at another
    layout would test nothing)."""
    connection = sqlite3.connect(FIXTURES / "layout2.sqlite3")
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone()
    finally:
        connection.close()
    assert row == ("2",)
