"""A SQLite store holding runs that cannot be read, for the readers' tests."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from trio_backplane.kernel import RunRecord
from trio_backplane.store import SQLiteStore

#: The runs :func:`unreadable_runs` stores: readable, damaged, from a newer version.
RUNS = ("good", "broken", "newer")


async def unreadable_runs(path: Path) -> None:
    """Store three queued runs at ``path``: ``good``; ``broken``, whose head
    is not JSON (damaged outside the store); ``newer``, whose record claims
    ``schema_version`` 99 (a later trio_backplane's)."""
    async with SQLiteStore(path) as store:
        for run_id in RUNS:
            await store.create(RunRecord.new(run_id, work=10))
    conn = sqlite3.connect(path)
    try:
        query = "SELECT head FROM runs WHERE run_id = 'newer'"
        head = json.loads(conn.execute(query).fetchone()[0])
        head["schema_version"] = 99
        conn.execute("UPDATE runs SET head = ? WHERE run_id = 'newer'", (json.dumps(head),))
        conn.execute("UPDATE runs SET head = '{not json' WHERE run_id = 'broken'")
        conn.commit()
    finally:
        conn.close()
