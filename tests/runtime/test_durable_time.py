"""Durable instants mean the same in every process: a run written by one
process and inspected or continued by another reads the same deadline and
approval expiry, as wall-clock seconds since the epoch (UTC)."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from trio_backplane import Error, ErrorClass, SQLiteStore, open_conversation
from trio_backplane.cli import main
from trio_backplane.testing import ScriptedProvider

from .support import run_with_host

WRITER = Path(__file__).with_name("waiting_writer.py")
RUN_ID = "waiting-1"


def _write_waiting_run(db: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(WRITER), str(db), RUN_ID],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


async def test_int_07_another_process_reads_the_same_deadline_and_expiry(tmp_path: Path) -> None:
    """INT-07, INT-15: the run deadline and the approval's expiry one host
    process stored (then died, waiting for the approval) are what another
    process reads from the store, what it reports when it opens the stored
    run, and wall-clock instants: the admission's wall time plus
    run_timeout.  The remaining budget the wait froze is stored with it."""
    db = tmp_path / "runs.sqlite3"
    written = _write_waiting_run(db)
    # The durable clock is the wall clock read once at opening plus Trio's
    # monotonic time since: the two clocks may drift apart by microseconds
    # (NTP slews one), so the bounds allow a millisecond.
    slack = 1e-3
    low = written["before"] + written["run_timeout"] - slack
    high = written["after"] + written["run_timeout"] + slack
    assert low <= written["deadline"] <= high
    assert written["expires_at"] == written["deadline"]

    async with SQLiteStore(db) as store:
        record = await store.load(RUN_ID)
        assert record is not None
        assert record.deadline == written["deadline"]
        pending = record.context["conversation"]["pending_interaction"]
        assert pending["request"]["operation"]["expires_at"] == written["expires_at"]
        assert pending["requested_at"] + pending["remaining"] == pytest.approx(record.deadline)
        assert 0 < pending["remaining"] <= written["run_timeout"]
        async with open_conversation(
            RUN_ID, store=store, provider=ScriptedProvider(), run=record
        ) as inspected:
            assert inspected.status().run.deadline == written["deadline"]


def test_runs_show_prints_the_deadline_as_a_utc_instant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command line shows the stored deadline as the date it is."""
    db = tmp_path / "runs.sqlite3"
    written = _write_waiting_run(db)
    assert main(["runs", "show", f"sqlite:///{db}", RUN_ID]) == 0
    shown = datetime.datetime.fromtimestamp(written["deadline"], datetime.UTC)
    assert shown.isoformat(timespec="seconds") in capsys.readouterr().out


async def test_a_mock_clock_maps_through_the_injected_wall_clock(
    autojump_clock: MockClock,
) -> None:
    """Under ``MockClock`` the stored instants are the injected wall clock at
    opening, advanced by Trio's clock: deterministic, and the deadline is
    admission + run_timeout on that clock."""
    epoch = 1_800_000_000.0
    await trio.sleep(7.0)
    finished, _host = await run_with_host(
        ScriptedProvider([ScriptedProvider.text("ok")]),
        wall_clock=lambda: epoch,
        run_timeout=30.0,
    )
    assert finished.record.deadline == epoch + 30.0
    started = [e.occurred_at for e in finished.log]
    assert all(epoch <= at <= epoch + 30.0 for at in started)


@pytest.mark.parametrize("wall_clock", [5, lambda: "now", lambda: float("nan")])
async def test_conv_01_a_wall_clock_that_is_not_one_is_refused(wall_clock: Any) -> None:
    """CONV-01: ``wall_clock`` must be a callable returning a finite number,
    refused as ``validation`` naming the option before the store is used."""
    with pytest.raises(Error) as raised:
        async with open_conversation(
            "r", store=_NoStore(), provider=ScriptedProvider(), wall_clock=wall_clock
        ):
            pass  # pragma: no cover - never opened
    assert raised.value.error_class is ErrorClass.VALIDATION
    assert raised.value.details["option"] == "wall_clock"


class _NoStore:
    """A store no test may reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used: {name}")
