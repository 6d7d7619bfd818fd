"""The console in a real browser (headless Chromium): the runs page, a
run's live events while its conversation runs in this test, approving and
denying in the page, and a reload mid-stream that loses no event.

On Trio's own clock: the store, the server and the browser all run in
threads or processes of their own; every wait is bounded, none timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from tests.console.browser import call, chromium, until
from tests.console.support import CANARY, HOSTILE, Deploy, served, waiting_run
from trio_backplane.store import SQLiteStore


def _text(browser: Any, element_id: str) -> str:
    """An element's text, read in the page in one step (the live part of
    the page is swapped as events arrive: no element is held across)."""
    script = "var e = document.getElementById(arguments[0]); return e ? e.innerText : '';"
    return str(browser.execute_script(script, element_id))


def _sequences(browser: Any) -> list[int]:
    """The sequences of the event rows the page shows, in order."""
    script = (
        "return Array.from(document.querySelectorAll('#events tr.event'))"
        ".map(function (row) { return Number(row.getAttribute('data-sequence')); });"
    )
    return [int(n) for n in browser.execute_script(script)]


def _click(browser: Any, element_id: str) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, element_id).click()


async def test_approve_in_the_browser_and_watch_the_run_complete(tmp_path: Path) -> None:
    """Open the runs page of a filled store, open the waiting run, approve
    its request in the page: its events arrive live (no reload) and the run
    completes; the tool's ``<script>`` result shows as text, never runs;
    the canary credential is in no page."""
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        waiting_run(s, "run-approve", deploy) as conversation,
    ):
        with chromium() as browser:
            await call(browser.get, s.login())
            await until(lambda: "run-approve" in _text(browser, "runs"))
            runs_page = await call(lambda: browser.page_source)
            await call(browser.get, f"{s.url}/runs/run-approve")
            await until(lambda: "deploy" in _text(browser, "question-tool"))
            before = await call(_sequences, browser)
            await call(_click, browser, "approve")
            with trio.fail_after(30):
                snapshot = await conversation.wait_settled()
            assert snapshot.run.state == "completed"
            await until(lambda: _text(browser, "state") == "completed")
            stored = [e.sequence for e in await store.events("run-approve")]
            await until(lambda: _sequences(browser) == stored)  # arrived live, no reload
            assert len(stored) > len(before)
            assert HOSTILE in await call(_text, browser, "transcript")  # shown as text
            assert await call(browser.execute_script, "return window.pwned === undefined")
            run_page = await call(lambda: browser.page_source)
    assert deploy.calls == [{"target": "prod"}]
    for page in (runs_page, run_page):
        assert CANARY not in page


async def test_deny_in_the_browser_shows_the_denial(tmp_path: Path) -> None:
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        waiting_run(s, "run-deny", deploy) as conversation,
    ):
        with chromium() as browser:
            await call(browser.get, s.login())
            await call(browser.get, f"{s.url}/runs/run-deny")
            await until(lambda: "deploy" in _text(browser, "question-tool"))
            await call(_click, browser, "deny")
            with trio.fail_after(30):
                snapshot = await conversation.wait_settled()
            await until(lambda: "approval denied" in _text(browser, "transcript"))
    assert snapshot.run.state == "completed"
    assert deploy.calls == []


async def test_a_reload_mid_stream_loses_no_event(tmp_path: Path) -> None:
    """Reloaded while the run goes on: the page shows every stored event
    once, in order, the ones before the reload and the ones after."""
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        waiting_run(s, "run-reload", deploy) as conversation,
    ):
        with chromium() as browser:
            await call(browser.get, s.login())
            await call(browser.get, f"{s.url}/runs/run-reload")
            await until(lambda: _sequences(browser))
            await call(browser.refresh)
            await conversation.resolve(conversation.status().pending_interaction["id"], "approved")
            await call(browser.refresh)  # mid-stream: the run is going on
            with trio.fail_after(30):
                snapshot = await conversation.wait_settled()
            stored = [e.sequence for e in await store.events("run-reload")]
            await until(lambda: _sequences(browser) == stored)
            await until(lambda: _text(browser, "feed-state") == "(the run is over)")
    assert snapshot.run.state == "completed"


async def test_events_arrive_live_while_the_conversation_runs(tmp_path: Path) -> None:
    """The run page open, the host answers and the run goes on: each new
    stored event appears in the page without a reload (a marker set in the
    page before survives), and the state shown follows the run's."""
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        waiting_run(s, "run-live", deploy) as conversation,
    ):
        with chromium() as browser:
            await call(browser.get, s.login())
            await call(browser.get, f"{s.url}/runs/run-live")
            before = await until(lambda: _sequences(browser))
            await call(browser.execute_script, "window.sameDocument = true;")
            await conversation.resolve(conversation.status().pending_interaction["id"], "approved")
            with trio.fail_after(30):
                await conversation.wait_settled()
            stored = [e.sequence for e in await store.events("run-live")]
            await until(lambda: _sequences(browser) == stored)
            await until(lambda: _text(browser, "state") == "completed")
            assert await call(browser.execute_script, "return window.sameDocument === true")
    assert len(stored) > len(before)
