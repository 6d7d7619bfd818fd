"""SQLiteStore layout 2: provider usage reports as rows; a layout-1 file
(``usage`` inline in the head) is read as it is and upgraded by its next commit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.kernel import Command, FrozenList, RunRecord, freeze, transition
from trio_backplane.store import SQLiteStore
from trio_backplane.store._sql._sqlite import LAYOUT_VERSION


def _respond(record: RunRecord, n: int) -> RunRecord:
    """``record`` after one provider response reporting usage ``{"tokens": n}``."""
    record, _ = transition(record, Command("provider_started", float(n)))
    new, _ = transition(
        record,
        Command(
            "provider_completed",
            float(n),
            {
                "messages": FrozenList((freeze({"role": "assistant", "content": "x"}),)),
                "usage": FrozenList((freeze({"tokens": n}),)),
            },
        ),
    )
    return new


async def _commit(store: SQLiteStore, old: RunRecord, new: RunRecord) -> None:
    await store.commit(
        old.run_id,
        incarnation=old.incarnation,
        expected_revision=old.revision,
        record=new,
        events=[],
    )


async def test_usage_rows_and_a_layout_1_file_upgraded(tmp_path: Path) -> None:
    """STO-07 across a layout change: nothing stored by layout 1 is lost."""
    path = tmp_path / "runs.db"
    record = RunRecord.new("r", work=100, context={"conversation": {}})
    async with SQLiteStore(path) as store:
        await store.create(record)
        admitted, _ = transition(record, Command("admit", 0.0, {"state": "running"}))
        await _commit(store, record, admitted)
        record = admitted
        for n in range(3):
            started, _ = transition(record, Command("provider_started", float(n)))
            await _commit(store, record, started)
            done = _respond(record, n)
            await _commit(store, started, done)
            record = done
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT key, value FROM run_parts WHERE part = 'usage'").fetchall()
    assert [json.loads(v)["tokens"] for _k, v in sorted(rows)] == [0, 1, 2]
    (head,) = conn.execute("SELECT head FROM runs").fetchone()
    assert json.loads(head)["usage"] == "__parts__"
    # Make the file what layout 1 wrote: usage inline in the head, no usage
    # rows (and, record schema version 1, the lists in the conversation).
    data = json.loads(head)
    del data["transcript"], data["usage"]
    data["schema_version"] = 1
    data["context"]["conversation"] = {
        "messages": "__parts__",
        "usage": [{"tokens": 0}, {"tokens": 1}, {"tokens": 2}],
    }
    conn.execute("UPDATE runs SET head = ?", (json.dumps(data, separators=(",", ":")),))
    conn.execute("DELETE FROM run_parts WHERE part = 'usage'")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'layout_version'")
    conn.commit()
    conn.close()

    async with SQLiteStore(path) as store:
        loaded = await store.load("r")
        assert loaded == record  # layout 1 read as it is
        started, _ = transition(loaded, Command("provider_started", 9.0))
        await _commit(store, loaded, started)
        done = _respond(loaded, 9)
        await _commit(store, started, done)
    async with SQLiteStore(path) as store:
        again = await store.load("r")
    assert again == done
    assert [u["tokens"] for u in again.usage] == [0, 1, 2, 9]
    conn = sqlite3.connect(path)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone()
    usage_rows = conn.execute("SELECT COUNT(*) FROM run_parts WHERE part = 'usage'").fetchone()
    conn.close()
    assert int(version) == LAYOUT_VERSION == 2
    assert usage_rows == (4,)


async def test_a_file_from_a_newer_layout_is_refused_untouched(tmp_path: Path) -> None:
    """A database whose layout is newer than this code is refused with
    ``unsupported_capability`` naming both versions, and left as it was."""
    path = await _store_at_layout(tmp_path, LAYOUT_VERSION + 1)
    async with SQLiteStore(path) as store:
        with pytest.raises(Error) as exc:
            await store.load("r")
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert dict(exc.value.details) == {
        "layout_version": LAYOUT_VERSION + 1,
        "supported": LAYOUT_VERSION,
    }
    conn = sqlite3.connect(path)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone()
    conn.close()
    assert int(version) == LAYOUT_VERSION + 1


async def _store_at_layout(tmp_path: Path, version: object) -> Path:
    """A store holding run "r" whose meta says layout ``version``."""
    path = tmp_path / "runs.db"
    async with SQLiteStore(path) as store:
        await store.create(RunRecord.new("r"))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'layout_version'", (version,))
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("version", ["v1.3", "", "0", "-2"])
async def test_sto_06_an_unreadable_layout_version_is_storage_failed(
    tmp_path: Path, version: str
) -> None:
    """STO-06: a store whose layout version is not a version number fails
    classed, naming the file: never a raw ``ValueError``."""
    path = await _store_at_layout(tmp_path, version)
    async with SQLiteStore(path) as store:
        with pytest.raises(Error) as raised:
            await store.load("r")
    assert raised.value.error_class is ErrorClass.STORAGE_FAILED
    assert raised.value.details["path"] == str(path)
