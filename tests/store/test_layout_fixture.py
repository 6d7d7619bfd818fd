"""Runs stored by layout 2 (``tests/fixtures/layout2.sqlite3``, written by
``scripts/make_layout_fixture.py``) still read as they were written, and a
later host can take them over: a layout change must upgrade them, never
lose them."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from trio_backplane import Error, ErrorClass, open_conversation
from trio_backplane.kernel import SCHEMA_VERSION, Command, thaw, transition
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


def _heads(path: Path) -> dict[str, Any]:
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute("SELECT run_id, head FROM runs").fetchall()
    finally:
        connection.close()
    return {run_id: json.loads(head) for run_id, head in rows}


def test_the_fixture_holds_schema_version_1_records() -> None:
    """Its records are of the schema the upgrade reads: the transcript and the
    usage reports inside the conversation state, stored as rows."""
    heads = _heads(FIXTURES / "layout2.sqlite3")
    assert {head["schema_version"] for head in heads.values()} == {1}
    conversation = heads["done"]["context"]["conversation"]
    assert (conversation["messages"], conversation["usage"]) == ("__parts__", "__parts__")
    assert "transcript" not in heads["done"]


async def test_a_schema_version_1_run_is_upgraded_by_its_next_commit(stored: Path) -> None:
    """Item 1 of issue 20: a record of schema version 1 loads as the current
    schema (transcript and usage in their own fields, the conversation state
    without them); its next commit writes a current head and keeps every
    message row as it was, and a new store instance reads it back equal."""
    before = sqlite3.connect(stored)
    rows = before.execute(
        "SELECT part, key, value FROM run_parts WHERE run_id = 'asking' AND part = 'messages'"
    ).fetchall()
    before.close()
    async with SQLiteStore(stored) as store:
        record = await store.load("asking")
        assert record is not None
        assert record.schema_version == SCHEMA_VERSION == 2
        assert [m["role"] for m in record.transcript] == ["user", "assistant"]
        assert "messages" not in record.context["conversation"]
        assert "usage" not in record.context["conversation"]
        message = {"role": "user", "content": "after the upgrade"}
        new, events = transition(
            record, Command("conversation_updated", WALL + 1, {"messages": [message]})
        )
        await store.commit(
            "asking", incarnation=1, expected_revision=record.revision, record=new, events=events
        )
    async with SQLiteStore(stored) as again:
        reloaded = await again.load("asking")
    assert reloaded == new
    assert thaw(reloaded.transcript)[-1] == message
    head = _heads(stored)["asking"]
    assert head["schema_version"] == 2
    assert (head["transcript"], head["usage"]) == ("__parts__", "__parts__")
    assert "messages" not in head["context"]["conversation"]
    after = sqlite3.connect(stored)
    kept = after.execute(
        "SELECT part, key, value FROM run_parts WHERE run_id = 'asking' AND part = 'messages'"
    ).fetchall()
    after.close()
    assert kept[: len(rows)] == rows
    assert len(kept) == len(rows) + 1


async def test_a_newer_record_schema_is_refused(stored: Path) -> None:
    """A record written by a later schema is never misread, nor called
    damaged: its run is ``unsupported_capability`` (for that run alone),
    naming the versions, and the other runs read on."""
    connection = sqlite3.connect(stored)
    head = _heads(stored)["done"]
    head["schema_version"] = SCHEMA_VERSION + 1
    connection.execute("UPDATE runs SET head = ? WHERE run_id = 'done'", (json.dumps(head),))
    connection.commit()
    connection.close()
    async with SQLiteStore(stored) as store:
        with pytest.raises(Error) as raised:
            await store.load("done")
        assert await store.load("asking") is not None
    assert raised.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert "written by a newer trio_backplane" in raised.value.message
    assert dict(raised.value.details) == {
        "run_id": "done",
        "path": str(stored),
        "schema_version": SCHEMA_VERSION + 1,
        "supported": SCHEMA_VERSION,
    }
